//! The grants endpoints (docs/protocol.md §6 "Grants"): list them, read one, revoke one.
//!
//! Grants are made by the engine when it applies an approval with `data.grant` (the gateway only
//! checks the request, through `check_answer`, before it accepts the answer), so here they are
//! only read and revoked. Who may: listing and reading, anyone who may answer questions
//! (`answer`); revoking, the grant's creator (the token whose approval made it) or an operator
//! (`operate`). With authentication off, anyone (everyone may do everything).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;

use delta_api::{ErrorCode, GrantList, GrantView, GrantsQuery};
use delta_protocol::grant::{Grant, GrantScope, GrantState};
use delta_protocol::{RequestId, RunId, Timestamp};
use delta_store::GrantStore;

use crate::Gateway;
use crate::api::caller;
use crate::auth::Role;
use crate::error::ApiError;

const ANSWERERS: &[Role] = &[Role::Answer, Role::Operate];

/// The view of a grant, with its state now.
pub fn view(grant: Grant, now: Timestamp) -> GrantView {
    GrantView {
        state: grant.state_at(now),
        grant,
    }
}

fn grant_id(raw: &str) -> Result<RequestId, ApiError> {
    raw.parse().map_err(|_| {
        ApiError::bad_request(format!(
            "`{raw}` is not a grant id (a UUID); GET /v1/grants lists them"
        ))
    })
}

/// Which states a listing keeps (`None`: all).
fn states(raw: Option<&str>) -> Result<Option<GrantState>, ApiError> {
    match raw.map(str::to_ascii_lowercase).as_deref() {
        None | Some("") | Some("active") => Ok(Some(GrantState::Active)),
        Some("revoked") => Ok(Some(GrantState::Revoked)),
        Some("expired") => Ok(Some(GrantState::Expired)),
        Some("used_up") => Ok(Some(GrantState::UsedUp)),
        Some("all") => Ok(None),
        Some(other) => Err(ApiError::bad_request(format!(
            "state `{other}`: use active, revoked, expired, used_up or all"
        ))),
    }
}

/// `GET /v1/grants?agent=&run=&state=`
pub async fn list(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    q: Result<Query<GrantsQuery>, QueryRejection>,
) -> Result<Json<GrantList>, ApiError> {
    caller(&gw, &headers, ANSWERERS)?;
    let Query(q) =
        q.map_err(|e| ApiError::bad_request(format!("bad query string: {}", e.body_text())))?;
    let state = states(q.state.as_deref())?;
    let mut agent = match q.agent.as_deref() {
        None | Some("") => None,
        Some(a) if crate::ops::valid_agent_name(a) => Some(a.to_owned()),
        Some(a) => {
            return Err(ApiError::bad_request(format!(
                "`{a}` is not an agent name (letters, digits, `-`, `_`)"
            )));
        }
    };
    let run = match q.run.as_deref() {
        None | Some("") => None,
        Some(r) => {
            let id: RunId = r
                .parse()
                .map_err(|_| ApiError::bad_request(format!("`{r}` is not a run id (a UUID)")))?;
            let record = gw.store.record(id).await?;
            if agent.as_deref().is_some_and(|a| a != record.agent) {
                return Ok(Json(GrantList { grants: vec![] }));
            }
            agent = Some(record.agent);
            Some(id)
        }
    };
    let now = Timestamp::now();
    let grants = gw
        .store
        .grants(agent.as_deref())
        .await?
        .into_iter()
        .filter(|g| run.is_none_or(|r| g.scope == GrantScope::Agent || g.run_id == r))
        .map(|g| view(g, now))
        .filter(|v| state.is_none_or(|s| v.state == s))
        .collect();
    Ok(Json(GrantList { grants }))
}

/// `GET /v1/grants/{grant_id}`
pub async fn get(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    Path(raw): Path<String>,
) -> Result<Json<GrantView>, ApiError> {
    caller(&gw, &headers, ANSWERERS)?;
    let id = grant_id(&raw)?;
    let grant = gw.store.grant(id).await?.ok_or_else(|| missing(id))?;
    Ok(Json(view(grant, Timestamp::now())))
}

fn missing(id: RequestId) -> ApiError {
    ApiError::not_found(format!("no grant {id}; GET /v1/grants lists them"))
}

/// `DELETE /v1/grants/{grant_id}`: by its creator or an operator.
pub async fn revoke(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    Path(raw): Path<String>,
) -> Result<Json<GrantView>, ApiError> {
    let who = caller(&gw, &headers, ANSWERERS)?;
    let id = grant_id(&raw)?;
    let grant = gw.store.grant(id).await?.ok_or_else(|| missing(id))?;
    if let Some(name) = &who.name
        && !who.has(Role::Operate)
        && *name != grant.created_by.id
    {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            format!(
                "`{name}` may not revoke grant {id}: only its creator (`{}`) or an operator may",
                grant.created_by.id
            ),
        ));
    }
    let by = who.name.unwrap_or_else(|| "anonymous".to_owned());
    let revoked = gw
        .store
        .revoke_grant(id, &by, Timestamp::now())
        .await?
        .ok_or_else(|| missing(id))?;
    tracing::info!(grant = %id, by = %by, "grant revoked");
    Ok(Json(view(revoked, Timestamp::now())))
}

/// When this gateway last swept the grants (µs), so that the sweep, which reads every grant, runs
/// once a minute rather than at every reconciler tick.
static LAST_SWEEP: AtomicI64 = AtomicI64::new(0);

/// Retention of grants (from the retention reconciler, with its cut-off): deletes those revoked
/// or expired before `cutoff_us`, and those of scope `run` whose run retention deleted. At most
/// once a minute per gateway. Logs the count only.
pub async fn sweep(gw: &Gateway, cutoff_us: i64) -> Result<usize, ApiError> {
    let now = Timestamp::now().micros();
    let last = LAST_SWEEP.load(Ordering::Relaxed);
    if now - last < 60_000_000
        || LAST_SWEEP
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        return Ok(0);
    }
    let gone = gw.store.purge_grants(cutoff_us).await?;
    if gone > 0 {
        tracing::info!(gone, "grants past retention deleted");
    }
    Ok(gone)
}
