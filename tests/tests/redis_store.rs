//! `RedisRunStore` against a real redis-server: the same contract as the file store, plus fencing.

use delta_protocol::{Event, MessageLevel, RunId, RunStatus, SystemMessage};
use delta_store::redis::RedisRunStore;
use delta_store::{Error, RunRecord, RunStore, contract};

fn msg(text: &str) -> Event {
    Event::SystemMessage(SystemMessage {
        level: MessageLevel::Info,
        content: text.into(),
    })
}

/// A new run of agent `a` (in `status`) paused on a `USER_INPUT` question with `prompt`,
/// sensitive or not: its id and the question.
async fn paused_run(
    store: &RedisRunStore,
    status: RunStatus,
    prompt: &str,
    sensitive: bool,
) -> (RunId, delta_protocol::InteractionRequest) {
    let rec = RunRecord::new(RunId::new(), "a", "t", status);
    let id = rec.run_id;
    store.create(rec).await.expect("create");
    let mut q = delta_protocol::InteractionRequest::new(
        id,
        "a",
        delta_protocol::InteractionType::UserInput,
        prompt,
    );
    q.sensitive = sensitive;
    delta_e2e::pause_on(store, id, &q).await;
    (id, q)
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

    let first = store.fenced(delta_protocol::Fence::new(7, 1));
    first
        .append(id, vec![msg("first owner")], None)
        .await
        .expect("first write");
    // The job is redelivered (delivery 2): the new owner writes, the old one is now stale.
    let second = store.fenced(delta_protocol::Fence::new(7, 2));
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
        .fenced(delta_protocol::Fence::new(9, 1))
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
async fn a_new_owner_cannot_write_on_a_journal_that_moved_since_it_loaded_it() {
    // The old owner (delivery 1) froze past ack_wait and is still alive; the job went to a new
    // owner (delivery 2), which loads the run. Before the new owner's first write, the old one
    // wakes up and journals its step's result: legal, the run is still its own. The new owner
    // must not then write on top of a journal it did not see: it would run that step again
    // and journal a second result for it.
    let redis = delta_e2e::Redis::start().expect("redis-server");
    let store = RedisRunStore::connect(&redis.url(), "t5")
        .await
        .expect("connect");
    let rec = RunRecord::new(RunId::new(), "a", "t", RunStatus::Queued);
    let id = rec.run_id;
    store.create(rec).await.expect("create");
    let old = store.fenced(delta_protocol::Fence::new(7, 1));
    old.load(id).await.expect("old owner loads");
    old.append(id, vec![msg("step 1 requested")], None)
        .await
        .expect("old owner writes");

    let new = store.fenced(delta_protocol::Fence::new(7, 2));
    let seen = new.load(id).await.expect("new owner loads").journal;
    assert_eq!(seen.len(), 1);
    old.append(id, vec![msg("step 1 result")], None)
        .await
        .expect("the old owner still owns the run: its write is accepted");
    let before = store.load(id).await.expect("load");
    let err = new
        .append(id, vec![msg("taking over from seq 1")], None)
        .await
        .expect_err("the new owner's view is stale");
    assert!(matches!(err, Error::Fenced(r) if r == id), "{err}");
    assert_eq!(
        store.load(id).await.expect("load"),
        before,
        "the refused write changed nothing"
    );

    // A later delivery that loads the journal as it is now takes the run over, and from then
    // on the old owner is fenced off.
    let newer = store.fenced(delta_protocol::Fence::new(7, 3));
    let seen = newer.load(id).await.expect("load").journal;
    assert_eq!(seen.len(), 2);
    newer
        .append(id, vec![msg("taking over from seq 2")], None)
        .await
        .expect("takeover");
    let err = old
        .append(id, vec![msg("late")], None)
        .await
        .expect_err("stale");
    assert!(matches!(err, Error::Fenced(_)), "{err}");
    // Its own writes follow one another without reloading.
    newer
        .append(id, vec![msg("next")], None)
        .await
        .expect("the owner goes on");
    assert_eq!(store.load(id).await.expect("load").journal.len(), 4);
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
    use delta_protocol::secret::SecretsKey;
    use delta_protocol::{InteractionResponse, Responder, Via};
    use std::sync::Arc;

    let redis = delta_e2e::Redis::start().expect("redis-server");
    let plain = RedisRunStore::connect(&redis.url(), "t5")
        .await
        .expect("connect");
    let key = Arc::new(SecretsKey::from_hex(&"5a".repeat(32)).expect("key"));
    let store = plain.clone().with_secrets_key(key);
    let (id, q) = paused_run(&store, RunStatus::Running, "token?", true).await;

    let mut a = InteractionResponse::new(
        q.request_id,
        Responder {
            id: "ops".into(),
            via: Via::Http,
            on_behalf_of: None,
            relayed_by: None,
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
    assert!(stored.matches("sealed:v2:").count() >= 3, "{stored}");

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

/// The dead-letter retry's store step: only a run failed with the letter's reason comes back,
/// and a question the failure closed before its deadline is open again.
#[tokio::test]
async fn requeue_brings_back_only_a_run_the_letter_failed_and_reopens_its_question() {
    use delta_protocol::{EngineEnd, InteractionState};
    use delta_store::redis::Requeue;
    use delta_store::{StatusChange, Terminal};

    let redis = delta_e2e::Redis::start().expect("redis-server");
    let store = RedisRunStore::connect(&redis.url(), "t6")
        .await
        .expect("connect");
    let fail = |reason: &str| {
        (
            vec![Event::EngineEnd(EngineEnd {
                status: RunStatus::Failed,
                result: None,
                error: Some(reason.into()),
            })],
            StatusChange::Finished {
                status: Terminal::Failed,
                result: None,
                error: Some(reason.into()),
            },
        )
    };
    // A run failed while it waited on a question (its announcement could not be published).
    let (id, q) = paused_run(&store, RunStatus::Queued, "name?", false).await;
    let (events, change) = fail("publish failed\non every delivery");
    store.append(id, events, Some(change)).await.expect("fail");
    let closed = store.interaction(id, q.request_id).await.expect("read");
    assert_eq!(closed.map(|ix| ix.state), Some(InteractionState::Expired));

    // A letter with another reason does not revive it; nothing changes.
    let before = store.load(id).await.expect("load");
    let other = store
        .requeue_failed(id, "retried", "something else", Some(&q))
        .await
        .expect("requeue");
    assert!(
        matches!(other, Requeue::FailedOtherwise(ref e) if e == "publish failed on every delivery"),
        "{other:?}"
    );
    assert_eq!(store.load(id).await.expect("load"), before);

    // The letter's reason (headers carry it on one line) brings it back, question open again.
    let back = store
        .requeue_failed(
            id,
            "retried by ops",
            "publish failed on every delivery",
            Some(&q),
        )
        .await
        .expect("requeue");
    let after = store.load(id).await.expect("load");
    assert_eq!(
        back,
        Requeue::Queued {
            seq: after.journal.len() as u64
        }
    );
    assert_eq!(after.record.status, RunStatus::Queued);
    assert_eq!(after.record.error, None);
    assert!(matches!(&after.journal.last().expect("note").event,
        Event::SystemMessage(m) if m.content == "retried by ops"));
    let open = store.interaction(id, q.request_id).await.expect("read");
    assert_eq!(open.map(|ix| ix.state), Some(InteractionState::Pending));
    let pending = store
        .index_page("interactions:pending", false, None, 10)
        .await
        .expect("index")
        .expect("a valid cursor");
    assert!(
        pending
            .entries
            .iter()
            .any(|(m, _)| *m == q.request_id.to_string()),
        "back in the pending index: {pending:?}"
    );

    // Once it is not FAILED, a second retry changes nothing.
    let again = store
        .requeue_failed(id, "again", "publish failed on every delivery", Some(&q))
        .await
        .expect("requeue");
    assert_eq!(again, Requeue::NotFailed(RunStatus::Queued));
}

#[tokio::test]
async fn an_answer_that_only_looks_sealed_is_kept_as_the_text_it_is() {
    use delta_protocol::secret::SecretsKey;
    use delta_protocol::{InteractionResponse, Responder, Via};
    use delta_store::AnswerStore;
    use std::sync::Arc;

    let redis = delta_e2e::Redis::start().expect("redis-server");
    let key = Arc::new(SecretsKey::from_hex(&"5a".repeat(32)).expect("key"));
    let store = RedisRunStore::connect(&redis.url(), "t6")
        .await
        .expect("connect")
        .with_secrets_key(key);
    for looks_sealed in [
        "sealed:v1:00112233445566778899aabbccddeeff",
        "sealed:v2:deadbeef:00112233445566778899aabbccddeeff",
    ] {
        // Not sensitive: whatever its answer says is text, never something to open.
        let (id, q) = paused_run(&store, RunStatus::Running, "name?", false).await;
        let mut a = InteractionResponse::new(
            q.request_id,
            Responder {
                id: "bob".into(),
                via: Via::Http,
                on_behalf_of: None,
                relayed_by: None,
            },
        );
        a.input = Some(looks_sealed.into());
        assert!(store.answer(&q, &a).await.expect("answer"));
        let settled = store
            .settled(id, q.request_id)
            .await
            .expect("a resume can read it")
            .expect("answered");
        assert_eq!(
            settled.response.and_then(|r| r.input).as_deref(),
            Some(looks_sealed)
        );
    }
}

/// Writes `id`'s first step with `handle`: one event, `RUNNING` (`what`: the write, if it fails).
async fn write_start(handle: &RedisRunStore, id: RunId, what: &str) {
    handle
        .append(
            id,
            vec![msg("started")],
            Some(delta_store::StatusChange::Running),
        )
        .await
        .expect(what);
}

/// Finishes `id` `COMPLETED`.
async fn finish(store: &RedisRunStore, id: RunId) {
    store
        .append(id, vec![msg("done")], Some(delta_e2e::completed_ok()))
        .await
        .expect("finish");
}

/// Retention (issue 14, finding 9): a run that finished before the cut-off is deleted whole, its
/// record, journal, questions, idempotency key and every index entry, in one script; a paused
/// run, a run finished after the cut-off and a failed run put back in the queue all stay. A second
/// pass deletes nothing more.
#[tokio::test]
async fn retention_deletes_a_finished_run_whole_and_nothing_else() {
    use delta_protocol::{InteractionResponse, Responder, Via};
    use delta_store::redis::{Purge, Purged, Requeue, Submitted};
    use delta_store::{StatusChange, Terminal};

    let redis = delta_e2e::Redis::start().expect("redis-server");
    let store = RedisRunStore::connect(&redis.url(), "rt")
        .await
        .expect("connect");

    // Old: submitted with an idempotency key, asked a question, was answered, finished.
    let rec = RunRecord::new(store.run_id_for_key("k1"), "a", "t", RunStatus::Queued);
    let old = rec.run_id;
    let created = store
        .create_indexed(&rec, Some(("k1", "fp")))
        .await
        .expect("create");
    assert_eq!(created, Submitted::Created);
    let mut q = delta_protocol::InteractionRequest::new(
        old,
        "a",
        delta_protocol::InteractionType::UserInput,
        "name?",
    );
    q.expires_at = Some(q.timestamp.plus_seconds(3600));
    delta_e2e::pause_on(&store, old, &q).await;
    let mut a = InteractionResponse::new(
        q.request_id,
        Responder {
            id: "bob".into(),
            via: Via::Http,
            on_behalf_of: None,
            relayed_by: None,
        },
    );
    a.input = Some("Ada".into());
    assert!(store.answer(&q, &a).await.expect("answer"));
    // A second question, left pending when the run is cancelled (closed by the finish).
    let q2 = delta_protocol::InteractionRequest::new(
        old,
        "a",
        delta_protocol::InteractionType::UserInput,
        "again?",
    );
    delta_e2e::pause_on(&store, old, &q2).await;
    finish(&store, old).await;

    // Paused, created as long ago; failed and retried; both must stay.
    let (paused, paused_q) = paused_run(&store, RunStatus::Queued, "still?", false).await;
    let (retried, retried_q) = paused_run(&store, RunStatus::Queued, "x?", false).await;
    store
        .append(
            retried,
            vec![msg("dead-lettered")],
            Some(StatusChange::Finished {
                status: Terminal::Failed,
                result: None,
                error: Some("poison".into()),
            }),
        )
        .await
        .expect("fail");
    let back = store
        .requeue_failed(retried, "retried", "poison", Some(&retried_q))
        .await
        .expect("requeue");
    assert!(matches!(back, Requeue::Queued { .. }), "{back:?}");

    let cutoff = delta_protocol::Timestamp::now().micros();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    // Finished after the cut-off: kept.
    let fresh = RunRecord::new(RunId::new(), "a", "t", RunStatus::Queued);
    let fresh_id = fresh.run_id;
    store.create(fresh).await.expect("create");
    finish(&store, fresh_id).await;

    let before = delta_e2e::redis_dump(&redis.url(), "rt:*").await;
    for id in [
        old.to_string(),
        q.request_id.to_string(),
        q2.request_id.to_string(),
    ] {
        assert!(before.contains(&id), "{id} is stored before: {before}");
    }
    assert!(before.contains(":idempotency:k1"), "{before}");

    let pass = store.purge_finished(cutoff, 100).await.expect("purge");
    assert_eq!(
        pass,
        Purged {
            purged: 1,
            skipped: 0,
            deferred: 0,
            more: false
        }
    );
    let after = delta_e2e::redis_dump(&redis.url(), "rt:*").await;
    for id in [
        old.to_string(),
        q.request_id.to_string(),
        q2.request_id.to_string(),
    ] {
        assert!(!after.contains(&id), "{id} is gone everywhere: {after}");
    }
    assert!(!after.contains(":idempotency:k1"), "{after}");
    for id in [paused, retried, fresh_id] {
        assert!(after.contains(&id.to_string()), "{id} stays: {after}");
    }
    assert!(matches!(store.load(old).await, Err(Error::NotFound(r)) if r == old));
    assert_eq!(
        store.load(paused).await.expect("paused").record.status,
        RunStatus::WaitingForInput
    );
    assert!(
        store
            .interaction(paused, paused_q.request_id)
            .await
            .expect("read")
            .is_some()
    );
    assert_eq!(
        store.load(retried).await.expect("retried").record.status,
        RunStatus::Queued
    );
    assert_eq!(
        store.load(fresh_id).await.expect("fresh").record.status,
        RunStatus::Completed
    );

    // Idempotent: again, by the pass or by the run, nothing more is deleted.
    let again = store.purge_finished(cutoff, 100).await.expect("purge");
    assert_eq!(again, Purged::default());
    assert_eq!(
        store.purge_run(old, cutoff).await.expect("purge"),
        Purge::Gone
    );
    // A run not finished is never deleted, whatever the cut-off.
    let now = delta_protocol::Timestamp::now().micros();
    assert_eq!(
        store.purge_run(paused, now).await.expect("purge"),
        Purge::Live
    );
    assert_eq!(
        store.purge_run(retried, now).await.expect("purge"),
        Purge::Live
    );
    assert_eq!(delta_e2e::redis_dump(&redis.url(), "rt:*").await, after);

    // The idempotency key went with the run: the same key makes a new run.
    let rec = RunRecord::new(store.run_id_for_key("k1"), "a", "t", RunStatus::Queued);
    assert_eq!(
        store
            .create_indexed(&rec, Some(("k1", "fp")))
            .await
            .expect("create"),
        Submitted::Created
    );
}

/// The run of a dead-lettered job (failed through a handle that is [`RedisRunStore::dead_lettering`])
/// is marked, and retention keeping letters longer than runs defers it once by the difference,
/// removing the mark, so that it is deleted as its letter goes. A run failed otherwise, or one
/// whose letter was retried (the retry removes the mark) and that failed again, is deleted as
/// any finished run; so is a marked one where letters are not kept longer.
#[tokio::test]
async fn retention_defers_the_run_of_a_dead_letter_once() {
    use delta_store::redis::{Purge, Requeue};
    use delta_store::{StatusChange, Terminal};
    let redis = delta_e2e::Redis::start().expect("redis-server");
    let plain = RedisRunStore::connect(&redis.url(), "dl")
        .await
        .expect("connect");
    let day = std::time::Duration::from_secs(24 * 3600);
    let store = plain.clone().keeping_letters(30 * day, 7 * day);
    let failed = || {
        Some(StatusChange::Finished {
            status: Terminal::Failed,
            result: None,
            error: Some("poison".into()),
        })
    };
    let mut ids = vec![];
    for _ in 0..4 {
        let rec = RunRecord::new(RunId::new(), "a", "t", RunStatus::Queued);
        ids.push(rec.run_id);
        store.create(rec).await.expect("create");
    }
    let [lettered, otherwise, retried, unkept] = ids[..] else {
        unreachable!()
    };
    for id in [lettered, retried, unkept] {
        store
            .clone()
            .dead_lettering()
            .append(id, vec![msg("dead-lettered")], failed())
            .await
            .expect("fail");
    }
    store
        .append(otherwise, vec![msg("failed")], failed())
        .await
        .expect("fail");
    let back = store
        .requeue_failed(retried, "retried", "poison", None)
        .await
        .expect("requeue");
    assert!(matches!(back, Requeue::Queued { .. }), "{back:?}");
    store
        .append(retried, vec![msg("failed again")], failed())
        .await
        .expect("fail again");
    let mut raw = delta_e2e::redis_raw(&redis.url()).await;
    let mut marks = vec![];
    for id in &ids {
        let m: Option<String> = redis::cmd("HGET")
            .arg(store.run_key(*id))
            .arg("dead_letter")
            .query_async(&mut raw)
            .await
            .expect("hget");
        marks.push(m);
    }
    let one = Some("1".to_owned());
    assert_eq!(marks, [one.clone(), None, None, one]);

    let at = store.finished_at(&[lettered]).await.expect("read")[0].expect("finished");
    let now = delta_protocol::Timestamp::now().micros();
    let mut purged = vec![];
    for id in [lettered, otherwise, retried] {
        purged.push(store.purge_run(id, now).await.expect("purge"));
    }
    assert_eq!(purged, [Purge::Deferred, Purge::Purged, Purge::Purged]);
    let longer = i64::try_from((23 * day).as_micros()).expect("µs");
    assert_eq!(
        store.finished_at(&[lettered]).await.expect("read"),
        vec![Some(at + longer)]
    );
    assert_eq!(
        store.load(lettered).await.expect("kept").record.status,
        RunStatus::Failed
    );
    // Not due before its new time; then deleted, the mark gone.
    assert_eq!(
        store.purge_run(lettered, now).await.expect("purge"),
        Purge::Kept
    );
    assert_eq!(
        store.purge_run(lettered, at + longer).await.expect("purge"),
        Purge::Purged
    );
    // Letters kept no longer than runs: deleted at once.
    assert_eq!(
        plain.purge_run(unkept, now).await.expect("purge"),
        Purge::Purged
    );
}

/// Runs finished before the finished index existed are added to it from the status indexes, by
/// their `updated_at`, and then expire like the others.
#[tokio::test]
async fn runs_finished_before_the_index_are_backfilled() {
    let redis = delta_e2e::Redis::start().expect("redis-server");
    let store = RedisRunStore::connect(&redis.url(), "bf")
        .await
        .expect("connect");
    let rec = RunRecord::new(RunId::new(), "a", "t", RunStatus::Queued);
    let id = rec.run_id;
    store.create(rec).await.expect("create");
    finish(&store, id).await;
    // As an older version left it: finished, not in the index.
    let client = redis::Client::open(redis.url()).expect("url");
    let mut c = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let _: () = redis::cmd("ZREM")
        .arg(store.run_index(id, "runs:finished"))
        .arg(id.to_string())
        .query_async(&mut c)
        .await
        .expect("zrem");
    let now = delta_protocol::Timestamp::now().micros();
    assert_eq!(
        store.purge_finished(now, 10).await.expect("purge").purged,
        0
    );
    assert!(
        store
            .due(now, Some(now), 10)
            .await
            .expect("due")
            .purge
            .is_empty()
    );
    let (added, next) = store
        .backfill_finished(RunStatus::Completed, 0, 10)
        .await
        .expect("backfill");
    assert_eq!((added, next), (1, 0));
    let updated = store.record(id).await.expect("record").updated_at.micros();
    assert_eq!(
        store.finished_at(&[id]).await.expect("read"),
        vec![Some(updated)]
    );
    // A round of the reconcilers finds it due, if asked to (retention on).
    assert_eq!(
        store.due(now, Some(now), 10).await.expect("due").purge,
        vec![id]
    );
    assert!(
        store
            .due(now, None, 10)
            .await
            .expect("due")
            .purge
            .is_empty()
    );
    // Walking again adds nothing.
    assert_eq!(
        store
            .backfill_finished(RunStatus::Completed, 0, 10)
            .await
            .expect("backfill"),
        (0, 0)
    );
    assert_eq!(
        store.purge_finished(now, 10).await.expect("purge").purged,
        1
    );
    assert!(matches!(store.load(id).await, Err(Error::NotFound(_))));
}

/// A new deployment says from its start that every finished run is in the finished index (no
/// gateway walks the status indexes for retention); one that does not say so (made before the
/// note existed) is walked, and says so once a walk got through.
#[tokio::test]
async fn a_new_deployment_needs_no_backfill_and_an_older_one_is_marked_once_walked() {
    let redis = delta_e2e::Redis::start().expect("redis-server");
    let store = RedisRunStore::connect(&redis.url(), "fi")
        .await
        .expect("connect");
    assert!(store.finished_indexed());
    let raw = delta_e2e::redis_raw(&redis.url()).await;
    let marker = || async {
        let v: Option<String> = redis::cmd("GET")
            .arg("fi:finished-index")
            .query_async(&mut raw.clone())
            .await
            .expect("get");
        v
    };
    assert_eq!(marker().await.as_deref(), Some("complete"));
    // As a deployment made before the note: a program connecting does not add it.
    let _: () = redis::cmd("DEL")
        .arg("fi:finished-index")
        .query_async(&mut raw.clone())
        .await
        .expect("del");
    let older = RedisRunStore::connect(&redis.url(), "fi")
        .await
        .expect("connect");
    assert!(!older.finished_indexed());
    assert_eq!(marker().await, None);
    older.mark_finished_indexed().await.expect("mark");
    let after = RedisRunStore::connect(&redis.url(), "fi")
        .await
        .expect("connect");
    assert!(after.finished_indexed());
}

/// A write's events are one stream entry (their time once, one line each); a note a script
/// appends alone, and an entry written before this format, is one event whole. Every reader
/// (the whole journal, a page from a seq, a live tail) gives the same events, numbered without
/// a gap, from any seq, even inside an entry.
#[tokio::test]
async fn a_write_is_one_entry_and_every_reader_splits_it_back() {
    let redis = delta_e2e::Redis::start().expect("redis-server");
    let store = RedisRunStore::connect(&redis.url(), "ent")
        .await
        .expect("connect");
    let rec = RunRecord::new(RunId::new(), "a", "t", RunStatus::Running);
    let id = rec.run_id;
    store.create(rec).await.expect("create");
    store
        .append(id, vec![msg("1"), msg("2"), msg("3")], None)
        .await
        .expect("append");
    store
        .append(id, vec![msg("4"), msg("5")], None)
        .await
        .expect("append");
    let journal = format!("{}:journal", store.run_key(id));
    let mut raw = delta_e2e::redis_raw(&redis.url()).await;
    let len: u64 = redis::cmd("XLEN")
        .arg(&journal)
        .query_async(&mut raw)
        .await
        .expect("xlen");
    assert_eq!(len, 2, "one entry per write");
    // An entry of one whole event, as a note script writes it (and as journals used to be).
    let mut six = store.load(id).await.expect("load").journal[4].clone();
    six.seq = 6;
    six.event = msg("6");
    let () = redis::pipe()
        .cmd("XADD")
        .arg(&journal)
        .arg("6-0")
        .arg("e")
        .arg(delta_protocol::journal::to_line(&six).trim_end())
        .ignore()
        .cmd("HSET")
        .arg(store.run_key(id))
        .arg("seq")
        .arg(6)
        .ignore()
        .query_async(&mut raw)
        .await
        .expect("a whole event");
    let texts = |events: &[delta_protocol::JournalEvent]| -> Vec<(u64, String)> {
        events
            .iter()
            .map(|e| match &e.event {
                Event::SystemMessage(m) => (e.seq, m.content.clone()),
                other => panic!("{other:?}"),
            })
            .collect()
    };
    let all: Vec<(u64, String)> = (1..=6).map(|i| (i, i.to_string())).collect();
    let whole = store.load(id).await.expect("load").journal;
    assert_eq!(texts(&whole), all);
    assert!(
        whole[..3].iter().all(|e| e.timestamp == whole[0].timestamp),
        "one time per write"
    );
    for from in 1..=7u64 {
        let page = store.journal_from(id, from, 100).await.expect("page");
        assert_eq!(texts(&page), all[(from - 1) as usize..], "from {from}");
        let tail = store
            .journal_tail(id)
            .await
            .expect("tail")
            .next(from - 1, 10)
            .await
            .expect("next");
        assert_eq!(
            texts(&tail),
            all[(from - 1) as usize..],
            "after {}",
            from - 1
        );
    }
    let two = store.journal_from(id, 2, 2).await.expect("page");
    assert_eq!(texts(&two), all[1..3], "at most `max`");
}

/// What an existing fleet of prefix `prefix` left in Redis: its bucket count (16), and its
/// journal format if it has one.
async fn existing_fleet(
    raw: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    format: Option<&str>,
) {
    let mut pipe = redis::pipe();
    pipe.cmd("SET")
        .arg(format!("{prefix}:buckets"))
        .arg(16)
        .ignore();
    if let Some(f) = format {
        pipe.cmd("SET")
            .arg(format!("{prefix}:journal-format"))
            .arg(f)
            .ignore();
    }
    let () = pipe.query_async(raw).await.expect("set");
}

/// A deployment older than the entry-per-write format keeps writing one entry per event (what
/// its older programs read), and one of 2026-11-24 one plain entry per write, until
/// `delta migrate-redis --journal-entries` allows packed entries; a new deployment packs from
/// the start. Every reader gives the same journal from each, and a format newer than this build
/// is refused at start rather than misread.
#[tokio::test]
async fn an_older_deployment_keeps_its_journal_format_until_it_is_allowed_the_newest() {
    let redis = delta_e2e::Redis::start().expect("redis-server");
    let mut raw = delta_e2e::redis_raw(&redis.url()).await;
    // What a fleet of before the format left: its bucket count, no journal format.
    existing_fleet(&mut raw, "old", None).await;
    // A fleet of 2026-11-24: one plain entry per write.
    existing_fleet(&mut raw, "plain", Some("entry-per-write")).await;
    // Entries, the fields of the last one, and the journal as read back.
    let entries = async |store: &RedisRunStore| -> (u64, Vec<String>, Vec<String>) {
        let rec = RunRecord::new(RunId::new(), "a", "t", RunStatus::Running);
        let id = rec.run_id;
        store.create(rec).await.expect("create");
        store
            .append(id, vec![msg("1"), msg("2"), msg("3")], None)
            .await
            .expect("append");
        let mut raw = delta_e2e::redis_raw(&redis.url()).await;
        let key = format!("{}:journal", store.run_key(id));
        let len: u64 = redis::cmd("XLEN")
            .arg(&key)
            .query_async(&mut raw)
            .await
            .expect("xlen");
        let last: Vec<(String, std::collections::HashMap<String, Vec<u8>>)> =
            redis::cmd("XREVRANGE")
                .arg(&key)
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(1)
                .query_async(&mut raw)
                .await
                .expect("xrevrange");
        let mut fields: Vec<String> = last[0].1.keys().cloned().collect();
        fields.sort();
        let texts = store
            .load(id)
            .await
            .expect("load")
            .journal
            .iter()
            .map(|e| match &e.event {
                Event::SystemMessage(m) => format!("{} {}", e.seq, m.content),
                other => panic!("{other:?}"),
            })
            .collect();
        (len, fields, texts)
    };
    let want: Vec<String> = ["1 1", "2 2", "3 3"].map(String::from).to_vec();
    let fields = |f: &[&str]| f.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let old = RedisRunStore::connect(&redis.url(), "old")
        .await
        .expect("connect");
    assert!(old.writes_single_entries());
    assert_eq!(
        entries(&old).await,
        (3, fields(&["e"]), want.clone()),
        "an entry per event"
    );
    let plain = RedisRunStore::connect(&redis.url(), "plain")
        .await
        .expect("connect");
    assert!(!plain.writes_single_entries() && !plain.writes_packed_entries());
    assert_eq!(
        entries(&plain).await,
        (1, fields(&["b", "t"]), want.clone()),
        "a plain entry per write"
    );
    for store in [&old, &plain] {
        assert!(!store.allow_entry_per_write().await.expect("allow"));
        assert!(
            store.allow_entry_per_write().await.expect("allow"),
            "set already"
        );
    }
    for prefix in ["old", "plain", "new"] {
        let upgraded = RedisRunStore::connect(&redis.url(), prefix)
            .await
            .expect("connect");
        assert!(upgraded.writes_packed_entries(), "{prefix}");
        assert_eq!(
            entries(&upgraded).await,
            (1, fields(&["t", "z"]), want.clone()),
            "a packed entry per write ({prefix})"
        );
    }
    // A fleet already on a format of a newer build.
    existing_fleet(&mut raw, "newer", Some("packed-9")).await;
    let refused = RedisRunStore::connect(&redis.url(), "newer").await;
    let err = refused.err().expect("refused").to_string();
    assert!(
        err.contains("packed-9") && err.contains("cannot read"),
        "{err}"
    );
}

/// A queued run's record made an hour ago, so that no write's own time could pass for its
/// creation time.
fn an_hour_old_record() -> RunRecord {
    let mut rec = RunRecord::new(RunId::new(), "a", "t", RunStatus::Queued);
    rec.created_at =
        delta_protocol::Timestamp::from_micros(rec.created_at.micros() - 3_600_000_000)
            .expect("a time");
    rec.updated_at = rec.created_at;
    rec
}

/// A start job that carries its run (a gateway's, docs/protocol.md "Job messages") starts it
/// without a read: its first write expects the journal empty and scores the run from the carried
/// creation time. Should the run have started meanwhile (another job of it wrote first), that
/// write is refused as any stale writer's, and changes nothing.
#[tokio::test]
async fn a_start_from_a_carried_run_reads_nothing_and_is_refused_once_the_run_started() {
    let redis = delta_e2e::Redis::start().expect("redis-server");
    let store = RedisRunStore::connect(&redis.url(), "fresh")
        .await
        .expect("connect");
    let raw = delta_e2e::redis_raw(&redis.url()).await;
    let mut rec = an_hour_old_record();
    rec.input = Some(serde_json::json!({"n": 1}));
    rec.submitted_by = Some("ada".into());
    let id = rec.run_id;
    let carried = rec.fresh();
    store.create(rec.clone()).await.expect("create");
    let reads = || async {
        let mut n = 0;
        for c in ["hgetall", "xrange", "get", "zscore", "evalsha"] {
            n += delta_e2e::command_calls(&raw, c).await;
        }
        n
    };

    // The carried run is the record as created.
    let first = store.fenced(delta_protocol::Fence::new(3, 1));
    let before = reads().await;
    let run = first.start_fresh(RunRecord::of_fresh(id, carried.clone()));
    assert_eq!(run.record, rec);
    assert!(run.journal.is_empty() && run.snapshot.is_none());
    assert_eq!(reads().await, before, "nothing read");
    let scores_before = delta_e2e::command_calls(&raw, "zscore").await;
    write_start(&first, id, "the first write of a fresh start").await;
    assert_eq!(
        delta_e2e::command_calls(&raw, "zscore").await,
        scores_before,
        "scored from the carried creation time"
    );
    let tag = store
        .run_key(id)
        .strip_suffix(&format!(":run:{id}"))
        .expect("tag")
        .to_owned();
    let mut conn = raw.clone();
    let score: Option<f64> = redis::cmd("ZSCORE")
        .arg(format!("{tag}:runs:RUNNING"))
        .arg(id.to_string())
        .query_async(&mut conn)
        .await
        .expect("zscore");
    assert_eq!(score.map(|s| s as i64), Some(rec.created_at.micros()));

    // A second start job of the same run (a newer message) that carries it too: its first write
    // finds the journal started, is refused, and leaves the run as it was.
    let stale = store.fenced(delta_protocol::Fence::new(9, 1));
    stale.start_fresh(RunRecord::of_fresh(id, carried));
    let before = store.load(id).await.expect("load");
    let err = stale
        .append(
            id,
            vec![msg("started again")],
            Some(delta_store::StatusChange::Running),
        )
        .await
        .expect_err("the run started since the job was published");
    assert!(matches!(err, Error::Fenced(r) if r == id), "{err}");
    assert_eq!(
        store.load(id).await.expect("load"),
        before,
        "nothing changed"
    );
    first
        .append(id, vec![msg("still mine")], None)
        .await
        .expect("the run stays its first job's");
}

/// A run's score in every status index is when it was created. A delivery's writes take it from
/// the record they loaded, without reading the `runs:all` index; a writer that loaded nothing
/// reads it there.
#[tokio::test]
async fn a_run_is_scored_by_its_creation_in_every_status_index() {
    let redis = delta_e2e::Redis::start().expect("redis-server");
    let store = RedisRunStore::connect(&redis.url(), "score")
        .await
        .expect("connect");
    let raw = delta_e2e::redis_raw(&redis.url()).await;
    let rec = an_hour_old_record();
    let id = rec.run_id;
    let created = rec.created_at.micros();
    store.create(rec).await.expect("create");
    let run_key = store.run_key(id);
    let tag = run_key.strip_suffix(&format!(":run:{id}")).expect("tag");
    let score = |status: RunStatus| {
        let key = format!("{tag}:runs:{}", status.as_str());
        let mut raw = raw.clone();
        async move {
            // ZMSCORE, so as not to count among the scripts' ZSCOREs.
            let s: Vec<Option<f64>> = redis::cmd("ZMSCORE")
                .arg(&key)
                .arg(id.to_string())
                .query_async(&mut raw)
                .await
                .expect("zmscore");
            s[0].map(|s| s as i64)
        }
    };
    let zscores = || delta_e2e::command_calls(&raw, "zscore");
    assert_eq!(score(RunStatus::Queued).await, Some(created));

    // A delivery loads the run, starts it and pauses it.
    let start = store.fenced(delta_protocol::Fence::new(1, 1));
    start.load_latest(id, None).await.expect("load");
    let before = zscores().await;
    write_start(&start, id, "start").await;
    assert_eq!(score(RunStatus::Running).await, Some(created));
    assert_eq!(score(RunStatus::Queued).await, None);
    let mut q = delta_protocol::InteractionRequest::new(
        id,
        "a",
        delta_protocol::InteractionType::UserInput,
        "go on?",
    );
    q.sensitive = false;
    delta_e2e::pause_on(&start, id, &q).await;
    assert_eq!(score(RunStatus::WaitingForInput).await, Some(created));
    assert_eq!(
        zscores().await,
        before,
        "the delivery scored the run from the record it loaded"
    );

    // A writer that did not load the run reads its score from `runs:all`.
    store
        .append(
            id,
            vec![msg("on")],
            Some(delta_store::StatusChange::Running),
        )
        .await
        .expect("unfenced write");
    assert_eq!(score(RunStatus::Running).await, Some(created));
    assert_eq!(score(RunStatus::WaitingForInput).await, None);
    assert_eq!(zscores().await, before + 1);
}

/// A question's request is stored packed where the journal is (`z:` and base64), in plain JSON
/// where it is not, and read back the same either way.
#[tokio::test]
async fn a_questions_request_is_packed_with_the_journal_and_read_back_the_same() {
    let redis = delta_e2e::Redis::start().expect("redis-server");
    let mut raw = delta_e2e::redis_raw(&redis.url()).await;
    existing_fleet(&mut raw, "qplain", Some("entry-per-write")).await;
    for (prefix, packed) in [("qpacked", true), ("qplain", false)] {
        let store = RedisRunStore::connect(&redis.url(), prefix)
            .await
            .expect("connect");
        assert_eq!(store.writes_packed_entries(), packed);
        let (id, q) = paused_run(&store, RunStatus::Running, "Which region?", false).await;
        let stored: String = redis::cmd("HGET")
            .arg(format!("{}:ix:{}", store.run_key(id), q.request_id))
            .arg("request")
            .query_async(&mut raw)
            .await
            .expect("hget");
        assert_eq!(stored.starts_with("z:"), packed, "{prefix}: {stored}");
        assert_eq!(stored.contains("Which region?"), !packed, "{prefix}");
        let ix = store
            .interaction(id, q.request_id)
            .await
            .expect("read")
            .expect("exists");
        assert_eq!(ix.request, q, "{prefix}");
        let (run, found) = store
            .find_interaction(q.request_id)
            .await
            .expect("find")
            .expect("found");
        assert_eq!((run, found.request), (id, q), "{prefix}");
    }
}

/// An answer takes its question out of the indexes it is in, and only those: a question with a
/// deadline and an escalation leaves `pending`, `deadlines` and `escalations`; one with neither
/// costs a single `ZREM` (its `pending` entry).
#[tokio::test]
async fn an_answer_leaves_exactly_the_indexes_its_question_is_in() {
    let redis = delta_e2e::Redis::start().expect("redis-server");
    let store = RedisRunStore::connect(&redis.url(), "idx")
        .await
        .expect("connect");
    let raw = delta_e2e::redis_raw(&redis.url()).await;
    let zrems = || delta_e2e::command_calls(&raw, "zrem");
    let member = |key: String, id: String| {
        let mut raw = raw.clone();
        async move {
            let s: Vec<Option<f64>> = redis::cmd("ZMSCORE")
                .arg(&key)
                .arg(id)
                .query_async(&mut raw)
                .await
                .expect("zmscore");
            s[0].is_some()
        }
    };
    let mut zrems_by_kind = vec![];
    for full in [true, false] {
        let rec = RunRecord::new(RunId::new(), "a", "t", RunStatus::Running);
        let id = rec.run_id;
        store.create(rec).await.expect("create");
        let mut q = delta_protocol::InteractionRequest::new(
            id,
            "a",
            delta_protocol::InteractionType::UserInput,
            "Go?",
        );
        if full {
            q.expires_at = Some(
                delta_protocol::Timestamp::from_micros(q.timestamp.micros() + 3_600_000_000)
                    .expect("a time"),
            );
            q.escalation = vec![delta_protocol::human::EscalationStep {
                after: std::time::Duration::from_secs(600),
                remind: true,
                add_responders: vec![],
                apply_default: false,
            }];
        }
        delta_e2e::pause_on(&store, id, &q).await;
        let tag = store
            .run_key(id)
            .strip_suffix(&format!(":run:{id}"))
            .expect("tag")
            .to_owned();
        let rid = q.request_id.to_string();
        let indexes = ["pending", "deadlines", "escalations"];
        let mut before = vec![];
        for i in indexes {
            before.push(member(format!("{tag}:interactions:{i}"), rid.clone()).await);
        }
        assert_eq!(before, [true, full, full], "full: {full}");
        let z0 = zrems().await;
        let mut answer = delta_protocol::InteractionResponse::new(
            q.request_id,
            delta_protocol::Responder::new("ann", delta_protocol::Via::Http),
        );
        answer.input = Some("yes".into());
        assert!(store.answer(&q, &answer).await.expect("answer"));
        zrems_by_kind.push(zrems().await - z0);
        for i in indexes {
            assert!(
                !member(format!("{tag}:interactions:{i}"), rid.clone()).await,
                "{i} after the answer (full: {full})"
            );
        }
    }
    assert_eq!(zrems_by_kind, [3, 1]);
}

/// A write that moves a run off the question it waited on closes that question if it is still
/// pending. A handle that read the question settled skips that check (a resume's first write:
/// one command fewer), so it must not skip it once it reopened the question: here the run then
/// moves on, and the reopened question is closed, not left pending on a run that no longer waits.
#[tokio::test]
async fn a_question_reopened_by_the_handle_that_read_it_settled_is_still_closed_when_left() {
    use delta_store::AnswerStore;
    let redis = delta_e2e::Redis::start().expect("redis-server");
    let store = RedisRunStore::connect(&redis.url(), "t9")
        .await
        .expect("connect");
    let (id, q) = paused_run(&store, RunStatus::Running, "Name?", false).await;
    let a = delta_e2e::typed_answer(q.request_id, "Ada");
    assert!(store.answer(&q, &a).await.expect("answer"));
    let worker = store.fenced(delta_protocol::Fence::new(10, 1));
    worker.load_latest(id, None).await.expect("load");
    let settled = worker.settled(id, q.request_id).await.expect("read");
    assert!(
        settled.is_some_and(|s| s.response.is_some()),
        "read answered"
    );
    // Reopened with the write that moves the run on (not the engine's way: a pause on it again;
    // what the store does with either).
    worker.reopen(id, &q);
    worker
        .append(
            id,
            vec![msg("moved on")],
            Some(delta_store::StatusChange::Running),
        )
        .await
        .expect("append");
    let ix = store
        .interaction(id, q.request_id)
        .await
        .expect("read")
        .expect("the question");
    assert_eq!(
        ix.state,
        delta_protocol::InteractionState::Expired,
        "closed"
    );
    let run = store.record(id).await.expect("record");
    assert_eq!(run.pending_request_id, None);
}

/// A reopen keeps when the refused answer was accepted (`reopened_at`: its announcement's id is
/// made of it) and which job reopened it (`job`: that job announces it), and the settled read
/// tells a resume; the next reopen (another answer, another job) replaces both.
#[tokio::test]
async fn a_reopen_keeps_the_refused_answers_instant_and_the_reopening_job() {
    use delta_store::AnswerStore;
    let redis = delta_e2e::Redis::start().expect("redis-server");
    let store = RedisRunStore::connect(&redis.url(), "t10")
        .await
        .expect("connect");
    let (id, q) = paused_run(&store, RunStatus::Running, "Name?", false).await;
    let read = async || {
        store
            .interaction(id, q.request_id)
            .await
            .expect("read")
            .expect("the question")
    };
    assert_eq!(read().await.reopened_at, None, "never reopened");
    let mut instants = vec![];
    for (seq, name) in [(10, "Ada"), (11, "Grace")] {
        let a = delta_e2e::typed_answer(q.request_id, name);
        assert!(store.answer(&q, &a).await.expect("answer"));
        let answered_at = read().await.answered_at.expect("answered");
        // Its asking job let go unannounced (a worker NATS would not let announce it).
        assert!(
            store
                .mark_unannounced(id, q.request_id)
                .await
                .expect("mark")
        );
        assert!(read().await.unannounced, "{name}: marked");
        let worker = store.fenced(delta_protocol::Fence::new(seq, 1));
        delta_e2e::reopen_refused(&worker, &q).await;
        let ix = read().await;
        assert_eq!(ix.state, delta_protocol::InteractionState::Pending);
        assert!(!ix.unannounced, "{name}: the reopening job announces it");
        assert_eq!(ix.answered_at, None);
        assert_eq!(ix.reopened_at, Some(answered_at), "{name}");
        assert_eq!(ix.asked_by_job, Some(seq), "{name}");
        let settled = store
            .settled(id, q.request_id)
            .await
            .expect("read")
            .expect("the question");
        assert_eq!(settled.response, None);
        assert_eq!(settled.reopened_at, Some(answered_at));
        instants.push(answered_at);
    }
    assert_ne!(instants[0], instants[1], "each reopen its own instant");
    // A pending question (reopened since the marker read it settled) is not marked: the job
    // that reopened it announces it.
    assert!(
        !store
            .mark_unannounced(id, q.request_id)
            .await
            .expect("mark")
    );
    assert!(!read().await.unannounced, "pending: not marked");
    // A question that is gone is not made again by the mark.
    let gone = delta_protocol::RequestId::new();
    assert!(!store.mark_unannounced(id, gone).await.expect("mark"));
    assert!(store.interaction(id, gone).await.expect("read").is_none());
}

/// A resume entry is dropped only when no resume is owed: a run still waiting on its settled
/// question keeps it, however the caller came to ask (a reconciler that read the question
/// pending just before a new answer settled it, which queues the same entry), and a run that
/// went on loses it.
#[tokio::test]
async fn a_resume_still_owed_is_not_dropped() {
    let redis = delta_e2e::Redis::start().expect("redis-server");
    let store = RedisRunStore::connect(&redis.url(), "t12")
        .await
        .expect("connect");
    let (id, q) = paused_run(&store, RunStatus::Running, "Name?", false).await;
    let entries = async || store.due_resumes(i64::MAX, 100).await.expect("due");
    assert!(
        store
            .answer(&q, &delta_e2e::typed_answer(q.request_id, "Ada"))
            .await
            .expect("answer")
    );
    assert_eq!(entries().await, [(id, q.request_id)]);
    assert!(
        !store.drop_resume(id, q.request_id).await.expect("drop"),
        "still owed: the run waits on its answered question"
    );
    assert_eq!(entries().await, [(id, q.request_id)]);

    // The run went on (here cancelled, which takes its own entry out); an entry left over for it
    // is dropped.
    delta_e2e::cancel_run(&store, id, "cancelled by ops").await;
    let mut raw = delta_e2e::redis_raw(&redis.url()).await;
    let _: i64 = redis::cmd("ZADD")
        .arg(store.run_index(id, "resumes"))
        .arg(1)
        .arg(format!("{id}/{}", q.request_id))
        .query_async(&mut raw)
        .await
        .expect("zadd");
    assert_eq!(entries().await, [(id, q.request_id)]);
    assert!(store.drop_resume(id, q.request_id).await.expect("drop"));
    assert!(entries().await.is_empty());
}

/// A settling that wins over a question the engine reopened says so, with the reopen's instant
/// and job, whether it carries the run for its resume job or not: a gateway answering from a
/// copy of the question heard before the reopen learns of it there (and announces it, if its
/// reopening delivery may have died first).
#[tokio::test]
async fn a_settling_reports_the_reopen_it_won_over() {
    use delta_store::redis::{Reopened, Resolution};
    let redis = delta_e2e::Redis::start().expect("redis-server");
    let store = RedisRunStore::connect(&redis.url(), "t11")
        .await
        .expect("connect");
    let raw = delta_e2e::redis_raw(&redis.url()).await;
    for carried in [false, true] {
        let (id, q) = paused_run(&store, RunStatus::Running, "Name?", false).await;
        if carried {
            // A run with a snapshot is carried: the settling returns its fields, and the
            // question's.
            let _: i64 = redis::cmd("HSET")
                .arg(store.run_key(id))
                .arg("snap")
                .arg("a snapshot")
                .query_async(&mut raw.clone())
                .await
                .expect("hset");
        }
        let settle = async |name: &str| {
            store
                .resolve_carrying(
                    &q,
                    Resolution::Answer(
                        &delta_e2e::typed_answer(q.request_id, name),
                        delta_protocol::Timestamp::now(),
                    ),
                    std::time::Duration::from_secs(5),
                )
                .await
                .expect("settle")
        };
        let first = settle("Ada").await;
        assert_eq!(first.lost, None, "won");
        assert_eq!(first.paused.is_some(), carried);
        assert_eq!(first.reopened, None, "never reopened (carried: {carried})");
        let refused_at = store
            .interaction(id, q.request_id)
            .await
            .expect("read")
            .expect("the question")
            .answered_at
            .expect("answered");
        let worker = store.fenced(delta_protocol::Fence::new(42, 1));
        delta_e2e::reopen_refused(&worker, &q).await;
        let second = settle("Grace").await;
        assert_eq!(second.lost, None, "won");
        assert_eq!(second.paused.is_some(), carried);
        assert_eq!(
            second.reopened,
            Some(Reopened {
                at: refused_at,
                job: Some(42)
            }),
            "carried: {carried}"
        );
        let third = settle("Edsger").await;
        assert_eq!(third.lost, Some(delta_protocol::InteractionState::Answered));
        assert_eq!(third.reopened, None, "lost: nothing to report");
    }
}

/// A handle that took its run as carried confirms it before a side effect its writes do not
/// fence (`RunStore::confirm`): a write of nothing, refused as its first write would be (here
/// the run was cancelled since, or another job started it). Confirmed once, or read, nothing more
/// is sent.
#[tokio::test]
async fn a_carried_run_is_confirmed_with_one_write_of_nothing() {
    let redis = delta_e2e::Redis::start().expect("redis-server");
    let store = RedisRunStore::connect(&redis.url(), "confirm")
        .await
        .expect("connect");
    let raw = delta_e2e::redis_raw(&redis.url()).await;
    let scripts = async || delta_e2e::command_calls(&raw, "evalsha").await;
    let fresh = async || {
        let rec = RunRecord::new(RunId::new(), "hello", "t", RunStatus::Queued);
        store.create(rec.clone()).await.expect("create");
        (rec.run_id, rec.fresh())
    };

    // Cancelled between its submission and its job's delivery.
    let (id, carried) = fresh().await;
    store
        .append(
            id,
            vec![msg("cancelled")],
            Some(delta_store::StatusChange::Finished {
                status: delta_store::Terminal::Cancelled,
                result: None,
                error: Some("cancelled".into()),
            }),
        )
        .await
        .expect("cancel");
    let handle = store.fenced(delta_protocol::Fence::new(3, 1));
    handle.start_fresh(RunRecord::of_fresh(id, carried));
    let err = handle.confirm(id).await.expect_err("refused");
    assert!(
        matches!(err, delta_store::Error::Terminal { .. }),
        "{err:?}"
    );

    // Started by another job meanwhile.
    let (id, carried) = fresh().await;
    let other = store.fenced(delta_protocol::Fence::new(5, 1));
    other.load(id).await.expect("load");
    write_start(&other, id, "start").await;
    let handle = store.fenced(delta_protocol::Fence::new(4, 1));
    handle.start_fresh(RunRecord::of_fresh(id, carried));
    let err = handle.confirm(id).await.expect_err("refused");
    assert!(matches!(err, delta_store::Error::Fenced(_)), "{err:?}");

    // Still as carried: confirmed once, with nothing written to its journal; then no more.
    let (id, carried) = fresh().await;
    let handle = store.fenced(delta_protocol::Fence::new(6, 1));
    handle.start_fresh(RunRecord::of_fresh(id, carried));
    let before = scripts().await;
    handle.confirm(id).await.expect("confirmed");
    assert_eq!(scripts().await, before + 1, "one write");
    handle.confirm(id).await.expect("confirmed");
    assert_eq!(scripts().await, before + 1, "once");
    let run = store.load(id).await.expect("load");
    assert!(run.journal.is_empty());
    assert_eq!(run.record.status, RunStatus::Queued);
    write_start(&handle, id, "its writes go on").await;
    // A handle that read the run has nothing to confirm.
    let reader = store.fenced(delta_protocol::Fence::new(7, 1));
    reader.load(id).await.expect("load");
    let before = scripts().await;
    reader.confirm(id).await.expect("nothing to do");
    assert_eq!(scripts().await, before, "nothing sent");
}
