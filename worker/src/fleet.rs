//! The fleet host of the engine: pull a job, advance its run, release it (docs/architecture.md "The walk of one run").
//!
//! A permit of the concurrency limit is taken *before* pulling, so a worker never holds jobs it
//! cannot start. Resume jobs come first: they have a consumer of their own, pulled by a puller of
//! their own that may take any free slot, while start jobs may only take slots while more than
//! `resume_slots` are left (docs/protocol.md §4 "Resumes first").
//!
//! Each job is handled in a tracked task: the run is advanced through a Redis store fenced with
//! the delivery's token, `Progress` acks keep JetStream from redelivering during long steps, and
//! the outcome maps to one queue action. Nothing of a run stays in the worker.
//!
//! | outcome | queue |
//! |---|---|
//! | completed, failed, cancelled | ack |
//! | paused | publish the request (idempotent), then ack |
//! | poison (bad JSON, unknown run, broken agent) | copy to the DLQ, run `FAILED` with the reason, term |
//! | store or brain unavailable | nak with backoff; on the last delivery, as poison |
//! | worker died on the last delivery | another worker takes JetStream's advisory: DLQ, run `FAILED`, job removed |
//! | fenced (a newer delivery owns the run) | nothing: this delivery is stale |
//! | shutdown mid-run | the run is checkpointed `INTERRUPTED`, nak so another worker resumes it |

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use delta_engine::agent::Agent;
use delta_engine::brain::AnyBrain;
use delta_engine::engine::{self, Engine, Outcome, PauseMode};
use delta_engine::resume::{self, Answers, Resumed};
use delta_protocol::secret::SecretsKey;
use delta_protocol::{Event, Fence, JobKind, MessageLevel, RunId, RunStatus, SystemMessage};
use delta_queue::{self as queue, Delivery, Exhausted, Queue};
use delta_store::redis::RedisRunStore;
use delta_store::{self as store, RunStore, StatusChange, Terminal};

use crate::workdir::WorkDirs;

/// How a worker runs. Its `Debug` shows the servers' URLs without their passwords.
#[derive(Clone)]
pub struct Config {
    pub nats_url: String,
    pub redis_url: String,
    /// CA certificates (PEM) that sign Redis's TLS certificate (the system's roots when `None`).
    pub redis_ca: Option<PathBuf>,
    pub prefix: String,
    pub agents_dir: PathBuf,
    /// The root of the runs' work directories: a run's tools run in `<work_dir>/<run_id>`.
    pub work_dir: PathBuf,
    pub concurrency: usize,
    /// Slots start jobs may not take, kept for resume jobs (`DELTA_RESUME_SLOTS`; see
    /// [`default_resume_slots`]). Less than `concurrency`: at least one slot is the starts'.
    pub resume_slots: usize,
    pub queue: queue::Settings,
    /// This worker's id, journaled in `ENGINE_START.worker`.
    pub worker_id: String,
    /// How long in-flight runs may take to checkpoint after shutdown is asked.
    pub grace: Duration,
    /// Opens sensitive answers sealed by the gateway (`DELTA_SECRETS_KEY`).
    pub secrets_key: Option<Arc<SecretsKey>>,
    /// How the record of a call to a tool that must not run twice is made durable before the
    /// tool runs (`DELTA_REDIS_DURABILITY`).
    pub durability: delta_store::redis::Durability,
    /// `redis_url` lists seed nodes of a Redis Cluster (`DELTA_REDIS_CLUSTER`).
    pub redis_cluster: bool,
    /// How many buckets the runs are spread over in Redis (`DELTA_REDIS_BUCKETS`).
    pub redis_buckets: Option<u32>,
    /// How long after it finished a run's work directory is kept (the gateways' retention of the
    /// run itself); `None`: until the run is deleted from the store.
    pub retention: Option<Duration>,
    /// How often the work directories are swept.
    pub sweep_every: Duration,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field(
                "nats_url",
                &delta_protocol::without_credentials(&self.nats_url),
            )
            .field(
                "redis_url",
                &delta_protocol::without_credentials(&self.redis_url),
            )
            .field("prefix", &self.prefix)
            .field("agents_dir", &self.agents_dir)
            .field("work_dir", &self.work_dir)
            .field("concurrency", &self.concurrency)
            .field("resume_slots", &self.resume_slots)
            .field("worker_id", &self.worker_id)
            .field("secrets_key", &self.secrets_key)
            .field("durability", &self.durability)
            .field("redis_cluster", &self.redis_cluster)
            .field("redis_buckets", &self.redis_buckets)
            .finish_non_exhaustive()
    }
}

/// Why the worker could not run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Queue(#[from] queue::Error),
    #[error(transparent)]
    Store(#[from] store::Error),
    #[error("DELTA_WORK_DIR {path}: cannot create or open it")]
    WorkDir {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Agents by name, loaded once from the agents directory.
struct Agents {
    dir: PathBuf,
    loaded: Mutex<HashMap<String, Arc<(Agent, AnyBrain)>>>,
}

impl Agents {
    fn get(&self, name: &str) -> Result<Arc<(Agent, AnyBrain)>, String> {
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(a) = loaded.get(name) {
            return Ok(a.clone());
        }
        let valid = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !valid {
            return Err(format!("`{name}` is not a valid agent name"));
        }
        let agent = Agent::load(&self.dir.join(name))
            .map_err(|e| format!("agent `{name}`: {}", delta_host::Chain(&e)))?;
        for w in &agent.warnings {
            tracing::warn!(agent = name, "{w}");
        }
        let brain = AnyBrain::for_agent(&agent)
            .map_err(|e| format!("agent `{name}`: {}", delta_host::Chain(&e)))?;
        let pair = Arc::new((agent, brain));
        loaded.insert(name.to_owned(), pair.clone());
        Ok(pair)
    }
}

struct Shared {
    /// The runs this worker advances now, each with the tokens that stop it (by registration,
    /// should two deliveries of a run meet here).
    running: Mutex<HashMap<RunId, Vec<(u64, CancellationToken)>>>,
    /// Numbers the registrations in `running`.
    registrations: std::sync::atomic::AtomicU64,
    config: Config,
    queue: Queue,
    store: RedisRunStore,
    agents: Agents,
    /// Cancelled on shutdown: running engines checkpoint at their next safe point.
    stop: CancellationToken,
    /// Each run's work directory, under `DELTA_WORK_DIR`.
    work_dirs: WorkDirs,
}

/// The longest a stopping worker waits for its last acks to reach NATS.
const FLUSH_AT_EXIT: Duration = Duration::from_secs(5);

/// Jobs taken in one pull at most (bounded by the free slots).
const FETCH_BATCH: usize = 16;

/// Runs the worker until `shutdown` is cancelled, then stops pulling and lets in-flight runs
/// finish or checkpoint within the grace period.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), Error> {
    let queue = Queue::connect(&config.nats_url, &config.prefix, &config.queue).await?;
    let work_dirs = WorkDirs::open(&config.work_dir).map_err(|source| Error::WorkDir {
        path: config.work_dir.display().to_string(),
        source,
    })?;
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
    let shared = Arc::new(Shared {
        agents: Agents {
            dir: config.agents_dir.clone(),
            loaded: Mutex::new(HashMap::new()),
        },
        config,
        queue,
        store,
        stop: CancellationToken::new(),
        running: Mutex::new(HashMap::new()),
        registrations: std::sync::atomic::AtomicU64::new(0),
        work_dirs,
    });
    let cancels = tokio::spawn(follow_cancellations(shared.clone(), shutdown.clone()));
    let reaper = tokio::spawn(reap_exhausted(shared.clone(), shutdown.clone()));
    let heart = tokio::spawn(heartbeat(shared.clone(), shutdown.clone()));
    let sweeper = tokio::spawn(sweep_work_dirs(shared.clone(), shutdown.clone()));
    let slots = Slots::new(shared.config.concurrency, shared.config.resume_slots);
    let tracker = TaskTracker::new();
    tracing::info!(
        worker = %shared.config.worker_id,
        slots = slots.concurrency,
        resume_slots = slots.reserved,
        "worker started"
    );
    // Each puller long-polls its own consumer, so a resume never waits behind a start's pull.
    // With no slot reserved the start puller takes the resumes first itself: a puller of their
    // own would then hold slots idle that start jobs could use.
    let resumes = async {
        if slots.reserved > 0 {
            pull(&shared, &slots, queue::Lane::Resumes, &tracker, &shutdown).await;
        }
    };
    tokio::join!(
        resumes,
        pull(&shared, &slots, queue::Lane::Starts, &tracker, &shutdown),
    );
    tracker.close();
    if tokio::time::timeout(shared.config.grace, tracker.wait())
        .await
        .is_err()
    {
        // Out of grace: runs checkpoint as INTERRUPTED and their jobs are nak'ed.
        shared.stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), tracker.wait()).await;
    }
    let _ = reaper.await;
    let _ = heart.await;
    let _ = sweeper.await;
    cancels.abort();
    // The resume notes still waiting, then the last acks and naks (sent without waiting for
    // their confirmation) reach the server before the worker exits; not waited for past a few
    // seconds (NATS unreachable): their jobs are then redelivered, which finds them done.
    let _ = tokio::time::timeout(FLUSH_AT_EXIT, shared.queue.send_resumed_notes_now()).await;
    match tokio::time::timeout(FLUSH_AT_EXIT, shared.queue.flush()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %delta_host::Chain(&e), "acks not flushed at exit; their jobs are redelivered");
        }
        Err(_) => {
            tracing::warn!(
                "NATS did not take the last acks within {FLUSH_AT_EXIT:?}; their jobs are redelivered"
            );
        }
    }
    // Under a target of its own, so that benchmarks can keep it while silencing the rest.
    tracing::info!(
        target: "delta_stats",
        redis_round_trips = shared.store.round_trips(),
        "worker stopped"
    );
    Ok(())
}

/// The resume slots when `DELTA_RESUME_SLOTS` is not set: a quarter of `concurrency`, at least
/// one, and none when there is only one slot (start jobs keep it). With none reserved, there is
/// one puller, and it asks for resume jobs before each pull of start jobs.
pub fn default_resume_slots(concurrency: usize) -> usize {
    if concurrency <= 1 {
        0
    } else {
        (concurrency / 4).max(1)
    }
}

/// A worker's slots: every job holds one of `all`; a start job holds one of `starts` as well,
/// which has `reserved` fewer, so that that many slots stay for resume jobs.
struct Slots {
    all: Arc<Semaphore>,
    starts: Arc<Semaphore>,
    concurrency: usize,
    reserved: usize,
}

/// A slot a job holds until it is handled (both permits go back when it drops).
struct Slot {
    _all: OwnedSemaphorePermit,
    _start: Option<OwnedSemaphorePermit>,
}

impl Slots {
    fn new(concurrency: usize, reserved: usize) -> Self {
        let concurrency = concurrency.max(1);
        // Starts keep at least one slot, whatever the config says (it checks this too).
        let reserved = reserved.min(concurrency - 1);
        Slots {
            all: Arc::new(Semaphore::new(concurrency)),
            starts: Arc::new(Semaphore::new(concurrency - reserved)),
            concurrency,
            reserved,
        }
    }

    /// Waits for a slot for a job of `lane`; `None` once the semaphores are closed (never).
    async fn acquire(&self, lane: queue::Lane) -> Option<Slot> {
        let start = match lane {
            queue::Lane::Starts => Some(self.starts.clone().acquire_owned().await.ok()?),
            queue::Lane::Resumes => None,
        };
        let all = self.all.clone().acquire_owned().await.ok()?;
        Some(Slot {
            _all: all,
            _start: start,
        })
    }

    /// A slot for a job of `lane` if one is free now.
    fn try_acquire(&self, lane: queue::Lane) -> Option<Slot> {
        let start = match lane {
            queue::Lane::Starts => Some(self.starts.clone().try_acquire_owned().ok()?),
            queue::Lane::Resumes => None,
        };
        let all = self.all.clone().try_acquire_owned().ok()?;
        Some(Slot {
            _all: all,
            _start: start,
        })
    }

    /// How many slots one pull of `lane` may hold while it waits for jobs. Slots held by a
    /// pull that waits are idle: the resume puller holds at most the reserved share while it
    /// waits, so that it never keeps a free slot from a start job (it pulls again at once for
    /// more when a pull comes back full). A start pull can hold no more than its own share.
    fn batch(&self, lane: queue::Lane) -> usize {
        match lane {
            queue::Lane::Resumes => self.reserved.clamp(1, FETCH_BATCH),
            queue::Lane::Starts => FETCH_BATCH,
        }
    }
}

/// Pulls jobs of `lane` while slots allow, and handles each in a task of `tracker`, until
/// `shutdown`.
async fn pull(
    shared: &Arc<Shared>,
    slots: &Slots,
    lane: queue::Lane,
    tracker: &TaskTracker,
    shutdown: &CancellationToken,
) {
    loop {
        let first = tokio::select! {
            s = slots.acquire(lane) => match s { Some(s) => s, None => break },
            () = shutdown.cancelled() => break,
        };
        // One pull for as many jobs as there are free slots (up to a batch): under load that
        // is one round trip to NATS for several jobs; idle, the pull waits for the first.
        let mut held = vec![first];
        while held.len() < slots.batch(lane) {
            match slots.try_acquire(lane) {
                Some(s) => held.push(s),
                None => break,
            }
        }
        let fetched = tokio::select! {
            f = fetch_for(shared, slots, lane, held.len()) => f,
            () = shutdown.cancelled() => break,
        };
        let deliveries = match fetched {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %delta_host::Chain(&e), ?lane, "fetch failed; retrying");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(500)) => continue,
                    () = shutdown.cancelled() => break,
                }
            }
        };
        // Slots left over go back as `held` drops.
        for (delivery, slot) in deliveries.into_iter().zip(held.drain(..)) {
            spawn_job(shared, tracker, delivery, slot);
        }
    }
}

/// One pull of `lane` for up to `max` jobs. With no slot reserved for resumes (one slot in
/// all, or `DELTA_RESUME_SLOTS=0`), a start pull takes the resume jobs waiting first, so that
/// they still go first.
async fn fetch_for(
    shared: &Shared,
    slots: &Slots,
    lane: queue::Lane,
    max: usize,
) -> Result<Vec<Delivery>, queue::Error> {
    if lane == queue::Lane::Starts && slots.reserved == 0 {
        let resumes = shared
            .queue
            .fetch(queue::Lane::Resumes, max, Duration::ZERO)
            .await?;
        if !resumes.is_empty() {
            return Ok(resumes);
        }
    }
    shared.queue.fetch(lane, max, Duration::from_secs(1)).await
}

/// Handles `delivery` in a task of `tracker`, in the span of its job, holding `slot`.
fn spawn_job(shared: &Arc<Shared>, tracker: &TaskTracker, delivery: Delivery, slot: Slot) {
    let shared = shared.clone();
    let run_id = delivery.job.as_ref().map(|j| j.run_id.to_string()).ok();
    let span = tracing::info_span!(
        "job",
        run_id = run_id.as_deref().unwrap_or("?"),
        agent = %delivery.agent,
        seq = delivery.fence.stream_seq,
        delivery = delivery.fence.delivery,
    );
    delta_host::continue_trace(&span, delivery.traceparent.as_deref());
    tracker.spawn(
        async move {
            handle(&shared, delivery).await;
            drop(slot);
        }
        .instrument(span),
    );
}

/// A run this worker advances, registered for as long as the handle lives, so that a gateway's
/// cancel announcement reaches its token.
struct Running<'a> {
    shared: &'a Shared,
    run_id: RunId,
    number: u64,
}

impl<'a> Running<'a> {
    fn register(shared: &'a Shared, run_id: RunId, token: CancellationToken) -> Self {
        let number = shared
            .registrations
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        shared
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(run_id)
            .or_default()
            .push((number, token));
        Running {
            shared,
            run_id,
            number,
        }
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let mut running = self
            .shared
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(tokens) = running.get_mut(&self.run_id) {
            tokens.retain(|(n, _)| *n != self.number);
            if tokens.is_empty() {
                running.remove(&self.run_id);
            }
        }
    }
}

/// Stops the steps of runs that gateways announce as cancelled (core NATS: a missed
/// announcement only lets the step finish, and its writes are refused as before).
async fn follow_cancellations(shared: Arc<Shared>, shutdown: CancellationToken) {
    let mut subscription = match shared.queue.cancellations().await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %delta_host::Chain(&e), "cannot follow cancellations; a cancelled run's step will finish first");
            return;
        }
    };
    loop {
        let msg = tokio::select! {
            m = futures_util::StreamExt::next(&mut subscription) => match m {
                Some(m) => m,
                None => return,
            },
            () = shutdown.cancelled() => return,
        };
        let Some(run_id) = std::str::from_utf8(&msg.payload)
            .ok()
            .and_then(|s| s.trim().parse::<RunId>().ok())
        else {
            continue;
        };
        let running = shared.running.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tokens) = running.get(&run_id) {
            tracing::info!(%run_id, "the run was cancelled: stopping its step");
            tokens.iter().for_each(|(_, t)| t.cancel());
        }
    }
}

/// Tells the gateways (`GET /v1/queue`) this worker is alive, every few seconds until shutdown.
async fn heartbeat(shared: Arc<Shared>, shutdown: CancellationToken) {
    loop {
        if let Err(e) = shared.store.heartbeat(&shared.config.worker_id).await {
            tracing::debug!(error = %delta_host::Chain(&e), "heartbeat failed");
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(5)) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

/// Removes, every `sweep_every` until shutdown, the work directories of runs that no longer
/// exist in the store or finished longer than the retention period ago (see [`crate::workdir`]).
async fn sweep_work_dirs(shared: Arc<Shared>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(shared.config.sweep_every) => {}
            () = shutdown.cancelled() => return,
        }
        match sweep(&shared).await {
            Ok(0) => {}
            Ok(removed) => tracing::info!(removed, "work directories of finished runs removed"),
            Err(e) => tracing::warn!(error = %e, "work directory sweep failed; will retry"),
        }
    }
}

/// Work directories looked up in the store per round trip.
const SWEEP_BATCH: usize = 500;

/// Before when (µs) a finished run's work directory is removed: `DELTA_RETENTION` after it
/// finished, and for a `FAILED` run (which may be a dead letter's, kept for a retry that goes on
/// in its directory) as long as a letter is kept if that is longer. A failed run that was no dead
/// letter loses its directory sooner anyway: retention deletes its record, and a run not in
/// the store is swept at once.
#[derive(Clone, Copy, Debug)]
struct Cutoffs {
    finished: i64,
    failed: i64,
}

impl Cutoffs {
    fn at(now_us: i64, retention: Duration, letters: Duration) -> Cutoffs {
        let before = |keep: Duration| {
            now_us.saturating_sub(i64::try_from(keep.as_micros()).unwrap_or(i64::MAX))
        };
        Cutoffs {
            finished: before(retention),
            failed: before(retention.max(letters)),
        }
    }

    /// Whether the directory of a run that finished `status` at `at_us` is due.
    fn expired(self, status: RunStatus, at_us: i64) -> bool {
        let cutoff = if status == RunStatus::Failed {
            self.failed
        } else {
            self.finished
        };
        at_us <= cutoff
    }
}

/// One sweep of the work directories; returns how many it removed.
async fn sweep(shared: &Arc<Shared>) -> Result<usize, String> {
    let dirs = shared.work_dirs.clone();
    let runs = tokio::task::spawn_blocking(move || dirs.list())
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("{}: {e}", shared.work_dirs.root().display()))?;
    let cutoffs = shared.config.retention.map(|keep| {
        Cutoffs::at(
            delta_protocol::Timestamp::now().micros(),
            keep,
            shared.config.queue.dlq_max_age,
        )
    });
    let mut removed = 0;
    for batch in runs.chunks(SWEEP_BATCH) {
        let statuses = shared.store.statuses(batch).await.map_err(|e| why(&e))?;
        let finished_at = shared.store.finished_at(batch).await.map_err(|e| why(&e))?;
        let mut due = vec![];
        for (id, (status, at)) in batch.iter().zip(statuses.into_iter().zip(finished_at)) {
            let expired = match status {
                // No status: deleted from the store (retention), so nothing will run here again;
                // unless the record is only damaged, which a second read tells apart.
                None => matches!(
                    shared.store.record(*id).await,
                    Err(store::Error::NotFound(_))
                ),
                Some(s) if s.is_terminal() => match (cutoffs, at) {
                    (Some(c), Some(at)) => c.expired(s, at),
                    _ => false,
                },
                // Queued, running, paused or interrupted: kept.
                Some(_) => false,
            };
            // Never the directory of a run this worker is advancing right now.
            let here = shared
                .running
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains_key(id);
            if expired && !here {
                due.push(*id);
            }
        }
        if due.is_empty() {
            continue;
        }
        let dirs = shared.work_dirs.clone();
        let shared = shared.clone();
        removed += tokio::task::spawn_blocking(move || {
            let mut n = 0;
            for id in due {
                // Looked at again just before: a run retried meanwhile may have started here.
                let here = shared
                    .running
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .contains_key(&id);
                if here {
                    continue;
                }
                match dirs.remove(id) {
                    Ok(()) => n += 1,
                    Err(e) => tracing::warn!(run = %id, error = %e, "work directory not removed"),
                }
            }
            n
        })
        .await
        .map_err(|e| e.to_string())?;
    }
    Ok(removed)
}

/// Fails the run of a dead-lettered job with `reason` (fenced by the job's token, so a newer
/// owner is not overridden), marked so that retention keeps it as long as its letter. `Err` only
/// when Redis could not take the write (a run that ended or went on meanwhile needs no failing).
async fn fail_run(
    shared: &Shared,
    run_id: RunId,
    fence: Fence,
    reason: &str,
) -> Result<(), store::Error> {
    let store = shared.store.fenced(fence).dead_lettering();
    let events = vec![
        Event::SystemMessage(SystemMessage {
            level: MessageLevel::Error,
            content: format!("job dead-lettered: {reason}"),
        }),
        Event::EngineEnd(delta_protocol::EngineEnd {
            status: RunStatus::Failed,
            result: None,
            error: Some(reason.to_owned()),
        }),
    ];
    let change = StatusChange::Finished {
        status: Terminal::Failed,
        result: None,
        error: Some(reason.to_owned()),
    };
    match store.append(run_id, events, Some(change)).await {
        Ok(_) => Ok(()),
        Err(e @ store::Error::Backend(_)) => Err(e),
        Err(e) => {
            tracing::debug!(error = %delta_host::Chain(&e), "could not mark the run failed");
            Ok(())
        }
    }
}

/// Announces that `record`'s run ended (`run.completed|failed|cancelled`); nothing if it has
/// not. Idempotent: the event's id is that of this end.
async fn announce_ended(
    shared: &Shared,
    record: &store::RunRecord,
    traceparent: Option<&str>,
) -> Result<(), String> {
    match record.ended() {
        Some(ended) => shared
            .queue
            .publish_run_ended(&ended, traceparent)
            .await
            .map_err(|e| why(&e)),
        None => Ok(()),
    }
}

/// Reads the run's record and announces its end, if it ended.
async fn announce_end_of(
    shared: &Shared,
    run_id: RunId,
    traceparent: Option<&str>,
) -> Result<(), String> {
    let record = shared.store.record(run_id).await.map_err(|e| why(&e))?;
    announce_ended(shared, &record, traceparent).await
}

/// Dead-letters a delivery and terminates it; fails its run (if known) with the reason.
async fn poison(shared: &Shared, d: &Delivery, reason: &str) {
    tracing::warn!(reason, "dead-lettering job");
    // The copy first: should it fail, the job is redelivered with its run untouched.
    if let Err(e) = shared.queue.dead_letter(d, reason).await {
        tracing::error!(error = %delta_host::Chain(&e), "DLQ publish failed; job left for redelivery");
        let _ = d.nak(Some(Duration::from_secs(5))).await;
        return;
    }
    if let Ok(job) = &d.job {
        // Redis unable to take the write: the job held until it can (its letter is written, and
        // given back on its last delivery, it would be dead-lettered a second time, for having
        // run out, and its run failed for that).
        if let Err(e) = fail_run(shared, job.run_id, d.fence, reason).await {
            tracing::warn!(error = %delta_host::Chain(&e), run = %job.run_id, "a dead-lettered run not marked failed; holding the job until the store takes it");
            let held = hold(shared, d, HOLD_WHILE_STORE_DOWN, async |_| {
                fail_run(shared, job.run_id, d.fence, reason).await.is_ok()
            })
            .await;
            if !matches!(held, Held::Done) {
                // As before: ended, its run left as it was, for the lost-job reconciler.
                tracing::warn!(run = %job.run_id, "a dead-lettered run left not failed");
                let _ = d.term().await;
                return;
            }
        }
        // Not announced, the job is given back rather than ended: its next delivery (or its
        // exhausted advisory's handler) finds the run failed and announces its end. Ended,
        // nothing would announce it, and whoever waits on the run's end (an A2A push session, a
        // webhook) would wait until retention.
        if let Err(e) = end_announced(shared, d, job.run_id).await {
            tracing::warn!(error = %e, run = %job.run_id, "a dead-lettered run's end not announced; the job is given back to announce it");
            let _ = d.nak(Some(Duration::from_secs(5))).await;
            return;
        }
    }
    let _ = d.term().await;
}

/// Announces the end of run `run_id` (nothing if it has not ended, or is not in the store),
/// holding job `d` while NATS refuses it for now, up to [`HOLD_WHILE_UNANNOUNCED`] or until the
/// worker stops: `Err` (the first refusal) if it was not announced, for the caller to give the
/// job back, whose next delivery (or its exhausted advisory's handler) announces it.
async fn end_announced(shared: &Shared, d: &Delivery, run_id: RunId) -> Result<(), String> {
    let tp = d.traceparent.as_deref();
    let announce = async || match shared.store.record(run_id).await {
        Ok(record) => announce_ended(shared, &record, tp).await,
        Err(store::Error::NotFound(_)) => Ok(()),
        Err(e) => Err(why(&e)),
    };
    let Err(reason) = announce().await else {
        return Ok(());
    };
    tracing::warn!(
        reason,
        "a run's end not announced; holding the job and trying again"
    );
    let held = hold(shared, d, HOLD_WHILE_UNANNOUNCED, async |longest| {
        // Bounded, so that no one attempt holds the job past its ack deadline.
        matches!(tokio::time::timeout(longest, announce()).await, Ok(Ok(())))
    })
    .await;
    match held {
        Held::Done => {
            tracing::info!("the run's end announced after all");
            Ok(())
        }
        Held::TimedOut | Held::Stopped => Err(reason),
    }
}

/// Dead-letters the jobs that used up `max_deliver` (their workers died on every delivery),
/// failing their runs, until shutdown.
async fn reap_exhausted(shared: Arc<Shared>, shutdown: CancellationToken) {
    loop {
        let fetched = tokio::select! {
            f = shared.queue.fetch_exhausted(Duration::from_secs(5)) => f,
            () = shutdown.cancelled() => return,
        };
        let batch = match fetched {
            Ok(b) => b,
            Err(e) => {
                tracing::debug!(error = %delta_host::Chain(&e), "exhausted-jobs fetch failed; retrying");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    () = shutdown.cancelled() => return,
                }
            }
        };
        for x in batch {
            settle_exhausted(&shared, &x).await;
        }
    }
}

/// Ends an exhausted job by what its run says: a paused run only lost its announcement (asked
/// again, or, for a question settled meanwhile, marked `unannounced` for the gateway that resumes
/// the run to announce before its answer), a finished one needs nothing, any other is failed and
/// the job dead-lettered: also a paused run whose exhausted job is the resume of its settled
/// question (its workers died before its first write).
async fn settle_exhausted(shared: &Shared, x: &Exhausted) {
    let status = match &x.job {
        Some(job) => match shared.store.load(job.run_id).await {
            Ok(run) => Some(run),
            Err(store::Error::NotFound(_)) => None,
            Err(e) => {
                tracing::warn!(error = %delta_host::Chain(&e), "exhausted job left for another try");
                return;
            }
        },
        None => None,
    };
    let settled = match status {
        Some(run) if run.record.status == RunStatus::WaitingForInput => {
            let pending = delta_protocol::journal::Replay::new(&run.journal)
                .pending()
                .cloned();
            if let Some(q) = pending {
                let ix = match shared.store.interaction(q.run_id, q.request_id).await {
                    Ok(ix) => ix,
                    Err(e) => {
                        tracing::warn!(error = %delta_host::Chain(&e), "exhausted job left for another try");
                        return;
                    }
                };
                // The question's own resume job, its workers dead on every delivery before
                // its first write (had it written, it would have reopened the question, and
                // the answer given since would have a resume job of its own): a poison job like
                // any other. Dropped (as a job that asked the question is, below), its run
                // would be resumed again by the gateway's reconciler, and die again, for ever.
                if ix.as_ref().is_some_and(|ix| {
                    ix.state != delta_protocol::InteractionState::Pending
                        && ix.asked_by_job != Some(x.fence.stream_seq)
                }) && x.job.as_ref().and_then(|j| j.request_id) == Some(q.request_id)
                {
                    return dead_letter_exhausted(shared, x).await;
                }
                let announced = match ix {
                    // Settled meanwhile: announced now, the question could follow its answer in
                    // the events stream. Marked instead, the gateway's reconciler, which
                    // resumes the run, announces it before its answer (as for a held job let go).
                    Some(ix) if ix.state != delta_protocol::InteractionState::Pending => shared
                        .store
                        .mark_unannounced(q.run_id, q.request_id)
                        .await
                        .map(drop)
                        .map_err(|e| why(&e)),
                    // Under its reopen's id if the engine reopened it: its first announcement's
                    // would be dropped as a duplicate, or taken for that one.
                    ix => shared
                        .queue
                        .publish_pending(
                            &q,
                            ix.and_then(|ix| ix.reopened_at),
                            x.traceparent.as_deref(),
                        )
                        .await
                        .map_err(|e| why(&e)),
                };
                if let Err(e) = announced {
                    tracing::warn!(error = %e, "exhausted job left for another try");
                    return;
                }
            }
            shared.queue.drop_exhausted(x).await
        }
        Some(run) if run.record.status.is_terminal() => {
            // Its end may be what its crashed workers never announced.
            if let Err(e) = announce_ended(shared, &run.record, x.traceparent.as_deref()).await {
                tracing::warn!(error = %e, "exhausted job left for another try");
                return;
            }
            shared.queue.drop_exhausted(x).await
        }
        _ => return dead_letter_exhausted(shared, x).await,
    };
    if let Err(e) = settled {
        tracing::warn!(error = %delta_host::Chain(&e), "exhausted job left for another try");
    }
}

/// Dead-letters an exhausted job and fails its run: the copy, the run failed and its end
/// announced, and only then the job removed and its advisory acknowledged, so that a worker that
/// dies on the way leaves the advisory to another (which finds the run failed, or fails it).
async fn dead_letter_exhausted(shared: &Shared, x: &Exhausted) {
    let reason = format!(
        "the job was delivered {} times (max_deliver) and never finished: its worker crashed or hung each time",
        x.deliveries
    );
    tracing::warn!(
        seq = x.fence.stream_seq,
        reason,
        "dead-lettering exhausted job"
    );
    if let Err(e) = shared.queue.copy_exhausted_to_dlq(x, &reason).await {
        tracing::warn!(error = %delta_host::Chain(&e), "exhausted job left for another try");
        return;
    }
    if let Some(job) = &x.job {
        // Redis down: the advisory is left for another try (its copy is dropped as a duplicate).
        if let Err(e) = fail_run(shared, job.run_id, x.fence, &reason).await {
            tracing::warn!(error = %delta_host::Chain(&e), "exhausted job left for another try");
            return;
        }
        // Not announced: the advisory is left for another try, which finds the run failed and
        // announces its end.
        if let Err(e) = announce_end_of(shared, job.run_id, x.traceparent.as_deref()).await {
            tracing::warn!(error = %e, run = %job.run_id, "a dead-lettered run's end not announced; exhausted job left for another try");
            return;
        }
    }
    delta_host::failpoint("exhausted:before-drop");
    if let Err(e) = shared.queue.drop_exhausted(x).await {
        tracing::warn!(error = %delta_host::Chain(&e), "exhausted job left for another try");
    }
}

/// The longest a job is held while Redis cannot take its writes, before it is given back and
/// counted as a failed delivery.
const HOLD_WHILE_STORE_DOWN: Duration = Duration::from_secs(600);

/// The longest a paused run's job is held while its question cannot be announced, before it is
/// given back (never dead-lettered for it: [`announce_held`]).
const HOLD_WHILE_UNANNOUNCED: Duration = Duration::from_secs(120);

/// Announces question `q` that a run just paused on; `reopened`: it was announced and resolved
/// before, and is open again since the engine refused the answer accepted at that instant (a
/// new announcement, so that every channel, SSE, the inbox and bots, shows it open again; the
/// same one on every try).
async fn announce_question(
    shared: &Shared,
    q: &delta_protocol::InteractionRequest,
    traceparent: Option<&str>,
    reopened: Option<delta_protocol::Timestamp>,
) -> Result<(), queue::Error> {
    shared.queue.publish_pending(q, reopened, traceparent).await
}

/// How a job held by [`hold`] came out.
enum Held {
    /// A probe said it was done (and acked or gave back the job itself).
    Done,
    /// The hold's limit passed first.
    TimedOut,
    /// The worker is stopping: the job is still held, for the caller to give back or settle.
    Stopped,
}

/// Holds job `d` (its ack deadline pushed back), calling `probe` after growing waits (250 ms,
/// doubling, at most a third of `ack_wait` and 2 s, so that the job stays this worker's) until
/// it says it is done, `limit` has passed, or the worker stops. `probe` is given the longest
/// wait, to bound what it does by.
async fn hold<F, Fut>(shared: &Shared, d: &Delivery, limit: Duration, mut probe: F) -> Held
where
    F: FnMut(Duration) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    let longest = (shared.config.queue.ack_wait / 3)
        .clamp(Duration::from_millis(100), Duration::from_secs(2));
    let mut wait = Duration::from_millis(250).min(longest);
    loop {
        let _ = d.progress().await;
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = shared.stop.cancelled() => return Held::Stopped,
        }
        if probe(longest).await {
            return Held::Done;
        }
        if started.elapsed() > limit {
            return Held::TimedOut;
        }
        wait = (wait * 2).min(longest);
    }
}

/// A run paused on question `q` (durable in Redis) whose announcement NATS could not take for
/// now ([`queue::Error::is_transient_publish`]): the events stream without a leader for a moment
/// (a NATS node killed), or NATS unreachable. The run is fine, so its job is never
/// dead-lettered for this, which would fail a run that only waits. The job is held while
/// `announce` is tried again, up to [`HOLD_WHILE_UNANNOUNCED`] or until the worker stops; acked
/// once it got through, or once the run no longer waits on the question, else given back (or,
/// for a question settled meanwhile, marked unannounced and let go, as its next delivery would
/// do: the gateway's reconciler announces the question and its answer, then resumes the run).
/// A question answered meanwhile (through the inbox, which lists it from Redis) or expired is still
/// announced, or left to whoever settled it: the job is held until then, because a gateway
/// settling a question announces it first only while the job that asked it is in the stream
/// (`maybe_unannounced`); its run moves on only after that gateway's announcements, so the
/// run moved on says they were made.
/// Should its deliveries run out meanwhile, the exhausted job's handler announces the question
/// of a paused run again (or marks it, if settled) and drops the job ([`settle_exhausted`]).
async fn announce_held<F, Fut>(
    shared: &Shared,
    d: &Delivery,
    q: &delta_protocol::InteractionRequest,
    reason: &str,
    announce: F,
) where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<(), queue::Error>>,
{
    tracing::warn!(
        reason,
        "a paused run's question not announced; holding the job and trying again"
    );
    let held = hold(shared, d, HOLD_WHILE_UNANNOUNCED, async |longest| {
        // A read error leaves the run as it was: waiting on the question, as far as this job
        // knows.
        let moved_on = match shared.store.record(q.run_id).await {
            Ok(r) => {
                r.status != RunStatus::WaitingForInput || r.pending_request_id != Some(q.request_id)
            }
            Err(store::Error::NotFound(_)) => true,
            Err(_) => false,
        };
        if moved_on {
            tracing::info!("the run no longer waits on the question; not announcing it");
            let _ = d.ack().await;
            return true;
        }
        // Bounded, so that no one attempt holds the job past its ack deadline.
        if let Ok(Ok(())) = tokio::time::timeout(longest, announce()).await {
            tracing::info!("the paused run's question announced after all");
            let _ = d.ack().await;
            return true;
        }
        false
    })
    .await;
    if let Held::Done = held {
        return;
    }
    // A question settled meanwhile: the job's next delivery would only let it go (only the
    // question's own resume job resumes a run waiting on a settled question: [`handle`]).
    // Marked and let go now, the run waits for the resume job that the gateway's reconciler
    // publishes after announcing the question and its answer, once NATS takes them.
    let settled = matches!(
        shared.store.interaction(q.run_id, q.request_id).await,
        Ok(Some(ix)) if ix.state != delta_protocol::InteractionState::Pending
    );
    // Let go, the job no longer tells a gateway that the question may be unannounced: the
    // question says so itself. Unmarked (Redis did not take it), the job is given back.
    let marked = settled
        && shared
            .store
            .mark_unannounced(q.run_id, q.request_id)
            .await
            .is_ok();
    match (held, marked) {
        (_, true) => {
            tracing::warn!(
                "a paused run's question still not announced, and settled meanwhile; letting the job go for the gateway's reconciler to announce it and resume the run"
            );
            let _ = d.ack().await;
        }
        (Held::Stopped, false) => {
            let _ = d.nak(None).await;
        }
        _ => {
            tracing::warn!("a paused run's question still not announced; giving the job back");
            let _ = d.nak(Some(Duration::from_secs(2))).await;
        }
    }
}

/// Redis could not take this job's writes (down, failing over, or a master without the replica
/// its durability needs). Not the job's fault: it is held until the store can take writes
/// again, then `again` is set for [`handle`] to redo it from its journal, still held. So an
/// outage costs a job no delivery, however long it lasts (up to [`HOLD_WHILE_STORE_DOWN`]), and
/// neither do several in a row, instead of using up its deliveries and dead-lettering its run.
async fn store_down(shared: &Shared, d: &Delivery, reason: &str, again: &AtomicU8) {
    tracing::warn!(
        reason,
        "the run store cannot take writes; holding the job until it can"
    );
    let held = hold(shared, d, HOLD_WHILE_STORE_DOWN, async |_| {
        shared.store.writable().await.is_ok()
    })
    .await;
    match held {
        // Handled again here, still held: given back, each outage would use up one of the
        // job's deliveries, and a few Redis failovers in a row would dead-letter a run that
        // did nothing wrong.
        Held::Done => again.store(AGAIN_STORE_DOWN, Ordering::Relaxed),
        Held::TimedOut => retry_or_poison(shared, d, reason).await,
        Held::Stopped => {
            let _ = d.nak(None).await;
        }
    }
}

/// A failure that may pass: nak with backoff, or dead-letter on the last delivery.
async fn retry_or_poison(shared: &Shared, d: &Delivery, reason: &str) {
    if i64::try_from(d.fence.delivery).unwrap_or(i64::MAX) >= shared.config.queue.max_deliver {
        poison(
            shared,
            d,
            &format!("{reason} (after {} deliveries)", d.fence.delivery),
        )
        .await;
    } else {
        let delay = Duration::from_millis(
            200 * 2u64.pow(u32::try_from(d.fence.delivery).unwrap_or(8).min(8)),
        );
        tracing::warn!(reason, ?delay, "job failed; will be redelivered");
        let _ = d.nak(Some(delay)).await;
    }
}

/// How many times a job is handled again in place (held while the run store could not take
/// writes, or refused a write by a journal that lost writes), before it is given back instead.
const HANDLED_AGAIN: u32 = 30;

/// Of those, how many for writes refused as `Rewound`: each replays the run's steps since the
/// journal's end again, so a store that keeps losing writes gives the job back soon, each try a
/// little later than the one before.
const REWOUND_AGAIN: u32 = 5;

/// Why [`handle_once`] asks to be run again (`again`): nothing, the store was down, a write was
/// refused as `Rewound`.
const AGAIN_NOT: u8 = 0;
const AGAIN_STORE_DOWN: u8 = 1;
const AGAIN_REWOUND: u8 = 2;

async fn handle(shared: &Shared, d: Delivery) {
    let mut rewound = 0;
    for attempt in 0..HANDLED_AGAIN {
        let again = AtomicU8::new(AGAIN_NOT);
        handle_once(shared, &d, attempt == 0, &again).await;
        match again.load(Ordering::Relaxed) {
            AGAIN_NOT => return,
            AGAIN_REWOUND => {
                rewound += 1;
                if rewound > REWOUND_AGAIN {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(250) * rewound).await;
            }
            _ => {}
        }
        tracing::info!("handling the job again, from the run's journal");
    }
    let _ = d.nak(None).await;
}

/// Handles delivery `d`: `first` unless it is handled again in place (then the run is read from
/// the store, never taken as the job carries it: this delivery may have written since).
async fn handle_once(shared: &Shared, d: &Delivery, first: bool, again: &AtomicU8) {
    let job = match &d.job {
        Ok(j) => j.clone(),
        Err(reason) => return poison(shared, d, reason).await,
    };
    // The trace this job continues: stored with any question it asks, so the answer's resume
    // continues it too.
    let tp = delta_host::traceparent(&tracing::Span::current(), d.traceparent.as_deref());
    let store = shared
        .store
        .fenced(d.fence)
        .owned_by(&shared.config.worker_id, tp.clone());
    // The agent the job's subject names, to read the run from its snapshot if its brain can.
    let named = shared.agents.get(&d.agent).ok();
    let agent = named.as_ref().map(|p| &p.0);
    // A resume job's first delivery may carry its run as the gateway's settling script read it,
    // paused: nothing to read either, when the store and the agent can take it as it is (its
    // first write checks that the journal has not grown since).
    let carried = match (&job.paused, job.request_id) {
        (Some(paused), Some(rid))
            if job.kind == JobKind::Resume && d.fence.delivery == 1 && first =>
        {
            store
                .adopt_paused(job.run_id, rid, paused)
                .filter(|r| r.record.agent == d.agent && resume::resumable_as_carried(agent, r))
        }
        _ => None,
    };
    let loaded = match (&job.run, carried) {
        // A start job's first delivery carries its run as the gateway created it: nothing to
        // read (the first write checks that the run is still as fresh). A later delivery may
        // find the run started, and reads it.
        (Some(fresh), _) if job.kind == JobKind::Start && d.fence.delivery == 1 && first => {
            Ok(store.start_fresh(store::RunRecord::of_fresh(job.run_id, fresh.clone())))
        }
        (_, Some(run)) => Ok(run),
        _ => match resume::load_run(&store, job.run_id, agent, job.request_id).await {
            // A job under another agent's name than the run's: the snapshot was checked against
            // the wrong agent, so the run is read whole.
            Ok(r) if r.snapshot.is_some() && r.record.agent != d.agent => {
                store.load(job.run_id).await
            }
            other => other,
        },
    };
    let run = match loaded {
        Ok(r) => r,
        Err(store::Error::NotFound(_)) => {
            return poison(shared, d, &format!("unknown run {}", job.run_id)).await;
        }
        Err(e @ store::Error::Backend(_)) => return store_down(shared, d, &why(&e), again).await,
        Err(e) => return retry_or_poison(shared, d, &why(&e)).await,
    };
    if run.record.status.is_terminal() {
        // A duplicate or late job, or this job's own earlier delivery, which ended the run and
        // died before announcing it (or was refused the announcement): the end is announced
        // (again: it is idempotent), the job held while NATS refuses it. Not announced, it is
        // given back, never dead-lettered for it: the run is over, and a last delivery's
        // exhausted advisory announces it too.
        match end_announced(shared, d, run.record.run_id).await {
            Ok(()) => {
                let _ = d.ack().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "a run's end not announced; the job is given back");
                let _ = d.nak(Some(Duration::from_secs(5))).await;
            }
        }
        return;
    }
    let pair = match shared.agents.get(&run.record.agent) {
        Ok(p) => p,
        Err(reason) => return poison(shared, d, &reason).await,
    };
    let (agent, brain) = (&pair.0, &pair.1);
    // The question this job resumes, its answer and the earlier secrets: read by the engine.
    let answers = match Answers::load(&store, &run, job.request_id).await {
        Ok(a) => a,
        Err(e @ store::Error::Backend(_)) => return store_down(shared, d, &why(&e), again).await,
        Err(e) => return retry_or_poison(shared, d, &why(&e)).await,
    };
    let status_at_load = run.record.status;
    // A question an earlier delivery reopened: announced again under that reopen's id, should
    // this job pause on it (that delivery may have died before announcing it).
    let reopened_before = answers.reopened();
    let applying = answers.applying();
    // When the answer this job applies was accepted: a reopen's announcement is named by it.
    let applying_at = applying.map(|(_, at)| at);
    // The job that asked the question the run waits on (a start job, or the resume of an
    // earlier question), delivered again (its worker died before acking it), or a duplicate,
    // finding that question settled: the run is left to its resume job, which the settling
    // gateway publishes after announcing the question and its answer (or that gateway's
    // reconciler, which resumes any run still waiting on a settled question). Resumed here, the
    // run would move on with neither announced should that gateway's announcements have failed
    // (NATS refusing them then), as the reconciler looks only at runs that still wait; and
    // paused again on it, the question would be announced after its answer. The question is
    // marked `unannounced` first, as the job that told a gateway it might be goes.
    let waits_on = match (status_at_load, run.record.pending_request_id) {
        (RunStatus::WaitingForInput, Some(p)) => Some(p),
        _ => None,
    };
    let left_to_resume = match (waits_on, job.request_id) {
        (Some(_), None) => answers.settled(),
        // Its state only: its answer, sealed if sensitive, is not this job's to open.
        (Some(p), Some(r)) if r != p => match shared.store.interaction(job.run_id, p).await {
            Ok(ix) => ix
                .filter(|ix| ix.state != delta_protocol::InteractionState::Pending)
                .map(|_| p),
            Err(e @ store::Error::Backend(_)) => {
                return store_down(shared, d, &why(&e), again).await;
            }
            Err(e) => return retry_or_poison(shared, d, &why(&e)).await,
        },
        _ => None,
    };
    if let Some(rid) = left_to_resume {
        match shared.store.mark_unannounced(job.run_id, rid).await {
            Ok(_) => {
                tracing::info!(
                    "the run waits on a question settled meanwhile; leaving it to its resume job"
                );
                let _ = d.ack().await;
            }
            Err(e @ store::Error::Backend(_)) => store_down(shared, d, &why(&e), again).await,
            Err(e) => retry_or_poison(shared, d, &why(&e)).await,
        }
        return;
    }
    delta_host::failpoint("resume:before-write");
    if let (Some((rid, at)), RunStatus::WaitingForInput) = (applying, status_at_load) {
        shared.queue.announce_resumed(rid, at);
    }
    // The run's own directory, made before any of its tools runs here; none for an agent that
    // never uses one (a scripted agent of `builtin:` tools without hooks).
    let work_dir = if agent.needs_work_dir() {
        match shared.work_dirs.create(job.run_id) {
            Ok(dir) => dir,
            Err(e) => {
                return retry_or_poison(shared, d, &format!("its work directory: {e}")).await;
            }
        }
    } else {
        shared.work_dirs.path(job.run_id)
    };
    let settings = engine::Settings {
        worker: shared.config.worker_id.clone(),
        work_dir,
        pause: PauseMode::Park,
    };
    // Stopped when the worker stops, or when a gateway announces that the run was cancelled
    // while it advances (its running tool is killed then, rather than left to finish for nobody).
    let run_cancel = shared.stop.child_token();
    let _running = Running::register(shared, job.run_id, run_cancel.clone());
    // Heartbeats while the run advances, so that long steps are not redelivered.
    let beat = CancellationToken::new();
    let heart = {
        let beat = beat.clone();
        let every = shared.config.queue.ack_wait / 3;
        let d = &d;
        async move {
            loop {
                tokio::select! {
                    () = tokio::time::sleep(every) => {}
                    () = beat.cancelled() => return,
                }
                let _ = d.progress().await;
            }
        }
    };
    let mut reopened = None;
    let mut stale = false;
    let advance = async {
        let mut engine = Engine::resumed(
            agent,
            brain,
            &store,
            run,
            answers,
            settings,
            run_cancel.clone(),
        );
        let out = match engine.advance_resumed().await {
            Ok(Resumed::Advanced {
                outcome,
                reopened: r,
            }) => {
                reopened = r.then(|| applying_at.unwrap_or_else(delta_protocol::Timestamp::now));
                Ok(outcome)
            }
            // Applied already. Go on only if this job owns the run (an earlier delivery of it
            // applied the answer) or the run waits anyway; a stale resume job must not become
            // a second executor of a run another job is running.
            Ok(Resumed::AlreadyApplied) => {
                let owns = status_at_load == RunStatus::WaitingForInput
                    || store
                        .owner_fence(job.run_id)
                        .await
                        .is_ok_and(|f| f.stream_seq == d.fence.stream_seq);
                if owns {
                    engine.advance(None).await
                } else {
                    stale = true;
                    Ok(Outcome::Interrupted)
                }
            }
            Err(e) => Err(e),
        };
        beat.cancel();
        // The record as this engine last wrote it: what a run that ended announces.
        (out, engine.record().clone())
    };
    let ((outcome, record), ()) = tokio::join!(advance, heart);
    if stale {
        tracing::info!("a stale resume job for a run another job is running; dropped");
        let _ = d.ack().await;
        return;
    }
    match outcome {
        Ok(Outcome::Paused(q)) => {
            let reopened = reopened.or_else(|| {
                reopened_before
                    .filter(|(rid, _)| *rid == q.request_id)
                    .map(|(_, at)| at)
            });
            delta_host::failpoint_delay("pause:before-announce").await;
            match announce_question(shared, &q, tp.as_deref(), reopened).await {
                Ok(()) => {
                    let _ = d.ack().await;
                }
                Err(e) if e.is_transient_publish() => {
                    announce_held(shared, d, &q, &why(&e), || {
                        announce_question(shared, &q, tp.as_deref(), reopened)
                    })
                    .await;
                }
                Err(e) => retry_or_poison(shared, d, &why(&e)).await,
            }
        }
        Ok(Outcome::Interrupted) => {
            let _ = d.nak(None).await;
        }
        Ok(_) => {
            // Ended: announced before the job is acked, so that a crash in between leaves the
            // job to a redelivery that announces it. From the record as the engine wrote it
            // (read back only if the engine ended nothing: a run ended before this job).
            let announced = if record.status.is_terminal() {
                announce_ended(shared, &record, tp.as_deref()).await
            } else {
                announce_end_of(shared, job.run_id, tp.as_deref()).await
            };
            // Refused: tried again with the job held (as a paused run's question is), then the
            // job given back, whose next delivery announces it.
            let announced = match announced {
                Ok(()) => Ok(()),
                Err(_) => end_announced(shared, d, job.run_id).await,
            };
            match announced {
                Ok(()) => {
                    let _ = d.ack().await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the run's end not announced; the job is redelivered to announce it");
                    let _ = d.nak(Some(Duration::from_secs(5))).await;
                }
            }
        }
        Err(engine::Error::Store(store::Error::Fenced(run))) => {
            // A newer *job* (another stream message) owns the run: this one is obsolete. A newer
            // delivery of this same message is left alone: acking it would take the job away
            // from the worker that holds it now.
            let owner = store.owner_fence(run).await;
            if owner.as_ref().is_ok_and(|o| *o <= d.fence) {
                // Not newer: an older delivery of this job, still alive, wrote after this one
                // loaded the run. It keeps the job; should it die, JetStream redelivers.
                tracing::warn!(%run, "write refused: the journal moved since this delivery loaded the run (an older owner is still writing); leaving the job to it");
            } else {
                tracing::warn!(%run, "write refused: a newer delivery owns this run; dropping the stale one");
            }
            if owner.is_ok_and(|o| o.stream_seq > d.fence.stream_seq) {
                let _ = d.ack().await;
            }
        }
        Err(engine::Error::Store(e @ store::Error::Rewound(_))) => {
            // The journal is not as this delivery left it (writes lost at a Redis failover, or
            // a write applied already that the client sent again): handled again here, still
            // held, going on from what the journal holds. Given back, each failover that lost
            // a write would use up one of the job's deliveries, as an outage would.
            tracing::warn!(error = %delta_host::Chain(&e), "write refused: the journal is not as this delivery left it; replaying it from the journal");
            again.store(AGAIN_REWOUND, Ordering::Relaxed);
        }
        Err(engine::Error::Store(e @ store::Error::Backend(_))) => {
            store_down(shared, d, &why(&e), again).await;
        }
        Err(engine::Error::Store(e @ store::Error::Terminal { .. })) => {
            // Finished elsewhere (a newer delivery, or cancelled): nothing left for this job but
            // to announce the end once more (idempotent), should whoever ended it have died
            // before announcing it.
            tracing::warn!(error = %delta_host::Chain(&e), "write refused: the run is already final; dropping this job");
            if let Err(e) = announce_end_of(shared, job.run_id, tp.as_deref()).await {
                tracing::debug!(error = %e, "the run's end not announced again");
            }
            let _ = d.ack().await;
        }
        Err(e) => retry_or_poison(shared, d, &why(&e)).await,
    }
}

/// An error with its causes, as a dead letter's reason or a failed run's error.
fn why<E: std::error::Error>(e: &E) -> String {
    delta_host::Chain(e).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_runs_directory_stays_as_long_as_a_dead_letter_would() {
        let day = Duration::from_secs(24 * 3600);
        let now = 100 * i64::try_from(day.as_micros()).expect("µs");
        let ago = |days: u64| {
            now - i64::try_from((day * u32::try_from(days).expect("days")).as_micros()).expect("µs")
        };
        let c = Cutoffs::at(now, 7 * day, 30 * day);
        assert!(c.expired(RunStatus::Completed, ago(8)));
        assert!(c.expired(RunStatus::Cancelled, ago(7)));
        assert!(!c.expired(RunStatus::Completed, ago(6)));
        assert!(!c.expired(RunStatus::Failed, ago(8)));
        assert!(!c.expired(RunStatus::Failed, ago(29)));
        assert!(c.expired(RunStatus::Failed, ago(30)));
        // A retention longer than letters are kept: the retention for every run.
        let c = Cutoffs::at(now, 40 * day, 30 * day);
        assert!(!c.expired(RunStatus::Failed, ago(35)));
        assert!(c.expired(RunStatus::Failed, ago(40)));
        assert!(!c.expired(RunStatus::Completed, ago(35)));
    }
}
