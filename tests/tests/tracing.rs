//! One trace follows a run across a pause and a resume on workers, through NATS headers.
//!
//! The worker's spans are collected by the OpenTelemetry SDK's in-memory exporter (the same SDK
//! pipeline OTLP export uses, minus the network), installed as this test process's subscriber.

use std::path::PathBuf;
use std::time::Duration;

use delta_protocol::{
    InteractionRequest, InteractionResponse, Job, JobKind, Responder, RunId, RunStatus, Via,
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
    let start = Job {
        run_id: id,
        kind: JobKind::Start,
        request_id: None,
    };
    q.publish_job("hello", &start, Some(&caller))
        .await
        .expect("publish");
    let msg = tokio::time::timeout(Duration::from_secs(20), requested.next())
        .await
        .expect("the question is announced")
        .expect("message");
    let req: InteractionRequest = serde_json::from_slice(&msg.payload).expect("request");
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
        },
    );
    answer.input = Some("Ada".into());
    assert!(store.answer(&req, &answer).await.expect("answer"));
    let resume = Job {
        run_id: id,
        kind: JobKind::Resume,
        request_id: Some(req.request_id),
    };
    q.publish_job("hello", &resume, Some(&announced))
        .await
        .expect("resume");
    delta_e2e::wait_for_status(&store, id, RunStatus::Completed).await;
    stop.cancel();
    worker.await.expect("join").expect("worker");

    let spans = exporter.get_finished_spans().expect("spans");
    let jobs: Vec<_> = spans.iter().filter(|s| s.name == "job").collect();
    assert_eq!(jobs.len(), 2, "one span per job: the start and the resume");
    for s in &spans {
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
