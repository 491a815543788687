//! The HTTP API of docs/protocol.md §6. Every refusal is `{"error": {"code", "message"}}` with the
//! status of its code; bodies are size-limited and parsed strictly (unknown fields refused).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;

use delta_api::{
    AnswerAccepted, AnswerBody, CancelBody, CancelResult, ClaimBody, ClaimState, DeadLetterDropped,
    DeadLetterPage, DeadLetterRetried, DlqQuery, DroppedStatus, ErrorCode, Health, HealthStatus,
    InteractionPage, InteractionView, InteractionsQuery, Journal, JournalQuery, QueueStats,
    Reachability, Readiness, RequeuedStatus, Run, RunAccepted, RunDetail, RunPage, RunsQuery,
    StreamTarget, StreamTicket, Submission, WorkerSeen,
};
use delta_protocol::{InteractionState, InteractionType, RequestId, RunId, RunStatus, Timestamp};
use delta_store::redis::Page;

use crate::Gateway;
use crate::auth::{Identity, Role};
use crate::error::ApiError;
use crate::ops::interaction_view;

type Shared = State<Arc<Gateway>>;

/// The gateway's routes.
pub fn router(gw: Arc<Gateway>) -> Router {
    let limit = gw.config.max_body_bytes;
    Router::new()
        .route("/v1/runs", post(submit).get(list_runs))
        .route("/v1/runs/{run_id}", get(get_run))
        .route("/v1/runs/{run_id}/journal", get(journal))
        .route("/v1/runs/{run_id}/events", get(crate::sse::run_events))
        .route("/v1/runs/{run_id}/cancel", post(cancel))
        .route("/v1/stream-tickets", post(stream_ticket))
        .route("/v1/interactions", get(list_interactions))
        .route(
            "/v1/interactions/stream",
            get(crate::sse::interaction_events),
        )
        .route("/v1/interactions/{request_id}", get(get_interaction))
        .route("/v1/interactions/{request_id}/response", post(respond))
        .route("/v1/interactions/{request_id}/claim", post(claim))
        .route("/v1/answer-links/open", post(open_link))
        .route("/v1/answer-links/answer", post(answer_link))
        .route(
            "/v1/delegations",
            post(crate::delegations::create).get(crate::delegations::list),
        )
        .route("/v1/delegations/{id}", delete(crate::delegations::delete))
        .route("/v1/queue", get(queue))
        .route("/v1/dlq", get(list_dlq))
        .route("/v1/dlq/{seq}", delete(drop_dlq))
        .route("/v1/dlq/{seq}/retry", post(retry_dlq))
        .route("/v1/grants", get(crate::grants::list))
        .route(
            "/v1/grants/{grant_id}",
            get(crate::grants::get).delete(crate::grants::revoke),
        )
        .route(
            "/v1/webhooks",
            post(crate::webhooks::create).get(crate::webhooks::list),
        )
        .route(
            "/v1/webhooks/{id}",
            get(crate::webhooks::get).delete(crate::webhooks::delete),
        )
        .route("/v1/webhooks/{id}/rotate", post(crate::webhooks::rotate))
        .route("/v1/webhooks/{id}/enable", post(crate::webhooks::enable))
        .route("/v1/webhooks/{id}/disable", post(crate::webhooks::disable))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .route("/", get(crate::inbox::page))
        .route("/runs/{run_id}", get(crate::inbox::page))
        .route("/answer", get(crate::inbox::page))
        .route("/inbox.js", get(crate::inbox::script))
        .route("/inbox.css", get(crate::inbox::style))
        .merge(crate::mcp::router(gw.clone()))
        .merge(crate::a2a::router())
        .fallback(|| async {
            ApiError::not_found("no such endpoint; GET /openapi.json lists them")
        })
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn_with_state(
            gw.config.request_timeout,
            within_time,
        ))
        .layer(axum::middleware::from_fn_with_state(
            gw.config.auth.is_on(),
            not_from_other_sites,
        ))
        .with_state(gw)
}

/// Whether `host` (a `Host` header, or an `Origin`'s host, with or without a port) names this
/// machine's loopback: `localhost`, `127.0.0.0/8` or `[::1]`.
pub(crate) fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        // `[::1]:8080`
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// What keeps web pages out. A `POST` must say `Content-Type: application/json`: a page can send
/// a cross-site `text/plain` or form POST without asking, never a JSON one. Without
/// authentication (a loopback-only choice), a request must also name this machine in `Host` and,
/// when it has one, in `Origin`: a rebinding DNS name or another site's page is refused.
async fn not_from_other_sites(
    State(auth_on): State<bool>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let headers = req.headers();
    if req.method() == axum::http::Method::POST {
        let json = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"));
        if !json {
            return ApiError::bad_request(
                "send the body as JSON, with `Content-Type: application/json`",
            )
            .into_response();
        }
    }
    if !auth_on {
        let host = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let origin = headers
            .get(header::ORIGIN)
            .and_then(|v| v.to_str().ok())
            .filter(|o| *o != "null");
        let origin_ok = origin.is_none_or(|o| {
            o.split_once("://").is_some_and(|(scheme, rest)| {
                (scheme == "http" || scheme == "https") && is_loopback_host(rest)
            })
        });
        if !is_loopback_host(host) || !origin_ok {
            return ApiError::new(
                ErrorCode::Forbidden,
                "this gateway runs without authentication and serves only this machine (Host and Origin must be localhost or a loopback address); give it tokens to serve others",
            )
            .into_response();
        }
    }
    next.run(req).await
}

/// A request that has not produced its response within `DELTA_REQUEST_TIMEOUT_S` (a slow body,
/// a stuck backend) is answered `503 unavailable`, and what it was doing is dropped. A live
/// stream only has to start in time: its events flow as long as the client stays.
async fn within_time(
    State(limit): State<std::time::Duration>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(response) => response,
        Err(_) => ApiError::unavailable(
            "the request took longer than this gateway allows (DELTA_REQUEST_TIMEOUT_S); try again",
        )
        .into_response(),
    }
}

/// The caller behind the `Authorization` header, if it holds one of `roles`. Never from the URL:
/// a live stream opened without headers takes a one-time ticket instead ([`crate::tickets`]).
pub fn caller(gw: &Gateway, headers: &HeaderMap, roles: &[Role]) -> Result<Identity, ApiError> {
    let header = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    gw.config.auth.check_any(header, roles)
}

const READ: &[Role] = &[Role::Submit, Role::Answer, Role::Operate];
pub const ANSWERERS: &[Role] = &[Role::Answer, Role::Operate];
/// Who may answer, vote or claim: answerers, and relays on a person's behalf.
const ANSWERERS_OR_RELAYS: &[Role] = &[Role::Answer, Role::Operate, Role::Relay];

/// The request's body, or why it could not be read: `413 payload_too_large` past
/// `DELTA_MAX_BODY_BYTES` (every endpoint says so the same way), else `400 bad_request`.
pub fn body_bytes(bytes: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    bytes.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                ErrorCode::PayloadTooLarge,
                "the request body is larger than this gateway accepts (DELTA_MAX_BODY_BYTES)",
            )
        } else {
            ApiError::bad_request(format!("cannot read the request body: {e}"))
        }
    })
}

/// A JSON body, parsed strictly: the path to a wrong field is named.
fn body<T: DeserializeOwned>(bytes: Result<Bytes, BytesRejection>) -> Result<T, ApiError> {
    let bytes = body_bytes(bytes)?;
    if bytes.is_empty() {
        return Err(ApiError::bad_request(
            "the request body is empty: send a JSON object",
        ));
    }
    strict_json(&bytes)
}

/// Parses JSON strictly: the path to a wrong field is named, trailing data refused. The bot
/// bridge parses its messages the same way.
pub fn strict_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = without_values(&e.into_inner().to_string());
        if path == "." || path.is_empty() {
            ApiError::bad_request(format!("the body is not the JSON expected: {inner}"))
        } else {
            ApiError::bad_request(format!("`{path}`: {inner}"))
        }
    })?;
    de.end()
        .map_err(|e| ApiError::bad_request(format!("trailing data after the JSON: {e}")))?;
    Ok(value)
}

/// A JSON error without the value it quotes (`invalid type: integer `123456`, expected a
/// string` says `invalid type: integer, expected a string`): the value may be a sensitive
/// answer, and a bot's refusal goes to an inbox other bots may read.
fn without_values(message: &str) -> String {
    for lead in ["invalid type: ", "invalid value: "] {
        let Some(at) = message.find(lead) else {
            continue;
        };
        let rest = &message[at + lead.len()..];
        // What was expected is the code's own words, never the input's: the last ", expected".
        let Some(end) = rest.rfind(", expected") else {
            continue;
        };
        let kind = rest[..end]
            .split(['`', '"'])
            .next()
            .unwrap_or_default()
            .trim();
        return format!("{}{kind}{}", &message[..at + lead.len()], &rest[end..]);
    }
    message.to_owned()
}

fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    q.map(|Query(t)| t)
        .map_err(|e| ApiError::bad_request(format!("bad query string: {}", e.body_text())))
}

fn run_id(raw: &str) -> Result<RunId, ApiError> {
    raw.parse()
        .map_err(|_| ApiError::bad_request(format!("`{raw}` is not a run id (a UUID)")))
}

fn request_id(raw: &str) -> Result<RequestId, ApiError> {
    raw.parse()
        .map_err(|_| ApiError::bad_request(format!("`{raw}` is not a request id (a UUID)")))
}

fn limit(l: Option<usize>) -> Result<usize, ApiError> {
    match l {
        None => Ok(50),
        Some(n) if (1..=500).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::bad_request(format!(
            "limit {n} is out of range 1..=500"
        ))),
    }
}

async fn submit(
    State(gw): Shared,
    headers: HeaderMap,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let who = caller(&gw, &headers, &[Role::Submit])?;
    let submission: Submission = body(bytes)?;
    let key = match headers.get("idempotency-key") {
        Some(v) => Some(
            v.to_str()
                .map_err(|_| ApiError::bad_request("Idempotency-Key must be visible ASCII"))?,
        ),
        None => None,
    };
    // Per token: without authentication (loopback only) there is one caller, this machine.
    let accepted: RunAccepted = gw
        .submit(submission, key, who.name.as_deref(), who.name.as_deref())
        .await?;
    Ok((StatusCode::ACCEPTED, Json(accepted)).into_response())
}

/// The most index entries one listing call reads (each loads its run or question): a filter
/// that matches little answers with fewer items and a cursor rather than reading thousands.
const MAX_SCANNED_PER_LISTING: usize = 2000;

/// An agent filter of a listing: a name an agent may have, else `400` (it is only compared, but
/// a wrong one would read the whole index to find nothing).
fn agent_filter(agent: Option<&str>) -> Result<Option<String>, ApiError> {
    match agent {
        None | Some("") => Ok(None),
        Some(a) if crate::ops::valid_agent_name(a) => Ok(Some(a.to_owned())),
        Some(a) => Err(ApiError::bad_request(format!(
            "agent `{}` is not an agent's name (letters, digits, `-` and `_`)",
            a.chars().take(64).collect::<String>()
        ))),
    }
}

/// Walks an index page by page, keeping the entries `keep` accepts, until `want` are kept.
async fn collect<T, F, Fut>(
    gw: &Gateway,
    index: &str,
    newest_first: bool,
    cursor: Option<String>,
    want: usize,
    mut load: F,
) -> Result<(Vec<T>, Option<String>), ApiError>
where
    F: FnMut(Vec<(String, i64)>) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<(String, i64, Option<T>)>, ApiError>>,
{
    let mut out = vec![];
    let mut cursor = cursor;
    let mut scanned = 0;
    // Bounded: a filter that matches nothing stops after this many pages, or entries read, with
    // a cursor to go on from.
    for _ in 0..20 {
        if scanned >= MAX_SCANNED_PER_LISTING {
            break;
        }
        let page = gw
            .store
            .index_page(index, newest_first, cursor.as_deref(), want.max(20))
            .await?
            .ok_or_else(|| ApiError::bad_request("the cursor is not one this API gave out"))?;
        let more = page.more;
        scanned += page.entries.len();
        let loaded = load(page.entries).await?;
        let mut last = None;
        let n = loaded.len();
        for (i, (member, score, item)) in loaded.into_iter().enumerate() {
            last = Some(Page::cursor(&member, score));
            if let Some(item) = item {
                out.push(item);
                if out.len() == want {
                    // A cursor only when something may follow.
                    let next = if more || i + 1 < n { last } else { None };
                    return Ok((out, next));
                }
            }
        }
        if !more {
            return Ok((out, None));
        }
        cursor = last;
    }
    Ok((out, cursor))
}

async fn list_runs(
    State(gw): Shared,
    headers: HeaderMap,
    q: Result<Query<RunsQuery>, QueryRejection>,
) -> Result<Json<RunPage>, ApiError> {
    caller(&gw, &headers, READ)?;
    let q = query(q)?;
    let want = limit(q.limit)?;
    let index = match q.status.as_deref() {
        None | Some("") => "runs:all".to_owned(),
        Some(s) => {
            let status: RunStatus = s.to_uppercase().parse().map_err(|_| {
                ApiError::bad_request(format!(
                    "status `{s}` is not one of QUEUED, RUNNING, WAITING_FOR_INPUT, INTERRUPTED, COMPLETED, FAILED, CANCELLED"
                ))
            })?;
            format!("runs:{}", status.as_str())
        }
    };
    let agent = agent_filter(q.agent.as_deref())?;
    let store = gw.store.clone();
    let (runs, next) = collect(&gw, &index, true, q.cursor, want, |entries| {
        let store = store.clone();
        let agent = agent.clone();
        async move {
            let ids: Vec<RunId> = entries.iter().filter_map(|(m, _)| m.parse().ok()).collect();
            let records = store.records(&ids).await?;
            let by_id: std::collections::HashMap<String, &delta_store::RunRecord> =
                records.iter().map(|r| (r.run_id.to_string(), r)).collect();
            Ok(entries
                .into_iter()
                .map(|(m, s)| {
                    let rec = by_id
                        .get(&m)
                        .copied()
                        .filter(|r| agent.as_deref().is_none_or(|a| r.agent == a))
                        .map(|r| Run {
                            input: None,
                            ..run_view(r)
                        });
                    (m, s, rec)
                })
                .collect())
        }
    })
    .await?;
    Ok(Json(RunPage {
        runs,
        next_cursor: next,
    }))
}

/// A run as the API shows it: the record without the local CLI's `agent_dir`. Listings leave
/// out the (possibly large) structured input as well.
pub(crate) fn run_view(r: &delta_store::RunRecord) -> Run {
    Run {
        run_id: r.run_id,
        agent: r.agent.clone(),
        task: r.task.clone(),
        status: r.status,
        created_at: r.created_at,
        updated_at: r.updated_at,
        pending_request_id: r.pending_request_id,
        input: r.input.clone(),
        result: r.result.clone(),
        error: r.error.clone(),
    }
}

async fn get_run(
    State(gw): Shared,
    headers: HeaderMap,
    Path(raw): Path<String>,
) -> Result<Json<RunDetail>, ApiError> {
    caller(&gw, &headers, READ)?;
    let id = run_id(&raw)?;
    let record = gw.store.record(id).await?;
    let pending = match record.pending_request_id {
        Some(rid) => gw
            .store
            .interaction(id, rid)
            .await?
            .map(|ix| interaction_view(id, &ix)),
        None => None,
    };
    Ok(Json(RunDetail {
        run: run_view(&record),
        pending_interaction: pending,
    }))
}

async fn journal(
    State(gw): Shared,
    headers: HeaderMap,
    Path(raw): Path<String>,
    q: Result<Query<JournalQuery>, QueryRejection>,
) -> Result<Json<Journal>, ApiError> {
    caller(&gw, &headers, READ)?;
    let id = run_id(&raw)?;
    let q = query(q)?;
    let max = match q.limit {
        None => 1000,
        Some(n) if (1..=10_000).contains(&n) => n,
        Some(n) => {
            return Err(ApiError::bad_request(format!(
                "limit {n} is out of range 1..=10000"
            )));
        }
    };
    // Not found is a run that does not exist, not an empty journal.
    let record = gw.store.record(id).await?;
    let events = gw
        .store
        .journal_from(id, q.from_seq.unwrap_or(1), max)
        .await?;
    let next = events.last().map(|e| e.seq + 1);
    Ok(Json(Journal {
        run_id: id,
        status: record.status,
        events,
        next_seq: next.or(q.from_seq).unwrap_or(1),
    }))
}

/// `POST /v1/stream-tickets`: a one-time ticket for the live stream the body names, for the
/// caller (who must be allowed to follow it).
async fn stream_ticket(
    State(gw): Shared,
    headers: HeaderMap,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Json<StreamTicket>, ApiError> {
    caller(&gw, &headers, READ)?;
    let target: StreamTarget = body(bytes)?;
    let who = caller(&gw, &headers, crate::tickets::roles_for(&target))?;
    if let StreamTarget::Run { run_id } = target {
        // 404 now rather than a ticket for a stream that cannot open.
        gw.store.record(run_id).await?;
    }
    Ok(Json(crate::tickets::issue(&gw, who, &target).await?))
}

async fn cancel(
    State(gw): Shared,
    headers: HeaderMap,
    Path(raw): Path<String>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Json<CancelResult>, ApiError> {
    let who = caller(&gw, &headers, &[Role::Operate])?;
    let id = run_id(&raw)?;
    let b: CancelBody = match &bytes {
        Ok(b) if b.is_empty() => CancelBody::default(),
        _ => body(bytes)?,
    };
    let by = who.name.unwrap_or_else(|| "an operator".into());
    let status = gw.cancel(id, &by, b.reason.as_deref()).await?;
    Ok(Json(CancelResult { run_id: id, status }))
}

async fn list_interactions(
    State(gw): Shared,
    headers: HeaderMap,
    q: Result<Query<InteractionsQuery>, QueryRejection>,
) -> Result<Json<InteractionPage>, ApiError> {
    caller(&gw, &headers, ANSWERERS)?;
    let q = query(q)?;
    let want = limit(q.limit)?;
    let state: Option<InteractionState> = match q.state.as_deref() {
        None | Some("") => Some(InteractionState::Pending),
        Some("all") => None,
        Some(s) => Some(
            s.parse()
                .map_err(|e: String| ApiError::bad_request(format!("{e}, or all")))?,
        ),
    };
    let kind: Option<InteractionType> = match q.kind.as_deref() {
        None | Some("") => None,
        Some(t) => Some(serde_json::from_value(t.to_uppercase().into()).map_err(|_| {
            ApiError::bad_request(format!(
                "type `{t}` is not one of TOOL_APPROVAL, MISSING_INFO, USER_CONFIRMATION, USER_CHOICE, USER_INPUT, CUSTOM"
            ))
        })?),
    };
    let index = if state == Some(InteractionState::Pending) {
        "interactions:pending"
    } else {
        "interactions:all"
    };
    let store = gw.store.clone();
    let agent = agent_filter(q.agent.as_deref())?;
    let (items, next) = collect(&gw, index, false, q.cursor, want, |entries| {
        let store = store.clone();
        let agent = agent.clone();
        async move {
            let ids: Vec<RequestId> = entries.iter().filter_map(|(m, _)| m.parse().ok()).collect();
            let found = store.interactions(&ids).await?;
            let by_id: std::collections::HashMap<
                String,
                &(RunId, delta_store::redis::StoredInteraction),
            > = found
                .iter()
                .map(|f| (f.1.request.request_id.to_string(), f))
                .collect();
            Ok(entries
                .into_iter()
                .map(|(m, s)| {
                    let item = by_id
                        .get(&m)
                        .copied()
                        .filter(|(_, ix)| state.is_none_or(|st| ix.state == st))
                        .filter(|(_, ix)| agent.as_deref().is_none_or(|a| ix.request.agent == a))
                        .filter(|(_, ix)| kind.is_none_or(|k| ix.request.kind == k))
                        .map(|(run, ix)| interaction_view(*run, ix));
                    (m, s, item)
                })
                .collect())
        }
    })
    .await?;
    Ok(Json(InteractionPage {
        interactions: items,
        next_cursor: next,
    }))
}

async fn get_interaction(
    State(gw): Shared,
    headers: HeaderMap,
    Path(raw): Path<String>,
) -> Result<Json<InteractionView>, ApiError> {
    // A relay (the Slack bridge) reads a question to show it and to know whether it is pending.
    caller(&gw, &headers, ANSWERERS_OR_RELAYS)?;
    let rid = request_id(&raw)?;
    let (run, ix) = gw.find(rid).await?;
    Ok(Json(interaction_view(run, &ix)))
}

async fn respond(
    State(gw): Shared,
    headers: HeaderMap,
    Path(raw): Path<String>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Json<AnswerAccepted>, ApiError> {
    let who = caller(&gw, &headers, ANSWERERS_OR_RELAYS)?;
    let rid = request_id(&raw)?;
    let answer: AnswerBody = body(bytes)?;
    let (who, responder) = gw.acting(who, answer.responder.as_ref())?;
    let answered = gw.answer(rid, answer, responder, who.groups()).await?;
    Ok(Json(AnswerAccepted {
        status: answered.status,
        run_id: answered.run_id,
        tally: answered.tally,
    }))
}

/// No token: the link's secret is the credential (crate::links).
async fn open_link(
    State(gw): Shared,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Json<delta_api::links::LinkView>, ApiError> {
    Ok(Json(crate::links::open(&gw, body(bytes)?).await?))
}

async fn answer_link(
    State(gw): Shared,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Json<AnswerAccepted>, ApiError> {
    Ok(Json(crate::links::answer(&gw, body(bytes)?).await?))
}

async fn claim(
    State(gw): Shared,
    headers: HeaderMap,
    Path(raw): Path<String>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Json<ClaimState>, ApiError> {
    let who = caller(&gw, &headers, ANSWERERS_OR_RELAYS)?;
    let rid = request_id(&raw)?;
    // An empty body takes the claim for the default time.
    let body: ClaimBody = match &bytes {
        Ok(b) if b.is_empty() => ClaimBody::default(),
        _ => body(bytes)?,
    };
    let (who, responder) = gw.acting(who, body.responder.as_ref())?;
    let operator = who.has(Role::Operate);
    Ok(Json(
        gw.claim(rid, body, responder, who.groups(), operator)
            .await?,
    ))
}

async fn queue(State(gw): Shared, headers: HeaderMap) -> Result<Json<QueueStats>, ApiError> {
    caller(&gw, &headers, &[Role::Operate])?;
    let stats = gw.queue.stats().await?;
    let since = Timestamp::now().micros() / 1000 - 30_000;
    let workers: Vec<WorkerSeen> = gw
        .store
        .workers_seen(since)
        .await?
        .into_iter()
        .map(|(id, ms)| WorkerSeen {
            worker_id: id,
            last_seen: Timestamp::from_micros(ms.saturating_mul(1000)),
        })
        .collect();
    Ok(Json(QueueStats {
        jobs_pending: stats.pending,
        jobs_in_flight: stats.in_flight,
        jobs_redelivered: stats.redelivered,
        dead_lettered: stats.dead_lettered,
        waiting_pulls: stats.waiting_pulls,
        workers,
    }))
}

fn dlq_seq(raw: &str) -> Result<u64, ApiError> {
    raw.parse::<u64>().ok().filter(|s| *s > 0).ok_or_else(|| {
        ApiError::bad_request(format!(
            "`{raw}` is not a dead letter's sequence (a number from 1); GET /v1/dlq lists them"
        ))
    })
}

async fn list_dlq(
    State(gw): Shared,
    headers: HeaderMap,
    q: Result<Query<DlqQuery>, QueryRejection>,
) -> Result<Json<DeadLetterPage>, ApiError> {
    caller(&gw, &headers, &[Role::Operate])?;
    let q = query(q)?;
    let want = limit(q.limit)?;
    let agent = match q.agent.as_deref() {
        None | Some("") => None,
        Some(a) if crate::ops::valid_agent_name(a) => Some(a),
        Some(a) => {
            return Err(ApiError::bad_request(format!(
                "`{a}` is not an agent name (letters, digits, `-`, `_`)"
            )));
        }
    };
    let from = match q.cursor.as_deref() {
        None | Some("") => 1,
        Some(c) => dlq_seq(c).map_err(|_| {
            ApiError::bad_request(format!("bad cursor `{c}`; pass next_cursor back as it was"))
        })?,
    };
    let (letters, next) = gw.dead_letters(agent, from, want).await?;
    Ok(Json(DeadLetterPage {
        dead_letters: letters,
        next_cursor: next,
    }))
}

async fn retry_dlq(
    State(gw): Shared,
    headers: HeaderMap,
    Path(raw): Path<String>,
) -> Result<Json<DeadLetterRetried>, ApiError> {
    let who = caller(&gw, &headers, &[Role::Operate])?;
    let seq = dlq_seq(&raw)?;
    let by = who.name.unwrap_or_else(|| "an operator".into());
    let r = gw.retry_dead_letter(seq, &by).await?;
    Ok(Json(DeadLetterRetried {
        seq,
        status: RequeuedStatus::Requeued,
        run_id: r.run_id,
        job_seq: r.job_seq,
    }))
}

async fn drop_dlq(
    State(gw): Shared,
    headers: HeaderMap,
    Path(raw): Path<String>,
) -> Result<Json<DeadLetterDropped>, ApiError> {
    let who = caller(&gw, &headers, &[Role::Operate])?;
    let seq = dlq_seq(&raw)?;
    let by = who.name.unwrap_or_else(|| "an operator".into());
    gw.drop_dead_letter(seq, &by).await?;
    Ok(Json(DeadLetterDropped {
        seq,
        status: DroppedStatus::Dropped,
    }))
}

async fn healthz() -> Json<Health> {
    Json(Health {
        status: HealthStatus::Ok,
    })
}

async fn readyz(State(gw): Shared) -> Response {
    let body = gw
        .probes
        .ready
        .get(|| async {
            let redis = gw.store.ping().await;
            let nats = gw.queue.stats().await;
            Readiness {
                redis: Reachability::of(&redis),
                nats: Reachability::of(&nats),
            }
        })
        .await;
    let status = if body.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

async fn metrics(State(gw): Shared) -> Response {
    let m = &gw.metrics;
    let (counts, stats) = gw
        .probes
        .figures
        .get(|| async { (gw.store.counts().await.ok(), gw.queue.stats().await.ok()) })
        .await;
    if let Some((by_status, pending)) = counts {
        for (status, n) in by_status {
            m.runs
                .get_or_create(&crate::metrics::StatusLabel {
                    status: status.as_str().to_owned(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        m.pending_interactions
            .set(i64::try_from(pending).unwrap_or(i64::MAX));
    }
    let (heard, heard_bytes) = gw.heard.len_and_bytes();
    m.questions_heard
        .set(i64::try_from(heard).unwrap_or(i64::MAX));
    m.questions_heard_bytes
        .set(i64::try_from(heard_bytes).unwrap_or(i64::MAX));
    m.answers_waiting
        .set(i64::try_from(gw.heard.waiting()).unwrap_or(i64::MAX));
    if let Some(s) = stats {
        let g = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        m.jobs_pending.set(g(s.pending));
        m.jobs_in_flight.set(g(s.in_flight));
        m.jobs_redelivered.set(g(s.redelivered));
        m.jobs_dead_lettered.set(g(s.dead_lettered));
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.render(),
    )
        .into_response()
}

/// The OpenAPI document of this API, generated from `delta-api`'s types once per process.
pub static OPENAPI: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(delta_api::openapi::json);

async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        OPENAPI.as_str(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body of the wrong type is refused naming the field and the type, never the value (a
    /// PIN sent as a number to a sensitive question).
    #[test]
    fn json_errors_do_not_repeat_the_value() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Body {
            input: String,
            n: Option<u8>,
        }
        for (body, field, kind) in [
            (
                r#"{"input": 739184}"#,
                "`input`",
                "invalid type: integer, expected a string",
            ),
            (
                r#"{"input": "x", "n": 70000}"#,
                "`n`",
                "invalid value: integer, expected u8",
            ),
            (
                r#"{"input": ["s3cr3t, expected x"]}"#,
                "`input`",
                "invalid type: sequence, expected a string",
            ),
        ] {
            let e = strict_json::<Body>(body.as_bytes()).expect_err(body);
            let text = e.to_string();
            assert!(text.contains(field) && text.contains(kind), "{text}");
            assert!(
                !text.contains("739184") && !text.contains("70000"),
                "{text}"
            );
        }
        let e = strict_json::<Body>(br#"{"input": "s3cr3t-value", "n": "x"}"#).expect_err("n");
        assert!(!e.to_string().contains("\"x\""), "{e}");
    }
}
