//! One trace follows a run across a pause and a resume on workers, through NATS headers; and,
//! with the fleet's real programs exporting to a real OTLP receiver, the decision of each
//! question is in it: the gateway's `interaction` span from asked to decided, between the
//! worker's `job` that asked and the `job` that resumed, with the answer's handling below it.
//!
//! The first test collects an in-process worker's spans with the OpenTelemetry SDK's in-memory
//! exporter (the same SDK pipeline OTLP export uses, minus the network), installed as this test
//! process's subscriber. The others start `delta-gateway` and `delta-worker` processes with
//! `OTEL_EXPORTER_OTLP_ENDPOINT` pointing at an OTLP/gRPC receiver served here ([`otlp`]).

use std::path::PathBuf;
use std::time::Duration;

use delta_protocol::{
    InteractionRequest, InteractionResponse, Job, Responder, RunId, RunStatus, Via,
};
use delta_queue::Queue;
use delta_store::{RunRecord, RunStore};
use delta_worker::fleet::{self, Config};
use futures_util::StreamExt;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

fn parts(traceparent: &str) -> (String, String) {
    let p: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(p.len(), 4, "a W3C traceparent: {traceparent}");
    (p[1].to_owned(), p[2].to_owned())
}

#[tokio::test]
async fn a_trace_follows_a_run_through_its_pause_and_resume() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")))
        .init();

    // One server of each, or clusters with DELTA_TEST_CLUSTER=1 (`delta_e2e::servers`).
    let (nats, redis) = (
        delta_e2e::servers::NatsServers::start(),
        delta_e2e::servers::RedisServers::start(),
    );
    let work = tempfile::tempdir().expect("tmp");
    let store = redis.store("tr", None).await;
    let q = Queue::connect(&nats.url(), "tr", &nats.queue_settings())
        .await
        .expect("nats");
    let client = delta_e2e::nats_client(&nats.url()).await;
    let mut requested = client
        .subscribe("tr.interactions.requested.>")
        .await
        .expect("subscribe");
    let stop = CancellationToken::new();
    let worker = tokio::spawn(fleet::run(
        Config {
            nats_url: nats.url(),
            redis_url: redis.url(),
            redis_ca: None,
            prefix: "tr".into(),
            agents_dir: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/agents"),
            work_dir: work.path().to_path_buf(),
            concurrency: 2,
            resume_slots: fleet::default_resume_slots(2),
            queue: nats.queue_settings(),
            worker_id: "traced".into(),
            grace: Duration::from_secs(5),
            secrets_key: None,
            retention: None,
            sweep_every: Duration::from_secs(600),
            durability: redis.durability(),
            redis_cluster: redis.is_cluster(),
            redis_buckets: None,
        },
        stop.clone(),
    ));

    let rec = RunRecord::new(RunId::new(), "hello", "say hi", RunStatus::Queued);
    let id = rec.run_id;
    store.create(rec).await.expect("create");
    let caller = format!("00-{TRACE}-{CALLER_SPAN}-01");
    let start = Job::start(id);
    q.publish_job("hello", &start, Some(&caller))
        .await
        .expect("publish");
    let msg = tokio::time::timeout(Duration::from_secs(20), requested.next())
        .await
        .expect("the question is announced")
        .expect("message");
    let req: InteractionRequest = delta_protocol::events::decode(&msg.payload)
        .expect("a CloudEvent of a request")
        .data;
    let announced = msg
        .headers
        .as_ref()
        .and_then(|h| h.get("traceparent"))
        .map(|v| v.as_str().to_owned())
        .expect("the announcement carries a traceparent");
    let (trace, parent) = parts(&announced);
    assert_eq!(trace, TRACE, "same trace as the submitter's");
    assert_ne!(
        parent, CALLER_SPAN,
        "the worker's own span is the next parent"
    );

    // Whoever answers resumes with the announcement's trace context (the gateway's job).
    let mut answer = InteractionResponse::new(
        req.request_id,
        Responder {
            id: "alice".into(),
            via: Via::Http,
            on_behalf_of: None,
            relayed_by: None,
        },
    );
    answer.input = Some("Ada".into());
    assert!(store.answer(&req, &answer).await.expect("answer"));
    let resume = Job::resume(id, Some(req.request_id));
    q.publish_job("hello", &resume, Some(&announced))
        .await
        .expect("resume");
    delta_e2e::wait_for_status(&store, id, RunStatus::Completed).await;
    stop.cancel();
    worker.await.expect("join").expect("worker");

    let spans = exporter.get_finished_spans().expect("spans");
    let jobs: Vec<_> = spans.iter().filter(|s| s.name == "job").collect();
    assert_eq!(jobs.len(), 2, "one span per job: the start and the resume");
    // Only the run's spans: the other tests of this file run an OTLP receiver in this process,
    // whose libraries' spans this subscriber sees too.
    for s in spans
        .iter()
        .filter(|s| ["job", "decide", "tool"].contains(&s.name.as_ref()))
    {
        assert_eq!(
            s.span_context.trace_id().to_string(),
            TRACE,
            "span `{}` belongs to the run's trace",
            s.name
        );
    }
    let parents: Vec<String> = jobs.iter().map(|s| s.parent_span_id.to_string()).collect();
    assert!(parents.contains(&CALLER_SPAN.to_owned()), "{parents:?}");
    assert!(
        parents.contains(&parent),
        "the resume continues from the pause: {parents:?}"
    );
    let run_id = id.to_string();
    for name in ["job", "decide", "tool"] {
        let tagged = spans.iter().filter(|s| s.name == name).any(|s| {
            s.attributes
                .iter()
                .any(|kv| kv.key.as_str() == "run_id" && kv.value.as_str() == run_id.as_str())
        });
        assert!(tagged, "a `{name}` span carries run_id");
    }
}

/// A real OTLP/gRPC trace receiver: the collector's `TraceService`, on hyper's HTTP/2 server,
/// keeping every span it is sent.
mod otlp {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
        TraceService, TraceServiceServer,
    };
    use opentelemetry_proto::tonic::collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
    };
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
    use serde_json::Value;

    /// One span as received.
    #[derive(Clone, Debug)]
    pub struct Span {
        /// The resource's `service.name`.
        pub service: String,
        pub name: String,
        pub trace_id: String,
        pub span_id: String,
        /// Empty for a root span.
        pub parent: String,
        pub start_ns: u64,
        pub end_ns: u64,
        pub attrs: HashMap<String, Value>,
        /// Each event's name and attributes.
        pub events: Vec<(String, HashMap<String, Value>)>,
    }

    impl Span {
        /// An attribute as JSON (`Null` when absent).
        pub fn attr(&self, key: &str) -> Value {
            self.attrs.get(key).cloned().unwrap_or(Value::Null)
        }
    }

    fn value(v: &AnyValue) -> Value {
        match &v.value {
            Some(any_value::Value::StringValue(s)) => Value::from(s.clone()),
            Some(any_value::Value::BoolValue(b)) => Value::from(*b),
            Some(any_value::Value::IntValue(i)) => Value::from(*i),
            Some(any_value::Value::DoubleValue(d)) => Value::from(*d),
            Some(any_value::Value::ArrayValue(a)) => {
                Value::Array(a.values.iter().map(value).collect())
            }
            Some(other) => Value::from(format!("{other:?}")),
            None => Value::Null,
        }
    }

    fn map(kvs: &[KeyValue]) -> HashMap<String, Value> {
        kvs.iter()
            .map(|kv| {
                (
                    kv.key.clone(),
                    kv.value.as_ref().map(value).unwrap_or(Value::Null),
                )
            })
            .collect()
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[derive(Clone, Default)]
    struct Collect(Arc<Mutex<Vec<Span>>>);

    #[tonic::async_trait]
    impl TraceService for Collect {
        async fn export(
            &self,
            request: tonic::Request<ExportTraceServiceRequest>,
        ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
            let mut got = vec![];
            for rs in request.into_inner().resource_spans {
                let service = rs
                    .resource
                    .as_ref()
                    .and_then(|r| map(&r.attributes).remove("service.name"))
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                for ss in rs.scope_spans {
                    for s in ss.spans {
                        got.push(Span {
                            service: service.clone(),
                            name: s.name,
                            trace_id: hex(&s.trace_id),
                            span_id: hex(&s.span_id),
                            parent: hex(&s.parent_span_id),
                            start_ns: s.start_time_unix_nano,
                            end_ns: s.end_time_unix_nano,
                            attrs: map(&s.attributes),
                            events: s
                                .events
                                .iter()
                                .map(|e| (e.name.clone(), map(&e.attributes)))
                                .collect(),
                        });
                    }
                }
            }
            self.0.lock().expect("lock").extend(got);
            Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
        }
    }

    /// The receiver, serving until dropped.
    pub struct Receiver {
        /// `http://127.0.0.1:<port>`: the programs' `OTEL_EXPORTER_OTLP_ENDPOINT`.
        pub endpoint: String,
        spans: Arc<Mutex<Vec<Span>>>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Drop for Receiver {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    impl Receiver {
        pub async fn start() -> Self {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
            let collect = Collect::default();
            let spans = collect.0.clone();
            let service = TraceServiceServer::new(collect);
            let task = tokio::spawn(async move {
                while let Ok((io, _)) = listener.accept().await {
                    let service = service.clone();
                    tokio::spawn(async move {
                        let _ = hyper::server::conn::http2::Builder::new(
                            hyper_util::rt::TokioExecutor::new(),
                        )
                        .serve_connection(
                            hyper_util::rt::TokioIo::new(io),
                            hyper_util::service::TowerToHyperService::new(service),
                        )
                        .await;
                    });
                }
            });
            Self {
                endpoint,
                spans,
                task,
            }
        }

        /// Waits (up to 20 s) until the spans received so far satisfy `done`, and returns them.
        pub async fn wait_for(&self, what: &str, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let spans = self.spans.lock().expect("lock").clone();
                if done(&spans) {
                    return spans;
                }
                assert!(
                    Instant::now() < deadline,
                    "the receiver never got {what}; it got: {:#?}",
                    spans
                        .iter()
                        .map(|s| (&s.service, &s.name, &s.attrs))
                        .collect::<Vec<_>>()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

use delta_e2e::fleet::Fleet;
use otlp::Span;
use serde_json::{Value, json};

/// A fleet (one gateway, one worker) exporting its spans to a fresh OTLP receiver, with the
/// batch exporter sending every 100 ms.
async fn traced_fleet(prefix: &str) -> (Fleet, otlp::Receiver) {
    let receiver = otlp::Receiver::start().await;
    let otel = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.clone()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
    ];
    let mut fleet = Fleet::start_with(prefix, 1, 0, |spec| spec.extra.extend(otel.clone())).await;
    fleet.worker_spec.extra.extend(otel.clone());
    fleet.add_worker("w0");
    (fleet, receiver)
}

/// What the trace of a paused and decided question must show.
struct Decided {
    /// The question's view from the API (its `created_at`, `request_hash`).
    view: Value,
    interaction: Span,
    /// The run's `job` spans: the one that asked, the one that resumed.
    asked: Span,
    resumed: Span,
    /// Every span of the run's trace.
    trace: Vec<Span>,
}

/// Waits for a run's spans after its question `rid` was decided, and checks what every decided
/// question's trace shows: the worker's `job` that asked, the gateway's `interaction` as its
/// child starting when the question was asked, the `job` that resumed as the interaction's
/// child, one trace for all, and nothing of `secret` in any span.
async fn decided(
    fleet: &Fleet,
    rx: &otlp::Receiver,
    run: RunId,
    rid: &str,
    secret: &str,
) -> Decided {
    let (status, view) = fleet
        .client
        .get(&format!("/v1/interactions/{rid}"))
        .await
        .expect("question");
    assert_eq!(status, 200, "{view}");
    let run_s = run.to_string();
    let of_run = |s: &Span| s.attr("run_id") == json!(run_s);
    let spans = rx
        .wait_for("the run's two jobs and its interaction", |spans| {
            spans
                .iter()
                .filter(|s| s.name == "job" && of_run(s))
                .count()
                == 2
                && spans.iter().any(|s| {
                    s.name == "interaction" && s.attr("delta.interaction.request_id") == json!(rid)
                })
        })
        .await;
    let interaction = spans
        .iter()
        .find(|s| s.name == "interaction" && s.attr("delta.interaction.request_id") == json!(rid))
        .expect("interaction")
        .clone();
    assert_eq!(interaction.service, "delta-gateway");
    let trace: Vec<Span> = spans
        .iter()
        .filter(|s| s.trace_id == interaction.trace_id)
        .cloned()
        .collect();
    let jobs: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == "job" && of_run(s))
        .collect();
    for j in &jobs {
        assert_eq!(j.service, "delta-worker");
        assert_eq!(j.trace_id, interaction.trace_id, "one trace for the run");
    }
    let asked = jobs
        .iter()
        .find(|j| j.span_id == interaction.parent)
        .unwrap_or_else(|| panic!("the interaction's parent is the job that asked: {jobs:#?}"))
        .to_owned()
        .clone();
    let resumed = jobs
        .iter()
        .find(|j| j.parent == interaction.span_id)
        .unwrap_or_else(|| panic!("the resumed job is the interaction's child: {jobs:#?}"))
        .to_owned()
        .clone();
    for name in ["decide", "tool"] {
        assert!(
            trace.iter().any(|s| s.name == name && of_run(s)),
            "the worker's `{name}` spans are in the trace"
        );
    }
    // It starts when the question was asked (the stored timestamp, to the microsecond) and
    // ends when it was decided.
    let asked_at: delta_protocol::Timestamp =
        serde_json::from_value(view["created_at"].clone()).expect("created_at");
    let asked_ns = u64::try_from(asked_at.micros()).expect("after 1970") * 1000;
    assert!(
        interaction.start_ns.abs_diff(asked_ns) < 1_000_000,
        "starts when asked: {} vs {asked_ns}",
        interaction.start_ns
    );
    assert!(interaction.end_ns >= interaction.start_ns);
    assert!(resumed.start_ns >= interaction.start_ns);
    let wait_ms = interaction
        .attr("delta.interaction.wait_ms")
        .as_i64()
        .expect("wait_ms");
    let span_ms = ((interaction.end_ns - interaction.start_ns) / 1_000_000) as i64;
    assert!(
        (wait_ms - span_ms).abs() <= 50,
        "wait {wait_ms} ms, span {span_ms} ms"
    );
    assert_eq!(interaction.attr("gen_ai.conversation.id"), json!(run_s));
    assert_eq!(
        interaction.attr("delta.interaction.request_hash"),
        view["request_hash"]
    );
    assert_eq!(interaction.attr("delta.interaction.type"), view["type"]);
    assert_eq!(interaction.attr("gen_ai.agent.name"), view["agent"]);
    for s in &spans {
        let text = format!("{:?} {:?}", s.attrs, s.events);
        assert!(
            !text.contains(secret),
            "`{}` holds what was answered: {text}",
            s.name
        );
    }
    Decided {
        view,
        interaction,
        asked,
        resumed,
        trace,
    }
}

/// The `answer` spans of question `rid`, in the order they started.
fn answers(d: &Decided, rid: &str) -> Vec<Span> {
    let mut a: Vec<Span> = d
        .trace
        .iter()
        .filter(|s| s.name == "answer" && s.attr("delta.interaction.request_id") == json!(rid))
        .cloned()
        .collect();
    a.sort_by_key(|s| s.start_ns);
    a
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_over_http_is_in_the_runs_trace() {
    let (fleet, rx) = traced_fleet("trh").await;
    let run = fleet.submit("hello", "greet").await;
    let rid = fleet.pending(run).await;
    let (status, body) = fleet
        .answer(
            &rid,
            json!({"option_id": "nope", "responder": {"id": "mallory"}}),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    let refused = body["error"]["code"].clone();
    let (status, body) = fleet
        .answer(
            &rid,
            json!({"input": "Ada-the-answer", "responder": {"id": "alice"}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    fleet.wait_status(run, RunStatus::Completed).await;
    let d = decided(&fleet, &rx, run, &rid, "Ada-the-answer").await;
    let i = &d.interaction;
    assert_eq!(i.attr("delta.interaction.type"), json!("USER_INPUT"));
    assert_eq!(i.attr("delta.interaction.state"), json!("ANSWERED"));
    assert_eq!(i.attr("delta.decision.source"), json!("answer"));
    assert_eq!(i.attr("delta.decision.action"), json!("PROVIDE_INFO"));
    assert_eq!(i.attr("delta.responder.id"), json!("alice"));
    assert_eq!(i.attr("delta.responder.via"), json!("http"));
    assert_eq!(i.attr("delta.interaction.sensitive"), json!(false));
    assert_eq!(i.attr("gen_ai.tool.name"), json!("ask_human"));
    assert_eq!(
        i.attr("gen_ai.tool.call.id"),
        d.view["request"]["context"]["action_id"]
    );
    let a = answers(&d, &rid);
    assert_eq!(a.len(), 2, "two answers handled: {a:#?}");
    assert_eq!(a[0].attr("delta.answer.status"), json!("refused"));
    assert_eq!(a[0].attr("error.type"), refused);
    assert_eq!(a[0].attr("delta.responder.id"), json!("mallory"));
    assert_eq!(
        a[0].parent, d.asked.span_id,
        "a refused answer hangs from the job that asked"
    );
    let a = &a[1];
    assert_eq!(a.service, "delta-gateway");
    assert_eq!(
        a.parent, i.span_id,
        "the answer's handling is the interaction's child"
    );
    assert_eq!(a.attr("delta.answer.status"), json!("accepted"));
    assert_eq!(a.attr("delta.responder.via"), json!("http"));
    assert!(a.start_ns >= i.start_ns && a.end_ns <= i.end_ns);
    assert_ne!(d.asked.span_id, d.resumed.span_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bots_answer_over_nats_is_in_the_runs_trace() {
    let (fleet, rx) = traced_fleet("trn").await;
    let run = fleet.submit("chooser", "the demo").await;
    let rid = fleet.pending(run).await;
    let nc = fleet.nats().await;
    let reply = delta_e2e::fleet::bot_answer(
        &nc,
        "trn",
        &rid,
        serde_json::to_vec(&json!({"option_id": "staging", "feedback": "fb-secret", "responder": {"id": "chatbot"}}))
            .expect("json"),
        None,
    )
    .await;
    assert_eq!(reply["ok"], true, "{reply}");
    fleet.wait_status(run, RunStatus::Completed).await;
    let d = decided(&fleet, &rx, run, &rid, "fb-secret").await;
    let i = &d.interaction;
    let action = d.view["request"]["options"]
        .as_array()
        .and_then(|o| o.iter().find(|o| o["option_id"] == "staging"))
        .map(|o| o["action"].clone())
        .expect("the option");
    assert_eq!(i.attr("delta.interaction.type"), json!("USER_CHOICE"));
    assert_eq!(i.attr("delta.decision.option_id"), json!("staging"));
    assert_eq!(i.attr("delta.decision.action"), action);
    assert_eq!(i.attr("delta.responder.id"), json!("chatbot"));
    assert_eq!(i.attr("delta.responder.via"), json!("nats"));
    let a = answers(&d, &rid);
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].parent, i.span_id);
    assert_eq!(a[0].attr("delta.responder.via"), json!("nats"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_decided_by_two_approvals_is_in_the_runs_trace() {
    let (fleet, rx) = traced_fleet("trq").await;
    fleet.add_agent(
        "pair",
        "name: pair\nbrain: scripted\ntools:\n  - name: echo\n    exec: \"echo ${text}\"\n    idempotent: true\n",
        "steps:\n  - ask_human:\n      prompt: \"Ship it?\"\n      approvals: {min: 2}\n      options:\n        - {id: ship, label: Ship, action: APPROVE_AND_EXECUTE}\n        - {id: stop, label: Stop, action: REJECT_WITH_REASON}\n  - tool: echo\n    args: {text: \"shipping\"}\n  - finish: \"answered ${answer}\"\n",
    );
    let run = fleet.submit("pair", "release").await;
    let rid = fleet.pending(run).await;
    let vote = |who: &str| json!({"option_id": "ship", "input": "vote-reason-secret", "responder": {"id": who}});
    let (status, body) = fleet.answer(&rid, vote("alice")).await;
    assert_eq!(
        (status, body["status"].clone()),
        (200, json!("counted")),
        "{body}"
    );
    let (status, body) = fleet.answer(&rid, vote("bob")).await;
    assert_eq!(
        (status, body["status"].clone()),
        (200, json!("accepted")),
        "{body}"
    );
    fleet.wait_status(run, RunStatus::Completed).await;
    let d = decided(&fleet, &rx, run, &rid, "vote-reason-secret").await;
    let i = &d.interaction;
    assert_eq!(i.attr("delta.decision.source"), json!("quorum"));
    assert_eq!(i.attr("delta.decision.option_id"), json!("ship"));
    assert_eq!(
        i.attr("delta.decision.action"),
        json!("APPROVE_AND_EXECUTE")
    );
    assert_eq!(
        i.attr("delta.responder.id"),
        json!("bob"),
        "the vote that decided"
    );
    assert_eq!(i.attr("delta.votes.count"), json!(2));
    assert_eq!(i.attr("delta.votes.needed"), json!(2));
    assert_eq!(i.attr("delta.votes.approvals"), json!(2));
    assert_eq!(i.attr("delta.votes.rejections"), json!(0));
    assert_eq!(i.attr("delta.votes.approved_by"), json!(["alice", "bob"]));
    let votes: Vec<&Value> = i
        .events
        .iter()
        .filter(|(n, _)| n == "vote")
        .map(|(_, a)| &a["delta.responder.id"])
        .collect();
    assert_eq!(
        votes,
        [&json!("alice"), &json!("bob")],
        "one event per vote"
    );
    let a = answers(&d, &rid);
    assert_eq!(a.len(), 2, "two votes handled");
    assert_eq!(a[0].attr("delta.answer.status"), json!("counted"));
    assert_eq!(
        a[0].parent, d.asked.span_id,
        "a vote that decided nothing hangs from the job that asked"
    );
    assert_eq!(a[1].attr("delta.answer.status"), json!("accepted"));
    assert_eq!(
        a[1].parent, i.span_id,
        "the deciding vote is the interaction's child"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_and_an_escalated_question_are_in_their_runs_traces() {
    let (fleet, rx) = traced_fleet("tre").await;
    fleet.add_agent(
        "nudged",
        "name: nudged\nbrain: scripted\ntools:\n  - name: echo\n    exec: \"echo ${text}\"\n    idempotent: true\n",
        "steps:\n  - ask_human:\n      prompt: \"Restart?\"\n      default_option_id: later\n      escalation:\n        - {after: 1s, remind: true}\n        - {after: 2s, apply_default: true}\n      options:\n        - {id: now, label: Now}\n        - {id: later, label: Later}\n  - tool: echo\n    args: {text: \"chose ${answer}\"}\n  - finish: \"chose ${answer}\"\n",
    );
    let timed = fleet.submit("timed", "wait").await;
    let nudged = fleet.submit("nudged", "wait").await;
    let timed_rid = fleet.pending(timed).await;
    let nudged_rid = fleet.pending(nudged).await;
    fleet.wait_status(timed, RunStatus::Completed).await;
    fleet.wait_status(nudged, RunStatus::Completed).await;

    let d = decided(&fleet, &rx, timed, &timed_rid, "\u{0}").await;
    let i = &d.interaction;
    assert_eq!(i.attr("delta.interaction.state"), json!("EXPIRED"));
    assert_eq!(i.attr("delta.decision.source"), json!("deadline"));
    assert_eq!(i.attr("delta.responder.id"), json!("timeout"));
    assert_eq!(i.attr("delta.responder.via"), json!("timeout"));
    assert_eq!(i.attr("delta.decision.option_id"), json!("later"));
    let wait_ms = i.attr("delta.interaction.wait_ms").as_i64().expect("wait");
    assert!(wait_ms >= 2000, "waited out its 2 s deadline: {wait_ms} ms");
    assert!(answers(&d, &timed_rid).is_empty(), "nobody answered");

    let d = decided(&fleet, &rx, nudged, &nudged_rid, "\u{0}").await;
    let i = &d.interaction;
    assert_eq!(i.attr("delta.interaction.state"), json!("EXPIRED"));
    assert_eq!(i.attr("delta.decision.source"), json!("escalation"));
    assert_eq!(i.attr("delta.decision.option_id"), json!("later"));
    assert_eq!(i.attr("delta.escalation.steps"), json!(2));
    assert_eq!(i.attr("delta.escalation.of"), json!(2));
    let steps: Vec<(Value, Value)> = i
        .events
        .iter()
        .filter(|(n, _)| n == "escalated")
        .map(|(_, a)| {
            (
                a["delta.escalation.step"].clone(),
                a["delta.escalation.apply_default"].clone(),
            )
        })
        .collect();
    assert_eq!(
        steps,
        [(json!(1), json!(false)), (json!(2), json!(true))],
        "one event per escalation step"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_tool_approval_is_in_the_runs_trace() {
    let (fleet, rx) = traced_fleet("trc").await;
    let run = fleet.submit("gated", "shout").await;
    let rid = fleet.pending(run).await;
    let (status, body) = fleet
        .client
        .post(
            &format!("/v1/runs/{run}/cancel"),
            &json!({"reason": "cancel-reason-secret"}),
        )
        .await
        .expect("cancel");
    assert_eq!(status, 200, "{body}");
    let run_s = run.to_string();
    let spans = rx
        // The worker's job span and the gateway's interaction span come from two processes,
        // each exporting on its own schedule: both are waited for.
        .wait_for(
            "the cancelled question's interaction and its job",
            |spans| {
                spans.iter().any(|s| {
                    s.name == "interaction" && s.attr("delta.interaction.request_id") == json!(rid)
                }) && spans
                    .iter()
                    .any(|s| s.name == "job" && s.attr("run_id") == json!(run_s))
            },
        )
        .await;
    let i = spans
        .iter()
        .find(|s| s.name == "interaction")
        .expect("interaction");
    let asked = spans
        .iter()
        .find(|s| s.name == "job" && s.attr("run_id") == json!(run_s))
        .expect("the job that asked");
    assert_eq!(i.parent, asked.span_id, "the interaction's parent asked");
    assert_eq!(i.trace_id, asked.trace_id);
    assert_eq!(i.attr("delta.interaction.type"), json!("TOOL_APPROVAL"));
    assert_eq!(i.attr("delta.interaction.state"), json!("CANCELLED"));
    assert_eq!(i.attr("delta.decision.source"), json!("cancel"));
    assert_eq!(i.attr("delta.responder.id"), json!("an operator"));
    assert_eq!(
        i.attr("gen_ai.tool.name"),
        json!("shout"),
        "the call awaiting approval"
    );
    assert!(i.attr("gen_ai.tool.call.id").is_string());
    for s in &spans {
        let text = format!("{:?} {:?}", s.attrs, s.events);
        assert!(!text.contains("cancel-reason-secret"), "{text}");
    }
}
