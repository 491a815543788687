//! Lifecycle hooks, with Delta Engine's (v1.10) protocol: `hooks.yaml` (or the legacy
//! `lifecycle_hooks:` of the agent's config) names a command per hook, run as a process like a
//! tool, and talking to the engine through files.
//!
//! Each call gets a directory `<work dir>/.delta/<run_id>/io/hooks/<NNN>_<hook>/` with
//! `input/context.json` (`hook_name`, `step_index`, `run_id`, `timestamp`), the payload
//! (`input/proposed_payload.json` for `pre_llm_req`, `input/payload.json` otherwise), an empty
//! `output/` and, once it ran, `execution_meta/` (`command.txt`, `stdout.log`, `stderr.log`,
//! `exit_code.txt`, `duration_ms.txt`). The hook runs in the work directory with `DELTA_RUN_ID`
//! and `DELTA_HOOK_IO_PATH` (that directory) and, like a tool, nothing else of the host's
//! environment but `PATH`, `HOME`, `LANG`, `TZ`: no API key ever reaches it.
//!
//! What a hook may return:
//! - `pre_llm_req`: `output/final_payload.json`, the request sent instead of the proposed one
//!   (read only when it exits 0; the journal line holds the SHA-256 of the request sent).
//! - `pre_tool_exec`: `output/control.json` with `"skip": true`: the tool does not run — read
//!   whatever the exit code (Delta Engine's guard writes it and exits 1). A `pre_tool_exec` that
//!   fails without a readable answer (non-zero exit, timeout, crash, cannot start, unreadable
//!   `control.json`) fails closed: the tool is not run.
//!
//! Each call's directory is made afresh (anything left there is removed first, without following
//! symlinks), and output files are read only as regular files, bounded ([`crate::files`]). A
//! relative program path is the agent directory's ([`resolve_program`]). The hook's process group
//! is killed once it exits.
//!
//! Any other hook that fails never fails the run: the engine goes on as if it had not been
//! configured, and says so in the journal. Every
//! call is journaled as a `SYSTEM_MESSAGE` (`hook <name>: SUCCESS|FAILED …`), Delta Engine's
//! `HOOK_EXECUTION_AUDIT`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::tools::{self, Exit, Invocation, ToolEnv};

/// Default `timeout_ms` (Delta Engine's documented default).
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;
/// The range Delta Engine documents for `timeout_ms`.
pub const TIMEOUT_RANGE_MS: std::ops::RangeInclusive<u64> = 100..=600_000;
/// Kept of a hook's stdout and stderr (each).
const MAX_LOG_BYTES: usize = 64 * 1024;
/// The largest `final_payload.json` / `control.json` read back.
const MAX_OUTPUT_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// One hook's declaration.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookSpec {
    /// The argv; `${AGENT_HOME}` expands in each part.
    pub command: Vec<String>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    #[serde(default)]
    pub description: Option<String>,
}

impl HookSpec {
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS))
    }
}

/// `hooks.yaml` (or `lifecycle_hooks:`): the hooks Delta Engine knows. Any other name is refused.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hooks {
    #[serde(default)]
    pub pre_llm_req: Option<HookSpec>,
    #[serde(default)]
    pub post_llm_resp: Option<HookSpec>,
    #[serde(default)]
    pub pre_tool_exec: Option<HookSpec>,
    #[serde(default)]
    pub post_tool_exec: Option<HookSpec>,
    #[serde(default)]
    pub on_error: Option<HookSpec>,
    #[serde(default)]
    pub on_run_end: Option<HookSpec>,
}

/// Which hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookKind {
    PreLlmReq,
    PostLlmResp,
    PreToolExec,
    PostToolExec,
    OnError,
    OnRunEnd,
}

impl HookKind {
    pub const ALL: [HookKind; 6] = [
        HookKind::PreLlmReq,
        HookKind::PostLlmResp,
        HookKind::PreToolExec,
        HookKind::PostToolExec,
        HookKind::OnError,
        HookKind::OnRunEnd,
    ];

    pub fn name(self) -> &'static str {
        match self {
            HookKind::PreLlmReq => "pre_llm_req",
            HookKind::PostLlmResp => "post_llm_resp",
            HookKind::PreToolExec => "pre_tool_exec",
            HookKind::PostToolExec => "post_tool_exec",
            HookKind::OnError => "on_error",
            HookKind::OnRunEnd => "on_run_end",
        }
    }
}

impl Hooks {
    pub fn get(&self, kind: HookKind) -> Option<&HookSpec> {
        match kind {
            HookKind::PreLlmReq => self.pre_llm_req.as_ref(),
            HookKind::PostLlmResp => self.post_llm_resp.as_ref(),
            HookKind::PreToolExec => self.pre_tool_exec.as_ref(),
            HookKind::PostToolExec => self.post_tool_exec.as_ref(),
            HookKind::OnError => self.on_error.as_ref(),
            HookKind::OnRunEnd => self.on_run_end.as_ref(),
        }
    }

    pub fn is_empty(&self) -> bool {
        HookKind::ALL.iter().all(|k| self.get(*k).is_none())
    }

    /// Checks every declared hook: a command, and a timeout in Delta Engine's range. Returns
    /// the hook's name and what is wrong.
    pub fn check(&self) -> Result<(), (String, String)> {
        for kind in HookKind::ALL {
            let Some(h) = self.get(kind) else { continue };
            if h.command.first().is_none_or(|c| c.trim().is_empty()) {
                return Err((
                    format!("{}.command", kind.name()),
                    "must name a program: `command: [./hooks/check.sh]`".into(),
                ));
            }
            if let Some(ms) = h.timeout_ms
                && !TIMEOUT_RANGE_MS.contains(&ms)
            {
                return Err((
                    format!("{}.timeout_ms", kind.name()),
                    format!(
                        "{ms} is outside {}..={} (milliseconds)",
                        TIMEOUT_RANGE_MS.start(),
                        TIMEOUT_RANGE_MS.end()
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// What one hook call gave back.
#[derive(Clone, Debug, Default)]
pub struct HookOutcome {
    /// Exited 0 (and its output, if any, was readable).
    pub success: bool,
    /// The host cancelled the call (the run is being interrupted).
    pub cancelled: bool,
    /// `output/final_payload.json` (pre_llm_req), parsed.
    pub final_payload: Option<Value>,
    /// `output/control.json` (pre_tool_exec), parsed — read whatever the exit code.
    pub control: Option<Value>,
    /// The journal line: `hook <name>: SUCCESS (io/hooks/001_pre_llm_req/)` or why it failed.
    pub audit: String,
}

impl HookOutcome {
    /// `control.json` asks to skip the tool (`"skip": true`), whatever the hook's exit code:
    /// Delta Engine's documented guard writes it and exits 1.
    pub fn skips(&self) -> bool {
        self.control
            .as_ref()
            .and_then(|c| c.get("skip"))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }
}

/// Where and as whom hooks run.
#[derive(Clone, Debug)]
pub struct HookHost {
    pub run_id: String,
    pub work_dir: PathBuf,
    pub agent_home: PathBuf,
}

/// A hook's (or generator's) program: a relative path with a `/` (`./hooks/check.sh`,
/// `hooks/check.sh`) is the agent directory's, never the work directory's (which tools write);
/// a bare name is looked up in `PATH`.
pub fn resolve_program(program: &str, agent_home: &Path) -> String {
    let p = Path::new(program);
    if p.is_relative() && program.contains('/') {
        agent_home.join(p).display().to_string()
    } else {
        program.to_owned()
    }
}

impl HookHost {
    /// `<work dir>/.delta/<run_id>/io/hooks`.
    pub fn hooks_dir(&self) -> PathBuf {
        self.work_dir
            .join(".delta")
            .join(&self.run_id)
            .join("io")
            .join("hooks")
    }

    /// Runs hook `kind` (`spec`) as call number `step` with `payload`.
    pub async fn run(
        &self,
        kind: HookKind,
        spec: &HookSpec,
        step: u64,
        payload: &Value,
        cancel: &CancellationToken,
    ) -> HookOutcome {
        let dir_name = format!("{step:03}_{}", kind.name());
        let io = self.hooks_dir().join(&dir_name);
        let io_ref = format!("io/hooks/{dir_name}/");
        let fail = |why: String| HookOutcome {
            audit: format!("hook {}: FAILED ({io_ref}): {why}", kind.name()),
            ..HookOutcome::default()
        };
        if let Err(e) = prepare(&io, kind, step, &self.run_id, payload) {
            return fail(format!("cannot prepare {}: {e}", io.display()));
        }
        let home = self.agent_home.display().to_string();
        let mut argv: Vec<String> = spec
            .command
            .iter()
            .map(|p| p.replace("${AGENT_HOME}", &home))
            .collect();
        if let Some(program) = argv.first_mut() {
            *program = resolve_program(program, &self.agent_home);
        }
        let inv = Invocation {
            argv: argv.clone(),
            stdin: None,
            env: vec![],
        };
        let env = ToolEnv {
            work_dir: self.work_dir.clone(),
            agent_home: self.agent_home.clone(),
            vars: vec![
                ("DELTA_RUN_ID".into(), self.run_id.clone()),
                ("DELTA_HOOK_IO_PATH".into(), io.display().to_string()),
            ],
        };
        let ex = tools::execute_reaped(&inv, &env, spec.timeout(), MAX_LOG_BYTES, cancel).await;
        let code = match &ex.exit {
            Exit::Code(c) => *c,
            _ => -1,
        };
        let meta = io.join("execution_meta");
        let ms = ex.duration.as_millis();
        for (file, text) in [
            ("command.txt", argv.join(" ")),
            ("stdout.log", ex.stdout.clone()),
            ("stderr.log", ex.stderr.clone()),
            ("exit_code.txt", code.to_string()),
            ("duration_ms.txt", ms.to_string()),
        ] {
            // The metadata is for people reading the run afterwards: losing it fails nothing.
            let _ = std::fs::write(meta.join(file), text);
        }
        let failure = match &ex.exit {
            Exit::Code(0) => None,
            Exit::Code(c) => Some(format!("exit code {c}")),
            Exit::Signal(s) => Some(format!("killed by signal {s}")),
            Exit::TimedOut => Some(format!(
                "timed out after {} ms and was killed",
                spec.timeout().as_millis()
            )),
            Exit::Cancelled => {
                let mut out = fail("cancelled".into());
                out.cancelled = true;
                return out;
            }
            Exit::SpawnFailed(e) => return fail(format!("could not start: {e}")),
        };
        let out = io.join("output");
        // The hook may have replaced `output/` itself: only a real directory is read from.
        if !std::fs::symlink_metadata(&out).is_ok_and(|m| m.is_dir()) {
            return fail("output/ is no longer a directory: nothing read from it".into());
        }
        let mut notes = vec![];
        // `control.json` is pre_tool_exec's (and read even after a non-zero exit: a guard that
        // writes `skip` and exits 1 must still stop the tool).
        let control = if kind == HookKind::PreToolExec {
            match read_json(out.join("control.json")).await {
                Ok(v) => v,
                Err(e) => {
                    let mut o = fail(match &failure {
                        Some(f) => format!("{f}; {e}"),
                        None => e,
                    });
                    // Unreadable: the guard's word is unknown.
                    o.control = None;
                    return o;
                }
            }
        } else {
            if std::fs::symlink_metadata(out.join("control.json")).is_ok() {
                notes.push(
                    "output/control.json ignored (only pre_tool_exec's is read by this engine)"
                        .to_owned(),
                );
            }
            None
        };
        if let Some(c) = control.as_ref().and_then(Value::as_object) {
            let ignored: Vec<&str> = c
                .keys()
                .map(String::as_str)
                .filter(|k| *k != "skip")
                .collect();
            if !ignored.is_empty() {
                notes.push(format!(
                    "control.json keys ignored by this engine: {}",
                    ignored.join(", ")
                ));
            }
        }
        if let Some(f) = failure {
            let mut o = fail(f);
            if control.is_some() {
                o.audit.push_str("; output/control.json read");
            }
            for n in notes {
                o.audit.push_str("; ");
                o.audit.push_str(&n);
            }
            o.control = control;
            return o;
        }
        // Only `pre_llm_req` may replace its payload (as in Delta Engine).
        let final_payload = match kind {
            HookKind::PreLlmReq => match read_json(out.join("final_payload.json")).await {
                Ok(v) => v,
                Err(e) => return fail(e),
            },
            _ => None,
        };
        let mut audit = format!("hook {}: SUCCESS ({io_ref}) in {ms} ms", kind.name());
        if let Some(p) = &final_payload {
            // What was sent instead, identifiable afterwards without keeping the request.
            let bytes = serde_json::to_vec(p).unwrap_or_default();
            let digest = ring::digest::digest(&ring::digest::SHA256, &bytes);
            let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
            audit.push_str(&format!(
                "; output/final_payload.json used: the LLM request was replaced (sha256 {hex})"
            ));
        }
        if control.is_some() {
            audit.push_str("; output/control.json read");
        }
        for n in notes {
            audit.push_str("; ");
            audit.push_str(&n);
        }
        HookOutcome {
            success: true,
            cancelled: false,
            final_payload,
            control,
            audit,
        }
    }
}

/// Makes the call's directory afresh: whatever was there (left by a crashed call, or planted by a
/// tool, which can write the work directory) is moved aside and removed without following any
/// symlink, so a stale `final_payload.json` or `control.json` is never read back.
fn prepare(
    io: &Path,
    kind: HookKind,
    step: u64,
    run_id: &str,
    payload: &Value,
) -> std::io::Result<()> {
    if let Some(parent) = io.parent() {
        std::fs::create_dir_all(parent)?;
    }
    if let Ok(old) = std::fs::symlink_metadata(io) {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let aside = io.with_file_name(format!(
            ".stale-{}-{}-{nanos}",
            std::process::id(),
            io.file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default()
        ));
        std::fs::rename(io, &aside)?;
        // `remove_dir_all` does not follow symlinks; a symlink itself is removed as a file.
        if old.is_dir() {
            std::fs::remove_dir_all(&aside)?;
        } else {
            std::fs::remove_file(&aside)?;
        }
    }
    // Fails if something appeared meanwhile.
    std::fs::create_dir(io)?;
    for sub in ["input", "output", "execution_meta"] {
        std::fs::create_dir(io.join(sub))?;
    }
    let context = json!({
        "hook_name": kind.name(),
        "step_index": step,
        "run_id": run_id,
        "timestamp": delta_protocol::Timestamp::now(),
    });
    std::fs::write(
        io.join("input").join("context.json"),
        serde_json::to_string_pretty(&context).unwrap_or_default(),
    )?;
    let file = match kind {
        HookKind::PreLlmReq => "proposed_payload.json",
        _ => "payload.json",
    };
    std::fs::write(
        io.join("input").join(file),
        serde_json::to_string_pretty(payload).unwrap_or_default(),
    )
}

/// A JSON output file, if the hook wrote one: a regular file (no symlink, FIFO or device), at
/// most [`MAX_OUTPUT_FILE_BYTES`], read off the runtime.
async fn read_json(path: PathBuf) -> Result<Option<Value>, String> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let text = match crate::files::read_text_async(path, MAX_OUTPUT_FILE_BYTES).await {
        Ok(t) => t,
        Err(crate::files::Error::Missing(_)) => return Ok(None),
        Err(crate::files::Error::TooLarge { max, .. }) => {
            return Err(format!(
                "output/{name} is more than the {max} bytes read back"
            ));
        }
        Err(crate::files::Error::Symlink(_)) => {
            return Err(format!("output/{name} is a symbolic link: refused"));
        }
        Err(crate::files::Error::NotRegular(_)) => {
            return Err(format!("output/{name} is not a regular file: refused"));
        }
        Err(e) => return Err(format!("output/{name}: {e}")),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| format!("output/{name} is not JSON: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_hooks_and_bad_timeouts_are_refused_by_name() {
        let err = serde_yaml_ng::from_str::<Hooks>("pre_llm_request:\n  command: [x]\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("pre_llm_request"), "{err}");
        let h: Hooks = serde_yaml_ng::from_str("on_error:\n  command: [x]\n  timeout_ms: 5\n")
            .expect("parses");
        let (field, _) = h.check().unwrap_err();
        assert_eq!(field, "on_error.timeout_ms");
        let h: Hooks = serde_yaml_ng::from_str("on_error:\n  command: []\n").expect("parses");
        assert_eq!(h.check().unwrap_err().0, "on_error.command");
    }

    #[tokio::test]
    async fn a_hook_reads_its_input_and_its_output_is_read_back() {
        let work = tempfile::tempdir().expect("tempdir");
        let host = HookHost {
            run_id: "r1".into(),
            work_dir: work.path().to_path_buf(),
            agent_home: work.path().to_path_buf(),
        };
        let spec = HookSpec {
            command: vec![
                "sh".into(),
                "-c".into(),
                "cat \"$DELTA_HOOK_IO_PATH/input/payload.json\" > seen.json; \
                 echo '{\"skip\": true}' > \"$DELTA_HOOK_IO_PATH/output/control.json\"; \
                 env > env.txt"
                    .into(),
            ],
            timeout_ms: None,
            description: None,
        };
        let out = host
            .run(
                HookKind::PreToolExec,
                &spec,
                1,
                &json!({"tool_name": "t"}),
                &CancellationToken::new(),
            )
            .await;
        assert!(out.success, "{}", out.audit);
        assert!(out.skips());
        assert!(
            out.audit
                .starts_with("hook pre_tool_exec: SUCCESS (io/hooks/001_pre_tool_exec/)")
        );
        let seen: Value = serde_json::from_str(
            &std::fs::read_to_string(work.path().join("seen.json")).expect("written"),
        )
        .expect("json");
        assert_eq!(seen["tool_name"], "t");
        let env = std::fs::read_to_string(work.path().join("env.txt")).expect("env");
        assert!(env.contains("DELTA_RUN_ID=r1"));
        // Nothing of this process's environment but the base variables reaches the hook (cargo
        // sets CARGO_* here, at least: this cannot pass vacuously).
        let leaked: Vec<String> = std::env::vars()
            .filter(|(k, _)| !crate::tools::BASE_ENV.contains(&k.as_str()))
            // What a shell sets for itself.
            .filter(|(k, _)| !["PWD", "OLDPWD", "SHLVL", "_"].contains(&k.as_str()))
            .filter(|(k, v)| env.contains(&format!("{k}={v}")))
            .map(|(k, _)| k)
            .collect();
        assert!(std::env::vars().count() > crate::tools::BASE_ENV.len());
        assert!(leaked.is_empty(), "{leaked:?}");
        let code = std::fs::read_to_string(
            work.path()
                .join(".delta/r1/io/hooks/001_pre_tool_exec/execution_meta/exit_code.txt"),
        )
        .expect("meta");
        assert_eq!(code, "0");
    }

    #[tokio::test]
    async fn a_failing_or_slow_hook_says_why() {
        let work = tempfile::tempdir().expect("tempdir");
        let host = HookHost {
            run_id: "r1".into(),
            work_dir: work.path().to_path_buf(),
            agent_home: work.path().to_path_buf(),
        };
        let spec = |cmd: &str, ms| HookSpec {
            command: vec!["sh".into(), "-c".into(), cmd.into()],
            timeout_ms: Some(ms),
            description: None,
        };
        let c = CancellationToken::new();
        let out = host
            .run(HookKind::OnError, &spec("exit 3", 5000), 1, &json!({}), &c)
            .await;
        assert!(!out.success);
        assert!(out.audit.ends_with("exit code 3"), "{}", out.audit);
        let out = host
            .run(HookKind::OnError, &spec("sleep 30", 100), 2, &json!({}), &c)
            .await;
        assert!(
            out.audit.contains("timed out after 100 ms"),
            "{}",
            out.audit
        );
        let out = host
            .run(
                HookKind::PreLlmReq,
                &spec(
                    "echo nope > \"$DELTA_HOOK_IO_PATH/output/final_payload.json\"",
                    5000,
                ),
                3,
                &json!({}),
                &c,
            )
            .await;
        assert!(!out.success);
        assert!(
            out.audit.contains("final_payload.json is not JSON"),
            "{}",
            out.audit
        );
    }

    fn host(work: &Path, home: &Path) -> HookHost {
        HookHost {
            run_id: "r1".into(),
            work_dir: work.to_path_buf(),
            agent_home: home.to_path_buf(),
        }
    }

    fn sh(cmd: &str) -> HookSpec {
        HookSpec {
            command: vec!["sh".into(), "-c".into(), cmd.into()],
            timeout_ms: Some(5000),
            description: None,
        }
    }

    #[tokio::test]
    async fn a_stale_or_planted_output_is_never_read() {
        let work = tempfile::tempdir().expect("tempdir");
        let host = host(work.path(), work.path());
        // A tool (or a crashed earlier call) left answers where call 1 will look.
        let io = host.hooks_dir().join("001_pre_llm_req");
        std::fs::create_dir_all(io.join("output")).expect("mkdir");
        std::fs::write(io.join("output/final_payload.json"), r#"{"model": "evil"}"#)
            .expect("write");
        let io2 = host.hooks_dir().join("002_pre_tool_exec");
        let elsewhere = tempfile::tempdir().expect("tempdir");
        std::fs::write(elsewhere.path().join("control.json"), r#"{"skip": true}"#).expect("write");
        std::fs::create_dir_all(&io2).expect("mkdir");
        std::os::unix::fs::symlink(elsewhere.path(), io2.join("output")).expect("symlink");
        let c = CancellationToken::new();
        let out = host
            .run(HookKind::PreLlmReq, &sh("true"), 1, &json!({}), &c)
            .await;
        assert!(out.success, "{}", out.audit);
        assert_eq!(out.final_payload, None);
        let out = host
            .run(HookKind::PreToolExec, &sh("true"), 2, &json!({}), &c)
            .await;
        assert!(out.success && !out.skips(), "{}", out.audit);
        // The symlink was removed, not followed.
        assert!(elsewhere.path().join("control.json").exists());
    }

    #[tokio::test]
    async fn fifo_device_and_symlinked_outputs_are_refused_without_hanging() {
        let work = tempfile::tempdir().expect("tempdir");
        let host = host(work.path(), work.path());
        let c = CancellationToken::new();
        for (n, (kind, cmd)) in [
            (
                HookKind::PreLlmReq,
                "ln -s /dev/zero \"$DELTA_HOOK_IO_PATH/output/final_payload.json\"",
            ),
            (
                HookKind::PreToolExec,
                "mkfifo \"$DELTA_HOOK_IO_PATH/output/control.json\"",
            ),
            (
                HookKind::PreToolExec,
                "echo '{\"skip\": true}' > /tmp/defix-c.json; ln -sf /tmp/defix-c.json \"$DELTA_HOOK_IO_PATH/output/control.json\"",
            ),
        ]
        .into_iter()
        .enumerate()
        {
            let out = tokio::time::timeout(
                Duration::from_secs(20),
                host.run(kind, &sh(cmd), n as u64 + 1, &json!({}), &c),
            )
            .await
            .expect("no hang");
            assert!(!out.success, "{cmd}: {}", out.audit);
            assert!(out.audit.contains("refused"), "{cmd}: {}", out.audit);
            assert!(out.final_payload.is_none() && out.control.is_none());
        }
    }

    #[tokio::test]
    async fn skip_counts_on_exit_1_and_ignored_keys_are_named() {
        let work = tempfile::tempdir().expect("tempdir");
        let host = host(work.path(), work.path());
        let out = host
            .run(
                HookKind::PreToolExec,
                &sh(r#"echo '{"skip": true, "action": "ABORT", "message": "no"}' > "$DELTA_HOOK_IO_PATH/output/control.json"; exit 1"#),
                1,
                &json!({}),
                &CancellationToken::new(),
            )
            .await;
        assert!(!out.success);
        assert!(out.skips(), "{}", out.audit);
        assert!(
            out.audit
                .contains("control.json keys ignored by this engine: action, message"),
            "{}",
            out.audit
        );
    }

    #[tokio::test]
    async fn relative_programs_are_the_agent_directorys_and_leftovers_are_killed() {
        let work = tempfile::tempdir().expect("tempdir");
        let home = tempfile::tempdir().expect("tempdir");
        for (dir, who) in [(work.path(), "work"), (home.path(), "agent")] {
            std::fs::create_dir_all(dir.join("hooks")).expect("mkdir");
            let script = dir.join("hooks/h.sh");
            std::fs::write(
                &script,
                format!("#!/bin/sh\necho {who} > by.txt\nsleep 300 &\necho $! > pid.txt\n"),
            )
            .expect("write");
            std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .expect("chmod");
        }
        let spec = HookSpec {
            command: vec!["./hooks/h.sh".into()],
            timeout_ms: None,
            description: None,
        };
        let out = host(work.path(), home.path())
            .run(
                HookKind::OnError,
                &spec,
                1,
                &json!({}),
                &CancellationToken::new(),
            )
            .await;
        assert!(out.success, "{}", out.audit);
        let by = std::fs::read_to_string(work.path().join("by.txt")).expect("ran");
        assert_eq!(by.trim(), "agent");
        let pid = std::fs::read_to_string(work.path().join("pid.txt")).expect("pid");
        let proc = PathBuf::from(format!("/proc/{}", pid.trim()));
        let mut gone = false;
        for _ in 0..100 {
            // Killed (and reaped by init), or at least a zombie.
            let state = std::fs::read_to_string(proc.join("stat")).unwrap_or_default();
            if state.is_empty() || state.contains(") Z ") {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(gone, "the hook's background process outlived it");
    }
}
