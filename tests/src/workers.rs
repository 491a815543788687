//! Fleet workers as real processes, so that tests can SIGKILL, SIGSTOP or SIGTERM them.
//!
//! A test binary re-runs itself as the worker: each test file that uses this declares
//!
//! ```ignore
//! #[tokio::test(flavor = "multi_thread")]
//! #[ignore = "a worker process started by the tests"]
//! async fn worker_child() { delta_e2e::workers::child_main().await }
//! ```
//!
//! and [`spawn`] starts `<test binary> --ignored --exact worker_child` with the worker's settings
//! in an environment variable. The child logs to the file given (or nowhere) and stops gracefully
//! on SIGTERM, like `delta-worker`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use delta_queue as queue;
use delta_worker::fleet::{self, Config};

const CHILD: &str = "DELTA_E2E_WORKER";

/// What a worker process is started with.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Spec {
    pub nats_url: String,
    pub redis_url: String,
    pub prefix: String,
    pub agents_dir: PathBuf,
    pub work_dir: PathBuf,
    pub concurrency: usize,
    pub ack_wait_ms: u64,
    pub max_deliver: i64,
    pub grace_ms: u64,
    pub worker_id: String,
    /// `DELTA_SECRETS_KEY`, 64 hex digits.
    #[serde(default)]
    pub secrets_key_hex: Option<String>,
}

impl Spec {
    /// The worker configuration this spec stands for.
    pub fn config(&self) -> Config {
        Config {
            nats_url: self.nats_url.clone(),
            redis_url: self.redis_url.clone(),
            prefix: self.prefix.clone(),
            agents_dir: self.agents_dir.clone(),
            work_dir: self.work_dir.clone(),
            concurrency: self.concurrency,
            queue: queue::Settings {
                ack_wait: Duration::from_millis(self.ack_wait_ms),
                max_deliver: self.max_deliver,
                ..Default::default()
            },
            worker_id: self.worker_id.clone(),
            grace: Duration::from_millis(self.grace_ms),
            secrets_key: self.secrets_key_hex.as_deref().map(|k| {
                std::sync::Arc::new(
                    delta_protocol::secret::SecretsKey::from_hex(k).expect("secrets key"),
                )
            }),
        }
    }
}

/// A worker process, killed on drop (a failing test leaves none behind, stopped or not).
pub struct WorkerProcess(Child);

impl std::ops::Deref for WorkerProcess {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for WorkerProcess {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a worker process as `id`, logging (at `info`) to `log` when given.
pub fn spawn(spec: &Spec, id: &str, log: Option<&Path>) -> WorkerProcess {
    let output = crate::ChildOutput {
        log: log.map(Path::to_path_buf),
        ..Default::default()
    };
    spawn_with(spec, id, &output)
}

/// Starts a worker process as `id`, reporting as `output` says (log file, filter, spans).
pub fn spawn_with(spec: &Spec, id: &str, output: &crate::ChildOutput) -> WorkerProcess {
    let spec = Spec {
        worker_id: id.to_owned(),
        ..spec.clone()
    };
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    cmd.args(["--ignored", "--exact", "worker_child", "--nocapture"])
        .env(CHILD, serde_json::to_string(&spec).expect("spec"))
        .stdout(Stdio::null());
    output.apply(&mut cmd);
    WorkerProcess(cmd.spawn().expect("spawn worker"))
}

/// Stops a worker gracefully (SIGTERM) and waits for it to exit.
pub fn stop(worker: &mut WorkerProcess) {
    crate::signal(worker.id(), crate::Signal::SIGTERM);
    let _ = worker.wait();
}

/// Whether this process was started by [`spawn`] as a worker.
pub fn is_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

/// The body of a test binary's `worker_child`: runs a worker until SIGTERM/SIGINT. Returns at
/// once when the binary was not started by [`spawn`] (a plain `--ignored` run).
pub async fn child_main() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let spec: Spec = serde_json::from_str(&spec).expect("worker spec");
    let shutdown = crate::child_process_setup();
    fleet::run(spec.config(), shutdown).await.expect("worker");
}
