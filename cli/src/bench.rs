//! `delta bench hitl-basic`: the reference workload of `docs/benchmarks.md` against a
//! real fleet started on this machine (redis-server, nats-server, a gateway, K workers).
//!
//! N runs, at most C in flight; each is a scripted agent (think, echo, echo, ask_human, echo with
//! the answer, finish), every step journaled in Redis before the next. The "human" sees each
//! question on the interactions subjects (a core NATS subscription to
//! `delta.interactions.requested.<agent>.>`, the subjects the gateway's live stream relays) and
//! answers `yes` at once, through the gateway's HTTP API or as a bot over NATS request-reply.
//!
//! What is timed comes from the journals, not from polling: resume latency is step 5's
//! `ACTION_REQUEST` timestamp minus the instant the answer was sent; the wall time runs from the
//! first submission to the last `ENGINE_END`. Completions are heard as a client of the fleet
//! would hear them: the runs' end announcements (a core NATS subscription to
//! `delta.runs.*.<agent>.>`), which only pace the load, not the figures; nothing the bench does
//! reads Redis while it is timed, so Redis's CPU and commands are the fleet's alone. Every journal
//! is checked at the end: a lost, failed or duplicated step fails the bench.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::{Semaphore, oneshot};

use delta_protocol::{ActionStatus, Event, RunId, RunStatus, Timestamp};
use delta_store::RunStore;
use delta_store::redis::RedisRunStore;

use crate::client::Client;
use delta_launcher::local::{LocalFleet, Options, find_programs};
use delta_launcher::repo_root;

const AGENT: &str = "hitl-basic";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AnswerVia {
    Http,
    Nats,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Echo {
    Builtin,
    Process,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum BenchCommand {
    /// The hitl-basic workload (docs/benchmarks.md): prints one JSON line.
    HitlBasic(BenchArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// How many runs.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub runs: u64,
    /// At most this many runs in flight (a run holds its slot from submission to COMPLETED).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub concurrency: u64,
    /// Workers to start.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=32))]
    pub workers: u16,
    /// Jobs each worker advances at once (its `DELTA_WORKER_CONCURRENCY`; a quarter of them kept
    /// for resume jobs). Fewer keep runs waiting in the jobs stream rather than for the CPU.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub worker_concurrency: u16,
    /// Of each worker's slots, those start jobs may not take (its `DELTA_RESUME_SLOTS`; a
    /// quarter when not given). More keep fewer runs starting at once, so that resumes wait
    /// less for the CPU.
    #[arg(long, value_parser = clap::value_parser!(u16).range(0..=1023))]
    pub resume_slots: Option<u16>,
    /// How the human answers: the gateway's HTTP API, or a bot over NATS.
    #[arg(long, value_enum, default_value_t = AnswerVia::Http)]
    pub answer_via: AnswerVia,
    /// Extra THOUGHT events each run journals before it pauses (to see a resume's cost grow).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=100_000))]
    pub journal_len: u64,
    /// Redis AOF fsync policy: always (every write on disk before Redis answers it, as
    /// docker-compose.yml and the fleet's default durability) or everysec (the fleet then runs
    /// with DELTA_REDIS_DURABILITY=none: a Redis host crash can lose about a second of writes).
    #[arg(long, default_value = "always", value_parser = ["always", "everysec"])]
    pub fsync: String,
    /// NATS servers: 1, or a cluster of 3 (or 5) keeping each stream on three of them (R3).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=5))]
    pub nats_servers: u16,
    /// Run on clusters: 3 NATS servers keeping each stream on all three (R3) and a Redis
    /// Cluster of 3 masters with a replica each (every write waits for its replica).
    #[arg(long)]
    pub cluster: bool,
    /// Before the timed runs, pause this many runs at once to measure what a paused run costs
    /// (Redis bytes, worker memory); they are answered before the timed runs start.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=100_000))]
    pub paused_probe: u64,
    /// How the `echo` tool runs: in the worker (`builtin: echo`, as a Python function tool in
    /// other frameworks) or as a process per call (`exec: "echo ${text}"`).
    #[arg(long, value_enum, default_value_t = Echo::Builtin)]
    pub echo: Echo,
    /// Keep the fleet's data and logs (printed on stderr).
    #[arg(long)]
    pub keep: bool,
    /// Install a missing redis-server or nats-server first.
    #[arg(long)]
    pub install: bool,
}

pub async fn run(cmd: BenchCommand, cancel: tokio_util::sync::CancellationToken) -> i32 {
    let BenchCommand::HitlBasic(a) = cmd;
    // A usage error, as clap's are: before anything starts.
    if a.resume_slots.is_some_and(|r| r >= a.worker_concurrency) {
        eprintln!(
            "error: --resume-slots {} leaves start jobs no slot of --worker-concurrency {}: give fewer resume slots than slots",
            resume_slots(&a),
            a.worker_concurrency
        );
        return 2;
    }
    let work = hitl_basic(a);
    tokio::select! {
        r = work => match r {
            Ok(true) => 0,
            Ok(false) => 1,
            Err(e) => {
                eprintln!("error: {e:#}");
                1
            }
        },
        () = cancel.cancelled() => {
            eprintln!("interrupted");
            130
        }
    }
}

/// The agent of the workload, with `extra` thoughts before the question.
fn write_agent(dir: &Path, extra: u64, echo: Echo) -> anyhow::Result<()> {
    let agent = dir.join(AGENT);
    std::fs::create_dir_all(&agent)?;
    std::fs::write(
        agent.join("config.yaml"),
        format!(
            "name: {AGENT}\nbrain: scripted\nmax_iterations: {}\ntools:\n  - name: echo\n    description: Returns its input.\n    {}\n    idempotent: true\n",
            extra + 20,
            match echo {
                Echo::Builtin => "builtin: echo",
                Echo::Process => "exec: \"echo ${text}\"",
            }
        ),
    )?;
    let mut script = String::from("steps:\n  - think: \"run ${task}: starting\"\n");
    for i in 0..extra {
        script.push_str(&format!("  - think: \"filler {i}\"\n"));
    }
    script.push_str(
        "  - tool: echo\n    args: {text: \"run ${task} step 2\"}\n  - tool: echo\n    args: {text: \"run ${task} step 3\"}\n  - ask_human: {prompt: \"approve deploy of run ${task}?\"}\n  - tool: echo\n    args: {text: \"${answer}\"}\n  - finish: \"done\"\n",
    );
    std::fs::write(agent.join("script.yaml"), script)?;
    Ok(())
}

/// What NATS announced of each run, met with whoever waits for it: the waiter registers first,
/// or the announcement arrives first. The first announcement of a run is kept (a question asked
/// again, an end announced twice, are the same).
struct Heard<T> {
    slots: Mutex<HashMap<RunId, Slot<T>>>,
}

enum Slot<T> {
    Waiting(oneshot::Sender<T>),
    Arrived(T),
}

impl<T> Default for Heard<T> {
    fn default() -> Self {
        Heard {
            slots: Mutex::new(HashMap::new()),
        }
    }
}

impl<T> Heard<T> {
    fn arrived(&self, run: RunId, what: T) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        match slots.remove(&run) {
            Some(Slot::Waiting(tx)) => {
                let _ = tx.send(what);
            }
            Some(first @ Slot::Arrived(_)) => {
                slots.insert(run, first);
            }
            None => {
                slots.insert(run, Slot::Arrived(what));
            }
        }
    }

    fn wait(&self, run: RunId) -> oneshot::Receiver<T> {
        let (tx, rx) = oneshot::channel();
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        match slots.remove(&run) {
            Some(Slot::Arrived(what)) => {
                let _ = tx.send(what);
            }
            _ => {
                slots.insert(run, Slot::Waiting(tx));
            }
        }
        rx
    }
}

/// What the human needs of a question announced: which run asks, and what to answer.
#[derive(Clone, Copy, Debug, serde::Deserialize)]
struct Asked {
    run_id: RunId,
    request_id: delta_protocol::RequestId,
}

/// A CloudEvent read only as far as the ids in its `data` (the rest of it is skipped, not
/// decoded: the bench is a light client, its CPU counted with the fleet's).
#[derive(serde::Deserialize)]
struct Ids<T> {
    data: T,
}

/// What the bench needs of a run's end announced.
#[derive(serde::Deserialize)]
struct Ended {
    run_id: RunId,
    status: RunStatus,
}

/// Questions announced, by run.
type Questions = Heard<Asked>;

/// Runs' ends announced, by run.
type Ends = Heard<RunStatus>;

/// One timed run's client-side instants.
struct Timing {
    run: RunId,
    submitted: Timestamp,
    /// When the question's announcement was heard and its answer sent.
    answered: Timestamp,
    request_id: delta_protocol::RequestId,
}

/// Each worker's slots kept for resume jobs: as given, else the worker's default (a quarter of
/// its slots, at least one, none of a single slot).
fn resume_slots(a: &BenchArgs) -> u16 {
    a.resume_slots.unwrap_or(match a.worker_concurrency {
        0 | 1 => 0,
        c => (c / 4).max(1),
    })
}

async fn hitl_basic(a: BenchArgs) -> anyhow::Result<bool> {
    let root = repo_root();
    let (servers, programs) = find_programs(root.as_deref(), a.install).await?;
    let data = tempfile::Builder::new()
        .prefix("delta-bench-")
        .tempdir()
        .context("creating a temporary directory")?;
    let agents = data.path().join("agents");
    write_agent(&agents, a.journal_len, a.echo)?;
    let opts = Options {
        servers,
        programs,
        dir: data.path().join("fleet"),
        agents_dir: agents,
        workers: usize::from(a.workers),
        worker_concurrency: usize::from(a.worker_concurrency),
        worker_resume_slots: a.resume_slots.map(usize::from),
        gateway_port: None,
        secrets_key_hex: Some("ab".repeat(32)),
        operator_token: None,
        tokens_file: None,
        cwd: None,
        redis_fsync: a.fsync.clone(),
        // Quiet, but for each process's Redis round trips, logged as it stops.
        log_level: "warn".into(),
        nats_servers: if a.cluster {
            usize::from(a.nats_servers).max(3)
        } else {
            usize::from(a.nats_servers)
        },
        redis_cluster: a.cluster,
    };
    eprintln!(
        "starting {} (appendfsync {}), {}, a gateway and {} worker(s)…",
        if a.cluster {
            "a Redis Cluster of 3 masters and 3 replicas"
        } else {
            "redis-server"
        },
        a.fsync,
        if opts.nats_servers > 1 {
            format!("a cluster of {} nats-servers (R3)", opts.nats_servers)
        } else {
            "nats-server".to_owned()
        },
        a.workers
    );
    let fleet = match LocalFleet::start(&opts).await {
        Ok(f) => f,
        Err(e) => {
            eprintln!("the fleet's logs are kept in {}", data.keep().display());
            return Err(e.into());
        }
    };
    let outcome = measure(&a, &fleet).await;
    fleet.stop(Duration::from_secs(10)).await;
    let (mut line, ok) = outcome?;
    // Each process logged its round trips to Redis as it stopped.
    let logs = data.path().join("fleet/logs");
    let workers: Option<u64> = (1..=a.workers)
        .map(|i| logged_round_trips(&logs.join(format!("worker-{i}.log"))))
        .sum();
    let gateway = logged_round_trips(&logs.join("gateway.log"));
    let heard = logged_count(&logs.join("gateway.log"), "answers_heard");
    let runs = (a.runs + a.paused_probe) as f64;
    let per_run = |n: Option<u64>, who: &str| match n {
        Some(n) => json!(round(n as f64 / runs, 2)),
        None => {
            eprintln!(
                "warning: the {who} did not log their Redis round trips as they stopped (killed?); reported as null"
            );
            Value::Null
        }
    };
    if let Some(obj) = line.as_object_mut() {
        obj.insert(
            "redis_round_trips_per_run_workers".into(),
            per_run(workers, "workers"),
        );
        obj.insert(
            "redis_round_trips_per_run_gateway".into(),
            per_run(gateway, "gateway"),
        );
        // Answers to questions the gateway kept, which it did not read from Redis.
        obj.insert(
            "answers_from_memory_share".into(),
            heard.map_or(Value::Null, |n| json!(round(n as f64 / runs, 3))),
        );
    }
    crate::ops::out(&format!("{line}\n"));
    if a.keep {
        eprintln!("data and logs kept in {}", data.keep().display());
    }
    Ok(ok)
}

/// The `redis_round_trips=N` a process logged as it stopped (`None` if it did not).
fn logged_round_trips(log: &Path) -> Option<u64> {
    logged_count(log, "redis_round_trips")
}

/// The `<name>=N` a process logged last (`None` if it did not).
fn logged_count(log: &Path, name: &str) -> Option<u64> {
    // Without the terminal colour codes, whose digits would mislead.
    let text =
        delta_launcher::process::strip_ansi(&std::fs::read_to_string(log).unwrap_or_default());
    let key = format!("{name}=");
    text.rsplit(&key)
        .next()
        .filter(|_| text.contains(&key))
        .map(|rest| {
            rest.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
        })
        .and_then(|n| n.parse().ok())
}

async fn measure(a: &BenchArgs, fleet: &LocalFleet) -> anyhow::Result<(Value, bool)> {
    let options = delta_store::redis::Options {
        cluster: fleet.redis_cluster,
        ..Default::default()
    };
    let store = RedisRunStore::connect_options(&fleet.redis_url, "delta", &options)
        .await
        .context("connecting to Redis")?;
    let nats = delta_queue::connect_client(&fleet.nats_url, &Default::default(), None)
        .await
        .context("connecting to NATS")?;
    let http = Client::new(&fleet.gateway_url, None, None).map_err(anyhow::Error::msg)?;
    let questions = Arc::new(Questions::default());
    let sub = nats
        .subscribe(format!("delta.interactions.requested.{AGENT}.>"))
        .await
        .context("subscribing to the questions")?;
    let listener = AbortOnDrop(tokio::spawn(hear(sub, questions.clone(), |m| {
        let q = serde_json::from_slice::<Ids<Asked>>(&m.payload).ok()?.data;
        Some((q.run_id, q))
    })));
    let ends = Arc::new(Ends::default());
    let sub = nats
        .subscribe(format!("delta.runs.*.{AGENT}.>"))
        .await
        .context("subscribing to the runs' ends")?;
    let end_listener = AbortOnDrop(tokio::spawn(hear(sub, ends.clone(), |m| {
        let e = serde_json::from_slice::<Ids<Ended>>(&m.payload).ok()?.data;
        Some((e.run_id, e.status))
    })));
    // Both subscriptions are in place on the server before the first run is submitted.
    nats.flush().await.context("subscribing")?;
    let ctx = Ctx {
        http,
        nats,
        via: a.answer_via,
        questions,
        ends,
    };
    let rss = Arc::new(RssSampler::new(fleet, usize::from(a.workers)));
    let sampler = AbortOnDrop({
        let rss = rss.clone();
        tokio::spawn(async move {
            loop {
                rss.sample();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    });

    let mut report = serde_json::Map::new();
    if a.paused_probe > 0 {
        probe_paused(&ctx, &store, &rss, a.paused_probe, &mut report).await?;
    }

    let cpu_before = CpuTimes::read(fleet, usize::from(a.workers));
    let nodes_before = redis_node_ticks(fleet);
    let before = store.info("commandstats").await?;
    let before_masters = store.info_by_master("commandstats").await?;
    let before_mem = used_memory(&store).await?;
    let nats_before = nats_messages(fleet).await;
    let bar = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        indicatif::ProgressBar::new(a.runs)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} runs completed  {per_sec}  {elapsed}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let bar = Arc::new(bar);
    let slots = Arc::new(Semaphore::new(usize::try_from(a.concurrency).unwrap_or(64)));
    let ctx = Arc::new(ctx);
    // Submitted from a task of the runtime, not from the main thread: a run's end then starts
    // the next on the thread that heard it, not by waking the main thread first
    // (docs/architecture.md#threads).
    let submitting = {
        let (ctx, bar, runs) = (ctx.clone(), bar.clone(), a.runs);
        tokio::spawn(async move {
            let mut tasks = Vec::new();
            for i in 0..runs {
                let permit = slots.clone().acquire_owned().await?;
                let ctx = ctx.clone();
                let bar = bar.clone();
                tasks.push(tokio::spawn(async move {
                    let r = one_run(&ctx, i).await;
                    bar.inc(1);
                    drop(permit);
                    r
                }));
            }
            anyhow::Ok(tasks)
        })
    };
    let tasks = submitting.await??;
    let mut timings = Vec::new();
    let mut errors = Vec::new();
    for t in tasks {
        match t.await {
            Ok(Ok(timing)) => timings.push(timing),
            Ok(Err(e)) => errors.push(format!("{e:#}")),
            Err(e) => errors.push(e.to_string()),
        }
    }
    bar.finish_and_clear();
    let after = store.info("commandstats").await?;
    let after_masters = store.info_by_master("commandstats").await?;
    let cpu = CpuTimes::read(fleet, usize::from(a.workers)).since(&cpu_before);
    let nodes_after = redis_node_ticks(fleet);
    let after_mem = used_memory(&store).await?;
    let nats_after = nats_messages(fleet).await;
    drop((sampler, listener, end_listener));

    // The checker: every journal read back, its shape checked, the instants taken.
    let mut resume_ms = Vec::new();
    let mut pause_ms = Vec::new();
    // Where a resume's time goes (docs/benchmarks.md): answer sent → the gateway takes it up (its
    // `answered_at`, before the answer's checks and the settling script) → step 5 requested (the
    // answer is journaled in the same write, with the same time); and a question's announcement:
    // asked → heard (and answered).
    let mut parts: [Vec<f64>; 3] = Default::default();
    let (mut completed, mut failed, mut bad) = (0u64, 0u64, Vec::new());
    let first = timings
        .iter()
        .map(|t| t.submitted.micros())
        .min()
        .unwrap_or(0);
    let mut last_end = first;
    for t in &timings {
        let run = store.load(t.run).await?;
        match check_journal(&run.journal, a.journal_len) {
            Ok(c) => {
                completed += 1;
                let ms =
                    |from: Timestamp, to: Timestamp| (to.micros() - from.micros()) as f64 / 1000.0;
                resume_ms.push(ms(t.answered, c.step5));
                pause_ms.push(ms(t.submitted, c.asked));
                if let Some(settled) = store
                    .interaction(t.run, t.request_id)
                    .await?
                    .and_then(|ix| ix.answered_at)
                {
                    parts[0].push(ms(c.asked, t.answered));
                    parts[1].push(ms(t.answered, settled));
                    parts[2].push(ms(settled, c.step5));
                }
                last_end = last_end.max(c.end.micros());
            }
            Err(why) => {
                if run.record.status == RunStatus::Failed {
                    failed += 1;
                }
                bad.push(format!("run {}: {why}", t.run));
            }
        }
    }
    let lost = a.runs - timings.len() as u64;
    let wall_s = (last_end - first) as f64 / 1e6;
    let commands: Vec<(String, u64)> = commands_between(&before, &after)
        .into_iter()
        .filter(|(_, v)| *v > 0)
        .collect();
    let fleet_commands: u64 = commands.iter().map(|(_, v)| v).sum();
    resume_ms.sort_by(f64::total_cmp);
    pause_ms.sort_by(f64::total_cmp);
    for p in &mut parts {
        p.sort_by(f64::total_cmp);
    }
    // `null`, not 0, when no question's `answered_at` could be read.
    let [heard, settled, step5] = parts
        .each_ref()
        .map(|p| (!p.is_empty()).then(|| round(pct(p, 0.50), 3)));
    let line = json!({
        "workload": "hitl-basic",
        "runs": a.runs,
        "concurrency": a.concurrency,
        "wall_s": round(wall_s, 3),
        "runs_per_s": round(if wall_s > 0.0 { completed as f64 / wall_s } else { 0.0 }, 1),
        "resume_p50_ms": round(pct(&resume_ms, 0.50), 3),
        "resume_p95_ms": round(pct(&resume_ms, 0.95), 3),
        "resume_p99_ms": round(pct(&resume_ms, 0.99), 3),
        "submit_to_pause_p50_ms": round(pct(&pause_ms, 0.50), 3),
        "question_heard_p50_ms": heard,
        "resume_parts_p50_ms": {
            "answer_to_settled": settled,
            "settled_to_step5": step5,
        },
        "completed": completed,
        "failed": failed,
        "lost": lost,
        "workers": a.workers,
        "worker_concurrency": a.worker_concurrency,
        "resume_slots": resume_slots(a),
        "answer_via": match a.answer_via { AnswerVia::Http => "http", AnswerVia::Nats => "nats" },
        "human_sees": "nats-subscription",
        "journal_len": a.journal_len,
        "echo": match a.echo { Echo::Builtin => "builtin", Echo::Process => "process" },
        "redis_appendfsync": a.fsync,
        "nats_servers": fleet.nats_pids().len(),
        "redis_nodes": fleet.redis_pids().len(),
        "redis_commands_per_run": round(fleet_commands as f64 / a.runs as f64, 2),
        "redis_commands": commands.into_iter().collect::<HashMap<_, _>>(),
        // Messages into and out of the NATS servers per run (`null` when a server's monitoring
        // did not answer); on a cluster, the routes' copies between nodes count too.
        "nats_messages_per_run": match (nats_before, nats_after) {
            (Some((in0, out0)), Some((in1, out1))) => json!({
                "in": round(in1.saturating_sub(in0) as f64 / a.runs as f64, 2),
                "out": round(out1.saturating_sub(out0) as f64 / a.runs as f64, 2),
            }),
            _ => Value::Null,
        },
        "redis_bytes_per_completed_run": (after_mem.saturating_sub(before_mem)) / a.runs.max(1),
        "worker_rss_max_mib": round(rss.max_worker() as f64 / 1024.0, 1),
        "cpu_ms_per_run": cpu
            .iter()
            .map(|(k, v)| (k.clone(), json!(round(*v as f64 * 10.0 / a.runs as f64, 3))))
            .collect::<serde_json::Map<_, _>>(),
        "gateway_rss_max_mib": round(rss.max_gateway() as f64 / 1024.0, 1),
    });
    let mut line = line;
    if let Some(obj) = line.as_object_mut() {
        obj.extend(report);
        if fleet.redis_cluster {
            obj.extend(master_shares(&before_masters, &after_masters));
            // The masters' CPU and the replicas', apart: what the capacity model needs.
            let (mut masters, mut replicas) = (0u64, 0u64);
            for (port, after) in &nodes_after {
                let used = after.saturating_sub(nodes_before.get(port).copied().unwrap_or(0));
                let suffix = format!(":{port}");
                if after_masters
                    .iter()
                    .any(|(node, _)| node.ends_with(&suffix))
                {
                    masters += used;
                } else {
                    replicas += used;
                }
            }
            let per_run = |ticks: u64| json!(round(ticks as f64 * 10.0 / a.runs as f64, 3));
            obj.insert("redis_masters_cpu_ms_per_run".into(), per_run(masters));
            obj.insert("redis_replicas_cpu_ms_per_run".into(), per_run(replicas));
        }
    }
    for e in errors.iter().chain(bad.iter()).take(10) {
        eprintln!("error: {e}");
    }
    let ok = errors.is_empty() && bad.is_empty() && lost == 0 && completed == a.runs;
    if !ok {
        eprintln!(
            "FAILED: {completed} of {} runs completed as the workload says ({} errors, {} bad journals, {lost} lost)",
            a.runs,
            errors.len(),
            bad.len()
        );
    }
    Ok((line, ok))
}

/// A background task stopped when this goes out of scope (on every path out, errors included).
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What the load needs.
struct Ctx {
    http: Client,
    nats: async_nats::Client,
    via: AnswerVia,
    questions: Arc<Questions>,
    ends: Arc<Ends>,
}

const STEP_TIMEOUT: Duration = Duration::from_secs(120);

/// Submits run `i`, answers its question `yes` when it comes, and waits for its end.
async fn one_run(ctx: &Ctx, i: u64) -> anyhow::Result<Timing> {
    let submitted = Timestamp::now();
    let accepted = ctx
        .http
        .post(
            "v1/runs",
            &json!({"agent": AGENT, "task": i.to_string()}),
            &[],
        )
        .await
        .with_context(|| format!("submitting run {i}"))?;
    let run: RunId = accepted["run_id"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("run {i}: no run_id in {accepted}"))?;
    let q = tokio::time::timeout(STEP_TIMEOUT, ctx.questions.wait(run))
        .await
        .with_context(|| format!("run {run} never asked its question"))?
        .context("the question listener stopped")?;
    let done = ctx.ends.wait(run);
    let answered = Timestamp::now();
    answer(ctx, &q).await?;
    let status = tokio::time::timeout(STEP_TIMEOUT, done)
        .await
        .with_context(|| format!("run {run} did not end after its answer"))?
        .context("the end listener stopped")?;
    if status != RunStatus::Completed {
        bail!("run {run} ended {status}");
    }
    Ok(Timing {
        run,
        submitted,
        answered,
        request_id: q.request_id,
    })
}

async fn answer(ctx: &Ctx, q: &Asked) -> anyhow::Result<()> {
    let body = json!({"input": "yes", "responder": {"id": "bench"}});
    match ctx.via {
        AnswerVia::Http => {
            ctx.http
                .post(
                    &format!("v1/interactions/{}/response", q.request_id),
                    &body,
                    &[],
                )
                .await
                .with_context(|| format!("answering {}", q.request_id))?;
        }
        AnswerVia::Nats => {
            let reply = ctx
                .nats
                .request(
                    format!("delta.interactions.respond.{}", q.request_id),
                    body.to_string().into(),
                )
                .await
                .with_context(|| format!("answering {} over NATS", q.request_id))?;
            let v: Value = serde_json::from_slice(&reply.payload).unwrap_or(Value::Null);
            if v["ok"] != true {
                bail!("answer to {} refused: {v}", q.request_id);
            }
        }
    }
    Ok(())
}

/// Meets each message of `sub` that `read` makes sense of with whoever waits for its run.
async fn hear<T>(
    mut sub: async_nats::Subscriber,
    heard: Arc<Heard<T>>,
    read: impl Fn(&async_nats::Message) -> Option<(RunId, T)>,
) {
    while let Some(m) = sub.next().await {
        if let Some((run, what)) = read(&m) {
            heard.arrived(run, what);
        }
    }
}

/// The instants a correct journal yields.
struct Checked {
    asked: Timestamp,
    step5: Timestamp,
    end: Timestamp,
}

/// Checks a run's journal against the workload: one pass through think, echo, echo, the
/// question, `yes`, echo of `yes`, `COMPLETED`; each tool call requested and done once.
fn check_journal(journal: &[delta_protocol::JournalEvent], extra: u64) -> Result<Checked, String> {
    let mut thoughts = 0u64;
    let mut requests = Vec::new();
    let mut echo_ids = Vec::new();
    let mut results = 0usize;
    let mut asked = None;
    let mut received = 0;
    let mut end = None;
    for (n, e) in journal.iter().enumerate() {
        if e.seq != n as u64 + 1 {
            return Err(format!("seq {} at position {}", e.seq, n + 1));
        }
        match &e.event {
            Event::Thought(_) => thoughts += 1,
            Event::ActionRequest(r) if r.tool == "echo" => {
                echo_ids.push(r.action_id.clone());
                requests.push((r.args.clone(), e.timestamp));
            }
            Event::ActionResult(r) if echo_ids.contains(&r.action_id) => {
                if r.status != ActionStatus::Success {
                    return Err(format!("a tool call ended {:?}", r.status));
                }
                results += 1;
            }
            Event::HumanInputRequest(q) => {
                if asked.is_some() {
                    return Err("asked twice".into());
                }
                asked = Some(q.timestamp);
            }
            Event::HumanInputReceived(_) => received += 1,
            Event::EngineEnd(x) if x.status == RunStatus::Completed => end = Some(e.timestamp),
            _ => {}
        }
    }
    // think + filler + one THOUGHT per tool call (3) + the finish's.
    let want_thoughts = 1 + extra + 4;
    if thoughts != want_thoughts {
        return Err(format!("{thoughts} THOUGHT events, not {want_thoughts}"));
    }
    if requests.len() != 3 || results != 3 {
        return Err(format!(
            "{} tool calls requested and {results} done, not 3 and 3",
            requests.len()
        ));
    }
    if received != 1 {
        return Err(format!("{received} answers journaled, not 1"));
    }
    if requests[2].0["text"] != "yes" {
        return Err(format!("step 5 echoed {}, not the answer", requests[2].0));
    }
    Ok(Checked {
        asked: asked.ok_or("never asked")?,
        step5: requests[2].1,
        end: end.ok_or("not COMPLETED")?,
    })
}

/// Pauses `n` runs at once, then measures what they cost while paused; answers them after.
async fn probe_paused(
    ctx: &Ctx,
    store: &RedisRunStore,
    rss: &RssSampler,
    n: u64,
    report: &mut serde_json::Map<String, Value>,
) -> anyhow::Result<()> {
    eprintln!("probe: pausing {n} runs at once…");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mem_before = used_memory(store).await?;
    let rss_before = rss.workers_now();
    let mut waiting = Vec::new();
    for i in 0..n {
        let accepted = ctx
            .http
            .post(
                "v1/runs",
                &json!({"agent": AGENT, "task": format!("probe-{i}")}),
                &[],
            )
            .await?;
        let run: RunId = accepted["run_id"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .context("no run_id")?;
        waiting.push(ctx.questions.wait(run));
    }
    let mut asked = Vec::new();
    for w in waiting {
        asked.push(tokio::time::timeout(STEP_TIMEOUT, w).await??);
    }
    // Let the workers settle (freed buffers, finished jobs).
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let mem_paused = used_memory(store).await?;
    let rss_paused = rss.workers_now();
    report.insert("paused_probe_runs".into(), json!(n));
    let per_run = mem_paused.saturating_sub(mem_before) / n;
    report.insert("redis_bytes_per_paused_run".into(), json!(per_run));
    // Where those bytes are: each key of a sample of the paused runs, as Redis counts it; the
    // rest is their entries in the listings and the keyspace's own overhead.
    let sample = &asked[..asked.len().min(50)];
    let mut by_key: Vec<(&str, u64)> = Vec::new();
    for q in sample {
        for (name, bytes) in store.memory_of_run(q.run_id).await? {
            match by_key.iter_mut().find(|(n, _)| *n == name) {
                Some((_, sum)) => *sum += bytes,
                None => by_key.push((name, bytes)),
            }
        }
    }
    let mut breakdown = serde_json::Map::new();
    let mut keys = 0;
    for (name, sum) in by_key {
        let mean = sum / (sample.len().max(1) as u64);
        keys += mean;
        breakdown.insert(name.into(), json!(mean));
    }
    breakdown.insert(
        "listings_and_keyspace".into(),
        json!(per_run.saturating_sub(keys)),
    );
    report.insert(
        "redis_bytes_per_paused_run_by_key".into(),
        Value::Object(breakdown),
    );
    report.insert("worker_rss_kib_before_probe".into(), json!(rss_before));
    report.insert("worker_rss_kib_with_probe_paused".into(), json!(rss_paused));
    for q in &asked {
        answer(ctx, q).await?;
    }
    // Wait until they are all over, so the timed runs start on an idle fleet.
    let ids: Vec<RunId> = asked.iter().map(|q| q.run_id).collect();
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    loop {
        let statuses = store.statuses(&ids).await?;
        if statuses.iter().all(|s| s.is_some_and(|s| s.is_terminal())) {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            bail!("the probe's runs did not end");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The same workers with none of these runs paused: what a worker keeps per paused run is
    // the difference (allocator high-water marks are in both readings).
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let rss_after = rss.workers_now();
    report.insert(
        "worker_rss_kib_after_probe_completed".into(),
        json!(rss_after),
    );
    report.insert(
        "worker_bytes_per_paused_run".into(),
        json!((rss_paused.saturating_sub(rss_after) * 1024) / n),
    );
    Ok(())
}

/// What Redis holds in memory for its data: `used_memory` without the connections' buffers and
/// the AOF buffer, which a burst of submissions fills for a moment and which are not the runs'.
async fn used_memory(store: &RedisRunStore) -> anyhow::Result<u64> {
    let info = store.info("memory").await?;
    let field = |name: &str| info.get(name).and_then(|v| v.parse::<u64>().ok());
    let used = field("used_memory").context("INFO memory has no used_memory")?;
    let transient: u64 = ["mem_clients_normal", "mem_clients_slaves", "mem_aof_buffer"]
        .iter()
        .filter_map(|f| field(f))
        .sum();
    Ok(used.saturating_sub(transient))
}

/// The messages the fleet's NATS servers took in and sent out so far (`in_msgs`, `out_msgs` of
/// each server's `/varz`, summed); `None` if one did not answer.
async fn nats_messages(fleet: &LocalFleet) -> Option<(u64, u64)> {
    // reqwest is built with rustls but no crypto provider: install ring (once per process).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .ok()?;
    let (mut inbound, mut outbound) = (0, 0);
    for port in fleet.nats_monitor_ports() {
        let varz: Value = http
            .get(format!("http://127.0.0.1:{port}/varz"))
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        inbound += varz["in_msgs"].as_u64()?;
        outbound += varz["out_msgs"].as_u64()?;
    }
    Some((inbound, outbound))
}

/// CPU clock ticks used so far by each Redis server, by port.
fn redis_node_ticks(fleet: &LocalFleet) -> HashMap<u16, u64> {
    fleet
        .redis_nodes()
        .into_iter()
        .filter_map(|(pid, port)| ticks(pid).map(|(own, _)| (port, own)))
        .collect()
}

/// Each Redis master's share of the commands between two readings (by node address), and how
/// far the busiest is from the mean: `redis_master_spread` (max / mean; 1.0 is perfectly even)
/// and `redis_masters_balanced` (every master within 1.25× of the mean).
fn master_shares(
    before: &[(String, HashMap<String, String>)],
    after: &[(String, HashMap<String, String>)],
) -> serde_json::Map<String, Value> {
    let per_master: Vec<(String, u64)> = after
        .iter()
        .map(|(node, fields)| {
            let was = before
                .iter()
                .find(|(b, _)| b == node)
                .map(|(_, f)| f.clone())
                .unwrap_or_default();
            let n = commands_between(&was, fields).iter().map(|(_, n)| n).sum();
            (node.clone(), n)
        })
        .collect();
    let total: u64 = per_master.iter().map(|(_, n)| n).sum();
    let mean = total as f64 / per_master.len().max(1) as f64;
    let max = per_master.iter().map(|(_, n)| *n).max().unwrap_or(0) as f64;
    let min = per_master.iter().map(|(_, n)| *n).min().unwrap_or(0) as f64;
    let spread = if mean > 0.0 { max / mean } else { 0.0 };
    let mut out = serde_json::Map::new();
    out.insert(
        "redis_masters".into(),
        per_master
            .iter()
            .map(|(node, n)| {
                json!({
                    "node": node,
                    "commands": n,
                    "share": round(*n as f64 / total.max(1) as f64, 3),
                })
            })
            .collect(),
    );
    out.insert("redis_master_spread".into(), json!(round(spread, 3)));
    out.insert(
        "redis_masters_balanced".into(),
        json!(mean > 0.0 && max <= 1.25 * mean && min >= mean / 1.25),
    );
    out
}

/// `cmdstat_<name>:calls=N,…` lines: calls by command between two readings.
fn commands_between(
    before: &HashMap<String, String>,
    after: &HashMap<String, String>,
) -> Vec<(String, u64)> {
    let calls = |v: &str| {
        v.split(',')
            .find_map(|kv| kv.strip_prefix("calls="))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let mut out: Vec<(String, u64)> = after
        .iter()
        .filter_map(|(k, v)| {
            let name = k.strip_prefix("cmdstat_")?;
            let was = before.get(k).map(|b| calls(b)).unwrap_or(0);
            let n = calls(v).saturating_sub(was);
            (n > 0 && name != "info").then(|| (name.to_owned(), n))
        })
        .collect();
    out.sort();
    out
}

/// CPU time used by each part of the fleet (and by this bench), in clock ticks (1/100 s):
/// user + system, and for workers also their finished children (the tools they ran).
struct CpuTimes(Vec<(String, u64)>);

impl CpuTimes {
    fn read(fleet: &LocalFleet, workers: usize) -> Self {
        let mut parts = vec![];
        let mut worker_ticks = 0;
        let mut tool_ticks = 0;
        for i in 1..=workers {
            if let Some((own, children)) = fleet.pid(&format!("worker-{i}")).and_then(ticks) {
                worker_ticks += own;
                tool_ticks += children;
            }
        }
        parts.push(("workers".to_owned(), worker_ticks));
        parts.push(("tools".to_owned(), tool_ticks));
        let gateway = fleet
            .pid("gateway")
            .and_then(ticks)
            .map_or(0, |(own, _)| own);
        parts.push(("gateway".to_owned(), gateway));
        // Every Redis node of a cluster, masters and replicas.
        let redis: u64 = fleet
            .redis_pids()
            .into_iter()
            .filter_map(ticks)
            .map(|(own, _)| own)
            .sum();
        parts.push(("redis".to_owned(), redis));
        // Every NATS server of a cluster.
        let nats: u64 = fleet
            .nats_pids()
            .into_iter()
            .filter_map(ticks)
            .map(|(own, _)| own)
            .sum();
        parts.push(("nats".to_owned(), nats));
        let me = ticks(std::process::id()).map_or(0, |(own, _)| own);
        parts.push(("bench".to_owned(), me));
        CpuTimes(parts)
    }

    fn since(&self, before: &CpuTimes) -> Vec<(String, u64)> {
        self.0
            .iter()
            .map(|(k, v)| {
                let was = before.0.iter().find(|(b, _)| b == k).map_or(0, |(_, b)| *b);
                (k.clone(), v.saturating_sub(was))
            })
            .collect()
    }
}

/// `(utime + stime, cutime + cstime)` of a process from `/proc/<pid>/stat`, in clock ticks.
fn ticks(pid: u32) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(4)
        .filter_map(|x| x.parse().ok())
        .collect();
    (f.len() == 4).then(|| (f[0] + f[1], f[2] + f[3]))
}

/// Resident memory of the fleet's processes, sampled.
struct RssSampler {
    workers: Vec<u32>,
    gateway: Option<u32>,
    max_worker: std::sync::atomic::AtomicU64,
    max_gateway: std::sync::atomic::AtomicU64,
}

impl RssSampler {
    fn new(fleet: &LocalFleet, workers: usize) -> Self {
        RssSampler {
            workers: (1..=workers)
                .filter_map(|i| fleet.pid(&format!("worker-{i}")))
                .collect(),
            gateway: fleet.pid("gateway"),
            max_worker: Default::default(),
            max_gateway: Default::default(),
        }
    }

    fn sample(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        for pid in &self.workers {
            self.max_worker.fetch_max(rss_kib(*pid), Relaxed);
        }
        if let Some(pid) = self.gateway {
            self.max_gateway.fetch_max(rss_kib(pid), Relaxed);
        }
    }

    /// The workers' resident memory now, in KiB, summed.
    fn workers_now(&self) -> u64 {
        self.workers.iter().map(|p| rss_kib(*p)).sum()
    }

    fn max_worker(&self) -> u64 {
        self.max_worker.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn max_gateway(&self) -> u64 {
        self.max_gateway.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// `VmRSS` of a process in KiB (0 when it cannot be read).
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}
