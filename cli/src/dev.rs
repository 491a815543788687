//! `delta dev`: the whole fleet on this machine in one command, for trying it. It starts
//! redis-server, nats-server, a gateway and two workers on free local ports with the example
//! agents, submits demo runs that stop to ask questions, prints where to answer them (the web
//! inbox, the CLI), then shows a short live log until Ctrl+C, which stops everything and removes
//! the data (unless `--keep`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::Local;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::client::Client;
use delta_launcher::local::{LocalFleet, Options, find_programs};
use delta_launcher::repo_root;

#[derive(Debug, Clone, clap::Args)]
pub struct DevArgs {
    /// How many workers to start.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub workers: u16,
    /// NATS servers: 1, or a cluster of 3 (or 5) keeping each stream on three of them (R3).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=5))]
    pub nats_servers: u16,
    /// Run on clusters: 3 NATS servers keeping each stream on all three (R3) and a Redis
    /// Cluster of 3 masters with a replica each (every write waits for its replica).
    #[arg(long)]
    pub cluster: bool,
    /// The gateway's port (a free one when left out).
    #[arg(long)]
    pub port: Option<u16>,
    /// The agents the fleet runs (default: examples/agents of this checkout).
    #[arg(long, value_name = "DIR")]
    pub agents: Option<PathBuf>,
    /// Keep the data directory (Redis and JetStream data, logs) at exit, and say where it is.
    #[arg(long)]
    pub keep: bool,
    /// Install a missing redis-server or nats-server first, with deploy/install-servers.sh.
    #[arg(long)]
    pub install: bool,
    /// Do not submit the demo runs.
    #[arg(long)]
    pub no_demo: bool,
    /// Also run the Slack bridge with this config file (docs/slack.md): its gateway and NATS
    /// settings are the local fleet's, and each person of its user mapping gets a token.
    #[arg(long, value_name = "CONFIG")]
    pub slack: Option<PathBuf>,
}

/// The demo runs: every kind of question between them.
const DEMO: &[(&str, &str)] = &[
    ("hello", "say hi"),
    ("chooser", "pick an environment"),
    ("deployer", "1.4.2"),
];

/// Runs the demo fleet until `cancel`; the exit code.
pub async fn run(a: DevArgs, cancel: CancellationToken) -> i32 {
    match dev(a, cancel).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    }
}

async fn dev(a: DevArgs, cancel: CancellationToken) -> anyhow::Result<()> {
    let root = repo_root();
    let agents = match (&a.agents, &root) {
        (Some(dir), _) => dir.clone(),
        (None, Some(r)) => r.join("examples/agents"),
        (None, None) => anyhow::bail!(
            "no agents directory: run delta dev from the repository, or pass --agents DIR"
        ),
    };
    if !agents.is_dir() {
        anyhow::bail!(
            "agents directory {} does not exist; pass --agents DIR",
            agents.display()
        );
    }
    let agents = agents.canonicalize().unwrap_or(agents);
    let (servers, programs) = find_programs(root.as_deref(), a.install).await?;
    let data = tempfile::Builder::new()
        .prefix("delta-dev-")
        .tempdir()
        .map_err(|e| anyhow::anyhow!("creating a temporary directory: {e}"))?;
    // Sensitive answers are sealed at rest with a key made for this session.
    let key = session_key();
    // And the gateway's one token, made for this session: authentication is on, as anywhere.
    let token = session_key();
    // With the Slack bridge: its config read now (errors before anything starts), and a tokens
    // file naming the bridge (a relay) and each person its user mapping names.
    let slack = match &a.slack {
        Some(path) => Some(crate::slack::DevBridge::prepare(path, data.path())?),
        None => None,
    };
    let opts = Options {
        servers,
        programs,
        dir: data.path().to_path_buf(),
        agents_dir: agents.clone(),
        workers: usize::from(a.workers),
        worker_concurrency: 16,
        worker_resume_slots: None,
        gateway_port: a.port,
        secrets_key_hex: Some(key),
        operator_token: Some(token.clone()),
        tokens_file: slack.as_ref().map(|b| b.tokens_file.clone()),
        cwd: root.clone(),
        redis_fsync: "always".into(),
        log_level: "info".into(),
        nats_servers: if a.cluster {
            usize::from(a.nats_servers).max(3)
        } else {
            usize::from(a.nats_servers)
        },
        redis_cluster: a.cluster,
    };
    eprintln!(
        "starting {}, {}, a gateway and {} worker(s)…",
        if a.cluster {
            "a Redis Cluster (3 masters, 3 replicas)"
        } else {
            "redis-server"
        },
        if opts.nats_servers > 1 {
            format!("{} nats-servers (R3)", opts.nats_servers)
        } else {
            "nats-server".to_owned()
        },
        a.workers
    );
    let started = tokio::select! {
        f = LocalFleet::start(&opts) => f.map_err(anyhow::Error::from),
        () = cancel.cancelled() => anyhow::bail!("interrupted while starting"),
    };
    let mut fleet = match started {
        Ok(f) => f,
        Err(e) => {
            // The processes started so far were killed when their handles dropped; the logs
            // are kept whatever --keep says, since they tell why.
            keep_or_remove(data, true, "the logs of the failed start are");
            return Err(e);
        }
    };
    let client =
        Client::new(&fleet.gateway_url, Some(token.clone()), None).map_err(anyhow::Error::msg)?;
    let mut runs = vec![];
    if !a.no_demo {
        for (agent, task) in DEMO {
            if delta_engine::agent::config_file(&agents.join(agent)).is_none() {
                continue;
            }
            match client
                .post("v1/runs", &json!({"agent": agent, "task": task}), &[])
                .await
            {
                Ok(v) => runs.push((
                    agent.to_string(),
                    v["run_id"].as_str().unwrap_or("").to_owned(),
                )),
                Err(e) => eprintln!(
                    "warning: demo run of {agent} not submitted: {}",
                    crate::table::for_terminal(&e.to_string())
                ),
            }
        }
    }
    let bridge_cancel = cancel.child_token();
    let bridge = match slack {
        Some(b) => Some(b.start(&fleet, bridge_cancel.clone()).await?),
        None => None,
    };
    print_banner(&fleet, &agents, &runs, a.keep, &token);
    if let Some(b) = &bridge {
        eprintln!("{}", b.banner());
    }

    let mut log = LiveLog::new(&client).await;
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            () = log.step(&client) => {}
        }
        for (name, status) in fleet.exited() {
            say(&format!(
                "{}  !!  {name} exited ({status}); its log: {}\n",
                now(),
                fleet.dir.join("logs").join(format!("{name}.log")).display()
            ));
        }
    }
    bridge_cancel.cancel();
    if let Some(b) = bridge {
        b.stop().await;
    }
    eprintln!("\nstopping the workers, the gateway and the servers…");
    fleet.stop(Duration::from_secs(10)).await;
    keep_or_remove(data, a.keep, "the data and logs are");
    Ok(())
}

/// Removes the data directory, or keeps it and says where.
fn keep_or_remove(data: tempfile::TempDir, keep: bool, what: &str) {
    if keep {
        let path = data.keep();
        eprintln!("{what} kept in {}", path.display());
    } else {
        let path = data.path().to_path_buf();
        match data.close() {
            Ok(()) => eprintln!("stopped; removed {}", path.display()),
            Err(e) => eprintln!("stopped; could not remove {}: {e}", path.display()),
        }
    }
}

/// A random 32-byte key in hex, for this session's sealed answers.
fn session_key() -> String {
    let a = uuid::Uuid::new_v4();
    let b = uuid::Uuid::new_v4();
    format!("{}{}", a.simple(), b.simple())
}

/// How to call this program in the printed commands: `delta` when that is what `PATH` finds.
fn delta_command() -> String {
    let exe = std::env::current_exe().ok();
    let on_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p).any(|d| {
                let c = d.join("delta");
                c.is_file() && exe.as_ref().is_some_and(|e| same_file(e, &c))
            })
        })
        .unwrap_or(false);
    match exe {
        Some(_) if on_path => "delta".to_owned(),
        Some(e) => {
            let cwd = std::env::current_dir().unwrap_or_default();
            e.strip_prefix(&cwd)
                .map(|r| format!("./{}", r.display()))
                .unwrap_or_else(|_| e.display().to_string())
        }
        None => "delta".to_owned(),
    }
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

fn print_banner(
    fleet: &LocalFleet,
    agents: &Path,
    runs: &[(String, String)],
    keep: bool,
    token: &str,
) {
    let d = delta_command();
    let url = &fleet.gateway_url;
    let mut s = String::new();
    s.push_str("\nDelta Fleet is running.\n\n");
    // The token rides in the fragment, which the browser never sends: the inbox keeps it and
    // takes it out of the address bar.
    s.push_str(&format!("  web inbox   {url}/#token={token}\n"));
    s.push_str(&format!(
        "  gateway     {url}   (API: {url}/openapi.json, metrics: {url}/metrics)\n"
    ));
    s.push_str(&format!(
        "  nats        {}\n",
        delta_protocol::without_credentials(&fleet.nats_url)
    ));
    s.push_str(&format!(
        "  redis       {}\n",
        delta_protocol::without_credentials(&fleet.redis_url)
    ));
    s.push_str(&format!(
        "  logins      {}   (users per role; nothing connects without one)\n",
        fleet.credentials.display()
    ));
    s.push_str(&format!("  agents      {}\n", agents.display()));
    s.push_str(&format!(
        "  data, logs  {}  ({})\n",
        fleet.dir.display(),
        if keep {
            "kept at exit"
        } else {
            "removed at exit; --keep keeps it"
        }
    ));
    if !runs.is_empty() {
        s.push_str("\nDemo runs (each stops to ask you something):\n");
        for (agent, run) in runs {
            s.push_str(&format!("  {agent:<9} {run}   {url}/runs/{run}\n"));
        }
    }
    s.push_str("\nAnswer in the web inbox, or from another terminal:\n");
    s.push_str(&format!("  export DELTA_GATEWAY_URL={url}\n"));
    s.push_str(&format!("  export DELTA_TOKEN={token}\n"));
    s.push_str(&format!(
        "  {d} pending ls                       # the questions waiting\n"
    ));
    s.push_str(&format!(
        "  {d} pending show <request_id>        # one, with how to answer it\n"
    ));
    s.push_str(&format!(
        "  {d} answer <request_id> --input Ada  # free text; --option ID for a choice\n"
    ));
    s.push_str(&format!(
        "  {d} runs ls                          # every run and its status\n"
    ));
    s.push_str(&format!(
        "  {d} runs journal <run_id> --follow   # a run's journal, live\n"
    ));
    s.push_str(&format!(
        "  {d} submit --agent hello --task hi   # another run\n"
    ));
    s.push_str(&format!(
        "  {d} queue                            # jobs and workers\n"
    ));
    s.push_str("\nCtrl+C stops everything. The live log:\n");
    say(&s);
}

/// Writes to stdout; a reader that went away is not an error (`print!` would panic).
fn say(text: &str) {
    crate::ops::out(text);
}

fn now() -> String {
    Local::now().format("%H:%M:%S").to_string()
}

/// A short live log: questions asked and settled (from the interactions stream) and runs that
/// change status (the run list, polled).
struct LiveLog {
    stream: Option<crate::client::SseStream>,
    last_seq: Option<u64>,
    statuses: std::collections::HashMap<String, String>,
    next_poll: tokio::time::Instant,
}

impl LiveLog {
    async fn new(client: &Client) -> Self {
        let mut log = LiveLog {
            stream: None,
            last_seq: None,
            statuses: Default::default(),
            next_poll: tokio::time::Instant::now(),
        };
        log.stream = client
            .sse("v1/interactions/stream?from_seq=1", None)
            .await
            .ok();
        log
    }

    /// Prints what happened next (waits at most about a second).
    async fn step(&mut self, client: &Client) {
        let poll_at = self.next_poll;
        match &mut self.stream {
            Some(stream) => {
                tokio::select! {
                    ev = stream.next() => match ev {
                        Some(ev) => {
                            if let Some(seq) = ev.id.as_deref().and_then(|i| i.parse().ok()) {
                                self.last_seq = Some(seq);
                            }
                            print_interaction(&ev.event, &ev.data);
                        }
                        None => self.stream = None,
                    },
                    () = tokio::time::sleep_until(poll_at) => {}
                }
            }
            None => {
                tokio::time::sleep_until(poll_at).await;
                // Reconnect where it left off.
                self.stream = client
                    .sse("v1/interactions/stream", self.last_seq)
                    .await
                    .ok();
            }
        }
        if tokio::time::Instant::now() >= self.next_poll {
            self.next_poll = tokio::time::Instant::now() + Duration::from_secs(1);
            self.poll_runs(client).await;
        }
    }

    async fn poll_runs(&mut self, client: &Client) {
        let Ok(page) = client.get("v1/runs", &[("limit", "100".to_owned())]).await else {
            return;
        };
        let mut runs = page["runs"].as_array().cloned().unwrap_or_default();
        runs.reverse();
        for r in runs {
            let id = r["run_id"].as_str().unwrap_or("").to_owned();
            let status = r["status"].as_str().unwrap_or("").to_owned();
            if self.statuses.get(&id) == Some(&status) {
                continue;
            }
            let agent = r["agent"].as_str().unwrap_or("");
            let detail = match status.as_str() {
                "COMPLETED" => format!(": {}", r["result"].as_str().unwrap_or("")),
                "FAILED" | "CANCELLED" => format!(": {}", r["error"].as_str().unwrap_or("")),
                _ => String::new(),
            };
            say(&format!(
                "{}  run {} {agent:<9} {status}{detail}\n",
                now(),
                id
            ));
            self.statuses.insert(id, status);
        }
    }
}

fn print_interaction(kind: &str, data: &str) {
    let v: Value = serde_json::from_str(data).unwrap_or(Value::Null);
    let rid = v["request_id"].as_str().unwrap_or("");
    match kind {
        "requested" => say(&format!(
            "{}  ?   {:<9} asks ({}): {}\n          request {rid}\n",
            now(),
            v["agent"].as_str().unwrap_or(""),
            v["type"].as_str().unwrap_or(""),
            v["prompt"].as_str().unwrap_or("")
        )),
        "resolved" => {
            let state = v["state"].as_str().unwrap_or("ANSWERED");
            let by = format!(
                "{} via {}",
                v["responder"]["id"].as_str().unwrap_or("?"),
                v["responder"]["via"].as_str().unwrap_or("?")
            );
            let what = match (state, v["option_id"].as_str()) {
                ("ANSWERED", Some(o)) => format!("answered by {by}: option {o}"),
                ("ANSWERED", None) => format!("answered by {by}"),
                ("EXPIRED", Some(o)) => format!("expired: default {o} applied"),
                ("EXPIRED", None) => "expired".to_owned(),
                (other, _) => other.to_lowercase(),
            };
            say(&format!("{}  ok  request {} {what}\n", now(), rid));
        }
        _ => {}
    }
}
