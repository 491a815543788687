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
