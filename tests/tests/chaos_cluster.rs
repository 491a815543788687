//! The chaos suite's cluster faults (issue 15, item 5): a fleet (a gateway and two workers) on
//! three NATS servers (streams R3) and a Redis Cluster of three masters with a replica each,
//! under load, loses a server mid-batch:
//!
//! - 7: the NATS jobs stream's leader is killed (`kill -9`), then restarted;
//! - 8: a Redis master that holds runs is killed (`kill -9`): its replica takes over, then the
//!   killed node is started again (as Kubernetes restarts a pod) and rejoins as a replica;
//! - 9: a Redis master is frozen (SIGSTOP) past the cluster node timeout, so that its replica is
//!   promoted, then thawed (SIGCONT): it comes back as a replica.
//!
//! Runs arrive over HTTP at a steady pace all along; each runs two counted `step` tools, asks a
//! question, runs a third step. A person answers the questions as they appear, about half over
//! HTTP and half as a bot over NATS. At the end the suite's checker reads every journal
//! (`delta_e2e::chaos`): no run lost, no step executed past its checkpoint, no answer lost or
//! applied twice. How long the fleet took to recover is measured and reported, not asserted.
//!
//! ```sh
//! cargo test -p delta-e2e --test chaos_cluster -- --nocapture
//! DELTA_CHAOS_LONG=1 cargo test -p delta-e2e --test chaos_cluster -- --nocapture --test-threads 1
//! ```
//!
//! Each scenario has its own servers, ports, directories and key prefix. The processes' logs are
//! kept in `<target dir>/chaos-cluster/<prefix>/` (overwritten by the next run).

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use delta_e2e::chaos::{self, Effects, Expect, Human, Scenario, Tally, size, step_agent};
use delta_e2e::gateways::{self, Client, GatewayProcess};
use delta_e2e::workers::{self, WorkerProcess};
use delta_e2e::{NatsRole, RedisRole, Signal};
use delta_launcher::servers::ServerOptions;
use delta_launcher::{NatsCluster, Output, RedisCluster};
use delta_protocol::{Event, RunId, RunStatus, Timestamp};
use delta_store::redis::{Options, RedisRunStore};
use serde_json::json;

// -- the fleet ------------------------------------------------------------------------------

/// A fleet on a NATS cluster and a Redis Cluster. Field order is drop order: the programs stop
/// before the servers they use.
struct ClusterFleet {
    _gateway: GatewayProcess,
    _workers: Vec<WorkerProcess>,
    /// A client of the gateway.
    client: Client,
    /// A bot's NATS client, logged in on every node.
    bot: async_nats::Client,
    /// The store as the admin, on the whole cluster: what the checker reads.
    store: RedisRunStore,
    /// JetStream as the admin: to find the jobs stream's leader.
    js: async_nats::jetstream::Context,
    prefix: &'static str,
    work: tempfile::TempDir,
    _agents: tempfile::TempDir,
    /// Each Redis node's URL as the admin, in the order of `redis.nodes()`.
    redis_admin: Vec<String>,
    /// Each Redis node's port, in the same order.
    redis_ports: Vec<u16>,
    /// The Redis Cluster slot of each bucket of runs.
    bucket_slots: Vec<u16>,
    nats: NatsCluster,
    redis: RedisCluster,
}

/// The settings a fleet on the clusters needs, for the gateway and the workers alike.
const CLUSTER_ENV: [(&str, &str); 2] =
    [("DELTA_STREAM_REPLICAS", "3"), ("DELTA_REDIS_CLUSTER", "1")];

/// `<target dir>/chaos-cluster/<prefix>`, emptied.
fn logs_dir(prefix: &str) -> PathBuf {
    let dir = chaos::summary_path()
        .parent()
        .map(|p| p.join("chaos-cluster").join(prefix))
        .unwrap_or_else(|| std::env::temp_dir().join(format!("chaos-cluster-{prefix}")));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("logs dir");
    dir
}

fn logged(dir: &std::path::Path, name: &str) -> Output {
    Output {
        log: Some(dir.join(format!("{name}.log"))),
        ..Default::default()
    }
}

impl ClusterFleet {
    async fn start(prefix: &'static str) -> Self {
        let logs = logs_dir(prefix);
        let (nats, redis) = tokio::task::block_in_place(|| {
            let nats = NatsCluster::start(
                3,
                &ServerOptions {
                    output: logged(&logs, "nats"),
                    ..ServerOptions::default()
                },
            )
            .expect("a 3-node NATS cluster");
            let redis = RedisCluster::start(
                3,
                1,
                &ServerOptions {
                    output: logged(&logs, "redis"),
                    ..ServerOptions::default()
                },
            )
            .expect("a Redis Cluster of 3 masters with a replica each");
            (nats, redis)
        });
        let mut redis = redis;
        let agents = tempfile::tempdir().expect("agents");
        let (config, script) = step_agent("chaos", &["0.1", "0.1", "0.1"], Some(2));
        let dir = agents.path().join("chaos");
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("config.yaml"), config).expect("config");
        std::fs::write(dir.join("script.yaml"), script).expect("script");
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
                agents.path().to_path_buf(),
                delta_e2e::free_port().expect("port"),
            )
        };
        spec.extra
            .extend(CLUSTER_ENV.iter().map(|(k, v)| (*k, (*v).to_owned())));
        let gateway = gateways::spawn_with(&spec, &logged(&logs, "gateway")).await;
        let mut worker_spec = workers::Spec {
            concurrency: 8,
            ack_wait_ms: 5000,
            max_deliver: 5,
            grace_ms: 2000,
            ..workers::Spec::joining(&spec, work.path().to_path_buf())
        };
        worker_spec
            .extra
            .extend(CLUSTER_ENV.iter().map(|(k, v)| (*k, (*v).to_owned())));
        let workers = ["w0", "w1"]
            .iter()
            .map(|id| workers::spawn_with(&worker_spec, id, &logged(&logs, id)))
            .collect();
        let client = Client::new(&gateway.url, None);
        let bot = delta_e2e::nats_client(&nats.url_as(NatsRole::Bot)).await;
        let admin = redis.url_as(RedisRole::Admin);
        let store = RedisRunStore::connect_options(
            &admin,
            prefix,
            &Options {
                cluster: true,
                ..Options::default()
            },
        )
        .await
        .expect("the store on the cluster");
        let js = async_nats::jetstream::new(delta_e2e::nats_client(&nats.url()).await);
        let redis_admin: Vec<String> = admin.split(',').map(str::to_owned).collect();
        let redis_ports = redis.nodes().iter().map(|n| n.port).collect();
        let mut bucket_slots = vec![];
        let mut any = node_conn(&redis_admin[0]).await.expect("a Redis node");
        for k in 0..store.buckets() {
            let slot: u16 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(store.tag(k))
                .query_async(&mut any)
                .await
                .expect("CLUSTER KEYSLOT");
            bucket_slots.push(slot);
        }
        ClusterFleet {
            _gateway: gateway,
            _workers: workers,
            client,
            bot,
            store,
            js,
            prefix,
            work,
            _agents: agents,
            redis_admin,
            redis_ports,
            bucket_slots,
            nats,
            redis,
        }
    }

    /// The Redis Cluster slot `run` lives in.
    fn slot_of(&self, run: RunId) -> u16 {
        self.bucket_slots[self.store.bucket(run) as usize]
    }

    /// The cluster as a node other than `not` (an index of `redis.nodes()`) sees it.
    async fn cluster_view(&self, not: Option<usize>) -> Option<Vec<NodeView>> {
        for (i, url) in self.redis_admin.iter().enumerate() {
            if Some(i) == not {
                continue;
            }
            if let Some(view) = cluster_nodes(url).await {
                return Some(view);
            }
        }
        None
    }

    /// The index in `redis.nodes()` of the node on `port`.
    fn node_index(&self, port: u16) -> usize {
        self.redis_ports
            .iter()
            .position(|p| *p == port)
            .expect("a node of the cluster")
    }
}

// -- Redis Cluster views ---------------------------------------------------------------------

/// One node of a Redis Cluster as `CLUSTER NODES` shows it.
#[derive(Clone, Debug)]
struct NodeView {
    id: String,
    port: u16,
    master: bool,
    /// Flagged `fail` (the cluster agreed it is down) or `fail?` (this node suspects it).
    failing: bool,
    /// A replica's master's id.
    replica_of: Option<String>,
    /// The slot ranges it serves, inclusive.
    slots: Vec<(u16, u16)>,
}

impl NodeView {
    fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot))
    }
}

/// A connection to one node as the admin, its replies within a second.
async fn node_conn(url: &str) -> Option<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(url).ok()?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(1)))
        .set_response_timeout(Some(Duration::from_secs(1)));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .ok()
}

/// `CLUSTER NODES` of the node at `url`, parsed; `None` when it does not answer.
async fn cluster_nodes(url: &str) -> Option<Vec<NodeView>> {
    let mut c = node_conn(url).await?;
    let text: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut c)
        .await
        .ok()?;
    let mut nodes = vec![];
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 {
            continue;
        }
        let port = f[1]
            .split('@')
            .next()
            .and_then(|a| a.rsplit(':').next())
            .and_then(|p| p.parse().ok())?;
        let flags: Vec<&str> = f[2].split(',').collect();
        let slots = f[8..]
            .iter()
            .filter(|s| !s.starts_with('['))
            .filter_map(|s| match s.split_once('-') {
                Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                None => s.parse().ok().map(|a| (a, a)),
            })
            .collect();
        nodes.push(NodeView {
            id: f[0].to_owned(),
            port,
            master: flags.contains(&"master"),
            failing: flags.iter().any(|x| *x == "fail" || *x == "fail?"),
            replica_of: (f[3] != "-").then(|| f[3].to_owned()),
            slots,
        });
    }
    Some(nodes)
}

// -- the load ------------------------------------------------------------------------------

/// A run the gateway acknowledged, and when it was first tried.
#[derive(Clone, Copy, Debug)]
struct Submitted {
    id: RunId,
    at: Timestamp,
}

/// Runs submitted over HTTP at a steady pace, each on its own task so that one refused while a
/// server is away does not hold up the next: tried again with the same `Idempotency-Key` until
/// it is acknowledged (`202`), for up to two minutes.
struct Load {
    task: tokio::task::JoinHandle<Vec<Option<Submitted>>>,
    /// Acknowledged so far, as they come.
    acked: Arc<Mutex<Vec<Submitted>>>,
    /// Tries refused (`503` while a server was away) or unanswered, then tried again.
    refused: Arc<AtomicUsize>,
}

impl Load {
    fn start(client: &Client, prefix: &str, runs: usize, every: Duration) -> Self {
        let acked: Arc<Mutex<Vec<Submitted>>> = Arc::default();
        let refused = Arc::new(AtomicUsize::new(0));
        let task = {
            let (client, prefix) = (client.clone(), prefix.to_owned());
            let (acked, refused) = (acked.clone(), refused.clone());
            tokio::spawn(async move {
                let mut tasks = vec![];
                for i in 0..runs {
                    let (client, acked, refused) = (client.clone(), acked.clone(), refused.clone());
                    let key = format!("{prefix}-{i}");
                    tasks.push(tokio::spawn(async move {
                        let at = Timestamp::now();
                        let body = json!({"agent": "chaos", "task": format!("t{i}")}).to_string();
                        let deadline = Instant::now() + Duration::from_secs(120);
                        loop {
                            let reply = client
                                .post_raw(
                                    "/v1/runs",
                                    body.clone().into_bytes(),
                                    &[("Idempotency-Key", key.as_str())],
                                )
                                .await;
                            if let Ok((202, b)) = &reply
                                && let Some(id) =
                                    b["run_id"].as_str().and_then(|s| s.parse::<RunId>().ok())
                            {
                                let s = Submitted { id, at };
                                acked.lock().unwrap_or_else(|p| p.into_inner()).push(s);
                                return Some(s);
                            }
                            refused.fetch_add(1, Ordering::Relaxed);
                            if Instant::now() > deadline {
                                return None;
                            }
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }));
                    tokio::time::sleep(every).await;
                }
                let mut out = vec![];
                for t in tasks {
                    out.push(t.await.ok().flatten());
                }
                out
            })
        };
        Load {
            task,
            acked,
            refused,
        }
    }

    fn acked(&self) -> Vec<Submitted> {
        self.acked.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

// -- faults --------------------------------------------------------------------------------

/// Which part of the clusters a scenario takes away.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    /// `kill -9` the jobs stream's leader, then restart it.
    JobsLeader,
    /// `kill -9` a Redis master, wait for its replica to take over, restart it.
    KillMaster,
    /// SIGSTOP a Redis master until its replica took over, then SIGCONT.
    StopMaster,
}

/// One fault done to the fleet.
struct Done {
    /// When it was done.
    at: Timestamp,
    /// The slots the failed Redis master served (`None`: every run depended on it).
    slots: Option<Vec<(u16, u16)>>,
    /// From the fault until the cluster had taken over (new leader elected, replica promoted),
    /// as the test saw it.
    took_over: Duration,
    /// From the fault until the failed server was back in the cluster (a replica again, or a
    /// NATS node again).
    back: Duration,
    /// What was done, for the notes.
    what: String,
}

impl Done {
    fn affects(&self, fleet: &ClusterFleet, run: RunId) -> bool {
        match &self.slots {
            None => true,
            Some(ranges) => {
                let slot = fleet.slot_of(run);
                ranges.iter().any(|(a, b)| (*a..=*b).contains(&slot))
            }
        }
    }
}

/// The name JetStream gives the leader of `stream` (a node's `server_name`), once it has one
/// that is not `not`.
async fn leader(js: &async_nats::jetstream::Context, stream: &str, not: Option<&str>) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let info = tokio::time::timeout(Duration::from_secs(2), async {
            let mut s = js.get_stream(stream).await.ok()?;
            let info = s.info().await.ok()?;
            info.cluster.as_ref().and_then(|c| c.leader.clone())
        })
        .await;
        if let Ok(Some(l)) = info
            && Some(l.as_str()) != not
        {
            return l;
        }
        assert!(Instant::now() < deadline, "{stream} has no leader");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Kills the jobs stream's leader, waits for another one, restarts the killed node.
async fn kill_jobs_leader(fleet: &mut ClusterFleet) -> Done {
    let stream = delta_queue::Names::new(fleet.prefix).jobs_stream();
    let killed = leader(&fleet.js, &stream, None).await;
    // Asked of the nodes left (a client of the killed one would first have to notice).
    let names = fleet.nats.names();
    let left: Vec<String> = fleet
        .nats
        .url()
        .split(',')
        .zip(&names)
        .filter(|(_, name)| **name != killed)
        .map(|(url, _)| url.to_owned())
        .collect();
    let js = async_nats::jetstream::new(delta_e2e::nats_client(&left.join(",")).await);
    let at = Timestamp::now();
    let t0 = Instant::now();
    fleet
        .nats
        .node(&killed)
        .expect("the leader is a node")
        .process()
        .signal(Signal::SIGKILL);
    let now = leader(&js, &stream, Some(&killed)).await;
    let took_over = t0.elapsed();
    let node = fleet.nats.node(&killed).expect("the node");
    tokio::task::block_in_place(|| node.restart()).expect("restart the killed node");
    tokio::task::block_in_place(|| fleet.nats.wait_healthy(Duration::from_secs(60)))
        .expect("the NATS cluster healthy again");
    Done {
        at,
        slots: None,
        took_over,
        back: t0.elapsed(),
        what: format!("kill -9 {killed} (leader of {stream}), new leader {now}, restarted"),
    }
}

/// The Redis master serving the most runs of `runs` that are not over yet, and its replica.
async fn busiest_master(fleet: &ClusterFleet, runs: &[Submitted]) -> (NodeView, NodeView) {
    let view = fleet.cluster_view(None).await.expect("a cluster view");
    let ids: Vec<RunId> = runs.iter().map(|s| s.id).collect();
    // Riding out a store that is still recovering from the previous fault.
    let deadline = Instant::now() + Duration::from_secs(60);
    let statuses = loop {
        match fleet.store.statuses(&ids).await {
            Ok(s) => break s,
            Err(e) => assert!(Instant::now() < deadline, "statuses: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let open: Vec<u16> = ids
        .iter()
        .zip(statuses)
        .filter(|(_, s)| !s.is_some_and(|s| s.is_terminal()))
        .map(|(id, _)| fleet.slot_of(*id))
        .collect();
    let master = view
        .iter()
        .filter(|n| n.master && !n.failing && !n.slots.is_empty())
        .max_by_key(|n| open.iter().filter(|s| n.serves(**s)).count())
        .expect("a master")
        .clone();
    let replica = view
        .iter()
        .find(|n| n.replica_of.as_deref() == Some(master.id.as_str()))
        .expect("the master has a replica")
        .clone();
    (master, replica)
}

/// Waits until a node other than `victim` (an index) sees `replica` (an id) as a master.
async fn promoted(fleet: &ClusterFleet, victim: usize, replica: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(view) = fleet.cluster_view(Some(victim)).await
            && view.iter().any(|n| n.id == replica && n.master)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the replica {replica} was never promoted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the node `victim` (an index) is a replica again with its link up, and the
/// cluster is `ok` everywhere.
async fn rejoined(fleet: &ClusterFleet, victim: usize, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let replica = match fleet.cluster_view(None).await {
            Some(view) => view
                .iter()
                .any(|n| n.id == id && !n.master && !n.failing && n.replica_of.is_some()),
            None => false,
        };
        if replica
            && tokio::task::block_in_place(|| fleet.redis.wait_ok(Duration::from_millis(200)))
                .is_ok()
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {} never came back as a replica",
            fleet.redis_ports[victim]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Takes a Redis master away (killed or frozen), waits for its replica to take over, and
/// brings it back (restarted or thawed) as a replica.
async fn fail_master(fleet: &mut ClusterFleet, runs: &[Submitted], how: Fault) -> Done {
    let (master, replica) = busiest_master(fleet, runs).await;
    let v = fleet.node_index(master.port);
    let at = Timestamp::now();
    let t0 = Instant::now();
    let signal = if how == Fault::KillMaster {
        Signal::SIGKILL
    } else {
        Signal::SIGSTOP
    };
    fleet.redis.nodes()[v].process().signal(signal);
    promoted(fleet, v, &replica.id).await;
    let took_over = t0.elapsed();
    if how == Fault::KillMaster {
        let node = &mut fleet.redis.nodes()[v];
        tokio::task::block_in_place(|| node.restart()).expect("restart the killed master");
    } else {
        fleet.redis.nodes()[v].process().signal(Signal::SIGCONT);
    }
    rejoined(fleet, v, &master.id).await;
    let what = match how {
        Fault::KillMaster => "kill -9",
        _ => "SIGSTOP",
    };
    let slots: usize = master
        .slots
        .iter()
        .map(|(a, b)| usize::from(b - a) + 1)
        .sum();
    Done {
        at,
        slots: Some(master.slots.clone()),
        took_over,
        back: t0.elapsed(),
        what: format!(
            "{what} master :{} ({slots} slots, {} of the fleet's buckets)",
            master.port,
            fleet
                .bucket_slots
                .iter()
                .filter(|s| master.serves(**s))
                .count()
        ),
    }
}

// -- recovery, from the journals -------------------------------------------------------------

/// How the fleet came back after one fault, read from the journals afterwards.
#[derive(Debug)]
struct Recovery {
    /// From the fault to the end of the first run it affected whose question was answered after
    /// the fault: the fleet completes runs that need the failed part again.
    first: Option<f64>,
    /// From the fault until every run submitted before it was over.
    drained: Option<f64>,
}

fn secs(from: Timestamp, to: Timestamp) -> f64 {
    (to.micros() - from.micros()) as f64 / 1e6
}

async fn recovery(fleet: &ClusterFleet, runs: &[Submitted], fault: &Done) -> Recovery {
    let mut first: Option<f64> = None;
    let mut drained: Option<f64> = None;
    for s in runs {
        let Ok(run) = chaos::load(&fleet.store, s.id).await else {
            continue;
        };
        let Some(end) = run.journal.last().filter(
            |e| matches!(&e.event, Event::EngineEnd(x) if x.status == RunStatus::Completed),
        ) else {
            continue;
        };
        let end = end.timestamp;
        if s.at.micros() < fault.at.micros() {
            let d = secs(fault.at, end).max(0.0);
            drained = Some(drained.map_or(d, |x: f64| x.max(d)));
        }
        if !fault.affects(fleet, s.id) {
            continue;
        }
        for e in &run.journal {
            let Event::HumanInputRequest(q) = &e.event else {
                continue;
            };
            let answered = fleet
                .store
                .interaction(s.id, q.request_id)
                .await
                .ok()
                .flatten()
                .and_then(|ix| ix.answered_at);
            if answered.is_some_and(|a| a.micros() > fault.at.micros()) {
                let d = secs(fault.at, end);
                first = Some(first.map_or(d, |x: f64| x.min(d)));
            }
        }
    }
    Recovery { first, drained }
}

fn fmt_s(x: Option<f64>) -> String {
    x.map_or_else(|| "-".to_owned(), |s| format!("{s:.1} s"))
}

// -- the scenarios -----------------------------------------------------------------------------

/// Runs one scenario: the fleet under load, `faults` faults of kind `fault` spread over the
/// batch, then every run checked.
async fn scenario(order: usize, name: &str, prefix: &'static str, fault: Fault) {
    let scenario = Scenario::begin(order, name);
    let runs = size(45, 400);
    let faults = size(1, 4);
    let every = Duration::from_millis(size(200, 120) as u64);
    let mut fleet = ClusterFleet::start(prefix).await;
    let human = Human::start_with_bot(
        fleet.client.clone(),
        fleet.bot.clone(),
        prefix,
        chaos::plain_answer,
    );
    let load = Load::start(&fleet.client, prefix, runs, every);
    let mut done = vec![];
    for k in 1..=faults {
        // Mid-batch, with answers flowing: runs at every stage when the fault comes.
        let due = k * runs / (faults + 1);
        let stats = human.stats.clone();
        chaos::wait_until(
            "runs to be submitted and answered",
            Duration::from_secs(300),
            || {
                let ready =
                    load.acked().len() >= due && stats.accepted.load(Ordering::Relaxed) >= due / 3;
                std::future::ready(ready)
            },
        )
        .await;
        let acked = load.acked();
        done.push(match fault {
            Fault::JobsLeader => kill_jobs_leader(&mut fleet).await,
            _ => fail_master(&mut fleet, &acked, fault).await,
        });
    }
    let submitted = load.task.await.expect("the load");
    let ids: Vec<RunId> = submitted.iter().flatten().map(|s| s.id).collect();
    let finished = chaos::wait_terminal(
        &fleet.store,
        &ids,
        Duration::from_secs(if chaos::long() { 900 } else { 180 }),
    )
    .await;
    let stats = human.stop().await;
    let mut tally: Tally = chaos::check_runs(
        &fleet.store,
        &ids,
        &Expect {
            status: RunStatus::Completed,
            questions: Some(1),
            counted_tool: Some("step"),
        },
        &Effects::read(fleet.work.path()),
    )
    .await;
    tally.runs = runs;
    let never = submitted.iter().filter(|s| s.is_none()).count();
    if never > 0 {
        tally.lost += never;
        tally.problem(format!("{never} submissions were never acknowledged"));
    }
    let answered = stats
        .answered
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let answers_lost = chaos::check_answers(&fleet.store, &answered, &mut tally).await;
    // A question read before it was durable (the pending listing reads a master before its
    // replica has the question) can vanish at a failover and be asked again under a new id:
    // answering the vanished one is `404`. Any other refusal is a fault of the fleet.
    let refusals = stats
        .refusals
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let vanished = refusals
        .iter()
        .filter(|r| r.starts_with("404 ") || r.starts_with("not_found "))
        .count();
    for r in refusals
        .iter()
        .filter(|r| !(r.starts_with("404 ") || r.starts_with("not_found ")))
    {
        tally.problem(format!("an answer was refused: {r}"));
    }
    let all: Vec<Submitted> = submitted.iter().flatten().copied().collect();
    let mut timings = vec![];
    for d in &done {
        let r = recovery(&fleet, &all, d).await;
        timings.push(format!(
            "{}: taken over {:.1} s, back {:.1} s, recovered {} (runs done again), in-flight runs done {}",
            d.what,
            d.took_over.as_secs_f64(),
            d.back.as_secs_f64(),
            fmt_s(r.first),
            fmt_s(r.drained)
        ));
    }
    let figures = format!(
        "runs lost {}, steps twice {}, answers lost {answers_lost}, answers twice {}",
        tally.lost, tally.steps_twice, tally.answers_twice
    );
    let notes = format!(
        "{figures}; {}; {finished}/{} runs done; {} unfinished steps re-ran (journaled); {} answers ({} over NATS), {vanished} to questions that vanished; {} submissions and {} answers tried again",
        timings.join("; "),
        ids.len(),
        tally.reruns,
        stats.accepted.load(Ordering::Relaxed),
        stats.over_nats.load(Ordering::Relaxed),
        load.refused.load(Ordering::Relaxed),
        stats.retried.load(Ordering::Relaxed),
    );
    eprintln!("{name}: {notes}");
    let refused = load.refused.load(Ordering::Relaxed) + vanished;
    scenario.report(&tally, refused, &notes);
    assert_eq!(
        (
            tally.lost,
            tally.steps_twice,
            answers_lost,
            tally.answers_twice
        ),
        (0, 0, 0, 0),
        "runs lost, steps run twice, answers lost, answers applied twice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s7_kill_9_the_nats_jobs_leader_mid_batch() {
    scenario(
        7,
        "7 kill -9 the NATS jobs leader",
        "ccn",
        Fault::JobsLeader,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s8_kill_9_a_redis_master_then_restart_it() {
    scenario(
        8,
        "8 kill -9 a Redis master, restart",
        "cck",
        Fault::KillMaster,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s9_sigstop_a_redis_master_past_the_node_timeout() {
    scenario(
        9,
        "9 SIGSTOP a Redis master, SIGCONT",
        "ccs",
        Fault::StopMaster,
    )
    .await;
}
