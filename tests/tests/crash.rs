//! Kill -9 workers mid-step during a batch: every run completes, no step is journaled twice.
//!
//! Workers are real `delta-worker` processes (the end-to-end `Fleet`) so that they can be
//! SIGKILLed.

use std::path::Path;
use std::time::{Duration, Instant};

use delta_protocol::{Job, RunId, RunStatus};
use delta_queue::Queue;
use delta_store::{RunRecord, RunStore};

fn agent(dir: &Path) {
    let a = dir.join("steps");
    std::fs::create_dir_all(&a).expect("mkdir");
    std::fs::write(
        a.join("config.yaml"),
        "name: steps\nbrain: scripted\ntools:\n  - name: step\n    shell: 'echo ${label} >> effects; sleep 0.05; echo done ${label}'\n    idempotent: true\n",
    )
    .expect("write");
    std::fs::write(
        a.join("script.yaml"),
        "steps:\n  - tool: step\n    args: {label: \"${run_id}-1\"}\n  - tool: step\n    args: {label: \"${run_id}-2\"}\n  - tool: step\n    args: {label: \"${run_id}-3\"}\n  - finish: ok\n",
    )
    .expect("write");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_workers_mid_step_loses_and_duplicates_nothing() {
    const RUNS: usize = 200;
    let mut fleet = delta_e2e::fleet::Fleet::start("kx", 0, 0).await;
    let spec = &mut fleet.worker_spec;
    spec.concurrency = 16;
    (spec.ack_wait_ms, spec.max_deliver, spec.grace_ms) = (2000, 20, 2000);
    agent(&spec.agents_dir);
    let work = spec.work_dir.clone();
    let store = fleet.store.clone();
    let q = Queue::connect(
        &fleet.nats.url(),
        "kx",
        &delta_e2e::workers::queue_settings(&fleet.worker_spec),
    )
    .await
    .expect("nats");

    let mut ids = vec![];
    for _ in 0..RUNS {
        let rec = RunRecord::new(RunId::new(), "steps", "t", RunStatus::Queued);
        ids.push(rec.run_id);
        store.create(rec.clone()).await.expect("create");
        q.publish_job("steps", &Job::start(rec.run_id), None)
            .await
            .expect("publish");
    }
    let mut workers = vec![fleet.spawn_worker("w0"), fleet.spawn_worker("w1")];
    // Kill a worker each time the batch crosses another 90 of its 600 steps, and start a fresh
    // one in its place: the kills land mid-batch, whatever the machine's speed (checked: each
    // kill's count of steps run is recorded).
    let thresholds = [60, 150, 240, 330];
    let mut kills = 0;
    let mut steps_at_kills = vec![];
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let steps_run = delta_e2e::run_file_lines(&work, "effects").len();
        if kills < thresholds.len() && steps_run >= thresholds[kills] {
            let victim = kills % workers.len();
            steps_at_kills.push(steps_run);
            workers[victim].kill().expect("kill -9");
            let _ = workers[victim].wait();
            workers[victim] = fleet.spawn_worker(&format!("w{}", kills + 2));
            kills += 1;
            continue;
        }
        let mut done = 0;
        for id in &ids {
            if store.load(*id).await.expect("load").record.status == RunStatus::Completed {
                done += 1;
            }
        }
        if done == RUNS {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {done} of {RUNS} runs completed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for mut w in workers {
        let _ = w.kill();
        let _ = w.wait();
    }

    let mut reruns = 0;
    for id in &ids {
        let run = store.load(*id).await.expect("load");
        delta_e2e::assert_each_step_once(&run, 3);
        // Each run's steps ran in its own work directory.
        let effects =
            std::fs::read_to_string(work.join(id.to_string()).join("effects")).expect("effects");
        for step in 1..=3 {
            let n = effects
                .lines()
                .filter(|l| *l == format!("{id}-{step}"))
                .count();
            assert!(n >= 1, "run {id} step {step} never ran");
            reruns += n - 1;
        }
    }
    // Re-runs happen only for steps in flight at a kill (idempotent tools, journaled once).
    assert_eq!(kills, thresholds.len(), "every kill made");
    assert!(
        steps_at_kills.iter().all(|n| *n < RUNS * 3),
        "every kill landed mid-batch (steps run at each: {steps_at_kills:?})"
    );
    assert!(
        reruns <= kills * 16,
        "{reruns} re-executions for {kills} kills of 16 slots"
    );
    eprintln!("{RUNS} runs completed through {kills} kill -9s; {reruns} in-flight steps re-ran");
}
