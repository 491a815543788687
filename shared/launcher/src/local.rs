//! A whole fleet on this machine for `delta dev` and `delta bench`: redis-server, nats-server,
//! a gateway and workers, each on a free loopback port, with its data and log under one
//! directory (`redis/`, `nats/`, `work/`, `logs/<process>.log`).
//!
//! The children run in process groups of their own, so a Ctrl+C at the terminal reaches only the
//! parent, which stops them in order: workers first (they checkpoint), then the gateway, then
//! the servers.

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use crate::process::{Output, Process};
use crate::servers::ServerOptions;
use crate::spec::{GatewayProcess, GatewaySpec, WorkerSpec};
use crate::{
    Error, Nats, NatsCluster, Programs, Redis, RedisCluster, RedisRole, ServerPrograms, free_port,
};

/// What to start.
#[derive(Clone, Debug)]
pub struct Options {
    pub servers: ServerPrograms,
    pub programs: Programs,
    /// Data and logs: `redis/`, `nats/`, `work/`, `logs/<process>.log`.
    pub dir: PathBuf,
    pub agents_dir: PathBuf,
    pub workers: usize,
    /// Task slots of each worker.
    pub worker_concurrency: usize,
    /// Of those, the slots start jobs may not take (`DELTA_RESUME_SLOTS`); the worker's default
    /// (a quarter) when `None`.
    pub worker_resume_slots: Option<usize>,
    /// The gateway's port (a free one when `None`).
    pub gateway_port: Option<u16>,
    /// `DELTA_SECRETS_KEY` of the gateway and workers.
    pub secrets_key_hex: Option<String>,
    /// The gateway's `DELTA_GATEWAY_TOKEN` (every role); without one it runs without
    /// authentication, on loopback only.
    pub operator_token: Option<String>,
    /// The gateway's tokens file, if any (`delta dev --slack` names the bridge and its people).
    pub tokens_file: Option<PathBuf>,
    /// Working directory of the workers (tools run in their work dir; this is for relative paths).
    pub cwd: Option<PathBuf>,
    /// Redis's `appendfsync`: `always` (what docker-compose.yml runs, and the fleet's default
    /// durability relies on) or `everysec` (then the fleet runs with `DELTA_REDIS_DURABILITY=none`).
    pub redis_fsync: String,
    /// `DELTA_LOG` of the gateway and workers when the caller's environment sets none.
    pub log_level: String,
    /// NATS servers: 1, or a cluster of that many with every stream kept on each
    /// (`DELTA_STREAM_REPLICAS`, at most 3).
    pub nats_servers: usize,
    /// A Redis Cluster of 3 masters with a replica each instead of one Redis
    /// (`DELTA_REDIS_CLUSTER=1`; every write waits for a replica, `DELTA_REDIS_DURABILITY=replica`).
    pub redis_cluster: bool,
}

/// The fleet's NATS: one server or a cluster.
enum NatsServers {
    One(Box<Nats>),
    Cluster(NatsCluster),
}

/// The fleet's Redis: one server or a cluster.
enum RedisServers {
    One(Box<Redis>),
    Cluster(RedisCluster),
}

impl RedisServers {
    /// The URL (a cluster's: every node's, comma-separated) logged in as `role`.
    fn url_as(&self, role: RedisRole) -> String {
        match self {
            RedisServers::One(r) => r.url_as(role),
            RedisServers::Cluster(c) => c.url_as(role),
        }
    }
}

/// The programs a local fleet runs, for the checkout at `root`: the servers (installed first
/// with the project's script when missing and `install` is set) and `delta-gateway` and
/// `delta-worker` (built first when missing and cargo started us, see
/// [`Programs::find_or_build`]).
pub async fn find_programs(
    root: Option<&Path>,
    install: bool,
) -> Result<(ServerPrograms, Programs), Error> {
    let servers = match ServerPrograms::find(root) {
        Ok(s) => s,
        Err(_) if install => ServerPrograms::install(root).await?,
        Err(e) => return Err(e),
    };
    Ok((servers, Programs::find_or_build(root).await?))
}

/// A running local fleet. Field order is drop order: workers, gateway, then the servers.
pub struct LocalFleet {
    pub gateway_url: String,
    /// The servers, logged in as the admin.
    pub nats_url: String,
    /// One Redis's URL, or every node's of a Redis Cluster, comma-separated.
    pub redis_url: String,
    /// Whether `redis_url` is a Redis Cluster's.
    pub redis_cluster: bool,
    /// `credentials.env` in the fleet's directory (readable by this user only): the servers'
    /// admin URLs and a bot's NATS URL, for an operator's tools and bots.
    pub credentials: PathBuf,
    pub dir: PathBuf,
    workers: Vec<Process>,
    gateway: Option<GatewayProcess>,
    nats: Option<NatsServers>,
    redis: Option<RedisServers>,
}

impl LocalFleet {
    /// The NATS URL (with the login) of `role`.
    pub fn nats_url_as(&self, role: crate::NatsRole) -> Option<String> {
        match self.nats.as_ref()? {
            NatsServers::One(n) => Some(n.url_as(role)),
            NatsServers::Cluster(c) => Some(c.url_as(role)),
        }
    }

    /// Starts the servers and waits until they answer, then the gateway (until `/readyz` is ok)
    /// and the workers.
    pub async fn start(o: &Options) -> Result<LocalFleet, Error> {
        for sub in ["redis", "nats", "work", "logs"] {
            let d = o.dir.join(sub);
            std::fs::create_dir_all(&d).map_err(Error::io(format!("creating {}", d.display())))?;
        }
        let output = |name: &str| Output {
            log: Some(o.dir.join("logs").join(format!("{name}.log"))),
            // The caller's DELTA_LOG wins, but each process's closing statistics (its Redis
            // round trips, which `delta bench` reads back) are always kept.
            filter: Some(format!(
                "{},delta_stats=info",
                std::env::var("DELTA_LOG").unwrap_or_else(|_| o.log_level.clone())
            )),
            own_group: true,
            cwd: None,
            spans: None,
        };
        let server = |name: &str, program: &PathBuf, fsync: Option<String>| ServerOptions {
            program: Some(program.clone()),
            dir: Some(o.dir.join(name)),
            output: output(name),
            redis_fsync: fsync,
            prefix: Some("delta".into()),
            tls: None,
        };
        let redis_options = server("redis", &o.servers.redis, Some(o.redis_fsync.clone()));
        let redis = if o.redis_cluster {
            RedisServers::Cluster(RedisCluster::start(3, 1, &redis_options)?)
        } else {
            RedisServers::One(Box::new(Redis::start_with(&redis_options)?))
        };
        let gateway_port = match o.gateway_port {
            Some(p) => p,
            None => free_port()?,
        };
        let (nats, mut gateway) = if o.nats_servers > 1 {
            let cluster =
                NatsCluster::start(o.nats_servers, &server("nats", &o.servers.nats, None))?;
            let replicas = o.nats_servers.min(3).to_string();
            let mut spec = GatewaySpec {
                worker_nats_url: cluster.url_as(crate::NatsRole::Worker),
                worker_redis_url: redis.url_as(RedisRole::Worker),
                ..GatewaySpec::new(
                    &cluster.url_as(crate::NatsRole::Gateway),
                    &redis.url_as(RedisRole::Gateway),
                    "delta",
                    o.agents_dir.clone(),
                    gateway_port,
                )
            };
            spec.extra.push(("DELTA_STREAM_REPLICAS", replicas));
            (NatsServers::Cluster(cluster), spec)
        } else {
            let nats = Nats::start_with(&server("nats", &o.servers.nats, None))?;
            let spec = GatewaySpec {
                worker_nats_url: nats.url_as(crate::NatsRole::Worker),
                worker_redis_url: redis.url_as(RedisRole::Worker),
                ..GatewaySpec::new(
                    &nats.url_as(crate::NatsRole::Gateway),
                    &redis.url_as(RedisRole::Gateway),
                    "delta",
                    o.agents_dir.clone(),
                    gateway_port,
                )
            };
            (NatsServers::One(Box::new(nats)), spec)
        };
        let (nats_admin, nats_bot) = match &nats {
            NatsServers::One(n) => (n.url(), n.url_as(crate::NatsRole::Bot)),
            NatsServers::Cluster(c) => (c.url(), c.url_as(crate::NatsRole::Bot)),
        };
        let credentials = o.dir.join("credentials.env");
        crate::servers::write_private(
            &credentials,
            &format!(
                "# The local fleet's servers (delta dev): log in with these.\nDELTA_REDIS_ADMIN_URL={}\nDELTA_NATS_ADMIN_URL={}\nDELTA_NATS_BOT_URL={}\n",
                redis.url_as(RedisRole::Admin),
                nats_admin,
                nats_bot
            ),
        )?;
        let mut fleet = LocalFleet {
            gateway_url: format!("http://127.0.0.1:{gateway_port}"),
            nats_url: nats_admin.clone(),
            redis_url: redis.url_as(RedisRole::Admin),
            redis_cluster: o.redis_cluster,
            credentials,
            dir: o.dir.clone(),
            workers: vec![],
            gateway: None,
            nats: Some(nats),
            redis: Some(redis),
        };
        gateway.secrets_key_hex = o.secrets_key_hex.clone();
        gateway.operator_token = o.operator_token.clone();
        gateway.tokens_file = o.tokens_file.clone();
        // Redis fsyncs every write (`always`), or the fleet is told it gets no guarantee; on a
        // cluster, every write also waits for a replica (unless no guarantee is wanted).
        let durability = match (o.redis_fsync.as_str(), o.redis_cluster) {
            ("always", false) => "fsync-always",
            ("always", true) => "replica",
            _ => "none",
        };
        gateway
            .extra
            .push(("DELTA_REDIS_DURABILITY", durability.to_owned()));
        if o.redis_cluster {
            gateway.extra.push(("DELTA_REDIS_CLUSTER", "1".to_owned()));
        }
        fleet.gateway = Some(
            gateway
                .start(&o.programs, "gateway", &output("gateway"))
                .await?,
        );
        let mut worker = WorkerSpec {
            concurrency: o.worker_concurrency,
            ..WorkerSpec::joining(&gateway, o.dir.join("work"))
        };
        worker
            .extra
            .push(("DELTA_REDIS_DURABILITY", durability.to_owned()));
        if let Some(n) = o.worker_resume_slots {
            worker.extra.push(("DELTA_RESUME_SLOTS", n.to_string()));
        }
        // The gateway's and the workers' streams must agree on their replicas, and both must
        // know a Redis Cluster for one.
        worker.extra.extend(
            gateway
                .extra
                .iter()
                .filter(|(k, _)| matches!(*k, "DELTA_STREAM_REPLICAS" | "DELTA_REDIS_CLUSTER"))
                .cloned(),
        );
        for i in 1..=o.workers {
            let name = format!("worker-{i}");
            let out = Output {
                cwd: o.cwd.clone(),
                ..output(&name)
            };
            fleet.workers.push(worker.start(&o.programs, &name, &out)?);
        }
        Ok(fleet)
    }

    /// Every process, in stopping order, by name: `worker-<n>`, `gateway`, `nats`, `redis`.
    fn processes(&mut self) -> Vec<(String, &mut Process)> {
        let mut all: Vec<(String, &mut Process)> = self
            .workers
            .iter_mut()
            .map(|p| (p.name().to_owned(), p))
            .collect();
        if let Some(g) = &mut self.gateway {
            all.push(("gateway".into(), &mut g.process));
        }
        match &mut self.nats {
            Some(NatsServers::One(n)) => all.push(("nats".into(), n.process())),
            Some(NatsServers::Cluster(c)) => {
                for (name, node) in c.named_nodes() {
                    all.push((format!("nats-{name}"), node.process()));
                }
            }
            None => {}
        }
        match &mut self.redis {
            Some(RedisServers::One(r)) => all.push(("redis".into(), r.process())),
            Some(RedisServers::Cluster(c)) => {
                for (i, node) in c.nodes().iter_mut().enumerate() {
                    all.push((format!("redis-{}", i + 1), node.process()));
                }
            }
            None => {}
        }
        all
    }

    /// Processes that exited since the last call, with how.
    pub fn exited(&mut self) -> Vec<(String, ExitStatus)> {
        self.processes()
            .into_iter()
            .filter_map(|(name, p)| p.exited().map(|status| (name, status)))
            .collect()
    }

    /// The process ids of the NATS servers (one, or each node of the cluster).
    pub fn nats_pids(&self) -> Vec<u32> {
        match self.nats.as_ref() {
            Some(NatsServers::One(n)) => vec![n.pid()],
            Some(NatsServers::Cluster(c)) => c.pids(),
            None => vec![],
        }
    }

    /// The NATS servers' monitoring ports on 127.0.0.1 (`/varz`: one, or each node's).
    pub fn nats_monitor_ports(&self) -> Vec<u16> {
        match self.nats.as_ref() {
            Some(NatsServers::One(n)) => n.monitor_port().into_iter().collect(),
            Some(NatsServers::Cluster(c)) => c.monitor_ports(),
            None => vec![],
        }
    }

    /// The process ids of the Redis servers (one, or each node of the cluster).
    pub fn redis_pids(&self) -> Vec<u32> {
        match self.redis.as_ref() {
            Some(RedisServers::One(r)) => vec![r.pid()],
            Some(RedisServers::Cluster(c)) => c.pids(),
            None => vec![],
        }
    }

    /// Each Redis server's process id and port (one, or each node of the cluster).
    pub fn redis_nodes(&self) -> Vec<(u32, u16)> {
        match self.redis.as_ref() {
            Some(RedisServers::One(r)) => vec![(r.pid(), r.port)],
            Some(RedisServers::Cluster(c)) => c.pids_and_ports(),
            None => vec![],
        }
    }

    /// The process id of `name` (`worker-1`, `gateway`, `nats` or `redis`: the first node of a
    /// cluster).
    pub fn pid(&self, name: &str) -> Option<u32> {
        match name {
            "gateway" => self.gateway.as_ref().map(|g| g.pid()),
            "nats" => match self.nats.as_ref() {
                Some(NatsServers::One(n)) => Some(n.pid()),
                Some(NatsServers::Cluster(c)) => c.pids().first().copied(),
                None => None,
            },
            "redis" => self.redis_pids().first().copied(),
            _ => self
                .workers
                .iter()
                .find(|p| p.name() == name)
                .map(|p| p.pid()),
        }
    }

    /// Stops everything in order: SIGTERM, then SIGKILL after `grace` for one that lingers.
    pub async fn stop(mut self, grace: Duration) {
        for (_, p) in self.processes() {
            p.stop(grace).await;
        }
    }
}
