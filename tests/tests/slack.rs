//! The Slack bridge (`delta slack`, docs/slack.md) against real servers, a real gateway and real
//! workers. The one stand-in is Slack's Web API, served here: it records every call, answers
//! as Slack would (a `429` with `Retry-After: 1` once when asked to), and the tests send
//! interactivity payloads signed as Slack signs them.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use delta_e2e::NatsRole;
use delta_e2e::fleet::{Fleet, pending, submit_as};
use delta_e2e::gateways::Client;
use delta_protocol::{Event, RunStatus, Via};
use delta_store::RunStore;
use serde_json::{Value, json};

const SECRET: &str = "test-signing-secret-0123456789";

/// One call the bridge made.
#[derive(Clone, Debug)]
struct Call {
    method: String,
    params: Value,
    /// What the stand-in answered: 200, 429, 400 for a refusal (`ok: false`, sent with HTTP
    /// 200 as Slack does), or 0 for a call it never answered.
    status: u16,
}

#[derive(Default)]
struct FakeState {
    calls: Mutex<Vec<Call>>,
    /// Answer the next `chat.postMessage` with `429` and `Retry-After: 1`.
    rate_limit_next_post: AtomicBool,
    /// Never answer the next `chat.update` (a call that hangs).
    hang_next_update: AtomicBool,
    /// Refuse the next `chat.update` with this error code.
    refuse_next_update: Mutex<Option<String>>,
    /// Refuse every `chat.postMessage` to a channel with its error code.
    refuse_posts_to: Mutex<HashMap<String, String>>,
    seq: AtomicU64,
    /// Slack user id → e-mail address (`users.info`, `users.lookupByEmail`).
    emails: HashMap<String, String>,
}

/// A stand-in for `https://slack.com/api/` on a loopback port.
struct FakeSlack {
    url: String,
    state: Arc<FakeState>,
    _server: tokio::task::JoinHandle<()>,
}

fn params_of(query: Option<&str>, body: &[u8]) -> Value {
    let mut out = serde_json::Map::new();
    if let Ok(Value::Object(m)) = serde_json::from_slice::<Value>(body) {
        out.extend(m);
    } else {
        for (k, v) in form_urlencoded::parse(body) {
            out.insert(k.into_owned(), json!(v));
        }
    }
    for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        out.insert(k.into_owned(), json!(v));
    }
    Value::Object(out)
}

async fn api(
    State(s): State<Arc<FakeState>>,
    Path(method): Path<String>,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Response {
    let params = params_of(query.as_deref(), &body);
    let n = s.seq.fetch_add(1, Ordering::SeqCst) + 1;
    let ts = format!("{}.{:06}", 1_800_000_000 + n, n);
    if method == "chat.postMessage" && s.rate_limit_next_post.swap(false, Ordering::SeqCst) {
        s.calls.lock().expect("calls").push(Call {
            method,
            params,
            status: 429,
        });
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", "1"), ("content-type", "application/json")],
            json!({"ok": false, "error": "ratelimited"}).to_string(),
        )
            .into_response();
    }
    let channel = params["channel"].as_str().unwrap_or_default().to_owned();
    if method == "chat.update" && s.hang_next_update.swap(false, Ordering::SeqCst) {
        s.calls.lock().expect("calls").push(Call {
            method,
            params,
            status: 0,
        });
        return std::future::pending::<Response>().await;
    }
    let refusal = match method.as_str() {
        "chat.update" => s.refuse_next_update.lock().expect("refuse").take(),
        "chat.postMessage" => s
            .refuse_posts_to
            .lock()
            .expect("refuse")
            .get(&channel)
            .cloned(),
        _ => None,
    };
    if let Some(code) = refusal {
        s.calls.lock().expect("calls").push(Call {
            method,
            params,
            status: 400,
        });
        return axum::Json(json!({"ok": false, "error": code})).into_response();
    }
    let user_email = |u: &str| s.emails.get(u).cloned();
    let reply = match method.as_str() {
        "chat.postMessage" => {
            // A DM to a user lands in a DM channel of its own.
            let channel = match channel.strip_prefix('U') {
                Some(rest) => format!("D{rest}"),
                None => channel.clone(),
            };
            json!({"ok": true, "channel": channel, "ts": ts,
                   "message": {"ts": ts, "text": params["text"]}})
        }
        "chat.update" => {
            json!({"ok": true, "channel": channel, "ts": params["ts"], "message": {"text": params["text"]}})
        }
        "chat.postEphemeral" => json!({"ok": true, "message_ts": ts}),
        "views.open" => json!({"ok": true}),
        "users.info" => {
            let user = params["user"].as_str().unwrap_or_default().to_owned();
            let mut profile = json!({});
            if let Some(e) = user_email(&user) {
                profile["email"] = json!(e);
            }
            json!({"ok": true, "user": {"id": user, "profile": profile}})
        }
        "users.lookupByEmail" => {
            let email = params["email"].as_str().unwrap_or_default();
            match s.emails.iter().find(|(_, e)| e.as_str() == email) {
                Some((u, _)) => json!({"ok": true, "user": {"id": u}}),
                None => json!({"ok": false, "error": "users_not_found"}),
            }
        }
        "conversations.history" => {
            let calls = s.calls.lock().expect("calls");
            let messages: Vec<Value> = calls
                .iter()
                .filter(|c| {
                    c.status == 200
                        && c.method == "chat.postMessage"
                        && c.params["channel"] == json!(channel)
                })
                .map(|c| json!({"ts": c.params["_ts"], "text": c.params["text"], "metadata": c.params["metadata"]}))
                .collect();
            json!({"ok": true, "messages": messages})
        }
        _ => json!({"ok": false, "error": "unknown_method"}),
    };
    let mut recorded = params;
    if method == "chat.postMessage" {
        recorded["_ts"] = reply["ts"].clone();
        recorded["_channel"] = reply["channel"].clone();
    }
    s.calls.lock().expect("calls").push(Call {
        method,
        params: recorded,
        status: 200,
    });
    axum::Json(reply).into_response()
}

impl FakeSlack {
    /// Posts to `channel` are refused with Slack's error `code` from now on (`None`: taken
    /// again).
    fn refuse_posts(&self, channel: &str, code: Option<&str>) {
        let mut refused = self.state.refuse_posts_to.lock().expect("refuse");
        match code {
            Some(c) => refused.insert(channel.to_owned(), c.to_owned()),
            None => refused.remove(channel),
        };
    }

    async fn start(emails: &[(&str, &str)]) -> FakeSlack {
        let state = Arc::new(FakeState {
            emails: emails
                .iter()
                .map(|(u, e)| (u.to_string(), e.to_string()))
                .collect(),
            ..Default::default()
        });
        let app = Router::new()
            .route("/api/{method}", any(api))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeSlack {
            url: format!("http://127.0.0.1:{port}/api/"),
            state,
            _server: server,
        }
    }

    fn calls(&self) -> Vec<Call> {
        self.state.calls.lock().expect("calls").clone()
    }

    /// The successful calls of `method`.
    fn ok(&self, method: &str) -> Vec<Value> {
        self.calls()
            .into_iter()
            .filter(|c| c.method == method && c.status == 200)
            .map(|c| c.params)
            .collect()
    }

    /// The successful posts of the question `rid` (its metadata names it).
    fn posts_of(&self, rid: &str) -> Vec<Value> {
        self.ok("chat.postMessage")
            .into_iter()
            .filter(|p| p["metadata"]["event_payload"]["request_id"] == json!(rid))
            .collect()
    }

    /// Waits (up to 30 s) until `check` finds something in the calls.
    async fn wait_for<T>(&self, what: &str, check: impl Fn(&FakeSlack) -> Option<T>) -> T {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(t) = check(self) {
                return t;
            }
            assert!(
                Instant::now() < deadline,
                "never saw {what}; calls: {:#?}",
                self.calls()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A tokens file: `(name, roles)`, each token `<name>-token-0123456789abcdef`.
fn tokens_file(dir: &std::path::Path, entries: &[(&str, &str)]) -> std::path::PathBuf {
    let file = dir.join("tokens.yaml");
    let text: String = entries
        .iter()
        .map(|(name, roles)| {
            format!(
                "- name: {name}\n  token: {}\n  roles: [{roles}]\n",
                token(name)
            )
        })
        .collect();
    std::fs::write(&file, text).expect("tokens");
    file
}

fn token(name: &str) -> String {
    format!("{name}-token-0123456789abcdef")
}

/// The people of every test: `ops` submits, `alice` and `bob` answer, `slack` is the bridge.
const PEOPLE: &[(&str, &str)] = &[
    ("ops", "operate"),
    ("alice", "answer"),
    ("bob", "answer"),
    ("slack", "relay"),
];

/// Slack users: alice by id, bob by e-mail; `U0NOBODY` maps to nobody.
const EMAILS: &[(&str, &str)] = &[("U0BOB", "bob@example.com"), ("U0NOBODY", "x@example.com")];

struct Setup {
    fleet: Fleet,
    slack: FakeSlack,
    bridge: Bridge,
    ops: Client,
    prefix: String,
    _dir: tempfile::TempDir,
}

/// The bridge process, killed on drop.
struct Bridge {
    child: Option<Child>,
    config: std::path::PathBuf,
    env: Vec<(String, String)>,
    port: u16,
}

impl Bridge {
    fn spawn(&mut self) {
        let delta = delta_e2e::workers::programs()
            .gateway
            .with_file_name("delta");
        let log = self.config.with_extension("log");
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("log");
        let child = Command::new(delta)
            .args(["slack", "--config"])
            .arg(&self.config)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("DELTA_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .spawn()
            .expect("delta slack");
        self.child = Some(child);
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .is_err()
        {
            assert!(
                Instant::now() < deadline,
                "the bridge never listened; its log: {}",
                std::fs::read_to_string(self.config.with_extension("log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/slack/interactivity", self.port)
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn setup(prefix: &str, agents: &[(&str, &str, &str)]) -> Setup {
    setup_with(prefix, agents, "").await
}

/// [`setup`] with more of the bridge's config (YAML lines).
async fn setup_with(prefix: &str, agents: &[(&str, &str, &str)], more: &str) -> Setup {
    setup_via(prefix, agents, more, None).await
}

/// [`setup_with`], the bridge calling the gateway at `gateway_url` when given.
async fn setup_via(
    prefix: &str,
    agents: &[(&str, &str, &str)],
    more: &str,
    gateway_url: Option<String>,
) -> Setup {
    let dir = tempfile::tempdir().expect("tmp");
    let tokens = tokens_file(dir.path(), PEOPLE);
    let fleet = Fleet::start_with(prefix, 1, 1, |s| s.tokens_file = Some(tokens.clone())).await;
    for (name, config, script) in agents {
        fleet.add_agent(name, config, script);
    }
    let slack = FakeSlack::start(EMAILS).await;
    let port = delta_e2e::free_port().expect("port");
    let config = dir.path().join("slack.yaml");
    std::fs::write(
        &config,
        format!(
            "gateway_url: {}\nnats: {{prefix: {prefix}}}\nlisten: 127.0.0.1:{port}\ninbox_url: https://delta.example/inbox\nslack_api_url: {}\nroutes:\n  - {{agents: [guarded, escalating], channel: C0GUARD, dm: true}}\n  - {{agents: [dmonly], dm: true}}\n  - {{agents: [\"*\"], channel: C0ALL}}\nusers:\n  by_id: {{U0ALICE: alice}}\n  by_email: {{bob@example.com: bob, x@example.com: mallory}}\n{more}",
            gateway_url.unwrap_or_else(|| fleet.gateway_spec.url()),
            slack.url
        ),
    )
    .expect("config");
    let env = vec![
        ("SLACK_BOT_TOKEN".to_owned(), "xoxb-test".to_owned()),
        ("SLACK_SIGNING_SECRET".to_owned(), SECRET.to_owned()),
        ("DELTA_TOKEN".to_owned(), token("slack")),
        (
            "DELTA_NATS_URL".to_owned(),
            fleet.nats.url_as(NatsRole::Slack),
        ),
    ];
    let mut bridge = Bridge {
        child: None,
        config,
        env,
        port,
    };
    bridge.spawn();
    bridge.wait_ready().await;
    let ops = fleet.client.with_token(Some(&token("ops")));
    Setup {
        fleet,
        slack,
        bridge,
        ops,
        prefix: prefix.to_owned(),
        _dir: dir,
    }
}

/// Waits (up to 30 s) until the bridge's consumer has every event delivered and acknowledged:
/// nothing waits to be tried again.
async fn wait_events_done(s: &Setup) {
    let js = async_nats::jetstream::new(s.fleet.nats_admin().await);
    let stream = js
        .get_stream(delta_queue::Names::new(&s.prefix).interactions_stream())
        .await
        .expect("the events stream");
    let consumer = format!("{}-slack", s.prefix);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info = stream.consumer_info(&consumer).await.expect("the consumer");
        if info.num_ack_pending == 0 && info.num_pending == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "events still pending: {} unacknowledged, {} not delivered",
            info.num_ack_pending,
            info.num_pending
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64
}

fn sign(ts: &str, body: &str) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, SECRET.as_bytes());
    let tag = ring::hmac::sign(&key, format!("v0:{ts}:{body}").as_bytes());
    let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("v0={hex}")
}

/// Posts `payload` to the bridge as Slack would, signed at `ts` (with `signature` instead of
/// the right one when given): the status.
async fn send(bridge: &Bridge, payload: &Value, ts: i64, signature: Option<&str>) -> u16 {
    send_read(bridge, payload, ts, signature).await.0
}

/// [`send`], and the body of the bridge's answer.
async fn send_read(
    bridge: &Bridge,
    payload: &Value,
    ts: i64,
    signature: Option<&str>,
) -> (u16, String) {
    let body: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("payload", &payload.to_string())
        .finish();
    let ts = ts.to_string();
    let sig = signature
        .map(str::to_owned)
        .unwrap_or_else(|| sign(&ts, &body));
    let r = reqwest::Client::new()
        .post(bridge.url())
        .header("content-type", "application/x-www-form-urlencoded")
        .header("x-slack-request-timestamp", &ts)
        .header("x-slack-signature", sig)
        .body(body)
        .send()
        .await
        .expect("interactivity");
    let status = r.status().as_u16();
    (status, r.text().await.unwrap_or_default())
}

/// A click on the button `action_id` of the message `post`, by the Slack user `user`.
fn click(post: &Value, user: &str, action_id: &str) -> Value {
    let button = buttons(post)
        .into_iter()
        .find(|b| b["action_id"] == json!(action_id))
        .unwrap_or_else(|| panic!("no button {action_id} in {post}"));
    json!({
        "type": "block_actions",
        "user": {"id": user},
        "trigger_id": format!("trigger-{user}"),
        "channel": {"id": post["_channel"]},
        "container": {"type": "message", "message_ts": post["_ts"]},
        "response_url": "https://hooks.slack.example/x",
        "actions": [{"type": "button", "action_id": action_id, "value": button["value"], "block_id": "b"}],
    })
}

fn buttons(message: &Value) -> Vec<Value> {
    message["blocks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| b["type"] == "actions")
        .flat_map(|b| b["elements"].as_array().cloned().unwrap_or_default())
        .collect()
}

fn answers(run: &delta_store::StoredRun) -> Vec<delta_protocol::HumanInputReceived> {
    run.journal
        .iter()
        .filter_map(|e| match &e.event {
            Event::HumanInputReceived(h) => Some(h.clone()),
            _ => None,
        })
        .collect()
}

/// The updates of the message at `ts`.
fn updates_of(slack: &FakeSlack, ts: &Value) -> Vec<Value> {
    slack
        .ok("chat.update")
        .into_iter()
        .filter(|u| u["ts"] == *ts)
        .collect()
}

fn ephemerals_to(slack: &FakeSlack, user: &str) -> Vec<String> {
    slack
        .ok("chat.postEphemeral")
        .into_iter()
        .filter(|e| e["user"] == json!(user))
        .map(|e| e["text"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// A tool approval is posted once (through a 429 honoured), with a red, confirmed approve
/// button; a bad signature and an old timestamp are refused and change nothing; an unmapped
/// Slack user is told so; alice's click answers as alice via slack, relayed by the bridge's
/// token; the message loses its buttons and says who answered; bob's late click is refused to
/// bob only.
#[tokio::test(flavor = "multi_thread")]
async fn a_click_answers_as_the_mapped_person_and_the_message_follows() {
    let s = setup("slk1", &[]).await;
    s.slack
        .state
        .rate_limit_next_post
        .store(true, Ordering::SeqCst);
    let run = submit_as(&s.ops, "gated", "go").await;
    let rid = pending(&s.ops, run).await;
    let post = s
        .slack
        .wait_for("the question posted", |f| {
            f.posts_of(&rid).into_iter().next()
        })
        .await;
    assert_eq!(post["channel"], "C0ALL");
    let limited = s
        .slack
        .calls()
        .into_iter()
        .filter(|c| c.method == "chat.postMessage" && c.status == 429)
        .count();
    assert_eq!(limited, 1, "the stand-in answered 429 once");
    let b = buttons(&post);
    let approve = b
        .iter()
        .find(|b| {
            b["action_id"]
                .as_str()
                .is_some_and(|a| a.starts_with("delta.answer."))
        })
        .expect("an answer button");
    let dangerous: Vec<&Value> = b.iter().filter(|b| b["style"] == "danger").collect();
    assert!(!dangerous.is_empty(), "{b:?}");
    assert!(dangerous.iter().all(|d| d["confirm"].is_object()));
    assert!(
        approve["value"]
            .as_str()
            .is_some_and(|v| v.starts_with(&rid))
    );

    // Forged and replayed requests are refused before anything is read.
    let approve_id = dangerous[0]["action_id"].as_str().expect("id").to_owned();
    let alice_click = click(&post, "U0ALICE", &approve_id);
    assert_eq!(
        send(&s.bridge, &alice_click, now(), Some("v0=00ff")).await,
        401
    );
    assert_eq!(
        send(&s.bridge, &alice_click, now() - 6 * 60, None).await,
        401
    );
    // Someone the mapping does not know.
    assert_eq!(
        send(
            &s.bridge,
            &click(&post, "U0STRANGER", &approve_id),
            now(),
            None
        )
        .await,
        200
    );
    let told = s
        .slack
        .wait_for("the stranger told", |f| {
            ephemerals_to(f, "U0STRANGER").into_iter().next()
        })
        .await;
    assert!(told.contains("not mapped"), "{told}");
    // Mapped (by e-mail) to a name the gateway's tokens file does not know: the gateway refuses.
    send(
        &s.bridge,
        &click(&post, "U0NOBODY", &approve_id),
        now(),
        None,
    )
    .await;
    let told = s
        .slack
        .wait_for("mallory told", |f| {
            ephemerals_to(f, "U0NOBODY").into_iter().next()
        })
        .await;
    assert!(
        told.contains("Not answered") && told.contains("mallory"),
        "{told}"
    );
    // The relay token itself: never as the fleet's own ids, nor as a stranger, nor for nobody,
    // nor through another channel.
    let relay = s.fleet.client.with_token(Some(&token("slack")));
    let answer_path = format!("/v1/interactions/{rid}/response");
    for (body, code) in [
        (
            json!({"option_id": "approve", "responder": {"id": "timeout"}}),
            "forbidden",
        ),
        (
            json!({"option_id": "approve", "responder": {"id": "ghost"}}),
            "forbidden",
        ),
        (json!({"option_id": "approve"}), "forbidden"),
        (
            json!({"option_id": "approve", "responder": {"id": "alice", "via": "cli"}}),
            "bad_request",
        ),
    ] {
        let (status, reply) = relay.post(&answer_path, &body).await.expect("relay");
        assert_eq!(reply["error"]["code"], code, "{body}: {status} {reply}");
    }
    // Nobody else may say `via: slack`.
    let bob = s.fleet.client.with_token(Some(&token("bob")));
    let (status, _) = bob
        .post(
            &answer_path,
            &json!({"option_id": "approve", "responder": {"via": "slack"}}),
        )
        .await
        .expect("bob");
    assert_eq!(status, 400);
    let (_, view) = s
        .ops
        .get(&format!("/v1/interactions/{rid}"))
        .await
        .expect("get");
    assert_eq!(view["state"], "PENDING", "nothing answered yet");
    assert!(s.slack.ok("chat.update").is_empty());

    // Alice answers.
    assert_eq!(send(&s.bridge, &alice_click, now(), None).await, 200);
    s.fleet.wait_status(run, RunStatus::Completed).await;
    let stored = s.fleet.store.load(run).await.expect("load");
    let a = answers(&stored);
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].responder.id, "alice");
    assert_eq!(a[0].responder.via, Via::Slack);
    assert_eq!(a[0].responder.relayed_by.as_deref(), Some("slack"));
    let update = s
        .slack
        .wait_for("the message updated", |f| updates_of(f, &post["_ts"]).pop())
        .await;
    assert!(buttons(&update).is_empty(), "{update}");
    assert!(
        update.to_string().contains("Answered by *alice* via slack"),
        "{update}"
    );
    // Bob is too late: told so, and only him.
    send(&s.bridge, &click(&post, "U0BOB", &approve_id), now(), None).await;
    let told = s
        .slack
        .wait_for("bob told", |f| ephemerals_to(f, "U0BOB").into_iter().next())
        .await;
    assert!(told.starts_with("Not answered"), "{told}");
    assert_eq!(s.slack.posts_of(&rid).len(), 1, "posted once");
    assert!(ephemerals_to(&s.slack, "U0ALICE").is_empty());
}

/// Answered elsewhere (the CLI's way, over HTTP), a sensitive question, an escalation step: the
/// message says who answered and how, the sensitive one has no buttons but a link, the step is
/// posted in the question's thread; `dm: true` sends the question to the person named.
#[tokio::test(flavor = "multi_thread")]
async fn answers_elsewhere_secrets_and_escalations_show_in_slack() {
    let s = setup(
        "slk2",
        &[(
            "escalating",
            "name: escalating\nbrain: scripted\n",
            "steps:\n  - ask_human:\n      prompt: \"Restart the database?\"\n      escalation:\n        - {after: 1s, remind: true}\n        - {after: 2s, add_responders: [bob]}\n      options:\n        - {id: now, label: Now}\n        - {id: later, label: Later}\n  - finish: \"chose ${answer}\"\n",
        )],
    )
    .await;
    // Answered by bob through the CLI's HTTP call.
    let run = submit_as(&s.ops, "chooser", "go").await;
    let rid = pending(&s.ops, run).await;
    let post = s
        .slack
        .wait_for("chooser posted", |f| f.posts_of(&rid).into_iter().next())
        .await;
    let bob = s.fleet.client.with_token(Some(&token("bob")));
    // A claim shows on the message.
    let (status, body) = bob
        .post(&format!("/v1/interactions/{rid}/claim"), &json!({}))
        .await
        .expect("claim");
    assert_eq!(status, 200, "{body}");
    let update = s
        .slack
        .wait_for("the claim shown", |f| updates_of(f, &post["_ts"]).pop())
        .await;
    assert!(update.to_string().contains("Claimed by *bob*"), "{update}");
    assert!(!buttons(&update).is_empty(), "still open: {update}");
    let (status, body) = bob
        .post(
            &format!("/v1/interactions/{rid}/response"),
            &json!({"option_id": "staging", "responder": {"via": "cli"}}),
        )
        .await
        .expect("answer");
    assert_eq!(status, 200, "{body}");
    let update = s
        .slack
        .wait_for("chooser updated", |f| {
            updates_of(f, &post["_ts"])
                .pop()
                .filter(|u| buttons(u).is_empty())
        })
        .await;
    assert!(
        update.to_string().contains("Answered by *bob* via cli"),
        "{update}"
    );
    assert!(buttons(&update).is_empty());

    // Sensitive: no buttons, a link to the inbox.
    let run = submit_as(&s.ops, "secret", "go").await;
    let rid = pending(&s.ops, run).await;
    let post = s
        .slack
        .wait_for("secret posted", |f| f.posts_of(&rid).into_iter().next())
        .await;
    assert!(buttons(&post).is_empty(), "{post}");
    assert!(
        post.to_string()
            .contains("<https://delta.example/inbox|web inbox>")
    );

    // A reminder in the thread.
    let run = submit_as(&s.ops, "escalating", "go").await;
    let rid = pending(&s.ops, run).await;
    let post = s
        .slack
        .wait_for("escalating posted", |f| f.posts_of(&rid).into_iter().next())
        .await;
    let reply = s
        .slack
        .wait_for("the reminder in the thread", |f| {
            f.ok("chat.postMessage")
                .into_iter()
                .find(|m| m["thread_ts"] == post["_ts"])
        })
        .await;
    assert!(
        reply["text"]
            .as_str()
            .is_some_and(|t| t.contains("Escalation step 1 of 2"))
    );
    assert_eq!(post["channel"], "C0GUARD");
    // The second step lets bob answer: the route DMs him the question (his Slack user found by
    // his e-mail address).
    s.slack
        .wait_for("bob's DM", |f| {
            f.posts_of(&rid)
                .into_iter()
                .find(|p| p["channel"] == "U0BOB")
        })
        .await;

    // `guarded` names alice: its route sends her a DM too.
    let run = submit_as(&s.ops, "guarded", "go").await;
    let rid = pending(&s.ops, run).await;
    let posts = s
        .slack
        .wait_for("guarded posted twice", |f| {
            let p = f.posts_of(&rid);
            (p.len() == 2).then_some(p)
        })
        .await;
    let mut channels: Vec<String> = posts
        .iter()
        .map(|p| p["channel"].as_str().unwrap_or_default().to_owned())
        .collect();
    channels.sort();
    assert_eq!(channels, ["C0GUARD", "U0ALICE"]);
    let _ = s.prefix;
}

/// An escalation step carried out while the bridge could not reach the gateway to post its
/// question (the question's event failed, to come again; the step's event found nothing to
/// show): the question's first post then goes to the people the step added too.
#[tokio::test(flavor = "multi_thread")]
async fn a_step_taken_before_the_first_post_still_reaches_who_it_added() {
    // The bridge's way to the gateway: nothing listens there until the proxy starts.
    let port = delta_e2e::free_port().expect("port");
    let s = setup_via(
        "slk11",
        &[(
            "escalating",
            "name: escalating\nbrain: scripted\n",
            "steps:\n  - ask_human:\n      prompt: \"Restart the database?\"\n      escalation:\n        - {after: 1s, add_responders: [bob]}\n      options:\n        - {id: now, label: Now}\n        - {id: later, label: Later}\n  - finish: \"chose ${answer}\"\n",
        )],
        "",
        Some(format!("http://127.0.0.1:{port}")),
    )
    .await;
    let run = submit_as(&s.ops, "escalating", "go").await;
    let rid = pending(&s.ops, run).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (_, v) = s
            .ops
            .get(&format!("/v1/interactions/{rid}"))
            .await
            .expect("get");
        if v["escalated"] == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the step carried out: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The bridge handled the step's event (acked: only the question's event is still pending).
    let js = async_nats::jetstream::new(s.fleet.nats_admin().await);
    let stream = js.get_stream("SLK11_INTERACTIONS").await.expect("stream");
    let step_seq = stream
        .get_last_raw_message_by_subject(&format!("slk11.interactions.escalated.escalating.{run}"))
        .await
        .expect("the step's event")
        .sequence;
    let mut consumer: async_nats::jetstream::consumer::PullConsumer =
        stream.get_consumer("slk11-slack").await.expect("consumer");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let info = consumer.info().await.expect("info").clone();
        if info.delivered.stream_sequence >= step_seq && info.num_ack_pending == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the step's event handled: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(s.slack.posts_of(&rid).is_empty(), "nothing posted yet");
    // The gateway is back for the bridge.
    let to = s.fleet.gateway_spec.url();
    let to = to.trim_start_matches("http://").to_owned();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("bind");
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let to = to.clone();
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(to).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    s.slack
        .wait_for("bob's DM", |f| {
            f.posts_of(&rid)
                .into_iter()
                .find(|p| p["channel"] == "U0BOB")
        })
        .await;
    let channel = s.slack.posts_of(&rid);
    assert!(
        channel.iter().any(|p| p["channel"] == "C0GUARD"),
        "{channel:?}"
    );
}

/// Text answers go through a modal: the click opens it (`views.open` with the click's trigger),
/// its submission answers, with free text and with a typed answer.
#[tokio::test(flavor = "multi_thread")]
async fn modals_answer_with_free_text_and_typed_data() {
    let s = setup("slk3", &[]).await;
    for (agent, fields, expect) in [
        ("hello", json!({"input": "Ada"}), "Greeted Ada."),
        (
            "intake",
            json!({"f.email": "ada@example.com", "f.copies": "2", "f.env": "staging"}),
            "ada@example.com gets 2 on staging",
        ),
    ] {
        let run = submit_as(&s.ops, agent, "go").await;
        let rid = pending(&s.ops, run).await;
        let post = s
            .slack
            .wait_for("posted", |f| f.posts_of(&rid).into_iter().next())
            .await;
        let modal_button = buttons(&post)
            .into_iter()
            .find(|b| {
                b["action_id"]
                    .as_str()
                    .is_some_and(|a| a.starts_with("delta.modal."))
            })
            .unwrap_or_else(|| panic!("no modal button in {post}"));
        let before = s.slack.ok("views.open").len();
        let action = modal_button["action_id"].as_str().expect("id").to_owned();
        assert_eq!(
            send(&s.bridge, &click(&post, "U0ALICE", &action), now(), None).await,
            200
        );
        let opened = s
            .slack
            .wait_for("views.open", |f| f.ok("views.open").get(before).cloned())
            .await;
        assert_eq!(opened["trigger_id"], "trigger-U0ALICE");
        let view = &opened["view"];
        let mut values = serde_json::Map::new();
        for (block, value) in fields.as_object().expect("fields") {
            assert!(
                view["blocks"]
                    .as_array()
                    .is_some_and(|b| b.iter().any(|x| x["block_id"] == json!(block))),
                "no field {block} in {view}"
            );
            values.insert(
                block.clone(),
                json!({"value": {"type": "plain_text_input", "value": value}}),
            );
        }
        if agent == "intake" {
            // A field of the wrong kind: the form stays open, the error under that field, and
            // nothing is answered.
            let mut wrong = values.clone();
            wrong.insert(
                "f.copies".into(),
                json!({"value": {"type": "plain_text_input", "value": "two"}}),
            );
            let submission = json!({
                "type": "view_submission",
                "user": {"id": "U0ALICE"},
                "view": {"private_metadata": view["private_metadata"], "state": {"values": wrong}},
            });
            let (status, body) = send_read(&s.bridge, &submission, now(), None).await;
            assert_eq!(status, 200);
            let body: Value = serde_json::from_str(&body).expect("JSON");
            assert_eq!(body["response_action"], "errors", "{body}");
            assert!(
                body["errors"]["f.copies"]
                    .as_str()
                    .is_some_and(|e| e.contains("whole number")),
                "{body}"
            );
            let (_, ix) = s
                .ops
                .get(&format!("/v1/interactions/{rid}"))
                .await
                .expect("get");
            assert_eq!(ix["state"], "PENDING", "{ix}");
        }
        let submission = json!({
            "type": "view_submission",
            "user": {"id": "U0ALICE"},
            "view": {"private_metadata": view["private_metadata"], "state": {"values": values}},
        });
        assert_eq!(send(&s.bridge, &submission, now(), None).await, 200);
        s.fleet.wait_status(run, RunStatus::Completed).await;
        let stored = s.fleet.store.load(run).await.expect("load");
        assert_eq!(stored.record.result.as_deref(), Some(expect));
        let a = answers(&stored);
        assert_eq!(
            (a[0].responder.id.as_str(), a[0].responder.via),
            ("alice", Via::Slack)
        );
    }
}

/// Killed and started again, the bridge goes on from its durable consumer: what was asked while
/// it was down is posted once, what was answered meanwhile is updated, nothing is posted twice.
#[tokio::test(flavor = "multi_thread")]
async fn restarted_it_catches_up_and_posts_each_question_once() {
    let mut s = setup("slk4", &[]).await;
    let first = submit_as(&s.ops, "chooser", "go").await;
    let first_rid = pending(&s.ops, first).await;
    let post = s
        .slack
        .wait_for("first posted", |f| {
            f.posts_of(&first_rid).into_iter().next()
        })
        .await;
    s.bridge.kill();
    // While it is down: the first is answered, two more are asked.
    let alice = s.fleet.client.with_token(Some(&token("alice")));
    let (status, body) = alice
        .post(
            &format!("/v1/interactions/{first_rid}/response"),
            &json!({"option_id": "staging"}),
        )
        .await
        .expect("answer");
    assert_eq!(status, 200, "{body}");
    let mut later = vec![];
    for agent in ["chooser", "gated"] {
        let run = submit_as(&s.ops, agent, "go").await;
        later.push(pending(&s.ops, run).await);
    }
    // A crash between posting and recording: the KV says a post was under way, Slack has it.
    let run = submit_as(&s.ops, "hello", "go").await;
    let crashed = pending(&s.ops, run).await;
    let (_, view) = s
        .ops
        .get(&format!("/v1/interactions/{crashed}"))
        .await
        .expect("get");
    let js = async_nats::jetstream::new(s.fleet.nats_admin().await);
    let kv = js
        .get_key_value(format!("{}_SLACK", s.prefix.to_uppercase()))
        .await
        .expect("the bridge's bucket");
    let record = json!({"request": view["request"], "posts": [], "posting": ["channel:C0ALL"]});
    kv.put(&crashed, record.to_string().into())
        .await
        .expect("put");
    let seeded_ts = "1799999999.000001";
    s.slack.state.calls.lock().expect("calls").push(Call {
        method: "chat.postMessage".into(),
        params: json!({"channel": "C0ALL", "text": "posted before the crash", "_ts": seeded_ts,
            "_channel": "C0ALL",
            "metadata": {"event_type": "delta_question", "event_payload": {"request_id": crashed}}}),
        status: 200,
    });
    s.bridge.spawn();
    s.bridge.wait_ready().await;
    for rid in &later {
        s.slack
            .wait_for("asked meanwhile, posted", |f| {
                f.posts_of(rid).into_iter().next()
            })
            .await;
    }
    let update = s
        .slack
        .wait_for("answered meanwhile, updated", |f| {
            updates_of(f, &post["_ts"]).pop()
        })
        .await;
    assert!(
        update.to_string().contains("Answered by *alice* via http"),
        "{update}"
    );
    // The crashed post was found in the channel's history, not posted again: answered, it is
    // the one updated.
    let (status, body) = alice
        .post(
            &format!("/v1/interactions/{crashed}/response"),
            &json!({"input": "Ada"}),
        )
        .await
        .expect("answer");
    assert_eq!(status, 200, "{body}");
    s.slack
        .wait_for("the crashed post updated", |f| {
            updates_of(f, &json!(seeded_ts)).pop()
        })
        .await;
    // Once more, to be sure nothing comes late.
    s.bridge.kill();
    s.bridge.spawn();
    s.bridge.wait_ready().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for rid in later.iter().chain([&first_rid, &crashed]) {
        assert_eq!(s.slack.posts_of(rid).len(), 1, "{rid} posted once");
    }
}

const COUNCIL_CONFIG: &str = "name: council\nbrain: scripted\ntools:\n  - name: deploy\n    exec: \"echo deploying ${env}\"\n    approval: always\n    approvals: {min: 2, of: [alice, bob]}\n    parameters:\n      - {name: env, type: string}\n";
const COUNCIL_SCRIPT: &str =
    "steps:\n  - tool: deploy\n    args: {env: prod}\n  - finish: \"deployed\"\n";

/// Votes from Slack are counted (the voter told the tally, the message's rule line updated) and
/// the second decides; a question that expires or whose run is cancelled says so.
#[tokio::test(flavor = "multi_thread")]
async fn votes_expiry_and_cancellation_show_in_slack() {
    let s = setup("slk5", &[("council", COUNCIL_CONFIG, COUNCIL_SCRIPT)]).await;
    let run = submit_as(&s.ops, "council", "go").await;
    let rid = pending(&s.ops, run).await;
    let post = s
        .slack
        .wait_for("council posted", |f| f.posts_of(&rid).into_iter().next())
        .await;
    assert!(
        post.to_string()
            .contains("Needs 2 approval(s) from alice, bob"),
        "{post}"
    );
    let approve = buttons(&post)
        .into_iter()
        .find(|b| {
            b["style"] == "danger"
                && b["action_id"]
                    .as_str()
                    .is_some_and(|a| a.starts_with("delta.answer."))
        })
        .expect("approve");
    let approve = approve["action_id"].as_str().expect("id").to_owned();
    send(&s.bridge, &click(&post, "U0ALICE", &approve), now(), None).await;
    let told = s
        .slack
        .wait_for("alice told her vote counted", |f| {
            ephemerals_to(f, "U0ALICE").into_iter().next()
        })
        .await;
    assert!(told.contains("1 of 2 approvals (alice)"), "{told}");
    let update = s
        .slack
        .wait_for("the tally on the message", |f| {
            updates_of(f, &post["_ts"]).pop()
        })
        .await;
    assert!(
        update.to_string().contains("1 of 2 approvals (alice)"),
        "{update}"
    );
    send(&s.bridge, &click(&post, "U0BOB", &approve), now(), None).await;
    s.fleet.wait_status(run, RunStatus::Completed).await;
    let update = s
        .slack
        .wait_for("decided", |f| {
            updates_of(f, &post["_ts"])
                .pop()
                .filter(|u| buttons(u).is_empty())
        })
        .await;
    assert!(update.to_string().contains("via slack"), "{update}");

    // Expired: its default applied.
    let run = submit_as(&s.ops, "timed", "go").await;
    let rid = pending(&s.ops, run).await;
    let post = s
        .slack
        .wait_for("timed posted", |f| f.posts_of(&rid).into_iter().next())
        .await;
    let update = s
        .slack
        .wait_for("expired", |f| updates_of(f, &post["_ts"]).pop())
        .await;
    assert!(update.to_string().contains("Expired after"), "{update}");
    assert!(buttons(&update).is_empty());

    // Cancelled with its run.
    let run = submit_as(&s.ops, "chooser", "go").await;
    let rid = pending(&s.ops, run).await;
    let post = s
        .slack
        .wait_for("chooser posted", |f| f.posts_of(&rid).into_iter().next())
        .await;
    let (status, body) = s
        .ops
        .post(&format!("/v1/runs/{run}/cancel"), &json!({}))
        .await
        .expect("cancel");
    assert_eq!(status, 200, "{body}");
    let update = s
        .slack
        .wait_for("cancelled", |f| updates_of(f, &post["_ts"]).pop())
        .await;
    assert!(update.to_string().contains("Cancelled"), "{update}");
    assert!(buttons(&update).is_empty());
}

const VERSIONS_SCRIPT: &str = "steps:\n  - ask_human:\n      prompt: \"Which version?\"\n      options:\n        - {id: v1.2, label: \"1.2\"}\n        - {id: v1.3, label: \"1.3\"}\n  - finish: \"chose ${answer}\"\n";

/// A button carries the `request_hash` of the question its message showed: a click carrying
/// another one (the question changed since) is refused as stale, to the clicker only, and
/// changes nothing; the button itself answers, also for an option id with a `.` in it.
#[tokio::test(flavor = "multi_thread")]
async fn a_click_answers_the_version_it_showed_or_nothing() {
    let s = setup(
        "slk6",
        &[(
            "versions",
            "name: versions\nbrain: scripted\n",
            VERSIONS_SCRIPT,
        )],
    )
    .await;
    let run = submit_as(&s.ops, "versions", "go").await;
    let rid = pending(&s.ops, run).await;
    let post = s
        .slack
        .wait_for("versions posted", |f| f.posts_of(&rid).into_iter().next())
        .await;
    let (_, view) = s
        .ops
        .get(&format!("/v1/interactions/{rid}"))
        .await
        .expect("get");
    let hash = view["request"]["request_hash"]
        .as_str()
        .expect("a request_hash")
        .to_owned();
    let action = "delta.answer.v1.2";
    let shown = click(&post, "U0ALICE", action);
    let value = shown["actions"][0]["value"]
        .as_str()
        .expect("value")
        .to_owned();
    assert_eq!(value, format!("{rid} {hash} v1.2"));

    // The message showed another version than the one pending now.
    let mut old = shown.clone();
    old["actions"][0]["value"] = json!(format!("{rid} {} v1.2", "0".repeat(64)));
    assert_eq!(send(&s.bridge, &old, now(), None).await, 200);
    let told = s
        .slack
        .wait_for("alice told it is stale", |f| {
            ephemerals_to(f, "U0ALICE").into_iter().next()
        })
        .await;
    assert!(
        told.starts_with("Not answered") && told.contains("stale"),
        "{told}"
    );
    let (_, view) = s
        .ops
        .get(&format!("/v1/interactions/{rid}"))
        .await
        .expect("get");
    assert_eq!(view["state"], "PENDING", "nothing answered");
    assert!(updates_of(&s.slack, &post["_ts"]).is_empty());

    // The button as shown answers.
    assert_eq!(send(&s.bridge, &shown, now(), None).await, 200);
    s.fleet.wait_status(run, RunStatus::Completed).await;
    let stored = s.fleet.store.load(run).await.expect("load");
    let a = answers(&stored);
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].option_id.as_deref(), Some("v1.2"));
    assert_eq!(a[0].responder.via, Via::Slack);
}

/// An update Slack fails once (`internal_error`) is done when the event comes again: the
/// message still loses its buttons and says who answered.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_update_is_done_again() {
    let s = setup("slk7", &[]).await;
    let run = submit_as(&s.ops, "chooser", "go").await;
    let rid = pending(&s.ops, run).await;
    let post = s
        .slack
        .wait_for("chooser posted", |f| f.posts_of(&rid).into_iter().next())
        .await;
    *s.slack.state.refuse_next_update.lock().expect("refuse") = Some("internal_error".into());
    let alice = s.fleet.client.with_token(Some(&token("alice")));
    let (status, body) = alice
        .post(
            &format!("/v1/interactions/{rid}/response"),
            &json!({"option_id": "staging"}),
        )
        .await
        .expect("answer");
    assert_eq!(status, 200, "{body}");
    let update = s
        .slack
        .wait_for("the message updated after all", |f| {
            updates_of(f, &post["_ts"]).pop()
        })
        .await;
    assert!(buttons(&update).is_empty(), "{update}");
    assert!(
        update.to_string().contains("Answered by *alice* via http"),
        "{update}"
    );
    let refused = s
        .slack
        .calls()
        .into_iter()
        .filter(|c| c.method == "chat.update" && c.status == 400)
        .count();
    assert_eq!(refused, 1, "the first update was refused");
}

/// A target Slack cannot take now (`internal_error` for the channel) holds back no other: the DM
/// goes out, and the channel's post follows at the event's next try. A refusal Slack does not
/// document as worth a retry (an unlisted code) is one for good: the event is done with at once,
/// not tried again for a day while it holds the bridge's events behind it.
#[tokio::test(flavor = "multi_thread")]
async fn a_target_slack_cannot_take_now_holds_back_no_other() {
    let s = setup("slk16", &[]).await;
    // Meanwhile, a client sends its headers and then trickles nothing of its body: the bridge
    // does not keep its connection for ever (it would hold one of its slots).
    let port = s.bridge.port;
    let slow = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut c = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        c.write_all(
            b"POST /slack/interactivity HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n\r\npayload=",
        )
        .await
        .expect("write");
        let mut answer = vec![0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(30), c.read(&mut answer))
            .await
            .expect("an answer within 30 s")
            .expect("read");
        String::from_utf8_lossy(&answer[..n]).into_owned()
    });
    s.slack.refuse_posts("C0GUARD", Some("internal_error"));
    let run = submit_as(&s.ops, "guarded", "go").await;
    let rid = pending(&s.ops, run).await;
    s.slack
        .wait_for("the DM posted while the channel refuses", |f| {
            f.posts_of(&rid)
                .into_iter()
                .find(|p| p["channel"] == json!("U0ALICE"))
        })
        .await;
    assert!(
        s.slack
            .posts_of(&rid)
            .iter()
            .all(|p| p["channel"] != json!("C0GUARD")),
        "the channel refused"
    );
    s.slack.refuse_posts("C0GUARD", None);
    s.slack
        .wait_for("the channel's post at the next try", |f| {
            f.posts_of(&rid)
                .into_iter()
                .find(|p| p["channel"] == json!("C0GUARD"))
        })
        .await;
    let dms = s
        .slack
        .posts_of(&rid)
        .iter()
        .filter(|p| p["channel"] == json!("U0ALICE"))
        .count();
    assert_eq!(dms, 1, "the DM was not posted again");

    // An unlisted refusal: given up on at once, the event acknowledged.
    s.slack
        .refuse_posts("C0ALL", Some("some_refusal_slack_adds_later"));
    let run = submit_as(&s.ops, "chooser", "go").await;
    pending(&s.ops, run).await;
    s.slack
        .wait_for("the post refused", |f| {
            f.calls().into_iter().find(|c| {
                c.method == "chat.postMessage"
                    && c.status == 400
                    && c.params["channel"] == json!("C0ALL")
            })
        })
        .await;
    wait_events_done(&s).await;
    let tries = s
        .slack
        .calls()
        .into_iter()
        .filter(|c| c.method == "chat.postMessage" && c.params["channel"] == json!("C0ALL"))
        .count();
    assert_eq!(tries, 1, "tried once");
    let answer = slow.await.expect("the slow client");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
}

/// A route of DMs alone, for a question no one of it can be sent to yet (it names a group):
/// nothing is posted, but the question is kept, so that the escalation step that lets bob answer
/// sends him the DM.
#[tokio::test(flavor = "multi_thread")]
async fn a_dm_route_with_no_one_to_post_to_yet_dms_whom_escalation_adds() {
    let s = setup(
        "slk17",
        &[(
            "dmonly",
            "name: dmonly\nbrain: scripted\n",
            "steps:\n  - ask_human:\n      prompt: \"Rotate the keys?\"\n      allowed_responders: [\"group:leads\"]\n      escalation:\n        - {after: 1s, add_responders: [bob]}\n      options:\n        - {id: yes, label: \"Yes\"}\n        - {id: no, label: \"No\"}\n  - finish: \"chose ${answer}\"\n",
        )],
    )
    .await;
    let run = submit_as(&s.ops, "dmonly", "go").await;
    let rid = pending(&s.ops, run).await;
    s.slack
        .wait_for("bob's DM once escalation adds him", |f| {
            f.posts_of(&rid)
                .into_iter()
                .find(|p| p["channel"] == "U0BOB")
        })
        .await;
}

/// A channel Slack refuses for good (`not_in_channel`: the bot was never invited) is logged and
/// skipped, once: the event is done with, and the next question is posted.
#[tokio::test(flavor = "multi_thread")]
async fn a_channel_slack_refuses_does_not_hold_the_bridge() {
    let s = setup("slk8", &[]).await;
    s.slack.refuse_posts("C0ALL", Some("not_in_channel"));
    let run = submit_as(&s.ops, "chooser", "go").await;
    let refused = pending(&s.ops, run).await;
    s.slack
        .wait_for("the post refused", |f| {
            f.calls()
                .into_iter()
                .find(|c| c.method == "chat.postMessage" && c.status == 400)
        })
        .await;
    let run = submit_as(&s.ops, "guarded", "go").await;
    let rid = pending(&s.ops, run).await;
    s.slack
        .wait_for("the next question posted", |f| {
            f.posts_of(&rid).into_iter().next()
        })
        .await;
    // Nothing waits to be tried again: the refused event was acknowledged.
    wait_events_done(&s).await;
    let tries = s
        .slack
        .calls()
        .into_iter()
        .filter(|c| {
            c.method == "chat.postMessage"
                && c.params["metadata"]["event_payload"]["request_id"] == json!(refused)
        })
        .count();
    assert_eq!(tries, 1, "tried once, not again and again");
}

/// A `chooser` question posted, then answered by alice over HTTP while Slack leaves the update
/// that follows hanging: the question's post.
async fn answered_with_a_hung_update(s: &Setup) -> Value {
    let run = submit_as(&s.ops, "chooser", "go").await;
    let rid = pending(&s.ops, run).await;
    let post = s
        .slack
        .wait_for("chooser posted", |f| f.posts_of(&rid).into_iter().next())
        .await;
    s.slack.state.hang_next_update.store(true, Ordering::SeqCst);
    let alice = s.fleet.client.with_token(Some(&token("alice")));
    let (status, body) = alice
        .post(
            &format!("/v1/interactions/{rid}/response"),
            &json!({"option_id": "staging"}),
        )
        .await
        .expect("answer");
    assert_eq!(status, 200, "{body}");
    post
}

/// A Slack call that hangs is given up after `slack_timeout_secs`: the update is done when the
/// event comes again, and the events after it are not held meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn a_hung_call_is_given_up_and_done_again() {
    let s = setup_with("slk9", &[], "slack_timeout_secs: 2\n").await;
    let post = answered_with_a_hung_update(&s).await;
    let update = s
        .slack
        .wait_for("the message updated after all", |f| {
            updates_of(f, &post["_ts"]).pop()
        })
        .await;
    assert!(buttons(&update).is_empty(), "{update}");
    let hung = s
        .slack
        .calls()
        .into_iter()
        .filter(|c| c.method == "chat.update" && c.status == 0)
        .count();
    assert_eq!(hung, 1, "the first update hung");
}

/// Events wait their turn behind a slow one without being delivered again meanwhile: a call
/// that hangs for longer than the consumer's ack wait (15 s) holds the questions asked after it,
/// and once it is given up each of those is delivered once (only the hung one twice).
#[tokio::test(flavor = "multi_thread")]
async fn events_behind_a_slow_one_are_delivered_once() {
    let s = setup_with("slk12", &[], "slack_timeout_secs: 20\n").await;
    let post = answered_with_a_hung_update(&s).await;
    s.slack
        .wait_for("the update hanging", |f| {
            f.calls()
                .into_iter()
                .find(|c| c.method == "chat.update" && c.status == 0)
        })
        .await;
    let mut later = vec![];
    for _ in 0..3 {
        let run = submit_as(&s.ops, "chooser", "go").await;
        later.push(pending(&s.ops, run).await);
    }
    for rid in &later {
        s.slack
            .wait_for("a later question posted", |f| {
                f.posts_of(rid).into_iter().next()
            })
            .await;
    }
    s.slack
        .wait_for("the first message updated after all", |f| {
            updates_of(f, &post["_ts"]).pop()
        })
        .await;
    // Deliveries, against the events the consumer takes (asked ×4, answered ×1).
    let js = async_nats::jetstream::new(s.fleet.nats_admin().await);
    let stream = js.get_stream("SLK12_INTERACTIONS").await.expect("stream");
    let mut consumer: async_nats::jetstream::consumer::PullConsumer =
        stream.get_consumer("slk12-slack").await.expect("consumer");
    let deadline = Instant::now() + Duration::from_secs(10);
    let info = loop {
        let info = consumer.info().await.expect("info").clone();
        if info.num_ack_pending == 0 && info.num_pending == 0 {
            break info;
        }
        assert!(Instant::now() < deadline, "every event done: {info:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        info.delivered.consumer_sequence, 6,
        "five events, only the hung one delivered twice: {info:?}"
    );
}

/// A click the bridge acknowledged (its `200` to Slack) and died before handling is handled by
/// the bridge started again: it was noted in the bridge's bucket (`clicks`) before the `200`,
/// and removed once handled. Before, it was lost, the question left pending.
#[tokio::test(flavor = "multi_thread")]
async fn a_click_acknowledged_is_handled_after_the_bridge_dies() {
    let mut s = setup("slk12", &[]).await;
    // This bridge waits 30 s between a click's `200` and its handling, and is killed meanwhile.
    s.bridge.kill();
    s.bridge
        .env
        .push(("DELTA_FAILPOINT".into(), "slack:before-click@30000".into()));
    s.bridge.spawn();
    s.bridge.wait_ready().await;
    let run = submit_as(&s.ops, "chooser", "go").await;
    let rid = pending(&s.ops, run).await;
    let post = s
        .slack
        .wait_for("the question posted", |f| {
            f.posts_of(&rid).into_iter().next()
        })
        .await;
    let button = buttons(&post)
        .into_iter()
        .find(|b| {
            b["style"] != "danger"
                && b["action_id"]
                    .as_str()
                    .is_some_and(|a| a.starts_with("delta.answer."))
        })
        .expect("an answer button");
    let action = button["action_id"].as_str().expect("id").to_owned();
    assert_eq!(
        send(&s.bridge, &click(&post, "U0ALICE", &action), now(), None).await,
        200
    );
    let js = async_nats::jetstream::new(s.fleet.nats_admin().await);
    let kv = js
        .get_key_value(format!("{}_SLACK", s.prefix.to_uppercase()))
        .await
        .expect("the bridge's bucket");
    let noted = async || -> serde_json::Map<String, Value> {
        let bytes = kv.get("clicks").await.expect("read").unwrap_or_default();
        serde_json::from_slice(&bytes).unwrap_or_default()
    };
    let clicks = noted().await;
    assert_eq!(clicks.len(), 1, "noted before the 200: {clicks:?}");
    let payload = clicks.values().next().expect("one")["payload"].to_string();
    assert!(
        !payload.contains("response_url") && !payload.contains("hooks.slack"),
        "only what the bridge reads is kept: {payload}"
    );
    s.bridge.kill();
    let (_, view) = s
        .ops
        .get(&format!("/v1/interactions/{rid}"))
        .await
        .expect("get");
    assert_eq!(
        view["state"], "PENDING",
        "not answered before the bridge died"
    );

    s.bridge.env.retain(|(k, _)| k != "DELTA_FAILPOINT");
    s.bridge.spawn();
    s.bridge.wait_ready().await;
    s.fleet.wait_status(run, RunStatus::Completed).await;
    let stored = s.fleet.store.load(run).await.expect("load");
    let a = answers(&stored);
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(
        (a[0].responder.id.as_str(), a[0].responder.via),
        ("alice", Via::Slack)
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !noted().await.is_empty() {
        assert!(Instant::now() < deadline, "the click noted handled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ephemerals_to(&s.slack, "U0ALICE").is_empty());
}
