//! The A2A server (`/a2a`, the agent card, the JWKS) through a real fleet (nats-server,
//! redis-server, gateway and worker processes), driven by the official A2A Python SDK
//! (PyPI `a2a-sdk`, tests/py/a2a_client.py): the card lists the fleet's agents as skills; a
//! message to `hello` is `input-required`, a message on the task answers it, and the task
//! completes; `deployer` is followed through streams (plan, a sensitive key that is
//! `auth-required` with a link and refused through A2A, a choice, an approval); a task is
//! cancelled; a bad answer is refused with the gateway's code; push notifications reach a
//! receiver, each JWT verified by PyJWT against the served JWKS (`kid`, `aud`, the body's hash),
//! and the config's consumer is gone once the run ended. With tokens: each method's roles; push
//! configs are their creator's (and an operator's); answers tied to a question that changed or
//! moved on are `stale`; a retried message does not answer the next question, nor does one
//! refused (a claim held) retried once the task moved on. Push configs that are not an
//! operator's never reach `DELTA_WEBHOOK_ALLOW`'s receivers, at creation or delivery.

use std::process::Command;

use delta_e2e::fleet::Fleet;
use serde_json::{Value, json};

const KEY: &str = "5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e";

/// A fleet with `deployer` too, an A2A signing key, and push notifications allowed to loopback.
async fn fleet(prefix: &str) -> (Fleet, tempfile::TempDir) {
    let keys = tempfile::tempdir().expect("tmp");
    let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new())
        .expect("key");
    let key_file = keys.path().join("a2a.der");
    std::fs::write(&key_file, pkcs8.as_ref()).expect("write key");
    let key_path = key_file.display().to_string();
    let fleet = Fleet::start_with(prefix, 1, 1, |s| {
        s.secrets_key_hex = Some(KEY.to_owned());
        s.extra.extend([
            ("DELTA_WEBHOOK_ALLOW", "127.0.0.1/32".to_owned()),
            ("DELTA_WEBHOOK_RETRY_FIRST_S", "0.2".to_owned()),
            ("DELTA_WEBHOOK_RETRY_MAX_S", "1".to_owned()),
            ("DELTA_WEBHOOK_ACK_WAIT_S", "3".to_owned()),
            ("DELTA_A2A_SIGNING_KEY", key_path.clone()),
        ]);
    })
    .await;
    fleet.add_example("deployer");
    (fleet, keys)
}

/// Runs one scenario of tests/py/a2a_client.py; its report.
fn scenario(fleet: &Fleet, name: &str) -> Value {
    let python = delta_e2e::test_python();
    let has_sdk = Command::new(&python)
        .args(["-c", "import a2a.client, jwt"])
        .current_dir(std::env::temp_dir())
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        has_sdk,
        "{} lacks a2a-sdk or PyJWT: run deploy/install-test-python.sh",
        python.display()
    );
    // Outside the package's directory (STACK.md trap 13).
    let out = Command::new(&python)
        .arg(delta_e2e::python_scripts().join("a2a_client.py"))
        .arg(fleet.gateway_spec.url())
        .arg(name)
        .current_dir(std::env::temp_dir())
        .output()
        .expect("python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "scenario {name} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout.lines().last().unwrap_or_default();
    let report: Value =
        serde_json::from_str(last).unwrap_or_else(|e| panic!("{name}: not JSON ({e}): {stdout}"));
    eprintln!("{name}: {report}");
    report
}

async fn rpc(fleet: &Fleet, body: &str, content_type: &str) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{}/a2a", fleet.gateway_spec.url()))
        .header("content-type", content_type)
        .body(body.to_owned())
        .send()
        .await
        .expect("post");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_card_lists_the_agents_and_a_question_is_answered_through_a2a() {
    let (fleet, _keys) = fleet("a2ahello").await;

    let card = scenario(&fleet, "card");
    let skills: Vec<&str> = card["skills"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for agent in ["hello", "deployer", "secret", "chooser"] {
        assert!(skills.contains(&agent), "{agent} is not a skill: {card}");
    }
    assert_eq!(card["bindings"], json!(["JSONRPC"]), "{card}");
    assert_eq!(card["versions"], json!(["1.0"]), "{card}");
    assert_eq!(
        card["urls"],
        json!([format!("{}/a2a", fleet.gateway_spec.url())])
    );
    assert_eq!(card["streaming"], true);
    assert_eq!(card["push"], true);

    let hello = scenario(&fleet, "hello");
    assert_eq!(hello["first"], "TASK_STATE_INPUT_REQUIRED", "{hello}");
    assert_eq!(hello["question"]["prompt"], "What is your name?", "{hello}");
    assert!(
        hello["prompt_text"]
            .as_str()
            .unwrap()
            .contains("What is your name?")
    );
    assert_eq!(hello["final"], "TASK_STATE_COMPLETED", "{hello}");
    assert_eq!(hello["result"], "Greeted Ada.", "{hello}");
    assert_eq!(hello["context_id"], hello["task_id"]);
    // A message on a task that no longer waits is refused with the gateway's code.
    assert_eq!(hello["again"], "already_resolved", "{hello}");
    // The answer took the gateway's one answer path, recorded as A2A's.
    let run: delta_protocol::RunId = hello["task_id"].as_str().unwrap().parse().unwrap();
    let journal = fleet
        .store
        .journal_from(run, 1, 10_000)
        .await
        .expect("journal");
    let via: Vec<String> = journal
        .iter()
        .filter_map(|e| match &e.event {
            delta_protocol::Event::HumanInputReceived(h) => Some(format!("{:?}", h.responder.via)),
            _ => None,
        })
        .collect();
    assert_eq!(via, vec!["A2a".to_owned()], "{journal:?}");

    let bad = scenario(&fleet, "bad_answer");
    assert_eq!(bad["first"], "TASK_STATE_INPUT_REQUIRED", "{bad}");
    assert_eq!(
        bad["options"],
        json!(["confirm", "modify", "cancel"]),
        "{bad}"
    );
    assert_eq!(bad["code"], "invalid_option", "{bad}");
    assert_eq!(bad["still"], "TASK_STATE_INPUT_REQUIRED", "{bad}");
    assert_eq!(bad["missing"], "TaskNotFoundError", "{bad}");

    let cancel = scenario(&fleet, "cancel");
    assert_eq!(cancel["first"], "TASK_STATE_INPUT_REQUIRED", "{cancel}");
    assert_eq!(cancel["cancelled"], "TASK_STATE_CANCELED", "{cancel}");
    assert_eq!(cancel["again"], "already_resolved", "{cancel}");
    assert_eq!(cancel["get"], "TASK_STATE_CANCELED", "{cancel}");

    // What no SDK sends: every one a JSON-RPC error, never a panic or an HTML page.
    let cases = [
        ("not json", -32700),
        ("{\"jsonrpc\": \"2.0\", \"id\": 1}", -32600),
        (
            "{\"jsonrpc\": \"1.0\", \"id\": 1, \"method\": \"GetTask\"}",
            -32600,
        ),
        (
            "{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": \"message/send\", \"params\": {}}",
            -32601,
        ),
        (
            "{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": \"Nope\"}",
            -32601,
        ),
        (
            "{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": \"GetTask\", \"params\": {\"id\": \"x\", \"bogus\": 1}}",
            -32602,
        ),
        (
            "{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": \"GetTask\", \"params\": {\"id\": \"x\"}}",
            -32001,
        ),
        (
            "{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": \"SendMessage\", \"params\": {\"message\": {\"messageId\": \"m\", \"parts\": []}}}",
            -32602,
        ),
        ("[1, 2]", -32600),
    ];
    for (body, code) in cases {
        let (status, b) = rpc(&fleet, body, "application/json").await;
        assert_eq!(status, 200, "{body}: {b}");
        assert_eq!(b["error"]["code"], code, "{body}: {b}");
    }
    // The gateway's own rule holds here too: a POST that is not JSON is refused.
    let (status, _) = rpc(&fleet, "{}", "text/plain").await;
    assert_eq!(status, 400);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deployer_run_is_streamed_and_its_sensitive_question_is_auth_required() {
    let (fleet, _keys) = fleet("a2astream").await;
    let s = scenario(&fleet, "stream");
    assert_eq!(s["final"], "TASK_STATE_COMPLETED", "{s}");
    let seen: Vec<&str> = s["seen"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    // Each stream ends where someone is needed, or at the end.
    let ends: Vec<&str> = seen
        .split(|x| *x == "|")
        .filter_map(|stream| stream.last().copied())
        .filter(|x| *x != "TASK_STATE_WORKING")
        .collect();
    assert_eq!(
        ends,
        vec![
            "TASK_STATE_INPUT_REQUIRED",
            "TASK_STATE_AUTH_REQUIRED",
            "TASK_STATE_INPUT_REQUIRED",
            "TASK_STATE_INPUT_REQUIRED",
            "TASK_STATE_COMPLETED",
        ],
        "{s}"
    );
    assert_eq!(s["key_sensitive"], true, "{s}");
    let link = s["link"].as_str().expect("a link");
    assert!(link.starts_with("http://127.0.0.1:"), "{link}");
    assert!(link.contains("#link="), "{link}");
    // The link opened that very question, answered it once, and is spent.
    assert_eq!(s["opened_request"], true, "{s}");
    assert_eq!(s["link_reused"], 404, "{s}");
    assert!(s["key_text"].as_str().unwrap().contains(link), "{s}");
    // The secret sent through A2A is refused, and not echoed back.
    assert_eq!(
        s["refused"],
        json!({"code": "forbidden", "echoed": false}),
        "{s}"
    );
    assert_eq!(s["env_options"], json!(["staging", "production", "other"]));
    assert_eq!(s["approval_type"], "TOOL_APPROVAL", "{s}");
    // Neither secret reached the journal.
    let run: delta_protocol::RunId = s["task_id"].as_str().unwrap().parse().unwrap();
    let journal = serde_json::to_string(
        &fleet
            .store
            .journal_from(run, 1, 10_000)
            .await
            .expect("journal"),
    )
    .unwrap();
    assert!(!journal.contains("s3cret-key"), "a secret in the journal");
}

#[tokio::test(flavor = "multi_thread")]
async fn push_notifications_are_signed_with_the_gateways_key() {
    let (fleet, _keys) = fleet("a2apush").await;
    let p = scenario(&fleet, "push");
    let states: Vec<&str> = p["states"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    // In order, each at least once: asked, answered, done.
    let mut firsts: Vec<&str> = vec![];
    for s in &states {
        if !firsts.contains(s) {
            firsts.push(s);
        }
    }
    assert_eq!(
        firsts,
        vec![
            "TASK_STATE_INPUT_REQUIRED",
            "TASK_STATE_WORKING",
            "TASK_STATE_COMPLETED"
        ],
        "{p}"
    );
    for v in p["verified"].as_array().unwrap() {
        assert_eq!(v["kid_is_jwks"], true, "{v}");
        assert_eq!(v["iat"], true, "{v}");
        assert_eq!(v["task_id"], p["task_id"], "{v}");
        assert_eq!(v["token"], "tok-123", "{v}");
        assert_eq!(v["content_type"], "application/json", "{v}");
        assert_eq!(v["aud"], p["origin"], "{v}");
        assert_eq!(v["wrong_aud_refused"], true, "{v}");
        assert_eq!(v["body_hash_ok"], true, "{v}");
    }
    // Listed without its token, and with its URL's path and query hidden.
    let listed = &p["listed"][0];
    assert_eq!(listed["taskId"], p["task_id"], "{p}");
    assert!(listed.get("token").is_none(), "{p}");
    assert!(
        !listed["url"].as_str().unwrap().contains("in-the-url"),
        "{p}"
    );
    // A config to an inside address is refused, and the message starts no run.
    let runs = |b: &Value| b["runs"].as_array().map_or(0, Vec::len);
    let (_, before) = fleet.client.get("/v1/runs").await.expect("runs");
    let mut params = text_message("inside", None, Some("hello"));
    params["configuration"] =
        json!({"taskPushNotificationConfig": {"url": "http://10.1.2.3/hook"}});
    let (_, b) = call(&fleet, None, "SendMessage", params).await;
    assert_eq!(b["error"]["code"], -32602, "{b}");
    assert_eq!(gateway_code(&b), "invalid_args", "{b}");
    let (_, after) = fleet.client.get("/v1/runs").await.expect("runs");
    assert_eq!(runs(&after), runs(&before), "{after}");
    // Once the end is delivered, the config and its consumer are gone.
    let task = p["task_id"].as_str().unwrap();
    delta_e2e::chaos::wait_until(
        "the config is deleted",
        std::time::Duration::from_secs(30),
        || async {
            fleet
                .store
                .a2a_pushes_of(task)
                .await
                .map(|c| c.is_empty())
                .unwrap_or(false)
        },
    )
    .await;
    let consumers = push_consumers(&fleet, "a2apush").await;
    assert!(consumers.is_empty(), "left behind: {consumers:?}");
}

/// The names of the A2A push consumers on the events stream.
async fn push_consumers(fleet: &Fleet, prefix: &str) -> Vec<String> {
    let js = async_nats::jetstream::new(fleet.nats_admin().await);
    let stream = js
        .get_stream(delta_queue::Names::new(prefix).interactions_stream())
        .await
        .expect("events stream");
    delta_e2e::consumer_names(&stream)
        .await
        .into_iter()
        .filter(|n| n.contains("-a2apush-"))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn push_notifications_outlive_the_gateway_that_was_delivering_them() {
    use std::io::{BufRead, BufReader, Write};
    use std::process::Stdio;

    let (mut fleet, _keys) = fleet("a2adurable").await;
    let mut child = Command::new(delta_e2e::test_python())
        .arg(delta_e2e::python_scripts().join("a2a_client.py"))
        .arg(fleet.gateway_spec.url())
        .arg("push_durable")
        .current_dir(std::env::temp_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut stdin = child.stdin.take().expect("stdin");
    let (line, mut stdout) = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read");
        (line, stdout)
    })
    .await
    .expect("reader");
    assert_eq!(line.trim(), "failing", "the scenario did not get going");
    // The only gateway, retrying against a refusing receiver, dies; another one starts.
    fleet.gateways[0].process.signal(delta_e2e::Signal::SIGKILL);
    fleet.add_gateway(None).await;
    let url = fleet.gateways.last().expect("gateway").url.clone();
    writeln!(stdin, "{url}").expect("write");
    let (rest, status) = tokio::task::spawn_blocking(move || {
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut rest).expect("read");
        (rest, child.wait().expect("wait"))
    })
    .await
    .expect("reader");
    assert!(status.success(), "push_durable failed: {rest}");
    let report: Value = serde_json::from_str(rest.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {rest}"));
    eprintln!("push_durable: {report}");
    let mut firsts: Vec<&str> = vec![];
    for s in report["states"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
    {
        if !firsts.contains(&s) {
            firsts.push(s);
        }
    }
    assert_eq!(
        firsts,
        vec![
            "TASK_STATE_INPUT_REQUIRED",
            "TASK_STATE_WORKING",
            "TASK_STATE_COMPLETED"
        ],
        "{report}"
    );
    assert_eq!(report["verified"], report["states"], "{report}");
}

/// One JSON-RPC call with `token` (none: no `Authorization`).
async fn call(fleet: &Fleet, token: Option<&str>, method: &str, params: Value) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{}/a2a", fleet.gateway_spec.url()))
        .json(&json!({"jsonrpc": "2.0", "id": "1", "method": method, "params": params}));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.expect("post");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn text_message(text: &str, task: Option<&str>, skill: Option<&str>) -> Value {
    let mut m = json!({
        "messageId": delta_protocol::RunId::new().to_string(),
        "role": "ROLE_USER",
        "parts": [{"text": text}],
    });
    if let Some(t) = task {
        m["taskId"] = json!(t);
    }
    if let Some(s) = skill {
        m["metadata"] = json!({"skill": s});
    }
    json!({"message": m})
}

fn gateway_code(b: &Value) -> &str {
    b["error"]["data"][0]["metadata"]["code"]
        .as_str()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn with_tokens_each_method_takes_the_gateways_roles() {
    let dir = tempfile::tempdir().expect("tmp");
    let tokens = dir.path().join("tokens.yaml");
    let entries = [
        ("sam", "sam-token-0123456789ab", "submit"),
        ("ann", "ann-token-0123456789ab", "answer"),
        ("rel", "rel-token-0123456789ab", "relay"),
    ];
    let text: String = entries
        .iter()
        .map(|(n, t, r)| format!("- name: {n}\n  token: {t}\n  roles: [{r}]\n"))
        .collect();
    std::fs::write(&tokens, text).expect("tokens");
    let fleet = Fleet::start_with("a2aauth", 1, 1, |s| {
        s.tokens_file = Some(tokens.clone());
    })
    .await;
    let (sam, ann, rel) = (
        Some("sam-token-0123456789ab"),
        Some("ann-token-0123456789ab"),
        Some("rel-token-0123456789ab"),
    );

    // The card is public and says how to authenticate.
    let card: Value = reqwest::get(format!(
        "{}/.well-known/agent-card.json",
        fleet.gateway_spec.url()
    ))
    .await
    .expect("card")
    .json()
    .await
    .expect("json");
    assert_eq!(
        card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"],
        "Bearer"
    );

    // No token: 401 with a JSON-RPC error.
    let (status, b) = call(
        &fleet,
        None,
        "SendMessage",
        text_message("x", None, Some("hello")),
    )
    .await;
    assert_eq!(status, 401, "{b}");
    assert_eq!(gateway_code(&b), "unauthorized", "{b}");

    // An answerer may not start a task; a submitter may.
    let (_, b) = call(
        &fleet,
        ann,
        "SendMessage",
        text_message("x", None, Some("hello")),
    )
    .await;
    assert_eq!(gateway_code(&b), "forbidden", "{b}");
    let (_, b) = call(
        &fleet,
        sam,
        "SendMessage",
        text_message("roles", None, Some("hello")),
    )
    .await;
    assert_eq!(
        b["result"]["task"]["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{b}"
    );
    let task = b["result"]["task"]["id"].as_str().expect("id").to_owned();
    let run: delta_protocol::RunId = task.parse().unwrap();
    assert_eq!(
        fleet
            .store
            .record(run)
            .await
            .expect("run")
            .submitted_by
            .as_deref(),
        Some("sam")
    );

    // Neither the submitter nor a relay may answer; an answerer may.
    for who in [sam, rel] {
        let (_, b) = call(
            &fleet,
            who,
            "SendMessage",
            text_message("Eve", Some(&task), None),
        )
        .await;
        assert_eq!(gateway_code(&b), "forbidden", "{b}");
    }
    let (_, b) = call(
        &fleet,
        ann,
        "SendMessage",
        text_message("Ann", Some(&task), None),
    )
    .await;
    assert!(b.get("error").is_none(), "{b}");
    fleet
        .wait_status(run, delta_protocol::RunStatus::Completed)
        .await;
    let (_, b) = call(&fleet, ann, "GetTask", json!({"id": task})).await;
    assert_eq!(
        b["result"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{b}"
    );

    // A sensitive question: the link only for whom may answer.
    let (_, b) = call(
        &fleet,
        sam,
        "SendMessage",
        text_message("k", None, Some("secret")),
    )
    .await;
    assert_eq!(
        b["result"]["task"]["status"]["state"], "TASK_STATE_AUTH_REQUIRED",
        "{b}"
    );
    let secret = b["result"]["task"]["id"].as_str().expect("id").to_owned();
    let data = |b: &Value| b["result"]["status"]["message"]["parts"][1]["data"].clone();
    let (_, b) = call(&fleet, sam, "GetTask", json!({"id": secret})).await;
    assert_eq!(data(&b)["url"], Value::Null, "{b}");
    let (_, b) = call(&fleet, ann, "GetTask", json!({"id": secret})).await;
    assert!(
        data(&b)["url"]
            .as_str()
            .is_some_and(|u| u.contains("#link=")),
        "{b}"
    );
    // Read through a name other than loopback on this plain-HTTP gateway (no
    // `DELTA_PUBLIC_URL`), no link can be made: it would carry the answer in clear. The task is
    // still given, `auth-required`, saying why.
    let r = reqwest::Client::new()
        .post(format!("{}/a2a", fleet.gateway_spec.url()))
        .header(reqwest::header::HOST, "delta.example.com")
        .bearer_auth(ann.expect("ann"))
        .json(&json!({"jsonrpc": "2.0", "id": "1", "method": "GetTask", "params": {"id": secret}}))
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 200);
    let b: Value = r.json().await.expect("json");
    assert_eq!(
        b["result"]["status"]["state"], "TASK_STATE_AUTH_REQUIRED",
        "{b}"
    );
    let text = &b["result"]["status"]["message"]["parts"][0]["text"];
    assert!(
        text.as_str()
            .is_some_and(|t| t.contains("no one-time inbox link could be made")),
        "{b}"
    );
    assert_eq!(data(&b)["url"], Value::Null, "{b}");
    assert!(
        data(&b)["link_error"]
            .as_str()
            .is_some_and(|e| e.contains("DELTA_PUBLIC_URL")),
        "{b}"
    );

    // Cancelling: the submitter may, an answerer who did not submit may not.
    let (_, b) = call(&fleet, ann, "CancelTask", json!({"id": secret})).await;
    assert_eq!(gateway_code(&b), "forbidden", "{b}");
    let (_, b) = call(&fleet, sam, "CancelTask", json!({"id": secret})).await;
    assert_eq!(b["result"]["status"]["state"], "TASK_STATE_CANCELED", "{b}");

    // Push notifications are off without a signing key.
    let (_, b) = call(
        &fleet,
        sam,
        "CreateTaskPushNotificationConfig",
        json!({"taskId": task, "url": "https://example.com/hook"}),
    )
    .await;
    assert_eq!(b["error"]["code"], -32003, "{b}");
}

/// The status message's data part: the question as data.
fn question_of(task: &Value) -> Value {
    task["status"]["message"]["parts"][1]["data"].clone()
}

/// A message answering `task` with `text`, tied to the question by `tie` (a data part), under
/// `message_id`.
fn answer_message(task: &str, text: &str, tie: Value, message_id: &str) -> Value {
    let mut parts = vec![json!({"text": text})];
    if !tie.is_null() {
        parts.push(json!({"data": tie}));
    }
    json!({"message": {
        "messageId": message_id,
        "role": "ROLE_USER",
        "taskId": task,
        "parts": parts,
    }})
}

#[tokio::test(flavor = "multi_thread")]
async fn with_tokens_push_configs_are_their_creators_and_answers_are_tied_to_their_question() {
    let dir = tempfile::tempdir().expect("tmp");
    let tokens = dir.path().join("tokens.yaml");
    let entries = [
        ("sam", "sam-token-0123456789ab", "submit"),
        ("sue", "sue-token-0123456789ab", "submit"),
        ("ann", "ann-token-0123456789ab", "answer"),
        ("ops", "ops-token-0123456789ab", "operate"),
    ];
    let text: String = entries
        .iter()
        .map(|(n, t, r)| format!("- name: {n}\n  token: {t}\n  roles: [{r}]\n"))
        .collect();
    std::fs::write(&tokens, text).expect("tokens");
    let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new())
        .expect("key");
    let key_file = dir.path().join("a2a.der");
    std::fs::write(&key_file, pkcs8.as_ref()).expect("write key");
    let key_path = key_file.display().to_string();
    let fleet = Fleet::start_with("a2aown", 1, 1, |s| {
        s.tokens_file = Some(tokens.clone());
        s.secrets_key_hex = Some(KEY.to_owned());
        s.extra.extend([
            ("DELTA_WEBHOOK_ALLOW", "127.0.0.1/32".to_owned()),
            ("DELTA_A2A_PUSH_ALLOW", "127.0.0.2/32".to_owned()),
            ("DELTA_A2A_SIGNING_KEY", key_path.clone()),
        ]);
    })
    .await;
    fleet.add_agent(
        "twice",
        "name: twice\nbrain: scripted\n",
        "steps:\n  - ask_human:\n      prompt: \"First?\"\n  - ask_human:\n      prompt: \"Second?\"\n  - finish: \"done\"\n",
    );
    let (sam, sue, ann, ops) = (
        Some("sam-token-0123456789ab"),
        Some("sue-token-0123456789ab"),
        Some("ann-token-0123456789ab"),
        Some("ops-token-0123456789ab"),
    );
    let (_, b) = call(
        &fleet,
        sam,
        "SendMessage",
        text_message("go", None, Some("twice")),
    )
    .await;
    let t = &b["result"]["task"];
    assert_eq!(t["status"]["state"], "TASK_STATE_INPUT_REQUIRED", "{b}");
    let task = t["id"].as_str().expect("id").to_owned();
    let q1 = question_of(t);
    let rid1 = q1["request_id"].as_str().expect("request_id").to_owned();
    assert!(
        q1["request_hash"].as_str().is_some_and(|h| !h.is_empty()),
        "{q1}"
    );

    // Another submitter may not cancel sam's task.
    let (_, b) = call(&fleet, sue, "CancelTask", json!({"id": task})).await;
    assert_eq!(gateway_code(&b), "forbidden", "{b}");
    // A message that may not answer (sam submits, answering is ann's) stores nothing of its
    // push config either: the answer is checked before the config is made.
    let mut params = answer_message(&task, "yes", serde_json::Value::Null, "pre-1");
    params["configuration"] = json!({"taskPushNotificationConfig": {
        "id": "pre", "url": "http://127.0.0.2:9/hook",
    }});
    let (_, b) = call(&fleet, sam, "SendMessage", params).await;
    assert_eq!(gateway_code(&b), "forbidden", "{b}");
    let all = fleet.store.a2a_all_pushes().await.expect("configs");
    assert!(!all.contains(&(task.clone(), "pre".to_owned())), "{all:?}");
    assert!(push_consumers(&fleet, "a2aown").await.is_empty());

    // The webhooks' exceptions (`DELTA_WEBHOOK_ALLOW`, the operators' own receivers) are for
    // an operator's push configs only: anyone else's may reach public addresses and
    // `DELTA_A2A_PUSH_ALLOW`'s exceptions. Before, any token that could read a task could have
    // the gateway post into the webhooks' private receivers.
    let to = |id: &str, url: &str| json!({"taskId": task, "id": id, "url": url});
    let inside = "https://127.0.0.1:9/hook";
    let (_, b) = call(
        &fleet,
        sam,
        "CreateTaskPushNotificationConfig",
        to("inside", inside),
    )
    .await;
    assert_eq!(b["error"]["code"], -32602, "{b}");
    let message = b["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("127.0.0.1") && message.contains("DELTA_A2A_PUSH_ALLOW"),
        "names the address and the setting that would allow it: {b}"
    );
    let (_, b) = call(
        &fleet,
        ops,
        "CreateTaskPushNotificationConfig",
        to("inside", inside),
    )
    .await;
    assert_eq!(b["result"]["id"], "inside", "an operator's may: {b}");
    let (_, b) = call(
        &fleet,
        ops,
        "DeleteTaskPushNotificationConfig",
        json!({"taskId": task, "id": "inside"}),
    )
    .await;
    assert!(b.get("error").is_none(), "{b}");
    // Push configs are their creator's.
    let config = |id: &str| to(id, "http://127.0.0.2:9/hook");
    let (_, b) = call(
        &fleet,
        sam,
        "CreateTaskPushNotificationConfig",
        config("mine"),
    )
    .await;
    assert_eq!(b["result"]["id"], "mine", "{b}");
    let (_, b) = call(
        &fleet,
        sue,
        "CreateTaskPushNotificationConfig",
        config("hers"),
    )
    .await;
    assert_eq!(b["result"]["id"], "hers", "{b}");
    let mine = json!({"taskId": task, "id": "mine"});
    let (_, b) = call(&fleet, sue, "GetTaskPushNotificationConfig", mine.clone()).await;
    assert_eq!(gateway_code(&b), "not_found", "{b}");
    let (_, b) = call(
        &fleet,
        sue,
        "DeleteTaskPushNotificationConfig",
        mine.clone(),
    )
    .await;
    assert_eq!(gateway_code(&b), "not_found", "{b}");
    let (_, b) = call(
        &fleet,
        sue,
        "CreateTaskPushNotificationConfig",
        config("mine"),
    )
    .await;
    assert_eq!(gateway_code(&b), "forbidden", "{b}");
    // Refused attempts left sam's config whole, delivery included.
    let all = fleet.store.a2a_all_pushes().await.expect("configs");
    assert!(all.contains(&(task.clone(), "mine".to_owned())), "{all:?}");
    // The per-task limit counts per caller.
    for i in 0..9 {
        let (_, b) = call(
            &fleet,
            sue,
            "CreateTaskPushNotificationConfig",
            config(&format!("s{i}")),
        )
        .await;
        assert!(b.get("error").is_none(), "{b}");
    }
    let (_, b) = call(
        &fleet,
        sue,
        "CreateTaskPushNotificationConfig",
        config("s9"),
    )
    .await;
    assert_eq!(gateway_code(&b), "rate_limited", "{b}");
    // The refusal leaves no consumer behind: one per stored config, no more.
    let stored = fleet.store.a2a_all_pushes().await.expect("configs").len();
    assert_eq!(push_consumers(&fleet, "a2aown").await.len(), stored);
    let (_, b) = call(
        &fleet,
        sam,
        "CreateTaskPushNotificationConfig",
        config("mine2"),
    )
    .await;
    assert!(b.get("error").is_none(), "{b}");
    for i in 0..9 {
        let (_, b) = call(
            &fleet,
            sue,
            "DeleteTaskPushNotificationConfig",
            json!({"taskId": task, "id": format!("s{i}")}),
        )
        .await;
        assert!(b.get("error").is_none(), "{b}");
    }
    let (_, b) = call(
        &fleet,
        sam,
        "DeleteTaskPushNotificationConfig",
        json!({"taskId": task, "id": "mine2"}),
    )
    .await;
    assert!(b.get("error").is_none(), "{b}");
    let ids = |b: &Value| -> Vec<String> {
        b["result"]["configs"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|c| c["id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let list = json!({"taskId": task});
    let (_, b) = call(&fleet, sue, "ListTaskPushNotificationConfigs", list.clone()).await;
    assert_eq!(ids(&b), vec!["hers"], "{b}");
    let (_, b) = call(&fleet, sam, "ListTaskPushNotificationConfigs", list.clone()).await;
    assert_eq!(ids(&b), vec!["mine"], "{b}");
    let (_, b) = call(&fleet, sam, "GetTaskPushNotificationConfig", mine.clone()).await;
    assert_eq!(b["result"]["id"], "mine", "{b}");
    // An operator sees, replaces and deletes all; what it replaces stays its creator's.
    let (_, b) = call(&fleet, ops, "ListTaskPushNotificationConfigs", list.clone()).await;
    assert_eq!(ids(&b), vec!["hers", "mine"], "{b}");
    let (_, b) = call(
        &fleet,
        ops,
        "CreateTaskPushNotificationConfig",
        config("hers"),
    )
    .await;
    assert_eq!(b["result"]["id"], "hers", "{b}");
    let (_, b) = call(&fleet, sue, "ListTaskPushNotificationConfigs", list.clone()).await;
    assert_eq!(ids(&b), vec!["hers"], "{b}");
    let (_, b) = call(
        &fleet,
        ops,
        "DeleteTaskPushNotificationConfig",
        json!({"taskId": task, "id": "hers"}),
    )
    .await;
    assert!(b.get("error").is_none(), "{b}");
    let (_, b) = call(&fleet, sam, "DeleteTaskPushNotificationConfig", mine).await;
    assert!(b.get("error").is_none(), "{b}");

    // An answer to a question that changed since it was shown (another hash), or to another
    // question, is stale.
    // It carried a push config, made before the answer was refused: the config goes again,
    // and its consumer with it.
    let mut stale = answer_message(
        &task,
        "Ann",
        json!({"request_id": rid1, "request_hash": "not-the-shown-one"}),
        "m-stale-1",
    );
    stale["configuration"] = json!({"taskPushNotificationConfig": config("with-stale")});
    let (_, b) = call(&fleet, ann, "SendMessage", stale).await;
    assert_eq!(gateway_code(&b), "stale", "{b}");
    let all = fleet.store.a2a_all_pushes().await.expect("configs");
    assert!(
        !all.contains(&(task.clone(), "with-stale".to_owned())),
        "{all:?}"
    );
    assert_eq!(push_consumers(&fleet, "a2aown").await.len(), all.len());
    let (_, b) = call(
        &fleet,
        ann,
        "SendMessage",
        answer_message(
            &task,
            "Ann",
            json!({"request_id": delta_protocol::RunId::new().to_string()}),
            "m-stale-2",
        ),
    )
    .await;
    assert_eq!(gateway_code(&b), "stale", "{b}");

    // Ann's untied answer while the operator holds a claim on the question: refused. Her retry
    // after the task moved on must not answer the next question.
    let ops_http = fleet.client.with_token(ops);
    let (status, body) = ops_http
        .post(&format!("/v1/interactions/{rid1}/claim"), &json!({}))
        .await
        .expect("claim");
    assert_eq!(status, 200, "{body}");
    let held_off = answer_message(&task, "too early", Value::Null, "m-claimed");
    let (_, b) = call(&fleet, ann, "SendMessage", held_off.clone()).await;
    assert_eq!(gateway_code(&b), "claimed", "{b}");

    // An operator answers, as over HTTP, tied to the question it saw.
    // Its push config stays: the answer was taken.
    let tie = json!({"request_id": rid1, "request_hash": q1["request_hash"]});
    let mut answer = answer_message(&task, "first", tie, "m-1");
    answer["configuration"] = json!({"taskPushNotificationConfig": config("with-answer")});
    let (_, b) = call(&fleet, ops, "SendMessage", answer.clone()).await;
    assert!(b.get("error").is_none(), "{b}");
    let all = fleet.store.a2a_all_pushes().await.expect("configs");
    assert!(
        all.contains(&(task.clone(), "with-answer".to_owned())),
        "{all:?}"
    );
    let run: delta_protocol::RunId = task.parse().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let rid2 = loop {
        let (_, b) = call(&fleet, ops, "GetTask", json!({"id": task})).await;
        if let Some(rid) = question_of(&b["result"])["request_id"].as_str()
            && rid != rid1
        {
            break rid.to_owned();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no second question: {b}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    // The same message again (a retry after a lost response) does not answer the next question.
    let (_, b) = call(&fleet, ops, "SendMessage", answer).await;
    assert!(b.get("error").is_none(), "{b}");
    let (_, b) = call(&fleet, ops, "GetTask", json!({"id": task})).await;
    assert_eq!(
        b["result"]["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{b}"
    );
    assert_eq!(question_of(&b["result"])["request_id"], rid2, "{b}");
    // Nor does ann's refused one.
    let (_, b) = call(&fleet, ann, "SendMessage", held_off).await;
    assert!(b.get("error").is_none(), "{b}");
    let (_, b) = call(&fleet, ops, "GetTask", json!({"id": task})).await;
    assert_eq!(
        (
            &b["result"]["status"]["state"],
            &question_of(&b["result"])["request_id"]
        ),
        (&json!("TASK_STATE_INPUT_REQUIRED"), &json!(rid2)),
        "{b}"
    );
    let (_, b) = call(
        &fleet,
        ann,
        "SendMessage",
        answer_message(&task, "second", json!({"request_id": rid2}), "m-2"),
    )
    .await;
    assert!(b.get("error").is_none(), "{b}");
    fleet
        .wait_status(run, delta_protocol::RunStatus::Completed)
        .await;
}

/// The types of the events stream's messages about `run`, in order.
async fn run_event_types(fleet: &Fleet, stream: &str, run: &str) -> Vec<String> {
    let js = async_nats::jetstream::new(fleet.nats_admin().await);
    let mut events = js.get_stream(stream).await.expect("stream");
    delta_e2e::stored_events(&mut events)
        .await
        .into_iter()
        .filter(|v| v["deltarun"] == json!(run))
        .map(|v| v["type"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// A task cancelled through a gateway that died before announcing it (`cancel:before-announce`):
/// CancelTask again, on another gateway, is refused as over, and announces the end that push
/// notifications and every other listener wait on, once.
#[tokio::test(flavor = "multi_thread")]
async fn cancel_task_again_announces_an_end_its_gateway_died_before_announcing() {
    let mut fleet = Fleet::start("a2acx", 0, 1).await;
    let doomed = fleet.add_gateway(Some("cancel:before-announce")).await;
    let rpc = |method: &str, params: Value| json!({"jsonrpc": "2.0", "id": "1", "method": method, "params": params});
    let (_, b) = doomed
        .post(
            "/a2a",
            &rpc("SendMessage", text_message("go", None, Some("hello"))),
        )
        .await
        .expect("send");
    let t = &b["result"]["task"];
    assert_eq!(t["status"]["state"], "TASK_STATE_INPUT_REQUIRED", "{b}");
    let task = t["id"].as_str().expect("id").to_owned();
    let cancel = rpc("CancelTask", json!({"id": task}));
    let reply = doomed.post("/a2a", &cancel).await;
    assert!(reply.is_err(), "the gateway died with the call: {reply:?}");
    assert_eq!(
        fleet.gateways[0].wait_exit(std::time::Duration::from_secs(10)),
        Some(86)
    );
    let run: delta_protocol::RunId = task.parse().expect("uuid");
    fleet
        .wait_status(run, delta_protocol::RunStatus::Cancelled)
        .await;
    // The question's announcement, and nothing of the cancel.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let before = loop {
        let seen = run_event_types(&fleet, "A2ACX_INTERACTIONS", &task).await;
        if !seen.is_empty() {
            break seen;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the question announced"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(before, ["dev.delta.interaction.requested"]);

    let healthy = fleet.add_gateway(None).await;
    let (_, b) = healthy.post("/a2a", &cancel).await.expect("cancel");
    assert_eq!(b["error"]["code"], -32002, "{b}");
    assert_eq!(gateway_code(&b), "already_resolved", "{b}");
    let after = run_event_types(&fleet, "A2ACX_INTERACTIONS", &task).await;
    assert_eq!(
        after[before.len()..],
        ["dev.delta.interaction.cancelled", "dev.delta.run.cancelled"],
        "{after:?}"
    );
    let (_, b) = healthy.post("/a2a", &cancel).await.expect("cancel");
    assert_eq!(b["error"]["code"], -32002, "{b}");
    assert_eq!(
        run_event_types(&fleet, "A2ACX_INTERACTIONS", &task).await,
        after,
        "announced once"
    );
}

/// Deliveries keep to the policy their config was set under: one an operator set reaches
/// `DELTA_WEBHOOK_ALLOW`'s receiver (here a loopback one), one that is not an operator's never
/// does (it may reach public addresses and `DELTA_A2A_PUSH_ALLOW`'s only), and one stored before
/// the policy was recorded is judged by its creator's roles (with authentication off, an
/// operator's). Each config stored as the gateway stores them, so that delivery alone decides.
#[tokio::test(flavor = "multi_thread")]
async fn push_deliveries_keep_to_the_policy_of_their_config() {
    use std::sync::{Arc, Mutex};
    let (fleet, _keys) = fleet("a2apol").await;
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let app = {
        let seen = seen.clone();
        axum::Router::new().route(
            "/{which}",
            axum::routing::post(
                move |axum::extract::Path(which): axum::extract::Path<String>| {
                    let seen = seen.clone();
                    async move {
                        seen.lock().expect("seen").push(which);
                        axum::http::StatusCode::OK
                    }
                },
            ),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let run = fleet.submit("hello", "push me").await;
    fleet.pending(run).await;
    let limits = delta_store::redis::PushLimits {
        per_task: 10,
        per_caller: 100,
        fleet: 2000,
    };
    for (id, listed) in [
        ("listed", Some(true)),
        ("unlisted", Some(false)),
        ("legacy", None),
    ] {
        let c = delta_store::redis::A2aPushConfig {
            id: id.to_owned(),
            task_id: run.to_string(),
            url: format!("http://127.0.0.1:{port}/{id}"),
            sealed_token: None,
            created_by: None,
            created_at: delta_protocol::Timestamp::now(),
            allow_listed: listed,
        };
        fleet
            .store
            .a2a_put_push(&c, true, limits)
            .await
            .expect("stored");
    }
    // The delivery loop finds them within its scan (5 s); each follows the run from its start.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let now: Vec<String> = seen.lock().expect("seen").clone();
        if now.iter().any(|w| w == "listed") && now.iter().any(|w| w == "legacy") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the operators' configs were not delivered: {now:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // The other one was tried as soon (the same scan, the same events) and refused before any
    // connection, which the gateway counts as a failure of that config: wait for the count (so
    // that the delivery loop did try it), then give it a retry's time more.
    let failing = format!(
        "{}:{{a2a}}:push-failing:{run}/unlisted",
        fleet.store.prefix()
    );
    let mut raw = delta_e2e::redis_connection(&fleet.redis.url()).await;
    while !redis::cmd("EXISTS")
        .arg(&failing)
        .query_async::<bool>(&mut raw)
        .await
        .expect("exists")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the unlisted config was never tried"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let now: Vec<String> = seen.lock().expect("seen").clone();
    assert!(
        !now.iter().any(|w| w == "unlisted"),
        "a config not an operator's reached a DELTA_WEBHOOK_ALLOW receiver: {now:?}"
    );
}
