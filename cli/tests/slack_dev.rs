//! `delta slack` and `delta dev --slack` as a user runs them: the built binary in a subprocess.
//! A bad config file is refused with every problem named; `delta dev --slack` starts the bridge
//! with the fleet, posts the demo's questions to a stand-in for Slack's Web API served here, and
//! a signed click answers one as the mapped person.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::routing::post;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use tokio::process::Command;

const SECRET: &str = "dev-signing-secret-0123456789";

#[tokio::test]
async fn a_bad_config_is_refused_with_every_problem_named() {
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("slack.yaml");
    std::fs::write(
        &file,
        "gateway_url: http://127.0.0.1:8080\nnats: {url: \"nats://127.0.0.1:4222\"}\nlisten: 127.0.0.1:3000\nroutes: [{agents: [\"*\"], chanel: C1}]\n",
    )
    .expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_delta"))
        .args(["slack", "--config"])
        .arg(&file)
        .env_remove("SLACK_BOT_TOKEN")
        .env_remove("SLACK_SIGNING_SECRET")
        .output()
        .await
        .expect("delta slack");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("chanel"), "{err}");
    std::fs::write(
        &file,
        "gateway_url: http://127.0.0.1:8080\nnats: {url: \"nats://127.0.0.1:4222\"}\nlisten: 127.0.0.1:3000\nroutes: [{agents: [\"*\"]}]\n",
    )
    .expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_delta"))
        .args(["slack", "--config"])
        .arg(&file)
        .env_remove("SLACK_BOT_TOKEN")
        .env_remove("SLACK_SIGNING_SECRET")
        .output()
        .await
        .expect("delta slack");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for needle in [
        "SLACK_BOT_TOKEN",
        "SLACK_SIGNING_SECRET",
        "neither a channel",
    ] {
        assert!(err.contains(needle), "{needle}: {err}");
    }
}

type Calls = Arc<Mutex<Vec<(String, Value)>>>;

async fn api(
    State(calls): State<Calls>,
    Path(method): Path<String>,
    body: Bytes,
) -> axum::Json<Value> {
    let params: Value = serde_json::from_slice(&body).unwrap_or(json!({}));
    let mut c = calls.lock().expect("calls");
    let ts = format!("1800000000.{:06}", c.len() + 1);
    let reply = match method.as_str() {
        "chat.postMessage" => json!({"ok": true, "channel": params["channel"], "ts": ts,
            "message": {"ts": ts, "text": params["text"]}}),
        "chat.update" => json!({"ok": true, "channel": params["channel"], "ts": params["ts"],
            "message": {"text": params["text"]}}),
        "chat.postEphemeral" => json!({"ok": true, "message_ts": ts}),
        _ => json!({"ok": true}),
    };
    let mut recorded = params;
    recorded["_ts"] = json!(ts);
    c.push((method, recorded));
    axum::Json(reply)
}

fn free_port() -> u16 {
    delta_launcher::free_port().expect("a free port")
}

#[tokio::test]
async fn delta_dev_starts_the_bridge_and_a_click_answers() {
    let calls: Calls = Arc::default();
    let app = Router::new()
        .route("/api/{method}", post(api))
        .with_state(calls.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let slack_port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("slack.yaml");
    let listen = free_port();
    std::fs::write(
        &file,
        format!(
            "gateway_url: http://replaced.invalid\nnats: {{url: \"nats://replaced.invalid:4222\"}}\nlisten: 127.0.0.1:{listen}\nslack_api_url: http://127.0.0.1:{slack_port}/api/\nroutes: [{{agents: [\"*\"], channel: C0DEMO}}]\nusers: {{by_id: {{U0ALICE: alice}}}}\n"
        ),
    )
    .expect("write");
    let mut child = Command::new(env!("CARGO_BIN_EXE_delta"))
        .args(["dev", "--workers", "1", "--slack"])
        .arg(&file)
        .env("SLACK_BOT_TOKEN", "xoxb-dev")
        .env("SLACK_SIGNING_SECRET", SECRET)
        .env("USER", "tester")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("delta dev");
    let pid = Pid::from_raw(i32::try_from(child.id().expect("pid")).expect("pid"));
    // The demo's chooser question, posted.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let post = loop {
        let found = calls.lock().expect("calls").iter().find_map(|(m, p)| {
            (m == "chat.postMessage"
                && p["text"]
                    .as_str()
                    .is_some_and(|t| t.contains("Which environment")))
            .then(|| p.clone())
        });
        if let Some(p) = found {
            break p;
        }
        if tokio::time::Instant::now() > deadline {
            let _ = kill(pid, Signal::SIGINT);
            panic!("never posted: {:?}", calls.lock().expect("calls"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let staging = post["blocks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| b["type"] == "actions")
        .flat_map(|b| b["elements"].as_array().cloned().unwrap_or_default())
        .find(|b| b["action_id"] == "delta.answer.staging")
        .expect("a staging button");
    let payload = json!({
        "type": "block_actions", "user": {"id": "U0ALICE"}, "trigger_id": "t",
        "channel": {"id": "C0DEMO"},
        "actions": [{"action_id": "delta.answer.staging", "value": staging["value"]}],
    });
    let body: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("payload", &payload.to_string())
        .finish();
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        .to_string();
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, SECRET.as_bytes());
    let tag = ring::hmac::sign(&key, format!("v0:{ts}:{body}").as_bytes());
    let sig: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let status = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{listen}/slack/interactivity"))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("x-slack-request-timestamp", &ts)
        .header("x-slack-signature", format!("v0={sig}"))
        .body(body)
        .send()
        .await
        .expect("click")
        .status();
    assert_eq!(status.as_u16(), 200);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let answered = calls.lock().expect("calls").iter().any(|(m, p)| {
            m == "chat.update"
                && p["ts"] == post["_ts"]
                && p.to_string().contains("Answered by *alice* via slack")
        });
        if answered {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            let _ = kill(pid, Signal::SIGINT);
            panic!("never updated: {:?}", calls.lock().expect("calls"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    kill(pid, Signal::SIGINT).expect("SIGINT");
    let status = tokio::time::timeout(Duration::from_secs(40), child.wait())
        .await
        .expect("stops after Ctrl+C")
        .expect("wait");
    assert_eq!(status.code(), Some(0));
}
