//! `POST /a2a`: JSON-RPC 2.0, A2A 1.0's method names and ProtoJSON shapes (camelCase fields,
//! `TASK_STATE_*` and `ROLE_*` enums), as the official SDKs send them.
//!
//! Every answer is HTTP 200 with a JSON-RPC response (the SDKs read errors only from there),
//! except a missing or unknown token: HTTP 401 with `WWW-Authenticate: Bearer`. An error's `data`
//! is a `google.rpc.ErrorInfo` whose `reason` and `metadata.code` are the gateway's error code
//! (docs/protocol.md §6), so a client learns `invalid_option` as the HTTP API would say it.
//!
//! A2A 0.3's names (`message/send`, `tasks/get`, …) are refused with a message naming the 1.0
//! method: their shapes differ (`kind` fields, lowercase states), and serving them half would be
//! worse than not at all.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use delta_api::{AnswerBody, ErrorCode, Submission};
use delta_protocol::{InteractionRequest, InteractionState, RunId, Via};

use super::task::{self, LinkFor};
use crate::Gateway;
use crate::api::caller;
use crate::auth::{Identity, Role};
use crate::error::ApiError;

/// Who may read tasks and follow them.
pub const READ: &[Role] = &[Role::Submit, Role::Answer, Role::Operate];

/// A JSON-RPC error: its code, message, and the gateway's code when there is one.
#[derive(Debug)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    pub gateway: Option<ErrorCode>,
}

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;
/// Implementation-defined: a refusal with no A2A code (forbidden, rate limited, unavailable).
pub const SERVER_ERROR: i64 = -32000;
pub const TASK_NOT_FOUND: i64 = -32001;
pub const TASK_NOT_CANCELABLE: i64 = -32002;
pub const PUSH_NOT_SUPPORTED: i64 = -32003;
pub const UNSUPPORTED_OPERATION: i64 = -32004;
pub const EXTENDED_CARD_NOT_CONFIGURED: i64 = -32007;
pub const VERSION_NOT_SUPPORTED: i64 = -32009;

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        RpcError {
            code,
            message: message.into(),
            gateway: None,
        }
    }

    pub fn params(message: impl Into<String>) -> Self {
        RpcError {
            code: INVALID_PARAMS,
            message: message.into(),
            gateway: Some(ErrorCode::BadRequest),
        }
    }

    /// The JSON-RPC `error` object.
    pub fn body(&self) -> Value {
        let mut e = json!({"code": self.code, "message": self.message});
        if let Some(code) = self.gateway {
            let code = serde_json::to_value(code)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            e["data"] = json!([{
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": code.to_uppercase(),
                "domain": "delta-fleet",
                "metadata": {"code": code},
            }]);
        }
        e
    }
}

impl From<ApiError> for RpcError {
    /// A gateway refusal, with A2A's code where it has one for it.
    fn from(e: ApiError) -> Self {
        let code = match e.code {
            ErrorCode::NotFound => TASK_NOT_FOUND,
            ErrorCode::BadRequest
            | ErrorCode::PayloadTooLarge
            | ErrorCode::InvalidOption
            | ErrorCode::InputRequired
            | ErrorCode::InvalidArgs
            | ErrorCode::InvalidData
            | ErrorCode::Stale
            | ErrorCode::AlreadyVoted => INVALID_PARAMS,
            ErrorCode::AlreadyResolved
            | ErrorCode::Expired
            | ErrorCode::Claimed
            | ErrorCode::NotRetryable => UNSUPPORTED_OPERATION,
            ErrorCode::Unavailable => INTERNAL_ERROR,
            _ => SERVER_ERROR,
        };
        RpcError {
            code,
            message: e.message,
            gateway: Some(e.code),
        }
    }
}

impl From<delta_store::Error> for RpcError {
    fn from(e: delta_store::Error) -> Self {
        ApiError::from(e).into()
    }
}

/// A JSON-RPC request.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    jsonrpc: String,
    #[serde(default)]
    id: Option<Value>,
    method: String,
    #[serde(default)]
    params: Option<Value>,
}

/// The parsed request, for the stream handlers.
pub struct Call {
    pub id: Value,
    pub method: String,
    pub params: Value,
}

pub fn response(id: &Value, result: Result<Value, RpcError>) -> Response {
    let unauthorized = matches!(&result, Err(e) if e.gateway == Some(ErrorCode::Unauthorized));
    let body = match result {
        Ok(r) => json!({"jsonrpc": "2.0", "id": id, "result": r}),
        Err(e) => json!({"jsonrpc": "2.0", "id": id, "error": e.body()}),
    };
    if unauthorized {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            axum::Json(body),
        )
            .into_response();
    }
    axum::Json(body).into_response()
}

/// A method's params, parsed strictly: the path to a wrong field is named.
pub fn params<T: DeserializeOwned>(v: Value) -> Result<T, RpcError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        RpcError::params(format!("`params.{path}`: {}", e.into_inner()))
    })
}

/// The envelope of a request: `Err` is the error to answer at once, with the id to answer it
/// under.
fn parse(bytes: Result<Bytes, BytesRejection>) -> Result<Call, (Value, RpcError)> {
    let bytes = crate::api::body_bytes(bytes).map_err(|e| {
        (
            Value::Null,
            RpcError {
                code: INVALID_REQUEST,
                message: e.message,
                gateway: Some(e.code),
            },
        )
    })?;
    let value: Value = crate::api::strict_json(&bytes).map_err(|e| {
        (
            Value::Null,
            RpcError {
                code: PARSE_ERROR,
                message: e.message,
                gateway: Some(ErrorCode::BadRequest),
            },
        )
    })?;
    let id = value.get("id").cloned().unwrap_or(Value::Null);
    let id = match id {
        Value::String(_) | Value::Number(_) | Value::Null => id,
        _ => Value::Null,
    };
    let req: Request = serde_json::from_value(value).map_err(|e| {
        (
            id.clone(),
            RpcError {
                code: INVALID_REQUEST,
                message: format!("not a JSON-RPC 2.0 request: {e}"),
                gateway: Some(ErrorCode::BadRequest),
            },
        )
    })?;
    if req.jsonrpc != "2.0" {
        return Err((
            id,
            RpcError::new(INVALID_REQUEST, "`jsonrpc` must be \"2.0\""),
        ));
    }
    if !matches!(req.id, None | Some(Value::String(_) | Value::Number(_))) {
        return Err((
            Value::Null,
            RpcError::new(INVALID_REQUEST, "`id` must be a string or a number"),
        ));
    }
    Ok(Call {
        id,
        method: req.method,
        params: req.params.unwrap_or_else(|| json!({})),
    })
}

/// A 0.3 method's 1.0 name.
fn renamed(method: &str) -> Option<&'static str> {
    Some(match method {
        "message/send" => "SendMessage",
        "message/stream" => "SendStreamingMessage",
        "tasks/get" => "GetTask",
        "tasks/cancel" => "CancelTask",
        "tasks/resubscribe" => "SubscribeToTask",
        "tasks/pushNotificationConfig/set" => "CreateTaskPushNotificationConfig",
        "tasks/pushNotificationConfig/get" => "GetTaskPushNotificationConfig",
        "tasks/pushNotificationConfig/list" => "ListTaskPushNotificationConfigs",
        "tasks/pushNotificationConfig/delete" => "DeleteTaskPushNotificationConfig",
        _ => return None,
    })
}

/// The `A2A-Version` a client asks for, if not one this server speaks.
fn unsupported_version(headers: &HeaderMap) -> Option<String> {
    let v = headers.get("a2a-version")?.to_str().unwrap_or("?").trim();
    if v.is_empty() || v == "1" || v.starts_with("1.") {
        return None;
    }
    Some(v.to_owned())
}

pub async fn endpoint(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    bytes: Result<Bytes, BytesRejection>,
) -> Response {
    let call = match parse(bytes) {
        Ok(c) => c,
        Err((id, e)) => return response(&id, Err(e)),
    };
    if let Some(v) = unsupported_version(&headers) {
        return response(
            &call.id,
            Err(RpcError::new(
                VERSION_NOT_SUPPORTED,
                format!("A2A-Version {v} is not spoken here: this server speaks A2A 1.0"),
            )),
        );
    }
    match call.method.as_str() {
        "SendStreamingMessage" | "SubscribeToTask" => {
            return super::stream::handle(gw, headers, call).await;
        }
        _ => {}
    }
    let result = dispatch(&gw, &headers, &call.method, call.params).await;
    response(&call.id, result)
}

async fn dispatch(
    gw: &Arc<Gateway>,
    headers: &HeaderMap,
    method: &str,
    p: Value,
) -> Result<Value, RpcError> {
    match method {
        "SendMessage" => send_message(gw, headers, params(p)?).await,
        "GetTask" => {
            let p: TaskQuery = params(p)?;
            let who = caller(gw, headers, READ)?;
            let id = task_id(&p.id)?;
            let link = LinkFor {
                headers,
                identity: &who,
            };
            Ok(task::snapshot(gw, id, Some(link)).await?.task)
        }
        "CancelTask" => cancel_task(gw, headers, params(p)?).await,
        "CreateTaskPushNotificationConfig" => {
            super::push::create(gw, headers, params(p)?, None).await
        }
        "GetTaskPushNotificationConfig" => super::push::get(gw, headers, params(p)?).await,
        "ListTaskPushNotificationConfigs" => super::push::list(gw, headers, params(p)?).await,
        "DeleteTaskPushNotificationConfig" => super::push::delete(gw, headers, params(p)?).await,
        "ListTasks" => Err(RpcError::new(
            UNSUPPORTED_OPERATION,
            "ListTasks is not served: list runs with GET /v1/runs",
        )),
        "GetExtendedAgentCard" => Err(RpcError::new(
            EXTENDED_CARD_NOT_CONFIGURED,
            "this agent has no extended card",
        )),
        m => match renamed(m) {
            Some(new) => Err(RpcError::new(
                METHOD_NOT_FOUND,
                format!("`{m}` is A2A 0.3; this server speaks A2A 1.0: call `{new}`"),
            )),
            None => Err(RpcError::new(
                METHOD_NOT_FOUND,
                format!("no method `{}`", m.chars().take(100).collect::<String>()),
            )),
        },
    }
}

/// A task id: a run id.
pub fn task_id(raw: &str) -> Result<RunId, RpcError> {
    raw.parse().map_err(|_| RpcError {
        code: TASK_NOT_FOUND,
        message: format!(
            "no task `{}` (a task id is a run id, a UUID)",
            raw.chars().take(100).collect::<String>()
        ),
        gateway: Some(ErrorCode::NotFound),
    })
}

/// `GetTask`, `SubscribeToTask`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TaskQuery {
    #[serde(default)]
    pub tenant: Option<String>,
    pub id: String,
    #[serde(default)]
    pub history_length: Option<i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CancelParams {
    #[serde(default)]
    #[allow(dead_code)]
    tenant: Option<String>,
    id: String,
    #[serde(default)]
    #[allow(dead_code)]
    metadata: Option<Map<String, Value>>,
}

/// A message part (ProtoJSON `Part`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Part {
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub raw: Option<String>,
    #[serde(default)]
    pub url: Option<String>,
    #[serde(default)]
    pub data: Option<Value>,
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
    #[serde(default)]
    pub filename: Option<String>,
    #[serde(default)]
    pub media_type: Option<String>,
}

/// A message (ProtoJSON `Message`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Message {
    pub message_id: String,
    #[serde(default)]
    pub context_id: Option<String>,
    #[serde(default)]
    pub task_id: Option<String>,
    #[serde(default)]
    pub role: Option<String>,
    #[serde(default)]
    pub parts: Vec<Part>,
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
    #[serde(default)]
    pub extensions: Vec<String>,
    #[serde(default)]
    pub reference_task_ids: Vec<String>,
}

/// `SendMessageConfiguration`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SendConfig {
    #[serde(default)]
    pub accepted_output_modes: Vec<String>,
    #[serde(default)]
    pub task_push_notification_config: Option<super::push::ConfigIn>,
    #[serde(default)]
    pub history_length: Option<i64>,
    #[serde(default)]
    pub return_immediately: bool,
}

/// `SendMessageRequest`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SendParams {
    #[serde(default)]
    pub tenant: Option<String>,
    pub message: Message,
    #[serde(default)]
    pub configuration: Option<SendConfig>,
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
}

/// What a message did: the run it started or answered.
pub struct Sent {
    pub run_id: RunId,
    pub wait: bool,
    /// Why the message's push config was not set, though its run started (told in the task's
    /// `metadata.pushNotificationConfigError` rather than as an error: the run is under way).
    pub push_error: Option<String>,
}

/// How long a message id is remembered with the question it answered.
const MESSAGE_TTL: std::time::Duration = std::time::Duration::from_secs(3600);

/// A caller's message id, scoped to the caller and hashed: the same id from two callers never
/// meets, and never an HTTP `Idempotency-Key`.
fn message_key(who: Option<&str>, message_id: &str) -> String {
    crate::ops::callers_key(who, message_id)
}

/// Checks a message and starts its run, or answers its task's question. The caller's identity
/// decides: `submit` to start, `answer` to answer (never a relay: A2A has no person to act for).
pub async fn accept_message(
    gw: &Arc<Gateway>,
    headers: &HeaderMap,
    p: SendParams,
) -> Result<Sent, RpcError> {
    let m = &p.message;
    if m.message_id.is_empty() || m.message_id.len() > 200 {
        return Err(RpcError::params(
            "`message.messageId` must be 1 to 200 characters",
        ));
    }
    if m.role.as_deref().is_some_and(|r| r != "ROLE_USER") {
        return Err(RpcError::params("`message.role` must be ROLE_USER"));
    }
    if m.parts.is_empty() {
        return Err(RpcError::params("`message.parts` is empty"));
    }
    if m.parts.len() > 32 {
        return Err(RpcError::params("`message.parts`: at most 32"));
    }
    for part in &m.parts {
        if part.raw.is_some() || part.url.is_some() {
            return Err(RpcError::new(
                -32005,
                "files (raw or url parts) are not taken: send text and data parts",
            ));
        }
    }
    let wait = !p
        .configuration
        .as_ref()
        .is_some_and(|c| c.return_immediately);
    let push = p
        .configuration
        .as_ref()
        .and_then(|c| c.task_push_notification_config.clone());
    // A config that would be refused is refused before the run starts or the answer is taken.
    if let Some(config) = &push {
        let who = caller(gw, headers, READ)?;
        super::push::check(gw, config, who.has(Role::Operate)).await?;
    }
    match &m.task_id {
        Some(t) if !t.is_empty() => {
            let run_id = task_id(t)?;
            // The task exists: its config is made (limits, consumer) after every check of the
            // answer and before it is taken (continue_task).
            continue_task(gw, headers, run_id, m, push).await?;
            Ok(Sent {
                run_id,
                wait,
                push_error: None,
            })
        }
        _ => {
            let run_id = start_task(gw, headers, &p).await?;
            let mut push_error = None;
            if let Some(config) = push
                && let Err(e) = super::push::create(gw, headers, config, Some(run_id)).await
            {
                push_error = Some(e.message);
            }
            Ok(Sent {
                run_id,
                wait,
                push_error,
            })
        }
    }
}

/// The skill a new message names: `message.metadata.skill`, else the request's
/// `metadata.skill`, else the fleet's only agent.
fn skill_of(gw: &Gateway, p: &SendParams) -> Result<String, RpcError> {
    let named = [p.message.metadata.as_ref(), p.metadata.as_ref()]
        .into_iter()
        .flatten()
        .find_map(|m| m.get("skill"));
    match named {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(RpcError::params("`metadata.skill` must be a string")),
        None => {
            let agents = gw.agents();
            match agents.as_slice() {
                [only] => Ok(only.name.clone()),
                _ => Err(RpcError::params(format!(
                    "name the skill to run in the message's metadata, {{\"skill\": \"<agent>\"}}: one of {}",
                    agents
                        .iter()
                        .map(|a| a.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))),
            }
        }
    }
}

async fn start_task(
    gw: &Arc<Gateway>,
    headers: &HeaderMap,
    p: &SendParams,
) -> Result<RunId, RpcError> {
    let who = caller(gw, headers, &[Role::Submit])?;
    let agent = skill_of(gw, p)?;
    let text: Vec<&str> = p
        .message
        .parts
        .iter()
        .filter_map(|part| part.text.as_deref())
        .collect();
    let data: Vec<&Value> = p
        .message
        .parts
        .iter()
        .filter_map(|part| part.data.as_ref())
        .collect();
    let input = match data.as_slice() {
        [] => None,
        [one] => Some((*one).clone()),
        _ => {
            return Err(RpcError::params(
                "at most one data part: it becomes the run's structured input",
            ));
        }
    };
    let submission = Submission {
        agent,
        task: text.join("\n"),
        input,
    };
    // The message id makes a retried message the same run, as an Idempotency-Key would; scoped
    // to the caller.
    let key = format!(
        "a2a:{}",
        message_key(who.name.as_deref(), &p.message.message_id)
    );
    let accepted = gw
        .submit(
            submission,
            Some(&key),
            who.name.as_deref(),
            who.name.as_deref(),
        )
        .await?;
    Ok(accepted.run_id)
}

/// Answers the question `run_id` waits on with message `m`.
async fn continue_task(
    gw: &Arc<Gateway>,
    headers: &HeaderMap,
    run_id: RunId,
    m: &Message,
    push: Option<super::push::ConfigIn>,
) -> Result<(), RpcError> {
    // As over HTTP: answerers and operators.
    let who: Identity = caller(gw, headers, crate::api::ANSWERERS)?;
    let record = gw.store.record(run_id).await?;
    if record.status.is_terminal() {
        return Err(RpcError {
            code: UNSUPPORTED_OPERATION,
            message: format!(
                "the task is over ({}): start a new one with a message without taskId",
                record.status.as_str()
            ),
            gateway: Some(ErrorCode::AlreadyResolved),
        });
    }
    let pending = match record.pending_request_id {
        Some(rid) => gw.store.interaction(run_id, rid).await?,
        None => None,
    };
    let Some(ix) = pending.filter(|ix| ix.state == InteractionState::Pending) else {
        return Err(RpcError {
            code: UNSUPPORTED_OPERATION,
            message: "the task is working, not waiting on a question: a message continues a task only in input-required".into(),
            gateway: Some(ErrorCode::AlreadyResolved),
        });
    };
    if ix.request.is_sensitive() {
        // Nothing of the message is logged or echoed: it may be the secret itself.
        return Err(RpcError {
            code: UNSUPPORTED_OPERATION,
            message: "the task is auth-required: its question is sensitive and is answered only in the inbox, through the one-time link in the task's status (GetTask gives a fresh one); nothing of this message was kept".into(),
            gateway: Some(ErrorCode::Forbidden),
        });
    }
    let pending_id = ix.request.request_id.to_string();
    let tie = tie_of(m)?;
    // A retried message (same messageId from the same caller) that answered an earlier question
    // is not applied to this one: it did what it did.
    let seen = message_key(who.name.as_deref(), &m.message_id);
    if let Some(before) = gw
        .store
        .a2a_message_answers(&seen, &pending_id, MESSAGE_TTL)
        .await?
        && before != pending_id
    {
        return Ok(());
    }
    if let Some(rid) = &tie.request_id
        && *rid != pending_id
    {
        let _ = gw.store.a2a_message_forget(&seen).await;
        return Err(ApiError::new(
            ErrorCode::Stale,
            format!(
                "the message answers question {}, but the task now waits on {pending_id}: read the task again and answer what it asks now",
                rid.chars().take(64).collect::<String>()
            ),
        )
        .into());
    }
    let result = async {
        let mut body = answer_of(&ix.request, &m.parts)?;
        body.request_hash = tie.request_hash;
        let responder = gw.responder(who.name.as_deref(), None, Via::A2a)?;
        // The message's push config, once the answer passed every check here: a config refused
        // leaves the answer untaken, a message refused leaves no config.
        let mut made = None;
        if let Some(config) = push {
            let existed = match config.id.as_deref() {
                Some(id) if !id.is_empty() => {
                    gw.store.a2a_push(&run_id.to_string(), id).await?.is_some()
                }
                _ => false,
            };
            let view = super::push::create(gw, headers, config, Some(run_id)).await?;
            if !existed && let Some(id) = view["id"].as_str() {
                made = Some(id.to_owned());
            }
        }
        if let Err(e) = gw
            .answer(ix.request.request_id, body, responder, who.groups())
            .await
        {
            // Refused by the answer's own checks (stale, an unknown option, a claim, answered
            // first by someone else): nothing of the message was taken, so neither is the config
            // it made. An unavailable store may have taken the answer: the config stays.
            if let Some(id) = made
                && e.code != ErrorCode::Unavailable
            {
                super::push::forget(gw, &run_id.to_string(), &id).await;
            }
            return Err(e.into());
        }
        Ok::<_, RpcError>(())
    }
    .await;
    // Kept whatever became of it: sent again while this question waits, it is tried again (an
    // answer taken is acknowledged as the same again); sent again once the task waits on another
    // question, it is not applied to that one. Forgetting a refusal would let a retry answer the
    // next question: after a refusal that stands only for now (a claim, another answer first),
    // or an error after the answer was taken (Redis's replication wait, a lost reply).
    result
}

/// Which question a message answers, as the client saw it: `request_id` and `request_hash`
/// from the answer's data part or `message.metadata` (the status message's data part carries
/// both).
#[derive(Default)]
struct Tie {
    request_id: Option<String>,
    request_hash: Option<String>,
}

/// The answer's fields a data part may have, as `POST /v1/interactions/{id}/response` takes them.
const FIELDS: [&str; 4] = ["option_id", "input", "data", "feedback"];
/// What ties an answer to its question.
const TIE: [&str; 2] = ["request_id", "request_hash"];

/// Whether data part `o` is the answer's fields (and the tie), not a typed answer: only then
/// are `request_id` and `request_hash` in it the tie (a typed answer may have such fields).
fn is_fields(o: &Map<String, Value>) -> bool {
    o.keys()
        .all(|k| FIELDS.contains(&k.as_str()) || TIE.contains(&k.as_str()))
}

fn tie_of(m: &Message) -> Result<Tie, RpcError> {
    let mut tie = Tie::default();
    let sources = m
        .parts
        .iter()
        .filter_map(|p| p.data.as_ref().and_then(Value::as_object))
        .filter(|o| is_fields(o))
        .chain(m.metadata.as_ref());
    for o in sources {
        for (field, slot) in [
            ("request_id", &mut tie.request_id),
            ("request_hash", &mut tie.request_hash),
        ] {
            match o.get(field) {
                None | Some(Value::Null) => {}
                Some(Value::String(v)) => match slot {
                    Some(s) if s != v => {
                        return Err(RpcError::params(format!(
                            "two different `{field}`s in the message"
                        )));
                    }
                    _ => *slot = Some(v.clone()),
                },
                Some(_) => return Err(RpcError::params(format!("`{field}` must be a string"))),
            }
        }
    }
    Ok(tie)
}

/// An answer to `q` from a message's parts (docs/protocols.md "A2A: answering"):
/// - a data part that is an object of only `option_id`, `input`, `data`, `feedback` is the
///   answer's fields, as `POST /v1/interactions/{id}/response` takes them;
/// - else, for a question with options, the text is an option's id or label (case-insensitive;
///   anything else is passed on as the option and refused `invalid_option`); an option with
///   `requires_input` takes the text after the first line as its input;
/// - else the text is the input, and a data part the typed answer (`response_schema`).
pub fn answer_of(q: &InteractionRequest, parts: &[Part]) -> Result<AnswerBody, RpcError> {
    let text = parts
        .iter()
        .filter_map(|p| p.text.as_deref())
        .collect::<Vec<_>>()
        .join("\n");
    // `request_id` and `request_hash` tie the answer to the question ([`tie_of`]): not part of
    // the answer; a data part of only those is no data part.
    let data: Vec<Value> = parts
        .iter()
        .filter_map(|p| p.data.as_ref())
        .filter_map(|d| match d {
            Value::Object(o) if is_fields(o) => {
                let mut o = o.clone();
                for k in TIE {
                    o.remove(k);
                }
                (!o.is_empty()).then_some(Value::Object(o))
            }
            other => Some(other.clone()),
        })
        .collect();
    if data.len() > 1 {
        return Err(RpcError::params("an answer has at most one data part"));
    }
    let mut body = AnswerBody::default();
    if let Some(Value::Object(o)) = data.first()
        && !o.is_empty()
        && o.keys().all(|k| FIELDS.contains(&k.as_str()))
    {
        body = params(Value::Object(o.clone()))?;
        if body.input.is_none() && body.option_id.is_some() && !text.trim().is_empty() {
            body.input = Some(text);
        }
        return Ok(body);
    }
    if q.options.is_empty() {
        if !text.trim().is_empty() {
            body.input = Some(text);
        }
        body.data = data.first().cloned();
        return Ok(body);
    }
    let (first, rest) = match text.trim().split_once('\n') {
        Some((a, b)) => (a.trim().to_owned(), Some(b.trim().to_owned())),
        None => (text.trim().to_owned(), None),
    };
    if first.is_empty() {
        return Err(RpcError::params(
            "name an option: its id or label as text, or a data part {\"option_id\": …}",
        ));
    }
    let option = q.options.iter().find(|o| o.option_id == first).or_else(|| {
        q.options.iter().find(|o| {
            o.option_id.eq_ignore_ascii_case(&first) || o.label.eq_ignore_ascii_case(&first)
        })
    });
    body.option_id = Some(option.map_or(first, |o| o.option_id.clone()));
    body.input = rest.filter(|r| !r.is_empty());
    body.data = data.first().cloned();
    Ok(body)
}

async fn send_message(
    gw: &Arc<Gateway>,
    headers: &HeaderMap,
    p: SendParams,
) -> Result<Value, RpcError> {
    let sent = accept_message(gw, headers, p).await?;
    let who = caller(gw, headers, READ)?;
    let link = LinkFor {
        headers,
        identity: &who,
    };
    if sent.wait {
        // Like A2A's own servers: answer once the task needs someone or is over, or after a
        // while (then it is `working` and the client polls or subscribes).
        let within = (gw.config.request_timeout / 2).min(std::time::Duration::from_secs(20));
        let _ = tokio::time::timeout(within, super::stream::settled(gw, sent.run_id)).await;
    }
    let mut snapshot = task::snapshot(gw, sent.run_id, Some(link)).await?;
    if let Some(e) = sent.push_error {
        snapshot.task["metadata"]["pushNotificationConfigError"] = json!(e);
    }
    Ok(json!({"task": snapshot.task}))
}

async fn cancel_task(
    gw: &Arc<Gateway>,
    headers: &HeaderMap,
    p: CancelParams,
) -> Result<Value, RpcError> {
    let who = caller(gw, headers, READ)?;
    let run_id = task_id(&p.id)?;
    let record = gw.store.record(run_id).await?;
    // Operators cancel any run; a submitter the runs it submitted.
    let own = who.name.is_some() && record.submitted_by == who.name;
    if !who.has(Role::Operate) && !own {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            "only an operator or the task's submitter may cancel it",
        )
        .into());
    }
    // A task over already is not cancelable, but the call still goes through the gateway's
    // cancel: a retried cancel of a cancelled run announces its end again, which the gateway
    // that cancelled it may have died before announcing (push notifications wait on it).
    let by = who.name.clone().unwrap_or_else(|| "an A2A client".into());
    match gw.cancel(run_id, &by, Some("cancelled through A2A")).await {
        Ok(_) => {}
        Err(e) if e.code == ErrorCode::AlreadyResolved => {
            return Err(RpcError {
                code: TASK_NOT_CANCELABLE,
                message: if record.status.is_terminal() {
                    format!("the task is over ({})", record.status.as_str())
                } else {
                    e.message
                },
                gateway: Some(e.code),
            });
        }
        Err(e) => return Err(e.into()),
    }
    let link = LinkFor {
        headers,
        identity: &who,
    };
    Ok(task::snapshot(gw, run_id, Some(link)).await?.task)
}

#[cfg(test)]
mod tests {
    use super::*;
    use delta_protocol::{InteractionOption, InteractionType, OptionAction};

    fn part(text: Option<&str>, data: Option<Value>) -> Part {
        Part {
            text: text.map(str::to_owned),
            raw: None,
            url: None,
            data,
            metadata: None,
            filename: None,
            media_type: None,
        }
    }

    fn question(options: &[(&str, &str)]) -> InteractionRequest {
        let mut q = InteractionRequest::new(RunId::new(), "a", InteractionType::UserChoice, "?");
        q.options = options
            .iter()
            .map(|(id, label)| InteractionOption::new(*id, *label, OptionAction::Custom))
            .collect();
        q
    }

    #[test]
    fn text_answers_a_free_question_and_names_an_option() {
        let free = question(&[]);
        let a = answer_of(&free, &[part(Some("Ada"), None)]).unwrap();
        assert_eq!(a.input.as_deref(), Some("Ada"));
        assert_eq!(a.option_id, None);
        let choice = question(&[("staging", "Staging"), ("other", "Another one")]);
        let a = answer_of(&choice, &[part(Some("another ONE"), None)]).unwrap();
        assert_eq!(a.option_id.as_deref(), Some("other"));
        let a = answer_of(&choice, &[part(Some("other\nqa-east"), None)]).unwrap();
        assert_eq!(
            (a.option_id.as_deref(), a.input.as_deref()),
            (Some("other"), Some("qa-east"))
        );
        // Not an option: passed on, for the gateway to refuse with its code.
        let a = answer_of(&choice, &[part(Some("maybe"), None)]).unwrap();
        assert_eq!(a.option_id.as_deref(), Some("maybe"));
        assert!(answer_of(&choice, &[part(Some("  "), None)]).is_err());
    }

    #[test]
    fn a_data_part_carries_the_fields_or_the_typed_answer() {
        let choice = question(&[("approve", "Approve")]);
        let a = answer_of(
            &choice,
            &[part(
                None,
                Some(json!({"option_id": "approve", "feedback": "ok"})),
            )],
        )
        .unwrap();
        assert_eq!(a.option_id.as_deref(), Some("approve"));
        assert_eq!(a.feedback.as_deref(), Some("ok"));
        let free = question(&[]);
        let a = answer_of(&free, &[part(None, Some(json!({"email": "a@b.c"})))]).unwrap();
        assert_eq!(a.data, Some(json!({"email": "a@b.c"})));
        assert!(answer_of(&free, &[part(None, Some(json!({"option_id": 3})))]).is_err());
    }

    fn message(parts: Vec<Part>, metadata: Option<Value>) -> Message {
        Message {
            message_id: "m".into(),
            context_id: None,
            task_id: None,
            role: None,
            parts,
            metadata: metadata.and_then(|m| m.as_object().cloned()),
            extensions: vec![],
            reference_task_ids: vec![],
        }
    }

    #[test]
    fn the_question_an_answer_is_tied_to_is_read_and_is_no_part_of_the_answer() {
        let tie = json!({"request_id": "r1", "request_hash": "h1"});
        let parts = vec![part(Some("Ada"), Some(tie.clone()))];
        let t = tie_of(&message(vec![part(Some("Ada"), Some(tie))], None)).unwrap();
        assert_eq!(
            (t.request_id.as_deref(), t.request_hash.as_deref()),
            (Some("r1"), Some("h1"))
        );
        // A data part of only the tie is no data part: the text is the answer.
        let a = answer_of(&question(&[]), &parts).unwrap();
        assert_eq!((a.input.as_deref(), a.data), (Some("Ada"), None));
        // A typed answer with a `request_id` field of its own keeps it, and ties nothing.
        let typed = json!({"request_id": "mine", "email": "a@b.c"});
        let t = tie_of(&message(vec![part(None, Some(typed.clone()))], None)).unwrap();
        assert_eq!(t.request_id, None);
        let a = answer_of(&question(&[]), &[part(None, Some(typed.clone()))]).unwrap();
        assert_eq!(a.data, Some(typed));
        let t = tie_of(&message(vec![], Some(json!({"request_id": "r2"})))).unwrap();
        assert_eq!(t.request_id.as_deref(), Some("r2"));
        // Two different ones, or not a string: refused.
        let two = message(
            vec![part(None, Some(json!({"request_id": "r1"})))],
            Some(json!({"request_id": "r2"})),
        );
        assert!(tie_of(&two).is_err());
        assert!(tie_of(&message(vec![], Some(json!({"request_hash": 3})))).is_err());
    }

    #[test]
    fn message_ids_are_scoped_to_the_caller() {
        assert_ne!(message_key(Some("a"), "m"), message_key(Some("b"), "m"));
        assert_ne!(message_key(None, "m"), message_key(Some("a"), "m"));
        assert_eq!(message_key(Some("a"), "m"), message_key(Some("a"), "m"));
        assert_eq!(message_key(Some("a"), &"x".repeat(200)).len(), 32);
    }

    #[test]
    fn errors_carry_the_gateway_code_and_a2a_codes() {
        let e: RpcError = ApiError::new(ErrorCode::InvalidOption, "no").into();
        assert_eq!(e.code, INVALID_PARAMS);
        let b = e.body();
        assert_eq!(b["data"][0]["metadata"]["code"], "invalid_option");
        let e: RpcError = ApiError::not_found("x").into();
        assert_eq!(e.code, TASK_NOT_FOUND);
    }
}
