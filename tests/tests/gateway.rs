//! The gateway against real nats-server, redis-server, gateway and worker processes: submit and
//! answer over HTTP and NATS, races, timeouts, a gateway crash between `ANSWERED` and the
//! resume, SSE resumption, bad input on every channel, auth, and two gateways at once.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use delta_e2e::fleet::{Fleet, bot_answer, pending};
use delta_e2e::gateways::{self, Client};
use delta_e2e::workers;
use delta_e2e::{answers_of, workers_of};
use delta_protocol::{Event, RunId, RunStatus};
use delta_store::RunStore;
use futures_util::StreamExt;
use serde_json::{Value, json};

fn count<F: Fn(&Event) -> bool>(run: &delta_store::StoredRun, f: F) -> usize {
    run.journal.iter().filter(|e| f(&e.event)).count()
}

#[tokio::test(flavor = "multi_thread")]
async fn http_submit_pause_answer_resumes_on_another_worker() {
    let mut fleet = Fleet::start("gwa", 1, 0).await;
    fleet.add_worker("first");
    let run = fleet.submit("hello", "greet").await;
    let rid = fleet.pending(run).await;
    // The first worker goes away; another picks the run up after the answer.
    workers::stop(&mut fleet.workers[0]);
    fleet.add_worker("second");
    let (status, body) = fleet
        .answer(&rid, json!({"input": "Ada", "responder": {"id": "ada"}}))
        .await;
    assert_eq!(
        (status, &body["status"]),
        (200, &json!("accepted")),
        "{body}"
    );
    assert_eq!(body["run_id"], json!(run.to_string()));
    fleet.wait_status(run, RunStatus::Completed).await;
    // Stopped at once, the second worker still sends the note that it resumed the run (checked
    // at the end), which it would otherwise have held for up to a tenth of a second.
    workers::stop(&mut fleet.workers[1]);
    let stored = fleet.store.load(run).await.expect("load");
    assert_eq!(workers_of(&stored), ["first", "second"]);
    let received = answers_of(&stored);
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].responder.id, "ada");
    assert_eq!(received[0].input.as_deref(), Some("Ada"));
    assert_eq!(stored.record.result.as_deref(), Some("Greeted Ada."));
    // The interaction shows its answer and who gave it.
    let (_, ix) = fleet
        .client
        .get(&format!("/v1/interactions/{rid}"))
        .await
        .expect("get");
    assert_eq!(ix["state"], "ANSWERED");
    assert_eq!(
        ix["response"]["responder"],
        json!({"id": "ada", "via": "http"})
    );
    // Listings: not pending any more, and the run is among the completed ones.
    let (_, pending) = fleet.client.get("/v1/interactions").await.expect("list");
    assert_eq!(pending["interactions"], json!([]));
    let (_, done) = fleet
        .client
        .get("/v1/runs?status=COMPLETED")
        .await
        .expect("list");
    assert_eq!(done["runs"][0]["run_id"], json!(run.to_string()));
    // The worker's `resumed` note reached the gateway's answer→resume histogram.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, m) = fleet.client.get("/metrics").await.expect("metrics");
        let text = m.as_str().unwrap_or_default().to_owned();
        if text.contains("delta_answer_to_resume_seconds_count 1\n") {
            break;
        }
        assert!(Instant::now() < deadline, "no resume observed in\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_nats_bot_answers_and_the_run_completes() {
    let fleet = Fleet::start("gwb", 1, 2).await;
    let nc = fleet.nats().await;
    // A bot watches questions on the interactions stream, like any durable consumer would.
    let mut asked = nc
        .subscribe("gwb.interactions.requested.>")
        .await
        .expect("sub");
    let run = fleet.submit("chooser", "deploy").await;
    let msg = tokio::time::timeout(Duration::from_secs(20), asked.next())
        .await
        .expect("a question in time")
        .expect("message");
    let q: Value = delta_protocol::events::decode::<Value>(&msg.payload)
        .expect("a CloudEvent")
        .data;
    assert_eq!(q["run_id"], json!(run.to_string()));
    let rid = q["request_id"].as_str().expect("rid").to_owned();
    let reply = bot_answer(
        &nc,
        "gwb",
        &rid,
        br#"{"option_id": "staging", "responder": {"id": "slackbot"}}"#.to_vec(),
        None,
    )
    .await;
    assert_eq!(reply, json!({"ok": true, "run_id": run.to_string()}));
    fleet.wait_status(run, RunStatus::Completed).await;
    let stored = fleet.store.load(run).await.expect("load");
    let h = answers_of(&stored)
        .into_iter()
        .next()
        .expect("answer journaled");
    assert_eq!(h.responder.id, "slackbot");
    assert_eq!(
        serde_json::to_value(h.responder.via).expect("via"),
        json!("nats")
    );
    assert_eq!(stored.record.result.as_deref(), Some("staging is ready"));
    // The same answer again is acknowledged (idempotent); a different one is refused.
    let again = bot_answer(
        &nc,
        "gwb",
        &rid,
        br#"{"option_id": "staging", "responder": {"id": "slackbot"}}"#.to_vec(),
        None,
    )
    .await;
    assert_eq!(again["ok"], true, "{again}");
    let other = bot_answer(
        &nc,
        "gwb",
        &rid,
        br#"{"option_id": "production"}"#.to_vec(),
        None,
    )
    .await;
    assert_eq!(other["error"]["code"], "already_resolved", "{other}");
}

#[tokio::test(flavor = "multi_thread")]
async fn fifty_concurrent_answers_one_wins_and_the_run_resumes_once() {
    let fleet = Fleet::start("gwc", 1, 2).await;
    let run = fleet.submit("hello", "race").await;
    let rid = fleet.pending(run).await;
    let mut tasks = vec![];
    for i in 0..50 {
        let client = fleet.client.clone();
        let rid = rid.clone();
        tasks.push(tokio::spawn(async move {
            client
                .post(
                    &format!("/v1/interactions/{rid}/response"),
                    &json!({"input": format!("name {i}"), "responder": {"id": format!("p{i}")}}),
                )
                .await
                .expect("answer")
        }));
    }
    let mut accepted = vec![];
    let mut refused = 0;
    for (i, t) in tasks.into_iter().enumerate() {
        let (status, body) = t.await.expect("join");
        match status {
            200 => accepted.push(i),
            409 => {
                assert_eq!(body["error"]["code"], "already_resolved");
                refused += 1;
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!((accepted.len(), refused), (1, 49));
    fleet.wait_status(run, RunStatus::Completed).await;
    let stored = fleet.store.load(run).await.expect("load");
    assert_eq!(
        count(&stored, |e| matches!(e, Event::HumanInputReceived(_))),
        1
    );
    // Started once, resumed once.
    assert_eq!(workers_of(&stored).len(), 2);
    let winner = accepted[0];
    assert_eq!(
        stored.record.result.as_deref(),
        Some(format!("Greeted name {winner}.").as_str())
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn deadlines_apply_the_default_or_fail_the_run() {
    let fleet = Fleet::start("gwd", 1, 1).await;
    let with_default = fleet.submit("timed", "wait").await;
    let without = fleet.submit("timed_nodefault", "wait").await;
    let rid = fleet.pending(with_default).await;
    fleet.pending(without).await;
    fleet.wait_status(with_default, RunStatus::Completed).await;
    fleet.wait_status(without, RunStatus::Failed).await;
    let done = fleet.store.load(with_default).await.expect("load");
    assert_eq!(done.record.result.as_deref(), Some("done: later"));
    let h = answers_of(&done)
        .into_iter()
        .next()
        .expect("the clock's answer is journaled");
    assert_eq!(
        (h.responder.id.as_str(), h.option_id.as_deref()),
        ("timeout", Some("later"))
    );
    let failed = fleet.store.load(without).await.expect("load");
    assert!(
        failed
            .record
            .error
            .as_deref()
            .is_some_and(|e| e.contains("expired")),
        "{:?}",
        failed.record.error
    );
    // An answer after the deadline is refused as expired, and changes nothing.
    let (status, body) = fleet.answer(&rid, json!({"option_id": "now"})).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (410, &json!("expired")),
        "{body}"
    );
    let after = fleet.store.load(with_default).await.expect("load");
    assert_eq!(after.journal.len(), done.journal.len());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_killed_between_answered_and_publish_is_mended_by_a_reconciler() {
    let mut fleet = Fleet::start("gwe", 0, 1).await;
    let doomed = fleet.add_gateway(Some("answer:before-publish")).await;
    let run = {
        let (status, body) = doomed
            .post("/v1/runs", &json!({"agent": "hello", "task": "crash"}))
            .await
            .expect("submit");
        assert_eq!(status, 202);
        body["run_id"]
            .as_str()
            .expect("id")
            .parse::<RunId>()
            .expect("uuid")
    };
    let rid = pending(&doomed, run).await;
    // The answer is stored, then the gateway dies before publishing the resume.
    let reply = doomed
        .post(
            &format!("/v1/interactions/{rid}/response"),
            &json!({"input": "Grace"}),
        )
        .await;
    died_at_its_failpoint(&mut fleet, &reply);
    let ix = stored_question(&fleet, run, rid.parse().expect("rid")).await;
    assert_eq!(ix.state, delta_protocol::InteractionState::Answered);
    assert_eq!(ix.resume_seq, None, "no resume was published");
    assert_eq!(
        fleet.store.load(run).await.expect("load").record.status,
        RunStatus::WaitingForInput
    );
    // A healthy gateway's reconciler publishes the resume.
    fleet.add_gateway(None).await;
    fleet.wait_status(run, RunStatus::Completed).await;
    let stored = fleet.store.load(run).await.expect("load");
    assert_eq!(stored.record.result.as_deref(), Some("Greeted Grace."));
    assert_eq!(
        count(&stored, |e| matches!(e, Event::HumanInputReceived(_))),
        1
    );
}

/// A gateway killed between a cancel's write and its announcements: the cancel retried (on
/// another gateway: `409 already_resolved`) announces then what the first did not, the closing
/// of the question the run waited on (`interaction.cancelled`) and the run's end, under the ids
/// they would have had. Before, the retry announced only the run's end: bots and channels kept
/// the question open, its buttons answered `already_resolved`.
#[tokio::test(flavor = "multi_thread")]
async fn a_cancel_retried_after_its_gateway_died_announces_the_closed_question() {
    let mut fleet = Fleet::start("gwk", 0, 1).await;
    let doomed = fleet.add_gateway(Some("cancel:before-announce")).await;
    let (status, body) = doomed
        .post("/v1/runs", &json!({"agent": "hello", "task": "cancel me"}))
        .await
        .expect("submit");
    assert_eq!(status, 202, "{body}");
    let run: RunId = body["run_id"].as_str().expect("id").parse().expect("uuid");
    let rid = pending(&doomed, run).await;
    let reply = doomed
        .post(&format!("/v1/runs/{run}/cancel"), &json!({}))
        .await;
    died_at_its_failpoint(&mut fleet, &reply);
    let ix = stored_question(&fleet, run, rid.parse().expect("rid")).await;
    assert_eq!(ix.state, delta_protocol::InteractionState::Cancelled);
    let js = async_nats::jetstream::new(fleet.nats_admin().await);
    let mut events = js.get_stream("GWK_INTERACTIONS").await.expect("stream");
    let stored = async |events: &mut async_nats::jetstream::stream::Stream| {
        delta_e2e::stored_events(events)
            .await
            .into_iter()
            .map(|v| v["type"].as_str().unwrap_or_default().to_owned())
            .collect::<Vec<_>>()
    };
    let before = stored(&mut events).await;
    assert!(
        !before.iter().any(|t| t.contains("cancelled")),
        "nothing of the cancel announced: {before:?}"
    );
    let healthy = fleet.add_gateway(None).await;
    let (status, body) = healthy
        .post(&format!("/v1/runs/{run}/cancel"), &json!({}))
        .await
        .expect("cancel again");
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "already_resolved", "{body}");
    let after = stored(&mut events).await;
    let new: Vec<&str> = after[before.len()..].iter().map(String::as_str).collect();
    assert_eq!(
        new,
        ["dev.delta.interaction.cancelled", "dev.delta.run.cancelled"],
        "{after:?}"
    );
    // A third try adds nothing: the same ids.
    let (status, _) = healthy
        .post(&format!("/v1/runs/{run}/cancel"), &json!({}))
        .await
        .expect("cancel again");
    assert_eq!(status, 409);
    assert_eq!(
        stored(&mut events).await.len(),
        after.len(),
        "no duplicates"
    );
}

/// A cancel that lands between a worker's pause write and its question's announcement (the
/// worker's `pause:before-announce` failpoint holds it there 3 s) waits for the worker to let its
/// job go: the events stream has the question asked, then cancelled, then the run's end, in that
/// order. Before, the cancellation and the end came first, and the question after them, open.
#[tokio::test(flavor = "multi_thread")]
async fn a_cancel_right_after_a_pause_is_announced_after_the_question() {
    let mut fleet = Fleet::start("gwo", 1, 0).await;
    fleet
        .worker_spec
        .extra
        .push(("DELTA_FAILPOINT", "pause:before-announce@3000".into()));
    fleet.add_worker("slow");
    let (status, body) = fleet
        .client
        .post("/v1/runs", &json!({"agent": "hello", "task": "cancel me"}))
        .await
        .expect("submit");
    assert_eq!(status, 202, "{body}");
    let run: RunId = body["run_id"].as_str().expect("id").parse().expect("uuid");
    // Paused (written), and not announced yet.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, r) = fleet
            .client
            .get(&format!("/v1/runs/{run}"))
            .await
            .expect("get");
        if r["status"] == "WAITING_FOR_INPUT" {
            break;
        }
        assert!(Instant::now() < deadline, "never paused: {r}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let js = async_nats::jetstream::new(fleet.nats_admin().await);
    let mut events = js.get_stream("GWO_INTERACTIONS").await.expect("stream");
    let of_run = async |events: &mut async_nats::jetstream::stream::Stream| {
        delta_e2e::stored_events(events)
            .await
            .into_iter()
            .filter(|v| v["deltarun"] == json!(run.to_string()))
            .map(|v| v["type"].as_str().unwrap_or_default().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        of_run(&mut events).await,
        Vec::<String>::new(),
        "the worker waits"
    );
    let (status, body) = fleet
        .client
        .post(&format!("/v1/runs/{run}/cancel"), &json!({}))
        .await
        .expect("cancel");
    assert_eq!(status, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = of_run(&mut events).await;
    while seen.len() < 3 {
        assert!(Instant::now() < deadline, "three events: {seen:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
        seen = of_run(&mut events).await;
    }
    assert_eq!(
        seen,
        [
            "dev.delta.interaction.requested",
            "dev.delta.interaction.cancelled",
            "dev.delta.run.cancelled"
        ]
    );
}

/// An escalation step carried out by a gateway that died before announcing it is announced by
/// another gateway (under its own id, so once), before that gateway carries out the next step.
#[tokio::test(flavor = "multi_thread")]
async fn an_escalation_step_whose_gateway_died_is_announced_by_another() {
    let mut fleet = Fleet::start("gwe", 0, 1).await;
    fleet.add_agent(
        "escalating",
        "name: escalating\nbrain: scripted\n",
        "steps:\n  - ask_human:\n      prompt: \"Restart the database?\"\n      escalation:\n        - {after: 1s, remind: true}\n        - {after: 2s, remind: true}\n  - finish: \"${answer}\"\n",
    );
    let doomed = fleet.add_gateway(Some("escalate:before-announce")).await;
    let (status, body) = doomed
        .post("/v1/runs", &json!({"agent": "escalating", "task": "go"}))
        .await
        .expect("submit");
    assert_eq!(status, 202, "{body}");
    let run: RunId = body["run_id"].as_str().expect("id").parse().expect("uuid");
    // Its reconciler carries out the first step a second later, and dies before announcing it
    // (so the question is read from the store, not from it).
    assert_eq!(
        fleet.gateways[0].wait_exit(Duration::from_secs(15)),
        Some(86)
    );
    let rid = fleet
        .store
        .record(run)
        .await
        .expect("record")
        .pending_request_id
        .expect("waits on its question");
    let ix = stored_question(&fleet, run, rid).await;
    assert_eq!(ix.escalated, 1, "the step is carried out");
    assert!(ix.unannounced_step.is_some(), "and not announced");
    let js = async_nats::jetstream::new(fleet.nats_admin().await);
    let mut events = js.get_stream("GWE_INTERACTIONS").await.expect("stream");
    let escalated = async |events: &mut async_nats::jetstream::stream::Stream| {
        delta_e2e::stored_events(events)
            .await
            .into_iter()
            .filter(|v| v["type"] == "dev.delta.interaction.escalated")
            .map(|v| (v["id"].clone(), v["data"]["step"].clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(escalated(&mut events).await, []);

    fleet.add_gateway(None).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = escalated(&mut events).await;
    while seen.len() < 2 {
        assert!(Instant::now() < deadline, "both steps announced: {seen:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        seen = escalated(&mut events).await;
    }
    assert_eq!(
        seen,
        [
            (json!(format!("escalated:{rid}:1")), json!(1)),
            (json!(format!("escalated:{rid}:2")), json!(2)),
        ],
        "the first step announced, then the second carried out and announced"
    );
    let ix = stored_question(&fleet, run, rid).await;
    assert_eq!((ix.escalated, ix.unannounced_step), (2, None));
    // Nothing more to look at: the question left the escalation index.
    let indexed = fleet
        .store
        .due_escalations(i64::MAX, 100)
        .await
        .expect("index");
    assert!(!indexed.contains(&(run, rid)), "{indexed:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn sse_reconnect_with_last_event_id_yields_every_event_once() {
    let fleet = Fleet::start("gwf", 1, 1).await;
    let run = fleet.submit("hello", "stream").await;
    let path = format!("/v1/runs/{run}/events");
    let mut first = fleet.client.sse(&path, None).await.expect("sse");
    assert_eq!(first.status(), 200);
    let mut seen: Vec<u64> = vec![];
    // Read until the pause, then drop the connection.
    while let Some(e) = first.next(Duration::from_secs(20)).await {
        assert_eq!(e.event, "journal");
        let ev: Value = serde_json::from_str(&e.data).expect("event JSON");
        assert_eq!(e.id.as_deref(), Some(ev["seq"].to_string().as_str()));
        seen.push(ev["seq"].as_u64().expect("seq"));
        if ev["type"] == "ENGINE_END" {
            break;
        }
    }
    drop(first);
    let rid = fleet.pending(run).await;
    fleet.answer(&rid, json!({"input": "Lin"})).await;
    let last = *seen.last().expect("some events");
    let mut second = fleet.client.sse(&path, Some(last)).await.expect("sse");
    let mut status = None;
    while let Some(e) = second.next(Duration::from_secs(20)).await {
        if e.event == "status" {
            status = Some(serde_json::from_str::<Value>(&e.data).expect("status"));
            break;
        }
        let ev: Value = serde_json::from_str(&e.data).expect("event JSON");
        seen.push(ev["seq"].as_u64().expect("seq"));
    }
    assert_eq!(
        status.expect("a status event at the end")["status"],
        "COMPLETED"
    );
    let journal = fleet.store.load(run).await.expect("load").journal;
    let all: Vec<u64> = journal.iter().map(|e| e.seq).collect();
    assert_eq!(seen, all, "every event exactly once, in order");
    // A finished run's stream replays and ends by itself.
    let mut replay = fleet.client.sse(&path, Some(3)).await.expect("sse");
    let mut n = 0;
    while let Some(e) = replay.next(Duration::from_secs(10)).await {
        if e.event == "status" {
            break;
        }
        n += 1;
    }
    assert_eq!(n, all.len() - 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_interactions_stream_shows_requested_and_resolved_and_catches_up() {
    let fleet = Fleet::start("gwg", 1, 1).await;
    let mut live = fleet
        .client
        .sse("/v1/interactions/stream", None)
        .await
        .expect("sse");
    let run = fleet.submit("hello", "x").await;
    let asked = live.next(Duration::from_secs(20)).await.expect("requested");
    assert_eq!(asked.event, "requested");
    let q: Value = serde_json::from_str(&asked.data).expect("json");
    let rid = q["request_id"].as_str().expect("rid").to_owned();
    assert_eq!(q["run_id"], json!(run.to_string()));
    fleet.answer(&rid, json!({"input": "Kim"})).await;
    let resolved = live.next(Duration::from_secs(20)).await.expect("resolved");
    assert_eq!(resolved.event, "resolved");
    let r: Value = serde_json::from_str(&resolved.data).expect("json");
    assert_eq!(
        (r["request_id"].as_str(), r["state"].as_str()),
        (Some(rid.as_str()), Some("ANSWERED"))
    );
    // Reconnecting after the first event catches up on the second.
    let first_id: u64 = asked.id.expect("id").parse().expect("number");
    let mut again = fleet
        .client
        .sse("/v1/interactions/stream", Some(first_id))
        .await
        .expect("sse");
    let next = again
        .next(Duration::from_secs(10))
        .await
        .expect("caught up");
    assert_eq!((next.event.as_str(), next.id), ("resolved", resolved.id));
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_is_refused_with_its_code_over_http_and_nats_and_changes_nothing() {
    let fleet = Fleet::start("gwh", 1, 1).await;
    let run = fleet.submit("chooser", "bad input").await;
    let rid = fleet.pending(run).await;
    let before = fleet.store.load(run).await.expect("load");
    let path = format!("/v1/interactions/{rid}/response");
    let unknown = RunId::new();
    let raw = |s: &str| s.as_bytes().to_vec();
    let big = vec![b' '; 70 * 1024];
    let cases: Vec<(&str, String, Vec<u8>, u16, &str)> = vec![
        (
            "malformed JSON",
            path.clone(),
            raw("{\"option_id\": "),
            400,
            "bad_request",
        ),
        (
            "wrong type",
            path.clone(),
            raw(r#"{"option_id": 7}"#),
            400,
            "bad_request",
        ),
        (
            "unknown field",
            path.clone(),
            raw(r#"{"option": "staging"}"#),
            400,
            "bad_request",
        ),
        ("empty body", path.clone(), vec![], 400, "bad_request"),
        (
            "oversized",
            path.clone(),
            big.clone(),
            413,
            "payload_too_large",
        ),
        (
            "invalid option",
            path.clone(),
            raw(r#"{"option_id": "moon"}"#),
            422,
            "invalid_option",
        ),
        (
            "missing option",
            path.clone(),
            raw(r#"{"input": "x"}"#),
            422,
            "invalid_option",
        ),
        (
            "missing input",
            path.clone(),
            raw(r#"{"option_id": "other"}"#),
            422,
            "input_required",
        ),
        (
            "bad data",
            path.clone(),
            raw(r#"{"option_id": "staging", "data": [1]}"#),
            422,
            "invalid_args",
        ),
        (
            "unknown request",
            format!("/v1/interactions/{unknown}/response"),
            raw(r#"{"option_id": "staging"}"#),
            404,
            "not_found",
        ),
        (
            "not a request id",
            "/v1/interactions/nope/response".into(),
            raw(r#"{"option_id": "staging"}"#),
            400,
            "bad_request",
        ),
        (
            "unknown run",
            format!("/v1/runs/{unknown}/cancel"),
            vec![],
            404,
            "not_found",
        ),
        (
            "submit unknown agent",
            "/v1/runs".into(),
            raw(r#"{"agent": "ghost", "task": "t"}"#),
            422,
            "invalid_args",
        ),
        (
            "submit wrong type",
            "/v1/runs".into(),
            raw(r#"{"agent": "hello", "task": 1}"#),
            400,
            "bad_request",
        ),
        (
            "submit unknown field",
            "/v1/runs".into(),
            raw(r#"{"agent": "hello", "task": "t", "prio": 1}"#),
            400,
            "bad_request",
        ),
        (
            "submit empty task",
            "/v1/runs".into(),
            raw(r#"{"agent": "hello", "task": " "}"#),
            422,
            "invalid_args",
        ),
    ];
    for (what, path, body, status, code) in &cases {
        let (got, reply) = fleet
            .client
            .post_raw(path, body.clone(), &[])
            .await
            .expect("request");
        assert_eq!(
            (got, reply["error"]["code"].as_str()),
            (*status, Some(*code)),
            "{what}: {reply}"
        );
        assert!(
            reply["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{what}: a message"
        );
    }
    for (what, path, status, code) in [
        (
            "unknown run",
            format!("/v1/runs/{unknown}"),
            404,
            "not_found",
        ),
        (
            "unknown journal",
            format!("/v1/runs/{unknown}/journal"),
            404,
            "not_found",
        ),
        (
            "unknown interaction",
            format!("/v1/interactions/{unknown}"),
            404,
            "not_found",
        ),
        (
            "bad status filter",
            "/v1/runs?status=SLEEPING".into(),
            400,
            "bad_request",
        ),
        (
            "bad cursor",
            "/v1/runs?cursor=zzz".into(),
            400,
            "bad_request",
        ),
        ("bad limit", "/v1/runs?limit=0".into(), 400, "bad_request"),
        (
            "unknown query",
            "/v1/interactions?stat=pending".into(),
            400,
            "bad_request",
        ),
        ("no such endpoint", "/v2/nothing".into(), 404, "not_found"),
    ] {
        let (got, reply) = fleet.client.get(&path).await.expect("request");
        assert_eq!(
            (got, reply["error"]["code"].as_str()),
            (status, Some(code)),
            "{what}: {reply}"
        );
    }
    // The same refusals over NATS, with the same codes.
    let nc = fleet.nats().await;
    for (what, rid, body, code) in [
        ("malformed JSON", rid.clone(), raw("{"), "bad_request"),
        (
            "unknown field",
            rid.clone(),
            raw(r#"{"option": "x"}"#),
            "bad_request",
        ),
        ("empty", rid.clone(), vec![], "bad_request"),
        ("oversized", rid.clone(), big.clone(), "payload_too_large"),
        (
            "invalid option",
            rid.clone(),
            raw(r#"{"option_id": "moon"}"#),
            "invalid_option",
        ),
        (
            "missing input",
            rid.clone(),
            raw(r#"{"option_id": "other"}"#),
            "input_required",
        ),
        (
            "unknown request",
            unknown.to_string(),
            raw(r#"{"option_id": "staging"}"#),
            "not_found",
        ),
        (
            "not a request id",
            "nope".into(),
            raw(r#"{"option_id": "staging"}"#),
            "bad_request",
        ),
    ] {
        let reply = bot_answer(&nc, "gwh", &rid, body, None).await;
        assert_eq!(reply["ok"], false, "{what}: {reply}");
        assert_eq!(reply["error"]["code"], code, "{what}: {reply}");
    }
    // Nothing changed: the run still waits on the same question with the same journal.
    let after = fleet.store.load(run).await.expect("load");
    assert_eq!(after.journal, before.journal);
    assert_eq!(after.record.status, RunStatus::WaitingForInput);
    let (_, ix) = fleet
        .client
        .get(&format!("/v1/interactions/{rid}"))
        .await
        .expect("get");
    assert_eq!(ix["state"], "PENDING");
    // Then a good answer goes through, and answers after it are refused.
    let (status, _) = fleet
        .answer(&rid, json!({"option_id": "other", "input": "qa"}))
        .await;
    assert_eq!(status, 200);
    fleet.wait_status(run, RunStatus::Completed).await;
    let (status, body) = fleet.answer(&rid, json!({"option_id": "staging"})).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (409, &json!("already_resolved"))
    );
    let reply = bot_answer(&nc, "gwh", &rid, raw(r#"{"option_id": "staging"}"#), None).await;
    assert_eq!(reply["error"]["code"], "already_resolved");
    // Cancel a finished run: refused.
    let (status, body) = fleet
        .client
        .post(&format!("/v1/runs/{run}/cancel"), &json!({}))
        .await
        .expect("cancel");
    assert_eq!(
        (status, &body["error"]["code"]),
        (409, &json!("already_resolved"))
    );
}

fn tokens_file(dir: &Path) -> PathBuf {
    let f = dir.join("tokens.yaml");
    std::fs::write(
        &f,
        "- name: alice\n  token: alice-token-0123456789\n  roles: [answer]\n\
         - name: bob\n  token: bob-token-0123456789ab\n  roles: [answer]\n\
         - name: ci\n  token: ci-token-0123456789abcd\n  roles: [submit]\n\
         - name: ops\n  token: ops-token-0123456789abc\n  roles: [operate]\n",
    )
    .expect("tokens");
    f
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_roles_and_allowed_responders_on_every_channel() {
    let dir = tempfile::tempdir().expect("tmp");
    let tokens = tokens_file(dir.path());
    let fleet = Fleet::start_with("gwi", 1, 1, |s| s.tokens_file = Some(tokens.clone())).await;
    let anon = fleet.client.clone();
    let ci = anon.with_token(Some("ci-token-0123456789abcd"));
    let alice = anon.with_token(Some("alice-token-0123456789"));
    let bob = anon.with_token(Some("bob-token-0123456789ab"));
    let ops = anon.with_token(Some("ops-token-0123456789abc"));
    let submit = json!({"agent": "guarded", "task": "budget"});
    let (s, b) = anon.post("/v1/runs", &submit).await.expect("r");
    assert_eq!((s, &b["error"]["code"]), (401, &json!("unauthorized")));
    let (s, b) = anon
        .with_token(Some("wrong-token-0123456789"))
        .post("/v1/runs", &submit)
        .await
        .expect("r");
    assert_eq!((s, &b["error"]["code"]), (401, &json!("unauthorized")));
    let (s, b) = alice.post("/v1/runs", &submit).await.expect("r");
    assert_eq!(
        (s, &b["error"]["code"]),
        (403, &json!("forbidden")),
        "answerers do not submit"
    );
    let (s, b) = ci.post("/v1/runs", &submit).await.expect("r");
    assert_eq!(s, 202, "{b}");
    let run: RunId = b["run_id"].as_str().expect("id").parse().expect("uuid");
    let rid = pending(&ops, run).await;
    let path = format!("/v1/interactions/{rid}/response");
    let (s, b) = ci.get("/v1/interactions").await.expect("r");
    assert_eq!(
        (s, &b["error"]["code"]),
        (403, &json!("forbidden")),
        "submitters do not read questions"
    );
    let (s, b) = ci
        .post(&format!("/v1/runs/{run}/cancel"), &json!({}))
        .await
        .expect("r");
    assert_eq!((s, &b["error"]["code"]), (403, &json!("forbidden")));
    // Only alice may answer this one: bob is refused over HTTP, and over NATS.
    let (s, b) = bob.post(&path, &json!({"input": "yes"})).await.expect("r");
    assert_eq!((s, &b["error"]["code"]), (403, &json!("forbidden")), "{b}");
    let nc = fleet.nats().await;
    let reply = bot_answer(
        &nc,
        "gwi",
        &rid,
        br#"{"input": "yes"}"#.to_vec(),
        Some("bob-token-0123456789ab"),
    )
    .await;
    assert_eq!(reply["error"]["code"], "forbidden", "{reply}");
    let reply = bot_answer(&nc, "gwi", &rid, br#"{"input": "yes"}"#.to_vec(), None).await;
    assert_eq!(reply["error"]["code"], "unauthorized", "{reply}");
    let reply = bot_answer(
        &nc,
        "gwi",
        &rid,
        br#"{"input": "yes"}"#.to_vec(),
        Some("nope-nope-nope-nope"),
    )
    .await;
    assert_eq!(reply["error"]["code"], "unauthorized", "{reply}");
    // Alice cannot pretend to be someone else.
    let (s, b) = alice
        .post(&path, &json!({"input": "yes", "responder": {"id": "bob"}}))
        .await
        .expect("r");
    assert_eq!((s, &b["error"]["code"]), (403, &json!("forbidden")), "{b}");
    // Her bot, with her token, answers: her identity is journaled.
    let reply = bot_answer(
        &nc,
        "gwi",
        &rid,
        br#"{"input": "approved"}"#.to_vec(),
        Some("alice-token-0123456789"),
    )
    .await;
    assert_eq!(reply["ok"], true, "{reply}");
    fleet.wait_status(run, RunStatus::Completed).await;
    let stored = fleet.store.load(run).await.expect("load");
    let h = answers_of(&stored).into_iter().next().expect("journaled");
    assert_eq!(h.responder.id, "alice");
    // Operators see the queue; others do not.
    let (s, q) = ops.get("/v1/queue").await.expect("queue");
    assert_eq!(s, 200, "{q}");
    assert!(
        q["workers"].as_array().is_some_and(|w| !w.is_empty()),
        "{q}"
    );
    let (s, _) = alice.get("/v1/queue").await.expect("queue");
    assert_eq!(s, 403);
    // Open endpoints stay open.
    for p in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
        let (s, _) = anon.get(p).await.expect("open");
        assert_eq!(s, 200, "{p}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_gateways_never_double_apply_answers_timeouts_or_reconciles() {
    let mut fleet = Fleet::start("gwj", 2, 2).await;
    let second = Client::new(&fleet.gateways[1].url, None);
    // Answers racing through both gateways: one wins per request.
    let mut runs = vec![];
    for i in 0..10 {
        runs.push(fleet.submit("hello", &format!("race {i}")).await);
    }
    for run in &runs {
        let rid = fleet.pending(*run).await;
        let p = format!("/v1/interactions/{rid}/response");
        let (one, two) = (
            json!({"input": "one", "responder": {"id": "x"}}),
            json!({"input": "two", "responder": {"id": "y"}}),
        );
        let (a, b) = tokio::join!(fleet.client.post(&p, &one), second.post(&p, &two));
        let codes = [a.expect("a").0, b.expect("b").0];
        assert!(codes.contains(&200) && codes.contains(&409), "{codes:?}");
    }
    // Deadlines with both reconcilers running: each applied once.
    let timed: Vec<RunId> = {
        let mut v = vec![];
        for _ in 0..5 {
            v.push(fleet.submit("timed", "t").await);
        }
        v
    };
    for run in runs.iter().chain(&timed) {
        fleet.wait_status(*run, RunStatus::Completed).await;
    }
    for run in runs.iter().chain(&timed) {
        let stored = fleet.store.load(*run).await.expect("load");
        assert_eq!(
            count(&stored, |e| matches!(e, Event::HumanInputReceived(_))),
            1,
            "{run}"
        );
        assert_eq!(
            workers_of(&stored).len(),
            2,
            "started and resumed once: {run}"
        );
    }
    // A crash between ANSWERED and the publish, with two healthy gateways reconciling.
    let doomed = fleet.add_gateway(Some("answer:before-publish")).await;
    let run = fleet.submit("hello", "crash").await;
    let rid = fleet.pending(run).await;
    let reply = doomed
        .post(
            &format!("/v1/interactions/{rid}/response"),
            &json!({"input": "Z"}),
        )
        .await;
    // It died at its failpoint: the answer stored, its resume not published (by it).
    assert!(
        reply.is_err(),
        "the connection drops with the gateway: {reply:?}"
    );
    assert_eq!(
        fleet
            .gateways
            .last_mut()
            .expect("the doomed gateway")
            .wait_exit(Duration::from_secs(10)),
        Some(86)
    );
    fleet.wait_status(run, RunStatus::Completed).await;
    // Let both reconcilers have several goes at it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stored = fleet.store.load(run).await.expect("load");
    assert_eq!(
        count(&stored, |e| matches!(e, Event::HumanInputReceived(_))),
        1
    );
    assert_eq!(workers_of(&stored).len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn submit_is_idempotent_lists_page_and_cancel_closes_the_question() {
    let fleet = Fleet::start("gwk", 1, 1).await;
    let body = json!({"agent": "hello", "task": "once"});
    let key = [("idempotency-key", "order-42")];
    let bytes = serde_json::to_vec(&body).expect("json");
    let (s1, a) = fleet
        .client
        .post_raw("/v1/runs", bytes.clone(), &key)
        .await
        .expect("r");
    let (s2, b) = fleet
        .client
        .post_raw("/v1/runs", bytes, &key)
        .await
        .expect("r");
    assert_eq!((s1, s2), (202, 202));
    assert_eq!(a["run_id"], b["run_id"], "the same key makes one run");
    let other = serde_json::to_vec(&json!({"agent": "hello", "task": "twice"})).expect("json");
    let (s, c) = fleet
        .client
        .post_raw("/v1/runs", other, &key)
        .await
        .expect("r");
    assert_eq!(
        (s, &c["error"]["code"]),
        (422, &json!("invalid_args")),
        "{c}"
    );
    // Pages of runs, newest first, without repeats or gaps.
    let mut made = vec![a["run_id"].as_str().expect("id").to_owned()];
    for i in 0..6 {
        made.push(fleet.submit("hello", &format!("p{i}")).await.to_string());
    }
    let mut listed = vec![];
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/runs?limit=3&cursor={c}"),
            None => "/v1/runs?limit=3".into(),
        };
        let (s, page) = fleet.client.get(&path).await.expect("list");
        assert_eq!(s, 200, "{page}");
        for r in page["runs"].as_array().expect("runs") {
            listed.push(r["run_id"].as_str().expect("id").to_owned());
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    made.reverse();
    assert_eq!(listed, made);
    // Cancel a waiting run: the question closes, the run ends CANCELLED.
    let run: RunId = made[0].parse().expect("id");
    let rid = fleet.pending(run).await;
    let (s, r) = fleet
        .client
        .post(
            &format!("/v1/runs/{run}/cancel"),
            &json!({"reason": "not needed"}),
        )
        .await
        .expect("cancel");
    assert_eq!((s, &r["status"]), (200, &json!("CANCELLED")), "{r}");
    let (_, ix) = fleet
        .client
        .get(&format!("/v1/interactions/{rid}"))
        .await
        .expect("get");
    assert_eq!(ix["state"], "CANCELLED");
    let (s, b) = fleet.answer(&rid, json!({"input": "late"})).await;
    assert_eq!((s, &b["error"]["code"]), (409, &json!("already_resolved")));
    let stored = fleet.store.load(run).await.expect("load");
    assert_eq!(stored.record.status, RunStatus::Cancelled);
    assert!(
        stored
            .record
            .error
            .as_deref()
            .is_some_and(|e| e.contains("not needed"))
    );
    // Journal paging and the metrics.
    let (_, j) = fleet
        .client
        .get(&format!("/v1/runs/{run}/journal?from_seq=2&limit=2"))
        .await
        .expect("journal");
    assert_eq!(j["events"].as_array().map(Vec::len), Some(2), "{j}");
    assert_eq!(j["events"][0]["seq"], 2);
    assert_eq!(j["next_seq"], 4);
    let (_, m) = fleet.client.get("/metrics").await.expect("metrics");
    let text = m.as_str().expect("text");
    for needle in [
        "delta_runs{status=\"CANCELLED\"} 1",
        "delta_interactions_pending",
        "delta_answer_to_resume_seconds_bucket",
        "delta_time_to_answer_seconds_count",
        "delta_jobs_redelivered",
    ] {
        assert!(text.contains(needle), "{needle} in\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sensitive_answers_need_the_key_and_never_show() {
    let key = "ab".repeat(32);
    let fleet = Fleet::start_with("gwl", 1, 1, |s| s.secrets_key_hex = Some(key.clone())).await;
    let run = fleet.submit("secret", "key").await;
    let rid = fleet.pending(run).await;
    let canary = "canary-5e1f-9a7c";
    let (s, b) = fleet.answer(&rid, json!({"input": canary})).await;
    assert_eq!(s, 200, "{b}");
    fleet.wait_status(run, RunStatus::Completed).await;
    for path in [
        format!("/v1/interactions/{rid}"),
        "/v1/interactions?state=all".into(),
        format!("/v1/runs/{run}"),
        format!("/v1/runs/{run}/journal"),
    ] {
        let (_, body) = fleet.client.get(&path).await.expect("get");
        assert!(
            !body.to_string().contains(canary),
            "{path} shows the secret: {body}"
        );
    }
    let (_, ix) = fleet
        .client
        .get(&format!("/v1/interactions/{rid}"))
        .await
        .expect("get");
    assert_eq!(ix["response"]["input"], "***");
    // A gateway without the key refuses sensitive answers instead of storing them in clear.
    let spec = gateways::Spec {
        port: delta_e2e::free_port().expect("port"),
        secrets_key_hex: None,
        ..fleet.gateway_spec.clone()
    };
    let gw = gateways::spawn(&spec, None).await;
    let c = Client::new(&gw.url, None);
    let run2 = {
        let (_, b) = c
            .post("/v1/runs", &json!({"agent": "secret", "task": "k"}))
            .await
            .expect("r");
        b["run_id"]
            .as_str()
            .expect("id")
            .parse::<RunId>()
            .expect("uuid")
    };
    let rid2 = pending(&c, run2).await;
    let (s, b) = c
        .post(
            &format!("/v1/interactions/{rid2}/response"),
            &json!({"input": canary}),
        )
        .await
        .expect("r");
    assert_eq!(
        (s, &b["error"]["code"]),
        (503, &json!("unavailable")),
        "{b}"
    );
    let (_, ix) = c
        .get(&format!("/v1/interactions/{rid2}"))
        .await
        .expect("get");
    assert_eq!(ix["state"], "PENDING");
}

/// Jobs ever published to the fleet's jobs stream (its last sequence: a work queue's messages
/// go once a worker acks them, so its count would miss a job published and taken).
async fn jobs_published(fleet: &Fleet, stream: &str) -> u64 {
    let js = async_nats::jetstream::new(fleet.nats_admin().await);
    let mut stream = js.get_stream(stream).await.expect("stream");
    stream.info().await.expect("info").state.last_sequence
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_edited_arguments_are_refused_at_the_gateway_over_http_and_nats() {
    let fleet = Fleet::start("gwm", 1, 1).await;
    let run = fleet.submit("gated", "shout").await;
    let rid = fleet.pending(run).await;
    let before = fleet.store.load(run).await.expect("load");
    let jobs_before = jobs_published(&fleet, "GWM_JOBS").await;
    // The question carries the tool's parameters, so the gateway checks edited arguments itself.
    let (_, ix) = fleet
        .client
        .get(&format!("/v1/interactions/{rid}"))
        .await
        .expect("get");
    assert_eq!(
        ix["request"]["context"]["parameters"],
        json!([{"name": "text", "type": "string", "required": true}]),
        "{ix}"
    );
    let (s, b) = fleet
        .answer(
            &rid,
            json!({"option_id": "approve", "data": {"args": {"volume": 11}}}),
        )
        .await;
    assert_eq!(s, 422, "{b}");
    assert_eq!(b["error"]["code"], "invalid_args", "{b}");
    assert!(
        b["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("unknown parameter `volume`")),
        "{b}"
    );
    let nc = fleet.nats().await;
    let reply = bot_answer(
        &nc,
        "gwm",
        &rid,
        br#"{"option_id": "approve", "data": {"args": {"text": 5, "loud": true}}, "responder": {"id": "bot"}}"#.to_vec(),
        None,
    )
    .await;
    assert_eq!(reply["error"]["code"], "invalid_args", "{reply}");
    // Still pending, nothing stored, no resume job published: no worker is involved.
    let (_, ix) = fleet
        .client
        .get(&format!("/v1/interactions/{rid}"))
        .await
        .expect("get");
    assert_eq!(ix["state"], "PENDING", "{ix}");
    assert_eq!(jobs_published(&fleet, "GWM_JOBS").await, jobs_before);
    let after = fleet.store.load(run).await.expect("load");
    assert_eq!(after.record.status, RunStatus::WaitingForInput);
    assert_eq!(
        after.journal.len(),
        before.journal.len(),
        "journal unchanged"
    );
    // A good answer goes through.
    approve_with_good_args_completes(&fleet, run, &rid).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_answer_the_engine_refuses_reopens_the_question_everywhere_and_a_corrected_one_resumes()
{
    let fleet = Fleet::start("gwr", 1, 1).await;
    let mut live = fleet
        .client
        .sse("/v1/interactions/stream", None)
        .await
        .expect("sse");
    let run = fleet.submit("gated", "shout").await;
    let rid = fleet.pending(run).await;
    // A question as a worker that predates `context.parameters` asked it (or an agent changed
    // between the answer and the resume): the gateway can check only the protocol's rules, and
    // the engine's check at resume is the defence.
    let key = fleet.store.interaction_key(run, &rid);
    let mut redis = delta_e2e::redis_connection(&fleet.redis.url()).await;
    let stored: String = redis::cmd("HGET")
        .arg(&key)
        .arg("request")
        .query_async(&mut redis)
        .await
        .expect("hget");
    // Packed where the journal is (docs/protocol.md): its JSON either way.
    let stored = delta_store::redis::request_json(&stored).expect("a request");
    let mut request: Value = serde_json::from_str(&stored).expect("request JSON");
    request["context"]
        .as_object_mut()
        .expect("context")
        .remove("parameters");
    let () = redis::cmd("HSET")
        .arg(&key)
        .arg("request")
        .arg(request.to_string())
        .query_async(&mut redis)
        .await
        .expect("hset");
    let (s, b) = fleet
        .answer(
            &rid,
            json!({"option_id": "approve", "data": {"args": {"volume": 11}}}),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, ix) = fleet
            .client
            .get(&format!("/v1/interactions/{rid}"))
            .await
            .expect("get");
        if ix["state"] == "PENDING" {
            break;
        }
        assert!(Instant::now() < deadline, "never reopened: {ix}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The worker journals why, opens the question again and pauses the run on it in one write:
    // once it is pending, the refusal is journaled and the run waits on it.
    let refused = |stored: &delta_store::StoredRun| {
        stored.journal.iter().any(|e| {
            matches!(&e.event, Event::SystemMessage(m)
            if m.content.contains("refused (invalid_args)") && m.content.contains("volume"))
        })
    };
    let stored = fleet.store.load(run).await.expect("load");
    assert!(refused(&stored), "the refusal is journaled");
    assert_eq!(
        stored.record.pending_request_id,
        Some(rid.parse().expect("id"))
    );
    assert_eq!(stored.record.status, RunStatus::WaitingForInput);
    let (_, listed) = fleet.client.get("/v1/interactions").await.expect("list");
    assert_eq!(
        listed["interactions"][0]["request_id"],
        json!(rid),
        "pending again"
    );
    // The live stream saw it asked, resolved, and asked again.
    let mut events = vec![];
    while events.len() < 3 {
        let e = live.next(Duration::from_secs(20)).await.expect("an event");
        let v: Value = serde_json::from_str(&e.data).expect("json");
        assert_eq!(v["request_id"], json!(rid), "{v}");
        events.push(e.event);
    }
    assert_eq!(events, ["requested", "resolved", "requested"]);
    // A corrected answer resumes the run at once: its resume job has an id of its own, not the
    // refused answer's (which NATS would drop as a duplicate).
    approve_with_good_args_completes(&fleet, run, &rid).await;
    // And its settling is announced too, as an event of its own (not dropped as a duplicate
    // of the first settling's).
    let e = live.next(Duration::from_secs(20)).await.expect("an event");
    assert_eq!(e.event, "resolved", "{}", e.data);
    let v: Value = serde_json::from_str(&e.data).expect("json");
    assert_eq!(v["request_id"], json!(rid), "{v}");
    assert_eq!(v["option_id"], "approve", "{v}");
}

/// A question the engine reopened, whose reopening delivery died before announcing it, is
/// announced by the job's next delivery under the reopen's id: under its first announcement's it
/// would be dropped as a duplicate, and bots, webhooks and live streams would never learn it is
/// open again.
#[tokio::test(flavor = "multi_thread")]
async fn a_reopened_question_is_announced_anew_by_the_jobs_next_delivery() {
    use delta_protocol::{Fence, Job};
    let fleet = Fleet::start("gwo", 1, 1).await;
    let run = fleet.submit("gated", "shout").await;
    let rid = fleet.pending(run).await;
    let request_id: delta_protocol::RequestId = rid.parse().expect("request id");
    let js = async_nats::jetstream::new(fleet.nats_admin().await);
    let mut events = js.get_stream("GWO_INTERACTIONS").await.expect("stream");
    // The requested announcements of the question, by their ids, as stored.
    let announced = async |events: &mut async_nats::jetstream::stream::Stream| {
        let state = events.info().await.expect("info").state.clone();
        let mut ids = vec![];
        for seq in state.first_sequence..=state.last_sequence {
            if let Ok(m) = events.get_raw_message(seq).await
                && m.subject.contains(".interactions.requested.")
            {
                let id = m
                    .headers
                    .get("Nats-Msg-Id")
                    .map(|v| v.to_string())
                    .unwrap_or_default();
                ids.push(id);
            }
        }
        ids
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while announced(&mut events).await.is_empty() {
        assert!(Instant::now() < deadline, "first announced");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(announced(&mut events).await, [format!("requested:{rid}")]);
    // An answer accepted (as a gateway settles it, but nobody publishes its resume job), then
    // refused and the question reopened by a delivery of job 9999 that died before it announced
    // the question again.
    let q = stored_question(&fleet, run, request_id).await.request;
    let a = delta_e2e::typed_answer(request_id, "too loud");
    assert!(fleet.store.answer(&q, &a).await.expect("answer"));
    let refused_at = stored_question(&fleet, run, request_id)
        .await
        .answered_at
        .expect("answered");
    let dead = fleet.store.fenced(Fence::new(9_999, 1));
    delta_e2e::reopen_refused(&dead, &q).await;
    let ix = stored_question(&fleet, run, request_id).await;
    assert_eq!(ix.state, delta_protocol::InteractionState::Pending);
    assert_eq!(
        ix.reopened_at,
        Some(refused_at),
        "the refused answer's instant"
    );
    assert_eq!(
        ix.asked_by_job,
        Some(9_999),
        "the job that reopened it announces it"
    );
    // The job's next delivery finds the question pending, parks on it again and announces it.
    let queue = delta_queue::Queue::connect(&fleet.nats.url(), "gwo", &fleet.nats.queue_settings())
        .await
        .expect("queue");
    queue
        .publish_job("gated", &Job::resume(run, Some(request_id)), None)
        .await
        .expect("publish");
    let again = format!("requested:{rid}:{}", refused_at.micros());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ids = announced(&mut events).await;
        if ids.len() == 2 {
            assert_eq!(ids, [format!("requested:{rid}"), again.clone()]);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "announced again under the reopen's id: {ids:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stored = fleet.store.load(run).await.expect("load");
    assert_eq!(stored.record.status, RunStatus::WaitingForInput);
}

/// Approves the `gated` agent's question with valid edited arguments: accepted, and the run
/// completes with them (within `wait_status`'s 20 s, well before a reconciler would step in).
async fn approve_with_good_args_completes(fleet: &Fleet, run: RunId, rid: &str) {
    let (s, b) = fleet
        .answer(
            rid,
            json!({"option_id": "approve", "data": {"args": {"text": "HELLO"}}}),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    fleet.wait_status(run, RunStatus::Completed).await;
    let stored = fleet.store.load(run).await.expect("load");
    assert!(
        stored
            .journal
            .iter()
            .any(|e| matches!(&e.event, Event::ActionResult(r)
        if r.observation_content.contains("HELLO")))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_whose_job_was_lost_is_enqueued_again() {
    let mut fleet = Fleet::start("gwn", 1, 0).await;
    let run = fleet.submit("hello", "lost").await;
    // NATS loses the job (as an unsynced write would be on a crash): the stream is emptied.
    let js = async_nats::jetstream::new(fleet.nats_admin().await);
    js.get_stream("GWN_JOBS")
        .await
        .expect("stream")
        .purge()
        .await
        .expect("purge");
    fleet.add_worker("late");
    // Past `lost_job_s` (3 s here) with no job left for it, a reconciler sends it again.
    let rid = fleet.pending(run).await;
    assert!(!rid.is_empty());
    let stored = fleet.store.load(run).await.expect("load");
    assert_eq!(workers_of(&stored), ["late"], "started once");
    assert_eq!(metric(&fleet.client, "delta_jobs_requeued_total").await, 1);
}

/// Jobs published and never noted (their publisher died before its note was due), then lost
/// from the stream, are enqueued again once each: the reconciler publishes each again under its
/// first id, learns the first copy's sequence from JetStream's "duplicate" answer, notes it, and
/// in its next round finds the job gone while the run has not moved on. Here nothing was noted by
/// any gateway (the test publishes the jobs itself), so only that path can find them.
#[tokio::test(flavor = "multi_thread")]
async fn jobs_never_noted_and_lost_are_enqueued_again_once_each() {
    use delta_protocol::{Job, Timestamp};
    use delta_store::redis::Resolution;
    let fleet = Fleet::start("gwd", 1, 0).await;
    let queue = delta_queue::Queue::connect(&fleet.nats.url(), "gwd", &fleet.nats.queue_settings())
        .await
        .expect("queue");
    // A run created with its start job published, as a gateway that died at once leaves it.
    let queued = delta_store::RunRecord::new(RunId::new(), "hello", "t", RunStatus::Queued);
    fleet.store.create(queued.clone()).await.expect("create");
    let start = Job::start(queued.run_id);
    queue
        .publish_job("hello", &start, None)
        .await
        .expect("publish");
    // A run paused and answered with its resume job published, likewise.
    let run = fleet.submit("hello", "answered").await;
    let q = pause_as_a_worker(&fleet, run, "Whom shall I greet?").await;
    let a = delta_e2e::typed_answer(q.request_id, "Grace");
    let at = Timestamp::now();
    let lost = fleet
        .store
        .resolve(&q, Resolution::Answer(&a, at), Duration::from_secs(1))
        .await
        .expect("answer");
    assert_eq!(lost, None);
    let resume = Job::resume(run, Some(q.request_id));
    queue
        .publish_job_as("hello", &resume, &resume.resume_msg_id(Some(at)), None)
        .await
        .expect("publish");
    // NATS loses both.
    let js = async_nats::jetstream::new(fleet.nats_admin().await);
    let mut stream = js.get_stream("GWD_JOBS").await.expect("stream");
    stream.purge().await.expect("purge");
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(&fleet.client, "delta_resumes_republished_total").await < 1
        || metric(&fleet.client, "delta_jobs_requeued_total").await < 1
    {
        assert!(Instant::now() < deadline, "both enqueued again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let state = stream.info().await.expect("info").state.clone();
    assert_eq!(state.messages, 2, "one job each");
    let mut subjects = vec![];
    for seq in state.first_sequence..=state.last_sequence {
        if let Ok(m) = stream.get_raw_message(seq).await {
            subjects.push(m.subject.to_string());
        }
    }
    subjects.sort();
    assert_eq!(subjects, ["gwd.jobs.hello", "gwd.jobs.hello.resume"]);
    let noted = job_seq_of(&fleet, queued.run_id).await;
    assert!(
        (state.first_sequence..=state.last_sequence).contains(&noted),
        "the start job in the stream is the one noted, not the lost one: {noted}"
    );
    assert_eq!(
        metric(&fleet.client, "delta_job_notes_written_total").await,
        1,
        "the gateway noted only the start job of the run it submitted itself"
    );
    // Once each: past another `lost_job_s` (3 s here) and its reconciler rounds, neither job is
    // sent again (they are in the stream, noted).
    tokio::time::sleep(Duration::from_millis(4500)).await;
    assert_eq!(
        metric(&fleet.client, "delta_resumes_republished_total").await,
        1
    );
    assert_eq!(metric(&fleet.client, "delta_jobs_requeued_total").await, 1);
    let later = stream.info().await.expect("info").state.clone();
    assert_eq!(
        (later.messages, later.last_sequence),
        (2, state.last_sequence),
        "nothing published since"
    );
}

/// The resume job of an answer accepted over HTTP carries the paused run as the settling script
/// read it (docs/protocol.md "Job messages": the record with its snapshot, the question with its
/// answer), and the run resumes and ends.
#[tokio::test(flavor = "multi_thread")]
async fn the_resume_job_of_an_answer_carries_the_paused_run() {
    let fleet = Fleet::start("gwp", 1, 1).await;
    let nats = fleet.nats_admin().await;
    let mut jobs = nats
        .subscribe("gwp.jobs.hello.resume")
        .await
        .expect("subscribe");
    let run = fleet.submit("hello", "carried").await;
    let rid = fleet.pending(run).await;
    let (status, body) = fleet.answer(&rid, json!({"input": "Ada"})).await;
    assert_eq!(status, 200, "{body}");
    let msg = tokio::time::timeout(Duration::from_secs(10), jobs.next())
        .await
        .expect("a resume job")
        .expect("message");
    let job = delta_protocol::Job::decode(&msg.payload).expect("a job");
    assert_eq!(
        (job.run_id, job.request_id.map(|r| r.to_string())),
        (run, Some(rid))
    );
    let paused = job.paused.expect("the paused run, carried");
    let field = |m: &std::collections::BTreeMap<String, String>, f: &str| m.get(f).cloned();
    assert_eq!(
        field(&paused.record, "status").as_deref(),
        Some("WAITING_FOR_INPUT")
    );
    assert!(
        field(&paused.record, "snap").is_some_and(|s| !s.is_empty()),
        "with its snapshot"
    );
    assert_eq!(
        field(&paused.question, "state").as_deref(),
        Some("ANSWERED")
    );
    assert!(
        field(&paused.question, "response").is_some_and(|r| r.contains("Ada")),
        "with its answer"
    );
    fleet.wait_status(run, RunStatus::Completed).await;
}

/// A resume job taken off the stream before any worker took it (NATS lost it; here a purge) is
/// enqueued again by a reconciler, once, whether or not the gateway had noted its sequence: the
/// note is written only for a job still not taken after a second (docs/architecture.md "Notes
/// after a publish"), and without it the reconciler learns the job's sequence from JetStream's
/// answer to the same publish again.
#[tokio::test(flavor = "multi_thread")]
async fn a_resume_job_lost_from_the_stream_is_enqueued_again_once() {
    let fleet = Fleet::start("gwr", 1, 0).await;
    let run = fleet.submit("hello", "resume lost").await;
    let q = pause_as_a_worker(&fleet, run, "Whom shall I greet?").await;
    let (status, body) = fleet
        .answer(&q.request_id.to_string(), json!({"input": "Grace"}))
        .await;
    assert_eq!(status, 200, "{body}");
    let js = async_nats::jetstream::new(fleet.nats_admin().await);
    let mut stream = js.get_stream("GWR_JOBS").await.expect("stream");
    stream.purge().await.expect("purge");
    // Past its first check (5 s), a reconciler finds the run still waiting and its job gone.
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(&fleet.client, "delta_resumes_republished_total").await < 1 {
        assert!(Instant::now() < deadline, "the resume is enqueued again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let state = stream.info().await.expect("info").state.clone();
    assert_eq!(state.messages, 1, "one resume job, enqueued once");
    let job = stream
        .get_raw_message(state.last_sequence)
        .await
        .expect("the job");
    assert_eq!(job.subject.as_str(), "gwr.jobs.hello.resume");
    let ix = stored_question(&fleet, run, q.request_id).await;
    assert_eq!(ix.resume_seq, Some(state.last_sequence), "noted");
    // Its next check (`lost_job_s` later, 3 s here) finds it in the stream: not enqueued again.
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    assert_eq!(
        metric(&fleet.client, "delta_resumes_republished_total").await,
        1
    );
    assert_eq!(stream.info().await.expect("info").state.messages, 1);
}

/// Every reply of the API reads as the typed contract of `delta-api` (as the CLI reads it),
/// refusals carry their `ErrorCode` with the status the contract gives it, the live stream's
/// events are typed too, and the served document is the generated one.
#[tokio::test(flavor = "multi_thread")]
async fn every_reply_reads_as_the_typed_contract() {
    use delta_api::{
        AnswerBody, AnswerStatus, DeadLetterPage, ErrorCode, Health, HealthStatus,
        InteractionState, JournalEvent, QueueStats, Readiness, RunEnded, RunPage, Submission,
    };
    use delta_e2e::gateways::CallError;

    let fleet = Fleet::start("gwt", 1, 1).await;
    let c = &fleet.client;
    let accepted = c
        .submit(&Submission {
            agent: "chooser".into(),
            task: "deploy".into(),
            input: Some(json!({"k": 1})),
        })
        .await
        .expect("submit");
    assert_eq!(accepted.status, RunStatus::Queued);
    let run = accepted.run_id;
    let deadline = Instant::now() + Duration::from_secs(20);
    let detail = loop {
        let d = c.run(run).await.expect("run");
        if d.pending_interaction.is_some() {
            break d;
        }
        assert!(Instant::now() < deadline, "no question: {}", d.run.status);
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(detail.run.input, Some(json!({"k": 1})));
    let ix = detail.pending_interaction.expect("a question");
    assert_eq!(detail.run.pending_request_id, Some(ix.request_id));
    assert_eq!((ix.state, ix.run_id), (InteractionState::Pending, run));
    let page = c.interactions("").await.expect("pending list");
    let listed: Vec<_> = page.interactions.iter().map(|i| i.request_id).collect();
    assert_eq!(listed, [ix.request_id]);
    let runs: RunPage = c.get_as("/v1/runs").await.expect("runs");
    assert_eq!(runs.runs[0].run_id, run);
    assert_eq!(runs.runs[0].input, None, "listings leave the input out");

    let wrong = AnswerBody {
        option_id: Some("moon".into()),
        ..AnswerBody::default()
    };
    let e = c
        .answer(ix.request_id, &wrong)
        .await
        .expect_err("no such option");
    assert_eq!(e.code(), Some(ErrorCode::InvalidOption));
    assert!(matches!(e, CallError::Refused { status: 422, .. }), "{e}");
    let right = AnswerBody {
        option_id: Some("staging".into()),
        ..AnswerBody::default()
    };
    let ok = c.answer(ix.request_id, &right).await.expect("answer");
    assert_eq!((ok.status, ok.run_id), (AnswerStatus::Accepted, run));
    fleet.wait_status(run, RunStatus::Completed).await;

    let journal = c.journal(run).await.expect("journal");
    assert_eq!(journal.status, RunStatus::Completed);
    assert_eq!(
        Some(journal.next_seq),
        journal.events.last().map(|e| e.seq + 1)
    );
    let e = c.cancel(run, Some("too late")).await.expect_err("over");
    assert_eq!(e.code(), Some(ErrorCode::AlreadyResolved));
    assert!(matches!(e, CallError::Refused { status: 409, .. }), "{e}");
    let view = c.interaction(ix.request_id).await.expect("the question");
    assert_eq!(view.state, InteractionState::Answered);
    assert!(view.response.is_some() && view.answered_at.is_some());
    let _: QueueStats = c.get_as("/v1/queue").await.expect("queue");
    let _: DeadLetterPage = c.get_as("/v1/dlq").await.expect("dlq");
    let health: Health = c.get_as("/healthz").await.expect("healthz");
    assert_eq!(health.status, HealthStatus::Ok);
    let ready: Readiness = c.get_as("/readyz").await.expect("readyz");
    assert!(ready.is_ready());
    let e = c.get_as::<Value>("/v1/nowhere").await.expect_err("404");
    assert_eq!(e.code(), Some(ErrorCode::NotFound));
    let served: Value = c.get_as("/openapi.json").await.expect("the document");
    let generated: Value =
        serde_json::from_str(&delta_api::openapi::json()).expect("the document is JSON");
    assert_eq!(served, generated);

    let mut sse = c
        .sse(&format!("/v1/runs/{run}/events"), None)
        .await
        .expect("sse");
    loop {
        let ev = sse
            .next(Duration::from_secs(10))
            .await
            .expect("events until the status");
        if ev.event == delta_api::sse::STATUS {
            let ended: RunEnded = serde_json::from_str(&ev.data).expect("RunEnded");
            assert_eq!(ended.status, RunStatus::Completed);
            break;
        }
        let _: JournalEvent = serde_json::from_str(&ev.data).expect("a journal event");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn typed_answers_are_checked_against_the_schema_over_http_and_nats() {
    let fleet = Fleet::start("gwy", 1, 1).await;
    let run = fleet.submit("intake", "q3").await;
    let rid = fleet.pending(run).await;
    let jobs_before = jobs_published(&fleet, "GWY_JOBS").await;
    let (_, ix) = fleet
        .client
        .get(&format!("/v1/interactions/{rid}"))
        .await
        .expect("get");
    assert_eq!(
        ix["request"]["response_schema"]["required"],
        json!(["email", "copies", "env"]),
        "{ix}"
    );
    let before = fleet.store.load(run).await.expect("load");
    for (body, field) in [
        (
            json!({"data": {"email": "ada", "copies": 1, "env": "staging"}}),
            "field `email`",
        ),
        (
            json!({"data": {"email": "ada@example.com", "copies": 0, "env": "staging"}}),
            "field `copies`",
        ),
        (
            json!({"data": {"email": "ada@example.com", "copies": 1, "env": "staging", "topics": ["x"]}}),
            "field `topics`",
        ),
        (
            json!({"data": {"email": "ada@example.com", "copies": 1}}),
            "field `env`",
        ),
        (json!({"input": "ada@example.com"}), "`data`"),
        (json!({"data": [1]}), "`data`"),
    ] {
        let (s, b) = fleet.answer(&rid, body.clone()).await;
        assert_eq!(
            (s, &b["error"]["code"]),
            (422, &json!("invalid_data")),
            "{body}: {b}"
        );
        assert!(
            b["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(field)),
            "{body}: {b}"
        );
    }
    let nc = fleet.nats().await;
    // `args` is no tool arguments here: an unknown field of the typed answer.
    let reply = bot_answer(
        &nc,
        "gwy",
        &rid,
        br#"{"data": {"email": "ada@example.com", "copies": 1, "env": "staging", "args": 3}, "responder": {"id": "bot"}}"#.to_vec(),
        None,
    )
    .await;
    assert_eq!(reply["error"]["code"], "invalid_data", "{reply}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("field `args`: unknown field")),
        "{reply}"
    );
    // Still pending, nothing journaled, no resume job.
    let (_, ix) = fleet
        .client
        .get(&format!("/v1/interactions/{rid}"))
        .await
        .expect("get");
    assert_eq!(ix["state"], "PENDING", "{ix}");
    assert_eq!(jobs_published(&fleet, "GWY_JOBS").await, jobs_before);
    let after = fleet.store.load(run).await.expect("load");
    assert_eq!(after.record.status, RunStatus::WaitingForInput);
    assert_eq!(
        after.journal.len(),
        before.journal.len(),
        "journal unchanged"
    );

    // A good answer from the bot reaches the agent as the object.
    let data = json!({"email": "ada@example.com", "copies": 2, "env": "production",
                      "topics": ["security", "docs"], "urgent": true});
    let reply = bot_answer(
        &nc,
        "gwy",
        &rid,
        serde_json::to_vec(&json!({"data": data, "responder": {"id": "bot"}})).expect("json"),
        None,
    )
    .await;
    assert_eq!(reply, json!({"ok": true, "run_id": run.to_string()}));
    fleet.wait_status(run, RunStatus::Completed).await;
    let stored = fleet.store.load(run).await.expect("load");
    assert_eq!(
        stored.record.result.as_deref(),
        Some("ada@example.com gets 2 on production")
    );
    let got = answers_of(&stored)
        .into_iter()
        .next()
        .expect("answer journaled");
    assert_eq!(got.data, Some(data.clone()));
    let observed = stored
        .journal
        .iter()
        .find_map(|e| match &e.event {
            Event::ActionResult(r) if r.observation_content.starts_with('{') => {
                serde_json::from_str::<Value>(&r.observation_content).ok()
            }
            _ => None,
        })
        .expect("the ask_human result is the object");
    assert_eq!(observed, data);
}

/// A worker that stored its run's question and died before announcing it (the announcement
/// comes after the write, before the job is acked) leaves a question that a person may find in a
/// listing and answer before the job is delivered again. The gateway that takes the answer sees
/// the asking job still in the stream, and announces the question before its answer: the events
/// stream still has `requested` before `answered`.
#[tokio::test(flavor = "multi_thread")]
async fn a_question_its_worker_died_before_announcing_is_announced_before_its_answer() {
    let fleet = Fleet::start("gwq", 1, 0).await;
    let run = fleet.submit("hello", "unannounced").await;
    // The worker's pause; then it dies: no announcement, no ack.
    let q = pause_as_a_worker(&fleet, run, "Whom shall I greet?").await;
    // Found in the listing, and answered.
    let listed = pending(&fleet.client, run).await;
    assert_eq!(listed, q.request_id.to_string());
    let (status, body) = fleet.answer(&listed, json!({"input": "Grace"})).await;
    assert_eq!(status, 200, "{body}");
    let mut tally = delta_e2e::chaos::Tally::default();
    delta_e2e::chaos::check_events(
        &fleet.nats.url(),
        "gwq",
        &[run],
        &["interaction.requested", "interaction.answered"],
        &mut tally,
    )
    .await;
    assert!(tally.problems.is_empty(), "{:?}", tally.problems);
}

/// A question the gateway heard announced is answered without reading it from Redis (the
/// answer path's first round trip, docs/architecture.md "Answers to questions the gateway
/// heard"); one it did not hear is read as before. Both are accepted and resume their runs.
#[tokio::test(flavor = "multi_thread")]
async fn an_answer_to_a_question_the_gateway_heard_does_not_read_it_from_redis() {
    let fleet = Fleet::start("gwh", 1, 0).await;
    let queue = delta_queue::Queue::connect(&fleet.nats.url(), "gwh", &fleet.nats.queue_settings())
        .await
        .expect("queue");
    // Reading an unheard question starts with its run's id, from the bucket's
    // `interactions:runs` (an `HGET`): nothing else on an answer's path runs one (the settling
    // script reads the run and the question whole, `HGETALL`, for the resume job to carry).
    let url = fleet.redis.url();
    let lookups = || delta_e2e::command_calls_at(&url, "hget");
    // Two runs paused the way a worker pauses them; only the first one's question announced.
    let mut asked = vec![];
    for task in ["heard", "unheard"] {
        let run = fleet.submit("hello", task).await;
        asked.push(pause_as_a_worker(&fleet, run, &format!("Whom shall I greet ({task})?")).await);
    }
    queue
        .publish_request(&asked[0], None)
        .await
        .expect("announce");
    hears_questions(&fleet.client, 1).await;

    let before = lookups().await;
    let (status, body) = fleet
        .answer(&asked[0].request_id.to_string(), json!({"input": "Grace"}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(lookups().await, before, "the heard question was not read");
    assert_eq!(metric(&fleet.client, "delta_answers_heard_total").await, 1);
    assert_eq!(
        metric(&fleet.client, "delta_questions_heard").await,
        0,
        "dropped once answered"
    );

    let before = lookups().await;
    let (status, body) = fleet
        .answer(&asked[1].request_id.to_string(), json!({"input": "Ada"}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(lookups().await > before, "the unheard question was read");
    assert_eq!(metric(&fleet.client, "delta_answers_heard_total").await, 1);

    // Both settled in Redis with their answers, and a second answer to the heard one refused
    // as for any settled question.
    for (q, text) in asked.iter().zip(["Grace", "Ada"]) {
        let ix = fleet
            .store
            .interaction(q.run_id, q.request_id)
            .await
            .expect("read")
            .expect("stored");
        assert_eq!(ix.state, delta_protocol::InteractionState::Answered);
        assert_eq!(ix.response.and_then(|r| r.input).as_deref(), Some(text));
    }
    let (status, body) = fleet
        .answer(
            &asked[0].request_id.to_string(),
            json!({"input": "Someone else"}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
}

/// An answer that reaches the gateway before its question was heard (a bot answering the instant
/// it hears the question on NATS, before the events stream's consumer delivers it to the
/// gateway) waits for the hearing, and is then answered from memory: no read of the question
/// from Redis (docs/architecture.md "Answers to questions the gateway heard").
#[tokio::test(flavor = "multi_thread")]
async fn an_answer_that_comes_before_its_question_is_heard_waits_for_the_hearing() {
    // A long wait, so that the test's own steps (seeing the answer wait, then announcing) fit
    // in it on a loaded machine; the default is 50 ms.
    let fleet = Fleet::start_with("gww", 1, 0, |s| {
        s.extra.push(("DELTA_QUESTION_WAIT_MS", "10000".into()));
    })
    .await;
    let queue = delta_queue::Queue::connect(&fleet.nats.url(), "gww", &fleet.nats.queue_settings())
        .await
        .expect("queue");
    let url = fleet.redis.url();
    let lookups = || delta_e2e::command_calls_at(&url, "hget");
    let run = fleet.submit("hello", "answered early").await;
    // Stored as a worker stores it, not announced yet.
    let q = pause_as_a_worker(&fleet, run, "Whom shall I greet?").await;
    let before = lookups().await;
    let client = fleet.client.clone();
    let rid = q.request_id.to_string();
    let answer = tokio::spawn(async move {
        client
            .post(
                &format!("/v1/interactions/{rid}/response"),
                &json!({"input": "Grace"}),
            )
            .await
            .expect("answer")
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(&fleet.client, "delta_answers_waiting").await < 1 {
        assert!(
            Instant::now() < deadline,
            "the answer waits for its question"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(metric(&fleet.client, "delta_answers_heard_total").await, 0);
    queue.publish_request(&q, None).await.expect("announce");
    let (status, body) = answer.await.expect("the answer's task");
    assert_eq!(status, 200, "{body}");
    assert_eq!(lookups().await, before, "the question was not read");
    assert_eq!(metric(&fleet.client, "delta_answers_heard_total").await, 1);
    assert_eq!(
        metric(&fleet.client, r#"delta_answers_waited_total{heard="true"}"#).await,
        1
    );
    assert_eq!(metric(&fleet.client, "delta_answers_waiting").await, 0);
    let ix = stored_question(&fleet, run, q.request_id).await;
    assert_eq!(ix.state, delta_protocol::InteractionState::Answered);
    assert_eq!(ix.response.and_then(|r| r.input).as_deref(), Some("Grace"));
}

/// A question the gateway kept but that was settled elsewhere (through another gateway, say)
/// is refused on the kept path by Redis's settling script, and decided again the usual way: the
/// same refusal as for any settled question, the first answer kept, nothing counted as answered
/// from memory.
#[tokio::test(flavor = "multi_thread")]
async fn a_kept_question_settled_elsewhere_is_refused_as_the_usual_path_refuses_it() {
    let fleet = Fleet::start("gwk", 1, 0).await;
    let queue = delta_queue::Queue::connect(&fleet.nats.url(), "gwk", &fleet.nats.queue_settings())
        .await
        .expect("queue");
    let run = fleet.submit("hello", "settled elsewhere").await;
    let q = pause_as_a_worker(&fleet, run, "Whom shall I greet?").await;
    queue.publish_request(&q, None).await.expect("announce");
    hears_questions(&fleet.client, 1).await;
    // Settled in Redis by someone else, as another gateway settles it.
    let mut first = delta_protocol::InteractionResponse::new(
        q.request_id,
        delta_protocol::Responder {
            id: "elsewhere".into(),
            via: delta_protocol::Via::Http,
            on_behalf_of: None,
            relayed_by: None,
        },
    );
    first.input = Some("Ada".into());
    assert!(fleet.store.answer(&q, &first).await.expect("answer"));

    let (status, body) = fleet
        .answer(&q.request_id.to_string(), json!({"input": "Grace"}))
        .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "already_resolved", "{body}");
    assert_eq!(metric(&fleet.client, "delta_answers_heard_total").await, 0);
    let ix = stored_question(&fleet, run, q.request_id).await;
    assert_eq!(ix.response.and_then(|r| r.input).as_deref(), Some("Ada"));
}

/// A gateway that has heard no question yet when its consumer of the events stream is lost does
/// not hear the stream again from its start (the client makes such a consumer again from the
/// first message): a question asked before it started stays unheard, and it hears those asked
/// after.
#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_that_heard_nothing_replays_nothing_when_its_consumer_is_lost() {
    let mut fleet = Fleet::start("gwn", 1, 0).await;
    let queue = delta_queue::Queue::connect(&fleet.nats.url(), "gwn", &fleet.nats.queue_settings())
        .await
        .expect("queue");
    // A question in the stream before the second gateway starts (the first one hears it).
    let run = fleet.submit("hello", "before").await;
    let old = pause_as_a_worker(&fleet, run, "Asked before").await;
    queue.publish_request(&old, None).await.expect("announce");
    hears_questions(&fleet.client, 1).await;
    let late = fleet.add_gateway(None).await;
    assert_eq!(metric(&late, "delta_questions_heard").await, 0);

    // Its consumer deleted under it (an operator, a stream that lost its leader): the client
    // makes it again, from the stream's first message since it delivered nothing yet.
    let js = async_nats::jetstream::new(fleet.nats_admin().await);
    let mut events = js.get_stream("GWN_INTERACTIONS").await.expect("stream");
    // Both gateways' consumers (the late one makes its own once it is up).
    let deadline = Instant::now() + Duration::from_secs(10);
    let names = loop {
        let names = delta_e2e::consumer_names(&events).await;
        if names.len() >= 2 {
            break names;
        }
        assert!(
            Instant::now() < deadline,
            "the gateways' consumers: {names:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for name in names {
        events.delete_consumer(&name).await.expect("delete");
    }
    let _ = events.info().await;
    // Questions asked after that, one every 2 s, until the late gateway hears one: its
    // consumer was made again by then, by the client or by the gateway.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut n = 0;
    while metric(&late, "delta_questions_heard").await < 1 {
        assert!(
            Instant::now() < deadline,
            "the late gateway hears questions asked after its consumer was lost"
        );
        n += 1;
        let run = fleet.submit("hello", &format!("after {n}")).await;
        let q = pause_as_a_worker(&fleet, run, "Asked after").await;
        queue.publish_request(&q, None).await.expect("announce");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    // The question asked before is not among those it keeps: its answer reads it from Redis.
    let (status, body) = late
        .post(
            &format!("/v1/interactions/{}/response", old.request_id),
            &json!({"input": "Grace"}),
        )
        .await
        .expect("answer");
    assert_eq!(status, 200, "{body}");
    assert_eq!(metric(&late, "delta_answers_heard_total").await, 0);
}

/// A gateway that heard a question announced, settling an answer to it after the engine
/// reopened it (another gateway took the refused answer) and before the reopening job announced
/// it again (its delivery died), announces the question under the reopen's id before its answer:
/// whether it answers from the copy it heard (the settling reports the reopen) or its reconciler
/// publishes the resume of an answer whose gateway died (the question read from Redis). Trusting
/// what it heard, it would publish the answer only, and bots, webhooks and live streams would
/// see a question settled twice and never reopened.
#[tokio::test(flavor = "multi_thread")]
async fn a_heard_question_reopened_since_is_announced_anew_before_its_answer() {
    let fleet = Fleet::start("gwr", 1, 0).await;
    let queue = delta_queue::Queue::connect(&fleet.nats.url(), "gwr", &fleet.nats.queue_settings())
        .await
        .expect("queue");
    let js = async_nats::jetstream::new(fleet.nats_admin().await);
    let mut events = js.get_stream("GWR_INTERACTIONS").await.expect("stream");
    // A question asked and announced; the gateway hears it. Another gateway's answer to it,
    // refused by the engine: the question reopened by a delivery of the run's job (no worker
    // runs here, so the job stays in the stream, as a dead worker's unacked job does until its
    // redelivery).
    let reopened = async |task: &str| {
        let run = fleet.submit("hello", task).await;
        let q = pause_as_a_worker(&fleet, run, "Whom shall I greet?").await;
        queue.publish_request(&q, None).await.expect("announce");
        hears_questions(&fleet.client, 1).await;
        let job = job_seq_of(&fleet, run).await;
        assert!(
            queue.job_exists(job).await.expect("ask"),
            "the job is pending"
        );
        let refused = delta_e2e::typed_answer(q.request_id, "Ada");
        assert!(fleet.store.answer(&q, &refused).await.expect("answer"));
        let refused_at = stored_question(&fleet, run, q.request_id)
            .await
            .answered_at
            .expect("answered");
        let dead = fleet.store.fenced(delta_protocol::Fence::new(job, 1));
        delta_e2e::reopen_refused(&dead, &q).await;
        (run, q, refused_at)
    };

    // Answered through this gateway, from the copy it heard.
    let (run, q, refused_at) = reopened("heard").await;
    let rid = q.request_id;
    let (status, body) = fleet
        .answer(&rid.to_string(), json!({"input": "Grace"}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        metric(&fleet.client, "delta_answers_heard_total").await,
        1,
        "answered from the copy heard"
    );
    let ix = stored_question(&fleet, run, rid).await;
    assert_eq!(ix.state, delta_protocol::InteractionState::Answered);
    assert_eq!(ix.response.and_then(|r| r.input).as_deref(), Some("Grace"));
    reopen_first(announcements(&mut events, rid).await, rid, refused_at);

    // Answered through a gateway that died before publishing anything: this gateway's
    // reconciler publishes the resume, reading the question from Redis.
    let (_, q, refused_at) = reopened("reconciled").await;
    let rid = q.request_id;
    settle_as_a_dead_gateway(&fleet, &q, "Grace").await;
    resume_republished(&fleet).await;
    reopen_first(announcements(&mut events, rid).await, rid, refused_at);
}

/// A question whose asking job was let go unannounced (its worker could not announce it, and it
/// was settled meanwhile: the worker marks it `unannounced`) is announced by the gateway that
/// announces its settling, first: here the reconciler, for an answer whose gateway died before
/// publishing anything. The job is gone from the stream, so only the mark says so.
#[tokio::test(flavor = "multi_thread")]
async fn a_question_marked_unannounced_is_announced_before_its_answer() {
    let fleet = Fleet::start("gwu", 1, 0).await;
    let run = fleet.submit("hello", "unannounced").await;
    let q = pause_as_a_worker(&fleet, run, "Whom shall I greet?").await;
    let rid = q.request_id;
    settle_as_a_dead_gateway(&fleet, &q, "Grace").await;
    // The worker marks it and lets its job go (acked: gone from the work queue).
    assert!(fleet.store.mark_unannounced(run, rid).await.expect("mark"));
    let job = job_seq_of(&fleet, run).await;
    let js = async_nats::jetstream::new(fleet.nats_admin().await);
    let jobs = js.get_stream("GWU_JOBS").await.expect("jobs");
    assert!(
        jobs.delete_message(job).await.expect("delete"),
        "the job let go"
    );

    resume_republished(&fleet).await;
    let mut events = js.get_stream("GWU_INTERACTIONS").await.expect("stream");
    let ids = announcements(&mut events, rid).await;
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert_eq!(ids[0], format!("requested:{rid}"), "the question first");
    assert!(ids[1].starts_with(&format!("resolved:{rid}:")), "{ids:?}");
}

/// Question `rid`'s `requested` and `resolved` announcements in `events`, in the stream's order,
/// by id.
async fn announcements(
    events: &mut async_nats::jetstream::stream::Stream,
    rid: delta_protocol::RequestId,
) -> Vec<String> {
    let state = events.info().await.expect("info").state.clone();
    let mut ids = vec![];
    for seq in state.first_sequence..=state.last_sequence {
        let Ok(m) = events.get_raw_message(seq).await else {
            continue;
        };
        let id = m.headers.get("Nats-Msg-Id").map(|v| v.to_string());
        let id = id.unwrap_or_default();
        if ["requested", "resolved"]
            .iter()
            .any(|k| id.starts_with(&format!("{k}:{rid}")))
        {
            ids.push(id);
        }
    }
    ids
}

/// The stream sequence of the job last noted for `run` (0 before any).
async fn job_seq_of(fleet: &Fleet, run: RunId) -> u64 {
    fleet
        .store
        .queue_run(run)
        .await
        .expect("read")
        .expect("run")
        .job_seq
}

/// Settles question `q` with the answer `text` as a gateway that died before publishing
/// anything would have: stored, its resume left to a reconciler (checked after 1 s).
async fn settle_as_a_dead_gateway(
    fleet: &Fleet,
    q: &delta_protocol::InteractionRequest,
    text: &str,
) {
    let answer = delta_e2e::typed_answer(q.request_id, text);
    let lost = fleet
        .store
        .resolve(
            q,
            delta_store::redis::Resolution::Answer(&answer, delta_protocol::Timestamp::now()),
            Duration::from_secs(1),
        )
        .await
        .expect("answer");
    assert_eq!(lost, None, "settled");
}

/// Waits (30 s at most) until the gateway's reconciler has published a resume job.
async fn resume_republished(fleet: &Fleet) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(&fleet.client, "delta_resumes_republished_total").await < 1 {
        assert!(Instant::now() < deadline, "the resume published");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Question `rid`'s announcements (`ids`, in the stream's order) are its first, its reopen's
/// (the answer refused at `refused_at`), then its answer.
fn reopen_first(
    ids: Vec<String>,
    rid: delta_protocol::RequestId,
    refused_at: delta_protocol::Timestamp,
) {
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert_eq!(ids[0], format!("requested:{rid}"));
    assert_eq!(
        ids[1],
        format!("requested:{rid}:{}", refused_at.micros()),
        "the reopen's, before the answer"
    );
    assert!(ids[2].starts_with(&format!("resolved:{rid}:")), "{ids:?}");
}

/// The fleet's first gateway exited at its failpoint (code 86), dropping the connection of the
/// request that got it there (`reply`).
fn died_at_its_failpoint<T: std::fmt::Debug, E: std::fmt::Debug>(
    fleet: &mut Fleet,
    reply: &Result<T, E>,
) {
    assert!(
        reply.is_err(),
        "the connection drops with the gateway: {reply:?}"
    );
    assert_eq!(
        fleet.gateways[0].wait_exit(Duration::from_secs(10)),
        Some(86)
    );
}

/// The value of the gateway's metric `name` (a counter or a gauge without labels), 0 if absent.
async fn metric(client: &delta_e2e::gateways::Client, name: &str) -> u64 {
    let (_, m) = client.get("/metrics").await.expect("metrics");
    let text = m.as_str().expect("text").to_owned();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .map_or(0, |n| n.trim().parse().expect("a count"))
}

/// Waits (10 s at most) until the gateway keeps at least `n` questions it heard announced.
async fn hears_questions(client: &delta_e2e::gateways::Client, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(client, "delta_questions_heard").await < n {
        assert!(
            Instant::now() < deadline,
            "the gateway hears {n} announcement(s)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Pauses `run` (of agent `hello`) on a question the way a worker does: under the fence of its
/// start job (its stream sequence, once the gateway noted it), with nothing announced.
async fn pause_as_a_worker(
    fleet: &Fleet,
    run: RunId,
    prompt: &str,
) -> delta_protocol::InteractionRequest {
    let deadline = Instant::now() + Duration::from_secs(10);
    let job = loop {
        let seq = job_seq_of(fleet, run).await;
        if seq > 0 {
            break seq;
        }
        assert!(Instant::now() < deadline, "the job's sequence is noted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let worker = fleet.store.fenced(delta_protocol::Fence::new(job, 1));
    worker.load_latest(run, None).await.expect("load");
    let q = delta_protocol::InteractionRequest::new(
        run,
        "hello",
        delta_protocol::InteractionType::UserInput,
        prompt,
    );
    delta_e2e::pause_on(&worker, run, &q).await;
    q
}

/// Question `rid` of `run` as the store holds it.
async fn stored_question(
    fleet: &Fleet,
    run: RunId,
    rid: delta_protocol::RequestId,
) -> delta_store::redis::StoredInteraction {
    fleet
        .store
        .interaction(run, rid)
        .await
        .expect("read")
        .expect("stored")
}

/// Free text an answer or a cancel carries is bounded: it is stored, journaled and announced (a
/// cancel's reason past NATS's largest message would leave the run's end unannounced). Past the
/// bound the call is refused (`invalid_args`) and nothing changes.
#[tokio::test(flavor = "multi_thread")]
async fn an_answers_text_and_a_cancels_reason_are_bounded() {
    // A body limit above the texts' (the tests' gateways take 64 KiB).
    let fleet = Fleet::start_with("gwv", 1, 1, |s| s.max_body_bytes = 1 << 20).await;
    let run = fleet.submit("hello", "bounded").await;
    let rid = fleet.pending(run).await;
    let before = fleet.store.load(run).await.expect("load");
    let jobs_before = jobs_published(&fleet, "GWV_JOBS").await;
    let long = "x".repeat(64 * 1024 + 1);
    for body in [
        json!({"input": long}),
        json!({"input": "Ada", "feedback": long}),
    ] {
        let (status, reply) = fleet
            .client
            .post(&format!("/v1/interactions/{rid}/response"), &body)
            .await
            .expect("answer");
        assert_eq!(status, 422, "{reply}");
        assert_eq!(reply["error"]["code"], "invalid_args", "{reply}");
        assert!(
            reply["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("longer than 64 KiB")),
            "{reply}"
        );
    }
    let (status, reply) = fleet
        .client
        .post(
            &format!("/v1/runs/{run}/cancel"),
            &json!({"reason": "y".repeat(1001)}),
        )
        .await
        .expect("cancel");
    assert_eq!(status, 422, "{reply}");
    assert_eq!(reply["error"]["code"], "invalid_args", "{reply}");
    // Nothing changed: still waiting on the same question, no job sent.
    let after = fleet.store.load(run).await.expect("load");
    assert_eq!(after.record.status, RunStatus::WaitingForInput);
    assert_eq!(after.journal.len(), before.journal.len());
    assert_eq!(jobs_published(&fleet, "GWV_JOBS").await, jobs_before);
    // At the bound, the cancel goes through.
    let (status, reply) = fleet
        .client
        .post(
            &format!("/v1/runs/{run}/cancel"),
            &json!({"reason": "y".repeat(1000)}),
        )
        .await
        .expect("cancel");
    assert_eq!(status, 200, "{reply}");
}

/// A body past `DELTA_MAX_BODY_BYTES` is `413 payload_too_large` on every endpoint that takes
/// one, delegations and webhooks as the others (they answered `400` with the framework's words).
#[tokio::test(flavor = "multi_thread")]
async fn a_body_too_large_is_413_on_every_endpoint() {
    let fleet = Fleet::start("gwx", 1, 0).await;
    let big = json!({"reason": "z".repeat(70 * 1024)});
    for path in ["/v1/runs", "/v1/delegations", "/v1/webhooks"] {
        let (status, reply) = fleet.client.post(path, &big).await.expect("post");
        assert_eq!(status, 413, "{path}: {reply}");
        assert_eq!(
            reply["error"]["code"], "payload_too_large",
            "{path}: {reply}"
        );
    }
}

/// A listing's agent filter must be an agent's name: anything else is `400` at once, rather
/// than every index entry read to match nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_listings_agent_filter_is_checked() {
    let fleet = Fleet::start("gwz", 1, 0).await;
    for path in [
        "/v1/runs?agent=no%20such",
        "/v1/interactions?agent=a.b",
        "/v1/runs?agent=%2A",
    ] {
        let (status, reply) = fleet.client.get(path).await.expect("get");
        assert_eq!(status, 400, "{path}: {reply}");
        assert!(
            reply["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("is not an agent's name")),
            "{path}: {reply}"
        );
    }
    for path in ["/v1/runs?agent=hello", "/v1/interactions?agent=hello"] {
        let (status, reply) = fleet.client.get(path).await.expect("get");
        assert_eq!(status, 200, "{path}: {reply}");
    }
}
