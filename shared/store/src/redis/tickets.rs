//! One-time tickets for the gateway's live streams (`POST /v1/stream-tickets`): what a ticket
//! grants, kept for a few seconds under a digest of the ticket and taken back atomically on its
//! first use, so that any gateway of the fleet honours a ticket another one made, once.

use std::time::Duration;

use super::{RedisRunStore, backend};
use crate::Error;

impl RedisRunStore {
    /// The key of a ticket: `<prefix>:ticket:<digest>`. The digest is the caller's (a hash of
    /// the ticket): the ticket itself is never stored, so a dump of Redis opens no stream.
    fn ticket_key(&self, digest: &str) -> String {
        self.index(&format!("ticket:{digest}"))
    }

    /// Stores `grant` under `digest` for `ttl` (at least a millisecond). `Ok(false)` when the
    /// digest is taken already (a collision of random tickets: make another).
    pub async fn put_ticket(
        &self,
        digest: &str,
        grant: &str,
        ttl: Duration,
    ) -> Result<bool, Error> {
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let mut conn = self.connection();
        let set: Option<String> = redis::cmd("SET")
            .arg(self.ticket_key(digest))
            .arg(grant)
            .arg("PX")
            .arg(ms)
            .arg("NX")
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        Ok(set.is_some())
    }

    /// Takes the grant stored under `digest`, if it is there and not expired, and removes it in
    /// the same step (`GETDEL`): of two uses, even on two gateways at once, one gets it.
    pub async fn take_ticket(&self, digest: &str) -> Result<Option<String>, Error> {
        let mut conn = self.connection();
        redis::cmd("GETDEL")
            .arg(self.ticket_key(digest))
            .query_async(&mut conn)
            .await
            .map_err(backend)
    }

    /// The grant stored under `digest`, left in place (an answer link is read when its page
    /// opens and spent only when its answer is accepted).
    pub async fn peek_ticket(&self, digest: &str) -> Result<Option<String>, Error> {
        let mut conn = self.connection();
        redis::cmd("GET")
            .arg(self.ticket_key(digest))
            .query_async(&mut conn)
            .await
            .map_err(backend)
    }

    /// Removes the grant under `digest`; `Ok(true)` when this call removed it.
    pub async fn drop_ticket(&self, digest: &str) -> Result<bool, Error> {
        let mut conn = self.connection();
        let n: i64 = redis::cmd("DEL")
            .arg(self.ticket_key(digest))
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        Ok(n > 0)
    }

    /// How long the ticket under `digest` has left (`None`: there is none).
    pub async fn ticket_ttl(&self, digest: &str) -> Result<Option<Duration>, Error> {
        let mut conn = self.connection();
        let ms: i64 = redis::cmd("PTTL")
            .arg(self.ticket_key(digest))
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        Ok(u64::try_from(ms).ok().map(Duration::from_millis))
    }
}
