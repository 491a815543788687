//! Issue 15: the fleet on a 3-node NATS cluster (routes on loopback, JetStream, R3 streams),
//! given every node's URL, rides through the loss of a server with nothing lost, answers
//! arriving over HTTP and over NATS all along; the harness's Redis Cluster; and the fleet's main
//! scenarios on both clusters at once (what CI runs on clusters every time; the whole suite
//! runs so with `DELTA_TEST_CLUSTER=1`, docs/testing.md).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use delta_e2e::gateways::{self, Client};
use delta_e2e::workers;
use delta_e2e::{NatsRole, Redis, RedisRole, Signal};
use delta_launcher::NatsCluster;
use delta_launcher::servers::ServerOptions;
use delta_protocol::{RunId, RunStatus};
use delta_store::RunStore;
use serde_json::json;

const RUNS: usize = 30;

/// The streams' leader of `stream`, as JetStream names it (a node's `server_name`).
async fn leader(js: &async_nats::jetstream::Context, stream: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(mut s) = js.get_stream(stream).await
            && let Ok(info) = s.info().await
            && let Some(leader) = info.cluster.as_ref().and_then(|c| c.leader.clone())
        {
            return leader;
        }
        assert!(Instant::now() < deadline, "{stream} has no leader");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Answers every pending question once: every other one over HTTP, the rest as a bot over NATS
/// (request-reply to the gateways through the cluster). An answer whose reply is lost (a server
/// going away) is sent again later; a second copy is acknowledged as the same answer.
async fn answer_pending(
    client: &Client,
    bot: &async_nats::Client,
    answered: &mut std::collections::HashSet<String>,
) {
    let Ok(page) = client.interactions("state=pending&limit=100").await else {
        return;
    };
    for ix in page.interactions {
        let rid = ix.request_id.to_string();
        if answered.contains(&rid) {
            continue;
        }
        let body = json!({"input": "Ada"});
        let ok = if answered.len() % 2 == 0 {
            matches!(
                client
                    .post(&format!("/v1/interactions/{rid}/response"), &body)
                    .await,
                Ok((200, _))
            )
        } else {
            let reply = tokio::time::timeout(
                Duration::from_secs(5),
                bot.request(
                    format!("nc.interactions.respond.{rid}"),
                    body.to_string().into_bytes().into(),
                ),
            )
            .await;
            matches!(reply, Ok(Ok(m))
                if serde_json::from_slice::<serde_json::Value>(&m.payload)
                    .is_ok_and(|v| v["ok"] == true))
        };
        if ok {
            answered.insert(rid);
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fleet_on_a_nats_cluster_loses_nothing_when_the_jobs_leader_is_killed() {
    let mut nats = NatsCluster::start(3, &ServerOptions::default()).expect("a 3-node cluster");
    let redis = Redis::start().expect("redis");
    let prefix = "nc";
    let agents = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/agents");
    let work = tempfile::tempdir().expect("work");
    let mut spec = gateways::Spec {
        reconcile_ms: 200,
        resume_check_s: 1,
        lost_job_s: 3,
        worker_nats_url: nats.url_as(NatsRole::Worker),
        worker_redis_url: redis.url_as(RedisRole::Worker),
        ..gateways::Spec::new(
            &nats.url_as(NatsRole::Gateway),
            &redis.url_as(RedisRole::Gateway),
            prefix,
            agents,
            delta_e2e::free_port().expect("port"),
        )
    };
    spec.extra.push(("DELTA_STREAM_REPLICAS", "3".into()));
    let gateway = gateways::spawn(&spec, None).await;
    let mut worker_spec = workers::Spec {
        concurrency: 8,
        ack_wait_ms: 5000,
        max_deliver: 5,
        grace_ms: 2000,
        ..workers::Spec::joining(&spec, work.path().to_path_buf())
    };
    worker_spec
        .extra
        .push(("DELTA_STREAM_REPLICAS", "3".into()));
    let _workers = [
        workers::spawn(&worker_spec, "w0", None),
        workers::spawn(&worker_spec, "w1", None),
    ];
    let client = Client::new(&gateway.url, None);
    let bot = delta_e2e::nats_client(&nats.url_as(NatsRole::Bot)).await;
    let store = delta_store::redis::RedisRunStore::connect(&redis.url(), prefix)
        .await
        .expect("store");

    // The jobs are kept on three servers.
    let js = async_nats::jetstream::new(delta_e2e::nats_client(&nats.url()).await);
    let info = js
        .get_stream("NC_JOBS")
        .await
        .expect("jobs")
        .info()
        .await
        .expect("info")
        .clone();
    assert_eq!(info.config.num_replicas, 3, "R3");

    let mut runs: Vec<RunId> = vec![];
    for i in 0..RUNS {
        let (status, body) = client
            .post(
                "/v1/runs",
                &json!({"agent": "hello", "task": format!("run {i}")}),
            )
            .await
            .expect("submit");
        assert_eq!(status, 202, "{body}");
        runs.push(body["run_id"].as_str().expect("id").parse().expect("uuid"));
    }
    let mut answered = std::collections::HashSet::new();
    // Mid-batch: a third answered, the jobs stream's leader killed.
    let deadline = Instant::now() + Duration::from_secs(60);
    while answered.len() < RUNS / 3 {
        assert!(Instant::now() < deadline, "runs never paused");
        answer_pending(&client, &bot, &mut answered).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let killed = leader(&js, "NC_JOBS").await;
    nats.node(&killed)
        .expect("the leader is a node")
        .process()
        .signal(Signal::SIGKILL);
    // Everything finishes on the two left, every run answered once.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        answer_pending(&client, &bot, &mut answered).await;
        let mut done = 0;
        for id in &runs {
            if let Ok(run) = store.load(*id).await
                && run.record.status == RunStatus::Completed
            {
                done += 1;
            }
        }
        if done == RUNS {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{done} of {RUNS} runs completed after {killed} was killed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for id in &runs {
        let run = store.load(*id).await.expect("load");
        let answers = delta_e2e::answers_of(&run);
        assert_eq!(answers.len(), 1, "run {id}: one answer applied once");
        let steps = run
            .journal
            .iter()
            .filter(|e| matches!(e.event, delta_protocol::Event::ActionResult(_)))
            .count();
        delta_e2e::assert_each_step_once(&run, steps);
    }
    // A new leader took over the jobs.
    let now = leader(&js, "NC_JOBS").await;
    assert_ne!(now, killed, "a new leader");
}

/// The harness's Redis Cluster (3 masters, a replica each, ACL users on every node, replicas
/// logged in to their masters with a user that may only replicate) takes writes across slots
/// from a cluster client logged in as a fleet role; once the replicas caught up, a master is
/// killed and its replica takes over with every write. (What asynchronous replication loses
/// when a master dies before its replica caught up is for the fleet's store on a cluster, with
/// `WAIT`/`WAITAOF`, to come.)
#[tokio::test(flavor = "multi_thread")]
async fn a_redis_cluster_fails_over_to_a_replica_that_caught_up() {
    use redis::AsyncCommands;
    let mut cluster =
        delta_launcher::RedisCluster::start(3, 1, &ServerOptions::default()).expect("cluster");
    let seeds: Vec<String> = cluster
        .url_as(RedisRole::Worker)
        .split(',')
        .map(str::to_owned)
        .collect();
    let client = redis::cluster::ClusterClient::new(seeds.clone()).expect("client");
    let mut c = client.get_async_connection().await.expect("connect");
    for i in 0..200 {
        let _: () = c.set(format!("t:{i}"), i).await.expect("set");
    }
    // The replicas have them (asynchronous replication: wait for it), then a master goes.
    let admin = cluster.url_as(RedisRole::Admin);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut all = true;
        for url in admin.split(',') {
            let node = redis::Client::open(url).expect("url");
            let mut n = node.get_multiplexed_async_connection().await.expect("node");
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut n)
                .await
                .expect("info");
            // A master's replicas report an offset equal to its own when caught up.
            if info.contains("role:master") {
                let own = info
                    .lines()
                    .find_map(|l| l.strip_prefix("master_repl_offset:"))
                    .unwrap_or("0")
                    .trim()
                    .to_owned();
                if !info.contains(&format!("offset={own},")) {
                    all = false;
                }
            }
        }
        if all {
            break;
        }
        assert!(Instant::now() < deadline, "replicas never caught up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let master = {
        let mut found = None;
        for (i, url) in admin.split(',').enumerate() {
            let node = redis::Client::open(url).expect("url");
            let mut n = node.get_multiplexed_async_connection().await.expect("node");
            let role: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut n)
                .await
                .expect("info");
            if role.contains("role:master") {
                found = Some(i);
                break;
            }
        }
        found.expect("a master")
    };
    cluster.nodes()[master].process().signal(Signal::SIGKILL);
    // Its replica takes over; every key is there, read through the cluster client.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut missing;
    loop {
        missing = 0;
        let mut failed = false;
        for i in 0..200 {
            match c.get::<_, Option<i64>>(format!("t:{i}")).await {
                Ok(Some(v)) if v == i => {}
                Ok(_) => missing += 1,
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        if !failed && missing == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after failover: {missing} keys missing, or the cluster never recovered"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A fleet role still may not administer a node (one that is alive).
    let live = (master + 1) % seeds.len();
    let worker = redis::Client::open(seeds[live].as_str()).expect("url");
    let mut n = worker
        .get_multiplexed_async_connection()
        .await
        .expect("a live node");
    let r: Result<String, _> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("*")
        .query_async(&mut n)
        .await;
    assert!(
        r.as_ref()
            .is_err_and(|e| e.to_string().to_uppercase().contains("NOPERM")),
        "a worker ran CONFIG on a cluster node: {r:?}"
    );
}

/// The pages of a listing (`path` with `limit`, then each `next_cursor` passed back) until the
/// last, as the items' `key` field (`run_id`, `request_id`); fails on a page that is not `200`.
async fn all_pages(client: &Client, path: &str, items: &str, key: &str) -> Vec<String> {
    let mut listed = vec![];
    let mut cursor: Option<String> = None;
    let sep = if path.contains('?') { '&' } else { '?' };
    loop {
        let page_path = match &cursor {
            Some(c) => format!("{path}{sep}cursor={c}"),
            None => path.to_owned(),
        };
        let (status, page) = client.get(&page_path).await.expect("list");
        assert_eq!(status, 200, "{page_path}: {page}");
        for item in page[items].as_array().expect("a list") {
            listed.push(item[key].as_str().expect("an id").to_owned());
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return listed,
        }
    }
}

/// Asserts that `listed` holds every one of `expected` once and nothing else.
fn each_once(what: &str, listed: &[String], expected: &[String]) {
    let mut seen = std::collections::HashSet::new();
    for id in listed {
        assert!(seen.insert(id), "{what}: {id} listed twice in {listed:?}");
    }
    let mut a = listed.to_vec();
    let mut b = expected.to_vec();
    a.sort();
    b.sort();
    assert_eq!(a, b, "{what}: every one once");
}

/// Issue 15: the fleet's main scenarios on a 3-node NATS cluster (R3 streams) and a Redis
/// Cluster of 3 masters with a replica each (every run write waiting for a replica), whatever
/// `DELTA_TEST_CLUSTER` says: runs submitted and paused, spread over buckets on every master,
/// listed page by page through the API (each run and each question once); answers over HTTP
/// and as a bot over NATS, each applied once; a run resumed on another worker than the one
/// that paused it; the reconcilers applying an expired deadline (its default, or failing the
/// run) and publishing a resume a gateway lost when it died; a run dead-lettered, then retried
/// once its cause is mended.
#[tokio::test(flavor = "multi_thread")]
async fn the_main_scenarios_hold_on_a_nats_cluster_and_a_redis_cluster() {
    use delta_e2e::fleet::{Fleet, bot_answer, pending};
    use delta_e2e::servers::{NatsServers, RedisServers};
    use delta_protocol::{Event, Via};
    const PAUSED: usize = 12;
    let mut fleet = Fleet::start_on(
        RedisServers::cluster(),
        NatsServers::cluster(),
        None,
        "mc",
        1,
        2,
        |_| {},
    )
    .await;
    assert!(fleet.store.is_cluster());
    let js = async_nats::jetstream::new(fleet.nats_admin().await);
    for stream in ["MC_JOBS", "MC_DLQ", "MC_INTERACTIONS"] {
        let info = js
            .get_stream(stream)
            .await
            .expect("stream")
            .info()
            .await
            .expect("info")
            .clone();
        assert_eq!(info.config.num_replicas, 3, "{stream} is R3");
    }

    // Runs submitted and paused, spread over buckets and over the three masters.
    let mut runs = vec![];
    for i in 0..PAUSED {
        runs.push(fleet.submit("hello", &format!("run {i}")).await);
    }
    let mut rids = vec![];
    for run in &runs {
        rids.push(fleet.pending(*run).await);
    }
    let buckets: std::collections::HashSet<u32> =
        runs.iter().map(|r| fleet.store.bucket(*r)).collect();
    assert!(buckets.len() > 1, "{PAUSED} runs in one bucket");
    let mut masters_with_runs = 0;
    for node in fleet.redis.url().split(',') {
        // Replicas are skipped: only masters count.
        let dump = delta_e2e::redis_dump(node, "mc:*").await;
        if runs.iter().any(|r| dump.contains(&r.to_string())) {
            masters_with_runs += 1;
        }
    }
    assert!(
        masters_with_runs > 1,
        "the runs' keys are on {masters_with_runs} master(s)"
    );

    // Listings across the buckets, a few at a time: each run and each question once, the runs
    // newest first.
    let ids: Vec<String> = runs.iter().map(ToString::to_string).collect();
    let listed = all_pages(&fleet.client, "/v1/runs?limit=5", "runs", "run_id").await;
    let newest_first: Vec<String> = ids.iter().rev().cloned().collect();
    assert_eq!(listed, newest_first, "every run once, newest first");
    let asked = all_pages(
        &fleet.client,
        "/v1/interactions?limit=5",
        "interactions",
        "request_id",
    )
    .await;
    each_once("pending questions", &asked, &rids);

    // The worker that paused the first run goes; another resumes it after the answer.
    let starter = delta_e2e::workers_of(&fleet.store.load(runs[0]).await.expect("load"))[0].clone();
    let gone = fleet
        .workers
        .iter()
        .position(|w| w.name() == starter)
        .expect("a worker of the fleet paused it");
    let mut stopped = fleet.workers.remove(gone);
    workers::stop(&mut stopped);
    fleet.add_worker("w2");

    // Answers: every other one over HTTP, the rest as a bot over NATS, through the clusters.
    let bot = fleet.nats().await;
    for (i, rid) in rids.iter().enumerate() {
        let body = json!({"input": format!("name {i}"), "responder": {"id": format!("p{i}")}});
        if i % 2 == 0 {
            let (status, reply) = fleet.answer(rid, body).await;
            assert_eq!(
                (status, &reply["status"]),
                (200, &json!("accepted")),
                "{reply}"
            );
        } else {
            let reply = bot_answer(&bot, "mc", rid, body.to_string().into_bytes(), None).await;
            assert_eq!(reply, json!({"ok": true, "run_id": ids[i]}));
        }
    }
    for run in &runs {
        fleet.wait_status(*run, RunStatus::Completed).await;
    }
    // A second, different answer is refused on either channel.
    let (status, reply) = fleet.answer(&rids[1], json!({"input": "late"})).await;
    assert_eq!(
        (status, &reply["error"]["code"]),
        (409, &json!("already_resolved"))
    );
    let reply = bot_answer(&bot, "mc", &rids[0], br#"{"input": "late"}"#.to_vec(), None).await;
    assert_eq!(reply["error"]["code"], "already_resolved", "{reply}");
    for (i, run) in runs.iter().enumerate() {
        let stored = fleet.store.load(*run).await.expect("load");
        let answers = delta_e2e::answers_of(&stored);
        assert_eq!(answers.len(), 1, "run {run}: one answer applied once");
        let via = if i % 2 == 0 { Via::Http } else { Via::Nats };
        assert_eq!(
            (answers[0].responder.id.as_str(), answers[0].responder.via),
            (format!("p{i}").as_str(), via)
        );
        assert_eq!(
            stored.record.result.as_deref(),
            Some(format!("Greeted name {i}.").as_str())
        );
        // `hello`: a tool, the question (an action too), a tool.
        delta_e2e::assert_each_step_once(&stored, 3);
        let sessions = delta_e2e::workers_of(&stored);
        assert_eq!(sessions.len(), 2, "run {run}: started and resumed once");
        if i == 0 {
            assert_eq!(sessions[0], starter);
            assert_ne!(sessions[1], starter, "resumed on another worker");
        }
    }

    // Reconcilers: deadlines applied (the default, or the run failed)...
    let with_default = fleet.submit("timed", "wait").await;
    let without = fleet.submit("timed_nodefault", "wait").await;
    let timed_rids = [
        fleet.pending(with_default).await,
        fleet.pending(without).await,
    ];
    fleet.wait_status(with_default, RunStatus::Completed).await;
    fleet.wait_status(without, RunStatus::Failed).await;
    let done = fleet.store.load(with_default).await.expect("load");
    assert_eq!(done.record.result.as_deref(), Some("done: later"));
    let h = delta_e2e::answers_of(&done);
    assert_eq!(h.len(), 1, "the deadline applied once");
    assert_eq!(
        (h[0].responder.id.as_str(), h[0].option_id.as_deref()),
        ("timeout", Some("later"))
    );
    let failed = fleet.store.load(without).await.expect("load");
    assert!(
        failed
            .record
            .error
            .as_deref()
            .is_some_and(|e| e.contains("expired")),
        "{:?}",
        failed.record.error
    );
    // ... and a resume that a gateway stored the answer for, then died before publishing.
    let doomed = fleet.add_gateway(Some("answer:before-publish")).await;
    let lost = fleet.submit("hello", "lost resume").await;
    let lost_rid = pending(&doomed, lost).await;
    let reply = doomed
        .post(
            &format!("/v1/interactions/{lost_rid}/response"),
            &json!({"input": "Grace"}),
        )
        .await;
    assert!(reply.is_err(), "the gateway died answering: {reply:?}");
    assert_eq!(
        fleet.gateways[1].wait_exit(Duration::from_secs(10)),
        Some(86)
    );
    let ix = fleet
        .store
        .interaction(lost, lost_rid.parse().expect("rid"))
        .await
        .expect("read")
        .expect("exists");
    assert_eq!(ix.resume_seq, None, "no resume was published");
    fleet.wait_status(lost, RunStatus::Completed).await;
    let stored = fleet.store.load(lost).await.expect("load");
    assert_eq!(stored.record.result.as_deref(), Some("Greeted Grace."));
    assert_eq!(delta_e2e::answers_of(&stored).len(), 1);

    // A run dead-lettered (its agent's config is broken), retried once it is mended.
    fleet.add_agent(
        "fragile",
        "name: fragile\nbrain: [unclosed\n",
        "steps: []\n",
    );
    let fragile = fleet.submit("fragile", "break").await;
    fleet.wait_status(fragile, RunStatus::Failed).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let letter = loop {
        let (_, page) = fleet.client.get("/v1/dlq").await.expect("dlq");
        let found = page["dead_letters"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|l| l["run_id"] == json!(fragile.to_string()))
            .cloned();
        if let Some(l) = found {
            break l;
        }
        assert!(Instant::now() < deadline, "never dead-lettered: {page}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        (&letter["retryable"], &letter["run_status"]),
        (&json!(true), &json!("FAILED")),
        "{letter}"
    );
    fleet.add_agent(
        "fragile",
        "name: fragile\nbrain: scripted\n",
        "steps:\n  - finish: \"mended\"\n",
    );
    let seq = letter["seq"].as_u64().expect("seq");
    let (status, retried) = fleet
        .client
        .post(&format!("/v1/dlq/{seq}/retry"), &json!({}))
        .await
        .expect("retry");
    assert_eq!(status, 200, "{retried}");
    assert_eq!(
        (&retried["status"], &retried["run_id"]),
        (&json!("requeued"), &json!(fragile.to_string()))
    );
    fleet.wait_status(fragile, RunStatus::Completed).await;
    let stored = fleet.store.load(fragile).await.expect("load");
    assert_eq!(stored.record.result.as_deref(), Some("mended"));
    assert!(
        stored
            .journal
            .iter()
            .any(|e| matches!(&e.event, Event::SystemMessage(m)
            if m.content.starts_with("retried from the dead-letter queue"))),
        "the retry is journaled"
    );
    let (_, page) = fleet.client.get("/v1/dlq").await.expect("dlq");
    assert!(
        !page.to_string().contains(&fragile.to_string()),
        "the letter is gone: {page}"
    );

    // In the end, through the API: every run once in its status's listing, every question once.
    let mut completed = ids.clone();
    completed.extend([with_default, lost, fragile].map(|r| r.to_string()));
    let listed = all_pages(
        &fleet.client,
        "/v1/runs?status=COMPLETED&limit=4",
        "runs",
        "run_id",
    )
    .await;
    each_once("completed runs", &listed, &completed);
    let listed = all_pages(&fleet.client, "/v1/runs?status=FAILED", "runs", "run_id").await;
    assert_eq!(listed, [without.to_string()]);
    let mut questions = rids.clone();
    questions.extend(timed_rids);
    questions.push(lost_rid);
    let listed = all_pages(
        &fleet.client,
        "/v1/interactions?state=all&limit=4",
        "interactions",
        "request_id",
    )
    .await;
    each_once("questions", &listed, &questions);
    let pending_now = all_pages(
        &fleet.client,
        "/v1/interactions",
        "interactions",
        "request_id",
    )
    .await;
    assert!(pending_now.is_empty(), "{pending_now:?}");
}
