//! The engine over Redis writes the same journal as over local files.

use delta_engine::agent::Agent;
use delta_engine::brain::AnyBrain;
use delta_engine::engine::{Engine, Outcome, PauseMode, Settings};
use delta_protocol::{Event, InteractionResponse, JournalEvent, Responder, RunId, RunStatus, Via};
use delta_store::file::FileRunStore;
use delta_store::redis::RedisRunStore;
use delta_store::{RunRecord, RunStore};
use tokio_util::sync::CancellationToken;

/// A new run of `agent` with `task`, advanced by a first engine to its first pause: its id,
/// the question and the engine's settings.
async fn to_first_pause<S: RunStore>(
    store: &S,
    agent: &Agent,
    brain: &AnyBrain,
    task: &str,
    work: &std::path::Path,
) -> (RunId, delta_protocol::InteractionRequest, Settings) {
    let rec = RunRecord::new(RunId::new(), agent.name(), task, RunStatus::Queued);
    let id = rec.run_id;
    store.create(rec).await.expect("create");
    let settings = Settings {
        worker: "w1".into(),
        work_dir: work.to_path_buf(),
        pause: PauseMode::Park,
    };
    let run = store.load(id).await.expect("load");
    let out = Engine::new(
        agent,
        brain,
        store,
        run,
        settings.clone(),
        CancellationToken::new(),
    )
    .advance(None)
    .await
    .expect("advance");
    let Outcome::Paused(q) = out else {
        panic!("expected a pause, got {out:?}")
    };
    (id, *q, settings)
}

async fn run_hello<S: RunStore>(
    store: &S,
    agent: &Agent,
    work: &std::path::Path,
) -> Vec<JournalEvent> {
    let brain = AnyBrain::for_agent(agent).expect("brain");
    let (id, q, settings) = to_first_pause(store, agent, &brain, "say hi", work).await;
    // Resumed by a fresh engine, as another worker would.
    let run = store.load(id).await.expect("load");
    assert_eq!(run.record.status, RunStatus::WaitingForInput);
    let mut answer = InteractionResponse::new(
        q.request_id,
        Responder {
            id: "alice".into(),
            via: Via::Http,
            on_behalf_of: None,
            relayed_by: None,
        },
    );
    answer.input = Some("Ada".into());
    let out = Engine::new(
        agent,
        &brain,
        store,
        run,
        settings,
        CancellationToken::new(),
    )
    .advance(Some(answer))
    .await
    .expect("advance");
    assert_eq!(
        out,
        Outcome::Completed {
            result: "Greeted Ada.".into()
        }
    );
    store.load(id).await.expect("load").journal
}

#[tokio::test]
async fn the_engine_writes_the_same_journal_to_redis_as_to_files() {
    let redis = delta_e2e::Redis::start().expect("redis-server");
    let agent = Agent::load(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/agents/hello"),
    )
    .expect("agent");
    let work = tempfile::tempdir().expect("tmp");
    let on_redis = run_hello(
        &RedisRunStore::connect(&redis.url(), "eq")
            .await
            .expect("connect"),
        &agent,
        work.path(),
    )
    .await;
    let on_files = run_hello(
        &FileRunStore::new(work.path().join(".delta")),
        &agent,
        work.path(),
    )
    .await;
    assert_eq!(
        delta_e2e::journal_shape(&on_redis),
        delta_e2e::journal_shape(&on_files)
    );
    assert!(
        on_redis
            .iter()
            .any(|e| matches!(e.event, Event::HumanInputReceived(_)))
    );
}

/// The questions an engine asks on Redis get request ids in their run's bucket, so an answer
/// finds its run by asking that one bucket; and the run is found.
#[tokio::test]
async fn questions_on_redis_get_ids_in_their_runs_bucket() {
    let redis = delta_e2e::Redis::start().expect("redis-server");
    let agent = Agent::load(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/agents/hello"),
    )
    .expect("agent");
    let work = tempfile::tempdir().expect("tmp");
    let store = RedisRunStore::connect(&redis.url(), "rb")
        .await
        .expect("connect");
    for _ in 0..5 {
        let journal = run_hello(&store, &agent, work.path()).await;
        let q = journal
            .iter()
            .find_map(|e| match &e.event {
                Event::HumanInputRequest(q) => Some(q.clone()),
                _ => None,
            })
            .expect("a question");
        assert_eq!(
            delta_store::redis::bucket_of(&q.request_id.to_string(), store.buckets()),
            store.bucket(q.run_id),
            "request {} of run {}",
            q.request_id,
            q.run_id
        );
        assert_eq!(
            store.interaction_run(q.request_id).await.expect("lookup"),
            Some(q.run_id)
        );
    }
}

/// A scripted agent whose runs think `thoughts` times, ask a colour, branch on it and finish.
fn long_agent(dir: &std::path::Path, thoughts: usize) -> Agent {
    std::fs::write(
        dir.join("config.yaml"),
        "name: long\nbrain: scripted\nmax_iterations: 100000\ntools:\n  - name: echo\n    builtin: echo\n",
    )
    .expect("config");
    let mut script = String::from("steps:\n  - tool: echo\n    args: {text: first}\n");
    for i in 0..thoughts {
        script.push_str(&format!("  - think: \"thought {i} on ${{observation}}\"\n"));
    }
    script.push_str(
        "  - ask_human:\n      prompt: \"colour?\"\n      options: [{id: red, label: Red}, {id: blue, label: Blue}]\n  - branch:\n      red:\n        - tool: echo\n          args: {text: \"went red after ${observation}\"}\n      default:\n        - fail: \"not red\"\n  - finish: \"done ${observation}\"\n",
    );
    std::fs::write(dir.join("script.yaml"), script).expect("script");
    Agent::load(dir).expect("agent")
}

/// A Redis, a work directory, the long agent of `thoughts` thoughts (scripted) and its brain, and
/// a store on namespace `ns`: what the tests of a long run on Redis start from.
struct Long {
    redis: delta_e2e::Redis,
    dir: tempfile::TempDir,
    agent: Agent,
    brain: AnyBrain,
    store: RedisRunStore,
}

async fn long_run_on_redis(ns: &str, thoughts: usize) -> Long {
    let redis = delta_e2e::Redis::start().expect("redis-server");
    let dir = tempfile::tempdir().expect("tmp");
    let agent_dir = dir.path().join("long");
    std::fs::create_dir_all(&agent_dir).expect("mkdir");
    let agent = long_agent(&agent_dir, thoughts);
    let brain = AnyBrain::for_agent(&agent).expect("brain");
    let store = RedisRunStore::connect(&redis.url(), ns)
        .await
        .expect("connect");
    Long {
        redis,
        dir,
        agent,
        brain,
        store,
    }
}

fn red(q: &delta_protocol::InteractionRequest) -> InteractionResponse {
    let mut a = InteractionResponse::new(
        q.request_id,
        Responder {
            id: "alice".into(),
            via: Via::Http,
            on_behalf_of: None,
            relayed_by: None,
        },
    );
    a.option_id = Some("red".into());
    a
}

/// What a test does to a stored snapshot (`<seq>:<json>`) of a run whose whole journal is given:
/// `None` deletes it.
type Prepare = dyn Fn(&str, &[JournalEvent]) -> Option<String>;

/// Runs a long run to its pause, then resumes it with `red` from what `prepare` leaves of its
/// snapshot; returns the journal and whether the resume read a snapshot. `legacy`: the snapshot
/// is moved out of the record into the key builds before 2026-11-27 kept it in (packed as they
/// packed it), as a run paused by such a build and resumed by this one has it.
async fn resume_long(
    url: &str,
    store: &RedisRunStore,
    agent: &Agent,
    work: &std::path::Path,
    prepare: &Prepare,
    legacy: bool,
) -> (Vec<JournalEvent>, bool) {
    use base64::Engine as _;
    let brain = AnyBrain::for_agent(agent).expect("brain");
    let (id, q, settings) = to_first_pause(store, agent, &brain, "t", work).await;
    // The pause stored a snapshot of the whole journal, in the record.
    let run_key = store.run_key(id);
    let key = format!("{run_key}:snap");
    let mut conn = delta_e2e::redis_raw(url).await;
    let raw: String = redis::cmd("HGET")
        .arg(&run_key)
        .arg("snap")
        .query_async(&mut conn)
        .await
        .expect("a snapshot at the pause");
    // `<seq>:b<packed JSON in base64>` on a fleet whose journal is packed (this one, a new
    // deployment), as `<seq>:<json>` here; the stores read either.
    let (head, body) = raw.split_once(':').expect("<seq>:");
    assert_eq!(
        body.starts_with('b'),
        store.writes_packed_entries(),
        "packed along with the journal"
    );
    let json = match body.strip_prefix('b') {
        Some(b64) => delta_store::redis::unpack_entry(
            &base64::engine::general_purpose::STANDARD_NO_PAD
                .decode(b64)
                .expect("base64"),
        )
        .expect("unpacks"),
        None => body.to_owned(),
    };
    let stored = format!("{head}:{json}");
    let whole = store.load(id).await.expect("load").journal;
    let (seq, json) = stored.split_once(':').expect("<seq>:<json>");
    assert_eq!(seq.parse::<u64>().ok(), whole.last().map(|e| e.seq));
    assert!(json.len() < 4_000, "a snapshot holds no journal: {json}");
    let value = match prepare(&stored, &whole) {
        // Unchanged: left as stored (packed or not).
        Some(v) if v == stored && !legacy => None,
        other => Some(other),
    };
    if let Some(v) = value {
        let _: i64 = redis::cmd("HDEL")
            .arg(&run_key)
            .arg("snap")
            .query_async(&mut conn)
            .await
            .expect("hdel");
        match (v, legacy) {
            (Some(v), true) => {
                // `<seq>:z<packed JSON>`, as those builds stored it.
                let (seq, json) = v.split_once(':').expect("<seq>:<json>");
                let mut old = format!("{seq}:z").into_bytes();
                old.extend(delta_store::redis::pack_entry(json).expect("packs"));
                let () = redis::cmd("SET")
                    .arg(&key)
                    .arg(old)
                    .query_async(&mut conn)
                    .await
                    .expect("set");
            }
            (Some(v), false) => {
                let _: i64 = redis::cmd("HSET")
                    .arg(&run_key)
                    .arg("snap")
                    .arg(v)
                    .query_async(&mut conn)
                    .await
                    .expect("hset");
            }
            (None, _) => {}
        }
    }
    let run = delta_engine::resume::load_run(store, id, Some(agent), None)
        .await
        .expect("load for a resume");
    let from_snapshot = run.snapshot.is_some();
    if from_snapshot {
        assert!(run.journal.is_empty(), "nothing after the pause's snapshot");
    } else {
        assert_eq!(run.journal, whole, "no usable snapshot: the whole journal");
    }
    let out = Engine::new(
        agent,
        &brain,
        store,
        run,
        settings,
        CancellationToken::new(),
    )
    .advance(Some(red(&q)))
    .await
    .expect("advance");
    assert!(
        matches!(&out, Outcome::Completed { result } if result.starts_with("done went red after chose")),
        "{out:?}"
    );
    let exists: bool = redis::cmd("EXISTS")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .expect("exists");
    let field: Option<String> = redis::cmd("HGET")
        .arg(&run_key)
        .arg("snap")
        .query_async(&mut conn)
        .await
        .expect("hget");
    assert!(
        !exists && field.as_deref().is_none_or(str::is_empty),
        "a finished run keeps no snapshot: key {exists}, field {field:?}"
    );
    (store.load(id).await.expect("load").journal, from_snapshot)
}

/// The snapshot `s` (format 2) of a run whose journal is `whole`, as a build before format 2
/// stored it: every question the run asked with its answer (the one waited on included), and the
/// requests of the current calls in full. (Whether a resume from a snapshot that left answered
/// questions out goes on as from the whole journal is the engine's tests' part.)
fn format_1(s: &str, whole: &[JournalEvent]) -> Option<String> {
    use delta_protocol::journal::{Replay, Snapshot};
    let (seq, json) = s.split_once(':').expect("seq");
    let n: u64 = seq.parse().expect("seq");
    let full = Replay::new(whole);
    let q = full.pending().expect("the run waits on a question");
    assert!(
        Snapshot::decode(json, n, None).is_err(),
        "a format-2 pause snapshot needs its question"
    );
    let decoded = Snapshot::decode(json, n, Some(q)).expect("decodes with its question");
    let mut v = serde_json::to_value(&decoded).expect("json");
    v["format"] = 1.into();
    v["replay"]["interactions"] = serde_json::to_value(&full.interactions).expect("json");
    let replay = v["replay"].as_object_mut().expect("replay");
    replay.remove("answered");
    assert!(v.get("asked").is_none() && v.get("requested").is_none());
    assert!(v["replay"]["requested"].is_object());
    Some(format!("{seq}:{v}"))
}

/// A resume reads the pause's snapshot and no event before it, and goes on exactly as from the
/// whole journal; a snapshot that is missing, unreadable, of another format or for another seq,
/// or whose brain memo names a place the script does not have, is ignored and the journal
/// replayed. The run is long enough (300 thoughts) that the engine
/// also stores snapshots on its way, every 256 events.
#[tokio::test]
async fn a_resume_goes_on_from_the_snapshot_or_else_from_the_whole_journal() {
    let Long {
        redis,
        dir,
        agent,
        store,
        ..
    } = long_run_on_redis("snap", 300).await;
    let (reference, used) = resume_long(
        &redis.url(),
        &store,
        &agent,
        dir.path(),
        &|s, _| Some(s.to_owned()),
        false,
    )
    .await;
    assert!(used, "the intact snapshot is used");
    // Where builds before 2026-11-27 kept it: read there, and deleted when the run finishes.
    let (journal, used) = resume_long(
        &redis.url(),
        &store,
        &agent,
        dir.path(),
        &|s, _| Some(s.to_owned()),
        true,
    )
    .await;
    assert!(used, "a snapshot in its own key is used");
    assert_eq!(
        delta_e2e::journal_shape(&journal),
        delta_e2e::journal_shape(&reference)
    );
    let shape = delta_e2e::journal_shape(&reference);
    // (what is done to the snapshot, whether the resume still uses it)
    let cases: [(&str, &Prepare, bool); 10] = [
        ("missing", &|_, _| None, false),
        (
            "packed, and unreadable",
            &|s, _| {
                let (seq, _) = s.split_once(':').expect("seq");
                Some(format!("{seq}:bbm90IGRlZmxhdGUgZGF0YQ"))
            },
            false,
        ),
        (
            "unreadable",
            &|s, _| {
                let (seq, json) = s.split_once(':').expect("seq");
                Some(format!("{seq}:{}", &json[..json.len() / 2]))
            },
            false,
        ),
        (
            "another format",
            &|s, _| Some(s.replacen("\"format\":2", "\"format\":0", 1)),
            false,
        ),
        (
            "a place the script does not have",
            &|s, _| {
                let (seq, json) = s.split_once(':').expect("seq");
                let mut v: serde_json::Value = serde_json::from_str(json).expect("json");
                v["brain"]["scripted"]["at"]["frames"] = serde_json::json!([[null, 99_999]]);
                Some(format!("{seq}:{v}"))
            },
            false,
        ),
        (
            "another seq",
            &|s, _| {
                let (seq, json) = s.split_once(':').expect("seq");
                let n: u64 = seq.parse().expect("n");
                Some(format!(
                    "{}:{}",
                    n - 1,
                    json.replacen(&format!("\"seq\":{n}"), &format!("\"seq\":{}", n - 1), 1)
                ))
            },
            false,
        ),
        (
            "a seq past Lua's whole numbers",
            &|s, _| {
                let (_, json) = s.split_once(':').expect("seq");
                Some(format!("{}:{json}", "9".repeat(15)))
            },
            false,
        ),
        (
            "a seq past a stream ID's",
            &|s, _| {
                let (_, json) = s.split_once(':').expect("seq");
                Some(format!("{}:{json}", "9".repeat(24)))
            },
            false,
        ),
        (
            "waiting on another question",
            &|s, _| {
                let (seq, json) = s.split_once(':').expect("seq");
                let mut v: serde_json::Value = serde_json::from_str(json).expect("json");
                assert!(v["asked"].is_string(), "format 2 names the question: {v}");
                v["asked"] = serde_json::json!(delta_protocol::RequestId::new());
                Some(format!("{seq}:{v}"))
            },
            false,
        ),
        (
            "format 1 (the question copied in, as builds before format 2 wrote it)",
            &format_1,
            true,
        ),
    ];
    for (what, prepare, usable) in cases {
        let (journal, used) =
            resume_long(&redis.url(), &store, &agent, dir.path(), prepare, false).await;
        assert_eq!(used, usable, "{what}: used");
        assert_eq!(delta_e2e::journal_shape(&journal), shape, "{what}");
    }
}

/// A worker stopped (its grace over) while it handles a job for a run that waits on a question,
/// before it did anything, leaves the run waiting: the question stays open for its person, the
/// record and the journal as they were. (An `INTERRUPTED` write here closed the question as
/// expired, and the next delivery applied its default or failed the run.)
#[tokio::test]
async fn stopping_on_a_waiting_run_keeps_its_question_open() {
    // The server stops when its handle drops: kept to the end.
    let Long {
        redis: _redis,
        dir,
        agent,
        brain,
        store,
    } = long_run_on_redis("stop", 3).await;
    let (id, q, settings) = to_first_pause(&store, &agent, &brain, "t", dir.path()).await;
    let before = store.load(id).await.expect("load");
    let stopped = CancellationToken::new();
    stopped.cancel();
    let resume = async |answer, cancel: &CancellationToken| {
        let run = delta_engine::resume::load_run(&store, id, Some(&agent), None)
            .await
            .expect("load");
        Engine::new(
            &agent,
            &brain,
            &store,
            run,
            settings.clone(),
            cancel.clone(),
        )
        .advance(answer)
        .await
        .expect("advance")
    };
    for answer in [None, Some(red(&q))] {
        assert_eq!(resume(answer, &stopped).await, Outcome::Interrupted);
        let now = store.load(id).await.expect("load");
        assert_eq!(now.journal, before.journal, "nothing written");
        assert_eq!(now.record.status, RunStatus::WaitingForInput);
        assert_eq!(now.record.pending_request_id, Some(q.request_id));
        let ix = store
            .interaction(id, q.request_id)
            .await
            .expect("read")
            .expect("the question");
        assert_eq!(ix.state, delta_protocol::InteractionState::Pending);
    }
    // And the run still goes on with its answer.
    let out = resume(Some(red(&q)), &CancellationToken::new()).await;
    assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");
}

/// What a resume job carries of a paused run (the record and question the gateway's settling
/// script read, `PausedRun`) is what a read gives: adopted, it is the record and snapshot
/// `load_latest` reads, with nothing after it, and the run resumed from it ends as one resumed
/// from a read. What does not fit (no snapshot, one for another seq, another question) is not
/// adopted, and the worker reads the run instead. And it is only a hint: when the journal grew
/// after the settling read it, the first write from it is refused.
#[tokio::test]
async fn a_carried_paused_run_is_what_a_read_gives_and_only_a_hint() {
    use delta_protocol::{Fence, RequestId, Timestamp};
    use delta_store::redis::Resolution;
    let Long {
        redis,
        dir,
        agent,
        brain,
        store,
    } = long_run_on_redis("carry", 3).await;
    let settle = async |q: &delta_protocol::InteractionRequest| {
        let delta_store::redis::Settlement { lost, paused, .. } = store
            .resolve_carrying(
                q,
                Resolution::Answer(&red(q), Timestamp::now()),
                std::time::Duration::from_secs(5),
            )
            .await
            .expect("resolve");
        assert_eq!(lost, None, "this answer won");
        paused.expect("the run and its question, carried")
    };
    let resume =
        async |store: &RedisRunStore, run, q: &delta_protocol::InteractionRequest, settings| {
            Engine::new(
                &agent,
                &brain,
                store,
                run,
                settings,
                CancellationToken::new(),
            )
            .advance(Some(red(q)))
            .await
        };

    // A reference: paused, answered, read and resumed.
    let (id, q, settings) = to_first_pause(&store, &agent, &brain, "t", dir.path()).await;
    settle(&q).await;
    let read = store
        .load_latest(id, Some(q.request_id))
        .await
        .expect("read");
    assert!(read.snapshot.is_some() && read.journal.is_empty());
    let out = resume(&store, read, &q, settings).await.expect("advance");
    assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");
    let reference = delta_e2e::journal_shape(&store.load(id).await.expect("load").journal);

    // Carried: the same record and snapshot as a read, and the same end.
    let (id, q, settings) = to_first_pause(&store, &agent, &brain, "t", dir.path()).await;
    let paused = settle(&q).await;
    assert_eq!(
        paused.record.get("status").map(String::as_str),
        Some("WAITING_FOR_INPUT")
    );
    assert_eq!(
        paused.question.get("state").map(String::as_str),
        Some("ANSWERED")
    );
    let worker = store.fenced(Fence::new(100, 1));
    let adopted = worker
        .adopt_paused(id, q.request_id, &paused)
        .expect("adopted");
    let read = store
        .load_latest(id, Some(q.request_id))
        .await
        .expect("read");
    assert_eq!(adopted, read, "what a read gives");
    for (what, bad, rid) in [
        (
            "no snapshot",
            {
                let mut p = paused.clone();
                p.record.remove("snap");
                p
            },
            q.request_id,
        ),
        (
            "a snapshot for another seq",
            {
                let mut p = paused.clone();
                p.record.insert("seq".into(), "1".into());
                p
            },
            q.request_id,
        ),
        ("another question", paused.clone(), RequestId::new()),
    ] {
        assert!(
            worker.adopt_paused(id, rid, &bad).is_none(),
            "{what}: not adopted"
        );
    }
    let before = worker.round_trips();
    let adopted = worker
        .adopt_paused(id, q.request_id, &paused)
        .expect("adopted");
    let out = resume(&worker, adopted, &q, settings.clone())
        .await
        .expect("advance");
    assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");
    assert_eq!(
        delta_e2e::journal_shape(&store.load(id).await.expect("load").journal),
        reference,
        "ends as when read"
    );
    assert!(worker.round_trips() > before, "it wrote");

    // Stale: the journal grew after the settling read the run.
    let (id, q, settings) = to_first_pause(&store, &agent, &brain, "t", dir.path()).await;
    let paused = settle(&q).await;
    let worker = store.fenced(Fence::new(200, 1));
    let adopted = worker
        .adopt_paused(id, q.request_id, &paused)
        .expect("adopted");
    let before = store.load(id).await.expect("load").journal;
    store
        .append(
            id,
            vec![Event::SystemMessage(delta_protocol::SystemMessage {
                level: delta_protocol::MessageLevel::Info,
                content: "written after the settling".into(),
            })],
            None,
        )
        .await
        .expect("append");
    let refused = resume(&worker, adopted, &q, settings).await;
    assert!(
        matches!(
            refused,
            Err(delta_engine::engine::Error::Store(
                delta_store::Error::Fenced(_)
            ))
        ),
        "{refused:?}"
    );
    let after = store.load(id).await.expect("load").journal;
    assert_eq!(
        after.len(),
        before.len() + 1,
        "nothing written from the stale run"
    );

    // A sensitive question's run is not carried, nor a password's: their sealed answers stay
    // in Redis.
    let key = delta_protocol::secret::SecretsKey::from_hex(&"5a".repeat(32)).expect("key");
    let sealing = store.clone().with_secrets_key(std::sync::Arc::new(key));
    for password in [false, true] {
        let (_, q, _) = to_first_pause(&store, &agent, &brain, "t", dir.path()).await;
        let mut secret = q.clone();
        if password {
            secret.input_type = delta_protocol::InputType::Password;
        } else {
            secret.sensitive = true;
        }
        let delta_store::redis::Settlement { lost, paused, .. } = sealing
            .resolve_carrying(
                &secret,
                Resolution::Answer(&red(&q), Timestamp::now()),
                std::time::Duration::from_secs(5),
            )
            .await
            .expect("resolve");
        assert_eq!(
            (lost, paused),
            (None, None),
            "settled, nothing carried (password: {password})"
        );
    }

    // A run whose record and question pass 8 KiB together is not carried either.
    let (id, q, _) = to_first_pause(&store, &agent, &brain, "t", dir.path()).await;
    let mut conn = delta_e2e::redis_raw(&redis.url()).await;
    let _: i64 = redis::cmd("HSET")
        .arg(store.run_key(id))
        .arg("input")
        .arg(format!("\"{}\"", "x".repeat(9 * 1024)))
        .query_async(&mut conn)
        .await
        .expect("hset");
    let delta_store::redis::Settlement { lost, paused, .. } = store
        .resolve_carrying(
            &q,
            Resolution::Answer(&red(&q), Timestamp::now()),
            std::time::Duration::from_secs(5),
        )
        .await
        .expect("resolve");
    assert_eq!((lost, paused), (None, None), "settled, nothing carried");
}

/// An answer the engine refuses (a gateway checked it against an older agent) is journaled as
/// refused, its question opened again and the run paused on it again, all in the one write the
/// resume makes: no crash can leave a part of it (a question pending with no word of why in the
/// journal, a refusal journaled with its question left answered, or a run that no longer waits
/// on its open question). And a write that is refused reopens nothing.
#[tokio::test]
async fn a_refused_answer_is_journaled_and_its_question_reopened_in_one_write() {
    use delta_engine::resume::{Answers, Resumed};
    use delta_protocol::{Fence, InteractionState};
    use delta_store::StatusChange;
    let Long {
        redis,
        dir,
        agent,
        brain,
        store,
    } = long_run_on_redis("refuse", 2).await;
    let mut conn = delta_e2e::redis_raw(&redis.url()).await;
    let refusals = |run: &delta_store::StoredRun, rid: delta_protocol::RequestId| {
        run.journal
            .iter()
            .filter(|e| {
                matches!(&e.event, Event::SystemMessage(m)
                    if m.content.contains("was refused") && m.content.contains(&rid.to_string()))
            })
            .count()
    };
    // `stopping`: the worker is stopping as it resumes (its cancellation token fired), which
    // must not write the run `INTERRUPTED` and close the question it opens again.
    for (refused_write, stopping) in [(false, false), (true, false), (false, true)] {
        let (id, q, settings) = to_first_pause(&store, &agent, &brain, "t", dir.path()).await;
        // Accepted where only the protocol's rules are checked: the engine refuses an option
        // the question does not offer.
        let mut purple = red(&q);
        purple.option_id = Some("purple".into());
        assert!(store.answer(&q, &purple).await.expect("answer"), "accepted");
        let before = store.load(id).await.expect("load");
        // A delivery of the resume job, as a worker takes it.
        let job = store.fenced(Fence::new(7, 1));
        let run = delta_engine::resume::load_run(&job, id, Some(&agent), Some(q.request_id))
            .await
            .expect("load");
        let answers = Answers::load(&job, &run, Some(q.request_id))
            .await
            .expect("answers");
        if refused_write {
            // Another delivery took the run meanwhile: this one's write is refused.
            store
                .fenced(Fence::new(8, 1))
                .append(id, vec![], Some(StatusChange::Running))
                .await
                .expect("the other delivery's write");
        }
        let stop = CancellationToken::new();
        if stopping {
            stop.cancel();
        }
        let trips = job.round_trips();
        let out = Engine::resumed(
            &agent,
            &brain,
            &job,
            run,
            answers,
            settings.clone(),
            stop.clone(),
        )
        .advance_resumed()
        .await;
        // (The handle counts its clones' trips too: read before the reads below.)
        let trips = job.round_trips() - trips;
        let now = store.load(id).await.expect("load");
        let ix = store
            .interaction(id, q.request_id)
            .await
            .expect("read")
            .expect("the question");
        let listed: Option<f64> = redis::cmd("ZSCORE")
            .arg(store.run_index(id, "interactions:pending"))
            .arg(q.request_id.to_string())
            .query_async(&mut conn)
            .await
            .expect("zscore");
        if refused_write {
            assert!(out.is_err(), "refused: {out:?}");
            assert_eq!(refusals(&now, q.request_id), 0, "nothing journaled");
            assert_eq!(ix.state, InteractionState::Answered, "not reopened");
            assert_eq!(listed, None, "not listed as pending");
            continue;
        }
        let Ok(Resumed::Advanced {
            outcome: Outcome::Paused(again),
            reopened: true,
        }) = out
        else {
            panic!("expected the question asked again, got {out:?}")
        };
        assert_eq!(again.request_id, q.request_id);
        assert_eq!(trips, 1, "one write, nothing else");
        assert_eq!(refusals(&now, q.request_id), 1, "{:?}", now.journal);
        assert_eq!(
            now.journal.len(),
            before.journal.len() + 3,
            "its attempt's start, the refusal, the pause's end: {:?}",
            now.journal
        );
        assert_eq!(now.record.status, RunStatus::WaitingForInput);
        assert_eq!(now.record.pending_request_id, Some(q.request_id));
        assert_eq!(ix.state, InteractionState::Pending, "open again");
        assert_eq!(ix.response, None);
        assert!(ix.reopened_at.is_some(), "the refused answer's instant");
        assert_eq!(ix.asked_by_job, Some(7), "the reopening job announces it");
        assert_eq!(
            listed,
            Some(q.timestamp.micros() as f64),
            "listed as pending, as when it was asked"
        );
        // A better answer is taken, and the run goes on with it.
        assert!(store.answer(&q, &red(&q)).await.expect("answer"));
        let run = delta_engine::resume::load_run(&store, id, Some(&agent), Some(q.request_id))
            .await
            .expect("load");
        let answers = Answers::load(&store, &run, Some(q.request_id))
            .await
            .expect("answers");
        let out = Engine::resumed(
            &agent,
            &brain,
            &store,
            run,
            answers,
            settings.clone(),
            CancellationToken::new(),
        )
        .advance_resumed()
        .await
        .expect("advance");
        assert!(
            matches!(
                &out,
                Resumed::Advanced {
                    outcome: Outcome::Completed { .. },
                    reopened: false
                }
            ),
            "{out:?}"
        );
    }
}
