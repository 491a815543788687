//! The run store: the engine's one port to durable state, and its adapters.
//!
//! The engine never writes anything but through [`RunStore::append`]: journal events plus, in the
//! same atomic step, the run's status change. Locally that is [`file::FileRunStore`] (Delta Engine
//! v1.2's `.delta/` layout); in the fleet it is the Redis store, fenced per delivery. Both pass the
//! same [`contract`] suite.
//!
//! Retention (deleting finished runs some time after they finished) belongs to the Redis store
//! alone (`redis::RedisRunStore::purge_finished`, run by the gateways' reconcilers): the fleet
//! keeps every run of every user. The file store has none and needs none: `delta run` keeps its
//! runs under `.delta/` in the user's own directory, where the user removes them.

use std::future::Future;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use delta_protocol::journal::{Replay, Snapshot};
use delta_protocol::{
    Event, InteractionRequest, InteractionResponse, JournalEvent, RequestId, RunId, RunStatus,
    Timestamp,
};

pub mod contract;
pub mod file;
pub mod grants;
pub mod redis;

pub use grants::{GrantStore, Unusable};

/// A run's record (`metadata.json` locally, a hash in Redis).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub run_id: RunId,
    pub agent: String,
    pub task: String,
    pub status: RunStatus,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub pending_request_id: Option<RequestId>,
    /// Structured input given at submission, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Locally: the agent directory the run was started with, so that a resume finds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_dir: Option<String>,
    /// Who submitted it (the gateway's authenticated caller): with `approvals.exclude_requester`
    /// they may not vote on its questions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_by: Option<String>,
}

impl RunRecord {
    /// What `run.completed|failed|cancelled` says of it; `None` while it has not ended.
    pub fn ended(&self) -> Option<delta_protocol::events::RunFinished> {
        self.status
            .is_terminal()
            .then(|| delta_protocol::events::RunFinished {
                run_id: self.run_id,
                agent: self.agent.clone(),
                status: self.status,
                result: self.result.clone(),
                error: self.error.clone(),
                submitted_by: self.submitted_by.clone(),
                created_at: self.created_at,
                ended_at: self.updated_at,
            })
    }

    /// A fresh record, `QUEUED` in the fleet or `RUNNING` locally.
    pub fn new(run_id: RunId, agent: &str, task: &str, status: RunStatus) -> Self {
        let now = Timestamp::now();
        Self {
            run_id,
            agent: agent.to_owned(),
            task: task.to_owned(),
            status,
            created_at: now,
            updated_at: now,
            pending_request_id: None,
            input: None,
            result: None,
            error: None,
            agent_dir: None,
            submitted_by: None,
        }
    }

    /// What a start job carries of this record (`QUEUED`, as the gateway created it).
    pub fn fresh(&self) -> delta_protocol::FreshRun {
        delta_protocol::FreshRun {
            agent: self.agent.clone(),
            task: self.task.clone(),
            input: self.input.clone(),
            created_at: self.created_at,
            submitted_by: self.submitted_by.clone(),
        }
    }

    /// The record of run `run_id` that a start job carried (see [`RunRecord::fresh`]).
    pub fn of_fresh(run_id: RunId, fresh: delta_protocol::FreshRun) -> Self {
        Self {
            run_id,
            agent: fresh.agent,
            task: fresh.task,
            status: RunStatus::Queued,
            created_at: fresh.created_at,
            updated_at: fresh.created_at,
            pending_request_id: None,
            input: fresh.input,
            result: None,
            error: None,
            agent_dir: None,
            submitted_by: fresh.submitted_by,
        }
    }
}

/// A status change committed in the same atomic step as the events it accompanies.
#[derive(Clone, Debug, PartialEq)]
pub enum StatusChange {
    Running,
    /// Paused on this request: the store keeps it as the run's pending interaction.
    Waiting(Box<InteractionRequest>),
    Interrupted,
    /// Terminal: `COMPLETED` with a result, `FAILED` with an error, or `CANCELLED`.
    Finished {
        status: Terminal,
        result: Option<String>,
        error: Option<String>,
    },
}

/// The three terminal statuses; a `Finished` change cannot name another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Terminal {
    Completed,
    Failed,
    Cancelled,
}

impl From<Terminal> for RunStatus {
    fn from(t: Terminal) -> Self {
        match t {
            Terminal::Completed => RunStatus::Completed,
            Terminal::Failed => RunStatus::Failed,
            Terminal::Cancelled => RunStatus::Cancelled,
        }
    }
}

impl StatusChange {
    pub fn status(&self) -> RunStatus {
        match self {
            StatusChange::Running => RunStatus::Running,
            StatusChange::Waiting(_) => RunStatus::WaitingForInput,
            StatusChange::Interrupted => RunStatus::Interrupted,
            StatusChange::Finished { status, .. } => (*status).into(),
        }
    }

    /// Applies this change to a record (the part every store does the same way).
    pub fn apply_to(&self, record: &mut RunRecord, now: Timestamp) {
        record.status = self.status();
        record.updated_at = now;
        record.pending_request_id = match self {
            StatusChange::Waiting(req) => Some(req.request_id),
            _ => None,
        };
        if let StatusChange::Finished { result, error, .. } = self {
            record.result.clone_from(result);
            record.error.clone_from(error);
        }
    }
}

/// Numbers `events` from `first` and stamps them all with `now`: how every store journals a batch.
pub fn numbered(events: Vec<Event>, first: u64, now: Timestamp) -> Vec<JournalEvent> {
    events
        .into_iter()
        .zip(first..)
        .map(|(event, seq)| JournalEvent {
            seq,
            timestamp: now,
            event,
        })
        .collect()
}

/// A run as stored: its record and its journal, whole or (from
/// [`RunStore::load_latest`]) the events after its latest snapshot.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredRun {
    pub record: RunRecord,
    /// The whole journal without `snapshot`; the events after `snapshot.seq` with one.
    pub journal: Vec<JournalEvent>,
    /// Where the run stood at the start of `journal`, when it was read with one.
    pub snapshot: Option<Snapshot>,
}

impl StoredRun {
    /// A run read whole.
    pub fn whole(record: RunRecord, journal: Vec<JournalEvent>) -> StoredRun {
        StoredRun {
            record,
            journal,
            snapshot: None,
        }
    }

    /// Where the run stands: the snapshot's replay with the events after it, or the whole
    /// journal replayed.
    pub fn replay(&self) -> Replay {
        let mut r = self
            .snapshot
            .as_ref()
            .map(|s| s.replay.clone())
            .unwrap_or_default();
        self.journal.iter().for_each(|e| r.apply(e));
        r
    }

    /// The seq of the last event, read or covered by the snapshot (0 for an empty journal).
    pub fn last_seq(&self) -> u64 {
        self.journal
            .last()
            .map(|e| e.seq)
            .or(self.snapshot.as_ref().map(|s| s.seq))
            .unwrap_or(0)
    }
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("run {0} not found")]
    NotFound(RunId),
    #[error("run {0} already exists")]
    AlreadyExists(RunId),
    #[error("run {run_id} is {status}, which is final: nothing more can be written to it")]
    Terminal { run_id: RunId, status: RunStatus },
    /// A newer owner holds the run, or (for a writer taking the run over) the journal changed
    /// since this writer loaded it: this writer is stale and must stop.
    #[error("run {0}: write refused, another owner holds the run or wrote to it")]
    Fenced(RunId),
    /// The run's journal is not as this (fenced) writer left it: shorter, writes it was told
    /// were stored are gone (a Redis failover to a replica that had not received them); or
    /// longer, the write it is making was applied already (the Redis client sent it again after
    /// its connection dropped, as at a failover). The writer must stop and the run go on from
    /// what its journal holds.
    #[error(
        "run {0}: its journal is not as this writer left it (writes lost at a Redis failover, or this write applied already); the run goes on from its journal"
    )]
    Rewound(RunId),
    #[error("run {run_id} is in use by another process ({detail})")]
    Locked { run_id: RunId, detail: String },
    #[error(transparent)]
    Journal(#[from] delta_protocol::journal::Error),
    #[error("{path}: cannot read or write it")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: invalid run record")]
    Record {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    /// Someone else holds a live claim on the question being answered.
    #[error("the question is claimed by {} until {}", .0.by, .0.until)]
    Claimed(delta_protocol::Claim),
    /// The backend (Redis) failed or could not be reached; the cause is the source.
    #[error("the run store's backend failed")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The backend holds a value this store did not write (damaged or foreign data).
    #[error("the run store holds damaged data: {0}")]
    Corrupt(String),
    #[error(transparent)]
    Secret(#[from] delta_protocol::secret::Error),
    #[error(
        "a sensitive answer cannot be stored without DELTA_SECRETS_KEY (it would sit in Redis in clear); set the same key on gateways and workers"
    )]
    NoSecretsKey,
    /// The Redis key layout does not fit this program: another bucket count, or the layout of
    /// before the buckets (the message says what to do).
    #[error("{0}")]
    Buckets(String),
}

/// Durable runs and journals. Every call is atomic: either all of it is stored or none. A run
/// store keeps the grants of its runs' agents too ([`GrantStore`]): the engine reads them before a
/// call that needs approval.
pub trait RunStore: GrantStore + Send + Sync {
    /// Stores a new run record with an empty journal.
    fn create(&self, record: RunRecord) -> impl Future<Output = Result<(), Error>> + Send;

    /// The run's record and whole journal.
    fn load(&self, run_id: RunId) -> impl Future<Output = Result<StoredRun, Error>> + Send;

    /// The run's record, its latest usable snapshot and the events after it: what a resume
    /// needs, in time that does not grow with the journal. A snapshot that is missing,
    /// unreadable or of another format is ignored: the whole journal comes back, as from
    /// [`RunStore::load`] (the default, for stores that keep no snapshots). `asking`: the
    /// question the caller asks about next ([`AnswerStore::settled`]; `None`: the one the run
    /// waits on), which a store may read in the same round trip.
    fn load_latest(
        &self,
        run_id: RunId,
        asking: Option<RequestId>,
    ) -> impl Future<Output = Result<StoredRun, Error>> + Send {
        let _ = asking;
        self.load(run_id)
    }

    /// Appends `events` (numbered from the journal's last `seq` + 1, stamped now) and applies
    /// `change`, atomically. Refused once the run is terminal. Returns the events as stored.
    fn append(
        &self,
        run_id: RunId,
        events: Vec<Event>,
        change: Option<StatusChange>,
    ) -> impl Future<Output = Result<Vec<JournalEvent>, Error>> + Send;

    /// Whether this store keeps snapshots ([`RunStore::append_with_snapshot`]): the engine
    /// makes none for a store that would drop them.
    fn keeps_snapshots(&self) -> bool {
        false
    }

    /// [`RunStore::append`], storing `snapshot` with the events when it covers exactly the
    /// journal as this append leaves it (it is dropped otherwise: snapshots are only ever an
    /// optimisation). Stores that keep no snapshots ignore it (the default).
    fn append_with_snapshot(
        &self,
        run_id: RunId,
        events: Vec<Event>,
        change: Option<StatusChange>,
        snapshot: Option<&Snapshot>,
    ) -> impl Future<Output = Result<Vec<JournalEvent>, Error>> + Send {
        let _ = snapshot;
        self.append(run_id, events, change)
    }

    /// Returns once what this handle wrote to `run_id` is durable (on disk, or on a replica
    /// as well, as the store is configured), for a write that precedes an irreversible step
    /// (a tool that must not run twice, an answer acknowledged). Stores whose every write is
    /// durable when it returns need do nothing (the default).
    fn sync(&self, run_id: RunId) -> impl Future<Output = Result<(), Error>> + Send {
        let _ = run_id;
        std::future::ready(Ok(()))
    }

    /// Makes sure this handle may still write `run_id` as it holds it, before a side effect that
    /// the run's own writes do not fence (a hook's process, a grant used or made). A store that
    /// took the run from its job without reading it (the Redis store: a start or resume job
    /// that carried its run) checks it then with a write of nothing, refused as the handle's
    /// first write would be (the run ended, or another delivery owns it or moved it on).
    /// Nothing to do once the run was read or written (the default: every read is).
    fn confirm(&self, run_id: RunId) -> impl Future<Output = Result<(), Error>> + Send {
        let _ = run_id;
        std::future::ready(Ok(()))
    }

    /// A new request id for a question `run_id` asks. Any fresh id will do; a store may pick
    /// one that its lookups find faster (the Redis store: one in the run's bucket).
    fn new_request_id(&self, run_id: RunId) -> RequestId {
        let _ = run_id;
        RequestId::new()
    }
}

/// A question of a run as the store settled it: what a resume applies.
#[derive(Clone, Debug)]
pub struct Settled {
    /// The accepted answer, opened (sensitive parts unsealed), if a person or bot answered.
    pub response: Option<InteractionResponse>,
    /// When it was answered or closed (its deadline is checked against that instant).
    pub answered_at: Option<Timestamp>,
    /// The clock closed it: the engine applies the default option, or fails the run.
    pub expired: bool,
    /// When the answer last refused was accepted, if the engine ever reopened it: a pending
    /// question is then announced under its reopen's id.
    pub reopened_at: Option<Timestamp>,
}

/// Where the answers to a run's questions are kept between the pause and the resume: the fleet's
/// Redis store (the local mailbox is read by `delta run` itself). The engine reads them through
/// this port to resume a run, so no host assembles its state by hand.
pub trait AnswerStore: RunStore {
    /// Question `request_id` of `run_id` as settled (or still pending: no response, not
    /// expired); `None` when the store has no such question.
    fn settled(
        &self,
        run_id: RunId,
        request_id: RequestId,
    ) -> impl Future<Output = Result<Option<Settled>, Error>> + Send;

    /// Opens question `request` of `run_id` again, because the engine refused its answer, with
    /// this handle's next write to the run: that write (which journals the refusal and pauses
    /// the run on the question again) and the reopen are one atomic step, so no crash leaves one
    /// without the other. The write changes nothing of the question unless it is answered then.
    fn reopen(&self, run_id: RunId, request: &InteractionRequest);
}
