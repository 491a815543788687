//! A2A push-notification configs (docs/protocols.md "A2A"): where a task's status changes are
//! posted. The only state the A2A server keeps besides the runs themselves, in Redis like the
//! rest, so that any gateway serves any request and delivers any config.
//!
//! The push keys share one hash tag, `{a2a}` (one Redis Cluster slot: the scripts touch several):
//!
//! - `<prefix>:{a2a}:pushes`: a set of `<task_id>/<config_id>`, for the delivery loop.
//! - `<prefix>:{a2a}:push:<task_id>`: a hash of the task's configs, `config_id` → JSON.
//! - `<prefix>:{a2a}:push-owners`: a hash, owner → how many configs they have (the per-caller
//!   limit).
//! - `<prefix>:{a2a}:push-failing:<task_id>/<config_id>`: `<event id> <µs>`, when the delivery of
//!   the event being retried first failed (`DELTA_WEBHOOK_DISABLE_AFTER` counts from there).
//! - `<prefix>:a2a:msg:<hash>`: the question a caller's message answered (a retry of the message
//!   is recognised), for an hour.
//!
//! Writes are Lua scripts: the owner check, the limits and the write are one step.
//!
//! A config's `token` (echoed to the receiver in `X-A2A-Notification-Token`) is stored sealed
//! with `DELTA_SECRETS_KEY`, bound to the task and config ids: a Redis dump shows no token.

use serde::{Deserialize, Serialize};

use delta_protocol::Timestamp;

use super::{RedisRunStore, backend};
use crate::Error;

/// One push-notification config of one task.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct A2aPushConfig {
    /// Its id, unique within the task (the client's, or one given).
    pub id: String,
    /// The task (run) it follows.
    pub task_id: String,
    /// Where notifications are posted.
    pub url: String,
    /// The token sealed, if the client gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed_token: Option<String>,
    /// Who set it (the token's name), if anyone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
    pub created_at: Timestamp,
    /// Whether its URL may be one of `DELTA_WEBHOOK_ALLOW`'s exceptions (private addresses,
    /// plain HTTP to a named host): only when an operator set it. Anyone else's may reach public
    /// addresses only (docs/security.md: the exceptions are for the operators' own receivers).
    /// `None` for a config stored before 2026-11-28: its creator's roles decide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_listed: Option<bool>,
}

impl std::fmt::Debug for A2aPushConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("A2aPushConfig")
            .field("id", &self.id)
            .field("task_id", &self.task_id)
            .field("token", &self.sealed_token.as_ref().map(|_| "…"))
            .finish_non_exhaustive()
    }
}

/// The limits on push configs ([`RedisRunStore::a2a_put_push`]).
#[derive(Clone, Copy, Debug)]
pub struct PushLimits {
    /// Configs of one caller on one task.
    pub per_task: usize,
    /// Configs of one caller on the fleet.
    pub per_caller: usize,
    /// Configs on the fleet.
    pub fleet: usize,
}

/// What [`RedisRunStore::a2a_put_push`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutPush {
    Stored,
    /// The id is another caller's config on this task.
    Taken,
    /// The caller has `per_task` configs on the task.
    TaskFull,
    /// The caller has `per_caller` configs on the fleet.
    CallerFull,
    /// The fleet has `fleet` configs.
    FleetFull,
}

/// What [`RedisRunStore::a2a_delete_push`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeletePush {
    Deleted,
    NotFound,
    /// Someone else's, and the caller is no operator.
    NotYours,
}

/// A config's owner as the scripts compare it: the token's name, `-` for nobody (auth off).
fn owner(created_by: Option<&str>) -> String {
    created_by.map_or_else(|| "-".to_owned(), |n| format!("n:{n}"))
}

/// KEYS: the task's hash, the fleet's set, the owners' counts. ARGV: id, JSON, set member,
/// owner, operator (1/0), limits per task (per caller), per caller, fleet.
const PUT_PUSH: &str = r#"
local function owner_of(json)
  local ok, c = pcall(cjson.decode, json)
  if ok and type(c) == 'table' and type(c.created_by) == 'string' then
    return 'n:' .. c.created_by
  end
  return '-'
end
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old then
  local was = owner_of(old)
  if was ~= ARGV[4] and ARGV[5] ~= '1' then return 'taken' end
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  if was ~= ARGV[4] then
    redis.call('HINCRBY', KEYS[3], was, -1)
    redis.call('HINCRBY', KEYS[3], ARGV[4], 1)
  end
  return 'ok'
end
local mine = 0
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do
  if owner_of(v) == ARGV[4] then mine = mine + 1 end
end
if mine >= tonumber(ARGV[6]) then return 'task' end
if tonumber(redis.call('HGET', KEYS[3], ARGV[4]) or '0') >= tonumber(ARGV[7]) then return 'caller' end
if redis.call('SCARD', KEYS[2]) >= tonumber(ARGV[8]) then return 'fleet' end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('SADD', KEYS[2], ARGV[3])
redis.call('HINCRBY', KEYS[3], ARGV[4], 1)
return 'ok'
"#;

/// KEYS: the task's hash, the fleet's set, the owners' counts, the config's failures. ARGV: id,
/// set member, who asks, check the owner (1/0). 1 deleted, 0 none, -1 someone else's.
const DELETE_PUSH: &str = r#"
local old = redis.call('HGET', KEYS[1], ARGV[1])
if not old then
  redis.call('SREM', KEYS[2], ARGV[2])
  return 0
end
local ok, c = pcall(cjson.decode, old)
local was = '-'
if ok and type(c) == 'table' and type(c.created_by) == 'string' then was = 'n:' .. c.created_by end
if ARGV[4] == '1' and was ~= ARGV[3] then return -1 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('SREM', KEYS[2], ARGV[2])
redis.call('DEL', KEYS[4])
if tonumber(redis.call('HINCRBY', KEYS[3], was, -1)) <= 0 then redis.call('HDEL', KEYS[3], was) end
return 1
"#;

/// KEYS: the config's failures. ARGV: event id, now (µs), TTL (s). The first failure's time.
const FAILING: &str = r#"
local v = redis.call('GET', KEYS[1])
if v then
  local sp = string.find(v, ' ', 1, true)
  if sp and string.sub(v, 1, sp - 1) == ARGV[1] then return tonumber(string.sub(v, sp + 1)) end
end
redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. ARGV[2], 'EX', ARGV[3])
return tonumber(ARGV[2])
"#;

fn seal_context(task_id: &str, id: &str) -> String {
    format!("a2a-push:{task_id}/{id}")
}

impl RedisRunStore {
    /// A push config key: all of them under one hash tag (`{a2a}`), so that the scripts that
    /// touch several (a config, the set, the owners' counts) run on a Redis Cluster too.
    fn a2a_key(&self, name: &str) -> String {
        format!("{}:{{a2a}}:{name}", self.prefix())
    }

    fn a2a_pushes_key(&self) -> String {
        self.a2a_key("pushes")
    }

    fn a2a_push_key(&self, task_id: &str) -> String {
        self.a2a_key(&format!("push:{task_id}"))
    }

    fn a2a_owners_key(&self) -> String {
        self.a2a_key("push-owners")
    }

    fn a2a_failing_key(&self, task_id: &str, id: &str) -> String {
        self.a2a_key(&format!("push-failing:{task_id}/{id}"))
    }

    /// Seals a config's token (needs `DELTA_SECRETS_KEY`).
    pub fn a2a_seal_token(&self, task_id: &str, id: &str, token: &str) -> Result<String, Error> {
        let key = self.secrets.as_ref().ok_or(Error::NoSecretsKey)?;
        Ok(key.seal(&seal_context(task_id, id), token)?)
    }

    /// Opens a config's token.
    pub fn a2a_open_token(&self, c: &A2aPushConfig) -> Result<Option<String>, Error> {
        let Some(sealed) = &c.sealed_token else {
            return Ok(None);
        };
        let key = self.secrets.as_ref().ok_or(Error::NoSecretsKey)?;
        Ok(Some(key.open(&seal_context(&c.task_id, &c.id), sealed)?))
    }

    /// Stores (or replaces) a config, atomically checking its owner and the limits:
    /// `max_task` configs of one caller on one task, `max_caller` of one caller on the fleet,
    /// `max_fleet` in all. `operator`: may replace a config someone else made.
    pub async fn a2a_put_push(
        &self,
        c: &A2aPushConfig,
        operator: bool,
        limits: PushLimits,
    ) -> Result<PutPush, Error> {
        let json = serde_json::to_string(c).map_err(|e| Error::Backend(Box::new(e)))?;
        let script = redis::Script::new(PUT_PUSH);
        let mut inv = script.key(self.a2a_push_key(&c.task_id));
        inv.key(self.a2a_pushes_key())
            .key(self.a2a_owners_key())
            .arg(&c.id)
            .arg(json)
            .arg(format!("{}/{}", c.task_id, c.id))
            .arg(owner(c.created_by.as_deref()))
            .arg(if operator { "1" } else { "0" })
            .arg(limits.per_task)
            .arg(limits.per_caller)
            .arg(limits.fleet);
        let mut conn = self.connection();
        let r: String = inv.invoke_async(&mut conn).await.map_err(backend)?;
        Ok(match r.as_str() {
            "ok" => PutPush::Stored,
            "taken" => PutPush::Taken,
            "task" => PutPush::TaskFull,
            "caller" => PutPush::CallerFull,
            _ => PutPush::FleetFull,
        })
    }

    /// One config of a task.
    pub async fn a2a_push(&self, task_id: &str, id: &str) -> Result<Option<A2aPushConfig>, Error> {
        let mut conn = self.connection();
        let json: Option<String> = redis::cmd("HGET")
            .arg(self.a2a_push_key(task_id))
            .arg(id)
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        Ok(json.and_then(|j| serde_json::from_str(&j).ok()))
    }

    /// Every config of a task, sorted by id.
    pub async fn a2a_pushes_of(&self, task_id: &str) -> Result<Vec<A2aPushConfig>, Error> {
        let mut conn = self.connection();
        let all: Vec<String> = redis::cmd("HVALS")
            .arg(self.a2a_push_key(task_id))
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        let mut out: Vec<A2aPushConfig> = all
            .iter()
            .filter_map(|j| serde_json::from_str(j).ok())
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// Deletes a config, atomically: `by` is who asks (`None`: anyone may, as the delivery loop
    /// and operators do).
    pub async fn a2a_delete_push(
        &self,
        task_id: &str,
        id: &str,
        by: Option<Option<&str>>,
    ) -> Result<DeletePush, Error> {
        let script = redis::Script::new(DELETE_PUSH);
        let mut inv = script.key(self.a2a_push_key(task_id));
        inv.key(self.a2a_pushes_key())
            .key(self.a2a_owners_key())
            .key(self.a2a_failing_key(task_id, id))
            .arg(id)
            .arg(format!("{task_id}/{id}"))
            .arg(by.map(owner).unwrap_or_default())
            .arg(if by.is_some() { "1" } else { "0" });
        let mut conn = self.connection();
        let r: i64 = inv.invoke_async(&mut conn).await.map_err(backend)?;
        Ok(match r {
            1 => DeletePush::Deleted,
            -1 => DeletePush::NotYours,
            _ => DeletePush::NotFound,
        })
    }

    /// When the delivery of event `event_id` to a config first failed: now, unless an earlier
    /// failure of the same event is recorded (kept `ttl`).
    pub async fn a2a_push_failing_since(
        &self,
        task_id: &str,
        id: &str,
        event_id: &str,
        now: Timestamp,
        ttl: std::time::Duration,
    ) -> Result<Timestamp, Error> {
        let script = redis::Script::new(FAILING);
        let mut inv = script.key(self.a2a_failing_key(task_id, id));
        inv.arg(event_id)
            .arg(now.micros())
            .arg(ttl.as_secs().max(1));
        let mut conn = self.connection();
        let since: i64 = inv.invoke_async(&mut conn).await.map_err(backend)?;
        Ok(Timestamp::from_micros(since).unwrap_or(now))
    }

    /// Forgets a config's failures (an event was delivered).
    pub async fn a2a_push_delivered(&self, task_id: &str, id: &str) -> Result<(), Error> {
        let mut conn = self.connection();
        redis::cmd("DEL")
            .arg(self.a2a_failing_key(task_id, id))
            .query_async::<()>(&mut conn)
            .await
            .map_err(backend)
    }

    /// Records that message `key` (a caller's `messageId`, hashed) answers question
    /// `request_id`, for `ttl`; the question it was recorded for before, if any (a retry).
    pub async fn a2a_message_answers(
        &self,
        key: &str,
        request_id: &str,
        ttl: std::time::Duration,
    ) -> Result<Option<String>, Error> {
        let mut conn = self.connection();
        let k = self.index(&format!("a2a:msg:{key}"));
        let set: Option<String> = redis::cmd("SET")
            .arg(&k)
            .arg(request_id)
            .arg("NX")
            .arg("EX")
            .arg(ttl.as_secs().max(1))
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        if set.is_some() {
            return Ok(None);
        }
        let before: Option<String> = redis::cmd("GET")
            .arg(&k)
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        Ok(before)
    }

    /// Forgets message `key` (its answer was refused: a retry is a new attempt).
    pub async fn a2a_message_forget(&self, key: &str) -> Result<(), Error> {
        let mut conn = self.connection();
        redis::cmd("DEL")
            .arg(self.index(&format!("a2a:msg:{key}")))
            .query_async::<()>(&mut conn)
            .await
            .map_err(backend)
    }

    /// Every config of the fleet, as `(task_id, config_id)`.
    pub async fn a2a_all_pushes(&self) -> Result<Vec<(String, String)>, Error> {
        let mut conn = self.connection();
        let all: Vec<String> = redis::cmd("SMEMBERS")
            .arg(self.a2a_pushes_key())
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        Ok(all
            .into_iter()
            .filter_map(|m| m.split_once('/').map(|(t, i)| (t.to_owned(), i.to_owned())))
            .collect())
    }
}
