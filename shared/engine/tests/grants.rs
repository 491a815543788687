//! Scoped grants and `policy.yaml`, the engine on the real file store: an approval that creates a
//! grant, later calls approved by it (journaled with its id and creator) or not (another call,
//! another run, used up, expired, revoked, a tool that is not grantable), policy rules that deny,
//! allow or require approval (journaled by name), and a replayed answer that creates nothing twice.

use std::collections::BTreeMap;
use std::path::PathBuf;

use delta_engine::agent::Agent;
use delta_engine::brain::AnyBrain;
use delta_engine::engine::{Engine, Error, Outcome, PauseMode, Settings};
use delta_protocol::grant::{ArgMatch, Grant, GrantScope};
use delta_protocol::{
    ActionStatus, Event, InteractionRequest, InteractionResponse, InteractionType, JournalEvent,
    RequestId, Responder, RunId, RunStatus, Timestamp, Via,
};
use delta_store::file::FileRunStore;
use delta_store::{GrantStore, RunRecord, RunStore};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const CONFIG: &str = r#"
name: grants-test
brain: scripted
tools:
  - name: deploy
    shell: "echo ${env} ${version} >> deploys; echo deployed ${env} ${version}"
    approval: always
  - name: wipe
    exec: "echo wiped ${what}"
    approval: always
    grantable: false
  - name: echo
    exec: "echo ${text}"
  - name: scale
    exec: "echo scaled to ${replicas}"
    parameters: [{name: replicas, type: integer}]
    approval: when_dangerous
    dangerous_if: {replicas: "^[0-9]{3,}$"}
"#;

const THREE_DEPLOYS: &str = r#"
steps:
  - tool: deploy
    args: {env: staging, version: "1.0"}
  - tool: deploy
    args: {env: staging, version: "1.0"}
  - tool: deploy
    args: {env: staging, version: "2.0"}
  - finish: "${observation}"
"#;

struct Fixture {
    dir: tempfile::TempDir,
    agent: Agent,
    brain: AnyBrain,
    store: FileRunStore,
}

impl Fixture {
    fn new(script: &str, policy: Option<&str>) -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let agent_dir = dir.path().join("agent");
        std::fs::create_dir_all(&agent_dir).expect("mkdir");
        std::fs::write(agent_dir.join("config.yaml"), CONFIG).expect("write");
        std::fs::write(agent_dir.join("script.yaml"), script).expect("write");
        if let Some(p) = policy {
            std::fs::write(agent_dir.join("policy.yaml"), p).expect("write");
        }
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

    async fn start(&self) -> RunId {
        let rec = RunRecord::new(RunId::new(), self.agent.name(), "t", RunStatus::Running);
        let id = rec.run_id;
        self.store.create(rec).await.expect("create");
        id
    }

    async fn advance(
        &self,
        id: RunId,
        answer: Option<InteractionResponse>,
    ) -> Result<Outcome, Error> {
        let run = self.store.load(id).await.expect("load");
        let settings = Settings {
            worker: "local".into(),
            work_dir: self.work(),
            pause: PauseMode::Park,
        };
        let mut engine = Engine::new(
            &self.agent,
            &self.brain,
            &self.store,
            run,
            settings,
            CancellationToken::new(),
        );
        engine.advance(answer).await
    }

    async fn journal(&self, id: RunId) -> Vec<JournalEvent> {
        FileRunStore::new(self.dir.path().join(".delta"))
            .load(id)
            .await
            .expect("load")
            .journal
    }

    fn deploys(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("deploys"))
            .map(|s| s.lines().map(str::to_owned).collect())
            .unwrap_or_default()
    }
}

fn paused(o: Outcome) -> InteractionRequest {
    match o {
        Outcome::Paused(q) => *q,
        other => panic!("expected a pause, got {other:?}"),
    }
}

fn approve(q: &InteractionRequest, data: Value) -> InteractionResponse {
    InteractionResponse {
        request_id: q.request_id,
        option_id: Some("approve".into()),
        input: None,
        data: Some(data),
        feedback: None,
        responder: Responder::new("alice", Via::File),
        request_hash: None,
    }
}

fn reject(q: &InteractionRequest) -> InteractionResponse {
    InteractionResponse {
        option_id: Some("reject".into()),
        input: Some("no".into()),
        data: None,
        ..approve(q, Value::Null)
    }
}

fn notes(journal: &[JournalEvent]) -> Vec<String> {
    journal
        .iter()
        .filter_map(|e| match &e.event {
            Event::SystemMessage(m) => Some(m.content.clone()),
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

fn questions(journal: &[JournalEvent]) -> usize {
    journal
        .iter()
        .filter(|e| matches!(e.event, Event::HumanInputRequest(_)))
        .count()
}

/// A grant written straight into the store, for `deploy` with `env = staging, version = 1.0`.
fn stored_grant(f: &Fixture, tool: &str, args: &[(&str, &str)]) -> Grant {
    Grant {
        grant_id: RequestId::new(),
        agent: f.agent.name().to_owned(),
        scope: GrantScope::Agent,
        run_id: RunId::new(),
        tool: tool.into(),
        args: args
            .iter()
            .map(|(k, v)| ((*k).to_owned(), ArgMatch::Exact((*v).to_owned())))
            .collect::<BTreeMap<_, _>>(),
        created_by: Responder::new("bob", Via::Http),
        created_at: Timestamp::now(),
        expires_at: None,
        max_uses: None,
        uses: 0,
        revoked_at: None,
        revoked_by: None,
    }
}

#[tokio::test]
async fn an_approval_with_a_grant_approves_the_same_call_again_in_its_run_only() {
    let f = Fixture::new(THREE_DEPLOYS, None);
    let id = f.start().await;
    let q = paused(f.advance(id, None).await.expect("advance"));
    assert_eq!(q.kind, InteractionType::ToolApproval);
    assert_eq!(q.context["grantable"], json!(true));

    let q2 = paused(
        f.advance(id, Some(approve(&q, json!({"grant": {}}))))
            .await
            .expect("approve with a grant"),
    );
    // The second call (the same arguments) ran without a question; the third (2.0) asks.
    assert_eq!(
        q2.context["args"],
        json!({"env": "staging", "version": "2.0"})
    );
    assert_eq!(f.deploys(), ["staging 1.0", "staging 1.0"]);
    let j = f.journal(id).await;
    let notes = notes(&j);
    let created = format!(
        "grant {} created by alice via file: scope run, tool `deploy`",
        q.request_id
    );
    assert!(notes.iter().any(|n| n.starts_with(&created)), "{notes:#?}");
    let used = format!(
        "call a2-1 of `deploy` approved by grant {} (scope run, created by alice via file when approving request {} of run {id}; use 1)",
        q.request_id, q.request_id
    );
    assert!(notes.contains(&used), "{notes:#?}");
    let g = f
        .store
        .grant(q.request_id)
        .await
        .expect("read")
        .expect("stored");
    assert_eq!((g.uses, g.created_by.id.as_str()), (1, "alice"));
    assert_eq!(g.args["version"], ArgMatch::Exact("1.0".into()));

    let out = f.advance(id, Some(reject(&q2))).await.expect("reject");
    assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");

    // Another run of the agent: a grant of scope `run` does not reach it.
    let other = f.start().await;
    let q = paused(f.advance(other, None).await.expect("advance"));
    assert_eq!(
        q.context["args"],
        json!({"env": "staging", "version": "1.0"})
    );
}

#[tokio::test]
async fn a_grant_of_scope_agent_reaches_later_runs_until_its_uses_are_spent() {
    let f = Fixture::new(THREE_DEPLOYS, None);
    let id = f.start().await;
    let q = paused(f.advance(id, None).await.expect("advance"));
    let grant = json!({"grant": {"scope": "agent", "max_uses": 2}});
    let q2 = paused(
        f.advance(id, Some(approve(&q, grant)))
            .await
            .expect("approve"),
    );
    f.advance(id, Some(reject(&q2))).await.expect("reject");
    assert_eq!(f.deploys().len(), 2);

    // The next run: its first call takes the grant's second use, its second call asks.
    let next = f.start().await;
    let q = paused(f.advance(next, None).await.expect("advance"));
    assert_eq!(q.context["action_id"], json!("a2-1"), "the first call ran");
    assert_eq!(f.deploys().len(), 3);
    let g = f.store.grant(q2.request_id).await.expect("read");
    assert!(g.is_none(), "a rejected approval makes no grant");
    let g = f
        .store
        .grants(Some(f.agent.name()))
        .await
        .expect("list")
        .pop()
        .expect("one grant");
    assert_eq!((g.uses, g.max_uses), (2, Some(2)));
    let notes = notes(&f.journal(next).await);
    assert!(
        notes
            .iter()
            .any(|n| n.contains(&format!("approved by grant {}", g.grant_id))
                && n.ends_with("use 2 of 2)")),
        "{notes:#?}"
    );
}

#[tokio::test]
async fn a_revoked_or_expired_grant_approves_nothing() {
    let f = Fixture::new(THREE_DEPLOYS, None);
    let id = f.start().await;
    let q = paused(f.advance(id, None).await.expect("advance"));
    let q2 = paused(
        f.advance(id, Some(approve(&q, json!({"grant": {"scope": "agent"}}))))
            .await
            .expect("approve"),
    );
    f.advance(id, Some(reject(&q2))).await.expect("reject");
    let revoked = f
        .store
        .revoke_grant(q.request_id, "carol", Timestamp::now())
        .await
        .expect("revoke")
        .expect("there");
    assert_eq!(revoked.revoked_by.as_deref(), Some("carol"));

    let next = f.start().await;
    let q = paused(f.advance(next, None).await.expect("advance"));
    assert_eq!(
        q.context["action_id"],
        json!("a1-1"),
        "the revoked grant approved nothing"
    );

    // Expired (written straight into the store), then one still live.
    let mut expired = stored_grant(&f, "deploy", &[("env", "staging"), ("version", "1.0")]);
    expired.created_at = Timestamp::now();
    expired.expires_at = Some(Timestamp::from_micros(Timestamp::now().micros() - 1).expect("t"));
    f.store.put_grant(&expired).await.expect("put");
    let third = f.start().await;
    let q = paused(f.advance(third, None).await.expect("advance"));
    assert_eq!(
        q.context["action_id"],
        json!("a1-1"),
        "the expired grant approved nothing"
    );

    let mut live = stored_grant(&f, "deploy", &[("env", "staging"), ("version", "1.0")]);
    live.expires_at = Some(Timestamp::now().plus_seconds(3600));
    f.store.put_grant(&live).await.expect("put");
    let fourth = f.start().await;
    let q = paused(f.advance(fourth, None).await.expect("advance"));
    assert_eq!(
        q.context["action_id"],
        json!("a3-1"),
        "the live grant approved two calls"
    );
    let notes = notes(&f.journal(fourth).await);
    assert!(
        notes.iter().any(
            |n| n.contains(&format!("approved by grant {}", live.grant_id))
                && n.contains("created by bob via http")
        ),
        "{notes:#?}"
    );
}

#[tokio::test]
async fn a_tool_that_is_not_grantable_always_asks() {
    let script = r#"
steps:
  - tool: wipe
    args: {what: cache}
  - tool: wipe
    args: {what: cache}
  - finish: "${observation}"
"#;
    let f = Fixture::new(script, None);
    let id = f.start().await;
    let q = paused(f.advance(id, None).await.expect("advance"));
    assert_eq!(q.context["grantable"], json!(false));
    let before = f.journal(id).await;
    let refused = f.advance(id, Some(approve(&q, json!({"grant": {}})))).await;
    match refused {
        Err(Error::Answer(e)) => {
            assert_eq!(e.code(), "invalid_args");
            assert!(e.to_string().contains("grantable: false"), "{e}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(
        f.journal(id).await,
        before,
        "a refused answer writes nothing"
    );
    // A grant for it in the store (however it got there) approves nothing either.
    f.store
        .put_grant(&stored_grant(&f, "wipe", &[("what", "cache")]))
        .await
        .expect("put");
    let q2 = paused(
        f.advance(id, Some(approve(&q, json!({}))))
            .await
            .expect("approve"),
    );
    assert_eq!(q2.context["action_id"], json!("a2-1"));
}

#[tokio::test]
async fn bad_grants_are_refused_and_change_nothing() {
    let f = Fixture::new(THREE_DEPLOYS, None);
    let id = f.start().await;
    let q = paused(f.advance(id, None).await.expect("advance"));
    let before = f.journal(id).await;
    for data in [
        json!({"grant": {"args": {"region": "eu"}}}),
        json!({"grant": {"args": {"version": {"regex": "1.("}}}}),
        json!({"grant": {"scope": "everyone"}}),
        json!({"grant": {"args": {"version": "3.0"}}}),
    ] {
        let out = f.advance(id, Some(approve(&q, data.clone()))).await;
        assert!(
            matches!(&out, Err(Error::Answer(e)) if e.code() == "invalid_args"),
            "{data}: {out:?}"
        );
    }
    assert_eq!(f.journal(id).await, before);
    assert!(f.store.grants(None).await.expect("list").is_empty());
}

const POLICY: &str = r#"
rules:
  - name: no-prod
    tool: deploy
    args: {env: "prod.*"}
    effect: deny
    reason: production is deployed by the release team
  - name: staging-free
    tool: deploy
    args: {env: staging}
    effect: allow
  - name: careful-echo
    tool: echo
    args: {text: "rm .*"}
    effect: require_approval
"#;

#[tokio::test]
async fn policy_rules_deny_allow_or_require_approval_and_are_journaled() {
    let script = r#"
steps:
  - tool: deploy
    args: {env: production, version: "1"}
  - tool: deploy
    args: {env: staging, version: "1"}
  - tool: echo
    args: {text: "hello"}
  - tool: echo
    args: {text: "rm everything"}
  - finish: "${observation}"
"#;
    let f = Fixture::new(script, Some(POLICY));
    // Deny wins over a grant that would approve the call.
    f.store
        .put_grant(&stored_grant(
            &f,
            "deploy",
            &[("env", "production"), ("version", "1")],
        ))
        .await
        .expect("put");
    let id = f.start().await;
    let q = paused(f.advance(id, None).await.expect("advance"));
    assert_eq!(q.context["tool"], json!("echo"));
    assert_eq!(q.context["policy_rule"], json!("careful-echo"));
    let j = f.journal(id).await;
    assert_eq!(
        results(&j),
        [
            (
                ActionStatus::Rejected,
                "denied by policy rule `no-prod`: production is deployed by the release team; this call is not allowed, do something else".to_owned()
            ),
            (ActionStatus::Success, "deployed staging 1\n".to_owned()),
            (ActionStatus::Success, "hello\n".to_owned()),
        ]
    );
    assert_eq!(
        f.deploys(),
        ["staging 1"],
        "denied: not run; allowed: run without asking"
    );
    assert_eq!(
        notes(&j),
        [
            "policy.yaml rule `no-prod` (deny) denied call a1-1 of `deploy`",
            "policy.yaml rule `staging-free` (allow) allowed, without approval, call a2-1 of `deploy`",
            "policy.yaml rule `careful-echo` (require_approval) requires approval of call a4-1 of `echo`",
        ]
    );
    assert_eq!(
        questions(&j),
        1,
        "only the call a rule requires approval of asks"
    );
    let out = f
        .advance(id, Some(approve(&q, json!({}))))
        .await
        .expect("approve");
    assert_eq!(
        out,
        Outcome::Completed {
            result: "rm everything\n".into()
        }
    );
}

#[tokio::test]
async fn a_broken_policy_is_refused_at_load_naming_the_file_line_and_rule() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("config.yaml"), CONFIG).expect("write");
    std::fs::write(dir.path().join("script.yaml"), "steps:\n  - finish: ok\n").expect("write");
    std::fs::write(
        dir.path().join("policy.yaml"),
        "rules:\n  - name: ok\n    tool: deploy\n    effect: allow\n  - name: typo\n    tool: deploi\n    effect: deny\n",
    )
    .expect("write");
    let e = Agent::load(dir.path()).expect_err("refused").to_string();
    assert!(
        e.contains("policy.yaml line 5: rules[1].tool: `deploi` is not a tool of this agent"),
        "{e}"
    );
}

#[tokio::test]
async fn a_replayed_answer_creates_its_grant_once() {
    let f = Fixture::new(THREE_DEPLOYS, None);
    let id = f.start().await;
    let q = paused(f.advance(id, None).await.expect("advance"));
    let q2 = paused(
        f.advance(
            id,
            Some(approve(
                &q,
                json!({"grant": {"scope": "agent", "max_uses": 5}}),
            )),
        )
        .await
        .expect("approve"),
    );
    let full = f.journal(id).await;
    let answered = full
        .iter()
        .position(|e| matches!(e.event, Event::HumanInputReceived(_)))
        .expect("answer journaled");
    let grants_dir = f.dir.path().join(".delta").join("grants");
    // What a crash leaves: the journal up to a commit (events committed together share their
    // timestamp), from the pause on; with the grant stored or not where both can be (before the
    // answer is journaled, since the grant is stored before the commit that journals it).
    let commits = (1..full.len()).filter(|&c| full[c - 1].timestamp != full[c].timestamp);
    for cut in commits.filter(|&c| c >= answered - 2) {
        let answer_journaled = cut > answered;
        for grant_stored in [true, false] {
            if answer_journaled && !grant_stored {
                continue;
            }
            let g = Fixture::new(THREE_DEPLOYS, None);
            let rec = RunRecord::new(id, g.agent.name(), "t", RunStatus::Running);
            g.store.create(rec).await.expect("create");
            let prefix: String = full[..cut]
                .iter()
                .map(delta_protocol::journal::to_line)
                .collect();
            std::fs::write(g.store.execution_dir(id).join("journal.jsonl"), prefix)
                .expect("write prefix");
            if grant_stored {
                let to = g.dir.path().join(".delta").join("grants");
                std::fs::create_dir_all(&to).expect("mkdir");
                for e in std::fs::read_dir(&grants_dir).expect("grants") {
                    let e = e.expect("entry");
                    std::fs::copy(e.path(), to.join(e.file_name())).expect("copy");
                }
            }
            // The same answer again (a redelivered resume), or none when it is journaled.
            let answer = (!answer_journaled)
                .then(|| approve(&q, json!({"grant": {"scope": "agent", "max_uses": 5}})));
            let mut again = paused(g.advance(id, answer).await.expect("resume"));
            if again.context.contains_key("may_have_run") {
                // Cut after the approved call was recorded and before its result: it may have
                // run, and a person says so (skip); the run then goes on as before.
                let skip = InteractionResponse {
                    option_id: Some("skip".into()),
                    data: None,
                    ..approve(&again, Value::Null)
                };
                again = paused(g.advance(id, Some(skip)).await.expect("skip"));
            }
            assert_eq!(
                again.context["action_id"], q2.context["action_id"],
                "cut {cut}"
            );
            let listed = g.store.grants(None).await.expect("list");
            assert_eq!(listed.len(), 1, "cut {cut}: one grant");
            assert_eq!(listed[0].grant_id, q.request_id);
            let j = g.journal(id).await;
            let created = notes(&j)
                .iter()
                .filter(|n| n.starts_with(&format!("grant {} created", q.request_id)))
                .count();
            assert_eq!(
                created, 1,
                "cut {cut}, stored {grant_stored}: journaled once"
            );
            let approvals = notes(&j)
                .iter()
                .filter(|n| n.contains("approved by grant"))
                .count();
            assert_eq!(
                approvals, 1,
                "cut {cut}, stored {grant_stored}: one use journaled"
            );
            assert!(
                listed[0].uses <= 1,
                "cut {cut}: a replayed call takes no second use"
            );
        }
    }
}

/// A rule about a number holds however the model spells it: the tool gets `0` for `00`, ` 0`
/// and `+0`, so a deny of `0` denies them all; `dangerous_if` sees `100` for `"100\n"`, so the
/// call waits for approval. Before, both matched the text as sent, and the tool got another.
#[tokio::test]
async fn policy_and_danger_match_a_number_as_the_tool_gets_it() {
    let script = r#"
steps:
  - tool: scale
    args: {replicas: "00"}
  - tool: scale
    args: {replicas: " 0"}
  - tool: scale
    args: {replicas: "+0"}
  - tool: scale
    args: {replicas: 0}
  - tool: scale
    args: {replicas: "7"}
  - tool: scale
    args: {replicas: "100\n"}
  - finish: "${observation}"
"#;
    let policy = "rules:\n  - name: never-zero\n    tool: scale\n    args: {replicas: 0}\n    effect: deny\n";
    let f = Fixture::new(script, Some(policy));
    let id = f.start().await;
    let q = paused(f.advance(id, None).await.expect("advance"));
    let denied = "denied by policy rule `never-zero`; this call is not allowed, do something else";
    assert_eq!(
        results(&f.journal(id).await),
        [
            (ActionStatus::Rejected, denied.to_owned()),
            (ActionStatus::Rejected, denied.to_owned()),
            (ActionStatus::Rejected, denied.to_owned()),
            (ActionStatus::Rejected, denied.to_owned()),
            (ActionStatus::Success, "scaled to 7\n".to_owned()),
        ]
    );
    assert_eq!(q.context["tool"], json!("scale"));
    assert_eq!(q.context["command_line"], json!("echo scaled to 100"));
    assert_eq!(
        q.context["dangerous_because"],
        json!("`replicas` matches /^[0-9]{3,}$/")
    );
}

/// A deny wins over a person too: arguments edited, in an approval, into a call a rule denies
/// do not run.
#[tokio::test]
async fn arguments_edited_into_a_denied_call_do_not_run() {
    let script = r#"
steps:
  - tool: deploy
    args: {env: staging, version: "1"}
  - finish: "${observation}"
"#;
    let policy = "rules:\n  - name: no-prod\n    tool: deploy\n    args: {env: production}\n    effect: deny\n    reason: the release team deploys production\n";
    let f = Fixture::new(script, Some(policy));
    let id = f.start().await;
    let q = paused(f.advance(id, None).await.expect("advance"));
    let out = f
        .advance(
            id,
            Some(approve(
                &q,
                json!({"args": {"env": "production", "version": "1"}}),
            )),
        )
        .await
        .expect("approve");
    assert!(
        matches!(&out, Outcome::Completed { result } if result.contains("no-prod")),
        "{out:?}"
    );
    assert_eq!(
        results(&f.journal(id).await),
        [(
            ActionStatus::Rejected,
            "not run: the arguments as alice edited them are denied by policy rule `no-prod`: the release team deploys production".to_owned()
        )]
    );
    assert!(
        f.deploys().is_empty(),
        "nothing deployed: {:?}",
        f.deploys()
    );
}
