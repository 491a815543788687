//! The engine over Redis writes the same journal as over local files.

use delta_engine::agent::Agent;
use delta_engine::brain::AnyBrain;
use delta_engine::engine::{Engine, Outcome, PauseMode, Settings};
use delta_protocol::{Event, InteractionResponse, JournalEvent, Responder, RunId, RunStatus, Via};
use delta_store::file::FileRunStore;
use delta_store::redis::RedisRunStore;
use delta_store::{RunRecord, RunStore};
use tokio_util::sync::CancellationToken;

async fn run_hello<S: RunStore>(
    store: &S,
    agent: &Agent,
    work: &std::path::Path,
) -> Vec<JournalEvent> {
    let brain = AnyBrain::for_agent(agent).expect("brain");
    let rec = RunRecord::new(RunId::new(), agent.name(), "say hi", RunStatus::Queued);
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
        &brain,
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
