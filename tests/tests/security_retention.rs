//! Findings 9 (retention) and 11 (one shared work directory) of the security review (issue 14),
//! reproduced against real nats-server, redis-server, gateway and worker processes: a finished
//! run past `DELTA_RETENTION` is deleted whole by the gateways, every run has its own work
//! directory under `DELTA_WORK_DIR`, and the workers sweep the directories of deleted runs.
//! The store-level cases (what exactly is deleted, idempotency, the backfill) are in
//! `redis_store.rs`.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use delta_e2e::fleet::Fleet;
use delta_protocol::{Event, RunId, RunStatus, Timestamp};
use delta_store::RunStore;
use delta_store::redis::Purge;
use serde_json::json;

/// An agent whose first tool writes the task to `mine.txt` and reports where it ran; after a
/// question, a second tool lists what it can see by relative path.
fn add_files_agent(fleet: &Fleet) {
    fleet.add_agent(
        "files",
        "name: files\nbrain: scripted\ntools:\n  \
         - name: write\n    shell: 'echo ${text} > mine.txt; echo \"cwd=$CWD pwd=$(pwd)\"'\n    idempotent: true\n  \
         - name: look\n    shell: 'ls -A; cat mine.txt'\n    idempotent: true\n",
        "steps:\n  - tool: write\n    args: {text: \"${task}\"}\n  \
         - ask_human: {prompt: \"Go on?\"}\n  - tool: look\n  - finish: \"${observation}\"\n",
    );
}

/// The observations of a run's tools, in order.
fn observations(run: &delta_store::StoredRun) -> Vec<String> {
    run.journal
        .iter()
        .filter_map(|e| match &e.event {
            Event::ActionResult(r) => Some(r.observation_content.trim_end().to_owned()),
            _ => None,
        })
        .collect()
}

/// Waits (up to `secs`) for `ok`, failing with `what`.
async fn eventually(what: &str, secs: u64, mut ok: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !ok().await {
        assert!(Instant::now() < deadline, "{what}: not within {secs} s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The names in a directory.
fn names(dir: &Path) -> Vec<String> {
    let mut n: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    n.sort();
    n
}

/// Findings 9 and 11 end to end: two runs on one worker work in two directories of their own
/// and cannot see each other's files by relative path; once one finished longer than
/// `DELTA_RETENTION` ago, a gateway deletes it from Redis (every key and index entry) and the
/// worker removes its directory (without following a link out of the root), while the paused
/// run keeps both.
#[tokio::test(flavor = "multi_thread")]
async fn a_finished_run_past_retention_is_deleted_with_its_work_dir_and_a_paused_one_stays() {
    let mut fleet = Fleet::start_with("ret1", 1, 0, |s| {
        s.extra = vec![("DELTA_RETENTION", "2s".into())];
    })
    .await;
    add_files_agent(&fleet);
    fleet.worker_spec.extra = vec![
        ("DELTA_RETENTION", "2s".into()),
        ("DELTA_WORK_SWEEP_S", "0.3".into()),
    ];
    fleet.add_worker("w0");
    let root = fleet
        .worker_spec
        .work_dir
        .canonicalize()
        .expect("work root");

    let done = fleet.submit("files", "alpha").await;
    let paused = fleet.submit("files", "beta").await;
    let done_q = fleet.pending(done).await;
    let paused_q = fleet.pending(paused).await;

    // Each run wrote in its own directory, private to the worker's user, and its tool was told so.
    for (run, text) in [(done, "alpha"), (paused, "beta")] {
        let dir = root.join(run.to_string());
        assert_eq!(
            std::fs::read_to_string(dir.join("mine.txt")).expect("mine.txt"),
            format!("{text}\n")
        );
        let mode = std::fs::metadata(&dir).expect("dir").permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", dir.display());
        let stored = fleet.store.load(run).await.expect("load");
        let where_ = format!("cwd={} pwd={}", dir.display(), dir.display());
        assert_eq!(observations(&stored), [where_]);
    }

    // A link out of the root, left in the finished run's directory.
    let outside = tempfile::tempdir().expect("outside");
    std::fs::write(outside.path().join("keep"), "x").expect("write");
    std::os::unix::fs::symlink(outside.path(), root.join(done.to_string()).join("out"))
        .expect("symlink");

    let (status, body) = fleet.answer(&done_q, json!({"input": "go"})).await;
    assert_eq!(status, 200, "{body}");
    fleet.wait_status(done, RunStatus::Completed).await;
    let finished = fleet.store.load(done).await.expect("load");
    // By relative path, the tool saw its own files only.
    let seen = observations(&finished);
    let listed = seen.last().map(|o| o.lines().collect::<Vec<_>>());
    assert_eq!(listed, Some(vec!["mine.txt", "out", "alpha"]), "{seen:?}");

    // Past retention: gone from Redis, every key and index entry, and its directory swept.
    let url = fleet.redis.url();
    let id = done.to_string();
    eventually("the finished run deleted", 20, async || {
        !delta_e2e::redis_dump(&url, "ret1:*").await.contains(&id)
    })
    .await;
    let dump = delta_e2e::redis_dump(&url, "ret1:*").await;
    assert!(!dump.contains(&done_q), "its question is gone too: {dump}");
    assert!(matches!(
        fleet.store.load(done).await,
        Err(delta_store::Error::NotFound(_))
    ));
    let done_dir = root.join(done.to_string());
    eventually("its work directory removed", 10, async || {
        !done_dir.exists()
    })
    .await;
    assert!(
        outside.path().join("keep").exists(),
        "the sweep followed a link out of the root"
    );

    // The paused run, as old, keeps its record, question and directory.
    assert_eq!(
        fleet.store.load(paused).await.expect("load").record.status,
        RunStatus::WaitingForInput
    );
    assert!(dump.contains(&paused.to_string()) && dump.contains(&paused_q));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(root.join(paused.to_string()).join("mine.txt").exists());
    assert_eq!(names(&root), [paused.to_string()]);

    // Deleting again (another gateway, a retry) deletes nothing more.
    let now = Timestamp::now().micros();
    assert_eq!(
        fleet.store.purge_run(done, now).await.expect("purge"),
        Purge::Gone
    );
    assert_eq!(
        fleet.store.purge_run(paused, now).await.expect("purge"),
        Purge::Live
    );
    // The same keys and values as before, but for the workers' heartbeats (which move on their
    // own), in a stable order.
    let stable = |d: &str| {
        let mut lines: Vec<String> = d
            .lines()
            .filter(|l| !l.starts_with("ret1:workers "))
            .map(str::to_owned)
            .collect();
        lines.sort();
        lines
    };
    assert_eq!(
        stable(&delta_e2e::redis_dump(&url, "ret1:*").await),
        stable(&dump)
    );

    // Counted, not listed.
    let (_, metrics) = fleet.client.get("/metrics").await.expect("metrics");
    let text = metrics.as_str().unwrap_or_default().to_owned();
    assert!(
        text.lines().any(|l| l == "delta_runs_purged_total 1"),
        "{text}"
    );
}

/// Finding 11: a job whose run id tries to climb out of the root makes no directory anywhere:
/// it is not a run id, so it is dead-lettered before anything touches the disk.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_id_with_dot_dot_cannot_make_a_directory_outside_the_root() {
    let fleet = Fleet::start("ret2", 1, 1).await;
    add_files_agent(&fleet);
    let root = fleet
        .worker_spec
        .work_dir
        .canonicalize()
        .expect("work root");
    let escape = format!("escape-{}", RunId::new());
    // Jobs no gateway would publish: with every right on NATS.
    let nc = fleet.nats_admin().await;
    let js = async_nats::jetstream::new(nc);
    for run_id in [
        format!("../{escape}"),
        format!("../../{escape}"),
        format!("{}/../../{escape}", RunId::new()),
    ] {
        js.publish(
            "ret2.jobs.files",
            serde_json::to_vec(&json!({"run_id": run_id, "kind": "start"}))
                .expect("json")
                .into(),
        )
        .await
        .expect("publish")
        .await
        .expect("ack");
    }
    let client = fleet.client.clone();
    eventually("the jobs dead-lettered", 20, async || {
        let (_, body) = client.get("/v1/dlq").await.expect("dlq");
        body["dead_letters"].as_array().map_or(0, Vec::len) == 3
    })
    .await;
    for dir in [root.clone(), root.join(".."), root.join("../..")] {
        assert!(
            !dir.join(&escape).exists(),
            "{} made outside the root",
            dir.join(&escape).display()
        );
    }
    assert!(names(&root).is_empty(), "{:?}", names(&root));

    // A real run still works, in its own directory.
    let run = fleet.submit("files", "gamma").await;
    fleet.pending(run).await;
    assert_eq!(names(&root), [run.to_string()]);
}

/// Finding 11: a worker also removes the directory of a run that finished longer than
/// `DELTA_RETENTION` ago while the run is still in Redis (here the gateways keep runs forever),
/// and keeps that of a paused run.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_removes_the_directory_of_a_run_finished_past_retention() {
    let mut fleet = Fleet::start_with("ret3", 1, 0, |s| {
        s.extra = vec![("DELTA_RETENTION", "off".into())];
    })
    .await;
    add_files_agent(&fleet);
    fleet.worker_spec.extra = vec![
        ("DELTA_RETENTION", "1s".into()),
        ("DELTA_WORK_SWEEP_S", "0.3".into()),
    ];
    fleet.add_worker("w0");
    let root = fleet
        .worker_spec
        .work_dir
        .canonicalize()
        .expect("work root");
    let done = fleet.submit("files", "alpha").await;
    let paused = fleet.submit("files", "beta").await;
    let done_q = fleet.pending(done).await;
    fleet.pending(paused).await;
    let (status, body) = fleet.answer(&done_q, json!({"input": "go"})).await;
    assert_eq!(status, 200, "{body}");
    fleet.wait_status(done, RunStatus::Completed).await;

    let done_dir = root.join(done.to_string());
    eventually("the finished run's directory removed", 10, async || {
        !done_dir.exists()
    })
    .await;
    assert_eq!(
        fleet
            .store
            .load(done)
            .await
            .expect("kept in Redis")
            .record
            .status,
        RunStatus::Completed
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(names(&root), [paused.to_string()]);
}

/// An agent that never uses a work directory (the scripted brain, `builtin:` tools only, no
/// hooks) gets none: its runs pause and complete with nothing made under the root.
#[tokio::test(flavor = "multi_thread")]
async fn an_agent_of_builtin_tools_gets_no_work_directory() {
    let mut fleet = Fleet::start_with("ret4", 1, 0, |_| {}).await;
    fleet.add_agent(
        "inworker",
        "name: inworker\nbrain: scripted\ntools:\n  - name: echo\n    description: Returns its input.\n    builtin: echo\n",
        "steps:\n  - ask_human: {prompt: \"go?\"}\n  - tool: echo\n    args: {text: \"said ${answer}\"}\n  - finish: \"${observation}\"\n",
    );
    add_files_agent(&fleet);
    fleet.add_worker("w0");
    let root = fleet
        .worker_spec
        .work_dir
        .canonicalize()
        .expect("work root");
    let run = fleet.submit("inworker", "t").await;
    let q = fleet.pending(run).await;
    assert!(names(&root).is_empty(), "{:?}", names(&root));
    let (status, body) = fleet.answer(&q, json!({"input": "yes"})).await;
    assert_eq!(status, 200, "{body}");
    fleet.wait_status(run, RunStatus::Completed).await;
    let stored = fleet.store.load(run).await.expect("load");
    assert_eq!(
        observations(&stored).last().map(String::as_str),
        Some("said yes")
    );
    assert!(names(&root).is_empty(), "{:?}", names(&root));
    // An agent that runs processes on the same worker still gets its own.
    let files = fleet.submit("files", "alpha").await;
    fleet.pending(files).await;
    assert_eq!(names(&root), [files.to_string()]);
}

/// A deployment made before `<p>:finished-index`, with more runs finished before the finished
/// index existed (not in it) than two rounds of the walk take (200 a round): the gateway walks the
/// status indexes, adds them, deletes every one past retention, and notes that every finished
/// run is indexed, so that gateways started later walk nothing (docs/protocol.md "Retention").
/// Had it deleted the first batch (in the second round) before its walk was through, the walk
/// would have passed over as many of the rest in the third, and they would stay forever.
#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_backfills_an_older_deployment_once_and_notes_it() {
    let mut fleet = Fleet::start_with("ret5", 0, 0, |s| {
        s.extra = vec![("DELTA_RETENTION", "1s".into())];
    })
    .await;
    let store = fleet.store.clone();
    let mut ids = vec![];
    // One command each: on a Redis Cluster the keys are in several slots.
    let mut as_before = vec![];
    for _ in 0..450 {
        let rec = delta_store::RunRecord::new(RunId::new(), "hello", "t", RunStatus::Queued);
        let id = rec.run_id;
        store.create(rec).await.expect("create");
        store
            .append(id, vec![], Some(delta_e2e::completed_ok()))
            .await
            .expect("finish");
        // As a build before the finished index left it.
        let mut zrem = redis::cmd("ZREM");
        zrem.arg(store.run_index(id, "runs:finished"))
            .arg(id.to_string());
        as_before.push(zrem);
        ids.push(id);
    }
    // In a deployment before the note.
    let mut del = redis::cmd("DEL");
    del.arg("ret5:finished-index");
    as_before.push(del);
    let mut raw = delta_e2e::redis_connection(&fleet.redis.url()).await;
    for cmd in as_before {
        let _: () = cmd.query_async(&mut raw).await.expect("as before");
    }
    assert!(
        store
            .finished_at(&ids)
            .await
            .expect("read")
            .iter()
            .all(Option::is_none)
    );
    // Every one past retention before the walk begins, so that a gateway that deleted as it
    // walked would delete the first batches before the walk got through.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    fleet.add_gateway(None).await;
    eventually("every run deleted past retention", 30, async || {
        for id in &ids {
            if store.load(*id).await.is_ok() {
                return false;
            }
        }
        true
    })
    .await;
    eventually("every finished run noted as indexed", 30, async || {
        let v: Option<String> = redis::cmd("GET")
            .arg("ret5:finished-index")
            .query_async(&mut raw.clone())
            .await
            .expect("get");
        v.as_deref() == Some("complete")
    })
    .await;
}

/// A run of agent `later`, which the fleet (key prefix `prefix`) does not have, once its worker
/// dead-lettered its job and failed it (an agent that does not load). The job is published
/// here: the gateway refuses a submission for an agent it does not have.
async fn dead_lettered(fleet: &Fleet, prefix: &str) -> RunId {
    let rec = delta_store::RunRecord::new(RunId::new(), "later", "t", RunStatus::Queued);
    let lettered = rec.run_id;
    fleet.store.create(rec).await.expect("create");
    let queue = delta_queue::Queue::connect(
        &fleet.nats.url(),
        prefix,
        &delta_e2e::workers::queue_settings(&fleet.worker_spec),
    )
    .await
    .expect("nats");
    queue
        .publish_job("later", &delta_protocol::Job::start(lettered), None)
        .await
        .expect("publish");
    fleet.wait_status(lettered, RunStatus::Failed).await;
    lettered
}

/// The run's `dead_letter` mark, as its record in Redis holds it.
async fn dead_letter_mark(fleet: &Fleet, run: RunId) -> Option<String> {
    let mut raw = delta_e2e::redis_connection(&fleet.redis.url()).await;
    redis::cmd("HGET")
        .arg(fleet.store.run_key(run))
        .arg("dead_letter")
        .query_async(&mut raw)
        .await
        .expect("hget")
}

/// A dead letter is kept 30 days, and `delta dlq retry` needs its run: so retention keeps the
/// run of a dead-lettered job (its record marked `dead_letter` by the worker that failed it) for
/// as long as the letter, where it deleted it `DELTA_RETENTION` after it failed. Here, with a
/// retention of 1 s: a run that completed is deleted, the dead-lettered one is deferred (its
/// finished entry moved on by the 30 days less the retention, the mark removed), and its letter
/// retried past the retention completes the run, which retention then deletes as any other.
#[tokio::test(flavor = "multi_thread")]
async fn a_dead_lettered_run_is_kept_past_retention_for_as_long_as_its_letter() {
    let mut fleet = Fleet::start_with("ret7", 1, 0, |s| {
        s.extra = vec![("DELTA_RETENTION", "1s".into())];
    })
    .await;
    fleet.add_agent(
        "quick",
        "name: quick\nbrain: scripted\n",
        "steps:\n  - finish: \"done\"\n",
    );
    fleet.add_worker("w0");
    // No agent `later` yet: its run is dead-lettered.
    let lettered = dead_lettered(&fleet, "ret7").await;
    let (_, page) = fleet.client.get("/v1/dlq").await.expect("dlq");
    let seq = page["dead_letters"][0]["seq"].as_u64().expect("a letter");
    // (Its mark is not read here: retention may have deferred it already. redis_store.rs
    // checks the marking.)

    // Past retention: the completed run is deleted, the dead-lettered one deferred.
    let done = fleet.submit("quick", "t").await;
    fleet.wait_status(done, RunStatus::Completed).await;
    eventually("the completed run deleted", 20, async || {
        matches!(
            fleet.store.load(done).await,
            Err(delta_store::Error::NotFound(_))
        )
    })
    .await;
    let kept = fleet
        .store
        .load(lettered)
        .await
        .expect("the dead-lettered run kept");
    assert_eq!(kept.record.status, RunStatus::Failed);
    // The instant it failed, which the finished index scored it by before it was deferred.
    let failed_at = kept.record.updated_at.micros();
    let deferred_to = fleet.store.finished_at(&[lettered]).await.expect("read")[0]
        .expect("still in the finished index");
    let longer =
        i64::try_from((Duration::from_secs(30 * 24 * 3600) - Duration::from_secs(1)).as_micros())
            .expect("µs");
    assert_eq!(
        deferred_to,
        failed_at + longer,
        "deferred by the letter's 30 days less 1 s"
    );
    assert_eq!(
        dead_letter_mark(&fleet, lettered).await,
        None,
        "deferred once: the mark is gone"
    );

    // The cause mended, the letter retried: the run goes on and completes, and then, finished
    // as any other run, retention deletes it.
    fleet.add_agent(
        "later",
        "name: later\nbrain: scripted\n",
        "steps:\n  - finish: \"at last\"\n",
    );
    let (status, body) = fleet
        .client
        .post(&format!("/v1/dlq/{seq}/retry"), &json!({}))
        .await
        .expect("retry");
    assert_eq!(status, 200, "{body}");
    fleet.wait_status(lettered, RunStatus::Completed).await;
    eventually(
        "the retried run deleted once it completed",
        20,
        async || {
            matches!(
                fleet.store.load(lettered).await,
                Err(delta_store::Error::NotFound(_))
            )
        },
    )
    .await;
}

/// A dead letter dropped (`delta dlq drop`) leaves its run to the retention of any finished run:
/// the drop removes the run's `dead_letter` mark (retention off here, so that nothing defers it
/// first).
#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_letter_no_longer_keeps_its_run() {
    let mut fleet = Fleet::start_with("ret8", 1, 0, |s| {
        s.extra = vec![("DELTA_RETENTION", "off".into())];
    })
    .await;
    fleet.add_worker("w0");
    let lettered = dead_lettered(&fleet, "ret8").await;
    let mark = async || dead_letter_mark(&fleet, lettered).await;
    assert_eq!(
        mark().await.as_deref(),
        Some("1"),
        "the failed run is marked"
    );
    let (_, page) = fleet.client.get("/v1/dlq").await.expect("dlq");
    let seq = page["dead_letters"][0]["seq"].as_u64().expect("a letter");
    let (status, body) = fleet
        .client
        .delete(&format!("/v1/dlq/{seq}"))
        .await
        .expect("drop");
    assert!((200..300).contains(&status), "{status} {body}");
    assert_eq!(mark().await, None, "the mark goes with the letter");
    assert_eq!(
        fleet
            .store
            .load(lettered)
            .await
            .expect("kept")
            .record
            .status,
        RunStatus::Failed
    );
}
