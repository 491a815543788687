//! The fleet's run store: Redis (PROTOCOL.md §5).
//!
//! ```text
//! <prefix>:run:{<run_id>}                 hash    the run record, plus `seq` (last journal seq) and the fence
//! <prefix>:run:{<run_id>}:journal         stream  one entry per event, entry id `<seq>-0`, field `e` = the event JSON
//! <prefix>:run:{<run_id>}:ix:<request_id> hash    request JSON, state (PENDING/ANSWERED/…), response
//! ```
//!
//! Every key of a run shares the hash tag `{<run_id>}`, so each state change is one Lua script on
//! one slot (Redis Cluster ready). A store handle may carry a fencing token `(stream sequence,
//! delivery count)` taken from the JetStream delivery it works for: a write with an older token
//! than the run's is refused (`Error::Fenced`) and changes nothing; a newer one takes the run
//! over. So a worker that stalled past `ack_wait` cannot overwrite the journal of the worker that
//! took its job, whatever NATS later accepts from it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use redis::Script;
use redis::aio::ConnectionManager;

use super::{Error, RunRecord, RunStore, StatusChange, StoredRun, numbered};
use crate::journal;
use crate::protocol::{
    Event, InteractionRequest, InteractionResponse, JournalEvent, RequestId, RunId, RunStatus,
    Timestamp,
};
use crate::secret::{self, SecretsKey};

/// Appends events and applies a status change, fenced. See the module docs for the keys.
const APPEND: &str = r#"
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return redis.error_reply('NOTFOUND') end
if st == 'COMPLETED' or st == 'FAILED' or st == 'CANCELLED' then
  return redis.error_reply('TERMINAL ' .. st)
end
if ARGV[1] ~= '' then
  local fs = tonumber(redis.call('HGET', KEYS[1], 'fence_seq') or '0')
  local fn = tonumber(redis.call('HGET', KEYS[1], 'fence_n') or '0')
  local s, n = tonumber(ARGV[1]), tonumber(ARGV[2])
  if fs > s or (fs == s and fn > n) then return redis.error_reply('FENCED') end
  redis.call('HSET', KEYS[1], 'fence_seq', s, 'fence_n', n)
end
local seq = tonumber(redis.call('HGET', KEYS[1], 'seq') or '0')
for i = 10, #ARGV do
  seq = seq + 1
  redis.call('XADD', KEYS[2], seq .. '-0', 'e',
    '{"seq":' .. seq .. ',"timestamp":"' .. ARGV[3] .. '",' .. ARGV[i])
end
redis.call('HSET', KEYS[1], 'seq', seq, 'updated_at', ARGV[3])
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[1], 'status', ARGV[4])
  if ARGV[5] ~= '' then
    redis.call('HSET', KEYS[1], 'pending_request_id', ARGV[5])
    redis.call('HSETNX', KEYS[3], 'state', 'PENDING')
    redis.call('HSETNX', KEYS[3], 'request', ARGV[9])
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

/// Creates a run record unless one exists.
const CREATE: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then return redis.error_reply('EXISTS') end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
"#;

/// Flips an interaction from PENDING to ANSWERED with its response; 0 when it was not pending.
const ANSWER: &str = r#"
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return redis.error_reply('NOTFOUND') end
if st ~= 'PENDING' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'ANSWERED', 'response', ARGV[1], 'answered_at', ARGV[2])
return 1
"#;

/// Runs in Redis, optionally fenced.
#[derive(Clone)]
pub struct RedisRunStore {
    /// A multiplexed connection that reconnects by itself; cheap to clone.
    conn: ConnectionManager,
    /// Key prefix (`DELTA_KEY_PREFIX`, default `delta`).
    prefix: String,
    /// The fencing token of the delivery this handle writes for, if any.
    fence: Option<(u64, u64)>,
    append: Script,
    create: Script,
    /// Round trips to Redis made through this handle and its clones (each method makes one).
    trips: Arc<AtomicU64>,
    /// Seals sensitive answers at rest (`DELTA_SECRETS_KEY`); without it they are refused.
    secrets: Option<Arc<SecretsKey>>,
}

impl RedisRunStore {
    /// Connects to `url` (e.g. `redis://127.0.0.1:6379`).
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, Error> {
        let client = redis::Client::open(url).map_err(backend)?;
        let conn = ConnectionManager::new(client).await.map_err(backend)?;
        Ok(Self {
            conn,
            prefix: prefix.to_owned(),
            fence: None,
            append: Script::new(APPEND),
            create: Script::new(CREATE),
            trips: Arc::new(AtomicU64::new(0)),
            secrets: None,
        })
    }

    /// A handle whose writes carry the token `(stream_seq, delivery_count)` of one delivery.
    pub fn fenced(&self, stream_seq: u64, delivery_count: u64) -> Self {
        let mut s = self.clone();
        s.fence = Some((stream_seq, delivery_count));
        s
    }

    /// A handle that seals sensitive answers with `key` when storing them and opens them when
    /// reading them back (see [`crate::secret`]).
    pub fn with_secrets_key(mut self, key: Arc<SecretsKey>) -> Self {
        self.secrets = Some(key);
        self
    }

    /// How many round trips to Redis this handle and its clones have made.
    pub fn round_trips(&self) -> u64 {
        self.trips.load(Ordering::Relaxed)
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

    /// Records `response` as the answer to `request` (pending), atomically: `Ok(true)` when this
    /// answer won, `Ok(false)` when the interaction was no longer pending. The input of a
    /// sensitive request is stored sealed; without a secrets key it is refused.
    pub async fn answer(
        &self,
        request: &InteractionRequest,
        response: &InteractionResponse,
    ) -> Result<bool, Error> {
        let run_id = request.run_id;
        let mut stored = response.clone();
        let has_content =
            response.input.is_some() || response.feedback.is_some() || response.data.is_some();
        if request.is_sensitive() && has_content {
            // Everything the person typed is sealed: input, feedback and data alike.
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
        let mut conn = self.connection();
        let key = self.interaction_key(run_id, &response.request_id.to_string());
        let json = serde_json::to_string(&stored).unwrap_or_default();
        match Script::new(ANSWER)
            .key(key)
            .arg(json)
            .arg(Timestamp::now().to_string())
            .invoke_async::<i64>(&mut conn)
            .await
        {
            Ok(n) => Ok(n == 1),
            Err(e) if e.to_string().contains("NOTFOUND") => Err(Error::NotFound(run_id)),
            Err(e) => Err(backend(e)),
        }
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

    /// The accepted answer of an interaction, if it has one.
    pub async fn stored_answer(
        &self,
        run_id: RunId,
        request_id: RequestId,
    ) -> Result<Option<InteractionResponse>, Error> {
        let mut conn = self.connection();
        let raw: Option<String> = redis::cmd("HGET")
            .arg(self.interaction_key(run_id, &request_id.to_string()))
            .arg("response")
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        let Some(raw) = raw else { return Ok(None) };
        let mut response: InteractionResponse = serde_json::from_str(&raw)
            .map_err(|e| Error::Backend(format!("interaction {request_id}: bad response ({e})")))?;
        let ctx = request_id.to_string();
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
                Error::Backend(format!("interaction {request_id}: bad sealed data ({e})"))
            })?);
        }
        Ok(Some(response))
    }
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
        let mut conn = self.connection();
        let mut inv = self.create.key(self.run_key(record.run_id));
        for (k, v) in record_fields(&record) {
            inv.arg(k).arg(v);
        }
        match inv.invoke_async::<i64>(&mut conn).await {
            Ok(_) => Ok(()),
            Err(e) if e.to_string().contains("EXISTS") => Err(Error::AlreadyExists(record.run_id)),
            Err(e) => Err(backend(e)),
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
            .arg(request);
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
        let first = last + 1 - events.len() as u64;
        Ok(numbered(events, first, now))
    }
}
