//! Webhook subscriptions in the Redis store against a real redis-server (a Redis Cluster with
//! `DELTA_TEST_CLUSTER=1`), as the gateway's Redis user: what is stored reads back, the secrets
//! are sealed at rest and open only with the key, a rotation keeps the previous secret for its
//! grace, delivery figures and the failure period add up, and a deletion leaves nothing.

use std::sync::Arc;

use delta_e2e::RedisRole;
use delta_e2e::servers::RedisServers;
use delta_protocol::Timestamp;
use delta_protocol::secret::SecretsKey;
use delta_store::redis::{Options, RedisRunStore, Webhook, WebhookState};

const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn sample(id: &str) -> Webhook {
    Webhook {
        id: id.to_owned(),
        url: "https://hooks.example.com/x?token=t".into(),
        events: vec!["run.completed".into()],
        agents: vec![],
        description: Some("e2e".into()),
        created_by: "ops".into(),
        created_at: Timestamp::now(),
        state: WebhookState::Active,
        disabled_reason: None,
        disabled_at: None,
        failing_since: None,
        last_success_at: None,
        last_error: None,
        deliveries: 0,
        failures: 0,
        previous_secret_until: None,
    }
}

#[tokio::test]
async fn subscriptions_keep_their_secrets_sealed_and_their_figures_straight() {
    let redis = RedisServers::start();
    let options = Options {
        cluster: redis.is_cluster(),
        ..Options::default()
    };
    let plain = RedisRunStore::connect_options(&redis.url_as(RedisRole::Gateway), "wh", &options)
        .await
        .expect("connect as the gateway");
    let key = Arc::new(SecretsKey::from_hex(KEY).expect("key"));
    let store = plain.clone().with_secrets_key(key);

    // Without the key nothing is stored.
    assert!(!plain.can_seal());
    assert!(plain.create_webhook(&sample("w0"), SECRET).await.is_err());
    assert!(plain.webhook("w0").await.expect("read").is_none());

    let w = sample("w1");
    store.create_webhook(&w, SECRET).await.expect("create");
    let back = store.webhook("w1").await.expect("read").expect("there");
    assert_eq!(back, w);
    assert_eq!(store.webhooks().await.expect("list"), vec![w.clone()]);
    let dump = delta_e2e::redis_dump(&redis.url(), "wh:*").await;
    assert!(
        !dump.contains("whsec_") && !dump.contains("MfKQ9r8"),
        "{dump}"
    );
    assert!(dump.contains("sealed:v2:"), "{dump}");
    // Readable without the key: the settings; not the secret.
    assert!(plain.webhook("w1").await.expect("read").is_some());
    assert!(plain.webhook_secrets("w1").await.is_err());
    let s = store
        .webhook_secrets("w1")
        .await
        .expect("open")
        .expect("there");
    assert_eq!(s.current, SECRET);
    assert!(s.previous.is_none());

    // Rotation: the previous one signs during its grace, not after.
    let until = Timestamp::now().plus_seconds(3600);
    assert!(
        store
            .rotate_webhook_secret("w1", "whsec_bmV3", until)
            .await
            .expect("rotate")
    );
    let s = store
        .webhook_secrets("w1")
        .await
        .expect("open")
        .expect("there");
    assert_eq!(
        (s.current.as_str(), s.previous.as_deref()),
        ("whsec_bmV3", Some(SECRET))
    );
    let past = Timestamp::from_micros(Timestamp::now().micros() - 1).expect("ts");
    assert!(
        store
            .rotate_webhook_secret("w1", "whsec_bmV3ZXI=", past)
            .await
            .expect("rotate")
    );
    let s = store
        .webhook_secrets("w1")
        .await
        .expect("open")
        .expect("there");
    assert_eq!(
        (s.current.as_str(), s.previous.as_deref()),
        ("whsec_bmV3ZXI=", None)
    );
    // Two rotations at once: each moves the secret it found aside, so both secrets handed out
    // sign (one current, one previous), and the one they replaced no longer does.
    let (a, b) = tokio::join!(
        store.rotate_webhook_secret("w1", "whsec_YQ==", until),
        store.rotate_webhook_secret("w1", "whsec_Yg==", until),
    );
    assert!(a.expect("rotate a") && b.expect("rotate b"));
    let s = store
        .webhook_secrets("w1")
        .await
        .expect("open")
        .expect("there");
    let mut both = [s.current.clone(), s.previous.clone().unwrap_or_default()];
    both.sort();
    assert_eq!(both, ["whsec_YQ==", "whsec_Yg=="], "{s:?}");

    // Failures start a period that a success ends; figures count both. Each event's own
    // period lasts until it is delivered, across other events' successes.
    let t1 = Timestamp::now();
    let failing =
        |since, event_since| Some(delta_store::redis::WebhookFailing { since, event_since });
    let since = store
        .webhook_failed("w1", "e1", "HTTP 503", t1)
        .await
        .expect("failed");
    assert_eq!(since, failing(t1, t1));
    let t2 = t1.plus_seconds(5);
    assert_eq!(
        store
            .webhook_failed("w1", "e1", "timed out", t2)
            .await
            .expect("failed"),
        failing(t1, t1)
    );
    let mid = store.webhook("w1").await.expect("read").expect("there");
    assert_eq!(
        (mid.failures, mid.failing_since, mid.last_error.as_deref()),
        (2, Some(t1), Some("timed out"))
    );
    store
        .webhook_delivered("w1", "e2", t2)
        .await
        .expect("delivered");
    let ok = store.webhook("w1").await.expect("read").expect("there");
    assert_eq!(
        (ok.deliveries, ok.failing_since, ok.last_success_at),
        (1, None, Some(t2))
    );
    let t3 = t2.plus_seconds(5);
    assert_eq!(
        store
            .webhook_failed("w1", "e1", "HTTP 400", t3)
            .await
            .expect("failed"),
        failing(t3, t1),
        "e1 has failed since t1, though e2 was delivered since"
    );
    store
        .webhook_delivered("w1", "e1", t3)
        .await
        .expect("delivered");
    assert_eq!(
        store
            .webhook_failed("w1", "e1", "HTTP 400", t3)
            .await
            .expect("failed"),
        failing(t3, t3),
        "delivered, its period is over"
    );
    store
        .webhook_delivered("w1", "e1", t3)
        .await
        .expect("delivered");

    // Disabled once; enabled with its failure period over.
    assert!(
        store
            .disable_failing_webhook("w1", "failing", t2)
            .await
            .expect("disable")
    );
    assert!(
        !store
            .disable_failing_webhook("w1", "again", t2)
            .await
            .expect("disable")
    );
    let off = store.webhook("w1").await.expect("read").expect("there");
    assert_eq!(
        (off.state, off.disabled_reason.as_deref()),
        (WebhookState::Disabled, Some("failing"))
    );
    store
        .webhook_failed("w1", "e3", "HTTP 500", t2)
        .await
        .expect("failed");
    assert!(store.enable_webhook("w1").await.expect("enable"));
    let on = store.webhook("w1").await.expect("read").expect("there");
    assert_eq!(
        (on.state, on.disabled_reason, on.failing_since),
        (WebhookState::Active, None, None)
    );
    // Enabled, every event's period starts over too.
    assert_eq!(
        store
            .webhook_failed("w1", "e3", "HTTP 500", t3)
            .await
            .expect("failed"),
        failing(t3, t3)
    );

    // Gone, and nothing is written back to what is gone.
    assert!(store.delete_webhook("w1").await.expect("delete"));
    assert!(!store.delete_webhook("w1").await.expect("delete"));
    assert!(!store.enable_webhook("w1").await.expect("enable"));
    assert_eq!(
        store
            .webhook_failed("w1", "e1", "x", t2)
            .await
            .expect("failed"),
        None
    );
    assert!(store.webhooks().await.expect("list").is_empty());
    let dump = delta_e2e::redis_dump(&redis.url(), "wh:webhook*").await;
    assert!(!dump.contains("w1"), "{dump}");
}

/// Each gateway lists the subscriptions every second: two round trips however many there are
/// (the set, then every hash in one pipeline), oldest first, and an id whose hash is gone (a
/// deletion half done) is dropped from the set on the way.
#[tokio::test]
async fn the_subscriptions_are_listed_in_two_round_trips() {
    let redis = RedisServers::start();
    let options = Options {
        cluster: redis.is_cluster(),
        ..Options::default()
    };
    let store = RedisRunStore::connect_options(&redis.url_as(RedisRole::Gateway), "whl", &options)
        .await
        .expect("connect as the gateway")
        .with_secrets_key(Arc::new(SecretsKey::from_hex(KEY).expect("key")));
    let mut made = vec![];
    for i in 0..12 {
        let mut w = sample(&format!("wl{i:02}"));
        // Created in an order other than their ids', with distinct times: listed by time.
        w.created_at = Timestamp::from_micros(1_800_000_000_000_000 - i * 1_000).expect("time");
        store.create_webhook(&w, SECRET).await.expect("create");
        made.push(w);
    }
    made.reverse();

    let before = store.round_trips();
    assert_eq!(store.webhooks().await.expect("list"), made);
    assert_eq!(
        store.round_trips() - before,
        2,
        "the set, then the hashes at once"
    );

    // A deletion that removed the hash and not the id: the listing leaves it out and drops it.
    let mut admin = delta_e2e::redis_connection(&redis.url()).await;
    let _: () = redis::cmd("DEL")
        .arg("whl:webhook:wl05")
        .query_async(&mut admin)
        .await
        .expect("del");
    let listed = store.webhooks().await.expect("list");
    assert_eq!(listed.len(), 11);
    assert!(listed.iter().all(|w| w.id != "wl05"), "{listed:?}");
    let members: Vec<String> = redis::cmd("SMEMBERS")
        .arg("whl:webhooks")
        .query_async(&mut admin)
        .await
        .expect("smembers");
    assert_eq!(members.len(), 11);
    assert!(!members.contains(&"wl05".to_owned()), "{members:?}");
}
