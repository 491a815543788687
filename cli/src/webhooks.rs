//! `delta webhooks add|ls|show|rm|rotate|enable|disable`: the fleet's signed webhooks, through
//! the gateway (`/v1/webhooks…`, operator role; docs/webhooks.md, docs/cli.md "Webhooks").

use chrono::{DateTime, Utc};

use delta_api::{RotateBody, WebhookBody, WebhookCreated, WebhookList, WebhookView};

use crate::client::{self, Client, Reply};
use crate::ops::{Remote, out};
use crate::show::time;
use crate::table::{ago, short, table};

#[derive(Debug, Clone, clap::Subcommand)]
pub enum WebhooksCommand {
    /// Subscribe a URL to the fleet's events; prints the signing secret once.
    Add(AddArgs),
    /// The subscriptions, with how delivery stands (disabled ones with why).
    Ls(RemoteOnly),
    /// One subscription in full.
    Show(IdArgs),
    /// Delete a subscription (its undelivered events are dropped).
    Rm(IdArgs),
    /// A new signing secret (printed once); the old one still signs during --grace.
    Rotate(RotateArgs),
    /// Deliver again a disabled subscription, from where it stopped.
    Enable(IdArgs),
    /// Stop delivering a subscription; its events wait until it is enabled.
    Disable(IdArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct AddArgs {
    /// Where to post: https://… (http://… only to a target DELTA_WEBHOOK_ALLOW names).
    pub url: String,
    /// An event to deliver (repeat it; default: all): interaction.requested, interaction.answered,
    /// interaction.expired, interaction.cancelled, interaction.updated, interaction.escalated,
    /// run.completed, run.failed, run.cancelled.
    #[arg(long = "event", value_name = "EVENT")]
    pub events: Vec<String>,
    /// An agent whose events to deliver (repeat it; default: all).
    #[arg(long = "agent", value_name = "AGENT")]
    pub agents: Vec<String>,
    /// What it is for (shown in listings).
    #[arg(long)]
    pub description: Option<String>,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, Clone, clap::Args)]
pub struct RemoteOnly {
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, Clone, clap::Args)]
pub struct IdArgs {
    /// The subscription's id (`delta webhooks ls`).
    #[arg(value_parser = crate::table::path_id)]
    pub id: String,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, Clone, clap::Args)]
pub struct RotateArgs {
    /// The subscription's id (`delta webhooks ls`).
    #[arg(value_parser = crate::table::path_id)]
    pub id: String,
    /// How long the old secret still signs, in seconds (default 86400; 0: not at all).
    #[arg(long, value_name = "SECONDS")]
    pub grace: Option<u64>,
    #[command(flatten)]
    pub remote: Remote,
}

impl WebhooksCommand {
    pub fn remote(&self) -> &Remote {
        match self {
            WebhooksCommand::Add(a) => &a.remote,
            WebhooksCommand::Ls(a) => &a.remote,
            WebhooksCommand::Rotate(a) => &a.remote,
            WebhooksCommand::Show(a)
            | WebhooksCommand::Rm(a)
            | WebhooksCommand::Enable(a)
            | WebhooksCommand::Disable(a) => &a.remote,
        }
    }
}

pub async fn run(client: &Client, cmd: WebhooksCommand, json: bool) -> Result<(), client::Error> {
    let now = Utc::now();
    match cmd {
        WebhooksCommand::Add(a) => {
            let body = WebhookBody {
                url: a.url,
                events: a.events,
                agents: a.agents,
                description: a.description,
            };
            let r: Reply<WebhookCreated> = client.post_as("v1/webhooks", &body, &[]).await?;
            created(&r, json, "subscribed");
        }
        WebhooksCommand::Ls(_) => {
            let r: Reply<WebhookList> = client.get_as("v1/webhooks", &[]).await?;
            if json {
                out(&format!("{}\n", r.json));
            } else if r.body.webhooks.is_empty() {
                eprintln!("no webhooks");
            } else {
                out(&webhooks_table(&r.body.webhooks, now));
            }
        }
        WebhooksCommand::Show(a) => {
            let r: Reply<WebhookView> =
                client.get_as(&format!("v1/webhooks/{}", a.id), &[]).await?;
            shown(&r, json, now);
        }
        WebhooksCommand::Rm(a) => {
            let r: Reply<WebhookView> = client.delete_as(&format!("v1/webhooks/{}", a.id)).await?;
            if json {
                out(&format!("{}\n", r.json));
            } else {
                out(&format!("deleted: {} ({})\n", r.body.id, r.body.url));
            }
        }
        WebhooksCommand::Rotate(a) => {
            let body = RotateBody {
                grace_seconds: a.grace,
            };
            let r: Reply<WebhookCreated> = client
                .post_as(&format!("v1/webhooks/{}/rotate", a.id), &body, &[])
                .await?;
            created(&r, json, "rotated");
        }
        WebhooksCommand::Enable(a) => {
            let r: Reply<WebhookView> = client
                .post_as(
                    &format!("v1/webhooks/{}/enable", a.id),
                    &serde_json::json!({}),
                    &[],
                )
                .await?;
            shown(&r, json, now);
        }
        WebhooksCommand::Disable(a) => {
            let r: Reply<WebhookView> = client
                .post_as(
                    &format!("v1/webhooks/{}/disable", a.id),
                    &serde_json::json!({}),
                    &[],
                )
                .await?;
            shown(&r, json, now);
        }
    }
    Ok(())
}

fn created(r: &Reply<WebhookCreated>, json: bool, what: &str) {
    if json {
        out(&format!("{}\n", r.json));
        return;
    }
    let w = &r.body.webhook;
    let mut text = format!(
        "{what}: {} → {}\nsecret (shown once; the receiver verifies with it): {}\n",
        w.id, w.url, r.body.secret
    );
    if let Some(until) = w.previous_secret_until {
        text.push_str(&format!(
            "the previous secret still signs until {}\n",
            crate::show::local(time(until))
        ));
    }
    out(&text);
}

fn shown(r: &Reply<WebhookView>, json: bool, now: DateTime<Utc>) {
    if json {
        out(&format!("{}\n", r.json));
    } else {
        out(&detail(&r.body, now));
    }
}

fn all_or(v: &[String]) -> String {
    if v.is_empty() {
        "all".into()
    } else {
        v.join(",")
    }
}

/// `delta webhooks show`: every field, one a line.
pub fn detail(w: &WebhookView, now: DateTime<Utc>) -> String {
    let mut lines = vec![
        ("id", w.id.clone()),
        ("url", w.url.clone()),
        ("state", w.state.clone()),
        ("events", all_or(&w.events)),
        ("agents", all_or(&w.agents)),
        ("delivered", w.deliveries.to_string()),
        ("failed attempts", w.failures.to_string()),
        (
            "created",
            format!("{} by {}", ago(time(w.created_at), now), w.created_by),
        ),
    ];
    let mut opt = |k: &'static str, v: Option<String>| {
        if let Some(v) = v {
            lines.push((k, v));
        }
    };
    opt("description", w.description.clone());
    opt("disabled", w.disabled_reason.clone());
    opt("failing since", w.failing_since.map(|t| ago(time(t), now)));
    opt("last success", w.last_success_at.map(|t| ago(time(t), now)));
    opt("last error", w.last_error.clone());
    opt(
        "previous secret until",
        w.previous_secret_until.map(|t| crate::show::local(time(t))),
    );
    lines
        .into_iter()
        .map(|(k, v)| format!("{k:>22}: {v}\n"))
        .collect()
}

/// `delta webhooks ls`: one line per subscription; a disabled one says why.
pub fn webhooks_table(items: &[WebhookView], now: DateTime<Utc>) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|w| {
            let status = match (&w.disabled_reason, &w.failing_since, &w.last_error) {
                (Some(why), _, _) => why.clone(),
                (None, Some(since), Some(e)) => {
                    format!("failing for {}: {e}", ago(time(*since), now))
                }
                _ => w
                    .last_success_at
                    .map(|t| format!("ok {}", ago(time(t), now)))
                    .unwrap_or_else(|| "nothing sent yet".into()),
            };
            vec![
                w.id.clone(),
                w.state.clone(),
                short(&w.url, 50),
                short(&all_or(&w.events), 40),
                short(&all_or(&w.agents), 30),
                w.deliveries.to_string(),
                w.failures.to_string(),
                status,
            ]
        })
        .collect();
    table(
        &[
            "ID", "STATE", "URL", "EVENTS", "AGENTS", "SENT", "FAILED", "STATUS",
        ],
        &rows,
    )
}
