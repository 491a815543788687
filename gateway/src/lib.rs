//! Delta Fleet's gateway: where runs are submitted and questions answered (docs/architecture.md "The
//! walk of one run", steps 1 and 5).
//!
//! - [`api`]: the HTTP API of docs/protocol.md §6 (axum), with [`sse`] for live streams.
//! - [`inbox`]: the web inbox at `GET /`, static files that use the API.
//! - [`bots`]: NATS request-reply for chat bots, the same answer path as HTTP.
//! - [`ops`]: submit, answer, cancel: every channel and the reconcilers go through these.
//! - [`reconcile`]: timeouts, unpublished or lost resumes, lost jobs.
//! - [`webhooks`]: signed webhooks, managed through the API and delivered from a JetStream
//!   consumer per subscription (docs/webhooks.md).
//! - [`auth`], [`metrics`], [`config`]; [`tls`] (HTTPS of its own) and [`tickets`] (one-time
//!   tickets that open a live stream, so that no token rides in a URL).
//!
//! A gateway keeps no state of its own: everything is in Redis (runs, interactions, indexes)
//! and NATS (jobs, announcements), changed by atomic scripts and idempotent publishes, so any
//! number of gateways may run side by side.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use delta_queue::{self as queue, Queue, Role};
use delta_store::redis::RedisRunStore;

pub mod a2a;
pub mod api;
pub mod auth;
pub mod bots;
pub mod catalog;
pub mod config;
pub mod delegations;
pub mod dlq;
pub mod error;
pub mod escalation;
pub mod grants;
pub mod heard;
pub mod inbox;
pub mod links;
pub mod mcp;
pub mod metrics;
pub mod notes;
pub mod ops;
pub mod reconcile;
pub mod sse;
pub mod tickets;
pub mod tls;
pub mod trace;
pub mod webhooks;

pub use config::Config;

/// One gateway: its configuration and its connections.
pub struct Gateway {
    pub config: Config,
    pub store: RedisRunStore,
    pub queue: Queue,
    pub metrics: metrics::Metrics,
    /// Cancelled on shutdown: live streams and background tasks end.
    pub shutdown: CancellationToken,
    /// Every task the gateway spawns (streams, bot answers), waited for at shutdown.
    pub tasks: TaskTracker,
    /// Live streams open at once (each holds a Redis connection or a NATS consumer).
    pub streams: Arc<tokio::sync::Semaphore>,
    /// Submissions per identity, for `DELTA_SUBMIT_PER_MINUTE`.
    pub submissions: SubmitRate,
    /// One-time credentials each identity may still get: stream tickets and answer links
    /// (`DELTA_TICKETS_PER_MINUTE`).
    pub tickets: Rate,
    /// Live streams held by each token's identity (authentication on), capped at
    /// `max_streams_per_identity` so that one token cannot take every slot.
    pub streams_by_identity: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
    /// Bot answers handled at once.
    pub bot_answers: Arc<tokio::sync::Semaphore>,
    /// Writes what the gateway notes of the jobs it published, together.
    pub notes: notes::Notes,
    /// The questions heard announced, for answers that need not read them (src/heard.rs).
    pub heard: heard::Heard,
    /// `/readyz`'s and `/metrics`' readings of the servers, kept a second.
    pub probes: metrics::Probes,
}

/// Live streams one gateway serves at once.
pub const MAX_STREAMS: usize = 512;
/// Bot answers one gateway handles at once (more wait in NATS' buffers).
pub const MAX_BOT_ANSWERS: usize = 64;

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] delta_store::Error),
    #[error(transparent)]
    Queue(#[from] queue::Error),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot subscribe to the bots' subjects: {0}")]
    Subscribe(String),
}

impl Gateway {
    /// Connects to Redis and NATS (creating the streams if missing, never changing the workers'
    /// consumer settings).
    pub async fn connect(config: Config, shutdown: CancellationToken) -> Result<Self, Error> {
        let mut store = RedisRunStore::connect_options(
            &config.redis_url,
            &config.prefix,
            &delta_store::redis::Options {
                cluster: config.redis_cluster,
                ca_file: config.redis_ca.clone(),
                buckets: config.redis_buckets,
            },
        )
        .await?
        .with_durability(config.durability)
        .await?;
        if let Some(key) = &config.secrets_key {
            store = store.with_secrets_key(key.clone());
        }
        if let Some(keep) = config.retention {
            // A dead letter can be retried for as long as it is kept: its run stays as long.
            store = store.keeping_letters(queue::Settings::default().dlq_max_age, keep);
        }
        let queue = Queue::connect_as(
            &config.nats_url,
            &config.prefix,
            &queue::Settings {
                ca_file: config.nats_ca.clone(),
                replicas: config.stream_replicas,
                ..Default::default()
            },
            Role::Gateway,
        )
        .await?;
        let submissions = SubmitRate::new(config.submit_per_minute);
        let tickets = Rate::of(
            config.tickets_per_minute,
            "made {n} stream tickets and answer links",
            "DELTA_TICKETS_PER_MINUTE",
        );
        let metrics = metrics::Metrics::new();
        let notes = notes::Notes::spawn(
            store.clone(),
            queue.clone(),
            metrics.notes.clone(),
            shutdown.clone(),
        );
        Ok(Self {
            heard: heard::Heard::new(config.question_cache_bytes, config.question_wait),
            probes: metrics::Probes::default(),
            config,
            queue,
            metrics,
            tasks: TaskTracker::new(),
            streams: Arc::new(tokio::sync::Semaphore::new(MAX_STREAMS)),
            streams_by_identity: Arc::default(),
            submissions,
            tickets,
            bot_answers: Arc::new(tokio::sync::Semaphore::new(MAX_BOT_ANSWERS)),
            notes,
            store,
            shutdown,
        })
    }
}

/// Runs a gateway until `shutdown`: the HTTP API on `config.addr`, the bot bridge and the
/// reconcilers. Calls `ready` with the bound address once it listens.
pub async fn run(
    config: Config,
    shutdown: CancellationToken,
    ready: impl FnOnce(std::net::SocketAddr),
) -> Result<(), Error> {
    let addr = config.addr;
    let gw = Arc::new(Gateway::connect(config, shutdown.clone()).await?);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Listen { addr, source })?;
    let bound = listener.local_addr().unwrap_or(addr);
    let bots = {
        let gw = gw.clone();
        tokio::spawn(async move { bots::serve(gw).await })
    };
    let heard = gw.heard.is_on().then(|| {
        let gw = gw.clone();
        tokio::spawn(async move { gw.heard.listen(&gw.queue, gw.shutdown.clone()).await })
    });
    let reconcilers = tokio::spawn(reconcile::run(gw.clone(), shutdown.clone()));
    let webhooks = tokio::spawn(webhooks::deliver::run(gw.clone()));
    // A2A push notifications (src/a2a/push.rs), delivered like webhooks.
    let a2a_push = tokio::spawn(a2a::push::run(gw.clone()));
    let tls = gw.config.tls.is_some();
    tracing::info!(%bound, auth = gw.config.auth.is_on(), tls, "gateway listening");
    if !tls && gw.config.auth.is_on() && !bound.ip().is_loopback() {
        // Allowed only by DELTA_GATEWAY_PLAIN_HTTP=any (config.rs): say it once, loudly.
        tracing::warn!(
            %bound,
            "serving plain HTTP on a non-loopback address: bearer tokens cross the network in clear unless a proxy in front terminates TLS (DELTA_GATEWAY_PLAIN_HTTP=any)"
        );
    }
    ready(bound);
    let app = api::router(gw.clone());
    serve(&gw, listener, app).await;
    shutdown.cancel();
    gw.tasks.close();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), gw.tasks.wait()).await;
    match bots.await {
        Ok(Err(e)) => tracing::warn!(error = %delta_host::Chain(&e), "bot bridge stopped"),
        Err(e) => tracing::warn!(error = %delta_host::Chain(&e), "bot bridge task failed"),
        Ok(Ok(())) => {}
    }
    let _ = reconcilers.await;
    if let Some(h) = heard {
        let _ = h.await;
    }
    let _ = webhooks.await;
    let _ = a2a_push.await;
    gw.notes.finish().await;
    // Under a target of its own, so that benchmarks can keep it while silencing the rest.
    tracing::info!(
        target: "delta_stats",
        redis_round_trips = gw.store.round_trips(),
        answers_heard = gw.metrics.answers_heard.get(),
        "gateway stopped"
    );
    Ok(())
}

/// Accepts HTTP connections until shutdown: at most `max_connections` at once (one more is
/// closed as soon as it is accepted), each given `header_timeout` to finish its TLS handshake
/// (with TLS on) and then to send a request's headers, so neither silent nor slow clients can
/// hold the gateway's connections. On shutdown every connection finishes the request it is in
/// and closes (live streams end with the shutdown).
async fn serve(gw: &Arc<Gateway>, listener: tokio::net::TcpListener, app: axum::Router) {
    let serving = delta_host::http::Serving {
        max_connections: gw.config.max_connections,
        header_timeout: gw.config.header_timeout,
        tls: gw.config.tls.clone(),
    };
    delta_host::http::serve(listener, app, &serving, gw.shutdown.clone(), || {
        gw.metrics.connections_refused.inc();
    })
    .await;
}

/// How many times each identity may still do a thing: a bucket per identity that holds a
/// minute's worth (its setting, e.g. `DELTA_SUBMIT_PER_MINUTE`) and refills at that rate, so a
/// burst is fine and a flood is not. Per gateway: behind several gateways, an identity's rate is
/// this times their number.
pub struct Rate {
    per_minute: u32,
    /// What one take is, in the refusal ("submitted {n} runs", "made {n} stream tickets and
    /// answer links"), `{n}` the rate.
    did: &'static str,
    setting: &'static str,
    buckets: std::sync::Mutex<std::collections::HashMap<String, (f64, std::time::Instant)>>,
}

/// Runs each identity may still submit (`DELTA_SUBMIT_PER_MINUTE`).
pub type SubmitRate = Rate;

impl Rate {
    /// Submissions: `DELTA_SUBMIT_PER_MINUTE`.
    pub fn new(per_minute: u32) -> Self {
        Rate::of(per_minute, "submitted {n} runs", "DELTA_SUBMIT_PER_MINUTE")
    }

    pub fn of(per_minute: u32, did: &'static str, setting: &'static str) -> Self {
        Rate {
            per_minute: per_minute.max(1),
            did,
            setting,
            buckets: std::sync::Mutex::default(),
        }
    }

    /// Takes one from `who`'s bucket, or says when to try again.
    pub fn take(&self, who: &str) -> Result<(), error::ApiError> {
        let capacity = f64::from(self.per_minute);
        let now = std::time::Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let (tokens, last) = buckets.entry(who.to_owned()).or_insert((capacity, now));
        let refill = now.duration_since(*last).as_secs_f64() * capacity / 60.0;
        *tokens = (*tokens + refill).min(capacity);
        *last = now;
        if *tokens < 1.0 {
            let wait = ((1.0 - *tokens) * 60.0 / capacity).ceil();
            return Err(error::ApiError::new(
                delta_api::ErrorCode::RateLimited,
                format!(
                    "`{who}` {} in the last minute, as many as one identity may ({}); try again in {wait} s",
                    self.did.replace("{n}", &self.per_minute.to_string()),
                    self.setting
                ),
            ));
        }
        *tokens -= 1.0;
        Ok(())
    }

    /// Gives back a submission taken for a call that made no run (an idempotent retry).
    pub fn give_back(&self, who: &str) {
        let capacity = f64::from(self.per_minute);
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((tokens, _)) = buckets.get_mut(who) {
            *tokens = (*tokens + 1.0).min(capacity);
        }
    }
}
