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

#[tokio::test]
async fn a_sensitive_answer_is_sealed_whole_and_opens_only_with_the_key() {
    use delta_shared::protocol::{
        InteractionRequest, InteractionResponse, InteractionType, Responder, Via,
    };
    use delta_shared::secret::SecretsKey;
    use delta_shared::store::StatusChange;
    use std::sync::Arc;

    let redis = delta_e2e::Redis::start().expect("redis-server");
    let plain = RedisRunStore::connect(&redis.url(), "t5")
        .await
        .expect("connect");
    let key = Arc::new(SecretsKey::from_hex(&"5a".repeat(32)).expect("key"));
    let store = plain.clone().with_secrets_key(key);
    let rec = RunRecord::new(RunId::new(), "a", "t", RunStatus::Running);
    let id = rec.run_id;
    store.create(rec).await.expect("create");
    let mut q = InteractionRequest::new(id, "a", InteractionType::UserInput, "token?");
    q.sensitive = true;
    store
        .append(
            id,
            vec![Event::HumanInputRequest(Box::new(q.clone()))],
            Some(StatusChange::Waiting(Box::new(q.clone()))),
        )
        .await
        .expect("pause");

    let mut a = InteractionResponse::new(
        q.request_id,
        Responder {
            id: "ops".into(),
            via: Via::Http,
        },
    );
    a.input = Some("canary-in".into());
    a.feedback = Some("canary-fb".into());
    a.data = Some(serde_json::json!({"k": "canary-data"}));
    let err = plain.answer(&q, &a).await.expect_err("no key");
    assert!(matches!(err, Error::NoSecretsKey), "{err}");
    assert!(store.answer(&q, &a).await.expect("answer"));

    let client = redis::Client::open(redis.url()).expect("url");
    let mut c = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let stored: Vec<String> = redis::cmd("HGETALL")
        .arg(store.interaction_key(id, &q.request_id.to_string()))
        .query_async(&mut c)
        .await
        .expect("hgetall");
    let stored = stored.join(" ");
    assert!(!stored.contains("canary"), "{stored}");
    assert!(stored.matches("sealed:v1:").count() >= 3, "{stored}");

    let back = store
        .stored_answer(id, q.request_id)
        .await
        .expect("open")
        .expect("answered");
    assert_eq!(
        (back.input, back.feedback, back.data),
        (a.input, a.feedback, a.data)
    );
    let err = plain
        .stored_answer(id, q.request_id)
        .await
        .expect_err("no key, no secret");
    assert!(matches!(err, Error::NoSecretsKey), "{err}");
    let wrong = plain.with_secrets_key(Arc::new(
        SecretsKey::from_hex(&"a5".repeat(32)).expect("key"),
    ));
    let err = wrong
        .stored_answer(id, q.request_id)
        .await
        .expect_err("wrong key");
    assert!(matches!(err, Error::Secret(_)), "{err}");
}
