//! `context.yaml`: Delta Engine's (v1.6+) context composition, for the openai brain.
//!
//! The manifest lists the sources the LLM's messages are built from, in order:
//!
//! - `file`: a file's text as a system message `# Context Block: <id>\n\n<text>` (`${AGENT_HOME}`
//!   and `${CWD}` expand in `path`; `on_missing: skip` leaves out a missing file).
//! - `computed_file`: runs `generator.command` (in the work directory, like a tool, with
//!   `DELTA_RUN_ID`, `DELTA_AGENT_HOME`, `DELTA_CWD`; `timeout_ms`, default 30000), then reads
//!   `output_path` as a `file` source does. This is Delta Engine's memory folding: a generator
//!   summarizes the journal (`.delta/…`) into a file, and a `journal` source with
//!   `max_iterations` keeps only the recent turns verbatim.
//! - `journal`: the conversation (the task as the user's message, each thought with its tool
//!   calls, each result); `max_iterations: N` keeps the last N thoughts and what follows them
//!   (and, as in Delta Engine, drops what came before, the task included).
//!
//! Without `context.yaml` the brain composes as before: the system prompt, then the journal.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::tools::{self, Exit, Invocation, ToolEnv};

/// `on_missing:` of a file source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnMissing {
    #[default]
    Error,
    Skip,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Generator {
    pub command: Vec<String>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// One entry of `sources:`.
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Source {
    File {
        #[serde(default)]
        id: Option<String>,
        path: String,
        #[serde(default)]
        on_missing: OnMissing,
    },
    ComputedFile {
        #[serde(default)]
        id: Option<String>,
        generator: Generator,
        output_path: String,
        #[serde(default)]
        on_missing: OnMissing,
    },
    Journal {
        #[serde(default)]
        id: Option<String>,
        #[serde(default)]
        max_iterations: Option<u32>,
    },
}

/// `context.yaml`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub sources: Vec<Source>,
}

impl Manifest {
    /// What is wrong with a parsed manifest, if anything: (field, message).
    pub fn check(&self) -> Result<(), (String, String)> {
        if self.sources.is_empty() {
            return Err((
                "sources".into(),
                "must list at least one source (e.g. `- type: journal`)".into(),
            ));
        }
        for (i, s) in self.sources.iter().enumerate() {
            match s {
                Source::ComputedFile { generator, .. } => {
                    if generator
                        .command
                        .first()
                        .is_none_or(|c| c.trim().is_empty())
                    {
                        return Err((
                            format!("sources[{i}].generator.command"),
                            "must name a program".into(),
                        ));
                    }
                    if generator.timeout_ms == Some(0) {
                        return Err((
                            format!("sources[{i}].generator.timeout_ms"),
                            "must be positive".into(),
                        ));
                    }
                }
                Source::Journal {
                    max_iterations: Some(0),
                    ..
                } => {
                    return Err((
                        format!("sources[{i}].max_iterations"),
                        "must be positive".into(),
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// One piece of the composed context.
#[derive(Clone, Debug, PartialEq)]
pub enum Block {
    /// A system message's text (already wrapped as a context block).
    System(String),
    /// The journal, from the `skip`-th message of the full conversation on.
    Journal { max_iterations: Option<u32> },
}

/// A source that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("context.yaml: source `{source_id}`: {message}")]
pub struct Error {
    pub source_id: String,
    pub message: String,
}

/// Where composition runs.
#[derive(Clone, Debug)]
pub struct Place<'a> {
    pub agent_home: &'a Path,
    pub work_dir: &'a Path,
    pub run_id: String,
}

fn expand(template: &str, place: &Place<'_>) -> String {
    template
        .replace("${AGENT_HOME}", &place.agent_home.display().to_string())
        .replace("${CWD}", &place.work_dir.display().to_string())
}

/// The largest file a source reads (the rest would not fit a context window anyway).
const MAX_SOURCE_BYTES: u64 = 1024 * 1024;

enum ReadError {
    Missing(PathBuf),
    /// Not a file this engine reads (FIFO, device, symlink out of the work directory…).
    Refused(String),
    Other(String),
}

/// Reads a source's file: bounded, a regular file only, and — when it is in the work directory,
/// where tools write — resolved inside it (a symlink out of it is refused).
async fn read_source(path: &Path, place: &Place<'_>) -> Result<String, ReadError> {
    use crate::files::Error as F;
    let in_work_dir = path.starts_with(place.work_dir)
        || place
            .work_dir
            .canonicalize()
            .is_ok_and(|w| path.starts_with(w));
    let real = if in_work_dir {
        match crate::files::inside(path, place.work_dir) {
            Ok(real) => real,
            Err(F::Missing(p)) => return Err(ReadError::Missing(p)),
            Err(e) => return Err(ReadError::Refused(e.to_string())),
        }
    } else {
        // The agent's own files (the user's) may be symlinks: resolved, then read as files.
        match path.canonicalize() {
            Ok(real) => real,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ReadError::Missing(path.to_path_buf()));
            }
            Err(e) => return Err(ReadError::Other(format!("{}: {e}", path.display()))),
        }
    };
    match crate::files::read_text_async(real, MAX_SOURCE_BYTES).await {
        Ok(text) => Ok(text),
        Err(F::Missing(p)) => Err(ReadError::Missing(p)),
        Err(e @ (F::Symlink(_) | F::NotRegular(_) | F::Outside { .. })) => {
            Err(ReadError::Refused(e.to_string()))
        }
        Err(F::TooLarge { path, max }) => Err(ReadError::Other(format!(
            "{} is more than the {max} bytes a source may hold",
            path.display()
        ))),
        Err(e) => Err(ReadError::Other(e.to_string())),
    }
}

/// Resolves the manifest's sources into blocks (running generators), in order.
pub async fn compose(
    manifest: &Manifest,
    place: &Place<'_>,
    cancel: &CancellationToken,
) -> Result<Vec<Block>, Error> {
    let mut blocks = vec![];
    for source in &manifest.sources {
        let (id, path, on_missing) = match source {
            Source::Journal { max_iterations, .. } => {
                blocks.push(Block::Journal {
                    max_iterations: *max_iterations,
                });
                continue;
            }
            Source::File {
                id,
                path,
                on_missing,
            } => (
                id.clone().unwrap_or_else(|| "file".into()),
                path,
                *on_missing,
            ),
            Source::ComputedFile {
                id,
                generator,
                output_path,
                on_missing,
            } => {
                let id = id.clone().unwrap_or_else(|| "computed_file".into());
                run_generator(&id, generator, place, cancel).await?;
                (id, output_path, *on_missing)
            }
        };
        let path = PathBuf::from(expand(path, place));
        match read_source(&path, place).await {
            Ok(text) => blocks.push(Block::System(format!("# Context Block: {id}\n\n{text}"))),
            Err(ReadError::Missing(_)) if on_missing == OnMissing::Skip => {}
            Err(ReadError::Refused(why)) if on_missing == OnMissing::Skip => {
                tracing::warn!(source = %id, "context.yaml: source `{id}` skipped: {why}");
            }
            Err(ReadError::Refused(why)) => {
                return Err(Error {
                    source_id: id,
                    message: format!("refused: {why}"),
                });
            }
            Err(ReadError::Missing(p)) => {
                return Err(Error {
                    source_id: id,
                    message: format!(
                        "{} not found (add `on_missing: skip` if it is optional)",
                        p.display()
                    ),
                });
            }
            Err(ReadError::Other(message)) => {
                return Err(Error {
                    source_id: id,
                    message,
                });
            }
        }
    }
    Ok(blocks)
}

async fn run_generator(
    id: &str,
    generator: &Generator,
    place: &Place<'_>,
    cancel: &CancellationToken,
) -> Result<(), Error> {
    let mut argv: Vec<String> = generator.command.iter().map(|a| expand(a, place)).collect();
    // As a hook's: a relative program path is the agent directory's, not the work directory's.
    if let Some(program) = argv.first_mut() {
        *program = crate::hooks::resolve_program(program, place.agent_home);
    }
    let inv = Invocation {
        argv: argv.clone(),
        stdin: None,
        env: vec![],
    };
    let env = ToolEnv {
        work_dir: place.work_dir.to_path_buf(),
        agent_home: place.agent_home.to_path_buf(),
        vars: vec![
            ("DELTA_RUN_ID".into(), place.run_id.clone()),
            (
                "DELTA_AGENT_HOME".into(),
                place.agent_home.display().to_string(),
            ),
            ("DELTA_CWD".into(), place.work_dir.display().to_string()),
        ],
    };
    let timeout = Duration::from_millis(
        generator
            .timeout_ms
            .unwrap_or(crate::hooks::DEFAULT_TIMEOUT_MS),
    );
    let ex = tools::execute_reaped(&inv, &env, timeout, 64 * 1024, cancel).await;
    let why = match &ex.exit {
        Exit::Code(0) => return Ok(()),
        Exit::Code(c) => format!("exited with code {c}"),
        Exit::Signal(s) => format!("killed by signal {s}"),
        Exit::TimedOut => format!("timed out after {} ms", timeout.as_millis()),
        Exit::Cancelled => "cancelled".into(),
        Exit::SpawnFailed(e) => format!("could not start: {e}"),
    };
    let stderr: String = ex.stderr.chars().take(500).collect();
    Err(Error {
        source_id: id.to_owned(),
        message: format!("generator `{}` {why}; stderr: {stderr}", argv.join(" ")),
    })
}

impl Manifest {
    /// Whether a generator runs (and so may read the journal file Delta Engine's generators
    /// read: [`journal_file`]).
    pub fn has_generators(&self) -> bool {
        self.sources
            .iter()
            .any(|s| matches!(s, Source::ComputedFile { .. }))
    }
}

/// Where Delta Engine's generators find the run's journal: `<work dir>/.delta/<run_id>/journal.jsonl`.
pub fn journal_file(work_dir: &Path, run_id: &str) -> PathBuf {
    work_dir.join(".delta").join(run_id).join("journal.jsonl")
}

/// The run's journal as Delta Engine writes it (`RUN_START`, `USER_MESSAGE`, `THOUGHT` with
/// OpenAI-shaped `tool_calls`, `ACTION_REQUEST` with `tool_name`/`tool_args`, `ACTION_RESULT`,
/// `SYSTEM_MESSAGE`), one JSON object a line, for generators written for it. The journal is
/// the engine's (sensitive answers already `"***"`); `command_line` gives an action's command.
pub fn delta_engine_journal(
    journal: &[delta_protocol::JournalEvent],
    run_id: &str,
    task: &str,
    agent_ref: &Path,
    command_line: impl Fn(&str, &Value) -> String,
) -> String {
    use delta_protocol::{ActionStatus, Event, MessageLevel};
    use serde_json::json;
    let mut out = String::new();
    let mut seq = 0u64;
    let mut line = |timestamp: &delta_protocol::Timestamp, kind: &str, payload: Value| {
        seq += 1;
        let v = json!({"seq": seq, "timestamp": timestamp, "type": kind, "payload": payload});
        out.push_str(&v.to_string());
        out.push('\n');
    };
    let mut started = false;
    for e in journal {
        match &e.event {
            Event::EngineStart(_) if !started => {
                started = true;
                line(
                    &e.timestamp,
                    "RUN_START",
                    json!({"run_id": run_id, "task": task, "agent_ref": agent_ref}),
                );
                line(&e.timestamp, "USER_MESSAGE", json!({"content": task}));
            }
            Event::Thought(t) => {
                let calls: Vec<Value> = t
                    .tool_calls
                    .iter()
                    .flatten()
                    .map(|c| {
                        json!({"id": c.id, "type": "function",
                               "function": {"name": c.tool, "arguments": c.args.to_string()}})
                    })
                    .collect();
                let mut p = json!({"content": t.content});
                if !calls.is_empty() {
                    p["tool_calls"] = Value::Array(calls);
                }
                line(&e.timestamp, "THOUGHT", p);
            }
            Event::ActionRequest(r) => line(
                &e.timestamp,
                "ACTION_REQUEST",
                json!({"action_id": r.action_id, "tool_name": r.tool, "tool_args": r.args,
                       "resolved_command": command_line(&r.tool, &r.args)}),
            ),
            Event::ActionResult(r) => {
                let status = match r.status {
                    ActionStatus::Success | ActionStatus::Skipped => "SUCCESS",
                    ActionStatus::Error => "FAILED",
                    ActionStatus::Rejected => "ERROR",
                };
                line(
                    &e.timestamp,
                    "ACTION_RESULT",
                    json!({"action_id": r.action_id, "status": status,
                           "observation_content": r.observation_content}),
                );
            }
            Event::SystemMessage(m) => {
                let level = match m.level {
                    MessageLevel::Info => "INFO",
                    MessageLevel::Warn => "WARN",
                    MessageLevel::Error => "ERROR",
                };
                line(
                    &e.timestamp,
                    "SYSTEM_MESSAGE",
                    json!({"level": level, "content": m.content}),
                );
            }
            _ => {}
        }
    }
    out
}

/// Keeps the last `n` assistant turns of `conversation` (the journal's messages) and what
/// follows them; the whole conversation when it has no more.
pub fn last_turns(conversation: Vec<Value>, n: Option<u32>) -> Vec<Value> {
    let Some(n) = n else { return conversation };
    let turns: Vec<usize> = conversation
        .iter()
        .enumerate()
        .filter(|(_, m)| m["role"] == "assistant")
        .map(|(i, _)| i)
        .collect();
    let n = n as usize;
    if turns.len() <= n {
        return conversation;
    }
    let start = turns[turns.len() - n];
    conversation.into_iter().skip(start).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn manifests_parse_and_unknown_keys_are_named() {
        let m: Manifest = serde_yaml_ng::from_str(
            "sources:\n  - type: file\n    id: s\n    path: '${AGENT_HOME}/system_prompt.md'\n  - type: journal\n    max_iterations: 2\n",
        )
        .expect("parses");
        assert_eq!(m.sources.len(), 2);
        let err = serde_yaml_ng::from_str::<Manifest>(
            "sources:\n  - type: file\n    path: x\n    max_turns: 3\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("max_turns"), "{err}");
        let err = serde_yaml_ng::from_str::<Manifest>("sources:\n  - type: web\n    url: x\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("web"), "{err}");
    }

    #[test]
    fn the_last_turns_are_kept() {
        let c = vec![
            json!({"role": "user", "content": "task"}),
            json!({"role": "assistant", "content": "1"}),
            json!({"role": "tool", "content": "r1"}),
            json!({"role": "assistant", "content": "2"}),
            json!({"role": "tool", "content": "r2"}),
        ];
        assert_eq!(last_turns(c.clone(), None).len(), 5);
        assert_eq!(last_turns(c.clone(), Some(5)).len(), 5);
        let kept = last_turns(c, Some(1));
        assert_eq!(
            kept,
            vec![
                json!({"role": "assistant", "content": "2"}),
                json!({"role": "tool", "content": "r2"})
            ]
        );
    }

    #[tokio::test]
    async fn files_generators_and_missing_sources() {
        let home = tempfile::tempdir().expect("tempdir");
        let work = tempfile::tempdir().expect("tempdir");
        std::fs::write(home.path().join("p.md"), "be brief").expect("write");
        let m: Manifest = serde_yaml_ng::from_str(
            "sources:\n  - type: file\n    id: prompt\n    path: '${AGENT_HOME}/p.md'\n\
             \x20 - type: file\n    path: '${CWD}/DELTA.md'\n    on_missing: skip\n\
             \x20 - type: computed_file\n    id: summary\n    generator:\n      command: [sh, -c, 'echo \"run $DELTA_RUN_ID\" > out.md']\n    output_path: '${CWD}/out.md'\n\
             \x20 - type: journal\n",
        )
        .expect("parses");
        let place = Place {
            agent_home: home.path(),
            work_dir: work.path(),
            run_id: "r9".into(),
        };
        let blocks = compose(&m, &place, &CancellationToken::new())
            .await
            .expect("composes");
        assert_eq!(
            blocks,
            vec![
                Block::System("# Context Block: prompt\n\nbe brief".into()),
                Block::System("# Context Block: summary\n\nrun r9\n".into()),
                Block::Journal {
                    max_iterations: None
                },
            ]
        );
        let m: Manifest = serde_yaml_ng::from_str(
            "sources:\n  - type: file\n    id: guide\n    path: '${CWD}/DELTA.md'\n",
        )
        .expect("parses");
        let err = compose(&m, &place, &CancellationToken::new())
            .await
            .unwrap_err();
        assert_eq!(err.source_id, "guide");
        assert!(err.message.contains("on_missing: skip"), "{err}");
    }

    #[tokio::test]
    async fn fifos_devices_and_symlinks_out_of_the_work_dir_are_refused_without_hanging() {
        let home = tempfile::tempdir().expect("tempdir");
        let work = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        std::fs::write(outside.path().join("secret.md"), "s3cr3t").expect("write");
        nix::unistd::mkfifo(&work.path().join("DELTA.md"), nix::sys::stat::Mode::S_IRWXU)
            .expect("mkfifo");
        std::os::unix::fs::symlink("/dev/zero", work.path().join("zero.md")).expect("symlink");
        let place = Place {
            agent_home: home.path(),
            work_dir: work.path(),
            run_id: "r9".into(),
        };
        let compose_one = |yaml: String| {
            let place = place.clone();
            async move {
                let m: Manifest = serde_yaml_ng::from_str(&yaml).expect("parses");
                tokio::time::timeout(
                    std::time::Duration::from_secs(20),
                    compose(&m, &place, &CancellationToken::new()),
                )
                .await
                .expect("no hang")
            }
        };
        // Optional: skipped (with a warning), not read.
        let blocks = compose_one(
            "sources:\n  - type: file\n    id: guide\n    path: '${CWD}/DELTA.md'\n    on_missing: skip\n".into(),
        )
        .await
        .expect("skipped");
        assert!(blocks.is_empty());
        for (path, why) in [("DELTA.md", "not a regular file"), ("zero.md", "outside")] {
            let err = compose_one(format!(
                "sources:\n  - type: file\n    id: guide\n    path: '${{CWD}}/{path}'\n"
            ))
            .await
            .unwrap_err();
            assert_eq!(err.source_id, "guide");
            assert!(err.message.contains(why), "{path}: {err}");
        }
        // A generator's output symlinked out of the work directory.
        let target = outside.path().join("secret.md").display().to_string();
        let err = compose_one(format!(
            "sources:\n  - type: computed_file\n    id: summary\n    generator:\n      command: [ln, -sf, '{target}', out.md]\n    output_path: '${{CWD}}/out.md'\n"
        ))
        .await
        .unwrap_err();
        assert_eq!(err.source_id, "summary");
        assert!(err.message.contains("outside"), "{err}");
        assert!(!err.message.contains("s3cr3t"));
    }

    #[tokio::test]
    async fn a_generators_relative_program_is_the_agent_directorys() {
        let home = tempfile::tempdir().expect("tempdir");
        let work = tempfile::tempdir().expect("tempdir");
        for (dir, who) in [(work.path(), "work"), (home.path(), "agent")] {
            std::fs::create_dir_all(dir.join("gen")).expect("mkdir");
            let script = dir.join("gen/g.sh");
            std::fs::write(&script, format!("#!/bin/sh\necho {who} > out.md\n")).expect("write");
            std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .expect("chmod");
        }
        let m: Manifest = serde_yaml_ng::from_str(
            "sources:\n  - type: computed_file\n    id: s\n    generator:\n      command: [./gen/g.sh]\n    output_path: '${CWD}/out.md'\n",
        )
        .expect("parses");
        let place = Place {
            agent_home: home.path(),
            work_dir: work.path(),
            run_id: "r".into(),
        };
        let blocks = compose(&m, &place, &CancellationToken::new())
            .await
            .expect("composes");
        assert_eq!(
            blocks,
            vec![Block::System("# Context Block: s\n\nagent\n".into())]
        );
    }
}
