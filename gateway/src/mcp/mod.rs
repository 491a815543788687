//! The MCP server at `/mcp` (docs/protocols.md "MCP"): the fleet's agents as tools, their
//! runs as tasks, their questions as elicitations, runs and questions as resources. Built on
//! the official Rust SDK (`rmcp`), over streamable HTTP, with the gateway's authentication.
//!
//! Nothing is kept here: a tool call is a run in the store, a task's id is the run's id, an
//! input request's key is the question's request id, and the request state a client echoes
//! names the run. Any gateway of the fleet serves any request (the SDK serves the 2026
//! protocol statelessly; older protocol versions are served without sessions too).
//!
//! - `tools/call` submits a run as the caller. A client that declared the tasks extension
//!   (`io.modelcontextprotocol/tasks`) gets a task at once; any other waits for the run to end
//!   or to ask (at most [`WAIT`] per round): a question comes back as an `input_required`
//!   result (MRTR) with the question as an elicitation, and the client's retry answers it
//!   through the gateway's one answer path, as the client, `via: mcp`. A call given an
//!   idempotency key ([`IDEMPOTENCY_META`] in `_meta`, or the `Idempotency-Key` header) and
//!   retried gets the first call's run.
//! - `tasks/get` maps the run's state (`working`, `input_required` with the question,
//!   `completed`, `cancelled`); `tasks/update` answers; `tasks/cancel` cancels (operators).
//! - Resources: `delta://runs/{run_id}` and `delta://interactions/{request_id}`.

pub mod elicit;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, header};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, GetTaskParams, GetTaskResult,
    InitializeResult, ListResourceTemplatesResult, ListResourcesResult, ListToolsResult,
    PaginatedRequestParams, ProtocolVersion, ReadResourceRequestParams, ReadResourceResponse,
    ServerCapabilities, UpdateTaskParams,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use delta_api::{ClaimedResponder, ErrorCode, RunDetail, Submission};
use delta_protocol::{InteractionState, RequestId, RunId, RunStatus, Via};
use delta_store::RunRecord;
use delta_store::redis::StoredInteraction;

use crate::Gateway;
use crate::auth::{Identity, Role};
use crate::error::ApiError;
use crate::ops::interaction_view;

/// How long one tool call (one round) waits for its run to end or ask before it answers
/// `input_required` with only its state, for the client to call again.
pub const WAIT: Duration = Duration::from_secs(20);
/// The `_meta` key of `tools/call` that names a call's idempotency key: a call retried with the
/// same key (after a reply lost with its connection) gets the run the first one started. The
/// HTTP header `Idempotency-Key` on the request does the same.
pub const IDEMPOTENCY_META: &str = "dev.delta/idempotency-key";
/// How often a task's client is asked to poll.
const POLL_MS: u64 = 1000;
/// How long one call of a client of an older protocol version (asked within its call) lasts
/// at most; its session is kept as long while it waits.
pub const LEGACY_CALL: Duration = Duration::from_secs(3600);

const READ: &[Role] = &[Role::Submit, Role::Answer, Role::Operate];
const ANSWERERS: &[Role] = &[Role::Answer, Role::Operate];

/// The `/mcp` routes: the SDK's streamable HTTP service behind the gateway's token check.
pub fn router(gw: Arc<Gateway>) -> Router<Arc<Gateway>> {
    // The 2026 protocol has no sessions: any gateway answers any request, and nothing lives in
    // memory. Clients of older versions get a session (in this gateway's memory, for the
    // elicitation requests sent within their calls), so a load balancer must keep them on one
    // gateway (docs/protocols.md). Host and Origin are the gateway's own checks
    // (api::not_from_other_sites), the same for every route; tokens keep the rest out.
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(true)
        .with_json_response(false)
        .with_cancellation_token(gw.shutdown.child_token())
        .with_max_request_body_bytes(gw.config.max_body_bytes)
        .disable_allowed_hosts();
    let server = gw.clone();
    // A session outlives the longest call it may hold (rmcp's default would end it after five
    // quiet minutes, while a person takes their time).
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.keep_alive = Some(LEGACY_CALL + Duration::from_secs(60));
    let service = StreamableHttpService::new(
        move || Ok(McpServer { gw: server.clone() }),
        Arc::new(sessions),
        config,
    );
    Router::new()
        .nest_service("/mcp", service)
        .route_layer(axum::middleware::from_fn_with_state(gw, require_token))
}

/// With authentication on, every MCP request carries a token of the gateway's tokens file
/// (`401` with `WWW-Authenticate: Bearer` otherwise); what it may do is checked per method.
async fn require_token(
    axum::extract::State(gw): axum::extract::State<Arc<Gateway>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let auth = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if let Err(e) = gw.config.auth.check_any(auth, READ) {
        let mut resp = e.into_response();
        resp.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
        return resp;
    }
    next.run(req).await
}

/// One request's server: the gateway it works on.
#[derive(Clone)]
pub struct McpServer {
    gw: Arc<Gateway>,
}

/// A client's own name, recorded as who submitted or answered (authentication off), is cut to
/// this many bytes: the most a responder id may have.
const MAX_CLIENT_NAME_BYTES: usize = 200;

/// `s` cut to at most `max` bytes, on a character's boundary.
fn shortened(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The most questions a `requestState` may name as linked: a run waits on one question at a
/// time, and a link's question leaves the list once answered.
const MAX_LINKED: usize = 16;

/// What a client echoes back in `requestState`: the run of its call, and the questions it was
/// given a link for (asked again only after they are answered).
#[derive(Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CallState {
    run: Option<RunId>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    linked: Vec<RequestId>,
}

/// Where a run stands for a caller waiting on it.
enum Standing {
    Ended(RunRecord),
    Asking(RunRecord, Box<StoredInteraction>),
    Working(RunRecord),
}

/// An [`ApiError`] as an MCP error: the gateway's message, and its code and status in `data`.
pub fn mcp_error(e: ApiError) -> McpError {
    let data = Some(json!({"code": e.code.as_str(), "status": e.code.status()}));
    match e.code {
        ErrorCode::Unavailable => McpError::internal_error(e.message, data),
        ErrorCode::NotFound => McpError::resource_not_found(e.message, data),
        _ => McpError::invalid_params(e.message, data),
    }
}

/// A store failure as an MCP error (the gateway's mapping of it, then [`mcp_error`]).
fn store_error(e: delta_store::Error) -> McpError {
    mcp_error(e.into())
}

fn bad(message: impl Into<String>) -> McpError {
    mcp_error(ApiError::bad_request(message.into()))
}

fn from_json<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, McpError> {
    // Our own JSON, in the SDK's wire shapes: a failure is a bug here, said as such.
    serde_json::from_value(v)
        .map_err(|e| McpError::internal_error(format!("cannot shape an MCP result: {e}"), None))
}

fn headers(ctx: &RequestContext<RoleServer>) -> HeaderMap {
    ctx.extensions
        .get::<axum::http::request::Parts>()
        .map(|p| p.headers.clone())
        .unwrap_or_default()
}

fn modern(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.protocol_version()
        .is_some_and(|v| v >= ProtocolVersion::V_2026_07_28)
}

fn rfc3339(t: delta_protocol::Timestamp) -> String {
    t.to_string()
}

impl McpServer {
    fn caller(
        &self,
        ctx: &RequestContext<RoleServer>,
        roles: &[Role],
    ) -> Result<Identity, McpError> {
        let h = headers(ctx);
        let auth = h.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        self.gw
            .config
            .auth
            .check_any(auth, roles)
            .map_err(mcp_error)
    }

    /// The call's idempotency key: `_meta`'s [`IDEMPOTENCY_META`] or the `Idempotency-Key`
    /// header (the same if both are given), 1 to 255 characters.
    fn idempotency_key(
        ctx: &RequestContext<RoleServer>,
        meta: &rmcp::model::RequestMetaObject,
    ) -> Result<Option<String>, McpError> {
        let from_meta = match meta.0.get(IDEMPOTENCY_META) {
            None | Some(Value::Null) => None,
            Some(Value::String(k)) => Some(k.clone()),
            Some(_) => {
                return Err(bad(format!("`_meta.{IDEMPOTENCY_META}` must be a string")));
            }
        };
        let h = headers(ctx);
        let from_header = match h.get("idempotency-key") {
            None => None,
            Some(v) => Some(
                v.to_str()
                    .map_err(|_| bad("the Idempotency-Key header is not text"))?
                    .to_owned(),
            ),
        };
        let key = match (from_meta, from_header) {
            (Some(m), Some(h)) if m != h => {
                return Err(bad(format!(
                    "`_meta.{IDEMPOTENCY_META}` and the Idempotency-Key header differ: give one, or the same in both"
                )));
            }
            (Some(k), _) | (None, Some(k)) => Some(k),
            (None, None) => None,
        };
        if let Some(k) = &key
            && (k.is_empty() || k.chars().count() > 255)
        {
            return Err(bad("an idempotency key must be 1 to 255 characters"));
        }
        Ok(key)
    }

    /// The client's own name, for the record when authentication is off.
    fn client_name(ctx: &RequestContext<RoleServer>) -> Option<String> {
        ctx.client_info()
            .map(|i| shortened(i.name.trim(), MAX_CLIENT_NAME_BYTES).to_owned())
            .filter(|n| !n.is_empty())
    }

    /// The responder id the caller's answers are recorded with.
    fn responder_id(who: &Identity, ctx: &RequestContext<RoleServer>) -> String {
        who.name
            .clone()
            .or_else(|| Self::client_name(ctx))
            .unwrap_or_else(|| "anonymous".into())
    }

    /// The elicitation modes the client declared: (form, url). A declaration with neither is
    /// form only (the 2025-06-18 rule).
    fn modes(ctx: &RequestContext<RoleServer>) -> (bool, bool) {
        match ctx.client_capabilities().and_then(|c| c.elicitation) {
            None => (false, false),
            Some(e) if e.form.is_none() && e.url.is_none() => (true, false),
            Some(e) => (e.form.is_some(), e.url.is_some()),
        }
    }

    /// The questions of `linked` whose link still works: a spent or expired one is asked again.
    async fn live_links(
        &self,
        ctx: &RequestContext<RoleServer>,
        who: &Identity,
        linked: &[RequestId],
    ) -> Result<Vec<RequestId>, McpError> {
        let name = Self::client_name(ctx);
        let mut live = vec![];
        for rid in linked {
            if crate::links::shown_alive(
                &self.gw,
                &headers(ctx),
                who,
                name.as_deref(),
                Via::Mcp,
                *rid,
            )
            .await
            .map_err(mcp_error)?
            {
                live.push(*rid);
            }
        }
        Ok(live)
    }

    /// Waits up to [`WAIT`] for `run` to end or to ask a question that is not in `skip` and
    /// that `voter` has not voted on yet.
    async fn standing(
        &self,
        run: RunId,
        skip: &[RequestId],
        voter: &str,
    ) -> Result<Standing, ApiError> {
        let deadline = tokio::time::Instant::now() + WAIT.min(self.gw.config.request_timeout);
        let mut pause = Duration::from_millis(20);
        loop {
            let record = self.gw.store.record(run).await?;
            if record.status.is_terminal() {
                return Ok(Standing::Ended(record));
            }
            if let Some(rid) = record.pending_request_id.filter(|r| !skip.contains(r))
                && let Some(ix) = self.gw.store.interaction(run, rid).await?
                && ix.state == InteractionState::Pending
                && !ix.votes.iter().any(|v| v.responder.id == voter)
            {
                return Ok(Standing::Asking(record, Box::new(ix)));
            }
            if tokio::time::Instant::now() + pause > deadline || self.gw.shutdown.is_cancelled() {
                return Ok(Standing::Working(record));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 3 / 2).min(Duration::from_millis(250));
        }
    }

    /// The elicitation for a pending question (a one-time link for what must not pass through
    /// the client), and whether it is a link; `None` when this caller is not to be asked: it
    /// may not answer, or it did not declare the mode the question needs.
    async fn elicitation(
        &self,
        ctx: &RequestContext<RoleServer>,
        who: &Identity,
        run: RunId,
        ix: &StoredInteraction,
    ) -> Result<Option<(Value, bool)>, McpError> {
        if !who.has(Role::Answer) {
            return Ok(None);
        }
        let (form, url) = Self::modes(ctx);
        let q = &ix.request;
        Ok(match elicit::ask(q) {
            elicit::Ask::Form { message, schema } if form => Some((
                json!({"method": "elicitation/create", "params": {
                    "mode": "form", "message": message, "requestedSchema": schema,
                }}),
                false,
            )),
            elicit::Ask::Url { message } if url => {
                let url = self.link(ctx, who, run, q.request_id).await?;
                Some((
                    json!({"method": "elicitation/create", "params": {
                        "mode": "url",
                        "message": format!("{message}\n\nAnswer it in the inbox (this link works once): it is not asked here, so that the answer never passes through this client."),
                        "url": url,
                        "elicitationId": q.request_id.to_string(),
                    }}),
                    true,
                ))
            }
            // Never a secret through a form: without URL mode, the inbox it is.
            _ => None,
        })
    }

    /// A one-time answer link for `who` to answer `rid`, the same one at every read of a task
    /// ([`crate::links::shown_link`]).
    async fn link(
        &self,
        ctx: &RequestContext<RoleServer>,
        who: &Identity,
        run: RunId,
        rid: RequestId,
    ) -> Result<String, McpError> {
        let name = Self::client_name(ctx);
        crate::links::shown_link(
            &self.gw,
            &headers(ctx),
            who,
            name.as_deref(),
            Via::Mcp,
            run,
            rid,
        )
        .await
        .map_err(mcp_error)
    }

    /// Answers `run`'s questions with the client's elicitation results (keyed by request id).
    /// Returns whether the client dismissed one (it stays pending for anyone else, and a call
    /// ends). A question settled meanwhile (answered elsewhere, expired) is no error: the run
    /// goes on without this answer.
    async fn answer_all(
        &self,
        ctx: &RequestContext<RoleServer>,
        run: RunId,
        responses: &std::collections::BTreeMap<String, Value>,
    ) -> Result<bool, McpError> {
        let mut left = false;
        if responses.is_empty() {
            return Ok(left);
        }
        let who = self.caller(ctx, ANSWERERS)?;
        if responses.len() > MAX_LINKED {
            return Err(bad(format!(
                "{} input responses: a run asks one question at a time",
                responses.len()
            )));
        }
        // Every response checked before any is applied: a bad one refuses the call with nothing
        // answered (not the ones before it answered and their runs resumed).
        let mut answers = vec![];
        for (key, result) in responses {
            let rid: RequestId = key
                .parse()
                .map_err(|_| bad(format!("`{key}` is not an input request of this run")))?;
            let ix = self
                .gw
                .store
                .interaction(run, rid)
                .await
                .map_err(store_error)?
                .ok_or_else(|| bad(format!("`{key}` is not an input request of this run")))?;
            let body = match elicit::reply(&ix.request, result).map_err(bad)? {
                elicit::Reply::Leave => {
                    left = true;
                    continue;
                }
                elicit::Reply::Wait => continue,
                elicit::Reply::Answer(body) => *body,
            };
            // With tokens the token names the responder; without, the client's own name.
            let claimed = ClaimedResponder {
                id: who.name.is_none().then(|| Self::client_name(ctx)).flatten(),
                via: None,
            };
            let responder = self
                .gw
                .responder(who.name.as_deref(), Some(&claimed), Via::Mcp)
                .map_err(mcp_error)?;
            answers.push((rid, body, responder));
        }
        for (rid, body, responder) in answers {
            match self.gw.answer(rid, body, responder, who.groups()).await {
                Ok(_) => {}
                Err(e) if matches!(e.code, ErrorCode::AlreadyResolved | ErrorCode::Expired) => {
                    tracing::debug!(request = %rid, "an MCP answer came after the question was settled");
                }
                Err(e) => return Err(mcp_error(e)),
            }
        }
        Ok(left)
    }

    /// A tool call's answer for where its run stands. The wait holds one of the gateway's
    /// stream slots and one of the caller's (`DELTA_MAX_STREAMS_PER_IDENTITY`), like a live
    /// stream: one token cannot hold every connection in waiting calls.
    async fn call_result(
        &self,
        ctx: &RequestContext<RoleServer>,
        run: RunId,
        mut state: CallState,
    ) -> Result<CallToolResponse, McpError> {
        let who = self.caller(ctx, READ)?;
        let _slot = crate::sse::stream_permit(&self.gw, &who).map_err(mcp_error)?;
        if !modern(ctx) && who.has(Role::Answer) && Self::modes(ctx) != (false, false) {
            // A client of an older protocol version that takes elicitations is asked within
            // its call (the elicitation request of those versions).
            return self.ask_within_call(ctx, &who, run).await;
        }
        state.linked = self.live_links(ctx, &who, &state.linked).await?;
        let voter = Self::responder_id(&who, ctx);
        let standing = self
            .standing(run, &state.linked, &voter)
            .await
            .map_err(mcp_error)?;
        let state_text = |s: &CallState| serde_json::to_string(s).unwrap_or_default();
        match standing {
            Standing::Ended(record) => {
                Ok(CallToolResponse::Complete(from_json(tool_result(&record))?))
            }
            Standing::Asking(record, ix) if modern(ctx) => {
                let Some((request, linked)) = self.elicitation(ctx, &who, run, &ix).await? else {
                    return Ok(CallToolResponse::Complete(from_json(paused_result(
                        &record,
                        Some(&ix),
                    ))?));
                };
                if linked {
                    state.linked.push(ix.request.request_id);
                }
                Ok(CallToolResponse::InputRequired(from_json(json!({
                    "resultType": "input_required",
                    "inputRequests": {ix.request.request_id.to_string(): request},
                    "requestState": state_text(&state),
                }))?))
            }
            Standing::Working(_) if modern(ctx) => {
                Ok(CallToolResponse::InputRequired(from_json(json!({
                    "resultType": "input_required",
                    "requestState": state_text(&state),
                }))?))
            }
            // A client of an older version that takes no elicitations (or may not answer) gets
            // where the run stands, and reads or answers it elsewhere.
            Standing::Asking(record, ix) => Ok(CallToolResponse::Complete(from_json(
                paused_result(&record, Some(&ix)),
            )?)),
            Standing::Working(record) => Ok(CallToolResponse::Complete(from_json(paused_result(
                &record, None,
            ))?)),
        }
    }

    /// For a client of a protocol version before 2026-07-28: puts each question of `run` to it
    /// with an `elicitation/create` request within the call, answers with what it says, and
    /// returns when the run ends, when the client dismisses a question, goes away, or cannot be
    /// asked a question, or after [`LEGACY_CALL`].
    async fn ask_within_call(
        &self,
        ctx: &RequestContext<RoleServer>,
        who: &Identity,
        run: RunId,
    ) -> Result<CallToolResponse, McpError> {
        let voter = Self::responder_id(who, ctx);
        let until = tokio::time::Instant::now() + LEGACY_CALL;
        let mut linked: Vec<RequestId> = vec![];
        loop {
            if ctx.ct.is_cancelled()
                || self.gw.shutdown.is_cancelled()
                || tokio::time::Instant::now() > until
            {
                return self.paused(run).await;
            }
            linked = self.live_links(ctx, who, &linked).await?;
            let ix = match self
                .standing(run, &linked, &voter)
                .await
                .map_err(mcp_error)?
            {
                Standing::Ended(record) => {
                    return Ok(CallToolResponse::Complete(from_json(tool_result(&record))?));
                }
                Standing::Working(_) => continue,
                Standing::Asking(_, ix) => ix,
            };
            let rid = ix.request.request_id;
            let Some((request, is_link)) = self.elicitation(ctx, who, run, &ix).await? else {
                return self.paused(run).await;
            };
            let params = from_json(request["params"].clone())?;
            let result = tokio::select! {
                r = ctx.peer.create_elicitation(params) => r.map_err(|e| {
                    McpError::internal_error(format!("the elicitation was not answered: {e}"), None)
                })?,
                () = ctx.ct.cancelled() => continue,
            };
            let result = serde_json::to_value(&result).map_err(|e| {
                McpError::internal_error(format!("cannot read the elicitation's result: {e}"), None)
            })?;
            if is_link {
                linked.push(rid);
            }
            let responses = std::collections::BTreeMap::from([(rid.to_string(), result)]);
            if self.answer_all(ctx, run, &responses).await? {
                return self.paused(run).await;
            }
        }
    }

    /// The question `record` names as pending, as stored (whatever its state now).
    async fn pending_of(&self, record: &RunRecord) -> Result<Option<StoredInteraction>, McpError> {
        match record.pending_request_id {
            Some(rid) => self
                .gw
                .store
                .interaction(record.run_id, rid)
                .await
                .map_err(store_error),
            None => Ok(None),
        }
    }

    /// A call's end while `run` waits: where it stands, and its pending question.
    async fn paused(&self, run: RunId) -> Result<CallToolResponse, McpError> {
        let record = self.gw.store.record(run).await.map_err(store_error)?;
        let ix = self.pending_of(&record).await?;
        Ok(CallToolResponse::Complete(from_json(paused_result(
            &record,
            ix.as_ref(),
        ))?))
    }

    /// `tasks/get`'s task for a run.
    async fn task(
        &self,
        ctx: &RequestContext<RoleServer>,
        who: &Identity,
        record: &RunRecord,
    ) -> Result<Value, McpError> {
        // The tasks extension counts a task's TTL from its creation; a run is kept
        // `DELTA_RETENTION` after it ends: unlimited while it lives, then exact.
        let ttl = match (self.gw.config.retention, record.status.is_terminal()) {
            (Some(keep), true) => {
                let lived = record
                    .updated_at
                    .micros()
                    .saturating_sub(record.created_at.micros());
                let lived_ms = u64::try_from(lived / 1000).unwrap_or(0);
                Some(lived_ms.saturating_add(u64::try_from(keep.as_millis()).unwrap_or(u64::MAX)))
            }
            _ => None,
        };
        let mut task = json!({
            "taskId": record.run_id.to_string(),
            "createdAt": rfc3339(record.created_at),
            "lastUpdatedAt": rfc3339(record.updated_at),
            "ttlMs": ttl,
            "pollIntervalMs": POLL_MS,
        });
        let status = match record.status {
            RunStatus::Completed => {
                task["result"] = tool_result(record);
                task["statusMessage"] = json!("the run completed");
                "completed"
            }
            RunStatus::Failed => {
                // The run's failure, as the task's error (the tool result it would have been is
                // in `data.result` too, for clients that show results only).
                let why = record
                    .error
                    .clone()
                    .unwrap_or_else(|| "no reason given".into());
                task["error"] = json!({
                    "code": -32000,
                    "message": format!("the run failed: {why}"),
                    "data": {"run_id": record.run_id, "status": record.status, "result": tool_result(record)},
                });
                task["statusMessage"] = json!(format!("the run failed: {why}"));
                "failed"
            }
            RunStatus::Cancelled => {
                task["statusMessage"] = json!(
                    record
                        .error
                        .clone()
                        .unwrap_or_else(|| "the run was cancelled".into())
                );
                "cancelled"
            }
            _ => {
                let pending = self
                    .pending_of(record)
                    .await?
                    .filter(|ix| ix.state == InteractionState::Pending);
                let voter = Self::responder_id(who, ctx);
                match pending {
                    // A vote given, the question waits for others': working, for this caller.
                    Some(ix) if ix.votes.iter().any(|v| v.responder.id == voter) => "working",
                    Some(ix) => {
                        // A caller that may not answer, or cannot be asked this question, sees
                        // the question without an input request.
                        let requests = match self.elicitation(ctx, who, record.run_id, &ix).await? {
                            Some((request, _)) => {
                                json!({ix.request.request_id.to_string(): request})
                            }
                            None => json!({}),
                        };
                        task["inputRequests"] = requests;
                        task["statusMessage"] = json!(elicit::message(&ix.request));
                        "input_required"
                    }
                    None => "working",
                }
            }
        };
        task["status"] = json!(status);
        Ok(task)
    }

    fn run_id(raw: &str) -> Result<RunId, McpError> {
        raw.parse().map_err(|_| {
            mcp_error(ApiError::not_found(format!(
                "no task `{raw}` (a task id is a run id)"
            )))
        })
    }
}

/// A finished run as a tool's result: its result (or error) as text, and the run's facts.
fn tool_result(record: &RunRecord) -> Value {
    let ok = record.status == RunStatus::Completed;
    let text = if ok {
        record.result.clone().unwrap_or_default()
    } else {
        format!(
            "The run {}: {}",
            record.status.as_str().to_lowercase(),
            record.error.as_deref().unwrap_or("no reason given")
        )
    };
    json!({
        "resultType": "complete",
        "content": [{"type": "text", "text": text}],
        "structuredContent": {
            "run_id": record.run_id, "agent": record.agent, "status": record.status,
            "result": record.result, "error": record.error,
        },
        "isError": !ok,
    })
}

/// Where a run stands, for a client that cannot be asked within its call.
fn paused_result(record: &RunRecord, ix: Option<&StoredInteraction>) -> Value {
    let text = match ix {
        Some(ix) => format!(
            "The run {} waits for an answer: {}\n\nAnswer it in the inbox (/runs/{}), or read delta://interactions/{}.",
            record.run_id,
            elicit::message(&ix.request),
            record.run_id,
            ix.request.request_id
        ),
        None => format!(
            "The run {} is still {}: read delta://runs/{} for where it stands.",
            record.run_id,
            record.status.as_str().to_lowercase(),
            record.run_id
        ),
    };
    json!({
        "resultType": "complete",
        "content": [{"type": "text", "text": text}],
        "structuredContent": {
            "run_id": record.run_id, "agent": record.agent, "status": record.status,
            "request_id": ix.map(|i| i.request.request_id),
        },
        "isError": false,
    })
}

fn task_input_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "task": {"type": "string", "description": "What the agent is to do (its task).", "minLength": 1},
            "input": {"type": "object", "description": "Structured input for the agent's tools (optional)."},
        },
        "required": ["task"],
    })
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> InitializeResult {
        let caps = ServerCapabilities::builder()
            .enable_tools()
            .enable_resources()
            .enable_tasks()
            .build();
        let mut info = InitializeResult::new(caps).with_instructions(
            "Delta Fleet: each tool runs an agent of this fleet on a task. A run may stop to ask a person: its question comes back as an elicitation (a sensitive one as a one-time inbox link). Runs and pending questions are resources (delta://runs/…, delta://interactions/…).",
        );
        info.server_info.name = "delta-fleet".into();
        info.server_info.version = env!("CARGO_PKG_VERSION").into();
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        self.caller(&ctx, READ)?;
        let tools: Vec<Value> = self
            .gw
            .agents()
            .into_iter()
            .map(|a| {
                json!({
                    "name": a.name,
                    "title": a.name,
                    "description": a.description,
                    "inputSchema": task_input_schema(),
                    "execution": {"taskSupport": "optional"},
                })
            })
            .collect();
        from_json(json!({"resultType": "complete", "tools": tools}))
    }

    fn get_tool(&self, name: &str) -> Option<rmcp::model::Tool> {
        let a = self.gw.agent(name)?;
        serde_json::from_value(json!({
            "name": a.name, "description": a.description, "inputSchema": task_input_schema(),
        }))
        .ok()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.to_string();
        if let Some(raw) = &request.request_state {
            // A retry: the state names the run; it is checked, never trusted.
            let mut state: CallState = serde_json::from_str(raw)
                .map_err(|_| bad("the requestState is not one this gateway gave out"))?;
            // Each id costs reads: as many as a run's questions could have links, no more.
            state.linked.sort_unstable();
            state.linked.dedup();
            if state.linked.len() > MAX_LINKED {
                return Err(bad("the requestState is not one this gateway gave out"));
            }
            let run = state
                .run
                .ok_or_else(|| bad("the requestState names no run"))?;
            self.caller(&ctx, READ)?;
            let record = self.gw.store.record(run).await.map_err(store_error)?;
            if record.agent != name {
                return Err(bad(format!(
                    "the requestState is of a call to `{}`, not `{name}`",
                    record.agent
                )));
            }
            let left = match &request.input_responses {
                Some(responses) => self.answer_all(&ctx, run, responses).await?,
                None => false,
            };
            if left {
                // The client dismissed the question: the call ends, and the run waits for an
                // answer from anyone.
                return self.paused(run).await;
            }
            return self.call_result(&ctx, run, state).await;
        }
        let who = self.caller(&ctx, &[Role::Submit])?;
        if self.gw.agent(&name).is_none() {
            return Err(mcp_error(ApiError::new(
                ErrorCode::InvalidArgs,
                format!("no tool `{name}`: tools/list names this fleet's agents"),
            )));
        }
        let args = request.arguments.unwrap_or_default();
        let task = match args.get("task") {
            Some(Value::String(t)) => t.clone(),
            _ => {
                return Err(bad(
                    "`task` (a string) is required: what the agent is to do",
                ));
            }
        };
        if let Some(extra) = args.keys().find(|k| *k != "task" && *k != "input") {
            return Err(bad(format!(
                "unknown argument `{extra}` (the tools take `task` and `input`)"
            )));
        }
        let input = match args.get("input") {
            None | Some(Value::Null) => None,
            Some(v @ Value::Object(_)) => Some(v.clone()),
            Some(_) => return Err(bad("`input` must be an object")),
        };
        // The SDK moves a request's `_meta` to its context; the params' own, should it be kept.
        let key = Self::idempotency_key(&ctx, request.meta.as_ref().unwrap_or(&ctx.meta))?;
        let submitted_by = who.name.clone().or_else(|| Self::client_name(&ctx));
        // Scoped to the caller, as A2A's message ids are: one caller's key never finds
        // another's run.
        let key = key.map(|k| format!("mcp:{}", crate::ops::callers_key(who.name.as_deref(), &k)));
        let accepted = self
            .gw
            .submit(
                Submission {
                    agent: name,
                    task,
                    input,
                },
                key.as_deref(),
                submitted_by.as_deref(),
                who.name.as_deref(),
            )
            .await
            .map_err(mcp_error)?;
        let run = accepted.run_id;
        if ctx
            .client_capabilities()
            .is_some_and(|c| c.supports_tasks())
        {
            let record = self.gw.store.record(run).await.map_err(store_error)?;
            let mut task = self.task(&ctx, &who, &record).await?;
            task["resultType"] = json!("task");
            if let Some(obj) = task.as_object_mut() {
                obj.remove("inputRequests");
                obj.remove("result");
                obj.insert("status".into(), json!("working"));
            }
            return Ok(CallToolResponse::Task(from_json(task)?));
        }
        self.call_result(
            &ctx,
            run,
            CallState {
                run: Some(run),
                linked: vec![],
            },
        )
        .await
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let who = self.caller(&ctx, READ)?;
        let run = Self::run_id(&request.task_id)?;
        let record = self.gw.store.record(run).await.map_err(store_error)?;
        let mut task = self.task(&ctx, &who, &record).await?;
        task["resultType"] = json!("complete");
        from_json(task)
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let run = Self::run_id(&request.task_id)?;
        self.gw.store.record(run).await.map_err(store_error)?;
        self.answer_all(&ctx, run, &request.input_responses)
            .await
            .map(|_| ())
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        // Operators, and whoever submitted the run (as A2A's CancelTask).
        let who = self.caller(&ctx, READ)?;
        let run = Self::run_id(&request.task_id)?;
        let record = self.gw.store.record(run).await.map_err(store_error)?;
        let submitter = who.name.is_some() && record.submitted_by == who.name;
        if !who.has(Role::Operate) && !submitter {
            return Err(mcp_error(ApiError::new(
                ErrorCode::Forbidden,
                "only an operator or the run's submitter may cancel it",
            )));
        }
        let by = who.name.unwrap_or_else(|| "an MCP client".into());
        self.gw
            .cancel(run, &by, Some("cancelled through MCP (tasks/cancel)"))
            .await
            .map_err(mcp_error)?;
        Ok(())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let who = self.caller(&ctx, READ)?;
        let store = &self.gw.store;
        let mut resources = vec![];
        if ANSWERERS.iter().any(|r| who.has(*r)) {
            let page = store
                .index_page("interactions:pending", false, None, 100)
                .await
                .map_err(store_error)?
                .unwrap_or_default();
            let ids: Vec<RequestId> = page
                .entries
                .iter()
                .filter_map(|(m, _)| m.parse().ok())
                .collect();
            for (run, ix) in store.interactions(&ids).await.map_err(store_error)? {
                if ix.state != InteractionState::Pending {
                    continue;
                }
                let q = &ix.request;
                resources.push(json!({
                    "uri": format!("delta://interactions/{}", q.request_id),
                    "name": format!("question {}", q.request_id),
                    "title": format!("{}: {}", q.agent, short(q.title.as_deref().unwrap_or(&q.prompt))),
                    "description": format!("A pending question of run {run}"),
                    "mimeType": "application/json",
                }));
            }
        }
        let page = store
            .index_page("runs:all", true, None, 50)
            .await
            .map_err(store_error)?
            .unwrap_or_default();
        let ids: Vec<RunId> = page
            .entries
            .iter()
            .filter_map(|(m, _)| m.parse().ok())
            .collect();
        for r in store.records(&ids).await.map_err(store_error)? {
            resources.push(json!({
                "uri": format!("delta://runs/{}", r.run_id),
                "name": format!("run {}", r.run_id),
                "title": format!("{}: {} ({})", r.agent, short(&r.task), r.status.as_str()),
                "mimeType": "application/json",
            }));
        }
        from_json(json!({"resultType": "complete", "resources": resources}))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        self.caller(&ctx, READ)?;
        from_json(json!({"resultType": "complete", "resourceTemplates": [
            {"uriTemplate": "delta://runs/{run_id}", "name": "run", "title": "A run: its status, result and pending question", "mimeType": "application/json"},
            {"uriTemplate": "delta://interactions/{request_id}", "name": "question", "title": "A question: its request, state and answer", "mimeType": "application/json"},
        ]}))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let uri = request.uri.clone();
        let unknown = || {
            mcp_error(ApiError::not_found(format!(
                "no resource `{uri}` (delta://runs/<run id> or delta://interactions/<request id>)"
            )))
        };
        let body = if let Some(raw) = uri.strip_prefix("delta://runs/") {
            self.caller(&ctx, READ)?;
            let run: RunId = raw.parse().map_err(|_| unknown())?;
            let record = self.gw.store.record(run).await.map_err(store_error)?;
            let pending = self
                .pending_of(&record)
                .await?
                .map(|ix| interaction_view(run, &ix));
            serde_json::to_value(RunDetail {
                run: crate::api::run_view(&record),
                pending_interaction: pending,
            })
        } else if let Some(raw) = uri.strip_prefix("delta://interactions/") {
            self.caller(&ctx, ANSWERERS)?;
            let rid: RequestId = raw.parse().map_err(|_| unknown())?;
            let (run, ix) = self.gw.find(rid).await.map_err(mcp_error)?;
            serde_json::to_value(interaction_view(run, &ix))
        } else {
            return Err(unknown());
        }
        .map_err(|e| McpError::internal_error(format!("cannot show the resource: {e}"), None))?;
        let text = serde_json::to_string_pretty(&body).unwrap_or_default();
        Ok(ReadResourceResponse::Complete(from_json(json!({
            "resultType": "complete",
            "contents": [{"uri": uri, "mimeType": "application/json", "text": text}],
        }))?))
    }
}

fn short(s: &str) -> String {
    let line = s.lines().next().unwrap_or("");
    if line.chars().count() > 80 {
        format!("{}…", line.chars().take(79).collect::<String>())
    } else {
        line.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_client_name_is_cut_on_a_characters_boundary() {
        assert_eq!(shortened("claude", MAX_CLIENT_NAME_BYTES), "claude");
        let long = "é".repeat(150); // 300 bytes
        let cut = shortened(&long, MAX_CLIENT_NAME_BYTES);
        assert_eq!(cut.len(), 200);
        assert!(cut.chars().all(|c| c == 'é'));
        let odd = format!("a{}", "é".repeat(150));
        assert_eq!(shortened(&odd, MAX_CLIENT_NAME_BYTES).len(), 199);
    }
}
