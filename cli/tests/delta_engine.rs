//! Delta Engine v1.10's agents under `delta run`, as a Delta Engine user runs them: its
//! examples (copied to `shared/engine/tests/fixtures/delta-engine/`) against an
//! OpenAI-compatible endpoint served by the test, found through `DELTA_BASE_URL` and
//! `DELTA_API_KEY`, with the tool calls scripted here; hooks, workspaces and `delta init`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

const DELTA: &str = env!("CARGO_BIN_EXE_delta");
const KEY: &str = "sk-delta-engine-test";

use delta_e2e::{copy_dir, delta_engine_fixture as fixture};

/// What the fake endpoint received, and what it answers next.
#[derive(Default)]
struct Exchange {
    requests: Vec<Value>,
    replies: Vec<(u16, Value)>,
}

type Recorded = Arc<Mutex<Exchange>>;

/// An OpenAI-compatible endpoint on its own thread; it records each request (with its
/// `Authorization` header as `_auth`) and answers with the next scripted reply.
fn fake_llm(replies: Vec<(u16, Value)>) -> (String, Recorded) {
    async fn completions(
        axum::extract::State(s): axum::extract::State<Recorded>,
        headers: axum::http::HeaderMap,
        axum::Json(mut body): axum::Json<Value>,
    ) -> (axum::http::StatusCode, axum::Json<Value>) {
        let mut s = s.lock().expect("lock");
        body["_auth"] = json!(headers.get("authorization").and_then(|v| v.to_str().ok()));
        s.requests.push(body);
        let (status, reply) = if s.replies.is_empty() {
            (400, json!({"error": {"message": "out of replies"}}))
        } else {
            s.replies.remove(0)
        };
        (
            axum::http::StatusCode::from_u16(status).expect("status"),
            axum::Json(reply),
        )
    }
    let shared: Recorded = Arc::new(Mutex::new(Exchange {
        requests: vec![],
        replies,
    }));
    let state = shared.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            tx.send(listener.local_addr().expect("addr")).expect("send");
            let app = axum::Router::new()
                .route("/v1/chat/completions", axum::routing::post(completions))
                .with_state(state);
            let _ = axum::serve(listener, app).await;
        });
    });
    let addr = rx.recv().expect("the fake endpoint started");
    (format!("http://{addr}/v1"), shared)
}

fn calls(list: &[(&str, Value)]) -> (u16, Value) {
    let calls: Vec<Value> = list
        .iter()
        .enumerate()
        .map(|(i, (name, args))| {
            json!({"id": format!("call_{i}"), "type": "function",
                   "function": {"name": name, "arguments": args.to_string()}})
        })
        .collect();
    (
        200,
        json!({"choices": [{"message": {"role": "assistant", "content": "on it", "tool_calls": calls}, "finish_reason": "tool_calls"}]}),
    )
}

fn answer(text: &str) -> (u16, Value) {
    (
        200,
        json!({"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}),
    )
}

/// `delta <args>` in `dir`, with Delta Engine's variables pointing at `base_url` (and no
/// OpenAI key, so that only `DELTA_API_KEY` can be the key).
fn delta(dir: &Path, base_url: &str, args: &[&str], extra_env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(DELTA);
    cmd.args(args)
        .current_dir(dir)
        .env_remove("OPENAI_API_KEY")
        .env("DELTA_BASE_URL", base_url)
        .env("DELTA_API_KEY", KEY)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    cmd.output().expect("delta runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn journal(work: &Path) -> Vec<Value> {
    let id = std::fs::read_to_string(work.join(".delta/runs/LATEST")).expect("LATEST");
    let text = std::fs::read_to_string(
        work.join(format!(".delta/runs/{}/execution/journal.jsonl", id.trim())),
    )
    .expect("journal");
    text.lines()
        .map(|l| serde_json::from_str(l).expect("event"))
        .collect()
}

fn system_messages(journal: &[Value]) -> Vec<String> {
    journal
        .iter()
        .filter(|e| e["type"] == "SYSTEM_MESSAGE")
        .map(|e| e["payload"]["content"].as_str().unwrap_or("").to_owned())
        .collect()
}

#[test]
fn hello_world_runs_end_to_end_on_delta_engines_variables() {
    let (url, llm) = fake_llm(vec![
        calls(&[
            ("print_message", json!({"message": "Hello"})),
            (
                "write_to_file",
                json!({"filename": "greeting.txt", "content": "hi there"}),
            ),
        ]),
        answer("Greeting written."),
    ]);
    let root = tempfile::tempdir().expect("tempdir");
    let agent = root.path().join("hello-world");
    copy_dir(&fixture("examples/hello-world"), &agent);
    let work = root.path().join("work");
    std::fs::create_dir_all(&work).expect("mkdir");
    std::fs::write(work.join("DELTA.md"), "Always greet politely.").expect("write");
    let out = delta(
        &work,
        &url,
        &[
            "run",
            "--agent",
            agent.to_str().expect("utf-8"),
            "-m",
            "Say hello",
            "-y",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "Greeting written."
    );
    assert!(!stderr(&out).contains("warning:"), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(work.join("greeting.txt")).expect("the tool wrote it"),
        "hi there"
    );
    let llm = llm.lock().expect("lock");
    assert_eq!(llm.requests.len(), 2);
    let first = &llm.requests[0];
    assert_eq!(first["_auth"], format!("Bearer {KEY}"));
    assert_eq!(first["model"], "gpt-5-mini");
    assert_eq!(first["max_tokens"], 2000);
    // context.yaml: the system prompt and DELTA.md as context blocks, then the journal.
    let contents: Vec<(&str, &str)> = first["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap_or(""),
                m["content"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert!(
        contents[1]
            .1
            .starts_with("# Context Block: system_prompt\n\n# "),
        "{contents:?}"
    );
    assert_eq!(
        contents[2],
        (
            "system",
            "# Context Block: workspace_guide\n\nAlways greet politely."
        )
    );
    assert_eq!(contents[3], ("user", "Say hello"));
    let tools: Vec<&str> = first["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap_or(""))
        .collect();
    for t in [
        "print_message",
        "create_file",
        "write_to_file",
        "list_files",
        "show_date",
        "ask_human",
    ] {
        assert!(tools.contains(&t), "{t} in {tools:?}");
    }
    let second = llm.requests[1]["messages"].as_array().expect("messages");
    let results: Vec<&str> = second
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(results, ["Hello\n", "hi there"]);
}

#[test]
fn tool_syntax_runs_its_exec_shell_and_legacy_tools() {
    let (url, llm) = fake_llm(vec![
        calls(&[
            ("count_lines", json!({"file": "notes.txt"})),
            ("echo_message", json!({"message": "legacy"})),
            ("list_directory", json!({"directory": "."})),
        ]),
        answer("3 lines."),
    ]);
    let root = tempfile::tempdir().expect("tempdir");
    let agent = root.path().join("tool-syntax");
    copy_dir(&fixture("examples/tool-syntax"), &agent);
    std::fs::write(root.path().join("notes.txt"), "a\nb\nc\n").expect("write");
    let out = delta(
        root.path(),
        &url,
        &[
            "run",
            "--agent",
            "tool-syntax",
            "--message",
            "Count the lines",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let llm = llm.lock().expect("lock");
    let results: Vec<String> = llm.requests[1]["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(results[0].trim(), "3");
    assert_eq!(results[1], "legacy\n");
    assert!(results[2].contains("notes.txt"), "{}", results[2]);
}

#[test]
fn the_agents_own_endpoint_and_key_variable_win_over_delta_engines() {
    let (url, llm) = fake_llm(vec![answer("fine")]);
    let root = tempfile::tempdir().expect("tempdir");
    let agent = root.path().join("own");
    std::fs::create_dir_all(&agent).expect("mkdir");
    std::fs::write(
        agent.join("agent.yaml"),
        format!("name: own\nllm:\n  model: m\n  base_url: {url}\n  api_key_env: OWN_API_KEY\n"),
    )
    .expect("write");
    // DELTA_BASE_URL points nowhere: only the agent's base_url can reach the endpoint.
    let out = delta(
        root.path(),
        "http://127.0.0.1:9/v1",
        &["run", "--agent", "own", "-m", "hi"],
        &[("OWN_API_KEY", "sk-own")],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        llm.lock().expect("lock").requests[0]["_auth"],
        "Bearer sk-own"
    );
}

/// A hook that keeps a copy of each call's directory (and its environment) in `$1`; as
/// `pre_llm_req` it adds a message to the request, and as `pre_tool_exec` it skips the tool
/// `blocked`.
const RECORD_SH: &str = r#"#!/bin/sh
io="$DELTA_HOOK_IO_PATH"
name=$(basename "$io")
env > "$io/env.txt"
case "$name" in
  *_pre_llm_req)
    sed 's/"messages": \[/"messages": [{"role": "system", "content": "added by the hook"},/' \
      "$io/input/proposed_payload.json" > "$io/output/final_payload.json" ;;
  *_pre_tool_exec)
    if grep -q '"tool_name": "blocked"' "$io/input/payload.json"; then
      echo '{"action": "CONTINUE", "skip": true}' > "$io/output/control.json"
    fi ;;
esac
cp -r "$io" "$1/$name"
"#;

/// An agent with every hook recording into `log`.
fn hooked_agent(root: &Path, base_url: Option<&str>, log: &Path) -> PathBuf {
    let agent = root.join("hooked");
    std::fs::create_dir_all(&agent).expect("mkdir");
    let base = base_url
        .map(|u| format!("  base_url: {u}\n"))
        .unwrap_or_default();
    std::fs::write(
        agent.join("agent.yaml"),
        format!(
            "name: hooked\nllm:\n  model: m\n{base}tools:\n  - name: echo\n    exec: \"echo ${{message}}\"\n\
             \x20 - name: blocked\n    exec: \"touch ran.txt\"\n"
        ),
    )
    .expect("write");
    std::fs::write(agent.join("system_prompt.md"), "You test hooks.").expect("write");
    std::fs::write(agent.join("record.sh"), RECORD_SH).expect("write");
    let log = log.display();
    let mut hooks = String::new();
    for h in [
        "pre_llm_req",
        "post_llm_resp",
        "pre_tool_exec",
        "post_tool_exec",
        "on_error",
        "on_run_end",
    ] {
        hooks.push_str(&format!(
            "{h}:\n  command: [sh, '${{AGENT_HOME}}/record.sh', '{log}']\n  timeout_ms: 10000\n"
        ));
    }
    std::fs::write(agent.join("hooks.yaml"), hooks).expect("write");
    agent
}

fn recorded(log: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(log)
        .expect("log")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn read_json(path: PathBuf) -> Value {
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("json")
}

#[test]
fn hooks_fire_in_order_with_delta_engines_payloads() {
    let (url, llm) = fake_llm(vec![
        calls(&[("echo", json!({"message": "hi"}))]),
        answer("done"),
    ]);
    let root = tempfile::tempdir().expect("tempdir");
    let log = root.path().join("log");
    std::fs::create_dir_all(&log).expect("mkdir");
    let agent = hooked_agent(root.path(), None, &log);
    let work = root.path().join("work");
    std::fs::create_dir_all(&work).expect("mkdir");
    let out = delta(
        &work,
        &url,
        &[
            "run",
            "--agent",
            agent.to_str().expect("utf-8"),
            "-m",
            "echo hi",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        recorded(&log),
        [
            "001_pre_llm_req",
            "002_post_llm_resp",
            "003_pre_tool_exec",
            "004_post_tool_exec",
            "005_pre_llm_req",
            "006_post_llm_resp",
            "007_on_run_end"
        ]
    );
    let run_id = std::fs::read_to_string(work.join(".delta/runs/LATEST")).expect("LATEST");
    let run_id = run_id.trim();
    // input/context.json, as Delta Engine writes it.
    let ctx = read_json(log.join("003_pre_tool_exec/input/context.json"));
    assert_eq!(ctx["hook_name"], "pre_tool_exec");
    assert_eq!(ctx["step_index"], 3);
    assert_eq!(ctx["run_id"], run_id);
    // pre_llm_req: the proposed request; its final_payload.json is what was sent.
    let proposed = read_json(log.join("001_pre_llm_req/input/proposed_payload.json"));
    assert_eq!(proposed["model"], "m");
    assert_eq!(proposed["messages"][0]["role"], "system");
    let llm = llm.lock().expect("lock");
    assert_eq!(
        llm.requests[0]["messages"][0],
        json!({"role": "system", "content": "added by the hook"})
    );
    assert_eq!(llm.requests[0]["messages"][1], proposed["messages"][0]);
    // post_llm_resp: the endpoint's response.
    let resp = read_json(log.join("002_post_llm_resp/input/payload.json"));
    assert_eq!(
        resp["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "echo"
    );
    // pre_tool_exec: the tool, its arguments and the command line.
    let pre = read_json(log.join("003_pre_tool_exec/input/payload.json"));
    assert_eq!(
        pre,
        json!({"tool_name": "echo", "tool_args": {"message": "hi"}, "resolved_command": "echo hi"})
    );
    // post_tool_exec: what it printed.
    let post = read_json(log.join("004_post_tool_exec/input/payload.json"));
    assert_eq!(
        post,
        json!({"tool_name": "echo", "exit_code": 0, "stdout": "hi\n", "stderr": ""})
    );
    let end = read_json(log.join("007_on_run_end/input/payload.json"));
    assert_eq!(end["status"], "COMPLETED");
    assert_eq!(end["result"], "done");
    assert_eq!(end["run_id"], run_id);
    // No hook sees the API key, in its environment or its payload.
    for name in recorded(&log) {
        let env = std::fs::read_to_string(log.join(&name).join("env.txt")).expect("env");
        assert!(
            !env.contains(KEY) && !env.contains("DELTA_API_KEY"),
            "{name}: {env}"
        );
        assert!(env.contains(&format!("DELTA_RUN_ID={run_id}")), "{name}");
        for f in std::fs::read_dir(log.join(&name).join("input"))
            .expect("input")
            .flatten()
        {
            let text = std::fs::read_to_string(f.path()).expect("read");
            assert!(!text.contains(KEY), "{name}/{:?}", f.file_name());
        }
    }
    // Each call is journaled, and its execution_meta is kept in the work directory.
    let msgs = system_messages(&journal(&work));
    let hooks: Vec<&str> = msgs
        .iter()
        .filter(|m| m.starts_with("hook "))
        .map(|m| m.split(" (").next().unwrap_or(""))
        .collect();
    assert_eq!(
        hooks,
        [
            "hook pre_llm_req: SUCCESS",
            "hook post_llm_resp: SUCCESS",
            "hook pre_tool_exec: SUCCESS",
            "hook post_tool_exec: SUCCESS",
            "hook pre_llm_req: SUCCESS",
            "hook post_llm_resp: SUCCESS",
            "hook on_run_end: SUCCESS"
        ]
    );
    assert!(
        msgs.iter().any(
            |m| m.starts_with("hook pre_llm_req: SUCCESS (io/hooks/001_pre_llm_req/)")
                && m.split_once(
                    "; output/final_payload.json used: the LLM request was replaced (sha256 "
                )
                .is_some_and(|(_, hex)| hex.len() == 65 && hex.ends_with(')'))
        ),
        "{msgs:?}"
    );
    let meta = work.join(format!(
        ".delta/{run_id}/io/hooks/004_post_tool_exec/execution_meta/exit_code.txt"
    ));
    assert_eq!(std::fs::read_to_string(meta).expect("meta"), "0");
}

#[test]
fn a_pre_tool_exec_hook_skips_a_tool_and_a_failed_run_calls_on_error() {
    let (url, _llm) = fake_llm(vec![
        calls(&[("blocked", json!({}))]),
        (400, json!({"error": {"message": "model not found"}})),
    ]);
    let root = tempfile::tempdir().expect("tempdir");
    let log = root.path().join("log");
    std::fs::create_dir_all(&log).expect("mkdir");
    let agent = hooked_agent(root.path(), None, &log);
    let work = root.path().join("work");
    std::fs::create_dir_all(&work).expect("mkdir");
    let out = delta(
        &work,
        &url,
        &[
            "run",
            "--agent",
            agent.to_str().expect("utf-8"),
            "-m",
            "try",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(!work.join("ran.txt").exists(), "the skipped tool ran");
    let j = journal(&work);
    let result = j
        .iter()
        .find(|e| e["type"] == "ACTION_RESULT")
        .expect("a result");
    assert_eq!(result["payload"]["status"], "SKIPPED");
    assert_eq!(
        result["payload"]["observation_content"],
        "Tool execution skipped by pre_tool_exec hook"
    );
    // No post_tool_exec for a skipped tool; on_error, then on_run_end, for the failure.
    assert_eq!(
        recorded(&log),
        [
            "001_pre_llm_req",
            "002_post_llm_resp",
            "003_pre_tool_exec",
            "004_pre_llm_req",
            "005_on_error",
            "006_on_run_end"
        ]
    );
    let err = read_json(log.join("005_on_error/input/payload.json"));
    assert_eq!(err["error_type"], "FATAL_ERROR");
    assert!(
        err["message"]
            .as_str()
            .expect("message")
            .contains("model not found"),
        "{err}"
    );
    let end = read_json(log.join("006_on_run_end/input/payload.json"));
    assert_eq!(end["status"], "FAILED");
}

#[test]
fn a_failing_hook_is_journaled_and_the_run_goes_on() {
    let (url, _llm) = fake_llm(vec![answer("fine")]);
    let root = tempfile::tempdir().expect("tempdir");
    let agent = root.path().join("a");
    std::fs::create_dir_all(&agent).expect("mkdir");
    std::fs::write(agent.join("agent.yaml"), "name: a\nllm: {model: m}\n").expect("write");
    std::fs::write(
        agent.join("hooks.yaml"),
        "pre_llm_req:\n  command: [sh, -c, 'exit 7']\npost_llm_resp:\n  command: [sleep, '30']\n  timeout_ms: 200\n",
    )
    .expect("write");
    let out = delta(root.path(), &url, &["run", "--agent", "a", "-m", "go"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let msgs = system_messages(&journal(root.path()));
    assert!(
        msgs.iter()
            .any(|m| m.starts_with("hook pre_llm_req: FAILED") && m.ends_with("exit code 7")),
        "{msgs:?}"
    );
    assert!(
        msgs.iter()
            .any(|m| m.starts_with("hook post_llm_resp: FAILED")
                && m.ends_with("timed out after 200 ms and was killed")),
        "{msgs:?}"
    );
}

#[test]
fn the_legacy_config_yaml_fixture_runs_its_lifecycle_hooks() {
    let (url, _llm) = fake_llm(vec![
        calls(&[("echo", json!({"message": "legacy"}))]),
        answer("ok"),
    ]);
    let root = tempfile::tempdir().expect("tempdir");
    copy_dir(
        &fixture("fixtures/agent-with-config-yaml"),
        &root.path().join("legacy"),
    );
    let out = delta(
        root.path(),
        &url,
        &["run", "--agent", "legacy", "-m", "go"],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("warning: config.yaml: `lifecycle_hooks` is deprecated"),
        "{}",
        stderr(&out)
    );
    let msgs = system_messages(&journal(root.path()));
    let hooks: Vec<&str> = msgs
        .iter()
        .filter(|m| m.starts_with("hook "))
        .map(|m| m.split(" (").next().unwrap_or(""))
        .collect();
    assert_eq!(
        hooks,
        [
            "hook pre_llm_req: SUCCESS",
            "hook post_tool_exec: SUCCESS",
            "hook pre_llm_req: SUCCESS"
        ]
    );
}

#[test]
fn an_unsupported_key_is_named_in_a_warning() {
    let (url, _llm) = fake_llm(vec![answer("nothing to do")]);
    let root = tempfile::tempdir().expect("tempdir");
    copy_dir(
        &fixture("examples/delta-agent-generator"),
        &root.path().join("generator"),
    );
    let out = delta(
        root.path(),
        &url,
        &["run", "--agent", "generator", "-m", "hi", "-q"],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(
            "warning: agent.yaml: `hooks` is not read from agent.yaml (Delta Engine ignores it there too)"
        ),
        "{}",
        stderr(&out)
    );
}

#[test]
fn workspaces_follow_delta_engines_layout() {
    let (url, _llm) = fake_llm(vec![answer("one"), answer("two"), answer("three")]);
    let root = tempfile::tempdir().expect("tempdir");
    let agent = root.path().join("hello-world");
    copy_dir(&fixture("examples/hello-world"), &agent);
    let run = |args: &[&str]| {
        let mut all = vec!["run", "--agent", "hello-world", "--workspaces"];
        all.extend_from_slice(args);
        delta(root.path(), &url, &all, &[])
    };
    let out = run(&["-m", "first"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let ws = agent.join("workspaces");
    assert_eq!(
        std::fs::read_to_string(ws.join("LAST_USED")).expect("LAST_USED"),
        "W001"
    );
    let j = journal(&ws.join("W001"));
    let end = j.last().expect("events");
    assert_eq!(end["type"], "ENGINE_END");
    assert_eq!(end["payload"]["result"], "one");
    // The last workspace again: a new run there (the last one completed).
    let out = run(&["-m", "second"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!ws.join("W002").exists());
    // -y: a new workspace.
    let out = run(&["-m", "third", "-y"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(ws.join("LAST_USED")).expect("LAST_USED"),
        "W002"
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "three");
    // This project's default layout is untouched: nothing was written beside the agent.
    assert!(!root.path().join(".delta").exists());
    let out = delta(root.path(), &url, &["run", "--workspaces", "-m", "x"], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--workspaces needs --agent"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_workspace_symlinked_elsewhere_is_not_used() {
    let (url, _llm) = fake_llm(vec![answer("one"), answer("two"), answer("three")]);
    let root = tempfile::tempdir().expect("tempdir");
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let agent = root.path().join("hello-world");
    copy_dir(&fixture("examples/hello-world"), &agent);
    let ws = agent.join("workspaces");
    std::fs::create_dir_all(&ws).expect("mkdir");
    std::os::unix::fs::symlink(elsewhere.path(), ws.join("W007")).expect("symlink");
    std::fs::write(ws.join("LAST_USED"), "W007").expect("write");
    for last in ["W007", "../../..", "W007/."] {
        std::fs::write(ws.join("LAST_USED"), last).expect("write");
        let out = delta(
            root.path(),
            &url,
            &["run", "--agent", "hello-world", "--workspaces", "-m", "go"],
            &[],
        );
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_eq!(
            std::fs::read_dir(elsewhere.path()).expect("list").count(),
            0,
            "{last}: the run wrote through the symlink"
        );
        // A new workspace instead, numbered past the real ones only (W007 is no workspace).
        let used = std::fs::read_to_string(ws.join("LAST_USED")).expect("LAST_USED");
        assert!(
            ["W001", "W002", "W003"].contains(&used.as_str()),
            "{last}: {used}"
        );
        assert!(
            std::fs::symlink_metadata(ws.join(&used))
                .expect("made")
                .is_dir()
        );
    }
}

#[test]
fn delta_init_makes_an_agent_from_a_template() {
    let root = tempfile::tempdir().expect("tempdir");
    let out = delta(
        root.path(),
        "http://127.0.0.1:9/v1",
        &["init", "my-agent", "-t", "hello"],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let config =
        std::fs::read_to_string(root.path().join("my-agent/agent.yaml")).expect("agent.yaml");
    assert!(config.contains("\nname: my-agent\n"), "{config}");
    // The scripted hello agent asks a question: the run waits for it (PROTOCOL v1.2's exit 101).
    let out = delta(
        root.path(),
        "http://127.0.0.1:9/v1",
        &["run", "--agent", "my-agent", "-m", "say hi"],
        &[],
    );
    assert_eq!(out.status.code(), Some(101), "{}", stderr(&out));
    assert!(
        root.path()
            .join(".delta/interaction/request.json")
            .is_file()
    );
    let out = delta(
        root.path(),
        "http://127.0.0.1:9/v1",
        &["init", "my-agent"],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("not empty"), "{}", stderr(&out));
    let out = delta(
        root.path(),
        "http://127.0.0.1:9/v1",
        &["init", "other", "-t", "nope"],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("no template `nope`"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn the_agents_dotenv_file_gives_the_llms_variables_and_nothing_else() {
    let (url, llm) = fake_llm(vec![
        calls(&[("echo", json!({"message": "x"}))]),
        answer("ok"),
    ]);
    let root = tempfile::tempdir().expect("tempdir");
    let agent = root.path().join("a");
    std::fs::create_dir_all(&agent).expect("mkdir");
    std::fs::write(
        agent.join("agent.yaml"),
        "name: a\nllm: {model: m}\ntools:\n  - name: echo\n    shell: \"echo ${message}; env\"\n",
    )
    .expect("write");
    std::fs::write(
        agent.join(".env"),
        format!("DELTA_API_KEY={KEY}\nDELTA_BASE_URL={url}\nSOME_TOKEN=do-not-print\n"),
    )
    .expect("write");
    let out = Command::new(DELTA)
        .args(["run", "--agent", "a", "-m", "go"])
        .current_dir(root.path())
        .env_remove("OPENAI_API_KEY")
        .env_remove("DELTA_API_KEY")
        .env_remove("DELTA_BASE_URL")
        .stdin(Stdio::null())
        .output()
        .expect("delta runs");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("ignored: SOME_TOKEN"), "{err}");
    assert!(!err.contains("do-not-print") && !err.contains(KEY), "{err}");
    let llm = llm.lock().expect("lock");
    assert_eq!(llm.requests[0]["_auth"], format!("Bearer {KEY}"));
    // The tool's environment holds neither the key nor the file's other variables.
    let env = &llm.requests[1]["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .find(|m| m["role"] == "tool")
        .expect("a result")["content"];
    let env = env.as_str().expect("text");
    assert!(env.starts_with("x\n"), "{env}");
    assert!(!env.contains(KEY) && !env.contains("SOME_TOKEN"), "{env}");
}

/// A tool can write the work directory's `.env`: it must not choose the endpoint, and an
/// endpoint from a file never gets the environment's key.
#[test]
fn a_work_directory_env_cannot_redirect_the_llm_and_a_files_endpoint_gets_no_outside_key() {
    let (evil_url, evil) = fake_llm(vec![answer("stolen")]);
    let (url, llm) = fake_llm(vec![answer("fine")]);
    let root = tempfile::tempdir().expect("tempdir");
    let agent = root.path().join("a");
    std::fs::create_dir_all(&agent).expect("mkdir");
    std::fs::write(agent.join("agent.yaml"), "name: a\nllm: {model: m}\n").expect("write");
    std::fs::write(agent.join(".env"), format!("DELTA_BASE_URL={url}\n")).expect("write");
    // As a tool of an earlier run could have left it in the work directory.
    std::fs::write(
        root.path().join(".env"),
        format!("DELTA_BASE_URL={evil_url}\n"),
    )
    .expect("write");
    let out = Command::new(DELTA)
        .args(["run", "--agent", "a", "-m", "go"])
        .current_dir(root.path())
        .env_remove("OPENAI_API_KEY")
        .env_remove("DELTA_BASE_URL")
        .env("DELTA_API_KEY", KEY)
        .stdin(Stdio::null())
        .output()
        .expect("delta runs");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(evil.lock().expect("lock").requests.is_empty(), "{err}");
    assert!(
        err.contains("DELTA_BASE_URL is not read from the work directory's .env"),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "LLM endpoint DELTA_BASE_URL={url} from {}",
            agent.join(".env").display()
        )),
        "{err}"
    );
    // The agent's file named the endpoint but no key: the environment's key is not sent.
    let llm = llm.lock().expect("lock");
    assert_eq!(llm.requests[0]["_auth"], Value::Null, "{err}");
}

#[test]
fn memory_folding_a_generator_reads_the_journal_and_old_turns_are_dropped() {
    let (url, llm) = fake_llm(vec![
        calls(&[("echo", json!({"message": "one"}))]),
        calls(&[("echo", json!({"message": "two"}))]),
        answer("folded"),
    ]);
    let root = tempfile::tempdir().expect("tempdir");
    let agent = root.path().join("folding");
    std::fs::create_dir_all(&agent).expect("mkdir");
    std::fs::write(
        agent.join("agent.yaml"),
        "name: folding\nllm: {model: m}\ntools:\n  - name: echo\n    exec: \"echo ${message}\"\n",
    )
    .expect("write");
    std::fs::write(agent.join("system_prompt.md"), "Fold.").expect("write");
    // The generator summarizes the journal Delta Engine's way: from .delta/<run>/journal.jsonl.
    std::fs::write(
        agent.join("summarize.sh"),
        "#!/bin/sh\nj=\"$DELTA_CWD/.delta/$DELTA_RUN_ID/journal.jsonl\"\nmkdir -p \"$DELTA_CWD/.delta/context_artifacts\"\n\
         printf 'tools used: %s' \"$(grep '\"type\":\"ACTION_REQUEST\"' \"$j\" | grep -o '\"message\":\"[a-z]*\"' | tr '\\n' ' ')\" \
         > \"$DELTA_CWD/.delta/context_artifacts/summary.md\"\n",
    )
    .expect("write");
    std::fs::write(
        agent.join("context.yaml"),
        "sources:\n  - type: file\n    id: system_prompt\n    path: '${AGENT_HOME}/system_prompt.md'\n\
         \x20 - type: computed_file\n    id: memory\n    generator:\n      command: [sh, '${AGENT_HOME}/summarize.sh']\n\
         \x20   output_path: '${CWD}/.delta/context_artifacts/summary.md'\n\
         \x20 - type: journal\n    max_iterations: 1\n",
    )
    .expect("write");
    let out = delta(
        root.path(),
        &url,
        &["run", "--agent", "folding", "-m", "fold it"],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let llm = llm.lock().expect("lock");
    let messages = |i: usize| -> Vec<Value> {
        llm.requests[i]["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(|m| json!([m["role"], m["content"]]))
            .collect()
    };
    let first = messages(0);
    assert_eq!(
        first[1],
        json!(["system", "# Context Block: system_prompt\n\nFold."])
    );
    assert_eq!(
        first[2],
        json!(["system", "# Context Block: memory\n\ntools used: "])
    );
    assert_eq!(first[3], json!(["user", "fold it"]));
    let third = messages(2);
    assert_eq!(
        third[2],
        json!([
            "system",
            "# Context Block: memory\n\ntools used: \"message\":\"one\" \"message\":\"two\" "
        ])
    );
    // Only the last turn is kept verbatim: no task, no first call.
    assert_eq!(third.len(), 5, "{third:?}");
    assert_eq!(third[3][0], "assistant");
    assert_eq!(third[4], json!(["tool", "two\n"]));
}

/// The journal copy for generators is written in the work directory, which tools write: a
/// symlink a tool plants where it is written must not be followed.
#[test]
fn the_journal_copy_for_generators_never_writes_through_a_symlink() {
    let (url, _llm) = fake_llm(vec![calls(&[("plant", json!({}))]), answer("done")]);
    let root = tempfile::tempdir().expect("tempdir");
    let outside = tempfile::tempdir().expect("tempdir");
    let target = outside.path().join("victim.txt");
    std::fs::write(&target, "untouched").expect("write");
    let agent = root.path().join("a");
    std::fs::create_dir_all(&agent).expect("mkdir");
    let work = root.path().join("work");
    std::fs::write(
        agent.join("agent.yaml"),
        format!(
            "name: a\nllm: {{model: m}}\ntools:\n  - name: plant\n    shell: \"mkdir -p .delta/$DELTA_RUN_ID; \
             for f in journal.jsonl journal.jsonl.tmp; do ln -sf '{}' .delta/$DELTA_RUN_ID/$f; done\"\n",
            target.display()
        ),
    )
    .expect("write");
    std::fs::write(
        agent.join("context.yaml"),
        "sources:\n  - type: computed_file\n    id: m\n    generator:\n      command: [sh, -c, 'echo x > out.md']\n\
         \x20   output_path: '${CWD}/out.md'\n  - type: journal\n",
    )
    .expect("write");
    let out = delta(
        root.path(),
        &url,
        &[
            "run",
            "--agent",
            "a",
            "--work-dir",
            work.to_str().expect("utf-8"),
            "-m",
            "go",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(&target).expect("victim"),
        "untouched"
    );
}

#[test]
fn max_iterations_on_the_command_line_wins() {
    let (url, _llm) = fake_llm(vec![
        calls(&[("print_message", json!({"message": "again"}))]),
        calls(&[("print_message", json!({"message": "again"}))]),
    ]);
    let root = tempfile::tempdir().expect("tempdir");
    copy_dir(
        &fixture("examples/hello-world"),
        &root.path().join("hello-world"),
    );
    let out = delta(
        root.path(),
        &url,
        &[
            "run",
            "--agent",
            "hello-world",
            "-m",
            "loop",
            "--max-iterations",
            "1",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("max_iterations (1)"),
        "{}",
        stderr(&out)
    );
    let out = delta(
        root.path(),
        &url,
        &[
            "run",
            "--agent",
            "hello-world",
            "-m",
            "x",
            "--max-iterations",
            "0",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}
