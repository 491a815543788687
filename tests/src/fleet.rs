//! A whole fleet for end-to-end tests, a thin convenience on the launcher: `redis-server` and
//! `nats-server` on free ports (or, with `DELTA_TEST_CLUSTER=1`, a NATS cluster and a Redis
//! Cluster: [`crate::servers`]), `delta-gateway` and `delta-worker` processes (see
//! [`crate::gateways`], [`crate::workers`]) under one key prefix, a temporary agents directory,
//! and the calls tests make most (submit, wait for the question, answer, wait for a status).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use delta_protocol::RunId;
use delta_protocol::RunStatus;
use delta_store::redis::RedisRunStore;
use serde_json::{Value, json};

use crate::gateways::{self, Client, GatewayProcess};
use crate::servers::{NatsServers, RedisServers};
use crate::workers::{self, WorkerProcess};

/// Agents for fleet tests: the examples `hello`, `chooser` and `intake` (a typed answer), plus `timed` (a choice with a
/// 2 s deadline and a default), `timed_nodefault`, `guarded` (only `alice` may answer), `secret`
/// (a sensitive question) and `gated` (a tool that always needs approval).
pub fn agents_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tmp");
    let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/agents");
    for name in ["hello", "chooser", "intake"] {
        let to = dir.path().join(name);
        std::fs::create_dir_all(&to).expect("mkdir");
        for f in ["config.yaml", "script.yaml"] {
            std::fs::copy(examples.join(name).join(f), to.join(f)).expect("copy");
        }
    }
    let agent = |name: &str, ask: &str| {
        let to = dir.path().join(name);
        std::fs::create_dir_all(&to).expect("mkdir");
        std::fs::write(
            to.join("config.yaml"),
            format!(
                "name: {name}\nbrain: scripted\ntools:\n  - name: echo\n    exec: \"echo ${{text}}\"\n    idempotent: true\n"
            ),
        )
        .expect("config");
        std::fs::write(
            to.join("script.yaml"),
            format!(
                "steps:\n  - ask_human:\n{ask}\n  - tool: echo\n    args: {{text: \"got ${{answer}}\"}}\n  - finish: \"done: ${{answer}}\"\n"
            ),
        )
        .expect("script");
    };
    agent(
        "timed",
        "      prompt: \"Go?\"\n      timeout_seconds: 2\n      default_option_id: later\n      options:\n        - {id: now, label: Now}\n        - {id: later, label: Later}",
    );
    agent(
        "timed_nodefault",
        "      prompt: \"Name?\"\n      timeout_seconds: 2",
    );
    agent(
        "guarded",
        "      prompt: \"Approve the budget?\"\n      allowed_responders: [alice]",
    );
    agent(
        "secret",
        "      prompt: \"API key?\"\n      sensitive: true",
    );
    let gated = dir.path().join("gated");
    std::fs::create_dir_all(&gated).expect("mkdir");
    std::fs::write(
        gated.join("config.yaml"),
        "name: gated\nbrain: scripted\ntools:\n  - name: shout\n    exec: \"echo ${text}\"\n    approval: always\n",
    )
    .expect("config");
    std::fs::write(
        gated.join("script.yaml"),
        "steps:\n  - tool: shout\n    args: {text: \"hello\"}\n  - finish: \"shouted\"\n",
    )
    .expect("script");
    dir
}

/// Real servers and gateway and worker processes under one key prefix, all stopped on drop.
pub struct Fleet {
    // Field order is drop order: processes before the servers they use.
    pub gateways: Vec<GatewayProcess>,
    pub workers: Vec<WorkerProcess>,
    /// A client of the first gateway (no token).
    pub client: Client,
    pub store: RedisRunStore,
    pub worker_spec: workers::Spec,
    pub gateway_spec: gateways::Spec,
    /// Where gateways and workers started from now on report (log files, filter, spans), if
    /// anywhere: see [`FleetLogs`].
    pub logs: Option<FleetLogs>,
    /// What every gateway and worker of this fleet is started with on top of its spec, so that
    /// a test replacing a spec's `extra` keeps it: the clusters' settings
    /// ([`crate::servers::cluster_settings`]).
    servers_env: Vec<(&'static str, String)>,
    _work: tempfile::TempDir,
    _agents: tempfile::TempDir,
    /// One server or a cluster each ([`crate::servers`]); they deref to the one server.
    pub nats: NatsServers,
    pub redis: RedisServers,
}

/// Log files (and optionally span files) for a fleet's processes: `<dir>/<name>.log` and
/// `<dir>/<name>.spans`, where the name is the worker's id or `gateway-<port>`.
#[derive(Clone, Debug)]
pub struct FleetLogs {
    pub dir: PathBuf,
    /// `DELTA_LOG` of the processes (`info` when `None`).
    pub filter: Option<String>,
    /// Whether the processes write their spans too.
    pub spans: bool,
}

impl FleetLogs {
    /// The log of the process named `name`.
    pub fn log(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.log"))
    }

    fn output(&self, name: &str) -> delta_launcher::Output {
        delta_launcher::Output {
            log: Some(self.log(name)),
            filter: self.filter.clone(),
            spans: self.spans.then(|| self.dir.join(format!("{name}.spans"))),
            ..Default::default()
        }
    }
}

impl Fleet {
    /// Servers, `gateways` gateways and `workers` workers, all processes. The servers are one
    /// of each, or clusters under `DELTA_TEST_CLUSTER=1` ([`crate::servers::on_clusters`]).
    pub async fn start(prefix: &str, gateways: usize, workers: usize) -> Fleet {
        Self::start_with(prefix, gateways, workers, |_| {}).await
    }

    /// As [`Fleet::start`], with the gateway spec changed by `tweak` first (tokens, key…).
    pub async fn start_with(
        prefix: &str,
        n_gateways: usize,
        n_workers: usize,
        tweak: impl Fn(&mut gateways::Spec),
    ) -> Fleet {
        let redis = RedisServers::start();
        let nats = NatsServers::start();
        Self::start_on(redis, nats, None, prefix, n_gateways, n_workers, tweak).await
    }

    /// As [`Fleet::start_with`], on servers started by the caller: single ones (over TLS, say,
    /// with the CA file that signed their certificates), or clusters whatever the switch says.
    pub async fn start_on(
        redis: impl Into<RedisServers>,
        nats: impl Into<NatsServers>,
        ca_file: Option<PathBuf>,
        prefix: &str,
        n_gateways: usize,
        n_workers: usize,
        tweak: impl Fn(&mut gateways::Spec),
    ) -> Fleet {
        let (redis, nats) = (redis.into(), nats.into());
        let agents = agents_dir();
        let work = tempfile::tempdir().expect("work");
        let mut gateway_spec = gateways::spec(&nats, &redis, prefix);
        gateway_spec.agents_dir = agents.path().to_path_buf();
        gateway_spec.ca_file = ca_file.clone();
        tweak(&mut gateway_spec);
        let servers_env = crate::servers::cluster_settings(&nats, &redis);
        crate::servers::add_missing(&mut gateway_spec.extra, &servers_env);
        let mut worker_spec = workers::Spec {
            concurrency: 8,
            ack_wait_ms: 5000,
            max_deliver: 3,
            grace_ms: 2000,
            ..workers::Spec::joining(&gateway_spec, work.path().to_path_buf())
        };
        crate::servers::add_missing(&mut worker_spec.extra, &servers_env);
        let mut fleet = Fleet {
            gateways: vec![],
            workers: vec![],
            client: Client::of(&gateway_spec, &gateway_spec.url(), None),
            store: redis.store(prefix, ca_file.as_deref()).await,
            worker_spec,
            gateway_spec,
            logs: None,
            servers_env,
            _work: work,
            _agents: agents,
            nats,
            redis,
        };
        for _ in 0..n_gateways {
            fleet.add_gateway(None).await;
        }
        for i in 0..n_workers {
            fleet.add_worker(&format!("w{i}"));
        }
        fleet
    }

    /// Another gateway on its own port (a failpoint makes it exit there).
    pub async fn add_gateway(&mut self, failpoint: Option<&str>) -> Client {
        let mut spec = self.gateway_spec.clone();
        crate::servers::add_missing(&mut spec.extra, &self.servers_env);
        if !self.gateways.is_empty() || failpoint.is_some() {
            spec.port = crate::free_port().expect("port");
        }
        spec.failpoint = failpoint.map(str::to_owned);
        let gw = match &self.logs {
            Some(logs) => {
                let output = logs.output(&format!("gateway-{}", spec.port));
                gateways::spawn_with(&spec, &output).await
            }
            None => gateways::spawn(&spec, None).await,
        };
        let client = Client::of(&spec, &gw.url, None);
        self.gateways.push(gw);
        client
    }

    /// Adds an agent to the fleet's agents directory (gateways and workers read it per run).
    pub fn add_agent(&self, name: &str, config_yaml: &str, script_yaml: &str) {
        let dir = self._agents.path().join(name);
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("config.yaml"), config_yaml).expect("config");
        std::fs::write(dir.join("script.yaml"), script_yaml).expect("script");
    }

    /// Copies the example agent `name` (every file of `examples/agents/<name>`) into the
    /// fleet's agents directory.
    pub fn add_example(&self, name: &str) {
        let from = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../examples/agents")
            .join(name);
        let to = self._agents.path().join(name);
        std::fs::create_dir_all(&to).expect("mkdir");
        for entry in std::fs::read_dir(&from).expect("example agent dir") {
            let path = entry.expect("entry").path();
            if path.is_file() {
                std::fs::copy(&path, to.join(path.file_name().expect("name"))).expect("copy");
            }
        }
    }

    /// Another worker process, named `id`.
    pub fn add_worker(&mut self, id: &str) {
        let w = self.spawn_worker(id);
        self.workers.push(w);
    }

    /// A worker process named `id` with the fleet's settings and logs, not (yet) in `workers`.
    pub fn spawn_worker(&self, id: &str) -> WorkerProcess {
        let mut spec = self.worker_spec.clone();
        crate::servers::add_missing(&mut spec.extra, &self.servers_env);
        match &self.logs {
            Some(logs) => workers::spawn_with(&spec, id, &logs.output(id)),
            None => workers::spawn(&spec, id, None),
        }
    }

    /// Whether this fleet runs on clusters (a NATS cluster or a Redis Cluster).
    pub fn on_clusters(&self) -> bool {
        self.nats.is_cluster() || self.redis.is_cluster()
    }

    /// Submits a run over HTTP and returns its id.
    pub async fn submit(&self, agent: &str, task: &str) -> RunId {
        submit_as(&self.client, agent, task).await
    }

    /// Waits for the run to pause and returns its pending request id.
    pub async fn pending(&self, run: RunId) -> String {
        pending(&self.client, run).await
    }

    /// Waits (up to 20 s) until the run has `status` in Redis.
    pub async fn wait_status(&self, run: RunId, status: RunStatus) {
        crate::wait_for_status(&self.store, run, status).await;
    }

    /// Answers a question over HTTP (no token): the status and body.
    pub async fn answer(&self, rid: &str, body: Value) -> (u16, Value) {
        self.client
            .post(&format!("/v1/interactions/{rid}/response"), &body)
            .await
            .expect("answer")
    }

    /// A NATS client of the fleet's server with every right (to look into or damage the
    /// streams, as a test must).
    pub async fn nats_admin(&self) -> async_nats::Client {
        crate::nats_client(&self.nats.url()).await
    }

    /// A NATS client of the fleet's server, logged in as a bot.
    pub async fn nats(&self) -> async_nats::Client {
        crate::nats_client(&self.nats.url_as(crate::NatsRole::Bot)).await
    }
}

/// A bot's answer over NATS request-reply (`<prefix>.interactions.respond.<rid>`, with a bearer
/// token when given): the reply JSON.
pub async fn bot_answer(
    nc: &async_nats::Client,
    prefix: &str,
    rid: &str,
    body: Vec<u8>,
    token: Option<&str>,
) -> Value {
    let mut headers = async_nats::HeaderMap::new();
    if let Some(t) = token {
        headers.insert("Authorization", format!("Bearer {t}").as_str());
    }
    let reply = tokio::time::timeout(
        Duration::from_secs(10),
        nc.request_with_headers(
            format!("{prefix}.interactions.respond.{rid}"),
            headers,
            body.into(),
        ),
    )
    .await
    .expect("reply in time")
    .expect("reply");
    serde_json::from_slice(&reply.payload).expect("reply JSON")
}

/// Submits a run over HTTP as `client` (its token) and returns its id; fails the test unless
/// it is accepted (`202`, `QUEUED`).
pub async fn submit_as(client: &Client, agent: &str, task: &str) -> RunId {
    let (status, body) = client
        .post("/v1/runs", &json!({"agent": agent, "task": task}))
        .await
        .expect("submit");
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["status"], "QUEUED");
    body["run_id"]
        .as_str()
        .expect("run_id")
        .parse()
        .expect("uuid")
}

/// Waits (through the API) for a run to pause and returns its pending request id.
pub async fn pending(client: &Client, run: RunId) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, body) = client
            .get(&format!("/v1/runs/{run}"))
            .await
            .expect("get run");
        if body["status"] == "WAITING_FOR_INPUT" && body["pending_interaction"].is_object() {
            return body["pending_interaction"]["request_id"]
                .as_str()
                .expect("request id")
                .to_owned();
        }
        assert!(Instant::now() < deadline, "run never paused: {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
