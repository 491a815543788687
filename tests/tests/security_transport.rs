//! Finding 10 of the security review (issue 14): tokens travelled over plain HTTP, and live
//! streams took the bearer token as `?access_token=`, where proxies log it. Now the gateway
//! serves TLS of its own, and a live stream opened without headers takes a one-time ticket.
//! Every test runs against real nats-server, redis-server and delta-gateway processes.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use delta_e2e::fleet::{Fleet, FleetLogs, submit_as};
use delta_e2e::gateways::{Client, Spec};
use delta_launcher::GatewayTls;
use serde_json::{Value, json};

const ALICE: &str = "alice-token-0123456789";
const CI: &str = "ci-token-0123456789abcd";

/// A tokens file in `dir`: alice answers, ci submits.
fn tokens_file(dir: &Path) -> PathBuf {
    let file = dir.join("tokens.yaml");
    std::fs::write(
        &file,
        format!(
            "- name: alice\n  token: {ALICE}\n  roles: [answer]\n- name: ci\n  token: {CI}\n  roles: [submit]\n"
        ),
    )
    .expect("tokens");
    file
}

/// A certificate authority and a gateway certificate it signed for `127.0.0.1` and
/// `localhost`, made now, as PEM files in `dir`.
fn make_tls(dir: &Path) -> GatewayTls {
    delta_e2e::tls::TestCertificates::make(dir).gateway()
}

/// The gateway's address, `127.0.0.1:<port>`.
fn addr(spec: &Spec) -> String {
    format!("127.0.0.1:{}", spec.port)
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
            Ok(Ok(_)) => {}
        }
    }
}

/// `POST /v1/stream-tickets` as `client`: `(status, body)`.
async fn ticket_for(client: &Client, target: Value) -> (u16, Value) {
    client
        .post("/v1/stream-tickets", &target)
        .await
        .expect("ticket")
}

/// A ticket `client` may have for `target`.
async fn ticket(client: &Client, target: Value) -> String {
    let (status, body) = ticket_for(client, target).await;
    assert_eq!(status, 200, "{body}");
    body["ticket"].as_str().expect("a ticket").to_owned()
}

/// Opens the live stream `path` of the gateway at `base` with no `Authorization` header: its
/// status, and the body of a refusal (a stream that opens is dropped at once).
async fn open(base: &str, path: &str) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .get(format!("{base}{path}"))
        .header("accept", "text/event-stream")
        .send()
        .await
        .expect("an answer");
    let status = resp.status().as_u16();
    if status == 200 {
        return (status, Value::Null);
    }
    let text = resp.text().await.expect("body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// The gateway serves HTTPS with the certificate it is given: a client that trusts the CA
/// talks to it (bearer token included); one that does not, or that speaks plain HTTP to the TLS
/// port, gets nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_tls_gateway_serves_clients_that_trust_its_ca() {
    let dir = tempfile::tempdir().expect("tmp");
    let tls = make_tls(dir.path());
    let tokens = tokens_file(dir.path());
    let fleet = Fleet::start_with("tls1", 1, 0, |s| {
        s.tls = Some(tls.clone());
        s.tokens_file = Some(tokens.clone());
    })
    .await;
    let url = fleet.gateway_spec.url();
    assert!(url.starts_with("https://"), "{url}");
    let (status, _) = fleet.client.get("/readyz").await.expect("readyz over TLS");
    assert_eq!(status, 200);
    let alice = fleet.client.with_token(Some(ALICE));
    let (status, body) = alice.get("/v1/interactions").await.expect("over TLS");
    assert_eq!(status, 200, "{body}");
    // The system's roots do not know this CA.
    let stranger = reqwest::Client::new();
    let e = stranger
        .get(format!("{url}/healthz"))
        .send()
        .await
        .expect_err("an untrusted certificate");
    assert!(e.is_connect() || e.is_request(), "{e:?}");
    // Plain HTTP on the TLS port: no HTTP answer at all.
    let plain = format!("http://{}/healthz", addr(&fleet.gateway_spec));
    let answer = reqwest::Client::new().get(&plain).send().await;
    assert!(
        answer.as_ref().map_or(true, |r| r.status() != 200),
        "plain HTTP was served on the TLS port: {answer:?}"
    );
    // And the gateway still serves TLS clients afterwards.
    let (status, _) = fleet.client.get("/healthz").await.expect("healthz");
    assert_eq!(status, 200);
}

/// The TLS handshake happens inside the connection's slot and its header timeout: clients that
/// open TCP and never say hello fill at most `DELTA_MAX_CONNECTIONS` slots (one more is closed at
/// once) and are dropped when `DELTA_HEADER_TIMEOUT_S` passes; then the gateway serves again.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_never_handshakes_is_dropped() {
    let dir = tempfile::tempdir().expect("tmp");
    let tls = make_tls(dir.path());
    let fleet = Fleet::start_with("tls2", 1, 0, |s| {
        s.tls = Some(tls.clone());
        s.extra = vec![
            ("DELTA_MAX_CONNECTIONS", "4".into()),
            ("DELTA_HEADER_TIMEOUT_S", "3".into()),
        ];
    })
    .await;
    let addr = addr(&fleet.gateway_spec);
    let mut silent = vec![];
    for _ in 0..4 {
        silent.push(
            tokio::net::TcpStream::connect(&addr)
                .await
                .expect("connect"),
        );
    }
    // The slots are taken by clients that said nothing: the next connection is closed at once.
    let mut fifth = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    assert!(
        closed_within(&mut fifth, Duration::from_secs(2)).await,
        "a connection past the cap was kept while silent ones held every slot"
    );
    for conn in &mut silent {
        assert!(
            closed_within(conn, Duration::from_secs(8)).await,
            "a connection that never began its TLS handshake is still open"
        );
    }
    let (status, _) = fleet.client.get("/healthz").await.expect("healthz");
    assert_eq!(status, 200);
}

/// Bad TLS settings are start-up errors that name the file and say what to do (exit 64, no
/// panic); plain HTTP with tokens on a non-loopback address is refused unless the operator says
/// TLS ends in front of the gateway.
#[test]
fn bad_tls_settings_are_refused_at_start() {
    let programs = delta_launcher::Programs::find().unwrap_or_else(|e| panic!("{}", e.chain()));
    let dir = tempfile::tempdir().expect("tmp");
    let tls = make_tls(dir.path());
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "-----BEGIN CERTIFICATE-----\nnot base64!\n").expect("write");
    let run = |env: &[(&str, &str)]| {
        let out = std::process::Command::new(&programs.gateway)
            .env_clear()
            .env("DELTA_AGENTS_DIR", dir.path())
            .env("DELTA_NATS_URL", "nats://127.0.0.1:1")
            .env("DELTA_REDIS_URL", "redis://127.0.0.1:1")
            .env("DELTA_GATEWAY_TOKEN", "operator-token-0123456789")
            .envs(env.iter().copied())
            .output()
            .expect("delta-gateway runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (cert, key) = (tls.cert.to_string_lossy(), tls.key.to_string_lossy());
    let missing = dir.path().join("missing-key.pem");
    let missing = missing.to_string_lossy();
    let garbage = garbage.to_string_lossy();
    for (env, needles) in [
        (
            vec![
                ("DELTA_GATEWAY_TLS_CERT", &*cert),
                ("DELTA_GATEWAY_TLS_KEY", &*missing),
            ],
            vec!["missing-key.pem", "cannot read the TLS private key"],
        ),
        (
            vec![
                ("DELTA_GATEWAY_TLS_CERT", &*garbage),
                ("DELTA_GATEWAY_TLS_KEY", &*key),
            ],
            vec!["garbage.pem", "PEM"],
        ),
        (
            // The CA's certificate with the gateway's key: not a pair.
            vec![
                ("DELTA_GATEWAY_TLS_CERT", &*tls.ca.to_string_lossy()),
                ("DELTA_GATEWAY_TLS_KEY", &*key),
            ],
            vec!["do not make a usable pair"],
        ),
        (
            vec![("DELTA_GATEWAY_TLS_CERT", &*cert)],
            vec!["DELTA_GATEWAY_TLS_KEY"],
        ),
        (
            vec![("DELTA_GATEWAY_ADDR", "0.0.0.0:8080")],
            vec!["in clear", "DELTA_GATEWAY_PLAIN_HTTP=any"],
        ),
    ] {
        let (code, err) = run(&env);
        assert_eq!(code, Some(64), "{env:?}: {err}");
        for needle in needles {
            assert!(err.contains(needle), "{env:?}: `{needle}` in {err}");
        }
        assert!(!err.contains("panicked"), "{err}");
    }
    // Good files, or plain HTTP told so: the settings are accepted (then NATS is unreachable,
    // exit 1).
    let (code, err) = run(&[
        ("DELTA_GATEWAY_TLS_CERT", &*cert),
        ("DELTA_GATEWAY_TLS_KEY", &*key),
        ("DELTA_GATEWAY_ADDR", "0.0.0.0:0"),
    ]);
    assert_eq!(code, Some(1), "{err}");
    let (code, err) = run(&[
        ("DELTA_GATEWAY_ADDR", "0.0.0.0:0"),
        ("DELTA_GATEWAY_PLAIN_HTTP", "any"),
    ]);
    assert_eq!(code, Some(1), "{err}");
}

/// `?access_token=` is no longer accepted on the live streams, with a message that says what
/// to do instead, and the token is not written to the gateway's log.
#[tokio::test(flavor = "multi_thread")]
async fn a_token_in_a_stream_url_is_refused_and_not_logged() {
    let dir = tempfile::tempdir().expect("tmp");
    let tokens = tokens_file(dir.path());
    let logs = tempfile::tempdir().expect("logs");
    let mut fleet = Fleet::start_with("tick1", 0, 0, |s| {
        s.tokens_file = Some(tokens.clone());
    })
    .await;
    fleet.logs = Some(FleetLogs {
        dir: logs.path().to_path_buf(),
        filter: Some("debug".into()),
        spans: false,
    });
    fleet.add_gateway(None).await;
    let base = fleet.gateway_spec.url();
    let ci = fleet.client.with_token(Some(CI));
    let run = submit_as(&ci, "hello", "t").await;
    for path in [
        format!("/v1/interactions/stream?access_token={ALICE}"),
        format!("/v1/runs/{run}/events?from_seq=1&access_token={CI}"),
    ] {
        let (status, body) = open(&base, &path).await;
        assert_eq!(
            (status, &body["error"]["code"]),
            (400, &json!("bad_request")),
            "{path}: {body}"
        );
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("access_token") && message.contains("/v1/stream-tickets"),
            "{message}"
        );
    }
    // Without a token or a ticket: 401, naming both ways in.
    let (status, body) = open(&base, "/v1/interactions/stream").await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("ticket")),
        "{body}"
    );
    let port = fleet.gateway_spec.port;
    let log = std::fs::read_to_string(
        fleet
            .logs
            .as_ref()
            .expect("logs")
            .log(&format!("gateway-{port}")),
    )
    .expect("the gateway's log");
    assert!(log.contains("access_token"), "the refusal is logged: {log}");
    assert!(!log.contains(ALICE) && !log.contains(CI), "{log}");
}

/// A ticket opens the stream it names, once, as the identity that asked for it; a used ticket,
/// a ticket for another stream and an expired one are refused (401); only a digest of the
/// ticket is kept in Redis, with a TTL.
#[tokio::test(flavor = "multi_thread")]
async fn a_stream_ticket_opens_its_stream_once() {
    let dir = tempfile::tempdir().expect("tmp");
    let tokens = tokens_file(dir.path());
    let fleet = Fleet::start_with("tick2", 1, 1, |s| {
        s.tokens_file = Some(tokens.clone());
        s.extra = vec![
            ("DELTA_STREAM_TICKET_TTL_S", "5".into()),
            ("DELTA_MAX_STREAMS_PER_IDENTITY", "1".into()),
        ];
    })
    .await;
    let base = fleet.gateway_spec.url();
    let alice = fleet.client.with_token(Some(ALICE));
    let ci = fleet.client.with_token(Some(CI));
    let anonymous = fleet.client.with_token(None);

    // Asking for a ticket needs a token, and a role that may follow the stream.
    let (status, _) = ticket_for(&anonymous, json!({"stream": "interactions"})).await;
    assert_eq!(status, 401);
    let (status, body) = ticket_for(&ci, json!({"stream": "interactions"})).await;
    assert_eq!((status, &body["error"]["code"]), (403, &json!("forbidden")));
    let (status, body) = ticket_for(&alice, json!({"stream": "everything"})).await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = ticket_for(
        &alice,
        json!({"stream": "run", "run_id": "0196d3c8-0000-7000-8000-000000000000"}),
    )
    .await;
    assert_eq!(status, 404, "{body}");

    // Only the digest is kept, with a TTL of at most DELTA_STREAM_TICKET_TTL_S.
    let (status, body) = ticket_for(&alice, json!({"stream": "interactions"})).await;
    assert_eq!(status, 200, "{body}");
    let t = body["ticket"].as_str().expect("ticket").to_owned();
    let expires: delta_protocol::Timestamp =
        serde_json::from_value(body["expires_at"].clone()).expect("expires_at");
    let left = expires.micros() - delta_protocol::Timestamp::now().micros();
    assert!((0..=5_000_000).contains(&left), "{left} µs left");
    let dump = delta_e2e::redis_dump(&fleet.redis.url(), "tick2:ticket:*").await;
    assert!(!dump.is_empty() && !dump.contains(&t), "{dump}");
    let digest: String = ring::digest::digest(&ring::digest::SHA256, t.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let ttl = fleet.store.ticket_ttl(&digest).await.expect("ttl");
    assert!(
        ttl.is_some_and(|t| t > Duration::ZERO && t <= Duration::from_secs(5)),
        "{ttl:?}"
    );

    // The ticket opens its stream, as alice: live events arrive, and the stream counts as one
    // of alice's (DELTA_MAX_STREAMS_PER_IDENTITY=1).
    let mut stream = anonymous
        .sse(&format!("/v1/interactions/stream?ticket={t}"), None)
        .await
        .expect("stream");
    assert_eq!(stream.status(), 200);
    let held = alice
        .sse("/v1/interactions/stream", None)
        .await
        .expect("stream");
    assert_eq!(held.status(), 429, "the ticket's stream is alice's");
    drop(held);
    // A second ticket of alice's, refused at her quota: the refusal says the ticket is spent.
    let second = ticket(&alice, json!({"stream": "interactions"})).await;
    let (status, body) = open(&base, &format!("/v1/interactions/stream?ticket={second}")).await;
    assert_eq!(status, 429, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("the ticket is spent")),
        "{body}"
    );
    let run = submit_as(&ci, "hello", "ticketed").await;
    let rid = delta_e2e::fleet::pending(&alice, run).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ev = stream
            .next(Duration::from_secs(20))
            .await
            .expect("a live event through the ticket's stream");
        if ev.event == "requested" && ev.data.contains(&rid) {
            break;
        }
        assert!(Instant::now() < deadline, "no `requested` event for {rid}");
    }
    drop(stream);

    // Used once: refused the second time, with a message that says what to do.
    let (status, body) = open(&base, &format!("/v1/interactions/stream?ticket={t}")).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (401, &json!("unauthorized"))
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("used") && m.contains("/v1/stream-tickets")),
        "{body}"
    );
    assert!(!body.to_string().contains(&t), "the ticket is not echoed");

    // For another stream: refused (and spent).
    let other = ticket(&alice, json!({"stream": "interactions"})).await;
    let (status, body) = open(&base, &format!("/v1/runs/{run}/events?ticket={other}")).await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("another stream")),
        "{body}"
    );
    let second_run = submit_as(&ci, "hello", "another").await;
    let for_run = ticket(&ci, json!({"stream": "run", "run_id": run.to_string()})).await;
    let (status, body) = open(
        &base,
        &format!("/v1/runs/{second_run}/events?ticket={for_run}"),
    )
    .await;
    assert_eq!(status, 401, "a ticket for run A on run B: {body}");
    let for_run = ticket(&ci, json!({"stream": "run", "run_id": run.to_string()})).await;
    let (status, body) = open(&base, &format!("/v1/runs/{run}/events?ticket={for_run}")).await;
    assert_eq!(status, 200, "a run's ticket on its run: {body}");
    let unknown = "ab".repeat(32);
    let (status, _) = open(&base, &format!("/v1/interactions/stream?ticket={unknown}")).await;
    assert_eq!(status, 401);

    // Expired: refused once its TTL (5 s) has passed.
    let late = ticket(&alice, json!({"stream": "interactions"})).await;
    tokio::time::sleep(Duration::from_millis(5500)).await;
    let (status, body) = open(&base, &format!("/v1/interactions/stream?ticket={late}")).await;
    assert_eq!(status, 401, "an expired ticket: {body}");
}

/// Behind a load balancer: a ticket made by one gateway opens the stream on another (they share
/// Redis), once.
#[tokio::test(flavor = "multi_thread")]
async fn a_ticket_from_one_gateway_opens_the_stream_on_another() {
    let dir = tempfile::tempdir().expect("tmp");
    let tokens = tokens_file(dir.path());
    let fleet = Fleet::start_with("tick3", 2, 0, |s| {
        s.tokens_file = Some(tokens.clone());
    })
    .await;
    let first = Client::new(&fleet.gateways[0].url, Some(ALICE));
    let t = ticket(&first, json!({"stream": "interactions"})).await;
    let path = format!("/v1/interactions/stream?ticket={t}");
    let (status, body) = open(&fleet.gateways[1].url, &path).await;
    assert_eq!(status, 200, "made on gateway 1, used on gateway 2: {body}");
    let (status, _) = open(&fleet.gateways[0].url, &path).await;
    assert_eq!(status, 401, "and only once, on any gateway");
}

/// The `delta` CLI talks to an https:// gateway whose CA it is given (`DELTA_GATEWAY_CA`, or
/// `--gateway-ca`), and refuses one whose certificate it cannot check, saying how to fix it.
#[tokio::test(flavor = "multi_thread")]
async fn the_cli_trusts_the_ca_it_is_given() {
    let dir = tempfile::tempdir().expect("tmp");
    let tls = make_tls(dir.path());
    let tokens = tokens_file(dir.path());
    let fleet = Fleet::start_with("tls3", 1, 0, |s| {
        s.tls = Some(tls.clone());
        s.tokens_file = Some(tokens.clone());
    })
    .await;
    let programs = delta_launcher::Programs::find().unwrap_or_else(|e| panic!("{}", e.chain()));
    let delta = programs.gateway.with_file_name("delta");
    let url = fleet.gateway_spec.url();
    let run = |args: &[&str], ca: Option<&Path>| {
        let mut cmd = std::process::Command::new(&delta);
        cmd.env_clear()
            .env("DELTA_GATEWAY_URL", &url)
            .env("DELTA_TOKEN", ALICE)
            .args(args);
        if let Some(ca) = ca {
            cmd.env("DELTA_GATEWAY_CA", ca);
        }
        let out = cmd.output().expect("delta runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = run(&["pending", "ls", "--json"], Some(&tls.ca));
    assert_eq!(code, Some(0), "{out}{err}");
    let (code, out, err) = run(
        &[
            "pending",
            "ls",
            "--json",
            "--gateway-ca",
            &tls.ca.to_string_lossy(),
        ],
        None,
    );
    assert_eq!(code, Some(0), "--gateway-ca: {out}{err}");
    let (code, out, err) = run(&["pending", "ls"], None);
    assert_ne!(code, Some(0), "an unknown CA was trusted: {out}");
    assert!(err.contains("--gateway-ca"), "{err}");
    let (code, _, err) = run(&["pending", "ls"], Some(&dir.path().join("no-ca.pem")));
    assert_ne!(code, Some(0));
    assert!(err.contains("no-ca.pem"), "{err}");
}

/// The web inbox follows its live stream with one-time tickets: questions arrive live; when the
/// gateway goes away and comes back, the page opens the stream again with a fresh ticket (never
/// EventSource's own reconnect, which would present the spent one); the token is in no URL.
#[tokio::test(flavor = "multi_thread")]
async fn the_inbox_streams_with_fresh_tickets_and_never_the_token() {
    use delta_e2e::browser::{Browser, Screen};
    let dir = tempfile::tempdir().expect("tmp");
    let tokens = tokens_file(dir.path());
    let mut fleet = Fleet::start_with("tick4", 1, 1, |s| {
        s.tokens_file = Some(tokens.clone());
    })
    .await;
    let browser = Browser::start(
        "the_inbox_streams_with_fresh_tickets_and_never_the_token",
        Screen::Desktop,
    )
    .await;
    let ci = fleet.client.with_token(Some(CI));
    let alice = fleet.client.with_token(Some(ALICE));
    let card = |rid: &str| format!(r#"article[data-request-id="{rid}"]"#);
    let wait_conn = |state: &'static str| {
        let browser = &browser;
        async move {
            browser
                .wait_for_within(
                    Duration::from_secs(30),
                    &format!("the connection to be {state}"),
                    "return document.getElementById('conn').dataset.state === arguments[0];",
                    vec![json!(state)],
                )
                .await;
        }
    };
    browser
        .checked(async {
            browser
                .goto(&format!("{}/#token={ALICE}", fleet.gateway_spec.url()))
                .await;
            // The link's token is offered, not taken: Save takes it.
            browser.click("#settings-save").await;
            wait_conn("live").await;
            // Every EventSource the page opens from now on is noted, with its URL.
            browser
                .js(
                    "window.streamUrls = []; const Real = window.EventSource; \
                     window.EventSource = class extends Real { \
                       constructor(url, init) { super(url, init); window.streamUrls.push(String(url)); } };",
                    vec![],
                )
                .await;
            let run = submit_as(&ci, "hello", "first").await;
            let rid = delta_e2e::fleet::pending(&alice, run).await;
            browser.find(&card(&rid)).await;
            // The gateway goes away and comes back on the same port.
            fleet.gateways.clear();
            browser
                .wait_for(
                    "the page to notice",
                    "return document.getElementById('conn').dataset.state !== 'live';",
                    vec![],
                )
                .await;
            fleet.add_gateway(None).await;
            wait_conn("live").await;
            let again = submit_as(&ci, "hello", "second").await;
            let rid = delta_e2e::fleet::pending(&alice, again).await;
            browser.find(&card(&rid)).await;
            let urls = browser.js("return window.streamUrls;", vec![]).await;
            let urls: Vec<String> = serde_json::from_value(urls).expect("urls");
            assert!(!urls.is_empty(), "the page opened its stream again");
            let tickets: std::collections::HashSet<&str> = urls
                .iter()
                .map(|u| {
                    assert!(!u.contains(ALICE) && !u.contains("access_token"), "{u}");
                    u.split("ticket=").nth(1).expect("a ticket in the URL")
                })
                .collect();
            assert_eq!(tickets.len(), urls.len(), "a fresh ticket each time: {urls:?}");
            // It went on from the event after the last one it had seen.
            assert!(
                urls.iter().all(|u| u.contains("from_seq=")),
                "reopened from the next event: {urls:?}"
            );
            let timed = browser
                .js(
                    "return performance.getEntriesByType('resource').map(e => e.name);",
                    vec![],
                )
                .await;
            assert!(!timed.to_string().contains(ALICE), "{timed}");
        })
        .await;
    browser.close().await;
}
