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
use crate::{Error, Nats, Programs, Redis, ServerPrograms, free_port};

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
    /// The gateway's port (a free one when `None`).
    pub gateway_port: Option<u16>,
    /// `DELTA_SECRETS_KEY` of the gateway and workers.
    pub secrets_key_hex: Option<String>,
    /// The gateway's `DELTA_GATEWAY_TOKEN` (every role); without one it runs without
    /// authentication, on loopback only.
    pub operator_token: Option<String>,
    /// Working directory of the workers (tools run in their work dir; this is for relative paths).
    pub cwd: Option<PathBuf>,
    /// Redis's `appendfsync`: `always` (what docker-compose.yml runs, and the fleet's default
    /// durability relies on) or `everysec` (then the fleet runs with `DELTA_REDIS_DURABILITY=none`).
    pub redis_fsync: String,
    /// `DELTA_LOG` of the gateway and workers when the caller's environment sets none.
    pub log_level: String,
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
    pub redis_url: String,
    /// `credentials.env` in the fleet's directory (readable by this user only): the servers'
    /// admin URLs and a bot's NATS URL, for an operator's tools and bots.
    pub credentials: PathBuf,
    pub dir: PathBuf,
    workers: Vec<Process>,
    gateway: Option<GatewayProcess>,
    nats: Option<Nats>,
    redis: Option<Redis>,
}

impl LocalFleet {
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
        let redis = Redis::start_with(&server(
            "redis",
            &o.servers.redis,
            Some(o.redis_fsync.clone()),
        ))?;
        let nats = Nats::start_with(&server("nats", &o.servers.nats, None))?;
        let gateway_port = match o.gateway_port {
            Some(p) => p,
            None => free_port()?,
        };
        let mut gateway =
            GatewaySpec::on(&nats, &redis, "delta", o.agents_dir.clone(), gateway_port);
        let credentials = o.dir.join("credentials.env");
        crate::servers::write_private(
            &credentials,
            &format!(
                "# The local fleet's servers (delta dev): log in with these.\nDELTA_REDIS_ADMIN_URL={}\nDELTA_NATS_ADMIN_URL={}\nDELTA_NATS_BOT_URL={}\n",
                redis.url(),
                nats.url(),
                nats.url_as(crate::NatsRole::Bot)
            ),
        )?;
        let mut fleet = LocalFleet {
            gateway_url: format!("http://127.0.0.1:{gateway_port}"),
            nats_url: nats.url(),
            redis_url: redis.url(),
            credentials,
            dir: o.dir.clone(),
            workers: vec![],
            gateway: None,
            nats: Some(nats),
            redis: Some(redis),
        };
        gateway.secrets_key_hex = o.secrets_key_hex.clone();
        gateway.operator_token = o.operator_token.clone();
        // Redis fsyncs every write (`always`), or the fleet is told it gets no guarantee.
        let durability = match o.redis_fsync.as_str() {
            "always" => "fsync-always",
            _ => "none",
        };
        gateway
            .extra
            .push(("DELTA_REDIS_DURABILITY", durability.to_owned()));
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
        if let Some(n) = &mut self.nats {
            all.push(("nats".into(), n.process()));
        }
        if let Some(r) = &mut self.redis {
            all.push(("redis".into(), r.process()));
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

    /// The process id of `name` (`worker-1`, `gateway`, `nats`, `redis`).
    pub fn pid(&self, name: &str) -> Option<u32> {
        match name {
            "gateway" => self.gateway.as_ref().map(|g| g.pid()),
            "nats" => self.nats.as_ref().map(|n| n.pid()),
            "redis" => self.redis.as_ref().map(|r| r.pid()),
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
