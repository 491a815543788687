//! Findings of the security review (issue 14) about the engine, each reproduced end to end:
//! real `redis-server` and `nats-server`, `delta-gateway` and `delta-worker` processes, agents
//! written here, answers given over HTTP. The engine's own tests and `delta run`'s cover the
//! same fixes in-process; these prove that the fleet keeps them: a secret sealed in Redis and
//! opened by another process, a tool started by a worker with the fleet's environment.
//!
//! Each test says which fix it guards and what it would see without it.

use std::path::Path;
use std::time::Duration;

use delta_e2e::fleet::{Fleet, FleetLogs};
use delta_e2e::gateways::Client;
use delta_protocol::{ActionStatus, Event, RunId, RunStatus};
use delta_store::{RunStore, StoredRun};
use serde_json::json;

/// The fleet's secrets key in these tests (64 hex digits).
fn secrets_key() -> String {
    "7e".repeat(32)
}

/// A text no other test uses, to search for.
fn canary(what: &str) -> String {
    format!("{what}-{}", RunId::new().as_uuid().simple())
}

fn sha256_hex(text: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, text.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Log files for the fleet's processes: our crates at their most verbose.
fn verbose_logs(dir: &Path) -> FleetLogs {
    FleetLogs {
        dir: dir.to_path_buf(),
        filter: Some(
            "info,delta_gateway=trace,delta_worker=trace,delta_protocol=trace,delta_store=trace,\
             delta_queue=trace,delta_host=trace,delta_engine=trace"
                .into(),
        ),
        spans: false,
    }
}

/// Reads a run's event stream (`/v1/runs/{run}/events`) until its closing `status` event: every
/// event as text.
fn read_run_stream(client: &Client, run: RunId) -> tokio::task::JoinHandle<String> {
    let client = client.clone();
    tokio::spawn(async move {
        let path = format!("/v1/runs/{run}/events");
        let mut sse = client.sse(&path, None).await.expect("sse");
        assert_eq!(sse.status(), 200, "{path}");
        let mut text = String::new();
        while let Some(e) = sse.next(Duration::from_secs(30)).await {
            text.push_str(&format!("{:?} {} {}\n", e.id, e.event, e.data));
            if e.event == "status" {
                break;
            }
        }
        text
    })
}

/// The observations a run journaled, in order: status and text.
fn results(run: &StoredRun) -> Vec<(ActionStatus, String)> {
    run.journal
        .iter()
        .filter_map(|e| match &e.event {
            Event::ActionResult(r) => Some((r.status, r.observation_content.clone())),
            _ => None,
        })
        .collect()
}

/// Waits for `run` to pause on a request other than `previous`, and returns its id.
async fn next_question(fleet: &Fleet, run: RunId, previous: &str) -> String {
    loop {
        let rid = fleet.pending(run).await;
        if rid != previous {
            return rid;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every place a person or an operator can read a run from: the API (the run, its journal, the
/// interactions, read with the fleet's client), the store (record and journal), every key of
/// Redis in clear. Each as a name and its text.
async fn places(fleet: &Fleet, run: RunId) -> Vec<(String, String)> {
    let mut out = vec![];
    for path in [
        format!("/v1/runs/{run}"),
        format!("/v1/runs/{run}/journal"),
        "/v1/interactions?state=all".to_owned(),
    ] {
        let (status, body) = fleet.client.get(&path).await.expect("get");
        assert_eq!(status, 200, "{path}: {body}");
        out.push((format!("GET {path}"), body.to_string()));
    }
    let stored = fleet.store.load(run).await.expect("load");
    out.push((
        "the store's record and journal".into(),
        format!("{:?}\n{:?}", stored.record, stored.journal),
    ));
    out.push((
        "Redis (every key, in clear)".into(),
        delta_e2e::redis_dump(&fleet.redis.url(), "*").await,
    ));
    out
}

/// Stops every process of the fleet (so that their logs are complete) and returns each log.
async fn stopped_logs(fleet: &mut Fleet, logs: &FleetLogs) -> Vec<(String, String)> {
    for w in &mut fleet.workers {
        w.stop(Duration::from_secs(30)).await;
    }
    for g in &mut fleet.gateways {
        g.process.stop(Duration::from_secs(30)).await;
    }
    let mut out = vec![];
    for entry in std::fs::read_dir(&logs.dir).expect("logs").flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        assert!(
            !text.trim().is_empty(),
            "{} is empty",
            entry.path().display()
        );
        out.push((entry.path().display().to_string(), text));
    }
    assert!(out.len() >= 2, "a gateway's and a worker's log: {out:?}");
    out
}

fn assert_nowhere(secret: &str, places: &[(String, String)]) {
    for (name, text) in places {
        assert!(
            !text.contains(secret),
            "the secret `{secret}` shows in {name}:\n{text}"
        );
    }
}

/// Finding "sensitive answers leak through option actions". A sensitive question's options
/// may reject, send back for another try, or terminate, each with the person's text as its
/// reason. The fix (the engine's `apply_answer`): whatever the option does, a sensitive answer's
/// text never becomes a result, the run's error, or what the brain sees; it journals "(the reason
/// given is hidden: the answer is sensitive)". Without it, the reason (the secret) would be the
/// `rejected: …` / `not run; … think again: …` observation, the run's result that echoes it,
/// and the cancelled run's error, in the journal, the API, SSE and Redis in clear.
///
/// Three runs, one per action, answered over HTTP with the secret as `input` (reject,
/// terminate) or as `feedback` (retry); the secret is then searched for in the API, the store,
/// the run's event stream, every Redis key in clear, and the gateway's and worker's logs.
#[tokio::test(flavor = "multi_thread")]
async fn a_sensitive_answer_never_leaks_through_an_option_action() {
    let logs_dir = tempfile::tempdir().expect("tmp");
    let logs = verbose_logs(logs_dir.path());
    let mut fleet = Fleet::start_with("se1", 0, 0, |s| {
        s.secrets_key_hex = Some(secrets_key());
    })
    .await;
    fleet.logs = Some(logs.clone());
    fleet.add_gateway(None).await;
    fleet.add_worker("w0");
    fleet.add_agent(
        "vault",
        "name: vault\nbrain: scripted\n",
        r#"steps:
  - ask_human:
      prompt: "The deploy key?"
      sensitive: true
      options:
        - {id: give, label: "Here it is", requires_input: true}
        - {id: reject, label: Reject, action: REJECT_WITH_REASON, requires_input: true}
        - {id: retry, label: "Ask again", action: RETRY_WITH_FEEDBACK}
        - {id: stop, label: Stop, action: TERMINATE, requires_input: true}
  - finish: "after: ${observation}"
"#,
    );
    let mut everywhere = vec![];
    let mut runs = vec![];
    for (option, field, status) in [
        ("reject", "input", RunStatus::Completed),
        ("retry", "feedback", RunStatus::Completed),
        ("stop", "input", RunStatus::Cancelled),
    ] {
        let secret = canary(&format!("sk-{option}"));
        let run = fleet.submit("vault", option).await;
        let stream = read_run_stream(&fleet.client, run);
        let rid = fleet.pending(run).await;
        let (s, b) = fleet
            .answer(&rid, json!({"option_id": option, field: secret}))
            .await;
        assert_eq!(s, 200, "{b}");
        fleet.wait_status(run, status).await;
        let stream = stream.await.expect("stream");
        assert!(stream.contains("status"), "{stream}");
        everywhere.push((format!("the event stream of run {run}"), stream));
        everywhere.extend(places(&fleet, run).await);
        runs.push((option, run, status, secret));
    }
    // The answers did go through Redis: sealed.
    let dump = delta_e2e::redis_dump(&fleet.redis.url(), "*").await;
    assert!(dump.matches("sealed:v2:").count() >= 3, "{dump}");
    everywhere.extend(stopped_logs(&mut fleet, &logs).await);
    for (_, _, _, secret) in &runs {
        assert_nowhere(secret, &everywhere);
    }
    // Each answer was applied, its reason hidden: as the observation, and as the run's result
    // (which echoes it) or error.
    let hidden = "(the reason given is hidden: the answer is sensitive)";
    for (option, run, status, _) in &runs {
        let stored = fleet.store.load(*run).await.expect("load");
        let r = results(&stored);
        assert_eq!(r.len(), 1, "{option}: {r:?}");
        assert!(r[0].1.contains(hidden), "{option}: {r:?}");
        let shown = match status {
            RunStatus::Cancelled => stored.record.error.clone(),
            _ => stored.record.result.clone(),
        };
        assert!(
            shown.as_deref().is_some_and(|t| t.contains(hidden)),
            "{option}: {shown:?}"
        );
    }
}

/// Finding "tools inherit the worker's whole environment". A worker's environment holds the
/// secrets key and the LLM's API key; a tool runs whatever the LLM asked for. The fix (the
/// engine's `tools::execute`): a tool starts with a cleared environment, then `PATH`, `HOME`,
/// `LANG`, `TZ`, the variables it declares in `env:`, and `AGENT_HOME`, `CWD`, `DELTA_RUN_ID`.
/// Without it, `env` would print `DELTA_SECRETS_KEY`, `OPENAI_API_KEY` and every other setting
/// of the worker into the journal.
#[tokio::test(flavor = "multi_thread")]
async fn a_tool_sees_only_the_environment_it_declares() {
    let mut fleet = Fleet::start_with("se2", 1, 0, |s| {
        s.secrets_key_hex = Some(secrets_key());
    })
    .await;
    let api_key = canary("sk-test");
    let undeclared = canary("undeclared");
    fleet.worker_spec.extra = vec![
        ("OPENAI_API_KEY", api_key.clone()),
        ("GH_TOKEN", undeclared.clone()),
        ("DEPLOY_REGION", "eu-west-7".into()),
    ];
    fleet.add_worker("w0");
    fleet.add_agent(
        "envy",
        "name: envy\nbrain: scripted\ntools:\n  - name: show_env\n    exec: \"env\"\n    env: [DEPLOY_REGION]\n",
        "steps:\n  - tool: show_env\n  - finish: \"${observation}\"\n",
    );
    let run = fleet.submit("envy", "env").await;
    fleet.wait_status(run, RunStatus::Completed).await;
    let stored = fleet.store.load(run).await.expect("load");
    let r = results(&stored);
    assert_eq!(r.len(), 1, "{r:?}");
    let (status, env) = &r[0];
    assert_eq!(*status, ActionStatus::Success, "{env}");
    // What it declared, and what the fleet gives every tool.
    for line in [
        "DEPLOY_REGION=eu-west-7".to_owned(),
        format!("DELTA_RUN_ID={run}"),
    ] {
        assert!(env.lines().any(|l| l == line), "{line} in:\n{env}");
    }
    assert!(env.lines().any(|l| l.starts_with("PATH=")), "{env}");
    // Neither secret, nor anything else of the worker's.
    for secret in [secrets_key(), api_key, undeclared] {
        assert!(!env.contains(&secret), "{env}");
    }
    for name in [
        "DELTA_SECRETS_KEY",
        "OPENAI_API_KEY",
        "GH_TOKEN",
        "DELTA_REDIS_URL",
        "DELTA_NATS_URL",
    ] {
        assert!(!env.contains(name), "{name} reached the tool:\n{env}");
    }
}

/// A gateway tokens file in `dir` with `(name, token, role)` entries.
fn tokens_file(dir: &Path, entries: &[(&str, &str, &str)]) -> std::path::PathBuf {
    let file = dir.join("tokens.yaml");
    let text: String = entries
        .iter()
        .map(|(name, token, role)| format!("- name: {name}\n  token: {token}\n  roles: [{role}]\n"))
        .collect();
    std::fs::write(&file, text).expect("tokens");
    file
}

/// Finding "`{{secret:<id>}}` is expanded in any tool argument". Alice gives her API key to a
/// sensitive question; Bob, asked for free text, answers with a reference to it; the script (as
/// a prompt-injected LLM would) also routes the reference into a parameter that is no secret.
/// The fix (the engine's `reveal`): a reference becomes the secret only in a parameter the
/// agent declares `secret: true`; anywhere else the call is refused with an `ERROR` result and
/// the tool does not run. Without it, `note` (which writes its argument to a file) would write
/// Alice's key, twice, where Bob or the model can read it back.
///
/// The `secret: true` parameter of `fingerprint` still gets the key: its SHA-256 is the run's
/// result, while the key itself appears in no journal, API answer or Redis key.
#[tokio::test(flavor = "multi_thread")]
async fn a_secret_reference_opens_only_in_a_secret_parameter() {
    let dir = tempfile::tempdir().expect("tmp");
    let (alice, bob, ops) = (
        "alice-token-0123456789",
        "bob-token-0123456789ab",
        "ops-token-0123456789ab",
    );
    let tokens = tokens_file(
        dir.path(),
        &[
            ("alice", alice, "answer"),
            ("bob", bob, "answer"),
            ("ops", ops, "operate"),
        ],
    );
    let mut fleet = Fleet::start_with("se5", 1, 0, |s| {
        s.tokens_file = Some(tokens.clone());
        s.secrets_key_hex = Some(secrets_key());
    })
    .await;
    fleet.client = fleet.client.with_token(Some(ops));
    fleet.add_worker("w0");
    fleet.add_agent(
        "keyring",
        r#"name: keyring
brain: scripted
tools:
  - name: note
    shell: 'printf "%s\n" "${text}" >> notes.txt; echo noted'
  - name: fingerprint
    exec: "sha256sum"
    stdin: key
    parameters: [{name: key, secret: true}]
"#,
        r#"steps:
  - ask_human: {prompt: "Alice: your API key?", sensitive: true, allowed_responders: [alice]}
  - ask_human: {prompt: "Bob: which version?", allowed_responders: [bob]}
  - tool: note
    args: {text: "${answer}"}
  - tool: note
    args: {text: "key ${secret}"}
  - tool: note
    args: {text: "plain"}
  - tool: fingerprint
    args: {key: "${secret}"}
  - finish: "${observation}"
"#,
    );
    let secret = canary("sk-alice");
    let run = fleet.submit("keyring", "deploy").await;
    let first = fleet.pending(run).await;
    let as_alice = fleet.client.with_token(Some(alice));
    let as_bob = fleet.client.with_token(Some(bob));
    let (s, b) = as_alice
        .post(
            &format!("/v1/interactions/{first}/response"),
            &json!({"input": secret}),
        )
        .await
        .expect("answer");
    assert_eq!(s, 200, "{b}");
    let second = next_question(&fleet, run, &first).await;
    let reference = format!("{{{{secret:{first}}}}}");
    let (s, b) = as_bob
        .post(
            &format!("/v1/interactions/{second}/response"),
            &json!({"input": reference}),
        )
        .await
        .expect("answer");
    assert_eq!(s, 200, "{b}");
    fleet.wait_status(run, RunStatus::Completed).await;
    let stored = fleet.store.load(run).await.expect("load");
    // `note` ran once, for the plain text: it never got the key, nor ran on a reference.
    let notes = std::fs::read_to_string(
        fleet
            .worker_spec
            .work_dir
            .join(run.to_string())
            .join("notes.txt"),
    )
    .expect("notes.txt");
    assert_eq!(notes, "plain\n", "what `note` was given");
    let r = results(&stored);
    assert_eq!(r.len(), 6, "two answers, four calls: {r:?}");
    // Bob's reference and the script's were refused, saying why.
    for refused in &r[2..4] {
        assert_eq!(refused.0, ActionStatus::Error, "{r:?}");
        assert!(
            refused.1.contains("does not take sensitive answers"),
            "{r:?}"
        );
    }
    assert_eq!(r[4], (ActionStatus::Success, "noted\n".into()));
    // The parameter declared `secret: true` got the key itself.
    let want = format!("{}  -\n", sha256_hex(&secret));
    assert_eq!(r[5], (ActionStatus::Success, want.clone()));
    assert_eq!(stored.record.result.as_deref(), Some(want.as_str()));
    // And the key shows nowhere.
    let mut everywhere = places(&fleet, run).await;
    everywhere.push(("notes.txt".into(), notes));
    assert_nowhere(&secret, &everywhere);
}

/// Low finding "values starting with `-` are passed as options where a parameter is
/// positional". The fix (`Tool::invocation`): a value that begins a word of an `exec:` (or
/// `command:`) tool's argv, where no `--` of the template precedes it, may not start with `-`;
/// the call is refused with an `ERROR` result saying to end the options with `--`. Behind the
/// template's own `--` the same value is data. Without the fix, `ls -d --help` prints `ls`'s
/// usage and `ls -d -rf` lists `.`: the value became options.
#[tokio::test(flavor = "multi_thread")]
async fn a_value_starting_with_a_dash_reaches_a_tool_as_data_not_as_an_option() {
    let fleet = Fleet::start("se6", 1, 1).await;
    fleet.add_agent(
        "lister",
        "name: lister\nbrain: scripted\ntools:\n  - name: make\n    exec: \"touch -- ${name}\"\n  - name: bare\n    exec: \"ls -d ${name}\"\n  - name: ended\n    exec: \"ls -d -- ${name}\"\n",
        "steps:\n  - tool: make\n    args: {name: \"${task}\"}\n  - tool: bare\n    args: {name: \"${task}\"}\n  - tool: ended\n    args: {name: \"${task}\"}\n  - finish: \"${observation}\"\n",
    );
    for name in ["--help", "-rf"] {
        // The run first makes a file of that name in its work directory, for `ls` to find.
        let run = fleet.submit("lister", name).await;
        fleet.wait_status(run, RunStatus::Completed).await;
        let stored = fleet.store.load(run).await.expect("load");
        let r = results(&stored);
        assert_eq!(r.len(), 3, "{r:?}");
        assert_eq!(r[0].0, ActionStatus::Success, "touch -- {name}: {r:?}");
        let (status, bare) = &r[1];
        assert_eq!(*status, ActionStatus::Error, "{name}: {bare}");
        assert!(
            bare.contains("`name` starts with `-`") && bare.contains("--"),
            "{name}: {bare}"
        );
        assert!(!bare.contains("Usage"), "{bare}");
        assert_eq!(
            r[2],
            (ActionStatus::Success, format!("{name}\n")),
            "behind `--`, `{name}` is a file name"
        );
    }
}
