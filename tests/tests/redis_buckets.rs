//! The bucketed Redis layout (issue 15, Redis Cluster): every key a run's lifecycle writes lives
//! in one cluster slot with the indexes that name it; listings merge the buckets and page
//! without skips or repeats; a program with another bucket count is refused; the layout of
//! before the buckets is migrated.

use std::collections::{BTreeSet, HashMap};

use delta_protocol::{
    Event, InteractionRequest, InteractionResponse, InteractionType, MessageLevel, Responder,
    RunId, RunStatus, SystemMessage, Timestamp, Via,
};
use delta_store::redis::{Migrated, RedisRunStore, Submitted};
use delta_store::{Error, RunRecord, RunStore, StatusChange, Terminal};

use delta_e2e::{cluster_slot as slot, crc16};

#[test]
fn the_slot_function_is_redis_clusters() {
    // The reference value of the Redis Cluster specification.
    assert_eq!(crc16(b"123456789"), 0x31C3);
    assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
    assert_eq!(slot("foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
}

fn msg(text: &str) -> Event {
    Event::SystemMessage(SystemMessage {
        level: MessageLevel::Info,
        content: text.into(),
    })
}

fn question(run: RunId, prompt: &str) -> InteractionRequest {
    let mut q = InteractionRequest::new(run, "a", InteractionType::UserInput, prompt);
    q.expires_at = Some(q.timestamp.plus_seconds(3600));
    q
}

/// A run through its whole life: submitted with an idempotency key, paused, answered, paused
/// again, failed, put back in the queue, finished. Returns its id and its questions.
async fn lifecycle(store: &RedisRunStore, key: &str) -> (RunId, Vec<InteractionRequest>) {
    let rec = RunRecord::new(store.run_id_for_key(key), "a", "t", RunStatus::Queued);
    let id = rec.run_id;
    assert_eq!(
        store
            .create_indexed(&rec, Some((key, "fp")))
            .await
            .expect("create"),
        Submitted::Created
    );
    store.set_job_seq(id, 1).await.expect("job seq");
    let q1 = question(id, "name?");
    store
        .append(
            id,
            vec![Event::HumanInputRequest(Box::new(q1.clone()))],
            Some(StatusChange::Waiting(Box::new(q1.clone()))),
        )
        .await
        .expect("pause");
    let mut a = InteractionResponse::new(
        q1.request_id,
        Responder {
            id: "bob".into(),
            via: Via::Http,
            on_behalf_of: None,
            relayed_by: None,
        },
    );
    a.input = Some("Ada".into());
    assert!(store.answer(&q1, &a).await.expect("answer"));
    store
        .resume_published(id, q1.request_id, 7, Timestamp::now().micros())
        .await
        .expect("published");
    let q2 = question(id, "again?");
    store
        .append(
            id,
            vec![Event::HumanInputRequest(Box::new(q2.clone()))],
            Some(StatusChange::Waiting(Box::new(q2.clone()))),
        )
        .await
        .expect("pause again");
    store
        .append(
            id,
            vec![msg("dead-lettered")],
            Some(StatusChange::Finished {
                status: Terminal::Failed,
                result: None,
                error: Some("poison".into()),
            }),
        )
        .await
        .expect("fail");
    store
        .requeue_failed(id, "retried", "poison", Some(&q2))
        .await
        .expect("requeue");
    store
        .append(id, vec![msg("done")], Some(delta_e2e::completed_ok()))
        .await
        .expect("finish");
    (id, vec![q1, q2])
}

/// Every key under `prefix` with the text of its members, fields and values.
async fn keys_and_contents(url: &str, prefix: &str) -> HashMap<String, String> {
    let mut c = delta_e2e::redis_raw(url).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query_async(&mut c)
        .await
        .expect("keys");
    let mut out = HashMap::new();
    for k in keys {
        let kind: String = redis::cmd("TYPE")
            .arg(&k)
            .query_async(&mut c)
            .await
            .expect("type");
        let text = match kind.as_str() {
            "zset" => {
                let m: Vec<String> = redis::cmd("ZRANGE")
                    .arg(&k)
                    .arg(0)
                    .arg(-1)
                    .query_async(&mut c)
                    .await
                    .expect("zrange");
                m.join(" ")
            }
            "hash" => {
                let m: Vec<String> = redis::cmd("HGETALL")
                    .arg(&k)
                    .query_async(&mut c)
                    .await
                    .expect("hgetall");
                m.join(" ")
            }
            "string" => {
                let v: String = redis::cmd("GET")
                    .arg(&k)
                    .query_async(&mut c)
                    .await
                    .expect("get");
                v
            }
            _ => String::new(),
        };
        out.insert(k, text);
    }
    out
}

/// Issue 15: a state change is one script in one slot. Every key a run's lifecycle writes
/// (record, journal, questions, idempotency key) and every index entry that names the run or
/// one of its questions is in the slot of the run's record; the only keys outside the buckets
/// are the bucket count and the worker heartbeats, which no script touches.
#[tokio::test]
async fn a_runs_keys_and_the_indexes_that_name_it_share_one_slot() {
    let redis = delta_e2e::Redis::start().expect("redis-server");
    let store = RedisRunStore::connect(&redis.url(), "sl")
        .await
        .expect("connect");
    assert_eq!(store.buckets(), 16);
    let mut runs = vec![];
    for i in 0..6 {
        runs.push(lifecycle(&store, &format!("key-{i}")).await);
    }
    // A run paused for good, and one purged: their keys and entries are checked too.
    let (paused, _) = {
        let rec = RunRecord::new(RunId::new(), "a", "t", RunStatus::Queued);
        let id = rec.run_id;
        store.create(rec).await.expect("create");
        let q = question(id, "still?");
        store
            .append(
                id,
                vec![Event::HumanInputRequest(Box::new(q.clone()))],
                Some(StatusChange::Waiting(Box::new(q.clone()))),
            )
            .await
            .expect("pause");
        (id, q)
    };
    store.heartbeat("w1").await.expect("heartbeat");
    let contents = keys_and_contents(&redis.url(), "sl").await;
    // The keys the store names are the ones its scripts wrote: `<tag>:run:<id>` and under it.
    for (id, qs) in &runs {
        let key = store.run_key(*id);
        assert_eq!(key, format!("{}:run:{id}", store.tag(store.bucket(*id))));
        assert!(contents.contains_key(&key), "{key}");
        assert!(contents.contains_key(&format!("{key}:journal")), "{key}");
        for q in qs {
            let ix = store.interaction_key(*id, &q.request_id.to_string());
            assert_eq!(ix, format!("{key}:ix:{}", q.request_id));
            assert!(contents.contains_key(&ix), "{ix}");
        }
    }
    let singletons = [
        "sl:buckets",
        "sl:workers",
        "sl:journal-format",
        "sl:finished-index",
    ];
    let mut buckets_seen = BTreeSet::new();
    for (key, text) in &contents {
        if singletons.contains(&key.as_str()) {
            continue;
        }
        assert!(key.starts_with("sl:{b"), "{key} is in a bucket");
        let k: u32 = key["sl:{b".len()..]
            .split('}')
            .next()
            .and_then(|n| n.parse().ok())
            .expect("bucket number");
        buckets_seen.insert(k);
        assert_eq!(slot(key), slot(&store.tag(k)), "{key}");
        let all = runs
            .iter()
            .map(|(id, qs)| (*id, qs.clone()))
            .chain([(paused, vec![])]);
        for (id, qs) in all {
            let named = key.contains(&id.to_string())
                || text.contains(&id.to_string())
                || qs.iter().any(|q| {
                    let rid = q.request_id.to_string();
                    key.contains(&rid) || text.split(' ').any(|m| m == rid)
                });
            if named {
                assert_eq!(
                    slot(key),
                    slot(&store.run_key(id)),
                    "{key} names run {id} and lives in its slot"
                );
            }
        }
    }
    assert!(buckets_seen.len() > 1, "runs spread over buckets");
    // Retention deletes a run whole: the scripts' keys again in one slot.
    let cutoff = Timestamp::now().micros();
    let pass = store.purge_finished(cutoff, 100).await.expect("purge");
    assert_eq!(pass.purged, runs.len());
    let left = keys_and_contents(&redis.url(), "sl").await;
    for (id, _) in &runs {
        assert!(
            left.iter()
                .all(|(k, v)| !k.contains(&id.to_string()) && !v.contains(&id.to_string())),
            "{id} is gone whole"
        );
    }
}

/// `GET /v1/runs` and `/v1/interactions` read every bucket: pages of any size, newest or oldest
/// first, give each entry once in `(score, id)` order, entries with one score included (ties
/// across buckets), while runs are added between pages.
#[tokio::test]
async fn listings_merge_the_buckets_and_page_without_skips_or_repeats() {
    let redis = delta_e2e::Redis::start().expect("redis-server");
    let store = RedisRunStore::connect_buckets(&redis.url(), "pg", None, 7)
        .await
        .expect("connect");
    listings_page_through(&store).await;
}

/// 40 runs (in groups of four with the same creation time) listed in pages of every size, both
/// ways, runs arriving meanwhile: each once, in order.
async fn listings_page_through(store: &RedisRunStore) {
    let base = Timestamp::now().micros();
    let mut first = vec![];
    for i in 0..40i64 {
        let mut rec = RunRecord::new(RunId::new(), "a", "t", RunStatus::Queued);
        // Groups of four runs with the same creation time.
        rec.created_at = Timestamp::from_micros(base - 1_000_000 + (i / 4) * 1000).expect("a time");
        first.push((rec.run_id.to_string(), rec.created_at.micros()));
        store.create(rec).await.expect("create");
    }
    let buckets: BTreeSet<u32> = first
        .iter()
        .map(|(id, _)| store.bucket(id.parse().expect("id")))
        .collect();
    assert!(buckets.len() > 3, "{buckets:?}");
    for newest_first in [true, false] {
        for page_size in [1, 3, 7, 40, 100] {
            let mut want = first.clone();
            want.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
            if newest_first {
                want.reverse();
            }
            let mut got = vec![];
            let mut cursor: Option<String> = None;
            loop {
                let page = store
                    .index_page("runs:all", newest_first, cursor.as_deref(), page_size)
                    .await
                    .expect("page")
                    .expect("good cursor");
                got.extend(page.entries.iter().cloned());
                // New runs arrive meanwhile (during the first pages, so that an oldest-first
                // walk, which meets them at its end, ends): newer than everything listed.
                if got.len() <= 10 {
                    let rec = RunRecord::new(RunId::new(), "a", "t", RunStatus::Queued);
                    store.create(rec).await.expect("create");
                }
                let Some((m, s)) = page.entries.last() else {
                    break;
                };
                if !page.more {
                    break;
                }
                cursor = Some(delta_store::redis::Page::cursor(m, *s));
            }
            let got: Vec<(String, i64)> = got
                .into_iter()
                .filter(|(id, _)| first.iter().any(|(f, _)| f == id))
                .collect();
            if newest_first {
                // Runs added meanwhile are newer: never in a later page.
                assert_eq!(got, want, "newest first, pages of {page_size}");
            } else {
                assert_eq!(got, want, "oldest first, pages of {page_size}");
            }
        }
    }
    // A cursor that is not one: refused (the API answers 400).
    assert!(
        store
            .index_page("runs:all", true, Some("garbage"), 5)
            .await
            .expect("read")
            .is_none()
    );
    // Counts add the buckets up.
    let (by_status, _) = store.counts().await.expect("counts");
    assert!(by_status[&RunStatus::Queued] >= 40);
}

/// The request id → run lookup needs no bucket; deadlines and resumes are found in every bucket.
#[tokio::test]
async fn lookups_and_reconcilers_cover_every_bucket() {
    let redis = delta_e2e::Redis::start().expect("redis-server");
    let store = RedisRunStore::connect_buckets(&redis.url(), "rc", None, 5)
        .await
        .expect("connect");
    // A round of the reconcilers with nothing due is one round trip, over every bucket and
    // index.
    let trips = store.round_trips();
    let now = Timestamp::now().micros();
    let due = store.due(now, Some(now), 100).await.expect("due");
    assert_eq!(store.round_trips() - trips, 1);
    assert_eq!(due, delta_store::redis::Due::default());
    lookups_and_reconcilers(&store).await;
}

/// 12 paused runs with deadlines past: found by request id, by deadline, by resume, by the
/// lost-job walk, each once.
async fn lookups_and_reconcilers(store: &RedisRunStore) {
    let mut asked = vec![];
    for _ in 0..12 {
        let rec = RunRecord::new(RunId::new(), "a", "t", RunStatus::Queued);
        let id = rec.run_id;
        store.create(rec).await.expect("create");
        let mut q = question(id, "now?");
        q.expires_at = Timestamp::from_micros(Timestamp::now().micros() - 1000);
        store
            .append(
                id,
                vec![Event::HumanInputRequest(Box::new(q.clone()))],
                Some(StatusChange::Waiting(Box::new(q.clone()))),
            )
            .await
            .expect("pause");
        asked.push(q);
    }
    for q in &asked {
        assert_eq!(
            store.interaction_run(q.request_id).await.expect("lookup"),
            Some(q.run_id)
        );
    }
    let ids: Vec<_> = asked.iter().map(|q| q.request_id).collect();
    assert_eq!(store.interactions(&ids).await.expect("read").len(), 12);
    let now = Timestamp::now().micros();
    let due: BTreeSet<_> = store
        .due_deadlines(now, 100)
        .await
        .expect("due")
        .into_iter()
        .collect();
    let want: BTreeSet<_> = asked.iter().map(|q| (q.run_id, q.request_id)).collect();
    assert_eq!(due, want);
    assert_eq!(store.due_deadlines(now, 5).await.expect("due").len(), 5);
    // A round's read finds the same, in one round trip and one for the questions' runs.
    let trips = store.round_trips();
    let round = store.due(now, Some(now), 100).await.expect("due");
    assert_eq!(store.round_trips() - trips, 2);
    assert_eq!(round.deadlines.into_iter().collect::<BTreeSet<_>>(), want);
    assert!(round.escalations.is_empty() && round.resumes.is_empty() && round.purge.is_empty());
    let mut a = InteractionResponse::new(
        asked[0].request_id,
        Responder {
            id: "bob".into(),
            via: Via::Http,
            on_behalf_of: None,
            relayed_by: None,
        },
    );
    a.input = Some("x".into());
    for q in &asked {
        a.request_id = q.request_id;
        assert!(store.answer(q, &a).await.expect("answer"));
    }
    let later = now + 60_000_000;
    let resumes: BTreeSet<_> = store
        .due_resumes(later, 100)
        .await
        .expect("resumes")
        .into_iter()
        .collect();
    assert_eq!(resumes, want);
    let round = store.due(later, None, 100).await.expect("due");
    assert_eq!(round.resumes.into_iter().collect::<BTreeSet<_>>(), want);
    assert!(round.deadlines.is_empty(), "answered: no deadline left");
    // The lost-job walk sees every waiting run once over its steps.
    let mut seen = BTreeSet::new();
    let mut offset = 0;
    loop {
        let (runs, next) = store
            .queue_runs(RunStatus::WaitingForInput, offset, 4)
            .await
            .expect("walk");
        for r in runs {
            assert!(seen.insert(r.run_id), "{} twice", r.run_id);
        }
        if next == 0 {
            break;
        }
        offset = next;
    }
    assert_eq!(seen.len(), 12);
}

/// The bucket count is fixed at the first start: a program with another one is refused.
#[tokio::test]
async fn a_program_with_another_bucket_count_is_refused() {
    let redis = delta_e2e::Redis::start().expect("redis-server");
    let first = RedisRunStore::connect_buckets(&redis.url(), "cf", None, 8).await;
    assert!(first.is_ok());
    let other = RedisRunStore::connect_buckets(&redis.url(), "cf", None, 16).await;
    assert!(matches!(other, Err(Error::Buckets(_))), "{:?}", other.err());
    let again = RedisRunStore::connect_buckets(&redis.url(), "cf", None, 8).await;
    assert!(again.is_ok());
    // A program given no count (DELTA_REDIS_BUCKETS unset) takes the one Redis holds, and a
    // new deployment's default otherwise.
    let unset = delta_store::redis::Options::default();
    let adopted = RedisRunStore::connect_options(&redis.url(), "cf", &unset)
        .await
        .expect("takes the stored count");
    assert_eq!(adopted.buckets(), 8);
    let fresh = RedisRunStore::connect_options(&redis.url(), "cf-new", &unset)
        .await
        .expect("a new deployment");
    assert_eq!(fresh.buckets(), delta_store::redis::DEFAULT_BUCKETS);
    // Nonsense counts and prefixes are refused before anything is written.
    for (prefix, n) in [("cf2", 0), ("cf2", 100_000), ("c{f}", 8)] {
        let bad = RedisRunStore::connect_buckets(&redis.url(), prefix, None, n).await;
        assert!(matches!(bad, Err(Error::Buckets(_))), "{prefix} {n}");
    }
    let mut c = delta_e2e::redis_raw(&redis.url()).await;
    for pattern in ["cf2*", "c{f}*"] {
        let written: Vec<String> = redis::cmd("KEYS")
            .arg(pattern)
            .query_async(&mut c)
            .await
            .expect("keys");
        assert_eq!(written, Vec::<String>::new(), "{pattern}");
    }
}

/// The layout of before the buckets: `<p>:run:{<id>}…` and global indexes. Written here by
/// moving the keys of a bucketed store of one bucket back to their old names, which is what
/// the old version wrote (same scripts, other key names).
async fn make_old_layout(url: &str, store: &RedisRunStore) {
    let p = store.prefix().to_owned();
    let tag = store.tag(0);
    let mut c = delta_e2e::redis_raw(url).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{p}:*"))
        .query_async(&mut c)
        .await
        .expect("keys");
    for key in keys {
        let old = if key == format!("{p}:buckets") {
            let _: () = redis::cmd("DEL")
                .arg(&key)
                .query_async(&mut c)
                .await
                .expect("del");
            continue;
        } else if let Some(rest) = key.strip_prefix(&format!("{tag}:run:")) {
            let (id, suffix) = rest.split_at(36);
            format!("{p}:run:{{{id}}}{suffix}")
        } else if let Some(rest) = key.strip_prefix(&format!("{tag}:")) {
            format!("{p}:{rest}")
        } else {
            continue;
        };
        let _: () = redis::cmd("RENAME")
            .arg(&key)
            .arg(&old)
            .query_async(&mut c)
            .await
            .expect("rename");
        if old.starts_with(&format!("{p}:run:{{")) && old.len() == p.len() + 5 + 38 {
            // A record: it names its idempotency key by its old name.
            let idem: Option<String> = redis::cmd("HGET")
                .arg(&old)
                .arg("idempotency_key")
                .query_async(&mut c)
                .await
                .expect("hget");
            if let Some(i) = idem {
                let _: () = redis::cmd("HSET")
                    .arg(&old)
                    .arg("idempotency_key")
                    .arg(i.replace(&format!("{tag}:"), &format!("{p}:")))
                    .query_async(&mut c)
                    .await
                    .expect("hset");
            }
        }
    }
}

/// `delta migrate-redis`: a fleet's keys in the layout of before the buckets are refused at
/// start, moved by the migration (runs, questions, every index, idempotency keys with their
/// time to live), and work afterwards; migrating again moves nothing.
#[tokio::test]
async fn migration_moves_the_layout_of_before_the_buckets() {
    let redis = delta_e2e::Redis::start().expect("redis-server");
    let url = redis.url();
    let old = RedisRunStore::connect_buckets(&url, "mg", None, 1)
        .await
        .expect("connect");
    let (done, qs) = lifecycle(&old, "key-done").await;
    let rec = RunRecord::new(
        old.run_id_for_key("key-paused"),
        "a",
        "t",
        RunStatus::Queued,
    );
    let paused = rec.run_id;
    old.create_indexed(&rec, Some(("key-paused", "fp")))
        .await
        .expect("create");
    let q = question(paused, "still?");
    old.append(
        paused,
        vec![Event::HumanInputRequest(Box::new(q.clone()))],
        Some(StatusChange::Waiting(Box::new(q.clone()))),
    )
    .await
    .expect("pause");
    let pending_before = old
        .index_page("interactions:pending", true, None, 10)
        .await
        .expect("page")
        .expect("cursor");
    let runs_before = old
        .index_page("runs:all", true, None, 10)
        .await
        .expect("page")
        .expect("cursor");
    make_old_layout(&url, &old).await;
    let dump = delta_e2e::redis_dump(&url, "mg:*").await;
    assert!(dump.contains(&format!("mg:run:{{{paused}}}")), "{dump}");

    // Not started on the old layout.
    let refused = RedisRunStore::connect_buckets(&url, "mg", None, 16).await;
    assert!(matches!(refused, Err(Error::Buckets(_))));

    // Cut short (as Ctrl+C does) once the runs' keys are moved, then run again: it finishes.
    let cut = RedisRunStore::migrate_layout_with(&url, "mg", None, 16, &|what, _, _| {
        what == "runs' keys"
    })
    .await
    .expect("cut short");
    assert!(cut.interrupted, "{cut:?}");
    assert!(cut.run_keys >= 5, "{cut:?}");
    assert_eq!(cut.idempotency_keys, 0, "stopped before them: {cut:?}");
    let moved = RedisRunStore::migrate_layout(&url, "mg", None, 16)
        .await
        .expect("migrate");
    assert!(!moved.interrupted, "{moved:?}");
    assert_eq!(moved.run_keys, 0, "moved already: {moved:?}");
    assert!(moved.index_entries > 0, "{moved:?}");
    assert_eq!(moved.idempotency_keys, 2);
    assert_eq!(moved.skipped, 0);
    let again = RedisRunStore::migrate_layout(&url, "mg", None, 16)
        .await
        .expect("migrate again");
    assert_eq!(again, Migrated::default());
    let other = RedisRunStore::migrate_layout(&url, "mg", None, 8).await;
    assert!(matches!(other, Err(Error::Buckets(_))));

    let store = RedisRunStore::connect_buckets(&url, "mg", None, 16)
        .await
        .expect("connect after the migration");
    let c = keys_and_contents(&url, "mg").await;
    assert!(
        c.keys()
            .all(|k| ["mg:buckets", "mg:journal-format", "mg:finished-index"]
                .contains(&k.as_str())
                || k.starts_with("mg:{b")),
        "{c:?}"
    );
    assert_eq!(
        store.load(done).await.expect("done").record.status,
        RunStatus::Completed
    );
    assert_eq!(store.load(done).await.expect("journal").journal.len(), 5);
    assert_eq!(
        store
            .interaction_run(qs[0].request_id)
            .await
            .expect("lookup"),
        Some(done)
    );
    assert_eq!(
        store.interaction_run(q.request_id).await.expect("lookup"),
        Some(paused)
    );
    let page = store
        .index_page("interactions:pending", true, None, 10)
        .await
        .expect("page")
        .expect("cursor");
    assert_eq!(page.entries, pending_before.entries);
    assert!(
        page.entries
            .iter()
            .any(|(id, _)| *id == q.request_id.to_string())
    );
    let runs = store
        .index_page("runs:all", true, None, 10)
        .await
        .expect("page")
        .expect("cursor");
    assert_eq!(runs.entries, runs_before.entries);
    assert_eq!(runs.entries.len(), 2);
    // The paused run's question can be answered, and its submission key still holds.
    let mut a = InteractionResponse::new(
        q.request_id,
        Responder {
            id: "bob".into(),
            via: Via::Http,
            on_behalf_of: None,
            relayed_by: None,
        },
    );
    a.input = Some("yes".into());
    assert!(store.answer(&q, &a).await.expect("answer"));
    let retry = RunRecord::new(
        store.run_id_for_key("key-paused"),
        "a",
        "t",
        RunStatus::Queued,
    );
    assert_eq!(
        store
            .create_indexed(&retry, Some(("key-paused", "fp")))
            .await
            .expect("submit again"),
        Submitted::Existing {
            run_id: paused,
            fingerprint: "fp".into()
        }
    );
    // Retention still deletes a migrated run whole.
    let cutoff = Timestamp::now().micros();
    assert_eq!(
        store
            .purge_finished(cutoff, 10)
            .await
            .expect("purge")
            .purged,
        1
    );
    // Its idempotency key, moved to another bucket than the run's, expires on its own (24 h).
    let left = keys_and_contents(&url, "mg").await;
    for (k, v) in &left {
        if !k.contains(":idempotency:") {
            assert!(
                !k.contains(&done.to_string()) && !v.contains(&done.to_string()),
                "{k}: {v}"
            );
        }
    }
}

/// The same store on a Redis Cluster of 3 masters with a replica each, logged in as the fleet's
/// roles: every write waits for a replica (the cluster's default durability), the runs' keys
/// spread over the three masters, listings, lookups and reconcilers see every bucket across the
/// nodes, a run's whole life (each state change one script in one slot) works, a journal tail
/// follows a run, and `INFO` is read per master. One seed URL is enough; several URLs without
/// cluster mode are refused, saying what to set.
#[tokio::test(flavor = "multi_thread")]
async fn the_store_works_the_same_on_a_redis_cluster() {
    use delta_e2e::RedisRole;
    use delta_store::redis::{Durability, Options};
    let cluster = delta_launcher::RedisCluster::start(
        3,
        1,
        &delta_launcher::servers::ServerOptions::default(),
    )
    .expect("a Redis Cluster");
    let options = Options {
        cluster: true,
        ..Options::default()
    };
    let store = RedisRunStore::connect_options(&cluster.url_as(RedisRole::Gateway), "cl", &options)
        .await
        .expect("connect to the cluster")
        .with_durability(Durability::default_for(true))
        .await
        .expect("every master has a replica");
    assert!(store.is_cluster());
    // A new deployment on a cluster spreads its runs over 64 buckets (even over 3 masters).
    assert_eq!(store.buckets(), delta_store::redis::DEFAULT_CLUSTER_BUCKETS);
    let workers = cluster.url_as(RedisRole::Worker);
    let one_seed = workers.split(',').next_back().expect("a node");
    let worker = RedisRunStore::connect_options(one_seed, "cl", &options)
        .await
        .expect("one seed is enough")
        .with_durability(Durability::default_for(true))
        .await
        .expect("replicas");

    listings_page_through(&store).await;
    lookups_and_reconcilers(&worker).await;
    let (id, questions) = lifecycle(&store, "key-1").await;
    let run = worker.load(id).await.expect("load");
    assert_eq!(run.record.status, RunStatus::Completed);
    assert_eq!(
        worker
            .interaction(id, questions[0].request_id)
            .await
            .expect("read")
            .expect("stored")
            .state,
        delta_protocol::InteractionState::Answered
    );

    // A tail on a connection of its own sees what is written after it started waiting.
    let rec = RunRecord::new(RunId::new(), "a", "t", RunStatus::Queued);
    let tailed = rec.run_id;
    worker.create(rec).await.expect("create");
    let mut tail = store.journal_tail(tailed).await.expect("tail");
    let writer = worker.clone();
    let write = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        writer
            .append(tailed, vec![msg("late")], None)
            .await
            .expect("append")
    });
    let events = tail.next(0, 10_000).await.expect("tail");
    write.await.expect("writer");
    assert_eq!(events.len(), 1, "{events:?}");

    // The keys spread over every master.
    let admin = RedisRunStore::connect_options(&cluster.url_as(RedisRole::Admin), "cl", &options)
        .await
        .expect("admin");
    let masters = admin.info_by_master("keyspace").await.expect("info");
    assert_eq!(masters.len(), 3, "{masters:?}");
    for (node, fields) in &masters {
        let keys: u64 = fields
            .get("db0")
            .and_then(|v| v.split(',').next())
            .and_then(|k| k.strip_prefix("keys="))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert!(keys > 10, "master {node} holds {keys} keys");
    }
    let summed = admin.info("keyspace").await.expect("info");
    assert!(summed["db0"].starts_with("keys="), "{summed:?}");

    // Several URLs without cluster mode: refused, saying what to do.
    let refused = RedisRunStore::connect_options(&workers, "cl", &Options::default()).await;
    let text = format!("{:?}", refused.err().expect("refused"));
    assert!(text.contains("DELTA_REDIS_CLUSTER=1"), "{text}");
    assert!(!text.contains('@'), "no password in the error: {text}");
}

/// A journal that lost writes its writer made (as when Redis fails over to a replica that had
/// not received them): that writer's next write is refused (`Rewound`) and changes nothing, and
/// the next delivery, which loads the journal as it is, goes on.
#[tokio::test]
async fn a_journal_that_lost_writes_refuses_the_writer_that_made_them() {
    let redis = delta_e2e::Redis::start().expect("redis-server");
    let store = RedisRunStore::connect(&redis.url(), "rw")
        .await
        .expect("connect");
    let rec = RunRecord::new(RunId::new(), "a", "t", RunStatus::Queued);
    let id = rec.run_id;
    store.create(rec).await.expect("create");
    let first = store.fenced(delta_protocol::Fence {
        stream_seq: 1,
        delivery: 1,
    });
    first.load(id).await.expect("load");
    first
        .append(id, vec![msg("one"), msg("two")], None)
        .await
        .expect("append");
    // The second event is lost, as a failover to a replica that had only the first loses it:
    // the journal as the replica has it.
    let mut raw = delta_e2e::redis_raw(&redis.url()).await;
    let journal = format!("{}:journal", store.run_key(id));
    let kept = store.load(id).await.expect("load").journal[0].clone();
    let _: () = redis::pipe()
        .del(&journal)
        .ignore()
        .cmd("XADD")
        .arg(&journal)
        .arg("1-0")
        .arg("e")
        .arg(delta_protocol::journal::to_line(&kept).trim_end())
        .ignore()
        .cmd("HSET")
        .arg(store.run_key(id))
        .arg("seq")
        .arg(1)
        .ignore()
        .query_async(&mut raw)
        .await
        .expect("rewind");
    let refused = first.append(id, vec![msg("three")], None).await;
    assert!(
        matches!(refused, Err(Error::Rewound(r)) if r == id),
        "{refused:?}"
    );
    assert_eq!(store.load(id).await.expect("load").journal.len(), 1);
    // The job's next delivery goes on from the journal as it is.
    let next = store.fenced(delta_protocol::Fence {
        stream_seq: 1,
        delivery: 2,
    });
    assert_eq!(next.load(id).await.expect("load").journal.len(), 1);
    next.append(id, vec![msg("two again")], None)
        .await
        .expect("the next delivery writes");
    assert_eq!(store.load(id).await.expect("load").journal.len(), 2);
}

/// A write its writer sends again after it was applied (the Redis client resends a command when
/// its connection drops, as at a failover, and the script may have run before the drop): the
/// journal is longer than that writer left it, so the second copy is refused (`Rewound`) and
/// changes nothing, instead of journaling the same events twice; the next delivery goes on.
#[tokio::test]
async fn a_write_applied_already_is_refused_when_it_comes_again() {
    let redis = delta_e2e::Redis::start().expect("redis-server");
    let store = RedisRunStore::connect(&redis.url(), "ra")
        .await
        .expect("connect");
    let rec = RunRecord::new(RunId::new(), "a", "t", RunStatus::Queued);
    let id = rec.run_id;
    store.create(rec).await.expect("create");
    let writer = store.fenced(delta_protocol::Fence {
        stream_seq: 1,
        delivery: 1,
    });
    writer.load(id).await.expect("load");
    writer
        .append(id, vec![msg("one")], None)
        .await
        .expect("append");
    // The next write reaches Redis and runs, but its reply is lost with the connection: the
    // journal holds it, and the writer still has the length it left before it.
    let mut raw = delta_e2e::redis_raw(&redis.url()).await;
    let journal = format!("{}:journal", store.run_key(id));
    let mut second = store.load(id).await.expect("load").journal[0].clone();
    second.seq = 2;
    second.event = msg("two");
    let applied = delta_protocol::journal::to_line(&second)
        .trim_end()
        .to_owned();
    let _: () = redis::pipe()
        .cmd("XADD")
        .arg(&journal)
        .arg("2-0")
        .arg("e")
        .arg(&applied)
        .ignore()
        .cmd("HSET")
        .arg(store.run_key(id))
        .arg("seq")
        .arg(2)
        .ignore()
        .query_async(&mut raw)
        .await
        .expect("the first copy");
    let again = writer.append(id, vec![msg("two")], None).await;
    assert!(
        matches!(again, Err(Error::Rewound(r)) if r == id),
        "{again:?}"
    );
    assert_eq!(store.load(id).await.expect("load").journal.len(), 2);
    let next = store.fenced(delta_protocol::Fence {
        stream_seq: 1,
        delivery: 2,
    });
    assert_eq!(next.load(id).await.expect("load").journal.len(), 2);
    next.append(id, vec![msg("three")], None)
        .await
        .expect("the next delivery writes");
    assert_eq!(store.load(id).await.expect("load").journal.len(), 3);
}
