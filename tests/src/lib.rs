//! Real servers for tests (and later `delta dev`): `redis-server` and `nats-server` started as
//! child processes on free loopback ports, each in its own temporary data directory, killed and
//! deleted on drop. Binaries come from `deploy/install-servers.sh` (or `DELTA_REDIS_SERVER` /
//! `DELTA_NATS_SERVER`); a missing one is reported with the command that installs it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A server that could not be started.
#[derive(Debug)]
pub struct Error(pub String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Finds a server binary: the environment variable, the project's tool dir, then `PATH`.
pub fn find_binary(name: &str, env_var: &str) -> Result<PathBuf, Error> {
    if let Some(p) = std::env::var_os(env_var) {
        return Ok(PathBuf::from(p));
    }
    let local = repo_root().join(".tools/venv/bin").join(name);
    if local.exists() {
        return Ok(local);
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.exists())
        .ok_or_else(|| {
            Error(format!(
                "{name} not found: run deploy/install-servers.sh (or set {env_var} to its path)"
            ))
        })
}

fn free_port() -> Result<u16, Error> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| Error(format!("no free port: {e}")))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| Error(format!("no free port: {e}")))
}

/// Starts a server up to three times: a free port can be taken by someone else before the
/// server binds it.
fn three_tries<T>(mut start: impl FnMut() -> Result<T, Error>) -> Result<T, Error> {
    let mut last = Error("not tried".into());
    for _ in 0..3 {
        match start() {
            Ok(server) => return Ok(server),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// A child process killed (and its data deleted) on drop.
struct Proc {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_until(what: &str, child: &mut Child, mut ready: impl FnMut() -> bool) -> Result<(), Error> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(Error(format!("{what} exited at start ({status})")));
        }
        if ready() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(Error(format!("{what} did not answer within 10 s")))
}

/// A `redis-server` with AOF on, in its own temporary directory.
pub struct Redis {
    proc: Proc,
    pub port: u16,
}

impl Redis {
    pub fn start() -> Result<Redis, Error> {
        let bin = find_binary("redis-server", "DELTA_REDIS_SERVER")?;
        three_tries(|| Self::try_start(&bin))
    }

    fn try_start(bin: &Path) -> Result<Redis, Error> {
        let dir = tempfile::tempdir().map_err(|e| Error(format!("tempdir: {e}")))?;
        let port = free_port()?;
        let mut child = Command::new(bin)
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args(["--appendonly", "yes", "--maxmemory-policy", "noeviction"])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| Error(format!("{}: {e}", bin.display())))?;
        let ping = || {
            TcpStream::connect(("127.0.0.1", port))
                .and_then(|mut s| {
                    s.write_all(b"PING\r\n")?;
                    let mut buf = [0u8; 7];
                    s.read_exact(&mut buf)?;
                    Ok(&buf == b"+PONG\r\n")
                })
                .unwrap_or(false)
        };
        if let Err(e) = wait_until("redis-server", &mut child, ping) {
            let _ = child.kill();
            return Err(e);
        }
        Ok(Redis {
            proc: Proc { child, _dir: dir },
            port,
        })
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.proc.child.id()
    }
}

/// A `nats-server` with JetStream, storing in its own temporary directory.
pub struct Nats {
    proc: Proc,
    pub port: u16,
}

impl Nats {
    pub fn start() -> Result<Nats, Error> {
        let bin = find_binary("nats-server", "DELTA_NATS_SERVER")?;
        three_tries(|| Self::try_start(&bin))
    }

    fn try_start(bin: &Path) -> Result<Nats, Error> {
        let dir = tempfile::tempdir().map_err(|e| Error(format!("tempdir: {e}")))?;
        let port = free_port()?;
        let mut child = Command::new(bin)
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| Error(format!("{}: {e}", bin.display())))?;
        // The server greets every client with an INFO line once it accepts connections.
        let greets = || {
            TcpStream::connect(("127.0.0.1", port))
                .and_then(|s| {
                    s.set_read_timeout(Some(Duration::from_millis(500)))?;
                    let mut line = String::new();
                    BufReader::new(s).read_line(&mut line)?;
                    Ok(line.starts_with("INFO ") && line.contains("\"jetstream\":true"))
                })
                .unwrap_or(false)
        };
        if let Err(e) = wait_until("nats-server", &mut child, greets) {
            let _ = child.kill();
            return Err(e);
        }
        Ok(Nats {
            proc: Proc { child, _dir: dir },
            port,
        })
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.proc.child.id()
    }
}
