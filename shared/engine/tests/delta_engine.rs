//! Delta Engine v1.10's own agents (`tests/fixtures/delta-engine/`, copied from its repository)
//! load here, with what this engine does not use named in warnings.

use std::path::PathBuf;

use delta_engine::agent::{Agent, BrainKind, Error, config_file};

fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/delta-engine")
        .join(rel)
}

#[test]
fn every_example_loads() {
    for (name, tools) in [
        ("hello-world", 5),
        ("tool-syntax", 8),
        ("interactive-shell", 3),
        ("python-repl", 3),
        ("delta-agent-generator", 8),
    ] {
        let dir = fixture(&format!("examples/{name}"));
        let agent = Agent::load(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(agent.brain, BrainKind::Openai, "{name}");
        assert_eq!(agent.tools.len(), tools, "{name}");
        assert!(agent.config_path.ends_with("agent.yaml"), "{name}");
        let context = agent.context.as_ref().expect("context.yaml");
        assert_eq!(context.sources.len(), 3, "{name}");
        assert!(agent.system_prompt.trim_start().starts_with('#'), "{name}");
    }
}

#[test]
fn a_hooks_key_in_agent_yaml_is_named_in_a_warning() {
    // delta-agent-generator declares `hooks:` in agent.yaml, which Delta Engine ignores too.
    let agent = Agent::load(&fixture("examples/delta-agent-generator")).expect("loads");
    assert!(agent.hooks.is_empty());
    assert!(
        agent
            .warnings
            .iter()
            .any(|w| w.starts_with("agent.yaml: `hooks` is not read from agent.yaml")),
        "{:?}",
        agent.warnings
    );
    let hello = Agent::load(&fixture("examples/hello-world")).expect("loads");
    assert!(hello.warnings.is_empty(), "{:?}", hello.warnings);
}

#[test]
fn config_yaml_and_its_lifecycle_hooks_load_with_a_deprecation_warning() {
    let dir = fixture("fixtures/agent-with-config-yaml");
    assert_eq!(config_file(&dir), Some(dir.join("config.yaml")));
    let agent = Agent::load(&dir).expect("loads");
    assert_eq!(agent.name(), "legacy-agent");
    let pre = agent.hooks.pre_llm_req.as_ref().expect("pre_llm_req");
    assert_eq!(pre.command, ["echo", "Pre-LLM hook from config.yaml"]);
    assert_eq!(pre.timeout_ms, Some(5000));
    assert!(agent.hooks.post_tool_exec.is_some());
    assert!(
        agent
            .warnings
            .iter()
            .any(|w| w.contains("`lifecycle_hooks` is deprecated")),
        "{:?}",
        agent.warnings
    );
}

#[test]
fn hooks_yaml_declares_every_hook() {
    let agent = Agent::load(&fixture("fixtures/agent-with-hooks-yaml")).expect("loads");
    let h = &agent.hooks;
    assert!(h.pre_llm_req.is_some() && h.post_llm_resp.is_some());
    assert!(h.post_tool_exec.is_some() && h.on_error.is_some() && h.on_run_end.is_some());
    assert!(h.pre_tool_exec.is_none());
    assert!(agent.warnings.is_empty(), "{:?}", agent.warnings);
}

#[test]
fn imports_bring_their_tools_and_name_what_they_ignore() {
    let agent = Agent::load(&fixture("fixtures/agent-with-imports")).expect("loads");
    let names: Vec<&str> = agent.tools.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "count_lines",
            "custom_echo",
            "echo",
            "grep_text",
            "list_files",
            "read_file",
            "show_date",
            "write_file"
        ]
    );
    assert!(
        agent.warnings.iter().any(|w| w.starts_with(
            "modules/file-tools.yaml: only `imports` and `tools` are read from an imported file; ignored: name, version, description, llm, max_iterations"
        )),
        "{:?}",
        agent.warnings
    );
}

#[test]
fn a_circular_import_is_refused_naming_the_chain() {
    let err = Agent::load(&fixture("fixtures/agent-with-circular-imports")).unwrap_err();
    let Error::Invalid {
        path,
        field,
        message,
        ..
    } = &err
    else {
        panic!("{err}");
    };
    assert!(path.ends_with("module-b.yaml"), "{path}");
    assert_eq!(field, "imports[0]");
    assert_eq!(
        message,
        "circular import: module-a.yaml -> module-b.yaml -> module-a.yaml"
    );
}

#[test]
fn imports_stay_inside_the_agent_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let agent = dir.path().join("a");
    std::fs::create_dir_all(&agent).expect("mkdir");
    std::fs::write(dir.path().join("outside.yaml"), "tools: []\n").expect("write");
    for (import, says) in [
        ("../outside.yaml", "without `..`"),
        ("/etc/passwd", "without `..`"),
        ("missing.yaml", "cannot read"),
    ] {
        std::fs::write(
            agent.join("agent.yaml"),
            format!("name: a\nllm: {{model: m, base_url: 'http://127.0.0.1:9/v1'}}\nimports: ['{import}']\n"),
        )
        .expect("write");
        let err = Agent::load(&agent).unwrap_err().to_string();
        assert!(
            err.contains("imports[0]") && err.contains(says),
            "{import}: {err}"
        );
    }
    std::os::unix::fs::symlink(dir.path().join("outside.yaml"), agent.join("link.yaml"))
        .expect("symlink");
    std::fs::write(
        agent.join("agent.yaml"),
        "name: a\nllm: {model: m, base_url: 'http://127.0.0.1:9/v1'}\nimports: [link.yaml]\n",
    )
    .expect("write");
    let err = Agent::load(&agent).unwrap_err().to_string();
    assert!(err.contains("leads outside the agent directory"), "{err}");
}

#[test]
fn agent_yaml_wins_over_config_yaml_and_unknown_keys_are_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("agent.yaml"),
        "name: new\nllm: {model: m, base_url: 'http://127.0.0.1:9/v1', seed: 4}\ntimeout_seconds: 60\nmemory: {kind: vector}\n",
    )
    .expect("write");
    std::fs::write(
        dir.path().join("config.yaml"),
        "name: old\nbrain: scripted\n",
    )
    .expect("write");
    let agent = Agent::load(dir.path()).expect("loads");
    assert_eq!(agent.name(), "new");
    let w = agent.warnings.join("\n");
    for named in [
        "agent.yaml: unknown key `memory` is ignored",
        "agent.yaml: unknown key `llm.seed` is ignored",
        "agent.yaml: `timeout_seconds`",
        "both agent.yaml and config.yaml exist",
    ] {
        assert!(w.contains(named), "{named} not in:\n{w}");
    }
}

#[test]
fn unknown_hooks_and_context_sources_are_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("agent.yaml"),
        "name: a\nllm: {model: m, base_url: 'http://127.0.0.1:9/v1'}\n",
    )
    .expect("write");
    std::fs::write(
        dir.path().join("hooks.yaml"),
        "pre_llm_request:\n  command: [x]\n",
    )
    .expect("write");
    let err = Agent::load(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("hooks.yaml") && err.contains("pre_llm_request"),
        "{err}"
    );
    std::fs::write(
        dir.path().join("hooks.yaml"),
        "pre_tool_exec:\n  command: [x]\n  timeout_ms: 900000\n",
    )
    .expect("write");
    let err = Agent::load(dir.path()).unwrap_err().to_string();
    assert!(err.contains("pre_tool_exec.timeout_ms"), "{err}");
    std::fs::remove_file(dir.path().join("hooks.yaml")).expect("rm");
    std::fs::write(
        dir.path().join("context.yaml"),
        "sources:\n  - type: vector_store\n    id: m\n",
    )
    .expect("write");
    let err = Agent::load(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("context.yaml") && err.contains("vector_store"),
        "{err}"
    );
}

#[test]
fn the_agents_own_tool_replaces_an_imported_one_with_a_warning() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("m")).expect("mkdir");
    std::fs::write(
        dir.path().join("m/a.yaml"),
        "tools:\n  - name: echo\n    description: imported\n    exec: \"echo ${x}\"\n",
    )
    .expect("write");
    std::fs::write(
        dir.path().join("m/b.yaml"),
        "imports: [m/a.yaml]\ntools:\n  - name: echo\n    description: from b\n    exec: \"echo ${y}\"\n",
    )
    .expect("write");
    std::fs::write(
        dir.path().join("agent.yaml"),
        "name: a\nllm: {model: m, base_url: 'http://127.0.0.1:9/v1'}\nimports: [m/b.yaml, m/a.yaml]\n\
         tools:\n  - name: echo\n    description: own\n    exec: \"echo ${z}\"\n",
    )
    .expect("write");
    // A file imported twice (not a cycle) is fine; the last definition of a name wins.
    let agent = Agent::load(dir.path()).expect("loads");
    assert_eq!(agent.tools["echo"].description, "own");
    let replaced = agent
        .warnings
        .iter()
        .filter(|w| w.starts_with("tool `echo` of "))
        .count();
    assert_eq!(replaced, 3, "{:?}", agent.warnings);
    assert!(
        agent
            .warnings
            .iter()
            .any(|w| w.ends_with("is replaced by the one in agent.yaml (the last definition wins)")),
        "{:?}",
        agent.warnings
    );
}

#[test]
fn a_context_without_the_journal_is_named_in_a_warning() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("agent.yaml"),
        "name: a\nllm: {model: m, base_url: 'http://127.0.0.1:9/v1'}\n",
    )
    .expect("write");
    std::fs::write(
        dir.path().join("context.yaml"),
        "sources:\n  - type: file\n    path: '${AGENT_HOME}/agent.yaml'\n",
    )
    .expect("write");
    let agent = Agent::load(dir.path()).expect("loads");
    assert!(
        agent
            .warnings
            .iter()
            .any(|w| w.starts_with("context.yaml has no `type: journal` source")),
        "{:?}",
        agent.warnings
    );
}

mod hooks_on_the_scripted_brain {
    use std::path::Path;

    use delta_engine::agent::Agent;
    use delta_engine::brain::AnyBrain;
    use delta_engine::engine::{Engine, Outcome, PauseMode, Settings};
    use delta_protocol::{Event, RunId, RunStatus};
    use delta_store::file::FileRunStore;
    use delta_store::{RunRecord, RunStore};
    use serde_json::Value;
    use tokio_util::sync::CancellationToken;

    /// Appends `<call dir name> <payload>` to `$1` for every call.
    const RECORD: &str = "n=$(basename \"$DELTA_HOOK_IO_PATH\"); \
        printf '%s %s\\n' \"$n\" \"$(tr -d '\\n' < \"$DELTA_HOOK_IO_PATH/input/payload.json\")\" >> \"$0\"";

    fn agent(dir: &Path, script: &str, log: &Path) -> Agent {
        let a = dir.join("agent");
        std::fs::create_dir_all(&a).expect("mkdir");
        std::fs::write(
            a.join("agent.yaml"),
            "name: t\nbrain: scripted\ntools:\n  - name: slow\n    shell: \"touch started; sleep 30\"\n\
             \x20 - name: missing\n    exec: \"/nonexistent/program\"\n",
        )
        .expect("write");
        std::fs::write(a.join("script.yaml"), script).expect("write");
        let mut hooks = String::new();
        for h in ["pre_tool_exec", "post_tool_exec", "on_error", "on_run_end"] {
            hooks.push_str(&format!(
                "{h}:\n  command: [sh, -c, {RECORD:?}, '{}']\n",
                log.display()
            ));
        }
        std::fs::write(a.join("hooks.yaml"), hooks).expect("write");
        Agent::load(&a).expect("loads")
    }

    fn lines(log: &Path) -> Vec<(String, Value)> {
        std::fs::read_to_string(log)
            .expect("log")
            .lines()
            .map(|l| {
                let (name, payload) = l.split_once(' ').expect("two parts");
                (
                    name.to_owned(),
                    serde_json::from_str(payload).expect("json"),
                )
            })
            .collect()
    }

    async fn run(dir: &Path, agent: &Agent, cancel: CancellationToken) -> (RunId, Outcome) {
        let brain = AnyBrain::for_agent(agent).expect("brain");
        let store = FileRunStore::new(dir.join(".delta"));
        let rec = RunRecord::new(RunId::new(), "t", "task", RunStatus::Running);
        let id = rec.run_id;
        store.create(rec).await.expect("create");
        let run = store.load(id).await.expect("load");
        let settings = Settings {
            worker: "local".into(),
            work_dir: dir.to_path_buf(),
            pause: PauseMode::Park,
        };
        let mut engine = Engine::new(agent, &brain, &store, run, settings, cancel);
        let out = engine.advance(None).await.expect("advance");
        (id, out)
    }

    #[tokio::test]
    async fn a_tool_that_cannot_start_calls_on_error_and_a_run_end_calls_on_run_end() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("hooks.log");
        let agent = agent(
            dir.path(),
            "steps:\n  - tool: missing\n    args: {}\n  - finish: done\n",
            &log,
        );
        let (id, out) = run(dir.path(), &agent, CancellationToken::new()).await;
        assert_eq!(
            out,
            Outcome::Completed {
                result: "done".into()
            }
        );
        let got = lines(&log);
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "001_pre_tool_exec",
                "002_on_error",
                "003_post_tool_exec",
                "004_on_run_end"
            ]
        );
        assert_eq!(got[1].1["error_type"], "TOOL_EXECUTION_ERROR");
        assert_eq!(got[1].1["context"]["tool_name"], "missing");
        assert_eq!(got[2].1["exit_code"], -1);
        assert_eq!(got[3].1["status"], "COMPLETED");
        assert_eq!(got[3].1["run_id"], id.to_string());
    }

    #[tokio::test]
    async fn an_interrupted_run_does_not_call_on_run_end() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("hooks.log");
        let agent = agent(
            dir.path(),
            "steps:\n  - tool: slow\n    args: {}\n  - finish: never\n",
            &log,
        );
        let cancel = CancellationToken::new();
        let started = dir.path().join("started");
        let c = cancel.clone();
        // Stop the host once the tool runs (as Ctrl+C or a stopping worker would).
        tokio::spawn(async move {
            while !started.exists() {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            c.cancel();
        });
        let (id, out) = run(dir.path(), &agent, cancel).await;
        assert_eq!(out, Outcome::Interrupted);
        let got = lines(&log);
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        // The run resumes later (another worker, the next `delta run`): it has not ended.
        assert_eq!(names, ["001_pre_tool_exec"]);
        let journal = FileRunStore::new(dir.path().join(".delta"))
            .load(id)
            .await
            .expect("load")
            .journal;
        assert!(!journal.iter().any(
            |e| matches!(&e.event, Event::SystemMessage(m) if m.content.contains("on_run_end"))
        ));
        let n = journal.len();
        assert!(
            matches!(&journal[n - 1].event, Event::EngineEnd(e) if e.status == RunStatus::Interrupted)
        );
    }

    /// An agent whose only hook is `pre_tool_exec: <command>`.
    fn guarded(dir: &Path, command: &str, timeout_ms: u64) -> Agent {
        let a = dir.join("agent");
        std::fs::create_dir_all(&a).expect("mkdir");
        std::fs::write(
            a.join("agent.yaml"),
            "name: t\nbrain: scripted\ntools:\n  - name: slow\n    shell: \"touch started; sleep 30\"\n\
             \x20 - name: touch\n    shell: \"touch ran\"\n",
        )
        .expect("write");
        std::fs::write(
            a.join("script.yaml"),
            "steps:\n  - tool: touch\n    args: {}\n  - finish: done\n",
        )
        .expect("write");
        std::fs::write(
            a.join("hooks.yaml"),
            format!(
                "pre_tool_exec:\n  command: [sh, -c, {command:?}]\n  timeout_ms: {timeout_ms}\n"
            ),
        )
        .expect("write");
        Agent::load(&a).expect("loads")
    }

    fn result_of(
        journal: &[delta_protocol::JournalEvent],
    ) -> (delta_protocol::ActionStatus, String) {
        journal
            .iter()
            .find_map(|e| match &e.event {
                Event::ActionResult(r) => Some((r.status, r.observation_content.clone())),
                _ => None,
            })
            .expect("a result")
    }

    #[tokio::test]
    async fn a_guard_that_writes_skip_and_exits_1_or_fails_keeps_the_tool_from_running() {
        for (command, timeout_ms) in [
            // Delta Engine's documented guard.
            (
                r#"echo '{"skip": true}' > "$DELTA_HOOK_IO_PATH/output/control.json"; exit 1"#,
                5000,
            ),
            // A guard that crashes, or hangs: it could not decide, so the tool does not run.
            ("kill -9 $$", 5000),
            ("sleep 30", 200),
        ] {
            let dir = tempfile::tempdir().expect("tempdir");
            let agent = guarded(dir.path(), command, timeout_ms);
            let (id, out) = run(dir.path(), &agent, CancellationToken::new()).await;
            assert!(
                matches!(out, Outcome::Completed { .. }),
                "{command}: {out:?}"
            );
            assert!(!dir.path().join("ran").exists(), "{command}: the tool ran");
            let journal = FileRunStore::new(dir.path().join(".delta"))
                .load(id)
                .await
                .expect("load")
                .journal;
            let (status, text) = result_of(&journal);
            assert_eq!(
                status,
                delta_protocol::ActionStatus::Skipped,
                "{command}: {text}"
            );
        }
    }

    #[tokio::test]
    async fn a_cancel_during_pre_tool_exec_does_not_start_the_tool() {
        let dir = tempfile::tempdir().expect("tempdir");
        guarded(dir.path(), "touch guard-started; sleep 30", 60_000);
        // The built-in echo instead of `touch`.
        std::fs::write(
            dir.path().join("agent/script.yaml"),
            "steps:\n  - tool: say\n    args: {text: hi}\n  - finish: done\n",
        )
        .expect("write");
        let mut yaml =
            std::fs::read_to_string(dir.path().join("agent/agent.yaml")).expect("agent.yaml");
        yaml.push_str("  - name: say\n    builtin: echo\n");
        std::fs::write(dir.path().join("agent/agent.yaml"), yaml).expect("write");
        let agent = Agent::load(&dir.path().join("agent")).expect("loads");
        let cancel = CancellationToken::new();
        let c = cancel.clone();
        let started = dir.path().join("guard-started");
        tokio::spawn(async move {
            while !started.exists() {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            c.cancel();
        });
        let (id, out) = run(dir.path(), &agent, cancel).await;
        assert_eq!(out, Outcome::Interrupted);
        assert!(!dir.path().join("ran").exists(), "the tool ran");
        // The built-in `echo` runs at once, whatever the cancel: it must not have been reached.
        let journal = FileRunStore::new(dir.path().join(".delta"))
            .load(id)
            .await
            .expect("load")
            .journal;
        assert!(
            !journal
                .iter()
                .any(|e| matches!(&e.event, Event::ActionResult(_))),
            "a tool ran after the cancel"
        );
    }
}
