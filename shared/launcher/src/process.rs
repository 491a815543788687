//! A child process with its own log, signalled on demand and killed on drop (no leaks, even when
//! a test fails half-way).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::Error;

/// The process groups of the children started in groups of their own, for [`kill_all_now`].
static GROUPS: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());

/// Kills every child started in a group of its own, with its group, at once (SIGKILL): for an
/// exit that cannot wait for the ordered stop (a second Ctrl+C), so that nothing is left running.
pub fn kill_all_now() {
    let groups = GROUPS.lock().map(|g| g.clone()).unwrap_or_default();
    for pgid in groups {
        let _ = nix::sys::signal::killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
}

/// Sends `sig` to a process (ignoring one that is already gone).
pub fn signal(pid: u32, sig: Signal) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), sig);
    }
}

/// Where a child reports, and how it is grouped.
#[derive(Clone, Debug, Default)]
pub struct Output {
    /// Its stdout and stderr, appended to this file; `None` throws them away.
    pub log: Option<PathBuf>,
    /// `DELTA_LOG` of a gateway or worker (`info` when `None`).
    pub filter: Option<String>,
    /// A gateway or worker writes its finished spans here (`DELTA_SPANS_FILE`).
    pub spans: Option<PathBuf>,
    /// A process group of its own: a Ctrl+C at the terminal then reaches only the parent, which
    /// stops its children in order (`delta dev`); the whole group is killed on drop. Tests leave
    /// it off, so that interrupting `cargo test` stops their children too.
    pub own_group: bool,
    /// Its working directory (the caller's when `None`).
    pub cwd: Option<PathBuf>,
}

/// A running child process, killed (with its group, when it has one) on drop. It derefs to the
/// [`Child`] for `id`, `kill`, `wait` and `try_wait`.
#[derive(Debug)]
pub struct Process {
    name: String,
    log: Option<PathBuf>,
    own_group: bool,
    child: Child,
    /// Whether [`Process::exited`] reported its exit already.
    reported: bool,
}

impl Process {
    /// Starts `cmd` as `name`, reporting as `out` says.
    pub fn spawn(name: &str, cmd: &mut Command, out: &Output) -> Result<Process, Error> {
        let (stdout, stderr) = match &out.log {
            Some(path) => {
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(Error::io(format!("creating {}", path.display())))?;
                let err = file
                    .try_clone()
                    .map_err(Error::io(format!("opening {}", path.display())))?;
                (Stdio::from(file), Stdio::from(err))
            }
            None => (Stdio::null(), Stdio::null()),
        };
        cmd.stdin(Stdio::null()).stdout(stdout).stderr(stderr);
        if let Some(dir) = &out.cwd {
            cmd.current_dir(dir);
        }
        if out.own_group {
            std::os::unix::process::CommandExt::process_group(cmd, 0);
        }
        let child = cmd.spawn().map_err(Error::io(format!(
            "starting {name} ({})",
            Path::new(cmd.get_program()).display()
        )))?;
        if out.own_group
            && let (Ok(pid), Ok(mut groups)) = (i32::try_from(child.id()), GROUPS.lock())
        {
            groups.push(pid);
        }
        Ok(Process {
            name: name.to_owned(),
            log: out.log.clone(),
            own_group: out.own_group,
            child,
            reported: false,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its log file, if it has one.
    pub fn log(&self) -> Option<&Path> {
        self.log.as_deref()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `sig` to the process (SIGSTOP, SIGCONT, SIGTERM…).
    pub fn signal(&self, sig: Signal) {
        signal(self.pid(), sig);
    }

    /// Its exit status, the first time it is seen to have exited; `None` while it runs and
    /// after that.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.reported {
            return None;
        }
        let status = self.child.try_wait().ok().flatten();
        self.reported = status.is_some();
        status
    }

    /// Waits up to `within` for the process to exit by itself: its status, or `None`.
    pub fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops it gracefully: SIGTERM, then SIGKILL if it lingers past `grace`. Blocks.
    pub fn stop_blocking(&mut self, grace: Duration) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        self.signal(Signal::SIGTERM);
        if self.wait_exit(grace).is_none() {
            self.kill_now();
        }
    }

    /// [`Process::stop_blocking`] without blocking the runtime.
    pub async fn stop(&mut self, grace: Duration) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        self.signal(Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.kill_now();
    }

    /// SIGKILL (the whole group when it has its own) and reaps it.
    pub fn kill_now(&mut self) {
        if self.own_group
            && let Ok(pgid) = i32::try_from(self.child.id())
        {
            let _ = nix::sys::signal::killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The last `lines` lines of its log, for an error message (empty without a log).
    pub fn log_tail(&self, lines: usize) -> String {
        let Some(log) = &self.log else {
            return String::new();
        };
        let text = strip_ansi(&std::fs::read_to_string(log).unwrap_or_default());
        let all: Vec<&str> = text.lines().collect();
        let tail = all[all.len().saturating_sub(lines)..].join("\n  ");
        format!("; the end of {}:\n  {tail}", log.display())
    }

    /// Polls `ready` every 10 ms for up to `within`, failing early (with the end of its log) if
    /// the process exits meanwhile.
    pub fn wait_ready(
        &mut self,
        within: Duration,
        mut ready: impl FnMut() -> bool,
    ) -> Result<(), Error> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(self.exited_at_start(status));
            }
            if ready() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.not_ready(within));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// [`Process::wait_ready`] for an asynchronous check, without blocking the runtime.
    pub async fn wait_ready_async<F, Fut>(
        &mut self,
        within: Duration,
        mut ready: F,
    ) -> Result<(), Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(self.exited_at_start(status));
            }
            if ready().await {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.not_ready(within));
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
    }

    fn exited_at_start(&self, status: ExitStatus) -> Error {
        Error::ExitedAtStart {
            name: self.name.clone(),
            status,
            tail: self.log_tail(15),
        }
    }

    fn not_ready(&self, within: Duration) -> Error {
        Error::NotReady {
            name: self.name.clone(),
            secs: within.as_secs(),
            tail: self.log_tail(15),
        }
    }
}

impl std::ops::Deref for Process {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.child
    }
}

impl std::ops::DerefMut for Process {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.child
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill_now();
        if self.own_group
            && let (Ok(pid), Ok(mut groups)) = (i32::try_from(self.child.id()), GROUPS.lock())
        {
            groups.retain(|g| *g != pid);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_in_its_own_group_is_killed_with_its_children_on_drop() {
        let dir = tempfile::tempdir().expect("tmp");
        let log = dir.path().join("sh.log");
        let out = Output {
            log: Some(log.clone()),
            own_group: true,
            ..Default::default()
        };
        // The shell starts a child of its own and says its pid.
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "sleep 60 & echo child $!; wait"]);
        let mut p = Process::spawn("sh", &mut cmd, &out).expect("spawn");
        p.wait_ready(Duration::from_secs(10), || {
            std::fs::read_to_string(&log).is_ok_and(|t| t.contains("child "))
        })
        .expect("ready");
        let text = std::fs::read_to_string(&log).expect("log");
        let child: i32 = text
            .trim()
            .trim_start_matches("child ")
            .parse()
            .expect("pid");
        assert!(p.exited().is_none());
        drop(p);
        // The grandchild went with the group: signal 0 finds nothing (or a zombie being reaped).
        let deadline = Instant::now() + Duration::from_secs(5);
        while nix::sys::signal::kill(Pid::from_raw(child), None).is_ok()
            && std::fs::read_to_string(format!("/proc/{child}/stat"))
                .is_ok_and(|s| !s.contains(") Z "))
        {
            assert!(
                Instant::now() < deadline,
                "sleep {child} outlived its group"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn a_process_that_exits_at_start_says_so_with_its_log() {
        let dir = tempfile::tempdir().expect("tmp");
        let out = Output {
            log: Some(dir.path().join("x.log")),
            ..Default::default()
        };
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo no such config >&2; exit 3"]);
        let mut p = Process::spawn("x", &mut cmd, &out).expect("spawn");
        let err = p
            .wait_ready(Duration::from_secs(10), || false)
            .expect_err("exits");
        assert!(matches!(err, Error::ExitedAtStart { .. }), "{err:?}");
        assert!(err.to_string().contains("no such config"), "{err}");
    }
}
