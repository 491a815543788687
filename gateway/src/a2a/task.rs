//! A run as an A2A task, read from the store every time (no second copy of run state).
//!
//! | run / question                                  | A2A `TaskState`              |
//! |-------------------------------------------------|------------------------------|
//! | `QUEUED`                                        | `TASK_STATE_SUBMITTED`       |
//! | `RUNNING`, `INTERRUPTED` (a worker resumes it)  | `TASK_STATE_WORKING`         |
//! | `WAITING_FOR_INPUT`, question pending           | `TASK_STATE_INPUT_REQUIRED`  |
//! | `WAITING_FOR_INPUT`, question pending, sensitive| `TASK_STATE_AUTH_REQUIRED`   |
//! | `WAITING_FOR_INPUT`, question answered/closed   | `TASK_STATE_WORKING`         |
//! | `COMPLETED` / `FAILED` / `CANCELLED`            | `COMPLETED` / `FAILED` / `CANCELED` |
//!
//! The task id and the context id are the run id.

use axum::http::HeaderMap;
use serde_json::{Value, json};

use delta_protocol::{InteractionRequest, InteractionState, RunId, RunStatus};

use crate::Gateway;
use crate::auth::Identity;
use crate::error::ApiError;

/// A task's state, as A2A spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Submitted,
    Working,
    InputRequired,
    AuthRequired,
    Completed,
    Failed,
    Canceled,
}

impl State {
    pub fn wire(self) -> &'static str {
        match self {
            State::Submitted => "TASK_STATE_SUBMITTED",
            State::Working => "TASK_STATE_WORKING",
            State::InputRequired => "TASK_STATE_INPUT_REQUIRED",
            State::AuthRequired => "TASK_STATE_AUTH_REQUIRED",
            State::Completed => "TASK_STATE_COMPLETED",
            State::Failed => "TASK_STATE_FAILED",
            State::Canceled => "TASK_STATE_CANCELED",
        }
    }

    /// The run is over.
    pub fn is_terminal(self) -> bool {
        matches!(self, State::Completed | State::Failed | State::Canceled)
    }

    /// The run waits on someone (a stream ends here, as A2A's own servers end theirs).
    pub fn is_interrupted(self) -> bool {
        matches!(self, State::InputRequired | State::AuthRequired)
    }
}

/// Whom a one-time answer link is made for: the request's headers (for the gateway's address)
/// and the caller. Without it (a push notification) an `auth-required` status carries no link.
#[derive(Clone, Copy)]
pub struct LinkFor<'a> {
    pub headers: &'a HeaderMap,
    pub identity: &'a Identity,
}

/// A task as read now, with what changes when it moves on.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub state: State,
    /// The pending question's id (interrupted states only).
    pub request_id: Option<String>,
    /// The task as A2A's JSON (`Task`).
    pub task: Value,
}

impl Snapshot {
    /// What a client sees change: the state and the question.
    pub fn key(&self) -> (State, Option<String>) {
        (self.state, self.request_id.clone())
    }

    /// The task's `TaskStatusUpdateEvent`.
    pub fn status_update(&self) -> Value {
        json!({
            "taskId": self.task["id"],
            "contextId": self.task["contextId"],
            "status": self.task["status"],
            "metadata": self.task["metadata"],
        })
    }
}

fn text_part(text: impl Into<String>) -> Value {
    json!({"text": text.into(), "mediaType": "text/plain"})
}

fn data_part(data: Value) -> Value {
    json!({"data": data, "mediaType": "application/json"})
}

fn agent_message(run_id: RunId, message_id: String, parts: Vec<Value>) -> Value {
    json!({
        "messageId": message_id,
        "taskId": run_id.to_string(),
        "contextId": run_id.to_string(),
        "role": "ROLE_AGENT",
        "parts": parts,
    })
}

/// The question as the status message's text: the prompt, details and options, and how to
/// answer.
fn question_text(q: &InteractionRequest) -> String {
    let mut text = String::new();
    if let Some(t) = q.title.as_deref().filter(|t| !t.trim().is_empty()) {
        text.push_str(t);
        text.push_str("\n\n");
    }
    text.push_str(&q.prompt);
    if let Some(d) = q.details.as_deref().filter(|d| !d.trim().is_empty()) {
        text.push_str("\n\n");
        text.push_str(d);
    }
    if q.options.is_empty() {
        text.push_str("\n\nAnswer with a message on this task: its text is the answer.");
    } else {
        text.push_str("\n\nOptions:");
        for o in &q.options {
            text.push_str(&format!("\n- {} ({})", o.option_id, o.label));
            if let Some(d) = &o.description {
                text.push_str(&format!(": {d}"));
            }
            if o.requires_input {
                text.push_str(" [needs text: send a data part {\"option_id\", \"input\"}]");
            }
        }
        text.push_str(
            "\n\nAnswer with a message on this task: an option's id (or label) as text, or a data part {\"option_id\": …, \"input\": …, \"data\": …, \"feedback\": …}.",
        );
    }
    text
}

/// The question as the status message's data part.
fn question_data(q: &InteractionRequest) -> Value {
    let options: Vec<Value> = q
        .options
        .iter()
        .map(|o| {
            json!({
                "option_id": o.option_id,
                "label": o.label,
                "description": o.description,
                "action": o.action,
                "requires_input": o.requires_input,
                "input_prompt": o.input_prompt,
                "is_dangerous": o.is_dangerous,
                "is_default": o.is_default,
            })
        })
        .collect();
    json!({
        "request_id": q.request_id.to_string(),
        // Echoed in the answer (docs/protocols.md "A2A: answering"): an answer to a question
        // that changed since is refused `stale`.
        "request_hash": q.shown_hash(),
        "type": q.kind,
        "prompt": q.prompt,
        "title": q.title,
        "details": q.details,
        "input_type": q.input_type.as_str(),
        "sensitive": q.is_sensitive(),
        "options": options,
        "default_option_id": q.default_option_id,
        "response_schema": q.response_schema,
        "expires_at": q.expires_at.map(|t| t.to_string()),
        "context": q.context,
    })
}

/// The status of a task waiting on question `q`: `input-required` with the question as text and
/// data, or, for a sensitive question, `auth-required` with the inbox link `url`: `Ok(None)` when
/// none was asked for (a push notification, a caller that may not answer), `Err(why)` when it
/// could not be made (the task is still given, with why).
pub fn question_status(
    run_id: RunId,
    q: &InteractionRequest,
    url: Result<Option<String>, String>,
) -> (State, Value) {
    if q.is_sensitive() {
        let text = match &url {
            Ok(Some(u)) => format!(
                "{}\n\nThis question is sensitive: its answer is never taken through A2A. Open this one-time link to answer it in the inbox: {u}",
                q.prompt
            ),
            Ok(None) => format!(
                "{}\n\nThis question is sensitive: its answer is never taken through A2A. Get a one-time inbox link with GetTask, or answer it in the inbox.",
                q.prompt
            ),
            Err(why) => format!(
                "{}\n\nThis question is sensitive: its answer is never taken through A2A, and no one-time inbox link could be made for it ({why}). Answer it in the inbox.",
                q.prompt
            ),
        };
        let mut data = question_data(q);
        match url {
            Ok(u) => data["url"] = json!(u),
            Err(why) => {
                data["url"] = Value::Null;
                data["link_error"] = json!(why);
            }
        }
        return (
            State::AuthRequired,
            agent_message(
                run_id,
                q.request_id.to_string(),
                vec![text_part(text), data_part(data)],
            ),
        );
    }
    (
        State::InputRequired,
        agent_message(
            run_id,
            q.request_id.to_string(),
            vec![text_part(question_text(q)), data_part(question_data(q))],
        ),
    )
}

/// The status of a run that ended `status` (or, for one that did not, `working`).
pub fn ended_status(
    run_id: RunId,
    status: RunStatus,
    result: Option<String>,
    error: Option<String>,
) -> (State, Option<Value>) {
    let (state, id, text) = match status {
        RunStatus::Completed => (State::Completed, "result", result.unwrap_or_default()),
        RunStatus::Failed => (
            State::Failed,
            "error",
            error.unwrap_or_else(|| "the run failed".into()),
        ),
        RunStatus::Cancelled => (
            State::Canceled,
            "cancelled",
            error.unwrap_or_else(|| "the run was cancelled".into()),
        ),
        RunStatus::Queued => return (State::Submitted, None),
        _ => return (State::Working, None),
    };
    (
        state,
        Some(agent_message(
            run_id,
            format!("{run_id}-{id}"),
            vec![text_part(text)],
        )),
    )
}

/// The run `run_id` as a task. `link`: for whom to make a one-time inbox link when it waits on a
/// sensitive question.
pub async fn snapshot(
    gw: &Gateway,
    run_id: RunId,
    link: Option<LinkFor<'_>>,
) -> Result<Snapshot, ApiError> {
    let record = gw.store.record(run_id).await?;
    let mut pending = None;
    if record.status == RunStatus::WaitingForInput
        && let Some(rid) = record.pending_request_id
        && let Some(ix) = gw.store.interaction(run_id, rid).await?
        && ix.state == InteractionState::Pending
    {
        pending = Some(ix.request);
    }
    let mut artifacts = vec![];
    let (state, message) = match record.status {
        RunStatus::Queued => (State::Submitted, None),
        RunStatus::Running | RunStatus::Interrupted => (State::Working, None),
        RunStatus::WaitingForInput => match &pending {
            None => (State::Working, None),
            Some(q) => {
                // A sensitive question is never answered through A2A: the secret goes to the
                // inbox, through a one-time link made for the caller.
                // A link that cannot be made (a plain-HTTP gateway reached by a name other
                // than loopback, without `DELTA_PUBLIC_URL`) does not hide the task: it is
                // given without one, saying why.
                let url = match link {
                    Some(l) if q.is_sensitive() => {
                        super::link::answer_link(gw, l.headers, l.identity, run_id, q.request_id)
                            .await
                            .map_err(|e| {
                                tracing::debug!(%run_id, error = %e, "no answer link for a task");
                                e.message
                            })
                    }
                    _ => Ok(None),
                };
                let (state, message) = question_status(run_id, q, url);
                (state, Some(message))
            }
        },
        status => {
            if status == RunStatus::Completed {
                artifacts.push(json!({
                    "artifactId": "result",
                    "name": "result",
                    "parts": [text_part(record.result.clone().unwrap_or_default())],
                }));
            }
            ended_status(run_id, status, record.result.clone(), record.error.clone())
        }
    };
    let mut status = json!({
        "state": state.wire(),
        "timestamp": record.updated_at.to_string(),
    });
    if let Some(m) = message {
        status["message"] = m;
    }
    let request_id = if state.is_interrupted() {
        pending.as_ref().map(|q| q.request_id.to_string())
    } else {
        None
    };
    let task = json!({
        "id": run_id.to_string(),
        "contextId": run_id.to_string(),
        "status": status,
        "artifacts": artifacts,
        "history": [],
        "metadata": {
            "agent": record.agent,
            "runStatus": record.status.as_str(),
            "requestId": request_id,
            "createdAt": record.created_at.to_string(),
        },
    });
    Ok(Snapshot {
        state,
        request_id,
        task,
    })
}
