//! Where scoped grants are kept ([`GrantStore`]): locally under `.delta/grants/`, in the fleet in
//! Redis (`redis/grants.rs`). Both pass [`contract::run_all`].
//!
//! A grant's definition never changes once stored; what changes is its use count and its
//! revocation, each in one atomic step that also checks the other: a use is taken only from a
//! grant that is not revoked, not expired and has uses left, and a revocation is seen by every use
//! that comes after it. So a revoked grant approves nothing from then on, and two runs racing for
//! a grant's last use get one use between them.
//!
//! ```text
//! .delta/grants/<grant_id>.json   {"grant": <Grant>, "used_by": ["<run_id>/<action_id>", …]}
//! .delta/grants/.lock             flock held while one process reads and rewrites a grant
//! ```

use std::fs::{self, File, OpenOptions};
use std::future::Future;
use std::path::PathBuf;

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use crate::Error;
use crate::file::{FileRunStore, write_atomically};
use delta_protocol::grant::{Grant, GrantState};
use delta_protocol::{RequestId, RunId, Timestamp};

/// Why a grant approves nothing (now).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unusable {
    NotFound,
    Revoked,
    Expired,
    /// Every one of its `max_uses` was taken.
    UsedUp,
}

impl std::fmt::Display for Unusable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Unusable::NotFound => "no such grant",
            Unusable::Revoked => "revoked",
            Unusable::Expired => "expired",
            Unusable::UsedUp => "used up",
        })
    }
}

/// Grants, by agent. Every call is atomic.
pub trait GrantStore: Send + Sync {
    /// Stores `grant` unless a grant with its id exists (a revoked one included, so that a
    /// replayed answer never brings a revoked grant back): `Ok(true)` when this call stored it.
    fn put_grant(&self, grant: &Grant) -> impl Future<Output = Result<bool, Error>> + Send;

    /// One grant, whatever its state.
    fn grant(&self, id: RequestId) -> impl Future<Output = Result<Option<Grant>, Error>> + Send;

    /// The grants of `agent` (every agent's when `None`), whatever their state, oldest first.
    fn grants(&self, agent: Option<&str>)
    -> impl Future<Output = Result<Vec<Grant>, Error>> + Send;

    /// Takes one use of grant `id` of `agent` for one call (action `action_id` of run `run_id`),
    /// if the grant is live at `now`: the grant after the use, or why it approves nothing. A call
    /// that took a use already (the same run and action: a replay) gets the grant again without
    /// a second use.
    fn use_grant(
        &self,
        agent: &str,
        id: RequestId,
        run_id: RunId,
        action_id: &str,
        now: Timestamp,
    ) -> impl Future<Output = Result<Result<Grant, Unusable>, Error>> + Send;

    /// Revokes grant `id` (by `by`, at `now`): the grant as revoked (as it was when it was revoked
    /// already), or `None` when there is no such grant.
    fn revoke_grant(
        &self,
        id: RequestId,
        by: &str,
        now: Timestamp,
    ) -> impl Future<Output = Result<Option<Grant>, Error>> + Send;
}

/// Why a grant in `state` approves nothing, if it does not.
pub fn unusable(state: GrantState) -> Option<Unusable> {
    match state {
        GrantState::Active => None,
        GrantState::Revoked => Some(Unusable::Revoked),
        GrantState::Expired => Some(Unusable::Expired),
        GrantState::UsedUp => Some(Unusable::UsedUp),
    }
}

/// A grant's file.
#[derive(Serialize, Deserialize)]
struct GrantFile {
    grant: Grant,
    /// The calls that took a use, so that a replayed call does not take a second one (kept only
    /// for grants with `max_uses`, where the count matters).
    #[serde(default)]
    used_by: Vec<String>,
}

impl FileRunStore {
    fn grants_dir(&self) -> PathBuf {
        self.root().join("grants")
    }

    fn grant_path(&self, id: RequestId) -> PathBuf {
        self.grants_dir().join(format!("{id}.json"))
    }

    /// Holds `.delta/grants/.lock` (another `delta run` in the same directory waits).
    fn lock_grants(&self) -> Result<Flock<File>, Error> {
        let dir = self.grants_dir();
        fs::create_dir_all(&dir).map_err(|source| io_error(&dir, source))?;
        let path = dir.join(".lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|source| io_error(&path, source))?;
        Flock::lock(file, FlockArg::LockExclusive)
            .map_err(|(_, e)| io_error(&path, std::io::Error::from(e)))
    }

    fn read_grant(&self, id: RequestId) -> Result<Option<GrantFile>, Error> {
        let path = self.grant_path(id);
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(io_error(&path, source)),
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|source| Error::Record {
                path: path.display().to_string(),
                source,
            })
    }

    fn write_grant(&self, file: &GrantFile) -> Result<(), Error> {
        let bytes = serde_json::to_vec_pretty(file).unwrap_or_default();
        write_atomically(&self.grant_path(file.grant.grant_id), &bytes)
    }

    fn all_grants(&self) -> Result<Vec<Grant>, Error> {
        let dir = self.grants_dir();
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(source) => return Err(io_error(&dir, source)),
        };
        let mut out = vec![];
        for entry in entries {
            let entry = entry.map_err(|source| io_error(&dir, source))?;
            let name = entry.file_name();
            let Some(id) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".json"))
                .and_then(|n| n.parse::<RequestId>().ok())
            else {
                continue;
            };
            if let Some(f) = self.read_grant(id)? {
                out.push(f.grant);
            }
        }
        out.sort_by_key(|g| (g.created_at, g.grant_id));
        Ok(out)
    }
}

fn io_error(path: &std::path::Path, source: std::io::Error) -> Error {
    Error::Io {
        path: path.display().to_string(),
        source,
    }
}

impl GrantStore for FileRunStore {
    async fn put_grant(&self, grant: &Grant) -> Result<bool, Error> {
        let _lock = self.lock_grants()?;
        if self.read_grant(grant.grant_id)?.is_some() {
            return Ok(false);
        }
        self.write_grant(&GrantFile {
            grant: grant.clone(),
            used_by: vec![],
        })?;
        Ok(true)
    }

    async fn grant(&self, id: RequestId) -> Result<Option<Grant>, Error> {
        Ok(self.read_grant(id)?.map(|f| f.grant))
    }

    async fn grants(&self, agent: Option<&str>) -> Result<Vec<Grant>, Error> {
        let mut all = self.all_grants()?;
        if let Some(a) = agent {
            all.retain(|g| g.agent == a);
        }
        Ok(all)
    }

    async fn use_grant(
        &self,
        agent: &str,
        id: RequestId,
        run_id: RunId,
        action_id: &str,
        now: Timestamp,
    ) -> Result<Result<Grant, Unusable>, Error> {
        let use_key = format!("{run_id}/{action_id}");
        let _lock = self.lock_grants()?;
        let Some(mut file) = self.read_grant(id)?.filter(|f| f.grant.agent == agent) else {
            return Ok(Err(Unusable::NotFound));
        };
        let counted = file.grant.max_uses.is_some();
        if counted && file.used_by.contains(&use_key) {
            // This call took its use already (a replay): approved again unless the grant was
            // revoked or expired since.
            return Ok(match unusable(file.grant.state_at(now)) {
                Some(why @ (Unusable::Revoked | Unusable::Expired)) => Err(why),
                _ => Ok(file.grant),
            });
        }
        if let Some(why) = unusable(file.grant.state_at(now)) {
            return Ok(Err(why));
        }
        file.grant.uses = file.grant.uses.saturating_add(1);
        if counted {
            file.used_by.push(use_key);
        }
        self.write_grant(&file)?;
        Ok(Ok(file.grant))
    }

    async fn revoke_grant(
        &self,
        id: RequestId,
        by: &str,
        now: Timestamp,
    ) -> Result<Option<Grant>, Error> {
        let _lock = self.lock_grants()?;
        let Some(mut file) = self.read_grant(id)? else {
            return Ok(None);
        };
        if file.grant.revoked_at.is_none() {
            file.grant.revoked_at = Some(now);
            file.grant.revoked_by = Some(by.to_owned());
            self.write_grant(&file)?;
        }
        Ok(Some(file.grant))
    }
}

/// The one suite every [`GrantStore`] passes (the file store's tests, `tests/tests/redis_store.rs`).
pub mod contract {
    use std::collections::BTreeMap;

    use super::{GrantStore, Unusable};
    use delta_protocol::grant::{ArgMatch, Grant, GrantScope, GrantState};
    use delta_protocol::{RequestId, Responder, RunId, Timestamp, Via};

    /// A grant of `agent` for the tool `deploy`, by alice.
    pub fn sample(agent: &str, max_uses: Option<u64>) -> Grant {
        Grant {
            grant_id: RequestId::new(),
            agent: agent.to_owned(),
            scope: GrantScope::Agent,
            run_id: RunId::new(),
            tool: "deploy".into(),
            args: BTreeMap::from([("env".into(), ArgMatch::Exact("staging".into()))]),
            created_by: Responder::new("alice", Via::Http),
            created_at: Timestamp::now(),
            expires_at: None,
            max_uses,
            uses: 0,
            revoked_at: None,
            revoked_by: None,
        }
    }

    pub async fn run_all<S: GrantStore>(store: &S) {
        stored_once_and_listed_by_agent(store).await;
        uses_are_counted_once_per_call_up_to_max_uses(store).await;
        a_revoked_grant_approves_nothing(store).await;
        an_expired_grant_approves_nothing(store).await;
        concurrent_uses_never_exceed_max_uses(store).await;
    }

    async fn stored_once_and_listed_by_agent<S: GrantStore>(store: &S) {
        let agent = format!("ga-{}", RequestId::new());
        let g = sample(&agent, None);
        assert!(store.put_grant(&g).await.expect("put"));
        let mut other = g.clone();
        other.tool = "other".into();
        assert!(
            !store.put_grant(&other).await.expect("put again"),
            "a second grant with the same id is not stored"
        );
        let got = store.grant(g.grant_id).await.expect("get").expect("there");
        assert_eq!(got, g);
        let second = sample(&agent, Some(3));
        store.put_grant(&second).await.expect("put second");
        store
            .put_grant(&sample(&format!("{agent}-x"), None))
            .await
            .expect("another agent's");
        let listed = store.grants(Some(&agent)).await.expect("list");
        let ids: Vec<RequestId> = listed.iter().map(|g| g.grant_id).collect();
        assert_eq!(
            ids,
            vec![g.grant_id, second.grant_id],
            "oldest first, one agent"
        );
        let all = store.grants(None).await.expect("all");
        assert!(all.len() >= 3);
        assert!(
            store.grant(RequestId::new()).await.expect("get").is_none(),
            "unknown id"
        );
    }

    async fn uses_are_counted_once_per_call_up_to_max_uses<S: GrantStore>(store: &S) {
        let agent = format!("gb-{}", RequestId::new());
        let run = RunId::new();
        let g = sample(&agent, Some(2));
        store.put_grant(&g).await.expect("put");
        let now = Timestamp::now();
        let used = store
            .use_grant(&agent, g.grant_id, run, "a1-1", now)
            .await
            .expect("use");
        assert_eq!(used.map(|g| g.uses), Ok(1));
        let again = store
            .use_grant(&agent, g.grant_id, run, "a1-1", now)
            .await
            .expect("use again");
        assert_eq!(
            again.map(|g| g.uses),
            Ok(1),
            "the same call takes no second use"
        );
        let second = store
            .use_grant(&agent, g.grant_id, run, "a2-1", now)
            .await
            .expect("second");
        assert_eq!(second.map(|g| g.uses), Ok(2));
        let third = store
            .use_grant(&agent, g.grant_id, run, "a3-1", now)
            .await
            .expect("third");
        assert_eq!(third, Err(Unusable::UsedUp));
        let replay = store
            .use_grant(&agent, g.grant_id, run, "a2-1", now)
            .await
            .expect("replay of a call that took the last use");
        assert!(replay.is_ok(), "a replayed call keeps its use: {replay:?}");
        let wrong_agent = store
            .use_grant("someone-else", g.grant_id, run, "a4-1", now)
            .await
            .expect("wrong agent");
        assert_eq!(wrong_agent, Err(Unusable::NotFound));
        let stored = store.grant(g.grant_id).await.expect("get").expect("there");
        assert_eq!(stored.uses, 2);
        assert_eq!(stored.state_at(now), GrantState::UsedUp);
    }

    async fn a_revoked_grant_approves_nothing<S: GrantStore>(store: &S) {
        let agent = format!("gc-{}", RequestId::new());
        let run = RunId::new();
        let g = sample(&agent, None);
        store.put_grant(&g).await.expect("put");
        let now = Timestamp::now();
        assert!(
            store
                .use_grant(&agent, g.grant_id, run, "a1-1", now)
                .await
                .expect("use")
                .is_ok()
        );
        let revoked = store
            .revoke_grant(g.grant_id, "bob", now)
            .await
            .expect("revoke")
            .expect("there");
        assert_eq!(revoked.revoked_by.as_deref(), Some("bob"));
        assert_eq!(revoked.uses, 1);
        let first_at = revoked.revoked_at;
        let again = store
            .revoke_grant(g.grant_id, "carol", Timestamp::now())
            .await
            .expect("revoke again")
            .expect("there");
        assert_eq!(
            (again.revoked_by.as_deref(), again.revoked_at),
            (Some("bob"), first_at),
            "revoking twice keeps the first"
        );
        let after = store
            .use_grant(&agent, g.grant_id, run, "a2-1", Timestamp::now())
            .await
            .expect("use after");
        assert_eq!(after, Err(Unusable::Revoked));
        assert!(
            !store.put_grant(&g).await.expect("put again"),
            "a replayed creation does not bring it back"
        );
        let stored = store.grant(g.grant_id).await.expect("get").expect("there");
        assert_eq!(stored.state_at(Timestamp::now()), GrantState::Revoked);
        assert!(
            store
                .revoke_grant(RequestId::new(), "bob", now)
                .await
                .expect("unknown")
                .is_none()
        );
    }

    async fn an_expired_grant_approves_nothing<S: GrantStore>(store: &S) {
        let agent = format!("gd-{}", RequestId::new());
        let run = RunId::new();
        let mut g = sample(&agent, None);
        let now = Timestamp::now();
        g.expires_at = Some(now.plus_seconds(60));
        store.put_grant(&g).await.expect("put");
        assert!(
            store
                .use_grant(&agent, g.grant_id, run, "a1-1", now)
                .await
                .expect("use")
                .is_ok()
        );
        let later = now.plus_seconds(61);
        assert_eq!(
            store
                .use_grant(&agent, g.grant_id, run, "a2-1", later)
                .await
                .expect("use later"),
            Err(Unusable::Expired)
        );
    }

    async fn concurrent_uses_never_exceed_max_uses<S: GrantStore>(store: &S) {
        let agent = format!("ge-{}", RequestId::new());
        let g = sample(&agent, Some(3));
        store.put_grant(&g).await.expect("put");
        let now = Timestamp::now();
        let runs: Vec<RunId> = (0..10).map(|_| RunId::new()).collect();
        let tries = runs
            .iter()
            .map(|r| store.use_grant(&agent, g.grant_id, *r, "a1-1", now));
        let results = futures_util::future::join_all(tries).await;
        let won = results
            .into_iter()
            .filter(|r| matches!(r, Ok(Ok(_))))
            .count();
        assert_eq!(won, 3, "exactly max_uses calls approved");
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn file_store_passes_the_grant_contract() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = crate::file::FileRunStore::new(dir.path().join(".delta"));
        super::contract::run_all(&store).await;
    }
}
