//! The fleet's events are CloudEvents 1.0 (docs/protocol.md §4 "Events"), checked by an
//! implementation nobody here wrote: runs on real servers, gateways and workers go through every
//! kind of event (a question asked, claimed, escalated, answered, expired, cancelled; runs
//! completed, failed, cancelled), and the CloudEvents SDK for Python decodes every message the
//! events stream holds, each checked against its JSON Schema in docs/events/.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use delta_e2e::fleet::Fleet;
use delta_protocol::{RunId, RunStatus};
use futures_util::StreamExt;
use serde_json::{Value, json};

const ASK_CONFIG: &str = "name: asker\nbrain: scripted\n";
const ASK_SCRIPT: &str = "steps:\n  - ask_human:\n      prompt: \"Go?\"\n      escalation:\n        - {after: 1s, remind: true}\n      options:\n        - {id: yes, label: Yes}\n        - {id: no, label: No}\n  - finish: \"chose ${answer}\"\n";
const LATE_CONFIG: &str = "name: late\nbrain: scripted\n";
const LATE_SCRIPT: &str = "steps:\n  - ask_human:\n      prompt: \"Anyone?\"\n      timeout_seconds: 1\n  - finish: \"${answer}\"\n";

/// Every message the events stream holds, as `{"subject", "payload"}`, once `enough` says so.
async fn stream_messages(
    fleet: &Fleet,
    prefix: &str,
    enough: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let js = async_nats::jetstream::new(fleet.nats_admin().await);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stream = js
            .get_stream(format!("{}_INTERACTIONS", prefix.to_uppercase()))
            .await
            .expect("the events stream");
        let consumer = stream
            .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig::default())
            .await
            .expect("consumer");
        let mut messages = consumer.messages().await.expect("messages");
        let mut out = vec![];
        while let Ok(Some(Ok(m))) =
            tokio::time::timeout(Duration::from_millis(500), messages.next()).await
        {
            out.push(json!({
                "subject": m.subject.as_str(),
                "payload": String::from_utf8(m.payload.to_vec()).expect("UTF-8"),
            }));
        }
        if enough(&out) {
            return out;
        }
        assert!(
            Instant::now() < deadline,
            "the events stream holds only {out:#?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn of_kind(messages: &[Value], family: &str) -> usize {
    messages
        .iter()
        .filter(|m| m["subject"].as_str().is_some_and(|s| s.contains(family)))
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_event_decodes_with_the_cloudevents_sdk_and_matches_its_schema() {
    let python = delta_e2e::test_python();
    let p = "ce";
    let fleet = Fleet::start(p, 1, 1).await;
    fleet.add_agent("asker", ASK_CONFIG, ASK_SCRIPT);
    fleet.add_agent("late", LATE_CONFIG, LATE_SCRIPT);

    // Asked, claimed (updated), escalated (a reminder after 1 s), answered, completed.
    let asked = fleet.submit("asker", "go").await;
    let rid = fleet.pending(asked).await;
    let (s, b) = fleet
        .client
        .post(
            &format!("/v1/interactions/{rid}/claim"),
            &json!({"responder": {"id": "alice"}}),
        )
        .await
        .expect("claim");
    assert_eq!(s, 200, "{b}");
    stream_messages(&fleet, p, |m| of_kind(m, ".interactions.escalated.") == 1).await;
    let (s, b) = fleet
        .answer(
            &rid,
            json!({"option_id": "yes", "responder": {"id": "alice"}}),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    fleet.wait_status(asked, RunStatus::Completed).await;
    // Asked, expired without a default: failed.
    let late = fleet.submit("late", "go").await;
    fleet.wait_status(late, RunStatus::Failed).await;
    // Asked, then cancelled while it waits.
    let cancelled = fleet.submit("hello", "go").await;
    fleet.pending(cancelled).await;
    let (s, b) = fleet
        .client
        .post(
            &format!("/v1/runs/{cancelled}/cancel"),
            &json!({"reason": "not today"}),
        )
        .await
        .expect("cancel");
    assert_eq!(s, 200, "{b}");

    let messages = stream_messages(&fleet, p, |m| {
        of_kind(m, ".runs.") == 3 && of_kind(m, ".interactions.resolved.") == 3
    })
    .await;
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("events.jsonl");
    let lines: String = messages.iter().map(|m| format!("{m}\n")).collect();
    std::fs::write(&file, lines).expect("write");
    let schemas = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/events");
    let out = std::process::Command::new(&python)
        .arg(delta_e2e::python_scripts().join("check_events.py"))
        .arg(&file)
        .arg(&schemas)
        .output()
        .expect("python");
    assert!(
        out.status.success(),
        "the CloudEvents SDK or a schema refused an event: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let decoded: Value = serde_json::from_slice(&out.stdout).expect("checker's JSON");
    let events = decoded["events"].as_array().expect("events");
    assert_eq!(events.len(), messages.len());

    // Each run's events, in the stream's order, by type.
    let mut by_run: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in events {
        by_run
            .entry(e["deltarun"].as_str().expect("run").to_owned())
            .or_default()
            .push(e["type"].as_str().expect("type").to_owned());
    }
    let types = |run: RunId| -> Vec<String> {
        by_run
            .get(&run.to_string())
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .map(|t| t.trim_start_matches("dev.delta.").to_owned())
            .collect()
    };
    assert_eq!(
        types(asked),
        [
            "interaction.requested",
            "interaction.updated",
            "interaction.escalated",
            "interaction.answered",
            "run.completed"
        ]
    );
    assert_eq!(
        types(late),
        ["interaction.requested", "interaction.expired", "run.failed"]
    );
    assert_eq!(
        types(cancelled),
        [
            "interaction.requested",
            "interaction.cancelled",
            "run.cancelled"
        ]
    );
    // What the envelope says of each: where it comes from, what it is about, unique ids.
    let mut ids = std::collections::HashSet::new();
    for e in events {
        let run = e["deltarun"].as_str().expect("run");
        let agent = e["data"]["agent"].as_str().unwrap_or_else(|| {
            // `resolved` carries no agent in its data: the source says it.
            e["source"]
                .as_str()
                .and_then(|s| s.rsplit('/').next())
                .unwrap_or("")
        });
        assert_eq!(e["source"], json!(format!("/delta/{p}/agents/{agent}")));
        match e["deltarequest"].as_str() {
            Some(rid) => assert_eq!(
                e["subject"],
                json!(format!("runs/{run}/interactions/{rid}"))
            ),
            None => assert_eq!(e["subject"], json!(format!("runs/{run}"))),
        }
        assert!(ids.insert(e["id"].as_str().expect("id").to_owned()), "{e}");
    }
    let completed = events
        .iter()
        .find(|e| e["type"] == "dev.delta.run.completed")
        .expect("completed");
    assert_eq!(completed["data"]["result"], "chose yes");
    assert_eq!(completed["data"]["status"], "COMPLETED");
    // The worker announces the record as it wrote it, without reading it back: the same times
    // and outcome as the stored run.
    let (s, run) = fleet
        .client
        .get(&format!("/v1/runs/{asked}"))
        .await
        .expect("the run");
    assert_eq!(s, 200, "{run}");
    assert_eq!(completed["data"]["ended_at"], run["updated_at"], "{run}");
    assert_eq!(completed["data"]["created_at"], run["created_at"], "{run}");
    assert_eq!(completed["data"]["result"], run["result"], "{run}");
    let cancel = events
        .iter()
        .find(|e| e["type"] == "dev.delta.run.cancelled")
        .expect("cancelled");
    assert!(
        cancel["data"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("not today")),
        "{cancel}"
    );
}
