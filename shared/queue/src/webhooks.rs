//! The JetStream side of webhooks (docs/webhooks.md "Delivery"): one durable pull consumer per
//! subscription, `<p>-webhook-<id>`, on the events stream `<P>_INTERACTIONS`, filtered to the
//! subscription's events and agents and starting at the moment it was made. It is a
//! `pinned_client` priority group consumer: every gateway pulls from it, the server delivers to
//! one of them at a time and moves the pin to another when that one stops pulling for
//! `priority_timeout`.

use std::time::Duration;

use async_nats::jetstream::consumer::{self, AckPolicy, DeliverPolicy, PriorityPolicy};

use delta_protocol::Timestamp;
use delta_protocol::events::EventType;

use crate::{Error, Names, Queue, setup};

/// The priority group every gateway pulls a webhook consumer in.
pub const GROUP: &str = "delivery";

/// Unacknowledged messages a webhook consumer hands out at once (across every run): all a
/// delivery session holds.
pub const MAX_ACK_PENDING: i64 = 500;

impl Names {
    /// The durable consumer of webhook subscription `id`.
    pub fn webhook_consumer(&self, id: &str) -> String {
        format!("{}-webhook-{id}", self.prefix)
    }

    /// The subject filters of a subscription to `events` (all when empty) of `agents` (all
    /// when empty), without repeats.
    pub fn webhook_filters(&self, events: &[EventType], agents: &[String]) -> Vec<String> {
        let events: Vec<EventType> = if events.is_empty() {
            EventType::ALL.to_vec()
        } else {
            events.to_vec()
        };
        let star = ["*".to_owned()];
        let agents: &[String] = if agents.is_empty() { &star } else { agents };
        let mut out: Vec<String> = vec![];
        for ty in events {
            for agent in agents {
                let f = self.event_filter(ty, agent);
                if !out.contains(&f) {
                    out.push(f);
                }
            }
        }
        out
    }
}

/// How a webhook consumer is made.
#[derive(Clone, Debug)]
pub struct WebhookConsumer {
    pub id: String,
    pub filters: Vec<String>,
    /// Events published from this moment on are delivered.
    pub start: Timestamp,
    /// How long a delivered message waits for its ack (or a progress ack) before it is
    /// delivered again.
    pub ack_wait: Duration,
    /// How long a pinned gateway may go without pulling before another one takes over.
    pub pin_timeout: Duration,
}

fn start_time(t: Timestamp) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(t.micros()) * 1000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

impl Queue {
    /// Creates the consumer of a subscription, or gets it if it exists (its settings are those
    /// it was made with).
    pub async fn webhook_consumer(
        &self,
        w: &WebhookConsumer,
    ) -> Result<consumer::PullConsumer, Error> {
        let name = self.names.webhook_consumer(&w.id);
        let stream = self
            .js
            .get_stream(self.names.interactions_stream())
            .await
            .map_err(|e| setup(&name)(e.into()))?;
        if let Ok(c) = stream.get_consumer(&name).await {
            return Ok(c);
        }
        stream
            .get_or_create_consumer(
                &name,
                consumer::pull::Config {
                    durable_name: Some(name.clone()),
                    description: Some("webhook subscription (docs/webhooks.md)".into()),
                    filter_subjects: w.filters.clone(),
                    deliver_policy: DeliverPolicy::ByStartTime {
                        start_time: start_time(w.start),
                    },
                    ack_policy: AckPolicy::Explicit,
                    ack_wait: w.ack_wait,
                    max_ack_pending: MAX_ACK_PENDING,
                    priority_policy: PriorityPolicy::PinnedClient,
                    priority_groups: vec![GROUP.to_owned()],
                    priority_timeout: w.pin_timeout,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| setup(&name)(e.into()))
    }

    /// Deletes the consumer of a subscription (its undelivered events with it); `Ok(false)`
    /// when there was none.
    pub async fn delete_webhook_consumer(&self, id: &str) -> Result<bool, Error> {
        let name = self.names.webhook_consumer(id);
        let stream = self
            .js
            .get_stream(self.names.interactions_stream())
            .await
            .map_err(|e| setup(&name)(e.into()))?;
        match stream.delete_consumer(&name).await {
            Ok(_) => Ok(true),
            Err(e)
                if matches!(
                    e.kind(),
                    async_nats::jetstream::stream::ConsumerErrorKind::JetStream(j)
                        if j.error_code() == async_nats::jetstream::ErrorCode::CONSUMER_NOT_FOUND
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(setup(&name)(e.into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_cover_each_event_and_agent_once() {
        let n = Names::new("delta");
        let all = n.webhook_filters(&[], &[]);
        // The three settled states share one subject.
        assert_eq!(all.len(), EventType::ALL.len() - 2);
        assert!(all.contains(&"delta.interactions.resolved.*.*".to_owned()));
        let some = n.webhook_filters(
            &[
                EventType::InteractionAnswered,
                EventType::InteractionExpired,
                EventType::RunCompleted,
            ],
            &["hello".into(), "deployer".into()],
        );
        assert_eq!(
            some,
            vec![
                "delta.interactions.resolved.hello.*",
                "delta.interactions.resolved.deployer.*",
                "delta.runs.completed.hello.*",
                "delta.runs.completed.deployer.*",
            ]
        );
    }
}
