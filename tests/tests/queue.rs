//! The queue adapter against a real nats-server with JetStream.

use std::time::Duration;

use delta_protocol::{Job, JobKind, RequestId, RunId};
use delta_queue::{Queue, Settings};

fn settings() -> Settings {
    Settings {
        ack_wait: Duration::from_secs(5),
        max_deliver: 3,
        ..Settings::default()
    }
}

async fn stream_messages(q: &Queue, nats_url: &str, stream: &str) -> u64 {
    let client = delta_e2e::nats_client(nats_url).await;
    let js = async_nats::jetstream::new(client);
    let _ = q;
    let mut s = js.get_stream(stream).await.expect("stream");
    s.info().await.expect("info").state.messages
}

#[tokio::test]
async fn setup_is_idempotent_and_duplicate_jobs_are_dropped() {
    let nats = delta_e2e::Nats::start().expect("nats-server");
    let q = Queue::connect(&nats.url(), "qa", &settings())
        .await
        .expect("first setup");
    // A second worker (or a restart) with the same settings sets up the same names.
    let q2 = Queue::connect(&nats.url(), "qa", &settings())
        .await
        .expect("second setup");
    let job = Job {
        run_id: RunId::new(),
        kind: JobKind::Start,
        request_id: None,
    };
    q.publish_job(
        "hello",
        &job,
        Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
    )
    .await
    .expect("publish");
    q2.publish_job("hello", &job, None)
        .await
        .expect("publish again");
    assert_eq!(
        stream_messages(&q, &nats.url(), "QA_JOBS").await,
        1,
        "Nats-Msg-Id drops the repeat"
    );

    let got = q
        .fetch(10, Duration::from_millis(500))
        .await
        .expect("fetch");
    assert_eq!(got.len(), 1);
    let d = &got[0];
    assert_eq!(d.job.as_ref().expect("a job"), &job);
    assert_eq!(d.agent, "hello");
    assert_eq!(d.fence.delivery, 1);
    assert_eq!(
        d.traceparent.as_deref(),
        Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    );
    d.ack().await.expect("ack");
    assert_eq!(
        stream_messages(&q, &nats.url(), "QA_JOBS").await,
        0,
        "work queue removes acked jobs"
    );
}

#[tokio::test]
async fn a_nak_redelivers_with_a_higher_fence_and_poison_goes_to_the_dlq() {
    let nats = delta_e2e::Nats::start().expect("nats-server");
    let q = Queue::connect(&nats.url(), "qb", &settings())
        .await
        .expect("setup");
    let job = Job {
        run_id: RunId::new(),
        kind: JobKind::Resume,
        request_id: Some(RequestId::new()),
    };
    q.publish_job("chooser", &job, None).await.expect("publish");
    let first = q
        .fetch(1, Duration::from_millis(500))
        .await
        .expect("fetch")
        .pop()
        .expect("delivery");
    first.nak(None).await.expect("nak");
    let second = q
        .fetch(1, Duration::from_secs(2))
        .await
        .expect("fetch")
        .pop()
        .expect("redelivery");
    assert_eq!(
        second.fence.stream_seq, first.fence.stream_seq,
        "same message"
    );
    assert!(
        second.fence > first.fence,
        "a redelivery outranks the first delivery"
    );
    second.ack().await.expect("ack");

    // A poison message: not a job at all.
    let client = delta_e2e::nats_client(&nats.url()).await;
    let js = async_nats::jetstream::new(client);
    js.publish("qb.jobs.hello", "{not json".into())
        .await
        .expect("publish")
        .await
        .expect("ack");
    let poison = q
        .fetch(1, Duration::from_secs(1))
        .await
        .expect("fetch")
        .pop()
        .expect("delivery");
    let reason = poison.job.as_ref().expect_err("not a job").clone();
    assert!(reason.contains("not a job message"), "{reason}");
    q.dead_letter(&poison, &reason).await.expect("dlq");
    poison.term().await.expect("term");
    assert_eq!(stream_messages(&q, &nats.url(), "QB_DLQ").await, 1);
    assert_eq!(stream_messages(&q, &nats.url(), "QB_JOBS").await, 0);
}
