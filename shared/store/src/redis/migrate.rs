//! `delta migrate-redis`: moves the keys of the layout of before the buckets (every run under
//! the tag `{<run_id>}`, the indexes global) to the bucketed layout of docs/protocol.md §5, on a
//! single Redis (a `RENAME` between slots is refused by a cluster: migrate before moving to
//! one).
//!
//! The fleet must be stopped (gateways and workers refuse to start on the old layout, so a
//! restart before the migration is harmless). Each step can run again: a run's keys are renamed
//! only when the new name is free, index entries are added (`ZADD`, `HSET`: the same entry
//! twice is one) before the old index is deleted, and `<prefix>:runs:all`, whose presence marks
//! the old layout, is deleted last. So a migration cut short is finished by running it again.

use std::collections::HashMap;

use super::{RedisRunStore, backend, bucket_of};
use crate::Error;
use delta_protocol::{RunId, RunStatus};

/// What a migration moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Migrated {
    /// Keys of runs renamed (records, journals, questions).
    pub run_keys: usize,
    /// Entries copied into the buckets' indexes.
    pub index_entries: usize,
    /// Idempotency keys moved.
    pub idempotency_keys: usize,
    /// Old keys left where they were because their new name was taken, or that named no run.
    pub skipped: usize,
    /// Stopped before the end, as [`Progress`] asked: running it again finishes it.
    pub interrupted: bool,
}

/// Told how a migration goes: `(what, done, of)` after each batch of its steps (the runs' keys,
/// the indexes, the idempotency keys); answers whether to go on (`false`: stop between batches,
/// with what is done kept, as when cut short).
pub type Progress<'a> = &'a (dyn Fn(&str, usize, usize) -> bool + Send + Sync);

/// Run keys renamed per round trip; also how many idempotency keys (two round trips each) go
/// between two reports of progress.
const BATCH: usize = 500;

/// The old layout's indexes, sorted sets whose members name a run (or a request of one).
const OLD_ZSETS: &[&str] = &[
    "runs:finished",
    "interactions:all",
    "interactions:pending",
    "interactions:deadlines",
    "resumes",
];

/// `text` with the characters a `SCAN MATCH` pattern treats specially escaped.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl RedisRunStore {
    /// Connects to `url` and moves the keys under `prefix` from the layout of before the
    /// buckets to `buckets` buckets (see the module doc); `Ok` with nothing moved when there
    /// was nothing to move. Refused when Redis already holds another bucket count for `prefix`.
    pub async fn migrate_layout(
        url: &str,
        prefix: &str,
        ca_file: Option<&std::path::Path>,
        buckets: u32,
    ) -> Result<Migrated, Error> {
        Self::migrate_layout_with(url, prefix, ca_file, buckets, &|_, _, _| true).await
    }

    /// [`Self::migrate_layout`], telling `progress` how it goes (and stopping when it says so).
    pub async fn migrate_layout_with(
        url: &str,
        prefix: &str,
        ca_file: Option<&std::path::Path>,
        buckets: u32,
        progress: Progress<'_>,
    ) -> Result<Migrated, Error> {
        // One Redis only: the old layout could not run on a cluster (docs/operations.md says
        // how to move a migrated Redis into one).
        let options = super::Options {
            cluster: false,
            ca_file: ca_file.map(std::path::Path::to_owned),
            buckets: Some(buckets),
        };
        let mut store = Self::connect_unchecked(url, prefix, &options).await?;
        store.claim_buckets(true, false).await?;
        store.migrate(progress).await
    }

    async fn migrate(&self, progress: Progress<'_>) -> Result<Migrated, Error> {
        let mut done = Migrated::default();
        let p = &self.prefix;
        // 1. Every key of a run: `<p>:run:{<id>}`, `…:journal`, `…:ix:<request>`, renamed a
        //    batch a round trip.
        let run_prefix = format!("{p}:run:{{");
        let old_keys = self.scan(&format!("{}*", glob_escape(&run_prefix))).await?;
        let total = old_keys.len();
        for (n, batch) in old_keys.chunks(BATCH).enumerate() {
            if !progress("runs' keys", n * BATCH, total) {
                done.interrupted = true;
                return Ok(done);
            }
            let mut pipe = redis::pipe();
            let mut renamed = 0;
            for old in batch {
                let rest = &old[run_prefix.len()..];
                let parsed = rest
                    .split_once('}')
                    .and_then(|(id, suffix)| Some((id.parse::<RunId>().ok()?, suffix)));
                let Some((run, suffix)) = parsed else {
                    done.skipped += 1;
                    continue;
                };
                pipe.cmd("RENAMENX")
                    .arg(old)
                    .arg(format!("{}{suffix}", self.run_key(run)));
                renamed += 1;
            }
            if renamed == 0 {
                continue;
            }
            let mut conn = self.conn.clone();
            let moved: Vec<bool> = pipe.query_async(&mut conn).await.map_err(backend)?;
            let n_moved = moved.iter().filter(|m| **m).count();
            done.run_keys += n_moved;
            done.skipped += moved.len() - n_moved;
        }
        progress("runs' keys", total, total);
        // 2. Request → run, which the other indexes need to place requests.
        let owners_key = self.index("interactions:runs");
        let owners: HashMap<String, String> = self.hgetall(&owners_key).await?;
        let mut pipe = redis::pipe();
        for (rid, run) in &owners {
            match run.parse::<RunId>() {
                Ok(run_id) => {
                    pipe.hset(self.run_index(run_id, "interactions:runs"), rid, run)
                        .ignore();
                    done.index_entries += 1;
                }
                Err(_) => done.skipped += 1,
            }
        }
        self.send(pipe).await?;
        // 3. The sorted sets: each member goes to its run's bucket, with its score.
        let statuses = RunStatus::ALL.map(|s| format!("runs:{}", s.as_str()));
        let names = OLD_ZSETS
            .iter()
            .map(|n| (*n).to_owned())
            .chain(statuses)
            .chain(["runs:all".to_owned()]);
        let names: Vec<String> = names.collect();
        for (n, name) in names.iter().enumerate() {
            if !progress("indexes", n, names.len()) {
                done.interrupted = true;
                return Ok(done);
            }
            let old = self.index(name);
            let mut conn = self.conn.clone();
            let entries: Vec<(String, f64)> = redis::cmd("ZRANGE")
                .arg(&old)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .query_async(&mut conn)
                .await
                .map_err(backend)?;
            let mut pipe = redis::pipe();
            for (member, score) in entries {
                let run = if name.starts_with("runs:") {
                    Some(member.as_str())
                } else if name == "resumes" {
                    member.split_once('/').map(|(run, _)| run)
                } else {
                    owners.get(&member).map(String::as_str)
                };
                match run.and_then(|r| r.parse::<RunId>().ok()) {
                    Some(run_id) => {
                        pipe.zadd(self.run_index(run_id, name), member, score)
                            .ignore();
                        done.index_entries += 1;
                    }
                    None => done.skipped += 1,
                }
            }
            // `runs:all` marks the old layout: it goes last (below).
            if name != "runs:all" {
                pipe.del(&old).ignore();
            }
            self.send(pipe).await?;
        }
        // 4. Idempotency keys: to their own bucket, with the time they have left; the run's
        //    record names the new key when it is in the run's bucket (purging the run deletes
        //    it then), else the key just expires within its 24 h.
        let idempotency = self
            .scan(&format!("{}:idempotency:*", glob_escape(p)))
            .await?;
        let total = idempotency.len();
        for (n, old) in idempotency.iter().enumerate() {
            if n % BATCH == 0 && !progress("idempotency keys", n, total) {
                done.interrupted = true;
                return Ok(done);
            }
            let digest = &old[p.len() + ":idempotency:".len()..];
            let mut conn = self.conn.clone();
            let (value, ttl_ms): (Option<String>, i64) = redis::pipe()
                .get(old)
                .pttl(old)
                .query_async(&mut conn)
                .await
                .map_err(backend)?;
            let Some(value) = value else { continue };
            let k = bucket_of(digest, self.buckets);
            let new = self.bucket_index(k, &format!("idempotency:{digest}"));
            let mut pipe = redis::pipe();
            let mut set = redis::cmd("SET");
            set.arg(&new).arg(&value).arg("NX");
            if ttl_ms > 0 {
                set.arg("PX").arg(ttl_ms);
            }
            pipe.add_command(set).ignore();
            if let Some(run_id) = value
                .split_once(' ')
                .and_then(|(run, _)| run.parse::<RunId>().ok())
            {
                if self.bucket(run_id) == k {
                    pipe.hset(self.run_key(run_id), "idempotency_key", &new)
                        .ignore();
                } else {
                    pipe.hdel(self.run_key(run_id), "idempotency_key").ignore();
                }
            }
            pipe.del(old).ignore();
            self.send(pipe).await?;
            done.idempotency_keys += 1;
        }
        progress("idempotency keys", total, total);
        // 5. Last, what marks the old layout.
        let mut pipe = redis::pipe();
        pipe.del(&owners_key)
            .ignore()
            .del(self.index("runs:all"))
            .ignore();
        self.send(pipe).await?;
        Ok(done)
    }

    /// Every key matching `pattern` (`SCAN`, so Redis is not blocked).
    async fn scan(&self, pattern: &str) -> Result<Vec<String>, Error> {
        let mut conn = self.conn.clone();
        let mut cursor: u64 = 0;
        let mut keys = vec![];
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .map_err(backend)?;
            keys.extend(batch);
            if next == 0 {
                break;
            }
            cursor = next;
        }
        // SCAN may return a key twice.
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    async fn hgetall(&self, key: &str) -> Result<HashMap<String, String>, Error> {
        let mut conn = self.conn.clone();
        redis::cmd("HGETALL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .map_err(backend)
    }

    async fn send(&self, pipe: redis::Pipeline) -> Result<(), Error> {
        if pipe.is_empty() {
            return Ok(());
        }
        let mut conn = self.conn.clone();
        pipe.query_async::<()>(&mut conn).await.map_err(backend)
    }
}
