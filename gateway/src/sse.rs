//! Server-sent events.
//!
//! - `GET /v1/runs/{run_id}/events`: the run's journal, each event with `id` = its `seq`, from
//!   `Last-Event-ID` + 1 (or `?from_seq=`) on, live; after the terminal `ENGINE_END`, one
//!   `status` event (`{"status", "result", "error"}`) and the stream ends. A client that
//!   reconnects with the last id it saw gets every later event exactly once.
//! - `GET /v1/interactions/stream`: `requested`, `updated` (a claim or a vote), `escalated` and
//!   `resolved` events, live, each with `id` =
//!   its sequence in the interactions stream, so a reconnect with `Last-Event-ID` catches up
//!   on what it missed (for as long as the stream keeps it, 7 days by default).
//!
//! Both end when the gateway shuts down. A client opens them with `Authorization: Bearer`, or,
//! when it cannot set headers (a browser's `EventSource`), with `?ticket=`: a one-time ticket for
//! that stream from `POST /v1/stream-tickets` ([`crate::tickets`]). The token itself is never
//! taken from a URL, which proxies log: `?access_token=` is refused.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::{Stream, StreamExt};
use tokio::sync::mpsc;

use delta_api::{ErrorCode, RunEnded, StreamQuery, StreamTarget, sse};
use delta_protocol::{Event as JournalEventKind, RunId};

use crate::Gateway;
use crate::api::caller;
use crate::auth::Identity;
use crate::error::ApiError;

fn last_event_id(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    match headers.get("last-event-id") {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .map(Some)
            .ok_or_else(|| ApiError::bad_request("Last-Event-ID must be a whole number")),
    }
}

/// Whether a query string holds an `access_token` parameter (the name compared as sent).
fn has_access_token(raw: Option<&str>) -> bool {
    raw.unwrap_or_default()
        .split('&')
        .any(|pair| pair.split('=').next() == Some("access_token"))
}

/// Who opens a live stream, and the stream's query: the holder of a one-time ticket for
/// `target` (`?ticket=`), else of a bearer token in `Authorization` with one of the stream's
/// roles. A token in the URL (`?access_token=`) is refused without being looked at: it may be
/// in some proxy's log already, which the warning says (never the token).
async fn stream_caller(
    gw: &Gateway,
    headers: &HeaderMap,
    raw: Option<&str>,
    q: Result<Query<StreamQuery>, QueryRejection>,
    target: impl FnOnce() -> Result<StreamTarget, ApiError>,
) -> Result<(Identity, StreamQuery), ApiError> {
    if has_access_token(raw) {
        tracing::warn!(
            "a live stream was asked for with the bearer token in its URL (?access_token=), refused; the token may be in proxy logs now: consider rotating it"
        );
        return Err(ApiError::bad_request(
            "a token in the URL (`?access_token=`) is not accepted: URLs end up in proxy logs. Send `Authorization: Bearer <token>`, or get a one-time ticket with POST /v1/stream-tickets and pass `?ticket=<ticket>`",
        ));
    }
    let q = q
        .map(|Query(q)| q)
        .map_err(|e| ApiError::bad_request(format!("bad query string: {}", e.body_text())))?;
    let target = target()?;
    let who = match q.ticket.as_deref() {
        Some(ticket) => crate::tickets::redeem(gw, ticket, &target).await?,
        None => {
            let roles = crate::tickets::roles_for(&target);
            caller(gw, headers, roles).map_err(|e| {
                if e.code == ErrorCode::Unauthorized && headers.get("authorization").is_none() {
                    ApiError::new(
                        ErrorCode::Unauthorized,
                        "this gateway needs `Authorization: Bearer <token>`, or `?ticket=` with a one-time ticket from POST /v1/stream-tickets (for clients that cannot set headers); ask an operator for a token",
                    )
                } else {
                    e
                }
            })?
        }
    };
    Ok((who, q))
}

/// `e`, saying that the ticket the stream was asked with is spent: a ticket opens one stream,
/// once, and was redeemed before the stream could be refused (a retry needs a new one).
fn ticket_spent(mut e: ApiError, q: &StreamQuery) -> ApiError {
    if q.ticket.is_some() {
        e.message
            .push_str("; the ticket is spent: ask for a new one with POST /v1/stream-tickets");
    }
    e
}

/// Live streams held by each identity (see [`Gateway::streams_by_identity`]).
type HeldStreams = Arc<std::sync::Mutex<HashMap<String, usize>>>;

/// A live stream's hold on the gateway: one of its slots and, with authentication on, one of its
/// identity's. Both are given back when the stream ends.
pub struct StreamSlot {
    _permit: tokio::sync::OwnedSemaphorePermit,
    /// The identity whose count this slot holds, and the counts.
    holder: Option<(HeldStreams, String)>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        if let Some((counts, name)) = self.holder.take() {
            let mut counts = counts.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(n) = counts.get_mut(&name) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    counts.remove(&name);
                }
            }
        }
    }
}

/// One of the gateway's live-stream slots (each holds a Redis connection or a NATS consumer),
/// and, with authentication on, one of the caller's: a token holds at most
/// `DELTA_MAX_STREAMS_PER_IDENTITY` streams at once, so one token cannot take every slot.
pub fn stream_permit(gw: &Gateway, who: &Identity) -> Result<StreamSlot, ApiError> {
    let permit = gw.streams.clone().try_acquire_owned().map_err(|_| {
        ApiError::unavailable("this gateway serves as many live streams as it can; try again shortly or use another gateway")
    })?;
    let Some(name) = &who.name else {
        return Ok(StreamSlot {
            _permit: permit,
            holder: None,
        });
    };
    let mut counts = gw
        .streams_by_identity
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let held = counts.entry(name.clone()).or_insert(0);
    if *held >= gw.config.max_streams_per_identity {
        // The caller's own quota, not the gateway's trouble: `rate_limited` (429).
        return Err(ApiError::new(
            ErrorCode::RateLimited,
            format!(
                "`{name}` holds {held} live streams, as many as one token may (DELTA_MAX_STREAMS_PER_IDENTITY); close one first"
            ),
        ));
    }
    *held += 1;
    Ok(StreamSlot {
        _permit: permit,
        holder: Some((gw.streams_by_identity.clone(), name.clone())),
    })
}

/// A stream fed by a task that stops when the client goes or the gateway shuts down.
fn channel_stream(rx: mpsc::Receiver<Event>) -> impl Stream<Item = Result<Event, Infallible>> {
    futures_util::stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|e| (Ok(e), rx)) },
    )
}

pub async fn run_events(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    Path(raw): Path<String>,
    RawQuery(query): RawQuery,
    q: Result<Query<StreamQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let parse = || {
        raw.parse::<RunId>()
            .map_err(|_| ApiError::bad_request(format!("`{raw}` is not a run id (a UUID)")))
    };
    // The client's own input first: a bad one spends no ticket.
    let last = last_event_id(&headers)?;
    let (who, q) = stream_caller(&gw, &headers, query.as_deref(), q, || {
        parse().map(|run_id| StreamTarget::Run { run_id })
    })
    .await?;
    let run_id = parse()?;
    // 404 now rather than an empty stream.
    gw.store
        .record(run_id)
        .await
        .map_err(|e| ticket_spent(e.into(), &q))?;
    let after = match last {
        Some(id) => id,
        None => q.from_seq.map(|s| s.saturating_sub(1)).unwrap_or(0),
    };
    let permit = stream_permit(&gw, &who).map_err(|e| ticket_spent(e, &q))?;
    let (tx, rx) = mpsc::channel(64);
    let gw2 = gw.clone();
    gw.tasks.spawn(async move {
        let _permit = permit;
        let shutdown = gw2.shutdown.clone();
        tokio::select! {
            () = follow_journal(&gw2, run_id, after, tx) => {}
            () = shutdown.cancelled() => {}
        }
    });
    Ok(Sse::new(channel_stream(rx))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

/// Sends journal events after `after` until the run ends (then its status) or the client goes.
async fn follow_journal(gw: &Gateway, run_id: RunId, mut after: u64, tx: mpsc::Sender<Event>) {
    let mut tail: Option<delta_store::redis::JournalTail> = None;
    let mut failures = 0u32;
    let mut caught_up = false;
    loop {
        // First what is there already, then live (blocking reads on the tail's own connection).
        if tx.is_closed() {
            return;
        }
        let read = match (&mut tail, caught_up) {
            (_, false) => {
                gw.store
                    .journal_from(run_id, after.saturating_add(1), 1000)
                    .await
            }
            (Some(t), true) => t.next(after, 10_000).await,
            (None, true) => match gw.store.journal_tail(run_id).await {
                Ok(t) => {
                    tail = Some(t);
                    continue;
                }
                Err(e) => Err(e),
            },
        };
        let mut events = match read {
            Ok(e) => {
                failures = 0;
                e
            }
            Err(e) => {
                // The tail's own connection does not reconnect: drop it and catch up afresh.
                // After a while the stream ends; the client reconnects with Last-Event-ID.
                failures += 1;
                tracing::warn!(error = %delta_host::Chain(&e), failures, "journal stream read failed");
                if failures >= 20 {
                    return;
                }
                tail = None;
                caught_up = false;
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        if events.is_empty() {
            caught_up = true;
            if tx.is_closed() {
                return;
            }
            // Nothing new: a run that is over says so and the stream ends. Its last events may
            // have landed between the read above and the record's: read what follows once more
            // (they went in with the final status, so they are visible now).
            let Ok(r) = gw.store.record(run_id).await else {
                continue;
            };
            if !r.status.is_terminal() {
                continue;
            }
            events = gw
                .store
                .journal_from(run_id, after.saturating_add(1), 1000)
                .await
                .unwrap_or_default();
            if events.is_empty() {
                let _ = tx
                    .send(ended(RunEnded {
                        status: r.status,
                        result: r.result,
                        error: r.error,
                    }))
                    .await;
                return;
            }
        }
        for e in events {
            after = e.seq;
            let end = match &e.event {
                JournalEventKind::EngineEnd(end) if end.status.is_terminal() => Some(end.clone()),
                _ => None,
            };
            let data = serde_json::to_string(&e).unwrap_or_default();
            let event = Event::default()
                .id(e.seq.to_string())
                .event(sse::JOURNAL)
                .data(data);
            if tx.send(event).await.is_err() {
                return;
            }
            if let Some(end) = end {
                let _ = tx
                    .send(ended(RunEnded {
                        status: end.status,
                        result: end.result,
                        error: end.error,
                    }))
                    .await;
                return;
            }
        }
    }
}

/// The `status` event that ends a run's stream.
fn ended(status: RunEnded) -> Event {
    // Plain data (a status and strings) always serializes.
    let data = serde_json::to_string(&status).unwrap_or_default();
    Event::default().event(sse::STATUS).data(data)
}

pub async fn interaction_events(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
    q: Result<Query<StreamQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    // The client's own input first: a bad one spends no ticket.
    let last = last_event_id(&headers)?;
    let (who, q) = stream_caller(&gw, &headers, query.as_deref(), q, || {
        Ok(StreamTarget::Interactions {})
    })
    .await?;
    let from = last.map(|id| id.saturating_add(1)).or(q.from_seq);
    let permit = stream_permit(&gw, &who).map_err(|e| ticket_spent(e, &q))?;
    let mut events = gw
        .queue
        .interaction_events(from)
        .await
        .map_err(|e| ticket_spent(e.into(), &q))?
        .boxed();
    let agent = q.agent.clone();
    let (tx, rx) = mpsc::channel(64);
    let shutdown = gw.shutdown.clone();
    gw.tasks.spawn(async move {
        let _permit = permit;
        loop {
            let next = tokio::select! {
                e = events.next() => e,
                () = shutdown.cancelled() => return,
                () = tx.closed() => return,
            };
            let Some(e) = next else { return };
            if agent.as_ref().is_some_and(|a| *a != e.agent) {
                continue;
            }
            let event = Event::default()
                .id(e.seq.to_string())
                .event(e.kind)
                .data(String::from_utf8_lossy(&e.payload));
            if tx.send(event).await.is_err() {
                return;
            }
        }
    });
    Ok(Sse::new(channel_stream(rx))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}
