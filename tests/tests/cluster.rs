//! Issue 15, the NATS side: the fleet on a 3-node NATS cluster (routes on loopback, JetStream,
//! R3 streams), given every node's URL, rides through the loss of a server with nothing lost.

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

/// Answers every pending question of the prefix's runs once (HTTP): how many it answered.
async fn answer_pending(client: &Client, answered: &mut std::collections::HashSet<String>) {
    let Ok(page) = client.interactions("state=pending&limit=100").await else {
        return;
    };
    for ix in page.interactions {
        let rid = ix.request_id.to_string();
        if answered.contains(&rid) {
            continue;
        }
        if let Ok((200, _)) = client
            .post(
                &format!("/v1/interactions/{rid}/response"),
                &json!({"input": "Ada"}),
            )
            .await
        {
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
        answer_pending(&client, &mut answered).await;
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
        answer_pending(&client, &mut answered).await;
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
