//! What can go wrong in a fleet (docs/architecture.md), done to real processes: a worker frozen past its
//! `ack_wait`, Redis and NATS restarted mid-batch, workers stopped with SIGTERM under load.
//!
//! Workers are real processes (`delta_e2e::workers`); the checks read every journal at the end.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use delta_e2e::Signal;
use delta_e2e::fleet::FleetLogs;
use delta_e2e::workers::WorkerProcess;
use delta_protocol::{Event, Job, RunId, RunStatus};
use delta_queue::Queue;
use delta_store::{RunRecord, RunStore, StoredRun};

/// Writes agent `name` (its `config.yaml` and `script.yaml`) into the agents directory `dir`.
fn write_agent(dir: &Path, name: &str, config: &str, script: &str) {
    let a = dir.join(name);
    std::fs::create_dir_all(&a).expect("mkdir");
    std::fs::write(a.join("config.yaml"), config).expect("write");
    std::fs::write(a.join("script.yaml"), script).expect("write");
}

/// Agent `crasher`, whose one tool kills the worker running it: every delivery of its job ends
/// in a crash.
fn write_crasher(dir: &Path) {
    write_agent(
        dir,
        "crasher",
        "name: crasher\nbrain: scripted\ntools:\n  - name: boom\n    shell: 'kill -9 $PPID'\n    idempotent: true\n",
        "steps:\n  - tool: boom\n  - finish: never\n",
    );
}

/// An agent `steps` running `count` steps of the `step` tool, each appending its label to
/// `effects` in its run's work dir (so side effects can be counted), then sleeping `secs`.
fn agent(dir: &Path, count: usize, secs: &str, idempotent: bool) {
    let mut script = "steps:\n".to_owned();
    for i in 1..=count {
        script.push_str(&format!(
            "  - tool: step\n    args: {{label: \"${{run_id}}-{i}\"}}\n"
        ));
    }
    script.push_str("  - finish: ok\n");
    write_agent(
        dir,
        "steps",
        &format!(
            "name: steps\nbrain: scripted\ntools:\n  - name: step\n    shell: 'echo ${{label}} >> effects; sleep {secs}; echo done ${{label}}'\n    idempotent: {idempotent}\n"
        ),
        &script,
    );
}

/// The end-to-end fleet's servers, store and worker settings, without a gateway (jobs are
/// published here), its workers logging to `logs`.
struct Fleet {
    inner: delta_e2e::fleet::Fleet,
    queue: Queue,
    logs: tempfile::TempDir,
}

impl std::ops::Deref for Fleet {
    type Target = delta_e2e::fleet::Fleet;
    fn deref(&self) -> &delta_e2e::fleet::Fleet {
        &self.inner
    }
}

impl std::ops::DerefMut for Fleet {
    fn deref_mut(&mut self) -> &mut delta_e2e::fleet::Fleet {
        &mut self.inner
    }
}

impl Fleet {
    async fn start(prefix: &str, ack_wait_ms: u64, grace_ms: u64, max_deliver: i64) -> Fleet {
        let mut inner = delta_e2e::fleet::Fleet::start(prefix, 0, 0).await;
        let logs = tempfile::tempdir().expect("tmp");
        inner.logs = Some(FleetLogs {
            dir: logs.path().to_path_buf(),
            filter: None,
            spans: false,
        });
        let spec = &mut inner.worker_spec;
        (spec.ack_wait_ms, spec.grace_ms, spec.max_deliver) = (ack_wait_ms, grace_ms, max_deliver);
        let queue = Queue::connect(
            &inner.nats.url(),
            prefix,
            &delta_e2e::workers::queue_settings(&inner.worker_spec),
        )
        .await
        .expect("nats");
        Fleet { inner, queue, logs }
    }

    fn log(&self, name: &str) -> PathBuf {
        self.logs.path().join(format!("{name}.log"))
    }

    fn worker(&self, id: &str) -> WorkerProcess {
        self.inner.spawn_worker(id)
    }

    async fn submit(&self, n: usize) -> Vec<RunId> {
        self.submit_to("steps", n).await
    }

    async fn submit_to(&self, agent: &str, n: usize) -> Vec<RunId> {
        let mut ids = vec![];
        for _ in 0..n {
            let rec = RunRecord::new(RunId::new(), agent, "t", RunStatus::Queued);
            ids.push(rec.run_id);
            self.store.create(rec.clone()).await.expect("create");
            let job = Job::start(rec.run_id);
            self.queue
                .publish_job(agent, &job, None)
                .await
                .expect("publish");
        }
        ids
    }

    /// Side effects so far, one line per step executed (every run's work directory).
    fn effects(&self) -> Vec<String> {
        delta_e2e::run_file_lines(&self.worker_spec.work_dir, "effects")
    }

    /// Loads a run, riding out a store that is restarting.
    async fn load(&self, id: RunId) -> StoredRun {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match self.store.load(id).await {
                Ok(r) => return r,
                Err(e) if Instant::now() > deadline => panic!("load {id}: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    async fn completed(&self, ids: &[RunId]) -> usize {
        let mut done = 0;
        for id in ids {
            if self.load(*id).await.record.status == RunStatus::Completed {
                done += 1;
            }
        }
        done
    }

    /// Every run's journal: each step requested once and resulted once, `steps` of them.
    async fn check_journals(&self, ids: &[RunId], steps: usize) {
        for id in ids {
            let run = self.load(*id).await;
            assert_eq!(run.record.status, RunStatus::Completed, "run {id}");
            delta_e2e::assert_each_step_once(&run, steps);
        }
    }
}

fn stop(w: WorkerProcess) {
    drop(w);
}

/// One fault scenario at a time: each runs two servers and several worker processes, and timing
/// (ack_wait, heartbeats) must not depend on how many others share the two cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// [`delta_e2e::chaos::wait_until`], within a minute.
async fn wait_until_async<F, Fut>(what: &str, done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    delta_e2e::chaos::wait_until(what, Duration::from_secs(60), done).await;
}

fn wait_until(what: &str, secs: u64, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_worker_whose_job_moved_on_has_its_writes_refused() {
    let _serial = SERIAL.lock().await;
    let fleet = Fleet::start("st", 2000, 5000, 20).await;
    // Step two outlives ack_wait once its worker is frozen and cannot send heartbeats.
    write_agent(
        &fleet.worker_spec.agents_dir,
        "steps",
        "name: steps\nbrain: scripted\ntools:\n  - name: step\n    shell: 'echo ${label} >> effects; sleep ${secs}; echo done ${label}'\n    idempotent: true\n",
        "steps:\n  - tool: step\n    args: {label: one, secs: \"0\"}\n  - tool: step\n    args: {label: two, secs: \"3\"}\n  - finish: ok\n",
    );
    let twos = || fleet.effects().iter().filter(|e| *e == "two").count();

    let stale = fleet.worker("stale");
    let ids = fleet.submit(1).await;
    let id = ids[0];
    wait_until("step two to start on the first worker", 20, || twos() == 1);
    delta_e2e::signal(stale.id(), Signal::SIGSTOP);

    // Past ack_wait the job is redelivered to a live worker, which runs step two again.
    let fresh = fleet.worker("fresh");
    wait_until("step two to start on the second worker", 30, || twos() == 2);
    // Thawed while the new owner is mid-step, the stale worker finishes its step first and
    // tries to journal the result: refused by the fence, not by the run being over.
    delta_e2e::signal(stale.id(), Signal::SIGCONT);
    let stale_log = fleet.log("stale");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let log = std::fs::read_to_string(&stale_log).unwrap_or_default();
        if log.contains("write refused: a newer delivery owns this run") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the stale worker's write was never fenced off; its log:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let during = fleet.load(id).await;
    assert_ne!(
        during.record.status,
        RunStatus::Completed,
        "the refusal came while the new owner was still working"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while fleet.load(id).await.record.status != RunStatus::Completed {
        assert!(Instant::now() < deadline, "the run never completed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = fleet.load(id).await;
    let workers: Vec<String> = after
        .journal
        .iter()
        .filter_map(|e| match &e.event {
            Event::EngineStart(s) => Some(s.worker.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(workers, ["stale", "fresh"], "only the two owners' sessions");
    assert_eq!(twos(), 2, "both workers ran step two; one result counts");
    fleet.check_journals(&ids, 2).await;
    stop(stale);
    stop(fresh);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarting_redis_and_nats_mid_batch_loses_nothing() {
    let _serial = SERIAL.lock().await;
    const RUNS: usize = 100;
    let mut fleet = Fleet::start("rs", 2000, 5000, 20).await;
    // On clusters (DELTA_TEST_CLUSTER=1) a restart is a rolling one, node after node, each
    // waited for until healthy: seconds where one server takes a fraction of one. Steps last
    // longer there, so that both restarts still land within the batch.
    let step = if fleet.on_clusters() { "1.5" } else { "0.05" };
    agent(&fleet.worker_spec.agents_dir, 3, step, true);
    let ids = fleet.submit(RUNS).await;
    let workers = [fleet.worker("w0"), fleet.worker("w1")];

    // Restarts triggered by progress, so they land mid-batch whatever the machine's speed.
    wait_until("a quarter of the steps", 60, || fleet.effects().len() >= 75);
    fleet.redis.restart().expect("restart redis");
    let at_redis = fleet.effects().len();
    wait_until("half of the steps", 60, || fleet.effects().len() >= 150);
    fleet.nats.restart().expect("restart nats");
    let at_nats = fleet.effects().len();

    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let done = fleet.completed(&ids).await;
        if done == RUNS {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {done} of {RUNS} runs completed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for w in workers {
        stop(w);
    }
    assert!(
        at_redis < 3 * RUNS && at_nats < 3 * RUNS,
        "the restarts landed mid-batch ({at_redis}, {at_nats} of {} steps)",
        3 * RUNS
    );
    fleet.check_journals(&ids, 3).await;
    let warnings: usize = ["w0", "w1"]
        .iter()
        .map(|w| {
            std::fs::read_to_string(fleet.log(w))
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                .inspect(|l| eprintln!("{l}"))
                .count()
        })
        .sum();
    eprintln!(
        "{RUNS} runs completed through a Redis restart at step {at_redis} and a NATS restart at \
         step {at_nats}; the workers rode out {warnings} failed operations"
    );
}

/// A job whose run store fails under it again and again (Redis restarted four times while it
/// runs, with three deliveries allowed) is handled again in place each time Redis is back, still
/// held: the consumer hands it out once. Given back instead, each outage used up a delivery, and a
/// few Redis failovers in a row dead-lettered a run that did nothing wrong (seen in the cluster
/// chaos suite: a run failed as if its workers had crashed five times).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_outages_do_not_use_up_a_jobs_deliveries() {
    let _serial = SERIAL.lock().await;
    let mut fleet = Fleet::start("ro", 2000, 5000, 3).await;
    let step = if fleet.on_clusters() { "1.5" } else { "0.3" };
    agent(&fleet.worker_spec.agents_dir, 16, step, true);
    let ids = fleet.submit(1).await;
    let worker = fleet.worker("w0");
    // Until `steps` steps are done (or the run is completed), the run not ended otherwise.
    let progress = async |fleet: &Fleet, steps: usize| {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let run = fleet.load(ids[0]).await;
            if run.record.status == RunStatus::Completed || fleet.effects().len() >= steps {
                return;
            }
            assert!(
                !run.record.status.is_terminal(),
                "the run ended {} ({:?})",
                run.record.status,
                run.record.error
            );
            assert!(
                Instant::now() < deadline,
                "the run stopped at {steps} steps"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    for n in 1..=4 {
        progress(&fleet, n * 3).await;
        fleet.redis.restart().expect("restart redis");
    }
    while fleet.completed(&ids).await < 1 {
        progress(&fleet, usize::MAX).await;
    }
    stop(worker);
    fleet.check_journals(&ids, 16).await;
    let log = std::fs::read_to_string(fleet.log("w0")).unwrap_or_default();
    let again = log.matches("handling the job again").count();
    // On one server each restart is an outage the job meets. A Redis Cluster restarted node by
    // node may fail over under it without a write of this job noticing: there, only that it
    // was handed out once, below.
    if !fleet.on_clusters() {
        assert!(
            again >= 3,
            "the outages reached the job ({again} times): {log}"
        );
    }
    let info = workers_consumer(&fleet, "ro").await;
    assert_eq!(
        info.delivered.consumer_sequence, 1,
        "handed out once: {info:?}"
    );
}

/// The start jobs' consumer of the fleet of key prefix `prefix`, as NATS sees it now (how many
/// jobs it handed out, in `delivered.consumer_sequence`).
async fn workers_consumer(fleet: &Fleet, prefix: &str) -> async_nats::jetstream::consumer::Info {
    let js = async_nats::jetstream::new(delta_e2e::nats_client(&fleet.nats.url()).await);
    let stream = js
        .get_stream(format!("{}_JOBS", prefix.to_uppercase()))
        .await
        .expect("stream");
    let mut consumer: async_nats::jetstream::consumer::PullConsumer = stream
        .get_consumer(&format!("{prefix}-workers"))
        .await
        .expect("consumer");
    consumer.info().await.expect("info").clone()
}

/// Writes lost at a Redis failover (the run's record and journal put back as they were a few
/// steps before, as a replica promoted without them has them): the worker's next write is
/// refused (`Rewound`), and it replays the run from the journal itself, still holding the job.
/// Three such losses under one job with `max_deliver` 2: the job is handed out once and the run
/// completes, where giving the job back after each would have used up its deliveries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_lost_at_failovers_do_not_use_up_a_jobs_deliveries() {
    let _serial = SERIAL.lock().await;
    let fleet = Fleet::start("rl", 2000, 5000, 2).await;
    agent(&fleet.worker_spec.agents_dir, 16, "0.3", true);
    let ids = fleet.submit(1).await;
    let worker = fleet.worker("w0");
    let mut raw = delta_e2e::redis_connection(&fleet.redis.url()).await;
    let keys = [
        fleet.store.run_key(ids[0]),
        format!("{}:journal", fleet.store.run_key(ids[0])),
    ];
    // The steps the run's journal holds, the run not ended otherwise.
    let steps_done = async |fleet: &Fleet| {
        let run = fleet.load(ids[0]).await;
        assert!(
            !run.record.status.is_terminal() || run.record.status == RunStatus::Completed,
            "the run ended {} ({:?})",
            run.record.status,
            run.record.error
        );
        run.journal
            .iter()
            .filter(|e| matches!(e.event, Event::ActionResult(_)))
            .count()
    };
    for n in 1..=3 {
        wait_until_async("the run to go on", || async {
            steps_done(&fleet).await >= n * 4
        })
        .await;
        let mut saved = Vec::new();
        for key in &keys {
            let dump: Vec<u8> = redis::cmd("DUMP")
                .arg(key)
                .query_async(&mut raw)
                .await
                .expect("dump");
            saved.push(dump);
        }
        let before = steps_done(&fleet).await;
        wait_until_async("two steps more", || async {
            steps_done(&fleet).await >= before + 2
        })
        .await;
        let mut put_back = redis::pipe();
        put_back.atomic();
        for (key, dump) in keys.iter().zip(&saved) {
            put_back
                .cmd("RESTORE")
                .arg(key)
                .arg(0)
                .arg(dump)
                .arg("REPLACE")
                .ignore();
        }
        let () = put_back.query_async(&mut raw).await.expect("restore");
    }
    wait_until_async("the run to complete", || async {
        fleet.completed(&ids).await == 1
    })
    .await;
    stop(worker);
    fleet.check_journals(&ids, 16).await;
    let log = std::fs::read_to_string(fleet.log("w0")).unwrap_or_default();
    let refused = log
        .matches("the journal is not as this delivery left it")
        .count();
    assert!(
        refused >= 3,
        "the lost writes reached the job ({refused} times): {log}"
    );
    let info = workers_consumer(&fleet, "rl").await;
    assert_eq!(
        info.delivered.consumer_sequence, 1,
        "handed out once: {info:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_finishes_in_flight_runs_and_loses_nothing() {
    let _serial = SERIAL.lock().await;
    const RUNS: usize = 60;
    // A long ack_wait: a late heartbeat on a busy machine must not redeliver a step that is
    // not idempotent (that would pause the run on "this may already have run").
    let fleet = Fleet::start("gs", 20_000, 15_000, 20).await;
    // Not idempotent: a graceful stop must never make a step run twice.
    agent(&fleet.worker_spec.agents_dir, 3, "0.1", false);
    let ids = fleet.submit(RUNS).await;
    let mut workers = vec![fleet.worker("w0"), fleet.worker("w1")];
    for (round, at) in [40, 100].into_iter().enumerate() {
        wait_until("the batch to progress", 60, || fleet.effects().len() >= at);
        let mut victim = workers.remove(0);
        let asked = Instant::now();
        delta_e2e::signal(victim.id(), Signal::SIGTERM);
        let status = loop {
            if let Some(s) = victim.try_wait().expect("wait") {
                break s;
            }
            assert!(
                asked.elapsed() < Duration::from_secs(20),
                "the worker did not exit within its grace period"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(status.success(), "a graceful stop exits 0: {status}");
        workers.push(fleet.worker(&format!("w{}", round + 2)));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let done = fleet.completed(&ids).await;
        if done == RUNS {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {done} of {RUNS} runs completed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for w in workers {
        stop(w);
    }
    fleet.check_journals(&ids, 3).await;
    let effects = fleet.effects();
    let unique: HashSet<&String> = effects.iter().collect();
    assert_eq!(
        unique.len(),
        effects.len(),
        "no step ran twice across two graceful stops"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_its_grace_a_stopping_worker_checkpoints_and_another_resumes() {
    let _serial = SERIAL.lock().await;
    let fleet = Fleet::start("gx", 5000, 500, 20).await;
    agent(&fleet.worker_spec.agents_dir, 1, "30", true);
    let mut w = fleet.worker("slow");
    let ids = fleet.submit(1).await;
    wait_until("the long step to start", 20, || !fleet.effects().is_empty());
    let asked = Instant::now();
    delta_e2e::signal(w.id(), Signal::SIGTERM);
    let status = loop {
        if let Some(s) = w.try_wait().expect("wait") {
            break s;
        }
        assert!(
            asked.elapsed() < Duration::from_secs(10),
            "a worker out of grace stops its steps and exits"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status}");
    let run = fleet.load(ids[0]).await;
    assert_eq!(run.record.status, RunStatus::Interrupted);
    assert!(
        matches!(run.journal.last().map(|e| &e.event), Some(Event::EngineEnd(end)) if end.status == RunStatus::Interrupted),
        "the checkpoint is journaled"
    );
    // The nak'ed job goes to the next worker, which re-runs the idempotent step.
    agent(&fleet.worker_spec.agents_dir, 1, "0", true);
    let next = fleet.worker("next");
    let deadline = Instant::now() + Duration::from_secs(30);
    while fleet.load(ids[0]).await.record.status != RunStatus::Completed {
        assert!(Instant::now() < deadline, "the interrupted run was resumed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop(next);
    fleet.check_journals(&ids, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_worker_dies_on_every_delivery_is_dead_lettered() {
    let _serial = SERIAL.lock().await;
    let fleet = Fleet::start("xd", 1000, 2000, 2).await;
    // The tool kills the worker running it: every delivery of this job ends in a crash.
    write_crasher(&fleet.worker_spec.agents_dir);
    let ids = fleet.submit_to("crasher", 1).await;

    let deaths = keep_a_worker_until(&fleet, 0, "the crashing job dead-lettered", async |_| {
        fleet.load(ids[0]).await.record.status == RunStatus::Failed
    })
    .await;
    let run = fleet.load(ids[0]).await;
    assert_eq!(deaths, 2, "the job was delivered max_deliver = 2 times");
    let error = run.record.error.unwrap_or_default();
    assert!(error.contains("delivered 2 times (max_deliver)"), "{error}");

    let js = async_nats::jetstream::new(delta_e2e::nats_client(&fleet.nats.url()).await);
    let mut dlq = js.get_stream("XD_DLQ").await.expect("dlq");
    let copied = dlq
        .get_last_raw_message_by_subject("xd.dlq.crasher")
        .await
        .expect("the job is in the DLQ");
    let reason = copied
        .headers
        .get("Delta-Dlq-Reason")
        .map(|v| v.as_str().to_owned())
        .unwrap_or_default();
    assert!(reason.contains("max_deliver"), "{reason}");
    assert_eq!(dlq.info().await.expect("info").state.messages, 1);
    // Removed last, once the run is failed and its end announced.
    wait_until_gone(&fleet, &js, &["XD_JOBS"]).await;
}

/// A worker that dies while it dead-letters an exhausted job (at its `exhausted:before-drop`
/// failpoint: after the copy to the DLQ and the run failed, before the job is removed and the
/// advisory acknowledged) leaves the run failed with its letter written, and the job and its
/// advisory for another worker (whose copy would be dropped as a duplicate: tests/tests/queue.rs).
/// The job was removed before the run was failed: a death in between left a `RUNNING` run with
/// no job, which the gateway's lost-job reconciler ran again, to die again. And while the job
/// is still there, the letter is not retried: the worker that takes the advisory up would fail
/// the retried run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_job_is_removed_only_once_its_run_is_failed() {
    let _serial = SERIAL.lock().await;
    let mut fleet = Fleet::start("xi", 1000, 2000, 2).await;
    write_crasher(&fleet.worker_spec.agents_dir);
    fleet
        .worker_spec
        .extra
        .push(("DELTA_FAILPOINT", "exhausted:before-drop".into()));
    let id = fleet.submit_to("crasher", 1).await[0];
    // Two workers killed by the job, a third by the failpoint as it dead-letters it.
    keep_a_worker_until(&fleet, 0, "three workers dead", async |deaths| deaths >= 3).await;
    let run = fleet.load(id).await;
    assert_eq!(
        run.record.status,
        RunStatus::Failed,
        "failed before the drop"
    );
    let js = async_nats::jetstream::new(delta_e2e::nats_client(&fleet.nats.url()).await);
    assert_eq!(messages_in(&js, "XI_DLQ").await, 1, "its letter written");
    assert_eq!(
        messages_in(&js, "XI_JOBS").await,
        1,
        "the job left for the next worker to remove"
    );
    assert_eq!(
        messages_in(&js, "XI_EXHAUSTED").await,
        1,
        "and its advisory, not acknowledged"
    );
    let client = fleet.add_gateway(None).await;
    let (_, page) = client.get("/v1/dlq").await.expect("dlq");
    let seq = page["dead_letters"][0]["seq"].as_u64().expect("a letter");
    let (status, body) = client
        .post(&format!("/v1/dlq/{seq}/retry"), &serde_json::json!({}))
        .await
        .expect("retry");
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "unavailable", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("still being dead-lettered")),
        "{body}"
    );
    assert_eq!(fleet.load(id).await.record.status, RunStatus::Failed);
    assert_eq!(messages_in(&js, "XI_DLQ").await, 1, "the letter kept");
}

/// A question's own resume job whose worker dies on every delivery before the job's first write
/// (at the worker's `resume:before-write` failpoint, as a crash loading or replaying the run
/// would) is dead-lettered and its run failed, as any job whose worker dies on every delivery.
/// Before, the exhausted job's handler let it go as it does the job that asked the question
/// (which leaves the run to its resume job), and the gateway's reconciler resumed the run again,
/// to die again, for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_job_whose_worker_dies_on_every_delivery_is_dead_lettered() {
    let _serial = SERIAL.lock().await;
    let (fleet, id, q) = exhaust_a_resume_job("xh", false).await;
    let run = fleet.load(id).await;
    assert_eq!(run.record.status, RunStatus::Failed);
    let error = run.record.error.unwrap_or_default();
    assert!(error.contains("delivered 2 times (max_deliver)"), "{error}");
    let js = async_nats::jetstream::new(delta_e2e::nats_client(&fleet.nats.url()).await);
    assert_eq!(messages_in(&js, "XH_DLQ").await, 1, "the job dead-lettered");
    // No resume owed any more: the gateway's reconciler leaves the run alone.
    let mut raw = delta_e2e::redis_connection(&fleet.redis.url()).await;
    let owed: Option<f64> = redis::cmd("ZSCORE")
        .arg(fleet.store.run_index(id, "resumes"))
        .arg(format!("{id}/{}", q.request_id))
        .query_async(&mut raw)
        .await
        .expect("zscore");
    assert_eq!(owed, None, "no resume owed");
}

/// But a resume job that did write (it refused the answer and reopened the question), whose
/// question was answered again before its deliveries ran out, is let go as before: the new
/// answer has a resume job of its own, and the run is not failed for it. The question is marked
/// `unannounced` for the gateway that resumes the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_job_that_reopened_its_question_is_let_go_when_it_runs_out() {
    let _serial = SERIAL.lock().await;
    let (fleet, id, q) = exhaust_a_resume_job("xj", true).await;
    let run = fleet.load(id).await;
    assert_eq!(run.record.status, RunStatus::WaitingForInput);
    let js = async_nats::jetstream::new(delta_e2e::nats_client(&fleet.nats.url()).await);
    assert_eq!(messages_in(&js, "XJ_DLQ").await, 0, "nothing dead-lettered");
    let ix = fleet
        .store
        .interaction(id, q.request_id)
        .await
        .expect("read")
        .expect("the question");
    assert_eq!(ix.state, delta_protocol::InteractionState::Answered);
    assert!(
        ix.unannounced,
        "marked for the gateway that resumes the run"
    );
}

/// A paused run's question answered (as a gateway settles it) and its resume job published,
/// then run by workers that die at `resume:before-write` until its two deliveries are used up
/// and a live worker settled the exhausted job (the job and its advisory gone). `reopened`:
/// before the answer, a delivery of that job refused an earlier answer and reopened the
/// question (as the engine does, in one write).
async fn exhaust_a_resume_job(
    prefix: &str,
    reopened: bool,
) -> (Fleet, RunId, delta_protocol::InteractionRequest) {
    let mut fleet = Fleet::start(prefix, 1000, 2000, 2).await;
    write_agent(
        &fleet.worker_spec.agents_dir,
        "asker",
        "name: asker\nbrain: scripted\ntools: []\n",
        "steps:\n  - ask_human:\n      prompt: \"Name?\"\n  - finish: \"done\"\n",
    );
    let id = fleet.submit_to("asker", 1).await[0];
    let w = fleet.worker("w0");
    let deadline = Instant::now() + Duration::from_secs(30);
    let paused = loop {
        let run = fleet.load(id).await;
        if run.record.status == RunStatus::WaitingForInput {
            break run;
        }
        assert!(Instant::now() < deadline, "the run pauses");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    stop(w);
    let q = answer_pending(&fleet, &paused).await;
    let job = fleet
        .queue
        .publish_job("asker", &Job::resume(id, Some(q.request_id)), None)
        .await
        .expect("the resume job");
    if reopened {
        let by_it = fleet.store.fenced(delta_protocol::Fence::new(job, 1));
        delta_e2e::reopen_refused(&by_it, &q).await;
        let again = delta_e2e::typed_answer(q.request_id, "Grace");
        assert!(fleet.store.answer(&q, &again).await.expect("answer"));
    }
    fleet
        .worker_spec
        .extra
        .push(("DELTA_FAILPOINT", "resume:before-write".into()));
    let js = async_nats::jetstream::new(delta_e2e::nats_client(&fleet.nats.url()).await);
    let names = [
        format!("{}_JOBS", prefix.to_uppercase()),
        format!("{}_EXHAUSTED", prefix.to_uppercase()),
    ];
    let settled = async |deaths| {
        let mut left = 0;
        for name in &names {
            left += messages_in(&js, name).await;
        }
        deaths == 2 && left == 0
    };
    keep_a_worker_until(&fleet, 1, "the exhausted resume job settled", settled).await;
    (fleet, id, q)
}

/// A worker that stops while it holds such a job, its question settled meanwhile, lets the job
/// go instead of giving it back (as it does after holding it two minutes): given back, its next
/// delivery would resume the run from the stored answer, and the answer would never be
/// announced, since the gateway's reconciler looks only at runs that still wait. The run waits
/// for the resume job that reconciler publishes after announcing the question (marked
/// `unannounced`, since its job no longer says so) and its answer.
#[tokio::test(flavor = "multi_thread")]
async fn a_held_question_settled_meanwhile_is_let_go_when_its_worker_stops() {
    let _serial = SERIAL.lock().await;
    let (mut fleet, js, run) = paused_with_events_stream_gone("xc", 2).await;
    let id = run.record.run_id;
    let q = delta_protocol::journal::Replay::new(&run.journal)
        .pending()
        .cloned()
        .expect("a pending question");
    assert!(
        fleet
            .store
            .answer(&q, &delta_e2e::typed_answer(q.request_id, "Ada"))
            .await
            .expect("answer")
    );
    let mut w = fleet.workers.pop().expect("the worker");
    delta_e2e::signal(w.id(), Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(20);
    while w.try_wait().expect("wait").is_none() {
        assert!(Instant::now() < deadline, "the worker stops");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Acknowledged (gone from the work queue), not given back to be delivered again.
    assert_eq!(messages_in(&js, "XC_JOBS").await, 0, "the job was let go");
    assert_eq!(messages_in(&js, "XC_DLQ").await, 0, "nothing dead-lettered");
    let after = fleet.load(id).await;
    assert_eq!(after.record.status, RunStatus::WaitingForInput);
    assert_eq!(after.record.pending_request_id, Some(q.request_id));
    // Marked, for a gateway to announce it before its answer (tests/tests/gateway.rs).
    let ix = fleet
        .store
        .interaction(id, q.request_id)
        .await
        .expect("read")
        .expect("the question");
    assert!(ix.unannounced, "the question says it may be unannounced");
}

/// A worker that dies (not stops) while it holds such a job, its question settled meanwhile:
/// the job's next delivery, once its ack deadline passes, leaves the run to its resume job
/// instead of resuming it from the stored answer, and marks the question `unannounced` (the job
/// that said so is gone), so that a gateway announces the question and its answer before the
/// run moves on. Resumed by that delivery, the run moved on with neither ever announced: the
/// gateway's reconciler looks only at runs that still wait.
#[tokio::test(flavor = "multi_thread")]
async fn a_held_question_settled_meanwhile_is_not_resumed_by_its_job_after_its_worker_died() {
    let _serial = SERIAL.lock().await;
    let (mut fleet, js, run) = paused_with_events_stream_gone("xe", 2).await;
    let q = answer_pending(&fleet, &run).await;
    kill_the_worker_and_start_another(&mut fleet, "xe").await;
    // Its deadline (3 s) passes, and the new worker gets it.
    wait_until_gone(&fleet, &js, &["XE_JOBS"]).await;
    assert_left_to_its_resume(&fleet, &js, "XE", &run, q.request_id).await;
}

/// A paused run's job whose deliveries run out while it is held (its last worker died), its
/// question settled meanwhile: the exhausted job's handler marks the question `unannounced` and
/// drops the job, rather than announcing the question, which could then follow its answer in
/// the events stream. The run waits for the gateway that resumes it to announce both, in order.
#[tokio::test(flavor = "multi_thread")]
async fn an_exhausted_job_whose_question_was_settled_marks_it_rather_than_announcing_it() {
    let _serial = SERIAL.lock().await;
    // One delivery: the one that paused the run is its last.
    let (mut fleet, js, run) = paused_with_events_stream_gone("xf", 1).await;
    let q = answer_pending(&fleet, &run).await;
    kill_the_worker_and_start_another(&mut fleet, "xf").await;
    // Its deadline (3 s) passes, JetStream's advisory says so, and the new worker settles it.
    wait_until_gone(&fleet, &js, &["XF_JOBS", "XF_EXHAUSTED"]).await;
    assert_left_to_its_resume(&fleet, &js, "XF", &run, q.request_id).await;
}

/// The same for a question asked by a resume job (of the run's first question): delivered again
/// after its worker died holding it, the second question settled meanwhile, the job leaves the
/// run to that question's own resume job and marks it. Before, it paused the run on the
/// question again and announced it, after its answer.
#[tokio::test(flavor = "multi_thread")]
async fn a_resume_job_that_asked_the_next_question_leaves_it_settled_to_its_own_resume() {
    let _serial = SERIAL.lock().await;
    let mut fleet = Fleet::start("xg", 3000, 2000, 2).await;
    write_agent(
        &fleet.worker_spec.agents_dir,
        "twice",
        "name: twice\nbrain: scripted\ntools: []\n",
        "steps:\n  - ask_human:\n      prompt: \"First?\"\n  - ask_human:\n      prompt: \"Second?\"\n  - finish: \"done\"\n",
    );
    fleet.add_worker("w0");
    let id = fleet.submit_to("twice", 1).await[0];
    let waiting = async |fleet: &Fleet, not: Option<delta_protocol::RequestId>| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let run = fleet.load(id).await;
            if run.record.status == RunStatus::WaitingForInput
                && run.record.pending_request_id != not
            {
                return run;
            }
            assert!(
                Instant::now() < deadline,
                "the run pauses: {}",
                std::fs::read_to_string(fleet.log("w0")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let first = answer_pending(&fleet, &waiting(&fleet, None).await).await;
    // The events stream gone: the second question's announcement is refused, its job held.
    let js = async_nats::jetstream::new(delta_e2e::nats_client(&fleet.nats.url()).await);
    js.delete_stream("XG_INTERACTIONS").await.expect("delete");
    fleet
        .queue
        .publish_job("twice", &Job::resume(id, Some(first.request_id)), None)
        .await
        .expect("the first question's resume");
    let paused = waiting(&fleet, Some(first.request_id)).await;
    let second = answer_pending(&fleet, &paused).await;
    kill_the_worker_and_start_another(&mut fleet, "xg").await;
    wait_until_gone(&fleet, &js, &["XG_JOBS"]).await;
    assert_left_to_its_resume(&fleet, &js, "XG", &paused, second.request_id).await;
}

/// Keeps one worker of `fleet` alive (`w<first>`, then a new one for each that dies: a job that
/// kills its worker) until `done` says so, given how many died; stops the last one and returns
/// that count. Fails after 40 s, saying it waited for `what`.
async fn keep_a_worker_until(
    fleet: &Fleet,
    first: usize,
    what: &str,
    mut done: impl AsyncFnMut(usize) -> bool,
) -> usize {
    let mut deaths = 0;
    let mut w = fleet.worker(&format!("w{first}"));
    let deadline = Instant::now() + Duration::from_secs(40);
    while !done(deaths).await {
        assert!(
            Instant::now() < deadline,
            "not {what} after 40 s ({deaths} workers died)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        if w.try_wait().expect("wait").is_some() {
            deaths += 1;
            w = fleet.worker(&format!("w{}", first + deaths));
        }
    }
    stop(w);
    deaths
}

/// Answers the question `run` waits on (as a gateway settles it, without announcing it); the
/// question.
async fn answer_pending(fleet: &Fleet, run: &StoredRun) -> delta_protocol::InteractionRequest {
    let q = delta_protocol::journal::Replay::new(&run.journal)
        .pending()
        .cloned()
        .expect("a pending question");
    let a = delta_e2e::typed_answer(q.request_id, "Ada");
    assert!(fleet.store.answer(&q, &a).await.expect("answer"));
    q
}

/// Kills the fleet's one worker (SIGKILL, so it neither gives back nor lets go the job it
/// holds), makes the streams again (as a gateway does as it connects) and starts worker `w1`.
async fn kill_the_worker_and_start_another(fleet: &mut Fleet, prefix: &str) {
    let mut w = fleet.workers.pop().expect("the worker");
    w.signal(Signal::SIGKILL);
    w.wait_exit(Duration::from_secs(10))
        .expect("the worker dies");
    Queue::connect(&fleet.nats.url(), prefix, &Default::default())
        .await
        .expect("the streams made again");
    fleet.add_worker("w1");
}

/// Waits until the streams `names` hold no message (the job delivered again and let go).
async fn wait_until_gone(fleet: &Fleet, js: &async_nats::jetstream::Context, names: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    for name in names {
        while messages_in(js, name).await > 0 {
            assert!(
                Instant::now() < deadline,
                "{name} emptied: {}",
                std::fs::read_to_string(fleet.log("w1")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The run `paused` left waiting on its settled question `rid` for that question's resume job:
/// nothing dead-lettered, the run still waiting on it with nothing journaled since, the question
/// marked `unannounced`, and nothing announced (the question and its answer are the gateway's to
/// announce, in that order). `stream`: the fleet's streams' prefix (`XE`).
async fn assert_left_to_its_resume(
    fleet: &Fleet,
    js: &async_nats::jetstream::Context,
    stream: &str,
    paused: &StoredRun,
    rid: delta_protocol::RequestId,
) {
    let id = paused.record.run_id;
    assert_eq!(
        messages_in(js, &format!("{stream}_DLQ")).await,
        0,
        "nothing dead-lettered"
    );
    let after = fleet.load(id).await;
    assert_eq!(
        after.record.status,
        RunStatus::WaitingForInput,
        "the run waits for its resume job"
    );
    assert_eq!(after.record.pending_request_id, Some(rid));
    assert_eq!(
        after.journal.len(),
        paused.journal.len(),
        "nothing journaled"
    );
    let ix = fleet
        .store
        .interaction(id, rid)
        .await
        .expect("read")
        .expect("the question");
    assert!(ix.unannounced, "the question says it may be unannounced");
    assert_eq!(
        messages_in(js, &format!("{stream}_INTERACTIONS")).await,
        0,
        "the settled question not announced by the worker"
    );
}

/// How many messages stream `name` holds.
async fn messages_in(js: &async_nats::jetstream::Context, name: &str) -> u64 {
    let mut stream = js.get_stream(name).await.expect("stream");
    stream.info().await.expect("info").state.messages
}

/// A fleet (prefix `prefix`, `max_deliver` as given) whose one worker has paused a `hello` run
/// on its question after the events stream was deleted (so its announcement is refused); the
/// stream client, and the paused run.
async fn paused_with_events_stream_gone(
    prefix: &str,
    max_deliver: i64,
) -> (Fleet, async_nats::jetstream::Context, StoredRun) {
    let (fleet, js) = events_stream_gone(prefix, max_deliver).await;
    let ids = fleet.submit_to("hello", 1).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let run = fleet.load(ids[0]).await;
        if run.record.status == RunStatus::WaitingForInput {
            return (fleet, js, run);
        }
        assert!(
            Instant::now() < deadline,
            "the run pauses on its question: {}",
            std::fs::read_to_string(fleet.log("w0")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A fleet (prefix `prefix`, `max_deliver` as given) with one worker, up, whose events stream
/// was deleted (so that announcements are refused); the stream client.
async fn events_stream_gone(
    prefix: &str,
    max_deliver: i64,
) -> (Fleet, async_nats::jetstream::Context) {
    let mut fleet = Fleet::start(prefix, 3000, 2000, max_deliver).await;
    agent(&fleet.worker_spec.agents_dir, 1, "0", true);
    fleet.add_worker("w0");
    // A first run through, so that the worker is up (it waits for the streams as it starts).
    let first = fleet.submit(1).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while fleet.completed(&first).await < 1 {
        assert!(Instant::now() < deadline, "the first run completes");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let js = async_nats::jetstream::new(delta_e2e::nats_client(&fleet.nats.url()).await);
    let events = format!("{}_INTERACTIONS", prefix.to_uppercase());
    // And its end announced (after its COMPLETED write): deleted before that, the stream would
    // refuse it, and the announcement would come again later, into the stream made again, where
    // the tests count what is announced.
    while messages_in(&js, &events).await < 1 {
        assert!(
            Instant::now() < deadline,
            "the first run's end is announced"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    js.delete_stream(&events).await.expect("delete");
    (fleet, js)
}

/// A job dead-lettered (its agent missing) while NATS refuses announcements (the events stream
/// gone): its run is failed, and its worker holds the job rather than ending it, trying the
/// run's end again until it is announced (`run.failed`, once, when the stream is back); one
/// letter. Before, the job was ended whatever happened, and the run's end was never announced:
/// an A2A push session or a webhook waiting on it waited until retention.
#[tokio::test(flavor = "multi_thread")]
async fn the_end_of_a_dead_lettered_run_nats_refused_is_announced_later() {
    let _serial = SERIAL.lock().await;
    let (fleet, js) = events_stream_gone("xp", 5).await;
    let ids = fleet.submit_to("later", 1).await;
    let log = || std::fs::read_to_string(fleet.log("w0")).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !log().contains("a run's end not announced; holding the job") {
        assert!(Instant::now() < deadline, "the job held: {}", log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Held a while, tried again meanwhile.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let run = fleet.load(ids[0]).await;
    assert_eq!(run.record.status, RunStatus::Failed);
    assert_eq!(messages_in(&js, "XP_DLQ").await, 1, "one letter");
    // The stream back (a gateway makes what is missing as it connects).
    Queue::connect(&fleet.nats.url(), "xp", &Default::default())
        .await
        .expect("the streams made again");
    let deadline = Instant::now() + Duration::from_secs(30);
    let ended = loop {
        if let Ok(mut stream) = js.get_stream("XP_INTERACTIONS").await {
            let of_run: Vec<String> = delta_e2e::stored_events(&mut stream)
                .await
                .into_iter()
                .filter(|v| v["deltarun"] == serde_json::json!(ids[0].to_string()))
                .map(|v| v["type"].as_str().unwrap_or_default().to_owned())
                .collect();
            if !of_run.is_empty() {
                break of_run;
            }
        }
        assert!(Instant::now() < deadline, "the end announced: {}", log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(ended, ["dev.delta.run.failed"]);
    // And the job ended with it, by the delivery that held it: nothing left to deliver.
    wait_until_gone(&fleet, &js, &["XP_JOBS"]).await;
    assert_eq!(messages_in(&js, "XP_DLQ").await, 1, "still one letter");
    assert!(
        log().contains("the run's end announced after all"),
        "{}",
        log()
    );
    assert!(!log().contains("delivery=2"), "delivered once: {}", log());
}

/// A run that paused on a question (stored in Redis) whose announcement NATS refuses (the events
/// stream gone for a while: here deleted, as a stream without a leader refuses) is not failed for
/// it, whatever `max_deliver`: its worker holds the job and tries the announcement again, and
/// the question is announced once the stream is back. Before, each delivery's refusal used one
/// up, and the last one dead-lettered the run (seen in chaos_cluster's `s7` on a loaded machine).
#[tokio::test(flavor = "multi_thread")]
async fn a_question_nats_will_not_take_yet_is_announced_later_and_its_run_not_failed() {
    let _serial = SERIAL.lock().await;
    // Two deliveries at most: the old way failed the run within a second of its pause.
    let (fleet, js, run) = paused_with_events_stream_gone("xa", 2).await;
    let ids = [run.record.run_id];
    // Long enough for both deliveries to have been used up the old way (a refusal, a 0.4 s
    // back-off, a second refusal).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        fleet.load(ids[0]).await.record.status,
        RunStatus::WaitingForInput,
        "a run that only waits is not failed because its question could not be announced"
    );
    // The stream back (a gateway makes what is missing as it connects).
    Queue::connect(&fleet.nats.url(), "xa", &Default::default())
        .await
        .expect("the streams made again");
    // Stored in the stream (a subscriber would have heard the refused attempts too).
    let deadline = Instant::now() + Duration::from_secs(30);
    let announced = loop {
        if let Ok(mut stream) = js.get_stream("XA_INTERACTIONS").await
            && let Ok(info) = stream.info().await
            && info.state.messages > 0
        {
            let first = info.state.first_sequence;
            break stream
                .get_raw_message(first)
                .await
                .expect("the first message");
        }
        assert!(
            Instant::now() < deadline,
            "the question is announced once the stream is back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        announced.subject.starts_with("xa.interactions.requested."),
        "{}",
        announced.subject
    );
    let q: serde_json::Value = serde_json::from_slice(&announced.payload).expect("json");
    assert_eq!(q["data"]["run_id"], ids[0].to_string());
    assert_eq!(
        fleet.load(ids[0]).await.record.status,
        RunStatus::WaitingForInput
    );
    assert_eq!(messages_in(&js, "XA_DLQ").await, 0, "nothing dead-lettered");
}

/// A held job whose question is answered meanwhile (through the inbox, which lists it from
/// Redis), while NATS still will not take the announcement, stays held as long as its run waits
/// on the question: a gateway settling a question announces it first only while the job that
/// asked it is in the stream, and the worker's own later announcement is a duplicate, dropped.
/// It is let go once the run moves on (here cancelled; usually resumed by the job the gateway
/// publishes after its announcements). Before, it was let go at once, and the question, never
/// announced, could reach bots and webhooks only as its answer.
#[tokio::test(flavor = "multi_thread")]
async fn a_held_question_answered_meanwhile_keeps_its_job_until_the_run_moves_on() {
    let _serial = SERIAL.lock().await;
    let (fleet, js, run) = paused_with_events_stream_gone("xb", 2).await;
    let id = run.record.run_id;
    // Jobs delivered and not acknowledged, over the jobs stream's consumers.
    let held = async || {
        let jobs = js.get_stream("XB_JOBS").await.expect("jobs");
        let mut n = 0;
        for name in delta_e2e::consumer_names(&jobs).await {
            let mut c: async_nats::jetstream::consumer::PullConsumer =
                jobs.get_consumer(&name).await.expect("consumer");
            n += c.info().await.expect("info").num_ack_pending;
        }
        n
    };
    assert_eq!(
        held().await,
        1,
        "the job is held while the question is not announced"
    );
    answer_pending(&fleet, &run).await;
    // The worker looks at the run every second at most here (a third of `ack_wait`): three
    // looks, each finding the run still waiting on the question.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(held().await, 1, "still held: the run waits on its question");
    assert_eq!(
        fleet.load(id).await.record.status,
        RunStatus::WaitingForInput
    );

    // The run moves on: cancelled, as a gateway cancels it.
    delta_e2e::cancel_run(&fleet.store, id, "cancelled by ops").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while held().await > 0 {
        assert!(
            Instant::now() < deadline,
            "the job let go once its run moved on"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(messages_in(&js, "XB_DLQ").await, 0, "nothing dead-lettered");
    assert_eq!(fleet.load(id).await.record.status, RunStatus::Cancelled);
}
