//! The engine against the real file store: pauses, answers, every option action, replay after a
//! crash at every event, secrets.

use std::path::{Path, PathBuf};

use delta_engine::agent::Agent;
use delta_engine::brain::AnyBrain;
use delta_engine::engine::{Engine, Error, Outcome, PauseMode, Settings};
use delta_protocol::journal::Snapshot;
use delta_protocol::{
    ActionStatus, Event, HumanInputReceived, InteractionRequest, InteractionResponse,
    InteractionType, JournalEvent, OptionAction, Plan, Responder, RiskLevel, RunId, RunStatus, Via,
};
use delta_store::file::FileRunStore;
use delta_store::{RunRecord, RunStore, StoredRun};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

struct Fixture {
    dir: tempfile::TempDir,
    agent: Agent,
    brain: AnyBrain,
    store: FileRunStore,
}

const TOOLS: &str = r#"
tools:
  - name: echo
    exec: "echo ${text}"
    idempotent: true
  - name: count
    shell: "echo x >> counter; echo counted ${label}"
    idempotent: true
  - name: record
    shell: "echo ${line} >> records; echo recorded"
  - name: deploy
    exec: "echo deploying ${target}"
    approval: always
    dangerous: true
  - name: use_key
    shell: "echo using ${key}; test ${key} = hunter2"
    parameters: [{name: key, secret: true}]
  - name: slow
    exec: "sleep ${secs}"
    idempotent: true
"#;

impl Fixture {
    fn new(script: &str) -> Fixture {
        Self::with_config(&format!("name: t\nbrain: scripted\n{TOOLS}"), script)
    }

    fn with_config(config: &str, script: &str) -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let agent_dir = dir.path().join("agent");
        std::fs::create_dir_all(&agent_dir).expect("mkdir");
        std::fs::write(agent_dir.join("config.yaml"), config).expect("write");
        std::fs::write(agent_dir.join("script.yaml"), script).expect("write");
        let agent = Agent::load(&agent_dir).expect("agent loads");
        let brain = AnyBrain::for_agent(&agent).expect("brain");
        let store = FileRunStore::new(dir.path().join(".delta"));
        Fixture {
            dir,
            agent,
            brain,
            store,
        }
    }

    fn work(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    async fn start(&self, task: &str) -> RunId {
        let rec = RunRecord::new(RunId::new(), self.agent.name(), task, RunStatus::Running);
        let id = rec.run_id;
        self.store.create(rec).await.expect("create");
        id
    }

    async fn engine(&self, id: RunId) -> Engine<'_, FileRunStore, AnyBrain> {
        let run = self.store.load(id).await.expect("load");
        self.engine_for(run, CancellationToken::new())
    }

    fn engine_for(
        &self,
        run: StoredRun,
        cancel: CancellationToken,
    ) -> Engine<'_, FileRunStore, AnyBrain> {
        let settings = Settings {
            worker: "local".into(),
            work_dir: self.work(),
            pause: PauseMode::Park,
        };
        Engine::new(&self.agent, &self.brain, &self.store, run, settings, cancel)
    }

    /// Run `id` (task `task`) as a crash right after `events` leaves it on disk: its record
    /// `RUNNING` and the journal prefix.
    async fn crashed_after(&self, id: RunId, task: &str, events: &[JournalEvent]) {
        self.store
            .create(RunRecord::new(id, "t", task, RunStatus::Running))
            .await
            .expect("create");
        let prefix: String = events
            .iter()
            .map(delta_protocol::journal::to_line)
            .collect();
        std::fs::write(self.store.execution_dir(id).join("journal.jsonl"), prefix)
            .expect("write prefix");
    }

    /// `run` as a resume from a snapshot reads it: the snapshot an engine that had read the
    /// first `at(len)` events would store, and the events after them.
    fn snapshotted(&self, run: StoredRun, at: At) -> StoredRun {
        let n = at(run.journal.len()).min(run.journal.len());
        if n == 0 {
            return run;
        }
        let head = StoredRun::whole(run.record.clone(), run.journal[..n].to_vec());
        let waits_on = head.replay().pending().cloned();
        let snapshot = self
            .engine_for(head, CancellationToken::new())
            .snapshot()
            .expect("a scripted brain's run has a snapshot");
        assert_eq!(snapshot.seq, run.journal[n - 1].seq);
        // As a store keeps it: encoded, the question waited on named by its id, and decoded
        // with the store's copy of that question.
        let stored = snapshot.encode();
        let snapshot = Snapshot::decode(&stored, snapshot.seq, waits_on.as_ref())
            .expect("a snapshot reads back");
        StoredRun {
            record: run.record,
            journal: run.journal[n..].to_vec(),
            snapshot: Some(snapshot),
        }
    }

    /// An engine in hold mode (like `-i`): answers arrive in this process, secrets stay in it.
    async fn holding_engine(&self, id: RunId) -> Engine<'_, FileRunStore, AnyBrain> {
        let run = self.store.load(id).await.expect("load");
        let settings = Settings {
            worker: "local".into(),
            work_dir: self.work(),
            pause: PauseMode::Hold,
        };
        Engine::new(
            &self.agent,
            &self.brain,
            &self.store,
            run,
            settings,
            CancellationToken::new(),
        )
    }

    async fn journal(&self, id: RunId) -> Vec<JournalEvent> {
        FileRunStore::new(self.dir.path().join(".delta"))
            .load(id)
            .await
            .expect("load")
            .journal
    }

    fn counter(&self, file: &str) -> usize {
        std::fs::read_to_string(self.dir.path().join(file))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }
}

fn answer(
    q: &InteractionRequest,
    option: Option<&str>,
    input: Option<&str>,
) -> InteractionResponse {
    InteractionResponse {
        request_id: q.request_id,
        option_id: option.map(str::to_owned),
        input: input.map(str::to_owned),
        data: None,
        feedback: None,
        responder: Responder {
            id: "tester".into(),
            via: Via::File,
            on_behalf_of: None,
            relayed_by: None,
        },
        request_hash: None,
    }
}

fn paused(o: Outcome) -> InteractionRequest {
    match o {
        Outcome::Paused(q) => *q,
        other => panic!("expected a pause, got {other:?}"),
    }
}

fn types(journal: &[JournalEvent]) -> Vec<&'static str> {
    journal.iter().map(|e| e.event.type_name()).collect()
}

fn received(journal: &[JournalEvent]) -> Vec<HumanInputReceived> {
    journal
        .iter()
        .filter_map(|e| match &e.event {
            Event::HumanInputReceived(r) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

fn plans(journal: &[JournalEvent]) -> Vec<Plan> {
    journal
        .iter()
        .filter_map(|e| match &e.event {
            Event::Plan(p) => Some(p.clone()),
            _ => None,
        })
        .collect()
}

fn results(journal: &[JournalEvent]) -> Vec<(ActionStatus, String)> {
    journal
        .iter()
        .filter_map(|e| match &e.event {
            Event::ActionResult(r) => Some((r.status, r.observation_content.clone())),
            _ => None,
        })
        .collect()
}

const HELLO: &str = r#"
steps:
  - think: "task: ${task}"
  - tool: echo
    args: {text: "hello ${task}"}
  - ask_human: {prompt: "name?"}
  - tool: echo
    args: {text: "hi ${answer}"}
  - finish: "greeted ${answer}"
"#;

#[tokio::test]
async fn a_run_pauses_for_a_human_and_completes_with_the_answer() {
    let f = Fixture::new(HELLO);
    let id = f.start("world").await;
    let q = paused(f.engine(id).await.advance(None).await.expect("advance"));
    assert_eq!(q.kind, InteractionType::UserInput);
    assert_eq!(q.prompt, "name?");
    assert_eq!(q.run_id, id);
    let rec = f.store.load(id).await.expect("load").record;
    assert_eq!(rec.status, RunStatus::WaitingForInput);
    assert_eq!(rec.pending_request_id, Some(q.request_id));

    // Re-running without an answer changes nothing.
    let before = f.journal(id).await;
    let again = paused(f.engine(id).await.advance(None).await.expect("advance"));
    assert_eq!(again.request_id, q.request_id);
    assert_eq!(f.journal(id).await, before);

    let out = f
        .engine(id)
        .await
        .advance(Some(answer(&q, None, Some("Ada"))))
        .await
        .expect("advance");
    assert_eq!(
        out,
        Outcome::Completed {
            result: "greeted Ada".into()
        }
    );
    let j = f.journal(id).await;
    assert_eq!(
        types(&j),
        [
            "ENGINE_START",
            "THOUGHT",
            "THOUGHT",
            "ACTION_REQUEST",
            "ACTION_RESULT",
            "THOUGHT",
            "ACTION_REQUEST",
            "HUMAN_INPUT_REQUEST",
            "ENGINE_END",
            "ENGINE_START",
            "HUMAN_INPUT_RECEIVED",
            "ACTION_RESULT",
            "THOUGHT",
            "ACTION_REQUEST",
            "ACTION_RESULT",
            "ENGINE_END"
        ]
    );
    let r = results(&j);
    assert_eq!(r[0], (ActionStatus::Success, "hello world\n".into()));
    assert_eq!(r[1], (ActionStatus::Success, "Ada".into()));
    assert_eq!(r[2], (ActionStatus::Success, "hi Ada\n".into()));
    assert!(j.iter().zip(1..).all(|(e, s)| e.seq == s));
    assert_eq!(
        f.store.load(id).await.expect("load").record.status,
        RunStatus::Completed
    );
}

#[tokio::test]
async fn refused_answers_write_nothing() {
    let f = Fixture::new(
        r#"
steps:
  - ask_human:
      prompt: "pick"
      options:
        - {id: a, label: A}
        - {id: b, label: B, requires_input: true}
  - finish: "${answer}"
"#,
    );
    let id = f.start("t").await;
    let q = paused(f.engine(id).await.advance(None).await.expect("advance"));
    assert_eq!(q.kind, InteractionType::UserChoice);
    let before = f.journal(id).await;
    for (resp, code) in [
        (answer(&q, Some("zzz"), None), "invalid_option"),
        (answer(&q, None, Some("a")), "invalid_option"),
        (answer(&q, Some("b"), Some(" ")), "input_required"),
    ] {
        match f.engine(id).await.advance(Some(resp)).await {
            Err(Error::Answer(e)) => assert_eq!(e.code(), code),
            other => panic!("expected {code}, got {other:?}"),
        }
    }
    let mut stranger = answer(&q, Some("a"), None);
    stranger.request_id = delta_protocol::RequestId::new();
    assert!(matches!(
        f.engine(id).await.advance(Some(stranger)).await,
        Err(Error::Answer(e)) if e.code() == "not_found"
    ));
    assert_eq!(f.journal(id).await, before);
    let status = f.store.load(id).await.expect("load").record.status;
    assert_eq!(status, RunStatus::WaitingForInput);

    let out = f
        .engine(id)
        .await
        .advance(Some(answer(&q, Some("b"), Some("because"))))
        .await;
    assert_eq!(
        out.expect("ok"),
        Outcome::Completed {
            result: "because".into()
        }
    );
    // A second answer to the same request is refused.
    assert!(matches!(
        f.engine(id).await.advance(Some(answer(&q, Some("a"), None))).await,
        Err(Error::Answer(e)) if e.code() == "already_resolved"
    ));
}

const ACTIONS: &str = r#"
steps:
  - ask_human:
      prompt: "how?"
      options:
        - {id: info, label: Info}
        - {id: reject, label: Reject, action: REJECT_WITH_REASON, requires_input: true}
        - {id: retry, label: Retry, action: RETRY_WITH_FEEDBACK}
        - {id: skip, label: Skip, action: SKIP}
        - {id: stop, label: Stop, action: TERMINATE}
        - {id: custom, label: Custom, action: CUSTOM}
  - finish: "${observation}"
"#;

async fn one_answer(
    f: &Fixture,
    option: &str,
    input: Option<&str>,
    feedback: Option<&str>,
) -> (Outcome, Vec<JournalEvent>) {
    let id = f.start("t").await;
    let q = paused(f.engine(id).await.advance(None).await.expect("advance"));
    let mut a = answer(&q, Some(option), input);
    a.feedback = feedback.map(str::to_owned);
    a.data = (option == "custom").then(|| json!({"k": 1}));
    let out = f.engine(id).await.advance(Some(a)).await.expect("advance");
    (out, f.journal(id).await)
}

#[tokio::test]
async fn every_option_action_drives_the_loop() {
    let f = Fixture::new(ACTIONS);

    let (out, j) = one_answer(&f, "info", None, None).await;
    assert_eq!(
        out,
        Outcome::Completed {
            result: "chose \"Info\" (option info)".into()
        }
    );
    assert_eq!(results(&j)[0].0, ActionStatus::Success);

    let (out, j) = one_answer(&f, "reject", Some("too risky"), None).await;
    assert_eq!(
        results(&j)[0],
        (ActionStatus::Rejected, "rejected: too risky".into())
    );
    assert_eq!(
        out,
        Outcome::Completed {
            result: "rejected: too risky".into()
        }
    );

    let (_, j) = one_answer(&f, "retry", None, Some("use staging")).await;
    let (status, text) = &results(&j)[0];
    assert_eq!(*status, ActionStatus::Rejected);
    assert!(text.contains("think again: use staging"), "{text}");

    let (_, j) = one_answer(&f, "skip", None, None).await;
    assert_eq!(
        results(&j)[0],
        (ActionStatus::Skipped, "skipped by tester".into())
    );

    let (out, j) = one_answer(&f, "stop", None, None).await;
    assert_eq!(
        out,
        Outcome::Cancelled {
            reason: "terminated by tester".into()
        }
    );
    assert_eq!(results(&j)[0].0, ActionStatus::Rejected);
    let last = j.last().expect("events");
    assert!(matches!(&last.event, Event::EngineEnd(e) if e.status == RunStatus::Cancelled));

    let (_, j) = one_answer(&f, "custom", Some("x"), None).await;
    let v: Value = serde_json::from_str(&results(&j)[0].1).expect("custom observation is JSON");
    assert_eq!(v["option_id"], "custom");
    assert_eq!(v["data"], json!({"k": 1}));
    let rec = j.iter().find_map(|e| match &e.event {
        Event::HumanInputReceived(r) => Some(r.clone()),
        _ => None,
    });
    assert_eq!(rec.expect("received").action, OptionAction::Custom);
}

#[tokio::test]
async fn choices_branch_the_script() {
    let f = Fixture::with_config(
        &std::fs::read_to_string("../../examples/agents/chooser/config.yaml").expect("example"),
        &std::fs::read_to_string("../../examples/agents/chooser/script.yaml").expect("example"),
    );
    let (out, _) = one_answer(&f, "staging", None, None).await;
    assert_eq!(
        out,
        Outcome::Completed {
            result: "staging is ready".into()
        }
    );
    let (out, j) = one_answer(&f, "other", Some("qa-east"), None).await;
    assert_eq!(
        out,
        Outcome::Completed {
            result: "qa-east is ready".into()
        }
    );
    assert!(results(&j).iter().any(|(_, o)| o == "preparing qa-east\n"));
    let (out, _) = one_answer(&f, "stop", None, None).await;
    assert!(matches!(out, Outcome::Cancelled { .. }));
}

#[tokio::test]
async fn gated_tools_ask_for_approval_and_run_only_when_approved() {
    let script = r#"
steps:
  - tool: deploy
    args: {target: prod}
  - finish: "${observation}"
"#;
    let f = Fixture::new(script);
    let id = f.start("t").await;
    let q = paused(f.engine(id).await.advance(None).await.expect("advance"));
    assert_eq!(q.kind, InteractionType::ToolApproval);
    assert_eq!(q.context["command_line"], "echo deploying prod");
    assert_eq!(q.context["risk_level"], "high");
    let ids: Vec<&str> = q.options.iter().map(|o| o.option_id.as_str()).collect();
    assert_eq!(ids, ["approve", "retry", "reject", "terminate"]);

    // Edited arguments are checked before anything is written.
    let mut bad = answer(&q, Some("approve"), None);
    bad.data = Some(json!({"args": {"target": "x", "force": true}}));
    let before = f.journal(id).await;
    assert!(matches!(
        f.engine(id).await.advance(Some(bad)).await,
        Err(Error::Answer(e)) if e.code() == "invalid_args"
    ));
    assert_eq!(f.journal(id).await, before);

    let mut edited = answer(&q, Some("approve"), None);
    edited.data = Some(json!({"args": {"target": "staging"}}));
    let out = f
        .engine(id)
        .await
        .advance(Some(edited))
        .await
        .expect("advance");
    assert_eq!(
        out,
        Outcome::Completed {
            result: "deploying staging\n".into()
        }
    );
    // The edit is journaled as a diff; the request keeps the call as the brain made it.
    let j = f.journal(id).await;
    let rec = received(&j).pop().expect("answer journaled");
    assert_eq!(
        rec.edited_args,
        Some(
            json!({"changed": {"target": {"from": "prod", "to": "staging"}}, "added": {}, "removed": []})
        )
    );
    assert!(j.iter().any(
        |e| matches!(&e.event, Event::ActionRequest(a) if a.args == json!({"target": "prod"}))
    ));

    let id = f.start("t").await;
    let q = paused(f.engine(id).await.advance(None).await.expect("advance"));
    let out = f
        .engine(id)
        .await
        .advance(Some(answer(&q, Some("reject"), Some("not today"))))
        .await;
    assert_eq!(
        out.expect("ok"),
        Outcome::Completed {
            result: "rejected: not today".into()
        }
    );
}

#[tokio::test]
async fn sensitive_answers_reach_tools_but_never_the_journal() {
    let script = r#"
steps:
  - ask_human: {prompt: "API key?", sensitive: true}
  - tool: use_key
    args: {key: "${answer}"}
  - finish: "${observation}"
"#;
    let f = Fixture::new(script);
    let id = f.start("t").await;
    let q = paused(f.engine(id).await.advance(None).await.expect("advance"));
    assert!(q.is_sensitive());
    let out = f
        .engine(id)
        .await
        .advance(Some(answer(&q, None, Some("hunter2"))))
        .await
        .expect("advance");
    // The tool saw the real key (its test passed) and echoed it; the journal shows "***".
    let r = results(&f.journal(id).await);
    assert_eq!(r[1], (ActionStatus::Success, "using ***\n".into()));
    assert_eq!(
        out,
        Outcome::Completed {
            result: "using ***\n".into()
        }
    );
    nowhere_in_the_store(&f, "hunter2");
}

#[tokio::test]
async fn a_tool_parameter_is_bound_to_an_earlier_sensitive_answer() {
    // Hold mode (like -i): the secret stays in this process while another question is asked.
    let f = Fixture::new(
        r#"
steps:
  - ask_human: {prompt: "API key?", sensitive: true}
  - ask_human: {prompt: "which env?", options: [{id: staging, label: Staging}]}
  - tool: use_key
    args: {key: "${secret}"}
  - finish: "${observation}"
"#,
    );
    let id = f.start("t").await;
    let mut engine = f.holding_engine(id).await;
    let q = paused(engine.advance(None).await.expect("advance"));
    let q = paused(
        engine
            .advance(Some(answer(&q, None, Some("hunter2"))))
            .await
            .expect("advance"),
    );
    let out = engine
        .advance(Some(answer(&q, Some("staging"), None)))
        .await
        .expect("advance");
    // use_key checked the real key (exit 0) and echoed it, masked.
    assert_eq!(
        out,
        Outcome::Completed {
            result: "using ***\n".into()
        }
    );
    let j = f.journal(id).await;
    let call = j
        .iter()
        .find_map(|e| match &e.event {
            Event::ActionRequest(a) if a.tool == "use_key" => Some(a.args.clone()),
            _ => None,
        })
        .expect("use_key called");
    assert!(
        call["key"].as_str().unwrap_or("").starts_with("{{secret:"),
        "{call}"
    );
    assert_eq!(results(&j)[2].0, ActionStatus::Success);
}

#[tokio::test]
async fn a_secret_reaches_only_the_parameters_declared_to_take_one() {
    // Alice gives a key; Bob, asked for a version in free text, answers with a reference to it,
    // and the task names `${secret}`: neither routes the key into `echo`, whose `text` is no
    // secret parameter. `use_key` (declared `secret: true`) still gets it.
    let f = Fixture::new(
        r#"
steps:
  - ask_human: {prompt: "API key?", sensitive: true}
  - ask_human: {prompt: "Which version?"}
  - tool: echo
    args: {text: "${answer}"}
  - tool: echo
    args: {text: "${task}"}
  - tool: use_key
    args: {key: "${secret}"}
  - finish: "${observation}"
"#,
    );
    let id = f.start("deploy ${secret}").await;
    let mut engine = f.holding_engine(id).await;
    let q = paused(engine.advance(None).await.expect("advance"));
    let q2 = paused(
        engine
            .advance(Some(answer(&q, None, Some("hunter2"))))
            .await
            .expect("advance"),
    );
    let bob = format!("{{{{secret:{}}}}}", q.request_id);
    let out = engine
        .advance(Some(answer(&q2, None, Some(&bob))))
        .await
        .expect("advance");
    assert_eq!(
        out,
        Outcome::Completed {
            result: "using ***\n".into()
        }
    );
    let j = f.journal(id).await;
    let r = results(&j);
    assert_eq!(r[2].0, ActionStatus::Error, "{r:?}");
    assert!(r[2].1.contains("does not take sensitive answers"), "{r:?}");
    // The task is inserted as written: `${secret}` in it is text, not a template.
    assert_eq!(r[3], (ActionStatus::Success, "deploy ${secret}\n".into()));
    assert_eq!(r[4].0, ActionStatus::Success, "{r:?}");
    let text = serde_json::to_string(&j).expect("json");
    assert!(!text.contains("hunter2"), "{text}");
}

#[tokio::test]
async fn a_value_that_would_be_an_option_is_refused_even_when_it_is_a_secret() {
    // `--help` from the task lands where `ls` reads options: refused, and the tool does not run.
    // A secret is checked once opened, and the refusal names the parameter, never the value.
    let f = Fixture::with_config(
        "name: t\nbrain: scripted\ntools:\n  - name: list\n    exec: \"ls -d ${dir}\"\n\
         \x20 - name: login\n    exec: \"test ${key} = x\"\n    parameters: [{name: key, secret: true}]\n",
        r#"
steps:
  - tool: list
    args: {dir: "${task}"}
  - ask_human: {prompt: "API key?", sensitive: true}
  - tool: login
    args: {key: "${secret}"}
  - finish: "${observation}"
"#,
    );
    let id = f.start("--help").await;
    let mut engine = f.holding_engine(id).await;
    let q = paused(engine.advance(None).await.expect("advance"));
    let out = engine
        .advance(Some(answer(&q, None, Some("-secret-key"))))
        .await
        .expect("advance");
    assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");
    let j = f.journal(id).await;
    let r = results(&j);
    assert_eq!(r[0].0, ActionStatus::Error, "{r:?}");
    assert!(
        r[0].1.contains("`dir` starts with `-`") && !r[0].1.contains("Usage"),
        "{r:?}"
    );
    assert_eq!(r[2].0, ActionStatus::Error, "{r:?}");
    assert!(r[2].1.contains("`key` starts with `-`"), "{r:?}");
    let text = serde_json::to_string(&j).expect("json");
    assert!(!text.contains("-secret-key"), "{text}");
}

#[tokio::test]
async fn a_secret_that_looks_like_its_own_reference_is_passed_as_is() {
    let f = Fixture::new(
        r#"
steps:
  - ask_human: {prompt: "API key?", sensitive: true}
  - tool: use_key
    args: {key: "${secret}"}
  - finish: "${observation}"
"#,
    );
    let id = f.start("t").await;
    let mut engine = f.holding_engine(id).await;
    let q = paused(engine.advance(None).await.expect("advance"));
    let sneaky = format!("{{{{secret:{}}}}}", q.request_id);
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        engine.advance(Some(answer(&q, None, Some(&sneaky)))),
    )
    .await
    .expect("the reference inside the secret is not expanded again (no endless loop)")
    .expect("advance");
    assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");
    let j = f.journal(id).await;
    assert_eq!(
        results(&j)[1].0,
        ActionStatus::Error,
        "use_key got the literal text, not hunter2"
    );
}

/// Asserts that no file of the fixture's `.delta` store holds `secret`.
fn nowhere_in_the_store(f: &Fixture, secret: &str) {
    for entry in walk(&f.dir.path().join(".delta")) {
        let text = std::fs::read(&entry).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&text).contains(secret),
            "{secret} found in {}",
            entry.display()
        );
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[tokio::test]
async fn expiry_applies_the_default_or_fails_the_run() {
    let script = r#"
steps:
  - ask_human:
      prompt: "go?"
      timeout_seconds: 0
      default_option_id: no
      options: [{id: yes, label: Yes}, {id: no, label: No, action: REJECT_WITH_REASON, requires_input: true}]
  - finish: "${observation}"
"#;
    let f = Fixture::new(script);
    let id = f.start("t").await;
    let q = paused(f.engine(id).await.advance(None).await.expect("advance"));
    assert!(q.expires_at.is_some());
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    assert!(matches!(
        f.engine(id).await.advance(Some(answer(&q, Some("yes"), None))).await,
        Err(Error::Answer(e)) if e.code() == "expired"
    ));
    let out = f.engine(id).await.advance(None).await.expect("advance");
    assert_eq!(
        out,
        Outcome::Completed {
            result: "rejected: no answer before the timeout".into()
        }
    );
    let j = f.journal(id).await;
    let rec = j.iter().find_map(|e| match &e.event {
        Event::HumanInputReceived(r) => Some(r.clone()),
        _ => None,
    });
    assert_eq!(rec.expect("received").responder.via, Via::Timeout);

    let f = Fixture::new(
        "steps:\n  - ask_human: {prompt: \"x\", timeout_seconds: 0}\n  - finish: done\n",
    );
    let id = f.start("t").await;
    paused(f.engine(id).await.advance(None).await.expect("advance"));
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let out = f.engine(id).await.advance(None).await.expect("advance");
    assert!(
        matches!(out, Outcome::Failed { ref error } if error.contains("expired")),
        "{out:?}"
    );
}

#[tokio::test]
async fn a_huge_timeout_never_expires_and_the_journal_reads_back() {
    // Regression: a `timeout_seconds` between i64::MAX / 1000 and i64::MAX panicked the engine
    // (chrono's TimeDelta bound), and any other one reaching past year 9999 journaled an
    // `expires_at` in year +262142 that made the journal unreadable.
    for secs in [
        "10000000000000000",
        "9000000000000000",
        "18446744073709551615",
    ] {
        let f = Fixture::new(&format!(
            "steps:\n  - ask_human: {{prompt: \"x\", timeout_seconds: {secs}}}\n  - finish: \"${{answer}}\"\n"
        ));
        let id = f.start("t").await;
        let q = paused(f.engine(id).await.advance(None).await.expect("advance"));
        assert_eq!(
            q.expires_at.map(|t| t.to_string()).as_deref(),
            Some("9999-12-31T23:59:59.999999Z")
        );
        let out = f
            .engine(id)
            .await
            .advance(Some(answer(&q, None, Some("Ada"))))
            .await
            .expect("the journal reads back and the answer is in time");
        assert_eq!(
            out,
            Outcome::Completed {
                result: "Ada".into()
            }
        );
    }
}

/// The journal without what differs between an uninterrupted run and a resumed one: engine
/// starts and non-terminal ends, system messages, times, durations, request ids and request
/// hashes (which cover ids and times), each id and hash numbered by first appearance.
fn semantic(journal: &[JournalEvent]) -> Vec<Value> {
    let mut ids = vec![];
    let mut hashes = vec![];
    journal
        .iter()
        .filter(|e| match &e.event {
            Event::EngineStart(_) | Event::SystemMessage(_) => false,
            Event::EngineEnd(end) => end.status.is_terminal(),
            _ => true,
        })
        .map(|e| {
            let mut v = serde_json::to_value(&e.event).expect("json");
            let p = &mut v["payload"];
            for key in ["timestamp", "expires_at"] {
                if p.get(key).is_some() {
                    p[key] = json!("T");
                }
            }
            if p.get("duration_ms").is_some() {
                p["duration_ms"] = json!(0);
            }
            if let Some(id) = p
                .get("request_id")
                .and_then(Value::as_str)
                .map(str::to_owned)
            {
                let n = ids.iter().position(|i| i == &id).unwrap_or_else(|| {
                    ids.push(id.clone());
                    ids.len() - 1
                });
                p["request_id"] = json!(n);
            }
            if let Some(h) = p
                .get("request_hash")
                .and_then(Value::as_str)
                .map(str::to_owned)
            {
                let n = hashes.iter().position(|i| i == &h).unwrap_or_else(|| {
                    hashes.push(h.clone());
                    hashes.len() - 1
                });
                p["request_hash"] = json!(n);
            }
            v
        })
        .collect()
}

const REPLAY: &str = r#"
steps:
  - think: "start"
  - tool: count
    args: {label: one}
  - ask_human: {prompt: "name?"}
  - tool: count
    args: {label: "${answer}"}
  - ask_human:
      prompt: "colour?"
      options: [{id: red, label: Red}, {id: blue, label: Blue}]
  - branch:
      red:
        - tool: count
          args: {label: red}
      blue:
        - tool: echo
          args: {text: blue}
  - finish: "done ${answer}"
"#;

/// `count` tool runs journaled as done in `events`.
fn counted(events: &[JournalEvent]) -> usize {
    events
        .iter()
        .filter(|e| matches!(&e.event, Event::ActionResult(r) if r.observation_content.starts_with("counted")))
        .count()
}

/// Drives a run to its end, answering each question the same way.
async fn drive(f: &Fixture, id: RunId) -> Outcome {
    drive_with(f, id, None).await
}

/// How many of a journal's `len` events a test's snapshot covers.
type At = fn(usize) -> usize;

/// Drives a run to its end, each engine reading the run whole, or with `snapshot_at`, from a
/// snapshot of its first `snapshot_at(len)` events and the events after it.
async fn drive_with(f: &Fixture, id: RunId, snapshot_at: Option<At>) -> Outcome {
    drive_answering(f, id, snapshot_at, |q, _| {
        if q.options.is_empty() {
            answer(q, None, Some("Ada"))
        } else {
            answer(q, Some("red"), None)
        }
    })
    .await
}

/// [`drive_with`], answering the `n`th question `q` with `respond(q, n)`.
async fn drive_answering(
    f: &Fixture,
    id: RunId,
    snapshot_at: Option<At>,
    respond: fn(&InteractionRequest, usize) -> InteractionResponse,
) -> Outcome {
    let run = async || {
        let run = f.store.load(id).await.expect("load");
        match snapshot_at {
            None => run,
            Some(at) => f.snapshotted(run, at),
        }
    };
    for n in 0..10 {
        let out = f
            .engine_for(run().await, CancellationToken::new())
            .advance(None)
            .await
            .expect("advance");
        let Outcome::Paused(q) = out else { return out };
        let a = respond(&q, n);
        let out = f
            .engine_for(run().await, CancellationToken::new())
            .advance(Some(a))
            .await
            .expect("advance");
        if !matches!(out, Outcome::Paused(_)) {
            return out;
        }
    }
    panic!("run did not finish");
}

#[tokio::test]
async fn a_run_cut_after_any_event_resumes_to_the_same_journal_without_extra_effects() {
    let f = Fixture::new(REPLAY);
    let id = f.start("t").await;
    let out = drive(&f, id).await;
    assert_eq!(
        out,
        Outcome::Completed {
            result: "done red".into()
        }
    );
    let full = f.journal(id).await;
    let reference = semantic(&full);
    let total_counts = f.counter("counter");
    assert_eq!(total_counts, 3);

    for cut in 1..full.len() {
        let g = Fixture::new(REPLAY);
        // What a crash right after event `cut` leaves on disk: the journal prefix.
        g.crashed_after(id, "t", &full[..cut]).await;
        let done_before = counted(&full[..cut]);
        let out = drive(&g, id).await;
        assert_eq!(
            out,
            Outcome::Completed {
                result: "done red".into()
            },
            "cut at {cut}"
        );
        let resumed = g.journal(id).await;
        assert_eq!(semantic(&resumed), reference, "cut after event {cut}");
        assert_eq!(
            g.counter("counter"),
            total_counts - done_before,
            "cut after event {cut}: only steps without a journaled result run again"
        );
        // Replaying a finished run again has no effect at all.
        let again = g.engine(id).await.advance(None).await.expect("advance");
        assert_eq!(again, out);
        assert_eq!(g.journal(id).await, resumed);
        assert_eq!(g.counter("counter"), total_counts - done_before);
    }
}

/// Resuming from a snapshot taken at any event, with any events after it, goes on exactly as
/// from the whole journal: the same journal, and no step run again that has a result.
#[tokio::test]
async fn a_run_resumed_from_a_snapshot_at_any_event_goes_on_as_from_its_whole_journal() {
    let f = Fixture::new(REPLAY);
    let id = f.start("t").await;
    drive(&f, id).await;
    let full = f.journal(id).await;
    let reference = semantic(&full);
    let at: [(&str, At); 3] = [
        ("the last event", |n| n),
        ("half way", |n| n / 2),
        ("the first event", |n| n.min(1)),
    ];
    for cut in 1..full.len() {
        for (where_, at) in at {
            let g = Fixture::new(REPLAY);
            g.crashed_after(id, "t", &full[..cut]).await;
            let done_before = counted(&full[..cut]);
            let out = drive_with(&g, id, Some(at)).await;
            assert_eq!(
                out,
                Outcome::Completed {
                    result: "done red".into()
                },
                "cut at {cut}, snapshot at {where_}"
            );
            assert_eq!(
                semantic(&g.journal(id).await),
                reference,
                "cut after event {cut}, snapshot at {where_}"
            );
            assert_eq!(g.counter("counter"), 3 - done_before, "cut at {cut}");
        }
    }
}

/// A snapshot keeps only the id of an answered question that is neither sensitive nor about the
/// current decision, and names the question the run waits on by its id; a resume from it still
/// refuses a second answer to that earlier question as already answered, and writes nothing.
#[tokio::test]
async fn an_earlier_answer_left_out_of_a_snapshot_is_still_refused_as_answered() {
    let f = Fixture::new(REPLAY);
    let id = f.start("t").await;
    let first = paused(f.engine(id).await.advance(None).await.expect("advance"));
    let second = paused(
        f.engine(id)
            .await
            .advance(Some(answer(&first, None, Some("Ada"))))
            .await
            .expect("advance"),
    );
    let whole = f.store.load(id).await.expect("load");
    let from_snapshot = f.snapshotted(whole.clone(), |n| n);
    let snapshot = from_snapshot.snapshot.as_ref().expect("a snapshot");
    assert!(from_snapshot.journal.is_empty());
    // Stored, it holds neither question (the one waited on only by its id), and the call
    // that asks once; read back, the pending one is there again.
    let stored = snapshot.encode();
    assert!(
        !stored.contains("name?") && !stored.contains("request_hash"),
        "{stored}"
    );
    assert_eq!(stored.matches("colour?").count(), 1, "{stored}");
    assert!(stored.contains(&first.request_id.to_string()));
    assert!(stored.contains(&second.request_id.to_string()));
    assert_eq!(
        snapshot.replay.pending().map(|q| q.request_id),
        Some(second.request_id)
    );
    assert!(snapshot.replay.interaction(first.request_id).is_none());
    assert!(snapshot.replay.answered(first.request_id));
    assert!(!snapshot.replay.answered(second.request_id));
    // Decoded without the store's copy of the question it names, it is not usable.
    assert!(Snapshot::decode(&stored, snapshot.seq, None).is_err());
    assert!(Snapshot::decode(&stored, snapshot.seq, Some(&first)).is_err());
    assert!(Snapshot::decode(&stored, snapshot.seq, Some(&second)).is_ok());
    // Nor with counters the next step would overflow (a tampered store or job): replayed.
    for (field, huge) in [("attempts", json!(u32::MAX)), ("turns", json!(u32::MAX))] {
        let mut v: Value = serde_json::from_str(&stored).expect("json");
        v["replay"][field] = huge;
        let e = Snapshot::decode(&v.to_string(), snapshot.seq, Some(&second)).expect_err(field);
        assert!(e.contains("out of range"), "{e}");
    }
    let mut v: Value = serde_json::from_str(&stored).expect("json");
    v["hook_calls"] = json!(u64::MAX);
    assert!(Snapshot::decode(&v.to_string(), snapshot.seq, Some(&second)).is_err());

    let before = f.journal(id).await;
    for run in [whole, from_snapshot] {
        let again = f
            .engine_for(run, CancellationToken::new())
            .advance(Some(answer(&first, None, Some("Bob"))))
            .await;
        assert!(
            matches!(&again, Err(Error::Answer(e)) if e.code() == "already_resolved"),
            "{again:?}"
        );
    }
    assert_eq!(f.journal(id).await, before);
}

/// The same with a plan sent back once ("modify") and then confirmed: a snapshot taken after a
/// plan must let the next walk stop at that plan again.
#[tokio::test]
async fn a_plan_sent_back_resumes_from_a_snapshot_as_from_its_whole_journal() {
    fn respond(q: &InteractionRequest, n: usize) -> InteractionResponse {
        match (q.option("modify").is_some(), n) {
            (true, 0) => answer(q, Some("modify"), Some("the smoke tests")),
            (true, _) => answer(q, Some("confirm"), None),
            (false, _) => answer(q, Some("approve"), None),
        }
    }
    let f = planned("max_plan_rounds: 3\n");
    let id = f.start("v2").await;
    let out = drive_answering(&f, id, None, respond).await;
    let done = Outcome::Completed {
        result: "carrying out the plan\n".into(),
    };
    assert_eq!(out, done);
    let full = f.journal(id).await;
    assert_eq!(plans(&full).len(), 2, "sent back once");
    let reference = semantic(&full);
    for cut in 1..full.len() {
        let g = planned("max_plan_rounds: 3\n");
        g.crashed_after(id, "v2", &full[..cut]).await;
        // The answers the prefix holds were the first ones: count them.
        let answered = received(&full[..cut]).len();
        let out = drive_answering(
            &g,
            id,
            Some(|n| n),
            match answered {
                0 => respond,
                _ => |q, _| respond(q, 1),
            },
        )
        .await;
        assert_eq!(out, done, "cut at {cut}");
        assert_eq!(
            semantic(&g.journal(id).await),
            reference,
            "cut after event {cut}"
        );
    }
}

#[tokio::test]
async fn an_unfinished_non_idempotent_action_asks_whether_it_already_ran() {
    let f = Fixture::new(
        "steps:\n  - tool: record\n    args: {line: once}\n  - finish: \"${observation}\"\n",
    );
    let id = f.start("t").await;
    f.engine(id).await.advance(None).await.expect("advance");
    let full = f.journal(id).await;
    let cut = full
        .iter()
        .position(|e| matches!(e.event, Event::ActionRequest(_)))
        .expect("request")
        + 1;

    for (option, input, status, result) in [
        ("skip", None, ActionStatus::Skipped, "skipped by tester"),
        ("mark_done", Some("it ran"), ActionStatus::Success, "it ran"),
        ("rerun", None, ActionStatus::Success, "recorded\n"),
    ] {
        let g = Fixture::new(
            "steps:\n  - tool: record\n    args: {line: once}\n  - finish: \"${observation}\"\n",
        );
        g.crashed_after(id, "t", &full[..cut]).await;
        let q = paused(g.engine(id).await.advance(None).await.expect("advance"));
        assert_eq!(q.kind, InteractionType::ToolApproval);
        assert_eq!(q.context["may_have_run"], true);
        let out = g
            .engine(id)
            .await
            .advance(Some(answer(&q, Some(option), input)))
            .await
            .expect("ok");
        assert_eq!(
            out,
            Outcome::Completed {
                result: result.into()
            },
            "{option}"
        );
        assert_eq!(results(&g.journal(id).await)[0].0, status);
        assert_eq!(g.counter("records"), usize::from(option == "rerun"));
    }
}

/// The same after an approval: a run that stopped after its approved call was journaled, but
/// before its result, does not run a tool that is not idempotent again without asking.
#[tokio::test]
async fn an_approved_call_cut_before_its_result_asks_whether_it_already_ran() {
    let script =
        "steps:\n  - tool: deploy\n    args: {target: prod}\n  - finish: \"${observation}\"\n";
    let config = format!(
        "name: t\nbrain: scripted\n{}",
        TOOLS.replace(
            "    exec: \"echo deploying ${target}\"",
            "    shell: \"echo ${target} >> records; echo deploying ${target}\""
        )
    );
    let f = Fixture::with_config(&config, script);
    let id = f.start("t").await;
    let q = paused(f.engine(id).await.advance(None).await.expect("advance"));
    // Approved with the arguments edited: staging, not prod.
    let mut approve = answer(&q, Some("approve"), None);
    approve.data = Some(json!({"args": {"target": "staging"}}));
    let out = f
        .engine(id)
        .await
        .advance(Some(approve))
        .await
        .expect("approve");
    assert_eq!(
        out,
        Outcome::Completed {
            result: "deploying staging\n".into()
        }
    );
    assert_eq!(f.counter("records"), 1);
    let full = f.journal(id).await;
    let cut = full
        .iter()
        .position(|e| matches!(e.event, Event::HumanInputReceived(_)))
        .expect("the approval")
        + 1;
    let g = Fixture::with_config(&config, script);
    g.crashed_after(id, "t", &full[..cut]).await;
    let again = paused(g.engine(id).await.advance(None).await.expect("advance"));
    assert_eq!(again.context["may_have_run"], true, "{again:?}");
    assert_eq!(g.counter("records"), 0, "not run again without asking");
    // It names the call as approved, edits and all, and "run it again" runs that one.
    assert_eq!(again.context["args"], json!({"target": "staging"}));
    assert!(again.prompt.contains("staging"), "{}", again.prompt);
    let out = g
        .engine(id)
        .await
        .advance(Some(answer(&again, Some("rerun"), None)))
        .await
        .expect("rerun");
    assert_eq!(
        out,
        Outcome::Completed {
            result: "deploying staging\n".into()
        }
    );
    assert_eq!(
        std::fs::read_to_string(g.dir.path().join("records")).expect("records"),
        "staging\n"
    );
}

#[tokio::test]
async fn cancellation_interrupts_a_running_tool_and_the_resume_runs_it_again() {
    let f = Fixture::new("steps:\n  - tool: slow\n    args: {secs: \"30\"}\n  - finish: ok\n");
    let id = f.start("t").await;
    let cancel = CancellationToken::new();
    let run = f.store.load(id).await.expect("load");
    let mut engine = f.engine_for(run, cancel.clone());
    let c = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        c.cancel();
    });
    let started = std::time::Instant::now();
    assert_eq!(
        engine.advance(None).await.expect("advance"),
        Outcome::Interrupted
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    let rec = f.store.load(id).await.expect("load").record;
    assert_eq!(rec.status, RunStatus::Interrupted);
    let j = f.journal(id).await;
    assert!(
        results(&j).is_empty(),
        "the interrupted action has no result"
    );
    assert!(
        matches!(&j.last().expect("end").event, Event::EngineEnd(e) if e.status == RunStatus::Interrupted)
    );
}

#[tokio::test]
async fn max_iterations_fails_the_run() {
    let f = Fixture::with_config(
        &format!("name: t\nbrain: scripted\nmax_iterations: 2\n{TOOLS}"),
        "steps:\n  - think: a\n  - think: b\n  - think: c\n  - finish: never\n",
    );
    let id = f.start("t").await;
    let out = f.engine(id).await.advance(None).await.expect("advance");
    assert!(
        matches!(out, Outcome::Failed { ref error } if error.contains("max_iterations (2)")),
        "{out:?}"
    );
}

#[tokio::test]
async fn bad_tool_arguments_become_an_error_observation() {
    let f = Fixture::new("steps:\n  - tool: echo\n    args: {}\n  - finish: \"${observation}\"\n");
    let id = f.start("t").await;
    let out = f.engine(id).await.advance(None).await.expect("advance");
    assert!(
        matches!(out, Outcome::Completed { ref result } if result.contains("missing required parameter `text`")),
        "{out:?}"
    );
    assert_eq!(results(&f.journal(id).await)[0].0, ActionStatus::Error);
}

#[tokio::test]
async fn a_hanging_tool_is_killed_at_its_timeout_and_journaled_as_error() {
    let f = Fixture::with_config(
        "name: t\nbrain: scripted\ntools:\n  - name: hang\n    exec: \"sleep 30\"\n    timeout_s: 1\n",
        "steps:\n  - tool: hang\n  - finish: \"${observation}\"\n",
    );
    let id = f.start("t").await;
    let started = std::time::Instant::now();
    let out = f.engine(id).await.advance(None).await.expect("advance");
    assert!(started.elapsed() < std::time::Duration::from_secs(15));
    let r = results(&f.journal(id).await);
    assert_eq!(r[0].0, ActionStatus::Error);
    assert!(r[0].1.contains("timed out after 1s"), "{}", r[0].1);
    assert!(matches!(out, Outcome::Completed { .. }));
}

#[tokio::test]
async fn a_scripted_plan_is_journaled_with_its_risk() {
    let f = Fixture::new(
        "steps:\n  - plan:\n      - {description: \"say hello\", tool: echo}\n      - {description: \"ship it\", tool: deploy}\n  - finish: planned\n",
    );
    let id = f.start("t").await;
    let out = f.engine(id).await.advance(None).await.expect("advance");
    assert_eq!(
        out,
        Outcome::Completed {
            result: "planned".into()
        }
    );
    let plan = f
        .journal(id)
        .await
        .into_iter()
        .find_map(|e| match e.event {
            Event::Plan(p) => Some(p),
            _ => None,
        })
        .expect("a PLAN event");
    let risks: Vec<_> = plan.tasks.iter().map(|t| (t.index, t.risk)).collect();
    assert_eq!(risks, [(1, RiskLevel::Low), (2, RiskLevel::High)]);
    assert_eq!(plan.risk_level, RiskLevel::High);
}

#[tokio::test]
async fn dangerous_if_decides_approval_per_call() {
    let f = Fixture::with_config(
        "name: t\nbrain: scripted\ntools:\n  - name: ship\n    exec: \"echo shipping ${env}\"\n    \
         approval: when_dangerous\n    dangerous_if: {env: \"^prod\"}\n",
        "steps:\n  - tool: ship\n    args: {env: staging}\n  - tool: ship\n    args: {env: prod-eu}\n  - finish: \"${observation}\"\n",
    );
    let id = f.start("t").await;
    let q = paused(f.engine(id).await.advance(None).await.expect("advance"));
    // The staging call ran without a question; the prod one waits for approval.
    assert_eq!(
        results(&f.journal(id).await),
        [(ActionStatus::Success, "shipping staging\n".to_owned())]
    );
    assert_eq!(q.kind, InteractionType::ToolApproval);
    assert_eq!(q.context["tool"], "ship");
    assert_eq!(q.context["args"], json!({"env": "prod-eu"}));
    assert_eq!(q.context["command_line"], "echo shipping prod-eu");
    assert_eq!(q.context["risk_level"], "high");
    assert_eq!(q.context["dangerous_because"], "`env` matches /^prod/");
    assert!(q.option("approve").expect("approve").is_dangerous);
    let out = f
        .engine(id)
        .await
        .advance(Some(answer(&q, Some("approve"), None)))
        .await
        .expect("advance");
    assert_eq!(
        out,
        Outcome::Completed {
            result: "shipping prod-eu\n".into()
        }
    );
}

const PLANNED: &str = r#"
steps:
  - plan:
      - {description: "say hello", tool: echo}
      - {description: "ship ${task}", tool: deploy}
    revise:
      - {description: "say hello", tool: echo}
      - {description: "ship ${task} after ${answer}", tool: deploy}
  - tool: echo
    args: {text: "carrying out the plan"}
  - finish: "${observation}"
"#;

fn planned(extra: &str) -> Fixture {
    Fixture::with_config(
        &format!("name: t\nbrain: scripted\nconfirm_plan: true\n{extra}{TOOLS}"),
        PLANNED,
    )
}

#[tokio::test]
async fn a_plan_is_confirmed_before_the_run_goes_on() {
    let f = planned("");
    let id = f.start("v2").await;
    let q = paused(f.engine(id).await.advance(None).await.expect("advance"));
    assert_eq!(q.kind, InteractionType::UserConfirmation);
    assert!(q.is_plan_confirmation());
    let ids: Vec<&str> = q.options.iter().map(|o| o.option_id.as_str()).collect();
    assert_eq!(ids, ["confirm", "modify", "cancel"]);
    assert_eq!(q.context["risk_level"], "high", "deploy is dangerous");
    assert_eq!(q.context["plan"][1]["description"], "ship v2");
    assert_eq!(q.context["plan"][1]["risk"], "high");
    assert_eq!(q.context["round"], 1);
    assert!(
        q.details
            .as_deref()
            .unwrap_or("")
            .contains("2. ship v2 (tool deploy) [risk high]")
    );
    let before = f.journal(id).await;
    assert!(
        results(&before).is_empty(),
        "nothing runs before the plan is confirmed"
    );

    let out = f
        .engine(id)
        .await
        .advance(Some(answer(&q, Some("confirm"), None)))
        .await
        .expect("advance");
    assert_eq!(
        out,
        Outcome::Completed {
            result: "carrying out the plan\n".into()
        }
    );
    let j = f.journal(id).await;
    assert_eq!(received(&j)[0].action, OptionAction::ApproveAndExecute);
    assert_eq!(plans(&j).len(), 1);
}

#[tokio::test]
async fn modifying_a_plan_asks_the_brain_again_up_to_max_plan_rounds() {
    let f = planned("max_plan_rounds: 3\n");
    let id = f.start("v2").await;
    let q1 = paused(f.engine(id).await.advance(None).await.expect("advance"));
    let before = f.journal(id).await;

    // Bad edits are refused and change nothing.
    let mut no_feedback = answer(&q1, Some("modify"), None);
    no_feedback.input = Some("  ".into());
    let mut not_a_list = answer(&q1, Some("modify"), None);
    not_a_list.data = Some(json!({"tasks": "deploy it all"}));
    let mut unknown_tool = answer(&q1, Some("modify"), None);
    unknown_tool.data = Some(json!({"tasks": [{"description": "x", "tool": "rm_rf"}]}));
    for (bad, code, says) in [
        (no_feedback, "input_required", "modify"),
        (not_a_list, "invalid_args", "a task list is a JSON list"),
        (unknown_tool, "invalid_args", "unknown tool `rm_rf`"),
    ] {
        match f.engine(id).await.advance(Some(bad)).await {
            Err(Error::Answer(e)) => {
                assert_eq!(e.code(), code);
                assert!(e.to_string().contains(says), "{e}");
            }
            other => panic!("expected {code}, got {other:?}"),
        }
    }
    assert_eq!(f.journal(id).await, before);

    // Feedback: the script's `revise` plan, round 2.
    let q2 = paused(
        f.engine(id)
            .await
            .advance(Some(answer(&q1, Some("modify"), Some("the smoke tests"))))
            .await
            .expect("advance"),
    );
    let j = f.journal(id).await;
    let p = plans(&j);
    assert_eq!(p.len(), 2);
    assert_eq!(p[1].round, 2);
    assert_eq!(p[1].tasks[1].description, "ship v2 after the smoke tests");
    assert_eq!(q2.context["round"], 2);
    assert!(q2.option("modify").is_some());

    // An edited task list: the plan becomes the person's, round 3, the last one.
    let mut edit = answer(&q2, Some("modify"), None);
    edit.data = Some(json!({"tasks": ["look around", {"description": "ship", "tool": "deploy"}]}));
    let q3 = paused(
        f.engine(id)
            .await
            .advance(Some(edit))
            .await
            .expect("advance"),
    );
    let p = plans(&f.journal(id).await);
    assert_eq!(p[2].round, 3);
    let tasks: Vec<(&str, Option<&str>, RiskLevel)> = p[2]
        .tasks
        .iter()
        .map(|t| (t.description.as_str(), t.tool.as_deref(), t.risk))
        .collect();
    assert_eq!(
        tasks,
        [
            ("look around", None, RiskLevel::Low),
            ("ship", Some("deploy"), RiskLevel::High)
        ]
    );
    let ids: Vec<&str> = q3.options.iter().map(|o| o.option_id.as_str()).collect();
    assert_eq!(
        ids,
        ["confirm", "cancel"],
        "the last round cannot be modified"
    );
    assert!(matches!(
        f.engine(id).await.advance(Some(answer(&q3, Some("modify"), Some("again")))).await,
        Err(Error::Answer(e)) if e.code() == "invalid_option"
    ));

    let out = f
        .engine(id)
        .await
        .advance(Some(answer(&q3, Some("confirm"), None)))
        .await
        .expect("advance");
    assert_eq!(
        out,
        Outcome::Completed {
            result: "carrying out the plan\n".into()
        }
    );
    // The script went on from the step after the plan, once.
    let j = f.journal(id).await;
    assert_eq!(
        results(&j),
        [(ActionStatus::Success, "carrying out the plan\n".to_owned())]
    );
}

#[tokio::test]
async fn cancelling_a_plan_cancels_the_run() {
    let f = planned("");
    let id = f.start("t").await;
    let q = paused(f.engine(id).await.advance(None).await.expect("advance"));
    let out = f
        .engine(id)
        .await
        .advance(Some(answer(&q, Some("cancel"), None)))
        .await
        .expect("advance");
    assert_eq!(
        out,
        Outcome::Cancelled {
            reason: "plan cancelled by tester".into()
        }
    );
    let j = f.journal(id).await;
    assert!(results(&j).is_empty());
    assert!(
        matches!(&j.last().expect("end").event, Event::EngineEnd(e) if e.status == RunStatus::Cancelled)
    );
}

#[tokio::test]
async fn an_unanswered_plan_takes_plan_default_at_its_timeout() {
    for (default, confirmed) in [("confirm", true), ("cancel", false)] {
        let f = planned(&format!(
            "plan_timeout_seconds: 0\nplan_default: {default}\ninteraction_defaults: {{timeout_seconds: 900}}\n"
        ));
        let id = f.start("t").await;
        let q = paused(f.engine(id).await.advance(None).await.expect("advance"));
        assert_eq!(q.timeout_seconds, Some(0), "plan_timeout_seconds wins");
        assert_eq!(q.default_option_id.as_deref(), Some(default));
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        let out = f.engine(id).await.advance(None).await.expect("advance");
        assert_eq!(
            matches!(out, Outcome::Completed { .. }),
            confirmed,
            "{out:?}"
        );
        assert_eq!(
            matches!(out, Outcome::Cancelled { .. }),
            !confirmed,
            "{out:?}"
        );
        let rec = received(&f.journal(id).await)
            .pop()
            .expect("the default was journaled");
        assert_eq!(rec.option_id.as_deref(), Some(default));
        assert_eq!(rec.responder.via, Via::Timeout);
    }
}

#[tokio::test]
async fn a_plan_cut_after_any_event_resumes_to_the_same_journal() {
    // Confirm after one modify: every prefix of that journal resumes to the same end.
    let f = planned("");
    let id = f.start("v2").await;
    let q1 = paused(f.engine(id).await.advance(None).await.expect("advance"));
    let q2 = paused(
        f.engine(id)
            .await
            .advance(Some(answer(&q1, Some("modify"), Some("tests"))))
            .await
            .expect("advance"),
    );
    f.engine(id)
        .await
        .advance(Some(answer(&q2, Some("confirm"), None)))
        .await
        .expect("advance");
    let full = f.journal(id).await;
    let reference = semantic(&full);
    for cut in 1..full.len() {
        let g = planned("");
        g.crashed_after(id, "v2", &full[..cut]).await;
        let mut out = g.engine(id).await.advance(None).await.expect("advance");
        for _ in 0..4 {
            let Outcome::Paused(q) = out else { break };
            let a = if q.context["round"] == 1 {
                answer(&q, Some("modify"), Some("tests"))
            } else {
                answer(&q, Some("confirm"), None)
            };
            out = g.engine(id).await.advance(Some(a)).await.expect("advance");
        }
        assert!(
            matches!(out, Outcome::Completed { .. }),
            "cut {cut}: {out:?}"
        );
        assert_eq!(
            semantic(&g.journal(id).await),
            reference,
            "cut after event {cut}"
        );
    }
}

const TYPED: &str = r#"
steps:
  - ask_human:
      prompt: "Who and how many?"
      response_schema:
        type: object
        properties:
          email: {type: string, format: email, title: Contact}
          count: {type: integer, minimum: 1, maximum: 10}
          env: {type: string, oneOf: [{const: stg, title: Staging}, {const: prd, title: Production}]}
          args: {type: boolean}
        required: [email, count]
  - tool: echo
    args: {text: "to ${answer.email} x${answer.count} on ${answer.env}"}
  - finish: "${answer}"
"#;

fn typed_answer(q: &InteractionRequest, data: Value) -> InteractionResponse {
    let mut a = answer(q, None, None);
    a.data = Some(data);
    a
}

#[tokio::test]
async fn a_typed_ask_human_hands_the_brain_the_checked_object() {
    let f = Fixture::new(TYPED);
    let id = f.start("t").await;
    let q = paused(f.engine(id).await.advance(None).await.expect("advance"));
    assert_eq!(q.kind, InteractionType::UserInput);
    let schema = q
        .response_schema
        .clone()
        .expect("the request carries its schema");
    assert_eq!(schema["required"], json!(["email", "count"]));
    let before = f.journal(id).await;
    for (data, field) in [
        (json!({"count": 3}), "email"),
        (json!({"email": "ada", "count": 3}), "email"),
        (json!({"email": "ada@example.com", "count": 11}), "count"),
        (
            json!({"email": "ada@example.com", "count": 2, "env": "dev"}),
            "env",
        ),
        (
            json!({"email": "ada@example.com", "count": 2, "who": "x"}),
            "who",
        ),
        (
            json!({"email": "ada@example.com", "count": 2, "args": {}}),
            "args",
        ),
    ] {
        match f
            .engine(id)
            .await
            .advance(Some(typed_answer(&q, data.clone())))
            .await
        {
            Err(Error::Answer(e)) => {
                assert_eq!(e.code(), "invalid_data", "{data}");
                assert!(e.to_string().contains(&format!("field `{field}`")), "{e}");
            }
            other => panic!("{data}: expected invalid_data, got {other:?}"),
        }
    }
    // Text alone is no typed answer.
    assert!(matches!(
        f.engine(id).await.advance(Some(answer(&q, None, Some("ada@example.com")))).await,
        Err(Error::Answer(e)) if e.code() == "invalid_data"
    ));
    assert_eq!(f.journal(id).await, before, "refusals write nothing");

    let data = json!({"email": "ada@example.com", "count": 3, "env": "stg", "args": true});
    let out = f
        .engine(id)
        .await
        .advance(Some(typed_answer(&q, data.clone())))
        .await
        .expect("advance");
    let j = f.journal(id).await;
    assert_eq!(
        received(&j)[0].data,
        Some(data.clone()),
        "journaled as given"
    );
    let r = results(&j);
    let observed: Value =
        serde_json::from_str(&r[0].1).expect("the observation is the JSON object");
    assert_eq!(observed, data);
    assert_eq!(
        r[1],
        (
            ActionStatus::Success,
            "to ada@example.com x3 on stg\n".into()
        )
    );
    let Outcome::Completed { result } = out else {
        panic!("completed, got {out:?}")
    };
    assert_eq!(serde_json::from_str::<Value>(&result).expect("json"), data);
}

#[tokio::test]
async fn a_sensitive_typed_answer_stays_out_of_the_journal_and_reaches_tools() {
    let f = Fixture::new(
        r#"
steps:
  - ask_human:
      prompt: "Key?"
      sensitive: true
      response_schema: {type: object, properties: {key: {type: string, minLength: 3}}, required: [key]}
  - tool: use_key
    args: {key: "${answer.key}"}
  - finish: "${observation}"
"#,
    );
    let id = f.start("t").await;
    let q = paused(f.engine(id).await.advance(None).await.expect("advance"));
    assert!(q.is_sensitive());
    let out = f
        .engine(id)
        .await
        .advance(Some(typed_answer(&q, json!({"key": "hunter2"}))))
        .await
        .expect("advance");
    // The tool saw the field's value (its test passed) and echoed it; the journal shows "***".
    assert_eq!(
        out,
        Outcome::Completed {
            result: "using ***\n".into()
        }
    );
    let j = f.journal(id).await;
    assert_eq!(received(&j)[0].data, Some(json!("***")));
    assert!(results(&j)[0].1.contains("hidden"), "{:?}", results(&j));
    nowhere_in_the_store(&f, "hunter2");
}

/// A sensitive typed answer's number (a PIN) that a tool prints is masked in the journal too,
/// not only its text fields.
#[tokio::test]
async fn a_sensitive_typed_answers_number_is_masked_in_what_a_tool_prints() {
    let config = format!(
        "name: t\nbrain: scripted\n{TOOLS}  - name: use_pin\n    shell: \"echo pin is ${{pin}}\"\n    parameters: [{{name: pin, secret: true}}]\n"
    );
    let f = Fixture::with_config(
        &config,
        r#"
steps:
  - ask_human:
      prompt: "PIN?"
      sensitive: true
      response_schema: {type: object, properties: {pin: {type: integer}}, required: [pin]}
  - tool: use_pin
    args: {pin: "${answer.pin}"}
  - finish: "${observation}"
"#,
    );
    let id = f.start("t").await;
    let q = paused(f.engine(id).await.advance(None).await.expect("advance"));
    let out = f
        .engine(id)
        .await
        .advance(Some(typed_answer(&q, json!({"pin": 739184}))))
        .await
        .expect("advance");
    assert_eq!(
        out,
        Outcome::Completed {
            result: "pin is ***\n".into()
        }
    );
    nowhere_in_the_store(&f, "739184");
}

#[tokio::test]
async fn a_schema_outside_the_subset_is_refused_when_the_script_loads() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("config.yaml"), "name: t\nbrain: scripted\n").expect("write");
    for (script, says) in [
        (
            "steps:\n  - ask_human:\n      prompt: x\n      response_schema: {type: object, properties: {a: {type: object}}}\n",
            "property `a`",
        ),
        (
            "steps:\n  - ask_human:\n      prompt: x\n      response_schema: {type: object, properties: {a: {type: string, pattern: x}}}\n",
            "`pattern`",
        ),
        (
            "steps:\n  - ask_human:\n      prompt: x\n      options: [{id: a}]\n      response_schema: {type: object, properties: {a: {type: string}}}\n",
            "do not go together",
        ),
    ] {
        std::fs::write(dir.path().join("script.yaml"), script).expect("write");
        let e = Agent::load(dir.path()).map(|_| ()).expect_err("refused");
        assert!(e.to_string().contains(says), "{e}");
        assert!(e.to_string().contains("script.yaml"), "{e}");
    }
}

/// A tool's `approvals` and `escalation` reach its approval question, which carries the hash of
/// what it shows (the same in the journal and in the pause); an `ask_human` step's too.
#[tokio::test]
async fn approvals_escalation_and_the_hash_reach_the_question() {
    let config = "name: t\nbrain: scripted\ntools:\n  - name: deploy\n    exec: \"echo deploying ${env}\"\n    approval: always\n    approvals: {min: 2, of: [\"group:leads\"], veto: true}\n    escalation:\n      - {after: 15m, remind: true}\n      - {after: 1h, apply_default: true}\n";
    let f = Fixture::with_config(
        config,
        "steps:\n  - tool: deploy\n    args: {env: prod}\n  - finish: done\n",
    );
    let id = f.start("go").await;
    let q = paused(f.engine(id).await.advance(None).await.expect("advance"));
    let a = q.approvals.clone().expect("approvals");
    assert_eq!(
        (a.min, a.of.as_slice(), a.veto),
        (2, ["group:leads".to_owned()].as_slice(), true)
    );
    assert!(a.exclude_requester, "on by default");
    assert_eq!(q.escalation.len(), 2);
    assert_eq!(q.escalation[1].after.as_secs(), 3600);
    let hash = q.request_hash.clone().expect("a hash");
    assert_eq!(hash, q.hash(), "the hash of what it shows");
    let journaled = f
        .journal(id)
        .await
        .into_iter()
        .find_map(|e| match e.event {
            delta_protocol::Event::HumanInputRequest(q) => Some(q),
            _ => None,
        })
        .expect("asked");
    assert_eq!(journaled.request_hash.as_deref(), Some(hash.as_str()));
    // An answer echoing another hash is refused; the right one is applied and journaled with it.
    let mut stale = answer(&q, Some("approve"), None);
    stale.request_hash = Some("0".repeat(64));
    let e = f
        .engine(id)
        .await
        .advance(Some(stale))
        .await
        .expect_err("stale");
    assert!(e.to_string().contains("not the one you were shown"), "{e}");
    let mut right = answer(&q, Some("approve"), None);
    right.request_hash = Some(hash.clone());
    f.engine(id)
        .await
        .advance(Some(right))
        .await
        .expect("applied");
    let received = f
        .journal(id)
        .await
        .into_iter()
        .find_map(|e| match e.event {
            delta_protocol::Event::HumanInputReceived(r) => Some(r),
            _ => None,
        })
        .expect("received");
    assert_eq!(received.request_hash.as_deref(), Some(hash.as_str()));
}

/// Approvals and escalation that cannot work are refused where they are declared, naming what is
/// wrong: in `config.yaml` when the agent loads, on an `ask_human` step when the script loads.
#[test]
fn bad_approvals_and_escalation_are_refused_where_declared() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tool = |extra: &str| {
        format!(
            "name: t\nbrain: scripted\ntools:\n  - name: deploy\n    exec: \"echo ${{env}}\"\n{extra}"
        )
    };
    std::fs::write(dir.path().join("script.yaml"), "steps:\n  - finish: done\n").expect("write");
    for (config, says) in [
        (
            tool("    approval: always\n    approvals: {min: 0}\n"),
            "approvals.min",
        ),
        (
            tool("    approvals: {min: 2}\n"),
            "needs `approval: always`",
        ),
        (
            tool(
                "    approval: always\n    escalation: [{after: 1h, remind: true}, {after: 30m, remind: true}]\n",
            ),
            "step 2",
        ),
        (
            tool("    approval: always\n    escalation: [{after: soon, remind: true}]\n"),
            "not a duration",
        ),
    ] {
        std::fs::write(dir.path().join("config.yaml"), config).expect("write");
        let e = Agent::load(dir.path()).map(|_| ()).expect_err("refused");
        assert!(e.to_string().contains(says), "{says}: {e}");
    }
    std::fs::write(dir.path().join("config.yaml"), "name: t\nbrain: scripted\n").expect("write");
    for (script, says) in [
        (
            "steps:\n  - ask_human:\n      prompt: x\n      approvals: {min: 2}\n      options: [{id: a}, {id: b}]\n",
            "APPROVE_AND_EXECUTE",
        ),
        (
            "steps:\n  - ask_human:\n      prompt: x\n      escalation: [{after: 1h}]\n",
            "does nothing",
        ),
        (
            "steps:\n  - ask_human:\n      prompt: x\n      allowed_responders: [\"group:\"]\n",
            "allowed_responders",
        ),
    ] {
        std::fs::write(dir.path().join("script.yaml"), script).expect("write");
        let e = Agent::load(dir.path()).map(|_| ()).expect_err("refused");
        assert!(e.to_string().contains(says), "{says}: {e}");
    }
}

/// An `ask_human` call (a model's, say) may narrow who answers, never widen it: its escalation's
/// `add_responders` are bounded by the agent's list like its `allowed_responders`; and a
/// question votes decide takes no approving default (nor may a script declare one).
#[tokio::test]
async fn a_call_cannot_widen_who_answers_through_its_escalation() {
    let config =
        "name: t\nbrain: scripted\ninteraction_defaults:\n  allowed_responders: [alice, carol]\n";
    let f = Fixture::with_config(
        config,
        "steps:\n  - ask_human:\n      prompt: \"Go?\"\n      allowed_responders: [alice]\n      escalation:\n        - {after: 1h, add_responders: [mallory, carol]}\n  - finish: done\n",
    );
    let id = f.start("go").await;
    let q = paused(f.engine(id).await.advance(None).await.expect("advance"));
    assert_eq!(q.allowed_responders, ["alice"]);
    assert_eq!(
        q.escalation[0].add_responders,
        ["carol"],
        "mallory is not in the agent's list"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("config.yaml"), "name: t\nbrain: scripted\n").expect("write");
    std::fs::write(
        dir.path().join("script.yaml"),
        "steps:\n  - ask_human:\n      prompt: x\n      approvals: {min: 2}\n      default_option_id: yes\n      options:\n        - {id: yes, action: APPROVE_AND_EXECUTE}\n        - {id: no, action: REJECT_WITH_REASON}\n",
    )
    .expect("write");
    let e = Agent::load(dir.path()).map(|_| ()).expect_err("refused");
    assert!(
        e.to_string()
            .contains("approves, but `approvals` says votes decide"),
        "{e}"
    );
}

/// What a tool leaves running in the background is killed once it exits, unless the tool says
/// `keep_background: true`.
#[tokio::test]
async fn a_tools_background_processes_end_with_it_unless_kept() {
    let f = Fixture::with_config(
        "name: t\nbrain: scripted\ntools:\n  - name: bg\n    shell: 'sleep 60 >/dev/null 2>&1 & echo $!'\n  \
         - name: kept\n    shell: 'sleep 60 >/dev/null 2>&1 & echo $!'\n    keep_background: true\n",
        "steps:\n  - tool: bg\n  - tool: kept\n  - finish: done\n",
    );
    let id = f.start("t").await;
    let out = f.engine(id).await.advance(None).await.expect("advance");
    assert_eq!(
        out,
        Outcome::Completed {
            result: "done".into()
        }
    );
    let pids: Vec<i32> = results(&f.journal(id).await)
        .iter()
        .map(|(_, text)| text.trim().parse().expect("a pid"))
        .collect();
    let alive = |pid: i32| {
        // A zombie is gone but for its entry: not alive.
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| !s.split(") ").nth(1).is_some_and(|r| r.starts_with('Z')))
    };
    // Killed as the call ended; the kernel may take a moment to show it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while alive(pids[0]) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        !alive(pids[0]),
        "the background process of `bg` outlived it"
    );
    assert!(alive(pids[1]), "`kept` keeps its background process");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pids[1]),
        nix::sys::signal::Signal::SIGKILL,
    );
}
