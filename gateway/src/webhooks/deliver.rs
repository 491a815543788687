//! Delivering webhooks (docs/webhooks.md "Delivery").
//!
//! Every gateway runs [`run`]: once a second it lists the subscriptions and keeps one session
//! per active one, pulling from the subscription's durable consumer in the priority group
//! [`delta_queue::webhooks::GROUP`]. The consumer is `pinned_client`: the server hands its
//! messages to one session at a time and moves the pin when that one stops pulling for
//! `DELTA_WEBHOOK_ACK_WAIT_S` (a dead or cut-off gateway).
//!
//! Within a session, events are held in stream order and each run's are posted one at a time:
//! a later event of a run waits while an earlier one is retried (with exponential backoff and
//! jitter, kept alive by progress acks); other runs go on. An event is acknowledged once its
//! receiver answered 2xx, so nothing is lost (at least once: a receiver may see an event again,
//! with the same `webhook-id`).
//!
//! **Takeovers.** Events the previous holder had not acknowledged are handed out again only
//! when their ack wait passes, possibly after later events of the same run. So a session that
//! finds events in flight elsewhere when it starts (the consumer's ack floor is below its first
//! delivery: something handed out earlier is not acknowledged) first waits one ack wait, holding what it receives, and then delivers in
//! stream order: per-run order holds across a takeover (a gateway cut off from NATS but still
//! posting could, during that window, post an event a second time: a duplicate, never a loss).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::AckKind;
use async_nats::jetstream::consumer::PullConsumer;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use delta_protocol::Timestamp;
use delta_protocol::events::{EventType, STRUCTURED_CONTENT_TYPE};
use delta_queue::webhooks::{GROUP, WebhookConsumer};
use delta_store::redis::{Webhook, WebhookSecrets, WebhookState};

use super::{Settings, allow, sign};
use crate::Gateway;

/// Events of one subscription posted at once (each of another run).
const MAX_IN_FLIGHT: usize = 16;
/// How often the subscriptions are listed.
const EVERY: Duration = Duration::from_secs(1);

/// The consumer of subscription `w` to `events`.
pub fn consumer_of(gw: &Gateway, w: &Webhook, events: &[EventType]) -> WebhookConsumer {
    let s = &gw.config.webhooks;
    WebhookConsumer {
        id: w.id.clone(),
        filters: gw.queue.names().webhook_filters(events, &w.agents),
        start: w.created_at,
        ack_wait: s.ack_wait,
        pin_timeout: s.ack_wait,
    }
}

fn event_types(w: &Webhook) -> Vec<EventType> {
    w.events.iter().filter_map(|e| e.parse().ok()).collect()
}

/// The delay before retry `attempt` (1, 2, …): `first`, doubled each time up to `max`, of which
/// a random half is taken off (`jitter` in 0..1), so that receivers coming back are not hit by
/// every retry at once.
pub fn backoff(first: Duration, max: Duration, attempt: u32, jitter: f64) -> Duration {
    let exp = attempt.saturating_sub(1).min(40);
    let full = first.as_secs_f64() * 2f64.powi(i32::try_from(exp).unwrap_or(40));
    let capped = full.min(max.as_secs_f64());
    Duration::from_secs_f64(capped * (1.0 - 0.5 * jitter.clamp(0.0, 1.0)))
}

fn jitter() -> f64 {
    // 53 random bits from a v4 UUID (the process' CSPRNG): enough for spreading retries.
    let bits = (uuid::Uuid::new_v4().as_u128() >> 75) as u64;
    bits as f64 / (1u64 << 53) as f64
}

/// The HTTP client webhooks are posted with: no redirects, no proxies from the environment,
/// timeouts on every call, and names resolved only to allowed addresses.
pub fn client(s: &Settings) -> Result<reqwest::Client, reqwest::Error> {
    // reqwest is built without a default TLS provider: install ring once per process.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .dns_resolver(Arc::new(allow::Resolver {
            allow: s.allow.clone(),
        }))
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .connect_timeout(s.connect_timeout)
        .timeout(s.timeout)
        .user_agent(concat!("delta-fleet-webhooks/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// Keeps a delivery session per active subscription until shutdown.
pub async fn run(gw: Arc<Gateway>) {
    // Without the key it cannot open the signing secrets: it must not take the pin from a
    // gateway that can (nor count its own failures against the receivers).
    if !gw.store.can_seal() {
        tracing::info!("webhooks: no DELTA_SECRETS_KEY; this gateway delivers none");
        return;
    }
    let http = match client(&gw.config.webhooks) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %delta_host::Chain(&e), "webhooks: no HTTP client; none will be delivered by this gateway");
            return;
        }
    };
    let mut sessions: HashMap<String, (CancellationToken, tokio::task::JoinHandle<()>)> =
        HashMap::new();
    loop {
        tokio::select! {
            () = tokio::time::sleep(EVERY) => {}
            () = gw.shutdown.cancelled() => break,
        }
        sessions.retain(|_, (_, h)| !h.is_finished());
        let list = match gw.store.webhooks().await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %delta_host::Chain(&e), "webhooks: cannot list subscriptions");
                continue;
            }
        };
        let active: HashSet<&str> = list
            .iter()
            .filter(|w| w.state == WebhookState::Active)
            .map(|w| w.id.as_str())
            .collect();
        for (id, (stop, _)) in &sessions {
            if !active.contains(id.as_str()) {
                stop.cancel();
            }
        }
        for w in list {
            if w.state != WebhookState::Active || sessions.contains_key(&w.id) {
                continue;
            }
            let stop = gw.shutdown.child_token();
            let id = w.id.clone();
            let handle = tokio::spawn(session(gw.clone(), http.clone(), w, stop.clone()));
            sessions.insert(id, (stop, handle));
        }
    }
    for (_, (stop, handle)) in sessions {
        stop.cancel();
        let _ = handle.await;
    }
}

/// What became of an event.
enum Outcome {
    /// Posted and answered 2xx.
    Delivered,
    /// The subscription was disabled, deleted or the gateway stops: the session ends, and the
    /// event is left to be handed out again.
    Stop,
    /// This gateway cannot open the subscription's signing secret (its `DELTA_SECRETS_KEY`
    /// lacks the key that sealed it): it gives the subscription up for a while, so that a
    /// gateway that can takes the pin.
    CannotSign,
}

/// How many times in a row a gateway fails to open a subscription's signing secret before it
/// gives the subscription up for a while ([`hand_off`]).
const SIGN_TRIES: u32 = 3;

/// How long a gateway that cannot sign stays away from a subscription whose consumer's ack wait
/// (its pin's timeout, set when the consumer was made) is `ack_wait`: that a few times over, so
/// that another gateway's pull takes the pin.
fn hand_off(ack_wait: Duration) -> Duration {
    (ack_wait * 3).max(Duration::from_secs(10))
}

/// An event handed to this session and not yet acknowledged.
struct Held {
    msg: async_nats::jetstream::Message,
    run: String,
    id: String,
    in_flight: bool,
}

/// The few fields of a CloudEvent a delivery needs; the body is posted as it was published.
#[derive(serde::Deserialize)]
struct Head {
    specversion: String,
    id: String,
    #[serde(rename = "type")]
    ty: String,
    deltarun: String,
}

async fn session(gw: Arc<Gateway>, http: reqwest::Client, w: Webhook, stop: CancellationToken) {
    let pause = match session_inner(&gw, &http, &w, &stop).await {
        Ok(Some(away)) => {
            tracing::error!(id = %w.id, away_s = away.as_secs(), "webhooks: this gateway cannot open the subscription's signing secret (is the key that sealed it in DELTA_SECRETS_KEY?); leaving it to another gateway for a while");
            away
        }
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(id = %w.id, error = %e, "webhook delivery session ended; starting again");
            Duration::from_secs(1)
        }
    };
    tokio::select! {
        () = tokio::time::sleep(pause) => {}
        () = stop.cancelled() => {}
    }
}

async fn session_inner(
    gw: &Arc<Gateway>,
    http: &reqwest::Client,
    w: &Webhook,
    stop: &CancellationToken,
) -> Result<Option<Duration>, String> {
    let s = &gw.config.webhooks;
    let events = event_types(w);
    let wanted: HashSet<String> = events.iter().map(|e| e.ce_type()).collect();
    let mut consumer: PullConsumer = gw
        .queue
        .webhook_consumer(&consumer_of(gw, w, &events))
        .await
        .map_err(|e| delta_host::Chain(&e).to_string())?;
    // The consumer's own ack wait (set when it was made; DELTA_WEBHOOK_ACK_WAIT_S may have
    // changed since): progress acks and a takeover's wait follow it.
    let ack_wait = match consumer.cached_info().config.ack_wait {
        d if d.is_zero() => s.ack_wait,
        d => d,
    };
    // Pulls expire well within the pin's timeout, so that a live session keeps its pin.
    let expires = (ack_wait / 3).max(Duration::from_millis(500));
    let mut messages = consumer
        .stream()
        .group(GROUP)
        .max_messages_per_batch(100)
        .expires(expires)
        .heartbeat(expires / 4)
        .messages()
        .await
        .map_err(|e| format!("cannot pull: {e}"))?;
    let mut held: BTreeMap<u64, Held> = BTreeMap::new();
    let mut busy: HashSet<String> = HashSet::new();
    let mut in_flight = FuturesUnordered::new();
    let mut started = false;
    let mut barrier: Option<Instant> = None;
    // The pin this session was handed events under (`Nats-Pin-Id`): once the server pins
    // another gateway (this one stopped pulling long enough, or was cut off), this session must
    // stop at once, without acking what it holds, which the server hands to the new holder
    // after its ack wait; two gateways posting a subscription's events would break their order.
    let mut pin: Option<String> = None;
    let mut keepalive = tokio::time::interval((ack_wait / 3).max(Duration::from_millis(300)));
    loop {
        if started && barrier.is_none() {
            for (seq, h) in held.iter_mut() {
                if in_flight.len() >= MAX_IN_FLIGHT {
                    break;
                }
                if h.in_flight || busy.contains(&h.run) {
                    continue;
                }
                h.in_flight = true;
                busy.insert(h.run.clone());
                let body = h.msg.payload.clone();
                let (gw, http, id, event_id, seq, stop) = (
                    gw.clone(),
                    http.clone(),
                    w.id.clone(),
                    h.id.clone(),
                    *seq,
                    stop.clone(),
                );
                in_flight.push(async move {
                    (
                        seq,
                        attempts(&gw, &http, &id, &event_id, &body, &stop).await,
                    )
                });
            }
        }
        tokio::select! {
            () = stop.cancelled() => return Ok(None),
            // Always pulling, so the pin stays here: the consumer's max_ack_pending
            // (`delta_queue::webhooks::MAX_ACK_PENDING`) bounds what is held. During a takeover's wait every event is taken,
            // so that the previous holder's come back before any is posted.
            m = messages.next() => {
                let msg = match m {
                    None => return Err("the pull ended".into()),
                    Some(Err(e)) => return Err(format!("pull: {e}")),
                    Some(Ok(msg)) => msg,
                };
                let Ok((info, consumer_seq)) =
                    msg.info().map(|i| (i.stream_sequence, i.consumer_sequence))
                else {
                    continue;
                };
                if let Some(p) = msg.headers.as_ref().and_then(|h| h.get("Nats-Pin-Id")) {
                    pin = Some(p.as_str().to_owned());
                }
                let head: Option<Head> = serde_json::from_slice(&msg.payload).ok();
                let Some(head) = head.filter(|h| h.specversion == "1.0") else {
                    tracing::warn!(id = %w.id, seq = info, "webhooks: an event that is not a CloudEvent is skipped");
                    let _ = msg.ack().await;
                    continue;
                };
                if !wanted.is_empty() && !wanted.contains(&head.ty) {
                    let _ = msg.ack().await;
                    continue;
                }
                if let Some(h) = held.get_mut(&info) {
                    // Handed out again while held here (its ack wait passed): keep the newer
                    // handle, whose ack the server takes.
                    h.msg = msg;
                    continue;
                }
                held.insert(info, Held { msg, run: head.deltarun, id: head.id, in_flight: false });
                if !started {
                    started = true;
                    // Everything handed out before this session's first delivery is
                    // acknowledged (the ack floor reaches it): nobody else holds an event.
                    // Otherwise another gateway (or this one's last session) may, and its
                    // events come back only when their ack wait passes.
                    let floor = consumer
                        .info()
                        .await
                        .map(|i| i.ack_floor.consumer_sequence)
                        .unwrap_or(0);
                    if floor.saturating_add(1) < consumer_seq {
                        let wait = ack_wait + Duration::from_secs(1);
                        tracing::info!(id = %w.id, wait_s = wait.as_secs_f64(), "webhooks: taking over a subscription with events in flight elsewhere; waiting for them to come back before delivering");
                        barrier = Some(Instant::now() + wait);
                    }
                }
            }
            Some((seq, outcome)) = in_flight.next(), if !in_flight.is_empty() => match outcome {
                Outcome::Delivered => {
                    if let Some(h) = held.remove(&seq) {
                        busy.remove(&h.run);
                        if let Err(e) = h.msg.double_ack().await {
                            // Handed out again later: a duplicate, with the same webhook-id.
                            tracing::warn!(id = %w.id, seq, error = %e, "webhooks: an ack was lost");
                        }
                    }
                }
                Outcome::Stop => return Ok(None),
                // Away from it for a while: the caller waits that long.
                Outcome::CannotSign => return Ok(Some(hand_off(ack_wait))),
            },
            _ = keepalive.tick() => {
                if let (Some(ours), Ok(info)) = (&pin, consumer.info().await) {
                    let pinned = info
                        .priority_groups
                        .iter()
                        .find(|g| g.group == GROUP)
                        .and_then(|g| g.pinned_client_id.clone());
                    if pinned.is_some_and(|p| p != *ours) {
                        return Err("another gateway holds the pin now".into());
                    }
                }
                for h in held.values() {
                    let _ = h.msg.ack_with(AckKind::Progress).await;
                }
            }
            () = async {
                match barrier {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => barrier = None,
        }
    }
}

/// Posts one event until it is delivered, or the subscription stops.
async fn attempts(
    gw: &Gateway,
    http: &reqwest::Client,
    id: &str,
    event_id: &str,
    body: &[u8],
    stop: &CancellationToken,
) -> Outcome {
    let s = &gw.config.webhooks;
    let mut attempt: u32 = 0;
    let mut unsigned: u32 = 0;
    loop {
        if stop.is_cancelled() {
            return Outcome::Stop;
        }
        let result = match gw.store.webhook(id).await {
            Ok(Some(w)) if w.state == WebhookState::Active => {
                // The secrets are this gateway's to open: failing to is not the receiver's
                // failure (a key dropped from DELTA_SECRETS_KEY too early, Redis away).
                let secrets = match gw.store.webhook_secrets(id).await {
                    Ok(Some(secrets)) => secrets,
                    Ok(None) => return Outcome::Stop,
                    Err(e) => {
                        tracing::warn!(id, error = %delta_host::Chain(&e), "webhooks: cannot open the signing secret; not counted against the receiver");
                        // The key, not Redis: another gateway may have it.
                        if matches!(e, delta_store::Error::Secret(_)) {
                            unsigned += 1;
                            if unsigned >= SIGN_TRIES {
                                return Outcome::CannotSign;
                            }
                        }
                        tokio::select! {
                            () = tokio::time::sleep(s.retry_max.min(Duration::from_secs(30))) => continue,
                            () = stop.cancelled() => return Outcome::Stop,
                        }
                    }
                };
                attempt += 1;
                post(gw, http, &w, &secrets, event_id, body).await
            }
            Ok(_) => return Outcome::Stop,
            Err(e) => {
                // Redis, not the receiver, is failing: nothing is counted against it.
                tracing::warn!(id, error = %delta_host::Chain(&e), "webhooks: cannot read the subscription");
                tokio::select! {
                    () = tokio::time::sleep(s.retry_first.max(Duration::from_secs(1))) => continue,
                    () = stop.cancelled() => return Outcome::Stop,
                }
            }
        };
        let why = match result {
            Ok(()) => {
                gw.metrics.webhook_deliveries.inc();
                if let Err(e) = gw
                    .store
                    .webhook_delivered(id, event_id, Timestamp::now())
                    .await
                {
                    tracing::warn!(id, error = %delta_host::Chain(&e), "webhooks: cannot record a delivery");
                }
                return Outcome::Delivered;
            }
            Err(why) => why,
        };
        gw.metrics.webhook_failures.inc();
        tracing::info!(id, event = event_id, attempt, error = %why, "webhook attempt failed");
        let now = Timestamp::now();
        match gw.store.webhook_failed(id, event_id, &why, now).await {
            Ok(Some(failing)) => {
                // The subscription's streak, or this event's, whichever is older: a receiver
                // that refuses one event for good (a 400, a 413) while taking others would
                // otherwise hold its run's later events back forever. The event's is kept in
                // Redis, so no restart or takeover starts it over.
                let since = if failing.event_since.micros() < failing.since.micros() {
                    failing.event_since
                } else {
                    failing.since
                };
                let failing = Duration::from_micros(
                    u64::try_from(now.micros() - since.micros()).unwrap_or(0),
                );
                if let Some(after) = s.disable_after.filter(|a| failing >= *a) {
                    let reason = format!(
                        "failing since {since}, longer than DELTA_WEBHOOK_DISABLE_AFTER ({}); last error: {why}",
                        humanize(after)
                    );
                    if let Ok(true) = gw.store.disable_failing_webhook(id, &reason, now).await {
                        gw.metrics.webhooks_disabled.inc();
                        tracing::warn!(id, reason = %reason, "webhook disabled");
                    }
                    return Outcome::Stop;
                }
            }
            Ok(None) => return Outcome::Stop,
            Err(e) => {
                tracing::warn!(id, error = %delta_host::Chain(&e), "webhooks: cannot record a failure")
            }
        }
        let wait = backoff(s.retry_first, s.retry_max, attempt.max(1), jitter());
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = stop.cancelled() => return Outcome::Stop,
        }
    }
}

fn humanize(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 && s % 3600 == 0 {
        format!("{} h", s / 3600)
    } else {
        format!("{} s", d.as_secs_f64())
    }
}

/// One attempt: signs the event with the subscription's secrets (two during a rotation's
/// grace) and posts it. The error says what went wrong without the URL.
async fn post(
    gw: &Gateway,
    http: &reqwest::Client,
    w: &Webhook,
    secrets: &WebhookSecrets,
    event_id: &str,
    body: &[u8],
) -> Result<(), String> {
    let target = allow::check_url(&w.url, &gw.config.webhooks.allow)?;
    let mut keys = vec![secrets.current.as_str()];
    if let Some(p) = &secrets.previous {
        keys.push(p.as_str());
    }
    let timestamp = Timestamp::now().micros() / 1_000_000;
    let signature = sign::header(&keys, event_id, timestamp, body).map_err(|e| e.to_string())?;
    let resp = http
        .post(target.url)
        .header("webhook-id", event_id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .header(reqwest::header::CONTENT_TYPE, STRUCTURED_CONTENT_TYPE)
        .body(body.to_vec())
        .send()
        .await
        .map_err(|e| {
            let kind = if e.is_timeout() {
                "timed out"
            } else if e.is_connect() {
                "cannot connect"
            } else {
                "request failed"
            };
            format!("{kind}: {}", delta_host::Chain(&e.without_url()))
        })?;
    let status = resp.status();
    if status.is_success() {
        Ok(())
    } else if status.is_redirection() {
        Err(format!("HTTP {status} (redirects are not followed)"))
    } else {
        Err(format!("HTTP {status}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_and_jitter_takes_at_most_half() {
        let (first, max) = (Duration::from_secs(1), Duration::from_secs(60));
        let at = |n, j| backoff(first, max, n, j).as_secs_f64();
        assert_eq!(at(1, 0.0), 1.0);
        assert_eq!(at(2, 0.0), 2.0);
        assert_eq!(at(4, 0.0), 8.0);
        assert_eq!(at(7, 0.0), 60.0);
        assert_eq!(at(1000, 0.0), 60.0);
        assert_eq!(at(3, 1.0), 2.0);
        for _ in 0..100 {
            let j = jitter();
            assert!((0.0..1.0).contains(&j));
            let d = at(5, j);
            assert!((8.0..=16.0).contains(&d), "{d}");
        }
    }
}
