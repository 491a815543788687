//! The fleet worker against real nats-server and redis-server processes.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use delta_shared::protocol::{
    Event, InteractionRequest, InteractionResponse, Job, JobKind, Responder, RunId, RunStatus, Via,
};
use delta_shared::store::redis::RedisRunStore;
use delta_shared::store::{RunRecord, RunStore};
use delta_worker::fleet::{self, Config};
use delta_worker::queue::{self, Queue};
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

fn config(
    nats: &delta_e2e::Nats,
    redis: &delta_e2e::Redis,
    prefix: &str,
    id: &str,
    work: &Path,
) -> Config {
    Config {
        nats_url: nats.url(),
        redis_url: redis.url(),
        prefix: prefix.into(),
        agents_dir: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/agents"),
        work_dir: work.to_path_buf(),
        concurrency: 4,
        queue: queue::Settings {
            ack_wait: Duration::from_secs(5),
            max_deliver: 3,
            ..Default::default()
        },
        worker_id: id.into(),
        grace: Duration::from_secs(5),
    }
}

struct Worker {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), fleet::Error>>,
}

fn start(config: Config) -> Worker {
    let stop = CancellationToken::new();
    let task = tokio::spawn(fleet::run(config, stop.clone()));
    Worker { stop, task }
}

impl Worker {
    async fn stop(self) {
        self.stop.cancel();
        self.task.await.expect("join").expect("worker ran cleanly");
    }
}

async fn wait_for(store: &RedisRunStore, id: RunId, status: RunStatus) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = store.load(id).await.expect("load").record.status;
        if now == status {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "run {id} is {now}, expected {status}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn submit(store: &RedisRunStore, q: &Queue, agent: &str, task: &str) -> RunId {
    let rec = RunRecord::new(RunId::new(), agent, task, RunStatus::Queued);
    let id = rec.run_id;
    store.create(rec).await.expect("create");
    q.publish_job(
        agent,
        &Job {
            run_id: id,
            kind: JobKind::Start,
            request_id: None,
        },
        None,
    )
    .await
    .expect("publish");
    id
}

#[tokio::test]
async fn a_run_paused_on_one_worker_is_resumed_by_another() {
    let (nats, redis) = (
        delta_e2e::Nats::start().expect("nats"),
        delta_e2e::Redis::start().expect("redis"),
    );
    let work = tempfile::tempdir().expect("tmp");
    let store = RedisRunStore::connect(&redis.url(), "fa")
        .await
        .expect("redis");
    let q = Queue::connect(&nats.url(), "fa", &queue::Settings::default())
        .await
        .expect("nats");
    let client = async_nats::connect(&nats.url()).await.expect("connect");
    let mut requested = client
        .subscribe("fa.interactions.requested.>")
        .await
        .expect("subscribe");

    let a = start(config(&nats, &redis, "fa", "worker-a", work.path()));
    let id = submit(&store, &q, "hello", "say hi").await;
    wait_for(&store, id, RunStatus::WaitingForInput).await;
    let msg = tokio::time::timeout(Duration::from_secs(10), requested.next())
        .await
        .expect("announced")
        .expect("msg");
    assert_eq!(
        msg.subject.as_str(),
        format!("fa.interactions.requested.hello.{id}")
    );
    let req: InteractionRequest = serde_json::from_slice(&msg.payload).expect("request JSON");
    assert_eq!(req.prompt, "What is your name?");
    a.stop().await;

    let b = start(config(&nats, &redis, "fa", "worker-b", work.path()));
    let mut answer = InteractionResponse::new(
        req.request_id,
        Responder {
            id: "alice".into(),
            via: Via::Http,
        },
    );
    answer.input = Some("Ada".into());
    assert!(store.answer(id, &answer).await.expect("answer"));
    assert!(
        !store.answer(id, &answer).await.expect("second answer"),
        "first answer wins"
    );
    let resume = Job {
        run_id: id,
        kind: JobKind::Resume,
        request_id: Some(req.request_id),
    };
    q.publish_job("hello", &resume, None).await.expect("resume");
    q.publish_job("hello", &resume, None)
        .await
        .expect("duplicate resume is dropped");
    wait_for(&store, id, RunStatus::Completed).await;
    b.stop().await;

    let run = store.load(id).await.expect("load");
    assert_eq!(run.record.result.as_deref(), Some("Greeted Ada."));
    let workers: Vec<String> = run
        .journal
        .iter()
        .filter_map(|e| match &e.event {
            Event::EngineStart(s) => Some(s.worker.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(workers, ["worker-a", "worker-b"]);
    let received = run
        .journal
        .iter()
        .filter(|e| matches!(e.event, Event::HumanInputReceived(_)))
        .count();
    assert_eq!(received, 1, "the answer was applied once");
}

#[tokio::test]
async fn poison_jobs_are_dead_lettered_and_their_runs_failed() {
    let (nats, redis) = (
        delta_e2e::Nats::start().expect("nats"),
        delta_e2e::Redis::start().expect("redis"),
    );
    let work = tempfile::tempdir().expect("tmp");
    let store = RedisRunStore::connect(&redis.url(), "fb")
        .await
        .expect("redis");
    let q = Queue::connect(&nats.url(), "fb", &queue::Settings::default())
        .await
        .expect("nats");
    let w = start(config(&nats, &redis, "fb", "worker-p", work.path()));

    let broken = submit(&store, &q, "no-such-agent", "t").await;
    q.publish_job(
        "hello",
        &Job {
            run_id: RunId::new(),
            kind: JobKind::Start,
            request_id: None,
        },
        None,
    )
    .await
    .expect("unknown run");
    let client = async_nats::connect(&nats.url()).await.expect("connect");
    let js = async_nats::jetstream::new(client);
    js.publish("fb.jobs.hello", "{not json".into())
        .await
        .expect("publish")
        .await
        .expect("ack");

    wait_for(&store, broken, RunStatus::Failed).await;
    let error = store
        .load(broken)
        .await
        .expect("load")
        .record
        .error
        .unwrap_or_default();
    assert!(
        error.contains("no-such-agent") && error.contains("config.yaml"),
        "{error}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let dlq = js
            .get_stream("FB_DLQ")
            .await
            .expect("dlq")
            .info()
            .await
            .expect("info")
            .state
            .messages;
        if dlq == 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "DLQ holds {dlq} of 3 poison jobs"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let jobs = js
        .get_stream("FB_JOBS")
        .await
        .expect("jobs")
        .info()
        .await
        .expect("info")
        .state
        .messages;
    assert_eq!(jobs, 0, "poison jobs are terminated, not redelivered");
    w.stop().await;
}
