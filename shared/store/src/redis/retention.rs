//! Retention: finished runs are deleted, whole, some time after they finished (`DELTA_RETENTION`,
//! issue 14 finding 9).
//!
//! `<t>:runs:finished` (one per bucket) holds every finished run by when it finished (µs). The scripts that finish
//! a run add it there (`APPEND` with a terminal status, `CREATE` of a terminal record) and the one
//! that reopens a finished run takes it out (`REQUEUE`, a dead letter retried), so finding what is
//! due is one `ZRANGEBYSCORE`, never a walk over the keys. [`PURGE`] then deletes one run
//! atomically: its record, journal and questions, and its entries in every index. It checks
//! again, inside the script, that the run is finished and finished before the cut-off, so an
//! entry that is stale (a run reopened meanwhile) never deletes a run in progress, and running it
//! twice (two gateways) deletes nothing more the second time.
//!
//! Runs finished before this index existed are not in it: [`RedisRunStore::backfill_finished`]
//! adds them from the status indexes (`runs:COMPLETED`, `runs:FAILED`, `runs:CANCELLED`) with
//! their `updated_at` as the finish time; the gateways walk it once after they start.
//!
//! The local file store has no retention: `delta run` keeps its runs under `.delta/` in the
//! user's own directory, as Delta Engine v1.2 does, and the user removes them.

use super::{RedisRunStore, ScriptError, backend};
use crate::Error;
use delta_protocol::{RunId, RunStatus, Timestamp};

/// Deletes one finished run entirely (with its snapshot, `<run>:snap`), if it finished at or
/// before the cut-off. KEYS: run, journal. ARGV: bucket tag, run id, cut-off (µs), how much
/// longer (µs) a dead letter is kept than a finished run. Returns `PURGED`, `GONE` (nothing was
/// left but index entries, now removed), `KEPT` (finished after the cut-off, or not in the
/// finished index), `LIVE` (not finished: reopened; its stale finished entry is removed) or
/// `DEFERRED` (failed by a dead letter, marked `dead_letter`, and the letter kept longer: its
/// finished entry moved on by that much, and the mark removed, so that it is deleted when it
/// comes due again, as its letter goes).
///
/// The run's questions are found by the ids its journal names (every question a run asks is
/// journaled as `HUMAN_INPUT_REQUEST` before or with its pause) and its pending request: in a
/// plain entry's text only structural `"request_id":"…"` pairs match, since quotes inside a JSON
/// string are escaped; a packed entry names the questions it asks in its field `q`.
const PURGE: &str = r#"
local p, run, cutoff, letters = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local st = redis.call('HGET', KEYS[1], 'status')
if st and st ~= 'COMPLETED' and st ~= 'FAILED' and st ~= 'CANCELLED' then
  redis.call('ZREM', p .. ':runs:finished', run)
  return 'LIVE'
end
if st then
  local at = redis.call('ZSCORE', p .. ':runs:finished', run)
  if not at or tonumber(at) > cutoff then return 'KEPT' end
  -- A dead letter's run, kept for `delta dlq retry` while the letter is.
  if st == 'FAILED' and letters > 0 and redis.call('HGET', KEYS[1], 'dead_letter') == '1' then
    redis.call('ZADD', p .. ':runs:finished', tonumber(at) + letters, run)
    redis.call('HDEL', KEYS[1], 'dead_letter')
    return 'DEFERRED'
  end
end
local rids = {}
local pending = redis.call('HGET', KEYS[1], 'pending_request_id')
if pending then rids[pending] = true end
for _, entry in ipairs(redis.call('XRANGE', KEYS[2], '-', '+')) do
  local fields = entry[2]
  for i = 2, #fields, 2 do
    if fields[i - 1] == 'q' then
      -- A packed entry's questions, by id (its events, in `z`, are not text).
      for rid in string.gmatch(fields[i], '[%w%-]+') do rids[rid] = true end
    elseif fields[i - 1] ~= 'z' then
      for rid in string.gmatch(fields[i], '"request_id":"([%w%-]+)"') do rids[rid] = true end
    end
  end
end
for rid in pairs(rids) do
  local ix = KEYS[1] .. ':ix:' .. rid
  if redis.call('EXISTS', ix) == 1 or redis.call('HGET', p .. ':interactions:runs', rid) == run then
    redis.call('HDEL', p .. ':interactions:runs', rid)
    redis.call('ZREM', p .. ':interactions:all', rid)
    redis.call('ZREM', p .. ':interactions:pending', rid)
    redis.call('ZREM', p .. ':interactions:deadlines', rid)
    redis.call('ZREM', p .. ':interactions:escalations', rid)
    redis.call('DEL', ix)
  end
  redis.call('ZREM', p .. ':resumes', run .. '/' .. rid)
end
local idem = redis.call('HGET', KEYS[1], 'idempotency_key')
if idem then
  local v = redis.call('GET', idem)
  if v and string.sub(v, 1, #run + 1) == run .. ' ' then redis.call('DEL', idem) end
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[1] .. ':snap')
for _, s in ipairs({'QUEUED', 'RUNNING', 'WAITING_FOR_INPUT', 'INTERRUPTED', 'COMPLETED', 'FAILED', 'CANCELLED'}) do
  redis.call('ZREM', p .. ':runs:' .. s, run)
end
redis.call('ZREM', p .. ':runs:all', run)
redis.call('ZREM', p .. ':runs:finished', run)
if st then return 'PURGED' end
return 'GONE'
"#;

/// What [`RedisRunStore::purge_run`] did to one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purge {
    /// Deleted: record, journal, questions, index entries.
    Purged,
    /// The run was already gone; what was left of it in the indexes is removed.
    Gone,
    /// Finished after the cut-off, or not in the finished index: left alone.
    Kept,
    /// Not finished (reopened after it finished): left alone, its stale index entry removed.
    Live,
    /// Failed by a dead letter that is kept longer than finished runs: left until then.
    Deferred,
}

/// What one retention pass ([`RedisRunStore::purge_finished`]) did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Purged {
    /// Runs deleted.
    pub purged: usize,
    /// Runs of dead letters left for as long again as their letters are kept longer.
    pub deferred: usize,
    /// Due entries that named no run any more (cleaned) or a run not finished (left alone).
    pub skipped: usize,
    /// Whether more runs may be due (the batch was full).
    pub more: bool,
}

impl RedisRunStore {
    /// Finished runs that finished at or before `before_us`, oldest first, at most `max`.
    /// Entries that are not run ids are removed from the index.
    pub async fn due_for_purge(&self, before_us: i64, max: usize) -> Result<Vec<RunId>, Error> {
        let ids = self.due_per_bucket("runs:finished", before_us, max).await?;
        self.runs_due(ids).await
    }

    /// The runs that entries `ids` of the buckets' `runs:finished` name (each with its bucket);
    /// entries that are not run ids are removed from the index.
    pub(super) async fn runs_due(&self, ids: Vec<(u32, String)>) -> Result<Vec<RunId>, Error> {
        let (mut due, mut junk) = (vec![], redis::pipe());
        let mut any_junk = false;
        for (k, raw) in ids {
            match raw.parse::<RunId>() {
                Ok(id) => due.push(id),
                // It would sit at the front of the index forever.
                Err(_) => {
                    junk.zrem(self.bucket_index(k, "runs:finished"), raw)
                        .ignore();
                    any_junk = true;
                }
            }
        }
        if any_junk {
            let mut conn = self.connection();
            junk.query_async::<()>(&mut conn).await.map_err(backend)?;
        }
        Ok(due)
    }

    /// Deletes `run_id` entirely (one script) if it is finished and finished at or before
    /// `before_us`; idempotent. The run of a dead letter ([`RedisRunStore::dead_lettering`]) is
    /// deferred instead, once, by as much longer as letters are kept
    /// ([`RedisRunStore::keeping_letters`]).
    pub async fn purge_run(&self, run_id: RunId, before_us: i64) -> Result<Purge, Error> {
        let mut conn = self.connection();
        let reply: Result<String, _> = redis::Script::new(PURGE)
            .key(self.run_key(run_id))
            .key(self.journal_key(run_id))
            .arg(self.run_tag(run_id))
            .arg(run_id.to_string())
            .arg(before_us)
            .arg(self.letters_longer_us)
            .invoke_async(&mut conn)
            .await;
        match reply {
            Ok(s) => match s.as_str() {
                "PURGED" => Ok(Purge::Purged),
                "GONE" => Ok(Purge::Gone),
                "KEPT" => Ok(Purge::Kept),
                "LIVE" => Ok(Purge::Live),
                "DEFERRED" => Ok(Purge::Deferred),
                other => Err(Error::Corrupt(format!(
                    "purge of {run_id} answered `{other}`"
                ))),
            },
            Err(e) => Err(match ScriptError::of(&e) {
                Some(known) => known.into_error(run_id),
                None => backend(e),
            }),
        }
    }

    /// One bounded retention pass: deletes up to `max` runs that finished at or before
    /// `before_us`, oldest first. Several processes may run it at once: each run is deleted by
    /// one script, and a second deletion finds nothing to do.
    pub async fn purge_finished(&self, before_us: i64, max: usize) -> Result<Purged, Error> {
        let due = self.due_for_purge(before_us, max).await?;
        self.purge_due(due, before_us, max).await
    }

    /// Deletes each of `due`, the runs a read of at most `max` found finished at or before
    /// `before_us` ([`Self::due_for_purge`], [`Self::due`]), as [`Self::purge_finished`] does.
    pub async fn purge_due(
        &self,
        due: Vec<RunId>,
        before_us: i64,
        max: usize,
    ) -> Result<Purged, Error> {
        let mut done = Purged {
            more: due.len() >= max,
            ..Purged::default()
        };
        for run_id in due {
            match self.purge_run(run_id, before_us).await? {
                Purge::Purged => done.purged += 1,
                Purge::Deferred => done.deferred += 1,
                Purge::Gone | Purge::Live | Purge::Kept => done.skipped += 1,
            }
        }
        Ok(done)
    }

    /// When each of `ids` finished (µs), `None` for a run not in the finished index.
    pub async fn finished_at(&self, ids: &[RunId]) -> Result<Vec<Option<i64>>, Error> {
        if ids.is_empty() {
            return Ok(vec![]);
        }
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.zscore(self.run_index(*id, "runs:finished"), id.to_string());
        }
        let mut conn = self.connection();
        let scores: Vec<Option<f64>> = pipe.query_async(&mut conn).await.map_err(backend)?;
        // Scores are µs timestamps: exact in an f64.
        Ok(scores.into_iter().map(|s| s.map(|s| s as i64)).collect())
    }

    /// Adds to the finished index the runs of `status` (a terminal one), newest first from
    /// `offset` on, at most `max`, that finished before the index existed, with their
    /// `updated_at` as the finish time (`ZADD NX`: an entry already there is kept). Returns how
    /// many it added and the offset to go on from (0 once the status index was walked through).
    /// Newest first, because retention deletes at the oldest end: those deletions do not shift
    /// the offsets of a walk in progress (new runs at the newest end only make it read some
    /// twice).
    pub async fn backfill_finished(
        &self,
        status: RunStatus,
        offset: usize,
        max: usize,
    ) -> Result<(usize, usize), Error> {
        if !status.is_terminal() || max == 0 {
            return Ok((0, 0));
        }
        let (ids, next) = self
            .walk_buckets(&format!("runs:{}", status.as_str()), true, offset, max)
            .await?;
        let ids: Vec<RunId> = ids.iter().filter_map(|i| i.parse().ok()).collect();
        if ids.is_empty() {
            return Ok((0, next));
        }
        let mut pipe = redis::pipe();
        for id in &ids {
            pipe.hget(self.run_key(*id), "updated_at");
        }
        let mut conn = self.connection();
        let times: Vec<Option<String>> = pipe.query_async(&mut conn).await.map_err(backend)?;
        // One `ZADD NX CH` per run, each into its bucket's index, in one round trip.
        let mut add = redis::pipe();
        let mut any = false;
        for (id, at) in ids.iter().zip(times) {
            // A run gone meanwhile, or with a damaged time, is left out.
            if let Some(t) = at.and_then(|t| t.parse::<Timestamp>().ok()) {
                add.cmd("ZADD")
                    .arg(self.run_index(*id, "runs:finished"))
                    .arg("NX")
                    .arg("CH")
                    .arg(t.micros())
                    .arg(id.to_string());
                any = true;
            }
        }
        if !any {
            return Ok((0, next));
        }
        let mut conn = self.connection();
        let added: Vec<usize> = add.query_async(&mut conn).await.map_err(backend)?;
        Ok((added.iter().sum(), next))
    }
}
