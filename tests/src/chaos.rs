//! The fault-injection suite's shared parts (`tests/tests/chaos.rs`): the checker that reads every
//! journal at the end, a "human" who answers questions over HTTP as soon as they appear, side
//! effects counted from a file, a seeded random source, and the summary table.
//!
//! The checker verifies, for every run a scenario submitted:
//!
//! - the run exists and is terminal, with the status the scenario expects (else it is *lost*);
//! - its journal's `seq` runs 1..n without a gap, and ends with the matching `ENGINE_END`;
//! - each step was requested once and resulted once (a second `ACTION_RESULT` is *duplicated*);
//! - each question was answered exactly once (`HUMAN_INPUT_RECEIVED`; a second one is
//!   *duplicated*);
//! - each counted tool step ran at most once per journaled attempt: once, plus once for every
//!   `re-running interrupted action` the journal shows for it. An idempotent step that was
//!   unfinished when its worker died may run again, and says so in the journal *before* it
//!   runs; a run nobody journaled is a step executed past its checkpoint (*duplicated*).
//!
//! [`check_events`] checks the events stream too: each run's events (told apart by their `id`:
//! an event announced twice is one event) are the ones its journal implies, in that order, and
//! its end is among them, whoever died between ending it and acking its job.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use delta_protocol::{Event, RunId, RunStatus};
use delta_store::redis::RedisRunStore;
use delta_store::{RunStore, StoredRun};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::gateways::Client;

/// Whether the long form runs (`DELTA_CHAOS_LONG=1`): bigger batches, more faults.
pub fn long() -> bool {
    std::env::var("DELTA_CHAOS_LONG").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// `short` in the default (CI) form, `long` with `DELTA_CHAOS_LONG=1`.
pub fn size(short: usize, long_form: usize) -> usize {
    if long() { long_form } else { short }
}

/// A small seeded random source (xorshift64*): `DELTA_CHAOS_SEED` replays a run's choices.
pub struct Rng(u64);

impl Rng {
    /// Seeded from `DELTA_CHAOS_SEED`, else from the clock; the seed is in the summary's notes.
    pub fn new() -> Self {
        let seed = std::env::var("DELTA_CHAOS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
            });
        Self(seed.max(1))
    }

    pub fn seed(&self) -> u64 {
        self.0
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

impl Default for Rng {
    fn default() -> Self {
        Self::new()
    }
}

/// A tool that leaves a side effect: it appends `<label> <worker pid>` to `effects` in its run's
/// work dir (`<DELTA_WORK_DIR>/<run_id>/effects`) when it starts (its parent, `$PPID`, is the worker that runs it), sleeps `secs`, and
/// prints `done <label> <worker pid>` (so the journal's observation names who ran it).
pub const STEP_TOOL: &str = "  - name: step\n    shell: 'echo ${label} $PPID >> effects; sleep ${secs}; echo done ${label} $PPID'\n    idempotent: true\n";

/// An agent named `name` of `step` tools: `steps` lists each step's sleep in seconds, and
/// `ask_after` puts a free-text question after that many steps (`None`: no question).
pub fn step_agent(name: &str, steps: &[&str], ask_after: Option<usize>) -> (String, String) {
    let config = format!("name: {name}\nbrain: scripted\ntools:\n{STEP_TOOL}");
    let mut script = "steps:\n".to_owned();
    for (i, secs) in steps.iter().enumerate() {
        if ask_after == Some(i) {
            script.push_str("  - ask_human: {prompt: \"Go on with ${task}?\"}\n");
        }
        script.push_str(&format!(
            "  - tool: step\n    args: {{label: \"${{run_id}}-{}\", secs: \"{secs}\"}}\n",
            i + 1
        ));
    }
    if ask_after == Some(steps.len()) {
        script.push_str("  - ask_human: {prompt: \"Go on with ${task}?\"}\n");
    }
    script.push_str("  - finish: done\n");
    (config, script)
}

/// The side effects of `step` tools so far: for each step label, the pids of the workers that
/// started it, in order.
#[derive(Debug, Default)]
pub struct Effects(pub HashMap<String, Vec<u32>>);

impl Effects {
    /// Reads `<work_root>/<run_id>/effects` of every run. A step labelled `<run_id>-<n>` must
    /// have left its effect in its own run's directory: one found in another's fails the test.
    pub fn read(work_root: &Path) -> Self {
        let mut map: HashMap<String, Vec<u32>> = HashMap::new();
        for (run_dir, text) in crate::run_files(work_root, "effects") {
            for line in text.lines() {
                let mut parts = line.split_whitespace();
                if let (Some(label), Some(pid)) = (parts.next(), parts.next()) {
                    if let Some((run, _step)) = label.rsplit_once('-')
                        && run.parse::<delta_protocol::RunId>().is_ok()
                    {
                        assert_eq!(
                            run, run_dir,
                            "step {label} left its effect in another run's work directory"
                        );
                    }
                    map.entry(label.to_owned())
                        .or_default()
                        .push(pid.parse().unwrap_or(0));
                }
            }
        }
        Self(map)
    }

    /// How many times the step `label` started.
    pub fn count(&self, label: &str) -> usize {
        self.0.get(label).map_or(0, Vec::len)
    }

    /// Every start, of every step.
    pub fn total(&self) -> usize {
        self.0.values().map(Vec::len).sum()
    }
}

/// What a scenario expects of each of its runs.
#[derive(Clone, Debug)]
pub struct Expect {
    /// The terminal status each run must end with.
    pub status: RunStatus,
    /// How many questions each run asked and had answered (`None`: not checked).
    pub questions: Option<usize>,
    /// The tool whose executions are counted against the effects file, if any.
    pub counted_tool: Option<&'static str>,
}

/// What the checker found.
#[derive(Debug, Default)]
pub struct Tally {
    pub runs: usize,
    /// Runs missing, not terminal, or ended otherwise than expected.
    pub lost: usize,
    /// Second results, second answers, steps executed past their checkpoint.
    pub duplicated: usize,
    /// Unfinished idempotent steps run again (allowed, and journaled).
    pub reruns: usize,
    /// Of `duplicated`: steps requested or resulted twice, or executed past their checkpoint.
    pub steps_twice: usize,
    /// Of `duplicated`: questions answered (`HUMAN_INPUT_RECEIVED`) more than once.
    pub answers_twice: usize,
    /// What was wrong, one line each.
    pub problems: Vec<String>,
}

impl Tally {
    /// Adds a problem that counts as neither lost nor duplicated (a wrong code, a leak…).
    pub fn problem(&mut self, p: impl Into<String>) {
        self.problems.push(p.into());
    }
}

/// Reads the whole events stream (`<P>_INTERACTIONS`) of the fleet at `nats_url` and checks,
/// for each run of `ids`, that its events, duplicates (same `id`) dropped, are exactly `expect`
/// (short names, e.g. `interaction.requested`, `interaction.answered`, `run.completed`) in
/// that order; each difference is a problem. Returns how many events announced twice were seen.
///
/// A run whose events so far are the start of `expect` may still be announcing the rest: a
/// worker killed after a run's last write and before its announcement leaves that to the job's
/// next delivery, an `ack_wait` later. The stream is read again (for up to 30 s) until every
/// run's events are whole, or one is wrong.
pub async fn check_events(
    nats_url: &str,
    prefix: &str,
    ids: &[RunId],
    expect: &[&str],
    t: &mut Tally,
) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (mut by_run, twice) = match read_events(nats_url, prefix).await {
            Ok(read) => read,
            Err(p) => {
                t.problem(p);
                return 0;
            }
        };
        let wrong: Vec<(RunId, Vec<String>)> = ids
            .iter()
            .filter_map(|id| {
                let got = by_run.remove(&id.to_string()).unwrap_or_default();
                (got != expect).then_some((*id, got))
            })
            .collect();
        let only_late = wrong.iter().all(|(_, got)| {
            got.len() < expect.len() && got.iter().zip(expect).all(|(g, e)| g == e)
        });
        if wrong.is_empty() || !only_late || Instant::now() > deadline {
            for (id, got) in wrong {
                t.problem(format!("run {id}: events {got:?}, expected {expect:?}"));
            }
            return twice;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Every run's event types (short names) in the events stream, duplicates (same `id`) dropped,
/// and how many duplicates there were; or why the stream could not be read.
async fn read_events(
    nats_url: &str,
    prefix: &str,
) -> Result<(HashMap<String, Vec<String>>, usize), String> {
    use futures_util::StreamExt;
    let js = async_nats::jetstream::new(crate::nats_client(nats_url).await);
    let stream = js
        .get_stream(format!("{}_INTERACTIONS", prefix.to_uppercase()))
        .await
        .map_err(|e| format!("the events stream: {e}"))?;
    let total = stream
        .get_info()
        .await
        .map(|i| i.state.messages)
        .unwrap_or(0);
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig::default())
        .await
        .map_err(|_| "the events stream: no consumer".to_owned())?;
    let mut messages = consumer
        .messages()
        .await
        .map_err(|_| "the events stream: no messages".to_owned())?;
    let mut seen = std::collections::HashSet::new();
    let mut twice = 0;
    let mut by_run: HashMap<String, Vec<String>> = HashMap::new();
    for _ in 0..total {
        let Ok(Some(Ok(m))) = tokio::time::timeout(Duration::from_secs(5), messages.next()).await
        else {
            return Err("the events stream ended early".into());
        };
        let Ok(e) = delta_protocol::events::decode::<Value>(&m.payload) else {
            return Err(format!("not a CloudEvent on {}", m.subject));
        };
        if !seen.insert(e.id.clone()) {
            twice += 1;
            continue;
        }
        let name = e.ty.trim_start_matches("dev.delta.").to_owned();
        by_run.entry(e.deltarun.to_string()).or_default().push(name);
    }
    Ok((by_run, twice))
}

/// Loads a run, riding out a store that is restarting (20 s).
pub async fn load(store: &RedisRunStore, id: RunId) -> Result<StoredRun, String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match store.load(id).await {
            Ok(r) => return Ok(r),
            Err(delta_store::Error::NotFound(_)) => {
                return Err(format!("run {id}: missing"));
            }
            Err(e) if Instant::now() > deadline => return Err(format!("run {id}: {e}")),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// How many runs of `ids` are terminal now (0 while the store is unreachable).
pub async fn terminal(store: &RedisRunStore, ids: &[RunId]) -> usize {
    let mut n = 0;
    for chunk in ids.chunks(500) {
        match store.statuses(chunk).await {
            Ok(s) => n += s.iter().flatten().filter(|s| s.is_terminal()).count(),
            Err(_) => return 0,
        }
    }
    n
}

/// Waits until every run in `ids` is terminal (or `within` passes): how many are.
pub async fn wait_terminal(store: &RedisRunStore, ids: &[RunId], within: Duration) -> usize {
    let deadline = Instant::now() + within;
    loop {
        let done = terminal(store, ids).await;
        if done == ids.len() || Instant::now() > deadline {
            return done;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Reads every run's journal and checks it (see the module's doc).
pub async fn check_runs(
    store: &RedisRunStore,
    ids: &[RunId],
    expect: &Expect,
    effects: &Effects,
) -> Tally {
    let mut t = Tally {
        runs: ids.len(),
        ..Tally::default()
    };
    for &id in ids {
        match load(store, id).await {
            Ok(run) => check_run(&run, expect, effects, &mut t),
            Err(e) => {
                t.lost += 1;
                t.problems.push(e);
            }
        }
    }
    t
}

/// Checks one run's journal into `t`.
pub fn check_run(run: &StoredRun, expect: &Expect, effects: &Effects, t: &mut Tally) {
    let id = run.record.run_id;
    let status = run.record.status;
    if status != expect.status {
        t.lost += 1;
        t.problems.push(format!(
            "run {id} is {status}, expected {} (error: {:?})",
            expect.status, run.record.error
        ));
    }
    for (i, e) in run.journal.iter().enumerate() {
        if e.seq != i as u64 + 1 {
            t.problems.push(format!(
                "run {id}: journal entry {} has seq {} (a gap or a repeat)",
                i + 1,
                e.seq
            ));
            break;
        }
    }
    if status.is_terminal() {
        match run.journal.last().map(|e| &e.event) {
            Some(Event::EngineEnd(end)) if end.status == status => {}
            other => t.problems.push(format!(
                "run {id} is {status} but its journal ends with {:?}",
                other.map(Event::type_name)
            )),
        }
    }
    let mut requested: HashMap<&str, usize> = HashMap::new();
    let mut resulted: HashMap<&str, usize> = HashMap::new();
    let mut asked: Vec<String> = vec![];
    let mut received: HashMap<String, usize> = HashMap::new();
    let mut reran: HashMap<String, usize> = HashMap::new();
    for e in &run.journal {
        match &e.event {
            Event::ActionRequest(a) => *requested.entry(&a.action_id).or_default() += 1,
            Event::ActionResult(r) => *resulted.entry(&r.action_id).or_default() += 1,
            Event::HumanInputRequest(q) => {
                let rid = q.request_id.to_string();
                if !asked.contains(&rid) {
                    asked.push(rid);
                }
            }
            Event::HumanInputReceived(h) => {
                *received.entry(h.request_id.to_string()).or_default() += 1;
            }
            Event::SystemMessage(m) => {
                if let Some(rest) = m.content.strip_prefix("re-running interrupted action ") {
                    let action = rest.split_whitespace().next().unwrap_or("");
                    *reran.entry(action.to_owned()).or_default() += 1;
                }
            }
            _ => {}
        }
    }
    for (action, n) in requested.iter().filter(|(_, n)| **n > 1) {
        t.duplicated += n - 1;
        t.steps_twice += n - 1;
        t.problems
            .push(format!("run {id}: step {action} requested {n} times"));
    }
    for (action, n) in resulted.iter().filter(|(_, n)| **n > 1) {
        t.duplicated += n - 1;
        t.steps_twice += n - 1;
        t.problems
            .push(format!("run {id}: step {action} has {n} results"));
    }
    for rid in &asked {
        let n = received.get(rid).copied().unwrap_or(0);
        if n > 1 {
            t.duplicated += n - 1;
            t.answers_twice += n - 1;
            t.problems
                .push(format!("run {id}: question {rid} answered {n} times"));
        } else if n == 0 && status == RunStatus::Completed {
            t.problems.push(format!(
                "run {id}: question {rid} never answered, yet the run completed"
            ));
        }
    }
    if let Some(q) = expect.questions
        && asked.len() != q
    {
        t.problems.push(format!(
            "run {id}: {} questions asked, expected {q}",
            asked.len()
        ));
    }
    let Some(tool) = expect.counted_tool else {
        return;
    };
    for e in &run.journal {
        let Event::ActionRequest(a) = &e.event else {
            continue;
        };
        if a.tool != tool {
            continue;
        }
        let label = a.args["label"].as_str().unwrap_or_default();
        let ran = effects.count(label);
        let allowed = 1 + reran.get(&a.action_id).copied().unwrap_or(0);
        t.reruns += allowed - 1;
        if ran > allowed {
            t.duplicated += ran - allowed;
            t.steps_twice += ran - allowed;
            t.problems.push(format!(
                "run {id}: step {} ({label}) ran {ran} times, {allowed} journaled: executed past its checkpoint",
                a.action_id
            ));
        }
        if ran == 0 && resulted.contains_key(a.action_id.as_str()) {
            t.problems.push(format!(
                "run {id}: step {} ({label}) has a result but never ran",
                a.action_id
            ));
        }
    }
}

/// Polls `done` every 50 ms until it holds; fails the test with `what` after `within`.
pub async fn wait_until<F, Fut>(what: &str, within: Duration, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What a [`Human`] did.
#[derive(Debug, Default)]
pub struct HumanStats {
    /// Answers accepted (`200`).
    pub accepted: AtomicUsize,
    /// Answers refused with a 4xx (they should not be: the human answers each question once,
    /// and again identically).
    pub refused: AtomicUsize,
    /// Answers that did not get through (`503`, connection errors) and were tried again.
    pub retried: AtomicUsize,
    /// Of `accepted`: those given as a bot over NATS ([`Human::start_with_bot`]).
    pub over_nats: AtomicUsize,
    /// Every answer accepted: `(run id, request id)`, once each.
    pub answered: Mutex<Vec<(String, String)>>,
    /// Every refusal: `<code> <request id>` (the HTTP status over HTTP, the code over NATS).
    pub refusals: Mutex<Vec<String>>,
}

/// A person answering every question over HTTP as soon as it appears: it follows
/// `GET /v1/interactions/stream` (reconnecting with `Last-Event-ID`) and, in case the stream
/// was down when a question came, reads the pending list every second. Each question is
/// answered with the body `answer` makes from the request; an answer that did not get through
/// is tried again, identically (so a second try is acknowledged, never a second answer).
pub struct Human {
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    pub stats: Arc<HumanStats>,
}

type AnswerFn = dyn Fn(&Value) -> Value + Send + Sync;

impl Human {
    pub fn start(client: Client, answer: impl Fn(&Value) -> Value + Send + Sync + 'static) -> Self {
        Self::start_on(client, None, answer)
    }

    /// As [`Human::start`], but about half the questions (by their id) are answered as a bot
    /// over NATS instead, on `<prefix>.interactions.respond.<request id>` through `bot` (a
    /// question's tries all go by the same channel, so a retry is always the same answer).
    pub fn start_with_bot(
        client: Client,
        bot: async_nats::Client,
        prefix: &str,
        answer: impl Fn(&Value) -> Value + Send + Sync + 'static,
    ) -> Self {
        Self::start_on(client, Some((bot, prefix.to_owned())), answer)
    }

    fn start_on(
        client: Client,
        bot: Option<(async_nats::Client, String)>,
        answer: impl Fn(&Value) -> Value + Send + Sync + 'static,
    ) -> Self {
        let stop = CancellationToken::new();
        let stats = Arc::new(HumanStats::default());
        let answer: Arc<AnswerFn> = Arc::new(answer);
        let done: Arc<Mutex<std::collections::HashSet<String>>> = Arc::default();
        let ctx = HumanCtx {
            client,
            bot,
            answer,
            done,
            stats: stats.clone(),
        };
        let live = {
            let (ctx, stop) = (ctx.clone(), stop.clone());
            tokio::spawn(async move { ctx.follow(stop).await })
        };
        let poll = {
            let (ctx, stop) = (ctx.clone(), stop.clone());
            tokio::spawn(async move { ctx.poll(stop).await })
        };
        Self {
            stop,
            tasks: vec![live, poll],
            stats,
        }
    }

    /// Stops answering.
    pub async fn stop(self) -> Arc<HumanStats> {
        self.stop.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
        self.stats
    }
}

/// What became of one try at answering.
enum Answered {
    Accepted,
    /// Refused for good, with the HTTP status (over HTTP) or the code (over NATS).
    Refused(String),
    /// Not through (a server down, no reply): to be tried again.
    Again,
}

#[derive(Clone)]
struct HumanCtx {
    client: Client,
    /// A bot's NATS client and the fleet's prefix: half the questions are answered there.
    bot: Option<(async_nats::Client, String)>,
    answer: Arc<AnswerFn>,
    /// Questions answered (accepted or settled): never answered again.
    done: Arc<Mutex<std::collections::HashSet<String>>>,
    stats: Arc<HumanStats>,
}

impl HumanCtx {
    async fn follow(&self, stop: CancellationToken) {
        let mut last: Option<u64> = None;
        while !stop.is_cancelled() {
            let Ok(mut sse) = self.client.sse("/v1/interactions/stream", last).await else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            if sse.status() != 200 {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            loop {
                let ev = tokio::select! {
                    ev = sse.next(Duration::from_secs(30)) => ev,
                    () = stop.cancelled() => return,
                };
                let Some(ev) = ev else { break };
                if let Some(id) = ev.id.as_deref().and_then(|i| i.parse().ok()) {
                    last = Some(id);
                }
                if ev.event == "requested"
                    && let Ok(q) = serde_json::from_str::<Value>(&ev.data)
                {
                    let me = self.clone();
                    tokio::spawn(async move { me.answer_one(&q).await });
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn poll(&self, stop: CancellationToken) {
        while !stop.is_cancelled() {
            if let Ok((200, body)) = self
                .client
                .get("/v1/interactions?state=pending&limit=500")
                .await
            {
                for ix in body["interactions"].as_array().into_iter().flatten() {
                    self.answer_one(&ix["request"]).await;
                }
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
                () = stop.cancelled() => return,
            }
        }
    }

    async fn answer_one(&self, q: &Value) {
        let Some(rid) = q["request_id"].as_str() else {
            return;
        };
        if self
            .done
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(rid)
        {
            return;
        }
        let body = (self.answer)(q);
        let bot = self
            .bot
            .as_ref()
            .filter(|_| rid.bytes().last().is_some_and(|b| b % 2 == 1));
        let outcome = match bot {
            Some((nc, prefix)) => Self::over_nats(nc, prefix, rid, &body).await,
            None => {
                let path = format!("/v1/interactions/{rid}/response");
                match self.client.post(&path, &body).await {
                    Ok((200, _)) => Answered::Accepted,
                    Ok((status, _)) if (400..500).contains(&status) => {
                        Answered::Refused(status.to_string())
                    }
                    _ => Answered::Again,
                }
            }
        };
        match outcome {
            Answered::Accepted => {
                self.stats.accepted.fetch_add(1, Ordering::Relaxed);
                if bot.is_some() {
                    self.stats.over_nats.fetch_add(1, Ordering::Relaxed);
                }
                let run = q["run_id"].as_str().unwrap_or_default().to_owned();
                let mut answered = self
                    .stats
                    .answered
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                if !answered.iter().any(|(_, r)| r == rid) {
                    answered.push((run, rid.to_owned()));
                }
                drop(answered);
                self.settle(rid);
            }
            Answered::Refused(code) => {
                self.stats.refused.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .refusals
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(format!("{code} {rid}"));
                self.settle(rid);
            }
            Answered::Again => {
                self.stats.retried.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// A bot's answer over NATS request-reply: `{"ok": true}` is accepted, `unavailable` or no
    /// reply in 5 s is tried again, any other refusal settles the question.
    async fn over_nats(nc: &async_nats::Client, prefix: &str, rid: &str, body: &Value) -> Answered {
        let reply = tokio::time::timeout(
            Duration::from_secs(5),
            nc.request(
                format!("{prefix}.interactions.respond.{rid}"),
                body.to_string().into_bytes().into(),
            ),
        )
        .await;
        let Ok(Ok(msg)) = reply else {
            return Answered::Again;
        };
        let Ok(v) = serde_json::from_slice::<Value>(&msg.payload) else {
            return Answered::Again;
        };
        match (v["ok"].as_bool(), v["error"]["code"].as_str()) {
            (Some(true), _) => Answered::Accepted,
            (_, Some("unavailable")) | (_, None) => Answered::Again,
            (_, Some(code)) => Answered::Refused(code.to_owned()),
        }
    }

    fn settle(&self, rid: &str) {
        self.done
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(rid.to_owned());
    }
}

/// The answer a plain human gives: the first option that does not end the run, or "yes".
pub fn plain_answer(q: &Value) -> Value {
    let options = q["options"].as_array().cloned().unwrap_or_default();
    match options
        .iter()
        .find(|o| o["action"] != "TERMINATE" && o["requires_input"] != true)
    {
        Some(o) => json!({"option_id": o["option_id"], "responder": {"id": "human"}}),
        None => json!({"input": "yes", "responder": {"id": "human"}}),
    }
}

// -- the summary table -------------------------------------------------------------------------

/// One line of the summary table.
#[derive(Clone, Debug)]
pub struct Row {
    /// Sorts the table (the scenario's number).
    pub order: usize,
    pub scenario: String,
    pub runs: usize,
    pub lost: usize,
    pub duplicated: usize,
    /// What the system refused, as it should: bad answers, stale writes, poison jobs…
    pub refused: usize,
    pub passed: bool,
    /// What was done to the fleet (kills, restarts, seed…).
    pub notes: String,
}

static ROWS: Mutex<Vec<Row>> = Mutex::new(Vec::new());
static RUNNING: AtomicUsize = AtomicUsize::new(0);

/// One scenario in progress: its row is recorded when it reports, or as failed if it panics
/// first. When no other scenario of this process is running, the table is printed to stderr.
/// Every row is also written to `<target dir>/chaos-summary.txt`, with the last rows of the
/// other chaos programs (see `merged`).
pub struct Scenario {
    order: usize,
    name: String,
    reported: bool,
}

impl Scenario {
    pub fn begin(order: usize, name: &str) -> Self {
        RUNNING.fetch_add(1, Ordering::SeqCst);
        Self {
            order,
            name: name.to_owned(),
            reported: false,
        }
    }

    /// Records the scenario's row from what the checker found, then fails the test with every
    /// problem, if there are any.
    pub fn report(mut self, tally: &Tally, refused: usize, notes: &str) {
        let passed = tally.problems.is_empty() && tally.lost == 0 && tally.duplicated == 0;
        record(Row {
            order: self.order,
            scenario: self.name.clone(),
            runs: tally.runs,
            lost: tally.lost,
            duplicated: tally.duplicated,
            refused,
            passed,
            notes: notes.to_owned(),
        });
        self.reported = true;
        let shown: Vec<&String> = tally.problems.iter().take(30).collect();
        assert!(
            passed,
            "{}: {} lost, {} duplicated, {} problems:\n{}",
            self.name,
            tally.lost,
            tally.duplicated,
            tally.problems.len(),
            shown
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        if !self.reported {
            record(Row {
                order: self.order,
                scenario: self.name.clone(),
                runs: 0,
                lost: 0,
                duplicated: 0,
                refused: 0,
                passed: false,
                notes: "stopped before its checks (see the test's failure)".into(),
            });
        }
        if RUNNING.fetch_sub(1, Ordering::SeqCst) == 1 {
            let table = table();
            eprintln!("\n{table}");
        }
    }
}

fn record(row: Row) {
    let mut rows = ROWS.lock().unwrap_or_else(|p| p.into_inner());
    rows.retain(|r| r.scenario != row.scenario);
    rows.push(row);
    rows.sort_by_key(|r| r.order);
    let text = merged(&rows);
    drop(rows);
    let _ = std::fs::write(summary_path(), text);
}

/// The name of this test program without cargo's hash (`chaos`, `chaos_cluster`).
fn program() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|stem| match stem.rsplit_once('-') {
            Some((name, _hash)) => name.to_owned(),
            None => stem,
        })
        .unwrap_or_default()
}

/// The table of `rows` with the rows the other chaos programs (`tests/tests/chaos*.rs`) recorded
/// last in `<target dir>/chaos-summary.json`, which it updates: each program's scenarios appear
/// in the one summary, whichever ran last. A program run in the other form than this one has
/// its form in its rows' notes.
fn merged(rows: &[Row]) -> String {
    let json_path = summary_path().with_extension("json");
    let mut all: serde_json::Map<String, Value> = std::fs::read_to_string(&json_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    let form = if long() { "long" } else { "short" };
    let ours: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({"order": r.order, "scenario": r.scenario, "runs": r.runs, "lost": r.lost,
                "duplicated": r.duplicated, "refused": r.refused, "passed": r.passed,
                "notes": r.notes})
        })
        .collect();
    all.insert(program(), json!({"form": form, "rows": ours}));
    let _ = std::fs::write(&json_path, Value::Object(all.clone()).to_string());
    let mut merged: Vec<Row> = vec![];
    for entry in all.values() {
        let their_form = entry["form"].as_str().unwrap_or(form);
        for r in entry["rows"].as_array().into_iter().flatten() {
            let n = |k: &str| r[k].as_u64().unwrap_or(0) as usize;
            let mut notes = r["notes"].as_str().unwrap_or_default().to_owned();
            if their_form != form {
                notes = format!("[{their_form} form] {notes}");
            }
            merged.push(Row {
                order: n("order"),
                scenario: r["scenario"].as_str().unwrap_or_default().to_owned(),
                runs: n("runs"),
                lost: n("lost"),
                duplicated: n("duplicated"),
                refused: n("refused"),
                passed: r["passed"].as_bool().unwrap_or(false),
                notes,
            });
        }
    }
    merged.sort_by_key(|r| r.order);
    render(&merged)
}

/// The table of every scenario reported so far in this process.
pub fn table() -> String {
    render(&ROWS.lock().unwrap_or_else(|p| p.into_inner()))
}

fn render(rows: &[Row]) -> String {
    let form = if long() { "long" } else { "short" };
    let mut out = format!(
        "chaos summary ({form} form)\n{:<34} {:>6} {:>5} {:>10} {:>8} {:>6}  notes\n",
        "scenario", "runs", "lost", "duplicated", "refused", "passed"
    );
    for r in rows {
        out.push_str(&format!(
            "{:<34} {:>6} {:>5} {:>10} {:>8} {:>6}  {}\n",
            r.scenario,
            r.runs,
            r.lost,
            r.duplicated,
            r.refused,
            if r.passed { "yes" } else { "NO" },
            r.notes
        ));
    }
    out
}

/// `<target dir>/chaos-summary.txt` (the target dir found from the test binary's path, so it
/// follows `CARGO_TARGET_DIR`).
pub fn summary_path() -> PathBuf {
    // <target>/debug/deps/<test binary>
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.ancestors().nth(3).map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"))
        .join("chaos-summary.txt")
}

// -- answers the human was told were accepted -------------------------------------------------

/// Checks that every answer a [`Human`] was told was accepted (`answered`: `(run id, request
/// id)`, as [`HumanStats::answered`] lists them) reached its run: the run's journal holds a
/// `HUMAN_INPUT_RECEIVED` for that request. One that is missing is an answer lost (a problem in
/// `t`, and the count returned); a second one is counted by [`check_run`] already.
pub async fn check_answers(
    store: &RedisRunStore,
    answered: &[(String, String)],
    t: &mut Tally,
) -> usize {
    let mut lost = 0;
    for (run, rid) in answered {
        let Ok(id) = run.parse::<RunId>() else {
            t.problem(format!(
                "answer to {rid}: its question named no run ({run:?})"
            ));
            continue;
        };
        let received = match load(store, id).await {
            Ok(r) => r
                .journal
                .iter()
                .filter(|e| {
                    matches!(&e.event, Event::HumanInputReceived(h) if h.request_id.to_string() == *rid)
                })
                .count(),
            Err(e) => {
                t.problem(e);
                continue;
            }
        };
        if received == 0 {
            lost += 1;
            t.problem(format!(
                "run {id}: the answer to {rid} was accepted but the run never applied it (lost)"
            ));
        }
    }
    lost
}

#[cfg(test)]
mod tests {
    use super::*;
    use delta_protocol::{
        ActionRequest, ActionResult, ActionStatus, EngineEnd, EngineStart, HumanInputReceived,
        InteractionRequest, InteractionType, JournalEvent, MessageLevel, OptionAction, Responder,
        SystemMessage, Timestamp,
    };
    use delta_store::RunRecord;

    const EXPECT: Expect = Expect {
        status: RunStatus::Completed,
        questions: Some(1),
        counted_tool: Some("step"),
    };

    fn start(id: RunId, worker: &str) -> Event {
        Event::EngineStart(EngineStart {
            run_id: id,
            agent: "chaos".into(),
            task: "t".into(),
            worker: worker.into(),
            attempt: 1,
        })
    }

    fn request(action: &str, label: &str) -> Event {
        Event::ActionRequest(ActionRequest {
            action_id: action.into(),
            tool: "step".into(),
            args: json!({"label": label, "secs": "0"}),
        })
    }

    fn result(action: &str) -> Event {
        Event::ActionResult(ActionResult {
            action_id: action.into(),
            status: ActionStatus::Success,
            observation_content: "done".into(),
            exit_code: Some(0),
            duration_ms: 1,
        })
    }

    fn rerun(action: &str) -> Event {
        Event::SystemMessage(SystemMessage {
            level: MessageLevel::Info,
            content: format!("re-running interrupted action {action} (`step` is idempotent)"),
        })
    }

    /// A completed run: step 1, a question and its answer(s), step 2, with `extra` events
    /// inserted after step 1's request.
    fn run(extra: Vec<Event>, answers: usize) -> StoredRun {
        let id = RunId::new();
        let q = InteractionRequest::new(id, "chaos", InteractionType::UserInput, "Go on?");
        let answer = Event::HumanInputReceived(HumanInputReceived {
            request_id: q.request_id,
            option_id: None,
            action: OptionAction::ProvideInfo,
            responder: Responder {
                id: "human".into(),
                via: delta_protocol::Via::Http,
                on_behalf_of: None,
                relayed_by: None,
            },
            input: Some("yes".into()),
            data: None,
            feedback: None,
            edited_args: None,
            request_hash: None,
        });
        let mut events = vec![start(id, "w0"), request("a1-1", &format!("{id}-1"))];
        events.extend(extra);
        events.push(result("a1-1"));
        events.push(Event::HumanInputRequest(Box::new(q)));
        events.extend(std::iter::repeat_n(answer, answers));
        events.push(request("a2-1", &format!("{id}-2")));
        events.push(result("a2-1"));
        events.push(Event::EngineEnd(EngineEnd {
            status: RunStatus::Completed,
            result: Some("done".into()),
            error: None,
        }));
        let journal = events
            .into_iter()
            .enumerate()
            .map(|(i, event)| JournalEvent {
                seq: i as u64 + 1,
                timestamp: Timestamp::now(),
                event,
            })
            .collect();
        StoredRun::whole(
            RunRecord::new(id, "chaos", "t", RunStatus::Completed),
            journal,
        )
    }

    fn effects(run: &StoredRun, starts: [usize; 2]) -> Effects {
        let id = run.record.run_id;
        let mut e = Effects::default();
        for (step, n) in starts.iter().enumerate() {
            e.0.insert(format!("{id}-{}", step + 1), vec![42; *n]);
        }
        e
    }

    fn check(run: &StoredRun, e: &Effects) -> Tally {
        let mut t = Tally::default();
        check_run(run, &EXPECT, e, &mut t);
        t
    }

    #[test]
    fn a_clean_run_passes() {
        let r = run(vec![], 1);
        let t = check(&r, &effects(&r, [1, 1]));
        assert!(t.problems.is_empty(), "{:?}", t.problems);
        assert_eq!((t.lost, t.duplicated, t.reruns), (0, 0, 0));
    }

    #[test]
    fn a_step_run_again_without_a_journaled_rerun_ran_past_its_checkpoint() {
        let r = run(vec![], 1);
        let t = check(&r, &effects(&r, [1, 2]));
        assert_eq!(t.duplicated, 1, "{:?}", t.problems);
    }

    #[test]
    fn an_unfinished_step_rerun_as_journaled_is_allowed_once() {
        let r = run(vec![start(RunId::new(), "w1"), rerun("a1-1")], 1);
        let t = check(&r, &effects(&r, [2, 1]));
        assert!(t.problems.is_empty(), "{:?}", t.problems);
        assert_eq!(t.reruns, 1);
        let t = check(&r, &effects(&r, [3, 1]));
        assert_eq!(t.duplicated, 1, "a third start is one too many");
    }

    #[test]
    fn second_answers_and_results_are_duplicates() {
        let r = run(vec![], 2);
        let t = check(&r, &effects(&r, [1, 1]));
        assert_eq!((t.duplicated, t.answers_twice, t.steps_twice), (1, 1, 0));
        let r = run(vec![result("a1-1")], 1);
        let t = check(&r, &effects(&r, [1, 1]));
        assert_eq!((t.duplicated, t.answers_twice, t.steps_twice), (1, 0, 1));
        let t = check(&r, &effects(&r, [2, 1]));
        assert_eq!(t.steps_twice, 2, "a second result and a second start");
    }

    #[test]
    fn gaps_wrong_statuses_and_unanswered_questions_are_reported() {
        let mut r = run(vec![], 0);
        r.journal[3].seq = 9;
        let t = check(&r, &effects(&r, [1, 1]));
        assert!(t.problems.iter().any(|p| p.contains("never answered")));
        assert!(t.problems.iter().any(|p| p.contains("a gap")));
        r.record.status = RunStatus::Failed;
        let t = check(&r, &effects(&r, [1, 1]));
        assert_eq!(t.lost, 1);
    }
}
