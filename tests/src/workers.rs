//! Fleet workers as real `delta-worker` processes (from the launcher), so that tests can
//! SIGKILL, SIGSTOP or SIGTERM them.

use std::path::Path;
use std::time::Duration;

pub use delta_launcher::{Output, WorkerSpec as Spec};

/// A worker process, killed on drop (a failing test leaves none behind, stopped or not). It
/// derefs to its `std::process::Child`.
pub type WorkerProcess = delta_launcher::Process;

/// The fleet's programs, built beforehand (`cargo build --bins`); a test fails with how to
/// build them when they are missing, and warns (shown with a failure) when a source file is
/// newer than a program: a test would then run yesterday's code.
pub fn programs() -> delta_launcher::Programs {
    static WARNED: std::sync::Once = std::sync::Once::new();
    let programs = delta_launcher::Programs::find().unwrap_or_else(|e| panic!("{}", e.chain()));
    WARNED.call_once(|| {
        for program in [&programs.gateway, &programs.worker] {
            if let Some(newer) = newer_source(program) {
                eprintln!(
                    "warning: {} is older than {}: run `cargo build --bins` first",
                    program.display(),
                    newer.display()
                );
            }
        }
    });
    programs
}

/// A source file of the programs or of the libraries they link, changed after `program` was
/// built.
fn newer_source(program: &Path) -> Option<std::path::PathBuf> {
    let built = std::fs::metadata(program).and_then(|m| m.modified()).ok()?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let root = root.canonicalize().unwrap_or(root);
    let mut dirs = vec![root.join("gateway/src"), root.join("worker/src")];
    dirs.extend(
        std::fs::read_dir(root.join("shared"))
            .into_iter()
            .flatten()
            .flatten()
            // The launcher starts the programs; they do not link it.
            .filter(|e| e.file_name() != "launcher")
            .map(|e| e.path().join("src")),
    );
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if entry
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t > built)
            {
                return Some(path);
            }
        }
    }
    None
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

/// The queue settings a worker of `spec` runs its consumer with (for a test's own publisher),
/// its streams' replicas included (`DELTA_STREAM_REPLICAS`, 3 on the test's NATS cluster).
pub fn queue_settings(spec: &Spec) -> delta_queue::Settings {
    let replicas = spec
        .extra
        .iter()
        .find(|(k, _)| *k == "DELTA_STREAM_REPLICAS")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(1);
    delta_queue::Settings {
        ack_wait: Duration::from_millis(spec.ack_wait_ms),
        max_deliver: spec.max_deliver,
        replicas,
        ca_file: spec.ca_file.clone(),
        ..Default::default()
    }
}
