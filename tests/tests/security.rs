//! Findings of the security review (issue 14), each reproduced against real nats-server,
//! redis-server, gateway and worker processes. Findings that need no servers are tested where
//! they live (the engine's tests, `delta run`'s tests, the gateway's unit tests).

use std::time::{Duration, Instant};

use delta_e2e::fleet::Fleet;
use delta_protocol::{Event, RunStatus};
use delta_store::RunStore;
use serde_json::json;

/// Whether a process whose command line holds `needle` (its arguments joined by spaces) is
/// alive on this machine.
fn process_running(needle: &str) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return false;
    };
    dir.flatten().any(|entry| {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let text: String = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        text.contains(needle)
    })
}

/// Finding 12: cancelling a run stops its running tool (the whole process group), rather than
/// leaving it to finish for nobody.
#[tokio::test(flavor = "multi_thread")]
async fn cancelling_a_run_kills_its_running_tool() {
    let mut fleet = Fleet::start("sec12", 1, 0).await;
    // A duration no other test uses, to find the process by.
    let marker = "sleep 47.131";
    fleet.add_agent(
        "sleeper",
        &format!(
            "name: sleeper\nbrain: scripted\ntools:\n  - name: nap\n    shell: '{marker}; echo woke'\n"
        ),
        "steps:\n  - tool: nap\n  - finish: \"${observation}\"\n",
    );
    fleet.add_worker("w0");
    let run = fleet.submit("sleeper", "nap").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !process_running(marker) {
        assert!(Instant::now() < deadline, "the tool never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, body) = fleet
        .client
        .post(
            &format!("/v1/runs/{run}/cancel"),
            &json!({"reason": "no time"}),
        )
        .await
        .expect("cancel");
    assert_eq!(status, 200, "{body}");
    // The worker sees the cancel within its look interval (2 s) and kills the tool's group.
    let deadline = Instant::now() + Duration::from_secs(15);
    while process_running(marker) {
        assert!(
            Instant::now() < deadline,
            "the cancelled run's tool is still running"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stored = fleet.store.load(run).await.expect("load");
    assert_eq!(stored.record.status, RunStatus::Cancelled);
    // The tool's result never reached the journal: it did not finish.
    assert!(
        !stored.journal.iter().any(
            |e| matches!(&e.event, Event::ActionResult(r) if r.observation_content.contains("woke"))
        ),
        "{:?}",
        stored.journal
    );
    // The worker let go of the job: nothing is left in the work queue.
    let js = async_nats::jetstream::new(fleet.nats().await);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut jobs = js.get_stream("SEC12_JOBS").await.expect("stream");
        if jobs.info().await.expect("info").state.messages == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cancelled run's job was never acked"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
