//! The notes the gateway writes after it publishes a job (its stream sequence, and for a resume
//! when to check it again), written late and only where one is needed.
//!
//! A note is on nobody's path. The run is stored before its job is published, and the job runs
//! whether or not its note is written; a note only lets the reconcilers tell a job still in the
//! stream from a lost one (`reconcile.rs`). And once a worker has taken the job, the worker's
//! own writes say so (the run's fence names the job's sequence; a resume's first write drops its
//! recheck), so the note has nothing left to tell. So the writer keeps each note [`DELAY`], then
//! asks the job stream once how far each lane's jobs are acknowledged (`Queue::acked_through`:
//! a job is acknowledged once its run paused or ended) and writes only the notes of jobs not
//! acknowledged by then (a backlog, no worker up, a step still running): together, in one Redis
//! round trip. Where jobs are done within a second (the scripted steps of the benchmark), no
//! note is written at all, and a run costs three Redis commands and a round trip fewer.
//!
//! A note never written (the gateway was killed within [`DELAY`], Redis refused it) leaves the
//! reconcilers where they are without one: the job is published again under the message id of
//! the first publish, which JetStream drops as a duplicate within its duplicate window (two
//! minutes, well past [`DELAY`] and the resume's first recheck), and answers with the first
//! publish's sequence, which the reconciler then notes; past the window, the fencing of
//! docs/protocol.md lets only one of the two jobs write to the run at a time.

use std::collections::VecDeque;
use std::time::Duration;

use delta_queue::{Lane, Queue};
use delta_store::redis::{Note, RedisRunStore};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Notes waiting to be handed to the writer at most; past that, [`Notes::note`] writes its own
/// at once.
const QUEUED: usize = 4096;
/// Notes in one write at most.
const BATCH: usize = 256;
/// How long a note waits before the writer decides whether to write it: a job acknowledged by then
/// needs none. Well under the first recheck of a resume (`resumes` is first due 5 s after the
/// answer) and the lost-job reconciler's `lost_job_after`.
pub const DELAY: Duration = Duration::from_secs(1);
/// How often the writer looks at the notes that waited [`DELAY`]: each look asks the job stream
/// twice (one request per lane), whatever the number of notes.
const TICK: Duration = Duration::from_millis(250);

/// What the writer counts, for the gateway's metrics.
#[derive(Clone, Default)]
pub struct Counters {
    /// Notes written to Redis.
    pub written: Counter,
    /// Notes dropped unwritten: their job was acknowledged before they were due.
    pub unneeded: Counter,
}

/// The gateway's note writer: [`Notes::note`] hands a note over, one task writes them.
pub struct Notes {
    tx: mpsc::Sender<Note>,
    store: RedisRunStore,
    counters: Counters,
    writer: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Notes {
    /// Starts the writer. It stops on `shutdown`, once it wrote what was handed to it.
    pub fn spawn(
        store: RedisRunStore,
        queue: Queue,
        counters: Counters,
        shutdown: CancellationToken,
    ) -> Self {
        let (tx, rx) = mpsc::channel(QUEUED);
        let writer = Writer {
            store: store.clone(),
            queue,
            counters: counters.clone(),
        };
        let writer = tokio::spawn(writer.run(rx, shutdown));
        Self {
            tx,
            store,
            counters,
            writer: std::sync::Mutex::new(Some(writer)),
        }
    }

    /// Has `note` written after [`DELAY`] if its job is not acknowledged by then. With the writer's
    /// queue full, or the writer stopped, it is written now, by this call.
    pub async fn note(&self, note: Note) {
        let note = match self.tx.try_send(note) {
            Ok(()) => return,
            Err(mpsc::error::TrySendError::Full(n) | mpsc::error::TrySendError::Closed(n)) => n,
        };
        write(&self.store, &self.counters, &[note]).await;
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

struct Writer {
    store: RedisRunStore,
    queue: Queue,
    counters: Counters,
}

impl Writer {
    /// Keeps what arrives, and every [`TICK`] decides on the notes that waited [`DELAY`], until
    /// shutdown; then decides on what is left at once (no time to wait for workers): the notes
    /// of jobs acknowledged already are dropped, the others written.
    async fn run(self, mut rx: mpsc::Receiver<Note>, shutdown: CancellationToken) {
        let mut waiting: VecDeque<(Instant, Note)> = VecDeque::new();
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                n = rx.recv() => match n {
                    Some(n) => waiting.push_back((Instant::now(), n)),
                    None => break,
                },
                _ = tick.tick() => self.due(&mut waiting).await,
                () = shutdown.cancelled() => break,
            }
        }
        // Shutdown: nothing new comes in (a late note is written by its caller); the rest goes out.
        rx.close();
        while let Some(n) = rx.recv().await {
            waiting.push_back((Instant::now(), n));
        }
        let rest: Vec<Note> = waiting.into_iter().map(|(_, n)| n).collect();
        self.decide(rest, Duration::from_secs(1)).await;
    }

    /// Writes the notes that waited [`DELAY`] whose job is still not acknowledged; drops the others.
    async fn due(&self, waiting: &mut VecDeque<(Instant, Note)>) {
        let Some(cutoff) = Instant::now().checked_sub(DELAY) else {
            return;
        };
        let n = waiting.iter().take_while(|(at, _)| *at <= cutoff).count();
        if n == 0 {
            return;
        }
        let due: Vec<Note> = waiting.drain(..n).map(|(_, n)| n).collect();
        self.decide(due, Duration::MAX).await;
    }

    /// Writes the notes of `due` whose job is not acknowledged yet; drops the others. The ack
    /// floors are asked for within `within` (at shutdown, not for long): past it, every note is
    /// written.
    async fn decide(&self, due: Vec<Note>, within: Duration) {
        if due.is_empty() {
            return;
        }
        let n = due.len();
        let floors = match tokio::time::timeout(within, self.floors()).await {
            Ok(floors) => floors,
            Err(_) => {
                tracing::debug!("job stream's ack floors not read in time; writing the notes");
                [0, 0]
            }
        };
        // Resume jobs published where start jobs go (no consumer of resumes when this gateway
        // connected: an upgrade under way) are acknowledged through the start jobs' consumer.
        let starts = floors[0];
        let resumes = if self.queue.resumes_have_their_lane() {
            floors[1]
        } else {
            starts
        };
        let needed: Vec<Note> = due
            .into_iter()
            .filter(|n| match *n {
                Note::JobSeq { seq, .. } => seq > starts,
                Note::ResumePublished { seq, .. } => seq > resumes,
            })
            .collect();
        let dropped = n - needed.len();
        self.counters.unneeded.inc_by(dropped as u64);
        for chunk in needed.chunks(BATCH) {
            write(&self.store, &self.counters, chunk).await;
        }
    }

    /// How far each lane's jobs are acknowledged; `0` for a lane the stream cannot tell about
    /// (NATS away): its notes are all written.
    async fn floors(&self) -> [u64; 2] {
        let mut floors = [0u64; 2];
        for (i, lane) in Lane::ALL.into_iter().enumerate() {
            if lane == Lane::Resumes && !self.queue.resumes_have_their_lane() {
                continue;
            }
            match self.queue.acked_through(lane).await {
                Ok(f) => floors[i] = f,
                Err(e) => {
                    tracing::debug!(error = %delta_host::Chain(&e), "job stream's ack floor not read; writing its notes")
                }
            }
        }
        floors
    }
}

/// Writes `notes` in one round trip; a failure is logged: the reconcilers make do without them
/// (module doc).
async fn write(store: &RedisRunStore, counters: &Counters, notes: &[Note]) {
    if notes.is_empty() {
        return;
    }
    match store.write_notes(notes).await {
        Ok(()) => {
            counters.written.inc_by(notes.len() as u64);
        }
        Err(e) => {
            tracing::warn!(error = %delta_host::Chain(&e), notes = notes.len(), "jobs published but not noted; the reconcilers will check them");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use delta_protocol::{Job, RequestId, RunId, RunStatus};
    use delta_store::{RunRecord, RunStore};

    struct Fixture {
        _redis: delta_launcher::Redis,
        _nats: delta_launcher::Nats,
        store: RedisRunStore,
        /// Reads on a handle of its own, which counts its round trips apart.
        reader: RedisRunStore,
        queue: Queue,
        url: String,
    }

    async fn fixture(ns: &str) -> Fixture {
        let redis = delta_launcher::Redis::start().expect("redis-server");
        let nats = delta_launcher::Nats::start().expect("nats-server");
        let store = RedisRunStore::connect(&redis.url(), ns)
            .await
            .expect("connect");
        let reader = RedisRunStore::connect(&redis.url(), ns)
            .await
            .expect("connect");
        let queue = Queue::connect(&nats.url(), ns, &delta_queue::Settings::default())
            .await
            .expect("queue");
        Fixture {
            url: redis.url(),
            _redis: redis,
            _nats: nats,
            store,
            reader,
            queue,
        }
    }

    impl Fixture {
        /// A writer over this fixture's store and stream, stopped by the token returned.
        fn writer(&self, counters: &Counters) -> (Notes, CancellationToken) {
            let shutdown = CancellationToken::new();
            let notes = Notes::spawn(
                self.store.clone(),
                self.queue.clone(),
                counters.clone(),
                shutdown.clone(),
            );
            (notes, shutdown)
        }
    }

    /// Hands the writer the start jobs' notes: run `ids[i]`'s job went out as `seqs[i]`.
    async fn hand_over(notes: &Notes, ids: &[RunId], seqs: impl IntoIterator<Item = u64>) {
        for (id, seq) in ids.iter().zip(seqs) {
            notes.note(Note::JobSeq { run_id: *id, seq }).await;
        }
    }

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

    /// Publishes a start job per run; returns their stream sequences.
    async fn publish(queue: &Queue, ids: &[RunId]) -> Vec<u64> {
        let mut seqs = vec![];
        for id in ids {
            seqs.push(
                queue
                    .publish_job("a", &Job::start(*id), None)
                    .await
                    .expect("publish"),
            );
        }
        seqs
    }

    /// Waits (10 s at most) until `done` holds.
    async fn until(mut done: impl AsyncFnMut() -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if done().await {
                return true;
            }
            if tokio::time::Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The notes of jobs nobody took are written once they waited, not before, and together:
    /// one Redis round trip for all of them.
    #[tokio::test]
    async fn notes_of_jobs_not_taken_are_written_together_once_they_waited() {
        let f = fixture("notes1").await;
        let ids = runs(&f.store, 50).await;
        let seqs = publish(&f.queue, &ids).await;
        let counters = Counters::default();
        let (notes, shutdown) = f.writer(&counters);
        let before = f.store.round_trips();
        hand_over(&notes, &ids, seqs.iter().copied()).await;
        tokio::time::sleep(DELAY / 4).await;
        assert_eq!(
            job_seqs(&f.reader, &ids).await,
            vec![0; 50],
            "nothing written before the notes waited"
        );
        assert!(
            until(async || job_seqs(&f.reader, &ids).await == seqs).await,
            "every note written, to its own run: {:?}",
            job_seqs(&f.reader, &ids).await
        );
        assert_eq!(f.store.round_trips() - before, 1, "in one round trip");
        assert_eq!(counters.written.get(), 50);
        assert_eq!(counters.unneeded.get(), 0);
        shutdown.cancel();
        notes.finish().await;
    }

    /// A note whose job a worker took (and let go of) before it was due is never written; the
    /// note of a job still in the stream, handed over with it, is.
    #[tokio::test]
    async fn notes_of_jobs_taken_are_never_written() {
        let f = fixture("notes2").await;
        let ids = runs(&f.store, 6).await;
        let seqs = publish(&f.queue, &ids[..5]).await;
        // A worker takes the five jobs and acknowledges them; the sixth job comes after.
        let mut taken = 0;
        while taken < 5 {
            let got = f
                .queue
                .fetch(Lane::Starts, 5, Duration::from_secs(2))
                .await
                .expect("fetch");
            assert!(!got.is_empty(), "the jobs were published");
            for d in got {
                d.ack().await.expect("ack");
                taken += 1;
            }
        }
        let last = publish(&f.queue, &ids[5..]).await[0];
        let counters = Counters::default();
        let (notes, shutdown) = f.writer(&counters);
        hand_over(&notes, &ids, seqs.iter().copied().chain([last])).await;
        // A resume of one of the taken runs, published and never taken: its note is written.
        let request_id = RequestId::new();
        let resume = f
            .queue
            .publish_job("a", &Job::resume(ids[0], Some(request_id)), None)
            .await
            .expect("publish");
        notes
            .note(Note::ResumePublished {
                run_id: ids[0],
                request_id,
                seq: resume,
                recheck_us: 1,
            })
            .await;
        assert!(
            until(async || counters.written.get() + counters.unneeded.get() == 7).await,
            "every note decided on: {} written, {} dropped",
            counters.written.get(),
            counters.unneeded.get()
        );
        let mut want = vec![0; 5];
        want.push(last);
        assert_eq!(job_seqs(&f.reader, &ids).await, want);
        assert_eq!(counters.unneeded.get(), 5);
        let mut conn = redis::Client::open(f.url.as_str())
            .expect("client")
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let noted: Option<u64> = redis::cmd("HGET")
            .arg(f.store.interaction_key(ids[0], &request_id.to_string()))
            .arg("resume_seq")
            .query_async(&mut conn)
            .await
            .expect("read");
        assert_eq!(noted, Some(resume));
        shutdown.cancel();
        notes.finish().await;
    }

    /// At shutdown the writer decides at once on the notes it holds: those of jobs acknowledged
    /// already are dropped (no Redis write for them), the others written.
    #[tokio::test]
    async fn at_shutdown_notes_of_acknowledged_jobs_are_dropped_and_the_rest_written() {
        let f = fixture("notes4").await;
        let ids = runs(&f.store, 3).await;
        let seqs = publish(&f.queue, &ids).await;
        // The first two taken and acknowledged, as far as the stream knows.
        let mut taken = 0;
        while taken < 2 {
            for d in f
                .queue
                .fetch(Lane::Starts, 2 - taken, Duration::from_secs(2))
                .await
                .expect("fetch")
            {
                d.ack().await.expect("ack");
                taken += 1;
            }
        }
        assert!(
            until(async || f.queue.acked_through(Lane::Starts).await.expect("floor") >= seqs[1])
                .await,
            "the stream counts the two acknowledged"
        );
        let counters = Counters::default();
        let (notes, shutdown) = f.writer(&counters);
        hand_over(&notes, &ids, seqs.iter().copied()).await;
        shutdown.cancel();
        notes.finish().await;
        assert_eq!(job_seqs(&f.reader, &ids).await, [0, 0, seqs[2]]);
        assert_eq!((counters.written.get(), counters.unneeded.get()), (1, 2));
    }

    /// At shutdown the writer writes what it was handed before it stops, without waiting; a
    /// note made after that is written by its caller.
    #[tokio::test]
    async fn nothing_handed_over_is_lost_at_shutdown() {
        let f = fixture("notes3").await;
        let ids = runs(&f.store, 11).await;
        let (notes, shutdown) = f.writer(&Counters::default());
        hand_over(&notes, &ids[..10], 1..=10).await;
        shutdown.cancel();
        notes.finish().await;
        assert_eq!(
            job_seqs(&f.store, &ids[..10]).await,
            (1..=10).collect::<Vec<u64>>()
        );
        let before = f.store.round_trips();
        notes
            .note(Note::JobSeq {
                run_id: ids[10],
                seq: 99,
            })
            .await;
        assert_eq!(
            f.store.round_trips() - before,
            1,
            "written by the call itself"
        );
        assert_eq!(job_seqs(&f.store, &ids[10..]).await, [99]);
    }
}
