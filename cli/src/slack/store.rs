//! What the bridge remembers of each question, in a NATS KV bucket of its own (`<P>_SLACK`, key:
//! the request id): where it posted the question, what it last heard of it; and, under the key
//! [`CLICKS`], the clicks and form submissions it acknowledged to Slack and has not handled yet.
//! Its NATS user may read and write this bucket and nothing else of the kind
//! (`delta_queue::access`, role `slack`).

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::kv;
use delta_protocol::human::{Claim, Tally};
use delta_protocol::{InteractionRequest, RequestId, Resolved};
use serde::{Deserialize, Serialize};

/// One message the bridge posted for a question.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Post {
    /// What the route asked for: `channel:<id>` or `dm:<identity>`.
    pub target: String,
    /// Where Slack put it (a DM's channel id for a DM) and its `ts`.
    pub channel: String,
    pub ts: String,
    /// Escalation steps posted in this message's thread (each once, whatever failed after).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<u32>,
}

/// What the bridge knows of one question.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Record {
    /// The question as announced (the latest version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<InteractionRequest>,
    #[serde(default)]
    pub posts: Vec<Post>,
    /// Targets whose post was started and not yet recorded: after a crash, Slack's history is
    /// searched for them (by the message's metadata) before posting again.
    #[serde(default)]
    pub posting: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled: Option<Resolved>,
    /// Settled before the bridge posted it (found so at the gateway): never posted.
    #[serde(default)]
    pub closed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tally: Option<Tally>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<Claim>,
    /// When the claim and tally above were changed (the update event's `at`): an update event
    /// older than that (delivered again after a later one) changes nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<delta_protocol::Timestamp>,
    /// Escalation steps already posted in the thread of every message.
    #[serde(default)]
    pub escalations: Vec<u32>,
    /// What every message shows (a digest of its blocks and text), once all were updated: a
    /// record whose rendering differs has an update to do, so one that failed is done again
    /// when the event comes again, or on the next one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shown: Option<String>,
    /// Who escalation steps let answer besides `allowed_responders` (DMs for `dm: true`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub added: Vec<String>,
    /// When the settling a reopen undid was made (its `resolved_at`): that settling, delivered
    /// again after the reopen (its message update had failed), is not applied again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reopened_after: Option<delta_protocol::Timestamp>,
}

/// The key of the clicks acknowledged and not handled yet (no request id: those are UUIDs).
pub const CLICKS: &str = "clicks";

/// Tries of one change to [`CLICKS`] when others change it at the same time.
const CLICKS_TRIES: usize = 20;

/// Notes kept at most: past it (the bridge's removals failing for long), an answer is handled
/// without one.
const CLICKS_MAX: usize = 1000;

/// Notes older than this (seconds) are dropped as a new one is written: an answer handled whose
/// removal failed, or one the bridge, stopped longer, would only tell its sender about.
const CLICKS_KEPT_S: i64 = 2 * 24 * 3600;

/// Adds note `id` to `all`, first dropping the notes older than [`CLICKS_KEPT_S`]; `false`, and
/// nothing added, when [`CLICKS_MAX`] are left.
fn admit(all: &mut BTreeMap<String, Pending>, id: &str, click: &Pending) -> bool {
    all.retain(|_, p| click.at.saturating_sub(p.at) <= CLICKS_KEPT_S);
    if all.len() >= CLICKS_MAX {
        return false;
    }
    all.insert(id.to_owned(), click.clone());
    true
}

/// A click or form submission acknowledged to Slack and not handled yet.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pending {
    /// When it came (Unix seconds).
    pub at: i64,
    /// Its payload, as far as the bridge reads it.
    pub payload: serde_json::Value,
}

/// Why the store failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}")]
    Unsound { what: String },
    #[error("reading {key} from the KV bucket: {what}")]
    Read { key: String, what: String },
    #[error("writing {key} to the KV bucket: {what}")]
    Write { key: String, what: String },
}

/// The bucket's name for a key prefix.
pub fn bucket(prefix: &str) -> String {
    delta_queue::slack_bucket(prefix)
}

/// The bridge's records.
#[derive(Clone)]
pub struct Store {
    kv: kv::Store,
}

impl Store {
    /// Opens the bucket. A gateway creates it (docs/security.md: the bridge's NATS user may not
    /// create a stream); where the bridge's login may (no role logins), it creates it itself,
    /// else it waits for a gateway, saying so, until `cancel`.
    pub async fn open(
        js: &jetstream::Context,
        prefix: &str,
        replicas: usize,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> Result<Option<Store>, Error> {
        let name = bucket(prefix);
        let mut said: Option<std::time::Instant> = None;
        loop {
            if let Ok(kv) = js.get_key_value(&name).await {
                // A bucket made by someone else to capture more (before gateways made it).
                delta_queue::slack_bucket_sound(prefix, &kv.stream.cached_info().config.subjects)
                    .map_err(|what| Error::Unsound { what })?;
                return Ok(Some(Store { kv }));
            }
            match js
                .create_key_value(delta_queue::slack_bucket_config(prefix, replicas))
                .await
            {
                Ok(kv) => return Ok(Some(Store { kv })),
                // Said once, then every minute while it lasts.
                Err(e) if said.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) => {
                    said = Some(std::time::Instant::now());
                    tracing::warn!(bucket = %name, error = %e, "the bridge's bucket is missing and the bridge may not create it: waiting for a gateway to create it (gateways create it at start since 2026-11-28; an older gateway does not)");
                }
                Err(_) => {}
            }
            tokio::select! {
                () = cancel.cancelled() => return Ok(None),
                () = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    }

    pub async fn get(&self, id: RequestId) -> Result<Record, Error> {
        let key = id.to_string();
        match self.kv.get(key.clone()).await {
            Ok(Some(bytes)) => record_of(key, &bytes),
            Ok(None) => Ok(Record::default()),
            Err(e) => Err(Error::Read {
                key,
                what: e.to_string(),
            }),
        }
    }

    /// The clicks acknowledged and not handled yet, by their ids.
    pub async fn pending_clicks(&self) -> Result<BTreeMap<String, Pending>, Error> {
        Ok(self.clicks().await?.0)
    }

    /// Notes click `id` as acknowledged and not handled yet.
    pub async fn note_click(&self, id: &str, click: Pending) -> Result<(), Error> {
        self.change_clicks(|all| {
            if admit(all, id, &click) {
                Ok(())
            } else {
                Err(format!(
                    "{CLICKS_MAX} answers noted and not yet removed (are the removals failing?)"
                ))
            }
        })
        .await
    }

    /// Notes click `id` handled (nothing if it is not noted).
    pub async fn click_done(&self, id: &str) -> Result<(), Error> {
        self.change_clicks(|all| {
            all.remove(id);
            Ok(())
        })
        .await
    }

    /// [`CLICKS`] and its revision (`None`: never written).
    async fn clicks(&self) -> Result<(BTreeMap<String, Pending>, Option<u64>), Error> {
        let entry = self.kv.entry(CLICKS).await.map_err(|e| Error::Read {
            key: CLICKS.into(),
            what: e.to_string(),
        })?;
        Ok(match entry {
            Some(e) => (
                // Unreadable (written by hand?): taken as none, and overwritten.
                serde_json::from_slice(&e.value).unwrap_or_default(),
                Some(e.revision),
            ),
            None => (BTreeMap::new(), None),
        })
    }

    /// Changes [`CLICKS`] by `f` (which may refuse, saying why), written only if nobody wrote it
    /// since it was read (and read again if someone did).
    async fn change_clicks(
        &self,
        f: impl Fn(&mut BTreeMap<String, Pending>) -> Result<(), String>,
    ) -> Result<(), Error> {
        let write = |what: String| Error::Write {
            key: CLICKS.into(),
            what,
        };
        for _ in 0..CLICKS_TRIES {
            let (mut all, revision) = self.clicks().await?;
            let before = all.clone();
            f(&mut all).map_err(write)?;
            if all == before && revision.is_some() {
                return Ok(());
            }
            let bytes = serde_json::to_vec(&all).unwrap_or_default();
            // Someone wrote it since it was read: read again.
            match revision {
                Some(r) => match self.kv.update(CLICKS, bytes.into(), r).await {
                    Ok(_) => return Ok(()),
                    Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {}
                    Err(e) => return Err(write(e.to_string())),
                },
                None => match self.kv.create(CLICKS, bytes.into()).await {
                    Ok(_) => return Ok(()),
                    Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {}
                    Err(e) => return Err(write(e.to_string())),
                },
            }
        }
        Err(write(format!(
            "changed by others {CLICKS_TRIES} times in a row"
        )))
    }

    pub async fn put(&self, id: RequestId, r: &Record) -> Result<(), Error> {
        let key = id.to_string();
        let bytes = serde_json::to_vec(r).unwrap_or_default();
        self.kv
            .put(&key, bytes.into())
            .await
            .map(|_| ())
            .map_err(|e| Error::Write {
                key,
                what: e.to_string(),
            })
    }
}

/// The record stored under `key`. One this build cannot read (another version's, a damaged
/// one) is an error, and the event is tried again: taken as empty, it would be overwritten, its
/// posts lost and posted again.
fn record_of(key: String, bytes: &[u8]) -> Result<Record, Error> {
    serde_json::from_slice(bytes).map_err(|e| Error::Read {
        key,
        what: format!("not a record this bridge reads: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_not_read_is_an_error_not_an_empty_one() {
        let r = Record::default();
        let bytes = serde_json::to_vec(&r).expect("json");
        assert!(record_of("k".into(), &bytes).is_ok());
        assert!(matches!(
            record_of("k".into(), b"{\"posts\": 7}"),
            Err(Error::Read { .. })
        ));
        assert!(record_of("k".into(), b"garbage").is_err());
    }

    fn note(at: i64) -> Pending {
        Pending {
            at,
            payload: serde_json::json!({}),
        }
    }

    #[test]
    fn notes_are_bounded_and_old_ones_dropped() {
        let mut all = BTreeMap::new();
        let now = 10 * CLICKS_KEPT_S;
        assert!(admit(&mut all, "old", &note(now - CLICKS_KEPT_S - 1)));
        assert!(admit(&mut all, "kept", &note(now - CLICKS_KEPT_S)));
        assert!(admit(&mut all, "new", &note(now)));
        let names: Vec<&str> = all.keys().map(String::as_str).collect();
        assert_eq!(names, ["kept", "new"], "the one older than kept is dropped");
        for i in all.len()..CLICKS_MAX {
            assert!(admit(&mut all, &format!("n{i}"), &note(now)));
        }
        assert_eq!(all.len(), CLICKS_MAX);
        assert!(!admit(&mut all, "one more", &note(now)), "full");
        assert!(!all.contains_key("one more"));
        // Once the old ones age out, there is room again.
        assert!(admit(&mut all, "later", &note(now + CLICKS_KEPT_S + 1)));
        assert_eq!(all.len(), 1);
    }
}
