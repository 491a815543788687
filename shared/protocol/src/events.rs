//! The fleet's events as CloudEvents 1.0 in structured JSON mode (docs/protocol.md §4, "Events";
//! a JSON Schema per type in docs/events/). Everything the fleet publishes on its event subjects
//! is one of these: the envelope's attributes say what happened, where and when; `data` is the
//! protocol's own shape (the request, the resolved announcement, the update, the escalation
//! step, the finished run).
//!
//! ```json
//! {"specversion": "1.0", "id": "requested:0193…", "source": "/delta/delta/agents/deployer",
//!  "type": "dev.delta.interaction.requested", "subject": "runs/0193…/interactions/0193…",
//!  "time": "2026-11-24T10:00:00.123456Z", "datacontenttype": "application/json",
//!  "deltaagent": "deployer", "deltarun": "0193…", "deltarequest": "0193…", "data": {…}}
//! ```
//!
//! `id` is deterministic (a question's announcement, its settling, an escalation step, a run's
//! end are each announced under one id however often they are announced), so a consumer that
//! sees the same `source` and `id` twice has seen the same event twice.

use std::fmt;
use std::str::FromStr;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{
    Escalated, InteractionRequest, InteractionState, InteractionUpdate, RequestId, Resolved, RunId,
    RunStatus, Timestamp,
};

/// The CloudEvents version of every event.
pub const SPEC_VERSION: &str = "1.0";
/// The media type of `data`.
pub const DATA_CONTENT_TYPE: &str = "application/json";
/// The media type of a whole event in structured mode (a webhook's `Content-Type`).
pub const STRUCTURED_CONTENT_TYPE: &str = "application/cloudevents+json";

/// What happened. `type` is `dev.delta.<name>`; webhooks subscribe by `<name>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventType {
    /// A run paused on a question (`data`: the interaction request).
    InteractionRequested,
    /// Someone answered it, or a quorum decided it (`data`: the resolved announcement).
    InteractionAnswered,
    /// Its deadline passed (`data`: the resolved announcement; `option_id` is the default
    /// applied, or `null`).
    InteractionExpired,
    /// Its run was cancelled while it waited (`data`: the resolved announcement).
    InteractionCancelled,
    /// A claim taken, given back or broken, or a vote counted (`data`: the update).
    InteractionUpdated,
    /// An escalation step was carried out (`data`: the step).
    InteractionEscalated,
    /// A run ended `COMPLETED` (`data`: the finished run).
    RunCompleted,
    /// A run ended `FAILED`.
    RunFailed,
    /// A run ended `CANCELLED`.
    RunCancelled,
}

impl EventType {
    pub const ALL: [EventType; 9] = [
        EventType::InteractionRequested,
        EventType::InteractionAnswered,
        EventType::InteractionExpired,
        EventType::InteractionCancelled,
        EventType::InteractionUpdated,
        EventType::InteractionEscalated,
        EventType::RunCompleted,
        EventType::RunFailed,
        EventType::RunCancelled,
    ];

    /// The short name (`interaction.requested`), as webhooks subscribe to it.
    pub fn name(self) -> &'static str {
        match self {
            EventType::InteractionRequested => "interaction.requested",
            EventType::InteractionAnswered => "interaction.answered",
            EventType::InteractionExpired => "interaction.expired",
            EventType::InteractionCancelled => "interaction.cancelled",
            EventType::InteractionUpdated => "interaction.updated",
            EventType::InteractionEscalated => "interaction.escalated",
            EventType::RunCompleted => "run.completed",
            EventType::RunFailed => "run.failed",
            EventType::RunCancelled => "run.cancelled",
        }
    }

    /// The CloudEvents `type`: `dev.delta.` and the short name.
    pub fn ce_type(self) -> String {
        format!("dev.delta.{}", self.name())
    }

    /// The type of a CloudEvents `type` attribute, if it is one of the fleet's.
    pub fn from_ce_type(ty: &str) -> Option<EventType> {
        ty.strip_prefix("dev.delta.").and_then(|n| n.parse().ok())
    }

    /// The event that settling a question in `state` is.
    pub fn resolved(state: InteractionState) -> EventType {
        match state {
            InteractionState::Expired => EventType::InteractionExpired,
            InteractionState::Cancelled => EventType::InteractionCancelled,
            InteractionState::Answered | InteractionState::Pending => {
                EventType::InteractionAnswered
            }
        }
    }

    /// The event of a run ending in `status`, if it is terminal.
    pub fn run_ended(status: RunStatus) -> Option<EventType> {
        match status {
            RunStatus::Completed => Some(EventType::RunCompleted),
            RunStatus::Failed => Some(EventType::RunFailed),
            RunStatus::Cancelled => Some(EventType::RunCancelled),
            _ => None,
        }
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for EventType {
    type Err = String;
    /// The short name (`run.completed`); the full `type` (`dev.delta.run.completed`) too.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let short = s.strip_prefix("dev.delta.").unwrap_or(s);
        EventType::ALL
            .into_iter()
            .find(|t| t.name() == short)
            .ok_or_else(|| {
                let names: Vec<&str> = EventType::ALL.iter().map(|t| t.name()).collect();
                format!("`{s}` is not an event type (one of: {})", names.join(", "))
            })
    }
}

/// What `run.completed`, `run.failed` and `run.cancelled` carry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunFinished {
    pub run_id: RunId,
    pub agent: String,
    pub status: RunStatus,
    /// The run's result (`COMPLETED`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// Why it failed or was cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Who submitted it (with authentication on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_by: Option<String>,
    pub created_at: Timestamp,
    pub ended_at: Timestamp,
}

/// One event: the CloudEvents envelope around `data`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CloudEvent<T = Value> {
    pub specversion: String,
    /// Unique within `source`; the same for the same event announced twice.
    pub id: String,
    /// `/delta/<prefix>/agents/<agent>`: the fleet (its key prefix) and the agent.
    pub source: String,
    /// `dev.delta.<name>` (see [`EventType`]).
    #[serde(rename = "type")]
    pub ty: String,
    /// `runs/<run_id>`, or `runs/<run_id>/interactions/<request_id>` for a question's events.
    pub subject: String,
    /// When it happened.
    pub time: Timestamp,
    pub datacontenttype: String,
    /// Extension: the agent.
    pub deltaagent: String,
    /// Extension: the run.
    pub deltarun: RunId,
    /// Extension: the question, for an interaction's events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deltarequest: Option<RequestId>,
    /// Extension (CloudEvents Distributed Tracing): the run's W3C trace context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    pub data: T,
}

impl<T> CloudEvent<T> {
    /// The fleet's type of this event, if `type` is one.
    pub fn event_type(&self) -> Option<EventType> {
        EventType::from_ce_type(&self.ty)
    }
}

/// Where events of `agent` come from in the fleet whose key prefix is `prefix`.
pub fn source(prefix: &str, agent: &str) -> String {
    format!("/delta/{prefix}/agents/{agent}")
}

fn subject(run: RunId, request: Option<RequestId>) -> String {
    match request {
        Some(r) => format!("runs/{run}/interactions/{r}"),
        None => format!("runs/{run}"),
    }
}

#[allow(clippy::too_many_arguments)]
fn envelope<T>(
    prefix: &str,
    ty: EventType,
    id: String,
    agent: &str,
    run: RunId,
    request: Option<RequestId>,
    time: Timestamp,
    traceparent: Option<&str>,
    data: T,
) -> CloudEvent<T> {
    CloudEvent {
        specversion: SPEC_VERSION.to_owned(),
        id,
        source: source(prefix, agent),
        ty: ty.ce_type(),
        subject: subject(run, request),
        time,
        datacontenttype: DATA_CONTENT_TYPE.to_owned(),
        deltaagent: agent.to_owned(),
        deltarun: run,
        deltarequest: request,
        traceparent: traceparent.map(str::to_owned),
        data,
    }
}

/// `interaction.requested`. `id` is `requested:<request_id>`, or with a suffix when the question
/// is announced again after it was reopened (a new question for whoever answers).
pub fn requested<'a>(
    prefix: &str,
    q: &'a InteractionRequest,
    again_at: Option<Timestamp>,
    traceparent: Option<&str>,
) -> CloudEvent<&'a InteractionRequest> {
    let id = match again_at {
        Some(at) => format!("requested:{}:{}", q.request_id, at.micros()),
        None => format!("requested:{}", q.request_id),
    };
    envelope(
        prefix,
        EventType::InteractionRequested,
        id,
        &q.agent,
        q.run_id,
        Some(q.request_id),
        q.timestamp,
        traceparent,
        q,
    )
}

/// `interaction.answered`, `.expired` or `.cancelled`, by the resolved state. `id` is
/// `resolved:<request_id>:<µs of resolved_at>` (the instant the store keeps as the question's
/// `answered_at`, so whoever announces it again uses the same id; a question the engine reopened
/// and that was settled again is another event).
pub fn resolved<'a>(
    prefix: &str,
    agent: &str,
    r: &'a Resolved,
    traceparent: Option<&str>,
) -> CloudEvent<&'a Resolved> {
    envelope(
        prefix,
        EventType::resolved(r.state),
        format!("resolved:{}:{}", r.request_id, r.resolved_at.micros()),
        agent,
        r.run_id,
        Some(r.request_id),
        r.resolved_at,
        traceparent,
        r,
    )
}

/// `interaction.updated`. `id` is `updated:<request_id>:<change>:<by>:<µs>`.
pub fn updated<'a>(prefix: &str, u: &'a InteractionUpdate) -> CloudEvent<&'a InteractionUpdate> {
    let change = serde_json::to_value(u.change)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    envelope(
        prefix,
        EventType::InteractionUpdated,
        format!(
            "updated:{}:{change}:{}:{}",
            u.request_id,
            u.by,
            u.at.micros()
        ),
        &u.agent,
        u.run_id,
        Some(u.request_id),
        u.at,
        None,
        u,
    )
}

/// `interaction.escalated`. `id` is `escalated:<request_id>:<step>`.
pub fn escalated<'a>(prefix: &str, e: &'a Escalated) -> CloudEvent<&'a Escalated> {
    envelope(
        prefix,
        EventType::InteractionEscalated,
        format!("escalated:{}:{}", e.request_id, e.step),
        &e.agent,
        e.run_id,
        Some(e.request_id),
        e.at,
        None,
        e,
    )
}

/// `run.completed`, `run.failed` or `run.cancelled`; `None` for a status that is not terminal.
/// `id` is `<status>:<run_id>:<µs of its end>`: the same whoever announces that end, and
/// another for a failed run that a dead-letter retry revived and that ended again.
pub fn run_ended<'a>(
    prefix: &str,
    r: &'a RunFinished,
    traceparent: Option<&str>,
) -> Option<CloudEvent<&'a RunFinished>> {
    let ty = EventType::run_ended(r.status)?;
    let status = ty.name().trim_start_matches("run.");
    Some(envelope(
        prefix,
        ty,
        format!("{status}:{}:{}", r.run_id, r.ended_at.micros()),
        &r.agent,
        r.run_id,
        None,
        r.ended_at,
        traceparent,
        r,
    ))
}

/// Why bytes are not one of the fleet's events.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("not a CloudEvent in structured JSON mode: {0}")]
    Json(#[from] serde_json::Error),
    #[error("CloudEvents specversion `{0}` (this fleet speaks 1.0)")]
    Version(String),
}

/// Reads an event, checking its envelope; `data` as `T`.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<CloudEvent<T>, DecodeError> {
    let event: CloudEvent<T> = serde_json::from_slice(bytes)?;
    if event.specversion != SPEC_VERSION {
        return Err(DecodeError::Version(event.specversion));
    }
    Ok(event)
}

/// The JSON text of an event (its fields are plain data: this cannot fail).
pub fn encode<T: Serialize>(event: &CloudEvent<T>) -> Vec<u8> {
    serde_json::to_vec(event).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_ones_are_refused_by_name() {
        for t in EventType::ALL {
            assert_eq!(t.name().parse::<EventType>(), Ok(t));
            assert_eq!(EventType::from_ce_type(&t.ce_type()), Some(t));
        }
        let err = "interaction.deleted".parse::<EventType>().unwrap_err();
        assert!(err.contains("interaction.deleted") && err.contains("run.failed"));
        assert_eq!(EventType::from_ce_type("com.example.x"), None);
    }

    #[test]
    fn a_run_end_is_an_event_only_when_terminal() {
        let mut r = RunFinished {
            run_id: RunId::new(),
            agent: "hello".into(),
            status: RunStatus::Running,
            result: None,
            error: None,
            submitted_by: None,
            created_at: Timestamp::now(),
            ended_at: Timestamp::now(),
        };
        assert!(run_ended("delta", &r, None).is_none());
        r.status = RunStatus::Failed;
        let e = run_ended("delta", &r, None).unwrap();
        assert_eq!(e.ty, "dev.delta.run.failed");
        assert_eq!(e.id, format!("failed:{}:{}", r.run_id, r.ended_at.micros()));
        assert_eq!(e.subject, format!("runs/{}", r.run_id));
        assert_eq!(e.source, "/delta/delta/agents/hello");
        let back: CloudEvent<RunFinished> = decode(&encode(&e)).unwrap();
        assert_eq!(back.data, r);
        assert_eq!(back.event_type(), Some(EventType::RunFailed));
        assert!(back.deltarequest.is_none());
    }

    #[test]
    fn another_spec_version_is_refused() {
        let mut v = serde_json::json!({
            "specversion": "0.3", "id": "x", "source": "/s", "type": "dev.delta.run.failed",
            "subject": "runs/x", "time": "2026-11-24T10:00:00.000000Z",
            "datacontenttype": "application/json", "deltaagent": "a",
            "deltarun": RunId::new(), "data": {}
        });
        let bytes = serde_json::to_vec(&v).unwrap();
        assert!(matches!(
            decode::<Value>(&bytes),
            Err(DecodeError::Version(v)) if v == "0.3"
        ));
        v["specversion"] = "1.0".into();
        assert!(decode::<Value>(&serde_json::to_vec(&v).unwrap()).is_ok());
    }
}
