//! Real servers for tests (and later `delta dev`): `redis-server` and `nats-server` started as
//! child processes on free loopback ports, each in its own temporary data directory, killed and
//! deleted on drop. Binaries come from `deploy/install-servers.sh` (or `DELTA_REDIS_SERVER` /
//! `DELTA_NATS_SERVER`); a missing one is reported with the command that installs it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use nix::sys::signal::Signal;

pub mod browser;
pub mod chaos;
pub mod fleet;
pub mod gateways;
pub mod workers;

/// Waits (up to 20 s) until a run in Redis has `status`; fails the test with the status it has.
pub async fn wait_for_status(
    store: &delta_store::redis::RedisRunStore,
    id: delta_protocol::RunId,
    status: delta_protocol::RunStatus,
) {
    use delta_store::RunStore;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = store.load(id).await.expect("load").record.status;
        if now == status {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "run {id} is {now}, expected {status}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Asserts that a run's journal requested and resulted each step once, `steps` of them.
pub fn assert_each_step_once(run: &delta_store::StoredRun, steps: usize) {
    use delta_protocol::Event;
    let id = run.record.run_id;
    let (mut requested, mut resulted) = (
        std::collections::HashSet::new(),
        std::collections::HashSet::new(),
    );
    for e in &run.journal {
        match &e.event {
            Event::ActionRequest(a) => assert!(
                requested.insert(a.action_id.clone()),
                "run {id}: step {} requested twice",
                a.action_id
            ),
            Event::ActionResult(r) => assert!(
                resulted.insert(r.action_id.clone()),
                "run {id}: step {} has two results",
                r.action_id
            ),
            _ => {}
        }
    }
    assert_eq!(resulted.len(), steps, "run {id}: {steps} steps");
}

/// A journal's events without what legitimately differs between two runs of the same agent
/// with the same answers: times, durations, ids and the worker's name.
pub fn journal_shape(journal: &[delta_protocol::JournalEvent]) -> Vec<serde_json::Value> {
    journal
        .iter()
        .map(|e| {
            let mut v = serde_json::to_value(&e.event).unwrap_or_default();
            let p = &mut v["payload"];
            for k in [
                "run_id",
                "request_id",
                "timestamp",
                "expires_at",
                "duration_ms",
                "worker",
            ] {
                if p.get(k).is_some() {
                    p[k] = serde_json::json!("*");
                }
            }
            serde_json::json!({"seq": e.seq, "event": v})
        })
        .collect()
}

/// The workers that ran a run, one per session (`ENGINE_START.worker`), in order.
pub fn workers_of(run: &delta_store::StoredRun) -> Vec<String> {
    use delta_protocol::Event;
    run.journal
        .iter()
        .filter_map(|e| match &e.event {
            Event::EngineStart(s) => Some(s.worker.clone()),
            _ => None,
        })
        .collect()
}

/// The answers a run journaled (`HUMAN_INPUT_RECEIVED`), in order.
pub fn answers_of(run: &delta_store::StoredRun) -> Vec<delta_protocol::HumanInputReceived> {
    use delta_protocol::Event;
    run.journal
        .iter()
        .filter_map(|e| match &e.event {
            Event::HumanInputReceived(h) => Some(h.clone()),
            _ => None,
        })
        .collect()
}

/// Every key matching `pattern` in Redis with its value, as text: hashes, streams, sorted sets,
/// sets, lists and strings read in clear (a `DUMP` is compressed, so a search could miss).
pub async fn redis_dump(url: &str, pattern: &str) -> String {
    let client = redis::Client::open(url).expect("url");
    let mut c = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(pattern)
        .query_async(&mut c)
        .await
        .expect("keys");
    let mut out = String::new();
    for k in keys {
        let kind: String = redis::cmd("TYPE")
            .arg(&k)
            .query_async(&mut c)
            .await
            .expect("type");
        let read = match kind.as_str() {
            "hash" => redis::cmd("HGETALL").arg(&k).clone(),
            "stream" => redis::cmd("XRANGE").arg(&k).arg("-").arg("+").clone(),
            "zset" => redis::cmd("ZRANGE")
                .arg(&k)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .clone(),
            "set" => redis::cmd("SMEMBERS").arg(&k).clone(),
            "list" => redis::cmd("LRANGE").arg(&k).arg(0).arg(-1).clone(),
            "string" => redis::cmd("GET").arg(&k).clone(),
            _ => redis::cmd("DUMP").arg(&k).clone(),
        };
        let value: redis::Value = read.query_async(&mut c).await.expect("read key");
        out.push_str(&k);
        out.push_str(&format!(" {value:?}\n"));
    }
    out
}

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

/// Sends `sig` to a process (ignoring one that is already gone).
pub fn signal(pid: u32, sig: Signal) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
    }
}

/// Where a worker or gateway child process reports: its stderr log (to a file, or nowhere), the
/// log filter (`DELTA_LOG`, `info` by default, as in production) and, optionally, a file that
/// receives its spans (see [`child_process_setup`]).
#[derive(Clone, Debug, Default)]
pub struct ChildOutput {
    /// The process's stderr log; `None` throws it away.
    pub log: Option<PathBuf>,
    /// `DELTA_LOG` for the child (`info` when `None`).
    pub filter: Option<String>,
    /// Spans go here, one line per finished span (`DELTA_E2E_SPANS`).
    pub spans: Option<PathBuf>,
}

impl ChildOutput {
    /// Stderr for the child: the log file (appended to), or nothing.
    fn stderr(&self) -> Stdio {
        match &self.log {
            Some(p) => std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map(Stdio::from)
                .expect("child log file"),
            None => Stdio::null(),
        }
    }

    /// Sets the child's environment: its log filter and span file.
    fn apply(&self, cmd: &mut Command) {
        cmd.env("DELTA_LOG", self.filter.as_deref().unwrap_or("info"))
            .stderr(self.stderr());
        match &self.spans {
            Some(p) => cmd.env(SPANS, p),
            None => cmd.env_remove(SPANS),
        };
    }
}

/// The file a child writes its spans to (set by [`ChildOutput`]).
const SPANS: &str = "DELTA_E2E_SPANS";

/// Writes every finished span, as the OpenTelemetry SDK hands it to an exporter (name,
/// attributes, events with their fields, status), as one line of text to a file: what an OTLP
/// exporter would send, without a collector.
#[derive(Debug)]
struct FileSpanExporter(std::sync::Mutex<std::fs::File>);

impl opentelemetry_sdk::trace::SpanExporter for FileSpanExporter {
    fn export(
        &self,
        batch: Vec<opentelemetry_sdk::trace::SpanData>,
    ) -> impl std::future::Future<Output = opentelemetry_sdk::error::OTelSdkResult> + Send {
        let mut f = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for span in batch {
            let _ = writeln!(f, "{span:?}");
        }
        std::future::ready(Ok(()))
    }
}

/// What a worker or gateway child process does first: log to stderr (`DELTA_LOG`), export its
/// spans to a file when `DELTA_E2E_SPANS` names one (the same tracing-opentelemetry layer and
/// `INFO` span filter as `delta_host::init_logging`, with a file in place of the OTLP
/// exporter), and stop gracefully on SIGTERM (the returned token is cancelled).
pub fn child_process_setup() -> tokio_util::sync::CancellationToken {
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(tracing_subscriber::EnvFilter::from_env("DELTA_LOG"));
    let otel = std::env::var_os(SPANS).map(|path| {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("span file");
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_simple_exporter(FileSpanExporter(std::sync::Mutex::new(file)))
            .build();
        let tracer = provider.tracer("delta-e2e-child");
        // The provider lives as long as the process: spans are written as they end.
        std::mem::forget(provider);
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_filter(tracing_subscriber::filter::LevelFilter::INFO)
    });
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(otel)
        .try_init();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let s = shutdown.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            term.recv().await;
            s.cancel();
        }
    });
    shutdown
}

/// A port nobody listens on now.
pub fn free_port() -> Result<u16, Error> {
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

/// Which server a [`Proc`] is: says how to tell it is ready.
#[derive(Clone, Copy)]
enum Kind {
    Redis,
    Nats,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Redis => "redis-server",
            Kind::Nats => "nats-server",
        }
    }

    fn ready(self, port: u16) -> bool {
        match self {
            Kind::Redis => TcpStream::connect(("127.0.0.1", port))
                .and_then(|mut s| {
                    s.set_read_timeout(Some(Duration::from_millis(500)))?;
                    s.write_all(b"PING\r\n")?;
                    let mut buf = [0u8; 7];
                    s.read_exact(&mut buf)?;
                    Ok(&buf == b"+PONG\r\n")
                })
                .unwrap_or(false),
            // The server greets every client with an INFO line once it accepts connections.
            Kind::Nats => TcpStream::connect(("127.0.0.1", port))
                .and_then(|s| {
                    s.set_read_timeout(Some(Duration::from_millis(500)))?;
                    let mut line = String::new();
                    BufReader::new(s).read_line(&mut line)?;
                    Ok(line.starts_with("INFO ") && line.contains("\"jetstream\":true"))
                })
                .unwrap_or(false),
        }
    }

    fn args(self, port: u16, dir: &Path) -> Vec<std::ffi::OsString> {
        let mut args: Vec<std::ffi::OsString> = match self {
            Kind::Redis => [
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "yes",
                "--maxmemory-policy",
                "noeviction",
                "--dir",
            ]
            .iter()
            .map(Into::into)
            .collect(),
            Kind::Nats => ["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"]
                .iter()
                .map(Into::into)
                .collect(),
        };
        args.push(dir.as_os_str().to_owned());
        args
    }
}

/// A server child process on a fixed port and data directory; killed (and its data deleted) on
/// drop.
struct Proc {
    kind: Kind,
    bin: PathBuf,
    port: u16,
    child: Child,
    dir: tempfile::TempDir,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    fn start(kind: Kind, env_var: &str) -> Result<Proc, Error> {
        let bin = find_binary(kind.name(), env_var)?;
        three_tries(|| {
            let dir = tempfile::tempdir().map_err(|e| Error(format!("tempdir: {e}")))?;
            let port = free_port()?;
            let child = Self::spawn(kind, &bin, port, dir.path())?;
            Ok(Proc {
                kind,
                bin: bin.clone(),
                port,
                child,
                dir,
            })
        })
    }

    fn spawn(kind: Kind, bin: &Path, port: u16, dir: &Path) -> Result<Child, Error> {
        let mut child = Command::new(bin)
            .args(kind.args(port, dir))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| Error(format!("{}: {e}", bin.display())))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(Error(format!("{} exited at start ({status})", kind.name())));
            }
            if kind.ready(port) {
                return Ok(child);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error(format!("{} did not answer within 10 s", kind.name())));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops the server the way an operator would (SIGTERM: Redis writes its AOF, NATS flushes
    /// its streams), waits for it to exit, and starts it again on the same port and data.
    fn restart(&mut self) -> Result<(), Error> {
        signal(self.child.id(), Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // The port can linger a moment after exit: retry the start for a while.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match Self::spawn(self.kind, &self.bin, self.port, self.dir.path()) {
                Ok(child) => {
                    self.child = child;
                    return Ok(());
                }
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }
}

/// A `redis-server` with AOF on, in its own temporary directory.
pub struct Redis {
    proc: Proc,
    pub port: u16,
}

impl Redis {
    pub fn start() -> Result<Redis, Error> {
        let proc = Proc::start(Kind::Redis, "DELTA_REDIS_SERVER")?;
        Ok(Redis {
            port: proc.port,
            proc,
        })
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.proc.child.id()
    }

    /// Where this server keeps its AOF (to search a "dump" for what must not be there).
    pub fn data_dir(&self) -> &Path {
        self.proc.dir.path()
    }

    /// SIGTERM, then the same server again on the same port and AOF.
    pub fn restart(&mut self) -> Result<(), Error> {
        self.proc.restart()
    }
}

/// A `nats-server` with JetStream, storing in its own temporary directory.
pub struct Nats {
    proc: Proc,
    pub port: u16,
}

impl Nats {
    pub fn start() -> Result<Nats, Error> {
        let proc = Proc::start(Kind::Nats, "DELTA_NATS_SERVER")?;
        Ok(Nats {
            port: proc.port,
            proc,
        })
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Where this server keeps its JetStream store (to search it for what must not be there).
    pub fn data_dir(&self) -> &Path {
        self.proc.dir.path()
    }

    pub fn pid(&self) -> u32 {
        self.proc.child.id()
    }

    /// SIGTERM, then the same server again on the same port and store directory.
    pub fn restart(&mut self) -> Result<(), Error> {
        self.proc.restart()
    }
}
