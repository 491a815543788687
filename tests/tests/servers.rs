//! The harness itself: both servers start, answer, and are gone after drop.

use std::net::TcpStream;

#[test]
fn servers_start_answer_and_stop() {
    let redis = delta_e2e::Redis::start().expect("redis-server starts");
    let nats = delta_e2e::Nats::start().expect("nats-server starts with JetStream");
    assert!(TcpStream::connect(("127.0.0.1", redis.port)).is_ok());
    assert!(TcpStream::connect(("127.0.0.1", nats.port)).is_ok());
    let (rp, np) = (redis.port, nats.port);
    drop(redis);
    drop(nats);
    assert!(
        TcpStream::connect(("127.0.0.1", rp)).is_err(),
        "redis stopped"
    );
    assert!(
        TcpStream::connect(("127.0.0.1", np)).is_err(),
        "nats stopped"
    );
}

/// A restart keeps the data and the users: what was written as the admin is read back after.
#[tokio::test]
async fn a_restarted_redis_keeps_its_data_and_users() {
    let mut redis = delta_e2e::Redis::start().expect("redis-server starts");
    let client = redis::Client::open(redis.url()).expect("url");
    let mut c = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect as the admin");
    let _: () = redis::cmd("SET")
        .arg("k")
        .arg("v")
        .query_async(&mut c)
        .await
        .expect("set");
    redis.restart().expect("restart");
    let client = redis::Client::open(redis.url()).expect("url");
    let mut c = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect again");
    let v: Option<String> = redis::cmd("GET")
        .arg("k")
        .query_async(&mut c)
        .await
        .expect("get");
    assert_eq!(v.as_deref(), Some("v"));
}

/// What the store's scripts wrote survives a restart of a Redis with ACL users, and a worker's
/// connection reads it again: Redis 7.0 replays a script's writes from the AOF as the `default`
/// user, so a `default` user without rights would drop them (see the store's `DEFAULT_USER`).
#[tokio::test]
async fn a_restarted_redis_with_users_keeps_what_scripts_wrote() {
    use delta_store::RunStore;
    let mut redis = delta_e2e::Redis::start().expect("redis-server starts");
    let admin = delta_store::redis::RedisRunStore::connect(&redis.url(), "t")
        .await
        .expect("admin");
    let worker = delta_store::redis::RedisRunStore::connect(
        &redis.url_as(delta_e2e::RedisRole::Worker),
        "t",
    )
    .await
    .expect("worker");
    let id = delta_protocol::RunId::new();
    let rec = delta_store::RunRecord::new(id, "hello", "task", delta_protocol::RunStatus::Queued);
    admin.create(rec).await.expect("create");
    worker.load(id).await.expect("load before");
    redis.restart().expect("restart");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match worker.load(id).await {
            Ok(run) => {
                assert_eq!(run.record.task, "task");
                return;
            }
            Err(delta_store::Error::NotFound(_)) => panic!("the run was lost at the restart"),
            Err(e) if std::time::Instant::now() > deadline => panic!("no reconnect: {e}"),
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
    }
}
