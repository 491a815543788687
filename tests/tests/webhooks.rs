//! Signed webhooks through a real fleet (nats-server, redis-server, gateway and worker processes),
//! received by a Python receiver (tests/py/webhook_receiver.py) that verifies every request with
//! the Standard Webhooks library and decodes it with the CloudEvents SDK: runs of `hello` and
//! `deployer` are delivered requested → answered → completed, in order per run, with nothing
//! lost when the receiver is killed mid-stream, when the subscription is disabled after failing
//! and enabled again, or when the gateway delivering it dies; rotation signs with both secrets
//! during its grace; filters deliver only what was subscribed; inside addresses are refused.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use delta_e2e::Signal;
use delta_e2e::fleet::Fleet;
use delta_e2e::gateways::Client;
use delta_protocol::{RunId, RunStatus};
use serde_json::{Value, json};

const KEY: &str = "5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e";

/// A fleet whose gateways may post to loopback, with quick retries and ack waits.
async fn fleet(prefix: &str, gateways: usize, extra: &[(&'static str, &str)]) -> Fleet {
    let extra: Vec<(&'static str, String)> =
        extra.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
    let fleet = Fleet::start_with(prefix, gateways, 1, |s| {
        s.secrets_key_hex = Some(KEY.to_owned());
        s.extra.extend([
            ("DELTA_WEBHOOK_ALLOW", "127.0.0.1/32".to_owned()),
            ("DELTA_WEBHOOK_RETRY_FIRST_S", "0.2".to_owned()),
            ("DELTA_WEBHOOK_RETRY_MAX_S", "1".to_owned()),
            ("DELTA_WEBHOOK_ACK_WAIT_S", "3".to_owned()),
            ("DELTA_WEBHOOK_TIMEOUT_S", "5".to_owned()),
        ]);
        for (k, v) in &extra {
            s.extra.retain(|(name, _)| name != k);
            s.extra.push((*k, v.clone()));
        }
    })
    .await;
    fleet.add_example("deployer");
    fleet
}

/// The Python receiver, on a port of its own that survives its restarts.
struct Receiver {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Receiver {
    fn start() -> Receiver {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(dir.path().join("secrets"), "").expect("secrets");
        let mut r = Receiver {
            port: delta_e2e::free_port().expect("port"),
            dir,
            child: None,
        };
        r.restart();
        r
    }

    fn out(&self) -> PathBuf {
        self.dir.path().join("events.jsonl")
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hooks?token=hidden", self.port)
    }

    fn restart(&mut self) {
        let mut child = Command::new(delta_e2e::test_python())
            .arg(delta_e2e::python_scripts().join("webhook_receiver.py"))
            .arg(self.port.to_string())
            .arg(self.dir.path().join("secrets"))
            .arg(self.out())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        BufReader::new(stdout).read_line(&mut line).expect("read");
        assert_eq!(line.trim(), "listening", "the receiver did not start");
        self.child = Some(child);
    }

    /// SIGKILL.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn secrets(&self, secrets: &[&str]) {
        std::fs::write(self.dir.path().join("secrets"), secrets.join("\n")).expect("secrets");
    }

    fn failing(&self, on: bool) {
        let flag = PathBuf::from(format!("{}.fail", self.out().display()));
        if on {
            std::fs::write(flag, "").expect("flag");
        } else {
            let _ = std::fs::remove_file(flag);
        }
    }

    /// While `to` is set, every request is answered `307` to it.
    fn redirecting(&self, to: Option<&str>) {
        let flag = PathBuf::from(format!("{}.redirect", self.out().display()));
        match to {
            Some(url) => std::fs::write(flag, url).expect("flag"),
            None => {
                let _ = std::fs::remove_file(flag);
            }
        }
    }

    /// How many requests were answered with a redirect.
    fn redirected(&self) -> usize {
        std::fs::read_to_string(format!("{}.redirected", self.out().display()))
            .map(|t| t.lines().count())
            .unwrap_or(0)
    }

    fn events(&self) -> Vec<Value> {
        read_lines(&self.out())
    }

    /// Waits (up to 60 s) until the events received satisfy `enough`.
    async fn wait(&self, what: &str, enough: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let events = self.events();
            if enough(&events) {
                return events;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: the receiver has only {events:#?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.kill();
    }
}

fn read_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Each run's event types in the order they first arrived (repeats, allowed, left out).
fn by_run(events: &[Value]) -> BTreeMap<String, Vec<String>> {
    let mut seen = std::collections::HashSet::new();
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in events {
        let id = e["id"].as_str().unwrap_or_default().to_owned();
        if seen.insert(id) {
            out.entry(e["run"].as_str().unwrap_or_default().to_owned())
                .or_default()
                .push(
                    e["type"]
                        .as_str()
                        .unwrap_or_default()
                        .trim_start_matches("dev.delta.")
                        .to_owned(),
                );
        }
    }
    out
}

fn types_of(events: &[Value], run: RunId) -> Vec<String> {
    by_run(events).remove(&run.to_string()).unwrap_or_default()
}

/// Every request the receiver took was verified, signed for the event it carries, as a
/// CloudEvent.
fn all_verified(events: &[Value]) {
    for e in events {
        assert!(
            e["verified"]
                .as_array()
                .is_some_and(|v| v.iter().any(|b| b == true)),
            "{e}"
        );
        assert_eq!(e["webhook_id"], e["id"], "webhook-id is the event's id");
        assert_eq!(e["content_type"], "application/cloudevents+json");
    }
}

async fn subscribe(client: &Client, body: Value) -> (String, String) {
    let (s, b) = client.post("/v1/webhooks", &body).await.expect("create");
    assert_eq!(s, 201, "{b}");
    let secret = b["secret"].as_str().expect("secret").to_owned();
    assert!(secret.starts_with("whsec_"));
    let shown = b["url"].as_str().expect("url");
    assert!(
        !shown.contains("hidden") && shown.ends_with("/…"),
        "neither the path nor the query string is shown: {b}"
    );
    (b["id"].as_str().expect("id").to_owned(), secret)
}

async fn run_hello(fleet: &Fleet, client: &Client, name: &str) -> RunId {
    let (s, b) = client
        .post("/v1/runs", &json!({"agent": "hello", "task": "greet"}))
        .await
        .expect("submit");
    assert_eq!(s, 202, "{b}");
    let run: RunId = b["run_id"].as_str().expect("run_id").parse().expect("uuid");
    let rid = delta_e2e::fleet::pending(client, run).await;
    let (s, b) = client
        .post(
            &format!("/v1/interactions/{rid}/response"),
            &json!({"input": name}),
        )
        .await
        .expect("answer");
    assert_eq!(s, 200, "{b}");
    fleet.wait_status(run, RunStatus::Completed).await;
    run
}

async fn run_deployer(fleet: &Fleet) -> RunId {
    let run = fleet.submit("deployer", "1.4.2").await;
    for answer in [
        json!({"option_id": "confirm"}),
        json!({"input": "canary-key-0123456789"}),
        json!({"option_id": "staging"}),
    ] {
        let rid = fleet.pending(run).await;
        let (s, b) = fleet.answer(&rid, answer).await;
        assert_eq!(s, 200, "{b}");
        // The next question is another request.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (_, body) = fleet
                .client
                .get(&format!("/v1/runs/{run}"))
                .await
                .expect("run");
            let now = body["pending_interaction"]["request_id"].as_str();
            if now != Some(rid.as_str()) {
                break;
            }
            assert!(Instant::now() < deadline, "the answer was never applied");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    fleet.wait_status(run, RunStatus::Completed).await;
    run
}

const HELLO: [&str; 3] = [
    "interaction.requested",
    "interaction.answered",
    "run.completed",
];

#[tokio::test(flavor = "multi_thread")]
async fn runs_are_delivered_signed_and_in_order_and_a_killed_receiver_loses_nothing() {
    let fleet = fleet("whk", 1, &[]).await;
    let mut receiver = Receiver::start();
    let (_id, secret) = subscribe(
        &fleet.client,
        json!({"url": receiver.url(), "description": "e2e"}),
    )
    .await;
    receiver.secrets(&[&secret]);

    let first = run_hello(&fleet, &fleet.client, "Ada").await;
    let deployed = run_deployer(&fleet).await;
    receiver
        .wait("the first runs", |e| {
            types_of(e, first).len() == 3 && types_of(e, deployed).len() == 7
        })
        .await;
    assert_eq!(types_of(&receiver.events(), first), HELLO);
    assert_eq!(
        types_of(&receiver.events(), deployed),
        [
            "interaction.requested",
            "interaction.answered",
            "interaction.requested",
            "interaction.answered",
            "interaction.requested",
            "interaction.answered",
            "run.completed"
        ]
    );

    // Killed mid-stream: runs go on meanwhile; back on the same port later, it gets it all.
    receiver.kill();
    let mut later = vec![];
    for name in ["Bo", "Cy", "Di"] {
        later.push(run_hello(&fleet, &fleet.client, name).await);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    receiver.restart();
    let events = receiver
        .wait("the runs while the receiver was down", |e| {
            later.iter().all(|r| types_of(e, *r).len() == 3)
        })
        .await;
    for run in &later {
        assert_eq!(types_of(&events, *run), HELLO, "run {run}");
    }
    all_verified(&events);
    for e in &events {
        assert_eq!(e["signatures"], 1, "one secret, one signature");
    }
    // The subscription's figures say so.
    let (_, list) = fleet.client.get("/v1/webhooks").await.expect("list");
    let w = &list["webhooks"][0];
    assert_eq!(w["state"], "active");
    assert!(w["deliveries"].as_u64().unwrap_or(0) >= 19, "{w}");
    assert!(w["failures"].as_u64().unwrap_or(0) >= 1, "{w}");
    assert!(w["failing_since"].is_null(), "{w}");
    assert!(!w.to_string().contains("whsec_"), "no secret in a listing");
}

#[tokio::test(flavor = "multi_thread")]
async fn during_a_rotation_both_the_old_and_the_new_secret_verify() {
    let fleet = fleet("whr", 1, &[]).await;
    let receiver = Receiver::start();
    let (id, old) = subscribe(&fleet.client, json!({"url": receiver.url()})).await;
    receiver.secrets(&[&old]);
    let before = run_hello(&fleet, &fleet.client, "Ada").await;
    receiver
        .wait("before the rotation", |e| types_of(e, before).len() == 3)
        .await;

    let (s, b) = fleet
        .client
        .post(&format!("/v1/webhooks/{id}/rotate"), &json!({}))
        .await
        .expect("rotate");
    assert_eq!(s, 200, "{b}");
    let new = b["secret"].as_str().expect("secret").to_owned();
    assert_ne!(new, old);
    assert!(b["previous_secret_until"].is_string(), "{b}");
    // Each request is verified with the old secret alone and with the new one alone.
    receiver.secrets(&[&old, &new]);
    let after = run_hello(&fleet, &fleet.client, "Bo").await;
    let events = receiver
        .wait("after the rotation", |e| types_of(e, after).len() == 3)
        .await;
    let mine: Vec<&Value> = events
        .iter()
        .filter(|e| e["run"] == after.to_string())
        .collect();
    for e in mine {
        assert_eq!(e["verified"], json!([true, true]), "{e}");
        assert_eq!(e["signatures"], 2, "{e}");
    }

    // Without a grace the old secret signs nothing more.
    let (s, b) = fleet
        .client
        .post(
            &format!("/v1/webhooks/{id}/rotate"),
            &json!({"grace_seconds": 0}),
        )
        .await
        .expect("rotate");
    assert_eq!(s, 200, "{b}");
    let newest = b["secret"].as_str().expect("secret").to_owned();
    receiver.secrets(&[&newest, &new]);
    let last = run_hello(&fleet, &fleet.client, "Cy").await;
    let events = receiver
        .wait("after the second rotation", |e| {
            types_of(e, last).len() == 3
        })
        .await;
    for e in events.iter().filter(|e| e["run"] == last.to_string()) {
        assert_eq!(e["verified"], json!([true, false]), "{e}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_receiver_is_disabled_with_the_reason_and_enabling_loses_nothing() {
    let fleet = fleet("whd", 1, &[("DELTA_WEBHOOK_DISABLE_AFTER", "3s")]).await;
    let receiver = Receiver::start();
    let (id, secret) = subscribe(&fleet.client, json!({"url": receiver.url()})).await;
    receiver.secrets(&[&secret]);
    receiver.failing(true);
    let first = run_hello(&fleet, &fleet.client, "Ada").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let w = loop {
        let (_, w) = fleet
            .client
            .get(&format!("/v1/webhooks/{id}"))
            .await
            .expect("get");
        if w["state"] == "disabled" {
            break w;
        }
        assert!(Instant::now() < deadline, "never disabled: {w}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let reason = w["disabled_reason"].as_str().expect("reason");
    assert!(
        reason.contains("DELTA_WEBHOOK_DISABLE_AFTER") && reason.contains("503"),
        "{reason}"
    );
    assert!(
        w["last_error"].as_str().is_some_and(|e| e.contains("503")),
        "{w}"
    );
    assert!(!reason.contains("hidden"), "no query string in the reason");
    // The CLI shows it too.
    let out = cli(&fleet, &["webhooks", "ls"]);
    assert!(
        out.contains("disabled") && out.contains("DELTA_WEBHOOK_DISABLE_AFTER"),
        "{out}"
    );

    // Events go on meanwhile; enabled, it gets them all, in order.
    let second = run_hello(&fleet, &fleet.client, "Bo").await;
    receiver.failing(false);
    let out = cli(&fleet, &["webhooks", "enable", &id]);
    assert!(out.contains("active"), "{out}");
    let events = receiver
        .wait("after enabling", |e| {
            types_of(e, first).len() == 3 && types_of(e, second).len() == 3
        })
        .await;
    assert_eq!(types_of(&events, first), HELLO);
    assert_eq!(types_of(&events, second), HELLO);
    all_verified(&events);
    let (_, w) = fleet
        .client
        .get(&format!("/v1/webhooks/{id}"))
        .await
        .expect("get");
    assert_eq!(w["state"], "active", "{w}");
    assert!(w["disabled_reason"].is_null(), "{w}");
}

#[tokio::test(flavor = "multi_thread")]
async fn filters_deliver_only_what_was_subscribed_and_inside_addresses_are_refused() {
    let fleet = fleet("whf", 1, &[]).await;
    // Refused, each with what to do, and nothing made.
    for (body, needle) in [
        (
            json!({"url": "http://127.0.0.2:9/x"}),
            "DELTA_WEBHOOK_ALLOW",
        ),
        (
            json!({"url": "https://127.0.0.2:9/x"}),
            "127.0.0.2 is a loopback",
        ),
        (json!({"url": "https://[::1]:9/x"}), "::1 is a loopback"),
        (
            json!({"url": "https://169.254.169.254/latest"}),
            "link-local",
        ),
        (json!({"url": "https://10.0.0.7/x"}), "private"),
        (
            json!({"url": "https://user:pw@hooks.example.com/x"}),
            "user or password",
        ),
        (
            json!({"url": "https://hooks.example.com/x", "events": ["run.exploded"]}),
            "run.exploded",
        ),
        (
            json!({"url": "https://hooks.example.com/x", "agents": ["../etc"]}),
            "agent name",
        ),
    ] {
        let (s, b) = fleet
            .client
            .post("/v1/webhooks", &body)
            .await
            .expect("post");
        assert_eq!(s, 422, "{body}: {b}");
        let message = b["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(needle), "{body}: {message}");
    }
    let (s, b) = fleet
        .client
        .post(
            "/v1/webhooks",
            &json!({"url": "https://x.example", "secret": "mine"}),
        )
        .await
        .expect("post");
    assert_eq!(s, 400, "unknown fields are refused: {b}");
    let (_, list) = fleet.client.get("/v1/webhooks").await.expect("list");
    assert_eq!(list["webhooks"], json!([]), "nothing was made");

    // Two receivers: one for hello's ends only (subscribed with the CLI), one for every
    // question of chooser.
    let ends = Receiver::start();
    let added = cli(
        &fleet,
        &[
            "webhooks",
            "add",
            &ends.url(),
            "--event",
            "run.completed",
            "--agent",
            "hello",
        ],
    );
    let s1 = added
        .split_whitespace()
        .find(|w| w.starts_with("whsec_"))
        .unwrap_or_else(|| panic!("no secret in {added}"))
        .to_owned();
    assert!(!added.contains("hidden"), "{added}");
    ends.secrets(&[&s1]);
    let questions = Receiver::start();
    let (_, s2) = subscribe(
        &fleet.client,
        json!({"url": questions.url(), "events": ["interaction.requested", "interaction.answered"], "agents": ["chooser"]}),
    )
    .await;
    questions.secrets(&[&s2]);

    let hello = run_hello(&fleet, &fleet.client, "Ada").await;
    let chooser = fleet.submit("chooser", "pick").await;
    let rid = fleet.pending(chooser).await;
    let (_, q) = fleet
        .client
        .get(&format!("/v1/interactions/{rid}"))
        .await
        .expect("question");
    let option = q["request"]["options"][0]["option_id"]
        .as_str()
        .or_else(|| q["options"][0]["option_id"].as_str())
        .expect("an option")
        .to_owned();
    let (s, b) = fleet.answer(&rid, json!({"option_id": option})).await;
    assert_eq!(s, 200, "{b}");
    fleet.wait_status(chooser, RunStatus::Completed).await;

    let got = ends
        .wait("hello's end", |e| types_of(e, hello).len() == 1)
        .await;
    let asked = questions
        .wait("chooser's questions", |e| types_of(e, chooser).len() == 2)
        .await;
    // A last run of each, so that anything wrongly delivered would have arrived by now.
    let hello2 = run_hello(&fleet, &fleet.client, "Bo").await;
    ends.wait("hello's second end", |e| types_of(e, hello2).len() == 1)
        .await;
    let got = [got, ends.events()].concat();
    assert!(
        got.iter()
            .all(|e| e["type"] == "dev.delta.run.completed" && e["agent"] == "hello"),
        "{got:#?}"
    );
    assert_eq!(
        types_of(&asked, chooser),
        ["interaction.requested", "interaction.answered"]
    );
    assert!(
        questions.events().iter().all(|e| e["agent"] == "chooser"),
        "{:#?}",
        questions.events()
    );
    // Deleted with the CLI: gone from the listing.
    let (_, list) = fleet.client.get("/v1/webhooks").await.expect("list");
    let first = list["webhooks"][0]["id"].as_str().expect("id").to_owned();
    let out = cli(&fleet, &["webhooks", "rm", &first]);
    assert!(out.contains("deleted"), "{out}");
    let out = cli(&fleet, &["webhooks", "ls", "--json"]);
    let list: Value = serde_json::from_str(out.trim()).expect("JSON");
    assert_eq!(list["webhooks"].as_array().map(Vec::len), Some(1), "{list}");
    // A delete that removed the subscription but not its consumer (the gateway stopped between
    // them): the delete retried removes the consumer, answering 404.
    let js = async_nats::jetstream::new(fleet.nats_admin().await);
    let stream = js.get_stream("WHF_INTERACTIONS").await.expect("stream");
    let consumer_of = |id: &str| format!("whf-webhook-{id}");
    assert!(
        stream.consumer_info(consumer_of(&first)).await.is_err(),
        "the CLI's delete removed its consumer"
    );
    let last = list["webhooks"][0]["id"].as_str().expect("id").to_owned();
    assert!(fleet.store.delete_webhook(&last).await.expect("delete"));
    assert!(stream.consumer_info(consumer_of(&last)).await.is_ok());
    let (s, _) = fleet
        .client
        .delete(&format!("/v1/webhooks/{last}"))
        .await
        .expect("delete");
    assert_eq!(s, 404);
    assert!(
        stream.consumer_info(consumer_of(&last)).await.is_err(),
        "the leftover consumer is gone"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn when_the_delivering_gateway_dies_another_takes_over_in_order() {
    let mut fleet = fleet("whg", 1, &[]).await;
    let receiver = Receiver::start();
    let (id, secret) = subscribe(&fleet.client, json!({"url": receiver.url()})).await;
    receiver.secrets(&[&secret]);
    // The first gateway holds the pin: it delivers the first run.
    let first = run_hello(&fleet, &fleet.client, "Ada").await;
    receiver
        .wait("the first run", |e| types_of(e, first).len() == 3)
        .await;
    let second_gw = fleet.add_gateway(None).await;

    // The receiver fails: the first gateway retries the events of two runs, holding them.
    receiver.failing(true);
    let mut runs = vec![];
    for name in ["Bo", "Cy"] {
        runs.push(run_hello(&fleet, &second_gw, name).await);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, w) = second_gw
            .get(&format!("/v1/webhooks/{id}"))
            .await
            .expect("get");
        if w["failures"].as_u64().unwrap_or(0) >= 3 {
            break;
        }
        assert!(Instant::now() < deadline, "no attempts: {w}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    fleet.gateways[0].process.signal(Signal::SIGKILL);
    receiver.failing(false);
    runs.push(run_hello(&fleet, &second_gw, "Di").await);
    let events = receiver
        .wait("after the takeover", |e| {
            runs.iter().all(|r| types_of(e, *r).len() == 3)
        })
        .await;
    for run in &runs {
        assert_eq!(types_of(&events, *run), HELLO, "run {run}");
    }
    all_verified(&events);
}

/// A gateway that cannot open a subscription's signing secret (its `DELTA_SECRETS_KEY` lacks
/// the key that sealed it: a rotation done on some gateways only) gives the subscription up after
/// a few tries, so that a gateway that can takes the pin and delivers. Before, it kept the pin,
/// and nothing was delivered while it lived.
#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_that_cannot_sign_leaves_the_subscription_to_one_that_can() {
    let mut fleet = fleet("whk", 1, &[]).await;
    let receiver = Receiver::start();
    let (id, secret) = subscribe(&fleet.client, json!({"url": receiver.url()})).await;
    receiver.secrets(&[&secret]);
    // Another key only, and the gateway that sealed the secret gone: the pin is the first's.
    let key = fleet.gateway_spec.secrets_key_hex.clone();
    fleet.gateway_spec.secrets_key_hex = Some("6f".repeat(32));
    let wrong = fleet.add_gateway(None).await;
    fleet.gateway_spec.secrets_key_hex = key;
    fleet.gateways[0].process.signal(Signal::SIGKILL);
    let run = run_hello(&fleet, &wrong, "Ada").await;
    // Its events are in the stream (run_hello waited for its end), and the gateway alive
    // cannot sign them.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(receiver.events().is_empty());
    // A gateway with the key: it delivers.
    fleet.add_gateway(None).await;
    let events = receiver
        .wait("the run, delivered by the gateway that can sign", |e| {
            types_of(e, run).len() == 3
        })
        .await;
    assert_eq!(types_of(&events, run), HELLO);
    all_verified(&events);
    let (_, w) = wrong.get(&format!("/v1/webhooks/{id}")).await.expect("get");
    assert_eq!(w["failures"], 0, "{w}");
}

/// Runs `delta <args>` against the fleet's first gateway: its output (it must succeed).
fn cli(fleet: &Fleet, args: &[&str]) -> String {
    let delta = delta_e2e::workers::programs()
        .worker
        .parent()
        .expect("target dir")
        .join("delta");
    let out = Command::new(delta)
        .args(args)
        .env("DELTA_GATEWAY_URL", &fleet.gateways[0].url)
        .output()
        .expect("delta");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "delta {args:?}: {text}");
    text
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_secrets_key_no_webhook_is_made() {
    let fleet = Fleet::start_with("whn", 1, 1, |s| {
        s.extra
            .push(("DELTA_WEBHOOK_ALLOW", "127.0.0.1/32".to_owned()));
    })
    .await;
    let (s, b) = fleet
        .client
        .post("/v1/webhooks", &json!({"url": "http://127.0.0.1:9/x"}))
        .await
        .expect("post");
    assert_eq!(s, 422, "{b}");
    let message = b["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("DELTA_SECRETS_KEY"), "{message}");
    let (_, list) = fleet.client.get("/v1/webhooks").await.expect("list");
    assert_eq!(list["webhooks"], json!([]));
}

/// A receiver that answers with a redirect is not followed (the place it points to could be
/// anywhere, the allowlist's inside included): the attempt fails, saying so, and the event is
/// delivered to the subscribed URL once it answers there, never to the redirect's target.
#[tokio::test(flavor = "multi_thread")]
async fn redirects_are_not_followed() {
    let fleet = fleet("whx", 1, &[]).await;
    let receiver = Receiver::start();
    let elsewhere = Receiver::start();
    let (id, secret) = subscribe(&fleet.client, json!({"url": receiver.url()})).await;
    receiver.secrets(&[&secret]);
    elsewhere.secrets(&[&secret]);
    receiver.redirecting(Some(&elsewhere.url()));
    let run = fleet.submit("hello", "greet").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while receiver.redirected() < 2 {
        assert!(Instant::now() < deadline, "never posted to the receiver");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, w) = fleet
        .client
        .get(&format!("/v1/webhooks/{id}"))
        .await
        .expect("get");
    assert!(
        w["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("redirects are not followed")),
        "{w}"
    );
    assert!(receiver.events().is_empty());
    receiver.redirecting(None);
    receiver
        .wait("delivered where it was subscribed", |e| {
            types_of(e, run).first().map(String::as_str) == Some("interaction.requested")
        })
        .await;
    assert!(
        elsewhere.events().is_empty() && elsewhere.redirected() == 0,
        "the redirect was followed: {:?}",
        elsewhere.events()
    );
}
