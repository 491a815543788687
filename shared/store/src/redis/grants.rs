//! Scoped grants in Redis ([`GrantStore`]).
//!
//! ```text
//! <p>:{g:<agent>}:grant:<grant_id>  hash  `grant` (its definition, JSON), `uses`, `max_uses` ('' for
//!                                         unlimited), `expires_us` ('' for never), `revoked_at`,
//!                                         `revoked_by`, and `use:<run_id>/<action_id>` per call that
//!                                         took a use of a grant with `max_uses`
//! <p>:{g:<agent>}:grants            zset  the agent's grant ids by creation time (µs)
//! <p>:grant-agents                  hash  grant id → agent (for revoking and reading by id)
//! ```
//!
//! A grant of scope `agent` is read by every run of its agent, on any bucket: so an agent's
//! grants share their own hash tag `{g:<agent>}`, not a run's bucket, and each step on a grant
//! (store, use, revoke) is one Lua script on one slot, on one Redis as on a Redis Cluster. Use and
//! revocation are scripts on the same key, so a use after a revocation always sees it.
//! `grant-agents` is written before the grant is stored and touched by no script.
//!
//! Retention ([`RedisRunStore::purge_grants`], from the gateways' retention reconciler): a grant
//! revoked or expired before the cut-off is deleted once the run that made it is gone, and so is
//! a grant of scope `run` whose run is gone (retention deleted it). While that run exists its
//! approval may be replayed (a resume after a crash, a dead letter retried), and a replay finding
//! no key would store the grant again, unrevoked. A grant of scope `agent` that is live stays
//! however old.

use redis::Script;

use super::{RedisRunStore, backend};
use crate::Error;
use crate::grants::{GrantStore, Unusable};
use delta_protocol::grant::{Grant, GrantScope};
use delta_protocol::{RequestId, RunId, Timestamp};

/// Stores a grant unless its key exists. KEYS: the grant, the agent's index. ARGV: definition
/// JSON, created µs, expires µs (or ''), max uses (or ''), grant id. Returns 1 when stored.
const PUT: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'grant', ARGV[1], 'uses', 0, 'expires_us', ARGV[3], 'max_uses', ARGV[4])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[5])
return 1
"#;

/// Takes one use of a grant for one call. KEYS: the grant. ARGV: now (µs), the call's use key.
/// Returns {state, definition, uses}: state `OK`, `NOTFOUND`, `REVOKED`, `EXPIRED` or `USED_UP`.
const USE: &str = r#"
local def = redis.call('HGET', KEYS[1], 'grant')
if not def then return {'NOTFOUND', '', '0'} end
local uses = redis.call('HGET', KEYS[1], 'uses') or '0'
if redis.call('HEXISTS', KEYS[1], 'revoked_at') == 1 then return {'REVOKED', def, uses} end
local exp = redis.call('HGET', KEYS[1], 'expires_us')
if exp and exp ~= '' and tonumber(ARGV[1]) >= tonumber(exp) then return {'EXPIRED', def, uses} end
local max = redis.call('HGET', KEYS[1], 'max_uses')
if max and max ~= '' then
  -- A replayed call that took its use already keeps it, and takes no second one.
  if redis.call('HEXISTS', KEYS[1], 'use:' .. ARGV[2]) == 1 then return {'OK', def, uses} end
  if tonumber(uses) >= tonumber(max) then return {'USED_UP', def, uses} end
  redis.call('HSET', KEYS[1], 'use:' .. ARGV[2], ARGV[1])
end
uses = redis.call('HINCRBY', KEYS[1], 'uses', 1)
return {'OK', def, tostring(uses)}
"#;

/// Revokes a grant (the first revocation stays). KEYS: the grant. ARGV: now (ISO), by whom.
/// Returns 0 when there is no such grant.
const REVOKE: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('HEXISTS', KEYS[1], 'revoked_at') == 0 then
  redis.call('HSET', KEYS[1], 'revoked_at', ARGV[1], 'revoked_by', ARGV[2])
end
return 1
"#;

/// The fields a grant is read from, in this order.
const FIELDS: [&str; 4] = ["grant", "uses", "revoked_at", "revoked_by"];

impl RedisRunStore {
    /// `<p>:{g:<agent>}`: the hash tag every key of the agent's grants starts with.
    fn grant_tag(&self, agent: &str) -> String {
        format!("{}:{{g:{agent}}}", self.prefix)
    }

    fn grant_key(&self, agent: &str, id: RequestId) -> String {
        format!("{}:grant:{id}", self.grant_tag(agent))
    }

    fn grant_index(&self, agent: &str) -> String {
        format!("{}:grants", self.grant_tag(agent))
    }

    /// The agent a grant id belongs to.
    async fn grant_agent(&self, id: RequestId) -> Result<Option<String>, Error> {
        let mut conn = self.connection();
        redis::cmd("HGET")
            .arg(self.index("grant-agents"))
            .arg(id.to_string())
            .query_async(&mut conn)
            .await
            .map_err(backend)
    }

    /// The grants `ids` of `agent`, as stored (missing ones left out), in one round trip.
    async fn read_grants(&self, agent: &str, ids: &[String]) -> Result<Vec<Grant>, Error> {
        if ids.is_empty() {
            return Ok(vec![]);
        }
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.cmd("HMGET")
                .arg(format!("{}:grant:{id}", self.grant_tag(agent)))
                .arg(&FIELDS[..]);
        }
        let mut conn = self.connection();
        let rows: Vec<Vec<Option<String>>> = pipe.query_async(&mut conn).await.map_err(backend)?;
        let mut out = vec![];
        for row in rows {
            let mut row = row.into_iter();
            let (Some(Some(def)), uses, revoked_at, revoked_by) = (
                row.next(),
                row.next().flatten(),
                row.next().flatten(),
                row.next().flatten(),
            ) else {
                continue;
            };
            out.push(parse_grant(&def, uses.as_deref(), revoked_at, revoked_by)?);
        }
        Ok(out)
    }
}

/// A grant from its stored definition and its changing fields.
fn parse_grant(
    def: &str,
    uses: Option<&str>,
    revoked_at: Option<String>,
    revoked_by: Option<String>,
) -> Result<Grant, Error> {
    let mut g: Grant = serde_json::from_str(def)
        .map_err(|e| Error::Corrupt(format!("a stored grant does not parse: {e}")))?;
    g.uses = uses.and_then(|u| u.parse().ok()).unwrap_or(0);
    g.revoked_at = revoked_at.and_then(|t| t.parse().ok());
    g.revoked_by = revoked_by;
    Ok(g)
}

impl RedisRunStore {
    /// Deletes the grants that approve nothing any more and whose run no longer exists: revoked
    /// or expired at or before `before_us`, or of scope `run`. A revoked grant of a run that
    /// exists is kept (a replay of its approval must find it revoked). Returns how many it
    /// deleted. Idempotent; a grant revoked meanwhile is simply deleted later.
    pub async fn purge_grants(&self, before_us: i64) -> Result<usize, Error> {
        let all = self.grants(None).await?;
        if all.is_empty() {
            return Ok(0);
        }
        let mut exists = redis::pipe();
        for g in &all {
            exists.exists(self.run_key(g.run_id));
        }
        let mut conn = self.connection();
        let runs: Vec<bool> = exists.query_async(&mut conn).await.map_err(backend)?;
        let now = Timestamp::now();
        let mut gone = 0;
        for (g, run_exists) in all.iter().zip(runs) {
            let ended = g
                .revoked_at
                .or(g.expires_at.filter(|e| *e <= now))
                .is_some_and(|t| t.micros() <= before_us);
            if run_exists || !(ended || g.scope == GrantScope::Run) {
                continue;
            }
            let mut conn = self.connection();
            let _: () = redis::pipe()
                .del(self.grant_key(&g.agent, g.grant_id))
                .ignore()
                .zrem(self.grant_index(&g.agent), g.grant_id.to_string())
                .ignore()
                .query_async(&mut conn)
                .await
                .map_err(backend)?;
            let _: () = redis::cmd("HDEL")
                .arg(self.index("grant-agents"))
                .arg(g.grant_id.to_string())
                .query_async(&mut conn)
                .await
                .map_err(backend)?;
            gone += 1;
        }
        Ok(gone)
    }
}

impl GrantStore for RedisRunStore {
    async fn put_grant(&self, grant: &Grant) -> Result<bool, Error> {
        let mut conn = self.connection();
        let _: () = redis::cmd("HSETNX")
            .arg(self.index("grant-agents"))
            .arg(grant.grant_id.to_string())
            .arg(&grant.agent)
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        let mut def = grant.clone();
        def.uses = 0;
        def.revoked_at = None;
        def.revoked_by = None;
        let script = Script::new(PUT);
        let mut inv = script.key(self.grant_key(&grant.agent, grant.grant_id));
        inv.key(self.grant_index(&grant.agent))
            .arg(serde_json::to_string(&def).unwrap_or_default())
            .arg(grant.created_at.micros())
            .arg(
                grant
                    .expires_at
                    .map(|t| t.micros().to_string())
                    .unwrap_or_default(),
            )
            .arg(grant.max_uses.map(|m| m.to_string()).unwrap_or_default())
            .arg(grant.grant_id.to_string());
        let (stored, replicated) = self.invoke_replicated::<i64>(grant.run_id, &inv).await;
        let stored = stored.map_err(backend)?;
        replicated?;
        Ok(stored == 1)
    }

    async fn grant(&self, id: RequestId) -> Result<Option<Grant>, Error> {
        let Some(agent) = self.grant_agent(id).await? else {
            return Ok(None);
        };
        Ok(self
            .read_grants(&agent, &[id.to_string()])
            .await?
            .into_iter()
            .next())
    }

    async fn grants(&self, agent: Option<&str>) -> Result<Vec<Grant>, Error> {
        let agents: Vec<String> = match agent {
            Some(a) => vec![a.to_owned()],
            None => {
                let mut conn = self.connection();
                let mut all: Vec<String> = redis::cmd("HVALS")
                    .arg(self.index("grant-agents"))
                    .query_async(&mut conn)
                    .await
                    .map_err(backend)?;
                all.sort();
                all.dedup();
                all
            }
        };
        let mut out = vec![];
        for a in agents {
            let mut conn = self.connection();
            let ids: Vec<String> = redis::cmd("ZRANGE")
                .arg(self.grant_index(&a))
                .arg(0)
                .arg(-1)
                .query_async(&mut conn)
                .await
                .map_err(backend)?;
            out.extend(self.read_grants(&a, &ids).await?);
        }
        out.sort_by_key(|g| (g.created_at, g.grant_id));
        Ok(out)
    }

    async fn use_grant(
        &self,
        agent: &str,
        id: RequestId,
        run_id: RunId,
        action_id: &str,
        now: Timestamp,
    ) -> Result<Result<Grant, Unusable>, Error> {
        let script = Script::new(USE);
        let mut inv = script.key(self.grant_key(agent, id));
        inv.arg(now.micros()).arg(format!("{run_id}/{action_id}"));
        // A use must not be lost at a failover either (the call would take another): replicated
        // as a run's writes are, when the store is set so.
        let (reply, replicated) = self
            .invoke_replicated::<(String, String, String)>(run_id, &inv)
            .await;
        let (state, def, uses) = reply.map_err(backend)?;
        replicated?;
        let why = match state.as_str() {
            "OK" => None,
            "NOTFOUND" => return Ok(Err(Unusable::NotFound)),
            "REVOKED" => Some(Unusable::Revoked),
            "EXPIRED" => Some(Unusable::Expired),
            "USED_UP" => Some(Unusable::UsedUp),
            other => {
                return Err(Error::Corrupt(format!(
                    "the grant script replied `{other}`"
                )));
            }
        };
        if let Some(why) = why {
            return Ok(Err(why));
        }
        Ok(Ok(parse_grant(&def, Some(&uses), None, None)?))
    }

    async fn revoke_grant(
        &self,
        id: RequestId,
        by: &str,
        now: Timestamp,
    ) -> Result<Option<Grant>, Error> {
        let Some(before) = self.grant(id).await? else {
            return Ok(None);
        };
        let script = Script::new(REVOKE);
        let mut inv = script.key(self.grant_key(&before.agent, id));
        inv.arg(now.to_string()).arg(by);
        // Replicated: a revocation acknowledged must not come undone at a failover.
        let (done, replicated) = self.invoke_replicated::<i64>(before.run_id, &inv).await;
        if done.map_err(backend)? == 0 {
            return Ok(None);
        }
        replicated?;
        self.grant(id).await
    }
}
