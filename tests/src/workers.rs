//! Fleet workers as real `delta-worker` processes (from the launcher), so that tests can
//! SIGKILL, SIGSTOP or SIGTERM them.

use std::path::Path;
use std::time::Duration;

pub use delta_launcher::{Output, WorkerSpec as Spec};

/// A worker process, killed on drop (a failing test leaves none behind, stopped or not). It
/// derefs to its `std::process::Child`.
pub type WorkerProcess = delta_launcher::Process;

/// The fleet's programs, built beforehand (`cargo build --bins`); a test fails with how to
/// build them when they are missing.
pub fn programs() -> delta_launcher::Programs {
    delta_launcher::Programs::find().unwrap_or_else(|e| panic!("{}", e.chain()))
}

/// Starts a worker process as `id`, logging (at `info`) to `log` when given.
pub fn spawn(spec: &Spec, id: &str, log: Option<&Path>) -> WorkerProcess {
    let output = Output {
        log: log.map(Path::to_path_buf),
        ..Default::default()
    };
    spawn_with(spec, id, &output)
}

/// Starts a worker process as `id`, reporting as `output` says (log file, filter, spans).
pub fn spawn_with(spec: &Spec, id: &str, output: &Output) -> WorkerProcess {
    spec.start(&programs(), id, output)
        .unwrap_or_else(|e| panic!("starting worker {id}: {}", e.chain()))
}

/// Stops a worker gracefully (SIGTERM) and waits for it to exit.
pub fn stop(worker: &mut WorkerProcess) {
    worker.stop_blocking(Duration::from_secs(120));
}

/// The queue settings a worker of `spec` runs its consumer with (for a test's own publisher).
pub fn queue_settings(spec: &Spec) -> delta_queue::Settings {
    delta_queue::Settings {
        ack_wait: Duration::from_millis(spec.ack_wait_ms),
        max_deliver: spec.max_deliver,
        ..Default::default()
    }
}
