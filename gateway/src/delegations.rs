//! Delegations (docs/protocol.md §3 "Delegation"): `POST /v1/delegations` lets `to` answer what
//! `from` may until `until`; `GET` lists those in force; `DELETE /v1/delegations/{id}` ends one.
//! They are kept in Redis (one hash), so every gateway applies the same ones; the answer path
//! ([`crate::ops`]) looks one up only when someone answers what they may not on their own.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use delta_api::{DelegationBody, DelegationPage, ErrorCode};
use delta_protocol::{Delegation, Timestamp};

use crate::Gateway;
use crate::api::{ANSWERERS, caller, strict_json};
use crate::auth::{RESERVED_RESPONDERS, Role};
use crate::error::ApiError;

/// The longest a delegation may last.
const MAX_DAYS: i64 = 90;

/// The most delegations one person's authority may have in force at once.
const MAX_PER_PERSON: usize = 50;

type Shared = State<Arc<Gateway>>;

fn body<T: serde::de::DeserializeOwned>(
    bytes: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let bytes = crate::api::body_bytes(bytes)?;
    if bytes.is_empty() {
        return Err(ApiError::bad_request(
            "the body is empty: send the delegation as JSON",
        ));
    }
    strict_json(&bytes)
}

/// A name a delegation may hold: non-empty, at most 200 characters, not one of the fleet's own.
fn check_name(what: &str, name: &str) -> Result<(), ApiError> {
    if name.trim().is_empty() || name.len() > 200 {
        return Err(ApiError::new(
            ErrorCode::InvalidArgs,
            format!("`{what}` must be a responder id of 1 to 200 characters"),
        ));
    }
    if RESERVED_RESPONDERS.contains(&name.to_lowercase().as_str()) {
        return Err(ApiError::new(
            ErrorCode::InvalidArgs,
            format!("`{what}`: `{name}` is the fleet's own responder id"),
        ));
    }
    Ok(())
}

pub async fn create(
    State(gw): Shared,
    headers: HeaderMap,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let who = caller(&gw, &headers, ANSWERERS)?;
    let b: DelegationBody = body(bytes)?;
    let operator = who.has(Role::Operate);
    let from = match (&b.from, &who.name) {
        (Some(f), Some(me)) if f != me && !operator => {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                format!(
                    "you are `{me}`: you may delegate your own authority, not `{f}`'s (an operator may)"
                ),
            ));
        }
        (Some(f), _) => f.clone(),
        (None, Some(me)) => me.clone(),
        (None, None) => {
            return Err(ApiError::bad_request(
                "say whose authority is delegated: `from` (this gateway has no tokens to tell who you are)",
            ));
        }
    };
    check_name("from", &from)?;
    check_name("to", &b.to)?;
    if from == b.to {
        return Err(ApiError::new(
            ErrorCode::InvalidArgs,
            "`from` and `to` are the same person",
        ));
    }
    if gw.config.auth.is_on() {
        for (what, name) in [("from", &from), ("to", &b.to)] {
            if !gw.config.auth.knows(name) {
                return Err(ApiError::new(
                    ErrorCode::InvalidArgs,
                    format!("`{what}`: no token of this gateway is named `{name}`"),
                ));
            }
        }
    }
    let now = Timestamp::now();
    let days = (b.until.micros() - now.micros()) / 86_400_000_000;
    if b.until.micros() <= now.micros() || days >= MAX_DAYS {
        return Err(ApiError::new(
            ErrorCode::InvalidArgs,
            format!("`until` must be in the future and at most {MAX_DAYS} days ahead"),
        ));
    }
    if b.reason.as_ref().is_some_and(|r| r.len() > 500) {
        return Err(ApiError::new(
            ErrorCode::InvalidArgs,
            "`reason` is longer than 500 characters",
        ));
    }
    // One delegation per pair (a new one replaces it), and a bounded number per person: the
    // answer path reads them.
    let now_in_force = gw.store.delegations(now).await?;
    let from_count = now_in_force.iter().filter(|d| d.from == from).count();
    let replaces = now_in_force.iter().any(|d| d.from == from && d.to == b.to);
    if !replaces && from_count >= MAX_PER_PERSON {
        return Err(ApiError::new(
            ErrorCode::InvalidArgs,
            format!("`{from}` has {MAX_PER_PERSON} delegations in force already: end one first"),
        ));
    }
    let d = Delegation {
        id: uuid::Uuid::now_v7().to_string(),
        from,
        to: b.to,
        until: b.until,
        created_by: who.name.clone().unwrap_or_else(|| "anonymous".into()),
        created_at: now,
        reason: b.reason.filter(|r| !r.trim().is_empty()),
    };
    // Replaces the pair's delegation in the same step.
    gw.store.put_delegation(&d).await?;
    tracing::info!(id = %d.id, from = %d.from, to = %d.to, until = %d.until, "delegation made");
    Ok((StatusCode::CREATED, Json(d)).into_response())
}

pub async fn list(State(gw): Shared, headers: HeaderMap) -> Result<Json<DelegationPage>, ApiError> {
    caller(&gw, &headers, ANSWERERS)?;
    Ok(Json(DelegationPage {
        delegations: gw.store.delegations(Timestamp::now()).await?,
    }))
}

pub async fn delete(
    State(gw): Shared,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Delegation>, ApiError> {
    let who = caller(&gw, &headers, ANSWERERS)?;
    let missing = || {
        ApiError::not_found(format!(
            "no delegation {id} in force; GET /v1/delegations lists them"
        ))
    };
    let d = gw
        .store
        .delegations(Timestamp::now())
        .await?
        .into_iter()
        .find(|d| d.id == id)
        .ok_or_else(missing)?;
    let mine = who
        .name
        .as_deref()
        .is_some_and(|me| me == d.from || me == d.created_by);
    if !mine && !who.has(Role::Operate) {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            "only its `from`, whoever made it, or an operator may end a delegation",
        ));
    }
    if !gw.store.delete_delegation(&id).await? {
        return Err(missing());
    }
    tracing::info!(id = %d.id, from = %d.from, to = %d.to, "delegation ended");
    Ok(Json(d))
}
