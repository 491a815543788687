//! `RedisRunStore` against a real redis-server: the same contract as the file store, plus fencing.

use delta_shared::protocol::{Event, MessageLevel, RunId, RunStatus, SystemMessage};
use delta_shared::store::redis::RedisRunStore;
use delta_shared::store::{Error, RunRecord, RunStore, contract};

fn msg(text: &str) -> Event {
    Event::SystemMessage(SystemMessage {
        level: MessageLevel::Info,
        content: text.into(),
    })
}

#[tokio::test]
async fn redis_store_passes_the_contract() {
    let redis = delta_e2e::Redis::start().expect("redis-server");
    let store = RedisRunStore::connect(&redis.url(), "t1")
        .await
        .expect("connect");
    contract::run_all(&store).await;
}

#[tokio::test]
async fn a_stale_delivery_cannot_write_after_a_newer_one_took_the_run() {
    let redis = delta_e2e::Redis::start().expect("redis-server");
    let store = RedisRunStore::connect(&redis.url(), "t2")
        .await
        .expect("connect");
    let rec = RunRecord::new(RunId::new(), "a", "t", RunStatus::Queued);
    let id = rec.run_id;
    store.create(rec).await.expect("create");

    let first = store.fenced(7, 1);
    first
        .append(id, vec![msg("first owner")], None)
        .await
        .expect("first write");
    // The job is redelivered (delivery 2): the new owner writes, the old one is now stale.
    let second = store.fenced(7, 2);
    second
        .append(id, vec![msg("second owner")], None)
        .await
        .expect("takeover");
    let before = store.load(id).await.expect("load");
    let err = first
        .append(id, vec![msg("late write")], None)
        .await
        .expect_err("stale");
    assert!(matches!(err, Error::Fenced(r) if r == id), "{err}");
    assert_eq!(
        store.load(id).await.expect("load"),
        before,
        "the refused write changed nothing"
    );
    // A resume job (a later stream sequence) outranks both.
    store
        .fenced(9, 1)
        .append(id, vec![msg("resume job")], None)
        .await
        .expect("newer job");
    assert!(matches!(
        second.append(id, vec![msg("x")], None).await,
        Err(Error::Fenced(_))
    ));
    let journal = store.load(id).await.expect("load").journal;
    let seqs: Vec<u64> = journal.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2, 3]);
}

#[tokio::test]
async fn runs_of_different_prefixes_do_not_see_each_other() {
    let redis = delta_e2e::Redis::start().expect("redis-server");
    let a = RedisRunStore::connect(&redis.url(), "ns-a")
        .await
        .expect("connect");
    let b = RedisRunStore::connect(&redis.url(), "ns-b")
        .await
        .expect("connect");
    let rec = RunRecord::new(RunId::new(), "a", "t", RunStatus::Queued);
    let id = rec.run_id;
    a.create(rec).await.expect("create");
    assert!(matches!(b.load(id).await, Err(Error::NotFound(_))));
}
