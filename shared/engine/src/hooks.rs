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
//! What a hook may return (only read when it exits 0):
//! - `pre_llm_req`: `output/final_payload.json`, the request sent instead of the proposed one.
//! - `pre_tool_exec`: `output/control.json` with `"skip": true`: the tool does not run.
//!
//! A hook that fails (non-zero exit, timeout, cannot start, unreadable output) never fails the
//! run: the engine goes on as if it had not been configured, and says so in the journal. Every
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
    /// `output/final_payload.json` (pre_llm_req), parsed.
    pub final_payload: Option<Value>,
    /// `output/control.json`, parsed.
    pub control: Option<Value>,
    /// The journal line: `hook <name>: SUCCESS (io/hooks/001_pre_llm_req/)` or why it failed.
    pub audit: String,
}

impl HookOutcome {
    /// `control.json` asks to skip the tool (`"skip": true`).
    pub fn skips(&self) -> bool {
        self.success
            && self
                .control
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
            success: false,
            final_payload: None,
            control: None,
            audit: format!("hook {}: FAILED ({io_ref}): {why}", kind.name()),
        };
        if let Err(e) = prepare(&io, kind, step, &self.run_id, payload) {
            return fail(format!("cannot prepare {}: {e}", io.display()));
        }
        let home = self.agent_home.display().to_string();
        let argv: Vec<String> = spec
            .command
            .iter()
            .map(|p| p.replace("${AGENT_HOME}", &home))
            .collect();
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
        let ex = tools::execute(&inv, &env, spec.timeout(), MAX_LOG_BYTES, cancel).await;
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
        match &ex.exit {
            Exit::Code(0) => {}
            Exit::Code(c) => return fail(format!("exit code {c}")),
            Exit::Signal(s) => return fail(format!("killed by signal {s}")),
            Exit::TimedOut => {
                return fail(format!(
                    "timed out after {} ms and was killed",
                    spec.timeout().as_millis()
                ));
            }
            Exit::Cancelled => return fail("cancelled".into()),
            Exit::SpawnFailed(e) => return fail(format!("could not start: {e}")),
        }
        let out = io.join("output");
        // Only `pre_llm_req` may replace its payload (as in Delta Engine).
        let final_payload = match kind {
            HookKind::PreLlmReq => match read_json(&out.join("final_payload.json")) {
                Ok(v) => v,
                Err(e) => return fail(e),
            },
            _ => None,
        };
        let control = match read_json(&out.join("control.json")) {
            Ok(v) => v,
            Err(e) => return fail(e),
        };
        let mut audit = format!("hook {}: SUCCESS ({io_ref}) in {ms} ms", kind.name());
        if final_payload.is_some() {
            audit.push_str("; output/final_payload.json used");
        }
        if control.is_some() {
            audit.push_str("; output/control.json read");
        }
        HookOutcome {
            success: true,
            final_payload,
            control,
            audit,
        }
    }
}

fn prepare(
    io: &Path,
    kind: HookKind,
    step: u64,
    run_id: &str,
    payload: &Value,
) -> std::io::Result<()> {
    for sub in ["input", "output", "execution_meta"] {
        std::fs::create_dir_all(io.join(sub))?;
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

/// A JSON output file, if the hook wrote one.
fn read_json(path: &Path) -> Result<Option<Value>, String> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("output/{name}: {e}")),
    };
    if meta.len() > MAX_OUTPUT_FILE_BYTES {
        return Err(format!(
            "output/{name} is {} bytes, more than the {MAX_OUTPUT_FILE_BYTES} read back",
            meta.len()
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("output/{name}: {e}"))?;
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
        assert!(!env.contains("API_KEY"));
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
}
