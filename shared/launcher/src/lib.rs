//! The one fleet launcher: `redis-server`, `nats-server`, gateways and workers started as child
//! processes on free loopback ports, each with its own data directory and log, killed on drop.
//! `delta dev` and `delta bench` ([`local::LocalFleet`]) and every end-to-end, chaos and browser
//! test (through `delta-e2e`) start their processes here, so there is one way to do it.
//!
//! - [`servers`]: finding the server programs (or installing them), [`Redis`] and [`Nats`] with
//!   readiness waits and restarts on the same port and data.
//! - [`programs`]: finding the fleet's own programs, `delta-gateway` and `delta-worker` (the real
//!   binaries, never a copy inside another program), and building them when `cargo` started us.
//! - [`process`]: a child process in its own log, signalled (SIGKILL, SIGSTOP/SIGCONT, SIGTERM
//!   with a grace) and killed on drop.
//! - [`spec`]: what a gateway or a worker is started with, as the `DELTA_*` settings the
//!   programs read.
//!
//! The launcher knows the programs only by their settings, not by their crates: it depends on
//! neither, so neither a test nor `delta` links a second copy of a program it starts.

pub mod local;
pub mod process;
pub mod programs;
pub mod servers;
pub mod spec;

pub use delta_queue::access::NatsRole;
pub use delta_store::redis::access::RedisRole;
pub use nix::sys::signal::Signal;
pub use process::{Output, Process, signal};
pub use programs::Programs;
pub use servers::{Nats, NatsCluster, Redis, RedisCluster, ServerPrograms, Tls, free_port};
pub use spec::{GatewayProcess, GatewaySpec, GatewayTls, WorkerSpec};

/// Why a process could not be found or started.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A server program is missing: what was looked for, where, and how to install it.
    #[error(
        "{missing} not found (looked in {looked}). Install with: {install}   (or run this again with --install)"
    )]
    ServersMissing {
        missing: String,
        looked: String,
        install: String,
    },
    /// `delta-gateway` or `delta-worker` is missing.
    #[error(
        "{missing} not found (looked in {looked}); build the fleet's programs with `cargo build --bins` (`cargo build --release --bins` for a release build), or set DELTA_BIN_DIR to their directory"
    )]
    ProgramsMissing { missing: String, looked: String },
    /// A file operation or process start failed.
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A process exited before it was ready.
    #[error("{name} exited at start ({status}){tail}")]
    ExitedAtStart {
        name: String,
        status: std::process::ExitStatus,
        tail: String,
    },
    /// A process did not become ready in time.
    #[error("{name} did not become ready within {secs}s{tail}")]
    NotReady {
        name: String,
        secs: u64,
        tail: String,
    },
    /// A command the launcher ran for the user (the install script, `cargo build`) failed.
    #[error("{0}")]
    Failed(String),
}

impl Error {
    /// This error and its causes, `: `-separated: for a panic message or a log line (`Display`
    /// says only what failed, as its cause is a separate error).
    pub fn chain(&self) -> String {
        let mut text = self.to_string();
        let mut cause = std::error::Error::source(self);
        while let Some(c) = cause {
            text.push_str(": ");
            text.push_str(&c.to_string());
            cause = c.source();
        }
        text
    }

    fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }
}

/// The checkout this program belongs to: the first directory, from the current one up, holding
/// the servers' install script; else the one the launcher was built from.
pub fn repo_root() -> Option<std::path::PathBuf> {
    use std::path::Path;
    let cwd = std::env::current_dir().ok();
    let from_cwd = cwd
        .iter()
        .flat_map(|d| d.ancestors())
        .find(|d| d.join(servers::INSTALL_SCRIPT).is_file())
        .map(Path::to_path_buf);
    from_cwd.or_else(|| {
        let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        built
            .join(servers::INSTALL_SCRIPT)
            .is_file()
            .then(|| built.canonicalize().unwrap_or(built))
    })
}
