//! What the gateway and its reconcilers read and write in Redis beside the engine's port: the
//! indexes (runs by status, interactions by state and deadline, resumes to check), submissions
//! with their idempotency keys, worker heartbeats and the journal tail for live streams.

use std::collections::HashMap;

use redis::AsyncCommands;

use super::{
    Fields, RedisRunStore, ScriptError, StoredInteraction, backend, parse_interaction, parse_record,
};
use crate::{Error, RunRecord};
use delta_protocol::journal;
use delta_protocol::{
    Event, InteractionRequest, JournalEvent, MessageLevel, RequestId, RunId, RunStatus,
    SystemMessage, Timestamp,
};

/// What the gateway notes about a job once it is published (it learns the job's stream sequence
/// only then). Each is a few idempotent writes; many go in one round trip
/// ([`RedisRunStore::write_notes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Note {
    /// A run's start job went out as stream message `seq` ([`RedisRunStore::set_job_seq`]).
    JobSeq { run_id: RunId, seq: u64 },
    /// The resume job of an answered question went out as `seq`; the resume is checked again
    /// at `recheck_us` unless it happened ([`RedisRunStore::resume_published`]).
    ResumePublished {
        run_id: RunId,
        request_id: RequestId,
        seq: u64,
        recheck_us: i64,
    },
}

/// Puts a run that dead-lettering failed back in the queue: `FAILED` → `QUEUED`, its error
/// cleared, a journal note appended; a question its journal left open, closed `EXPIRED` by the
/// failure before its deadline, is `PENDING` again. Only a run whose error is the letter's
/// reason: one that failed otherwise stays as it is. Returns `{'QUEUED', seq}`, or
/// `{'STATUS', status}` / `{'OTHER', error}` when nothing changed.
/// KEYS: run, journal, the open question (or a dummy). ARGV: bucket tag, now, now µs, the note's JSON
/// without its opening brace, the letter's reason, the question's id (or ''), when it was asked
/// (µs), its deadline (µs or ''), `1` when it has an escalation (the reconciler finds its next
/// step).
/// A request's run and interaction, if the run is in the request's bucket. KEYS: the bucket's
/// `interactions:runs`. ARGV: request id, the bucket's tag. Returns `{run id, interaction
/// fields}` (empty fields for a run of another bucket), or nil.
const FIND: &str = r#"
local run = redis.call('HGET', KEYS[1], ARGV[1])
if not run then return false end
return {run, redis.call('HGETALL', ARGV[2] .. ':run:' .. run .. ':ix:' .. ARGV[1])}
"#;

static FIND_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(FIND));

const REQUEUE: &str = r#"
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return redis.error_reply('NOTFOUND') end
if st ~= 'FAILED' then return {'STATUS', st} end
local err = string.gsub(redis.call('HGET', KEYS[1], 'error') or '', '[\r\n]', ' ')
if err ~= ARGV[5] then return {'OTHER', err} end
local run = redis.call('HGET', KEYS[1], 'run_id')
local seq = tonumber(redis.call('HGET', KEYS[1], 'seq') or '0') + 1
redis.call('XADD', KEYS[2], seq .. '-0', 'e',
  '{"seq":' .. seq .. ',"timestamp":"' .. ARGV[2] .. '",' .. ARGV[4])
redis.call('HSET', KEYS[1], 'seq', seq, 'updated_at', ARGV[2], 'status', 'QUEUED')
redis.call('HDEL', KEYS[1], 'error', 'result', 'pending_request_id', 'dead_letter')
local score = redis.call('ZSCORE', ARGV[1] .. ':runs:all', run) or ARGV[3]
redis.call('ZREM', ARGV[1] .. ':runs:FAILED', run)
redis.call('ZREM', ARGV[1] .. ':runs:finished', run)
redis.call('ZADD', ARGV[1] .. ':runs:QUEUED', score, run)
if ARGV[6] ~= '' and redis.call('HGET', KEYS[3], 'state') == 'EXPIRED'
  and (ARGV[8] == '' or tonumber(ARGV[8]) > tonumber(ARGV[3])) then
  redis.call('HSET', KEYS[3], 'state', 'PENDING')
  redis.call('HDEL', KEYS[3], 'answered_at')
  redis.call('ZADD', ARGV[1] .. ':interactions:pending', ARGV[7], ARGV[6])
  if ARGV[8] ~= '' then redis.call('ZADD', ARGV[1] .. ':interactions:deadlines', ARGV[8], ARGV[6]) end
  if ARGV[9] == '1' then redis.call('ZADD', ARGV[1] .. ':interactions:escalations', 0, ARGV[6]) end
end
return {'QUEUED', tostring(seq)}
"#;

impl RedisRunStore {
    /// Removes run `run_id`'s `dead_letter` mark (its letter dropped): retention then deletes it
    /// as any finished run.
    pub async fn forget_dead_letter(&self, run_id: RunId) -> Result<(), Error> {
        let mut conn = self.connection();
        redis::cmd("HDEL")
            .arg(self.run_key(run_id))
            .arg("dead_letter")
            .query_async::<()>(&mut conn)
            .await
            .map_err(backend)
    }
}

/// What [`RedisRunStore::requeue_failed`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Requeue {
    /// `QUEUED` again; the journal's note has this `seq`.
    Queued { seq: u64 },
    /// The run is not `FAILED` (it went on): nothing changed.
    NotFailed(RunStatus),
    /// The run failed for another reason than the letter's (this error): nothing changed.
    FailedOtherwise(String),
}

/// How long a submission's `Idempotency-Key` is remembered.
const IDEMPOTENCY_TTL_S: u64 = 24 * 3600;

/// What a submission did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Submitted {
    Created,
    /// The idempotency key was used before: the run it made, and the fingerprint of its body.
    Existing {
        run_id: RunId,
        fingerprint: String,
    },
}

/// One page of an index: `(member, score)` in index order, after the cursor given.
#[derive(Clone, Debug, Default)]
pub struct Page {
    pub entries: Vec<(String, i64)>,
    /// Whether the index holds more after these.
    pub more: bool,
}

impl Page {
    /// The cursor that continues after `(member, score)`.
    pub fn cursor(member: &str, score: i64) -> String {
        format!("{score}_{member}")
    }

    fn parse_cursor(cursor: &str) -> Option<(i64, &str)> {
        let (score, member) = cursor.split_once('_')?;
        Some((score.parse().ok()?, member))
    }
}

/// What the lost-job reconciler needs of a run.
#[derive(Clone, Debug)]
pub struct QueueRun {
    pub run_id: RunId,
    pub agent: String,
    pub status: RunStatus,
    pub updated_at: Option<Timestamp>,
    /// The stream sequence of the last job published for the run (by the gateway).
    pub job_seq: u64,
    /// The stream sequence of the job whose delivery last wrote to the run (the fence).
    pub fence_seq: u64,
}

/// A row of `HMGET agent status updated_at job_seq fence_seq`.
fn queue_row(run_id: RunId, row: &[Option<String>]) -> Option<QueueRun> {
    let get = |i: usize| row.get(i).cloned().flatten();
    Some(QueueRun {
        run_id,
        agent: get(0)?,
        status: get(1)?.parse().ok()?,
        updated_at: get(2).and_then(|t| t.parse().ok()),
        job_seq: get(3).and_then(|s| s.parse().ok()).unwrap_or(0),
        fence_seq: get(4).and_then(|s| s.parse().ok()).unwrap_or(0),
    })
}

/// A live view of one run's journal on a connection of its own (blocking reads).
pub struct JournalTail {
    conn: super::Conn,
    key: String,
}

impl JournalTail {
    /// Events after `after_seq`, waiting up to `block_ms` for the first one.
    pub async fn next(
        &mut self,
        after_seq: u64,
        block_ms: u64,
    ) -> Result<Vec<JournalEvent>, Error> {
        let opts = redis::streams::StreamReadOptions::default()
            .block(usize::try_from(block_ms).unwrap_or(usize::MAX))
            .count(500);
        let reply: Option<redis::streams::StreamReadReply> = self
            .conn
            .xread_options(&[&self.key], &[format!("{after_seq}-0")], &opts)
            .await
            .map_err(backend)?;
        let mut text = String::new();
        for key in reply.map(|r| r.keys).unwrap_or_default() {
            for id in key.ids {
                let fields: HashMap<&str, &[u8]> = id
                    .map
                    .iter()
                    .filter_map(|(k, v)| match v {
                        redis::Value::BulkString(b) => Some((k.as_str(), b.as_slice())),
                        _ => None,
                    })
                    .collect();
                super::entry_lines(
                    &id.id,
                    |f| fields.get(f).copied(),
                    after_seq.saturating_add(1),
                    &mut text,
                );
            }
        }
        Ok(journal::parse_jsonl_from(&text, after_seq.saturating_add(1))?.events)
    }
}

/// Drops a run's resume entry unless the run still waits on the question and the question is
/// settled (the resume is then still owed). KEYS: the bucket's `resumes`, the run, the question.
/// ARGV: the entry, the request id. 1 if dropped.
const DROP_RESUME: &str = r#"
local run = redis.call('HMGET', KEYS[2], 'status', 'pending_request_id')
if run[1] == 'WAITING_FOR_INPUT' and run[2] == ARGV[2] then
  local st = redis.call('HGET', KEYS[3], 'state')
  if st and st ~= 'PENDING' then return 0 end
end
redis.call('ZREM', KEYS[1], ARGV[1])
return 1
"#;

static DROP_RESUME_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(DROP_RESUME));

impl RedisRunStore {
    /// Stores a new run (indexed by creation time and status). With `idempotency` (the key's
    /// hash, the body's fingerprint), a key seen in the last 24 h returns the run it made.
    pub async fn create_indexed(
        &self,
        record: &RunRecord,
        idempotency: Option<(&str, &str)>,
    ) -> Result<Submitted, Error> {
        let (idem_key, idem_value) = match idempotency {
            Some((key, fingerprint)) => {
                let k = super::bucket_of(key, self.buckets);
                if k != self.bucket(record.run_id) {
                    return Err(Error::Buckets(format!(
                        "run {} is not in the bucket of its idempotency key: mint its id with run_id_for_key",
                        record.run_id
                    )));
                }
                (
                    self.bucket_index(k, &format!("idempotency:{key}")),
                    format!("{} {fingerprint}", record.run_id),
                )
            }
            None => Default::default(),
        };
        let mut inv = self.create.key(self.run_key(record.run_id));
        inv.arg(self.run_tag(record.run_id))
            .arg(record.created_at.micros())
            .arg(idem_key)
            .arg(idem_value)
            .arg(IDEMPOTENCY_TTL_S);
        for (k, v) in super::record_fields(record) {
            inv.arg(k).arg(v);
        }
        let (reply, replicated) = self
            .invoke_replicated::<(String, String)>(record.run_id, &inv)
            .await;
        match reply {
            Ok((outcome, prior)) if outcome == "IDEMPOTENT" => {
                let (run, fingerprint) = prior.split_once(' ').unwrap_or((&prior, ""));
                let run_id = run
                    .parse()
                    .map_err(|_| Error::Corrupt(format!("idempotency record `{prior}`")))?;
                Ok(Submitted::Existing {
                    run_id,
                    fingerprint: fingerprint.to_owned(),
                })
            }
            Ok(_) => {
                replicated?;
                Ok(Submitted::Created)
            }
            Err(e) => Err(match ScriptError::of(&e) {
                Some(known) => known.into_error(record.run_id),
                None => backend(e),
            }),
        }
    }

    /// A new run id in the bucket of the idempotency key `key` (its digest): a submission with
    /// a key creates its run, and checks and sets the key, in one script in one slot. Random ids
    /// are drawn until one falls in that bucket (`buckets` draws on average).
    pub fn run_id_for_key(&self, key: &str) -> RunId {
        let want = super::bucket_of(key, self.buckets);
        loop {
            let id = RunId::new();
            if self.bucket(id) == want {
                return id;
            }
        }
    }

    /// Remembers the stream sequence of the job just published for a run.
    pub async fn set_job_seq(&self, run_id: RunId, seq: u64) -> Result<(), Error> {
        self.write_notes(&[Note::JobSeq { run_id, seq }]).await
    }

    /// Writes `notes` in one round trip (a pipeline; on a Redis Cluster, split by slot).
    pub async fn write_notes(&self, notes: &[Note]) -> Result<(), Error> {
        if notes.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for note in notes {
            match *note {
                Note::JobSeq { run_id, seq } => {
                    pipe.hset(self.run_key(run_id), "job_seq", seq).ignore();
                }
                Note::ResumePublished {
                    run_id,
                    request_id,
                    seq,
                    recheck_us,
                } => {
                    pipe.hset(
                        self.interaction_key(run_id, &request_id.to_string()),
                        "resume_seq",
                        seq,
                    )
                    .ignore()
                    .cmd("ZADD")
                    .arg(self.run_index(run_id, "resumes"))
                    .arg("XX")
                    .arg(recheck_us)
                    .arg(format!("{run_id}/{request_id}"))
                    .ignore();
                }
            }
        }
        let mut conn = self.connection();
        pipe.query_async::<()>(&mut conn).await.map_err(backend)
    }

    /// A run's record alone (no journal).
    pub async fn record(&self, run_id: RunId) -> Result<RunRecord, Error> {
        let mut conn = self.connection();
        let h: Fields = conn.hgetall(self.run_key(run_id)).await.map_err(backend)?;
        if h.is_empty() {
            return Err(Error::NotFound(run_id));
        }
        parse_record(run_id, &h)
    }

    /// The records of `ids`, in order, skipping any that vanished.
    pub async fn records(&self, ids: &[RunId]) -> Result<Vec<RunRecord>, Error> {
        if ids.is_empty() {
            return Ok(vec![]);
        }
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.hgetall(self.run_key(*id));
        }
        let mut conn = self.connection();
        let hashes: Vec<Fields> = pipe.query_async(&mut conn).await.map_err(backend)?;
        ids.iter()
            .zip(hashes)
            .filter(|(_, h)| !h.is_empty())
            .map(|(id, h)| parse_record(*id, &h))
            .collect()
    }

    /// The run a request belongs to, if the request exists. A request id is drawn in its run's
    /// bucket (`new_request_id`), so its own bucket is asked first; one made otherwise (by an
    /// older worker) is looked for in every bucket, in one more round trip.
    /// The run of request `request_id` and its stored interaction: one script on the request's
    /// own bucket, where the engine mints its ids (an answer's one read); a request of an older
    /// run found elsewhere takes the long way ([`RedisRunStore::interaction_run`]).
    pub async fn find_interaction(
        &self,
        request_id: RequestId,
    ) -> Result<Option<(RunId, StoredInteraction)>, Error> {
        let rid = request_id.to_string();
        let own = super::bucket_of(&rid, self.buckets);
        let mut conn = self.connection();
        let found: Option<(String, HashMap<String, String>)> = FIND_SCRIPT
            .key(self.bucket_index(own, "interactions:runs"))
            .arg(&rid)
            .arg(self.tag(own))
            .invoke_async(&mut conn)
            .await
            .map_err(backend)?;
        let run_id = match found.map(|(run, h)| (run.parse::<RunId>(), h)) {
            Some((Ok(run_id), h)) if self.bucket(run_id) == own => {
                return Ok(super::parse_interaction(request_id, &h)?.map(|ix| (run_id, ix)));
            }
            Some((Ok(run_id), _)) => Some(run_id),
            _ => self.interaction_run(request_id).await?,
        };
        let Some(run_id) = run_id else {
            return Ok(None);
        };
        Ok(self
            .interaction(run_id, request_id)
            .await?
            .map(|ix| (run_id, ix)))
    }

    pub async fn interaction_run(&self, request_id: RequestId) -> Result<Option<RunId>, Error> {
        let rid = request_id.to_string();
        let own = super::bucket_of(&rid, self.buckets);
        let mut conn = self.connection();
        let found: Option<String> = conn
            .hget(self.bucket_index(own, "interactions:runs"), &rid)
            .await
            .map_err(backend)?;
        if let Some(run) = found.and_then(|r| r.parse().ok()) {
            return Ok(Some(run));
        }
        let runs: Vec<Option<String>> = self
            .per_bucket(|pipe, k| {
                pipe.hget(self.bucket_index(k, "interactions:runs"), &rid);
            })
            .await?;
        Ok(runs.into_iter().flatten().find_map(|r| r.parse().ok()))
    }

    /// Interactions by id (each with its run), skipping unknown ones; two round trips.
    pub async fn interactions(
        &self,
        ids: &[RequestId],
    ) -> Result<Vec<(RunId, StoredInteraction)>, Error> {
        if ids.is_empty() {
            return Ok(vec![]);
        }
        let texts: Vec<String> = ids.iter().map(ToString::to_string).collect();
        let by_bucket: Vec<Vec<Option<String>>> = self
            .per_bucket(|pipe, k| {
                pipe.cmd("HMGET")
                    .arg(self.bucket_index(k, "interactions:runs"))
                    .arg(&texts);
            })
            .await?;
        let known: Vec<(RequestId, RunId)> = ids
            .iter()
            .enumerate()
            .filter_map(|(i, rid)| {
                let run = by_bucket
                    .iter()
                    .find_map(|b| b.get(i).cloned().flatten().and_then(|r| r.parse().ok()))?;
                Some((*rid, run))
            })
            .collect();
        let mut pipe = redis::pipe();
        for (rid, run) in &known {
            pipe.hgetall(self.interaction_key(*run, &rid.to_string()));
        }
        let mut conn = self.connection();
        let hashes: Vec<Fields> = pipe.query_async(&mut conn).await.map_err(backend)?;
        let mut out = vec![];
        for ((rid, run), h) in known.into_iter().zip(hashes) {
            if let Some(ix) = parse_interaction(rid, &h)? {
                out.push((run, ix));
            }
        }
        Ok(out)
    }

    /// Notes that the resume job of an answered interaction went out as stream message `seq`;
    /// its run is looked at again after `recheck_us` unless it resumed meanwhile.
    pub async fn resume_published(
        &self,
        run_id: RunId,
        request_id: RequestId,
        seq: u64,
        recheck_us: i64,
    ) -> Result<(), Error> {
        self.write_notes(&[Note::ResumePublished {
            run_id,
            request_id,
            seq,
            recheck_us,
        }])
        .await
    }

    /// Pending interactions whose deadline is at or before `now_us`: `(run, request)`.
    pub async fn due_deadlines(
        &self,
        now_us: i64,
        max: usize,
    ) -> Result<Vec<(RunId, RequestId)>, Error> {
        self.due_interactions("interactions:deadlines", now_us, max)
            .await
    }

    /// Pending interactions whose next escalation step is due at or before `now_us`.
    pub async fn due_escalations(
        &self,
        now_us: i64,
        max: usize,
    ) -> Result<Vec<(RunId, RequestId)>, Error> {
        self.due_interactions("interactions:escalations", now_us, max)
            .await
    }

    /// Drops an escalation entry that needs no action (no longer pending, or no step left).
    pub async fn drop_escalation(&self, run_id: RunId, request_id: RequestId) -> Result<(), Error> {
        self.drop_from_index(run_id, request_id, "interactions:escalations")
            .await
    }

    /// Removes request `request_id` of `run_id` from its bucket's index `name`.
    async fn drop_from_index(
        &self,
        run_id: RunId,
        request_id: RequestId,
        name: &str,
    ) -> Result<(), Error> {
        let mut conn = self.connection();
        conn.zrem::<_, _, ()>(self.run_index(run_id, name), request_id.to_string())
            .await
            .map_err(backend)
    }

    /// The interactions of the index `name` (scored by a time, members request ids) due at or
    /// before `now_us`, with their runs; members that belong to no run are dropped from it.
    async fn due_interactions(
        &self,
        name: &str,
        now_us: i64,
        max: usize,
    ) -> Result<Vec<(RunId, RequestId)>, Error> {
        // Each bucket's earliest `max`, then the earliest `max` of them all.
        let due = self.due_per_bucket(name, now_us, max).await?;
        self.interactions_due(name, due).await
    }

    /// Everything a round of the reconcilers looks at, in one round trip: the questions whose
    /// deadline or escalation step is due at `now_us`, the resumes due for a look, and (with
    /// `purge_before_us`) the finished runs past retention; at most `max` of each, earliest
    /// first. Only what is found costs more: the runs of due questions, read together.
    pub async fn due(
        &self,
        now_us: i64,
        purge_before_us: Option<i64>,
        max: usize,
    ) -> Result<Due, Error> {
        let mut wanted = vec![
            ("interactions:deadlines", now_us),
            ("interactions:escalations", now_us),
            ("resumes", now_us),
        ];
        if let Some(before) = purge_before_us {
            wanted.push(("runs:finished", before));
        }
        let mut lists = self.due_per_bucket_of(&wanted, max).await?.into_iter();
        let mut next = || lists.next().unwrap_or_default();
        let (deadlines, escalations, resumes, purge) = (next(), next(), next(), next());
        Ok(Due {
            deadlines: self
                .interactions_due("interactions:deadlines", deadlines)
                .await?,
            escalations: self
                .interactions_due("interactions:escalations", escalations)
                .await?,
            resumes: resumes_of(&resumes),
            purge: self.runs_due(purge).await?,
        })
    }

    /// The questions `due` of the index `name` (each with its bucket), with their runs; members
    /// that belong to no run are dropped from the index.
    async fn interactions_due(
        &self,
        name: &str,
        due: Vec<(u32, String)>,
    ) -> Result<Vec<(RunId, RequestId)>, Error> {
        if due.is_empty() {
            return Ok(vec![]);
        }
        let mut ids: Vec<Vec<String>> = vec![vec![]; self.buckets as usize];
        for (k, id) in &due {
            if let Some(list) = ids.get_mut(*k as usize) {
                list.push(id.clone());
            }
        }
        let mut pipe = redis::pipe();
        for (k, list) in ids.iter().enumerate().filter(|(_, l)| !l.is_empty()) {
            pipe.cmd("HMGET")
                .arg(self.bucket_index(k as u32, "interactions:runs"))
                .arg(list);
        }
        let mut conn = self.connection();
        let runs: Vec<Vec<Option<String>>> = pipe.query_async(&mut conn).await.map_err(backend)?;
        let mut found: HashMap<String, Option<String>> = HashMap::new();
        for (list, runs) in ids.iter().filter(|l| !l.is_empty()).zip(runs) {
            for (id, run) in list.iter().zip(runs) {
                found.insert(id.clone(), run);
            }
        }
        let mut out = vec![];
        let mut junk = redis::pipe();
        let mut any_junk = false;
        for (k, raw) in &due {
            let run = found.get(raw).cloned().flatten();
            match (
                raw.parse::<RequestId>(),
                run.and_then(|r| r.parse::<RunId>().ok()),
            ) {
                (Ok(rid), Some(run)) => out.push((run, rid)),
                // Not a request of any run: it would sit at the front of the index forever.
                _ => {
                    junk.zrem(self.bucket_index(*k, name), raw).ignore();
                    any_junk = true;
                }
            }
        }
        if any_junk {
            let mut conn = self.connection();
            junk.query_async::<()>(&mut conn).await.map_err(backend)?;
        }
        Ok(out)
    }

    /// The members of every bucket's index `name` scored at or before `until`: the earliest
    /// `max` of them all, earliest first, each with its bucket. One round trip.
    pub(super) async fn due_per_bucket(
        &self,
        name: &str,
        until: i64,
        max: usize,
    ) -> Result<Vec<(u32, String)>, Error> {
        let mut lists = self.due_per_bucket_of(&[(name, until)], max).await?;
        Ok(lists.pop().unwrap_or_default())
    }

    /// As [`Self::due_per_bucket`] for each `(name, until)` of `wanted`, all in one round trip:
    /// one list per entry of `wanted`, in its order.
    async fn due_per_bucket_of(
        &self,
        wanted: &[(&str, i64)],
        max: usize,
    ) -> Result<Vec<Vec<(u32, String)>>, Error> {
        // Bucket by bucket, each index of `wanted` in turn.
        let lists: Vec<Vec<(String, f64)>> = self
            .per_bucket(|pipe, k| {
                for (name, until) in wanted {
                    pipe.cmd("ZRANGEBYSCORE")
                        .arg(self.bucket_index(k, name))
                        .arg("-inf")
                        .arg(*until)
                        .arg("WITHSCORES")
                        .arg("LIMIT")
                        .arg(0)
                        .arg(max);
                }
            })
            .await?;
        let mut all: Vec<Vec<(f64, u32, String)>> = vec![vec![]; wanted.len()];
        for (n, list) in lists.into_iter().enumerate() {
            let (k, i) = (n / wanted.len(), n % wanted.len());
            all[i].extend(list.into_iter().map(|(m, s)| (s, k as u32, m)));
        }
        Ok(all
            .into_iter()
            .map(|mut l| {
                l.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.2.cmp(&b.2)));
                l.truncate(max);
                l.into_iter().map(|(_, k, m)| (k, m)).collect()
            })
            .collect())
    }

    /// Drops a deadline that needs no action (its interaction is no longer pending).
    pub async fn drop_deadline(&self, run_id: RunId, request_id: RequestId) -> Result<(), Error> {
        self.drop_from_index(run_id, request_id, "interactions:deadlines")
            .await
    }

    /// Answered interactions whose run has not resumed, due for a look at `now_us`.
    pub async fn due_resumes(
        &self,
        now_us: i64,
        max: usize,
    ) -> Result<Vec<(RunId, RequestId)>, Error> {
        let members = self.due_per_bucket("resumes", now_us, max).await?;
        Ok(resumes_of(&members))
    }

    /// Looks at a resume again at `at_us` (only while it is still awaited).
    pub async fn reschedule_resume(
        &self,
        run_id: RunId,
        request_id: RequestId,
        at_us: i64,
    ) -> Result<(), Error> {
        let mut conn = self.connection();
        redis::cmd("ZADD")
            .arg(self.run_index(run_id, "resumes"))
            .arg("XX")
            .arg(at_us)
            .arg(format!("{run_id}/{request_id}"))
            .query_async::<()>(&mut conn)
            .await
            .map_err(backend)
    }

    /// Forgets a resume that needs no more looking after: its run is gone, went on, or waits on
    /// the question pending again. Checked again as it is dropped, so that an answer settled
    /// since the caller looked (a reopened question answered anew, which queues the same entry)
    /// keeps its entry; `false` then.
    pub async fn drop_resume(&self, run_id: RunId, request_id: RequestId) -> Result<bool, Error> {
        let rid = request_id.to_string();
        let mut inv = DROP_RESUME_SCRIPT.key(self.run_index(run_id, "resumes"));
        inv.key(self.run_key(run_id))
            .key(self.interaction_key(run_id, &rid))
            .arg(format!("{run_id}/{rid}"))
            .arg(&rid);
        let mut conn = self.connection();
        inv.invoke_async::<i64>(&mut conn)
            .await
            .map(|n| n == 1)
            .map_err(backend)
    }

    /// Up to `max` entries of the index `name` (`runs:all`, `runs:QUEUED`, `interactions:pending`,
    /// …) after `cursor`, newest or oldest first, across every bucket. A bad cursor is `Ok(None)`.
    ///
    /// The order is by `(score, member)`, as within one sorted set, so a cursor is one position
    /// `<score>_<member>` that applies to every bucket alike: each bucket gives its first
    /// entries after it (one command per bucket, one round trip) and the page is the first
    /// `max` of their merge. An entry that ranks among the page's in the merged order ranks no
    /// lower in its own bucket, so each bucket's first `max + 1` are enough.
    pub async fn index_page(
        &self,
        name: &str,
        newest_first: bool,
        cursor: Option<&str>,
        max: usize,
    ) -> Result<Option<Page>, Error> {
        let after = match cursor {
            Some(c) => match Page::parse_cursor(c) {
                Some(a) => Some(a),
                None => return Ok(None),
            },
            None => None,
        };
        // Entries at the cursor's own score may repeat: fetch a little more and skip them.
        let want = max + 1;
        let slack = 64;
        let lists: Vec<Vec<(String, f64)>> = self
            .per_bucket(|pipe, k| {
                let key = self.bucket_index(k, name);
                match (newest_first, after) {
                    (true, None) => {
                        pipe.zrevrange_withscores(key, 0, want as isize - 1);
                    }
                    (false, None) => {
                        pipe.zrange_withscores(key, 0, want as isize - 1);
                    }
                    (true, Some((s, _))) => {
                        pipe.zrevrangebyscore_limit_withscores(
                            key,
                            s,
                            "-inf",
                            0,
                            (want + slack) as isize,
                        );
                    }
                    (false, Some((s, _))) => {
                        pipe.zrangebyscore_limit_withscores(
                            key,
                            s,
                            "+inf",
                            0,
                            (want + slack) as isize,
                        );
                    }
                }
            })
            .await?;
        // A bucket that filled its whole reply may hold more than it gave.
        let limit = if after.is_some() { want + slack } else { want };
        let mut cut_short = false;
        let mut entries: Vec<(String, i64)> = vec![];
        for raw in lists {
            cut_short |= raw.len() >= limit;
            entries.extend(
                raw.into_iter()
                    // Scores are µs timestamps: exact in an f64.
                    .map(|(m, s)| (m, s as i64))
                    .filter(|(m, s)| match after {
                        None => true,
                        Some((cs, cm)) if newest_first => *s < cs || (*s == cs && m.as_str() < cm),
                        Some((cs, cm)) => *s > cs || (*s == cs && m.as_str() > cm),
                    }),
            );
        }
        entries.sort_by(|a, b| {
            let order = a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0));
            if newest_first { order.reverse() } else { order }
        });
        let more = entries.len() > max || cut_short;
        entries.truncate(max);
        Ok(Some(Page { entries, more }))
    }

    /// Journal events from `from_seq` on (at most `max`).
    pub async fn journal_from(
        &self,
        run_id: RunId,
        from_seq: u64,
        max: usize,
    ) -> Result<Vec<JournalEvent>, Error> {
        let mut conn = self.connection();
        let entries: Vec<(String, super::EntryFields)> = redis::cmd("XRANGE")
            .arg(self.journal_key(run_id))
            .arg(format!("{}-0", from_seq.max(1)))
            .arg("+")
            .arg("COUNT")
            .arg(max)
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        // An entry holds one write's events: keep `max` of them.
        let mut events = super::parse_entries(&entries, from_seq.max(1))?;
        events.truncate(max);
        Ok(events)
    }

    /// A blocking reader of one run's journal, on a connection of its own.
    pub async fn journal_tail(&self, run_id: RunId) -> Result<JournalTail, Error> {
        let conn = self.client.dedicated().await.map_err(backend)?;
        Ok(JournalTail {
            conn,
            key: self.journal_key(run_id),
        })
    }

    /// Runs by status and interactions pending, for `/metrics`.
    pub async fn counts(&self) -> Result<(HashMap<RunStatus, u64>, u64), Error> {
        // Every bucket's counts, one round trip.
        let mut pipe = redis::pipe();
        for k in 0..self.buckets {
            for s in RunStatus::ALL {
                pipe.zcard(self.bucket_index(k, &format!("runs:{}", s.as_str())));
            }
            pipe.zcard(self.bucket_index(k, "interactions:pending"));
        }
        let mut conn = self.connection();
        let n: Vec<u64> = pipe.query_async(&mut conn).await.map_err(backend)?;
        let width = RunStatus::ALL.len() + 1;
        let mut by_status: HashMap<RunStatus, u64> = HashMap::new();
        let mut pending = 0;
        for row in n.chunks(width) {
            for (s, c) in RunStatus::ALL.into_iter().zip(row) {
                *by_status.entry(s).or_default() += c;
            }
            pending += row.last().copied().unwrap_or(0);
        }
        Ok((by_status, pending))
    }

    /// Records that `worker` is alive (and forgets workers silent for an hour).
    pub async fn heartbeat(&self, worker: &str) -> Result<(), Error> {
        let now_ms = Timestamp::now().micros() / 1000;
        let mut conn = self.connection();
        redis::pipe()
            .zadd(self.index("workers"), worker, now_ms)
            .ignore()
            .cmd("ZREMRANGEBYSCORE")
            .arg(self.index("workers"))
            .arg("-inf")
            .arg(now_ms - 3_600_000)
            .ignore()
            .query_async::<()>(&mut conn)
            .await
            .map_err(backend)
    }

    /// Workers heard from since `since_ms` (ms since the epoch), with when they last were.
    pub async fn workers_seen(&self, since_ms: i64) -> Result<Vec<(String, i64)>, Error> {
        let mut conn = self.connection();
        let seen: Vec<(String, f64)> = conn
            .zrangebyscore_withscores(self.index("workers"), since_ms, "+inf")
            .await
            .map_err(backend)?;
        Ok(seen.into_iter().map(|(w, s)| (w, s as i64)).collect())
    }

    /// Up to `max` runs of `status`, oldest first from `offset`, with what the lost-job
    /// reconciler needs; the offset to continue from (0 when the index was walked through).
    pub async fn queue_runs(
        &self,
        status: RunStatus,
        offset: usize,
        max: usize,
    ) -> Result<(Vec<QueueRun>, usize), Error> {
        let (ids, next) = self
            .walk_buckets(&format!("runs:{}", status.as_str()), false, offset, max)
            .await?;
        let ids: Vec<RunId> = ids.iter().filter_map(|i| i.parse().ok()).collect();
        if ids.is_empty() {
            return Ok((vec![], next));
        }
        let mut pipe = redis::pipe();
        for id in &ids {
            pipe.cmd("HMGET").arg(self.run_key(*id)).arg(&[
                "agent",
                "status",
                "updated_at",
                "job_seq",
                "fence_seq",
            ]);
        }
        let mut conn = self.connection();
        let rows: Vec<Vec<Option<String>>> = pipe.query_async(&mut conn).await.map_err(backend)?;
        let runs = ids
            .into_iter()
            .zip(rows)
            .filter_map(|(run_id, row)| queue_row(run_id, &row))
            .collect();
        Ok((runs, next))
    }

    /// One step of a walk over every bucket's index `name`, oldest or newest first: the
    /// entries at `offset .. offset + share` of each bucket, `share` being `max / buckets`
    /// rounded up, in one round trip. Returns them and the offset of the next step (0 once no
    /// bucket holds more): a cursor of one number, as before the buckets.
    pub(super) async fn walk_buckets(
        &self,
        name: &str,
        newest_first: bool,
        offset: usize,
        max: usize,
    ) -> Result<(Vec<String>, usize), Error> {
        let share = max.div_ceil(self.buckets as usize).max(1);
        let lists: Vec<Vec<String>> = self
            .per_bucket(|pipe, k| {
                let key = self.bucket_index(k, name);
                // One more than the share: whether the bucket goes on past it.
                let (from, to) = (offset as isize, (offset + share) as isize);
                if newest_first {
                    pipe.zrevrange(key, from, to);
                } else {
                    pipe.zrange(key, from, to);
                }
            })
            .await?;
        let next = if lists.iter().any(|l| l.len() > share) {
            offset + share
        } else {
            0
        };
        Ok((
            lists
                .into_iter()
                .flat_map(|l| l.into_iter().take(share))
                .collect(),
            next,
        ))
    }

    /// What the lost-job reconciler needs of one run, read afresh.
    pub async fn queue_run(&self, run_id: RunId) -> Result<Option<QueueRun>, Error> {
        let mut conn = self.connection();
        let row: Vec<Option<String>> = redis::cmd("HMGET")
            .arg(self.run_key(run_id))
            .arg(&["agent", "status", "updated_at", "job_seq", "fence_seq"])
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        Ok(queue_row(run_id, &row))
    }

    /// Puts a run that dead-lettering failed (its error is `reason`) back to `QUEUED` with
    /// `note` journaled; `question` is the one its journal left open, if any, reopened when the
    /// failure closed it before its deadline.
    pub async fn requeue_failed(
        &self,
        run_id: RunId,
        note: &str,
        reason: &str,
        question: Option<&InteractionRequest>,
    ) -> Result<Requeue, Error> {
        let now = Timestamp::now();
        let event = Event::SystemMessage(SystemMessage {
            level: MessageLevel::Info,
            content: note.to_owned(),
        });
        let json = serde_json::to_string(&event).unwrap_or_default();
        let rid = question
            .map(|q| q.request_id.to_string())
            .unwrap_or_default();
        let script = redis::Script::new(REQUEUE);
        let mut inv = script.key(self.run_key(run_id));
        inv.key(self.journal_key(run_id))
            .key(self.interaction_key(run_id, if rid.is_empty() { "none" } else { &rid }))
            .arg(self.run_tag(run_id))
            .arg(now.to_string())
            .arg(now.micros())
            .arg(json.strip_prefix('{').unwrap_or(&json))
            .arg(reason.replace(['\r', '\n'], " "))
            .arg(&rid)
            .arg(question.map(|q| q.timestamp.micros()).unwrap_or_default())
            .arg(
                question
                    .and_then(|q| q.expires_at)
                    .map(|t| t.micros().to_string())
                    .unwrap_or_default(),
            )
            .arg(if question.is_some_and(|q| !q.escalation.is_empty()) {
                "1"
            } else {
                ""
            });
        let (reply, replicated) = self
            .invoke_replicated::<(String, String)>(run_id, &inv)
            .await;
        match reply {
            Ok((kind, v)) if kind == "QUEUED" => {
                replicated?;
                Ok(Requeue::Queued {
                    seq: v.parse().unwrap_or(0),
                })
            }
            Ok((kind, v)) if kind == "OTHER" => Ok(Requeue::FailedOtherwise(v)),
            Ok((_, status)) => Ok(Requeue::NotFailed(status.parse().map_err(Error::Corrupt)?)),
            Err(e) => Err(match ScriptError::of(&e) {
                Some(known) => known.into_error(run_id),
                None => backend(e),
            }),
        }
    }

    /// The statuses of `ids` in one round trip (`None` for a run that does not exist).
    pub async fn statuses(&self, ids: &[RunId]) -> Result<Vec<Option<RunStatus>>, Error> {
        if ids.is_empty() {
            return Ok(vec![]);
        }
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.hget(self.run_key(*id), "status");
        }
        let mut conn = self.connection();
        let raw: Vec<Option<String>> = pipe.query_async(&mut conn).await.map_err(backend)?;
        Ok(raw
            .into_iter()
            .map(|s| s.and_then(|s| s.parse().ok()))
            .collect())
    }

    /// `INFO <section>` as `field → value` (for benchmarks and diagnostics); on a cluster, the
    /// masters' numeric fields summed (see [`Self::info_by_master`]).
    pub async fn info(&self, section: &str) -> Result<HashMap<String, String>, Error> {
        let masters = self.info_by_master(section).await?;
        if let [(_, one)] = &masters[..] {
            return Ok(one.clone());
        }
        let mut sum: HashMap<String, String> = HashMap::new();
        for (_, fields) in masters {
            for (k, v) in fields {
                // `cmdstat_*` lines are `calls=…,usec=…`: summed field by field.
                let merged = match sum.get(&k) {
                    None => v,
                    Some(prior) => sum_info_values(prior, &v),
                };
                sum.insert(k, merged);
            }
        }
        Ok(sum)
    }

    /// `INFO <section>` of every master (one on one Redis), by node address.
    pub async fn info_by_master(
        &self,
        section: &str,
    ) -> Result<Vec<(String, HashMap<String, String>)>, Error> {
        let mut conn = self.connection();
        let replies = conn
            .on_masters(redis::cmd("INFO").arg(section))
            .await
            .map_err(backend)?;
        let mut out = vec![];
        for (addr, value) in replies {
            let text: String = redis::FromRedisValue::from_redis_value(value)
                .map_err(|e| Error::Corrupt(format!("INFO replied {e}")))?;
            let fields = text
                .lines()
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
                .collect();
            out.push((addr, fields));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// What Redis says each of a run's keys takes (`MEMORY USAGE`, in bytes, every element
    /// sampled): its record (with its snapshot), journal and the question it waits on, by those names;
    /// a key that does not exist counts 0. For the bench's breakdown of a paused run.
    pub async fn memory_of_run(&self, run_id: RunId) -> Result<Vec<(&'static str, u64)>, Error> {
        let mut conn = self.connection();
        let pending: Option<String> = redis::cmd("HGET")
            .arg(self.run_key(run_id))
            .arg("pending_request_id")
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        let keys = [
            ("record", Some(self.run_key(run_id))),
            ("journal", Some(self.journal_key(run_id))),
            (
                "question",
                pending.map(|rid| self.interaction_key(run_id, &rid)),
            ),
        ];
        let mut out = Vec::new();
        for (name, key) in keys {
            let bytes: Option<u64> = match key {
                Some(key) => redis::cmd("MEMORY")
                    .arg("USAGE")
                    .arg(key)
                    .arg("SAMPLES")
                    .arg(0)
                    .query_async(&mut conn)
                    .await
                    .map_err(backend)?,
                None => None,
            };
            out.push((name, bytes.unwrap_or(0)));
        }
        Ok(out)
    }

    /// Whether the store can take writes as configured: every master answers and, with
    /// [`super::Durability::Replica`], has a replica that acknowledges.
    pub async fn writable(&self) -> Result<(), Error> {
        self.ping().await?;
        let super::Durability::Replica { timeout } = self.durability() else {
            return Ok(());
        };
        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        let mut conn = self.connection();
        let replies = conn
            .on_masters(redis::cmd("WAIT").arg(1).arg(ms))
            .await
            .map_err(backend)?;
        if replies
            .iter()
            .all(|(_, v)| matches!(v, redis::Value::Int(n) if *n >= 1))
        {
            Ok(())
        } else {
            Err(Error::Backend(
                "a Redis master has no replica that acknowledges (DELTA_REDIS_DURABILITY=replica)"
                    .into(),
            ))
        }
    }

    /// Whether Redis answers (`PING`); on a cluster, every master.
    pub async fn ping(&self) -> Result<(), Error> {
        let mut conn = self.connection();
        conn.on_masters(&redis::cmd("PING"))
            .await
            .map(|_| ())
            .map_err(backend)
    }
}

/// Two values of one `INFO` field summed: numbers as numbers, `a=1,b=2` lists key by key;
/// anything else keeps the first.
fn sum_info_values(a: &str, b: &str) -> String {
    if let (Ok(x), Ok(y)) = (a.parse::<i64>(), b.parse::<i64>()) {
        return (x + y).to_string();
    }
    if let (Ok(x), Ok(y)) = (a.parse::<f64>(), b.parse::<f64>()) {
        return (x + y).to_string();
    }
    if a.contains('=') {
        let theirs: HashMap<&str, &str> = b.split(',').filter_map(|p| p.split_once('=')).collect();
        return a
            .split(',')
            .map(|p| match p.split_once('=') {
                Some((k, v)) => match theirs.get(k) {
                    Some(w) => format!("{k}={}", sum_info_values(v, w)),
                    None => p.to_owned(),
                },
                None => p.to_owned(),
            })
            .collect::<Vec<_>>()
            .join(",");
    }
    a.to_owned()
}

/// The resumes that members of a bucket's `resumes` index name (`<run>/<request>`); any other
/// member is passed over.
fn resumes_of(members: &[(u32, String)]) -> Vec<(RunId, RequestId)> {
    members
        .iter()
        .filter_map(|(_, m)| {
            let (run, rid) = m.split_once('/')?;
            Some((run.parse().ok()?, rid.parse().ok()?))
        })
        .collect()
}

/// What a round of the reconcilers finds due ([`RedisRunStore::due`]), earliest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Due {
    /// Pending questions whose deadline passed: `(run, request)`.
    pub deadlines: Vec<(RunId, RequestId)>,
    /// Pending questions whose next escalation step is due.
    pub escalations: Vec<(RunId, RequestId)>,
    /// Answered questions whose run has not resumed, due for a look.
    pub resumes: Vec<(RunId, RequestId)>,
    /// Finished runs past retention (none unless asked for).
    pub purge: Vec<RunId>,
}
