//! The operator commands (`delta submit`, `runs`, `pending`, `answer`, `cancel`, `queue`, `dlq`) as a
//! person or a script runs them: the built `delta` binary as a subprocess against real
//! nats-server, redis-server, gateway and worker processes. What is checked is what a user sees:
//! the exit code, the table or the `--json` document, and the run's fate.
//!
//! These live in the `delta-cli` package (not `delta-e2e`) so that cargo builds the `delta`
//! binary for them (`CARGO_BIN_EXE_delta`); the servers and processes come from `delta-e2e`.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use delta_e2e::gateways;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

const SECRETS_KEY: &str = "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a";

/// The end-to-end fleet (`delta_e2e::fleet::Fleet`: servers, a gateway and, `with_worker`, a
/// worker, all processes) with a secrets key, a tokens file when given, and this file's
/// `secret` agent: a sensitive question, then a finish that does not show the answer.
struct Fleet {
    inner: delta_e2e::fleet::Fleet,
    /// The gateway's URL.
    url: String,
}

impl std::ops::Deref for Fleet {
    type Target = delta_e2e::fleet::Fleet;
    fn deref(&self) -> &delta_e2e::fleet::Fleet {
        &self.inner
    }
}

impl Fleet {
    async fn start(prefix: &str, tokens_file: Option<&Path>, with_worker: bool) -> Fleet {
        let mut inner = delta_e2e::fleet::Fleet::start_with(prefix, 1, 0, |s| {
            s.tokens_file = tokens_file.map(Path::to_path_buf);
            s.secrets_key_hex = Some(SECRETS_KEY.into());
        })
        .await;
        inner.add_agent(
            "secret",
            "name: secret\nbrain: scripted\ntools:\n  - name: echo\n    exec: \"echo ${text}\"\n    idempotent: true\n",
            "steps:\n  - ask_human:\n      prompt: \"API key?\"\n      sensitive: true\n  - finish: \"key taken\"\n",
        );
        if with_worker {
            inner.add_worker("w0");
        }
        let url = inner.gateways[0].url.clone();
        Fleet { inner, url }
    }

    /// Kills the gateway (its streams break) and starts another on the same port.
    async fn restart_gateway(&mut self) {
        let gateway = &mut self.inner.gateways[0];
        gateway.process.kill_now();
        self.inner.gateways[0] = gateways::spawn(&self.inner.gateway_spec, None).await;
    }

    /// `delta <args>` against this fleet's gateway, without a token.
    async fn delta(&self, args: &[&str]) -> Run {
        delta(&self.url, None, args, None).await
    }
}

/// What a `delta` process did.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn from(out: Output) -> Self {
        Self {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Asserts exit 0 and returns stdout.
    fn ok(&self) -> &str {
        assert_eq!(
            self.code, 0,
            "stdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        &self.stdout
    }

    /// Asserts exit 0 and returns stdout as the one JSON document it must be.
    fn json(&self) -> Value {
        let out = self.ok();
        assert_eq!(out.trim().lines().count(), 1, "one JSON document: {out}");
        serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
    }

    /// Asserts the exit code and that stderr starts `error: <code>:`.
    fn refused(&self, exit: i32, code: &str) {
        assert_eq!(
            self.code, exit,
            "stdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        assert!(
            self.stderr.starts_with(&format!("error: {code}:")),
            "stderr should start `error: {code}:`: {}",
            self.stderr
        );
    }
}

fn command(url: &str, token: Option<&str>, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_delta"));
    cmd.args(args)
        .env("DELTA_GATEWAY_URL", url)
        .env("USER", "tester")
        .env_remove("DELTA_TOKEN")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    if let Some(t) = token {
        cmd.env("DELTA_TOKEN", t);
    }
    cmd
}

/// Runs `delta <args>` (stdin: `stdin` or nothing) and waits for it, at most a minute.
async fn delta(url: &str, token: Option<&str>, args: &[&str], stdin: Option<&str>) -> Run {
    let mut cmd = command(url, token, args);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    if stdin.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let mut child = cmd.spawn().expect("spawn delta");
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes()).await.expect("stdin");
        drop(pipe);
    }
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("delta {args:?} did not finish within a minute"))
        .expect("delta output");
    Run::from(out)
}

/// A `delta … --follow` running in the background; its stdout collected as it comes.
struct Follower {
    child: tokio::process::Child,
    stdout: std::sync::Arc<std::sync::Mutex<String>>,
    reader: tokio::task::JoinHandle<()>,
}

impl Follower {
    fn spawn(url: &str, args: &[&str]) -> Self {
        use tokio::io::AsyncBufReadExt;
        let mut cmd = command(url, None, args);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn delta");
        let pipe = child.stdout.take().expect("stdout");
        let stdout = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let into = stdout.clone();
        let reader = tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(pipe).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let mut s = into.lock().expect("lock");
                s.push_str(&line);
                s.push('\n');
            }
        });
        Self {
            child,
            stdout,
            reader,
        }
    }

    fn seen(&self) -> String {
        self.stdout.lock().expect("lock").clone()
    }

    /// Waits until it has printed `needle` (it is connected and caught up to there).
    async fn wait_for(&self, needle: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !self.seen().contains(needle) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{needle} never printed: {}",
                self.seen()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits for it to stop by itself (at most 30 s) and returns what it did.
    async fn finish(self) -> Run {
        let out = tokio::time::timeout(Duration::from_secs(30), self.child.wait_with_output())
            .await
            .expect("--follow stops when the run ends")
            .expect("output");
        let _ = self.reader.await;
        let mut run = Run::from(out);
        run.stdout = self.stdout.lock().expect("lock").clone();
        run
    }
}

/// Submits with `--wait --json` and returns the paused run's record.
async fn submit_and_wait(fleet: &Fleet, agent: &str, task: &str) -> Value {
    let rec = fleet
        .delta(&[
            "submit", "--agent", agent, "--task", task, "--wait", "--json",
        ])
        .await
        .json();
    assert_eq!(rec["status"], "WAITING_FOR_INPUT", "{rec}");
    rec
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v}"))
}

/// Polls `delta runs show --json` until the run has `status`.
async fn wait_status(fleet: &Fleet, run: &str, status: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let rec = fleet.delta(&["runs", "show", run, "--json"]).await.json();
        if rec["status"] == status {
            return rec;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "run {run} never became {status}: {rec}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn submit_runs_ls_show_and_journal_follow_a_run_to_completed() {
    let mut fleet = Fleet::start("opa", None, true).await;

    // submit: the run id and QUEUED; the same Idempotency-Key gives the same run.
    let args = [
        "submit",
        "--agent",
        "hello",
        "--task",
        "greet",
        "--idempotency-key",
        "order-1",
        "--json",
    ];
    let first = fleet.delta(&args).await.json();
    assert_eq!(first["status"], "QUEUED", "{first}");
    let run = s(&first["run_id"]).to_owned();
    let again = fleet.delta(&args).await.json();
    assert_eq!(
        again["run_id"], first["run_id"],
        "the same key makes one run"
    );
    // The same key for another submission is refused: exit 1 and the gateway's code.
    let other = fleet
        .delta(&[
            "submit",
            "--agent",
            "hello",
            "--task",
            "another",
            "--idempotency-key",
            "order-1",
        ])
        .await;
    other.refused(1, "invalid_args");
    // No such agent: refused too; bad --input JSON is a usage error.
    fleet
        .delta(&["submit", "--agent", "nobody", "--task", "x"])
        .await
        .refused(1, "invalid_args");
    let bad = fleet
        .delta(&["submit", "--agent", "hello", "--task", "x", "--input", "{"])
        .await;
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    // Without --json: the id and status for people, and a hint on stderr.
    let plain = fleet
        .delta(&[
            "submit",
            "--agent",
            "chooser",
            "--task",
            "pick one",
            "--input",
            r#"{"ticket": 7}"#,
        ])
        .await;
    let line = plain.ok().trim().to_owned();
    assert!(
        line.starts_with("run ") && line.ends_with(" QUEUED"),
        "{line}"
    );
    assert!(
        plain.stderr.contains("delta runs journal"),
        "{}",
        plain.stderr
    );
    let chooser_run = line.split_whitespace().nth(1).expect("run id").to_owned();

    // submit --wait (human): waits until the question, shows it.
    let waited = fleet
        .delta(&[
            "submit",
            "--agent",
            "hello",
            "--task",
            "wait for me",
            "--wait",
        ])
        .await;
    let out = waited.ok();
    assert!(out.contains("status:  WAITING_FOR_INPUT"), "{out}");
    assert!(out.contains("What is your name?"), "{out}");
    assert!(out.contains("delta answer "), "{out}");

    // runs show (human and --json) on the first run once it waits.
    let rec = wait_status(&fleet, &run, "WAITING_FOR_INPUT").await;
    for field in [
        "run_id",
        "agent",
        "task",
        "status",
        "created_at",
        "updated_at",
    ] {
        assert!(
            rec.get(field).is_some(),
            "runs show --json has {field}: {rec}"
        );
    }
    let rid = s(&rec["pending_interaction"]["request_id"]).to_owned();
    let shown = fleet.delta(&["runs", "show", &run]).await;
    let out = shown.ok();
    for needle in [
        format!("run:     {run}"),
        "agent:   hello".into(),
        "status:  WAITING_FOR_INPUT".into(),
        "task:    greet".into(),
        format!("request {rid}"),
        "USER_INPUT What is your name?".into(),
    ] {
        assert!(out.contains(&needle), "{needle:?} in\n{out}");
    }
    let chooser = wait_status(&fleet, &chooser_run, "WAITING_FOR_INPUT").await;
    assert_eq!(
        chooser["input"]["ticket"], 7,
        "--input reaches the run: {chooser}"
    );

    // runs ls: a table, newest first, with filters.
    let table = fleet.delta(&["runs", "ls"]).await;
    let out = table.ok();
    let mut lines = out.lines();
    let header = lines.next().expect("header");
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        ["RUN", "AGENT", "STATUS", "AGE", "TASK"]
    );
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 3, "{out}");
    assert!(rows[0].contains("wait for me"), "newest first: {out}");
    let row = rows
        .iter()
        .find(|r| r.starts_with(&run))
        .unwrap_or_else(|| panic!("{run} listed: {out}"));
    assert!(
        row.contains("hello") && row.contains("WAITING_FOR_INPUT"),
        "{row}"
    );
    assert!(row.contains("s ago"), "relative age: {row}");
    // Columns are aligned: STATUS starts at the same place on every line.
    let col = header.find("STATUS").expect("STATUS");
    for r in &rows {
        assert!(
            r[col..].starts_with("WAITING_FOR_INPUT"),
            "aligned STATUS column:\n{out}"
        );
    }
    let listed = fleet
        .delta(&["runs", "ls", "--agent", "chooser", "--json"])
        .await
        .json();
    let runs = listed["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 1, "{listed}");
    assert_eq!(runs[0]["run_id"], s(&chooser["run_id"]));
    assert!(listed.get("next_cursor").is_some(), "{listed}");
    let limited = fleet
        .delta(&["runs", "ls", "--limit", "1", "--json"])
        .await
        .json();
    assert_eq!(limited["runs"].as_array().map(Vec::len), Some(1));
    assert!(limited["next_cursor"].is_string(), "{limited}");
    let none = fleet
        .delta(&["runs", "ls", "--status", "completed", "--json"])
        .await
        .json();
    assert_eq!(none["runs"], serde_json::json!([]));
    let bad = fleet.delta(&["runs", "ls", "--status", "sleeping"]).await;
    assert_eq!(bad.code, 2, "a status that does not exist is a usage error");

    // runs journal: one line per event, so far.
    let j = fleet.delta(&["runs", "journal", &run]).await;
    let out = j.ok();
    assert!(
        out.lines()
            .next()
            .is_some_and(|l| l.trim_start().starts_with("1  ")),
        "{out}"
    );
    for kind in [
        "ENGINE_START",
        "THOUGHT",
        "ACTION_REQUEST",
        "ACTION_RESULT",
        "HUMAN_INPUT_REQUEST",
    ] {
        assert!(out.contains(kind), "{kind} in\n{out}");
    }
    assert!(out.contains("What is your name?"), "{out}");
    let doc = fleet
        .delta(&["runs", "journal", &run, "--json"])
        .await
        .json();
    assert_eq!(doc["run_id"], run.as_str());
    let events = doc["events"].as_array().expect("events");
    let seqs: Vec<u64> = events.iter().filter_map(|e| e["seq"].as_u64()).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>());
    assert!(
        events
            .iter()
            .all(|e| e["type"].is_string() && e["timestamp"].is_string())
    );

    // runs journal --follow, human and --json, started before the answer: they print what
    // is there, then what comes, and stop at the end of the run.
    let human = Follower::spawn(&fleet.url, &["runs", "journal", &run, "--follow"]);
    let json = Follower::spawn(&fleet.url, &["runs", "journal", &run, "--follow", "--json"]);
    human.wait_for("HUMAN_INPUT_REQUEST").await;
    json.wait_for("HUMAN_INPUT_REQUEST").await;
    // The gateway goes away mid-stream: the followers reconnect with Last-Event-ID.
    fleet.restart_gateway().await;
    let answered = fleet.delta(&["answer", &rid, "--input", "Ada"]).await;
    assert!(
        answered.ok().contains(&format!("accepted: run {run}")),
        "{}",
        answered.stdout
    );
    let human = human.finish().await;
    let out = human.ok();
    assert!(human.stderr.contains("reconnecting"), "{}", human.stderr);
    assert!(
        out.contains("HUMAN_INPUT_RECEIVED") && out.contains("from tester via cli"),
        "{out}"
    );
    assert!(out.contains("ENGINE_END"), "{out}");
    assert_eq!(
        out.lines().last(),
        Some("run COMPLETED: Greeted Ada."),
        "{out}"
    );
    let json = json.finish().await;
    let lines: Vec<Value> = json
        .ok()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let (last, journal) = lines.split_last().expect("lines");
    assert_eq!(last["status"], "COMPLETED", "{last}");
    assert_eq!(last["result"], "Greeted Ada.");
    let seqs: Vec<u64> = journal.iter().filter_map(|e| e["seq"].as_u64()).collect();
    assert_eq!(
        seqs,
        (1..=journal.len() as u64).collect::<Vec<_>>(),
        "every event once, in order"
    );
    assert_eq!(
        journal.last().map(|e| &e["type"]),
        Some(&Value::from("ENGINE_END"))
    );
    // Following a run that has ended prints its journal and its status, then stops.
    let done = fleet.delta(&["runs", "journal", &run, "--follow"]).await;
    assert!(
        done.ok().ends_with("run COMPLETED: Greeted Ada.\n"),
        "{}",
        done.stdout
    );

    // Not found: exit 4.
    let unknown = "0190aaaa-0000-7000-8000-000000000000";
    for args in [
        vec!["runs", "show", unknown],
        vec!["runs", "journal", unknown],
        vec!["runs", "journal", unknown, "--follow"],
    ] {
        fleet.delta(&args).await.refused(4, "not_found");
    }
    // Not a run id at all: usage.
    assert_eq!(fleet.delta(&["runs", "show", "nope"]).await.code, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn pending_ls_show_answer_cancel_and_queue() {
    let fleet = Fleet::start("opb", None, true).await;
    let hello = submit_and_wait(&fleet, "hello", "greet").await;
    let chooser = submit_and_wait(&fleet, "chooser", "env").await;
    let gated = submit_and_wait(&fleet, "gated", "shout").await;
    let rid = |rec: &Value| s(&rec["pending_interaction"]["request_id"]).to_owned();
    let (hello_q, chooser_q, gated_q) = (rid(&hello), rid(&chooser), rid(&gated));

    // pending ls: oldest first, a table.
    let ls = fleet.delta(&["pending", "ls"]).await;
    let out = ls.ok();
    let mut lines = out.lines();
    let header = lines.next().expect("header");
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        [
            "REQUEST", "AGENT", "TYPE", "AGE", "EXPIRES", "IN", "CLAIM", "/", "VOTES", "PROMPT"
        ]
    );
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 3, "{out}");
    assert!(rows[0].starts_with(&hello_q), "oldest first:\n{out}");
    assert!(rows[1].starts_with(&chooser_q), "oldest first:\n{out}");
    assert!(
        rows[0].contains("USER_INPUT") && rows[0].contains("What is your name?"),
        "{out}"
    );
    assert!(rows[2].contains("TOOL_APPROVAL"), "{out}");
    // Filters: agent, type (any case), age.
    let only = |doc: &Value| -> Vec<String> {
        doc["interactions"]
            .as_array()
            .expect("interactions")
            .iter()
            .map(|i| s(&i["request_id"]).to_owned())
            .collect()
    };
    let doc = fleet
        .delta(&["pending", "ls", "--agent", "chooser", "--json"])
        .await
        .json();
    assert_eq!(only(&doc), [chooser_q.as_str()]);
    let item = &doc["interactions"][0];
    for field in [
        "request_id",
        "run_id",
        "agent",
        "type",
        "state",
        "created_at",
        "expires_at",
        "request",
    ] {
        assert!(
            item.get(field).is_some(),
            "pending ls --json has {field}: {item}"
        );
    }
    assert_eq!(item["state"], "PENDING");
    let doc = fleet
        .delta(&["pending", "ls", "--type", "user_input", "--json"])
        .await
        .json();
    assert_eq!(only(&doc), [hello_q.as_str()]);
    let doc = fleet
        .delta(&["pending", "ls", "--older-than", "1h", "--json"])
        .await
        .json();
    assert_eq!(only(&doc), Vec::<String>::new());
    let empty = fleet.delta(&["pending", "ls", "--older-than", "1h"]).await;
    assert_eq!(empty.ok(), "", "nothing on stdout when there is nothing");
    assert!(
        empty.stderr.contains("no pending questions"),
        "{}",
        empty.stderr
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let doc = fleet
        .delta(&["pending", "ls", "--older-than", "1s", "--json"])
        .await
        .json();
    assert_eq!(only(&doc).len(), 3, "{doc}");
    // Pages of it: none of the three skipped or repeated, and the hint for the next page keeps
    // the filter (its cursor belongs to the filtered listing).
    let first = fleet
        .delta(&[
            "pending",
            "ls",
            "--older-than",
            "1s",
            "--limit",
            "2",
            "--json",
        ])
        .await
        .json();
    let mut paged = only(&first);
    assert_eq!(paged.len(), 2, "{first}");
    let next = first["next_cursor"]
        .as_str()
        .expect("a next page")
        .to_owned();
    let second = fleet
        .delta(&[
            "pending",
            "ls",
            "--older-than",
            "1s",
            "--limit",
            "2",
            "--cursor",
            &next,
            "--json",
        ])
        .await
        .json();
    paged.extend(only(&second));
    paged.sort();
    let mut all = only(&doc);
    all.sort();
    assert_eq!(paged, all, "{first} {second}");
    let table = fleet
        .delta(&["pending", "ls", "--older-than", "1s", "--limit", "2"])
        .await;
    assert!(
        table
            .stderr
            .contains("more: delta pending ls --older-than 1s --limit 2 --cursor "),
        "{}",
        table.stderr
    );
    assert_eq!(
        fleet
            .delta(&["pending", "ls", "--older-than", "soon"])
            .await
            .code,
        2
    );

    // pending show: the question for a person.
    let show = fleet.delta(&["pending", "show", &chooser_q]).await;
    let out = show.ok();
    for needle in [
        format!("request:  {chooser_q} (PENDING)"),
        "? Which environment should I prepare for 'env'?".into(),
        "  1) Staging [staging] - The shared test environment".into(),
        "  2) Production [production]  !! dangerous".into(),
        "  3) Something else [other]  (needs --input: Which one?)".into(),
        format!("delta answer {chooser_q} --option staging"),
    ] {
        assert!(out.contains(&needle), "{needle:?} in\n{out}");
    }
    assert!(
        !out.lines()
            .any(|l| l.contains("Staging [staging]") && l.contains("dangerous")),
        "only dangerous options are marked:\n{out}"
    );
    let show = fleet.delta(&["pending", "show", &gated_q]).await;
    let out = show.ok();
    for needle in [
        "== Approve tool call: shout ==",
        "  tool:    shout",
        "  args:    {\"text\":\"hello\"}",
        "approve",
    ] {
        assert!(out.contains(needle), "{needle:?} in\n{out}");
    }
    let view = fleet
        .delta(&["pending", "show", &gated_q, "--json"])
        .await
        .json();
    assert_eq!(view["request"]["context"]["tool"], "shout", "{view}");

    // answer: refusals first (exit 1 with the gateway's code), then the option by its number.
    fleet
        .delta(&["answer", &chooser_q, "--option", "other"])
        .await
        .refused(1, "input_required");
    fleet
        .delta(&["answer", &chooser_q, "--option", "nowhere"])
        .await
        .refused(1, "invalid_option");
    let refused_json = fleet
        .delta(&["answer", &chooser_q, "--option", "nowhere", "--json"])
        .await;
    assert_eq!(refused_json.code, 1);
    let err: Value = serde_json::from_str(&refused_json.stdout).expect("error JSON");
    assert_eq!(err["error"]["code"], "invalid_option", "{err}");
    assert!(err["error"]["message"].is_string());
    let accepted = fleet
        .delta(&["answer", &chooser_q, "--option", "1", "--json"])
        .await
        .json();
    assert_eq!(accepted["status"], "accepted", "{accepted}");
    assert_eq!(accepted["run_id"], chooser["run_id"]);
    let done = wait_status(&fleet, s(&chooser["run_id"]), "COMPLETED").await;
    assert_eq!(done["result"], "staging is ready", "option 1 is staging");
    let view = fleet
        .delta(&["pending", "show", &chooser_q, "--json"])
        .await
        .json();
    assert_eq!(view["state"], "ANSWERED");
    assert_eq!(
        view["response"]["responder"],
        serde_json::json!({"id": "tester", "via": "cli"}),
        "$USER via cli"
    );
    let shown = fleet.delta(&["pending", "show", &chooser_q]).await;
    assert!(
        shown.ok().contains("answered by tester via cli"),
        "{}",
        shown.stdout
    );
    // A second, different answer: already_resolved; an unknown request: not found.
    fleet
        .delta(&["answer", &chooser_q, "--option", "production"])
        .await
        .refused(1, "already_resolved");
    let unknown = "0190aaaa-0000-7000-8000-000000000000";
    fleet
        .delta(&["answer", unknown, "--input", "x"])
        .await
        .refused(4, "not_found");
    fleet
        .delta(&["pending", "show", unknown])
        .await
        .refused(4, "not_found");
    // Nothing to answer with: usage.
    let nothing = fleet.delta(&["answer", &hello_q]).await;
    assert_eq!(nothing.code, 2, "{}", nothing.stderr);
    // Rejecting a tool call with a reason.
    let rejected = fleet
        .delta(&[
            "answer", &gated_q, "--option", "reject", "--input", "too loud",
        ])
        .await;
    rejected.ok();

    // cancel: the waiting hello run ends CANCELLED and its question closes.
    let hello_run = s(&hello["run_id"]).to_owned();
    let cancelled = fleet
        .delta(&["cancel", &hello_run, "--reason", "not needed"])
        .await;
    assert_eq!(cancelled.ok().trim(), format!("run {hello_run} CANCELLED"));
    let rec = fleet
        .delta(&["runs", "show", &hello_run, "--json"])
        .await
        .json();
    assert_eq!(rec["status"], "CANCELLED");
    assert!(s(&rec["error"]).contains("not needed"), "{rec}");
    let view = fleet
        .delta(&["pending", "show", &hello_q, "--json"])
        .await
        .json();
    assert_eq!(view["state"], "CANCELLED");
    fleet
        .delta(&["cancel", &hello_run])
        .await
        .refused(1, "already_resolved");
    fleet
        .delta(&["cancel", unknown])
        .await
        .refused(4, "not_found");
    let run = fleet
        .delta(&["submit", "--agent", "hello", "--task", "bye", "--json"])
        .await
        .json();
    let doc = fleet
        .delta(&["cancel", s(&run["run_id"]), "--json"])
        .await
        .json();
    assert_eq!(doc["status"], "CANCELLED", "{doc}");
    assert_eq!(doc["run_id"], run["run_id"]);

    // queue: the figures and the workers seen.
    let q = fleet.delta(&["queue"]).await;
    let out = q.ok();
    let mut lines = out.lines();
    assert_eq!(
        lines
            .next()
            .map(|h| h.split_whitespace().collect::<Vec<_>>()),
        Some(vec![
            "PENDING",
            "IN",
            "FLIGHT",
            "REDELIVERED",
            "DEAD-LETTERED",
            "WORKERS"
        ])
    );
    assert!(out.contains("WORKER  LAST SEEN"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("w0  ") && l.ends_with(" ago")),
        "{out}"
    );
    let doc = fleet.delta(&["queue", "--json"]).await.json();
    for field in [
        "jobs_pending",
        "jobs_in_flight",
        "jobs_redelivered",
        "dead_lettered",
    ] {
        assert!(doc[field].is_u64(), "queue --json has {field}: {doc}");
    }
    assert_eq!(doc["workers"][0]["worker_id"], "w0", "{doc}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sensitive_answer_is_read_without_echo_and_never_shown() {
    let fleet = Fleet::start("opc", None, true).await;
    let rec = submit_and_wait(&fleet, "secret", "key").await;
    let run = s(&rec["run_id"]).to_owned();
    let rid = s(&rec["pending_interaction"]["request_id"]).to_owned();
    let show = fleet.delta(&["pending", "show", &rid]).await;
    assert!(show.ok().contains("sensitive"), "{}", show.stdout);
    let canary = "canary-0p3r4t0r-77";
    // No --input: the CLI asks for it (here on a pipe; on a terminal, without echo).
    let answered = delta(
        &fleet.url,
        None,
        &["answer", &rid],
        Some(&format!("{canary}\n")),
    )
    .await;
    answered.ok();
    assert!(
        answered.stderr.contains("(hidden) > "),
        "{}",
        answered.stderr
    );
    for out in [&answered.stdout, &answered.stderr] {
        assert!(!out.contains(canary), "the answer is printed: {out}");
    }
    wait_status(&fleet, &run, "COMPLETED").await;
    for args in [
        vec!["pending", "show", rid.as_str()],
        vec!["pending", "show", rid.as_str(), "--json"],
        vec!["runs", "journal", run.as_str()],
        vec!["runs", "journal", run.as_str(), "--json"],
        vec!["runs", "show", run.as_str(), "--json"],
    ] {
        let r = fleet.delta(&args).await;
        assert!(
            !r.ok().contains(canary),
            "{args:?} shows the secret: {}",
            r.stdout
        );
    }
    let view = fleet
        .delta(&["pending", "show", &rid, "--json"])
        .await
        .json();
    assert_eq!(view["response"]["input"], "***");
    // A sensitive question with nothing typed: usage, nothing sent.
    let rec = submit_and_wait(&fleet, "secret", "again").await;
    let rid = s(&rec["pending_interaction"]["request_id"]).to_owned();
    let empty = delta(&fleet.url, None, &["answer", &rid], Some("")).await;
    assert_eq!(empty.code, 2, "{}", empty.stderr);
    let view = fleet
        .delta(&["pending", "show", &rid, "--json"])
        .await
        .json();
    assert_eq!(view["state"], "PENDING");
}

fn tokens_file(dir: &Path) -> PathBuf {
    let f = dir.join("tokens.yaml");
    std::fs::write(
        &f,
        "- name: alice\n  token: alice-token-0123456789\n  roles: [answer]\n\
         - name: ops\n  token: ops-token-0123456789abc\n  roles: [operate]\n",
    )
    .expect("tokens");
    f
}

#[tokio::test(flavor = "multi_thread")]
async fn delta_token_is_sent_and_names_the_responder() {
    let dir = tempfile::tempdir().expect("tmp");
    let tokens = tokens_file(dir.path());
    let fleet = Fleet::start("opd", Some(&tokens), true).await;
    let ops = Some("ops-token-0123456789abc");
    let alice = Some("alice-token-0123456789");
    // No token: unauthorized (exit 1, the gateway's code and message).
    let anon = delta(&fleet.url, None, &["queue"], None).await;
    anon.refused(1, "unauthorized");
    assert!(anon.stderr.contains("Bearer"), "{}", anon.stderr);
    // DELTA_TOKEN is sent; so is --token.
    delta(&fleet.url, ops, &["queue"], None).await.ok();
    delta(
        &fleet.url,
        None,
        &["queue", "--token", "ops-token-0123456789abc"],
        None,
    )
    .await
    .ok();
    // A role the token lacks: forbidden.
    delta(&fleet.url, alice, &["queue"], None)
        .await
        .refused(1, "forbidden");
    delta(
        &fleet.url,
        alice,
        &["submit", "--agent", "hello", "--task", "x"],
        None,
    )
    .await
    .refused(1, "forbidden");
    // The token's name is the responder, whatever $USER says.
    let rec = delta(
        &fleet.url,
        ops,
        &[
            "submit", "--agent", "hello", "--task", "greet", "--wait", "--json",
        ],
        None,
    )
    .await
    .json();
    let rid = s(&rec["pending_interaction"]["request_id"]).to_owned();
    let listed = delta(&fleet.url, alice, &["pending", "ls", "--json"], None)
        .await
        .json();
    assert_eq!(listed["interactions"][0]["request_id"], rid.as_str());
    delta(
        &fleet.url,
        alice,
        &["answer", &rid, "--input", "Alice"],
        None,
    )
    .await
    .ok();
    let view = delta(
        &fleet.url,
        alice,
        &["pending", "show", &rid, "--json"],
        None,
    )
    .await
    .json();
    assert_eq!(
        view["response"]["responder"],
        serde_json::json!({"id": "alice", "via": "cli"})
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_gateway_is_exit_5_with_the_url() {
    // Nobody listens on this port.
    let port = delta_e2e::free_port().expect("port");
    let url = format!("http://127.0.0.1:{port}");
    let some_id = "0190aaaa-0000-7000-8000-000000000000";
    for args in [
        vec!["submit", "--agent", "hello", "--task", "x"],
        vec!["runs", "ls"],
        vec!["runs", "show", some_id],
        vec!["runs", "journal", some_id, "--follow"],
        vec!["pending", "ls"],
        vec!["pending", "show", some_id],
        vec!["answer", some_id, "--input", "x"],
        vec!["cancel", some_id],
        vec!["queue"],
    ] {
        let r = delta(&url, None, &args, None).await;
        assert_eq!(r.code, 5, "{args:?}: {}", r.stderr);
        assert!(
            r.stderr.contains(&url),
            "{args:?} names the URL: {}",
            r.stderr
        );
        assert!(
            r.stderr.contains("DELTA_GATEWAY_URL"),
            "{args:?}: {}",
            r.stderr
        );
    }
    let r = delta(&url, None, &["queue", "--json"], None).await;
    assert_eq!(r.code, 5);
    let doc: Value = serde_json::from_str(&r.stdout).expect("error JSON");
    assert_eq!(doc["error"]["code"], "unreachable", "{doc}");
    // A malformed URL is a usage error.
    assert_eq!(delta("not a url", None, &["queue"], None).await.code, 2);

    // A gateway that answers 503 (its Redis is gone) is unreachable too.
    let mut fleet = Fleet::start("ope", None, false).await;
    fleet.delta(&["runs", "ls"]).await.ok();
    fleet.inner.redis.process().kill_now();
    let r = delta(&fleet.url, None, &["runs", "ls"], None).await;
    assert_eq!(r.code, 5, "{}", r.stderr);
    assert!(r.stderr.starts_with("error: unavailable:"), "{}", r.stderr);
}

/// Polls `delta dlq ls --json` until it lists `n` dead letters; returns them.
async fn wait_letters(fleet: &Fleet, n: usize) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let doc = fleet.delta(&["dlq", "ls", "--json"]).await.json();
        let letters = doc["dead_letters"].as_array().cloned().unwrap_or_default();
        if letters.len() == n {
            return letters;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never {n} dead letters: {doc}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn dlq_ls_retry_and_drop_bring_dead_lettered_runs_back() {
    let fleet = Fleet::start("opd", None, true).await;
    // An agent whose config the worker cannot read (the gateway only checks that it exists):
    // its runs are poison, dead-lettered and FAILED.
    let dir = fleet.gateway_spec.agents_dir.join("fragile");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("config.yaml"), "name: fragile\nbrain: [unclosed\n").expect("config");
    let mut runs = vec![];
    for task in ["one", "two"] {
        let doc = fleet
            .delta(&["submit", "--agent", "fragile", "--task", task, "--json"])
            .await
            .json();
        runs.push(s(&doc["run_id"]).to_owned());
    }
    for run in &runs {
        let rec = wait_status(&fleet, run, "FAILED").await;
        assert!(s(&rec["error"]).contains("fragile"), "{rec}");
    }
    // And a message on the job subject that is not a job at all.
    let nats = delta_e2e::nats_client(&fleet.nats.url()).await;
    let js = async_nats::jetstream::new(nats);
    js.publish("opd.jobs.hello", "not json".into())
        .await
        .expect("publish")
        .await
        .expect("ack");
    let letters = wait_letters(&fleet, 3).await;

    // ls: a table for people, the documented JSON for scripts, a filter by agent.
    let out = fleet.delta(&["dlq", "ls"]).await.ok().to_owned();
    let header: Vec<&str> = out
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["SEQ", "AGENT", "RUN", "RUN", "STATUS", "AGE", "REASON"],
        "{out}"
    );
    for run in &runs {
        assert!(
            out.lines()
                .any(|l| l.contains(run.as_str()) && l.contains("FAILED (retryable)")),
            "{out}"
        );
    }
    assert!(out.contains("(not a job)"), "{out}");
    let junk = letters
        .iter()
        .find(|l| l["run_id"].is_null())
        .expect("the junk message is listed");
    assert_eq!(junk["agent"], "hello");
    assert_eq!(junk["payload"], "not json");
    assert_eq!(junk["retryable"], false);
    assert!(!s(&junk["reason"]).is_empty(), "{junk}");
    for l in letters.iter().filter(|l| !l["run_id"].is_null()) {
        assert_eq!(l["agent"], "fragile");
        assert_eq!(l["run_status"], "FAILED");
        assert_eq!(l["retryable"], true);
        assert_eq!(l["kind"], "start");
        assert!(
            l["job_seq"].is_u64() && l["dead_lettered_at"].is_string(),
            "{l}"
        );
    }
    let fragile = fleet
        .delta(&["dlq", "ls", "--agent", "fragile", "--json"])
        .await
        .json();
    assert_eq!(fragile["dead_letters"].as_array().map(Vec::len), Some(2));
    let page = fleet
        .delta(&["dlq", "ls", "--limit", "1", "--json"])
        .await
        .json();
    assert_eq!(page["dead_letters"].as_array().map(Vec::len), Some(1));
    let next = s(&page["next_cursor"]).to_owned();
    let rest = fleet
        .delta(&["dlq", "ls", "--cursor", &next, "--json"])
        .await
        .json();
    assert_eq!(rest["dead_letters"].as_array().map(Vec::len), Some(2));
    assert_ne!(
        rest["dead_letters"][0]["seq"],
        page["dead_letters"][0]["seq"]
    );

    // Refusals: a letter with no run, one that does not exist, a sequence that is not one.
    let junk_seq = junk["seq"].to_string();
    fleet
        .delta(&["dlq", "retry", &junk_seq])
        .await
        .refused(1, "not_retryable");
    fleet
        .delta(&["dlq", "retry", "999"])
        .await
        .refused(4, "not_found");
    assert_eq!(fleet.delta(&["dlq", "retry", "0"]).await.code, 2);
    assert_eq!(fleet.delta(&["dlq", "retry"]).await.code, 2);
    assert_eq!(
        wait_letters(&fleet, 3).await.len(),
        3,
        "refusals change nothing"
    );

    // The cause mended, a retry puts the run back in the queue and it completes.
    std::fs::write(dir.join("config.yaml"), "name: fragile\nbrain: scripted\n").expect("config");
    std::fs::write(dir.join("script.yaml"), "steps:\n  - finish: \"mended\"\n").expect("script");
    let first = letters
        .iter()
        .find(|l| l["run_id"] == runs[0].as_str())
        .expect("listed");
    let seq = first["seq"].to_string();
    let reply = fleet.delta(&["dlq", "retry", &seq]).await;
    assert!(
        reply
            .ok()
            .contains(&format!("dead letter {seq}: run {} requeued", runs[0])),
        "{}",
        reply.stdout
    );
    let rec = wait_status(&fleet, &runs[0], "COMPLETED").await;
    assert_eq!(rec["result"], "mended");
    let journal = fleet
        .delta(&["runs", "journal", &runs[0], "--json"])
        .await
        .json();
    let events = journal["events"].as_array().cloned().unwrap_or_default();
    let retried = events
        .iter()
        .position(|e| {
            e["type"] == "SYSTEM_MESSAGE"
                && s(&e["payload"]["content"]).starts_with("retried from the dead-letter queue by")
        })
        .expect("the retry is journaled");
    assert!(
        events[retried + 1..]
            .iter()
            .any(|e| e["type"] == "ENGINE_START"),
        "a new attempt starts after the retry: {journal}"
    );
    assert_eq!(
        events.last().map(|e| &e["type"]),
        Some(&Value::from("ENGINE_END"))
    );
    // The letter is gone: a second retry finds nothing.
    fleet
        .delta(&["dlq", "retry", &seq])
        .await
        .refused(4, "not_found");

    // --all retries every retryable letter (not the junk), --json for scripts.
    let doc = fleet
        .delta(&["dlq", "retry", "--all", "--json"])
        .await
        .json();
    let done = doc["done"].as_array().cloned().unwrap_or_default();
    assert_eq!(done.len(), 1, "{doc}");
    assert_eq!(done[0]["run_id"], runs[1].as_str());
    assert_eq!(done[0]["status"], "requeued");
    wait_status(&fleet, &runs[1], "COMPLETED").await;

    // drop removes what cannot be retried.
    let out = fleet.delta(&["dlq", "drop", &junk_seq]).await;
    assert_eq!(out.ok(), format!("dead letter {junk_seq}: dropped\n"));
    fleet
        .delta(&["dlq", "drop", &junk_seq])
        .await
        .refused(4, "not_found");
    let empty = fleet.delta(&["dlq", "ls"]).await;
    assert_eq!(empty.ok(), "");
    assert!(empty.stderr.contains("no dead letters"), "{}", empty.stderr);
    let q = fleet.delta(&["queue", "--json"]).await.json();
    assert_eq!(q["dead_lettered"], 0, "{q}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_typed_question_is_shown_with_its_data_example_and_answered_with_data() {
    let fleet = Fleet::start("opt", None, true).await;
    fleet.add_agent(
        "typed_secret",
        "name: typed_secret\nbrain: scripted\n",
        "steps:\n  - ask_human:\n      prompt: \"Login?\"\n      sensitive: true\n      response_schema: {type: object, properties: {user: {type: string}, pin: {type: string, minLength: 4}}, required: [user, pin]}\n  - finish: \"in as ${answer.user}\"\n",
    );
    let rec = submit_and_wait(&fleet, "intake", "q3").await;
    let run = s(&rec["run_id"]).to_owned();
    let rid = s(&rec["pending_interaction"]["request_id"]).to_owned();
    let show = fleet.delta(&["pending", "show", &rid]).await;
    for line in [
        "fields (answer with --data, a JSON object):",
        "  copies (required): Copies - integer 1 to 5",
        "  env (required): Environment - one of staging, production",
        &format!("delta answer {rid} --data '{{\"copies\":1,"),
    ] {
        assert!(show.ok().contains(line), "{line}: {}", show.stdout);
    }
    let bad = fleet
        .delta(&[
            "answer",
            &rid,
            "--data",
            r#"{"email": "ada", "copies": 1, "env": "staging"}"#,
        ])
        .await;
    bad.refused(1, "invalid_data");
    assert!(bad.stderr.contains("field `email`"), "{}", bad.stderr);
    let view = fleet
        .delta(&["pending", "show", &rid, "--json"])
        .await
        .json();
    assert_eq!(view["state"], "PENDING");
    fleet
        .delta(&[
            "answer",
            &rid,
            "--data",
            r#"{"email": "ada@example.com", "copies": 4, "env": "staging"}"#,
        ])
        .await
        .ok();
    let done = wait_status(&fleet, &run, "COMPLETED").await;
    assert_eq!(
        done["result"], "ada@example.com gets 4 on staging",
        "{done}"
    );

    // A sensitive typed question takes its `--data` too: nothing is asked on the terminal, and
    // the answer never shows.
    let rec = submit_and_wait(&fleet, "typed_secret", "in").await;
    let run = s(&rec["run_id"]).to_owned();
    let rid = s(&rec["pending_interaction"]["request_id"]).to_owned();
    let answered = delta(
        &fleet.url,
        None,
        &[
            "answer",
            &rid,
            "--data",
            r#"{"user": "ada", "pin": "c4n4ry-77"}"#,
        ],
        Some(""),
    )
    .await;
    answered.ok();
    assert!(!answered.stderr.contains("(hidden)"), "{}", answered.stderr);
    assert!(
        answered
            .stderr
            .contains("warning: this question is sensitive"),
        "{}",
        answered.stderr
    );
    let done = wait_status(&fleet, &run, "COMPLETED").await;
    assert!(!done.to_string().contains("c4n4ry-77"), "{done}");
    // `--data -` reads it from stdin instead (no flag to show it); what is not JSON is refused
    // without quoting it back.
    let rec = submit_and_wait(&fleet, "typed_secret", "in").await;
    let stdin_run = s(&rec["run_id"]).to_owned();
    let stdin_rid = s(&rec["pending_interaction"]["request_id"]).to_owned();
    let refused = delta(
        &fleet.url,
        None,
        &["answer", &stdin_rid, "--data", "-"],
        Some("{\"user\": \"ada\", \"pin\": c4n4ry-78\n"),
    )
    .await;
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(!refused.stderr.contains("c4n4ry-78"), "{}", refused.stderr);
    let answered = delta(
        &fleet.url,
        None,
        &["answer", &stdin_rid, "--data", "-"],
        Some("{\"user\": \"ada\", \"pin\": \"c4n4ry-79\"}\n"),
    )
    .await;
    answered.ok();
    assert!(answered.stderr.contains("(hidden)"), "{}", answered.stderr);
    assert!(!answered.stderr.contains("warning"), "{}", answered.stderr);
    let done = wait_status(&fleet, &stdin_run, "COMPLETED").await;
    assert!(!done.to_string().contains("c4n4ry-79"), "{done}");
    let view = fleet
        .delta(&["pending", "show", &rid, "--json"])
        .await
        .json();
    assert_eq!(view["response"]["data"], "***");
}

/// `delta claim` takes, shows and gives back a claim; `delta answer` on a question that needs
/// two approvals counts a vote and says so; `pending ls` and `pending show` show both; an
/// answer pinned to another version of the question (`--request-hash`) is refused `stale`.
#[tokio::test(flavor = "multi_thread")]
async fn claim_and_vote_from_the_terminal() {
    let fleet = Fleet::start("opq", None, true).await;
    fleet.add_agent(
        "council",
        "name: council\nbrain: scripted\n",
        "steps:\n  - ask_human:\n      prompt: \"Ship it?\"\n      approvals: {min: 2}\n      options:\n        - {id: ship, label: Ship, action: APPROVE_AND_EXECUTE}\n        - {id: stop, label: Stop, action: REJECT_WITH_REASON}\n  - finish: \"${answer}\"\n",
    );
    let rec = submit_and_wait(&fleet, "council", "ship").await;
    let rid = s(&rec["pending_interaction"]["request_id"]).to_owned();
    let run = s(&rec["run_id"]).to_owned();

    let out = fleet.delta(&["claim", &rid]).await;
    let said = out.ok();
    assert!(
        said.contains("claimed") && said.contains("tester"),
        "{said}"
    );
    let ls = fleet.delta(&["pending", "ls"]).await;
    assert!(
        ls.ok().contains("tester (4m); 0/2 approvals")
            || ls.ok().contains("tester (5m); 0/2 approvals"),
        "{}",
        ls.ok()
    );
    let shown = fleet.delta(&["pending", "show", &rid]).await;
    let text = shown.ok();
    assert!(text.contains("claimed:  by tester until"), "{text}");
    assert!(
        text.contains("approvals: 2 of anyone who may answer"),
        "{text}"
    );
    let hash = text
        .lines()
        .find_map(|l| l.strip_prefix("hash:"))
        .map(|h| h.trim().to_owned())
        .expect("a hash line");
    assert_eq!(hash.len(), 64, "{text}");
    // Someone else (over HTTP) is held off while tester holds it.
    let (s2, body) = fleet
        .answer(
            &rid,
            json!({"option_id": "ship", "responder": {"id": "bob"}}),
        )
        .await;
    assert_eq!(
        (s2, body["error"]["code"].as_str()),
        (409, Some("claimed")),
        "{body}"
    );
    // A vote pinned to another version of the question is stale; the right one is counted.
    let other = "0".repeat(64);
    fleet
        .delta(&["answer", &rid, "--option", "ship", "--request-hash", &other])
        .await
        .refused(1, "stale");
    let out = fleet
        .delta(&["answer", &rid, "--option", "ship", "--request-hash", &hash])
        .await;
    let said = out.ok();
    assert!(
        said.contains("vote counted: 1 of 2 approvals (tester)"),
        "{said}"
    );
    let doc = fleet
        .delta(&["pending", "show", &rid, "--json"])
        .await
        .json();
    assert_eq!(doc["tally"]["approved_by"], json!(["tester"]));
    let out = fleet.delta(&["claim", &rid, "--release"]).await;
    assert!(out.ok().contains("released"), "{}", out.stdout);
    let (s2, body) = fleet
        .answer(
            &rid,
            json!({"option_id": "ship", "responder": {"id": "bob"}}),
        )
        .await;
    assert_eq!((s2, &body["status"]), (200, &json!("accepted")), "{body}");
    wait_status(&fleet, &run, "COMPLETED").await;
    fleet
        .delta(&["claim", &rid])
        .await
        .refused(1, "already_resolved");
}

/// `delta delegations add|ls|rm`: a delegation made for 8 hours, listed as a table and as JSON,
/// ended; a bad `--until` is a usage error.
#[tokio::test(flavor = "multi_thread")]
async fn delegations_are_added_listed_and_removed_from_the_terminal() {
    let fleet = Fleet::start("opd", None, false).await;
    let out = fleet
        .delta(&[
            "delegations",
            "add",
            "--from",
            "alice",
            "--to",
            "bob",
            "--until",
            "8h",
            "--reason",
            "on leave",
        ])
        .await;
    let said = out.ok();
    assert!(
        said.starts_with("delegated: bob may answer what alice may until"),
        "{said}"
    );
    let ls = fleet.delta(&["delegations", "ls"]).await;
    let table = ls.ok();
    let header: Vec<&str> = table
        .lines()
        .next()
        .expect("header")
        .split_whitespace()
        .collect();
    assert_eq!(header, ["ID", "FROM", "TO", "UNTIL", "IN", "REASON"]);
    assert!(
        table.contains("alice") && table.contains("on leave"),
        "{table}"
    );
    assert!(table.contains("7h") || table.contains("8h"), "{table}");
    let doc = fleet.delta(&["delegations", "ls", "--json"]).await.json();
    let id = s(&doc["delegations"][0]["id"]).to_owned();
    assert_eq!(doc["delegations"][0]["to"], "bob");
    assert_eq!(
        fleet
            .delta(&["delegations", "add", "--to", "bob", "--until", "soon"])
            .await
            .code,
        2
    );
    let out = fleet.delta(&["delegations", "rm", &id]).await;
    assert!(
        out.ok().contains("ended: bob no longer answers for alice"),
        "{}",
        out.stdout
    );
    let empty = fleet.delta(&["delegations", "ls"]).await;
    assert_eq!(empty.ok(), "");
    assert!(
        empty.stderr.contains("no delegations in force"),
        "{}",
        empty.stderr
    );
    fleet
        .delta(&["delegations", "rm", &id])
        .await
        .refused(4, "not_found");
}

#[tokio::test(flavor = "multi_thread")]
async fn grants_ls_and_revoke_after_an_answer_with_grant() {
    let fleet = Fleet::start("opg", None, true).await;
    fleet.add_agent(
        "shipit",
        "name: shipit\nbrain: scripted\ntools:\n  - name: deploy\n    exec: \"echo deployed ${env}\"\n    approval: always\n",
        "steps:\n  - tool: deploy\n    args: {env: \"${task}\"}\n  - finish: \"${observation}\"\n",
    );
    // Nothing yet: an empty list, said on stderr.
    let none = fleet.delta(&["grants", "ls"]).await;
    assert_eq!(
        (none.code, none.stdout.as_str()),
        (0, ""),
        "{}",
        none.stderr
    );
    assert!(none.stderr.contains("no grants"), "{}", none.stderr);
    // Approve with --grant agent: the next run of the agent asks nothing.
    let rec = submit_and_wait(&fleet, "shipit", "staging").await;
    let rid = s(&rec["pending_interaction"]["request_id"]).to_owned();
    let shown = fleet.delta(&["pending", "show", &rid]).await;
    assert!(
        shown.ok().contains(&format!(
            "delta answer {rid} --option approve --grant run|agent"
        )),
        "{}",
        shown.stdout
    );
    fleet
        .delta(&["answer", &rid, "--option", "approve", "--grant", "agent"])
        .await
        .ok();
    wait_status(&fleet, s(&rec["run_id"]), "COMPLETED").await;
    let next = fleet
        .delta(&["submit", "--agent", "shipit", "--task", "staging", "--json"])
        .await
        .json();
    wait_status(&fleet, s(&next["run_id"]), "COMPLETED").await;
    // The table, for people.
    let table = fleet.delta(&["grants", "ls", "--agent", "shipit"]).await;
    let text = table.ok();
    let header = text.lines().next().unwrap_or_default();
    for col in [
        "ID", "AGENT", "TOOL", "SCOPE", "STATE", "USES", "BY", "ARGS",
    ] {
        assert!(header.contains(col), "{header}");
    }
    let row = text.lines().nth(1).unwrap_or_default();
    for cell in [
        rid.as_str(),
        "shipit",
        "deploy",
        "agent",
        "active",
        "tester",
        "env = \"staging\"",
    ] {
        assert!(row.contains(cell), "`{cell}` in {row}");
    }
    // --json: the gateway's document as is.
    let listed = fleet.delta(&["grants", "ls", "--json"]).await.json();
    assert_eq!(listed["grants"][0]["grant_id"], rid.as_str());
    assert_eq!(listed["grants"][0]["uses"], 1);
    // Revoke: then the agent asks again; a bad id is usage, an unknown one not found.
    let out = fleet.delta(&["grants", "revoke", &rid]).await;
    assert!(
        out.ok().contains(&format!("grant {rid} revoked")),
        "{}",
        out.stdout
    );
    let listed = fleet.delta(&["grants", "ls", "--json"]).await.json();
    assert_eq!(
        listed["grants"],
        serde_json::json!([]),
        "only active ones by default"
    );
    let all = fleet
        .delta(&["grants", "ls", "--state", "all", "--json"])
        .await
        .json();
    assert_eq!(all["grants"][0]["state"], "REVOKED");
    submit_and_wait(&fleet, "shipit", "staging").await;
    let bad = fleet.delta(&["grants", "revoke", "nope"]).await;
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    let unknown = "01a20df5-3992-715c-a637-975c95594e0f";
    fleet
        .delta(&["grants", "revoke", unknown])
        .await
        .refused(4, "not_found");
}
