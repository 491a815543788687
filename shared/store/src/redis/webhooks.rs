//! Webhook subscriptions (docs/webhooks.md, docs/protocol.md §5 "Webhooks"): where events are
//! delivered, which ones, and how delivery stands.
//!
//! - `<prefix>:webhooks`: a set of the subscriptions' ids.
//! - `<prefix>:webhook:<id>`: a hash per subscription. Its settings (`url`, `events`, `agents`,
//!   …) are written once at creation; `state`, the delivery figures and the secrets change later,
//!   each with a single-key command, so that the API (enable, disable, rotate) and the gateway
//!   delivering it never overwrite each other's fields.
//!
//! The signing secrets are stored sealed with `DELTA_SECRETS_KEY` (bound to the subscription's
//! id): a Redis dump or replica shows no secret. Without the key, no subscription is created.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use delta_protocol::Timestamp;

use super::{RedisRunStore, backend};
use crate::Error;

/// Whether a subscription is delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WebhookState {
    Active,
    /// Stopped by an operator or after failing for `DELTA_WEBHOOK_DISABLE_AFTER`; its events
    /// wait in the events stream until it is enabled again.
    Disabled,
}

/// A subscription as stored, without its secrets.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Webhook {
    pub id: String,
    /// Where events are posted (kept whole; shown and logged without its query string).
    pub url: String,
    /// Short event names (`interaction.requested`, …); empty: all.
    pub events: Vec<String>,
    /// Agents; empty: all.
    pub agents: Vec<String>,
    pub description: Option<String>,
    pub created_by: String,
    pub created_at: Timestamp,
    pub state: WebhookState,
    pub disabled_reason: Option<String>,
    pub disabled_at: Option<Timestamp>,
    /// Since when every attempt has failed (none since the last success).
    pub failing_since: Option<Timestamp>,
    pub last_success_at: Option<Timestamp>,
    /// The last failure, as a short text without the URL.
    pub last_error: Option<String>,
    /// Events delivered (2xx).
    pub deliveries: u64,
    /// Attempts that failed.
    pub failures: u64,
    /// Until when the secret replaced by the last rotation is still signed with.
    pub previous_secret_until: Option<Timestamp>,
}

/// A subscription's signing secrets, opened: the current one, and the previous one while its
/// grace lasts.
#[derive(Clone)]
pub struct WebhookSecrets {
    pub current: String,
    pub previous: Option<String>,
}

impl std::fmt::Debug for WebhookSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebhookSecrets(…)")
    }
}

fn ts(h: &HashMap<String, String>, field: &str) -> Option<Timestamp> {
    h.get(field)
        .and_then(|v| v.parse::<i64>().ok())
        .and_then(Timestamp::from_micros)
}

fn text(h: &HashMap<String, String>, field: &str) -> Option<String> {
    h.get(field).filter(|v| !v.is_empty()).cloned()
}

fn count(h: &HashMap<String, String>, field: &str) -> u64 {
    h.get(field).and_then(|v| v.parse().ok()).unwrap_or(0)
}

fn list(h: &HashMap<String, String>, field: &str) -> Vec<String> {
    h.get(field)
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or_default()
}

fn parse(id: &str, h: &HashMap<String, String>) -> Option<Webhook> {
    let state = match h.get("state").map(String::as_str) {
        Some("active") => WebhookState::Active,
        Some("disabled") => WebhookState::Disabled,
        _ => return None,
    };
    Some(Webhook {
        id: id.to_owned(),
        url: h.get("url")?.clone(),
        events: list(h, "events"),
        agents: list(h, "agents"),
        description: text(h, "description"),
        created_by: h.get("created_by").cloned().unwrap_or_default(),
        created_at: ts(h, "created_at")?,
        state,
        disabled_reason: text(h, "disabled_reason"),
        disabled_at: ts(h, "disabled_at"),
        failing_since: ts(h, "failing_since"),
        last_success_at: ts(h, "last_success_at"),
        last_error: text(h, "last_error"),
        deliveries: count(h, "deliveries"),
        failures: count(h, "failures"),
        previous_secret_until: ts(h, "previous_secret_until"),
    })
}

/// The context a subscription's secret is sealed under: it opens for that subscription only.
fn seal_context(id: &str) -> String {
    format!("webhook:{id}")
}

/// Subscriptions read in one round trip when they are listed.
const LIST_BATCH: usize = 500;

/// Since when a subscription, and one of its events, have been failing
/// ([`RedisRunStore::webhook_failed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WebhookFailing {
    /// Since the subscription's last delivery.
    pub since: Timestamp,
    /// Since this event's first failed attempt, by whichever gateway.
    pub event_since: Timestamp,
}

impl RedisRunStore {
    fn webhooks_key(&self) -> String {
        self.index("webhooks")
    }

    fn webhook_key(&self, id: &str) -> String {
        self.index(&format!("webhook:{id}"))
    }

    /// Whether subscriptions can be stored: their secrets need `DELTA_SECRETS_KEY`.
    pub fn can_seal(&self) -> bool {
        self.secrets.is_some()
    }

    fn seal_secret(&self, id: &str, secret: &str) -> Result<String, Error> {
        let key = self.secrets.as_ref().ok_or(Error::NoSecretsKey)?;
        Ok(key.seal(&seal_context(id), secret)?)
    }

    /// Stores a new subscription (`w.state` as given) with its signing secret, sealed.
    pub async fn create_webhook(&self, w: &Webhook, secret: &str) -> Result<(), Error> {
        let sealed = self.seal_secret(&w.id, secret)?;
        let json = |v: &Vec<String>| serde_json::to_string(v).unwrap_or_else(|_| "[]".into());
        let mut fields: Vec<(&str, String)> = vec![
            ("url", w.url.clone()),
            ("events", json(&w.events)),
            ("agents", json(&w.agents)),
            ("created_by", w.created_by.clone()),
            ("created_at", w.created_at.micros().to_string()),
            ("state", "active".into()),
            ("secret", sealed),
            ("deliveries", "0".into()),
            ("failures", "0".into()),
        ];
        if let Some(d) = &w.description {
            fields.push(("description", d.clone()));
        }
        let mut conn = self.connection();
        redis::cmd("HSET")
            .arg(self.webhook_key(&w.id))
            .arg(fields)
            .query_async::<()>(&mut conn)
            .await
            .map_err(backend)?;
        let mut conn = self.connection();
        redis::cmd("SADD")
            .arg(self.webhooks_key())
            .arg(&w.id)
            .query_async::<()>(&mut conn)
            .await
            .map_err(backend)
    }

    /// One subscription, if it exists.
    pub async fn webhook(&self, id: &str) -> Result<Option<Webhook>, Error> {
        let mut conn = self.connection();
        let h: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(self.webhook_key(id))
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        if h.is_empty() {
            return Ok(None);
        }
        parse(id, &h)
            .map(Some)
            .ok_or_else(|| Error::Corrupt(format!("webhook {id}: not a subscription record")))
    }

    /// Every subscription, oldest first (an id in the set without its hash, a deletion half
    /// done, is removed on the way). Two round trips however many there are (the set, then
    /// every hash in one pipeline of up to [`LIST_BATCH`] a trip): each gateway lists them
    /// every second.
    pub async fn webhooks(&self) -> Result<Vec<Webhook>, Error> {
        let mut conn = self.connection();
        let ids: Vec<String> = redis::cmd("SMEMBERS")
            .arg(self.webhooks_key())
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        let (mut out, mut gone) = (vec![], vec![]);
        for batch in ids.chunks(LIST_BATCH) {
            let mut pipe = redis::pipe();
            for id in batch {
                pipe.cmd("HGETALL").arg(self.webhook_key(id));
            }
            let hashes: Vec<HashMap<String, String>> = pipe
                .query_async(&mut self.connection())
                .await
                .map_err(backend)?;
            for (id, h) in batch.iter().zip(hashes) {
                if h.is_empty() {
                    gone.push(id.as_str());
                    continue;
                }
                match parse(id, &h) {
                    Some(w) => out.push(w),
                    None => tracing::warn!(
                        error = %format!("webhook {id}: not a subscription record"),
                        "skipping a webhook"
                    ),
                }
            }
        }
        if !gone.is_empty() {
            let _: Result<(), _> = redis::cmd("SREM")
                .arg(self.webhooks_key())
                .arg(&gone)
                .query_async(&mut self.connection())
                .await;
        }
        out.sort_by(|a, b| (a.created_at.micros(), &a.id).cmp(&(b.created_at.micros(), &b.id)));
        Ok(out)
    }

    /// Removes a subscription; `false` when there was none.
    pub async fn delete_webhook(&self, id: &str) -> Result<bool, Error> {
        let mut conn = self.connection();
        let n: i64 = redis::cmd("DEL")
            .arg(self.webhook_key(id))
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        let mut conn = self.connection();
        redis::cmd("SREM")
            .arg(self.webhooks_key())
            .arg(id)
            .query_async::<()>(&mut conn)
            .await
            .map_err(backend)?;
        Ok(n == 1)
    }

    /// Sets fields of an existing subscription (never creates one: a subscription deleted
    /// meanwhile stays deleted). `Ok(false)`: there is none.
    async fn webhook_set(
        &self,
        id: &str,
        set: &[(&str, String)],
        del: &[&str],
    ) -> Result<bool, Error> {
        // One key: a script is atomic on a single Redis and on a cluster alike.
        const SET: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local n = tonumber(ARGV[1])
for i = 0, n - 1 do redis.call('HSET', KEYS[1], ARGV[2 + 2 * i], ARGV[3 + 2 * i]) end
for i = 2 + 2 * n, #ARGV do redis.call('HDEL', KEYS[1], ARGV[i]) end
return 1
"#;
        let script = redis::Script::new(SET);
        let mut call = script.key(self.webhook_key(id));
        call.arg(set.len());
        for (k, v) in set {
            call.arg(*k).arg(v);
        }
        for k in del {
            call.arg(*k);
        }
        let mut conn = self.connection();
        let n: i64 = call.invoke_async(&mut conn).await.map_err(backend)?;
        Ok(n == 1)
    }

    /// Disables a subscription with `reason`. `Ok(false)`: there is none.
    pub async fn disable_webhook(
        &self,
        id: &str,
        reason: &str,
        at: Timestamp,
    ) -> Result<bool, Error> {
        self.webhook_set(
            id,
            &[
                ("state", "disabled".into()),
                ("disabled_reason", reason.to_owned()),
                ("disabled_at", at.micros().to_string()),
            ],
            &[],
        )
        .await
    }

    /// Disables an active subscription after its failure period, with `reason`; `Ok(false)`
    /// when it is not active any more (another attempt or gateway disabled it first, an
    /// operator did, or it was deleted), so that it is counted and logged once.
    pub async fn disable_failing_webhook(
        &self,
        id: &str,
        reason: &str,
        at: Timestamp,
    ) -> Result<bool, Error> {
        const DISABLE: &str = r#"
if redis.call('HGET', KEYS[1], 'state') ~= 'active' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'disabled', 'disabled_reason', ARGV[1], 'disabled_at', ARGV[2])
return 1
"#;
        let mut conn = self.connection();
        let n: i64 = redis::Script::new(DISABLE)
            .key(self.webhook_key(id))
            .arg(reason)
            .arg(at.micros().to_string())
            .invoke_async(&mut conn)
            .await
            .map_err(backend)?;
        Ok(n == 1)
    }

    /// Enables a subscription: its failure period starts over, and every event's. `Ok(false)`:
    /// there is none.
    pub async fn enable_webhook(&self, id: &str) -> Result<bool, Error> {
        const ENABLE: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'state', 'active')
redis.call('HDEL', KEYS[1], 'disabled_reason', 'disabled_at', 'failing_since')
for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(f, 1, 14) == 'event_failing:' then redis.call('HDEL', KEYS[1], f) end
end
return 1
"#;
        let mut conn = self.connection();
        let n: i64 = redis::Script::new(ENABLE)
            .key(self.webhook_key(id))
            .invoke_async(&mut conn)
            .await
            .map_err(backend)?;
        Ok(n == 1)
    }

    /// Replaces the signing secret with `secret`; the one it replaces stays valid until
    /// `previous_until` (only the two newest ever sign: a rotation during another's grace ends
    /// the oldest). One script, so that two rotations at once both hold: each moves the secret
    /// it found to `previous`. `Ok(false)`: there is none.
    pub async fn rotate_webhook_secret(
        &self,
        id: &str,
        secret: &str,
        previous_until: Timestamp,
    ) -> Result<bool, Error> {
        const ROTATE: &str = r#"
local current = redis.call('HGET', KEYS[1], 'secret')
if not current then return 0 end
redis.call('HSET', KEYS[1], 'secret', ARGV[1], 'previous_secret', current,
  'previous_secret_until', ARGV[2])
return 1
"#;
        // Sealed for the subscription (not for the field): the current secret moves as it is.
        let sealed_new = self.seal_secret(id, secret)?;
        let mut conn = self.connection();
        let n: i64 = redis::Script::new(ROTATE)
            .key(self.webhook_key(id))
            .arg(sealed_new)
            .arg(previous_until.micros().to_string())
            .invoke_async(&mut conn)
            .await
            .map_err(backend)?;
        Ok(n == 1)
    }

    /// The subscription's secrets, opened (the previous one only while its grace lasts).
    pub async fn webhook_secrets(&self, id: &str) -> Result<Option<WebhookSecrets>, Error> {
        let key = self.secrets.as_ref().ok_or(Error::NoSecretsKey)?;
        let mut conn = self.connection();
        let (current, previous, until): (Option<String>, Option<String>, Option<String>) =
            redis::cmd("HMGET")
                .arg(self.webhook_key(id))
                .arg("secret")
                .arg("previous_secret")
                .arg("previous_secret_until")
                .query_async(&mut conn)
                .await
                .map_err(backend)?;
        let Some(current) = current else {
            return Ok(None);
        };
        let context = seal_context(id);
        let current = key.open(&context, &current)?;
        let live = until
            .and_then(|u| u.parse::<i64>().ok())
            .is_some_and(|u| u > Timestamp::now().micros());
        let previous = match previous {
            Some(p) if live => Some(key.open(&context, &p)?),
            _ => None,
        };
        Ok(Some(WebhookSecrets { current, previous }))
    }

    /// Records that event `event_id` was delivered: the subscription's failure period ends, and
    /// the event's own. Nothing is written for a subscription deleted meanwhile.
    pub async fn webhook_delivered(
        &self,
        id: &str,
        event_id: &str,
        at: Timestamp,
    ) -> Result<(), Error> {
        const DELIVERED: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[1], 'deliveries', 1)
redis.call('HSET', KEYS[1], 'last_success_at', ARGV[1])
redis.call('HDEL', KEYS[1], 'failing_since', 'event_failing:' .. ARGV[2])
return 1
"#;
        let mut conn = self.connection();
        redis::Script::new(DELIVERED)
            .key(self.webhook_key(id))
            .arg(at.micros().to_string())
            .arg(event_id)
            .invoke_async::<i64>(&mut conn)
            .await
            .map_err(backend)?;
        Ok(())
    }

    /// Records a failed attempt to deliver event `event_id` (`error`: what went wrong, without
    /// the URL). Returns since when the subscription has been failing (this attempt's time if it
    /// is the first failure since a success) and since when this event has (kept in the
    /// subscription's hash until the event is delivered or the subscription enabled again, so
    /// that no gateway's restart starts it over), or `None` when the subscription is gone.
    pub async fn webhook_failed(
        &self,
        id: &str,
        event_id: &str,
        error: &str,
        at: Timestamp,
    ) -> Result<Option<WebhookFailing>, Error> {
        const FAILED: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
redis.call('HINCRBY', KEYS[1], 'failures', 1)
redis.call('HSET', KEYS[1], 'last_error', ARGV[1])
redis.call('HSETNX', KEYS[1], 'failing_since', ARGV[2])
redis.call('HSETNX', KEYS[1], 'event_failing:' .. ARGV[3], ARGV[2])
return {redis.call('HGET', KEYS[1], 'failing_since'), redis.call('HGET', KEYS[1], 'event_failing:' .. ARGV[3])}
"#;
        let mut conn = self.connection();
        let since: Option<(String, String)> = redis::Script::new(FAILED)
            .key(self.webhook_key(id))
            .arg(error)
            .arg(at.micros().to_string())
            .arg(event_id)
            .invoke_async(&mut conn)
            .await
            .map_err(backend)?;
        let time = |s: &str| {
            s.parse::<i64>()
                .ok()
                .and_then(Timestamp::from_micros)
                .unwrap_or(at)
        };
        Ok(since.map(|(since, event)| WebhookFailing {
            since: time(&since),
            event_since: time(&event),
        }))
    }
}
