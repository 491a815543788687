//! The fleet's own programs, `delta-gateway` and `delta-worker`: the real binaries of the
//! `gateway` and `worker` crates, found next to the program that starts them.

use std::path::{Path, PathBuf};

use crate::Error;

/// The gateway's program name.
pub const GATEWAY: &str = "delta-gateway";
/// The worker's program name.
pub const WORKER: &str = "delta-worker";

/// Where the fleet's programs are.
#[derive(Clone, Debug)]
pub struct Programs {
    pub gateway: PathBuf,
    pub worker: PathBuf,
}

impl Programs {
    /// Looks in `DELTA_BIN_DIR` when it is set; else in the directory of the running program,
    /// then its parent (a test binary lives in `target/<profile>/deps/`, the programs one up),
    /// then on `PATH`. The error says how to build them.
    pub fn find() -> Result<Programs, Error> {
        let (dirs, own) = search_dirs();
        let find = |name: &str| dirs.iter().map(|d| d.join(name)).find(|p| p.is_file());
        match (find(GATEWAY), find(WORKER)) {
            (Some(gateway), Some(worker)) => Ok(Programs { gateway, worker }),
            (gateway, worker) => Err(Error::ProgramsMissing {
                missing: [
                    gateway.is_none().then_some(GATEWAY),
                    worker.is_none().then_some(WORKER),
                ]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(" and "),
                looked: dirs[..own]
                    .iter()
                    .map(|d| d.display().to_string())
                    .chain((own < dirs.len()).then(|| "PATH".to_owned()))
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    /// [`Programs::find`]; when they are missing and the running program was started by cargo
    /// (`CARGO` is set, as with `cargo run --bin delta -- dev`), builds them first with the
    /// same profile (`$CARGO build [--release] --bin delta-gateway --bin delta-worker` in
    /// `root`), saying so on stderr.
    pub async fn find_or_build(root: Option<&Path>) -> Result<Programs, Error> {
        let missing = match Programs::find() {
            Ok(p) => return Ok(p),
            Err(e) => e,
        };
        let Some(cargo) = std::env::var_os("CARGO").filter(|c| !c.is_empty()) else {
            return Err(missing);
        };
        if std::env::var_os("DELTA_BIN_DIR").is_some() {
            return Err(missing);
        }
        let mut cmd = tokio::process::Command::new(&cargo);
        cmd.arg("build");
        if !cfg!(debug_assertions) {
            cmd.arg("--release");
        }
        cmd.args(["--bin", GATEWAY, "--bin", WORKER]);
        if let Some(root) = root {
            cmd.current_dir(root);
        }
        eprintln!(
            "building {GATEWAY} and {WORKER} (cargo build{} --bin {GATEWAY} --bin {WORKER})…",
            if cfg!(debug_assertions) {
                ""
            } else {
                " --release"
            }
        );
        let status = cmd.status().await.map_err(Error::io(format!(
            "running {}",
            Path::new(&cargo).display()
        )))?;
        if !status.success() {
            return Err(Error::Failed(format!(
                "building {GATEWAY} and {WORKER} failed ({status})"
            )));
        }
        Programs::find()
    }
}

/// Where [`Programs::find`] looks, in order, and how many of those come before `PATH`'s.
fn search_dirs() -> (Vec<PathBuf>, usize) {
    if let Some(dir) = std::env::var_os("DELTA_BIN_DIR").filter(|d| !d.is_empty()) {
        return (vec![PathBuf::from(dir)], 1);
    }
    let mut dirs = vec![];
    if let Some(exe_dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        let parent = exe_dir.parent().map(Path::to_path_buf);
        dirs.push(exe_dir);
        dirs.extend(parent);
    }
    let own = dirs.len();
    let path = std::env::var_os("PATH").unwrap_or_default();
    dirs.extend(std::env::split_paths(&path));
    (dirs, own)
}
