//! `SendStreamingMessage` and `SubscribeToTask`: server-sent events, each a JSON-RPC response
//! whose `result` is a `StreamResponse`: the task first, then a `statusUpdate` each time its state
//! or question changes. The stream ends after a terminal or interrupted (`input-required`,
//! `auth-required`) state, as A2A's own servers end theirs: a client answers and subscribes
//! again.
//!
//! Fed by the run's live events ([`super::events`]): each one wakes the stream, which reads the
//! task from the store (the one truth) and sends it if it changed. The consumer is made before
//! the first read, so nothing that happens after the read is missed; a read every few seconds
//! besides is a safety net for an event that never came (a NATS hiccup).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use delta_protocol::RunId;

use super::rpc::{self, Call, READ, RpcError};
use super::task::{self, LinkFor};
use crate::Gateway;
use crate::api::caller;

/// How often a followed task is read even without an event.
const RECHECK: Duration = Duration::from_secs(5);

fn sse_data(id: &Value, result: Value) -> Event {
    Event::default().data(json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string())
}

pub async fn handle(gw: Arc<Gateway>, headers: HeaderMap, call: Call) -> Response {
    let id = call.id.clone();
    match start(&gw, &headers, call).await {
        Ok(r) => r,
        Err(e) => rpc::response(&id, Err(e)),
    }
}

async fn start(gw: &Arc<Gateway>, headers: &HeaderMap, call: Call) -> Result<Response, RpcError> {
    let who = caller(gw, headers, READ)?;
    let permit = crate::sse::stream_permit(gw, &who)?;
    // The live consumer is made before anything is done where the task is known, so that a
    // failure to make it refuses the call before an answer is taken; for a new task, after it
    // started, a failure only leaves the stream to its reads every RECHECK.
    let (run_id, events, push_error) = if call.method == "SubscribeToTask" {
        let q: rpc::TaskQuery = rpc::params(call.params)?;
        let run_id = rpc::task_id(&q.id)?;
        gw.store.record(run_id).await?;
        let events = super::events::live(gw, run_id).await?;
        (run_id, Some(events), None)
    } else {
        let p: rpc::SendParams = rpc::params(call.params)?;
        let known = match p.message.task_id.as_deref() {
            Some(t) if !t.is_empty() => Some(rpc::task_id(t)?),
            _ => None,
        };
        let early = match known {
            Some(run_id) => Some(super::events::live(gw, run_id).await?),
            None => None,
        };
        let sent = rpc::accept_message(gw, headers, p).await?;
        let events = match early {
            Some(e) => Some(e),
            None => super::events::live(gw, sent.run_id).await.ok(),
        };
        (sent.run_id, events, sent.push_error)
    };
    let mut first = task::snapshot(
        gw,
        run_id,
        Some(LinkFor {
            headers,
            identity: &who,
        }),
    )
    .await?;
    if let Some(e) = push_error {
        first.task["metadata"]["pushNotificationConfigError"] = json!(e);
    }
    let (tx, rx) = mpsc::channel::<Event>(16);
    let id = call.id;
    let gw2 = gw.clone();
    let headers = headers.clone();
    gw.tasks.spawn(async move {
        let _permit = permit;
        let mut events = std::pin::pin!(futures_util::stream::iter(events).flatten());
        let mut last = first.key();
        let done = first.state.is_terminal() || first.state.is_interrupted();
        if tx
            .send(sse_data(&id, json!({"task": first.task})))
            .await
            .is_err()
            || done
        {
            return;
        }
        // Once the events end (NATS gone), the reads every RECHECK go on alone.
        let mut live = true;
        loop {
            tokio::select! {
                e = events.next(), if live => live = e.is_some(),
                () = tokio::time::sleep(RECHECK) => {}
                () = tx.closed() => return,
                () = gw2.shutdown.cancelled() => return,
            }
            let link = LinkFor {
                headers: &headers,
                identity: &who,
            };
            let now = match task::snapshot(&gw2, run_id, Some(link)).await {
                Ok(s) => s,
                Err(e) => {
                    let error =
                        json!({"jsonrpc": "2.0", "id": id, "error": RpcError::from(e).body()});
                    let _ = tx.send(Event::default().data(error.to_string())).await;
                    return;
                }
            };
            if now.key() == last {
                continue;
            }
            last = now.key();
            let end = now.state.is_terminal() || now.state.is_interrupted();
            if tx
                .send(sse_data(&id, json!({"statusUpdate": now.status_update()})))
                .await
                .is_err()
                || end
            {
                return;
            }
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|e| (Ok::<_, Infallible>(e), rx))
    });
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

/// Returns once `run_id` waits on someone or is over (or cannot be read).
pub async fn settled(gw: &Gateway, run_id: RunId) {
    let events = super::events::live(gw, run_id).await;
    let mut events = match events {
        Ok(e) => Some(Box::pin(e)),
        Err(_) => None,
    };
    let mut live = events.is_some();
    loop {
        match task::snapshot(gw, run_id, None).await {
            Ok(s) if s.state.is_terminal() || s.state.is_interrupted() => return,
            Ok(_) => {}
            Err(_) => return,
        }
        match &mut events {
            Some(e) if live => {
                tokio::select! {
                    next = e.next() => live = next.is_some(),
                    () = tokio::time::sleep(RECHECK) => {}
                }
            }
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}
