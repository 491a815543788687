//! The fleet's run store: Redis (docs/protocol.md §5).
//!
//! Runs are spread over `B` buckets (`DELTA_REDIS_BUCKETS`, default 16, fixed per deployment and
//! stored in `<p>:buckets`); run `r` is in bucket `k = fnv1a32(r) mod B` ([`bucket_of`]). `<t>` is
//! the bucket's tag `<p>:{b<k>}`: the braces make `b<k>` the Redis Cluster hash tag.
//!
//! ```text
//! <p>:buckets                       string  B, set by the first program to start
//! <t>:run:<run_id>                  hash    the run record, plus `seq` (last journal seq), the fence, `owner`,
//!                                           `job_seq`, `idempotency_key` (the key its submission set, if any),
//!                                           `snap` (its latest snapshot; emptied when it finishes)
//! <t>:run:<run_id>:journal          stream  one entry per event, entry id `<seq>-0`, field `e` = the event JSON
//! <t>:run:<run_id>:ix:<request_id>  hash    request JSON, state (PENDING/ANSWERED/EXPIRED/CANCELLED), response,
//!                                           answered_at, resume_seq, traceparent
//! <t>:runs:all, <t>:runs:<STATUS>   zset    the bucket's run ids by creation time (µs)
//! <t>:runs:finished                 zset    finished run ids by when they finished (µs): what retention reads
//! <t>:interactions:all, …:pending   zset    request ids by request time (µs)
//! <t>:interactions:deadlines        zset    pending request ids by `expires_at` (µs)
//! <t>:interactions:runs             hash    request id → run id
//! <t>:resumes                       zset    `<run_id>/<request_id>` of answered requests whose run has not
//!                                           resumed yet, by when a reconciler should look at it next
//! <t'>:idempotency:<sha256>         string  `<run_id> <body sha256>` of a submission (24 h); `t'` is the
//!                                           digest's bucket, and the run's id is drawn in that bucket
//! <p>:workers                       zset    worker ids by last heartbeat (ms)
//! <p>:ticket:<sha256>               string  what a live-stream ticket grants (the gateway's JSON), for its
//!                                           few seconds; taken with GETDEL on first use
//! ```
//!
//! A run's keys and its bucket's indexes share one hash tag, so each state change is one Lua
//! script on one slot, on one Redis as on Redis Cluster; the keys outside the buckets are touched
//! by no script. Listings, reconcilers and the request id → run lookup read every bucket with
//! one pipelined command each, in one round trip (`redis/index.rs`).
//!
//! A store handle may carry a fencing token `(stream sequence, delivery count)` taken from the
//! JetStream delivery it works for: a write with an older token than the run's is refused
//! (`Error::Fenced`) and changes nothing; a newer one takes the run over. So a worker that stalled
//! past `ack_wait` cannot overwrite the journal of the worker that took its job, whatever NATS
//! later accepts from it. The takeover itself is checked too: a fenced handle remembers how long
//! the journal was when it loaded the run, and its first write with the newer token is refused
//! (`Error::Fenced`) if the journal grew since, because the old owner, still alive, wrote in
//! between. Otherwise the new owner would act on a journal it did not see (run a finished step
//! again and journal a second result for it). Each later write of that handle checks the length
//! as well: shorter than the handle left it, writes it was told were stored are gone (a
//! failover); longer, this very write was applied already (the Redis client sends a command
//! again when its connection drops, and the script may have run before the drop). Either way
//! the write is refused (`Error::Rewound`) and the run goes on from its journal.
//!
//! With replica durability (a Redis Cluster's default), each write travels with its `WAIT` in
//! one pipeline, so that the `WAIT` answers for that write (`invoke_replicated`).
//!
//! The indexes (`runs:*`, `interactions:*`, `resumes`) are updated inside the same scripts as the
//! run's state, so they are never stale.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::Script;

pub mod access;
pub use human::{ClaimMode, Claimed, Counted, Escalation};
mod conn;
mod grants;
mod human;
mod index;
mod migrate;
mod packed;
mod retention;
mod tickets;
mod webhooks;
// A2A push-notification configs (gateway/src/a2a).
mod a2a;

pub use a2a::{A2aPushConfig, DeletePush, PushLimits, PutPush};
pub use webhooks::{Webhook, WebhookFailing, WebhookSecrets, WebhookState};

use conn::{Client, Conn};
pub use index::{Due, JournalTail, Note, Page, QueueRun, Requeue, Submitted};
pub use migrate::Migrated;
pub use retention::{Purge, Purged};

use super::{AnswerStore, Error, RunRecord, RunStore, Settled, StatusChange, StoredRun, numbered};
use delta_protocol::journal::{self, Snapshot};
use delta_protocol::secret::{self, SecretsKey};
use delta_protocol::{
    Event, Fence, InteractionRequest, InteractionResponse, InteractionState, JournalEvent,
    PausedRun, RequestId, RunId, RunStatus, Timestamp,
};

/// Declares the named arguments of a Lua script: a struct with one `String` per name, and the
/// names in ARGV order. [`named_args`] puts `local <names> = ARGV[1], ARGV[2], …` in front of the
/// script, so the script reads names, not positions, and the order lives in this one list.
macro_rules! script_args {
    ($(#[$doc:meta])* $name:ident { $($field:ident),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Default)]
        struct $name {
            $($field: String),+
        }

        impl $name {
            const NAMES: &'static [&'static str] = &[$(stringify!($field)),+];

            /// The values in the order of [`Self::NAMES`].
            fn into_argv(self) -> Vec<String> {
                vec![$(self.$field),+]
            }
        }
    };
}

/// `body` with a first line that binds `names` to ARGV[1..]: the script refers to its arguments
/// by name. Arguments past the named ones (a variable list) start at `first_extra`.
fn named_args(names: &[&str], body: &str) -> String {
    let argv: Vec<String> = (1..=names.len()).map(|i| format!("ARGV[{i}]")).collect();
    format!(
        "local {} = {}\nlocal first_extra = {}\n{body}",
        names.join(", "),
        argv.join(", "),
        names.len() + 1
    )
}

script_args!(
    /// The named arguments of [`APPEND`] (its events follow them, one ARGV each).
    AppendArgs {
        // The writer's fencing token ('' when unfenced).
        fence_seq,
        fence_n,
        // ISO time of the write, stamped on every event.
        now,
        // The new status ('' for none), and the request it waits on ('' for none).
        status,
        pending,
        // '1' when the run finished, with its result and error ('' for none).
        finished,
        result,
        err_text,
        // The request JSON when the run starts waiting.
        request,
        // The run's bucket tag `<p>:{b<k>}`: the indexes' keys start with it.
        prefix,
        // µs of the write (the score of a run new to an index), the owner ('' for none).
        created_us,
        owner,
        // µs the run was created, which scores it in the status indexes ('' when the writer did
        // not read its record: the script reads it from `runs:all`).
        run_us,
        // µs when the request was asked, and of its deadline ('' for none).
        asked_us,
        expires_us,
        // µs when its first escalation step is due ('' for none).
        escalate_us,
        traceparent,
        // The journal length the writer saw ('' when unknown): a takeover is refused when the
        // journal has grown since.
        seen_len,
        // A snapshot (`<seq>:<json>`, or `<seq>:b<packed json in base64>` when the journal is
        // packed) to keep in the record's `snap` when the journal ends at `snap_seq` after this
        // write ('' for none).
        snap,
        snap_seq,
        // '1': each event an entry of its own (the format older builds read).
        single,
        // '<n>': the one argument after these is the write's n events, packed (`z`).
        packed,
        // The ids of the questions a packed write asks, space-separated (its entry's `q`, which
        // retention reads to find them).
        asked,
        // The ids of the run's questions this writer read settled, space-separated: a write
        // that moves the run off one of them does not check that it is still pending.
        settled,
        // A question of the run to open again, if answered ([`AnswerStore::reopen`]; '' for
        // none): µs when it was asked and of its deadline (''), and '1' if it escalates.
        reopen,
        reopen_asked_us,
        reopen_expires_us,
        reopen_escalates,
        // '1': a `FAILED` end written for a dead-lettered job (the record's `dead_letter`).
        dead_letter,
    }
);

/// Appends events and applies a status change, fenced, keeping the indexes, and keeps the run's
/// snapshot in the record's `snap` (emptied when the run finishes). KEYS: run, journal, the
/// interaction paused on (or a dummy), the snapshot's key of builds before 2026-11-27 (deleted
/// when the run finishes without a `snap` field). ARGV: [`AppendArgs`], then one event each.
/// Errors: `NOTFOUND`, `TERMINAL <status>`, `FENCED` (an older token), `FENCED moved` (a takeover
/// after the journal moved), `REWOUND` (the journal lost writes this writer made, or holds this
/// write already): see [`ScriptError`].
const APPEND: &str = r#"
-- Finishing, also the snapshot field: without one, the snapshot may be in its own key (a build
-- before 2026-11-27 stored it there), which goes.
local cur
if finished == '1' then
  cur = redis.call('HMGET', KEYS[1], 'status', 'seq', 'fence_seq', 'fence_n', 'run_id',
    'pending_request_id', 'snap')
else
  cur = redis.call('HMGET', KEYS[1], 'status', 'seq', 'fence_seq', 'fence_n', 'run_id',
    'pending_request_id')
end
local st = cur[1]
if not st then return redis.error_reply('NOTFOUND') end
if st == 'COMPLETED' or st == 'FAILED' or st == 'CANCELLED' then
  return redis.error_reply('TERMINAL ' .. st)
end
local seq = tonumber(cur[2] or '0')
-- Every field of the record this write sets, written by one HSET at the end.
local set = {}
local function put(f, v) set[#set + 1] = f; set[#set + 1] = v end
if fence_seq ~= '' then
  local fs = tonumber(cur[3] or '0')
  local fn = tonumber(cur[4] or '0')
  local s, n = tonumber(fence_seq), tonumber(fence_n)
  if fs > s or (fs == s and fn > n) then return redis.error_reply('FENCED') end
  -- Shorter than this writer left it: writes it was told were stored are gone (a failover
  -- to a replica that had not received them).
  if seen_len ~= '' and tonumber(seen_len) > seq then return redis.error_reply('REWOUND') end
  local takeover = fs < s or fn < n
  if takeover and seen_len ~= '' and tonumber(seen_len) ~= seq then
    return redis.error_reply('FENCED moved')
  end
  -- Longer than this writer left it, and nobody else may write: this very write was applied
  -- already (the client sent it again after its connection dropped, as at a failover).
  if not takeover and seen_len ~= '' and tonumber(seen_len) < seq then
    return redis.error_reply('REWOUND applied already')
  end
  put('fence_seq', s)
  put('fence_n', n)
end
if owner ~= '' then put('owner', owner) end
-- The seq after the events (they are written last, with the record's `seq`).
local first_seq = seq + 1
if packed ~= '' then seq = seq + tonumber(packed)
elseif #ARGV >= first_extra then seq = seq + #ARGV - first_extra + 1 end
put('seq', seq)
put('updated_at', now)
-- A question whose answer the engine refused, opened again by the write that journals why (and
-- pauses the run on it again), before the status below: a write that moves the run off it
-- closes it as any pending question.
if reopen ~= '' then
  local rkey = KEYS[1] .. ':ix:' .. reopen
  if redis.call('HGET', rkey, 'state') == 'ANSWERED' then
    local refused = redis.call('HGET', rkey, 'answered_at')
    local f = {'state', 'PENDING'}
    if refused then f[#f + 1] = 'reopened_at'; f[#f + 1] = refused end
    if fence_seq ~= '' then f[#f + 1] = 'job'; f[#f + 1] = fence_seq end
    redis.call('HSET', rkey, unpack(f))
    redis.call('HDEL', rkey, 'response', 'answered_at', 'resume_seq', 'approvals', 'rejections',
      'unannounced')
    -- A question decided by votes is voted on afresh: the decision was refused.
    for _, k in ipairs(redis.call('HKEYS', rkey)) do
      local kind = string.match(k, '^(%a+):')
      if kind == 'vote' or kind == 'votefp' or kind == 'auth' then redis.call('HDEL', rkey, k) end
    end
    redis.call('ZADD', prefix .. ':interactions:pending', reopen_asked_us, reopen)
    if reopen_expires_us ~= '' then
      redis.call('ZADD', prefix .. ':interactions:deadlines', reopen_expires_us, reopen)
    end
    if reopen_escalates == '1' then
      redis.call('ZADD', prefix .. ':interactions:escalations', 0, reopen)
    end
    redis.call('ZREM', prefix .. ':resumes', cur[5] .. '/' .. reopen)
  end
end
if status ~= '' then
  local p = prefix
  local run = cur[5]
  local old = cur[6]
  put('status', status)
  if status ~= st then
    local score = run_us
    if score == '' then score = redis.call('ZSCORE', p .. ':runs:all', run) or created_us end
    redis.call('ZREM', p .. ':runs:' .. st, run)
    redis.call('ZADD', p .. ':runs:' .. status, score, run)
  end
  if old and old ~= pending then
    -- The run no longer waits on `old`: a question still pending there is closed (unless the
    -- writer read it settled: it cannot be pending again but by a reopen, which it would know).
    local okey = KEYS[1] .. ':ix:' .. old
    if not string.find(' ' .. settled .. ' ', ' ' .. old .. ' ', 1, true)
      and redis.call('HGET', okey, 'state') == 'PENDING' then
      local closed = 'EXPIRED'
      if status == 'CANCELLED' then closed = 'CANCELLED' end
      redis.call('HSET', okey, 'state', closed, 'answered_at', now)
      redis.call('ZREM', p .. ':interactions:pending', old)
      redis.call('ZREM', p .. ':interactions:deadlines', old)
      redis.call('ZREM', p .. ':interactions:escalations', old)
    end
    redis.call('ZREM', p .. ':resumes', run .. '/' .. old)
  end
  if pending ~= '' then
    put('pending_request_id', pending)
    if redis.call('HSETNX', KEYS[3], 'state', 'PENDING') == 1 then
      -- The question's run is in its key, and in `interactions:runs`; `job`, the stream
      -- sequence of the job that asks it, tells whoever settles it whether that job was acked
      -- (and so the question announced).
      local q = {'request', request}
      if traceparent ~= '' then q[#q + 1] = 'traceparent'; q[#q + 1] = traceparent end
      if fence_seq ~= '' then q[#q + 1] = 'job'; q[#q + 1] = fence_seq end
      redis.call('HSET', KEYS[3], unpack(q))
      redis.call('ZADD', p .. ':interactions:all', asked_us, pending)
      redis.call('ZADD', p .. ':interactions:pending', asked_us, pending)
      if expires_us ~= '' then redis.call('ZADD', p .. ':interactions:deadlines', expires_us, pending) end
      if escalate_us ~= '' then redis.call('ZADD', p .. ':interactions:escalations', escalate_us, pending) end
      redis.call('HSET', p .. ':interactions:runs', pending, run)
    end
  elseif old then
    redis.call('HDEL', KEYS[1], 'pending_request_id')
  end
  if finished == '1' then
    if result ~= '' then put('result', result) end
    if err_text ~= '' then put('error', err_text) end
    if dead_letter == '1' and status == 'FAILED' then put('dead_letter', '1') end
    -- Retention finds finished runs by when they finished (redis/retention.rs).
    redis.call('ZADD', p .. ':runs:finished', created_us, run)
    -- A finished run keeps no snapshot: emptied in the record's HSET below.
    if cur[7] then put('snap', '') else redis.call('DEL', KEYS[4]) end
  end
end
-- The events as one entry, `<last seq>-0`: their time once, then one JSON line each (packed by
-- the writer, or in plain text); then the
-- record, so that the journal and the record's `seq` are written together, after anything
-- above that could fail.
if seq >= first_seq and single == '1' then
  for i = first_extra, #ARGV do
    local n = first_seq + i - first_extra
    redis.call('XADD', KEYS[2], n .. '-0', 'e',
      '{"seq":' .. n .. ',"timestamp":"' .. now .. '",' .. string.sub(ARGV[i], 2))
  end
elseif seq >= first_seq and packed ~= '' and asked ~= '' then
  redis.call('XADD', KEYS[2], seq .. '-0', 't', now, 'z', ARGV[first_extra], 'q', asked)
elseif seq >= first_seq and packed ~= '' then
  redis.call('XADD', KEYS[2], seq .. '-0', 't', now, 'z', ARGV[first_extra])
elseif seq >= first_seq then
  redis.call('XADD', KEYS[2], seq .. '-0', 't', now, 'b',
    table.concat(ARGV, '\n', first_extra, #ARGV))
end
-- A finishing write keeps none (emptied above), whatever snapshot fell due with it.
if snap ~= '' and finished ~= '1' and seq >= first_seq and tostring(seq) == snap_seq then
  put('snap', snap)
end
redis.call('HSET', KEYS[1], unpack(set))
return seq
"#;

/// A run's record, its snapshot and the journal after it, and the question a resume asks about,
/// in one round trip. KEYS: run, journal, the snapshot's key of builds before 2026-11-27 (read
/// only when the record has no `snap`). ARGV: the question's request id ('': the one the run
/// waits on, if any). Returns `{record fields (with `snap`), the snapshot if it came from its
/// key (else nil), entries, request id or nil, its interaction's fields}`: without a snapshot (or
/// with one whose seq cannot be read) the whole journal; with one that ends where the record's
/// `seq` does (a run paused and not moved since), no entries, and the journal is not read.
const LOAD_LATEST: &str = r#"
local h = redis.call('HGETALL', KEYS[1])
if #h == 0 then return {h, false, {}, false, {}} end
local rid = ARGV[1]
local find = rid == ''
if find then rid = false end
local at, snap = false, false
for i = 1, #h - 1, 2 do
  local f = h[i]
  if find and f == 'pending_request_id' then rid = h[i + 1]
  elseif f == 'seq' then at = h[i + 1]
  elseif f == 'snap' and h[i + 1] ~= '' then snap = h[i + 1] end
end
local ix = {}
if rid then ix = redis.call('HGETALL', KEYS[1] .. ':ix:' .. rid) end
local keyed = false
if not snap then
  keyed = redis.call('GET', KEYS[3])
  snap = keyed
end
local from = '-'
if snap then
  local s = string.match(snap, '^(%d+):')
  if s and s == at then return {h, keyed, {}, rid, ix} end
  -- After the snapshot's own entry, exclusive, not its seq plus one: Lua's numbers lose whole
  -- numbers of more than 14 digits. A seq of 20 digits or more, never a real one (it may
  -- overflow a stream ID), is read from the start: the snapshot is then found unusable and the
  -- whole journal replayed.
  if s and #s < 20 then from = '(' .. s .. '-0' end
end
return {h, keyed, redis.call('XRANGE', KEYS[2], from, '+'), rid, ix}
"#;

/// What `<p>:journal-format` holds once every program of a fleet reads a write's events as one
/// journal entry (builds of 2026-11-24 on): programs then write them so, in plain text (`b`).
/// Without the key each event is an entry of its own, as older builds read them
/// (docs/operations.md#upgrades).
pub const JOURNAL_FORMAT: &str = "entry-per-write";

/// What `<p>:journal-format` holds once every program of a fleet reads packed entries (builds of
/// 2026-11-25 on): a write's events are then one entry, deflated with a preset dictionary (`z`,
/// `redis/packed.rs`). Set by the first program of a new deployment, or by
/// `delta migrate-redis --journal-entries` once an older fleet is upgraded.
pub const JOURNAL_FORMAT_PACKED: &str = "packed-1";

/// How a handle writes a write's events in the journal, from `<p>:journal-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum JournalMode {
    /// Each event an entry of its own (`e`): no key.
    Single,
    /// One entry per write, its events in plain text (`b`): [`JOURNAL_FORMAT`].
    Plain,
    /// One entry per write, packed (`z`): [`JOURNAL_FORMAT_PACKED`].
    Packed,
}

impl JournalMode {
    /// The mode `<p>:journal-format` (its value, if any) asks for; an error for a format this build
    /// does not know (a newer build's): it could not read what the fleet writes.
    fn of(format: Option<&str>, key: &str) -> Result<Self, Error> {
        match format {
            None => Ok(Self::Single),
            Some(JOURNAL_FORMAT) => Ok(Self::Plain),
            Some(JOURNAL_FORMAT_PACKED) => Ok(Self::Packed),
            Some(other) => Err(Error::Buckets(format!(
                "`{key}` says this fleet writes its journals as `{other}`, which this build cannot read: run a build at least as new as the fleet's (docs/operations.md#upgrades)"
            ))),
        }
    }
}

/// A question a run's next write opens again ([`AnswerStore::reopen`]), with what its indexes
/// need of it.
#[derive(Clone, Debug, PartialEq)]
struct Reopen {
    run_id: RunId,
    request_id: RequestId,
    asked_us: i64,
    expires_us: Option<i64>,
    escalates: bool,
}

/// What a fenced handle last saw of the run it writes (see [`RedisRunStore::fenced`]).
#[derive(Clone, Copy, Debug)]
struct Seen {
    run_id: RunId,
    /// The journal's length then.
    len: u64,
    /// When the run was created (µs), if its record was read.
    created_us: Option<i64>,
    /// Taken from its job as carried, neither read nor written since: the first side effect
    /// outside the run's writes waits for [`RunStore::confirm`].
    carried: bool,
}

/// Buckets when `DELTA_REDIS_BUCKETS` is not set, on one Redis.
pub const DEFAULT_BUCKETS: u32 = 16;

/// Buckets when `DELTA_REDIS_BUCKETS` is not set, on a Redis Cluster: enough that the buckets'
/// slots spread evenly over the masters (16 buckets on 3 masters put 4, 6 and 6 on them; 64 put
/// 22, 22 and 20).
pub const DEFAULT_CLUSTER_BUCKETS: u32 = 64;

/// The bucket count a new deployment gets on one Redis or on a cluster.
pub fn default_buckets(cluster: bool) -> u32 {
    if cluster {
        DEFAULT_CLUSTER_BUCKETS
    } else {
        DEFAULT_BUCKETS
    }
}

/// The most buckets a deployment may have (a listing reads every one of them).
pub const MAX_BUCKETS: u32 = 1024;

/// The length of a run id's hyphenated text.
const ID_LEN: usize = uuid::fmt::Hyphenated::LENGTH;

/// `run_id`'s hyphenated lowercase text (its `Display`), written in `buf`: no allocation.
fn id_text<'a>(run_id: &RunId, buf: &'a mut [u8; ID_LEN]) -> &'a str {
    run_id.as_uuid().hyphenated().encode_lower(buf)
}

/// The bucket of `id` (a run id, or an idempotency key's digest) among `buckets`: the 32-bit
/// FNV-1a hash of its text (a run id in its hyphenated lowercase form), modulo `buckets`.
/// Where every key lives follows from it: it must never change.
pub fn bucket_of(id: &str, buckets: u32) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in id.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h % buckets.max(1)
}

/// An error a script returned on purpose (`redis.error_reply`), parsed from its code: the store
/// acts on these, never on the text of other errors.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ScriptError {
    /// `NOTFOUND`: no such run (or interaction).
    NotFound,
    /// `TERMINAL <status>`: the run is final.
    Terminal(RunStatus),
    /// `FENCED`: a newer delivery owns the run; `FENCED moved`: this writer's takeover came
    /// after the journal moved.
    Fenced,
    /// `EXISTS`: the run exists already.
    Exists,
    /// `REWOUND`: the journal is not as long as this writer left it (shorter: writes lost at a
    /// failover; longer: this write, sent again, was applied already).
    Rewound,
}

impl ScriptError {
    /// The script error `e` carries, if it is one of ours.
    fn of(e: &redis::RedisError) -> Option<ScriptError> {
        // Redis 7 sends a script's `error_reply('FENCED moved')` as `-ERR FENCED moved` (older
        // servers as `-FENCED moved`): the code is then the first word after `ERR`.
        let (code, detail) = match e.code()? {
            "ERR" => {
                let mut words = e.detail()?.trim().splitn(2, ' ');
                (words.next()?, words.next())
            }
            code => (code, e.detail()),
        };
        match code {
            "NOTFOUND" => Some(ScriptError::NotFound),
            "FENCED" => Some(ScriptError::Fenced),
            "EXISTS" => Some(ScriptError::Exists),
            "REWOUND" => Some(ScriptError::Rewound),
            "TERMINAL" => {
                let status = detail?.trim().parse::<RunStatus>().ok()?;
                status
                    .is_terminal()
                    .then_some(ScriptError::Terminal(status))
            }
            _ => None,
        }
    }

    /// The store error it means for `run_id`.
    fn into_error(self, run_id: RunId) -> Error {
        match self {
            ScriptError::NotFound => Error::NotFound(run_id),
            ScriptError::Terminal(status) => Error::Terminal { run_id, status },
            ScriptError::Fenced => Error::Fenced(run_id),
            ScriptError::Exists => Error::AlreadyExists(run_id),
            ScriptError::Rewound => Error::Rewound(run_id),
        }
    }
}

/// Creates a run record unless one exists, indexed; with an idempotency key, a second submission
/// returns the first one's value instead. KEYS: run. ARGV: the run's bucket tag, created µs, idempotency key
/// (or ''), its value, its TTL in seconds, then the record's fields.
const CREATE: &str = r#"
if ARGV[3] ~= '' then
  local prior = redis.call('GET', ARGV[3])
  if prior then return {'IDEMPOTENT', prior} end
end
if redis.call('EXISTS', KEYS[1]) == 1 then return redis.error_reply('EXISTS') end
local fields = {}
local run, st
for i = 6, #ARGV do fields[#fields + 1] = ARGV[i] end
for i = 6, #ARGV - 1, 2 do
  if ARGV[i] == 'run_id' then run = ARGV[i + 1] elseif ARGV[i] == 'status' then st = ARGV[i + 1] end
end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('ZADD', ARGV[1] .. ':runs:all', ARGV[2], run)
redis.call('ZADD', ARGV[1] .. ':runs:' .. st, ARGV[2], run)
if st == 'COMPLETED' or st == 'FAILED' or st == 'CANCELLED' then
  redis.call('ZADD', ARGV[1] .. ':runs:finished', ARGV[2], run)
end
if ARGV[3] ~= '' then
  redis.call('SET', ARGV[3], ARGV[4], 'EX', ARGV[5])
  -- So that retention removes the key with the run (it lives 24 h anyway).
  redis.call('HSET', KEYS[1], 'idempotency_key', ARGV[3])
end
return {'CREATED', ''}
"#;

/// Settles a pending interaction: `ANSWERED` with its response, or `EXPIRED` by the clock, and
/// queues its run's resume for the reconciler to check. Returns `WON`, or the state it was in.
/// KEYS: the interaction, the run. ARGV: new state, response JSON (or ''), now, bucket tag,
/// request id, resume member, when to check the resume (µs), the responder (`''` for the clock),
/// now (µs), the indexes besides `pending` it is in: `d` (deadlines) and `e` (escalations), `-`
/// for neither (a question is in them only when it has a deadline, an escalation:
/// docs/protocol.md "Redis layout"); missing (an older caller): both; the most bytes of fields
/// to carry ('' for none): then a win over a run with a snapshot whose record and question
/// together hold no more returns `{'WON', the run's fields, the question's fields}`, for the
/// resume job. A win over a question the engine reopened says so: `WON|<reopened_at>|<job>`
/// (the carried question's fields hold both).
/// `CLAIMED|<until µs>|<holder>` when someone else holds a live claim on it.
const RESOLVE: &str = r#"
local cur = redis.call('HMGET', KEYS[1], 'state', 'claim_by', 'claim_until', 'reopened_at', 'job')
local st, by, till = cur[1], cur[2], cur[3]
if not st then return redis.error_reply('NOTFOUND') end
if st ~= 'PENDING' then return st end
if ARGV[8] ~= '' and by and by ~= ARGV[8] and tonumber(till or '0') > tonumber(ARGV[9]) then
  return 'CLAIMED|' .. till .. '|' .. by
end
if by or till then redis.call('HDEL', KEYS[1], 'claim_by', 'claim_until') end
if ARGV[2] ~= '' then
  redis.call('HSET', KEYS[1], 'state', ARGV[1], 'answered_at', ARGV[3], 'response', ARGV[2])
else
  redis.call('HSET', KEYS[1], 'state', ARGV[1], 'answered_at', ARGV[3])
end
redis.call('ZREM', ARGV[4] .. ':interactions:pending', ARGV[5])
local idx = ARGV[10]
if not idx or string.find(idx, 'd', 1, true) then
  redis.call('ZREM', ARGV[4] .. ':interactions:deadlines', ARGV[5])
end
if not idx or string.find(idx, 'e', 1, true) then
  redis.call('ZREM', ARGV[4] .. ':interactions:escalations', ARGV[5])
end
redis.call('ZADD', ARGV[4] .. ':resumes', ARGV[7], ARGV[6])
local cap = tonumber(ARGV[11] or '')
if cap then
  -- Only a run with a snapshot is worth carrying (without one, its worker reads the journal),
  -- and only up to `cap` bytes of fields.
  local run = redis.call('HGETALL', KEYS[2])
  local size, snap = 0, false
  for i = 1, #run - 1, 2 do
    size = size + #run[i] + #run[i + 1]
    if run[i] == 'snap' and run[i + 1] ~= '' then snap = true end
  end
  if snap and size <= cap then
    local ix = redis.call('HGETALL', KEYS[1])
    for i = 1, #ix do size = size + #ix[i] end
    if size <= cap then return {'WON', run, ix} end
  end
end
if cur[4] then return 'WON|' .. cur[4] .. '|' .. (cur[5] or '') end
return 'WON'
"#;

/// The most bytes of record and question fields a resume job carries ([`PausedRun`]): beyond
/// that its worker reads the run, and a job stays a small message however large the runs.
pub const CARRIED_MAX_BYTES: usize = 8 * 1024;

/// What `RESOLVE` answered: this call won (with the run and question if asked to carry them, and
/// the engine's reopen of the question if there was one), or the question's state (or claim)
/// that stopped it.
enum Settling {
    Won(Option<PausedRun>, Option<Reopened>),
    Other(String),
}

/// The engine's last reopen of a question (it refused an answer), as a settling found it: what a
/// copy of the question taken before the reopen (a gateway's question heard announced) does not
/// know, and what announcing the question again needs (`Queue::publish_pending`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reopened {
    /// When the refused answer was accepted: the reopen's announcement is named by it.
    pub at: Timestamp,
    /// The stream sequence of the job that reopened it (it announces the question again).
    pub job: Option<u64>,
}

impl Reopened {
    /// From a question's `reopened_at` and `job` fields; `None` if it was never reopened.
    fn of(at: Option<&str>, job: Option<&str>) -> Option<Reopened> {
        Some(Reopened {
            at: at?.parse().ok()?,
            job: job.and_then(|j| j.parse().ok()),
        })
    }
}

/// What [`RedisRunStore::resolve_carrying`] did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Settlement {
    /// `None` when this call won; otherwise the state the question was already in.
    pub lost: Option<InteractionState>,
    /// The run and its question, for the resume job to carry, if this call won and may carry it.
    pub paused: Option<PausedRun>,
    /// The engine's last reopen of the question, if this call won over a reopened question.
    pub reopened: Option<Reopened>,
}

/// `RESOLVE`'s tenth argument: the indexes besides `pending` that question `q` is in.
fn resolve_indexes(q: &InteractionRequest) -> &'static str {
    match (q.expires_at.is_some(), !q.escalation.is_empty()) {
        (true, true) => "de",
        (true, false) => "d",
        (false, true) => "e",
        (false, false) => "-",
    }
}

/// Marks a run as synced (`synced_at`), so that a `WAIT` behind it in the same pipeline answers
/// for every write its master holds ([`RunStore::sync`] with replica durability). KEYS: run.
/// ARGV: now. Errors: `NOTFOUND` (not on this master: lost at a failover, or never there).
const SYNC: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return redis.error_reply('NOTFOUND') end
redis.call('HSET', KEYS[1], 'synced_at', ARGV[1])
return 1
"#;

/// Runs in Redis, optionally fenced.
#[derive(Clone)]
pub struct RedisRunStore {
    /// For dedicated connections (blocking stream reads must not hold up the shared one).
    client: Client,
    /// A multiplexed connection (to one Redis or a cluster) that reconnects by itself; cheap
    /// to clone.
    conn: Conn,
    /// Key prefix (`DELTA_KEY_PREFIX`, default `delta`).
    prefix: String,
    /// How many buckets the runs are spread over (`DELTA_REDIS_BUCKETS`), as stored in Redis.
    buckets: u32,
    /// The fencing token of the delivery this handle writes for, if any.
    fence: Option<Fence>,
    /// The worker this handle writes for (the run record's `owner`).
    owner: Option<String>,
    /// The trace a pause belongs to, stored with the question so its answer continues it.
    traceparent: Option<String>,
    /// Whether a `FAILED` end written through this handle is a dead letter's
    /// ([`RedisRunStore::dead_lettering`]): retention keeps such a run as long as its letter.
    dead_letter: bool,
    /// How much longer (µs) than a finished run retention keeps a dead letter's run
    /// ([`RedisRunStore::keeping_letters`]).
    letters_longer_us: i64,
    append: Script,
    load_latest: Script,
    create: Script,
    resolve: Script,
    /// Round trips to Redis made through this handle and its clones (each method makes one).
    trips: Arc<AtomicU64>,
    /// Seals sensitive answers at rest (`DELTA_SECRETS_KEY`); without it they are refused.
    secrets: Option<Arc<SecretsKey>>,
    /// For a fenced handle: the run it loaded or wrote last, its journal length then (so that
    /// its takeover write is refused if someone wrote in between: see the module doc), and when
    /// the run was created if it was loaded (the score of its status indexes).
    seen: Arc<std::sync::Mutex<Option<Seen>>>,
    /// The question read with the run by [`RunStore::load_latest`] (the one a resume asks
    /// about next), for [`AnswerStore::settled`] to take instead of reading it again.
    prefetched: Arc<std::sync::Mutex<Option<(RunId, RequestId, Fields)>>>,
    /// The questions this handle read settled ([`AnswerStore::settled`]; answered, expired or
    /// cancelled) and has not reopened since: a settled question never becomes pending again but
    /// by a reopen, so the write that moves the run off one need not check it.
    settled: Arc<std::sync::Mutex<Vec<(RunId, RequestId)>>>,
    /// The question each run's next write through this handle opens again
    /// ([`AnswerStore::reopen`]).
    reopening: Arc<std::sync::Mutex<Vec<Reopen>>>,
    /// How a write's events go in the journal: each an entry of its own, as builds before
    /// 2026-11-24 read them, until `<p>:journal-format` says every reader takes a write as one
    /// entry ([`JOURNAL_FORMAT`]) or a packed one ([`JOURNAL_FORMAT_PACKED`]).
    journal: JournalMode,
    /// How a write that precedes an irreversible step is made durable ([`Durability`]).
    durability: Durability,
    /// Whether `<p>:finished-index` says every finished run is in its bucket's `runs:finished`
    /// (read as this handle connected): retention then needs no backfill walk.
    finished_indexed: bool,
}

/// What `<p>:finished-index` holds once every finished run is in its bucket's `runs:finished`.
const FINISHED_INDEX_COMPLETE: &str = "complete";

/// How the fleet knows that a write is durable before it does something that cannot be undone
/// (`DELTA_REDIS_DURABILITY`; docs/operations.md#durability): an accepted answer before the
/// gateway says so and queues the resume, the record of a tool call before a tool that must
/// not run twice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Redis runs with `appendfsync always`: it answers a write only once the write is fsynced,
    /// so there is nothing to wait for. The default on one Redis, and what the launcher and
    /// docker-compose.yml run.
    FsyncAlways,
    /// Redis 7.2 or newer, with the AOF on (any `appendfsync`): after such a write, `WAITAOF`
    /// waits (up to the timeout) until Redis fsynced it.
    WaitAof { timeout: Duration },
    /// Every write to a run returns only once a replica of its master has it too (`WAIT 1`),
    /// on top of the master's own `appendfsync always`: a failover to that replica loses no
    /// acknowledged write. The default on a Redis Cluster. A master without a live replica
    /// refuses to go on (the write is retried) rather than risk losing it.
    Replica { timeout: Duration },
    /// Nothing is waited for: an acknowledged write can be lost if the Redis host crashes
    /// within about a second (`appendfsync everysec`). For throwaway fleets only.
    None,
}

impl Durability {
    /// Parses `fsync-always`, `waitaof` or `replica` (each waits at most 1 s), or `none`.
    pub fn parse(text: &str) -> Result<Durability, String> {
        match text {
            "fsync-always" => Ok(Durability::FsyncAlways),
            "waitaof" => Ok(Durability::WaitAof {
                timeout: Duration::from_secs(1),
            }),
            "replica" => Ok(Durability::default_for(true)),
            "none" => Ok(Durability::None),
            other => Err(format!(
                "`{other}` is not `fsync-always` (Redis runs with appendfsync always; the default on one Redis), `replica` (each write waits for a replica; the default on a Redis Cluster), `waitaof` (Redis 7.2 or newer) or `none` (no guarantee)"
            )),
        }
    }

    /// The default for one Redis (`cluster` false) or a Redis Cluster.
    pub fn default_for(cluster: bool) -> Durability {
        if cluster {
            // Below the response timeout (2 s), so that a replica that does not answer is
            // reported as such, not as a master that does not.
            Durability::Replica {
                timeout: Duration::from_secs(1),
            }
        } else {
            Durability::FsyncAlways
        }
    }
}

/// How to reach Redis: the programs' `DELTA_REDIS_CLUSTER`, `DELTA_REDIS_CA_FILE` and
/// `DELTA_REDIS_BUCKETS`.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The URLs are seed nodes of a Redis Cluster (`DELTA_REDIS_CLUSTER=1`).
    pub cluster: bool,
    /// Certificate authorities (PEM) to check a `rediss://` server against.
    pub ca_file: Option<std::path::PathBuf>,
    /// How many buckets the runs are spread over (`DELTA_REDIS_BUCKETS`): refused if Redis
    /// already holds another count. `None`: the count Redis holds, or for a new deployment
    /// [`default_buckets`].
    pub buckets: Option<u32>,
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
    /// When the answer last refused (the question reopened) was accepted: a pending question
    /// with one is announced under its reopen's id (the queue's `publish_pending`).
    pub reopened_at: Option<Timestamp>,
    /// The stream sequence of the resume job published for it, once published.
    pub resume_seq: Option<u64>,
    /// The stream sequence of the job that asked it (builds of 2026-11-25 on): while that job is
    /// in the stream its worker has not acked it, so may have died before announcing it.
    pub asked_by_job: Option<u64>,
    /// Its asking job was let go without announcing it (NATS would not take it, and it was
    /// settled meanwhile): whoever announces its settling announces it first.
    pub unannounced: bool,
    /// The `traceparent` of the run's span that asked it.
    pub traceparent: Option<String>,
    /// A person's live claim on it (none once it lapsed).
    pub claim: Option<delta_protocol::Claim>,
    /// The votes cast on it (a question with `approvals`), in order.
    pub votes: Vec<delta_protocol::Vote>,
    /// How many of its escalation steps were carried out.
    pub escalated: u32,
    /// When its last step carried out was, if its announcement is not recorded (the gateway
    /// that carried it out died first, or NATS would not take it): the next look announces it.
    pub unannounced_step: Option<Timestamp>,
    /// Who its escalation let answer besides `allowed_responders` (`add_responders`).
    pub added_responders: Vec<String>,
}

/// How a pending interaction is settled.
pub enum Resolution<'a> {
    /// A person's (or bot's) answer, validated at the instant given (stored as `answered_at`,
    /// so that a worker checks the deadline against the same instant).
    Answer(&'a InteractionResponse, Timestamp),
    /// Its deadline passed (noticed at the instant given, stored as `answered_at`): the run
    /// applies the default option, or fails.
    Expired(Timestamp),
}

impl RedisRunStore {
    /// Connects to `url` (e.g. `redis://127.0.0.1:6379`, `redis://user:password@host:port`).
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, Error> {
        Self::connect_with(url, prefix, None).await
    }

    /// Connects to `url`; with a `rediss://` URL the server's certificate is checked against
    /// the certificate authorities in `ca_file` (PEM) when given, else against the system's.
    pub async fn connect_with(
        url: &str,
        prefix: &str,
        ca_file: Option<&std::path::Path>,
    ) -> Result<Self, Error> {
        Self::connect_buckets(url, prefix, ca_file, DEFAULT_BUCKETS).await
    }

    /// Connects as [`Self::connect_with`] for a deployment of `buckets` buckets
    /// (`DELTA_REDIS_BUCKETS`). The first program to connect to a prefix stores the count in
    /// `<prefix>:buckets`; a program with another count is refused ([`Error::Buckets`]), and so
    /// is one that finds the layout of before the buckets (run `delta migrate-redis` first).
    pub async fn connect_buckets(
        url: &str,
        prefix: &str,
        ca_file: Option<&std::path::Path>,
        buckets: u32,
    ) -> Result<Self, Error> {
        let options = Options {
            cluster: false,
            ca_file: ca_file.map(std::path::Path::to_owned),
            buckets: Some(buckets),
        };
        Self::connect_options(url, prefix, &options).await
    }

    /// Connects to one Redis or, with `options.cluster`, to the Redis Cluster whose seed
    /// nodes `urls` lists (comma-separated); checks the layout and the bucket count as
    /// [`Self::connect_buckets`] does.
    pub async fn connect_options(
        urls: &str,
        prefix: &str,
        options: &Options,
    ) -> Result<Self, Error> {
        let mut store = Self::connect_unchecked(urls, prefix, options).await?;
        if store.has_old_layout().await? {
            return Err(Error::Buckets(format!(
                "Redis holds runs under the prefix `{prefix}` in the layout of before the buckets: stop the fleet and run `delta migrate-redis` (docs/operations.md#redis-buckets)"
            )));
        }
        store.claim_buckets(options.buckets.is_some(), true).await?;
        Ok(store)
    }

    /// Lets the fleet write the newest journal format, each write's events packed in one entry
    /// (`<p>:journal-format` = [`JOURNAL_FORMAT_PACKED`]), once every gateway and worker runs a
    /// build that reads it (2026-11-25 or later); programs started after it write so. Returns
    /// whether it was set already.
    pub async fn allow_entry_per_write(&self) -> Result<bool, Error> {
        let mut conn = self.connection();
        let old: Option<String> = redis::cmd("SET")
            .arg(self.index("journal-format"))
            .arg(JOURNAL_FORMAT_PACKED)
            .arg("GET")
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        Ok(old.as_deref() == Some(JOURNAL_FORMAT_PACKED))
    }

    /// Whether every finished run was in its bucket's `runs:finished` as this handle connected
    /// (`<p>:finished-index`): set in a new deployment, and by the first retention backfill
    /// that walked every terminal status index ([`Self::mark_finished_indexed`]).
    pub fn finished_indexed(&self) -> bool {
        self.finished_indexed
    }

    /// Notes in `<p>:finished-index` that every finished run is in `runs:finished`: for the
    /// gateway whose backfill walked every terminal status index. Every build that writes the
    /// bucketed layout indexes each run it finishes, so no run finished later can be missing;
    /// gateways started after this walk nothing.
    pub async fn mark_finished_indexed(&self) -> Result<(), Error> {
        let mut conn = self.connection();
        redis::cmd("SET")
            .arg(self.index("finished-index"))
            .arg(FINISHED_INDEX_COMPLETE)
            .query_async::<()>(&mut conn)
            .await
            .map_err(backend)
    }

    /// Whether this handle writes each event as a journal entry of its own.
    pub fn writes_single_entries(&self) -> bool {
        self.journal == JournalMode::Single
    }

    /// Whether this handle packs each write's events in one journal entry.
    pub fn writes_packed_entries(&self) -> bool {
        self.journal == JournalMode::Packed
    }

    /// Connects without checking the layout or the bucket count (for the migration).
    async fn connect_unchecked(urls: &str, prefix: &str, options: &Options) -> Result<Self, Error> {
        let buckets = options
            .buckets
            .unwrap_or_else(|| default_buckets(options.cluster));
        if prefix.contains(['{', '}']) {
            return Err(Error::Buckets(format!(
                "the key prefix `{prefix}` holds a brace: braces mark Redis Cluster hash tags, pick a prefix without them"
            )));
        }
        if !(1..=MAX_BUCKETS).contains(&buckets) {
            return Err(Error::Buckets(format!(
                "{buckets} buckets: DELTA_REDIS_BUCKETS must be 1 to {MAX_BUCKETS}"
            )));
        }
        let client = Client::open(urls, options.cluster, options.ca_file.as_deref())?;
        let conn = client.connect().await.map_err(backend)?;
        Ok(Self {
            client,
            conn,
            prefix: prefix.to_owned(),
            buckets,
            fence: None,
            owner: None,
            traceparent: None,
            dead_letter: false,
            letters_longer_us: 0,
            append: Script::new(&named_args(AppendArgs::NAMES, APPEND)),
            load_latest: Script::new(LOAD_LATEST),
            create: Script::new(CREATE),
            resolve: Script::new(RESOLVE),
            trips: Arc::new(AtomicU64::new(0)),
            secrets: None,
            seen: Arc::default(),
            prefetched: Arc::default(),
            settled: Arc::default(),
            reopening: Arc::default(),
            journal: JournalMode::Single,
            durability: Durability::FsyncAlways,
            finished_indexed: false,
        })
    }

    /// Stores this handle's bucket count in `<prefix>:buckets` unless a count is there. With
    /// `strict` (a count was given), refuses to go on with another one; otherwise takes the
    /// count Redis holds.
    /// `new_format`: a deployment this claim creates writes one journal entry per write (not
    /// for a migration: the migrated fleet's older programs may still run).
    async fn claim_buckets(&mut self, strict: bool, new_format: bool) -> Result<(), Error> {
        let key = self.index("buckets");
        let format_key = self.index("journal-format");
        let mut conn = self.conn.clone();
        let (fresh, stored): (Option<String>, Option<String>) = redis::pipe()
            .cmd("SET")
            .arg(&key)
            .arg(self.buckets)
            .arg("NX")
            .get(&key)
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        // A new deployment has no reader of an older format: a write is one packed entry there.
        // Nor a run finished before the finished index: retention has nothing to walk for.
        let finished_key = self.index("finished-index");
        let mut pipe = redis::pipe();
        if fresh.is_some() && new_format {
            pipe.cmd("SET")
                .arg(&format_key)
                .arg(JOURNAL_FORMAT_PACKED)
                .arg("NX")
                .ignore();
            pipe.cmd("SET")
                .arg(&finished_key)
                .arg(FINISHED_INDEX_COMPLETE)
                .arg("NX")
                .ignore();
        }
        let (format, finished): (Option<String>, Option<String>) = pipe
            .get(&format_key)
            .get(&finished_key)
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        self.journal = JournalMode::of(format.as_deref(), &format_key)?;
        self.finished_indexed = finished.as_deref() == Some(FINISHED_INDEX_COMPLETE);
        match stored.as_deref().map(str::parse::<u32>) {
            Some(Ok(n)) if n == self.buckets => Ok(()),
            Some(Ok(n)) if !strict && (1..=MAX_BUCKETS).contains(&n) => {
                self.buckets = n;
                Ok(())
            }
            Some(Ok(n)) => Err(Error::Buckets(format!(
                "this Redis spreads the runs of prefix `{}` over {n} buckets, but this program was started with DELTA_REDIS_BUCKETS={}: start it with DELTA_REDIS_BUCKETS={n} (the count is fixed for the life of a deployment, or runs would be lost)",
                self.prefix, self.buckets
            ))),
            _ => Err(Error::Buckets(format!(
                "`{key}` does not hold a bucket count ({stored:?}): it was not written by Delta Fleet"
            ))),
        }
    }

    /// Whether keys of the layout of before the buckets are there (`<prefix>:runs:all`).
    async fn has_old_layout(&self) -> Result<bool, Error> {
        let mut conn = self.conn.clone();
        redis::cmd("EXISTS")
            .arg(self.index("runs:all"))
            .query_async(&mut conn)
            .await
            .map_err(backend)
    }

    /// A handle that makes writes durable as `durability` says, once it checked that the server
    /// can: `WAITAOF` needs Redis 7.2 or newer with the AOF on.
    pub async fn with_durability(mut self, durability: Durability) -> Result<Self, Error> {
        let mut conn = self.connection();
        match durability {
            Durability::WaitAof { .. } => {
                // `numlocal` 1: refused when the AOF is off, not only when WAITAOF is unknown.
                let probe = redis::cmd("WAITAOF").arg(1).arg(0).arg(1000).to_owned();
                if let Err(e) = conn.on_masters(&probe).await {
                    return Err(Error::Backend(
                        format!(
                            "DELTA_REDIS_DURABILITY=waitaof, but this Redis cannot wait for its AOF ({}): use Redis 7.2 or newer with appendonly yes, or run Redis with appendfsync always and DELTA_REDIS_DURABILITY=fsync-always",
                            e.detail().unwrap_or("WAITAOF refused")
                        )
                        .into(),
                    ));
                }
            }
            Durability::Replica { timeout } => {
                // Every master must have a replica that keeps up, or no write would go through.
                // A replica may still be connecting (a cluster just created): a while to.
                let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
                let probe = redis::cmd("WAIT").arg(1).arg(ms).to_owned();
                let deadline = std::time::Instant::now() + Duration::from_secs(5);
                loop {
                    let alone: Vec<String> = match conn.on_masters(&probe).await {
                        Ok(replies) => replies
                            .into_iter()
                            .filter(|(_, v)| !matches!(v, redis::Value::Int(n) if *n >= 1))
                            .map(|(addr, _)| {
                                if addr.is_empty() {
                                    "Redis".to_owned()
                                } else {
                                    addr
                                }
                            })
                            .collect(),
                        Err(e) if std::time::Instant::now() < deadline => {
                            tracing::debug!(error = %e, "waiting for the replicas");
                            vec![String::new()]
                        }
                        Err(e) => return Err(backend(e)),
                    };
                    if alone.is_empty() {
                        break;
                    }
                    if std::time::Instant::now() >= deadline {
                        return Err(Error::Backend(
                            format!(
                                "DELTA_REDIS_DURABILITY=replica, but {} has no replica that acknowledged within {ms} ms: give every master a replica, or choose DELTA_REDIS_DURABILITY=fsync-always (a failover can then lose the last writes)",
                                alone.join(", ")
                            )
                            .into(),
                        ));
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
            Durability::FsyncAlways | Durability::None => {}
        }
        self.durability = durability;
        Ok(self)
    }

    /// Runs the script `inv` (on `run_id`'s slot) and, with [`Durability::Replica`], `WAIT 1`
    /// right behind it in the same pipeline. Returns the script's reply (an error reply as the
    /// redis error, for [`ScriptError::of`]) and whether a replica of the node that ran the
    /// script has its write (always `Ok` without replica durability).
    ///
    /// Together, because `WAIT` counts the writes sent earlier *on its connection*: the pipeline
    /// goes to one node on one connection, so the `WAIT` answers for this very write. Sent on
    /// its own, a `WAIT` is routed by the slot once more, and after a failover it lands on the
    /// new master, where it answers for other writes: a write the old master took in its last
    /// moments (commands it had queued while frozen, run as it woke up) and lost when it turned
    /// replica was then taken as replicated (the chaos suite's scenario 9 lost a run that way).
    async fn invoke_replicated<T: redis::FromRedisValue>(
        &self,
        run_id: RunId,
        inv: &redis::ScriptInvocation<'_>,
    ) -> (redis::RedisResult<T>, Result<(), Error>) {
        let Durability::Replica { timeout } = self.durability else {
            let mut conn = self.connection();
            return (inv.invoke_async(&mut conn).await, Ok(()));
        };
        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        let mut loaded = false;
        loop {
            let mut pipe = redis::pipe();
            pipe.invoke_script(inv)
                .cmd("WAIT")
                .arg(1)
                .arg(ms)
                .ignore_errors();
            let mut conn = self.connection();
            let replies: Vec<redis::Value> = match pipe.query_async(&mut conn).await {
                Ok(r) => r,
                Err(e) => return (Err(e), Ok(())),
            };
            let mut replies = replies.into_iter();
            let (Some(reply), Some(acked)) = (replies.next(), replies.next()) else {
                let e = (
                    redis::ErrorKind::UnexpectedReturnType,
                    "a script and WAIT gave no two replies",
                );
                return (Err(e.into()), Ok(()));
            };
            let reply = match reply.extract_error() {
                // A node that has not seen the script yet (new, restarted, promoted): load it
                // there and try once more.
                Err(e)
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
                        && !loaded =>
                {
                    loaded = true;
                    if let Err(e) = inv.load_async(&mut conn).await {
                        return (Err(e), Ok(()));
                    }
                    continue;
                }
                Err(e) => return (Err(e), Ok(())),
                Ok(v) => v,
            };
            let replicated = if matches!(acked, redis::Value::Int(n) if n >= 1) {
                Ok(())
            } else {
                Err(not_replicated(run_id, ms))
            };
            return (
                redis::FromRedisValue::from_redis_value(reply).map_err(Into::into),
                replicated,
            );
        }
    }

    /// A handle whose writes carry the fencing token of one delivery.
    pub fn fenced(&self, fence: Fence) -> Self {
        let mut s = self.clone();
        s.fence = Some(fence);
        s.seen = Arc::default();
        s.prefetched = Arc::default();
        s.settled = Arc::default();
        s.reopening = Arc::default();
        s
    }

    /// Notes (on a fenced handle) that `run_id`'s journal is `len` events long as far as this
    /// handle knows; `created` is the run's record's creation time when it was just read.
    fn saw(&self, run_id: RunId, len: u64, created: Option<Timestamp>) {
        if self.fence.is_none() {
            return;
        }
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let created_us = created.map(|t| t.micros()).or(match *seen {
            Some(s) if s.run_id == run_id => s.created_us,
            _ => None,
        });
        *seen = Some(Seen {
            run_id,
            len,
            created_us,
            carried: false,
        });
    }

    /// [`RedisRunStore::saw`] of a run taken from its job, unread.
    fn saw_carried(&self, run_id: RunId, len: u64, created: Timestamp) {
        self.saw(run_id, len, Some(created));
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = seen.as_mut().filter(|s| s.run_id == run_id) {
            s.carried = true;
        }
    }

    /// The run a start job carried (see [`delta_protocol::FreshRun`]), taken as read (on a fenced
    /// handle): the first write then expects the journal empty, as a read would have found it,
    /// and is refused like any write whose writer did not see the journal as it is (`Fenced`),
    /// should the run have started meanwhile.
    pub fn start_fresh(&self, record: RunRecord) -> StoredRun {
        self.saw_carried(record.run_id, 0, record.created_at);
        StoredRun::whole(record, vec![])
    }

    /// What this handle last saw of `run_id`.
    fn seen(&self, run_id: RunId) -> Option<Seen> {
        (*self.seen.lock().unwrap_or_else(|p| p.into_inner())).filter(|s| s.run_id == run_id)
    }

    /// A handle whose writes name `worker` as the run's owner and store `traceparent` with any
    /// question they ask.
    pub fn owned_by(mut self, worker: &str, traceparent: Option<String>) -> Self {
        self.owner = Some(worker.to_owned());
        self.traceparent = traceparent;
        self
    }

    /// A handle whose `FAILED` end of a run is that of a dead-lettered job: the record is marked
    /// (`dead_letter`), and retention keeps the run as long as the letter is kept
    /// ([`RedisRunStore::purge_run`]) so that `delta dlq retry` finds it; a retry removes the
    /// mark.
    pub fn dead_lettering(mut self) -> Self {
        self.dead_letter = true;
        self
    }

    /// A handle whose retention ([`RedisRunStore::purge_run`]) keeps the run of a dead letter
    /// until `letters` after it failed, where finished runs are kept `retention`: so that a
    /// letter can be retried for as long as it is kept.
    pub fn keeping_letters(mut self, letters: Duration, retention: Duration) -> Self {
        self.letters_longer_us =
            i64::try_from(letters.saturating_sub(retention).as_micros()).unwrap_or(i64::MAX / 2);
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

    /// Whether this store is on a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.client.is_cluster()
    }

    /// How writes are made durable.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// The connection for one round trip (counted).
    fn connection(&self) -> Conn {
        self.trips.fetch_add(1, Ordering::Relaxed);
        self.conn.clone()
    }

    /// How many buckets the runs are spread over (`DELTA_REDIS_BUCKETS`).
    pub fn buckets(&self) -> u32 {
        self.buckets
    }

    /// The bucket of `run_id`.
    pub fn bucket(&self, run_id: RunId) -> u32 {
        bucket_of(id_text(&run_id, &mut [0; ID_LEN]), self.buckets)
    }

    /// The start of every key of bucket `k`: `<prefix>:{b<k>}`; the braces make it the hash tag,
    /// so that all of them live in one Redis Cluster slot.
    pub fn tag(&self, k: u32) -> String {
        let mut tag = String::new();
        self.write_tag(&mut tag, k);
        tag
    }

    /// Appends bucket `k`'s tag to `out`.
    fn write_tag(&self, out: &mut String, k: u32) {
        use std::fmt::Write as _;
        let _ = write!(out, "{}:{{b{k}}}", self.prefix);
    }

    /// The tag of `run_id`'s bucket: what the scripts get as their prefix.
    fn run_tag(&self, run_id: RunId) -> String {
        self.tag(self.bucket(run_id))
    }

    /// The index `name` (`runs:all`, `interactions:pending`, …) of bucket `k`.
    pub fn bucket_index(&self, k: u32, name: &str) -> String {
        format!("{}:{name}", self.tag(k))
    }

    /// The index `name` of the bucket `run_id` is in.
    pub fn run_index(&self, run_id: RunId, name: &str) -> String {
        self.bucket_index(self.bucket(run_id), name)
    }

    pub fn run_key(&self, run_id: RunId) -> String {
        self.run_key_and(run_id, "")
    }

    /// `run_id`'s record key followed by `suffix`, built in one string: every write and read of
    /// a run names a few of its keys, so they are not each formatted in steps.
    fn run_key_and(&self, run_id: RunId, suffix: &str) -> String {
        let mut buf = [0; ID_LEN];
        let id = id_text(&run_id, &mut buf);
        let mut key = String::with_capacity(self.prefix.len() + 20 + ID_LEN + suffix.len());
        self.write_tag(&mut key, bucket_of(id, self.buckets));
        for part in [":run:", id, suffix] {
            key.push_str(part);
        }
        key
    }

    fn journal_key(&self, run_id: RunId) -> String {
        self.run_key_and(run_id, ":journal")
    }

    /// Where builds before 2026-11-27 kept the run's latest snapshot (a string,
    /// `<seq>:<snapshot JSON>`); now in the record's `snap`. Read when a record has none,
    /// deleted when such a run finishes, and by retention.
    fn snapshot_key(&self, run_id: RunId) -> String {
        self.run_key_and(run_id, ":snap")
    }

    pub fn interaction_key(&self, run_id: RunId, request_id: &str) -> String {
        let mut key = self.run_key_and(run_id, ":ix:");
        key.push_str(request_id);
        key
    }

    /// One command per bucket (`add(pipe, k)` adds bucket `k`'s), all in one round trip: the
    /// replies in bucket order.
    async fn per_bucket<T: redis::FromRedisValue>(
        &self,
        add: impl Fn(&mut redis::Pipeline, u32),
    ) -> Result<Vec<T>, Error> {
        let mut pipe = redis::pipe();
        for k in 0..self.buckets {
            add(&mut pipe, k);
        }
        let mut conn = self.connection();
        pipe.query_async(&mut conn).await.map_err(backend)
    }

    /// A key of its own outside the buckets (`workers`, `ticket:…`, `buckets`): `<prefix>:<name>`.
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
        self.resolve_as(request, how, check_after, None)
            .await
            .map(|settled| settled.lost)
    }

    /// [`RedisRunStore::resolve`], and when this call won, the run and the question as the same
    /// script left them: what a resume job may carry ([`PausedRun`]) for its worker not to read
    /// them again. Only for a run with a snapshot (its worker reads nothing else), at most
    /// [`CARRIED_MAX_BYTES`] of their fields, and never for a sensitive question (a password's
    /// included): its sealed answer stays in Redis. A win also says whether the engine had
    /// reopened the question, which a caller's copy of it may predate.
    pub async fn resolve_carrying(
        &self,
        request: &InteractionRequest,
        how: Resolution<'_>,
        check_after: Duration,
    ) -> Result<Settlement, Error> {
        let carry = (!request.is_sensitive()).then_some(CARRIED_MAX_BYTES);
        self.resolve_as(request, how, check_after, carry).await
    }

    async fn resolve_as(
        &self,
        request: &InteractionRequest,
        how: Resolution<'_>,
        check_after: Duration,
        carry: Option<usize>,
    ) -> Result<Settlement, Error> {
        let run_id = request.run_id;
        let (state, json, now, by) = match how {
            Resolution::Answer(response, at) => {
                let stored = self.seal(request, response)?;
                (
                    InteractionState::Answered,
                    serde_json::to_string(&stored).unwrap_or_default(),
                    at,
                    response.responder.id.clone(),
                )
            }
            Resolution::Expired(at) => {
                (InteractionState::Expired, String::new(), at, String::new())
            }
        };
        let rid = request.request_id.to_string();
        let check_at = now.micros() + i64::try_from(check_after.as_micros()).unwrap_or(0);
        let mut inv = self.resolve.key(self.interaction_key(run_id, &rid));
        inv.key(self.run_key(run_id))
            .arg(state.as_str())
            .arg(json)
            .arg(now.to_string())
            .arg(self.run_tag(run_id))
            .arg(&rid)
            .arg(format!("{run_id}/{rid}"))
            .arg(check_at)
            .arg(by)
            .arg(Timestamp::now().micros())
            .arg(resolve_indexes(request))
            .arg(carry.map(|n| n.to_string()).unwrap_or_default());
        // Replicated, as every write to a run: an answer the gateway accepts must not be lost
        // at a failover (the caller's `sync` alone would not tell, see `invoke_replicated`).
        let (reply, replicated) = self.invoke_replicated::<redis::Value>(run_id, &inv).await;
        let reply = reply.and_then(|v| match v {
            // Won: what to carry is only a hint, and the answer is stored whatever it says.
            redis::Value::Array(_) => {
                type Pairs = Vec<(String, String)>;
                let carried: Option<(String, Pairs, Pairs)> =
                    redis::FromRedisValue::from_redis_value(v).ok();
                let paused = carried.map(|(_, record, question)| PausedRun {
                    record: record.into_iter().collect(),
                    question: question.into_iter().collect(),
                });
                let reopened = paused.as_ref().and_then(|p| {
                    let field = |name: &str| p.question.get(name).map(String::as_str);
                    Reopened::of(field("reopened_at"), field("job"))
                });
                Ok(Settling::Won(paused, reopened))
            }
            other => {
                let s: String = redis::FromRedisValue::from_redis_value(other)?;
                Ok(match s.strip_prefix("WON") {
                    Some("") => Settling::Won(None, None),
                    Some(reopen) if reopen.starts_with('|') => {
                        let mut parts = reopen[1..].splitn(2, '|');
                        Settling::Won(None, Reopened::of(parts.next(), parts.next()))
                    }
                    _ => Settling::Other(s),
                })
            }
        });
        match reply {
            Ok(Settling::Won(paused, reopened)) => replicated.map(|()| Settlement {
                lost: None,
                paused,
                reopened,
            }),
            Ok(Settling::Other(s)) if s.starts_with("CLAIMED|") => {
                let mut parts = s.splitn(3, '|').skip(1);
                let until = parts.next().unwrap_or_default();
                let by = parts.next().unwrap_or_default().to_owned();
                human::claim_of(by, until)
                    .map(|c| Err(Error::Claimed(c)))
                    .unwrap_or_else(|| Err(Error::Corrupt(format!("request {rid}: bad claim"))))
            }
            Ok(Settling::Other(s)) => Ok(Settlement {
                lost: Some(s.parse().map_err(Error::Corrupt)?),
                ..Settlement::default()
            }),
            Err(e) => Err(script_error(e, run_id)),
        }
    }

    /// The run a resume job carries ([`PausedRun`], read by the gateway's settling script), as
    /// [`RunStore::load_latest`] would read it, without a round trip: its record, its snapshot
    /// and no events after it, and the question's fields kept for the resume to read its answer.
    /// `None` (read the run from Redis instead) unless the record reads, its snapshot reads and
    /// ends at its `seq`, and the question is `request_id`'s. Only a hint: this handle's first
    /// write checks that the journal has not grown since, as after any read.
    pub fn adopt_paused(
        &self,
        run_id: RunId,
        request_id: RequestId,
        paused: &PausedRun,
    ) -> Option<StoredRun> {
        let mut hash: Fields = paused
            .record
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let snap = hash.remove("snap").filter(|s| !s.is_empty())?;
        let record = parse_record(run_id, &hash).ok()?;
        let seq: u64 = hash.get("seq")?.parse().ok()?;
        let ix: Fields = paused
            .question
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let question = request_text(ix.get("request")?)
            .ok()
            .and_then(|r| serde_json::from_str::<InteractionRequest>(&r).ok())?;
        if question.request_id != request_id || question.run_id != run_id {
            return None;
        }
        let (at, json) = snapshot_text(snap.as_bytes()).ok()?;
        if at != seq {
            return None;
        }
        let snapshot = Snapshot::decode(&json, seq, Some(&question)).ok()?;
        *self
            .prefetched
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((run_id, request_id, ix));
        self.saw_carried(run_id, seq, record.created_at);
        Some(StoredRun {
            record,
            journal: vec![],
            snapshot: Some(snapshot),
        })
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

    /// Opens the sealed parts of a stored answer to `request` (needs the secrets key when there
    /// are any). Only a sensitive request's answer was sealed here: the answer to any other is
    /// returned as given, even if it looks sealed (a person may type anything, and text that
    /// merely looks sealed must neither poison the run nor be opened).
    pub fn open(
        &self,
        request: &InteractionRequest,
        mut response: InteractionResponse,
    ) -> Result<InteractionResponse, Error> {
        if !request.is_sensitive() {
            return Ok(response);
        }
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
                Error::Corrupt(format!("interaction {ctx}: bad sealed data ({e})"))
            })?);
        }
        Ok(response)
    }

    /// The fencing token of the delivery that last wrote to a run (zero before any).
    pub async fn owner_fence(&self, run_id: RunId) -> Result<Fence, Error> {
        let mut conn = self.connection();
        let (s, n): (Option<u64>, Option<u64>) = redis::cmd("HMGET")
            .arg(self.run_key(run_id))
            .arg("fence_seq")
            .arg("fence_n")
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        Ok(Fence {
            stream_seq: s.unwrap_or(0),
            delivery: n.unwrap_or(0),
        })
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
                request,
                response: Some(r),
                ..
            }) => Ok(Some(self.open(&request, r)?)),
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
        Error::Corrupt(format!("interaction {request_id}: bad {what} ({e})"))
    };
    let request: InteractionRequest = serde_json::from_str(
        &request_text(h.get("request").map(String::as_str).unwrap_or(""))
            .map_err(|e| bad("request", e))?,
    )
    .map_err(|e| bad("request", e.to_string()))?;
    let state = h
        .get("state")
        .map(String::as_str)
        .unwrap_or("")
        .parse()
        .map_err(|e| bad("state", e))?;
    let (claim, votes) = human::claim_and_votes(h, Timestamp::now());
    let escalated = h.get("escalated").and_then(|n| n.parse().ok()).unwrap_or(0);
    // Only the last step carried out, marked by the script that carried it out (a build before
    // 2026-11-28 marks none: its steps were announced, or lost, then).
    let unannounced_step = h
        .get("escalated_unannounced")
        .and_then(|n| n.parse::<u32>().ok())
        .filter(|&k| k == escalated)
        .map(|_| {
            h.get("escalated_at")
                .and_then(|t| Timestamp::from_micros(t.parse().ok()?))
                .unwrap_or(request.timestamp)
        });
    let response = match h.get("response") {
        Some(r) => Some(serde_json::from_str(r).map_err(|e| bad("response", e.to_string()))?),
        None => None,
    };
    Ok(Some(StoredInteraction {
        request,
        state,
        response,
        answered_at: h.get("answered_at").and_then(|t| t.parse().ok()),
        reopened_at: h.get("reopened_at").and_then(|t| t.parse().ok()),
        resume_seq: h.get("resume_seq").and_then(|t| t.parse().ok()),
        asked_by_job: h.get("job").and_then(|t| t.parse().ok()),
        unannounced: h.contains_key("unannounced"),
        traceparent: h.get("traceparent").cloned(),
        claim,
        votes,
        escalated,
        unannounced_step,
        added_responders: h
            .get("added_responders")
            .and_then(|l| serde_json::from_str(l).ok())
            .unwrap_or_default(),
    }))
}

/// A Redis hash, or a stream entry's fields.
type Fields = HashMap<String, String>;

/// A journal entry's fields: bytes, as a packed entry's `z` is not text.
type EntryFields = HashMap<String, Vec<u8>>;

/// Journal entries as read from the stream, from seq `first` on, checked to be numbered from
/// there without a gap.
fn parse_entries(
    entries: &[(String, EntryFields)],
    first: u64,
) -> Result<Vec<JournalEvent>, Error> {
    let mut text = String::new();
    for (id, fields) in entries {
        entry_lines(id, |f| fields.get(f).map(Vec::as_slice), first, &mut text);
    }
    Ok(journal::parse_jsonl_from(&text, first)?.events)
}

/// Appends to `text` the journal lines of stream entry `id` (its fields read by `field`) whose
/// seq is `first` or more. An entry is one write: id `<last seq>-0`, `t` the time of the write,
/// and its events' JSON, one per line, without seq and time: in `b` as text, or packed in `z`
/// (`redis/packed.rs`). An older entry (and a note a script appends alone) is one event whole in
/// `e`, id `<seq>-0`.
pub(crate) fn entry_lines<'a>(
    id: &str,
    field: impl Fn(&str) -> Option<&'a [u8]>,
    first: u64,
    text: &mut String,
) {
    // Not an entry this store writes, or one that does not read: a line that does not parse,
    // so that the reader says so.
    let unreadable = |text: &mut String, why: &str| {
        tracing::warn!(entry = id, why, "a journal entry cannot be read");
        text.push_str("{}\n");
    };
    let utf8 = |f: &str| field(f).map(std::str::from_utf8);
    let last = id
        .split_once('-')
        .map_or(id, |(seq, _)| seq)
        .parse::<u64>()
        .unwrap_or(0);
    match utf8("e") {
        Some(Ok(e)) => {
            if last >= first {
                text.push_str(e);
                text.push('\n');
            }
            return;
        }
        Some(Err(_)) => return unreadable(text, "its event is not UTF-8"),
        None => {}
    }
    let Some(Ok(t)) = utf8("t") else {
        return unreadable(text, "no time");
    };
    let body = match (utf8("b"), field("z")) {
        (Some(Ok(b)), _) => std::borrow::Cow::Borrowed(b),
        (Some(Err(_)), _) => return unreadable(text, "its events are not UTF-8"),
        (None, Some(z)) => match packed::unpack(z) {
            Ok(lines) => std::borrow::Cow::Owned(lines),
            Err(why) => return unreadable(text, &format!("its packed events: {why}")),
        },
        _ => return unreadable(text, "no events"),
    };
    let n = body.split('\n').count() as u64;
    for (seq, line) in (last.saturating_add(1).saturating_sub(n)..).zip(body.split('\n')) {
        if seq < first {
            continue;
        }
        text.push_str(&format!("{{\"seq\":{seq},\"timestamp\":\"{t}\","));
        text.push_str(line.strip_prefix('{').unwrap_or(line));
        text.push('\n');
    }
}

/// A question's `request` as stored: its JSON, or `z:` and its JSON packed as a journal entry
/// is, in base64 (a fleet whose journal is packed: the hash's fields are text); the JSON, or why
/// it cannot be read.
fn request_text(stored: &str) -> Result<std::borrow::Cow<'_, str>, String> {
    match stored.strip_prefix("z:") {
        Some(b64) => unpack_base64(b64.as_bytes()).map(std::borrow::Cow::Owned),
        None => Ok(std::borrow::Cow::Borrowed(stored)),
    }
}

/// `text` packed as a journal entry is, in base64 without padding (a hash's fields are text): a
/// question's request, a snapshot in the record. `None` if it does not pack.
fn pack_base64(text: &str) -> Option<String> {
    use base64::Engine as _;
    packed::pack(text).map(|z| base64::engine::general_purpose::STANDARD_NO_PAD.encode(z))
}

/// What [`pack_base64`] made, unpacked.
fn unpack_base64(b64: &[u8]) -> Result<String, String> {
    use base64::Engine as _;
    let z = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(b64)
        .map_err(|e| format!("not base64: {e}"))?;
    packed::unpack(&z).map_err(|e| format!("packed: {e}"))
}

/// The JSON of a question's stored `request` (for tests that read Redis directly).
pub fn request_json(stored: &str) -> Result<String, String> {
    request_text(stored).map(std::borrow::Cow::into_owned)
}

/// A stored snapshot's seq and JSON: `<seq>:<json>`, or on a fleet whose journal is packed
/// `<seq>:b<packed json in base64>` (in the record's `snap`) or `<seq>:z<packed json>` (in its
/// own key, as builds before 2026-11-27 stored it); or why it cannot be read.
fn snapshot_text(stored: &[u8]) -> Result<(u64, String), String> {
    let colon = stored
        .iter()
        .position(|b| *b == b':')
        .ok_or_else(|| "no `<seq>:` in front".to_owned())?;
    let seq = std::str::from_utf8(&stored[..colon])
        .map_err(|_| "its seq is not text".to_owned())?
        .parse::<u64>()
        .map_err(|e| format!("its seq: {e}"))?;
    let body = &stored[colon + 1..];
    let json = match body.split_first() {
        Some((b'z', z)) => packed::unpack(z).map_err(|e| format!("packed: {e}"))?,
        Some((b'b', b64)) => unpack_base64(b64)?,
        _ => String::from_utf8(body.to_vec()).map_err(|_| "not UTF-8".to_owned())?,
    };
    Ok((seq, json))
}

/// The events' lines of a packed journal entry's `z` (for tests that read Redis directly, as
/// a search for what must not be stored in clear, and for fuzzing).
pub fn unpack_entry(z: &[u8]) -> Result<String, String> {
    packed::unpack(z)
}

/// `lines` as a packed journal entry's `z` (for tests and fuzzing).
pub fn pack_entry(lines: &str) -> Option<Vec<u8>> {
    packed::pack(lines)
}

/// The most a packed journal entry may unpack to.
pub const MAX_UNPACKED_ENTRY: usize = packed::MAX_UNPACKED;

fn backend(e: redis::RedisError) -> Error {
    Error::Backend(Box::new(e))
}

/// A write to `run_id` that no replica acknowledged within `ms` (replica durability).
fn not_replicated(run_id: RunId, ms: u64) -> Error {
    Error::Backend(
        format!(
            "no Redis replica acknowledged the write to run {run_id} within {ms} ms (DELTA_REDIS_DURABILITY=replica): not going on until its master has a replica again"
        )
        .into(),
    )
}

/// The store error a script's error reply `e` means for `run_id`.
fn script_error(e: redis::RedisError, run_id: RunId) -> Error {
    match ScriptError::of(&e) {
        Some(known) => known.into_error(run_id),
        None => backend(e),
    }
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
        ("submitted_by", &r.submitted_by),
    ] {
        if let Some(v) = v {
            f.push((k.into(), v.clone()));
        }
    }
    f
}

fn parse_record(run_id: RunId, h: &HashMap<String, String>) -> Result<RunRecord, Error> {
    let bad = |field: &str| {
        Error::Corrupt(format!(
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
        submitted_by: get("submitted_by"),
    })
}

impl AnswerStore for RedisRunStore {
    async fn settled(
        &self,
        run_id: RunId,
        request_id: RequestId,
    ) -> Result<Option<Settled>, Error> {
        let prefetched = self
            .prefetched
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take_if(|(run, rid, _)| *run == run_id && *rid == request_id)
            .map(|(_, _, h)| h);
        let ix = match prefetched {
            Some(h) => parse_interaction(request_id, &h)?,
            None => self.interaction(run_id, request_id).await?,
        };
        let Some(ix) = ix else {
            return Ok(None);
        };
        if ix.state != InteractionState::Pending {
            let mut settled = self
                .settled
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if !settled.contains(&(run_id, request_id)) {
                settled.push((run_id, request_id));
            }
        }
        Ok(Some(Settled {
            response: ix.response.map(|r| self.open(&ix.request, r)).transpose()?,
            answered_at: ix.answered_at,
            expired: ix.state == InteractionState::Expired,
            reopened_at: ix.reopened_at,
        }))
    }

    fn reopen(&self, run_id: RunId, q: &InteractionRequest) {
        self.settled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|s| *s != (run_id, q.request_id));
        let reopen = Reopen {
            run_id,
            request_id: q.request_id,
            asked_us: q.timestamp.micros(),
            expires_us: q.expires_at.map(|t| t.micros()),
            escalates: !q.escalation.is_empty(),
        };
        let mut reopening = self
            .reopening
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        reopening.retain(|r| r.run_id != run_id);
        reopening.push(reopen);
    }
}

impl RunStore for RedisRunStore {
    async fn sync(&self, run_id: RunId) -> Result<(), Error> {
        let timeout = match self.durability {
            Durability::WaitAof { timeout } => timeout,
            Durability::Replica { .. } => {
                // A write of its own in the run's slot, `WAIT` behind it: once a replica has it,
                // it has every earlier write the run's master holds.
                let script = Script::new(SYNC);
                let mut inv = script.key(self.run_key(run_id));
                inv.arg(Timestamp::now().to_string());
                let (reply, replicated) = self.invoke_replicated::<i64>(run_id, &inv).await;
                reply.map_err(|e| script_error(e, run_id))?;
                return replicated;
            }
            Durability::FsyncAlways | Durability::None => return Ok(()),
        };
        let mut conn = self.connection();
        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        // Every write sent on this (shared) connection to the run's master so far, this
        // handle's included.
        let wait = redis::cmd("WAITAOF").arg(1).arg(0).arg(ms).to_owned();
        let reply = conn
            .on_master_of(&self.run_key(run_id), &wait)
            .await
            .map_err(backend)?;
        let (local, _replicas): (i64, i64) = redis::FromRedisValue::from_redis_value(reply)
            .map_err(|e| Error::Corrupt(format!("WAITAOF replied {e}")))?;
        if local < 1 {
            return Err(Error::Backend(
                format!("Redis did not fsync its AOF within {ms} ms; not going on").into(),
            ));
        }
        Ok(())
    }

    fn new_request_id(&self, run_id: RunId) -> RequestId {
        // Drawn until it falls in the run's bucket (`buckets` draws on average), so that an
        // answer finds its run by asking one bucket, not all of them.
        let want = self.bucket(run_id);
        let mut id = RequestId::new();
        for _ in 0..self.buckets.saturating_mul(32) {
            if bucket_of(&id.to_string(), self.buckets) == want {
                break;
            }
            id = RequestId::new();
        }
        id
    }

    async fn create(&self, record: RunRecord) -> Result<(), Error> {
        match self.create_indexed(&record, None).await? {
            Submitted::Created => Ok(()),
            Submitted::Existing { .. } => Err(Error::AlreadyExists(record.run_id)),
        }
    }

    async fn load(&self, run_id: RunId) -> Result<StoredRun, Error> {
        let mut conn = self.connection();
        // One round trip: the record and the whole journal.
        let (hash, entries): (Fields, Vec<(String, EntryFields)>) = redis::pipe()
            .hgetall(self.run_key(run_id))
            .xrange_all(self.journal_key(run_id))
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        if hash.is_empty() {
            return Err(Error::NotFound(run_id));
        }
        let record = parse_record(run_id, &hash)?;
        let events = parse_entries(&entries, 1)?;
        self.saw(
            run_id,
            events.last().map_or(0, |e| e.seq),
            Some(record.created_at),
        );
        Ok(StoredRun::whole(record, events))
    }

    async fn load_latest(
        &self,
        run_id: RunId,
        asking: Option<RequestId>,
    ) -> Result<StoredRun, Error> {
        let mut conn = self.connection();
        type Reply = (
            Fields,
            Option<Vec<u8>>,
            Vec<(String, EntryFields)>,
            Option<String>,
            Fields,
        );
        let (mut hash, keyed, entries, rid, ix): Reply = self
            .load_latest
            .key(self.run_key(run_id))
            .key(self.journal_key(run_id))
            .key(self.snapshot_key(run_id))
            .arg(asking.map(|r| r.to_string()).unwrap_or_default())
            .invoke_async(&mut conn)
            .await
            .map_err(backend)?;
        if hash.is_empty() {
            return Err(Error::NotFound(run_id));
        }
        let snap = hash
            .remove("snap")
            .filter(|s| !s.is_empty())
            .map(String::into_bytes)
            .or(keyed);
        // The question the run waits on, read with the snapshot (which names it by its id).
        let question = ix
            .get("request")
            .filter(|_| snap.is_some())
            .and_then(|r| request_text(r).ok())
            .and_then(|r| serde_json::from_str::<InteractionRequest>(&r).ok());
        *self
            .prefetched
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            rid.and_then(|r| r.parse().ok()).map(|r| (run_id, r, ix));
        let Some(snap) = snap else {
            let record = parse_record(run_id, &hash)?;
            let events = parse_entries(&entries, 1)?;
            self.saw(
                run_id,
                events.last().map_or(0, |e| e.seq),
                Some(record.created_at),
            );
            return Ok(StoredRun::whole(record, events));
        };
        let stored_seq = hash.get("seq").and_then(|s| s.parse::<u64>().ok());
        let usable = snapshot_text(&snap)
            .and_then(|(seq, json)| Snapshot::decode(&json, seq, question.as_ref()))
            .and_then(|snapshot| {
                let events = parse_entries(&entries, snapshot.seq + 1)
                    .map_err(|e| format!("the events after it: {e}"))?;
                let last = events.last().map_or(snapshot.seq, |e| e.seq);
                if Some(last) != stored_seq {
                    return Err(format!(
                        "it and the events after it end at seq {last}, the record at {stored_seq:?}"
                    ));
                }
                Ok((snapshot, events))
            });
        match usable {
            Ok((snapshot, events)) => {
                let record = parse_record(run_id, &hash)?;
                let run = StoredRun {
                    record,
                    journal: events,
                    snapshot: Some(snapshot),
                };
                self.saw(run_id, run.last_seq(), Some(run.record.created_at));
                Ok(run)
            }
            Err(why) => {
                tracing::warn!(run = %run_id, why = %why, "the run's snapshot is not usable; replaying its whole journal");
                self.load(run_id).await
            }
        }
    }

    async fn append(
        &self,
        run_id: RunId,
        events: Vec<Event>,
        change: Option<StatusChange>,
    ) -> Result<Vec<JournalEvent>, Error> {
        self.append_with_snapshot(run_id, events, change, None)
            .await
    }

    fn keeps_snapshots(&self) -> bool {
        true
    }

    async fn confirm(&self, run_id: RunId) -> Result<(), Error> {
        if self.seen(run_id).is_some_and(|s| s.carried) {
            // Fenced like any write, and no event: the record's owner and fence are this
            // handle's from now on, as after its first write.
            self.append(run_id, vec![], None).await?;
        }
        Ok(())
    }

    async fn append_with_snapshot(
        &self,
        run_id: RunId,
        events: Vec<Event>,
        change: Option<StatusChange>,
        snapshot: Option<&Snapshot>,
    ) -> Result<Vec<JournalEvent>, Error> {
        let now = Timestamp::now();
        let seen = self.seen(run_id);
        let mut args = AppendArgs {
            now: now.to_string(),
            prefix: self.run_tag(run_id),
            created_us: now.micros().to_string(),
            owner: self.owner.clone().unwrap_or_default(),
            traceparent: self.traceparent.clone().unwrap_or_default(),
            seen_len: seen.map(|s| s.len.to_string()).unwrap_or_default(),
            run_us: seen
                .and_then(|s| s.created_us)
                .map(|us| us.to_string())
                .unwrap_or_default(),
            single: if self.journal == JournalMode::Single {
                "1"
            } else {
                ""
            }
            .to_owned(),
            ..AppendArgs::default()
        };
        if let Some(f) = self.fence {
            args.fence_seq = f.stream_seq.to_string();
            args.fence_n = f.delivery.to_string();
        }
        if let Some(snap) = snapshot {
            args.snap_seq = snap.seq.to_string();
        }
        args.settled = self
            .settled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter(|(run, _)| *run == run_id)
            .map(|(_, rid)| rid.to_string())
            .collect::<Vec<_>>()
            .join(" ");
        if let Some(c) = &change {
            args.status = c.status().as_str().to_owned();
            match c {
                StatusChange::Waiting(q) => {
                    args.pending = q.request_id.to_string();
                    args.request = serde_json::to_string(q).unwrap_or_default();
                    if self.journal == JournalMode::Packed
                        && let Some(b64) = pack_base64(&args.request)
                    {
                        args.request = format!("z:{b64}");
                    }
                    args.asked_us = q.timestamp.micros().to_string();
                    args.expires_us = q
                        .expires_at
                        .map(|t| t.micros().to_string())
                        .unwrap_or_default();
                    args.escalate_us = q
                        .escalation
                        .first()
                        .map(|s| {
                            (q.timestamp.micros()
                                + i64::try_from(s.after.as_micros()).unwrap_or(i64::MAX / 2))
                            .to_string()
                        })
                        .unwrap_or_default();
                }
                StatusChange::Finished {
                    status,
                    result,
                    error,
                } => {
                    args.finished = "1".to_owned();
                    args.result = opt(result);
                    args.err_text = opt(error);
                    if self.dead_letter && *status == crate::Terminal::Failed {
                        args.dead_letter = "1".to_owned();
                    }
                }
                _ => {}
            }
        }
        let reopen = self
            .reopening
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .find(|r| r.run_id == run_id)
            .cloned();
        if let Some(r) = &reopen {
            args.reopen = r.request_id.to_string();
            args.reopen_asked_us = r.asked_us.to_string();
            args.reopen_expires_us = r.expires_us.map(|us| us.to_string()).unwrap_or_default();
            args.reopen_escalates = if r.escalates { "1" } else { "" }.to_owned();
        }
        let ix_key = self.interaction_key(
            run_id,
            if args.pending.is_empty() {
                "none"
            } else {
                &args.pending
            },
        );
        let mut inv = self.append.key(self.run_key(run_id));
        inv.key(self.journal_key(run_id))
            .key(ix_key)
            .key(self.snapshot_key(run_id));
        // `{"type":…,"payload":…}` each: the entry holds their seq and timestamp once.
        let lines = events
            .iter()
            .map(|e| serde_json::to_string(e).unwrap_or_default());
        let packed = match self.journal {
            JournalMode::Packed if !events.is_empty() => {
                packed::pack(&lines.clone().collect::<Vec<_>>().join("\n"))
            }
            _ => None,
        };
        if packed.is_some() {
            args.packed = events.len().to_string();
            args.asked = events
                .iter()
                .filter_map(|e| match e {
                    Event::HumanInputRequest(q) => Some(q.request_id.to_string()),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join(" ");
        }
        // The snapshot, packed along with the journal (its JSON is mostly the events' own words),
        // in base64: the record's fields are text.
        if let Some(snap) = snapshot {
            let json = snap.encode();
            let b64 = match self.journal {
                JournalMode::Packed => pack_base64(&json),
                _ => None,
            };
            args.snap = match b64 {
                Some(b64) => format!("{}:b{b64}", snap.seq),
                None => format!("{}:{json}", snap.seq),
            };
        }
        for a in args.into_argv() {
            inv.arg(a);
        }
        match packed {
            Some(blob) => {
                inv.arg(blob);
            }
            None => {
                for line in lines {
                    inv.arg(line);
                }
            }
        }
        let (last, replicated) = self.invoke_replicated::<u64>(run_id, &inv).await;
        let last = last.map_err(|e| script_error(e, run_id))?;
        self.saw(run_id, last, None);
        if let Some(r) = reopen {
            // Done with this write, whether the question was still answered or not.
            self.reopening
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .retain(|o| *o != r);
        }
        replicated?;
        let first = last + 1 - events.len() as u64;
        Ok(numbered(events, first, now))
    }
}

#[cfg(test)]
mod tests {
    use super::{ID_LEN, bucket_of, id_text};
    use delta_protocol::RunId;

    /// Keys are built from a run id's text written on the stack: the same text as its
    /// `Display`, so the same bucket and keys as every build before.
    #[test]
    fn a_run_ids_key_text_is_its_display() {
        for _ in 0..100 {
            let run = RunId::new();
            let text = run.to_string();
            assert_eq!(id_text(&run, &mut [0; ID_LEN]), text);
            assert_eq!(
                bucket_of(id_text(&run, &mut [0; ID_LEN]), 64),
                bucket_of(&text, 64)
            );
        }
        let run: RunId = "0192F1C4-8A3B-7C2D-9E4F-5A6B7C8D9E0F".parse().unwrap();
        assert_eq!(
            id_text(&run, &mut [0; ID_LEN]),
            "0192f1c4-8a3b-7c2d-9e4f-5a6b7c8d9e0f"
        );
    }

    /// Where every key lives follows from the bucket hash: these values must never change
    /// (32-bit FNV-1a reference values, and a run id's bucket as stored).
    #[test]
    fn the_bucket_hash_is_fnv1a_and_never_changes() {
        assert_eq!(bucket_of("", u32::MAX), 0x811c_9dc5);
        assert_eq!(bucket_of("a", u32::MAX), 0xe40c_292c);
        assert_eq!(bucket_of("foobar", u32::MAX), 0xbf9c_f968);
        let run = "0192f1c4-8a3b-7c2d-9e4f-5a6b7c8d9e0f";
        assert_eq!(bucket_of(run, 16), 1);
        assert_eq!(bucket_of(run, 256), 33);
        assert_eq!(bucket_of("anything", 1), 0);
    }
}
