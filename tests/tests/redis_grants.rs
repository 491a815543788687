//! Scoped grants in the Redis store against a real redis-server (a Redis Cluster with
//! `DELTA_TEST_CLUSTER=1`): the grant contract the file store passes too, as the workers' Redis
//! user, and every key of an agent's grants in one cluster slot.

use delta_e2e::RedisRole;
use delta_e2e::servers::RedisServers;
use delta_protocol::RequestId;
use delta_store::GrantStore;
use delta_store::grants::contract;
use delta_store::redis::{Options, RedisRunStore};

use delta_e2e::cluster_slot as slot;

#[tokio::test]
async fn redis_store_passes_the_grant_contract_as_the_worker_user() {
    let redis = RedisServers::start();
    let options = Options {
        cluster: redis.is_cluster(),
        ..Options::default()
    };
    let store = RedisRunStore::connect_options(&redis.url_as(RedisRole::Worker), "gr", &options)
        .await
        .expect("connect as the worker");
    let store = store
        .with_durability(redis.durability())
        .await
        .expect("durability");
    contract::run_all(&store).await;
}

#[tokio::test]
async fn an_agents_grants_live_in_one_slot() {
    let redis = delta_e2e::Redis::start().expect("redis-server");
    let store = RedisRunStore::connect(&redis.url(), "gs")
        .await
        .expect("connect");
    let agent = "deployer";
    let ids: Vec<RequestId> = {
        let mut ids = vec![];
        for max in [None, Some(2)] {
            let g = contract::sample(agent, max);
            store.put_grant(&g).await.expect("put");
            ids.push(g.grant_id);
        }
        ids
    };
    let now = delta_protocol::Timestamp::now();
    store
        .use_grant(agent, ids[1], delta_protocol::RunId::new(), "a1-1", now)
        .await
        .expect("use")
        .expect("usable");
    store
        .revoke_grant(ids[0], "ops", now)
        .await
        .expect("revoke")
        .expect("there");
    let client = redis::Client::open(redis.url()).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("gs:*")
        .query_async(&mut conn)
        .await
        .expect("keys");
    let grant_keys: Vec<&String> = keys.iter().filter(|k| k.contains("{g:")).collect();
    assert_eq!(
        grant_keys.len(),
        3,
        "two grants and the agent's index: {keys:?}"
    );
    let slots: std::collections::BTreeSet<u16> = grant_keys.iter().map(|k| slot(k)).collect();
    assert_eq!(slots.len(), 1, "one slot: {grant_keys:?}");
    assert!(
        keys.contains(&"gs:grant-agents".to_owned()),
        "the id → agent map: {keys:?}"
    );
    let listed = store.grants(None).await.expect("list");
    assert_eq!(listed.len(), 2);
    assert!(listed[0].revoked_at.is_some());
    assert_eq!(listed[1].uses, 1);
}

#[tokio::test]
async fn retention_deletes_grants_that_ended_long_ago_and_those_of_deleted_runs() {
    use delta_protocol::grant::GrantScope;
    use delta_protocol::{RunId, RunStatus, Timestamp};
    use delta_store::{RunRecord, RunStore};

    let redis = delta_e2e::Redis::start().expect("redis-server");
    let store = RedisRunStore::connect(&redis.url(), "gp")
        .await
        .expect("connect");
    let now = Timestamp::now();
    let long_ago = Timestamp::from_micros(now.micros() - 7_200_000_000).expect("t");
    let cutoff = now.micros() - 3_600_000_000;
    let agent = "keeper";
    // Live, of scope agent: kept however old.
    let live = contract::sample(agent, None);
    // Revoked two hours ago: deleted. Revoked now: kept (within retention).
    let revoked_old = contract::sample(agent, None);
    let revoked_now = contract::sample(agent, None);
    // Expired two hours ago: deleted.
    let mut expired = contract::sample(agent, None);
    expired.expires_at = Some(long_ago);
    // Scope run: of a run that exists (kept), of one that does not (deleted).
    let rec = RunRecord::new(RunId::new(), agent, "t", RunStatus::Running);
    store.create(rec.clone()).await.expect("run");
    let mut of_run = contract::sample(agent, None);
    of_run.scope = GrantScope::Run;
    of_run.run_id = rec.run_id;
    let mut orphan = contract::sample(agent, None);
    orphan.scope = GrantScope::Run;
    // Revoked two hours ago, made by a run that still exists: kept (a replay of its approval
    // must find it revoked, not store it again).
    let mut revoked_of_run = contract::sample(agent, None);
    revoked_of_run.run_id = rec.run_id;
    for g in [
        &live,
        &revoked_old,
        &revoked_now,
        &expired,
        &of_run,
        &orphan,
        &revoked_of_run,
    ] {
        store.put_grant(g).await.expect("put");
    }
    store
        .revoke_grant(revoked_of_run.grant_id, "ops", long_ago)
        .await
        .expect("revoke")
        .expect("there");
    store
        .revoke_grant(revoked_old.grant_id, "ops", long_ago)
        .await
        .expect("revoke")
        .expect("there");
    store
        .revoke_grant(revoked_now.grant_id, "ops", now)
        .await
        .expect("revoke")
        .expect("there");
    assert_eq!(store.purge_grants(cutoff).await.expect("purge"), 3);
    let mut kept: Vec<RequestId> = store
        .grants(Some(agent))
        .await
        .expect("list")
        .into_iter()
        .map(|g| g.grant_id)
        .collect();
    kept.sort();
    let mut want = vec![
        live.grant_id,
        revoked_now.grant_id,
        of_run.grant_id,
        revoked_of_run.grant_id,
    ];
    want.sort();
    assert_eq!(kept, want);
    for g in [&revoked_old, &expired, &orphan] {
        assert!(store.grant(g.grant_id).await.expect("get").is_none());
    }
    assert_eq!(
        store.purge_grants(cutoff).await.expect("again"),
        0,
        "idempotent"
    );
    // Its run replaying the approval: the grant stays revoked.
    assert!(!store.put_grant(&revoked_of_run).await.expect("put again"));
    let again = store
        .grant(revoked_of_run.grant_id)
        .await
        .expect("get")
        .expect("there");
    assert!(again.revoked_at.is_some());
    // Once the run is gone (retention deleted it), both of its grants go.
    let mut conn = delta_e2e::redis_raw(&redis.url()).await;
    let _: () = redis::cmd("DEL")
        .arg(store.run_key(rec.run_id))
        .query_async(&mut conn)
        .await
        .expect("del");
    assert_eq!(store.purge_grants(cutoff).await.expect("purge"), 2);
    for g in [&of_run, &revoked_of_run] {
        assert!(store.grant(g.grant_id).await.expect("get").is_none());
    }
}

/// A delegation replaces its pair's (same `from` and `to`) in the one write that stores it, and
/// only those: eight made at once for a pair leave one.
#[tokio::test]
async fn a_delegation_replaces_its_pairs_in_one_write() {
    let redis = delta_e2e::Redis::start().expect("redis-server");
    let store = RedisRunStore::connect(&redis.url(), "gd")
        .await
        .expect("connect");
    let now = delta_protocol::Timestamp::now();
    let until = delta_protocol::Timestamp::from_micros(now.micros() + 3_600_000_000).expect("t");
    let delegation = |id: &str, to: &str| delta_protocol::Delegation {
        id: id.to_owned(),
        from: "alice".into(),
        to: to.into(),
        until,
        created_by: "alice".into(),
        created_at: now,
        reason: None,
    };
    let pairs = async || -> Vec<(String, String)> {
        let mut all: Vec<(String, String)> = store
            .delegations(delta_protocol::Timestamp::now())
            .await
            .expect("list")
            .into_iter()
            .map(|d| (d.id, d.to))
            .collect();
        all.sort();
        all
    };
    store
        .put_delegation(&delegation("d1", "bob"))
        .await
        .expect("put");
    store
        .put_delegation(&delegation("d2", "carol"))
        .await
        .expect("put");
    store
        .put_delegation(&delegation("d3", "bob"))
        .await
        .expect("put");
    assert_eq!(
        pairs().await,
        [("d2".into(), "carol".into()), ("d3".into(), "bob".into())]
    );
    let puts: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            let d = delegation(&format!("x{i}"), "bob");
            tokio::spawn(async move { store.put_delegation(&d).await })
        })
        .collect();
    for p in puts {
        p.await.expect("task").expect("put");
    }
    let left = pairs().await;
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.contains(&("d2".into(), "carol".into())), "{left:?}");
}
