//! The contract every [`RunStore`] implementation must pass; each adapter's tests call
//! [`run_all`] against a real instance of it.

use serde_json::json;

use super::{Error, RunRecord, RunStore, StatusChange, Terminal};
use delta_protocol::{
    Event, InteractionRequest, InteractionType, MessageLevel, RunId, RunStatus, SystemMessage,
};

fn msg(text: &str) -> Event {
    Event::SystemMessage(SystemMessage {
        level: MessageLevel::Info,
        content: text.into(),
    })
}

fn request(run_id: RunId) -> InteractionRequest {
    let mut q = InteractionRequest::new(run_id, "contract", InteractionType::UserInput, "name?");
    q.context.insert("action_id".to_owned(), json!("a1"));
    q
}

/// Runs every contract case against `store`. Panics (as a test does) on the first breach.
pub async fn run_all<S: RunStore>(store: &S) {
    create_then_load(store).await;
    appends_number_events_contiguously(store).await;
    status_changes_travel_with_events(store).await;
    terminal_runs_refuse_writes(store).await;
    unknown_runs_are_not_found(store).await;
}

async fn fresh<S: RunStore>(store: &S) -> RunId {
    let rec = RunRecord::new(RunId::new(), "contract", "a task", RunStatus::Queued);
    let id = rec.run_id;
    store.create(rec).await.expect("create");
    id
}

async fn create_then_load<S: RunStore>(store: &S) {
    let id = fresh(store).await;
    let run = store.load(id).await.expect("load");
    assert_eq!(run.record.run_id, id);
    assert_eq!(run.record.status, RunStatus::Queued);
    assert_eq!(run.record.task, "a task");
    assert!(run.journal.is_empty());
    let again = RunRecord::new(id, "contract", "other", RunStatus::Queued);
    assert!(matches!(store.create(again).await, Err(Error::AlreadyExists(r)) if r == id));
    assert_eq!(store.load(id).await.expect("load").record.task, "a task");
}

async fn appends_number_events_contiguously<S: RunStore>(store: &S) {
    let id = fresh(store).await;
    let a = store
        .append(id, vec![msg("1"), msg("2")], None)
        .await
        .expect("append");
    let b = store
        .append(id, vec![msg("3")], None)
        .await
        .expect("append");
    let c = store
        .append(id, vec![], Some(StatusChange::Running))
        .await
        .expect("empty append");
    assert!(c.is_empty());
    let seqs: Vec<u64> = a.iter().chain(&b).map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2, 3]);
    let run = store.load(id).await.expect("load");
    assert_eq!(run.journal, [a, b].concat());
    assert!(
        run.journal
            .windows(2)
            .all(|w| w[0].timestamp <= w[1].timestamp)
    );
    assert_eq!(run.record.status, RunStatus::Running);
}

async fn status_changes_travel_with_events<S: RunStore>(store: &S) {
    let id = fresh(store).await;
    let req = request(id);
    let rid = req.request_id;
    store
        .append(
            id,
            vec![Event::HumanInputRequest(Box::new(req.clone()))],
            Some(StatusChange::Waiting(Box::new(req))),
        )
        .await
        .expect("pause");
    let run = store.load(id).await.expect("load");
    assert_eq!(run.record.status, RunStatus::WaitingForInput);
    assert_eq!(run.record.pending_request_id, Some(rid));
    store
        .append(id, vec![msg("resumed")], Some(StatusChange::Running))
        .await
        .expect("resume");
    let run = store.load(id).await.expect("load");
    assert_eq!(run.record.status, RunStatus::Running);
    assert_eq!(run.record.pending_request_id, None);
    store
        .append(id, vec![], Some(StatusChange::Interrupted))
        .await
        .expect("interrupt");
    assert_eq!(
        store.load(id).await.expect("load").record.status,
        RunStatus::Interrupted
    );
}

async fn terminal_runs_refuse_writes<S: RunStore>(store: &S) {
    let id = fresh(store).await;
    let done = StatusChange::Finished {
        status: Terminal::Completed,
        result: Some("42".into()),
        error: None,
    };
    store
        .append(id, vec![msg("end")], Some(done))
        .await
        .expect("finish");
    let before = store.load(id).await.expect("load");
    assert_eq!(before.record.status, RunStatus::Completed);
    assert_eq!(before.record.result.as_deref(), Some("42"));
    let err = store
        .append(id, vec![msg("late")], Some(StatusChange::Running))
        .await
        .expect_err("a terminal run refuses writes");
    assert!(
        matches!(
            err,
            Error::Terminal {
                status: RunStatus::Completed,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(store.load(id).await.expect("load"), before);
}

async fn unknown_runs_are_not_found<S: RunStore>(store: &S) {
    let id = RunId::new();
    assert!(matches!(store.load(id).await, Err(Error::NotFound(r)) if r == id));
    assert!(matches!(
        store.append(id, vec![msg("x")], None).await,
        Err(Error::NotFound(_))
    ));
}
