//! The gateway's HTTP API (docs/protocol.md §6) as types: the request and response bodies of every
//! route, the error codes with their HTTP statuses, and the OpenAPI document generated from them
//! ([`openapi`]).
//!
//! One crate so that the three parties that speak this API cannot drift apart: the gateway
//! serializes these types, the `delta` CLI and the end-to-end tests' client deserialize them, and
//! the served document is derived from the same definitions (it used to be written by hand).
//!
//! The wire shapes are those the gateway sent before it had types, field for field: an optional
//! field is either always present (`null` when empty: marked "always present" below) or left
//! out when empty, exactly as before. Bodies the gateway *reads* refuse unknown fields (the API
//! parses strictly); bodies it *writes* are read tolerantly by clients, so that a newer gateway
//! may add fields. Contract types of `delta-protocol` (runs' statuses, journal events,
//! interaction requests and answers) are used as they are.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

pub use delta_protocol::{
    Change, Claim, Delegation, Escalated, EscalationStep, InteractionRequest, InteractionResponse,
    InteractionState, InteractionType, InteractionUpdate, JobKind, JournalEvent, RequestId,
    Resolved, RunId, RunStatus, Tally, Timestamp, Via,
};

pub mod events;
pub mod grants;
pub mod links;
pub mod openapi;
pub mod webhooks;

pub use grants::{GrantList, GrantView, GrantsQuery};
pub use webhooks::{RotateBody, WebhookBody, WebhookCreated, WebhookList, WebhookView};

// ---------------------------------------------------------------------------------------------
// Errors

/// Every code the API refuses with. Each has one HTTP status ([`ErrorCode::status`]); the bot
/// bridge answers on NATS with the same codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// Malformed or empty JSON, a wrong type, an unknown field or query parameter, a path id
    /// that is not a UUID, a bad `limit`, `cursor`, filter or header.
    BadRequest,
    /// Authentication is on and the bearer token is missing or unknown; or a live stream's
    /// ticket is unknown, used, expired or for another stream.
    Unauthorized,
    /// The token lacks the role this needs, or may not answer this question.
    Forbidden,
    /// No such run, interaction request, dead letter or endpoint.
    NotFound,
    /// The question was answered before (differently) or closed; the run is already over.
    AlreadyResolved,
    /// A dead letter that cannot be retried (no job, no run, or its run went on): drop it.
    NotRetryable,
    /// The question is past `expires_at`.
    Expired,
    /// The body is larger than `DELTA_MAX_BODY_BYTES`.
    PayloadTooLarge,
    /// No option, or not one of the request's options.
    InvalidOption,
    /// The answer needs a non-blank `input`.
    InputRequired,
    /// The submission or the answer's `data` is not valid (unknown agent, blank task, edited
    /// arguments the tool refuses, an `Idempotency-Key` reused for another body).
    InvalidArgs,
    /// A typed answer's `data` does not fit the request's `response_schema` (the message names
    /// the field).
    InvalidData,
    /// Redis or NATS cannot be reached (try again), or the gateway lacks what it needs.
    Unavailable,
    /// The caller is at one of its limits: runs submitted (`DELTA_SUBMIT_PER_MINUTE`), stream
    /// tickets and answer links (`DELTA_TICKETS_PER_MINUTE`), live streams, A2A push configs.
    RateLimited,
    /// The answer echoed the `request_hash` of another version of the request than the pending one.
    Stale,
    /// Someone else holds a live claim on the question.
    Claimed,
    /// The caller voted on this question before, otherwise.
    AlreadyVoted,
}

impl ErrorCode {
    /// Every code, in the order the document lists them.
    pub const ALL: [ErrorCode; 17] = [
        ErrorCode::BadRequest,
        ErrorCode::Unauthorized,
        ErrorCode::Forbidden,
        ErrorCode::NotFound,
        ErrorCode::AlreadyResolved,
        ErrorCode::NotRetryable,
        ErrorCode::Expired,
        ErrorCode::PayloadTooLarge,
        ErrorCode::InvalidOption,
        ErrorCode::InputRequired,
        ErrorCode::InvalidArgs,
        ErrorCode::InvalidData,
        ErrorCode::Unavailable,
        ErrorCode::RateLimited,
        ErrorCode::Stale,
        ErrorCode::Claimed,
        ErrorCode::AlreadyVoted,
    ];

    /// The HTTP status of this code: the one place it is decided.
    pub fn status(self) -> u16 {
        match self {
            ErrorCode::BadRequest => 400,
            ErrorCode::Unauthorized => 401,
            ErrorCode::Forbidden => 403,
            ErrorCode::NotFound => 404,
            ErrorCode::AlreadyResolved
            | ErrorCode::NotRetryable
            | ErrorCode::Stale
            | ErrorCode::Claimed
            | ErrorCode::AlreadyVoted => 409,
            ErrorCode::Expired => 410,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::InvalidOption
            | ErrorCode::InputRequired
            | ErrorCode::InvalidArgs
            | ErrorCode::InvalidData => 422,
            ErrorCode::Unavailable => 503,
            ErrorCode::RateLimited => 429,
        }
    }

    /// The wire spelling, e.g. `already_resolved`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::NotFound => "not_found",
            ErrorCode::AlreadyResolved => "already_resolved",
            ErrorCode::NotRetryable => "not_retryable",
            ErrorCode::Expired => "expired",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::InvalidOption => "invalid_option",
            ErrorCode::InputRequired => "input_required",
            ErrorCode::InvalidArgs => "invalid_args",
            ErrorCode::InvalidData => "invalid_data",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::Stale => "stale",
            ErrorCode::Claimed => "claimed",
            ErrorCode::AlreadyVoted => "already_voted",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ErrorCode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| format!("`{s}` is not an error code of this API"))
    }
}

/// A refusal: its code and a message for people (what was wrong and what to do). Also the
/// `error` of a bot's reply on NATS.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub code: ErrorCode,
    /// What was wrong and what to do; internals of a 503 are logged, not shown.
    pub message: String,
}

/// Every refusal of the API: `{"error": {"code", "message"}}` with the status of its code.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(as = Error)]
pub struct ErrorResponse {
    pub error: ErrorBody,
}

/// A bot's reply on NATS: `{"ok": true, "run_id"}` or `{"ok": false, "error": {"code", "message"}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BotReply {
    pub ok: bool,
    /// The answered question's run, when `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<RunId>,
    /// Why the answer was refused, when not `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
    /// For a vote (a question with `approvals`): `accepted` when it decided the question,
    /// `counted` when the question waits for more votes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<AnswerStatus>,
    /// Where the votes stand after this one (a question with `approvals`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tally: Option<Tally>,
}

impl BotReply {
    /// The answer was accepted for `run_id`.
    pub fn accepted(run_id: RunId) -> Self {
        Self {
            ok: true,
            run_id: Some(run_id),
            error: None,
            status: None,
            tally: None,
        }
    }

    /// A vote was counted for `run_id`: `status` says whether it decided the question.
    pub fn voted(run_id: RunId, status: AnswerStatus, tally: Tally) -> Self {
        Self {
            status: Some(status),
            tally: Some(tally),
            ..Self::accepted(run_id)
        }
    }

    /// The answer was refused.
    pub fn refused(error: ErrorBody) -> Self {
        Self {
            ok: false,
            run_id: None,
            error: Some(error),
            status: None,
            tally: None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Runs

/// `POST /v1/runs`' body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"agent": "hello", "task": "say hi"})))]
pub struct Submission {
    /// An agent directory of the gateway's agents directory (`<agents-dir>/<agent>/agent.yaml`
    /// or `config.yaml` must exist), else `422 invalid_args`.
    #[schema(pattern = "^[A-Za-z0-9_-]{1,128}$")]
    pub agent: String,
    /// Must not be blank (`422 invalid_args`).
    pub task: String,
    /// Any JSON value, kept on the run record as `input`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
}

/// `202` of `POST /v1/runs`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RunAccepted {
    pub run_id: RunId,
    /// `QUEUED` for a new run; for a repeat with the same `Idempotency-Key`, the earlier run's
    /// current status.
    pub status: RunStatus,
}

/// A run as the API shows it: its record, without what only the local CLI uses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = RunRecord)]
pub struct Run {
    pub run_id: RunId,
    pub agent: String,
    pub task: String,
    pub status: RunStatus,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// The question the run waits on; always present (`null` when none).
    #[schema(required = true)]
    pub pending_request_id: Option<RequestId>,
    /// The submission's `input`; absent when none was given, and in listings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// Absent until the run completes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// Why the run failed or was cancelled; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `GET /v1/runs`: a page of runs, newest first (without their `input`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RunPage {
    pub runs: Vec<Run>,
    /// Pass back as `cursor` for the next page; always present (`null` on the last page).
    #[schema(required = true)]
    pub next_cursor: Option<String>,
}

/// `GET /v1/runs/{run_id}`: the run record with the question it waits on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = RunWithInteraction)]
pub struct RunDetail {
    #[serde(flatten)]
    pub run: Run,
    /// The interaction named by `pending_request_id`, as `GET /v1/interactions/{request_id}`
    /// shows it (its state may already be `ANSWERED` while the run waits to resume); always
    /// present (`null` when none).
    pub pending_interaction: Option<InteractionView>,
}

/// `GET /v1/runs/{run_id}/journal`: journal events from `from_seq` on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Journal {
    pub run_id: RunId,
    pub status: RunStatus,
    pub events: Vec<JournalEvent>,
    /// The `from_seq` of the next page: the last event's `seq` + 1, else the `from_seq` given,
    /// else 1.
    pub next_seq: u64,
}

/// `POST /v1/runs/{run_id}/cancel`'s body (which may also be empty).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelBody {
    /// Journaled as `cancelled by <who>: <reason>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `200` of `POST /v1/runs/{run_id}/cancel`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CancelResult {
    pub run_id: RunId,
    pub status: RunStatus,
}

/// Data of the `status` SSE event that ends a run's event stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RunEnded {
    pub status: RunStatus,
    /// Always present (`null` when none).
    #[schema(required = true)]
    pub result: Option<String>,
    /// Always present (`null` when none).
    #[schema(required = true)]
    pub error: Option<String>,
}

/// The names of the server-sent events of the two live streams.
pub mod sse {
    /// `GET /v1/runs/{run_id}/events`: one journal event (`data` = a `JournalEvent`).
    pub const JOURNAL: &str = "journal";
    /// `GET /v1/runs/{run_id}/events`: the run is over (`data` = a `RunEnded`); the stream ends.
    pub const STATUS: &str = "status";
    /// `GET /v1/interactions/stream`: a question was asked (`data` = an `InteractionRequest`).
    pub const REQUESTED: &str = "requested";
    /// `GET /v1/interactions/stream`: a question was answered, expired or closed (`data` =
    /// `Resolved`).
    pub const RESOLVED: &str = "resolved";
    /// `GET /v1/interactions/stream`: a pending question was claimed, released, its claim
    /// broken, or a vote on it counted (`data` = `InteractionUpdate`).
    pub const UPDATED: &str = "updated";
    /// `GET /v1/interactions/stream`: a step of a question's escalation was carried out
    /// (`data` = `Escalated`).
    pub const ESCALATED: &str = "escalated";

    /// One event of a live stream as a client reads it: its `id` (to resume from), its name and
    /// its `data` lines joined.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct Event {
        pub id: Option<String>,
        pub event: String,
        pub data: String,
    }

    /// Takes the next whole event out of `buf` (the bytes received so far, `\r` already
    /// dropped), skipping comments and keep-alives; `None` until a whole event has arrived. A
    /// chunk may end inside a character or an event: what is left stays in `buf`.
    pub fn take_event(buf: &mut Vec<u8>) -> Option<Event> {
        loop {
            let end = buf.windows(2).position(|w| w == b"\n\n")?;
            let block: Vec<u8> = buf.drain(..end + 2).collect();
            let block = String::from_utf8_lossy(&block);
            let mut ev = Event::default();
            let mut data = vec![];
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    ev.id = Some(v.trim().to_owned());
                } else if let Some(v) = line.strip_prefix("event:") {
                    ev.event = v.trim().to_owned();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push(v.strip_prefix(' ').unwrap_or(v).to_owned());
                }
            }
            if ev.event.is_empty() && data.is_empty() {
                continue;
            }
            ev.data = data.join("\n");
            return Some(ev);
        }
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn events_are_taken_whole_and_comments_skipped() {
            let mut buf = b": keep-alive\n\nid: 7\nevent: journal\ndata: {\"a\":\ndata: 1}\n\nid: 8\nevent: sta"
                .to_vec();
            let ev = super::take_event(&mut buf).expect("an event");
            assert_eq!(ev.id.as_deref(), Some("7"));
            assert_eq!(
                (ev.event.as_str(), ev.data.as_str()),
                ("journal", "{\"a\":\n1}")
            );
            assert_eq!(
                super::take_event(&mut buf),
                None,
                "the rest is not whole yet"
            );
            buf.extend_from_slice(b"tus\ndata: {}\n\n");
            assert_eq!(
                super::take_event(&mut buf).expect("whole now").event,
                "status"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Interactions

/// An interaction with where it stands and its (redacted) answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct InteractionView {
    pub request_id: RequestId,
    pub run_id: RunId,
    pub agent: String,
    #[serde(rename = "type")]
    pub kind: InteractionType,
    pub state: InteractionState,
    /// The request's `timestamp`.
    pub created_at: Timestamp,
    /// Always present (`null` when the question never expires).
    #[schema(required = true)]
    pub expires_at: Option<Timestamp>,
    /// When it was answered, expired or cancelled; always present (`null` while pending).
    #[schema(required = true)]
    pub answered_at: Option<Timestamp>,
    pub request: InteractionRequest,
    /// The accepted answer, its sensitive parts as `"***"`; always present (`null` unless
    /// `ANSWERED`).
    #[schema(required = true)]
    pub response: Option<InteractionResponse>,
    /// The hash an answer may echo (`request_hash` of the answer): what this request shows.
    pub request_hash: String,
    /// Who holds a live claim on it, until when; always present (`null` when nobody does).
    #[schema(required = true)]
    pub claim: Option<Claim>,
    /// Where its votes stand (a question with `approvals`); always present (`null` otherwise).
    #[schema(required = true)]
    pub tally: Option<Tally>,
    /// How many of its `escalation` steps were carried out.
    pub escalated: u32,
    /// Who its escalation let answer besides `request.allowed_responders`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub added_responders: Vec<String>,
}

/// `GET /v1/interactions`: a page of interactions, oldest first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct InteractionPage {
    pub interactions: Vec<InteractionView>,
    /// Pass back as `cursor` for the next page; always present (`null` on the last page).
    #[schema(required = true)]
    pub next_cursor: Option<String>,
}

/// An answer as a channel receives it (`POST /v1/interactions/{request_id}/response`, and a
/// bot's message on NATS): the response fields a person or bot sets (docs/protocol.md §3). With
/// options: `option_id` is required (`422 invalid_option`) and an option with `requires_input`
/// needs a non-blank `input` (`422 input_required`). Without options: no `option_id`, and a
/// non-blank `input`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(
    json!({"input": "Ada"}),
    json!({"option_id": "other", "input": "qa-east"}),
    json!({"option_id": "approve", "data": {"args": {"env": "staging", "version": "1.4.2"}}}),
    json!({"data": {"email": "ada@example.com", "count": 3}})
))]
pub struct AnswerBody {
    /// Optional; when given it must be the request of the path or subject (`400 bad_request`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<RequestId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub option_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    /// Must be an object, with `args` an object (edited arguments of the tool call being
    /// approved) and `tasks` a list (an edited plan) when present, else `422 invalid_args`.
    /// With an approval of a tool call, `grant` (a `GrantRequest`) also approves later calls
    /// like it (docs/protocol.md "Grants and policy").
    /// For a request with a `response_schema`: the typed answer itself, e.g.
    /// `{"email": "ada@example.com", "count": 3}`, checked against the schema (`422 invalid_data`
    /// naming the field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feedback: Option<String>,
    /// Who answers. With authentication on, the token decides and a different id is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub responder: Option<ClaimedResponder>,
    /// The `request_hash` of the request as the responder saw it: another one is
    /// `409 stale` (the request changed since it was shown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_hash: Option<String>,
}

/// The body of `POST /v1/interactions/{request_id}/claim` (and of a bot's message on
/// `…interactions.claim.<request_id>`): take or renew a claim for `ttl_seconds`, or give it
/// back (`release`). An operator's `release` of someone else's claim breaks it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimBody {
    /// How long the claim lasts, 10 to 3600 seconds (default 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
    /// Give the claim back (or, for an operator, break someone else's).
    #[serde(default)]
    pub release: bool,
    /// Who claims (as for an answer: with authentication on, the token decides).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub responder: Option<ClaimedResponder>,
}

/// `200` of a claim call: the question's claim as it is now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ClaimState {
    pub request_id: RequestId,
    /// Always present (`null`: nobody holds it now).
    #[schema(required = true)]
    pub claim: Option<Claim>,
}

/// The responder a caller names.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimedResponder {
    /// With authentication on, the token's name is the responder: another id is
    /// `403 forbidden`, but for a `relay` token, which names the person of the tokens file it
    /// answers for. Off: this id (blank or absent: `anonymous`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 200)]
    pub id: Option<String>,
    /// `http` (the default) or `cli` over HTTP (the CLI says so), `slack` from a `relay` token
    /// (or with authentication off); any other value of `Via` is `400 bad_request` over HTTP.
    /// Bots on NATS are always `nats`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<Via>,
}

/// What `"status"` an accepted answer reports: `accepted` (it decided the question), or
/// `counted` (a vote on a question with `approvals` that is not decided yet).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum AnswerStatus {
    Accepted,
    Counted,
}

/// `200` of `POST /v1/interactions/{request_id}/response`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AnswerAccepted {
    pub status: AnswerStatus,
    pub run_id: RunId,
    /// Where the votes stand after this one (a question with `approvals`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tally: Option<Tally>,
}

// ---------------------------------------------------------------------------------------------
// Operations

/// A worker heard from lately.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WorkerSeen {
    pub worker_id: String,
    /// Always present (`null` when the time cannot be written).
    #[schema(required = true)]
    pub last_seen: Option<Timestamp>,
}

/// `GET /v1/queue`: JetStream figures and the workers seen.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct QueueStats {
    /// Jobs not yet delivered to a worker.
    pub jobs_pending: u64,
    /// Delivered, not yet acknowledged.
    pub jobs_in_flight: u64,
    /// Delivered more than once, not yet acknowledged.
    pub jobs_redelivered: u64,
    /// Messages in the dead-letter stream.
    pub dead_lettered: u64,
    /// Workers' pull requests waiting for a job.
    pub waiting_pulls: u64,
    /// Workers heard from in the last 30 seconds.
    pub workers: Vec<WorkerSeen>,
}

/// `GET /healthz`'s only status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum HealthStatus {
    Ok,
}

/// `GET /healthz`: `{"status": "ok"}` while the process serves HTTP.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Health {
    pub status: HealthStatus,
}

/// Whether a server answered the readiness probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Reachability {
    Ok,
    Unreachable,
}

impl Reachability {
    /// `Ok` when the probe succeeded.
    pub fn of<T, E>(probe: &Result<T, E>) -> Self {
        if probe.is_ok() {
            Reachability::Ok
        } else {
            Reachability::Unreachable
        }
    }
}

/// `GET /readyz` (`200` when both are `ok`, else `503` with this same body).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Readiness {
    pub redis: Reachability,
    pub nats: Reachability,
}

impl Readiness {
    /// Both servers answered.
    pub fn is_ready(&self) -> bool {
        self.redis == Reachability::Ok && self.nats == Reachability::Ok
    }
}

/// A job in the dead-letter stream, as `GET /v1/dlq` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(as = DeadLetter)]
pub struct DeadLetterView {
    /// Sequence in the dead-letter stream: what retry and drop name.
    pub seq: u64,
    pub agent: String,
    /// Why it was dead-lettered (`Delta-Dlq-Reason`).
    pub reason: String,
    /// Its sequence in the job stream; always present (`null` when unknown).
    #[schema(required = true)]
    pub job_seq: Option<u64>,
    pub dead_lettered_at: Timestamp,
    /// Always present (`null` when the payload is not a job).
    #[schema(required = true)]
    pub run_id: Option<RunId>,
    /// Always present (`null` when the payload is not a job).
    #[schema(required = true)]
    pub kind: Option<JobKind>,
    /// Always present (`null` unless a resume job).
    #[schema(required = true)]
    pub request_id: Option<RequestId>,
    /// The run's status now; always present (`null` when the run does not exist).
    #[schema(required = true)]
    pub run_status: Option<RunStatus>,
    /// Whether `POST /v1/dlq/{seq}/retry` would requeue it: the run is `FAILED` with this
    /// letter's reason as its error (a run that failed otherwise, or went on, is not).
    pub retryable: bool,
    /// Only when the payload is not a job: as it was, cut to 1 KiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
}

/// `GET /v1/dlq`: a page of dead letters, oldest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeadLetterPage {
    pub dead_letters: Vec<DeadLetterView>,
    /// Pass back as `cursor` for the next page; always present (`null` on the last page).
    #[schema(required = true)]
    pub next_cursor: Option<String>,
}

/// What `"status"` a retried dead letter reports: always `requeued`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum RequeuedStatus {
    Requeued,
}

/// `200` of `POST /v1/dlq/{seq}/retry`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeadLetterRetried {
    pub seq: u64,
    pub status: RequeuedStatus,
    pub run_id: RunId,
    /// The new start job's sequence in the job stream.
    pub job_seq: u64,
}

/// What `"status"` a dropped dead letter reports: always `dropped`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum DroppedStatus {
    Dropped,
}

/// `200` of `DELETE /v1/dlq/{seq}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeadLetterDropped {
    pub seq: u64,
    pub status: DroppedStatus,
}

// ---------------------------------------------------------------------------------------------
// Delegations

/// The body of `POST /v1/delegations`: until `until`, `to` may answer what `from` may.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DelegationBody {
    /// Whose authority is delegated: the caller's own (the default), or, for an operator,
    /// anyone's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Who may answer in their place (with authentication on, a token's name).
    pub to: String,
    /// Until when (at most 90 days ahead).
    pub until: Timestamp,
    /// Why (shown with it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 500)]
    pub reason: Option<String>,
}

/// `GET /v1/delegations`: the delegations in force, oldest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DelegationPage {
    pub delegations: Vec<Delegation>,
}

// ---------------------------------------------------------------------------------------------
// Query strings (parsed strictly by the gateway: an unknown parameter is `400 bad_request`)

/// `GET /v1/runs`' query.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct RunsQuery {
    /// Only runs in this status (any case); empty or absent: all. Another value:
    /// `400 bad_request`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// Only this agent's runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// Items per page (1 to 500, default 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<usize>,
    /// The `next_cursor` of the previous page; a cursor this API did not give out is
    /// `400 bad_request`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
}

/// `GET /v1/runs/{run_id}/journal`'s query.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct JournalQuery {
    /// The first `seq` wanted (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_seq: Option<u64>,
    /// Events at most (1 to 10000, default 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[param(minimum = 1, maximum = 10000)]
    pub limit: Option<usize>,
}

/// `GET /v1/interactions`' query.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct InteractionsQuery {
    /// `pending`, `answered`, `expired`, `cancelled` or `all`, any case; empty or absent:
    /// `pending`. Another value: `400 bad_request`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Only this agent's interactions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// An `InteractionType`, any case; empty or absent: every type.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Items per page (1 to 500, default 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<usize>,
    /// The `next_cursor` of the previous page; a cursor this API did not give out is
    /// `400 bad_request`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
}

/// `GET /v1/dlq`'s query.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DlqQuery {
    /// Only this agent's dead letters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// At most this many (1 to 500, default 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<usize>,
    /// `next_cursor` of the previous page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
}

/// The query of both live streams.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct StreamQuery {
    /// The first sequence wanted when there is no `Last-Event-ID`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_seq: Option<u64>,
    /// A one-time ticket from `POST /v1/stream-tickets`, for clients that cannot set headers (a
    /// browser's `EventSource`): it opens this one stream once, as the identity that asked for
    /// it, within a few seconds. The bearer token itself is never accepted in a URL (proxies log
    /// URLs): `?access_token=` is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ticket: Option<String>,
    /// On `/v1/interactions/stream`: only this agent's `requested` events (`resolved` events
    /// carry no agent and are always sent). Accepted and ignored on a run's events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

/// The live stream a ticket opens: the body of `POST /v1/stream-tickets`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "stream", rename_all = "snake_case", deny_unknown_fields)]
pub enum StreamTarget {
    /// `GET /v1/interactions/stream` (`{"stream": "interactions"}`).
    // A struct variant with no fields, not a unit variant: serde refuses unknown fields only in
    // the former.
    Interactions {},
    /// `GET /v1/runs/{run_id}/events` of this run (`{"stream": "run", "run_id": "…"}`).
    Run { run_id: RunId },
}

impl StreamTarget {
    /// The stream's name as a ticket records it: `interactions` or `run:<run_id>`.
    pub fn name(&self) -> String {
        match self {
            StreamTarget::Interactions {} => "interactions".to_owned(),
            StreamTarget::Run { run_id } => format!("run:{run_id}"),
        }
    }
}

/// A one-time stream ticket: pass it as `?ticket=` to the stream it was made for, once, before
/// `expires_at`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StreamTicket {
    /// Opaque; it opens the stream once (a second use is `401 unauthorized`).
    pub ticket: String,
    /// When it stops opening anything (`DELTA_STREAM_TICKET_TTL_S` after it was made).
    pub expires_at: Timestamp,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_target_is_read_strictly() {
        let run = RunId::new();
        let parse = |v: Value| serde_json::from_value::<StreamTarget>(v);
        assert_eq!(
            parse(serde_json::json!({"stream": "interactions"})).ok(),
            Some(StreamTarget::Interactions {})
        );
        assert_eq!(
            parse(serde_json::json!({"stream": "run", "run_id": run.to_string()})).ok(),
            Some(StreamTarget::Run { run_id: run })
        );
        for bad in [
            serde_json::json!({"stream": "run"}),
            serde_json::json!({"stream": "journal"}),
            serde_json::json!({"stream": "interactions", "extra": 1}),
            serde_json::json!({"stream": "run", "run_id": run.to_string(), "extra": 1}),
            serde_json::json!({}),
        ] {
            assert!(parse(bad.clone()).is_err(), "{bad}");
        }
        assert_eq!(
            StreamTarget::Run { run_id: run }.name(),
            format!("run:{run}")
        );
    }

    #[test]
    fn codes_are_spelled_as_on_the_wire() {
        for code in ErrorCode::ALL {
            let json = serde_json::to_value(code).expect("a code serializes");
            assert_eq!(json, code.as_str());
            assert_eq!(code.as_str().parse::<ErrorCode>(), Ok(code));
        }
    }

    fn run() -> Run {
        let at: Timestamp = "2026-11-21T10:00:00.000000Z".parse().expect("a time");
        Run {
            run_id: RunId::new(),
            agent: "hello".into(),
            task: "greet".into(),
            status: RunStatus::Queued,
            created_at: at,
            updated_at: at,
            pending_request_id: None,
            input: None,
            result: None,
            error: None,
        }
    }

    fn keys(v: &Value) -> Vec<&str> {
        let mut keys: Vec<&str> = v
            .as_object()
            .map(|m| m.keys().map(String::as_str).collect())
            .unwrap_or_default();
        keys.sort_unstable();
        keys
    }

    /// The keys each body had when the gateway wrote them with `json!`: a field is either always
    /// there (`null` when empty) or left out when empty, never both.
    #[test]
    fn bodies_keep_the_keys_the_gateway_always_sent() {
        let detail = RunDetail {
            run: run(),
            pending_interaction: None,
        };
        let v = serde_json::to_value(&detail).expect("serializes");
        assert_eq!(
            keys(&v),
            [
                "agent",
                "created_at",
                "pending_interaction",
                "pending_request_id",
                "run_id",
                "status",
                "task",
                "updated_at"
            ]
        );
        assert!(v["pending_interaction"].is_null() && v["pending_request_id"].is_null());
        let back: RunDetail = serde_json::from_value(v).expect("reads back");
        assert_eq!(back, detail);

        let page = RunPage {
            runs: vec![],
            next_cursor: None,
        };
        assert_eq!(
            serde_json::to_value(&page).expect("serializes"),
            serde_json::json!({"runs": [], "next_cursor": null})
        );

        let at = run().created_at;
        let not_a_job = DeadLetterView {
            seq: 3,
            agent: "hello".into(),
            reason: "poison".into(),
            job_seq: None,
            dead_lettered_at: at,
            run_id: None,
            kind: None,
            request_id: None,
            run_status: None,
            retryable: false,
            payload: Some("{".into()),
        };
        let v = serde_json::to_value(&not_a_job).expect("serializes");
        assert_eq!(
            keys(&v),
            [
                "agent",
                "dead_lettered_at",
                "job_seq",
                "kind",
                "payload",
                "reason",
                "request_id",
                "retryable",
                "run_id",
                "run_status",
                "seq"
            ]
        );
        let a_job = DeadLetterView {
            payload: None,
            ..not_a_job
        };
        let v = serde_json::to_value(&a_job).expect("serializes");
        assert!(v.get("payload").is_none() && v["run_id"].is_null());

        let stats = QueueStats {
            jobs_pending: 1,
            jobs_in_flight: 0,
            jobs_redelivered: 0,
            dead_lettered: 0,
            waiting_pulls: 2,
            workers: vec![WorkerSeen {
                worker_id: "w1".into(),
                last_seen: None,
            }],
        };
        assert_eq!(
            serde_json::to_value(&stats).expect("serializes")["workers"],
            serde_json::json!([{"worker_id": "w1", "last_seen": null}])
        );
        assert_eq!(
            serde_json::to_value(Readiness {
                redis: Reachability::Ok,
                nats: Reachability::Unreachable
            })
            .expect("serializes"),
            serde_json::json!({"redis": "ok", "nats": "unreachable"})
        );
    }

    /// Bodies the gateway reads refuse unknown fields, and leave absent ones out when sent.
    #[test]
    fn requests_are_strict_and_minimal() {
        let e = serde_json::from_str::<AnswerBody>(r#"{"option": "a"}"#).expect_err("unknown");
        assert!(e.to_string().contains("unknown field `option`"), "{e}");
        assert_eq!(
            serde_json::to_value(CancelBody::default()).expect("serializes"),
            serde_json::json!({})
        );
        let s = Submission {
            agent: "hello".into(),
            task: "greet".into(),
            input: None,
        };
        assert_eq!(
            serde_json::to_value(&s).expect("serializes"),
            serde_json::json!({"agent": "hello", "task": "greet"})
        );
    }

    #[test]
    fn always_present_fields_are_null_and_optional_ones_absent() {
        let ended = RunEnded {
            status: RunStatus::Completed,
            result: None,
            error: None,
        };
        assert_eq!(
            serde_json::to_value(&ended).expect("serializes"),
            serde_json::json!({"status": "COMPLETED", "result": null, "error": null})
        );
        assert_eq!(
            serde_json::to_value(BotReply::refused(ErrorBody {
                code: ErrorCode::Expired,
                message: "late".into()
            }))
            .expect("serializes"),
            serde_json::json!({"ok": false, "error": {"code": "expired", "message": "late"}})
        );
    }
}
