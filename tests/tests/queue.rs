//! The queue adapter against a real nats-server with JetStream.

use std::time::Duration;

use delta_protocol::{Job, JobKind, RequestId, RunId};
use delta_queue::{Lane, Queue, Role, Settings};

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
    let job = Job::start(RunId::new());
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
        .fetch(Lane::Starts, 10, Duration::from_millis(500))
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
    let job = Job::resume(RunId::new(), Some(RequestId::new()));
    q.publish_job("chooser", &job, None).await.expect("publish");
    let first = q
        .fetch(Lane::Resumes, 1, Duration::from_millis(500))
        .await
        .expect("fetch")
        .pop()
        .expect("delivery");
    first.nak(None).await.expect("nak");
    let second = q
        .fetch(Lane::Resumes, 1, Duration::from_secs(2))
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
        .fetch(Lane::Starts, 1, Duration::from_secs(1))
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

fn start_job() -> Job {
    Job::start(RunId::new())
}

fn resume_job() -> Job {
    Job::resume(RunId::new(), Some(RequestId::new()))
}

/// The subject message `seq` of `stream` was published on.
async fn subject_of(js: &async_nats::jetstream::Context, stream: &str, seq: u64) -> String {
    let s = js.get_stream(stream).await.expect("stream");
    let m = s.get_raw_message(seq).await.expect("message");
    m.subject.to_string()
}

#[tokio::test]
async fn resume_jobs_have_their_own_subject_and_consumer() {
    let nats = delta_e2e::Nats::start().expect("nats-server");
    let q = Queue::connect(&nats.url(), "qc", &settings())
        .await
        .expect("setup");
    let js = async_nats::jetstream::new(delta_e2e::nats_client(&nats.url()).await);
    let (start, resume) = (start_job(), resume_job());
    let start_seq = q.publish_job("hello", &start, None).await.expect("start");
    let resume_seq = q.publish_job("hello", &resume, None).await.expect("resume");
    assert_eq!(subject_of(&js, "QC_JOBS", start_seq).await, "qc.jobs.hello");
    assert_eq!(
        subject_of(&js, "QC_JOBS", resume_seq).await,
        "qc.jobs.hello.resume"
    );
    let stats = q.stats().await.expect("stats");
    assert_eq!(stats.pending, 2, "both consumers are counted: {stats:?}");

    // Each consumer delivers its own kind only.
    let resumes = q
        .fetch(Lane::Resumes, 10, Duration::from_millis(500))
        .await
        .expect("fetch resumes");
    assert_eq!(resumes.len(), 1);
    assert_eq!(resumes[0].job.as_ref().expect("a job"), &resume);
    assert_eq!(
        resumes[0].agent, "hello",
        "the `.resume` suffix is no agent's"
    );
    let starts = q
        .fetch(Lane::Starts, 10, Duration::from_millis(500))
        .await
        .expect("fetch starts");
    assert_eq!(starts.len(), 1);
    assert_eq!(starts[0].job.as_ref().expect("a job"), &start);
    assert_eq!(starts[0].agent, "hello");
    let stats = q.stats().await.expect("stats");
    assert_eq!((stats.pending, stats.in_flight), (0, 2), "{stats:?}");
    for d in resumes.iter().chain(&starts) {
        d.ack().await.expect("ack");
    }
    assert_eq!(stream_messages(&q, &nats.url(), "QC_JOBS").await, 0);

    let jobs = js.get_stream("QC_JOBS").await.expect("stream");
    for (consumer, filter) in [
        ("qc-workers", "qc.jobs.*"),
        ("qc-resumes", "qc.jobs.*.resume"),
    ] {
        let info = jobs.consumer_info(consumer).await.expect("consumer");
        assert_eq!(info.config.filter_subject, filter, "{consumer}");
        assert_eq!(
            info.config.max_deliver, 3,
            "{consumer}: the workers' settings"
        );
        assert_eq!(info.config.ack_wait, Duration::from_secs(5), "{consumer}");
    }
}

#[tokio::test]
async fn an_older_deployments_consumer_is_narrowed_and_its_resume_jobs_still_served() {
    use async_nats::jetstream::{consumer, stream};
    let nats = delta_e2e::Nats::start().expect("nats-server");
    let js = async_nats::jetstream::new(delta_e2e::nats_client(&nats.url()).await);
    // What the previous version set up: one unfiltered consumer, one advisory kept.
    js.create_stream(stream::Config {
        name: "QU_JOBS".into(),
        subjects: vec!["qu.jobs.>".into()],
        retention: stream::RetentionPolicy::WorkQueue,
        storage: stream::StorageType::File,
        discard: stream::DiscardPolicy::New,
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await
    .expect("old job stream");
    let jobs = js.get_stream("QU_JOBS").await.expect("stream");
    jobs.create_consumer(consumer::pull::Config {
        durable_name: Some("qu-workers".into()),
        ack_policy: consumer::AckPolicy::Explicit,
        ..Default::default()
    })
    .await
    .expect("old consumer");
    js.create_stream(stream::Config {
        name: "QU_EXHAUSTED".into(),
        subjects: vec!["$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.QU_JOBS.qu-workers".into()],
        retention: stream::RetentionPolicy::WorkQueue,
        storage: stream::StorageType::File,
        ..Default::default()
    })
    .await
    .expect("old exhausted stream");
    // An old gateway's resume job, on the subject starts use.
    let resume = resume_job();
    js.publish(
        "qu.jobs.hello",
        serde_json::to_vec(&resume).expect("json").into(),
    )
    .await
    .expect("publish")
    .await
    .expect("ack");

    // A gateway of this version first: it changes no consumer, and still comes up.
    let gateway = Queue::connect_as(&nats.url(), "qu", &settings(), Role::Gateway)
        .await
        .expect("a gateway starts before any worker is upgraded");
    let old = jobs.consumer_info("qu-workers").await.expect("consumer");
    assert_eq!(
        old.config.filter_subject, "",
        "a gateway leaves it to the workers"
    );
    assert!(
        jobs.consumer_info("qu-resumes").await.is_err(),
        "no consumer may overlap an unfiltered one on a work queue"
    );
    // Its resume jobs go where the old consumer takes them (not on `.resume`, which the
    // resumes' consumer would deliver a second time once a worker creates it), and its jobs
    // without the run they would carry, which an old worker would refuse as malformed.
    let mut from_gateway = resume_job();
    from_gateway.paused = Some(delta_protocol::PausedRun {
        record: [("status".to_owned(), "WAITING_FOR_INPUT".to_owned())].into(),
        question: [("state".to_owned(), "ANSWERED".to_owned())].into(),
    });
    let seq = gateway
        .publish_job("hello", &from_gateway, None)
        .await
        .expect("publish");
    assert_eq!(subject_of(&js, "QU_JOBS", seq).await, "qu.jobs.hello");
    let mut start = start_job();
    start.run = Some(delta_protocol::FreshRun {
        agent: "hello".into(),
        task: "t".into(),
        input: None,
        created_at: delta_protocol::Timestamp::now(),
        submitted_by: None,
    });
    let start_seq = gateway
        .publish_job("hello", &start, None)
        .await
        .expect("publish");
    for seq in [seq, start_seq] {
        let raw = jobs.get_raw_message(seq).await.expect("message");
        let sent: serde_json::Value = serde_json::from_slice(&raw.payload).expect("json");
        assert!(
            sent.get("paused").is_none() && sent.get("run").is_none(),
            "nothing carried: {sent}"
        );
    }
    from_gateway.paused = None;
    start.run = None;
    assert_eq!(gateway.stats().await.expect("stats").pending, 3);
    let exhausted = js.get_stream("QU_EXHAUSTED").await.expect("stream");
    let subjects = exhausted.cached_info().config.subjects.clone();
    assert_eq!(
        subjects.len(),
        2,
        "the gateway keeps both advisories: {subjects:?}"
    );

    // A worker narrows the consumer and adds the one for resumes.
    let q = Queue::connect(&nats.url(), "qu", &settings())
        .await
        .expect("worker setup");
    let narrowed = jobs.consumer_info("qu-workers").await.expect("consumer");
    assert_eq!(narrowed.config.filter_subject, "qu.jobs.*");
    assert_eq!(narrowed.config.max_deliver, 3);
    let resumes = jobs.consumer_info("qu-resumes").await.expect("resumes");
    assert_eq!(resumes.config.filter_subject, "qu.jobs.*.resume");

    // The old jobs come from the starts' consumer, and are resumes by their payload.
    let got = q
        .fetch(Lane::Starts, 10, Duration::from_millis(500))
        .await
        .expect("fetch");
    assert_eq!(got.len(), 3);
    for (d, want) in got.iter().zip([&resume, &from_gateway, &start]) {
        assert_eq!(d.job.as_ref().expect("a job"), want);
        assert_eq!(d.agent, "hello");
        d.ack().await.expect("ack");
    }
    assert_eq!(got[1].job.as_ref().expect("a job").kind, JobKind::Resume);

    // An old worker restarting now widens it again: nats-server 2.12 lets an update make
    // consumers of a work queue overlap (it refuses only a new consumer that would). The next
    // worker of this version to start narrows it back (docs/protocol.md §4 "Upgrading").
    jobs.update_consumer(consumer::pull::Config {
        durable_name: Some("qu-workers".into()),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: Duration::from_secs(5),
        max_deliver: 3,
        ..Default::default()
    })
    .await
    .expect("the server lets an old worker widen it");
    let again = Queue::connect(&nats.url(), "qu", &settings())
        .await
        .expect("again");
    let narrowed = jobs.consumer_info("qu-workers").await.expect("consumer");
    assert_eq!(narrowed.config.filter_subject, "qu.jobs.*");

    // A new resume takes the new way.
    let fresh = resume_job();
    again
        .publish_job("hello", &fresh, None)
        .await
        .expect("publish");
    let got = q
        .fetch(Lane::Resumes, 10, Duration::from_millis(500))
        .await
        .expect("fetch");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].job.as_ref().expect("a job"), &fresh);
    got[0].ack().await.expect("ack");
}

#[tokio::test]
async fn a_resume_job_that_used_up_its_deliveries_is_dead_lettered() {
    let nats = delta_e2e::Nats::start().expect("nats-server");
    let settings = Settings {
        max_deliver: 2,
        ..settings()
    };
    let q = Queue::connect(&nats.url(), "qx", &settings)
        .await
        .expect("setup");
    let resume = resume_job();
    q.publish_job("hello", &resume, None)
        .await
        .expect("publish");
    for _ in 0..2 {
        let d = q
            .fetch(Lane::Resumes, 1, Duration::from_secs(2))
            .await
            .expect("fetch")
            .pop()
            .expect("a delivery");
        d.nak(None).await.expect("nak");
    }
    // The server gives up on it when it would deliver it a third time: to a pull.
    let third = q
        .fetch(Lane::Resumes, 1, Duration::from_secs(1))
        .await
        .expect("fetch");
    assert!(third.is_empty(), "delivered past max_deliver");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let x = loop {
        if let Some(x) = q
            .fetch_exhausted(Duration::from_secs(1))
            .await
            .expect("fetch exhausted")
            .pop()
        {
            break x;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no MAX_DELIVERIES advisory from the resumes' consumer was kept"
        );
    };
    assert_eq!(x.agent, "hello");
    assert_eq!(x.deliveries, 2);
    assert_eq!(x.job.as_ref().expect("the job"), &resume);
    // Copied twice (a worker died after the copy, and another took the advisory up): one letter.
    for _ in 0..2 {
        q.copy_exhausted_to_dlq(&x, "worker died")
            .await
            .expect("dlq");
    }
    q.drop_exhausted(&x).await.expect("dropped");
    let (letters, more) = q.dead_letters(None, 1, 10).await.expect("dead letters");
    assert!(!more);
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].agent, "hello");
    assert_eq!(letters[0].job.as_ref().expect("a job"), &resume);
    assert_eq!(stream_messages(&q, &nats.url(), "QX_JOBS").await, 0);
}

/// A dead-lettered resume job's copy leaves out the paused run it carried (its record and its
/// question with the answer): the dead-letter stream keeps letters for weeks, answers stay out of
/// it. The rest of the job is copied as it was.
#[tokio::test]
async fn a_dead_letter_of_a_resume_job_leaves_its_carried_run_out() {
    let nats = delta_e2e::Nats::start().expect("nats-server");
    let q = Queue::connect(&nats.url(), "qp", &settings())
        .await
        .expect("setup");
    let mut job = resume_job();
    let mut paused = delta_protocol::PausedRun::default();
    paused
        .record
        .insert("status".into(), "WAITING_FOR_INPUT".into());
    paused
        .question
        .insert("response".into(), r#"{"input":"the answer-c4f1"}"#.into());
    job.paused = Some(paused);
    q.publish_job("hello", &job, None).await.expect("publish");
    let d = q
        .fetch(Lane::Resumes, 1, Duration::from_secs(2))
        .await
        .expect("fetch")
        .pop()
        .expect("delivery");
    assert_eq!(
        d.job.as_ref().expect("a job"),
        &job,
        "delivered as published"
    );
    q.dead_letter(&d, "poison for the test").await.expect("dlq");
    d.term().await.expect("term");
    let (letters, _) = q.dead_letters(None, 1, 10).await.expect("dead letters");
    assert_eq!(letters.len(), 1);
    let kept = letters[0].job.as_ref().expect("a job");
    assert_eq!(kept.paused, None, "the carried run left out");
    assert_eq!(
        (kept.run_id, kept.kind, kept.request_id),
        (job.run_id, job.kind, job.request_id)
    );
    assert!(
        !letters[0].payload.contains("c4f1"),
        "{}",
        letters[0].payload
    );
}

/// A reopened question's announcement is named by the instant the refused answer was accepted:
/// a retry of it (its first attempt got through, its ack was lost) is dropped as a duplicate, and
/// the next reopen (another answer, another instant) is announced anew. The first announcement
/// keeps its own id.
#[tokio::test]
async fn a_reopened_questions_announcement_is_the_same_on_every_try() {
    let nats = delta_e2e::Nats::start().expect("nats-server");
    let q = Queue::connect(&nats.url(), "qr", &settings())
        .await
        .expect("setup");
    let ask = delta_protocol::InteractionRequest::new(
        RunId::new(),
        "hello",
        delta_protocol::InteractionType::UserInput,
        "Your name?",
    );
    q.publish_request(&ask, None).await.expect("asked");
    let refused = delta_protocol::Timestamp::now();
    for _ in 0..3 {
        q.publish_request_again(&ask, refused, None)
            .await
            .expect("asked again");
    }
    assert_eq!(
        stream_messages(&q, &nats.url(), "QR_INTERACTIONS").await,
        2,
        "the question, and its reopen once however often it was tried"
    );
    // Announced again while pending (its asker may have died first): under the id of its
    // last reopen, or of its first announcement if it was never reopened; duplicates both.
    q.publish_pending(&ask, Some(refused), None)
        .await
        .expect("pending, reopened");
    q.publish_pending(&ask, None, None)
        .await
        .expect("pending, never reopened");
    assert_eq!(
        stream_messages(&q, &nats.url(), "QR_INTERACTIONS").await,
        2,
        "the same ids"
    );
    let later = delta_protocol::Timestamp::from_micros(refused.micros() + 1).expect("time");
    q.publish_request_again(&ask, later, None)
        .await
        .expect("asked again");
    assert_eq!(
        stream_messages(&q, &nats.url(), "QR_INTERACTIONS").await,
        3,
        "a second reopen"
    );
}
