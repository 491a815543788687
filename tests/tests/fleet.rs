//! The fleet worker against real nats-server and redis-server processes (or clusters of them
//! with `DELTA_TEST_CLUSTER=1`: `delta_e2e::servers`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use delta_e2e::servers::{NatsServers, RedisServers};
use delta_protocol::{
    Event, InteractionRequest, InteractionResponse, Job, Responder, RunId, RunStatus, Via,
};
use delta_queue::{self as queue, Queue};
use delta_store::redis::RedisRunStore;
use delta_store::{RunRecord, RunStore};
use delta_worker::fleet::{self, Config};
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

fn config(nats: &NatsServers, redis: &RedisServers, prefix: &str, id: &str, work: &Path) -> Config {
    Config {
        nats_url: nats.url_as(delta_e2e::NatsRole::Worker),
        redis_url: redis.url_as(delta_e2e::RedisRole::Worker),
        redis_ca: None,
        prefix: prefix.into(),
        agents_dir: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/agents"),
        work_dir: work.to_path_buf(),
        concurrency: 4,
        resume_slots: fleet::default_resume_slots(4),
        queue: queue::Settings {
            ack_wait: Duration::from_secs(5),
            max_deliver: 3,
            ..nats.queue_settings()
        },
        worker_id: id.into(),
        grace: Duration::from_secs(5),
        secrets_key: None,
        retention: None,
        sweep_every: Duration::from_secs(600),
        durability: redis.durability(),
        redis_cluster: redis.is_cluster(),
        redis_buckets: None,
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

async fn submit(store: &RedisRunStore, q: &Queue, agent: &str, task: &str) -> RunId {
    let rec = RunRecord::new(RunId::new(), agent, task, RunStatus::Queued);
    let id = rec.run_id;
    store.create(rec).await.expect("create");
    q.publish_job(agent, &Job::start(id), None)
        .await
        .expect("publish");
    id
}

#[tokio::test]
async fn a_run_paused_on_one_worker_is_resumed_by_another() {
    let (nats, redis) = (NatsServers::start(), RedisServers::start());
    let work = tempfile::tempdir().expect("tmp");
    let store = redis.store("fa", None).await;
    let q = Queue::connect(&nats.url(), "fa", &nats.queue_settings())
        .await
        .expect("nats");
    let client = delta_e2e::nats_client(&nats.url()).await;
    let mut requested = client
        .subscribe("fa.interactions.requested.>")
        .await
        .expect("subscribe");

    let a = start(config(&nats, &redis, "fa", "worker-a", work.path()));
    let id = submit(&store, &q, "hello", "say hi").await;
    delta_e2e::wait_for_status(&store, id, RunStatus::WaitingForInput).await;
    let msg = tokio::time::timeout(Duration::from_secs(10), requested.next())
        .await
        .expect("announced")
        .expect("msg");
    assert_eq!(
        msg.subject.as_str(),
        format!("fa.interactions.requested.hello.{id}")
    );
    let req: InteractionRequest = delta_protocol::events::decode(&msg.payload)
        .expect("a CloudEvent of a request")
        .data;
    assert_eq!(req.prompt, "What is your name?");
    a.stop().await;

    let b = start(config(&nats, &redis, "fa", "worker-b", work.path()));
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
    assert!(
        !store.answer(&req, &answer).await.expect("second answer"),
        "first answer wins"
    );
    let resume = Job::resume(id, Some(req.request_id));
    q.publish_job("hello", &resume, None).await.expect("resume");
    q.publish_job("hello", &resume, None)
        .await
        .expect("duplicate resume is dropped");
    delta_e2e::wait_for_status(&store, id, RunStatus::Completed).await;
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

    // The same journal as the local engine writes for the same answer.
    let local_dir = tempfile::tempdir().expect("tmp");
    let files = delta_store::file::FileRunStore::new(local_dir.path().join(".delta"));
    let agent = delta_engine::agent::Agent::load(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/agents/hello"),
    )
    .expect("agent");
    let brain = delta_engine::brain::AnyBrain::for_agent(&agent).expect("brain");
    let rec = RunRecord::new(RunId::new(), "hello", "say hi", RunStatus::Queued);
    let local = rec.run_id;
    files.create(rec).await.expect("create");
    let settings = delta_engine::engine::Settings {
        worker: "local".into(),
        work_dir: local_dir.path().to_path_buf(),
        pause: delta_engine::engine::PauseMode::Park,
    };
    let engine = |run| {
        delta_engine::engine::Engine::new(
            &agent,
            &brain,
            &files,
            run,
            settings.clone(),
            CancellationToken::new(),
        )
    };
    let out = engine(files.load(local).await.expect("load"))
        .advance(None)
        .await
        .expect("advance");
    let delta_engine::engine::Outcome::Paused(lq) = out else {
        panic!("the local run pauses too: {out:?}")
    };
    let mut same = answer.clone();
    same.request_id = lq.request_id;
    engine(files.load(local).await.expect("load"))
        .advance(Some(same))
        .await
        .expect("advance");
    assert_eq!(
        delta_e2e::journal_shape(&run.journal),
        delta_e2e::journal_shape(&files.load(local).await.expect("load").journal),
        "the fleet journals exactly what the local engine does"
    );
}

/// A start job that carries its run (as a gateway's does) starts it without reading it. A
/// second such job for a run that has started meanwhile (published again under another id)
/// changes nothing: its first write is refused, and its next delivery reads the run as it is and
/// leaves it waiting on its question. The run then ends as any other.
#[tokio::test]
async fn a_start_job_carrying_its_run_starts_it_and_a_stale_one_changes_nothing() {
    let (nats, redis) = (NatsServers::start(), RedisServers::start());
    let work = tempfile::tempdir().expect("tmp");
    let store = redis.store("fc", None).await;
    let q = Queue::connect(&nats.url(), "fc", &nats.queue_settings())
        .await
        .expect("nats");
    let client = delta_e2e::nats_client(&nats.url()).await;
    let mut requested = client
        .subscribe("fc.interactions.requested.>")
        .await
        .expect("subscribe");
    let w = start(config(&nats, &redis, "fc", "worker-c", work.path()));

    let rec = RunRecord::new(RunId::new(), "hello", "say hi", RunStatus::Queued);
    let id = rec.run_id;
    store.create(rec.clone()).await.expect("create");
    let carrying = Job {
        run: Some(rec.fresh()),
        ..Job::start(id)
    };
    q.publish_job("hello", &carrying, None)
        .await
        .expect("publish");
    let req = next_question(&mut requested).await;
    delta_e2e::wait_for_status(&store, id, RunStatus::WaitingForInput).await;
    let paused = store.load(id).await.expect("load");

    let seq = q
        .publish_job_as("hello", &carrying, "start-again", None)
        .await
        .expect("publish again");
    let deadline = Instant::now() + Duration::from_secs(30);
    while q.job_exists(seq).await.expect("ask the stream") {
        assert!(Instant::now() < deadline, "the stale job was never settled");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = store.load(id).await.expect("load");
    assert_eq!(after.record.status, RunStatus::WaitingForInput);
    assert_eq!(after.journal, paused.journal, "the stale job wrote nothing");

    answer(&store, &q, &req, None, Some("Ada"), None).await;
    delta_e2e::wait_for_status(&store, id, RunStatus::Completed).await;
    w.stop().await;
    let run = store.load(id).await.expect("load");
    assert_eq!(run.record.result.as_deref(), Some("Greeted Ada."));
    let starts = run
        .journal
        .iter()
        .filter(|e| matches!(e.event, Event::EngineStart(_)))
        .count();
    assert_eq!(starts, 2, "one start for the first job, one for the resume");
}

/// A job that carries its run takes it as read, so the run's first side effect outside its own
/// writes (a hook's process here; a grant used or made) waits for a check that the run may still
/// be written. A run cancelled between its submission and its job's delivery runs no hook (its
/// tools never ran anyway: a call is stored before its tool starts), while a run beside it runs
/// both of its hooks.
#[tokio::test]
async fn a_carried_run_cancelled_before_its_job_runs_no_hook() {
    let (nats, redis) = (NatsServers::start(), RedisServers::start());
    let work = tempfile::tempdir().expect("tmp");
    let agents = tempfile::tempdir().expect("tmp");
    let log = agents.path().join("hooks.log");
    let dir = agents.path().join("hooked");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(
        dir.join("config.yaml"),
        "name: hooked\nbrain: scripted\ntools:\n  - name: echo\n    exec: \"echo ${text}\"\n    idempotent: true\n",
    )
    .expect("config");
    std::fs::write(
        dir.join("script.yaml"),
        "steps:\n  - tool: echo\n    args: {text: hi}\n  - finish: done\n",
    )
    .expect("script");
    let hooks: String = ["pre_tool_exec", "on_run_end"]
        .iter()
        .map(|h| {
            format!(
                "{h}:\n  command: [sh, -c, 'echo {h} >> {}']\n",
                log.display()
            )
        })
        .collect();
    std::fs::write(dir.join("hooks.yaml"), hooks).expect("hooks");
    let store = redis.store("fk", None).await;
    let q = Queue::connect(&nats.url(), "fk", &nats.queue_settings())
        .await
        .expect("nats");
    // Both submitted as a gateway does (the start job carries the run), before any worker.
    let mut seqs = vec![];
    let mut ids = vec![];
    for task in ["cancelled", "kept"] {
        let rec = RunRecord::new(RunId::new(), "hooked", task, RunStatus::Queued);
        store.create(rec.clone()).await.expect("create");
        let job = Job {
            run: Some(rec.fresh()),
            ..Job::start(rec.run_id)
        };
        let seq = q
            .publish_job_as("hooked", &job, &format!("start:{}", rec.run_id), None)
            .await
            .expect("publish");
        seqs.push(seq);
        ids.push(rec.run_id);
    }
    // The first cancelled as a gateway cancels it: its job stays in the stream.
    delta_e2e::cancel_run(&store, ids[0], "cancelled by test").await;
    let cancelled = store.load(ids[0]).await.expect("load");
    let w = start(Config {
        agents_dir: agents.path().to_path_buf(),
        ..config(&nats, &redis, "fk", "worker-k", work.path())
    });
    delta_e2e::wait_for_status(&store, ids[1], RunStatus::Completed).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    for seq in seqs {
        while q.job_exists(seq).await.expect("ask the stream") {
            assert!(Instant::now() < deadline, "job {seq} never settled");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    w.stop().await;
    let ran = std::fs::read_to_string(&log).expect("the kept run's hooks ran");
    assert_eq!(
        ran.lines().collect::<Vec<_>>(),
        ["pre_tool_exec", "on_run_end"],
        "the kept run's hooks only"
    );
    let after = store.load(ids[0]).await.expect("load");
    assert_eq!(after.record.status, RunStatus::Cancelled);
    assert_eq!(after.journal, cancelled.journal, "nothing written");
}

/// A resume job that carries its paused run (as a gateway's does: the record and question its
/// settling script read) resumes it without reading it: from the answer to the end, Redis runs
/// no read of the run's record, question or journal. (One Redis, to count what it runs.)
#[tokio::test]
async fn a_resume_job_carrying_its_paused_run_resumes_it_without_reading_it() {
    let (nats, redis) = (NatsServers::start(), RedisServers::one());
    let work = tempfile::tempdir().expect("tmp");
    let store = redis.store("fr", None).await;
    let q = Queue::connect(&nats.url(), "fr", &nats.queue_settings())
        .await
        .expect("nats");
    let client = delta_e2e::nats_client(&nats.url()).await;
    let mut requested = client
        .subscribe("fr.interactions.requested.>")
        .await
        .expect("subscribe");
    let mut ended = client
        .subscribe("fr.runs.completed.>")
        .await
        .expect("subscribe");
    let w = start(config(&nats, &redis, "fr", "worker-r", work.path()));
    let id = submit(&store, &q, "hello", "say hi").await;
    let req = next_question(&mut requested).await;
    assert_eq!(req.run_id, id);
    delta_e2e::wait_for_status(&store, id, RunStatus::WaitingForInput).await;

    let a = delta_e2e::typed_answer(req.request_id, "Ada");
    let delta_store::redis::Settlement { lost, paused, .. } = store
        .resolve_carrying(
            &req,
            delta_store::redis::Resolution::Answer(&a, delta_protocol::Timestamp::now()),
            Duration::from_secs(5),
        )
        .await
        .expect("answer");
    assert_eq!(lost, None, "answer won");
    // A read of the run: its record and question whole (`HGETALL`), a field (`HGET`: the
    // resume's first write does not check that the question it leaves is still pending, since
    // the worker read it answered), the journal (`XRANGE`), a value (`GET`). The fence each
    // write checks inside its script (`HMGET`) is not.
    let raw = delta_e2e::redis_raw(&redis.url()).await;
    let reads = async || {
        let mut n = 0;
        for c in ["hgetall", "hget", "get", "xrange"] {
            n += delta_e2e::command_calls(&raw, c).await;
        }
        n
    };
    let before = reads().await;
    let job = Job {
        paused: Some(paused.expect("a paused run with its snapshot is carried")),
        ..Job::resume(id, Some(req.request_id))
    };
    q.publish_job("hello", &job, None).await.expect("resume");
    tokio::time::timeout(Duration::from_secs(20), ended.next())
        .await
        .expect("the run ends")
        .expect("message");
    let read = reads().await - before;
    w.stop().await;
    assert_eq!(read, 0, "nothing of the run read");
    let run = store.load(id).await.expect("load");
    assert_eq!(run.record.status, RunStatus::Completed);
    assert_eq!(run.record.result.as_deref(), Some("Greeted Ada."));
}

#[tokio::test]
async fn poison_jobs_are_dead_lettered_and_their_runs_failed() {
    let (nats, redis) = (NatsServers::start(), RedisServers::start());
    let work = tempfile::tempdir().expect("tmp");
    let store = redis.store("fb", None).await;
    let q = Queue::connect(&nats.url(), "fb", &nats.queue_settings())
        .await
        .expect("nats");
    let w = start(config(&nats, &redis, "fb", "worker-p", work.path()));

    let broken = submit(&store, &q, "no-such-agent", "t").await;
    q.publish_job("hello", &Job::start(RunId::new()), None)
        .await
        .expect("unknown run");
    let client = delta_e2e::nats_client(&nats.url()).await;
    let js = async_nats::jetstream::new(client);
    js.publish("fb.jobs.hello", "{not json".into())
        .await
        .expect("publish")
        .await
        .expect("ack");

    delta_e2e::wait_for_status(&store, broken, RunStatus::Failed).await;
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

/// Answers `req` in Redis (as the gateway will) and publishes the resume job.
async fn answer(
    store: &RedisRunStore,
    q: &Queue,
    req: &InteractionRequest,
    option: Option<&str>,
    input: Option<&str>,
    data: Option<serde_json::Value>,
) {
    let mut a = InteractionResponse::new(
        req.request_id,
        Responder {
            id: "ops".into(),
            via: Via::Http,
            on_behalf_of: None,
            relayed_by: None,
        },
    );
    a.option_id = option.map(str::to_owned);
    a.input = input.map(str::to_owned);
    a.data = data;
    assert!(store.answer(req, &a).await.expect("answer"), "answer won");
    let job = Job::resume(req.run_id, Some(req.request_id));
    q.publish_job(&req.agent, &job, None).await.expect("resume");
}

async fn next_question(sub: &mut async_nats::Subscriber) -> InteractionRequest {
    let msg = tokio::time::timeout(Duration::from_secs(20), sub.next())
        .await
        .expect("a question is announced")
        .expect("message");
    delta_protocol::events::decode(&msg.payload)
        .expect("a CloudEvent of a request")
        .data
}

#[tokio::test]
async fn the_deployer_in_the_fleet_plan_secret_choice_and_edited_approval() {
    const CANARY: &str = "canary-7f3a9c-api-key";
    let (nats, mut redis) = (NatsServers::start(), RedisServers::start());
    let work = tempfile::tempdir().expect("tmp");
    let key = std::sync::Arc::new(
        delta_protocol::secret::SecretsKey::from_hex(
            "8c1f0e4d2b3a69780f1e2d3c4b5a69788c1f0e4d2b3a69780f1e2d3c4b5a6978",
        )
        .expect("key"),
    );
    let plain = redis.store("dp", None).await;
    let store = plain.clone().with_secrets_key(key.clone());
    let q = Queue::connect(&nats.url(), "dp", &nats.queue_settings())
        .await
        .expect("nats");
    let client = delta_e2e::nats_client(&nats.url()).await;
    let mut questions = client
        .subscribe("dp.interactions.requested.>")
        .await
        .expect("subscribe");
    let with_key = |id: &str| Config {
        secrets_key: Some(key.clone()),
        ..config(&nats, &redis, "dp", id, work.path())
    };
    let (a, b) = (start(with_key("worker-a")), start(with_key("worker-b")));
    let id = submit(&store, &q, "deployer", "1.4.2").await;

    let plan = next_question(&mut questions).await;
    assert_eq!(plan.run_id, id);
    assert_eq!(plan.context.get("round"), Some(&serde_json::json!(1)));
    answer(
        &store,
        &q,
        &plan,
        Some("modify"),
        Some("after the freeze"),
        None,
    )
    .await;
    let plan2 = next_question(&mut questions).await;
    assert_eq!(plan2.context.get("round"), Some(&serde_json::json!(2)));
    answer(&store, &q, &plan2, Some("confirm"), None, None).await;

    let secret = next_question(&mut questions).await;
    assert!(secret.is_sensitive(), "{}", secret.prompt);
    let mut refused = InteractionResponse::new(
        secret.request_id,
        Responder {
            id: "ops".into(),
            via: Via::Http,
            on_behalf_of: None,
            relayed_by: None,
        },
    );
    refused.input = Some(CANARY.into());
    let err = plain
        .answer(&secret, &refused)
        .await
        .expect_err("no key, no sensitive answer");
    assert!(err.to_string().contains("DELTA_SECRETS_KEY"), "{err}");
    answer(&store, &q, &secret, None, Some(CANARY), None).await;

    let env = next_question(&mut questions).await;
    assert!(env.option("production").is_some(), "{}", env.prompt);
    answer(&store, &q, &env, Some("production"), None, None).await;

    let approval = next_question(&mut questions).await;
    assert_eq!(
        approval.context.get("tool"),
        Some(&serde_json::json!("deploy"))
    );
    let edited = serde_json::json!({"args": {"env": "production", "version": "1.4.3"}});
    answer(&store, &q, &approval, Some("approve"), None, Some(edited)).await;
    delta_e2e::wait_for_status(&store, id, RunStatus::Completed).await;
    a.stop().await;
    b.stop().await;

    let run = store.load(id).await.expect("load");
    let journal = serde_json::to_string(&run.journal).expect("json");
    let plans = run
        .journal
        .iter()
        .filter(|e| matches!(e.event, Event::Plan(_)))
        .count();
    assert_eq!(plans, 2, "the plan was proposed again after the change");
    let received: Vec<_> = run
        .journal
        .iter()
        .filter_map(|e| match &e.event {
            Event::HumanInputReceived(r) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(received.len(), 5);
    assert_eq!(
        received[2].input.as_deref(),
        Some("***"),
        "the key is redacted"
    );
    let diff = serde_json::to_value(&received[4].edited_args).expect("diff");
    assert_eq!(
        diff["changed"]["version"],
        serde_json::json!({"from": "1.4.2", "to": "1.4.3"}),
        "{diff}"
    );
    let checked = run
        .journal
        .iter()
        .any(|e| matches!(&e.event, Event::ActionResult(r) if r.observation_content.contains(&format!("({} characters", CANARY.len()))));
    assert!(
        checked,
        "check_key got the real key (its length), not a reference"
    );
    // In the run's own work directory.
    let deployed =
        std::fs::read_to_string(work.path().join(id.to_string()).join("deployments.log"))
            .expect("log");
    assert_eq!(deployed, "production 1.4.3\n", "the edited call ran");

    // The canary is nowhere: not in the journal, not in Redis, not in its AOF.
    assert!(!journal.contains(CANARY));
    let dump = delta_e2e::redis_dump(&redis.url(), "dp:*").await;
    assert!(dump.contains("sealed:v2:"), "the answer is stored sealed");
    assert!(!dump.contains(CANARY), "the key is not in Redis in clear");
    let mut aof = Vec::new();
    for dir in redis.data_dirs() {
        for entry in std::fs::read_dir(dir.join("appendonlydir")).expect("aof dir") {
            aof.extend(std::fs::read(entry.expect("entry").path()).expect("read"));
        }
    }
    assert!(!aof.is_empty(), "the AOF was found");
    // The journal's events are packed there (docs/protocol.md): what they hold in clear is the
    // journal read back, searched above.
    assert!(
        !String::from_utf8_lossy(&aof).contains(CANARY),
        "the key is not in the AOF"
    );
}

#[tokio::test]
async fn a_sealed_secret_reaches_a_tool_after_a_later_pause_on_another_worker() {
    const CANARY: &str = "canary-2b9d-token";
    let (nats, redis) = (NatsServers::start(), RedisServers::start());
    let work = tempfile::tempdir().expect("tmp");
    let agents = work.path().join("agents");
    let vault = agents.join("vault");
    std::fs::create_dir_all(&vault).expect("mkdir");
    std::fs::write(
        vault.join("config.yaml"),
        "name: vault\nbrain: scripted\ntools:\n  - name: measure\n    shell: 'printf %s ${key} | wc -c'\n    parameters: [{name: key, secret: true}]\n    idempotent: true\n",
    )
    .expect("write");
    std::fs::write(
        vault.join("script.yaml"),
        "steps:\n  - ask_human: {prompt: \"Token?\", sensitive: true}\n  - ask_human: {prompt: \"Go on?\"}\n  - tool: measure\n    args: {key: \"${secret}\"}\n  - finish: \"${observation}\"\n",
    )
    .expect("write");
    let key = std::sync::Arc::new(
        delta_protocol::secret::SecretsKey::from_hex(&"ab".repeat(32)).expect("key"),
    );
    let store = redis.store("sv", None).await.with_secrets_key(key.clone());
    let q = Queue::connect(&nats.url(), "sv", &nats.queue_settings())
        .await
        .expect("nats");
    let client = delta_e2e::nats_client(&nats.url()).await;
    let mut questions = client
        .subscribe("sv.interactions.requested.>")
        .await
        .expect("subscribe");
    let worker = |id: &str| {
        start(Config {
            agents_dir: agents.clone(),
            secrets_key: Some(key.clone()),
            ..config(&nats, &redis, "sv", id, work.path())
        })
    };
    let a = worker("worker-a");
    let id = submit(&store, &q, "vault", "t").await;
    let token = next_question(&mut questions).await;
    answer(&store, &q, &token, None, Some(CANARY), None).await;
    let go_on = next_question(&mut questions).await;
    // The worker that received the secret is gone: the next one must open it from the store.
    a.stop().await;
    let b = worker("worker-b");
    answer(&store, &q, &go_on, None, Some("yes"), None).await;
    delta_e2e::wait_for_status(&store, id, RunStatus::Completed).await;
    b.stop().await;
    let run = store.load(id).await.expect("load");
    assert_eq!(
        run.record.result.as_deref().map(str::trim),
        Some(CANARY.len().to_string().as_str()),
        "the tool measured the real token"
    );
    assert!(
        !serde_json::to_string(&run.journal)
            .expect("json")
            .contains(CANARY)
    );
}

/// Agents for the resumes-first test: `hello` (asks a name) and `gate`, whose one tool blocks
/// until the file `gate` appears.
fn gated_agents(gate: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tmp");
    let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/agents");
    let hello = dir.path().join("hello");
    std::fs::create_dir_all(&hello).expect("mkdir");
    for f in ["config.yaml", "script.yaml"] {
        std::fs::copy(examples.join("hello").join(f), hello.join(f)).expect("copy");
    }
    let blocked = dir.path().join("gate");
    std::fs::create_dir_all(&blocked).expect("mkdir");
    std::fs::write(
        blocked.join("config.yaml"),
        format!(
            "name: gate\nbrain: scripted\ntools:\n  - name: wait\n    shell: \"while [ ! -e '{}' ]; do sleep 0.05; done; echo open\"\n    timeout_s: 600\n",
            gate.display()
        ),
    )
    .expect("config");
    std::fs::write(
        blocked.join("script.yaml"),
        "steps:\n  - tool: wait\n    args: {}\n  - finish: \"through\"\n",
    )
    .expect("script");
    dir
}

#[tokio::test]
async fn a_resume_is_taken_while_start_jobs_fill_every_slot_they_may_take() {
    let (nats, redis) = (NatsServers::start(), RedisServers::start());
    let work = tempfile::tempdir().expect("tmp");
    let gate = work.path().join("gate");
    let agents = gated_agents(&gate);
    let store = redis.store("fr", None).await;
    let q = Queue::connect(&nats.url(), "fr", &nats.queue_settings())
        .await
        .expect("nats");
    let client = delta_e2e::nats_client(&nats.url()).await;
    let mut requested = client
        .subscribe("fr.interactions.requested.>")
        .await
        .expect("subscribe");
    // Two slots: one for start jobs, one kept for resumes (the default quarter, at least one).
    let mut c = config(&nats, &redis, "fr", "worker-r", work.path());
    c.agents_dir = agents.path().to_path_buf();
    c.concurrency = 2;
    c.resume_slots = fleet::default_resume_slots(2);
    assert_eq!(c.resume_slots, 1);
    let w = start(c);

    let waiting = submit(&store, &q, "hello", "say hi").await;
    delta_e2e::wait_for_status(&store, waiting, RunStatus::WaitingForInput).await;
    let req = next_question(&mut requested).await;
    // The start slot is taken by a run that does not finish until the gate opens, and another
    // start job waits behind it.
    let blocked = submit(&store, &q, "gate", "wait").await;
    delta_e2e::wait_for_status(&store, blocked, RunStatus::Running).await;
    let queued = submit(&store, &q, "gate", "wait too").await;

    answer(&store, &q, &req, None, Some("Ada"), None).await;
    delta_e2e::wait_for_status(&store, waiting, RunStatus::Completed).await;
    let run = store.load(waiting).await.expect("load");
    assert_eq!(run.record.result.as_deref(), Some("Greeted Ada."));
    // The resume went past the start job waiting, which got no slot of the resumes'.
    assert_eq!(
        store.load(queued).await.expect("load").record.status,
        RunStatus::Queued
    );
    assert_eq!(
        store.load(blocked).await.expect("load").record.status,
        RunStatus::Running
    );

    std::fs::write(&gate, "").expect("open the gate");
    delta_e2e::wait_for_status(&store, blocked, RunStatus::Completed).await;
    delta_e2e::wait_for_status(&store, queued, RunStatus::Completed).await;
    w.stop().await;
}
