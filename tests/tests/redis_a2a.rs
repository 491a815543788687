//! A2A push configs in the Redis store against a real redis-server (a Redis Cluster with
//! `DELTA_TEST_CLUSTER=1`), as the gateway's Redis user: the scripts that touch several keys
//! (a config, the delivery set, the owners' counts) run there too, owners and limits hold, and a
//! deletion leaves nothing.

use delta_e2e::RedisRole;
use delta_e2e::servers::RedisServers;
use delta_protocol::Timestamp;
use delta_store::redis::{A2aPushConfig, DeletePush, Options, PushLimits, PutPush, RedisRunStore};

fn config(task: &str, id: &str, by: &str) -> A2aPushConfig {
    A2aPushConfig {
        id: id.to_owned(),
        task_id: task.to_owned(),
        url: "https://hooks.example.com/a2a".into(),
        sealed_token: None,
        created_by: Some(by.to_owned()),
        created_at: Timestamp::now(),
        allow_listed: Some(false),
    }
}

#[tokio::test]
async fn push_configs_keep_owners_and_limits_on_redis_and_on_a_cluster() {
    let redis = RedisServers::start();
    let options = Options {
        cluster: redis.is_cluster(),
        ..Options::default()
    };
    let store = RedisRunStore::connect_options(&redis.url_as(RedisRole::Gateway), "a2a", &options)
        .await
        .expect("connect as the gateway");
    let limits = PushLimits {
        per_task: 2,
        per_caller: 3,
        fleet: 4,
    };
    let task = "01a20f1a-b0ad-723f-9bc6-346b635abf59";
    let put = |c: A2aPushConfig, op: bool| {
        let store = store.clone();
        async move { store.a2a_put_push(&c, op, limits).await.expect("put") }
    };
    assert_eq!(put(config(task, "c1", "sam"), false).await, PutPush::Stored);
    assert_eq!(put(config(task, "c2", "sam"), false).await, PutPush::Stored);
    assert_eq!(
        put(config(task, "c3", "sam"), false).await,
        PutPush::TaskFull
    );
    assert_eq!(
        put(config(task, "c1", "ann"), false).await,
        PutPush::Taken,
        "another caller's id"
    );
    assert_eq!(put(config(task, "a1", "ann"), false).await, PutPush::Stored);
    let other = "01a20f1a-b0ad-723f-9bc6-346b635abf5a";
    assert_eq!(
        put(config(other, "c4", "sam"), false).await,
        PutPush::Stored
    );
    assert_eq!(
        put(config(other, "c5", "sam"), false).await,
        PutPush::CallerFull
    );
    assert_eq!(
        put(config(other, "a2", "ann"), false).await,
        PutPush::FleetFull
    );
    let mut ids: Vec<String> = store
        .a2a_pushes_of(task)
        .await
        .expect("list")
        .into_iter()
        .map(|c| c.id)
        .collect();
    ids.sort();
    assert_eq!(ids, ["a1", "c1", "c2"]);

    assert_eq!(
        store
            .a2a_delete_push(task, "c1", Some(Some("ann")))
            .await
            .expect("delete"),
        DeletePush::NotYours
    );
    assert!(store.a2a_push(task, "c1").await.expect("read").is_some());
    assert_eq!(
        store
            .a2a_delete_push(task, "c1", Some(Some("sam")))
            .await
            .expect("delete"),
        DeletePush::Deleted
    );
    assert!(store.a2a_push(task, "c1").await.expect("read").is_none());
    assert_eq!(
        store
            .a2a_delete_push(task, "c1", None)
            .await
            .expect("delete"),
        DeletePush::NotFound
    );
    // A slot freed is a slot to take again, for its owner.
    assert_eq!(put(config(task, "c3", "sam"), false).await, PutPush::Stored);
}
