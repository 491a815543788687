//! `cargo bench -p delta-e2e --bench fleet [-- --runs N --concurrency C]`: the worker's
//! throughput against real servers started on free ports (nothing else is measured).
//!
//! 1. Journal appends/s through `RedisRunStore` (one fenced Lua script per append): one writer
//!    one event at a time, then 64 writers at once.
//! 2. Runs/s of the scripted `hello` agent (think, echo, ask a name, echo, finish) with 1 and 2
//!    `delta-worker` processes (`concurrency` slots each; build them first with
//!    `cargo build --release --bins`): every run is submitted at once, the bench answers each
//!    question as the human
//!    (Redis answer + resume job, as the gateway will), and the clock stops when every run is
//!    `COMPLETED`. Redis commands per run come from `INFO commandstats`, minus the bench's own.
//!
//! Prints a table, then one JSON line per measure.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use delta_e2e::workers::Spec;
use delta_protocol::{
    Event, InteractionRequest, InteractionResponse, Job, MessageLevel, Responder, RunId, RunStatus,
    SystemMessage, Via,
};
use delta_queue::{self as queue, Queue};
use delta_store::redis::RedisRunStore;
use delta_store::{RunRecord, RunStore};
use futures_util::StreamExt;

struct Args {
    runs: usize,
    concurrency: usize,
    appends: usize,
}

fn args() -> Args {
    let mut a = Args {
        runs: 2000,
        concurrency: 64,
        appends: 20_000,
    };
    let argv: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        argv.iter()
            .position(|x| x == flag)
            .and_then(|i| argv.get(i + 1))
            .and_then(|v| v.parse::<usize>().ok())
    };
    if let Some(n) = value("--runs") {
        a.runs = n.max(1);
    }
    if let Some(n) = value("--concurrency") {
        a.concurrency = n.max(1);
    }
    if let Some(n) = value("--appends") {
        a.appends = n.max(64);
    }
    a
}

fn note(i: usize) -> Vec<Event> {
    vec![Event::SystemMessage(SystemMessage {
        level: MessageLevel::Info,
        content: format!("bench event {i}"),
    })]
}

/// Appends/s: one writer, then 64 writers on 64 runs.
async fn appends(redis: &delta_e2e::Redis, total: usize) -> (f64, f64) {
    let store = RedisRunStore::connect(&redis.url(), "ba")
        .await
        .expect("redis");
    let one = RunRecord::new(RunId::new(), "bench", "t", RunStatus::Running);
    store.create(one.clone()).await.expect("create");
    let fenced = store.fenced(delta_protocol::Fence::new(1, 1));
    let sequential = total / 4;
    let t = Instant::now();
    for i in 0..sequential {
        fenced
            .append(one.run_id, note(i), None)
            .await
            .expect("append");
    }
    let seq_rate = sequential as f64 / t.elapsed().as_secs_f64();

    let writers = 64;
    let mut runs = vec![];
    for _ in 0..writers {
        let r = RunRecord::new(RunId::new(), "bench", "t", RunStatus::Running);
        store.create(r.clone()).await.expect("create");
        runs.push(r.run_id);
    }
    let per = total / writers;
    let t = Instant::now();
    let tasks: Vec<_> = runs
        .into_iter()
        .enumerate()
        .map(|(w, id)| {
            let s = store.fenced(delta_protocol::Fence::new(w as u64 + 1, 1));
            tokio::spawn(async move {
                for i in 0..per {
                    s.append(id, note(i), None).await.expect("append");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("writer");
    }
    let par_rate = (per * writers) as f64 / t.elapsed().as_secs_f64();
    (seq_rate, par_rate)
}

async fn commandstats(url: &str) -> HashMap<String, u64> {
    let client = redis::Client::open(url).expect("url");
    let mut c = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let info: String = redis::cmd("INFO")
        .arg("everything")
        .query_async(&mut c)
        .await
        .expect("info");
    info.lines()
        .filter_map(|l| {
            if let Some(n) = l.strip_prefix("total_commands_processed:") {
                return Some(("total".to_owned(), n.trim().parse().ok()?));
            }
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

struct RunsResult {
    workers: usize,
    runs: usize,
    secs: f64,
    redis_per_run: f64,
    worker_trips_per_run: f64,
    submit_answer_trips_per_run: f64,
    breakdown: String,
}

/// The `redis_round_trips` a worker logged when it stopped.
fn logged_round_trips(log: &std::path::Path) -> u64 {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    // Drop terminal colour codes, then read the number after the field name.
    let mut plain = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d == 'm' {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain
        .rsplit("redis_round_trips=")
        .next()
        .filter(|_| plain.contains("redis_round_trips="))
        .and_then(|rest| {
            rest.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// Submits `runs` hello runs, answers each question, waits until all are COMPLETED.
async fn runs(
    nats: &delta_e2e::Nats,
    redis: &delta_e2e::Redis,
    workers: usize,
    runs: usize,
    concurrency: usize,
) -> RunsResult {
    let prefix = format!("b{workers}");
    let work = tempfile::tempdir().expect("tmp");
    let store = RedisRunStore::connect(&redis.url(), &prefix)
        .await
        .expect("redis");
    let q = Arc::new(
        Queue::connect(&nats.url(), &prefix, &queue::Settings::default())
            .await
            .expect("nats"),
    );
    let spec = Spec {
        nats_url: nats.url_as(delta_e2e::NatsRole::Worker),
        redis_url: redis.url_as(delta_e2e::RedisRole::Worker),
        ca_file: None,
        prefix: prefix.clone(),
        agents_dir: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/agents"),
        work_dir: work.path().to_path_buf(),
        concurrency,
        ack_wait_ms: 30_000,
        max_deliver: 5,
        grace_ms: 5000,
        worker_id: String::new(),
        secrets_key_hex: None,
        extra: vec![],
    };
    let logs: Vec<PathBuf> = (0..workers)
        .map(|w| work.path().join(format!("worker-{w}.log")))
        .collect();
    let hosts: Vec<_> = (0..workers)
        .map(|w| delta_e2e::workers::spawn(&spec, &format!("bench-{w}"), Some(&logs[w])))
        .collect();
    // The human: answer each question as it is announced.
    let client = delta_e2e::nats_client(&nats.url()).await;
    let mut requested = client
        .subscribe(format!("{prefix}.interactions.requested.>"))
        .await
        .expect("subscribe");
    let human = {
        let (store, q) = (store.clone(), q.clone());
        tokio::spawn(async move {
            while let Some(msg) = requested.next().await {
                let (store, q) = (store.clone(), q.clone());
                tokio::spawn(async move {
                    let req: InteractionRequest = delta_protocol::events::decode(&msg.payload)
                        .expect("a CloudEvent of a request")
                        .data;
                    let mut a = InteractionResponse::new(
                        req.request_id,
                        Responder {
                            id: "bench".into(),
                            via: Via::Nats,
                            on_behalf_of: None,
                            relayed_by: None,
                        },
                    );
                    a.input = Some("Bench".into());
                    store.answer(&req, &a).await.expect("answer");
                    let job = Job::resume(req.run_id, Some(req.request_id));
                    q.publish_job("hello", &job, None).await.expect("resume");
                });
            }
        })
    };
    let before = commandstats(&redis.url()).await;
    let bench_trips = store.round_trips();
    let started = Instant::now();
    let ids: Vec<RunId> = (0..runs).map(|_| RunId::new()).collect();
    let submits = futures_util::stream::iter(ids.clone())
        .map(|id| {
            let (store, q) = (store.clone(), q.clone());
            async move {
                store
                    .create(RunRecord::new(id, "hello", "bench", RunStatus::Queued))
                    .await
                    .expect("create");
                let job = Job::start(id);
                q.publish_job("hello", &job, None).await.expect("submit");
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<()>>();
    submits.await;

    let client = redis::Client::open(redis.url()).expect("url");
    let mut c = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let mut left = ids;
    let mut polls = 0u64;
    while !left.is_empty() {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut pipe = redis::pipe();
        for id in &left {
            pipe.cmd("HMGET").arg(store.run_key(*id)).arg("status");
        }
        polls += left.len() as u64;
        let statuses: Vec<Vec<Option<String>>> = pipe.query_async(&mut c).await.expect("poll");
        left = left
            .into_iter()
            .zip(statuses)
            .filter(|(_, s)| s.first().cloned().flatten().as_deref() != Some("COMPLETED"))
            .map(|(id, _)| id)
            .collect();
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "{} runs never completed",
            left.len()
        );
    }
    let secs = started.elapsed().as_secs_f64();
    let after = commandstats(&redis.url()).await;
    let bench_trips = store.round_trips() - bench_trips;
    for mut h in hosts {
        delta_e2e::signal(h.id(), delta_e2e::Signal::SIGTERM);
        let _ = h.wait();
    }
    let worker_trips: u64 = logs.iter().map(|l| logged_round_trips(l)).sum();
    human.abort();

    let mut calls: Vec<(String, u64)> = after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(k, v)| *v > 0 && k != "info" && k != "total")
        .map(|(k, v)| if k == "hmget" { (k, v - polls) } else { (k, v) })
        .filter(|(_, v)| *v > 0)
        .collect();
    calls.sort_by_key(|c| std::cmp::Reverse(c.1));
    let total: u64 = calls.iter().map(|(_, v)| v).sum();

    let breakdown = calls
        .iter()
        .map(|(k, v)| format!("{k} {:.1}", *v as f64 / runs as f64))
        .collect::<Vec<_>>()
        .join(", ");
    RunsResult {
        workers,
        runs,
        secs,
        redis_per_run: total as f64 / runs as f64,
        worker_trips_per_run: worker_trips as f64 / runs as f64,
        submit_answer_trips_per_run: bench_trips as f64 / runs as f64,
        breakdown,
    }
}

fn main() {
    let a = args();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let nats = delta_e2e::Nats::start().expect("nats-server");
        let redis = delta_e2e::Redis::start().expect("redis-server");
        eprintln!("journal appends ({} events)…", a.appends);
        let (seq, par) = appends(&redis, a.appends).await;
        let mut results = vec![];
        for workers in [1, 2] {
            eprintln!(
                "hello runs: {} runs, {workers} worker(s) × {} slots…",
                a.runs, a.concurrency
            );
            results.push(runs(&nats, &redis, workers, a.runs, a.concurrency).await);
        }
        println!();
        println!("{:<44} {:>12}", "measure", "per second");
        println!("{:<44} {:>12.0}", "journal appends, 1 writer", seq);
        println!("{:<44} {:>12.0}", "journal appends, 64 writers", par);
        for r in &results {
            println!(
                "{:<44} {:>12.0}",
                format!("hello runs (1 pause each), {} worker(s)", r.workers),
                r.runs as f64 / r.secs
            );
        }
        println!();
        for r in &results {
            println!(
                "{} worker(s): Redis round trips per run: {:.1} by workers + {:.1} to submit and answer; \
                 {:.1} commands executed per run, counting those inside scripts ({})",
                r.workers,
                r.worker_trips_per_run,
                r.submit_answer_trips_per_run,
                r.redis_per_run,
                r.breakdown
            );
        }
        println!(
            "{{\"bench\":\"journal_appends\",\"writers\":1,\"appends_per_s\":{seq:.0}}}\n{{\"bench\":\"journal_appends\",\"writers\":64,\"appends_per_s\":{par:.0}}}"
        );
        for r in &results {
            println!(
                "{{\"bench\":\"hello_runs\",\"workers\":{},\"runs\":{},\"concurrency\":{},\"seconds\":{:.3},\"runs_per_s\":{:.0},\"redis_round_trips_per_run\":{:.1},\"redis_commands_per_run\":{:.1}}}",
                r.workers,
                r.runs,
                a.concurrency,
                r.secs,
                r.runs as f64 / r.secs,
                r.worker_trips_per_run + r.submit_answer_trips_per_run,
                r.redis_per_run
            );
        }
    });
}
