//! The openai brain against an OpenAI-compatible endpoint served by the test itself.

use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use delta_engine::agent::Agent;
use delta_engine::brain::AnyBrain;
use delta_engine::engine::{Engine, Outcome, PauseMode, Settings};
use delta_protocol::{
    InteractionRequest, InteractionResponse, InteractionType, Responder, RunId, RunStatus, Via,
};
use delta_store::file::FileRunStore;
use delta_store::{RunRecord, RunStore, StoredRun};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// What the fake endpoint received, and what it answers next.
#[derive(Default)]
struct Fake {
    requests: Vec<Value>,
    replies: Vec<(u16, Value)>,
}

type Shared = Arc<Mutex<Fake>>;

async fn completions(
    State(fake): State<Shared>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let mut f = fake.lock().expect("lock");
    let mut body = body;
    body["_auth"] = json!(headers.get("authorization").and_then(|v| v.to_str().ok()));
    f.requests.push(body.clone());
    // The reply may refer to the secret reference the last tool message announced.
    let secret_ref = body["messages"].as_array().and_then(|m| {
        m.iter().rev().find_map(|m| {
            m["content"].as_str().and_then(|c| {
                c.find("{{secret:")
                    .map(|i| c[i..].split("}}").next().unwrap_or("").to_owned() + "}}")
            })
        })
    });
    let (status, reply) = if f.replies.is_empty() {
        (500, json!({"error": {"message": "no more replies"}}))
    } else {
        f.replies.remove(0)
    };
    let text = reply
        .to_string()
        .replace("SECRET_REF", secret_ref.as_deref().unwrap_or(""));
    let mut resp = (StatusCode::from_u16(status).expect("status"), text).into_response();
    resp.headers_mut()
        .insert("content-type", "application/json".parse().expect("hv"));
    if status == 429 {
        resp.headers_mut()
            .insert("retry-after", "0".parse().expect("hv"));
    }
    resp
}

async fn serve(replies: Vec<(u16, Value)>) -> (String, Shared) {
    let fake: Shared = Arc::new(Mutex::new(Fake {
        requests: vec![],
        replies,
    }));
    let app = axum::Router::new()
        .route("/v1/chat/completions", post(completions))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/v1"), fake)
}

fn call(id: &str, name: &str, args: Value) -> Value {
    json!({"id": id, "type": "function", "function": {"name": name, "arguments": args.to_string()}})
}

fn tool_reply(calls: Vec<Value>) -> (u16, Value) {
    (
        200,
        json!({"choices": [{"message": {"role": "assistant", "content": "working", "tool_calls": calls}, "finish_reason": "tool_calls"}]}),
    )
}

fn agent(dir: &std::path::Path, base_url: &str) -> Agent {
    agent_with(dir, base_url, "")
}

/// The test agent, with `extra` top-level config lines.
fn agent_with(dir: &std::path::Path, base_url: &str, extra: &str) -> Agent {
    let a = dir.join("agent");
    std::fs::create_dir_all(&a).expect("mkdir");
    std::fs::write(
        a.join("config.yaml"),
        format!(
            "name: llm\n{extra}llm:\n  model: test-model\n  temperature: 0\n  base_url: {base_url}\n  max_retries: 3\n\
             tools:\n  - name: echo\n    description: echo text\n    exec: \"echo ${{text}}\"\n\
             \x20 - name: login\n    description: log in\n    shell: 'test ${{key}} = opensesame && echo ok'\n\
             \x20   parameters: [{{name: key, secret: true}}]\n"
        ),
    )
    .expect("write");
    std::fs::write(a.join("system_prompt.md"), "You are a test agent.").expect("write");
    Agent::load(&a).expect("agent")
}

/// A fresh run of `t` in `dir`'s store, advanced once: its id, the store and the outcome.
async fn first_decision(
    dir: &std::path::Path,
    agent: &Agent,
    brain: &AnyBrain,
) -> (RunId, FileRunStore, Outcome) {
    let store = FileRunStore::new(dir.join(".delta"));
    let (id, run, settings) = new_run(dir, &store, "t", PauseMode::Park).await;
    let out = Engine::new(
        agent,
        brain,
        &store,
        run,
        settings,
        CancellationToken::new(),
    )
    .advance(None)
    .await
    .expect("advance");
    (id, store, out)
}

/// A fresh run of `task` in `dir`'s store, with the settings a local host would use.
async fn new_run(
    dir: &std::path::Path,
    store: &FileRunStore,
    task: &str,
    pause: PauseMode,
) -> (RunId, StoredRun, Settings) {
    let rec = RunRecord::new(RunId::new(), "llm", task, RunStatus::Running);
    let id = rec.run_id;
    store.create(rec).await.expect("create");
    let settings = Settings {
        worker: "local".into(),
        work_dir: dir.to_path_buf(),
        pause,
    };
    (id, store.load(id).await.expect("load"), settings)
}

#[tokio::test]
async fn the_openai_brain_drives_tools_and_questions_and_never_sees_secrets() {
    let (url, fake) = serve(vec![
        (429, json!({"error": {"message": "slow down"}})),
        tool_reply(vec![call("x1", "echo", json!({"text": "hi"}))]),
        tool_reply(vec![call("x2", "ask_human", json!({"prompt": "password?", "sensitive": true}))]),
        tool_reply(vec![call("x3", "login", json!({"key": "SECRET_REF"}))]),
        (200, json!({"choices": [{"message": {"role": "assistant", "content": "all done"}, "finish_reason": "stop"}]})),
    ])
    .await;
    let dir = tempfile::tempdir().expect("tmp");
    let agent = agent(dir.path(), &url);
    let brain = AnyBrain::for_agent(&agent).expect("brain");
    let store = FileRunStore::new(dir.path().join(".delta"));
    let (id, run, settings) = new_run(dir.path(), &store, "log in please", PauseMode::Hold).await;
    let mut engine = Engine::new(
        &agent,
        &brain,
        &store,
        run,
        settings,
        CancellationToken::new(),
    );
    let q = match engine.advance(None).await.expect("advance") {
        Outcome::Paused(q) => q,
        other => panic!("expected a question, got {other:?}"),
    };
    assert!(q.is_sensitive());
    let answer = InteractionResponse {
        request_id: q.request_id,
        option_id: None,
        input: Some("opensesame".into()),
        data: None,
        feedback: None,
        responder: Responder {
            id: "t".into(),
            via: Via::Stdin,
            on_behalf_of: None,
            relayed_by: None,
        },
        request_hash: None,
    };
    let out = engine.advance(Some(answer)).await.expect("advance");
    assert_eq!(
        out,
        Outcome::Completed {
            result: "all done".into()
        }
    );

    let requests = fake.lock().expect("lock").requests.clone();
    assert_eq!(
        requests.len(),
        5,
        "one retry after the 429, then four decisions"
    );
    let first = &requests[1];
    assert_eq!(first["model"], "test-model");
    assert_eq!(first["messages"][0]["role"], "system");
    assert!(
        first["messages"][0]["content"]
            .as_str()
            .unwrap_or("")
            .starts_with("You are a test agent.")
    );
    assert_eq!(
        first["messages"][1],
        json!({"role": "user", "content": "log in please"})
    );
    let names: Vec<&str> = first["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    assert_eq!(names, ["echo", "login", "ask_human"]);
    // The tool result comes back as a tool message tied to the call.
    let second = requests[2]["messages"].as_array().expect("messages");
    let tool_msg = second
        .iter()
        .find(|m| m["role"] == "tool")
        .expect("tool message");
    assert_eq!(tool_msg["content"], "hi\n");
    let assistant = second
        .iter()
        .find(|m| m["role"] == "assistant")
        .expect("assistant");
    assert_eq!(assistant["tool_calls"][0]["id"], tool_msg["tool_call_id"]);
    // The login tool got the real secret (its check passed) ...
    let last = requests[4]["messages"].as_array().expect("messages");
    assert_eq!(last.last().expect("msg")["content"], "ok\n");
    // ... and no request ever carried it.
    for r in &requests {
        assert!(
            !r.to_string().contains("opensesame"),
            "secret sent to the LLM"
        );
    }
    let journal =
        std::fs::read_to_string(store.execution_dir(id).join("journal.jsonl")).expect("journal");
    assert!(!journal.contains("opensesame"));
}

#[tokio::test]
async fn client_errors_fail_the_run_at_once_and_server_errors_after_retries() {
    for (status, tries, says) in [(400, 1, "HTTP 400"), (503, 3, "after 3 attempts")] {
        let replies = (0..3)
            .map(|_| (status, json!({"error": {"message": "nope"}})))
            .collect();
        let (url, fake) = serve(replies).await;
        let dir = tempfile::tempdir().expect("tmp");
        let agent = agent(dir.path(), &url);
        let brain = match AnyBrain::for_agent(&agent).expect("brain") {
            AnyBrain::Openai(b) => AnyBrain::Openai(Box::new(
                b.with_backoff(std::time::Duration::from_millis(1)),
            )),
            other => other,
        };
        let (id, store, out) = first_decision(dir.path(), &agent, &brain).await;
        match out {
            Outcome::Failed { error } => {
                assert!(error.contains(says) && error.contains("nope"), "{error}")
            }
            other => panic!("expected failure, got {other:?}"),
        }
        assert_eq!(fake.lock().expect("lock").requests.len(), tries);
        assert_eq!(
            store.load(id).await.expect("load").record.status,
            RunStatus::Failed
        );
    }
}

fn said(request: &Value, role: &str) -> Vec<String> {
    request["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == role)
        .filter_map(|m| m["content"].as_str().map(str::to_owned))
        .collect()
}

/// A person's answer on the terminal: an option, maybe with text.
fn ask(q: &InteractionRequest, option: &str, input: Option<&str>) -> InteractionResponse {
    let mut a = InteractionResponse::new(
        q.request_id,
        Responder {
            id: "t".into(),
            via: Via::Stdin,
            on_behalf_of: None,
            relayed_by: None,
        },
    );
    a.option_id = Some(option.into());
    a.input = input.map(str::to_owned);
    a
}

fn paused(o: Outcome) -> InteractionRequest {
    match o {
        Outcome::Paused(q) => *q,
        other => panic!("expected a question, got {other:?}"),
    }
}

#[tokio::test]
async fn the_plan_tool_is_confirmed_by_a_person_and_answers_reach_the_model() {
    let plan = |tasks: Value| tool_reply(vec![call("p", "plan", json!({ "tasks": tasks }))]);
    let (url, fake) = serve(vec![
        plan(json!([{"description": "ask where", "tool": null}, {"description": "echo it", "tool": "echo"}])),
        plan(json!(["ask where", {"description": "echo it twice", "tool": "echo"}])),
        tool_reply(vec![call(
            "c1",
            "ask_human",
            json!({"prompt": "where?", "options": [
                {"id": "here", "label": "Here"},
                {"id": "other", "label": "Somewhere else", "requires_input": true}]}),
        )]),
        (200, json!({"choices": [{"message": {"role": "assistant", "content": "went there"}, "finish_reason": "stop"}]})),
    ])
    .await;
    let dir = tempfile::tempdir().expect("tmp");
    let agent = agent_with(dir.path(), &url, "confirm_plan: true\n");
    let brain = AnyBrain::for_agent(&agent).expect("brain");
    let store = FileRunStore::new(dir.path().join(".delta"));
    let (id, run, settings) = new_run(dir.path(), &store, "go somewhere", PauseMode::Hold).await;
    let mut engine = Engine::new(
        &agent,
        &brain,
        &store,
        run,
        settings,
        CancellationToken::new(),
    );

    let q1 = paused(engine.advance(None).await.expect("advance"));
    assert!(q1.is_plan_confirmation());
    assert_eq!(q1.context["plan"][1]["description"], "echo it");
    let q2 = paused(
        engine
            .advance(Some(ask(&q1, "modify", Some("do it twice"))))
            .await
            .expect("advance"),
    );
    assert_eq!(q2.context["round"], 2);
    assert_eq!(q2.context["plan"][1]["description"], "echo it twice");
    let q3 = paused(
        engine
            .advance(Some(ask(&q2, "confirm", None)))
            .await
            .expect("advance"),
    );
    assert_eq!(q3.kind, InteractionType::UserChoice);
    let out = engine
        .advance(Some(ask(&q3, "other", Some("the moon"))))
        .await
        .expect("advance");
    assert_eq!(
        out,
        Outcome::Completed {
            result: "went there".into()
        }
    );

    let requests = fake.lock().expect("lock").requests.clone();
    assert_eq!(requests.len(), 4);
    let tools: Vec<&str> = requests[0]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    assert_eq!(tools, ["echo", "login", "ask_human", "plan"]);
    // The feedback, then the confirmation, reach the model as the person's words.
    let users = said(&requests[1], "user");
    assert!(
        users
            .iter()
            .any(|m| m.starts_with("Change the plan: do it twice")),
        "{users:?}"
    );
    assert!(
        said(&requests[2], "user")
            .iter()
            .any(|m| m.contains("The plan is confirmed"))
    );
    // The choice with its free text is the ask_human call's observation.
    let tools_said = said(&requests[3], "tool");
    assert_eq!(
        tools_said.last().map(String::as_str),
        Some("chose \"Somewhere else\" (option other): the moon")
    );
    let journal =
        std::fs::read_to_string(store.execution_dir(id).join("journal.jsonl")).expect("journal");
    assert_eq!(journal.matches("\"type\":\"PLAN\"").count(), 2);
}

#[tokio::test]
async fn after_a_plan_is_sent_back_no_tool_runs_until_a_new_plan_is_confirmed() {
    let plan = |tasks: Value| tool_reply(vec![call("p", "plan", json!({ "tasks": tasks }))]);
    let (url, _fake) = serve(vec![
        plan(json!(["echo hi"])),
        // The model acts instead of re-planning: the call must not run.
        tool_reply(vec![call("c0", "echo", json!({"text": "too early"}))]),
        plan(json!(["echo hi twice"])),
        (200, json!({"choices": [{"message": {"role": "assistant", "content": "done"}, "finish_reason": "stop"}]})),
    ])
    .await;
    let dir = tempfile::tempdir().expect("tmp");
    let agent = agent_with(dir.path(), &url, "confirm_plan: true\n");
    let brain = AnyBrain::for_agent(&agent).expect("brain");
    let store = FileRunStore::new(dir.path().join(".delta"));
    let (id, run, settings) = new_run(dir.path(), &store, "t", PauseMode::Hold).await;
    let mut engine = Engine::new(
        &agent,
        &brain,
        &store,
        run,
        settings,
        CancellationToken::new(),
    );
    let q1 = paused(engine.advance(None).await.expect("advance"));
    let q2 = paused(
        engine
            .advance(Some(ask(&q1, "modify", Some("twice"))))
            .await
            .expect("advance"),
    );
    assert_eq!(q2.context["round"], 2, "the second plan is asked again");
    let out = engine
        .advance(Some(ask(&q2, "confirm", None)))
        .await
        .expect("advance");
    assert_eq!(
        out,
        Outcome::Completed {
            result: "done".into()
        }
    );
    let journal =
        std::fs::read_to_string(store.execution_dir(id).join("journal.jsonl")).expect("journal");
    assert!(
        journal.contains("not run: the plan was sent back"),
        "{journal}"
    );
    assert!(
        !journal.contains("too early\\n"),
        "echo never ran: {journal}"
    );
}

#[tokio::test]
async fn the_openai_brain_asks_for_a_typed_answer_and_gets_the_object() {
    let schema = json!({"type": "object", "properties": {
        "email": {"type": "string", "format": "email"},
        "count": {"type": "integer", "minimum": 1}}, "required": ["email"]});
    let (url, fake) = serve(vec![
        // Outside the subset: an error result that says why, and the model tries again.
        tool_reply(vec![call(
            "y1",
            "ask_human",
            json!({"prompt": "who?", "response_schema": {"type": "object", "properties": {"who": {"type": "object"}}}}),
        )]),
        tool_reply(vec![call(
            "y2",
            "ask_human",
            json!({"prompt": "who?", "response_schema": schema}),
        )]),
        (200, json!({"choices": [{"message": {"role": "assistant", "content": "noted"}, "finish_reason": "stop"}]})),
    ])
    .await;
    let dir = tempfile::tempdir().expect("tmp");
    let agent = agent(dir.path(), &url);
    let brain = AnyBrain::for_agent(&agent).expect("brain");
    let store = FileRunStore::new(dir.path().join(".delta"));
    let (_, run, settings) = new_run(dir.path(), &store, "t", PauseMode::Hold).await;
    let mut engine = Engine::new(
        &agent,
        &brain,
        &store,
        run,
        settings,
        CancellationToken::new(),
    );
    let q = match engine.advance(None).await.expect("advance") {
        Outcome::Paused(q) => q,
        other => panic!("expected a question, got {other:?}"),
    };
    assert_eq!(q.response_schema.as_ref(), Some(&schema));
    let data = json!({"email": "ada@example.com", "count": 2});
    let mut answer = InteractionResponse::new(
        q.request_id,
        Responder {
            id: "t".into(),
            via: Via::Stdin,
            on_behalf_of: None,
            relayed_by: None,
        },
    );
    answer.data = Some(data.clone());
    let out = engine.advance(Some(answer)).await.expect("advance");
    assert_eq!(
        out,
        Outcome::Completed {
            result: "noted".into()
        }
    );
    let requests = fake.lock().expect("lock").requests.clone();
    // The model is offered `response_schema` on `ask_human`.
    let ask = requests[0]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .find(|t| t["function"]["name"] == "ask_human")
        .expect("ask_human")
        .clone();
    assert_eq!(
        ask["function"]["parameters"]["properties"]["response_schema"]["type"],
        "object"
    );
    // The latest tool result each request carries (the engine names the calls itself).
    let tool_text = |r: &Value| {
        r["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .rev()
            .find(|m| m["role"] == "tool")
            .and_then(|m| m["content"].as_str())
            .map(str::to_owned)
            .expect("tool message")
    };
    let refused = tool_text(&requests[1]);
    assert!(
        refused.starts_with("[error] ask_human: response_schema property `who`"),
        "{refused}"
    );
    let got = tool_text(&requests[2]);
    assert_eq!(
        serde_json::from_str::<Value>(&got).expect("the result is the object"),
        data
    );
}

/// What a model's endpoint sends is bounded: a body past `MAX_RESPONSE_BYTES` fails the run
/// without being read whole; an error that echoes the key is journaled without it; a response
/// with more tool calls than one may make has the first `MAX_CALLS_PER_RESPONSE` of them run.
#[tokio::test]
async fn what_the_endpoint_sends_is_bounded() {
    use delta_engine::brain::openai::{MAX_CALLS_PER_RESPONSE, MAX_RESPONSE_BYTES, OpenAiBrain};
    const KEY: &str = "sk-test-KEY-0123456789";
    let huge = "x".repeat(MAX_RESPONSE_BYTES + 1);
    let many: Vec<Value> = (0..MAX_CALLS_PER_RESPONSE + 8)
        .map(|i| call(&format!("c{i}"), "echo", json!({"text": format!("n{i}")})))
        .collect();
    let cases = [
        (
            vec![(
                200,
                json!({"choices": [{"message": {"role": "assistant", "content": huge}}]}),
            )],
            "larger than",
        ),
        (
            vec![(
                400,
                json!({"error": {"message": format!("bad key {KEY} for this model")}}),
            )],
            "bad key *** for this model",
        ),
        // The key across the 300-character cut: masked before it is cut, no start of it left.
        (
            vec![(
                400,
                json!({"error": {"message": format!("{} {KEY} tail", "x".repeat(290))}}),
            )],
            "x ***",
        ),
        (vec![tool_reply(many)], "no more replies"),
    ];
    for (replies, says) in cases {
        let (url, _fake) = serve(replies).await;
        let dir = tempfile::tempdir().expect("tmp");
        let agent = agent(dir.path(), &url);
        let brain = OpenAiBrain::with_env(&agent, &|name| {
            (name == "OPENAI_API_KEY").then(|| KEY.to_owned())
        })
        .expect("brain")
        .with_backoff(std::time::Duration::from_millis(1));
        let brain = AnyBrain::Openai(Box::new(brain));
        let (id, store, out) = first_decision(dir.path(), &agent, &brain).await;
        let Outcome::Failed { error } = out else {
            panic!("expected failure, got {out:?}");
        };
        assert!(error.contains(says), "{says}: {error}");
        let journal =
            serde_json::to_string(&store.load(id).await.expect("load").journal).expect("json");
        assert!(!journal.contains(KEY), "the key in the journal");
        assert!(
            !journal.contains(&KEY[..8]),
            "the key's start in the journal"
        );
        if says == "no more replies" {
            let requests = journal.matches("\"ACTION_REQUEST\"").count();
            assert_eq!(requests, MAX_CALLS_PER_RESPONSE, "{journal}");
        }
    }
}
