//! The fleet's run store: Redis (PROTOCOL.md §5).
//!
//! ```text
//! <p>:run:{<run_id>}                 hash    the run record, plus `seq` (last journal seq), the fence, `owner`, `job_seq`
//! <p>:run:{<run_id>}:journal         stream  one entry per event, entry id `<seq>-0`, field `e` = the event JSON
//! <p>:run:{<run_id>}:ix:<request_id> hash    request JSON, state (PENDING/ANSWERED/EXPIRED/CANCELLED), response,
//!                                            answered_at, resume_seq, traceparent
//! <p>:runs:all, <p>:runs:<STATUS>    zset    run ids by creation time (µs)
//! <p>:interactions:all, …:pending    zset    request ids by request time (µs)
//! <p>:interactions:deadlines         zset    pending request ids by `expires_at` (µs)
//! <p>:interactions:runs              hash    request id → run id
//! <p>:resumes                        zset    `<run_id>/<request_id>` of answered requests whose run has not
//!                                            resumed yet, by when a reconciler should look at it next
//! <p>:workers                        zset    worker ids by last heartbeat (ms)
//! <p>:idempotency:<sha256>           string  `<run_id> <body sha256>` of a submission (24 h)
//! ```
//!
//! Every key of a run shares the hash tag `{<run_id>}`, and each state change is one Lua script.
//! A store handle may carry a fencing token `(stream sequence, delivery count)` taken from the
//! JetStream delivery it works for: a write with an older token than the run's is refused
//! (`Error::Fenced`) and changes nothing; a newer one takes the run over. So a worker that stalled
//! past `ack_wait` cannot overwrite the journal of the worker that took its job, whatever NATS
//! later accepts from it. The takeover itself is checked too: a fenced handle remembers how long
//! the journal was when it loaded the run, and its first write with the newer token is refused
//! (`Error::Fenced`) if the journal grew since, because the old owner, still alive, wrote in
//! between. Otherwise the new owner would act on a journal it did not see (run a finished step
//! again and journal a second result for it).
//!
//! The indexes (`runs:*`, `interactions:*`, `resumes`) are updated inside the same scripts as the
//! run's state, so on one Redis they are never stale. On Redis Cluster those scripts would touch
//! two slots; there the index updates would have to move to a second step repaired by the
//! reconcilers (not built: we run one Redis with AOF, see README).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::Script;
use redis::aio::ConnectionManager;

mod index;

pub use index::{JournalTail, Page, QueueRun, Requeue, Submitted};

use super::{Error, RunRecord, RunStore, StatusChange, StoredRun, numbered};
use delta_protocol::journal;
use delta_protocol::secret::{self, SecretsKey};
use delta_protocol::{
    Event, InteractionRequest, InteractionResponse, InteractionState, JournalEvent, RequestId,
    RunId, RunStatus, Timestamp,
};

/// Appends events and applies a status change, fenced, keeping the indexes. KEYS: run, journal,
/// the interaction paused on (or a dummy). ARGV: see [`RedisRunStore::append`]; ARGV[16] is the
/// journal length the writer saw (or ''): a takeover (a newer token) is refused when the journal
/// has grown since.
const APPEND: &str = r#"
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return redis.error_reply('NOTFOUND') end
if st == 'COMPLETED' or st == 'FAILED' or st == 'CANCELLED' then
  return redis.error_reply('TERMINAL ' .. st)
end
local seq = tonumber(redis.call('HGET', KEYS[1], 'seq') or '0')
if ARGV[1] ~= '' then
  local fs = tonumber(redis.call('HGET', KEYS[1], 'fence_seq') or '0')
  local fn = tonumber(redis.call('HGET', KEYS[1], 'fence_n') or '0')
  local s, n = tonumber(ARGV[1]), tonumber(ARGV[2])
  if fs > s or (fs == s and fn > n) then return redis.error_reply('FENCED') end
  local takeover = fs < s or fn < n
  if takeover and ARGV[16] ~= '' and tonumber(ARGV[16]) ~= seq then
    return redis.error_reply('FENCED moved')
  end
  redis.call('HSET', KEYS[1], 'fence_seq', s, 'fence_n', n)
end
if ARGV[12] ~= '' then redis.call('HSET', KEYS[1], 'owner', ARGV[12]) end
for i = 17, #ARGV do
  seq = seq + 1
  redis.call('XADD', KEYS[2], seq .. '-0', 'e',
    '{"seq":' .. seq .. ',"timestamp":"' .. ARGV[3] .. '",' .. ARGV[i])
end
redis.call('HSET', KEYS[1], 'seq', seq, 'updated_at', ARGV[3])
if ARGV[4] ~= '' then
  local p = ARGV[10]
  local run = redis.call('HGET', KEYS[1], 'run_id')
  local old = redis.call('HGET', KEYS[1], 'pending_request_id')
  redis.call('HSET', KEYS[1], 'status', ARGV[4])
  if ARGV[4] ~= st then
    local score = redis.call('ZSCORE', p .. ':runs:all', run) or ARGV[11]
    redis.call('ZREM', p .. ':runs:' .. st, run)
    redis.call('ZADD', p .. ':runs:' .. ARGV[4], score, run)
  end
  if old and old ~= ARGV[5] then
    -- The run no longer waits on `old`: a question still pending there is closed.
    local okey = KEYS[1] .. ':ix:' .. old
    if redis.call('HGET', okey, 'state') == 'PENDING' then
      local closed = 'EXPIRED'
      if ARGV[4] == 'CANCELLED' then closed = 'CANCELLED' end
      redis.call('HSET', okey, 'state', closed, 'answered_at', ARGV[3])
      redis.call('ZREM', p .. ':interactions:pending', old)
      redis.call('ZREM', p .. ':interactions:deadlines', old)
    end
    redis.call('ZREM', p .. ':resumes', run .. '/' .. old)
  end
  if ARGV[5] ~= '' then
    redis.call('HSET', KEYS[1], 'pending_request_id', ARGV[5])
    if redis.call('HSETNX', KEYS[3], 'state', 'PENDING') == 1 then
      redis.call('HSET', KEYS[3], 'request', ARGV[9], 'run_id', run)
      if ARGV[15] ~= '' then redis.call('HSET', KEYS[3], 'traceparent', ARGV[15]) end
      redis.call('ZADD', p .. ':interactions:all', ARGV[13], ARGV[5])
      redis.call('ZADD', p .. ':interactions:pending', ARGV[13], ARGV[5])
      if ARGV[14] ~= '' then redis.call('ZADD', p .. ':interactions:deadlines', ARGV[14], ARGV[5]) end
      redis.call('HSET', p .. ':interactions:runs', ARGV[5], run)
    end
  else
    redis.call('HDEL', KEYS[1], 'pending_request_id')
  end
  if ARGV[6] == '1' then
    if ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'result', ARGV[7]) end
    if ARGV[8] ~= '' then redis.call('HSET', KEYS[1], 'error', ARGV[8]) end
  end
end
return seq
"#;

/// Creates a run record unless one exists, indexed; with an idempotency key, a second submission
/// returns the first one's value instead. KEYS: run. ARGV: prefix, created µs, idempotency key
/// (or ''), its value, its TTL in seconds, then the record's fields.
const CREATE: &str = r#"
if ARGV[3] ~= '' then
  local prior = redis.call('GET', ARGV[3])
  if prior then return {'IDEMPOTENT', prior} end
end
if redis.call('EXISTS', KEYS[1]) == 1 then return redis.error_reply('EXISTS') end
local fields = {}
for i = 6, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(fields))
local run = redis.call('HGET', KEYS[1], 'run_id')
local st = redis.call('HGET', KEYS[1], 'status')
redis.call('ZADD', ARGV[1] .. ':runs:all', ARGV[2], run)
redis.call('ZADD', ARGV[1] .. ':runs:' .. st, ARGV[2], run)
if ARGV[3] ~= '' then redis.call('SET', ARGV[3], ARGV[4], 'EX', ARGV[5]) end
return {'CREATED', ''}
"#;

/// Settles a pending interaction: `ANSWERED` with its response, or `EXPIRED` by the clock, and
/// queues its run's resume for the reconciler to check. Returns `WON`, or the state it was in.
/// KEYS: the interaction. ARGV: new state, response JSON (or ''), now, prefix, request id,
/// resume member, when to check the resume (µs).
const RESOLVE: &str = r#"
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return redis.error_reply('NOTFOUND') end
if st ~= 'PENDING' then return st end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'answered_at', ARGV[3])
if ARGV[2] ~= '' then redis.call('HSET', KEYS[1], 'response', ARGV[2]) end
redis.call('ZREM', ARGV[4] .. ':interactions:pending', ARGV[5])
redis.call('ZREM', ARGV[4] .. ':interactions:deadlines', ARGV[5])
redis.call('ZADD', ARGV[4] .. ':resumes', ARGV[7], ARGV[6])
return 'WON'
"#;

/// Opens an answered interaction again (its answer was refused by the engine): `PENDING`,
/// answer removed, back in the pending and deadline indexes. KEYS: the interaction. ARGV:
/// prefix, request id, request time (µs), deadline (µs or ''), resume member.
const REOPEN: &str = r#"
if redis.call('HGET', KEYS[1], 'state') ~= 'ANSWERED' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'PENDING')
redis.call('HDEL', KEYS[1], 'response', 'answered_at', 'resume_seq')
redis.call('ZADD', ARGV[1] .. ':interactions:pending', ARGV[3], ARGV[2])
if ARGV[4] ~= '' then redis.call('ZADD', ARGV[1] .. ':interactions:deadlines', ARGV[4], ARGV[2]) end
redis.call('ZREM', ARGV[1] .. ':resumes', ARGV[5])
return 1
"#;

/// Runs in Redis, optionally fenced.
#[derive(Clone)]
pub struct RedisRunStore {
    /// For dedicated connections (blocking stream reads must not hold up the shared one).
    client: redis::Client,
    /// A multiplexed connection that reconnects by itself; cheap to clone.
    conn: ConnectionManager,
    /// Key prefix (`DELTA_KEY_PREFIX`, default `delta`).
    prefix: String,
    /// The fencing token of the delivery this handle writes for, if any.
    fence: Option<(u64, u64)>,
    /// The worker this handle writes for (the run record's `owner`).
    owner: Option<String>,
    /// The trace a pause belongs to, stored with the question so its answer continues it.
    traceparent: Option<String>,
    append: Script,
    create: Script,
    resolve: Script,
    /// Round trips to Redis made through this handle and its clones (each method makes one).
    trips: Arc<AtomicU64>,
    /// Seals sensitive answers at rest (`DELTA_SECRETS_KEY`); without it they are refused.
    secrets: Option<Arc<SecretsKey>>,
    /// For a fenced handle: the run it loaded or wrote last, and its journal length then, so that
    /// its takeover write is refused if someone wrote in between (see the module doc).
    seen: Arc<std::sync::Mutex<Option<(RunId, u64)>>>,
}

/// An interaction as stored: the request, where it stands, and its (still sealed) answer.
#[derive(Clone, Debug)]
pub struct StoredInteraction {
    pub request: InteractionRequest,
    pub state: InteractionState,
    /// The accepted answer as stored: sensitive parts are sealed (see [`RedisRunStore::open`]).
    pub response: Option<InteractionResponse>,
    /// When it was answered or closed.
    pub answered_at: Option<Timestamp>,
    /// The stream sequence of the resume job published for it, once published.
    pub resume_seq: Option<u64>,
    /// The `traceparent` of the run's span that asked it.
    pub traceparent: Option<String>,
}

/// How a pending interaction is settled.
pub enum Resolution<'a> {
    /// A person's (or bot's) answer, validated at the instant given (stored as `answered_at`,
    /// so that a worker checks the deadline against the same instant).
    Answer(&'a InteractionResponse, Timestamp),
    /// Its deadline passed: the run applies the default option, or fails.
    Expired,
}

impl RedisRunStore {
    /// Connects to `url` (e.g. `redis://127.0.0.1:6379`).
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, Error> {
        let client = redis::Client::open(url).map_err(backend)?;
        let conn = ConnectionManager::new(client.clone())
            .await
            .map_err(backend)?;
        Ok(Self {
            client,
            conn,
            prefix: prefix.to_owned(),
            fence: None,
            owner: None,
            traceparent: None,
            append: Script::new(APPEND),
            create: Script::new(CREATE),
            resolve: Script::new(RESOLVE),
            trips: Arc::new(AtomicU64::new(0)),
            secrets: None,
            seen: Arc::default(),
        })
    }

    /// A handle whose writes carry the token `(stream_seq, delivery_count)` of one delivery.
    pub fn fenced(&self, stream_seq: u64, delivery_count: u64) -> Self {
        let mut s = self.clone();
        s.fence = Some((stream_seq, delivery_count));
        s.seen = Arc::default();
        s
    }

    /// Notes (on a fenced handle) that `run_id`'s journal is `len` events long as far as this
    /// handle knows.
    fn saw(&self, run_id: RunId, len: u64) {
        if self.fence.is_some() {
            *self.seen.lock().unwrap_or_else(|p| p.into_inner()) = Some((run_id, len));
        }
    }

    /// The journal length this handle last saw for `run_id`, as the script's argument.
    fn seen_len(&self, run_id: RunId) -> String {
        match *self.seen.lock().unwrap_or_else(|p| p.into_inner()) {
            Some((r, len)) if r == run_id => len.to_string(),
            _ => String::new(),
        }
    }

    /// A handle whose writes name `worker` as the run's owner and store `traceparent` with any
    /// question they ask.
    pub fn owned_by(mut self, worker: &str, traceparent: Option<String>) -> Self {
        self.owner = Some(worker.to_owned());
        self.traceparent = traceparent;
        self
    }

    /// A handle that seals sensitive answers with `key` when storing them and opens them when
    /// reading them back (see [`delta_protocol::secret`]).
    pub fn with_secrets_key(mut self, key: Arc<SecretsKey>) -> Self {
        self.secrets = Some(key);
        self
    }

    /// How many round trips to Redis this handle and its clones have made.
    pub fn round_trips(&self) -> u64 {
        self.trips.load(Ordering::Relaxed)
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The connection for one round trip (counted).
    fn connection(&self) -> ConnectionManager {
        self.trips.fetch_add(1, Ordering::Relaxed);
        self.conn.clone()
    }

    pub fn run_key(&self, run_id: RunId) -> String {
        format!("{}:run:{{{run_id}}}", self.prefix)
    }

    fn journal_key(&self, run_id: RunId) -> String {
        format!("{}:journal", self.run_key(run_id))
    }

    pub fn interaction_key(&self, run_id: RunId, request_id: &str) -> String {
        format!("{}:ix:{request_id}", self.run_key(run_id))
    }

    /// An index key: `<prefix>:<name>`.
    fn index(&self, name: &str) -> String {
        format!("{}:{name}", self.prefix)
    }

    /// Records `response` as the answer to `request` (pending), atomically: `Ok(true)` when this
    /// answer won, `Ok(false)` when the interaction was no longer pending. The input of a
    /// sensitive request is stored sealed; without a secrets key it is refused.
    pub async fn answer(
        &self,
        request: &InteractionRequest,
        response: &InteractionResponse,
    ) -> Result<bool, Error> {
        let won = self
            .resolve(
                request,
                Resolution::Answer(response, Timestamp::now()),
                Duration::from_secs(5),
            )
            .await?;
        Ok(won.is_none())
    }

    /// Settles a pending interaction (first one wins) and queues its run's resume, to be checked
    /// after `check_after`. `Ok(None)` when this call won; otherwise the state it was already in.
    pub async fn resolve(
        &self,
        request: &InteractionRequest,
        how: Resolution<'_>,
        check_after: Duration,
    ) -> Result<Option<InteractionState>, Error> {
        let run_id = request.run_id;
        let (state, json, now) = match how {
            Resolution::Answer(response, at) => {
                let stored = self.seal(request, response)?;
                (
                    InteractionState::Answered,
                    serde_json::to_string(&stored).unwrap_or_default(),
                    at,
                )
            }
            Resolution::Expired => (InteractionState::Expired, String::new(), Timestamp::now()),
        };
        let rid = request.request_id.to_string();
        let check_at = now.micros() + i64::try_from(check_after.as_micros()).unwrap_or(0);
        let mut conn = self.connection();
        let reply: Result<String, _> = self
            .resolve
            .key(self.interaction_key(run_id, &rid))
            .arg(state.as_str())
            .arg(json)
            .arg(now.to_string())
            .arg(&self.prefix)
            .arg(&rid)
            .arg(format!("{run_id}/{rid}"))
            .arg(check_at)
            .invoke_async(&mut conn)
            .await;
        match reply {
            Ok(s) if s == "WON" => Ok(None),
            Ok(s) => Ok(Some(s.parse().map_err(Error::Backend)?)),
            Err(e) if e.to_string().contains("NOTFOUND") => Err(Error::NotFound(run_id)),
            Err(e) => Err(backend(e)),
        }
    }

    /// The answer as it is stored: everything a person typed into a sensitive request sealed.
    fn seal(
        &self,
        request: &InteractionRequest,
        response: &InteractionResponse,
    ) -> Result<InteractionResponse, Error> {
        let mut stored = response.clone();
        let has_content =
            response.input.is_some() || response.feedback.is_some() || response.data.is_some();
        if request.is_sensitive() && has_content {
            let key = self.secrets.as_ref().ok_or(Error::NoSecretsKey)?;
            let ctx = request.request_id.to_string();
            let seal = |t: &str| key.seal(&ctx, t);
            stored.input = response.input.as_deref().map(seal).transpose()?;
            stored.feedback = response.feedback.as_deref().map(seal).transpose()?;
            stored.data = response
                .data
                .as_ref()
                .map(|d| seal(&d.to_string()).map(serde_json::Value::String))
                .transpose()?;
        }
        Ok(stored)
    }

    /// Opens the sealed parts of a stored answer (needs the secrets key when there are any).
    pub fn open(&self, mut response: InteractionResponse) -> Result<InteractionResponse, Error> {
        let ctx = response.request_id.to_string();
        let open = |t: &str| -> Result<String, Error> {
            let key = self.secrets.as_ref().ok_or(Error::NoSecretsKey)?;
            Ok(key.open(&ctx, t)?)
        };
        if let Some(t) = response.input.as_deref().filter(|t| secret::is_sealed(t)) {
            response.input = Some(open(t)?);
        }
        if let Some(t) = response
            .feedback
            .as_deref()
            .filter(|t| secret::is_sealed(t))
        {
            response.feedback = Some(open(t)?);
        }
        if let Some(serde_json::Value::String(t)) = &response.data
            && secret::is_sealed(t)
        {
            let plain = open(t)?;
            response.data = Some(serde_json::from_str(&plain).map_err(|e| {
                Error::Backend(format!("interaction {ctx}: bad sealed data ({e})"))
            })?);
        }
        Ok(response)
    }

    /// Opens an answered question again: its answer could not be applied. `false` when it was
    /// not answered (nothing changed).
    pub async fn reopen(&self, run_id: RunId, request_id: RequestId) -> Result<bool, Error> {
        let Some(ix) = self.interaction(run_id, request_id).await? else {
            return Ok(false);
        };
        let q = &ix.request;
        let mut conn = self.connection();
        let n: i64 = Script::new(REOPEN)
            .key(self.interaction_key(run_id, &request_id.to_string()))
            .arg(&self.prefix)
            .arg(request_id.to_string())
            .arg(q.timestamp.micros())
            .arg(
                q.expires_at
                    .map(|t| t.micros().to_string())
                    .unwrap_or_default(),
            )
            .arg(format!("{run_id}/{request_id}"))
            .invoke_async(&mut conn)
            .await
            .map_err(backend)?;
        Ok(n == 1)
    }

    /// The fencing token of the delivery that last wrote to a run (`(0, 0)` before any).
    pub async fn owner_fence(&self, run_id: RunId) -> Result<(u64, u64), Error> {
        let mut conn = self.connection();
        let (s, n): (Option<u64>, Option<u64>) = redis::cmd("HMGET")
            .arg(self.run_key(run_id))
            .arg("fence_seq")
            .arg("fence_n")
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        Ok((s.unwrap_or(0), n.unwrap_or(0)))
    }

    /// One interaction of a run, as stored (its answer still sealed), if it exists.
    pub async fn interaction(
        &self,
        run_id: RunId,
        request_id: RequestId,
    ) -> Result<Option<StoredInteraction>, Error> {
        let mut conn = self.connection();
        let h: Fields = redis::cmd("HGETALL")
            .arg(self.interaction_key(run_id, &request_id.to_string()))
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        parse_interaction(request_id, &h)
    }

    /// The accepted answer of an interaction, opened, if it has one.
    pub async fn stored_answer(
        &self,
        run_id: RunId,
        request_id: RequestId,
    ) -> Result<Option<InteractionResponse>, Error> {
        match self.interaction(run_id, request_id).await? {
            Some(StoredInteraction {
                response: Some(r), ..
            }) => Ok(Some(self.open(r)?)),
            _ => Ok(None),
        }
    }
}

/// An interaction hash as a [`StoredInteraction`]; `None` when the hash is empty (no such key).
fn parse_interaction(
    request_id: RequestId,
    h: &HashMap<String, String>,
) -> Result<Option<StoredInteraction>, Error> {
    if h.is_empty() {
        return Ok(None);
    }
    let bad = |what: &str, e: String| {
        Error::Backend(format!("interaction {request_id}: bad {what} ({e})"))
    };
    let request: InteractionRequest =
        serde_json::from_str(h.get("request").map(String::as_str).unwrap_or(""))
            .map_err(|e| bad("request", e.to_string()))?;
    let state = h
        .get("state")
        .map(String::as_str)
        .unwrap_or("")
        .parse()
        .map_err(|e| bad("state", e))?;
    let response = match h.get("response") {
        Some(r) => Some(serde_json::from_str(r).map_err(|e| bad("response", e.to_string()))?),
        None => None,
    };
    Ok(Some(StoredInteraction {
        request,
        state,
        response,
        answered_at: h.get("answered_at").and_then(|t| t.parse().ok()),
        resume_seq: h.get("resume_seq").and_then(|t| t.parse().ok()),
        traceparent: h.get("traceparent").cloned(),
    }))
}

/// A Redis hash, or a stream entry's fields.
type Fields = HashMap<String, String>;

fn backend(e: redis::RedisError) -> Error {
    Error::Backend(e.to_string())
}

fn opt(s: &Option<String>) -> String {
    s.clone().unwrap_or_default()
}

/// The record as hash fields (absent options are left out).
fn record_fields(r: &RunRecord) -> Vec<(String, String)> {
    let mut f = vec![
        ("run_id".into(), r.run_id.to_string()),
        ("agent".into(), r.agent.clone()),
        ("task".into(), r.task.clone()),
        ("status".into(), r.status.as_str().into()),
        ("created_at".into(), r.created_at.to_string()),
        ("updated_at".into(), r.updated_at.to_string()),
        ("seq".into(), "0".into()),
    ];
    if let Some(p) = r.pending_request_id {
        f.push(("pending_request_id".into(), p.to_string()));
    }
    if let Some(i) = &r.input {
        f.push(("input".into(), i.to_string()));
    }
    for (k, v) in [
        ("result", &r.result),
        ("error", &r.error),
        ("agent_dir", &r.agent_dir),
    ] {
        if let Some(v) = v {
            f.push((k.into(), v.clone()));
        }
    }
    f
}

fn parse_record(run_id: RunId, h: &HashMap<String, String>) -> Result<RunRecord, Error> {
    let bad = |field: &str| {
        Error::Backend(format!(
            "run {run_id}: field `{field}` is missing or invalid"
        ))
    };
    let get = |k: &str| h.get(k).cloned();
    let ts = |k: &str| -> Result<Timestamp, Error> {
        get(k).and_then(|v| v.parse().ok()).ok_or_else(|| bad(k))
    };
    Ok(RunRecord {
        run_id,
        agent: get("agent").ok_or_else(|| bad("agent"))?,
        task: get("task").ok_or_else(|| bad("task"))?,
        status: get("status")
            .and_then(|s| s.parse::<RunStatus>().ok())
            .ok_or_else(|| bad("status"))?,
        created_at: ts("created_at")?,
        updated_at: ts("updated_at")?,
        pending_request_id: match get("pending_request_id") {
            Some(p) => Some(p.parse().map_err(|_| bad("pending_request_id"))?),
            None => None,
        },
        input: match get("input") {
            Some(i) => Some(serde_json::from_str(&i).map_err(|_| bad("input"))?),
            None => None,
        },
        result: get("result"),
        error: get("error"),
        agent_dir: get("agent_dir"),
    })
}

impl RunStore for RedisRunStore {
    async fn create(&self, record: RunRecord) -> Result<(), Error> {
        match self.create_indexed(&record, None).await? {
            Submitted::Created => Ok(()),
            Submitted::Existing { .. } => Err(Error::AlreadyExists(record.run_id)),
        }
    }

    async fn load(&self, run_id: RunId) -> Result<StoredRun, Error> {
        let mut conn = self.connection();
        // One round trip: the record and the whole journal.
        let (hash, entries): (Fields, Vec<(String, Fields)>) = redis::pipe()
            .hgetall(self.run_key(run_id))
            .xrange_all(self.journal_key(run_id))
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        if hash.is_empty() {
            return Err(Error::NotFound(run_id));
        }
        let record = parse_record(run_id, &hash)?;
        let mut text = String::new();
        for (_, fields) in &entries {
            text.push_str(fields.get("e").map(String::as_str).unwrap_or("{}"));
            text.push('\n');
        }
        let parsed = journal::parse_jsonl(&text)?;
        self.saw(run_id, parsed.events.last().map_or(0, |e| e.seq));
        Ok(StoredRun {
            record,
            journal: parsed.events,
        })
    }

    async fn append(
        &self,
        run_id: RunId,
        events: Vec<Event>,
        change: Option<StatusChange>,
    ) -> Result<Vec<JournalEvent>, Error> {
        let now = Timestamp::now();
        let (fence_seq, fence_n) = match self.fence {
            Some((s, n)) => (s.to_string(), n.to_string()),
            None => (String::new(), String::new()),
        };
        let (status, pending, finished, result, error, request) = match &change {
            None => Default::default(),
            Some(c) => {
                let (pending, request) = match c {
                    StatusChange::Waiting(q) => (
                        q.request_id.to_string(),
                        serde_json::to_string(q).unwrap_or_default(),
                    ),
                    _ => Default::default(),
                };
                let (finished, result, error) = match c {
                    StatusChange::Finished { result, error, .. } => {
                        ("1".to_owned(), opt(result), opt(error))
                    }
                    _ => Default::default(),
                };
                (
                    c.status().as_str().to_owned(),
                    pending,
                    finished,
                    result,
                    error,
                    request,
                )
            }
        };
        let (asked_us, expires_us) = match &change {
            Some(StatusChange::Waiting(q)) => (
                q.timestamp.micros().to_string(),
                q.expires_at
                    .map(|t| t.micros().to_string())
                    .unwrap_or_default(),
            ),
            _ => Default::default(),
        };
        let ix_key =
            self.interaction_key(run_id, if pending.is_empty() { "none" } else { &pending });
        let mut inv = self.append.key(self.run_key(run_id));
        inv.key(self.journal_key(run_id))
            .key(ix_key)
            .arg(fence_seq)
            .arg(fence_n)
            .arg(now.to_string())
            .arg(status)
            .arg(pending)
            .arg(finished)
            .arg(result)
            .arg(error)
            .arg(request)
            .arg(&self.prefix)
            .arg(now.micros())
            .arg(self.owner.clone().unwrap_or_default())
            .arg(asked_us)
            .arg(expires_us)
            .arg(self.traceparent.clone().unwrap_or_default())
            .arg(self.seen_len(run_id));
        for e in &events {
            // `{"type":…,"payload":…}` without its opening brace: the script puts seq and
            // timestamp in front.
            let json = serde_json::to_string(e).unwrap_or_default();
            inv.arg(json.strip_prefix('{').unwrap_or(&json).to_owned());
        }
        let mut conn = self.connection();
        let last: u64 = match inv.invoke_async::<u64>(&mut conn).await {
            Ok(v) => v,
            Err(e) => {
                let msg = e.to_string();
                return Err(if msg.contains("NOTFOUND") {
                    Error::NotFound(run_id)
                } else if msg.contains("FENCED") {
                    Error::Fenced(run_id)
                } else if msg.contains("TERMINAL") {
                    let status = RunStatus::ALL
                        .into_iter()
                        .find(|s| s.is_terminal() && msg.contains(s.as_str()))
                        .unwrap_or(RunStatus::Failed);
                    Error::Terminal { run_id, status }
                } else {
                    backend(e)
                });
            }
        };
        self.saw(run_id, last);
        let first = last + 1 - events.len() as u64;
        Ok(numbered(events, first, now))
    }
}
