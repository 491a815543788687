//! The fleet's queue: NATS JetStream (docs/protocol.md §4). The only module that speaks async-nats.
//!
//! At start it creates or updates, idempotently, the job stream (work-queue retention, file
//! storage, `discard: new`), the dead-letter stream, the interactions stream (limits retention,
//! 7 days) and the durable pull consumer shared by all workers (explicit ack, `ack_wait`,
//! `max_deliver`, `max_ack_pending`). Jobs are published with `Nats-Msg-Id` so that a repeat
//! inside the duplicate window is dropped by the server. A delivery carries its fencing token,
//! `(stream sequence, delivery count)`, for the run store.
//!
//! A job whose worker dies on its last delivery would otherwise stay in the work queue forever:
//! JetStream only announces it with a `MAX_DELIVERIES` advisory on core NATS. A small stream,
//! `<P>_EXHAUSTED`, keeps those advisories (so none is lost while no worker listens), and workers
//! take them from the durable consumer `<p>-exhausted` to dead-letter the job ([`Exhausted`]).

use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, AckKind, consumer, kv, stream};
use futures_util::StreamExt;

use delta_protocol::events;
use delta_protocol::{
    Fence, InteractionRequest, Job, JobKind, RequestId, Resolved, RunId, Timestamp,
};

pub mod access;
pub mod webhooks;

/// Why NATS refused or failed an operation (the client's own error).
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// A queue operation that failed: the message says which, the source why.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot connect to NATS at {url}")]
    Connect {
        url: String,
        #[source]
        source: Cause,
    },
    #[error("JetStream setup of {what}")]
    Setup {
        what: String,
        #[source]
        source: Cause,
    },
    #[error("publish to {subject}")]
    Publish {
        subject: String,
        #[source]
        source: Cause,
    },
    #[error("fetch from {consumer}")]
    Fetch {
        consumer: String,
        #[source]
        source: Cause,
    },
    #[error("acknowledging a job")]
    Ack(#[source] Cause),
}

impl Error {
    /// Whether this is a publish that NATS could not take for now, and may take later: no
    /// stream answered for the subject (a stream without a leader for a moment, after a NATS
    /// node died), its ack did not come in time, the connection broke, or the stream's ack
    /// backlog is full. Not a message too large, nor any other refusal.
    pub fn is_transient_publish(&self) -> bool {
        use jetstream::context::{PublishError, PublishErrorKind};
        let Error::Publish { source, .. } = self else {
            return false;
        };
        source.downcast_ref::<PublishError>().is_some_and(|e| {
            matches!(
                e.kind(),
                PublishErrorKind::StreamNotFound
                    | PublishErrorKind::TimedOut
                    | PublishErrorKind::BrokenPipe
                    | PublishErrorKind::MaxAckPending
            )
        })
    }
}

/// Stream, subject and consumer names under one prefix (`DELTA_KEY_PREFIX`, default `delta`).
#[derive(Clone, Debug)]
pub struct Names {
    prefix: String,
}

impl Names {
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
        }
    }
    pub fn jobs_stream(&self) -> String {
        format!("{}_JOBS", self.prefix.to_uppercase())
    }
    pub fn dlq_stream(&self) -> String {
        format!("{}_DLQ", self.prefix.to_uppercase())
    }
    pub fn interactions_stream(&self) -> String {
        format!("{}_INTERACTIONS", self.prefix.to_uppercase())
    }
    /// The durable consumer of start jobs (`<p>.jobs.<agent>`), shared by all workers.
    pub fn consumer(&self) -> String {
        format!("{}-workers", self.prefix)
    }
    /// The durable consumer of resume jobs (`<p>.jobs.<agent>.resume`), shared by all workers.
    pub fn resumes_consumer(&self) -> String {
        format!("{}-resumes", self.prefix)
    }
    /// The durable consumer of `lane`.
    pub fn lane_consumer(&self, lane: Lane) -> String {
        match lane {
            Lane::Starts => self.consumer(),
            Lane::Resumes => self.resumes_consumer(),
        }
    }
    /// What `lane`'s consumer takes from the job stream: `<p>.jobs.*` (one token after
    /// `jobs`: starts, and resumes published before resumes had their own subject) or
    /// `<p>.jobs.*.resume`. Disjoint, as a work-queue stream requires.
    pub fn lane_filter(&self, lane: Lane) -> String {
        match lane {
            Lane::Starts => format!("{}.jobs.*", self.prefix),
            Lane::Resumes => format!("{}.jobs.*.resume", self.prefix),
        }
    }
    pub fn exhausted_stream(&self) -> String {
        format!("{}_EXHAUSTED", self.prefix.to_uppercase())
    }
    pub fn exhausted_consumer(&self) -> String {
        format!("{}-exhausted", self.prefix)
    }
    /// Where JetStream announces a job that used up `max_deliver` on `lane`'s consumer.
    pub fn exhausted_advisory(&self, lane: Lane) -> String {
        format!(
            "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{}.{}",
            self.jobs_stream(),
            self.lane_consumer(lane)
        )
    }
    /// The advisories the exhausted stream keeps: both consumers'.
    pub fn exhausted_advisories(&self) -> Vec<String> {
        Lane::ALL
            .iter()
            .map(|l| self.exhausted_advisory(*l))
            .collect()
    }
    /// Where a start job for `agent` is published (and where resumes were before they had
    /// their own subject).
    pub fn jobs_subject(&self, agent: &str) -> String {
        format!("{}.jobs.{agent}", self.prefix)
    }
    /// Where a resume job for `agent` is published.
    pub fn resume_subject(&self, agent: &str) -> String {
        format!("{}.jobs.{agent}.resume", self.prefix)
    }
    /// Where `job` for `agent` goes: its kind decides.
    pub fn job_subject(&self, agent: &str, job: &Job) -> String {
        match job.kind {
            JobKind::Start => self.jobs_subject(agent),
            JobKind::Resume => self.resume_subject(agent),
        }
    }
    /// The agent a job's subject names, either form (`<p>.jobs.<agent>`,
    /// `<p>.jobs.<agent>.resume`); `None` for a subject outside the job stream's.
    pub fn agent_of_job_subject<'s>(&self, subject: &'s str) -> Option<&'s str> {
        let rest = subject
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix(".jobs.")?;
        Some(rest.strip_suffix(".resume").unwrap_or(rest))
    }
    pub fn dlq_subject(&self, agent: &str) -> String {
        format!("{}.dlq.{agent}", self.prefix)
    }
    pub fn requested_subject(&self, agent: &str, run: &str) -> String {
        format!("{}.interactions.requested.{agent}.{run}", self.prefix)
    }
    pub fn resolved_subject(&self, agent: &str, run: &str) -> String {
        format!("{}.interactions.resolved.{agent}.{run}", self.prefix)
    }
    /// Where a question's escalation steps are announced (`Escalated`).
    pub fn escalated_subject(&self, agent: &str, run: &str) -> String {
        format!("{}.interactions.escalated.{agent}.{run}", self.prefix)
    }
    /// Where a pending question's claims and votes are announced (`InteractionUpdate`).
    pub fn updated_subject(&self, agent: &str, run: &str) -> String {
        format!("{}.interactions.updated.{agent}.{run}", self.prefix)
    }
    /// Where a run's end is announced (`run.completed|failed|cancelled`, a CloudEvent of
    /// `RunFinished`): `<p>.runs.<completed|failed|cancelled>.<agent>.<run_id>`.
    pub fn run_ended_subject(&self, status: &str, agent: &str, run: &str) -> String {
        format!("{}.runs.{status}.{agent}.{run}", self.prefix)
    }
    /// The subject filter of the events of type `ty` for `agent` (`*`: every agent) in the
    /// events stream. The three settled states of a question share `…interactions.resolved…`:
    /// a consumer of one of them filters on the event's `type` too.
    pub fn event_filter(&self, ty: delta_protocol::events::EventType, agent: &str) -> String {
        use delta_protocol::events::EventType as T;
        let p = &self.prefix;
        match ty {
            T::InteractionRequested => format!("{p}.interactions.requested.{agent}.*"),
            T::InteractionAnswered | T::InteractionExpired | T::InteractionCancelled => {
                format!("{p}.interactions.resolved.{agent}.*")
            }
            T::InteractionUpdated => format!("{p}.interactions.updated.{agent}.*"),
            T::InteractionEscalated => format!("{p}.interactions.escalated.{agent}.*"),
            T::RunCompleted => format!("{p}.runs.completed.{agent}.*"),
            T::RunFailed => format!("{p}.runs.failed.{agent}.*"),
            T::RunCancelled => format!("{p}.runs.cancelled.{agent}.*"),
        }
    }
    /// Where bots answer a request (core NATS request-reply).
    pub fn respond_subject(&self, request_id: &str) -> String {
        format!("{}.interactions.respond.{request_id}", self.prefix)
    }
    /// Where bots claim a request, renew or give back their claim (core NATS request-reply).
    pub fn claim_subject(&self, request_id: &str) -> String {
        format!("{}.interactions.claim.{request_id}", self.prefix)
    }
    /// The queue group the gateways serve the respond subjects in.
    pub fn gateway_group(&self) -> String {
        format!("{}-gateway", self.prefix)
    }
    /// Where workers say that a run resumed on an answer (core NATS, for the gateways' metrics).
    pub fn resumed_subject(&self) -> String {
        format!("{}.events.resumed", self.prefix)
    }

    /// Where gateways say that a run was cancelled (core NATS, best effort; the payload is the
    /// run id): the worker running one of its steps stops it.
    pub fn cancelled_subject(&self) -> String {
        format!("{}.events.cancelled", self.prefix)
    }
}

/// The two ways into the workers: resume jobs (a person answered and may be waiting) have a
/// consumer of their own, so that workers can take them first and keep slots for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lane {
    /// `<p>-workers` on `<p>.jobs.*`.
    Starts,
    /// `<p>-resumes` on `<p>.jobs.*.resume`.
    Resumes,
}

impl Lane {
    pub const ALL: [Lane; 2] = [Lane::Starts, Lane::Resumes];
}

/// Consumer and connection settings.
#[derive(Clone, Debug)]
pub struct Settings {
    /// A PEM file of the certificate authorities that sign the server's TLS certificate (with a
    /// `tls://` URL, or a server that requires TLS); the system's roots otherwise.
    pub ca_file: Option<std::path::PathBuf>,
    /// How long a delivery may stay unacknowledged (heartbeats extend it).
    pub ack_wait: Duration,
    /// Deliveries of one job before it is dead-lettered.
    pub max_deliver: i64,
    /// Unacknowledged jobs in flight across all workers.
    pub max_ack_pending: i64,
    /// How long interaction events are kept for bots that catch up.
    pub interactions_max_age: Duration,
    /// Jobs waiting at most: past it a publish is refused (the gateway says `unavailable`)
    /// rather than the stream growing without bound.
    pub jobs_max_messages: i64,
    /// Dead letters kept at most, the oldest dropped first, and for how long.
    pub dlq_max_messages: i64,
    pub dlq_max_age: Duration,
    /// Copies of each stream a NATS cluster keeps (`DELTA_STREAM_REPLICAS`): 1 on one server,
    /// 3 on a cluster of three, where an acknowledged write is then on a majority of servers.
    pub replicas: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            ca_file: None,
            ack_wait: Duration::from_secs(30),
            max_deliver: 5,
            max_ack_pending: 10_000,
            interactions_max_age: Duration::from_secs(7 * 24 * 3600),
            jobs_max_messages: 1_000_000,
            dlq_max_messages: 100_000,
            dlq_max_age: Duration::from_secs(30 * 24 * 3600),
            replicas: 1,
        }
    }
}

/// Who connects: workers set the consumers' settings, gateways leave them as they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Worker,
    Gateway,
}

/// JetStream's figures for `GET /v1/queue`.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Stats {
    /// Jobs waiting for a worker.
    pub pending: u64,
    /// Jobs delivered and not yet acknowledged.
    pub in_flight: u64,
    /// Jobs delivered more than once and not yet acknowledged.
    pub redelivered: u64,
    /// Pull requests waiting for jobs (idle worker slots).
    pub waiting_pulls: u64,
    /// Messages in the dead-letter stream.
    pub dead_lettered: u64,
}

/// An interaction's event, for live views: its sequence in the events stream, its kind
/// (`requested`, `resolved`, `updated`, `escalated`), its agent, and its CloudEvent's `data`.
#[derive(Clone, Debug)]
pub struct InteractionEvent {
    pub seq: u64,
    pub kind: &'static str,
    pub agent: String,
    pub payload: Vec<u8>,
}

/// A job in the dead-letter stream: why it was put there and what it was.
#[derive(Clone, Debug)]
pub struct DeadLetter {
    /// Its sequence in the dead-letter stream (what `retry` and `drop` name).
    pub seq: u64,
    /// The agent its subject names.
    pub agent: String,
    /// Why it was dead-lettered (`Delta-Dlq-Reason`).
    pub reason: String,
    /// Its sequence in the job stream (`Delta-Stream-Seq`).
    pub job_seq: Option<u64>,
    /// When it was dead-lettered.
    pub at: Timestamp,
    /// The job, when the payload is one (a poison job may be anything).
    pub job: Option<Job>,
    /// The payload as it was, lossily decoded and cut to 1 KiB.
    pub payload: String,
    pub traceparent: Option<String>,
}

impl DeadLetter {
    fn from_parts(
        seq: u64,
        subject: &str,
        headers: Option<&HeaderMap>,
        payload: &[u8],
        at_nanos: i128,
        prefix: &str,
    ) -> Self {
        let header = |name: &str| {
            headers
                .and_then(|h| h.get(name))
                .map(|v| v.as_str().to_owned())
        };
        let mut text = String::from_utf8_lossy(payload).into_owned();
        if text.len() > 1024 {
            let mut cut = 1024;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push('…');
        }
        DeadLetter {
            seq,
            agent: subject
                .strip_prefix(&format!("{prefix}.dlq."))
                .unwrap_or(subject)
                .to_owned(),
            reason: header("Delta-Dlq-Reason").unwrap_or_default(),
            job_seq: header("Delta-Stream-Seq").and_then(|s| s.parse().ok()),
            at: i64::try_from(at_nanos / 1000)
                .ok()
                .and_then(Timestamp::from_micros)
                .unwrap_or_else(Timestamp::now),
            job: Job::decode(payload).ok(),
            payload: text,
            traceparent: header("traceparent"),
        }
    }
}

/// What JetStream said of a publish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Published {
    /// The message's stream sequence; for a duplicate, that of the first copy.
    pub seq: u64,
    /// Dropped as a duplicate of a publish under the same `Nats-Msg-Id` within the stream's
    /// duplicate window: nothing was added.
    pub duplicate: bool,
}

/// A connection to the fleet's streams.
#[derive(Clone)]
pub struct Queue {
    /// The core client (interaction events, later request-reply).
    client: async_nats::Client,
    js: jetstream::Context,
    names: Names,
    /// `<p>-workers`: start jobs.
    starts: consumer::PullConsumer,
    /// `<p>-resumes`: resume jobs. `None` only on a gateway that found `<p>-workers` as an
    /// older version left it, taking every job (no worker of this version narrowed it yet):
    /// that gateway then publishes resume jobs on the old subject.
    resumes: Option<consumer::PullConsumer>,
    jobs: stream::Stream,
    exhausted: consumer::PullConsumer,
    /// The `resumed` notes waiting to be sent together ([`Queue::announce_resumed`]); the task
    /// that sends them is started with the first.
    resumed_notes: Arc<std::sync::OnceLock<tokio::sync::mpsc::Sender<NotesMsg>>>,
}

/// A worker's note that it resumes a run on an answer: one element of a `resumed` message.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ResumedNote {
    pub request_id: RequestId,
    pub answered_at: Timestamp,
    pub resumed_at: Timestamp,
}

/// What the task that sends `resumed` notes is given: a note, or a request to send what it
/// holds now (answered once it is handed to the client).
enum NotesMsg {
    Note(ResumedNote),
    SendNow(tokio::sync::oneshot::Sender<()>),
}

/// How long a `resumed` note may wait for others to go in the same message, and how many go in
/// one at most: one message per worker and tenth of a second under load, not one per resume.
const RESUMED_EVERY: Duration = Duration::from_millis(100);
const RESUMED_AT_MOST: usize = 256;

/// A job that used up its deliveries without being acknowledged or terminated (its workers
/// crashed or hung every time). Dead-letter it with [`Queue::copy_exhausted_to_dlq`] and
/// [`Queue::drop_exhausted`].
pub struct Exhausted {
    advisory: jetstream::Message,
    /// The job's sequence with one delivery more than it had: outranks every delivery of it.
    pub fence: Fence,
    /// How many times the job was delivered.
    pub deliveries: u64,
    /// The job's `traceparent`, carried over to the DLQ copy.
    pub traceparent: Option<String>,
    /// The job, if it is still in the stream and is one.
    pub job: Option<Job>,
    /// The agent named by the job's subject.
    pub agent: String,
    payload: Option<Vec<u8>>,
}

/// The Slack bridge's KV bucket for `prefix` (docs/slack.md): where it posted each question.
pub fn slack_bucket(prefix: &str) -> String {
    format!("{}_SLACK", prefix.to_uppercase())
}

/// The settings of [`slack_bucket`]: one value per key, on files, with the streams' replicas.
pub fn slack_bucket_config(prefix: &str, replicas: usize) -> kv::Config {
    kv::Config {
        bucket: slack_bucket(prefix),
        description: "delta slack: where each question was posted".into(),
        history: 1,
        // A question waits at most as long as its last escalation step may be (90 days); its
        // record is kept that long after its last change.
        max_age: Duration::from_secs(90 * 24 * 3600),
        storage: stream::StorageType::File,
        num_replicas: replicas,
        ..Default::default()
    }
}

/// Creates the Slack bridge's bucket if it is missing. The gateway makes it, as it makes the
/// streams, so that the bridge's NATS user needs no right to create a stream: NATS checks only
/// the stream's name against a user's rights, not the subjects it captures, so a user that may
/// create the bucket's stream before the bridge does could make it capture bots' answers (their
/// bearer tokens in the headers) and read them back. A gateway whose NATS user may not (an
/// older `users.conf`) says so and goes on, within a few seconds: the bridge then waits for the
/// bucket. A bucket whose stream captures more than its own subjects (made so by a login that
/// could, before this was fixed) is reported as an error.
async fn ensure_slack_bucket(js: &jetstream::Context, prefix: &str, replicas: usize) {
    let name = format!("KV_{}", slack_bucket(prefix));
    let work = async {
        if let Ok(stream) = js.get_stream(&name).await {
            if let Err(why) = slack_bucket_sound(prefix, &stream.cached_info().config.subjects) {
                tracing::error!(stream = %name, "{why}");
            }
            return;
        }
        if let Err(e) = js
            .create_key_value(slack_bucket_config(prefix, replicas))
            .await
        {
            tracing::warn!(
                stream = %name,
                error = %e,
                "cannot create the Slack bridge's bucket (its NATS user's rights are older than this gateway: see deploy/nats/users.conf); a Slack bridge waits for it"
            );
        }
    };
    if tokio::time::timeout(Duration::from_secs(3), work)
        .await
        .is_err()
    {
        tracing::warn!(stream = %name, "no answer about the Slack bridge's bucket within 3 s (the NATS user's rights are older than this gateway?); a Slack bridge waits for it");
    }
}

/// Whether the Slack bridge's bucket stream, capturing `subjects`, captures its own subjects
/// only; else why not, and what to do.
pub fn slack_bucket_sound(prefix: &str, subjects: &[String]) -> Result<(), String> {
    let own = format!("$KV.{}.>", slack_bucket(prefix));
    if subjects == [own.as_str()] {
        return Ok(());
    }
    Err(format!(
        "the Slack bridge's bucket stream KV_{} captures {subjects:?}, not only its own `{own}`: a login that could create streams made it so, and it may have kept bots' answers with their tokens. Delete the stream (`nats stream rm KV_{}`), rotate the bots' gateway tokens, and start a gateway again (it makes the bucket anew)",
        slack_bucket(prefix),
        slack_bucket(prefix)
    ))
}

/// The durable pull consumer `config` on `stream_name`, updated to `config` or created.
/// Makes sure a stream exists. A gateway creates it, or updates it to `config` (never lowering
/// the replicas it has: a gateway left on the default cannot scale an R3 fleet down). A worker
/// never changes a stream (its login may not: a stream's subjects decide who can read what): it
/// creates one only where its login allows (an admin's, in tests), and otherwise waits for a
/// gateway to create it.
async fn ensure_stream(
    js: &jetstream::Context,
    mut config: stream::Config,
    role: Role,
) -> Result<(), Error> {
    let name = config.name.clone();
    let existing = match js.get_stream(&name).await {
        Ok(mut s) => s.info().await.ok().map(|i| i.config.num_replicas),
        Err(_) => None,
    };
    match (role, existing) {
        (Role::Worker, Some(_)) => Ok(()),
        (Role::Gateway, Some(replicas)) => {
            if replicas > config.num_replicas {
                tracing::warn!(
                    stream = %name,
                    has = replicas,
                    configured = config.num_replicas,
                    "the stream keeps more replicas than DELTA_STREAM_REPLICAS says; keeping them (set the same value everywhere)"
                );
                config.num_replicas = replicas;
            }
            js.update_stream(config)
                .await
                .map(|_| ())
                .map_err(|e| setup(&name)(e.into()))
        }
        (Role::Gateway, None) => js
            .create_or_update_stream(config)
            .await
            .map(|_| ())
            .map_err(|e| setup(&name)(e.into())),
        (Role::Worker, None) => {
            if js.create_stream(config).await.is_ok() {
                return Ok(());
            }
            // Not allowed (a worker's login): a gateway creates it.
            let deadline = std::time::Instant::now() + Duration::from_secs(120);
            loop {
                if js.get_stream(&name).await.is_ok() {
                    return Ok(());
                }
                if std::time::Instant::now() > deadline {
                    return Err(setup(&name)(
                        "the stream does not exist, and a worker may not create it: start a gateway first (it creates the streams)"
                            .into(),
                    ));
                }
                tracing::info!(stream = %name, "waiting for a gateway to create the stream");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// Connects to NATS at `url` (servers separated by commas; `user:password@` in a URL logs in),
/// trusting `settings.ca_file` for TLS, and with `role`'s own inbox under `prefix` when given
/// (see [`access`]).
pub async fn connect_client(
    url: &str,
    settings: &Settings,
    role: Option<(&str, access::NatsRole)>,
) -> Result<async_nats::Client, Error> {
    let shown = delta_protocol::without_credentials(url);
    let connect_error = |source: Cause| Error::Connect {
        url: shown.clone(),
        source,
    };
    let parse = |s: &str| {
        s.parse::<async_nats::ServerAddr>()
            // The parser's message can quote the URL, password and all: say what is wrong only.
            .map_err(|_| connect_error("not a NATS URL (nats://[user:password@]host:port)".into()))
    };
    let mut options = async_nats::ConnectOptions::new();
    let mut servers = vec![];
    let mut logged_in = false;
    for one in url.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let addr = parse(one)?;
        if addr.has_user_pass() && !logged_in {
            let user = percent_decode(addr.username().unwrap_or_default());
            let pass = percent_decode(addr.password().unwrap_or_default());
            options = options.user_and_password(user, pass);
            logged_in = true;
        }
        // The address without its user and password, which the client would otherwise show in
        // its own debug logs.
        servers.push(parse(&strip_userinfo(one))?);
    }
    if let Some(ca) = &settings.ca_file {
        if !ca.is_file() {
            return Err(connect_error(
                format!("the CA file {} cannot be read", ca.display()).into(),
            ));
        }
        options = options.add_root_certificates(ca.clone()).require_tls(true);
    }
    if let Some((prefix, role)) = role {
        options = options
            .name(format!("delta-{}", role.name()))
            .custom_inbox_prefix(access::inbox_prefix(prefix, role));
    }
    options
        .connect(servers)
        .await
        .map_err(|e| connect_error(e.into()))
}

/// `url` without its `user:password@`.
fn strip_userinfo(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}{}", &url[..s + 3], &url[at + 1..]),
        _ => url.to_owned(),
    }
}

/// A URL's user name or password, written `%XX`-escaped, as it is meant.
fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

async fn durable_consumer(
    js: &jetstream::Context,
    stream_name: &str,
    config: consumer::pull::Config,
    role: Role,
) -> Result<(stream::Stream, consumer::PullConsumer), Error> {
    let name = config.durable_name.clone().unwrap_or_default();
    let stream = js
        .get_stream(stream_name)
        .await
        .map_err(|e| setup(stream_name)(e.into()))?;
    let existing = match role {
        // Workers own the consumer's settings (ack_wait, max_deliver…): theirs win.
        Role::Worker => stream.update_consumer(config.clone()).await.ok(),
        // A gateway only reads it: it never changes what the workers set.
        Role::Gateway => stream.get_consumer(&name).await.ok(),
    };
    let consumer = match existing {
        Some(c) => c,
        None => stream
            .create_consumer(config)
            .await
            .map_err(|e| setup(&name)(e.into()))?,
    };
    Ok((stream, consumer))
}

/// An error with its sources, for a log line (`Display` of [`Error`] leaves them out).
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        out.push_str(": ");
        out.push_str(&s.to_string());
        next = s.source();
    }
    out
}

/// Whether `tp` is a W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`). Anything else (a value
/// planted in Redis with CR/LF, say) is left off a message rather than put in a header.
pub fn is_traceparent(tp: &str) -> bool {
    let parts: Vec<&str> = tp.split('-').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    parts.len() == 4
        && hex(parts[0], 2)
        && hex(parts[1], 32)
        && hex(parts[2], 16)
        && hex(parts[3], 2)
}

/// Whether a stream read failed because the message is not there (JetStream error 10037).
fn is_no_message(kind: stream::RawMessageErrorKind) -> bool {
    match kind {
        stream::RawMessageErrorKind::NoMessageFound => true,
        stream::RawMessageErrorKind::JetStream(e) => {
            e.error_code() == jetstream::ErrorCode::NO_MESSAGE_FOUND
        }
        _ => false,
    }
}

/// The part of a `MAX_DELIVERIES` advisory we need.
#[derive(serde::Deserialize)]
struct MaxDeliveries {
    stream_seq: u64,
    deliveries: u64,
}

/// One delivered job.
pub struct Delivery {
    msg: jetstream::Message,
    /// The job, or why its payload is not one (a poison message).
    pub job: Result<Job, String>,
    /// Which message and which delivery of it: newer deliveries outrank older ones.
    pub fence: Fence,
    /// The agent named by the subject.
    pub agent: String,
    /// The W3C `traceparent` header, if the publisher sent one.
    pub traceparent: Option<String>,
}

/// Sends the `resumed` notes of `notes` to `subject`, each with those that came within
/// [`RESUMED_EVERY`] after it (at most [`RESUMED_AT_MOST`] a message), and what it holds when
/// asked to, until every sender is gone.
async fn send_resumed_notes(
    client: async_nats::Client,
    subject: String,
    mut notes: tokio::sync::mpsc::Receiver<NotesMsg>,
) {
    while let Some(first) = notes.recv().await {
        let first = match first {
            NotesMsg::Note(note) => note,
            NotesMsg::SendNow(done) => {
                let _ = done.send(());
                continue;
            }
        };
        let mut batch = vec![first];
        let until = tokio::time::Instant::now() + RESUMED_EVERY;
        let mut asked = None;
        while batch.len() < RESUMED_AT_MOST {
            match tokio::time::timeout_at(until, notes.recv()).await {
                Ok(Some(NotesMsg::Note(note))) => batch.push(note),
                Ok(Some(NotesMsg::SendNow(done))) => {
                    asked = Some(done);
                    break;
                }
                Ok(None) | Err(_) => break,
            }
        }
        if let Ok(payload) = serde_json::to_vec(&batch) {
            let _ = client.publish(subject.clone(), payload.into()).await;
        }
        if let Some(done) = asked {
            let _ = done.send(());
        }
    }
}

fn setup(what: &str) -> impl FnOnce(Cause) -> Error + '_ {
    move |source| Error::Setup {
        what: what.to_owned(),
        source,
    }
}

impl Queue {
    /// Connects and makes sure the streams and the consumer exist with these settings.
    pub async fn connect(url: &str, prefix: &str, settings: &Settings) -> Result<Queue, Error> {
        Self::connect_as(url, prefix, settings, Role::Worker).await
    }

    /// Connects as `role`: a gateway creates what is missing but changes no consumer settings.
    pub async fn connect_as(
        url: &str,
        prefix: &str,
        settings: &Settings,
        role: Role,
    ) -> Result<Queue, Error> {
        let nats_role = match role {
            Role::Worker => access::NatsRole::Worker,
            Role::Gateway => access::NatsRole::Gateway,
        };
        let client = connect_client(url, settings, Some((prefix, nats_role))).await?;
        let js = jetstream::new(client.clone());
        let names = Names::new(prefix);
        let p = prefix;
        ensure_stream(
            &js,
            stream::Config {
                num_replicas: settings.replicas,
                name: names.jobs_stream(),
                subjects: vec![format!("{p}.jobs.>")],
                retention: stream::RetentionPolicy::WorkQueue,
                storage: stream::StorageType::File,
                discard: stream::DiscardPolicy::New,
                max_messages: settings.jobs_max_messages,
                duplicate_window: Duration::from_secs(120),
                ..Default::default()
            },
            role,
        )
        .await?;
        ensure_stream(
            &js,
            stream::Config {
                num_replicas: settings.replicas,
                name: names.dlq_stream(),
                subjects: vec![format!("{p}.dlq.>")],
                retention: stream::RetentionPolicy::Limits,
                storage: stream::StorageType::File,
                discard: stream::DiscardPolicy::Old,
                max_messages: settings.dlq_max_messages,
                max_age: settings.dlq_max_age,
                // An exhausted job's letter is copied once (`copy_exhausted_to_dlq`).
                duplicate_window: Duration::from_secs(120),
                ..Default::default()
            },
            role,
        )
        .await?;
        ensure_stream(
            &js,
            stream::Config {
                num_replicas: settings.replicas,
                name: names.interactions_stream(),
                subjects: vec![
                    format!("{p}.interactions.requested.>"),
                    format!("{p}.interactions.resolved.>"),
                    format!("{p}.interactions.updated.>"),
                    format!("{p}.interactions.escalated.>"),
                    format!("{p}.runs.>"),
                ],
                retention: stream::RetentionPolicy::Limits,
                storage: stream::StorageType::File,
                max_age: settings.interactions_max_age,
                duplicate_window: Duration::from_secs(120),
                ..Default::default()
            },
            role,
        )
        .await?;
        let lane = |lane: Lane| consumer::pull::Config {
            durable_name: Some(names.lane_consumer(lane)),
            filter_subject: names.lane_filter(lane),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: settings.ack_wait,
            max_deliver: settings.max_deliver,
            max_ack_pending: settings.max_ack_pending,
            ..Default::default()
        };
        // Starts first: a worker narrows a `<p>-workers` left unfiltered by an older version to
        // `<p>.jobs.*` before `<p>-resumes` can exist (filters on a work queue may not overlap).
        let (stream, starts) =
            durable_consumer(&js, &names.jobs_stream(), lane(Lane::Starts), role).await?;
        let resumes = match durable_consumer(&js, &names.jobs_stream(), lane(Lane::Resumes), role)
            .await
        {
            Ok((_, c)) => Some(c),
            Err(e) if role == Role::Gateway => {
                // An upgrade that reached a gateway before any worker: the old consumer
                // still takes every job. This gateway goes on publishing resume jobs where
                // it does (see `publish_job_as`) until it restarts.
                tracing::warn!(
                    error = %chain(&e),
                    "no consumer of resume jobs yet (workers not upgraded): this gateway publishes resume jobs as before, without priority, until it restarts"
                );
                None
            }
            Err(e) => return Err(e),
        };
        ensure_stream(
            &js,
            stream::Config {
                num_replicas: settings.replicas,
                name: names.exhausted_stream(),
                subjects: names.exhausted_advisories(),
                retention: stream::RetentionPolicy::WorkQueue,
                storage: stream::StorageType::File,
                max_age: settings.interactions_max_age,
                ..Default::default()
            },
            role,
        )
        .await?;
        let (_, exhausted) = durable_consumer(
            &js,
            &names.exhausted_stream(),
            consumer::pull::Config {
                durable_name: Some(names.exhausted_consumer()),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(30),
                ..Default::default()
            },
            role,
        )
        .await?;
        if role == Role::Gateway {
            ensure_slack_bucket(&js, prefix, settings.replicas).await;
        }
        Ok(Queue {
            client,
            js,
            names,
            starts,
            resumes,
            jobs: stream,
            exhausted,
            resumed_notes: Arc::default(),
        })
    }

    pub fn names(&self) -> &Names {
        &self.names
    }

    async fn publish(
        &self,
        subject: String,
        headers: HeaderMap,
        payload: Vec<u8>,
    ) -> Result<Published, Error> {
        let err = |source: Cause| Error::Publish {
            subject: subject.clone(),
            source,
        };
        let ack = self
            .js
            .publish_with_headers(subject.clone(), headers, payload.into())
            .await
            .map_err(|e| err(e.into()))?;
        let ack = ack.await.map_err(|e| err(e.into()))?;
        Ok(Published {
            seq: ack.sequence,
            duplicate: ack.duplicate,
        })
    }

    /// Publishes a job for `agent` on its kind's subject (`…jobs.<agent>` or
    /// `…jobs.<agent>.resume`), idempotently (`Nats-Msg-Id`), and waits for the server's ack.
    /// Returns its stream sequence (that of the first copy, for a duplicate).
    pub async fn publish_job(
        &self,
        agent: &str,
        job: &Job,
        traceparent: Option<&str>,
    ) -> Result<u64, Error> {
        self.publish_job_as(agent, job, &job.msg_id(), traceparent)
            .await
    }

    /// Publishes a job under its own `Nats-Msg-Id` (a reconciler's re-enqueue of a lost job).
    /// Returns its stream sequence (that of the first copy, for a duplicate).
    pub async fn publish_job_as(
        &self,
        agent: &str,
        job: &Job,
        msg_id: &str,
        traceparent: Option<&str>,
    ) -> Result<u64, Error> {
        Ok(self
            .publish_job_acked(agent, job, msg_id, traceparent)
            .await?
            .seq)
    }

    /// [`Queue::publish_job_as`], saying whether JetStream dropped it as a duplicate of a
    /// publish under the same id within its duplicate window (and so added nothing).
    pub async fn publish_job_acked(
        &self,
        agent: &str,
        job: &Job,
        msg_id: &str,
        traceparent: Option<&str>,
    ) -> Result<Published, Error> {
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", msg_id);
        if let Some(tp) = traceparent.filter(|tp| is_traceparent(tp)) {
            headers.insert("traceparent", tp);
        }
        // Without a consumer of resume jobs, workers of a build before resumes first (2026-11-24)
        // may still take every job, and they refuse a job that carries its run (`run`,
        // `paused`: 2026-11-27) as malformed. Such a job goes without it: its worker reads the
        // run, as before.
        let payload = match (&self.resumes, job.run.is_some() || job.paused.is_some()) {
            (None, true) => serde_json::to_vec(&Job {
                run: None,
                paused: None,
                ..job.clone()
            }),
            _ => serde_json::to_vec(job),
        }
        .unwrap_or_default();
        let subject = match (job.kind, &self.resumes) {
            // No consumer of resume jobs yet (an upgrade that reached this gateway before any
            // worker): the old subject, which the old consumer serves. A resume on the new one
            // would be delivered again by `<p>-resumes` once a worker creates it, while an old
            // worker still holds it.
            (JobKind::Resume, None) => self.names.jobs_subject(agent),
            _ => self.names.job_subject(agent, job),
        };
        self.publish(subject, headers, payload).await
    }

    /// Announces a question on `…interactions.requested.<agent>.<run_id>` (idempotent per request),
    /// with the run's trace context so that whoever answers continues the same trace.
    pub async fn publish_request(
        &self,
        q: &InteractionRequest,
        traceparent: Option<&str>,
    ) -> Result<(), Error> {
        self.announce_request(q, None, traceparent).await
    }

    /// Announces a question again after it was reopened: a new `Nats-Msg-Id` and event id, so
    /// that it is not dropped as a duplicate of the first announcement, made from `refused_at`
    /// (when the answer the engine refused was accepted): the same on every try of this
    /// announcement, so a retry whose first attempt got through is dropped, and another for the
    /// next reopen (another answer).
    pub async fn publish_request_again(
        &self,
        q: &InteractionRequest,
        refused_at: Timestamp,
        traceparent: Option<&str>,
    ) -> Result<(), Error> {
        self.announce_request(q, Some(refused_at), traceparent)
            .await
    }

    /// Announces pending question `q` once more (its asker may have died before it did):
    /// under its first announcement's id, or, once the engine reopened it (`reopened_at`, as
    /// stored with it), under its last reopen's (as [`Queue::publish_request_again`]). Either
    /// way one that did go out is dropped as a duplicate, and a reopened question is not
    /// taken for its first announcement.
    pub async fn publish_pending(
        &self,
        q: &InteractionRequest,
        reopened_at: Option<Timestamp>,
        traceparent: Option<&str>,
    ) -> Result<(), Error> {
        self.announce_request(q, reopened_at, traceparent).await
    }

    async fn announce_request(
        &self,
        q: &InteractionRequest,
        again_at: Option<Timestamp>,
        traceparent: Option<&str>,
    ) -> Result<(), Error> {
        let (subject, event) = self.request_event(q, again_at, traceparent);
        self.publish_event(subject, &event).await
    }

    /// The `requested` announcement of `q` (again at `again_at`, if so) and its subject.
    fn request_event<'a>(
        &self,
        q: &'a InteractionRequest,
        again_at: Option<Timestamp>,
        traceparent: Option<&str>,
    ) -> (String, events::CloudEvent<&'a InteractionRequest>) {
        let tp = traceparent.filter(|tp| is_traceparent(tp));
        let event = events::requested(&self.names.prefix, q, again_at, tp);
        let subject = self
            .names
            .requested_subject(&q.agent, &q.run_id.to_string());
        (subject, event)
    }

    /// Publishes an event (a CloudEvent, docs/protocol.md §4 "Events") on `subject`, idempotent
    /// by its id (`Nats-Msg-Id`), with its trace context as a header too.
    async fn publish_event<T: serde::Serialize>(
        &self,
        subject: String,
        event: &events::CloudEvent<T>,
    ) -> Result<(), Error> {
        let headers = event_headers(&event.id, event.traceparent.as_deref());
        self.publish(subject, headers, events::encode(event))
            .await
            .map(drop)
    }

    /// Announces question `q` (as [`Queue::publish_pending`] does, the same id) and then that
    /// it was settled (as [`Queue::publish_resolved`]), the second sent without waiting for the
    /// first's ack: both go to the events stream over this one connection, which keeps their
    /// order, and the two acks are waited for together (one round trip, not two).
    pub async fn publish_request_and_resolved(
        &self,
        q: &InteractionRequest,
        reopened_at: Option<Timestamp>,
        asked_traceparent: Option<&str>,
        resolved: &Resolved,
        traceparent: Option<&str>,
    ) -> Result<(), Error> {
        let (request_subject, request) = self.request_event(q, reopened_at, asked_traceparent);
        let settled = events::resolved(
            &self.names.prefix,
            &q.agent,
            resolved,
            traceparent.filter(|tp| is_traceparent(tp)),
        );
        let run = q.run_id.to_string();
        let sends = [
            (
                request_subject,
                event_headers(&request.id, request.traceparent.as_deref()),
                events::encode(&request),
            ),
            (
                self.names.resolved_subject(&q.agent, &run),
                event_headers(&settled.id, settled.traceparent.as_deref()),
                events::encode(&settled),
            ),
        ];
        let mut acks = Vec::with_capacity(2);
        for (subject, headers, payload) in sends {
            let ack = self
                .js
                .publish_with_headers(subject.clone(), headers, payload.into())
                .await
                .map_err(|e| Error::Publish {
                    subject: subject.clone(),
                    source: e.into(),
                })?;
            acks.push((subject, ack));
        }
        for (subject, ack) in acks {
            ack.await.map_err(|e| Error::Publish {
                subject,
                source: e.into(),
            })?;
        }
        Ok(())
    }

    /// Announces that a question was settled, on `…interactions.resolved.<agent>.<run_id>`
    /// (idempotent per request): `interaction.answered`, `.expired` or `.cancelled`.
    pub async fn publish_resolved(
        &self,
        agent: &str,
        resolved: &Resolved,
        traceparent: Option<&str>,
    ) -> Result<(), Error> {
        let tp = traceparent.filter(|tp| is_traceparent(tp));
        let event = events::resolved(&self.names.prefix, agent, resolved, tp);
        let subject = self
            .names
            .resolved_subject(agent, &resolved.run_id.to_string());
        self.publish_event(subject, &event).await
    }

    /// Announces a claim taken, given back or broken, or a vote counted, on
    /// `…interactions.updated.<agent>.<run_id>` (`interaction.updated`).
    pub async fn publish_update(
        &self,
        update: &delta_protocol::InteractionUpdate,
    ) -> Result<(), Error> {
        let event = events::updated(&self.names.prefix, update);
        let subject = self
            .names
            .updated_subject(&update.agent, &update.run_id.to_string());
        self.publish_event(subject, &event).await
    }

    /// Announces an escalation step carried out, on `…interactions.escalated.<agent>.<run_id>`
    /// (idempotent per step: `interaction.escalated`).
    pub async fn publish_escalated(&self, e: &delta_protocol::Escalated) -> Result<(), Error> {
        let event = events::escalated(&self.names.prefix, e);
        let subject = self
            .names
            .escalated_subject(&e.agent, &e.run_id.to_string());
        self.publish_event(subject, &event).await
    }

    /// Announces that a run ended, on `…runs.<completed|failed|cancelled>.<agent>.<run_id>`
    /// (idempotent per end: `run.completed`, `.failed`, `.cancelled`). Nothing for a run that
    /// has not ended.
    pub async fn publish_run_ended(
        &self,
        ended: &events::RunFinished,
        traceparent: Option<&str>,
    ) -> Result<(), Error> {
        let tp = traceparent.filter(|tp| is_traceparent(tp));
        let Some(event) = events::run_ended(&self.names.prefix, ended, tp) else {
            return Ok(());
        };
        let status = event.ty.rsplit('.').next().unwrap_or_default().to_owned();
        let subject =
            self.names
                .run_ended_subject(&status, &ended.agent, &ended.run_id.to_string());
        self.publish_event(subject, &event).await
    }

    /// Says (core NATS, best effort) that the answer to `request_id`, accepted at `answered_at`,
    /// is being resumed now: the gateways' answer→resume latency. Notes wait up to a tenth of a
    /// second for others and go together, as one JSON array ([`ResumedNote`]s): a message per
    /// worker and tenth of a second under load rather than one per resume
    /// (docs/protocol.md#subjects). A note that finds 4,096 waiting is dropped. Called within a
    /// Tokio runtime: the first note starts the task that sends them.
    pub fn announce_resumed(&self, request_id: RequestId, answered_at: Timestamp) {
        let note = ResumedNote {
            request_id,
            answered_at,
            resumed_at: Timestamp::now(),
        };
        let notes = self.resumed_notes.get_or_init(|| {
            let (tx, rx) = tokio::sync::mpsc::channel(4096);
            tokio::spawn(send_resumed_notes(
                self.client.clone(),
                self.names.resumed_subject(),
                rx,
            ));
            tx
        });
        let _ = notes.try_send(NotesMsg::Note(note));
    }

    /// Hands the `resumed` notes still waiting to the client now (a worker stopping; then
    /// [`Queue::flush`] sends them). Returns at once when no note was ever sent.
    pub async fn send_resumed_notes_now(&self) {
        let Some(notes) = self.resumed_notes.get() else {
            return;
        };
        let (done, sent) = tokio::sync::oneshot::channel();
        if notes.send(NotesMsg::SendNow(done)).await.is_ok() {
            let _ = sent.await;
        }
    }

    /// Says (core NATS, best effort) that `run_id` was cancelled, so that a worker running one of
    /// its steps stops it now rather than when the step ends (its writes are refused either way).
    pub async fn announce_cancelled(&self, run_id: RunId) {
        let _ = self
            .client
            .publish(
                self.names.cancelled_subject(),
                run_id.to_string().into_bytes().into(),
            )
            .await;
    }

    /// The runs cancelled from now on, as gateways announce them.
    pub async fn cancellations(&self) -> Result<async_nats::Subscriber, Error> {
        self.client
            .subscribe(self.names.cancelled_subject())
            .await
            .map_err(|e| Error::Fetch {
                consumer: self.names.cancelled_subject(),
                source: e.into(),
            })
    }

    /// Whether the events stream holds the announcement that `run` of `agent` ended `status`
    /// (`completed`, `failed`, `cancelled`): a message on its end's subject.
    pub async fn run_end_in_stream(
        &self,
        status: &str,
        agent: &str,
        run: RunId,
    ) -> Result<bool, Error> {
        let name = self.names.interactions_stream();
        let stream = self
            .js
            .get_stream(&name)
            .await
            .map_err(|e| setup(&name)(e.into()))?;
        let subject = self
            .names
            .run_ended_subject(status, agent, &run.to_string());
        match stream.get_last_raw_message_by_subject(&subject).await {
            Ok(_) => Ok(true),
            Err(e) if is_no_message(e.kind()) => Ok(false),
            Err(e) => Err(Error::Fetch {
                consumer: format!("{name} ({subject})"),
                source: e.into(),
            }),
        }
    }

    /// Whether the job stream still holds message `seq` (a job not yet acknowledged).
    pub async fn job_exists(&self, seq: u64) -> Result<bool, Error> {
        match self.jobs.get_raw_message(seq).await {
            Ok(_) => Ok(true),
            Err(e) if is_no_message(e.kind()) => Ok(false),
            Err(e) => Err(Error::Fetch {
                consumer: format!("{} (job {seq})", self.names.jobs_stream()),
                source: e.into(),
            }),
        }
    }

    /// Whether this connection publishes resume jobs on their own subject (`…jobs.<agent>.resume`,
    /// served by `<p>-resumes`), or, with no consumer of resumes found when it connected (an
    /// upgrade under way), on the start jobs' subject, which the start jobs' consumer serves.
    pub fn resumes_have_their_lane(&self) -> bool {
        self.resumes.is_some()
    }

    /// The stream sequence up to which every job of `lane` is acknowledged (its consumer's ack
    /// floor): a job at or below it was taken and let go of, and is no longer in the stream. 0
    /// for a lane whose consumer does not exist yet (an upgrade under way, see `Queue::resumes`).
    pub async fn acked_through(&self, lane: Lane) -> Result<u64, Error> {
        let name = self.names.lane_consumer(lane);
        match self.jobs.consumer_info(&name).await {
            Ok(info) => Ok(info.ack_floor.stream_sequence),
            Err(e) if e.kind() == jetstream::context::ConsumerInfoErrorKind::NotFound => Ok(0),
            Err(e) => Err(Error::Fetch {
                consumer: name,
                source: e.into(),
            }),
        }
    }

    /// The workers' two consumers (added up) and the dead-letter stream, in figures.
    pub async fn stats(&self) -> Result<Stats, Error> {
        let err = |what: String, e: Cause| Error::Fetch {
            consumer: what,
            source: e,
        };
        let mut stats = Stats::default();
        for lane in Lane::ALL {
            let name = self.names.lane_consumer(lane);
            let info = match self.jobs.consumer_info(&name).await {
                Ok(info) => info,
                // Not made yet: an upgrade under way (see `Queue::resumes`).
                Err(e)
                    if lane == Lane::Resumes
                        && e.kind() == jetstream::context::ConsumerInfoErrorKind::NotFound =>
                {
                    continue;
                }
                Err(e) => return Err(err(name, e.into())),
            };
            stats.pending += info.num_pending;
            stats.in_flight += info.num_ack_pending as u64;
            stats.redelivered += info.num_redelivered as u64;
            stats.waiting_pulls += info.num_waiting as u64;
        }
        let mut dlq = self
            .js
            .get_stream(self.names.dlq_stream())
            .await
            .map_err(|e| err(self.names.dlq_stream(), e.into()))?;
        let dlq = dlq
            .info()
            .await
            .map_err(|e| err(self.names.dlq_stream(), e.into()))?;
        stats.dead_lettered = dlq.state.messages;
        Ok(stats)
    }

    /// The dead-letter stream.
    async fn dlq(&self) -> Result<stream::Stream, Error> {
        self.js
            .get_stream(self.names.dlq_stream())
            .await
            .map_err(|e| self.dlq_error(e.into()))
    }

    fn dlq_error(&self, source: Cause) -> Error {
        Error::Fetch {
            consumer: self.names.dlq_stream(),
            source,
        }
    }

    /// Up to `limit` dead-lettered jobs from stream sequence `from` on, oldest first, of one
    /// agent or all; and whether more follow.
    pub async fn dead_letters(
        &self,
        agent: Option<&str>,
        from: u64,
        limit: usize,
    ) -> Result<(Vec<DeadLetter>, bool), Error> {
        let stream = self.dlq().await?;
        let err = |e: Cause| self.dlq_error(e);
        let consumer = stream
            .create_consumer(consumer::pull::OrderedConfig {
                deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: from.max(1),
                },
                filter_subject: agent.map(|a| self.names.dlq_subject(a)).unwrap_or_default(),
                ..Default::default()
            })
            .await
            .map_err(|e| err(e.into()))?;
        let mut left = consumer.cached_info().num_pending;
        let mut out = vec![];
        if left == 0 || limit == 0 {
            return Ok((out, left > 0));
        }
        let mut messages = consumer.messages().await.map_err(|e| err(e.into()))?;
        while out.len() < limit && left > 0 {
            let next = tokio::time::timeout(Duration::from_secs(5), messages.next()).await;
            let m = match next {
                Ok(Some(Ok(m))) => m,
                Ok(Some(Err(e))) => return Err(err(e.into())),
                Ok(None) | Err(_) => break,
            };
            let Ok(info) = m.info() else { break };
            left = info.pending;
            out.push(DeadLetter::from_parts(
                info.stream_sequence,
                m.subject.as_str(),
                m.headers.as_ref(),
                &m.payload,
                info.published.unix_timestamp_nanos(),
                &self.names.prefix,
            ));
        }
        Ok((out, left > 0))
    }

    /// One dead-lettered job, if the stream holds it.
    pub async fn dead_letter_at(&self, seq: u64) -> Result<Option<DeadLetter>, Error> {
        let stream = self.dlq().await?;
        let err = |e: Cause| self.dlq_error(e);
        match stream.get_raw_message(seq).await {
            Ok(m) => Ok(Some(DeadLetter::from_parts(
                m.sequence,
                m.subject.as_str(),
                Some(&m.headers),
                &m.payload,
                m.time.unix_timestamp_nanos(),
                &self.names.prefix,
            ))),
            Err(e) if is_no_message(e.kind()) => Ok(None),
            Err(e) => Err(err(format!("reading {seq}: {e}").into())),
        }
    }

    /// Removes a dead-lettered job (retried or given up on); `false` when it was gone already.
    pub async fn drop_dead_letter(&self, seq: u64) -> Result<bool, Error> {
        let stream = self.dlq().await?;
        let err = |e: Cause| self.dlq_error(e);
        match stream.delete_message(seq).await {
            Ok(deleted) => Ok(deleted),
            // The server says "delete failed" for a message that is not there (any more) too.
            Err(e) => match stream.get_raw_message(seq).await {
                Err(gone) if is_no_message(gone.kind()) => Ok(false),
                _ => Err(err(format!("deleting {seq}: {e}").into())),
            },
        }
    }

    /// Interaction events (`requested`, `resolved`, `updated`, `escalated`) from stream
    /// sequence `from` on, or only new ones; for live views, each on its own ordered consumer.
    pub async fn interaction_events(
        &self,
        from: Option<u64>,
    ) -> Result<impl futures_util::Stream<Item = InteractionEvent> + use<>, Error> {
        let deliver_policy = match from {
            Some(start_sequence) => consumer::DeliverPolicy::ByStartSequence { start_sequence },
            None => consumer::DeliverPolicy::New,
        };
        let p = self.names.prefix.clone();
        let kinds = ["requested", "resolved", "updated", "escalated"];
        let messages = self
            .ordered_interactions(
                deliver_policy,
                kinds
                    .iter()
                    .map(|k| format!("{p}.interactions.{k}.>"))
                    .collect(),
            )
            .await?;
        let prefix = format!("{p}.interactions.");
        Ok(messages.filter_map(move |m| {
            let event = m.ok().and_then(|m| {
                let seq = m.info().ok()?.stream_sequence;
                let rest = m.subject.as_str().strip_prefix(&prefix)?;
                let kind = *kinds
                    .iter()
                    .find(|k| rest.strip_prefix(**k).is_some_and(|r| r.starts_with('.')))?;
                // `data` as it was written (no second serialization). A message from before
                // events were CloudEvents (kept 7 days, or from a worker not yet upgraded) is
                // that data itself, its agent the subject's next token.
                Some(
                    match events::decode::<Box<serde_json::value::RawValue>>(&m.payload) {
                        Ok(event) => InteractionEvent {
                            seq,
                            kind,
                            agent: event.deltaagent,
                            payload: event.data.get().as_bytes().to_vec(),
                        },
                        Err(_) => InteractionEvent {
                            seq,
                            kind,
                            agent: rest[kind.len() + 1..]
                                .split('.')
                                .next()
                                .unwrap_or_default()
                                .to_owned(),
                            payload: m.payload.to_vec(),
                        },
                    },
                )
            });
            std::future::ready(event)
        }))
    }

    /// The `requested` announcements stored from now on, as their messages' payloads, on an
    /// ordered consumer of their own: a question comes only once the events stream holds it
    /// (a core subscription would hear one the stream then refused).
    pub async fn stored_questions(
        &self,
    ) -> Result<impl futures_util::Stream<Item = Vec<u8>> + use<>, Error> {
        let filter = format!("{}.interactions.requested.>", self.names.prefix);
        let messages = self
            .ordered_interactions(consumer::DeliverPolicy::New, vec![filter])
            .await?;
        Ok(messages.filter_map(|m| std::future::ready(m.ok().map(|m| m.payload.to_vec()))))
    }

    /// The events stream's messages on `filter_subjects` from `deliver_policy` on, through an
    /// ordered consumer of this connection's own.
    ///
    /// The stream ends (its reader makes a new one) should the client make the consumer again
    /// from the stream's first message, as async-nats does for one that delivered nothing yet
    /// when it misses its heartbeats: that would replay up to 7 days of events. Only new
    /// messages are asked for as "after the stream's last sequence now", so that such a replay
    /// is seen at its first message. (A consumer deleted under it, or a NATS restart, ends the
    /// client's stream instead: tests/tests/gateway.rs.)
    async fn ordered_interactions(
        &self,
        deliver_policy: consumer::DeliverPolicy,
        filter_subjects: Vec<String>,
    ) -> Result<
        impl futures_util::Stream<Item = Result<async_nats::jetstream::Message, Cause>> + use<>,
        Error,
    > {
        let name = self.names.interactions_stream();
        let err = |e: Cause| setup(&name)(e);
        let stream = self.js.get_stream(&name).await.map_err(|e| err(e.into()))?;
        let deliver_policy = match deliver_policy {
            // The stream's state as `get_stream` just read it: no second request.
            consumer::DeliverPolicy::New => consumer::DeliverPolicy::ByStartSequence {
                start_sequence: stream.cached_info().state.last_sequence + 1,
            },
            other => other,
        };
        let first = match deliver_policy {
            consumer::DeliverPolicy::ByStartSequence { start_sequence } => start_sequence,
            _ => 0,
        };
        let messages = stream
            .create_consumer(consumer::pull::OrderedConfig {
                deliver_policy,
                filter_subjects,
                ..Default::default()
            })
            .await
            .map_err(|e| err(e.into()))?
            .messages()
            .await
            .map_err(|e| err(e.into()))?;
        Ok(messages
            .map(|m| m.map_err(Cause::from))
            .take_while(move |m| {
                let replayed = m
                    .as_ref()
                    .ok()
                    .and_then(|m| m.info().ok())
                    .is_some_and(|i| i.stream_sequence < first);
                if replayed {
                    tracing::debug!(
                        first,
                        "the events' consumer was made again from the stream's start; ending it"
                    );
                }
                std::future::ready(!replayed)
            }))
    }

    /// Copies a delivery to the dead-letter stream with the reason in a header; a second copy
    /// of the same job within two minutes (a delivery given back after its copy, poisoned again)
    /// is dropped as a duplicate.
    pub async fn dead_letter(&self, d: &Delivery, reason: &str) -> Result<(), Error> {
        let payload = d.msg.payload.to_vec();
        let id = format!("dlq:poison:{}", d.fence.stream_seq);
        self.copy_to_dlq(
            &d.agent,
            d.fence.stream_seq,
            d.traceparent.as_deref(),
            reason,
            payload,
            Some(&id),
        )
        .await
    }

    /// Publishes a job's payload on `…dlq.<agent>` with `Delta-Dlq-Reason`, `Delta-Stream-Seq` and
    /// its `traceparent`, and `Nats-Msg-Id` `msg_id` if given (a second copy under it within two
    /// minutes is dropped). A resume job's copy leaves out the paused run it carried (its record and
    /// question, the answer with them): the dead-letter stream keeps a letter for 30 days, and
    /// answers stay out of it (docs/security.md); a retry reads the run from Redis.
    async fn copy_to_dlq(
        &self,
        agent: &str,
        seq: u64,
        traceparent: Option<&str>,
        reason: &str,
        payload: Vec<u8>,
        msg_id: Option<&str>,
    ) -> Result<(), Error> {
        let payload = match Job::decode(&payload) {
            Ok(mut job) if job.paused.is_some() => {
                job.paused = None;
                serde_json::to_vec(&job).unwrap_or(payload)
            }
            _ => payload,
        };
        let mut headers = HeaderMap::new();
        headers.insert(
            "Delta-Dlq-Reason",
            reason.replace(['\r', '\n'], " ").as_str(),
        );
        headers.insert("Delta-Stream-Seq", seq.to_string().as_str());
        if let Some(id) = msg_id {
            headers.insert("Nats-Msg-Id", id);
        }
        if let Some(tp) = traceparent.filter(|tp| is_traceparent(tp)) {
            headers.insert("traceparent", tp);
        }
        self.publish(self.names.dlq_subject(agent), headers, payload)
            .await
            .map(drop)
    }

    /// Pulls up to `max` jobs from `lane`'s consumer, waiting at most `wait` for the first
    /// (`Duration::ZERO`: only what is there now). A job is what its payload says, whichever
    /// consumer brought it: resumes published before they had their own subject come as starts.
    pub async fn fetch(
        &self,
        lane: Lane,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Delivery>, Error> {
        let err = |source: Cause| Error::Fetch {
            consumer: self.names.lane_consumer(lane),
            source,
        };
        let consumer = match lane {
            Lane::Starts => &self.starts,
            Lane::Resumes => self.resumes.as_ref().ok_or_else(|| {
                err("this connection has no consumer of resume jobs (a gateway's)".into())
            })?,
        };
        let mut request = consumer.fetch().max_messages(max);
        if !wait.is_zero() {
            request = request.expires(wait);
        }
        let mut batch = request.messages().await.map_err(|e| err(e.into()))?;
        let mut out = vec![];
        while let Some(msg) = batch.next().await {
            let msg = msg.map_err(&err)?;
            let (fence, agent) = {
                let info = msg.info().map_err(&err)?;
                let agent = self
                    .names
                    .agent_of_job_subject(msg.subject.as_str())
                    .unwrap_or("")
                    .to_owned();
                (
                    Fence {
                        stream_seq: info.stream_sequence,
                        delivery: u64::try_from(info.delivered).unwrap_or(0),
                    },
                    agent,
                )
            };
            let job = Job::decode(&msg.payload).map_err(|e| e.to_string());
            let traceparent = msg
                .headers
                .as_ref()
                .and_then(|h| h.get("traceparent"))
                .map(|v| v.as_str().to_owned());
            out.push(Delivery {
                msg,
                job,
                fence,
                agent,
                traceparent,
            });
        }
        Ok(out)
    }

    /// Takes the jobs that used up `max_deliver`, waiting at most `wait` for one.
    pub async fn fetch_exhausted(&self, wait: Duration) -> Result<Vec<Exhausted>, Error> {
        let err = |source: Cause| Error::Fetch {
            consumer: self.names.exhausted_consumer(),
            source,
        };
        let mut batch = self
            .exhausted
            .fetch()
            .max_messages(16)
            .expires(wait)
            .messages()
            .await
            .map_err(|e| err(e.into()))?;
        let mut out = vec![];
        while let Some(msg) = batch.next().await {
            let advisory = msg.map_err(&err)?;
            let Ok(adv) = serde_json::from_slice::<MaxDeliveries>(&advisory.payload) else {
                tracing::warn!("ignoring an advisory that is not MAX_DELIVERIES");
                let _ = advisory.ack().await;
                continue;
            };
            let raw = match self.jobs.get_raw_message(adv.stream_seq).await {
                Ok(m) => Some(m),
                Err(e) if is_no_message(e.kind()) => None,
                // Not known to be gone: leave the advisory for another try.
                Err(e) => return Err(err(format!("reading job {}: {e}", adv.stream_seq).into())),
            };
            let agent = raw
                .as_ref()
                .and_then(|m| self.names.agent_of_job_subject(m.subject.as_str()))
                .map(str::to_owned)
                .unwrap_or_default();
            let job = raw.as_ref().and_then(|m| Job::decode(&m.payload).ok());
            let traceparent = raw
                .as_ref()
                .and_then(|m| m.headers.get("traceparent"))
                .map(|v| v.as_str().to_owned());
            out.push(Exhausted {
                advisory,
                // One past the last delivery: outranks a worker still holding it.
                fence: Fence {
                    stream_seq: adv.stream_seq,
                    delivery: adv.deliveries.saturating_add(1),
                },
                deliveries: adv.deliveries,
                job,
                agent,
                traceparent,
                payload: raw.map(|m| m.payload.to_vec()),
            });
        }
        Ok(out)
    }

    /// Copies an exhausted job to the dead-letter stream (nothing for a job already gone,
    /// handled meanwhile), as `Nats-Msg-Id` `dlq:exhausted:<stream sequence>`.
    /// [`Queue::drop_exhausted`] then removes it, once its run is failed: a worker that dies in
    /// between leaves the advisory to another, whose copy is dropped as a duplicate within the
    /// dead-letter stream's two minutes.
    pub async fn copy_exhausted_to_dlq(&self, x: &Exhausted, reason: &str) -> Result<(), Error> {
        if let Some(payload) = &x.payload {
            let tp = x.traceparent.as_deref();
            // One letter per exhausted job, whichever worker copies it: the reason is the same
            // for each (not for a poison delivery's copy of the same job, which keeps its own).
            let id = format!("dlq:exhausted:{}", x.fence.stream_seq);
            self.copy_to_dlq(
                &x.agent,
                x.fence.stream_seq,
                tp,
                reason,
                payload.clone(),
                Some(&id),
            )
            .await?;
        }
        Ok(())
    }

    /// Removes an exhausted job that needs no dead-lettering (its run went on) and acknowledges
    /// the advisory.
    pub async fn drop_exhausted(&self, x: &Exhausted) -> Result<(), Error> {
        if x.payload.is_some() {
            self.jobs
                .delete_message(x.fence.stream_seq)
                .await
                .map_err(|e| {
                    Error::Ack(format!("removing exhausted job {}: {e}", x.fence.stream_seq).into())
                })?;
        }
        x.advisory.double_ack().await.map_err(Error::Ack)
    }

    /// Writes what the client still buffers (acks, naks) to the server's connection. It waits
    /// for as long as the client is not connected: bound it with a timeout.
    pub async fn flush(&self) -> Result<(), Error> {
        self.client
            .flush()
            .await
            .map_err(|e| Error::Ack(Box::new(e)))
    }

    /// The core NATS client, for subscribers.
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }
}

impl Delivery {
    /// Done. Sent without waiting for the server to confirm it, as naks are: an ack lost on the
    /// way (the connection dropped) redelivers a finished job after `ack_wait`, which the next
    /// delivery finds finished (fenced, or its run past the job) and acks again. [`Queue::flush`]
    /// before exiting sends what is still buffered.
    pub async fn ack(&self) -> Result<(), Error> {
        self.msg.ack().await.map_err(Error::Ack)
    }

    /// Not now: redeliver after `delay`.
    pub async fn nak(&self, delay: Option<Duration>) -> Result<(), Error> {
        self.msg
            .ack_with(AckKind::Nak(delay))
            .await
            .map_err(Error::Ack)
    }

    /// Still working: restart the `ack_wait` clock.
    pub async fn progress(&self) -> Result<(), Error> {
        self.msg
            .ack_with(AckKind::Progress)
            .await
            .map_err(Error::Ack)
    }

    /// Never again (after a copy went to the dead-letter stream): work queues delete it.
    pub async fn term(&self) -> Result<(), Error> {
        self.msg
            .double_ack_with(AckKind::Term)
            .await
            .map_err(Error::Ack)
    }
}

/// An event's headers: its id as `Nats-Msg-Id` (a second copy inside the duplicate window is
/// dropped), and its trace context.
fn event_headers(id: &str, traceparent: Option<&str>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("Nats-Msg-Id", id);
    if let Some(tp) = traceparent {
        headers.insert("traceparent", tp);
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Slack bridge's bucket stream is sound only capturing its own subjects: one made to
    /// capture bots' answers too is reported, with what to do.
    #[test]
    fn a_slack_bucket_capturing_more_is_reported() {
        let own = vec!["$KV.DELTA_SLACK.>".to_owned()];
        assert!(slack_bucket_sound("delta", &own).is_ok());
        for bad in [
            vec![
                "$KV.DELTA_SLACK.>".to_owned(),
                "delta.interactions.respond.*".to_owned(),
            ],
            vec!["delta.interactions.respond.*".to_owned()],
            vec![],
        ] {
            let why = slack_bucket_sound("delta", &bad).expect_err("unsound");
            assert!(why.contains("nats stream rm KV_DELTA_SLACK"), "{why}");
        }
        assert!(
            slack_bucket_sound("other", &own).is_err(),
            "another prefix's"
        );
    }

    #[test]
    fn only_a_publish_nats_may_take_later_is_transient() {
        use jetstream::context::{PublishError, PublishErrorKind as K};
        let publish = |kind: K| Error::Publish {
            subject: "delta.interactions.requested.a.b".into(),
            source: Box::new(PublishError::new(kind)),
        };
        for kind in [
            K::StreamNotFound,
            K::TimedOut,
            K::BrokenPipe,
            K::MaxAckPending,
        ] {
            assert!(publish(kind).is_transient_publish(), "{kind:?}");
        }
        for kind in [K::MaxPayloadExceeded, K::Other, K::WrongLastSequence] {
            assert!(!publish(kind).is_transient_publish(), "{kind:?}");
        }
        let other: Cause = "something else".into();
        assert!(
            !Error::Publish {
                subject: "s".into(),
                source: other
            }
            .is_transient_publish()
        );
        assert!(!Error::Ack("x".into()).is_transient_publish());
    }

    #[test]
    fn a_job_goes_on_its_kinds_subject_and_either_subject_names_its_agent() {
        let names = Names::new("delta");
        let start = Job::start(RunId::new());
        let resume = Job {
            kind: JobKind::Resume,
            request_id: Some(RequestId::new()),
            ..start.clone()
        };
        assert_eq!(names.job_subject("hello", &start), "delta.jobs.hello");
        assert_eq!(
            names.job_subject("hello", &resume),
            "delta.jobs.hello.resume"
        );
        for (subject, agent) in [
            ("delta.jobs.hello", Some("hello")),
            ("delta.jobs.hello.resume", Some("hello")),
            // An agent may be called `resume`: one token is always the agent.
            ("delta.jobs.resume", Some("resume")),
            ("delta.jobs.resume.resume", Some("resume")),
            ("delta.dlq.hello", None),
            ("deltax.jobs.hello", None),
        ] {
            assert_eq!(names.agent_of_job_subject(subject), agent, "{subject}");
        }
        assert_eq!(names.lane_filter(Lane::Starts), "delta.jobs.*");
        assert_eq!(names.lane_filter(Lane::Resumes), "delta.jobs.*.resume");
        assert_eq!(
            names.exhausted_advisories(),
            [
                "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.DELTA_JOBS.delta-workers",
                "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.DELTA_JOBS.delta-resumes",
            ]
        );
    }

    #[test]
    fn only_a_w3c_traceparent_goes_in_a_header() {
        assert!(super::is_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\nX: y",
            "00-xyz-00f067aa0ba902b7-01",
            "garbage",
        ] {
            assert!(!super::is_traceparent(bad), "{bad:?}");
        }
    }
}
