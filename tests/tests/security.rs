//! Findings of the security review (issue 14), each reproduced against real nats-server,
//! redis-server, gateway and worker processes. Findings that need no servers are tested where
//! they live (the engine's tests, `delta run`'s tests, the gateway's unit tests).

use std::time::{Duration, Instant};

use delta_e2e::fleet::Fleet;
use delta_protocol::{Event, RunStatus};
use delta_store::RunStore;
use serde_json::json;

/// Whether a process whose command line holds `needle` (its arguments joined by spaces) is
/// alive on this machine.
fn process_running(needle: &str) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return false;
    };
    dir.flatten().any(|entry| {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let text: String = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        text.contains(needle)
    })
}

/// A gateway tokens file in `dir` with `(name, token, role)` entries.
fn tokens_file(dir: &std::path::Path, entries: &[(&str, &str, &str)]) -> std::path::PathBuf {
    let file = dir.join("tokens.yaml");
    let text: String = entries
        .iter()
        .map(|(name, token, role)| format!("- name: {name}\n  token: {token}\n  roles: [{role}]\n"))
        .collect();
    std::fs::write(&file, text).expect("tokens");
    file
}

/// Finding 12: cancelling a run stops its running tool (the whole process group), rather than
/// leaving it to finish for nobody.
#[tokio::test(flavor = "multi_thread")]
async fn cancelling_a_run_kills_its_running_tool() {
    let mut fleet = Fleet::start("sec12", 1, 0).await;
    // A duration no other test uses, to find the process by.
    let marker = "sleep 47.131";
    fleet.add_agent(
        "sleeper",
        &format!(
            "name: sleeper\nbrain: scripted\ntools:\n  - name: nap\n    shell: '{marker}; echo woke'\n"
        ),
        "steps:\n  - tool: nap\n  - finish: \"${observation}\"\n",
    );
    fleet.add_worker("w0");
    let run = fleet.submit("sleeper", "nap").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !process_running(marker) {
        assert!(Instant::now() < deadline, "the tool never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, body) = fleet
        .client
        .post(
            &format!("/v1/runs/{run}/cancel"),
            &json!({"reason": "no time"}),
        )
        .await
        .expect("cancel");
    assert_eq!(status, 200, "{body}");
    // The worker sees the cancel within its look interval (2 s) and kills the tool's group.
    let deadline = Instant::now() + Duration::from_secs(15);
    while process_running(marker) {
        assert!(
            Instant::now() < deadline,
            "the cancelled run's tool is still running"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stored = fleet.store.load(run).await.expect("load");
    assert_eq!(stored.record.status, RunStatus::Cancelled);
    // The tool's result never reached the journal: it did not finish.
    assert!(
        !stored.journal.iter().any(
            |e| matches!(&e.event, Event::ActionResult(r) if r.observation_content.contains("woke"))
        ),
        "{:?}",
        stored.journal
    );
    // The worker let go of the job: nothing is left in the work queue.
    let js = async_nats::jetstream::new(fleet.nats_admin().await);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut jobs = js.get_stream("SEC12_JOBS").await.expect("stream");
        if jobs.info().await.expect("info").state.messages == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cancelled run's job was never acked"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Reads from `conn` until the server closes it (EOF or a reset) or `within` passes: whether it
/// was closed.
async fn closed_within(conn: &mut tokio::net::TcpStream, within: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, conn.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            // A response (a 408 or 503) may come first; the close follows.
            Ok(Ok(_)) => {}
        }
    }
}

/// Finding 8: silent and slow clients cannot hold the gateway's connections. Past
/// `DELTA_MAX_CONNECTIONS`, a connection is closed at once; one that does not finish its request
/// headers within `DELTA_HEADER_TIMEOUT_S` is closed then; afterwards the gateway serves as usual.
#[tokio::test(flavor = "multi_thread")]
async fn half_open_connections_are_capped_and_timed_out() {
    use tokio::io::AsyncWriteExt;
    let fleet = Fleet::start_with("sec8a", 1, 0, |s| {
        s.extra = vec![
            ("DELTA_MAX_CONNECTIONS", "20".into()),
            ("DELTA_HEADER_TIMEOUT_S", "2".into()),
        ];
    })
    .await;
    let addr = fleet
        .gateway_spec
        .url()
        .trim_start_matches("http://")
        .to_owned();
    let mut slow = vec![];
    for _ in 0..60 {
        let mut conn = tokio::net::TcpStream::connect(&addr)
            .await
            .expect("connect");
        // Half a request: the headers never end.
        let _ = conn
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            .await;
        slow.push(conn);
    }
    // 20 are held (until their header timeout), the other 40 are closed at once: all 60 watched
    // together for 300 ms, well inside the timeout (2 s). A few more may be closed at once if
    // the test's own client holds a connection.
    let probes = slow
        .iter_mut()
        .map(|conn| closed_within(conn, Duration::from_millis(300)));
    let closed_at_once = futures_util::future::join_all(probes)
        .await
        .into_iter()
        .filter(|closed| *closed)
        .count();
    assert!(
        (40..=45).contains(&closed_at_once),
        "{closed_at_once} of 60 closed at once: 40 past the cap of 20, the rest held"
    );
    // Every one is closed once the header timeout (2 s) has passed.
    for conn in &mut slow {
        assert!(
            closed_within(conn, Duration::from_secs(5)).await,
            "a connection that never finished its headers is still open"
        );
    }
    let (status, _) = fleet.client.get("/healthz").await.expect("healthz");
    assert_eq!(status, 200);
    let (_, metrics) = fleet.client.get("/metrics").await.expect("metrics");
    let text = metrics.as_str().unwrap_or_default().to_owned();
    let refused: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("delta_connections_refused_total "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(refused >= 40, "{text}");
}

/// Finding 8: a request whose body never arrives gets its answer when the request timeout
/// passes (`503 unavailable`), instead of holding the gateway.
#[tokio::test(flavor = "multi_thread")]
async fn a_request_that_never_finishes_its_body_times_out() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fleet = Fleet::start_with("sec8b", 1, 0, |s| {
        s.extra = vec![("DELTA_REQUEST_TIMEOUT_S", "1".into())];
    })
    .await;
    let addr = fleet
        .gateway_spec
        .url()
        .trim_start_matches("http://")
        .to_owned();
    let mut conn = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    conn.write_all(
        b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"agent\":",
    )
    .await
    .expect("write");
    let mut reply = vec![];
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 4096];
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    reply.extend_from_slice(&buf[..n]);
                    if reply.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            }
        }
    })
    .await;
    assert!(read.is_ok(), "no answer within 10 s");
    let text = String::from_utf8_lossy(&reply);
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
}

/// Finding 8: one token cannot take every live-stream slot: past
/// `DELTA_MAX_STREAMS_PER_IDENTITY` its next stream is refused, another token's is not, and a
/// closed stream gives its slot back.
#[tokio::test(flavor = "multi_thread")]
async fn one_token_holds_at_most_its_share_of_live_streams() {
    let dir = tempfile::tempdir().expect("tmp");
    let tokens = tokens_file(
        dir.path(),
        &[
            ("alice", "alice-token-0123456789", "answer"),
            ("bob", "bob-token-0123456789ab", "answer"),
        ],
    );
    let fleet = Fleet::start_with("sec8c", 1, 0, |s| {
        s.tokens_file = Some(tokens.clone());
        s.extra = vec![("DELTA_MAX_STREAMS_PER_IDENTITY", "2".into())];
    })
    .await;
    let alice = fleet.client.with_token(Some("alice-token-0123456789"));
    let bob = fleet.client.with_token(Some("bob-token-0123456789ab"));
    let first = alice
        .sse("/v1/interactions/stream", None)
        .await
        .expect("sse");
    let second = alice
        .sse("/v1/interactions/stream", None)
        .await
        .expect("sse");
    assert_eq!((first.status(), second.status()), (200, 200));
    let third = alice
        .sse("/v1/interactions/stream", None)
        .await
        .expect("sse");
    assert_eq!(
        third.status(),
        429,
        "a third stream for the same token: its own quota (rate_limited)"
    );
    let other = bob.sse("/v1/interactions/stream", None).await.expect("sse");
    assert_eq!(other.status(), 200, "another token is not held back");
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let again = alice
            .sse("/v1/interactions/stream", None)
            .await
            .expect("sse");
        if again.status() == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a closed stream never gave its slot back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Finding 4: a web page cannot drive the gateway. A cross-site `text/plain` POST (which a page
/// may send without asking) is refused and submits nothing; without authentication, a request
/// naming another host (DNS rebinding) or coming from another site's page is refused too.
#[tokio::test(flavor = "multi_thread")]
async fn web_pages_cannot_drive_a_gateway() {
    let fleet = Fleet::start("sec4a", 1, 0).await;
    let url = fleet.gateway_spec.url();
    let http = reqwest::Client::new();
    let plain = http
        .post(format!("{url}/v1/runs"))
        .header("content-type", "text/plain")
        .body(r#"{"agent": "hello", "task": "from a page"}"#)
        .send()
        .await
        .expect("post");
    assert_eq!(plain.status().as_u16(), 400);
    let body: serde_json::Value = plain.json().await.expect("json");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("application/json")),
        "{body}"
    );
    let (_, runs) = fleet.client.get("/v1/runs").await.expect("runs");
    assert_eq!(runs["runs"], json!([]), "nothing was submitted");
    // A rebinding name, and another site's page: refused while authentication is off.
    let rebound = http
        .get(format!("{url}/v1/runs"))
        .header("host", "attacker.example:8080")
        .send()
        .await
        .expect("get");
    assert_eq!(rebound.status().as_u16(), 403);
    let cross_site = http
        .post(format!("{url}/v1/runs"))
        .header("origin", "https://attacker.example")
        .json(&json!({"agent": "hello", "task": "from a page"}))
        .send()
        .await
        .expect("post");
    assert_eq!(cross_site.status().as_u16(), 403);
    // This machine's own pages and tools are served.
    let local = http
        .post(format!("{url}/v1/runs"))
        .header("origin", url.as_str())
        .json(&json!({"agent": "hello", "task": "from here"}))
        .send()
        .await
        .expect("post");
    assert_eq!(local.status().as_u16(), 202);
}

/// Finding 4: authentication is the default. A gateway with no tokens does not start unless told
/// `DELTA_GATEWAY_AUTH=off`, and that only on a loopback address.
#[test]
fn a_gateway_without_tokens_starts_only_when_told_and_only_on_loopback() {
    let programs = delta_launcher::Programs::find().unwrap_or_else(|e| panic!("{}", e.chain()));
    let dir = tempfile::tempdir().expect("tmp");
    let run = |env: &[(&str, &str)]| {
        let out = std::process::Command::new(&programs.gateway)
            .env_clear()
            .env("DELTA_AGENTS_DIR", dir.path())
            .env("DELTA_NATS_URL", "nats://127.0.0.1:1")
            .env("DELTA_REDIS_URL", "redis://127.0.0.1:1")
            .envs(env.iter().copied())
            .output()
            .expect("delta-gateway runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&[]);
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.contains("no tokens") && err.contains("DELTA_GATEWAY_AUTH=off"),
        "{err}"
    );
    let (code, err) = run(&[
        ("DELTA_GATEWAY_AUTH", "off"),
        ("DELTA_GATEWAY_ADDR", "0.0.0.0:8080"),
    ]);
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("loopback address only"), "{err}");
    // Told, on loopback: the settings are accepted (it then fails to reach NATS, exit 1).
    let (code, err) = run(&[
        ("DELTA_GATEWAY_AUTH", "off"),
        ("DELTA_GATEWAY_ADDR", "127.0.0.1:0"),
    ]);
    assert_eq!(code, Some(1), "{err}");
}

/// Finding 9: storage is bounded. A task past `DELTA_MAX_TASK_BYTES` is refused; a token submits
/// at most `DELTA_SUBMIT_PER_MINUTE` runs a minute (another token is not held back; a refused
/// submission or an idempotent repeat makes no run and does not count); the jobs and
/// dead-letter streams have limits.
#[tokio::test(flavor = "multi_thread")]
async fn submissions_and_streams_are_bounded() {
    let dir = tempfile::tempdir().expect("tmp");
    let tokens = tokens_file(
        dir.path(),
        &[
            ("ci", "ci-token-0123456789abcd", "submit"),
            ("ops", "ops-token-0123456789abc", "operate"),
        ],
    );
    let fleet = Fleet::start_with("sec9", 1, 0, |s| {
        s.tokens_file = Some(tokens.clone());
        s.extra = vec![
            ("DELTA_MAX_TASK_BYTES", "1000".into()),
            ("DELTA_SUBMIT_PER_MINUTE", "3".into()),
            ("DELTA_TICKETS_PER_MINUTE", "2".into()),
        ];
    })
    .await;
    let ci = fleet.client.with_token(Some("ci-token-0123456789abcd"));
    let ops = fleet.client.with_token(Some("ops-token-0123456789abc"));
    let (status, body) = ci
        .post(
            "/v1/runs",
            &json!({"agent": "hello", "task": "x".repeat(1001)}),
        )
        .await
        .expect("post");
    assert_eq!(
        (status, &body["error"]["code"]),
        (422, &json!("invalid_args"))
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("DELTA_MAX_TASK_BYTES")),
        "{body}"
    );
    // The refused one did not count, nor does a submission repeated with its Idempotency-Key
    // (it makes no run): three runs, then the minute's share is used up.
    let keyed = serde_json::to_vec(&json!({"agent": "hello", "task": "keyed"})).expect("json");
    for _ in 0..3 {
        let (status, body) = ci
            .post_raw("/v1/runs", keyed.clone(), &[("idempotency-key", "sec9-k")])
            .await
            .expect("post");
        assert_eq!(status, 202, "{body}");
    }
    for i in 0..2 {
        let (status, body) = ci
            .post(
                "/v1/runs",
                &json!({"agent": "hello", "task": format!("t{i}")}),
            )
            .await
            .expect("post");
        assert_eq!(status, 202, "{body}");
    }
    let (status, body) = ci
        .post(
            "/v1/runs",
            &json!({"agent": "hello", "task": "one too many"}),
        )
        .await
        .expect("post");
    assert_eq!(
        (status, &body["error"]["code"]),
        (429, &json!("rate_limited"))
    );
    let (status, body) = ops
        .post(
            "/v1/runs",
            &json!({"agent": "hello", "task": "another token"}),
        )
        .await
        .expect("post");
    assert_eq!(status, 202, "{body}");
    let another = body["run_id"].clone();
    // Stream tickets (each kept in Redis for its lifetime): `DELTA_TICKETS_PER_MINUTE` a
    // minute per token, then 429; another token is not held back.
    let ticket = json!({"stream": "interactions"});
    for _ in 0..2 {
        let (status, body) = ops.post("/v1/stream-tickets", &ticket).await.expect("post");
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = ops.post("/v1/stream-tickets", &ticket).await.expect("post");
    assert_eq!(
        (status, &body["error"]["code"]),
        (429, &json!("rate_limited")),
        "{body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("DELTA_TICKETS_PER_MINUTE")),
        "{body}"
    );
    let (status, body) = ci
        .post(
            "/v1/stream-tickets",
            &json!({"stream": "run", "run_id": another}),
        )
        .await
        .expect("post");
    assert_eq!(status, 200, "{body}");
    let js = async_nats::jetstream::new(fleet.nats_admin().await);
    let jobs = js
        .get_stream("SEC9_JOBS")
        .await
        .expect("jobs")
        .info()
        .await
        .expect("info")
        .config
        .clone();
    assert!(jobs.max_messages > 0, "the jobs stream is bounded");
    let dlq = js
        .get_stream("SEC9_DLQ")
        .await
        .expect("dlq")
        .info()
        .await
        .expect("info")
        .config
        .clone();
    assert!(
        dlq.max_messages > 0 && dlq.max_age > Duration::ZERO,
        "the dead-letter stream is bounded: {dlq:?}"
    );
}

/// Low finding: NATS and Redis credentials never appear in an error, whether the URL is
/// malformed or the server cannot be reached.
#[test]
fn server_credentials_never_show_in_errors() {
    let programs = delta_launcher::Programs::find().unwrap_or_else(|e| panic!("{}", e.chain()));
    let dir = tempfile::tempdir().expect("tmp");
    for (nats, redis) in [
        ("nats://bot:s3cret-nats@127.0.0.1:1", "redis://127.0.0.1:1"),
        (
            "http://bot:s3cret-nats@127.0.0.1:1",
            "rediz://u:s3cret-redis@x",
        ),
    ] {
        let out = std::process::Command::new(&programs.worker)
            .env_clear()
            .env("DELTA_AGENTS_DIR", dir.path())
            .env("DELTA_WORK_DIR", dir.path())
            .env("DELTA_NATS_URL", nats)
            .env("DELTA_REDIS_URL", redis)
            .output()
            .expect("delta-worker runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(
            err.contains("***@"),
            "the URL is named, without its password: {err}"
        );
        assert!(!err.contains("s3cret"), "{err}");
    }
}

/// Finding 6: an answer that only looks sealed is text, and secrets keys rotate without a drain.
/// A non-sensitive answer `sealed:v1:…` / `sealed:v2:…` is kept and applied as the text it is
/// (before the fix the store tried to open it and the run failed for good). A sensitive answer
/// sealed by a gateway under the old key is opened by a worker that already runs with
/// `DELTA_SECRETS_KEY=<new>,<old>`: the key id in the sealed form says which key to use.
#[tokio::test(flavor = "multi_thread")]
async fn sealed_looking_answers_are_text_and_keys_rotate_without_a_drain() {
    let old = "11".repeat(32);
    let new = "22".repeat(32);
    let mut fleet =
        Fleet::start_with("sec6", 1, 0, |s| s.secrets_key_hex = Some(old.clone())).await;
    fleet.add_agent(
        "keeper",
        r#"name: keeper
brain: scripted
tools:
  - name: fingerprint
    exec: "sha256sum"
    stdin: key
    parameters: [{name: key, secret: true}]
"#,
        r#"steps:
  - ask_human: {prompt: "Your name?"}
  - ask_human: {prompt: "Your key?", sensitive: true}
  - tool: fingerprint
    args: {key: "${secret}"}
  - finish: "${observation}"
"#,
    );
    fleet.add_agent(
        "echoer",
        "name: echoer\nbrain: scripted\ntools: []\n",
        "steps:\n  - ask_human: {prompt: \"Say something\"}\n  - finish: \"${answer}\"\n",
    );
    fleet.add_worker("w-old");
    // Text that looks sealed, to questions that are not sensitive.
    for text in [
        "sealed:v1:deadbeef00",
        "sealed:v2:k1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
    ] {
        let run = fleet.submit("echoer", "talk").await;
        let rid = fleet.pending(run).await;
        let (s, b) = fleet.answer(&rid, json!({"input": text})).await;
        assert_eq!(s, 200, "{b}");
        fleet.wait_status(run, RunStatus::Completed).await;
        let stored = fleet.store.load(run).await.expect("load");
        assert_eq!(stored.record.result.as_deref(), Some(text), "kept as text");
    }
    // A sensitive answer sealed under the old key, then opened by a worker on new,old.
    let run = fleet.submit("keeper", "rotate").await;
    let first = fleet.pending(run).await;
    let (s, b) = fleet
        .answer(&first, json!({"input": "sealed:v2:not:really"}))
        .await;
    assert_eq!(s, 200, "{b}");
    let second = loop {
        let rid = fleet.pending(run).await;
        if rid != first {
            break rid;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The worker that knew only the old key goes; the gateway seals the answer under it.
    fleet.workers.clear();
    let secret = "sk-rotation-canary-7731";
    let (s, b) = fleet.answer(&second, json!({"input": secret})).await;
    assert_eq!(s, 200, "{b}");
    let dump = delta_e2e::redis_dump(&fleet.redis.url(), "sec6:*").await;
    assert!(
        !dump.contains(secret) && dump.contains("sealed:v2:"),
        "sealed in Redis"
    );
    fleet.worker_spec.secrets_key_hex = Some(format!("{new},{old}"));
    fleet.add_worker("w-new");
    fleet.wait_status(run, RunStatus::Completed).await;
    let stored = fleet.store.load(run).await.expect("load");
    let digest = ring::digest::digest(&ring::digest::SHA256, secret.as_bytes());
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        stored.record.result.as_deref(),
        Some(format!("{hex}  -\n").as_str()),
        "the new worker opened the old key's answer"
    );
}

/// A relay (the Slack bridge's token) acts for the people of the tokens file only, and only to
/// answer: never as `DELTA_GATEWAY_TOKEN`'s `operator`, never with an operator's other powers
/// (breaking someone's claim), and never on a sensitive question, whose secret must not pass
/// through it (docs/security.md "Credentials", docs/slack.md).
#[tokio::test(flavor = "multi_thread")]
async fn a_relay_acts_only_as_people_only_to_answer_and_never_on_a_secret() {
    let dir = tempfile::tempdir().expect("tmp");
    let tokens = tokens_file(
        dir.path(),
        &[
            ("alice", "alice-token-0123456789", "answer"),
            ("olga", "olga-token-0123456789ab", "operate"),
            ("slack", "slack-token-0123456789", "relay"),
        ],
    );
    let fleet = Fleet::start_with("secrelay", 1, 1, |s| {
        s.tokens_file = Some(tokens.clone());
        s.operator_token = Some("fleet-operator-token-0123456789".into());
    })
    .await;
    fleet.add_agent(
        "vault",
        "name: vault\nbrain: scripted\n",
        "steps:\n  - ask_human:\n      prompt: \"The key?\"\n      sensitive: true\n  - finish: \"got it\"\n",
    );
    let ops = fleet
        .client
        .with_token(Some("fleet-operator-token-0123456789"));
    let relay = fleet.client.with_token(Some("slack-token-0123456789"));
    let alice = fleet.client.with_token(Some("alice-token-0123456789"));
    let run = delta_e2e::fleet::submit_as(&ops, "vault", "open").await;
    let rid = delta_e2e::fleet::pending(&ops, run).await;
    let answer =
        |id: &str| json!({"input": "s3cret-value", "responder": {"id": id, "via": "slack"}});
    let path = format!("/v1/interactions/{rid}/response");
    // As the fleet's own operator: nobody a relay may act for.
    let (s, b) = relay.post(&path, &answer("operator")).await.expect("post");
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (403, Some("forbidden")),
        "{b}"
    );
    assert!(
        b["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("`operator` is not a name of the tokens file")),
        "{b}"
    );
    // As alice, but the question is sensitive: refused, and the secret goes nowhere.
    let (s, b) = relay.post(&path, &answer("alice")).await.expect("post");
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (403, Some("forbidden")),
        "{b}"
    );
    assert!(
        b["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("sensitive") && !m.contains("s3cret")),
        "{b}"
    );
    let (_, ix) = ops
        .get(&format!("/v1/interactions/{rid}"))
        .await
        .expect("get");
    assert_eq!(ix["state"], "PENDING", "{ix}");
    // Claims: alice claims; olga, relayed, is only one who answers: she cannot break it, as
    // she could herself.
    let claim = format!("/v1/interactions/{rid}/claim");
    let (s, b) = alice.post(&claim, &json!({})).await.expect("claim");
    assert_eq!(s, 200, "{b}");
    let (s, b) = relay
        .post(
            &claim,
            &json!({"release": true, "responder": {"id": "olga", "via": "slack"}}),
        )
        .await
        .expect("break");
    assert_ne!(s, 200, "a relayed operator broke a claim: {b}");
    let (_, ix) = ops
        .get(&format!("/v1/interactions/{rid}"))
        .await
        .expect("get");
    assert_eq!(ix["claim"]["by"], "alice", "{ix}");
}
