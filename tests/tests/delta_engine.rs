//! Delta Engine v1.10's agents in the fleet: real nats-server, redis-server, gateway and worker
//! processes; only the LLM is faked (an OpenAI-compatible endpoint served by the test, found by
//! the worker through `DELTA_BASE_URL` and `DELTA_API_KEY`). The agents are submitted by name
//! with only an `agent.yaml` (the gateway's check), run with their `context.yaml`, and their
//! hooks fire on the worker, journaled.

use std::path::Path;
use std::sync::{Arc, Mutex};

use delta_e2e::fleet::Fleet;
use delta_protocol::{Event, RunStatus};
use delta_store::RunStore;
use serde_json::{Value, json};

const KEY: &str = "sk-fleet-delta-engine";

use delta_e2e::{copy_dir, delta_engine_fixture as fixture};

#[derive(Default)]
struct Exchange {
    requests: Vec<Value>,
    replies: Vec<Value>,
}

type Recorded = Arc<Mutex<Exchange>>;

async fn completions(
    axum::extract::State(s): axum::extract::State<Recorded>,
    headers: axum::http::HeaderMap,
    axum::Json(mut body): axum::Json<Value>,
) -> (axum::http::StatusCode, axum::Json<Value>) {
    let mut s = s.lock().expect("lock");
    body["_auth"] = json!(headers.get("authorization").and_then(|v| v.to_str().ok()));
    s.requests.push(body);
    if s.replies.is_empty() {
        return (
            axum::http::StatusCode::BAD_REQUEST,
            axum::Json(json!({"error": {"message": "out of replies"}})),
        );
    }
    (axum::http::StatusCode::OK, axum::Json(s.replies.remove(0)))
}

async fn fake_llm(replies: Vec<Value>) -> (String, Recorded) {
    let shared: Recorded = Arc::new(Mutex::new(Exchange {
        requests: vec![],
        replies,
    }));
    let app = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(completions))
        .with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/v1"), shared)
}

fn calls(list: &[(&str, Value)]) -> Value {
    let calls: Vec<Value> = list
        .iter()
        .enumerate()
        .map(|(i, (name, args))| {
            json!({"id": format!("call_{i}"), "type": "function",
                   "function": {"name": name, "arguments": args.to_string()}})
        })
        .collect();
    json!({"choices": [{"message": {"role": "assistant", "content": "on it", "tool_calls": calls}}]})
}

fn answer(text: &str) -> Value {
    json!({"choices": [{"message": {"role": "assistant", "content": text}}]})
}

/// A fleet (one gateway, one worker) whose worker reaches `llm_url` through Delta Engine's
/// variables, with the given agent directories added.
async fn fleet(prefix: &str, llm_url: &str, agents: &[(&str, &Path)]) -> Fleet {
    let mut fleet = Fleet::start(prefix, 1, 0).await;
    for (name, from) in agents {
        copy_dir(from, &fleet.gateway_spec.agents_dir.join(name));
    }
    fleet
        .worker_spec
        .extra
        .push(("DELTA_BASE_URL", llm_url.to_owned()));
    fleet
        .worker_spec
        .extra
        .push(("DELTA_API_KEY", KEY.to_owned()));
    fleet.add_worker("w0");
    fleet
}

fn tool_results(request: &Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or("").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn delta_engines_examples_run_in_the_fleet() {
    let (url, llm) = fake_llm(vec![
        calls(&[
            ("print_message", json!({"message": "Hello from the fleet"})),
            (
                "write_to_file",
                json!({"filename": "greeting.txt", "content": "hi"}),
            ),
            ("show_date", json!({})),
        ]),
        answer("Greeted."),
        calls(&[
            ("echo_message", json!({"message": "legacy"})),
            ("count_lines", json!({"file": "greeting.txt"})),
        ]),
        answer("Counted."),
    ])
    .await;
    let fleet = fleet(
        "de-examples",
        &url,
        &[
            ("hello-world", &fixture("examples/hello-world")),
            ("tool-syntax", &fixture("examples/tool-syntax")),
        ],
    )
    .await;

    let run = fleet.submit("hello-world", "Say hello").await;
    fleet.wait_status(run, RunStatus::Completed).await;
    let stored = fleet.store.load(run).await.expect("load");
    assert_eq!(stored.record.result.as_deref(), Some("Greeted."));
    {
        let llm = llm.lock().expect("lock");
        assert_eq!(llm.requests.len(), 2);
        assert_eq!(llm.requests[0]["_auth"], format!("Bearer {KEY}"));
        assert_eq!(llm.requests[0]["model"], "gpt-5-mini");
        let first = llm.requests[0]["messages"].as_array().expect("messages");
        assert!(
            first[1]["content"]
                .as_str()
                .expect("text")
                .starts_with("# Context Block: system_prompt\n\n"),
            "{first:?}"
        );
        assert_eq!(first[2], json!({"role": "user", "content": "Say hello"}));
        let results = tool_results(&llm.requests[1]);
        assert_eq!(results[0], "Hello from the fleet\n");
        assert_eq!(results[1], "hi");
        assert!(!results[2].is_empty());
    }

    // tool-syntax's tools run in the same run's work directory: its own, so greeting.txt is not
    // there and `wc` says so.
    let run = fleet.submit("tool-syntax", "Count").await;
    fleet.wait_status(run, RunStatus::Completed).await;
    {
        let llm = llm.lock().expect("lock");
        let results = tool_results(&llm.requests[3]);
        assert_eq!(results[0], "legacy\n");
        assert!(results[1].contains("greeting.txt"), "{}", results[1]);
    }

    // The other examples need programs besides an LLM for their tools (Delta Engine's
    // `delta-sessions`, Claude Code): submitted as they are, they load on the worker and complete
    // when the model answers without a tool.
    for name in ["interactive-shell", "python-repl", "delta-agent-generator"] {
        copy_dir(
            &fixture(&format!("examples/{name}")),
            &fleet.gateway_spec.agents_dir.join(name),
        );
        llm.lock()
            .expect("lock")
            .replies
            .push(answer(&format!("{name} answered")));
        let run = fleet.submit(name, "Just answer").await;
        fleet.wait_status(run, RunStatus::Completed).await;
        let stored = fleet.store.load(run).await.expect("load");
        assert_eq!(
            stored.record.result.as_deref(),
            Some(format!("{name} answered").as_str())
        );
    }
}

/// A hook that appends its name and payload to the file `$1`.
const RECORD_SH: &str = r#"#!/bin/sh
io="$DELTA_HOOK_IO_PATH"
payload=$(cat "$io"/input/*payload.json | tr -d '\n')
printf '%s %s\n' "$(basename "$io")" "$payload" >> "$1"
env | grep -c API_KEY >> "$1.keys"
env >> "$1.env"
cat "$io"/input/* >> "$1.inputs"
exit 0
"#;

#[tokio::test(flavor = "multi_thread")]
async fn hooks_fire_on_the_worker_in_order_and_are_journaled() {
    let (url, _llm) = fake_llm(vec![
        calls(&[("echo", json!({"message": "hi"}))]),
        answer("done"),
    ])
    .await;
    let scratch = tempfile::tempdir().expect("tempdir");
    let agent = scratch.path().join("hooked");
    std::fs::create_dir_all(&agent).expect("mkdir");
    std::fs::write(
        agent.join("agent.yaml"),
        "name: hooked\nllm:\n  model: m\ntools:\n  - name: echo\n    exec: \"echo ${message}\"\n",
    )
    .expect("write");
    std::fs::write(agent.join("record.sh"), RECORD_SH).expect("write");
    let log = scratch.path().join("hooks.log");
    let mut hooks = String::new();
    for h in [
        "pre_llm_req",
        "post_llm_resp",
        "pre_tool_exec",
        "post_tool_exec",
        "on_run_end",
    ] {
        hooks.push_str(&format!(
            "{h}:\n  command: [sh, '${{AGENT_HOME}}/record.sh', '{}']\n",
            log.display()
        ));
    }
    std::fs::write(agent.join("hooks.yaml"), hooks).expect("write");
    let fleet = fleet("de-hooks", &url, &[("hooked", &agent)]).await;

    let run = fleet.submit("hooked", "echo hi").await;
    fleet.wait_status(run, RunStatus::Completed).await;
    let text = std::fs::read_to_string(&log).expect("the hooks ran");
    let lines: Vec<&str> = text.lines().collect();
    let names: Vec<&str> = lines
        .iter()
        .map(|l| l.split(' ').next().unwrap_or(""))
        .collect();
    assert_eq!(
        names,
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
    let payload = |i: usize| -> Value {
        serde_json::from_str(lines[i].split_once(' ').expect("payload").1).expect("json")
    };
    assert_eq!(payload(2)["tool_name"], "echo");
    assert_eq!(payload(2)["tool_args"], json!({"message": "hi"}));
    assert_eq!(payload(3)["stdout"], "hi\n");
    assert_eq!(payload(6)["status"], "COMPLETED");
    assert_eq!(payload(6)["run_id"], run.to_string());
    // No hook saw an API key variable (the worker has DELTA_API_KEY).
    let keys = std::fs::read_to_string(format!("{}.keys", log.display())).expect("keys");
    assert!(keys.lines().all(|l| l == "0"), "{keys}");
    // Nor the key's value, under any name or in any input file; nor the worker's secrets key
    // or its Redis and NATS URLs (which hold logins).
    let env = std::fs::read_to_string(format!("{}.env", log.display())).expect("env");
    let inputs = std::fs::read_to_string(format!("{}.inputs", log.display())).expect("inputs");
    assert!(env.contains("DELTA_RUN_ID="), "{env}");
    for text in [&env, &inputs] {
        assert!(!text.contains(KEY), "the API key reached a hook");
        for secret in [
            "DELTA_SECRETS_KEY",
            "redis://",
            "rediss://",
            "nats://",
            "tls://",
        ] {
            assert!(!text.contains(secret), "{secret} reached a hook");
        }
    }
    for (name, value) in fleet.worker_spec.extra.iter() {
        if (name.contains("URL") || name.contains("KEY") || name.contains("SECRET"))
            && !value.is_empty()
        {
            assert!(
                !env.contains(value.as_str()),
                "the worker's {name} reached a hook"
            );
        }
    }
    let stored = fleet.store.load(run).await.expect("load");
    let audits: Vec<String> = stored
        .journal
        .iter()
        .filter_map(|e| match &e.event {
            Event::SystemMessage(m) if m.content.starts_with("hook ") => {
                Some(m.content.split(" (").next().unwrap_or("").to_owned())
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        audits,
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
    for e in &stored.journal {
        let line = serde_json::to_string(e).expect("json");
        assert!(!line.contains(KEY), "the key reached the journal: {line}");
    }
}
