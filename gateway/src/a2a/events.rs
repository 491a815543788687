//! A run's live events, from the events stream (docs/protocol.md §4): its questions' and its
//! end's CloudEvents, read through an ordered consumer filtered to the run.

use async_nats::jetstream::{self, consumer};
use futures_util::{Stream, StreamExt};

use delta_protocol::RunId;

use crate::Gateway;
use crate::error::ApiError;

/// The subject filters of one run's events: its questions' and its end's.
pub fn run_filters(gw: &Gateway, run_id: RunId) -> Vec<String> {
    let p = &gw.config.prefix;
    vec![
        format!("{p}.interactions.*.*.{run_id}"),
        format!("{p}.runs.*.*.{run_id}"),
    ]
}

fn unavailable(e: impl std::fmt::Display) -> ApiError {
    tracing::warn!(error = %e, "a2a: cannot follow a run's events");
    ApiError::unavailable("cannot read the fleet's events (NATS); try again")
}

/// The events of `run_id` published from now on, each as its CloudEvent's bytes.
pub async fn live(
    gw: &Gateway,
    run_id: RunId,
) -> Result<impl Stream<Item = Vec<u8>> + Send + use<>, ApiError> {
    let js = jetstream::new(gw.queue.client().clone());
    let stream = js
        .get_stream(gw.queue.names().interactions_stream())
        .await
        .map_err(unavailable)?;
    let messages = stream
        .create_consumer(consumer::pull::OrderedConfig {
            deliver_policy: consumer::DeliverPolicy::New,
            filter_subjects: run_filters(gw, run_id),
            ..Default::default()
        })
        .await
        .map_err(unavailable)?
        .messages()
        .await
        .map_err(unavailable)?;
    Ok(messages.filter_map(|m| async move { m.ok().map(|m| m.payload.to_vec()) }))
}
