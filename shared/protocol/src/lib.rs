//! The external contract of docs/protocol.md §1–3 as Rust types.
//!
//! Everything here is pure data: serde shapes that round-trip exactly the JSON of the contract,
//! plus the validation rules every entry point applies to an interaction response (§3). No I/O,
//! no async, so that the CLI, the worker, the gateway and the fuzzers all agree by construction.

pub mod events;
pub mod grant;
pub mod human;
pub mod journal;
pub mod schema;
pub mod secret;

/// `url` (or several, separated by commas) with any user and password replaced by `***`, for
/// errors and logs: `nats://alice:s3cret@host:4222` becomes `nats://***@host:4222`.
pub fn without_credentials(url: &str) -> String {
    url.split(',')
        .map(|one| match one.rfind('@') {
            // Everything before the last `@` may be a user and password, whatever the scheme
            // (or none, and a password may hold a `/`): keep the scheme only.
            Some(at) => match one[..at].find("://") {
                Some(s) => format!("{}://***{}", &one[..s], &one[at..]),
                None => format!("***{}", &one[at..]),
            },
            None => one.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

pub use human::{
    Approvals, Ballot, Change, Claim, Delegation, Escalated, EscalationStep, InteractionUpdate,
    Tally, Vote,
};
pub use time::Timestamp;

/// Timestamps: RFC 3339, UTC, always six fractional digits (`2026-11-20T10:00:00.123456Z`).
pub mod time {
    use super::*;

    /// A point in time as the contract writes it: UTC with microsecond precision.
    #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
    pub struct Timestamp(DateTime<Utc>);

    /// The written form, as a chrono format (the `Display` below writes it by hand).
    #[cfg(test)]
    pub(crate) const FORMAT: &str = "%Y-%m-%dT%H:%M:%S%.6fZ";

    /// `0000-01-01T00:00:00.000000Z` and `9999-12-31T23:59:59.999999Z` in microseconds since the
    /// Unix epoch: what RFC 3339's four-digit years can write. Every timestamp is kept inside, so
    /// that what is written always parses back (a later time is "never" anyway).
    pub(crate) const MIN_MICROS: i64 = -62_167_219_200_000_000;
    pub(crate) const MAX_MICROS: i64 = 253_402_300_799_999_999;

    impl Timestamp {
        /// The current time, truncated to microseconds so that it survives a round trip.
        pub fn now() -> Self {
            Self::from_datetime(Utc::now())
        }

        /// Truncates to microseconds, and clamps to the years 0000–9999.
        pub fn from_datetime(t: DateTime<Utc>) -> Self {
            Self::clamped(t.timestamp_micros())
        }

        fn clamped(micros: i64) -> Self {
            let micros = micros.clamp(MIN_MICROS, MAX_MICROS);
            // Every microsecond of the years 0000–9999 is a valid chrono time.
            Self(DateTime::from_timestamp_micros(micros).unwrap_or(DateTime::UNIX_EPOCH))
        }

        pub fn as_datetime(&self) -> DateTime<Utc> {
            self.0
        }

        /// The time `us` microseconds after the Unix epoch, if chrono can represent it (clamped
        /// to the years 0000–9999).
        pub fn from_micros(us: i64) -> Option<Self> {
            DateTime::<Utc>::from_timestamp_micros(us).map(Self::from_datetime)
        }

        /// Microseconds since the Unix epoch.
        pub fn micros(&self) -> i64 {
            self.0.timestamp_micros()
        }

        /// This time plus whole seconds, saturating at `9999-12-31T23:59:59.999999Z` (so a
        /// `timeout_seconds` of any size gives an `expires_at` that can be written and read).
        pub fn plus_seconds(&self, secs: u64) -> Self {
            let later = i64::try_from(secs)
                .ok()
                .and_then(|s| s.checked_mul(1_000_000))
                .and_then(|d| self.micros().checked_add(d))
                .unwrap_or(i64::MAX);
            Self::clamped(later)
        }
    }

    impl fmt::Display for Timestamp {
        /// `%Y-%m-%dT%H:%M:%S%.6fZ`, digit by digit: a timestamp is written with every event,
        /// record and announcement, and parsing the format string each time cost more than the
        /// rest (the years are 0000–9999, so each field has a fixed width).
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            use chrono::{Datelike, Timelike};
            let (d, t) = (self.0.date_naive(), self.0.time());
            let mut out = *b"0000-00-00T00:00:00.000000Z";
            let mut put = |at: usize, width: usize, mut n: u32| {
                for i in (at..at + width).rev() {
                    out[i] = b'0' + (n % 10) as u8;
                    n /= 10;
                }
            };
            put(0, 4, u32::try_from(d.year()).unwrap_or(0));
            put(5, 2, d.month());
            put(8, 2, d.day());
            put(11, 2, t.hour());
            put(14, 2, t.minute());
            put(17, 2, t.second());
            // No leap second: a timestamp is made from whole microseconds since the epoch.
            put(20, 6, t.nanosecond() % 1_000_000_000 / 1_000);
            f.write_str(std::str::from_utf8(&out).unwrap_or("0000-01-01T00:00:00.000000Z"))
        }
    }

    impl fmt::Debug for Timestamp {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            fmt::Display::fmt(self, f)
        }
    }

    impl FromStr for Timestamp {
        type Err = chrono::ParseError;
        fn from_str(s: &str) -> Result<Self, Self::Err> {
            Ok(Self::from_datetime(
                DateTime::parse_from_rfc3339(s)?.with_timezone(&Utc),
            ))
        }
    }

    impl Serialize for Timestamp {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.collect_str(self)
        }
    }

    impl<'de> Deserialize<'de> for Timestamp {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            let s = String::deserialize(d)?;
            s.parse().map_err(|e| {
                serde::de::Error::custom(format_args!(
                    "`{s}` is not an RFC 3339 time ({e}), e.g. 2026-11-20T10:00:00.123456Z"
                ))
            })
        }
    }
}

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(Uuid);

        impl $name {
            /// A new time-ordered (v7) id.
            pub fn new() -> Self {
                Self(Uuid::now_v7())
            }
            pub fn as_uuid(&self) -> &Uuid {
                &self.0
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.hyphenated().fmt(f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(self, f)
            }
        }

        impl FromStr for $name {
            type Err = uuid::Error;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Uuid::parse_str(s).map(Self)
            }
        }
    };
}

uuid_id!(
    /// Identifies one run of an agent on a task.
    RunId
);
uuid_id!(
    /// Identifies one interaction request.
    RequestId
);

// ---------------------------------------------------------------------------------------------
// §1 Runs

/// The single source of truth about a run (docs/protocol.md §1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RunStatus {
    Queued,
    Running,
    WaitingForInput,
    Interrupted,
    Completed,
    Failed,
    Cancelled,
}

impl RunStatus {
    pub const ALL: [RunStatus; 7] = [
        RunStatus::Queued,
        RunStatus::Running,
        RunStatus::WaitingForInput,
        RunStatus::Interrupted,
        RunStatus::Completed,
        RunStatus::Failed,
        RunStatus::Cancelled,
    ];

    /// Terminal statuses never change again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }

    /// The contract's spelling, e.g. `WAITING_FOR_INPUT`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "QUEUED",
            Self::Running => "RUNNING",
            Self::WaitingForInput => "WAITING_FOR_INPUT",
            Self::Interrupted => "INTERRUPTED",
            Self::Completed => "COMPLETED",
            Self::Failed => "FAILED",
            Self::Cancelled => "CANCELLED",
        }
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RunStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|st| st.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown run status `{s}`"))
    }
}

// ---------------------------------------------------------------------------------------------
// §2 Journal

/// One journal entry: `{"seq", "timestamp", "type", "payload"}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JournalEvent {
    pub seq: u64,
    pub timestamp: Timestamp,
    #[serde(flatten)]
    pub event: Event,
}

/// The journal event types and their payloads (docs/protocol.md §2).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", content = "payload", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Event {
    EngineStart(EngineStart),
    Thought(Thought),
    Plan(Plan),
    ActionRequest(ActionRequest),
    ActionResult(ActionResult),
    HumanInputRequest(Box<InteractionRequest>),
    HumanInputReceived(HumanInputReceived),
    /// A vote on a question that needs several approvals, journaled by the gateway as it counts
    /// it (docs/protocol.md §3, "Quorum").
    HumanVote(Vote),
    /// A step of a question's escalation, carried out by the gateway while the run waits.
    Escalated(Escalated),
    SystemMessage(SystemMessage),
    EngineEnd(EngineEnd),
}

impl Event {
    /// The contract's name of this event's type, e.g. `ACTION_REQUEST`.
    pub fn type_name(&self) -> &'static str {
        match self {
            Event::EngineStart(_) => "ENGINE_START",
            Event::Thought(_) => "THOUGHT",
            Event::Plan(_) => "PLAN",
            Event::ActionRequest(_) => "ACTION_REQUEST",
            Event::ActionResult(_) => "ACTION_RESULT",
            Event::HumanInputRequest(_) => "HUMAN_INPUT_REQUEST",
            Event::HumanInputReceived(_) => "HUMAN_INPUT_RECEIVED",
            Event::HumanVote(_) => "HUMAN_VOTE",
            Event::Escalated(_) => "ESCALATED",
            Event::SystemMessage(_) => "SYSTEM_MESSAGE",
            Event::EngineEnd(_) => "ENGINE_END",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EngineStart {
    pub run_id: RunId,
    pub agent: String,
    pub task: String,
    /// A worker id, or `local`.
    pub worker: String,
    /// 1 for the first start, +1 for every later resume or takeover.
    pub attempt: u32,
}

/// A tool call as the brain decided it; `id` becomes the `action_id` of its `ACTION_REQUEST`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ToolCall {
    pub id: String,
    pub tool: String,
    pub args: Value,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Thought {
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum RiskLevel {
    Low,
    Medium,
    High,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PlanTask {
    pub index: u32,
    pub description: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    pub risk: RiskLevel,
}

impl PlanTask {
    /// `"<index>. <description>"`, as a plan is listed to people and to the model.
    pub fn line(&self) -> String {
        format!("{}. {}", self.index, self.description)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Plan {
    pub tasks: Vec<PlanTask>,
    pub risk_level: RiskLevel,
    /// 1 for a new plan; n + 1 for the plan the brain revised after round n was answered
    /// "modify". Written only when above 1.
    #[serde(default = "first_round", skip_serializing_if = "is_first_round")]
    pub round: u32,
}

fn first_round() -> u32 {
    1
}

fn is_first_round(round: &u32) -> bool {
    *round == 1
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ActionRequest {
    pub action_id: String,
    pub tool: String,
    pub args: Value,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ActionStatus {
    Success,
    Error,
    Skipped,
    Rejected,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ActionResult {
    pub action_id: String,
    pub status: ActionStatus,
    pub observation_content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    pub duration_ms: u64,
}

/// Who answered, and through which channel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Responder {
    pub id: String,
    pub via: Via,
    /// Whose authority they answered with: a delegation from that person (`delta delegations`),
    /// recorded as "bob on behalf of alice".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_behalf_of: Option<String>,
    /// The gateway token that relayed the answer for this person (a `relay` token, such as the
    /// Slack bridge's), when the person did not call the gateway themselves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relayed_by: Option<String>,
}

impl Responder {
    /// `id` answering through `via` on their own behalf.
    pub fn new(id: impl Into<String>, via: Via) -> Self {
        Self {
            id: id.into(),
            via,
            on_behalf_of: None,
            relayed_by: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Via {
    Http,
    Nats,
    Cli,
    File,
    Stdin,
    Timeout,
    /// The Slack bridge (`delta slack`), for the person its user mapping names.
    Slack,
    /// An MCP client at the gateway's `/mcp` (an elicitation's answer), or the one-time inbox
    /// link it was given (docs/protocols.md).
    Mcp,
    /// An A2A client at the gateway's `/a2a` (a message continuing a task), or the one-time
    /// inbox link it was given (docs/protocols.md).
    A2a,
}

/// What the journal keeps of an answer. Sensitive answers are redacted to `"***"` before they
/// are ever put here (docs/protocol.md §3, answer rule 9).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HumanInputReceived {
    pub request_id: RequestId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub option_id: Option<String>,
    pub action: OptionAction,
    pub responder: Responder,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feedback: Option<String>,
    /// When an approval came with edited arguments (`data.args`): what changed, as
    /// `{"changed": {k: {"from", "to"}}, "added": {k: v}, "removed": [k]}` (see [`args_diff`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edited_args: Option<Value>,
    /// The hash of the request as it was shown and decided on ([`human::request_hash`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_hash: Option<String>,
}

/// The difference between a call's arguments and their edited version, in the shape journaled
/// as `HUMAN_INPUT_RECEIVED.payload.edited_args`: `{"changed": {k: {"from": old, "to": new}},
/// "added": {k: new}, "removed": [k]}`. `None` when nothing changed. Arguments that are not
/// JSON objects are compared whole, as one change of the key `""`.
pub fn args_diff(before: &Value, after: &Value) -> Option<Value> {
    if before == after {
        return None;
    }
    let empty = serde_json::Map::new();
    let (b, a) = match (before, after) {
        (Value::Object(b), Value::Object(a)) => (b, a),
        (Value::Null, Value::Object(a)) => (&empty, a),
        _ => {
            return Some(serde_json::json!({
                "changed": {"": {"from": before, "to": after}}, "added": {}, "removed": []
            }));
        }
    };
    let mut changed = serde_json::Map::new();
    let mut added = serde_json::Map::new();
    for (k, new) in a {
        match b.get(k) {
            Some(old) if old == new => {}
            Some(old) => {
                changed.insert(k.clone(), serde_json::json!({"from": old, "to": new}));
            }
            None => {
                added.insert(k.clone(), new.clone());
            }
        }
    }
    let removed: Vec<&String> = b.keys().filter(|k| !a.contains_key(*k)).collect();
    Some(serde_json::json!({"changed": changed, "added": added, "removed": removed}))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum MessageLevel {
    Info,
    Warn,
    Error,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SystemMessage {
    pub level: MessageLevel,
    pub content: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EngineEnd {
    pub status: RunStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

// ---------------------------------------------------------------------------------------------
// §4 Fleet job messages

/// Why a job was published.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum JobKind {
    Start,
    Resume,
}

/// A message on `delta.jobs.<agent>`: `{"run_id", "kind", "request_id"?, "run"?, "paused"?}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    pub run_id: RunId,
    pub kind: JobKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<RequestId>,
    /// A start job's run as the gateway created it, so that the job's first delivery starts it
    /// without reading it from the store (docs/protocol.md "Job messages"). Only a hint: the
    /// worker's first write still checks that the run is as fresh as this says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<FreshRun>,
    /// A resume job's run as the gateway's settling script read it, paused, so that the job's
    /// first delivery resumes it without reading it from the store (docs/protocol.md "Job
    /// messages"). Only a hint, like `run`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<PausedRun>,
}

/// What a resume job carries of a paused run: its record and the question it resumes on, each
/// the fields of its hash in the store, as text (the record with its snapshot in `snap`). Opaque
/// to everyone but the store that wrote them, which checks them as it checks what it reads.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PausedRun {
    pub record: std::collections::BTreeMap<String, String>,
    pub question: std::collections::BTreeMap<String, String>,
}

/// What a start job carries of a run that has not started: the fields of its record the
/// submission set. The rest of a fresh record follows from them (`QUEUED`, nothing journaled).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FreshRun {
    pub agent: String,
    pub task: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<serde_json::Value>,
    pub created_at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_by: Option<String>,
}

/// A payload on `delta.jobs.<agent>` that is not a job message: why, and the start of what came.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not a job message ({reason}): {preview}")]
pub struct JobError {
    /// What the JSON parser refused, and where (line and column).
    pub reason: String,
    /// The first 200 characters of the payload (lossy UTF-8), for the DLQ reason and the logs.
    pub preview: String,
}

impl Job {
    /// A start job for `run_id`, carrying nothing of the run.
    pub fn start(run_id: RunId) -> Job {
        Job {
            run_id,
            kind: JobKind::Start,
            request_id: None,
            run: None,
            paused: None,
        }
    }

    /// A resume job for `run_id`, about question `request_id` (if it names one).
    pub fn resume(run_id: RunId, request_id: Option<RequestId>) -> Job {
        Job {
            run_id,
            kind: JobKind::Resume,
            request_id,
            run: None,
            paused: None,
        }
    }

    /// Decodes a job message's payload: strict JSON (no unknown fields, no trailing data). Every
    /// host decodes jobs here, so the fuzzers test what the workers run.
    pub fn decode(payload: &[u8]) -> Result<Job, JobError> {
        serde_json::from_slice(payload).map_err(|e| JobError {
            reason: e.to_string(),
            preview: String::from_utf8_lossy(payload).chars().take(200).collect(),
        })
    }

    /// The `Nats-Msg-Id` that makes publishing this job idempotent: `start:<run_id>` or
    /// `resume:<request_id>`.
    pub fn msg_id(&self) -> String {
        match (self.kind, self.request_id) {
            (JobKind::Resume, Some(r)) => format!("resume:{r}"),
            (JobKind::Resume, None) => format!("resume:{}", self.run_id),
            (JobKind::Start, _) => format!("start:{}", self.run_id),
        }
    }

    /// The `Nats-Msg-Id` of the resume job for one answer: `resume:<request_id>:<micros>` for the
    /// answer accepted at `answered_at`, `resume:<request_id>` when the clock closed the question
    /// (`None`; that happens once). Per answer, not per question: a question the engine reopened
    /// (its answer refused at resume) gets a new answer, and that answer's job must not be
    /// dropped as a duplicate of the refused one's.
    pub fn resume_msg_id(&self, answered_at: Option<Timestamp>) -> String {
        match answered_at {
            Some(at) => format!("{}:{}", self.msg_id(), at.micros()),
            None => self.msg_id(),
        }
    }
}

/// A fencing token: the JetStream stream sequence of the job message a worker works for, and the
/// count of the delivery it got. Tokens order by sequence, then delivery: a write with a token
/// older than the run's is refused, a newer one takes the run over. So a worker that stalled past
/// `ack_wait` cannot overwrite the journal of the one that took its job over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fence {
    /// The job message's sequence in the jobs stream.
    pub stream_seq: u64,
    /// Which delivery of that message (1 for the first).
    pub delivery: u64,
}

impl Fence {
    /// The token of delivery `delivery` of the message at `stream_seq`.
    pub const fn new(stream_seq: u64, delivery: u64) -> Self {
        Fence {
            stream_seq,
            delivery,
        }
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.stream_seq, self.delivery)
    }
}

/// What `…interactions.resolved.<agent>.<run_id>` carries (docs/protocol.md §4), plus `state`:
/// `ANSWERED`, `EXPIRED` (the clock answered: `option_id` is the default applied, or none when
/// the run fails) or `CANCELLED` (the run was cancelled while it waited).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Resolved {
    pub request_id: RequestId,
    pub run_id: RunId,
    #[serde(default)]
    pub option_id: Option<String>,
    #[serde(default)]
    pub action: Option<OptionAction>,
    pub responder: Responder,
    pub resolved_at: Timestamp,
    pub state: InteractionState,
}

/// Where an interaction stands (docs/protocol.md §5, the `state` of its hash).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum InteractionState {
    Pending,
    Answered,
    Expired,
    Cancelled,
}

impl InteractionState {
    pub fn as_str(self) -> &'static str {
        match self {
            InteractionState::Pending => "PENDING",
            InteractionState::Answered => "ANSWERED",
            InteractionState::Expired => "EXPIRED",
            InteractionState::Cancelled => "CANCELLED",
        }
    }
}

impl FromStr for InteractionState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            InteractionState::Pending,
            InteractionState::Answered,
            InteractionState::Expired,
            InteractionState::Cancelled,
        ]
        .into_iter()
        .find(|st| st.as_str().eq_ignore_ascii_case(s))
        .ok_or_else(|| {
            format!("`{s}` is not an interaction state (pending, answered, expired, cancelled)")
        })
    }
}

// ---------------------------------------------------------------------------------------------
// §3 Interactions

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum InteractionType {
    ToolApproval,
    MissingInfo,
    UserConfirmation,
    UserChoice,
    UserInput,
    Custom,
}

/// `text`, `password`, `confirmation`, `choice`; any other string is kept as is (for `CUSTOM`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum InputType {
    Text,
    Password,
    Confirmation,
    Choice,
    Other(String),
}

impl InputType {
    pub fn as_str(&self) -> &str {
        match self {
            InputType::Text => "text",
            InputType::Password => "password",
            InputType::Confirmation => "confirmation",
            InputType::Choice => "choice",
            InputType::Other(s) => s,
        }
    }
}

impl From<&str> for InputType {
    fn from(s: &str) -> Self {
        match s {
            "text" => InputType::Text,
            "password" => InputType::Password,
            "confirmation" => InputType::Confirmation,
            "choice" => InputType::Choice,
            other => InputType::Other(other.to_owned()),
        }
    }
}

impl Serialize for InputType {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for InputType {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(InputType::from(String::deserialize(d)?.as_str()))
    }
}

/// What the engine does with an answer that picked this option.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OptionAction {
    ApproveAndExecute,
    RetryWithFeedback,
    RejectWithReason,
    Terminate,
    ProvideInfo,
    Skip,
    Custom,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InteractionOption {
    pub option_id: String,
    pub label: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub action: OptionAction,
    #[serde(default)]
    pub is_default: bool,
    #[serde(default)]
    pub is_dangerous: bool,
    #[serde(default)]
    pub requires_input: bool,
    #[serde(default)]
    pub input_prompt: Option<String>,
    #[serde(default)]
    pub metadata: BTreeMap<String, Value>,
}

impl InteractionOption {
    /// A plain option: not default, not dangerous, no input.
    pub fn new(
        option_id: impl Into<String>,
        label: impl Into<String>,
        action: OptionAction,
    ) -> Self {
        Self {
            option_id: option_id.into(),
            label: label.into(),
            description: None,
            action,
            is_default: false,
            is_dangerous: false,
            requires_input: false,
            input_prompt: None,
            metadata: BTreeMap::new(),
        }
    }
}

/// What a run asks a human (docs/protocol.md §3). A superset of Delta v1.2's `request.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InteractionRequest {
    pub request_id: RequestId,
    pub run_id: RunId,
    pub agent: String,
    pub timestamp: Timestamp,
    #[serde(rename = "type")]
    pub kind: InteractionType,
    pub prompt: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<String>,
    pub input_type: InputType,
    #[serde(default)]
    pub sensitive: bool,
    #[serde(default)]
    pub options: Vec<InteractionOption>,
    #[serde(default)]
    pub default_option_id: Option<String>,
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
    #[serde(default)]
    pub expires_at: Option<Timestamp>,
    #[serde(default)]
    pub context: BTreeMap<String, Value>,
    /// Who may answer (responder ids; with gateway auth on, token names). Empty: anyone allowed
    /// to answer at all. From the agent's `interaction_defaults` or the `ask_human` call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_responders: Vec<String>,
    /// Decided by votes: how many must approve, and who may vote (docs/protocol.md §3, "Quorum").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approvals: Option<Approvals>,
    /// What happens while it waits: reminders, more responders, its default applied
    /// (docs/protocol.md §3 "Escalation"), carried out by the gateway.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub escalation: Vec<EscalationStep>,
    /// The SHA-256 of what the request shows ([`human::request_hash`]), set when it is asked. An
    /// answer that echoes another hash is refused (`409 stale`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_hash: Option<String>,
    /// A typed answer: the restricted JSON Schema of MCP elicitation (see [`schema`]) that the
    /// answer's `data` must fit. Absent: the answer is an option and/or free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_schema: Option<Value>,
}

impl InteractionRequest {
    /// A new request (fresh id, stamped now) with no options, no timeout and an empty context.
    pub fn new(
        run_id: RunId,
        agent: &str,
        kind: InteractionType,
        prompt: impl Into<String>,
    ) -> Self {
        Self {
            request_id: RequestId::new(),
            run_id,
            agent: agent.to_owned(),
            timestamp: Timestamp::now(),
            kind,
            prompt: prompt.into(),
            title: None,
            details: None,
            input_type: InputType::Text,
            sensitive: false,
            options: vec![],
            default_option_id: None,
            timeout_seconds: None,
            expires_at: None,
            context: BTreeMap::new(),
            allowed_responders: vec![],
            approvals: None,
            escalation: vec![],
            request_hash: None,
            response_schema: None,
        }
    }

    /// Whether `responder`, a member of `groups`, may answer: anyone when the list is empty, the
    /// clock always; else an id the list names, or a member of a `group:<name>` it names.
    pub fn allows(&self, responder: &Responder, groups: &[String]) -> bool {
        self.allowed_responders.is_empty()
            || responder.via == Via::Timeout
            || human::admitted_by(&self.allowed_responders, &responder.id, groups)
    }

    /// The hash of what this request shows, as [`human::request_hash`] computes it.
    pub fn hash(&self) -> String {
        human::request_hash(self)
    }

    /// The hash an answer must echo: the one set when the request was asked, else (a request
    /// asked before hashes existed) its hash now.
    pub fn shown_hash(&self) -> String {
        self.request_hash.clone().unwrap_or_else(|| self.hash())
    }

    /// Sets `request_hash` to this request's hash: the last step of asking.
    pub fn seal_hash(&mut self) {
        self.request_hash = Some(self.hash());
    }

    pub fn option(&self, option_id: &str) -> Option<&InteractionOption> {
        self.options.iter().find(|o| o.option_id == option_id)
    }

    /// The action id of the journaled `ACTION_REQUEST` this request belongs to, if any.
    pub fn action_id(&self) -> Option<&str> {
        self.context.get("action_id").and_then(Value::as_str)
    }

    /// Whether this request asks a person to confirm the plan of the run's current decision
    /// (`confirm_plan`): it carries the plan in `context.plan` and belongs to no action.
    pub fn is_plan_confirmation(&self) -> bool {
        self.context.contains_key("plan") && self.action_id().is_none()
    }

    /// Whether the answer must be hidden everywhere (`sensitive`, or a password input).
    pub fn is_sensitive(&self) -> bool {
        self.sensitive || self.input_type == InputType::Password
    }

    /// True once `now` is past `expires_at`.
    pub fn is_expired_at(&self, now: Timestamp) -> bool {
        self.expires_at.is_some_and(|e| now > e)
    }
}

/// An answer to an interaction request (docs/protocol.md §3).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct InteractionResponse {
    pub request_id: RequestId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub option_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feedback: Option<String>,
    pub responder: Responder,
    /// The `request_hash` of the request as the responder saw it; when given, it must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_hash: Option<String>,
}

impl InteractionResponse {
    /// An empty answer to `request_id` by `responder`; fill in the option and the text.
    pub fn new(request_id: RequestId, responder: Responder) -> Self {
        Self {
            request_id,
            option_id: None,
            input: None,
            data: None,
            feedback: None,
            responder,
            request_hash: None,
        }
    }
}

/// Debug never shows the free-text parts: they may be secrets.
impl fmt::Debug for InteractionResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InteractionResponse")
            .field("request_id", &self.request_id)
            .field("option_id", &self.option_id)
            .field("input", &self.input.as_ref().map(|_| REDACTED))
            .field("responder", &self.responder)
            .finish_non_exhaustive()
    }
}

/// What every sensitive value is shown as.
pub const REDACTED: &str = "***";

/// Why a response was refused (docs/protocol.md §3 and §6 codes).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResponseError {
    #[error("no pending interaction request {0}")]
    NotFound(String),
    #[error("request {0} was already answered")]
    AlreadyResolved(RequestId),
    #[error("request {request_id} expired at {expires_at}")]
    Expired {
        request_id: RequestId,
        expires_at: Timestamp,
    },
    #[error("`{given}` is not an option of this request; choose one of: {valid}")]
    InvalidOption { given: String, valid: String },
    #[error("option `{0}` needs a non-empty input")]
    InputRequired(String),
    #[error("an answer to this request needs a non-empty input")]
    EmptyInput,
    #[error("edited arguments refused: {0}")]
    InvalidArgs(String),
    #[error("`{0}` may not answer this request (it names who may: see allowed_responders)")]
    NotAllowed(String),
    /// The answer echoed the hash of another version of the request than the one pending.
    #[error(
        "request {0} is not the one you were shown (its request_hash differs): load it again and answer what it asks now"
    )]
    Stale(RequestId),
    #[error(
        "request {request_id} is claimed by {by} until {until}: only they may answer until then"
    )]
    Claimed {
        request_id: RequestId,
        by: String,
        until: Timestamp,
    },
    #[error("`{0}` has voted on this request already: a person votes once")]
    AlreadyVoted(String),
    /// A typed answer's `data` does not fit the request's `response_schema`.
    #[error("data refused: {0}")]
    InvalidData(schema::FieldError),
}

impl ResponseError {
    /// The contract's error code.
    pub fn code(&self) -> &'static str {
        match self {
            ResponseError::NotFound(_) => "not_found",
            ResponseError::AlreadyResolved(_) => "already_resolved",
            ResponseError::Expired { .. } => "expired",
            ResponseError::InvalidOption { .. } => "invalid_option",
            ResponseError::InputRequired(_) | ResponseError::EmptyInput => "input_required",
            ResponseError::InvalidArgs(_) => "invalid_args",
            ResponseError::NotAllowed(_) => "forbidden",
            ResponseError::Stale(_) => "stale",
            ResponseError::Claimed { .. } => "claimed",
            ResponseError::AlreadyVoted(_) => "already_voted",
            ResponseError::InvalidData(_) => "invalid_data",
        }
    }
}

/// An answer checked against its request: the option it picked (if any) and the action to apply.
#[derive(Clone, Debug, PartialEq)]
pub struct AcceptedAnswer {
    pub response: InteractionResponse,
    pub option: Option<InteractionOption>,
    pub action: OptionAction,
}

impl InteractionRequest {
    /// Answer rules 1, 3 and 4 of docs/protocol.md §3, those that depend only on the request
    /// and the answer; whether the request is still pending is the store's business.
    pub fn validate(
        &self,
        response: InteractionResponse,
        now: Timestamp,
    ) -> Result<AcceptedAnswer, ResponseError> {
        if response.request_id != self.request_id {
            return Err(ResponseError::NotFound(response.request_id.to_string()));
        }
        if response
            .request_hash
            .as_ref()
            .is_some_and(|h| *h != self.shown_hash())
        {
            return Err(ResponseError::Stale(self.request_id));
        }
        if response.responder.via != Via::Timeout {
            if let Some(expires_at) = self.expires_at.filter(|_| self.is_expired_at(now)) {
                return Err(ResponseError::Expired {
                    request_id: self.request_id,
                    expires_at,
                });
            }
        }
        let has_input = response
            .input
            .as_deref()
            .is_some_and(|s| !s.trim().is_empty());
        if let Some(v) = &self.response_schema {
            // A typed answer is its `data`; text, if any, goes along as a comment.
            let schema = schema::ResponseSchema::parse(v).map_err(|e| {
                ResponseError::InvalidData(schema::FieldError {
                    field: None,
                    message: format!("this request cannot be answered: {e}"),
                })
            })?;
            // A sensitive answer's values are not repeated in the error: it reaches a bot's
            // inbox (which other bots may read) and logs.
            schema
                .check_as(response.data.as_ref(), self.is_sensitive())
                .map_err(ResponseError::InvalidData)?;
        }
        if self.options.is_empty() {
            if response.option_id.is_some() {
                return Err(ResponseError::InvalidOption {
                    given: response.option_id.clone().unwrap_or_default(),
                    valid: "(none: this request takes free text)".into(),
                });
            }
            if !has_input && self.response_schema.is_none() {
                return Err(ResponseError::EmptyInput);
            }
            return Ok(AcceptedAnswer {
                response,
                option: None,
                action: OptionAction::ProvideInfo,
            });
        }
        let valid = || {
            self.options
                .iter()
                .map(|o| o.option_id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let Some(given) = response.option_id.as_deref() else {
            return Err(ResponseError::InvalidOption {
                given: "(no option_id)".into(),
                valid: valid(),
            });
        };
        let Some(option) = self.option(given) else {
            return Err(ResponseError::InvalidOption {
                given: given.to_owned(),
                valid: valid(),
            });
        };
        if option.requires_input && !has_input {
            return Err(ResponseError::InputRequired(option.option_id.clone()));
        }
        Ok(AcceptedAnswer {
            action: option.action,
            option: Some(option.clone()),
            response,
        })
    }
}

impl AcceptedAnswer {
    /// The journal's record of this answer: free text replaced by `"***"` when sensitive.
    pub fn journal_record(&self, request: &InteractionRequest) -> HumanInputReceived {
        let r = &self.response;
        let hide = |s: &Option<String>| {
            if request.is_sensitive() {
                s.as_ref().map(|_| REDACTED.to_owned())
            } else {
                s.clone()
            }
        };
        HumanInputReceived {
            request_id: r.request_id,
            option_id: r.option_id.clone(),
            action: self.action,
            responder: r.responder.clone(),
            input: hide(&r.input),
            data: if request.is_sensitive() {
                r.data.as_ref().map(|_| Value::String(REDACTED.into()))
            } else {
                r.data.clone()
            },
            feedback: hide(&r.feedback),
            edited_args: None,
            request_hash: Some(request.shown_hash()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_show_in_a_url_we_print() {
        assert_eq!(
            without_credentials("nats://alice:s3cret@10.0.0.1:4222"),
            "nats://***@10.0.0.1:4222"
        );
        assert_eq!(
            without_credentials("redis://:pw@r:6379/0,redis://u:p@s:6379"),
            "redis://***@r:6379/0,redis://***@s:6379"
        );
        assert_eq!(without_credentials("nats://host:4222"), "nats://host:4222");
        // A server URL has no path: an `@` anywhere is taken for the end of a login (a raw `/` in
        // a password would otherwise show it).
        assert_eq!(without_credentials("http://h/a@b"), "http://***@b");
        assert_eq!(without_credentials("not a url"), "not a url");
    }
    use serde_json::json;

    fn roundtrip<T: Serialize + for<'de> Deserialize<'de>>(v: Value) {
        let parsed: T = serde_json::from_value(v.clone()).expect("parses");
        let back = serde_json::to_value(&parsed).expect("serialises");
        assert_eq!(back, v);
    }

    #[test]
    fn job_messages_round_trip_and_name_their_msg_id() {
        let run = "0190a7a8-0000-7000-8000-000000000001";
        let req = "0190a7a8-0000-7000-8000-000000000002";
        roundtrip::<Job>(json!({"run_id": run, "kind": "start"}));
        roundtrip::<Job>(json!({"run_id": run, "kind": "resume", "request_id": req}));
        let job: Job =
            serde_json::from_value(json!({"run_id": run, "kind": "resume", "request_id": req}))
                .expect("ok");
        assert_eq!(job.msg_id(), format!("resume:{req}"));
        assert!(serde_json::from_value::<Job>(json!({"run_id": run, "kind": "stop"})).is_err());
        assert!(serde_json::from_str::<Job>("not json").is_err());
        let e = Job::decode(b"{\"run_id\": 1}").unwrap_err();
        assert!(
            e.to_string().starts_with("not a job message (invalid type"),
            "{e}"
        );
        assert_eq!(e.preview, "{\"run_id\": 1}");
        let ok = Job::decode(format!(r#"{{"run_id": "{run}", "kind": "start"}}"#).as_bytes());
        assert_eq!(ok.map(|j| j.kind), Ok(JobKind::Start));
    }

    #[test]
    fn timestamps_have_microseconds_and_utc() {
        let t: Timestamp = "2026-11-20T10:00:00.123456Z".parse().expect("valid");
        assert_eq!(t.to_string(), "2026-11-20T10:00:00.123456Z");
        let t: Timestamp = "2026-11-20T11:00:00+01:00".parse().expect("valid");
        assert_eq!(t.to_string(), "2026-11-20T10:00:00.000000Z");
        assert_eq!(Timestamp::now().to_string().len(), 27);
        let e = serde_json::from_str::<Timestamp>("\"yesterday\"").expect_err("not a time");
        assert!(
            e.to_string()
                .starts_with("`yesterday` is not an RFC 3339 time ("),
            "{e}"
        );
    }

    #[test]
    fn a_timestamp_is_written_as_chrono_writes_its_format() {
        // The ends of the years kept, the epoch, leap days, and a spread of instants between.
        let mut micros = vec![
            super::time::MIN_MICROS,
            super::time::MAX_MICROS,
            0,
            -1,
            951_782_400_000_001,
            1_795_953_600_123_456,
        ];
        let step = (super::time::MAX_MICROS - super::time::MIN_MICROS) / 9_973;
        micros.extend((0..9_973).map(|i| super::time::MIN_MICROS + i * step + i % 1_000_000));
        for us in micros {
            let t = Timestamp::from_micros(us).expect("in range");
            let chrono = t.as_datetime().format(super::time::FORMAT).to_string();
            assert_eq!(t.to_string(), chrono, "{us} µs");
        }
    }

    #[test]
    fn every_timestamp_written_parses_back() {
        // Found while writing the fuzz properties (huge numbers): a `timeout_seconds` between
        // i64::MAX / 1000 and i64::MAX panicked in `plus_seconds` (chrono's TimeDelta bound),
        // and any other one reaching past year 9999 wrote an `expires_at` in year +262142 that
        // the journal could not read back ("the journal is corrupt").
        let t: Timestamp = "2026-11-20T10:00:00.123456Z".parse().expect("valid");
        for secs in [10_000_000_000_000_000, 9_000_000_000_000_000, u64::MAX] {
            let later = t.plus_seconds(secs);
            assert_eq!(later.to_string(), "9999-12-31T23:59:59.999999Z");
            assert_eq!(later.to_string().parse::<Timestamp>(), Ok(later));
        }
        assert_eq!(
            t.plus_seconds(900).to_string(),
            "2026-11-20T10:15:00.123456Z"
        );
        // Offsets that move a time out of the years 0000–9999 are clamped.
        for (given, kept) in [
            ("9999-12-31T23:59:59-01:00", "9999-12-31T23:59:59.999999Z"),
            ("0000-01-01T00:00:00+01:00", "0000-01-01T00:00:00.000000Z"),
        ] {
            let t: Timestamp = given.parse().expect("valid RFC 3339");
            assert_eq!(t.to_string(), kept);
            assert_eq!(kept.parse::<Timestamp>(), Ok(t));
        }
        for us in [i64::MIN, i64::MAX] {
            if let Some(t) = Timestamp::from_micros(us) {
                assert_eq!(t.to_string().parse::<Timestamp>(), Ok(t));
            }
        }
    }

    #[test]
    fn statuses_are_screaming_snake_case() {
        assert_eq!(
            serde_json::to_value(RunStatus::WaitingForInput).expect("ok"),
            json!("WAITING_FOR_INPUT")
        );
        for s in RunStatus::ALL {
            assert_eq!(s.as_str().parse::<RunStatus>(), Ok(s));
            assert_eq!(serde_json::to_value(s).expect("ok"), json!(s.as_str()));
        }
        assert!(RunStatus::Cancelled.is_terminal() && !RunStatus::Interrupted.is_terminal());
    }

    #[test]
    fn journal_events_round_trip_protocol_json() {
        let run = "0190a7a8-0000-7000-8000-000000000001";
        let req = "0190a7a8-0000-7000-8000-000000000002";
        let events = [
            json!({"seq": 1, "timestamp": "2026-11-20T10:00:00.123456Z", "type": "ENGINE_START",
                   "payload": {"run_id": run, "agent": "hello", "task": "t", "worker": "local", "attempt": 1}}),
            json!({"seq": 2, "timestamp": "2026-11-20T10:00:00.123456Z", "type": "THOUGHT",
                   "payload": {"content": "hm", "tool_calls": [{"id": "a1", "tool": "echo", "args": {"text": "x"}}]}}),
            json!({"seq": 3, "timestamp": "2026-11-20T10:00:00.123456Z", "type": "PLAN",
                   "payload": {"tasks": [{"index": 1, "description": "d", "tool": "deploy", "risk": "high"}], "risk_level": "high"}}),
            json!({"seq": 3, "timestamp": "2026-11-20T10:00:00.123456Z", "type": "PLAN",
                   "payload": {"tasks": [], "risk_level": "low", "round": 2}}),
            json!({"seq": 4, "timestamp": "2026-11-20T10:00:00.123456Z", "type": "ACTION_REQUEST",
                   "payload": {"action_id": "a1", "tool": "echo", "args": {"text": "x"}}}),
            json!({"seq": 5, "timestamp": "2026-11-20T10:00:00.123456Z", "type": "ACTION_RESULT",
                   "payload": {"action_id": "a1", "status": "SUCCESS", "observation_content": "x", "exit_code": 0, "duration_ms": 3}}),
            json!({"seq": 6, "timestamp": "2026-11-20T10:00:00.123456Z", "type": "HUMAN_INPUT_RECEIVED",
                   "payload": {"request_id": req, "option_id": "approve", "action": "APPROVE_AND_EXECUTE",
                               "responder": {"id": "alice", "via": "http"}, "input": "***",
                               "data": {"args": {"env": "staging"}},
                               "edited_args": {"changed": {"env": {"from": "prod", "to": "staging"}}, "added": {}, "removed": []}}}),
            json!({"seq": 7, "timestamp": "2026-11-20T10:00:00.123456Z", "type": "SYSTEM_MESSAGE",
                   "payload": {"level": "warn", "content": "retrying"}}),
            json!({"seq": 8, "timestamp": "2026-11-20T10:00:00.123456Z", "type": "ENGINE_END",
                   "payload": {"status": "WAITING_FOR_INPUT"}}),
        ];
        for e in events {
            roundtrip::<JournalEvent>(e);
        }
    }

    fn approval_request_json() -> Value {
        json!({
          "request_id": "0190a7a8-0000-7000-8000-000000000002",
          "run_id": "0190a7a8-0000-7000-8000-000000000001",
          "agent": "deployer", "timestamp": "2026-11-20T10:00:00.123456Z",
          "type": "TOOL_APPROVAL",
          "prompt": "Run `kubectl apply -f prod.yaml`?",
          "title": "Approve tool call", "details": "…",
          "input_type": "confirmation",
          "sensitive": false,
          "options": [
            {"option_id": "approve", "label": "Approve", "description": "…", "action": "APPROVE_AND_EXECUTE",
             "is_default": false, "is_dangerous": true, "requires_input": false, "input_prompt": null, "metadata": {}},
            {"option_id": "reject", "label": "Reject", "action": "REJECT_WITH_REASON",
             "is_default": true, "is_dangerous": false, "requires_input": true, "input_prompt": "Why?", "metadata": {}}
          ],
          "default_option_id": "reject",
          "timeout_seconds": 900, "expires_at": "2026-11-20T10:15:00.123456Z",
          "context": {"tool": "kubectl_apply", "args": {"file": "prod.yaml"}, "risk_level": "high"}
        })
    }

    #[test]
    fn interaction_request_round_trips_protocol_example() {
        roundtrip::<InteractionRequest>(approval_request_json());
        let mut custom = approval_request_json();
        custom["type"] = json!("CUSTOM");
        custom["input_type"] = json!("slider");
        roundtrip::<InteractionRequest>(custom);
    }

    #[test]
    fn interaction_response_round_trips_and_refuses_unknown_fields() {
        roundtrip::<InteractionResponse>(json!({
            "request_id": "0190a7a8-0000-7000-8000-000000000002", "option_id": "approve",
            "input": "free text", "data": {"args": {"a": 1}}, "feedback": "why",
            "responder": {"id": "alice", "via": "http"}}));
        let bad = json!({"request_id": "0190a7a8-0000-7000-8000-000000000002",
            "responder": {"id": "a", "via": "http"}, "optionid": "x"});
        assert!(serde_json::from_value::<InteractionResponse>(bad).is_err());
    }

    fn response(
        req: &InteractionRequest,
        option: Option<&str>,
        input: Option<&str>,
    ) -> InteractionResponse {
        InteractionResponse {
            request_id: req.request_id,
            option_id: option.map(str::to_owned),
            input: input.map(str::to_owned),
            data: None,
            feedback: None,
            responder: Responder {
                id: "alice".into(),
                via: Via::Http,
                on_behalf_of: None,
                relayed_by: None,
            },
            request_hash: None,
        }
    }

    #[test]
    fn an_answer_echoing_another_version_of_the_request_is_stale() {
        let mut q = InteractionRequest::new(RunId::new(), "a", InteractionType::UserInput, "Name?");
        q.seal_hash();
        let mut r = response(&q, None, Some("x"));
        r.request_hash = Some(q.hash());
        assert!(q.validate(r.clone(), Timestamp::now()).is_ok());
        r.request_hash = Some("0".repeat(64));
        let e = q.validate(r.clone(), Timestamp::now()).unwrap_err();
        assert_eq!(e.code(), "stale");
        r.request_hash = None;
        assert!(
            q.validate(r, Timestamp::now()).is_ok(),
            "an answer need not echo it"
        );
    }

    #[test]
    fn validation_applies_the_protocol_rules() {
        let req: InteractionRequest = serde_json::from_value(approval_request_json()).expect("ok");
        let before = "2026-11-20T10:01:00.000000Z".parse().expect("ts");
        let after = "2026-11-20T10:16:00.000000Z".parse().expect("ts");

        let ok = req
            .validate(response(&req, Some("approve"), None), before)
            .expect("valid");
        assert_eq!(ok.action, OptionAction::ApproveAndExecute);

        let e = req
            .validate(response(&req, Some("nope"), None), before)
            .unwrap_err();
        assert_eq!(e.code(), "invalid_option");
        let e = req
            .validate(response(&req, None, Some("x")), before)
            .unwrap_err();
        assert_eq!(e.code(), "invalid_option");
        let e = req
            .validate(response(&req, Some("reject"), Some("  ")), before)
            .unwrap_err();
        assert_eq!(e.code(), "input_required");
        let e = req
            .validate(response(&req, Some("approve"), None), after)
            .unwrap_err();
        assert_eq!(e.code(), "expired");
        let mut other = response(&req, Some("approve"), None);
        other.request_id = RequestId::new();
        assert_eq!(req.validate(other, before).unwrap_err().code(), "not_found");
        let mut by_timeout = response(&req, Some("reject"), Some("timed out"));
        by_timeout.responder = Responder {
            id: "timeout".into(),
            via: Via::Timeout,
            on_behalf_of: None,
            relayed_by: None,
        };
        assert!(req.validate(by_timeout, after).is_ok());
    }

    #[test]
    fn free_text_requests_need_text_and_no_option() {
        let mut req: InteractionRequest =
            serde_json::from_value(approval_request_json()).expect("ok");
        req.options.clear();
        req.expires_at = None;
        let now = Timestamp::now();
        assert_eq!(
            req.validate(response(&req, None, Some("")), now)
                .unwrap_err()
                .code(),
            "input_required"
        );
        assert_eq!(
            req.validate(response(&req, Some("a"), Some("x")), now)
                .unwrap_err()
                .code(),
            "invalid_option"
        );
        assert_eq!(
            req.validate(response(&req, None, Some("x")), now)
                .expect("ok")
                .action,
            OptionAction::ProvideInfo
        );
    }

    #[test]
    fn typed_requests_need_data_that_fits_their_schema() {
        let mut req: InteractionRequest =
            serde_json::from_value(approval_request_json()).expect("ok");
        req.options.clear();
        req.expires_at = None;
        req.response_schema = Some(json!({"type": "object",
            "properties": {"email": {"type": "string", "format": "email"},
                           "args": {"type": "integer"}},
            "required": ["email"]}));
        let back: InteractionRequest =
            serde_json::from_value(serde_json::to_value(&req).expect("ok")).expect("ok");
        assert_eq!(back.response_schema, req.response_schema);
        let now = Timestamp::now();
        let with = |data: Value| {
            let mut r = response(&req, None, None);
            r.data = Some(data);
            req.validate(r, now)
        };
        let ok = with(json!({"email": "ada@example.com", "args": 3})).expect("valid");
        assert_eq!(ok.action, OptionAction::ProvideInfo);
        let e = with(json!({"email": "ada"})).unwrap_err();
        assert_eq!(e.code(), "invalid_data");
        assert!(e.to_string().contains("field `email`"), "{e}");
        let e = with(json!({"email": "a@b.c", "extra": 1})).unwrap_err();
        assert!(e.to_string().contains("field `extra`"), "{e}");
        let e = req
            .validate(response(&req, None, Some("text")), now)
            .unwrap_err();
        assert_eq!(e.code(), "invalid_data", "text alone is no typed answer");
        // A sensitive question's refusal does not repeat the value given.
        let e = with(json!({"email": "hunter2-secret"})).unwrap_err();
        assert!(e.to_string().contains("hunter2-secret"), "{e}");
        let mut secret = req.clone();
        secret.sensitive = true;
        let mut r = response(&secret, None, None);
        r.data = Some(json!({"email": "hunter2-secret"}));
        let e = secret.validate(r, now).unwrap_err();
        assert_eq!(e.code(), "invalid_data");
        assert!(
            e.to_string().contains("field `email`") && !e.to_string().contains("hunter2"),
            "{e}"
        );
        // Untyped requests never look at the schema rules.
        req.response_schema = None;
        assert!(req.validate(response(&req, None, Some("x")), now).is_ok());
    }

    #[test]
    fn args_diff_names_changed_added_and_removed_keys() {
        let before = json!({"env": "production", "version": "1.0", "dry_run": "no"});
        let after = json!({"env": "production", "version": "1.1", "note": "hotfix"});
        assert_eq!(
            args_diff(&before, &after),
            Some(json!({
                "changed": {"version": {"from": "1.0", "to": "1.1"}},
                "added": {"note": "hotfix"},
                "removed": ["dry_run"]
            }))
        );
        assert_eq!(args_diff(&before, &before.clone()), None);
        let whole = args_diff(&json!("a"), &json!({"x": 1})).expect("differs");
        assert_eq!(whole["changed"][""]["to"], json!({"x": 1}));
    }

    #[test]
    fn sensitive_answers_are_redacted_in_the_journal_record() {
        let mut req: InteractionRequest =
            serde_json::from_value(approval_request_json()).expect("ok");
        req.options.clear();
        req.expires_at = None;
        req.input_type = InputType::Password;
        let ok = req
            .validate(response(&req, None, Some("hunter2")), Timestamp::now())
            .expect("ok");
        let rec = ok.journal_record(&req);
        assert_eq!(rec.input.as_deref(), Some(REDACTED));
        assert!(!serde_json::to_string(&rec).expect("ok").contains("hunter2"));
        assert!(!format!("{:?}", ok.response).contains("hunter2"));
    }
}

/// OpenAPI schemas of the types whose serde shape is written by hand (a string in each case), for
/// the gateway's generated document (`delta-api`). Behind the `openapi` feature so that the
/// worker, the engine and the fuzzers do not build `utoipa`.
#[cfg(feature = "openapi")]
mod schemas {
    use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
    use utoipa::openapi::{RefOr, Schema};
    use utoipa::{PartialSchema, ToSchema};

    fn string(format: Option<SchemaFormat>, description: &str, example: &str) -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(format)
            .description(Some(description))
            .examples([serde_json::Value::String(example.to_owned())])
            .into()
    }

    impl PartialSchema for super::Timestamp {
        fn schema() -> RefOr<Schema> {
            string(
                Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)),
                "RFC 3339, UTC, always six fractional digits.",
                "2026-11-21T10:00:00.000000Z",
            )
        }
    }
    impl ToSchema for super::Timestamp {}

    impl PartialSchema for super::RunId {
        fn schema() -> RefOr<Schema> {
            string(
                Some(SchemaFormat::Custom("uuid".into())),
                "A run id (a UUID, v7).",
                "0193a1b2-0000-7000-8000-00000000a001",
            )
        }
    }
    impl ToSchema for super::RunId {}

    impl PartialSchema for super::RequestId {
        fn schema() -> RefOr<Schema> {
            string(
                Some(SchemaFormat::Custom("uuid".into())),
                "An interaction request id (a UUID, v7).",
                "0193a1b2-0000-7000-8000-00000000b002",
            )
        }
    }
    impl ToSchema for super::RequestId {}

    impl PartialSchema for super::InputType {
        fn schema() -> RefOr<Schema> {
            string(
                None,
                "`text`, `password`, `confirmation`, `choice`; any other string is kept as is (for `CUSTOM`).",
                "text",
            )
        }
    }
    impl ToSchema for super::InputType {}
}

#[cfg(test)]
mod credential_tests {
    use super::without_credentials;

    #[test]
    fn credentials_are_masked_whatever_the_url_looks_like() {
        for (url, shown) in [
            ("nats://alice:s3cret@host:4222", "nats://***@host:4222"),
            ("alice:s3cret@host:4222", "***@host:4222"),
            ("redis://u:pa/ss@h:6379", "redis://***@h:6379"),
            (
                "nats://a:b@n1:4222,nats://a:b@n2:4222",
                "nats://***@n1:4222,nats://***@n2:4222",
            ),
            ("nats://host:4222", "nats://host:4222"),
        ] {
            assert_eq!(without_credentials(url), shown, "{url}");
        }
    }
}
