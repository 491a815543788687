//! The servers a test fleet runs on: one `nats-server` and one `redis-server`, or, with
//! `DELTA_TEST_CLUSTER=1`, a 3-node NATS cluster (every stream kept on the three, R3) and a
//! Redis Cluster of 3 masters with a replica each (issue 15). The switch is read here and only
//! here: [`crate::fleet::Fleet::start`] and [`crate::fleet::Fleet::start_with`] ask
//! [`NatsServers::start`] and [`RedisServers::start`], so every test that starts its fleet
//! through the harness runs on clusters under it, its gateways and workers given every node's
//! URL with `DELTA_REDIS_CLUSTER=1` and `DELTA_STREAM_REPLICAS=3` ([`cluster_settings`]), its
//! store opened as a cluster client ([`RedisServers::store`]).
//!
//! Some test files are about one server by nature (they restart "the" Redis, search its AOF,
//! check one server's users): [`ONE_SERVER_TESTS`] names them, and they keep single servers
//! under the switch (docs/testing.md says why for each).
//!
//! [`NatsServers`] and [`RedisServers`] deref to the one [`Server`] for what only makes sense
//! for one (its port, process, data directory): on a cluster that is a test on the wrong list,
//! and it fails saying so.

use std::sync::OnceLock;
use std::time::Duration;

use delta_launcher::servers::{Server, ServerOptions};
use delta_launcher::{Error, NatsCluster, RedisCluster};
use delta_store::redis::{Durability, Options, RedisRunStore};

use crate::{Nats, NatsRole, Redis, RedisRole};

/// The variable that puts the suite on clusters.
pub const SWITCH: &str = "DELTA_TEST_CLUSTER";

/// Test files (integration test programs, by file name) that stay on one `nats-server` and one
/// `redis-server` under `DELTA_TEST_CLUSTER=1`, because what they test is one server:
///
/// - `chaos`: restarts "the" Redis and "the" NATS server, searches their data directories
///   (the chaos suite, docs/testing.md; its cluster form belongs to that suite);
/// - `operator` (`cli/tests`): kills "the" Redis so that the gateway answers 503.
pub const ONE_SERVER_TESTS: &[&str] = &["chaos", "operator"];

/// Whether fleets started through the harness run on clusters: `DELTA_TEST_CLUSTER=1` (or
/// `true`), unless this test program is one of [`ONE_SERVER_TESTS`]. Any other value than `1`,
/// `true`, `0`, `false` or empty fails the test, saying which are meant.
pub fn on_clusters() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let wanted = match std::env::var(SWITCH).unwrap_or_default().trim() {
            "1" | "true" => true,
            "" | "0" | "false" => false,
            other => panic!(
                "{SWITCH}={other}: set it to 1 to run the fleets on clusters, or leave it unset"
            ),
        };
        wanted && !test_program().is_some_and(|p| ONE_SERVER_TESTS.contains(&p.as_str()))
    })
}

/// The name of the running test file (`gateway` for `target/debug/deps/gateway-0123…`).
fn test_program() -> Option<String> {
    let exe = std::env::current_exe().ok()?;
    let stem = exe.file_stem()?.to_string_lossy().into_owned();
    Some(match stem.rsplit_once('-') {
        Some((name, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            name.to_owned()
        }
        _ => stem,
    })
}

/// Replicas of each JetStream stream on the test's NATS cluster (three nodes: R3).
pub const CLUSTER_REPLICAS: usize = 3;

/// The settings that tell a gateway or a worker it runs on these clusters:
/// `DELTA_REDIS_CLUSTER=1` for a Redis Cluster, `DELTA_STREAM_REPLICAS=3` for a NATS cluster
/// (`DELTA_REDIS_DURABILITY` left to its cluster default, `replica`). Empty on single servers.
pub fn cluster_settings(nats: &NatsServers, redis: &RedisServers) -> Vec<(&'static str, String)> {
    let mut env = vec![];
    if redis.is_cluster() {
        env.push(("DELTA_REDIS_CLUSTER", "1".to_owned()));
    }
    if nats.is_cluster() {
        env.push(("DELTA_STREAM_REPLICAS", CLUSTER_REPLICAS.to_string()));
    }
    env
}

/// Adds `settings` to `extra` where `extra` does not set them already (a test's own value
/// wins; a test that replaced `extra` gets them back).
pub fn add_missing(extra: &mut Vec<(&'static str, String)>, settings: &[(&'static str, String)]) {
    for (k, v) in settings {
        if !extra.iter().any(|(have, _)| have == k) {
            extra.push((k, v.clone()));
        }
    }
}

/// The fleet's NATS: one server, or a cluster of three.
#[derive(Debug)]
pub enum NatsServers {
    One(Box<Nats>),
    Cluster(NatsCluster),
}

/// The fleet's Redis: one server, or a Redis Cluster of 3 masters with a replica each.
#[derive(Debug)]
pub enum RedisServers {
    One(Box<Redis>),
    Cluster(RedisCluster),
}

impl From<Nats> for NatsServers {
    fn from(n: Nats) -> Self {
        NatsServers::One(Box::new(n))
    }
}

impl From<Redis> for RedisServers {
    fn from(r: Redis) -> Self {
        RedisServers::One(Box::new(r))
    }
}

/// The message of a test that treats a cluster as one server.
fn not_one(what: &str) -> ! {
    panic!(
        "this test uses {what} as one server, but it runs on a cluster ({SWITCH}=1): add its file to ONE_SERVER_TESTS in tests/src/servers.rs (and say why in docs/testing.md), or make it work on a cluster"
    )
}

impl NatsServers {
    /// One server, or a 3-node cluster under `DELTA_TEST_CLUSTER=1` (see [`on_clusters`]).
    pub fn start() -> Self {
        if on_clusters() {
            Self::cluster()
        } else {
            Self::one()
        }
    }

    /// One `nats-server` with JetStream.
    pub fn one() -> Self {
        NatsServers::One(Box::new(Nats::start().expect("nats-server")))
    }

    /// A 3-node NATS cluster, JetStream on each, ready for R3 streams.
    pub fn cluster() -> Self {
        NatsServers::Cluster(
            NatsCluster::start(3, &ServerOptions::default()).expect("a 3-node NATS cluster"),
        )
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self, NatsServers::Cluster(_))
    }

    /// Copies of each stream: 1 on one server, 3 on the cluster.
    pub fn replicas(&self) -> usize {
        if self.is_cluster() {
            CLUSTER_REPLICAS
        } else {
            1
        }
    }

    /// Queue settings whose streams fit these servers (R3 on the cluster), the rest default.
    pub fn queue_settings(&self) -> delta_queue::Settings {
        delta_queue::Settings {
            replicas: self.replicas(),
            ..Default::default()
        }
    }

    /// The URL (a cluster's: every node's, comma-separated) logged in as the admin.
    pub fn url(&self) -> String {
        self.url_as(NatsRole::Admin)
    }

    /// The URL (a cluster's: every node's, comma-separated) logged in as `role`.
    pub fn url_as(&self, role: NatsRole) -> String {
        match self {
            NatsServers::One(n) => n.url_as(role),
            NatsServers::Cluster(c) => c.url_as(role),
        }
    }

    /// Stops and starts the server again on the same port and data; on a cluster, each node in
    /// turn, the next once every node is healthy again (a rolling restart).
    pub fn restart(&mut self) -> Result<(), Error> {
        match self {
            NatsServers::One(n) => n.restart(),
            NatsServers::Cluster(c) => {
                for (_, node) in c.named_nodes() {
                    node.restart()?;
                }
                c.wait_healthy(Duration::from_secs(30))
            }
        }
    }

    /// The cluster, when it is one.
    pub fn as_cluster(&mut self) -> Option<&mut NatsCluster> {
        match self {
            NatsServers::Cluster(c) => Some(c),
            NatsServers::One(_) => None,
        }
    }
}

impl RedisServers {
    /// One server, or a Redis Cluster (3 masters, a replica each) under `DELTA_TEST_CLUSTER=1`
    /// (see [`on_clusters`]).
    pub fn start() -> Self {
        if on_clusters() {
            Self::cluster()
        } else {
            Self::one()
        }
    }

    /// One `redis-server`.
    pub fn one() -> Self {
        RedisServers::One(Box::new(Redis::start().expect("redis-server")))
    }

    /// A Redis Cluster of 3 masters with a replica each.
    pub fn cluster() -> Self {
        let mut cluster =
            RedisCluster::start(3, 1, &ServerOptions::default()).expect("a Redis Cluster");
        for node in cluster.nodes() {
            sync_at_once(node);
        }
        RedisServers::Cluster(cluster)
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self, RedisServers::Cluster(_))
    }

    /// The URL (a cluster's: every node's, comma-separated) logged in as the admin.
    pub fn url(&self) -> String {
        self.url_as(RedisRole::Admin)
    }

    /// The URL (a cluster's: every node's, comma-separated) logged in as `role`.
    pub fn url_as(&self, role: RedisRole) -> String {
        match self {
            RedisServers::One(r) => r.url_as(role),
            RedisServers::Cluster(c) => c.url_as(role),
        }
    }

    /// How the fleet's programs make writes durable on these servers by default: Redis's own
    /// fsync on one, a replica's copy too on the cluster.
    pub fn durability(&self) -> Durability {
        Durability::default_for(self.is_cluster())
    }

    /// Every node's data directory (its AOF), masters and replicas: to search them.
    pub fn data_dirs(&mut self) -> Vec<std::path::PathBuf> {
        match self {
            RedisServers::One(r) => vec![r.data_dir().to_path_buf()],
            RedisServers::Cluster(c) => c
                .nodes()
                .iter()
                .map(|n| n.data_dir().to_path_buf())
                .collect(),
        }
    }

    /// A store of `prefix` logged in as the admin, as the fleet's programs open it: on a
    /// cluster, a cluster client whose writes wait for a replica (the cluster default).
    pub async fn store(&self, prefix: &str, ca_file: Option<&std::path::Path>) -> RedisRunStore {
        let options = Options {
            cluster: self.is_cluster(),
            ca_file: ca_file.map(std::path::Path::to_path_buf),
            ..Options::default()
        };
        let store = RedisRunStore::connect_options(&self.url(), prefix, &options)
            .await
            .expect("store");
        if self.is_cluster() {
            store
                .with_durability(self.durability())
                .await
                .expect("replica durability")
        } else {
            store
        }
    }

    /// Stops and starts the server again on the same port and data; on a cluster, each node in
    /// turn, the next once the cluster is ok again (a rolling restart).
    pub fn restart(&mut self) -> Result<(), Error> {
        match self {
            RedisServers::One(r) => r.restart(),
            RedisServers::Cluster(c) => {
                for i in 0..c.nodes().len() {
                    c.nodes()[i].restart()?;
                    sync_at_once(&c.nodes()[i]);
                    c.wait_ok(Duration::from_secs(30))?;
                }
                Ok(())
            }
        }
    }

    /// The cluster, when it is one.
    pub fn as_cluster(&mut self) -> Option<&mut RedisCluster> {
        match self {
            RedisServers::Cluster(c) => Some(c),
            RedisServers::One(_) => None,
        }
    }
}

/// Makes a Redis Cluster node start a replica's full sync at once
/// (`repl-diskless-sync-delay 0`), not after the 5 s it waits by default for more replicas to
/// share the transfer: each node has one replica, and a rolling restart makes every replica
/// sync in full once (AOF alone keeps no replication offset), which would add 5 s per node.
/// A setting of the test's servers for speed; what is replicated, and when a write counts as
/// replicated, stay the same.
fn sync_at_once(node: &Server) {
    let mut c = redis::Client::open(node.url())
        .and_then(|c| c.get_connection())
        .expect("a Redis Cluster node");
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("repl-diskless-sync-delay")
        .arg(0)
        .query(&mut c)
        .expect("CONFIG SET repl-diskless-sync-delay");
}

impl std::ops::Deref for NatsServers {
    type Target = Server;
    fn deref(&self) -> &Server {
        match self {
            NatsServers::One(n) => n,
            NatsServers::Cluster(_) => not_one("the NATS server"),
        }
    }
}

impl std::ops::DerefMut for NatsServers {
    fn deref_mut(&mut self) -> &mut Server {
        match self {
            NatsServers::One(n) => n,
            NatsServers::Cluster(_) => not_one("the NATS server"),
        }
    }
}

impl std::ops::Deref for RedisServers {
    type Target = Server;
    fn deref(&self) -> &Server {
        match self {
            RedisServers::One(r) => r,
            RedisServers::Cluster(_) => not_one("the Redis server"),
        }
    }
}

impl std::ops::DerefMut for RedisServers {
    fn deref_mut(&mut self) -> &mut Server {
        match self {
            RedisServers::One(r) => r,
            RedisServers::Cluster(_) => not_one("the Redis server"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_test_program_is_named_without_cargos_hash() {
        // This unit test runs in `target/debug/deps/delta_e2e-<16 hex digits>`.
        assert_eq!(test_program().as_deref(), Some("delta_e2e"));
    }

    #[test]
    fn settings_are_added_where_missing_and_a_tests_own_win() {
        let mut extra = vec![("DELTA_STREAM_REPLICAS", "1".to_owned())];
        add_missing(
            &mut extra,
            &[
                ("DELTA_REDIS_CLUSTER", "1".to_owned()),
                ("DELTA_STREAM_REPLICAS", "3".to_owned()),
            ],
        );
        assert_eq!(
            extra,
            [
                ("DELTA_STREAM_REPLICAS", "1".to_owned()),
                ("DELTA_REDIS_CLUSTER", "1".to_owned())
            ]
        );
    }
}
