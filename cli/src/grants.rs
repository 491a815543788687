//! `delta grants ls|revoke`: the fleet's scoped grants ("always allow"), through the gateway
//! (`GET /v1/grants`, `DELETE /v1/grants/{id}`; docs/cli.md "Grants").

use chrono::{DateTime, Utc};

use delta_api::{GrantList, GrantView, GrantsQuery};
use delta_protocol::RequestId;
use delta_protocol::grant::GrantState;

use crate::client::{self, Client, Reply};
use crate::ops::{Remote, out};
use crate::show::time;
use crate::table::{ago, short, table, until};

#[derive(Debug, Clone, clap::Subcommand)]
pub enum GrantsCommand {
    /// List grants (active ones unless --state says otherwise), oldest first.
    Ls(GrantsLsArgs),
    /// Revoke grants: from now on they approve nothing (yours, or any with the operate role).
    Revoke(GrantsRevokeArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct GrantsLsArgs {
    /// Only this agent's grants.
    #[arg(long)]
    pub agent: Option<String>,
    /// Only the grants that approve calls of this run.
    #[arg(long, value_name = "RUN_ID")]
    pub run: Option<String>,
    /// active (default), revoked, expired, used_up or all.
    #[arg(long, value_name = "STATE", ignore_case = true, value_parser = clap::builder::PossibleValuesParser::new(["active", "revoked", "expired", "used_up", "all"]))]
    pub state: Option<String>,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, Clone, clap::Args)]
pub struct GrantsRevokeArgs {
    /// The grants' ids (the ID column of `delta grants ls`).
    #[arg(value_name = "GRANT_ID", required = true)]
    pub ids: Vec<RequestId>,
    #[command(flatten)]
    pub remote: Remote,
}

impl GrantsCommand {
    pub fn remote(&self) -> &Remote {
        match self {
            GrantsCommand::Ls(a) => &a.remote,
            GrantsCommand::Revoke(a) => &a.remote,
        }
    }
}

pub async fn run(client: &Client, cmd: GrantsCommand, json: bool) -> Result<(), client::Error> {
    match cmd {
        GrantsCommand::Ls(a) => ls(client, a, json).await,
        GrantsCommand::Revoke(a) => revoke(client, a, json).await,
    }
}

async fn ls(client: &Client, a: GrantsLsArgs, json: bool) -> Result<(), client::Error> {
    let query = GrantsQuery {
        agent: a.agent,
        run: a.run,
        state: a.state,
    };
    let list: Reply<GrantList> = client.get_with("v1/grants", &query).await?;
    if json {
        out(&format!("{}\n", list.json));
    } else if list.body.grants.is_empty() {
        eprintln!("no grants");
    } else {
        out(&grants_table(&list.body.grants, Utc::now()));
    }
    Ok(())
}

/// One call per grant, in order, stopping at the first refusal.
async fn revoke(client: &Client, a: GrantsRevokeArgs, json: bool) -> Result<(), client::Error> {
    for id in a.ids {
        let reply: Reply<GrantView> = client.delete_as(&format!("v1/grants/{id}")).await?;
        if json {
            out(&format!("{}\n", reply.json));
        } else {
            let g = &reply.body.grant;
            out(&format!(
                "grant {id} revoked by {} ({} of `{}`, made by {})\n",
                g.revoked_by.as_deref().unwrap_or("?"),
                g.scope,
                g.tool,
                g.created_by.id
            ));
        }
    }
    Ok(())
}

/// `delta grants ls`: one line per grant.
pub fn grants_table(grants: &[GrantView], now: DateTime<Utc>) -> String {
    let rows: Vec<Vec<String>> = grants
        .iter()
        .map(|v| {
            let g = &v.grant;
            let state = match v.state {
                GrantState::Active => "active",
                GrantState::Revoked => "revoked",
                GrantState::Expired => "expired",
                GrantState::UsedUp => "used up",
            };
            let scope = match g.scope {
                delta_protocol::grant::GrantScope::Agent => "agent".to_owned(),
                delta_protocol::grant::GrantScope::Run => format!("run {}", g.run_id),
            };
            let uses = match g.max_uses {
                Some(m) => format!("{}/{m}", g.uses),
                None => g.uses.to_string(),
            };
            vec![
                g.grant_id.to_string(),
                g.agent.clone(),
                g.tool.clone(),
                scope,
                state.to_owned(),
                uses,
                g.created_by.id.clone(),
                ago(time(g.created_at), now),
                g.expires_at
                    .map(|t| until(time(t), now))
                    .unwrap_or_else(|| "never".into()),
                short(&delta_engine::grants::describe_args(&v.grant), 60),
            ]
        })
        .collect();
    table(
        &[
            "ID", "AGENT", "TOOL", "SCOPE", "STATE", "USES", "BY", "MADE", "EXPIRES", "ARGS",
        ],
        &rows,
    )
}
