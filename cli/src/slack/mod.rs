//! `delta slack --config <file>`: the Slack bridge (docs/slack.md).
//!
//! - **Questions in.** A durable JetStream consumer of its own (`<p>-slack`) on the events
//!   stream reads every question's announcement and what happens to it (answered, expired,
//!   cancelled, a claim or a vote, an escalation step). A question is posted once per target
//!   its route names (a channel, and with `dm: true` each person its `allowed_responders`
//!   names); later events update each of those messages (`chat.update`) or post in their
//!   thread (escalation steps).
//! - **Answers out.** `POST /slack/interactivity` is verified (Slack's v0 signature, five
//!   minutes) before anything in it is read, acknowledged at once, then handled: a button
//!   answers through the gateway's one answer path, as the person the Slack user maps to
//!   (a `relay` token); an option that needs text opens a modal whose submission answers.
//!   Refusals are shown to the person who clicked only. Each answer (a button that answers, a
//!   form sent) is noted in the bucket before its `200` and the note removed once it is
//!   handled, so that a bridge that died in between handles it when it starts again
//!   ([`replay_clicks`]).
//! - **Once.** Where each question was posted is kept in a KV bucket of its own
//!   ([`store`]); a post under way is marked first, so that after a crash between posting
//!   and recording, Slack's history (the message's metadata) is searched before posting again.

pub mod api;
pub mod config;
pub mod render;
pub mod store;
pub mod verify;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use delta_api::{AnswerAccepted, AnswerStatus, InteractionView};
use delta_protocol::events::{self, EventType};
use delta_protocol::human::{Escalated, InteractionUpdate};
use delta_protocol::{InteractionRequest, InteractionState, OptionAction, RequestId, Resolved};
use futures_util::StreamExt;
use serde_json::{Value, json};
use slack_morphism::prelude::*;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::client::{self, Client};
use config::Config;
use store::{Post, Record, Store};

/// `delta slack`.
#[derive(Debug, Clone, clap::Args)]
pub struct SlackArgs {
    /// The bridge's config file (YAML; docs/slack.md). Secrets come from the environment:
    /// SLACK_BOT_TOKEN, SLACK_SIGNING_SECRET, DELTA_TOKEN (the gateway's relay token),
    /// DELTA_NATS_URL (with the NATS user's credentials).
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
}

/// Runs the bridge until `cancel`; the exit code.
pub async fn run(a: SlackArgs, cancel: CancellationToken) -> i32 {
    let env: HashMap<String, String> = std::env::vars().collect();
    let cfg = match Config::load(&a.config, &env) {
        Ok(c) => c,
        Err(errors) => {
            for e in errors {
                eprintln!("error: {e}");
            }
            return 2;
        }
    };
    match serve(cfg, cancel).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    }
}

/// The bridge as `delta dev --slack` runs it: in this process, on the local fleet, with a
/// tokens file made for the session (the bridge as a relay, each person of its user mapping
/// with the role `answer`).
pub struct DevBridge {
    /// The gateway's tokens file.
    pub tokens_file: PathBuf,
    config: PathBuf,
    relay_token: String,
    people: Vec<String>,
}

/// The bridge running under `delta dev`.
pub struct RunningBridge {
    handle: tokio::task::JoinHandle<anyhow::Result<()>>,
    listen: std::net::SocketAddr,
    tokens_file: PathBuf,
    people: Vec<String>,
}

fn random_token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

impl DevBridge {
    /// Reads the config (its errors before anything starts) and writes the tokens file in `dir`.
    pub fn prepare(config: &std::path::Path, dir: &std::path::Path) -> anyhow::Result<DevBridge> {
        let mut env: HashMap<String, String> = std::env::vars().collect();
        // The local fleet's NATS is not known yet: a stand-in to read the rest.
        env.insert(config::ENV_NATS_URL.into(), "nats://127.0.0.1:4222".into());
        let cfg = Config::load(config, &env).map_err(|e| anyhow::anyhow!(e.join("\n")))?;
        let mut people: Vec<String> = cfg
            .users
            .by_id
            .values()
            .chain(cfg.users.by_email.values())
            .filter(|p| {
                !["slack", "operator", "timeout", "system", "anonymous"].contains(&p.as_str())
            })
            .cloned()
            .collect();
        people.sort();
        people.dedup();
        let relay_token = random_token();
        let mut text = format!(
            "# delta dev --slack: the bridge and the people of its user mapping.\n- name: slack\n  token: {relay_token}\n  roles: [relay]\n"
        );
        for p in &people {
            text.push_str(&format!(
                "- name: {}\n  token: {}\n  roles: [answer]\n",
                serde_json::to_string(p).unwrap_or_default(),
                random_token()
            ));
        }
        let tokens_file = dir.join("tokens.yaml");
        {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tokens_file)?;
            f.write_all(text.as_bytes())?;
        }
        Ok(DevBridge {
            tokens_file,
            config: config.to_path_buf(),
            relay_token,
            people,
        })
    }

    /// Starts the bridge on the running `fleet`.
    pub async fn start(
        self,
        fleet: &delta_launcher::local::LocalFleet,
        cancel: CancellationToken,
    ) -> anyhow::Result<RunningBridge> {
        let mut env: HashMap<String, String> = std::env::vars().collect();
        let nats = fleet
            .nats_url_as(delta_queue::access::NatsRole::Slack)
            .ok_or_else(|| anyhow::anyhow!("the local fleet has no NATS"))?;
        env.insert(config::ENV_NATS_URL.into(), nats);
        env.insert(config::ENV_GATEWAY_TOKEN.into(), self.relay_token.clone());
        env.remove("DELTA_KEY_PREFIX");
        let mut cfg =
            Config::load(&self.config, &env).map_err(|e| anyhow::anyhow!(e.join("\n")))?;
        cfg.gateway_url = fleet.gateway_url.clone();
        cfg.gateway_ca = None;
        cfg.nats_ca = None;
        cfg.prefix = "delta".into();
        let listen = cfg.listen;
        let handle = tokio::spawn(serve(cfg, cancel));
        Ok(RunningBridge {
            handle,
            listen,
            tokens_file: self.tokens_file,
            people: self.people,
        })
    }
}

impl RunningBridge {
    /// What `delta dev` prints about the bridge.
    pub fn banner(&self) -> String {
        format!(
            "  slack       interactivity at http://{}/slack/interactivity (expose it to Slack, e.g. through a tunnel)\n              people: {} (their tokens for the inbox and CLI: {})",
            self.listen,
            if self.people.is_empty() {
                "none mapped".to_owned()
            } else {
                self.people.join(", ")
            },
            self.tokens_file.display()
        )
    }

    /// Waits for the bridge to stop (its token cancelled), at most 10 s.
    pub async fn stop(self) {
        match tokio::time::timeout(Duration::from_secs(10), self.handle).await {
            Ok(Ok(Err(e))) => eprintln!("the Slack bridge stopped: {e:#}"),
            Ok(_) => {}
            Err(_) => eprintln!("the Slack bridge did not stop within 10 s"),
        }
    }
}

/// How long the events stream waits for the bridge to acknowledge an event before delivering it
/// again.
const ACK_WAIT: Duration = Duration::from_secs(15);

/// Connections the bridge's HTTP server keeps open at once (Slack's are a few).
const MAX_CONNECTIONS: usize = 1024;

/// How long a connection to the bridge may take to send a request's headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a request may take in all, its body included: a client that sends its headers and
/// then trickles its body would hold a connection slot for ever (Slack sends at once, and wants
/// an answer within 3 s).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest body taken: Slack's interactivity payloads are a few kilobytes.
const MAX_BODY_BYTES: usize = 1 << 20;

/// Requests refused by the signature check, and when that was last said in the log: said at
/// most once a minute (a flood must not become one of log lines).
static REFUSED_REQUESTS: Mutex<(u64, Option<std::time::Instant>)> = Mutex::new((0, None));

/// The consumer's name.
fn consumer_name(prefix: &str) -> String {
    format!("{prefix}-slack")
}

/// Runs the bridge with `cfg` until `cancel`.
pub async fn serve(cfg: Config, cancel: CancellationToken) -> anyhow::Result<()> {
    cfg.check_gateway_transport().map_err(anyhow::Error::msg)?;
    let names = delta_queue::Names::new(&cfg.prefix);
    let slack = api::Slack::new(&cfg.slack_api_url, &cfg.bot_token, cfg.slack_timeout)
        .map_err(anyhow::Error::msg)?;
    let gateway = Client::new(
        &cfg.gateway_url,
        cfg.gateway_token.clone(),
        cfg.gateway_ca.as_deref(),
    )
    .map_err(anyhow::Error::msg)?;
    let settings = delta_queue::Settings {
        ca_file: cfg.nats_ca.clone(),
        ..Default::default()
    };
    let nc = delta_queue::connect_client(
        &cfg.nats_url,
        &settings,
        Some((&cfg.prefix, delta_queue::access::NatsRole::Slack)),
    )
    .await
    .map_err(|e| anyhow::anyhow!("{}", error_chain(&e)))?;
    let js = jetstream::new(nc);
    // The gateway creates the events stream: wait for it.
    let stream = loop {
        match js.get_stream(names.interactions_stream()).await {
            Ok(s) => break s,
            Err(e) => {
                tracing::info!(error = %e, "waiting for a gateway to create the events stream");
                tokio::select! {
                    _ = cancel.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            }
        }
    };
    let replicas = stream.cached_info().config.num_replicas;
    let Some(store) = Store::open(&js, &cfg.prefix, replicas, &cancel).await? else {
        return Ok(());
    };
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", cfg.listen))?;
    let local = listener.local_addr()?;
    let bridge = Arc::new(Bridge {
        cfg,
        slack,
        gateway,
        store,
        users: Mutex::new(UserCache::default()),
        tasks: TaskTracker::new(),
    });
    replay_clicks(&bridge).await;
    let consumer = stream
        .get_or_create_consumer(
            &consumer_name(&bridge.cfg.prefix),
            jetstream::consumer::pull::Config {
                durable_name: Some(consumer_name(&bridge.cfg.prefix)),
                description: Some("delta slack: questions and what happens to them".into()),
                filter_subjects: [
                    EventType::InteractionRequested,
                    EventType::InteractionAnswered,
                    EventType::InteractionUpdated,
                    EventType::InteractionEscalated,
                ]
                .into_iter()
                .map(|t| names.event_filter(t, "*"))
                .collect(),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                // Short, with a heartbeat while an event is handled: after a crash, what the
                // dead process had pulled comes back within seconds. Few in flight, for the same
                // reason (they are handled one by one anyway).
                ack_wait: ACK_WAIT,
                max_ack_pending: 16,
                // The bridge drops an event after MAX_DELIVER tries itself (retry_delay spaces
                // them); the server's bound is the same, for a consumer made by this version.
                max_deliver: MAX_DELIVER,
                deliver_policy: jetstream::consumer::DeliverPolicy::All,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("cannot create the consumer on the events stream: {e}"))?;
    println!("delta slack: interactivity at http://{local}/slack/interactivity");
    tracing::info!(%local, "slack bridge listening");
    let app = Router::new()
        .route("/slack/interactivity", post(interactivity))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn(
            |req: axum::extract::Request, next: axum::middleware::Next| async move {
                use axum::response::IntoResponse;
                match tokio::time::timeout(REQUEST_TIMEOUT, next.run(req)).await {
                    Ok(r) => r,
                    Err(_) => StatusCode::REQUEST_TIMEOUT.into_response(),
                }
            },
        ))
        .with_state(bridge.clone());
    // Facing the internet (Slack calls it): connections capped, and a client that does not send
    // its headers in time is dropped, as the gateway does.
    let serving = delta_host::http::Serving {
        max_connections: MAX_CONNECTIONS,
        header_timeout: HEADER_TIMEOUT,
        tls: None,
    };
    let http_cancel = cancel.clone();
    let http = tokio::spawn(async move {
        // Counted, and said at most once a minute: a flood must not become one of log lines.
        let refused = std::sync::atomic::AtomicU64::new(0);
        let said = std::sync::Mutex::new(None::<std::time::Instant>);
        delta_host::http::serve(listener, app, &serving, http_cancel, || {
            let n = refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            let mut said = said.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if said.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                *said = Some(std::time::Instant::now());
                tracing::warn!(
                    refused_so_far = n,
                    "connections closed at once: {MAX_CONNECTIONS} are open (a flood, or Slack retrying)"
                );
            }
        })
        .await;
    });
    let result = consume(&bridge, &stream, consumer, &cancel).await;
    cancel.cancel();
    let _ = http.await;
    bridge.tasks.close();
    let _ = tokio::time::timeout(Duration::from_secs(10), bridge.tasks.wait()).await;
    result
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Slack users and responder identities, both ways, as far as looked up.
#[derive(Default)]
struct UserCache {
    /// Slack user id → identity (`None`: looked up, not mapped), and when it was looked up.
    identity: HashMap<String, (Option<String>, std::time::Instant)>,
    /// Identity → Slack user id (for DMs).
    slack_user: HashMap<String, (Option<String>, std::time::Instant)>,
}

/// How long a lookup is trusted: a user found, an hour; one not found (their e-mail address
/// not set yet, the app without users:read.email for a while), a minute.
fn fresh(hit: &(Option<String>, std::time::Instant)) -> Option<Option<String>> {
    let ttl = match hit.0 {
        Some(_) => Duration::from_secs(3600),
        None => Duration::from_secs(60),
    };
    (hit.1.elapsed() < ttl).then(|| hit.0.clone())
}

/// The running bridge.
struct Bridge {
    cfg: Config,
    slack: api::Slack,
    gateway: Client,
    store: Store,
    users: Mutex<UserCache>,
    /// The interactivity requests being handled after their acknowledgement.
    tasks: TaskTracker,
}

/// Why handling an event failed: it is delivered again later.
type Outcome = anyhow::Result<()>;

async fn consume(
    b: &Arc<Bridge>,
    stream: &jetstream::stream::Stream,
    consumer: jetstream::consumer::PullConsumer,
    cancel: &CancellationToken,
) -> anyhow::Result<()> {
    let mut failed_pulls: u32 = 0;
    loop {
        // One event at a time, pulled once the last is done with: an event delivered into a
        // buffer while another is handled for longer than `ack_wait` would be delivered again
        // and again meanwhile, each delivery counted as a try it never had (and dropped after
        // MAX_DELIVER of them).
        let next = async {
            let mut batch = consumer
                .batch()
                .max_messages(1)
                .expires(PULL_WAIT)
                .messages()
                .await?;
            batch.next().await.transpose()
        };
        let msg = tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            m = next => m,
        };
        let msg = match msg {
            Ok(Some(m)) => {
                failed_pulls = 0;
                m
            }
            // Nothing new within PULL_WAIT.
            Ok(None) => {
                failed_pulls = 0;
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the events stream");
                failed_pulls += 1;
                // NATS away only delays; a consumer (or stream) deleted under the bridge never
                // comes back by itself: it stops, and a start makes it again.
                if failed_pulls % 5 == 0 {
                    use jetstream::context::ConsumerInfoErrorKind as K;
                    if let Err(e) = stream.consumer_info(&consumer_name(&b.cfg.prefix)).await
                        && matches!(e.kind(), K::NotFound | K::StreamNotFound)
                    {
                        anyhow::bail!(
                            "the events stream's consumer is gone ({e}); start the bridge again to make it again"
                        );
                    }
                }
                tokio::select! {
                    _ = cancel.cancelled() => return Ok(()),
                    () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
        };
        // Slack's rate limits can hold an event for longer than `ack_wait`: say it is in hand,
        // up to HANDLE_MAX (each Slack call has its own timeout; this bounds them all).
        let handled = b.event(&msg.subject, &msg.payload);
        tokio::pin!(handled);
        let deadline = tokio::time::Instant::now() + HANDLE_MAX;
        let outcome = loop {
            tokio::select! {
                r = &mut handled => break r,
                _ = tokio::time::sleep_until(deadline) => {
                    // Dropped between two awaits: every step is recorded before the next, so
                    // the next delivery goes on from there.
                    break Err(anyhow::anyhow!("handling the event took over {HANDLE_MAX:?}"));
                }
                _ = tokio::time::sleep(ACK_WAIT / 3) => {
                    let _ = msg.ack_with(jetstream::AckKind::Progress).await;
                }
            }
        };
        let delivered = msg.info().map(|i| i.delivered).unwrap_or(1);
        let ack = match outcome {
            Ok(()) => jetstream::AckKind::Ack,
            Err(e) => match failure(&e, delivered) {
                Failure::Again(delay) => {
                    tracing::warn!(error = %format!("{e:#}"), subject = %msg.subject, delivered, "handling an event failed; it comes again in {delay:?}");
                    jetstream::AckKind::Nak(Some(delay))
                }
                Failure::Refused(s) => {
                    tracing::error!(error = %format!("{e:#}"), subject = %msg.subject, advice = s.advice(), "Slack refused for good: this event is dropped");
                    jetstream::AckKind::Term
                }
                Failure::GaveUp => {
                    tracing::error!(error = %format!("{e:#}"), subject = %msg.subject, delivered, "handling an event failed {MAX_DELIVER} times: it is dropped");
                    jetstream::AckKind::Term
                }
            },
        };
        let done = match ack {
            jetstream::AckKind::Ack => msg.double_ack().await,
            other => msg.ack_with(other).await,
        };
        if let Err(e) = done {
            tracing::warn!(error = %e, "acknowledging an event");
        }
    }
}

/// How long one pull waits for an event before it is made again.
const PULL_WAIT: Duration = Duration::from_secs(5);

/// How long handling one event may take in all.
const HANDLE_MAX: Duration = Duration::from_secs(600);

/// How many times an event is tried before it is dropped: with [`retry_delay`], about a day.
const MAX_DELIVER: i64 = 300;

/// The wait before the `delivered`th try of an event is tried again: 5 s, doubling, at most
/// 5 min.
fn retry_delay(delivered: i64) -> Duration {
    let doublings = u32::try_from(delivered.clamp(1, 32) - 1).unwrap_or(0);
    Duration::from_secs(5)
        .saturating_mul(2u32.saturating_pow(doublings))
        .min(Duration::from_secs(300))
}

/// What becomes of an event whose handling failed.
#[derive(Debug)]
enum Failure<'a> {
    /// Tried again after the delay.
    Again(Duration),
    /// Slack refuses every call of the bridge until the app is fixed (its token, its scopes):
    /// dropped, the log says what to do.
    Refused(&'a api::Error),
    /// Tried [`MAX_DELIVER`] times.
    GaveUp,
}

fn failure(e: &anyhow::Error, delivered: i64) -> Failure<'_> {
    let slack = e.chain().find_map(|c| c.downcast_ref::<api::Error>());
    if let Some(s) = slack
        && s.reach() != api::Reach::Transient
    {
        return Failure::Refused(s);
    }
    if delivered >= MAX_DELIVER {
        return Failure::GaveUp;
    }
    Failure::Again(retry_delay(delivered))
}

/// What a message shows (its blocks and text), as a SHA-256 in hex.
fn digest_of(blocks: &[SlackBlock], text: &str) -> String {
    let json = serde_json::to_string(&(blocks, text)).unwrap_or_default();
    let digest = ring::digest::digest(&ring::digest::SHA256, json.as_bytes());
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// An event's kind and `data`, from a CloudEvent or (a publisher not yet converted) from the
/// bare payload and its subject.
fn read_event(subject: &str, payload: &[u8]) -> Option<(EventType, Value)> {
    if let Ok(e) = events::decode::<Value>(payload)
        && let Some(t) = e.event_type()
    {
        return Some((t, e.data));
    }
    let data: Value = serde_json::from_slice(payload).ok()?;
    let kind = subject.split('.').nth(2)?;
    let t = match kind {
        "requested" => EventType::InteractionRequested,
        "resolved" => EventType::InteractionAnswered,
        "updated" => EventType::InteractionUpdated,
        "escalated" => EventType::InteractionEscalated,
        _ => return None,
    };
    Some((t, data))
}

impl Bridge {
    async fn event(&self, subject: &str, payload: &[u8]) -> Outcome {
        let Some((t, data)) = read_event(subject, payload) else {
            tracing::warn!(%subject, "not an event the bridge reads: skipped");
            return Ok(());
        };
        match t {
            EventType::InteractionRequested => match serde_json::from_value(data) {
                Ok(q) => self.requested(q).await,
                Err(e) => {
                    tracing::warn!(error = %e, "a question the bridge cannot read: skipped");
                    Ok(())
                }
            },
            EventType::InteractionAnswered
            | EventType::InteractionExpired
            | EventType::InteractionCancelled => match serde_json::from_value(data) {
                Ok(r) => self.resolved(r).await,
                Err(e) => {
                    tracing::warn!(error = %e, "a settling the bridge cannot read: skipped");
                    Ok(())
                }
            },
            EventType::InteractionUpdated => match serde_json::from_value(data) {
                Ok(u) => self.updated(u).await,
                Err(_) => Ok(()),
            },
            EventType::InteractionEscalated => match serde_json::from_value(data) {
                Ok(e) => self.escalated(e).await,
                Err(_) => Ok(()),
            },
            _ => Ok(()),
        }
    }

    fn render(&self, r: &Record) -> Option<(Vec<SlackBlock>, String)> {
        let q = r.request.as_ref()?;
        let s = render::Standing {
            tally: r.tally.as_ref(),
            claim: r.claim.as_ref(),
            settled: r.settled.as_ref(),
            added: &r.added,
        };
        Some(render::question(q, &s, self.cfg.inbox_url.as_deref()))
    }

    /// Brings every message of `r` to what it should show now, unless they all show it already
    /// (`r.shown`, kept once every update is done): an update that failed is done again when
    /// the event comes again, or with the question's next event.
    async fn show(&self, id: RequestId, r: &mut Record) -> Outcome {
        let Some((blocks, text)) = self.render(r) else {
            return Ok(());
        };
        let digest = digest_of(&blocks, &text);
        if r.shown.as_deref() == Some(digest.as_str()) {
            return Ok(());
        }
        for p in &r.posts {
            if let Err(e) = self
                .slack
                .update(&p.channel, &p.ts, blocks.clone(), text.clone())
                .await
            {
                self.refused(e, "updating a message", &p.channel)?;
            }
        }
        r.shown = Some(digest);
        if !r.posts.is_empty() {
            self.store.put(id, r).await?;
        }
        Ok(())
    }

    /// A Slack call that failed: a refusal that concerns only `channel` (the bot not in it, a
    /// deleted message, a message Slack refuses) is logged with what to do and skipped; anything
    /// else is an error of the event (tried again later, unless it concerns the whole bridge).
    fn refused(&self, e: api::Error, doing: &str, channel: &str) -> Outcome {
        match e.reach() {
            api::Reach::Target => {
                tracing::error!(error = %e, %channel, advice = e.advice(), "{doing}: Slack refused for good, skipped");
                Ok(())
            }
            api::Reach::Transient | api::Reach::Bridge => Err(e.into()),
        }
    }

    /// Where `q` goes: `(target, channel or Slack user id to post to)`.
    /// A DM whose Slack user cannot be looked up now is left out, and the lookup's error given
    /// back, for the event to come again once the others are posted.
    async fn targets(
        &self,
        q: &InteractionRequest,
        extra: &[String],
    ) -> (Vec<(String, String)>, Option<api::Error>) {
        let Some(route) = self.cfg.route(&q.agent) else {
            return (vec![], None);
        };
        let mut out = vec![];
        let mut later = None;
        if let Some(c) = &route.channel {
            out.push((format!("channel:{c}"), c.clone()));
        }
        if route.dm {
            for who in q.allowed_responders.iter().chain(extra) {
                if who.starts_with(delta_protocol::human::GROUP_PREFIX) {
                    continue;
                }
                match self.slack_user_of(who).await {
                    Ok(Some(u)) => out.push((format!("dm:{who}"), u)),
                    Ok(None) => tracing::info!(%who, "no Slack user maps to this responder: no DM"),
                    // That one DM waits (or is skipped for good); the other targets do not.
                    Err(e) => match e.reach() {
                        api::Reach::Transient => {
                            tracing::warn!(error = %e, %who, "cannot find the Slack user for a DM: tried again later");
                            later.get_or_insert(e);
                        }
                        api::Reach::Target | api::Reach::Bridge => tracing::error!(
                            error = %e, %who, advice = e.advice(),
                            "cannot find the Slack user for a DM: no DM to them"
                        ),
                    },
                }
            }
        }
        (out, later)
    }

    async fn requested(&self, q: InteractionRequest) -> Outcome {
        let id = q.request_id;
        // A question no route takes is none of the bridge's business: no gateway call, no
        // record (and so no record of what happens to it either).
        if self.cfg.route(&q.agent).is_none() {
            return Ok(());
        }
        let mut rec = self.store.get(id).await?;
        let again = rec
            .request
            .as_ref()
            .is_some_and(|old| old.request_hash != q.request_hash);
        let known = !rec.posts.is_empty() || !rec.posting.is_empty();
        let settled = rec.settled.is_some() || rec.closed;
        let mut reopened = false;
        if !known || settled {
            // Caught up after a while: post only what still waits for an answer. Settled here
            // but announced again: reopened, if the gateway says it waits.
            match self
                .gateway
                .get_as::<InteractionView>(&format!("v1/interactions/{id}"), &[])
                .await
            {
                Ok(v) if v.body.state != InteractionState::Pending => {
                    if !settled {
                        rec.closed = true;
                        self.store.put(id, &rec).await?;
                    }
                    return Ok(());
                }
                Ok(v) => {
                    rec.tally = v.body.tally;
                    rec.claim = v.body.claim;
                    // Escalation steps taken before this question's first post (their events
                    // found nothing to show): who they let answer is in the view.
                    for who in v.body.added_responders {
                        if !rec.added.contains(&who) {
                            rec.added.push(who);
                        }
                    }
                    if settled {
                        if let Some(undone) = rec.settled.take() {
                            rec.reopened_after = Some(undone.resolved_at);
                        }
                        rec.closed = false;
                        reopened = true;
                    }
                }
                Err(client::Error::NotFound { .. }) => return Ok(()),
                Err(e) => anyhow::bail!("asking the gateway about {id}: {e}"),
            }
        }
        rec.request = Some(q.clone());
        if again || reopened {
            self.store.put(id, &rec).await?;
        }
        // Posts started before a crash: Slack may have them already.
        self.recover(id, &mut rec).await?;
        // Asked again or reopened (or an update that failed before): the same messages show the
        // question as it is now, buttons and all.
        self.show(id, &mut rec).await?;
        self.post_all(id, &mut rec, &q).await
    }

    /// Posts the question to each target of its route it was not posted to yet.
    async fn post_all(&self, id: RequestId, rec: &mut Record, q: &InteractionRequest) -> Outcome {
        let Some((blocks, text)) = self.render(rec) else {
            return Ok(());
        };
        let (targets, later) = self.targets(q, &rec.added).await;
        if targets.is_empty() && self.cfg.route(&q.agent).is_some() {
            // Nothing to post to yet (a route of DMs whose people are not mapped, or only
            // groups): the question is kept all the same, for an escalation step that adds
            // someone to DM.
            self.store.put(id, rec).await?;
        }
        self.post_to(id, rec, targets, blocks, text).await?;
        match later {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Posts the question to each of `targets` it was not posted to yet; each post is marked
    /// under way first and recorded once Slack has it.
    async fn post_to(
        &self,
        id: RequestId,
        rec: &mut Record,
        targets: Vec<(String, String)>,
        blocks: Vec<SlackBlock>,
        text: String,
    ) -> Outcome {
        // A target Slack cannot take now waits for the event's next try; the others go on.
        let mut later: Option<api::Error> = None;
        for (target, to) in targets {
            if rec.posts.iter().any(|p| p.target == target) {
                continue;
            }
            if !rec.posting.contains(&target) {
                rec.posting.push(target.clone());
                self.store.put(id, rec).await?;
            }
            let posted = match self
                .slack
                .post(
                    &to,
                    blocks.clone(),
                    text.clone(),
                    Some(&id.to_string()),
                    None,
                )
                .await
            {
                Ok(p) => p,
                Err(e) if e.reach() == api::Reach::Transient => {
                    // Still under way: the next try finds out whether Slack took it after all.
                    tracing::warn!(error = %e, channel = %to, "posting a question: tried again later");
                    later.get_or_insert(e);
                    continue;
                }
                Err(e) => {
                    self.refused(e, "posting a question", &to)?;
                    // Refused for good there: not under way any more, the other targets go on.
                    rec.posting.retain(|t| t != &target);
                    self.store.put(id, rec).await?;
                    continue;
                }
            };
            rec.posting.retain(|t| t != &target);
            rec.posts.push(Post {
                target,
                channel: posted.channel,
                ts: posted.ts,
                steps: vec![],
            });
            self.store.put(id, rec).await?;
        }
        match later {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Posts a crash left unrecorded (`posting`), found in their channel's history by their
    /// metadata, recorded now: so that what happens to the question reaches them too.
    async fn recover(&self, id: RequestId, rec: &mut Record) -> Outcome {
        let Some(q) = rec.request.as_ref() else {
            return Ok(());
        };
        let oldest = q.timestamp.micros() / 1_000_000 - 60;
        let mut found = false;
        for target in rec.posting.clone() {
            let Some(channel) = target.strip_prefix("channel:") else {
                continue;
            };
            match self
                .slack
                .find_posted(channel, oldest, &id.to_string())
                .await
            {
                Ok(Some(ts)) => {
                    rec.posting.retain(|t| t != &target);
                    rec.posts.push(Post {
                        target: target.clone(),
                        channel: channel.to_owned(),
                        ts,
                        steps: vec![],
                    });
                    found = true;
                }
                Ok(None) => {}
                // Slack slow or away: the post may be there. The event comes again rather than
                // post a second copy.
                Err(e) if e.reach() == api::Reach::Transient => {
                    if found {
                        self.store.put(id, rec).await?;
                    }
                    return Err(e.into());
                }
                Err(e) => {
                    tracing::warn!(error = %e, advice = e.advice(), "cannot search the channel's history (channels:history): a post a crash left unrecorded may be made again")
                }
            }
        }
        if found {
            self.store.put(id, rec).await?;
        }
        Ok(())
    }

    async fn resolved(&self, r: Resolved) -> Outcome {
        let id = r.request_id;
        let mut rec = self.store.get(id).await?;
        if rec.request.is_none() && rec.posts.is_empty() && rec.posting.is_empty() {
            // Never posted (no route, or settled before its announcement was read: then the
            // announcement finds it settled at the gateway).
            return Ok(());
        }
        self.recover(id, &mut rec).await?;
        if is_undone(&rec, &r) {
            // The settling a reopen undid, delivered again: the question waits again.
            return self.show(id, &mut rec).await;
        }
        if rec.settled.is_none() {
            rec.settled = Some(r);
            rec.claim = None;
            self.store.put(id, &rec).await?;
        }
        // Also when the settling was recorded already: its updates may not all be done.
        self.show(id, &mut rec).await
    }

    async fn updated(&self, u: InteractionUpdate) -> Outcome {
        let id = u.request_id;
        let mut rec = self.store.get(id).await?;
        if rec.settled.is_some() || rec.request.is_none() {
            return Ok(());
        }
        if rec.updated_at.is_some_and(|last| u.at < last) {
            // Delivered again after a later one: the record already shows what came after.
            return Ok(());
        }
        self.recover(id, &mut rec).await?;
        rec.claim = u.claim;
        if u.tally.is_some() {
            rec.tally = u.tally;
        }
        rec.updated_at = Some(u.at);
        self.store.put(id, &rec).await?;
        self.show(id, &mut rec).await
    }

    async fn escalated(&self, e: Escalated) -> Outcome {
        let id = e.request_id;
        let mut rec = self.store.get(id).await?;
        if rec.settled.is_some() || rec.request.is_none() {
            return Ok(());
        }
        self.recover(id, &mut rec).await?;
        if !rec.escalations.contains(&e.step) {
            // In each message's thread once: a redelivery posts only where it is missing.
            let line = render::escalation_line(&e);
            for i in 0..rec.posts.len() {
                let (channel, ts) = (rec.posts[i].channel.clone(), rec.posts[i].ts.clone());
                if rec.posts[i].steps.contains(&e.step) {
                    continue;
                }
                if let Err(e) = self
                    .slack
                    .post(&channel, vec![], line.clone(), None, Some(&ts))
                    .await
                {
                    self.refused(e, "posting an escalation step in a thread", &channel)?;
                }
                rec.posts[i].steps.push(e.step);
                self.store.put(id, &rec).await?;
            }
            rec.escalations.push(e.step);
            self.store.put(id, &rec).await?;
        }
        // People the step lets answer get the question in a DM too, where the route says so
        // (each target once: a redelivery posts only what is missing).
        if !e.what.add_responders.is_empty()
            && let Some(q) = rec.request.clone()
        {
            for who in &e.what.add_responders {
                if !rec.added.contains(who) {
                    rec.added.push(who.clone());
                }
            }
            self.store.put(id, &rec).await?;
            // The messages' "who may answer" line names them too.
            self.show(id, &mut rec).await?;
            self.post_all(id, &mut rec, &q).await?;
        }
        Ok(())
    }

    /// The responder identity of a Slack user: the mapping by id, else by the e-mail address
    /// Slack gives for them (`users.info`), looked up once.
    async fn identity_of(&self, user: &str) -> anyhow::Result<Option<String>> {
        if let Some(id) = self.cfg.users.by_id.get(user) {
            return Ok(Some(id.clone()));
        }
        if let Ok(cache) = self.users.lock()
            && let Some(hit) = cache.identity.get(user).and_then(fresh)
        {
            return Ok(hit);
        }
        let found = match self.cfg.users.by_email.is_empty() {
            true => None,
            false => self
                .slack
                .email_of(user)
                .await?
                .and_then(|e| self.cfg.users.by_email.get(&e.to_lowercase()).cloned()),
        };
        if let Ok(mut cache) = self.users.lock() {
            cache
                .identity
                .insert(user.to_owned(), (found.clone(), std::time::Instant::now()));
        }
        Ok(found)
    }

    /// The Slack user of a responder identity (for a DM).
    async fn slack_user_of(&self, who: &str) -> Result<Option<String>, api::Error> {
        let mut by_id: Vec<&String> = self
            .cfg
            .users
            .by_id
            .iter()
            .filter(|(_, v)| v.as_str() == who)
            .map(|(k, _)| k)
            .collect();
        by_id.sort();
        if let Some(u) = by_id.first() {
            return Ok(Some((*u).clone()));
        }
        if let Ok(cache) = self.users.lock()
            && let Some(hit) = cache.slack_user.get(who).and_then(fresh)
        {
            return Ok(hit);
        }
        let mut emails: Vec<&String> = self
            .cfg
            .users
            .by_email
            .iter()
            .filter(|(_, v)| v.as_str() == who)
            .map(|(k, _)| k)
            .collect();
        emails.sort();
        let mut found = None;
        for e in emails {
            if let Some(u) = self.slack.user_by_email(e).await? {
                found = Some(u);
                break;
            }
        }
        if let Ok(mut cache) = self.users.lock() {
            cache
                .slack_user
                .insert(who.to_owned(), (found.clone(), std::time::Instant::now()));
        }
        Ok(found)
    }
}

/// Whether `r` is a settling a reopen of the question undid (or an older one): delivered
/// again after the reopen, it must not show the waiting question as settled.
fn is_undone(rec: &Record, r: &Resolved) -> bool {
    rec.reopened_after.is_some_and(|t| r.resolved_at <= t)
}

/// Whether `p` comes from the workspace `ours`, both where it happened and the user's own.
/// Without `ours`: from anyone whose own workspace is where it happened; a guest of another
/// organisation (Slack Connect) only when mapped by their Slack id (`by_id`), since an e-mail
/// address in another organisation's Slack is that organisation's to give.
fn of_team(ours: Option<&str>, mapped_by_id: bool, p: &Payload) -> bool {
    let Some(ours) = ours else {
        let guest = matches!(
            (p.user.team_id.as_deref(), p.team.as_ref()),
            (Some(own), Some(here)) if own != here.id
        );
        return !guest || mapped_by_id;
    };
    p.team.as_ref().is_some_and(|t| t.id == ours)
        && p.user.team_id.as_deref().is_none_or(|t| t == ours)
}

/// What Slack posts to the interactivity URL, as far as the bridge reads it.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Payload {
    #[serde(rename = "type")]
    kind: String,
    user: PayloadUser,
    /// The workspace the interaction happened in.
    #[serde(default)]
    team: Option<PayloadTeam>,
    #[serde(default)]
    trigger_id: Option<String>,
    #[serde(default)]
    channel: Option<PayloadChannel>,
    #[serde(default)]
    actions: Vec<PayloadAction>,
    #[serde(default)]
    view: Option<PayloadView>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct PayloadUser {
    id: String,
    /// The user's own workspace (another one for a Slack Connect guest).
    #[serde(default)]
    team_id: Option<String>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct PayloadTeam {
    id: String,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct PayloadChannel {
    id: String,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct PayloadAction {
    action_id: String,
    #[serde(default)]
    value: Option<String>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct PayloadView {
    #[serde(default)]
    private_metadata: Option<String>,
    #[serde(default)]
    state: Option<Value>,
}

/// What a modal carries from the click to its submission.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct ModalMeta {
    /// The request, the option (empty: none), the kind of modal, the channel of the click.
    r: RequestId,
    o: String,
    k: String,
    c: String,
    /// The `request_hash` the clicked message showed ([`render::Shown::token`]; empty in a
    /// modal opened by an older bridge): the submission answers that version or nothing.
    #[serde(default)]
    h: String,
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// `POST /slack/interactivity`: verified, acknowledged at once, handled after.
async fn interactivity(
    State(b): State<Arc<Bridge>>,
    headers: HeaderMap,
    body: Bytes,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    if let Err(e) = verify::verify(
        &b.cfg.signing_secret,
        header("x-slack-request-timestamp"),
        header("x-slack-signature"),
        &body,
        now_secs(),
    ) {
        let mut refused = REFUSED_REQUESTS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        refused.0 += 1;
        if refused
            .1
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(60))
        {
            refused.1 = Some(std::time::Instant::now());
            tracing::warn!(error = %e, refused_so_far = refused.0, "an interactivity request refused (said at most once a minute)");
        }
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let payload = form_urlencoded::parse(&body)
        .find(|(k, _)| k == "payload")
        .map(|(_, v)| v.into_owned());
    let Some(payload) = payload else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let payload: Payload = match serde_json::from_str(&payload) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "an interactivity payload the bridge cannot read");
            return StatusCode::BAD_REQUEST.into_response();
        }
    };
    // A form whose own checks fail stays open, the errors under its fields: nothing is answered.
    if payload.kind == "view_submission"
        && let Some(view) = &payload.view
        && let Some(meta) = view
            .private_metadata
            .as_deref()
            .and_then(|m| serde_json::from_str::<ModalMeta>(m).ok())
    {
        // The schema only for a typed form, read briefly: the `200` is due within 3 s, and the
        // click's note may take 1.5 s of them after this.
        let typed = view
            .state
            .as_ref()
            .and_then(|s| s.get("values"))
            .and_then(Value::as_object)
            .is_some_and(|v| v.keys().any(|k| k.starts_with("f.")));
        let schema = if typed {
            match tokio::time::timeout(Duration::from_millis(500), b.store.get(meta.r)).await {
                Ok(Ok(rec)) => rec.request.and_then(|q| q.response_schema),
                _ => None,
            }
        } else {
            None
        };
        if let Some(errors) = form_errors(view, schema.as_ref()) {
            return axum::Json(json!({"response_action": "errors", "errors": errors}))
                .into_response();
        }
    }
    // An answer (a button that answers, a form sent) is noted before the `200`, so that a
    // bridge that dies before it is handled handles it when it starts again; not noted in time
    // (NATS away for longer than Slack waits), it is handled all the same. A click that opens a
    // form is not: its trigger is good for 3 s, and nothing could open the form later.
    let answers = match payload.kind.as_str() {
        "view_submission" => true,
        "block_actions" => payload.actions.first().is_some_and(|a| {
            render::parse_click(&a.action_id, a.value.as_deref().unwrap_or(""))
                .is_some_and(|c| c.act == render::Act::Answer)
        }),
        _ => false,
    };
    let mut note = answers.then(|| {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let click = store::Pending {
            at: now_secs(),
            payload: serde_json::to_value(&payload).unwrap_or_default(),
        };
        let store = b.store.clone();
        let task = tokio::spawn({
            let id = id.clone();
            async move { store.note_click(&id, click).await }
        });
        (id, task)
    });
    // Whether the note is still under way: then the click's handling waits for it before
    // removing it, so that a note written late is not left behind, to be handled again.
    let mut late = false;
    if let Some((_, task)) = &mut note {
        match tokio::time::timeout(NOTE_WITHIN, &mut *task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => {
                tracing::warn!(error = %e, "a click not noted: handled now, lost should the bridge stop first");
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "a click's note failed"),
            Err(_) => {
                tracing::warn!(
                    "a click not noted in time: handled now, lost should the bridge stop first"
                );
                late = true;
            }
        }
    }
    let bridge = b.clone();
    b.tasks.spawn(async move {
        delta_host::failpoint_delay("slack:before-click").await;
        let id = match note {
            Some((id, task)) => {
                if late {
                    let _ = task.await;
                }
                Some(id)
            }
            None => None,
        };
        bridge.handle(id.as_deref(), payload).await;
    });
    StatusCode::OK.into_response()
}

/// What a form sent can be told in the form itself, which then stays open with the person's
/// typing (Slack's `response_action: errors`, by block id): arguments that are not a JSON
/// object, a typed field of the wrong kind. `None`: nothing to say there (the gateway's own
/// checks come after, told to the person alone).
fn form_errors(view: &PayloadView, schema: Option<&Value>) -> Option<Value> {
    let values = form_values(view.state.as_ref());
    if let Some(args) = values.get("args")
        && !serde_json::from_str::<Value>(args).is_ok_and(|v| v.is_object())
    {
        return Some(
            json!({"args": "Not a JSON object: write the arguments as {\"name\": value, …}."}),
        );
    }
    if let Some(schema) = schema
        && let Err((field, message)) = typed_field(schema, &values)
    {
        return Some(json!({ format!("f.{field}"): message }));
    }
    None
}

/// How long a click's note may take before the `200` (Slack waits 3 s in all).
const NOTE_WITHIN: Duration = Duration::from_millis(1500);

/// How old a noted answer may be and still be handled when the bridge starts again; an older one
/// is dropped, and its user told to answer again.
const REPLAY_WITHIN: i64 = 24 * 3600;

/// Handles the clicks a bridge that stopped (or died) had acknowledged and not handled.
async fn replay_clicks(bridge: &Arc<Bridge>) {
    let pending = match bridge.store.pending_clicks().await {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the clicks acknowledged before this start; they are handled at the next one");
            return;
        }
    };
    if !pending.is_empty() {
        tracing::info!(
            clicks = pending.len(),
            "handling the clicks acknowledged before this start"
        );
    }
    for (id, click) in pending {
        let payload: Payload = match serde_json::from_value(click.payload) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "a noted click the bridge cannot read; dropped");
                let _ = bridge.store.click_done(&id).await;
                continue;
            }
        };
        let b = bridge.clone();
        if now_secs().saturating_sub(click.at) > REPLAY_WITHIN {
            tracing::warn!(
                age_s = now_secs().saturating_sub(click.at),
                "a click too old to handle; dropped"
            );
            bridge.tasks.spawn(async move {
                b.not_handled(&payload).await;
                let _ = b.store.click_done(&id).await;
            });
            continue;
        }
        bridge.tasks.spawn(async move {
            b.handle(Some(&id), payload).await;
        });
    }
}

impl Bridge {
    /// Handles an interaction, then notes it handled if it was noted (`id`).
    async fn handle(&self, id: Option<&str>, payload: Payload) {
        if let Err(e) = self.interaction(payload).await {
            tracing::warn!(error = %format!("{e:#}"), "handling a Slack interaction failed");
        }
        if let Some(id) = id
            && let Err(e) = self.store.click_done(id).await
        {
            tracing::warn!(error = %e, "a click not noted handled: it is handled again at the next start");
        }
    }

    /// Tells who answered that their answer was not handled, as it came too long before.
    async fn not_handled(&self, p: &Payload) {
        let channel = p.channel.as_ref().map(|c| c.id.clone()).or_else(|| {
            p.view
                .as_ref()
                .and_then(|v| v.private_metadata.as_deref())
                .and_then(|m| serde_json::from_str::<ModalMeta>(m).ok())
                .map(|m| m.c)
        });
        if let Some(channel) = channel {
            self.tell(&channel, &p.user.id, NOT_HANDLED).await;
        }
    }

    async fn interaction(&self, p: Payload) -> anyhow::Result<()> {
        if !self.of_our_team(&p) {
            tracing::warn!(user = %p.user.id, team = ?p.team.as_ref().map(|t| &t.id), user_team = ?p.user.team_id, "an interaction from another workspace refused (team_id)");
            if let Some(c) = &p.channel {
                self.tell(&c.id, &p.user.id, OTHER_TEAM).await;
            }
            return Ok(());
        }
        match p.kind.as_str() {
            "block_actions" => self.clicked(p).await,
            "view_submission" => self.submitted(p).await,
            _ => Ok(()),
        }
    }

    /// Whether the interaction comes from the configured workspace, both where it happened and
    /// the user's own (always, without `team_id`).
    fn of_our_team(&self, p: &Payload) -> bool {
        of_team(
            self.cfg.team_id.as_deref(),
            self.cfg.users.by_id.contains_key(&p.user.id),
            p,
        )
    }

    /// The identity of the Slack user who clicked; else they are told why not.
    async fn who(&self, channel: &str, user: &str) -> Option<String> {
        match self.identity_of(user).await {
            Ok(Some(id)) => Some(id),
            Ok(None) => {
                self.tell(channel, user, UNMAPPED).await;
                None
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "cannot look a Slack user up");
                self.tell(
                    channel,
                    user,
                    "The bridge cannot look you up in Slack right now (users:read / users:read.email?): nothing was answered. Try again later.",
                )
                .await;
                None
            }
        }
    }

    async fn tell(&self, channel: &str, user: &str, text: &str) {
        if let Err(e) = self.slack.ephemeral(channel, user, text).await {
            tracing::warn!(error = %e, "cannot tell the user why");
        }
    }

    async fn clicked(&self, p: Payload) -> anyhow::Result<()> {
        let Some(action) = p.actions.first() else {
            return Ok(());
        };
        let channel = p.channel.as_ref().map(|c| c.id.clone()).unwrap_or_default();
        let user = p.user.id.clone();
        let Some(click) =
            render::parse_click(&action.action_id, action.value.as_deref().unwrap_or(""))
        else {
            return Ok(());
        };
        let rid = click.request_id;
        match click.act {
            render::Act::Answer => {
                let Some(identity) = self.who(&channel, &user).await else {
                    return Ok(());
                };
                let Some(q) = self.question_for(rid, &channel, &user).await? else {
                    return Ok(());
                };
                let body = json!({
                    "option_id": render::option_of_key(&q, &click.key),
                    "request_hash": click.shown.echo(q.request_hash.as_deref()),
                    "responder": {"id": identity, "via": "slack"},
                });
                self.answer(&channel, &user, rid, body).await;
            }
            render::Act::Modal | render::Act::Edit => {
                // Slack's trigger is good for 3 s: the modal opens first (its content is the
                // question as kept here, one read of a local bucket); who clicked is looked up
                // after, and again when the form is sent.
                let Some(trigger) = p.trigger_id.as_deref() else {
                    return Ok(());
                };
                let Some(q) = self.question_for(rid, &channel, &user).await? else {
                    return Ok(());
                };
                let meta = ModalMeta {
                    r: rid,
                    o: click.key,
                    k: click.act.prefix().to_owned(),
                    c: channel.clone(),
                    h: click.shown.token().to_owned(),
                };
                let view = modal(&q, &meta);
                if let Err(e) = self.slack.open_modal(trigger, view).await {
                    self.tell(&channel, &user, &format!("Cannot open the form: {e}"))
                        .await;
                    return Ok(());
                }
                // Told now, not after filling the form in, when the bridge cannot answer for them.
                let _ = self.who(&channel, &user).await;
            }
        }
        Ok(())
    }

    /// The question of a click as the bridge holds it, unless it is unknown or sensitive (the
    /// user is told so).
    async fn question_for(
        &self,
        rid: RequestId,
        channel: &str,
        user: &str,
    ) -> anyhow::Result<Option<InteractionRequest>> {
        let rec = self.store.get(rid).await?;
        let Some(q) = rec.request else {
            self.tell(
                channel,
                user,
                "This question is not known to the bridge any more.",
            )
            .await;
            return Ok(None);
        };
        if q.is_sensitive() {
            self.tell(channel, user, SENSITIVE).await;
            return Ok(None);
        }
        Ok(Some(q))
    }

    async fn submitted(&self, p: Payload) -> anyhow::Result<()> {
        let Some(view) = p.view else { return Ok(()) };
        let Some(meta) = view
            .private_metadata
            .as_deref()
            .and_then(|m| serde_json::from_str::<ModalMeta>(m).ok())
        else {
            return Ok(());
        };
        let user = p.user.id.clone();
        let channel = meta.c.clone();
        let Some(identity) = self.who(&channel, &user).await else {
            return Ok(());
        };
        let rec = self.store.get(meta.r).await?;
        let Some(q) = rec.request.clone() else {
            return Ok(());
        };
        if q.is_sensitive() {
            self.tell(&channel, &user, SENSITIVE).await;
            return Ok(());
        }
        let values = form_values(view.state.as_ref());
        let shown = render::Shown::parse(&meta.h);
        let mut body = json!({
            "request_hash": shown.echo(q.request_hash.as_deref()),
            "responder": {"id": identity, "via": "slack"},
        });
        if !meta.o.is_empty() {
            body["option_id"] = json!(render::option_of_key(&q, &meta.o));
        }
        if let Some(text) = values.get("input").filter(|t| !t.is_empty()) {
            body["input"] = json!(text);
        }
        if let Some(text) = values.get("feedback").filter(|t| !t.is_empty()) {
            body["feedback"] = json!(text);
        }
        if let Some(args) = values.get("args") {
            match serde_json::from_str::<Value>(args) {
                Ok(v) if v.is_object() => body["data"] = json!({"args": v}),
                _ => {
                    self.tell(
                        &channel,
                        &user,
                        "The arguments are not a JSON object: nothing was answered. Click again to fix them.",
                    )
                    .await;
                    return Ok(());
                }
            }
        }
        if let Some(schema) = &q.response_schema {
            match typed(schema, &values) {
                Ok(data) => body["data"] = data,
                Err(e) => {
                    // The schema's field names are the agent's: escaped, like all its text.
                    let e = render::escape(&e.to_string());
                    self.tell(&channel, &user, &format!("Nothing was answered: {e}"))
                        .await;
                    return Ok(());
                }
            }
        }
        self.answer(&channel, &user, meta.r, body).await;
        Ok(())
    }

    /// Answers through the gateway; a refusal, or a counted vote, is told to the user only.
    async fn answer(&self, channel: &str, user: &str, rid: RequestId, body: Value) {
        let r = self
            .gateway
            .post_as::<_, AnswerAccepted>(&format!("v1/interactions/{rid}/response"), &body, &[])
            .await;
        match r {
            Ok(a) if a.body.status == AnswerStatus::Counted => {
                // Responder ids are free text where authentication is off: escaped.
                let tally = a
                    .body
                    .tally
                    .map(|t| render::escape(&t.summary()))
                    .unwrap_or_default();
                self.tell(channel, user, &format!("Your vote was counted: {tally}."))
                    .await;
            }
            Ok(_) => {}
            Err(e) => {
                let message = match &e {
                    client::Error::Refused {
                        code: Some(delta_api::ErrorCode::Stale),
                        ..
                    } => STALE.to_owned(),
                    client::Error::Refused { message, .. } => message.clone(),
                    other => other.to_string(),
                };
                self.tell(
                    channel,
                    user,
                    &format!("Not answered: {}", render::escape(&message)),
                )
                .await;
            }
        }
    }
}

const NOT_HANDLED: &str = "The bridge stopped before it handled your answer, over a day ago: nothing was answered. Answer again if the question is still open.";
const UNMAPPED: &str = "Your Slack account is not mapped to a Delta identity, so the bridge cannot answer for you. Ask an operator to add you to the bridge's user mapping (docs/slack.md).";
const OTHER_TEAM: &str =
    "This bridge answers only for people of its own Slack workspace: nothing was answered.";
const STALE: &str = "the question changed after this message showed it (stale). Its message shows it as it is now: read it again, then answer.";
const SENSITIVE: &str =
    "This question is sensitive: it is never answered in Slack. Answer it in the web inbox.";

/// The values of a submitted modal: block id → the text typed or the option chosen.
fn form_values(state: Option<&Value>) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let Some(values) = state
        .and_then(|s| s.get("values"))
        .and_then(Value::as_object)
    else {
        return out;
    };
    for (block, actions) in values {
        let Some(actions) = actions.as_object() else {
            continue;
        };
        for (_, v) in actions {
            let text = v
                .get("value")
                .and_then(Value::as_str)
                .or_else(|| {
                    v.get("selected_option")
                        .and_then(|o| o.get("value"))
                        .and_then(Value::as_str)
                })
                .unwrap_or_default();
            out.insert(block.clone(), text.to_owned());
        }
    }
    out
}

/// A typed answer from a modal's fields (`f.<name>`), by the schema's property types; the
/// gateway checks the rest.
fn typed(schema: &Value, values: &HashMap<String, String>) -> Result<Value, String> {
    typed_field(schema, values).map_err(|(_, e)| e)
}

/// [`typed`], its error with the name of the field it is about.
fn typed_field(
    schema: &Value,
    values: &HashMap<String, String>,
) -> Result<Value, (String, String)> {
    let mut data = serde_json::Map::new();
    let props = schema
        .get("properties")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for (name, p) in props {
        let Some(text) = values
            .get(&format!("f.{name}"))
            .filter(|t| !t.trim().is_empty())
        else {
            continue;
        };
        let text = text.trim();
        let wrong = |what: &str| (name.clone(), format!("`{name}` must be {what}"));
        let v = match p.get("type").and_then(Value::as_str) {
            Some("integer") => json!(text.parse::<i64>().map_err(|_| wrong("a whole number"))?),
            Some("number") => json!(text.parse::<f64>().map_err(|_| wrong("a number"))?),
            Some("boolean") => match text.to_lowercase().as_str() {
                "true" | "yes" => json!(true),
                "false" | "no" => json!(false),
                _ => return Err(wrong("true or false")),
            },
            Some("array") => json!(
                text.split(',')
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .collect::<Vec<_>>()
            ),
            _ => json!(text),
        };
        data.insert(name, v);
    }
    Ok(Value::Object(data))
}

/// The modal for an option that needs text, a typed answer, or edited arguments.
fn modal(q: &InteractionRequest, meta: &ModalMeta) -> SlackModalView {
    let input =
        |block: &str, label: &str, multiline: bool, optional: bool, initial: Option<String>| {
            let mut el = SlackBlockPlainTextInputElement::new()
                .with_action_id(SlackActionId::new("value".into()))
                .with_multiline(multiline);
            if let Some(i) = initial {
                el = el.with_initial_value(render::truncate(&i, 3000));
            }
            SlackBlock::from(
                SlackInputBlock::new(
                    pt!(render::truncate(label, 2000)),
                    SlackInputBlockElement::PlainTextInput(el),
                )
                .with_block_id(SlackBlockId::new(block.into()))
                .with_optional(optional),
            )
        };
    let mut blocks: Vec<SlackBlock> = vec![
        SlackSectionBlock::new()
            .with_text(render::mrkdwn(render::truncate(
                &render::escape(&q.prompt),
                3000,
            )))
            .into(),
    ];
    let option = q.option(&render::option_of_key(q, &meta.o));
    if meta.k == render::ACT_EDIT {
        let args = q.context.get("args").cloned().unwrap_or(json!({}));
        blocks.push(input(
            "args",
            "Arguments (JSON)",
            true,
            false,
            Some(serde_json::to_string_pretty(&args).unwrap_or_default()),
        ));
    } else if let Some(schema) = &q.response_schema {
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if let Some(props) = schema.get("properties").and_then(Value::as_object) {
            for (name, p) in props.iter().take(50) {
                let mut label = p
                    .get("title")
                    .and_then(Value::as_str)
                    .unwrap_or(name)
                    .to_owned();
                let consts: Vec<String> = p
                    .get("oneOf")
                    .or_else(|| p.get("anyOf"))
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|c| c.get("const").and_then(Value::as_str))
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default();
                let items: Vec<String> = p
                    .get("items")
                    .and_then(|i| i.get("enum"))
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_str)
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default();
                if !consts.is_empty() {
                    label = format!("{label} (one of: {})", consts.join(", "));
                } else if !items.is_empty() {
                    label = format!("{label} (some of, with commas: {})", items.join(", "));
                }
                if let Some(e) = p.get("enum").and_then(Value::as_array) {
                    let choices: Vec<String> = e
                        .iter()
                        .map(|v| v.as_str().map(str::to_owned).unwrap_or(v.to_string()))
                        .collect();
                    label = format!("{label} (one of: {})", choices.join(", "));
                }
                blocks.push(input(
                    &format!("f.{name}"),
                    &label,
                    false,
                    !required.contains(&name.as_str()),
                    None,
                ));
            }
        }
    } else {
        let feedback = option.is_some_and(|o| {
            matches!(
                o.action,
                OptionAction::RetryWithFeedback | OptionAction::RejectWithReason
            )
        });
        let label = option
            .and_then(|o| o.input_prompt.clone())
            .filter(|p| !p.trim().is_empty())
            .unwrap_or_else(|| {
                if feedback {
                    "Why?".into()
                } else {
                    "Your answer".into()
                }
            });
        blocks.push(input(
            if feedback { "feedback" } else { "input" },
            &label,
            true,
            false,
            None,
        ));
    }
    let title = option
        .map(|o| o.label.clone())
        .filter(|l| !l.trim().is_empty())
        .unwrap_or_else(|| "Answer".into());
    SlackModalView::new(pt!(render::truncate(&title, 24)), blocks)
        .with_submit(pt!("Send"))
        .with_close(pt!("Cancel"))
        .with_callback_id(SlackCallbackId::new("delta.answer".into()))
        .with_private_metadata(serde_json::to_string(meta).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_read_as_cloudevents_and_bare_payloads_by_their_subject() {
        let q = InteractionRequest::new(
            delta_protocol::RunId::new(),
            "hello",
            delta_protocol::InteractionType::UserInput,
            "Name?",
        );
        let ce = events::encode(&events::requested("delta", &q, None, None));
        let (t, data) = read_event("delta.interactions.requested.hello.x", &ce).expect("ce");
        assert_eq!(t, EventType::InteractionRequested);
        assert_eq!(data["prompt"], "Name?");
        let bare = serde_json::to_vec(&q).expect("json");
        let (t, _) = read_event("delta.interactions.requested.hello.x", &bare).expect("bare");
        assert_eq!(t, EventType::InteractionRequested);
        assert!(read_event("delta.interactions.requested.hello.x", b"not json").is_none());
        assert!(read_event("delta.jobs.hello", b"{}").is_none());
    }

    #[test]
    fn failures_are_tried_again_later_and_later_unless_slack_refuses_for_good() {
        let delays: Vec<u64> = [1, 2, 3, 6, 7, 100, i64::MAX]
            .into_iter()
            .map(|n| retry_delay(n).as_secs())
            .collect();
        assert_eq!(delays, [5, 10, 20, 160, 300, 300, 300]);
        let down = anyhow::anyhow!("the gateway is down");
        assert!(matches!(failure(&down, 1), Failure::Again(_)));
        assert!(matches!(failure(&down, MAX_DELIVER), Failure::GaveUp));
        let refused = |code: &str| {
            anyhow::Error::from(api::Error::Api {
                method: "chat.postMessage",
                code: code.into(),
            })
            .context("posting")
        };
        assert!(matches!(
            failure(&refused("invalid_auth"), 1),
            Failure::Refused(_)
        ));
        assert!(matches!(
            failure(&refused("internal_error"), 1),
            Failure::Again(_)
        ));
    }

    #[test]
    fn with_a_team_id_only_its_people_are_answered_for() {
        let payload = |team: &str, user_team: Option<&str>| -> Payload {
            serde_json::from_value(json!({"type": "block_actions",
                "team": {"id": team}, "user": {"id": "U1", "team_id": user_team}}))
            .expect("payload")
        };
        assert!(of_team(Some("T1"), false, &payload("T1", Some("T1"))));
        assert!(of_team(Some("T1"), false, &payload("T1", None)));
        // A Slack Connect guest: another home workspace, in a channel shared with ours.
        assert!(!of_team(Some("T1"), false, &payload("T1", Some("T9"))));
        assert!(!of_team(Some("T1"), true, &payload("T1", Some("T9"))));
        assert!(!of_team(Some("T1"), false, &payload("T9", None)));
        // Without a team_id: people of the workspace it happened in, and a guest only when
        // mapped by their Slack id (an e-mail address there is another organisation's to give).
        assert!(of_team(None, false, &payload("T2", Some("T2"))));
        assert!(of_team(None, false, &payload("T2", None)));
        assert!(!of_team(None, false, &payload("T2", Some("T3"))));
        assert!(of_team(None, true, &payload("T2", Some("T3"))));
    }

    #[test]
    fn a_settling_a_reopen_undid_is_not_applied_again() {
        let at = |us: i64| delta_protocol::Timestamp::from_micros(us).expect("time");
        let resolved = |us: i64| -> Resolved {
            serde_json::from_value(json!({
                "request_id": delta_protocol::RequestId::new(),
                "run_id": delta_protocol::RunId::new(),
                "responder": {"id": "bob", "via": "slack"},
                "resolved_at": at(us),
                "state": "ANSWERED",
            }))
            .expect("resolved")
        };
        let mut rec = Record::default();
        assert!(!is_undone(&rec, &resolved(1_000)));
        rec.reopened_after = Some(at(1_000));
        assert!(is_undone(&rec, &resolved(1_000)), "the undone one, again");
        assert!(is_undone(&rec, &resolved(900)), "an older one");
        assert!(
            !is_undone(&rec, &resolved(2_000)),
            "settled again after the reopen"
        );
    }

    #[test]
    fn a_user_not_found_is_looked_up_again_soon() {
        let now = std::time::Instant::now();
        assert_eq!(fresh(&(None, now)), Some(None));
        assert_eq!(fresh(&(Some("a".into()), now)), Some(Some("a".into())));
        if let Some(past) = now.checked_sub(Duration::from_secs(120)) {
            assert_eq!(fresh(&(None, past)), None);
            assert_eq!(fresh(&(Some("a".into()), past)), Some(Some("a".into())));
        }
    }

    #[test]
    fn a_forms_own_errors_are_shown_in_the_form() {
        let view = |values: Value| PayloadView {
            private_metadata: None,
            state: Some(json!({"values": values})),
        };
        let field = |v: &str| json!({"value": {"type": "plain_text_input", "value": v}});
        let args = view(json!({"args": field("[1, 2]")}));
        assert!(form_errors(&args, None).is_some_and(|e| e["args"].is_string()));
        assert_eq!(
            form_errors(&view(json!({"args": field("{\"a\": 1}")})), None),
            None
        );
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
        let typed = view(json!({"f.n": field("many")}));
        let e = form_errors(&typed, Some(&schema)).expect("an error");
        assert!(
            e["f.n"]
                .as_str()
                .is_some_and(|m| m.contains("whole number")),
            "{e}"
        );
        assert_eq!(
            form_errors(&view(json!({"f.n": field("3")})), Some(&schema)),
            None
        );
    }

    #[test]
    fn typed_answers_follow_the_schema() {
        let schema = json!({"type": "object", "properties": {
            "email": {"type": "string"}, "count": {"type": "integer"}, "ok": {"type": "boolean"}}});
        let values: HashMap<String, String> = [
            ("f.email", "ada@example.com"),
            ("f.count", "3"),
            ("f.ok", "yes"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(
            typed(&schema, &values),
            Ok(json!({"email": "ada@example.com", "count": 3, "ok": true}))
        );
        let mut bad = values.clone();
        bad.insert("f.count".into(), "three".into());
        assert!(typed(&schema, &bad).is_err_and(|e| e.contains("count")));
    }

    #[test]
    fn submitted_values_are_read_from_inputs_and_selects() {
        let state = json!({"values": {
            "input": {"value": {"type": "plain_text_input", "value": "hello"}},
            "f.env": {"value": {"type": "static_select", "selected_option": {"value": "prod"}}}}});
        let v = form_values(Some(&state));
        assert_eq!(v.get("input").map(String::as_str), Some("hello"));
        assert_eq!(v.get("f.env").map(String::as_str), Some("prod"));
    }
}
