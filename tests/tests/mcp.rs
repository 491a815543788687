//! The MCP server at `/mcp` (docs/protocols.md "MCP"), driven by a client nobody here wrote:
//! the official MCP Python SDK (PyPI `mcp`, tests/py/mcp_client.py) against real servers, a
//! gateway with tokens and a worker. The script checks what a client sees; this test checks
//! what the fleet keeps: the journal's answers, who gave them and through what, and that the
//! secret given through the one-time link never reached the journal.

use std::process::Command;

use delta_e2e::fleet::{Fleet, FleetLogs};
use delta_protocol::{Event, RunId, RunStatus, Via};
use delta_store::RunStore;
use serde_json::Value;

fn token(name: &str) -> String {
    format!("{name}-token-0123456789abcdef")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_official_python_client_lists_calls_answers_and_follows_tasks() {
    let python = delta_e2e::test_python();
    let dir = tempfile::tempdir().expect("tmp");
    let tokens = dir.path().join("tokens.yaml");
    let people = [
        ("alice", "submit, answer"),
        ("bob", "answer"),
        ("sub", "submit"),
    ];
    let text: String = people
        .iter()
        .map(|(n, r)| format!("- name: {n}\n  token: {}\n  roles: [{r}]\n", token(n)))
        .collect();
    std::fs::write(&tokens, text).expect("tokens");
    let mut fleet = Fleet::start_with("mcp", 0, 0, |s| {
        s.tokens_file = Some(tokens.clone());
        // Sensitive answers are sealed with it (the workers get the same key).
        s.secrets_key_hex = Some("42".repeat(32));
    })
    .await;
    // Everything the processes log, at debug: neither the key nor a link may show there.
    let logs = tempfile::tempdir().expect("logs");
    fleet.logs = Some(FleetLogs {
        dir: logs.path().to_path_buf(),
        filter: Some("debug".into()),
        spans: false,
    });
    fleet.add_gateway(None).await;
    fleet.add_worker("w0");
    fleet.add_example("deployer");
    fleet.add_agent(
        "failer",
        "name: failer\nbrain: scripted\n",
        "steps:\n  - fail: \"out of coffee\"\n",
    );

    // Without a token: 401, with the scheme to use.
    let resp = reqwest::Client::new()
        .post(format!("{}/mcp", fleet.gateway_spec.url()))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#)
        .send()
        .await
        .expect("the gateway answers");
    assert_eq!(resp.status(), 401);
    assert_eq!(
        resp.headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok()),
        Some("Bearer")
    );

    let out = Command::new(&python)
        .arg(delta_e2e::python_scripts().join("mcp_client.py"))
        .args([
            fleet.gateway_spec.url(),
            token("alice"),
            token("bob"),
            token("sub"),
        ])
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "the MCP client failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    assert_eq!(report["protocol_version"], "2026-07-28", "{report}");
    assert_eq!(
        report["refused"]["data"]["code"], "invalid_option",
        "{report}"
    );

    // The deploy's journal: every answer by alice, via MCP (the key via the link it gave),
    // and the key itself nowhere.
    let run: RunId = report["deployer_run"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("the deploy's run id");
    fleet.wait_status(run, RunStatus::Completed).await;
    let stored = fleet.store.load(run).await.expect("the run");
    let answers: Vec<_> = stored
        .journal
        .iter()
        .filter_map(|e| match &e.event {
            Event::HumanInputReceived(a) => Some(a),
            _ => None,
        })
        .collect();
    assert_eq!(answers.len(), 3, "plan, key, environment: {answers:#?}");
    for a in &answers {
        assert_eq!(
            (a.responder.id.as_str(), a.responder.via),
            ("alice", Via::Mcp),
            "{a:?}"
        );
    }
    let text = serde_json::to_string(&stored.journal).expect("json");
    assert!(
        !text.contains("sk-live-1234567890"),
        "the key is not journaled"
    );
    let link = report["link"].as_str().expect("the link");
    let secret = link.rsplit_once("#link=").expect("a link").1;
    let mut logged = 0;
    for entry in std::fs::read_dir(logs.path()).expect("logs") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("a log");
        logged += text.len();
        assert!(
            !text.contains("sk-live-1234567890"),
            "the key in {}",
            path.display()
        );
        assert!(!text.contains(secret), "the link in {}", path.display());
    }
    assert!(logged > 1000, "the processes logged ({logged} bytes)");
}

/// A `requestState` is the client's to echo back and is never trusted: one naming more linked
/// questions than a run could have links for is refused before any of them is read (each would
/// cost reads); the same id many times counts once.
#[tokio::test(flavor = "multi_thread")]
async fn a_request_state_naming_too_many_questions_is_refused() {
    let fleet = Fleet::start("mcpst", 1, 0).await;
    let url = &fleet.gateways[0].url;
    let call = async |linked: Vec<String>| -> Value {
        let state = serde_json::json!({"run": RunId::new().to_string(), "linked": linked});
        let meta = serde_json::json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "state-test", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {},
        });
        let params = serde_json::json!({
            "name": "hello", "arguments": {"task": "now"}, "_meta": meta,
            "requestState": state.to_string(),
        });
        delta_e2e::mcp_tools_call(url, None, "hello", params).await
    };
    let many: Vec<String> = (0..17)
        .map(|_| delta_protocol::RequestId::new().to_string())
        .collect();
    let refused = call(many).await;
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("not one this gateway gave out")),
        "{refused}"
    );
    // 17 times one id is one: past the check, to the run it names (which does not exist).
    let one = delta_protocol::RequestId::new().to_string();
    let once = call(vec![one; 17]).await;
    assert!(
        !once.to_string().contains("not one this gateway gave out"),
        "{once}"
    );
}
