//! The notes the gateway writes after it publishes a job (its stream sequence, and for a resume
//! when to check it again), written together: whatever notes wait when a write goes out share
//! its one Redis round trip.
//!
//! A note is on nobody's path. The run is stored before its job is published, and the job runs
//! whether or not its note is written; a note only lets the reconcilers tell a job still in the
//! stream from a lost one (`reconcile.rs`). So a submission or an answer is acknowledged once its
//! job is published, without waiting for its note. A note that is never written (the gateway
//! was killed, Redis refused it) leaves the reconcilers where they are without one: the job is
//! published again under the message id of the first publish, which JetStream drops as a
//! duplicate within its duplicate window; past it, the fencing of docs/protocol.md lets only one
//! of the two jobs write to the run at a time.

use delta_store::redis::{Note, RedisRunStore};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Notes waiting to be written at most; past that, [`Notes::note`] writes its own at once.
const QUEUED: usize = 4096;
/// Notes in one write at most.
const BATCH: usize = 256;

/// The gateway's note writer: [`Notes::note`] hands a note over, one task writes them.
pub struct Notes {
    tx: mpsc::Sender<Note>,
    store: RedisRunStore,
    writer: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Notes {
    /// Starts the writer. It stops on `shutdown`, once it wrote what was handed to it.
    pub fn spawn(store: RedisRunStore, shutdown: CancellationToken) -> Self {
        let (tx, rx) = mpsc::channel(QUEUED);
        let writer = tokio::spawn(write(store.clone(), rx, shutdown));
        Self {
            tx,
            store,
            writer: std::sync::Mutex::new(Some(writer)),
        }
    }

    /// Has `note` written with the next write. With the writer's queue full, or the writer
    /// stopped, it is written now, by this call.
    pub async fn note(&self, note: Note) {
        let note = match self.tx.try_send(note) {
            Ok(()) => return,
            Err(mpsc::error::TrySendError::Full(n) | mpsc::error::TrySendError::Closed(n)) => n,
        };
        failed(&self.store.write_notes(&[note]).await, 1);
    }

    /// Waits (after shutdown) until the writer wrote what it was handed.
    pub async fn finish(&self) {
        let writer = self
            .writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(w) = writer {
            let _ = w.await;
        }
    }
}

/// Writes what arrives, whatever waits in one go, until shutdown; then what is left.
async fn write(store: RedisRunStore, mut rx: mpsc::Receiver<Note>, shutdown: CancellationToken) {
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        let first = tokio::select! {
            n = rx.recv() => n,
            () = shutdown.cancelled() => None,
        };
        let Some(first) = first else { break };
        batch.push(first);
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(n) => batch.push(n),
                Err(_) => break,
            }
        }
        failed(&store.write_notes(&batch).await, batch.len());
        batch.clear();
    }
    // Shutdown: nothing new comes in (a late note is written by its caller); the rest goes out.
    rx.close();
    while let Some(n) = rx.recv().await {
        batch.push(n);
        if batch.len() == BATCH {
            failed(&store.write_notes(&batch).await, batch.len());
            batch.clear();
        }
    }
    failed(&store.write_notes(&batch).await, batch.len());
}

/// Logs a write of `n` notes that failed: the reconcilers make do without them (module doc).
fn failed(result: &Result<(), delta_store::Error>, n: usize) {
    if let Err(e) = result {
        tracing::warn!(error = %delta_host::Chain(e), notes = n, "jobs published but not noted; the reconcilers will check them");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use delta_protocol::{RunId, RunStatus};
    use delta_store::{RunRecord, RunStore};

    async fn runs(store: &RedisRunStore, n: usize) -> Vec<RunId> {
        let mut ids = vec![];
        for _ in 0..n {
            let rec = RunRecord::new(RunId::new(), "a", "t", RunStatus::Queued);
            ids.push(rec.run_id);
            store.create(rec).await.expect("create");
        }
        ids
    }

    async fn job_seqs(store: &RedisRunStore, ids: &[RunId]) -> Vec<u64> {
        let mut seqs = vec![];
        for id in ids {
            let run = store.queue_run(*id).await.expect("read").expect("run");
            seqs.push(run.job_seq);
        }
        seqs
    }

    /// The notes handed over while the writer waits go out in one round trip, every one of them.
    #[tokio::test]
    async fn notes_handed_over_together_are_written_in_one_round_trip() {
        let redis = delta_launcher::Redis::start().expect("redis-server");
        let store = RedisRunStore::connect(&redis.url(), "notes1")
            .await
            .expect("connect");
        // Reads on a handle of their own, which counts its round trips apart.
        let reader = RedisRunStore::connect(&redis.url(), "notes1")
            .await
            .expect("connect");
        let ids = runs(&store, 50).await;
        let shutdown = CancellationToken::new();
        let notes = Notes::spawn(store.clone(), shutdown.clone());
        let before = store.round_trips();
        // On this test's one thread the writer runs only once the test waits: all 50 are queued.
        for (i, id) in ids.iter().enumerate() {
            notes
                .note(Note::JobSeq {
                    run_id: *id,
                    seq: i as u64 + 1,
                })
                .await;
        }
        let want: Vec<u64> = (1..=50).collect();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        let written = loop {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            let during = store.round_trips() - before;
            let seqs = job_seqs(&reader, &ids).await;
            if seqs == want || tokio::time::Instant::now() > deadline {
                break (during, seqs);
            }
        };
        assert_eq!(written.1, want, "every note written, to its own run");
        assert_eq!(written.0, 1, "in one round trip");
        shutdown.cancel();
        notes.finish().await;
    }

    /// At shutdown the writer writes what it was handed before it stops; a note made after that
    /// is written by its caller.
    #[tokio::test]
    async fn nothing_handed_over_is_lost_at_shutdown() {
        let redis = delta_launcher::Redis::start().expect("redis-server");
        let store = RedisRunStore::connect(&redis.url(), "notes2")
            .await
            .expect("connect");
        let ids = runs(&store, 11).await;
        let shutdown = CancellationToken::new();
        let notes = Notes::spawn(store.clone(), shutdown.clone());
        for (i, id) in ids[..10].iter().enumerate() {
            notes
                .note(Note::JobSeq {
                    run_id: *id,
                    seq: i as u64 + 1,
                })
                .await;
        }
        shutdown.cancel();
        notes.finish().await;
        assert_eq!(
            job_seqs(&store, &ids[..10]).await,
            (1..=10).collect::<Vec<u64>>()
        );
        let before = store.round_trips();
        notes
            .note(Note::JobSeq {
                run_id: ids[10],
                seq: 99,
            })
            .await;
        assert_eq!(
            store.round_trips() - before,
            1,
            "written by the call itself"
        );
        assert_eq!(job_seqs(&store, &ids[10..]).await, [99]);
    }
}
