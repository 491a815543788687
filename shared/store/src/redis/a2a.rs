//! A2A push-notification configs (docs/protocols.md "A2A"): where a task's status changes are
//! posted. The only state the A2A server keeps besides the runs themselves, in Redis like the
//! rest, so that any gateway serves any request and delivers any config.
//!
//! - `<prefix>:a2a:pushes`: a set of `<task_id>/<config_id>`, for the delivery loop.
//! - `<prefix>:a2a:push:<task_id>`: a hash of the task's configs, `config_id` → JSON.
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

fn seal_context(task_id: &str, id: &str) -> String {
    format!("a2a-push:{task_id}/{id}")
}

impl RedisRunStore {
    fn a2a_pushes_key(&self) -> String {
        self.index("a2a:pushes")
    }

    fn a2a_push_key(&self, task_id: &str) -> String {
        self.index(&format!("a2a:push:{task_id}"))
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

    /// Stores (or replaces) a config.
    pub async fn a2a_put_push(&self, c: &A2aPushConfig) -> Result<(), Error> {
        let json = serde_json::to_string(c).map_err(|e| Error::Backend(Box::new(e)))?;
        let mut conn = self.connection();
        redis::cmd("HSET")
            .arg(self.a2a_push_key(&c.task_id))
            .arg(&c.id)
            .arg(json)
            .query_async::<()>(&mut conn)
            .await
            .map_err(backend)?;
        let mut conn = self.connection();
        redis::cmd("SADD")
            .arg(self.a2a_pushes_key())
            .arg(format!("{}/{}", c.task_id, c.id))
            .query_async::<()>(&mut conn)
            .await
            .map_err(backend)?;
        Ok(())
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

    /// Deletes a config: `Ok(false)` when there was none.
    pub async fn a2a_delete_push(&self, task_id: &str, id: &str) -> Result<bool, Error> {
        let mut conn = self.connection();
        let n: i64 = redis::cmd("HDEL")
            .arg(self.a2a_push_key(task_id))
            .arg(id)
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        let mut conn = self.connection();
        redis::cmd("SREM")
            .arg(self.a2a_pushes_key())
            .arg(format!("{task_id}/{id}"))
            .query_async::<()>(&mut conn)
            .await
            .map_err(backend)?;
        Ok(n == 1)
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
