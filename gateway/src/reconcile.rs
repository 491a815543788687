//! The reconcilers (docs/architecture.md "What can go wrong, and who mends it"). They run periodically in
//! every gateway, take no input, and make every change through the same atomic scripts and
//! idempotent publishes as the request path, so several gateways may run them at once:
//!
//! - **deadlines**: a question past `expires_at` is closed `EXPIRED` (first one wins against a
//!   late human) and its run resumed: the worker applies the default option or fails the run;
//! - **escalations**: a pending question's escalation steps are carried out when due, each once
//!   ([`crate::escalation`]);
//! - **resumes**: a question answered whose resume job was not published (gateway died between
//!   `ANSWERED` and the publish) is published again with the same `Nats-Msg-Id`; one published
//!   whose job vanished from the stream while the run still waits is enqueued again (a job whose
//!   sequence was never noted, `notes.rs`, is known by JetStream's answer to that same publish:
//!   a duplicate, with the first copy's sequence);
//! - **lost jobs**: a `QUEUED`, `RUNNING` or `INTERRUPTED` run with no progress for
//!   `lost_job_after` whose job is no longer in the stream (NATS lost it, or the gateway died
//!   before publishing it) is enqueued again. A job still in the stream is JetStream's to
//!   redeliver, so a long step on a live worker is never doubled;
//! - **retention**: runs finished longer than `DELTA_RETENTION` ago are deleted whole, a bounded
//!   batch per round, each by one idempotent script that checks again that the run is finished
//!   (two gateways deleting the same run delete it once). After a start, each gateway also walks
//!   the terminal status indexes once to add runs finished before the finished index existed.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio_util::sync::CancellationToken;

use delta_protocol::{InteractionState, Job, RequestId, RunId, RunStatus, Timestamp};

use crate::Gateway;
use crate::error::ApiError;

/// Where the lost-job walk goes on next time, per status, and where the retention backfill is.
pub struct Cursors {
    queued: AtomicUsize,
    running: AtomicUsize,
    interrupted: AtomicUsize,
    /// The terminal statuses whose index the backfill has yet to walk, with its offset.
    backfill: std::sync::Mutex<Vec<(RunStatus, usize)>>,
}

impl Cursors {
    /// At the start of every walk; with `finished_indexed` (`<p>:finished-index` says every
    /// finished run is in the finished index), no backfill to do.
    fn new(finished_indexed: bool) -> Self {
        let backfill = if finished_indexed {
            vec![]
        } else {
            vec![
                (RunStatus::Completed, 0),
                (RunStatus::Failed, 0),
                (RunStatus::Cancelled, 0),
            ]
        };
        Self {
            queued: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            interrupted: AtomicUsize::new(0),
            backfill: std::sync::Mutex::new(backfill),
        }
    }
}

/// Runs deleted in one retention batch, and batches at most per round.
const PURGE_BATCH: usize = 200;
const PURGE_BATCHES: usize = 10;

/// Runs the reconcilers every `reconcile_every` until `shutdown`.
pub async fn run(gw: std::sync::Arc<Gateway>, shutdown: CancellationToken) {
    let cursors = Cursors::new(gw.store.finished_indexed());
    let mut ticks: u64 = 0;
    loop {
        tokio::select! {
            () = tokio::time::sleep(gw.config.reconcile_every) => {}
            () = shutdown.cancelled() => return,
        }
        round(&gw, &cursors, ticks).await;
        ticks += 1;
    }
}

/// One round of the reconcilers. What is due (deadlines, escalation steps, resumes, and runs
/// past retention) is read in one round trip; an idle fleet costs that one a round.
async fn round(gw: &Gateway, cursors: &Cursors, ticks: u64) {
    let now = Timestamp::now().micros();
    let cutoff = gw
        .config
        .retention
        .map(|keep| now.saturating_sub(micros(keep)));
    let due = match gw.store.due(now, cutoff, PURGE_BATCH).await {
        Ok(due) => due,
        Err(e) => {
            tracing::warn!(error = %e, "reconcilers: what is due not read; will retry");
            delta_store::redis::Due::default()
        }
    };
    deadlines(gw, due.deadlines).await;
    escalations(gw, due.escalations).await;
    resumes(gw, due.resumes, now).await;
    // The lost-job walk reads every queued/running run: less often.
    if ticks % 10 == 0
        && let Err(e) = lost_jobs(gw, cursors).await
    {
        tracing::warn!(error = %e, "lost-job reconciler");
    }
    if let Some(cutoff) = cutoff
        && let Err(e) = retention(gw, cursors, due.purge, cutoff).await
    {
        tracing::warn!(error = %e, "retention reconciler");
    }
}

/// Closes the questions `due` whose deadline passed. Returns how many it closed. One entry's
/// failure is logged and does not hold up the others.
async fn deadlines(gw: &Gateway, due: Vec<(RunId, RequestId)>) -> usize {
    let mut closed = 0;
    for (run_id, request_id) in due {
        match gw.expire(run_id, request_id).await {
            Ok(true) => closed += 1,
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %e, run = %run_id, request = %request_id, "deadline not applied; will retry")
            }
        }
    }
    closed
}

/// Carries out the escalation steps `due`. Returns how many it carried out.
async fn escalations(gw: &Gateway, due: Vec<(RunId, RequestId)>) -> usize {
    let mut done = 0;
    for (run_id, request_id) in due {
        match gw.escalate(run_id, request_id).await {
            Ok(n) => done += n,
            Err(e) => {
                tracing::warn!(error = %e, run = %run_id, request = %request_id, "escalation step not carried out; will retry")
            }
        }
    }
    done
}

/// Looks after the answered questions `due` whose run has not resumed yet (read at `now`).
/// Returns how many resume jobs it published.
async fn resumes(gw: &Gateway, due: Vec<(RunId, RequestId)>, now: i64) -> usize {
    let mut published = 0;
    for (run_id, request_id) in due {
        match resume_one(gw, run_id, request_id, now).await {
            Ok(true) => published += 1,
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %e, run = %run_id, request = %request_id, "resume not checked; will retry")
            }
        }
    }
    published
}

async fn resume_one(
    gw: &Gateway,
    run_id: RunId,
    request_id: RequestId,
    now: i64,
) -> Result<bool, ApiError> {
    // The stream first, the run second: a job taken and finished between the two reads shows
    // as a run that moved on, never as a lost job.
    let before = gw.store.interaction(run_id, request_id).await?;
    if let Some(seq) = before.as_ref().and_then(|ix| ix.resume_seq)
        && gw.queue.job_exists(seq).await?
    {
        // Still queued (a backlog): look again later.
        let later = now + micros(gw.config.lost_job_after);
        gw.store
            .reschedule_resume(run_id, request_id, later)
            .await?;
        return Ok(false);
    }
    let record = match gw.store.record(run_id).await {
        Ok(r) => r,
        Err(delta_store::Error::NotFound(_)) => {
            gw.store.drop_resume(run_id, request_id).await?;
            return Ok(false);
        }
        Err(e) => return Err(e.into()),
    };
    let ix = gw.store.interaction(run_id, request_id).await?;
    let still_waiting = record.status == RunStatus::WaitingForInput
        && record.pending_request_id == Some(request_id);
    let Some(ix) = ix.filter(|ix| still_waiting && ix.state != InteractionState::Pending) else {
        // The run went on (or the question is open again): nothing to mend.
        gw.store.drop_resume(run_id, request_id).await?;
        return Ok(false);
    };
    let job = Job::resume(run_id, Some(request_id));
    let tp = ix.traceparent.as_deref();
    let msg_id = match ix.resume_seq {
        // Never published (or not noted): the same id, so a publish that did happen dedupes.
        None => job.resume_msg_id(
            ix.answered_at
                .filter(|_| ix.state == InteractionState::Answered),
        ),
        // Published, gone from the stream, and the run still waits: lost.
        Some(seq) => format!("requeue:{request_id}:{seq}"),
    };
    // Whoever settled it may have died before announcing it (same id: announced once); before
    // the job, as `Gateway::resume` does, so that it precedes what the resumed run announces.
    // So may the worker that asked it, before announcing the question (`requested`).
    if gw.maybe_unannounced(&ix).await {
        gw.queue
            .publish_pending(&ix.request, ix.reopened_at, ix.traceparent.as_deref())
            .await?;
    }
    if let Some(resolved) = gw.resolved_of(run_id, &ix) {
        gw.queue
            .publish_resolved(&record.agent, &resolved, tp)
            .await?;
    }
    let sent = gw
        .queue
        .publish_job_acked(&record.agent, &job, &msg_id, tp)
        .await?;
    if sent.duplicate && ix.resume_seq.is_none() {
        // Published, and not noted: its note is written only for a job not acknowledged within
        // a second (`notes.rs`), and this one's was not (the gateway died first, or the job left
        // the stream without the run moving on, as by a purge). JetStream told its sequence:
        // noted, and looked at again in the next round as any noted job is (the stream first,
        // then the run): still there, a backlog; gone while the run still waits, lost.
        gw.store
            .resume_published(run_id, request_id, sent.seq, Timestamp::now().micros())
            .await?;
        return Ok(false);
    }
    let later = Timestamp::now().micros() + micros(gw.config.lost_job_after);
    gw.store
        .resume_published(run_id, request_id, sent.seq, later)
        .await?;
    gw.metrics.resumes_republished.inc();
    tracing::info!(run = %run_id, request = %request_id, msg_id, "resume job published by the reconciler");
    Ok(true)
}

/// Enqueues again the runs whose job was lost. Returns how many.
pub async fn lost_jobs(gw: &Gateway, cursors: &Cursors) -> Result<usize, ApiError> {
    let cutoff = Timestamp::now().micros() - micros(gw.config.lost_job_after);
    let mut requeued = 0;
    for (status, cursor) in [
        (RunStatus::Queued, &cursors.queued),
        (RunStatus::Running, &cursors.running),
        (RunStatus::Interrupted, &cursors.interrupted),
    ] {
        let (runs, next) = gw
            .store
            .queue_runs(status, cursor.load(Ordering::Relaxed), 200)
            .await?;
        cursor.store(next, Ordering::Relaxed);
        for run in runs {
            let idle = run.updated_at.is_none_or(|t| t.micros() < cutoff);
            if !idle || run.status != status {
                continue;
            }
            match requeue_if_lost(gw, &run, cutoff).await {
                Ok(true) => requeued += 1,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, run = %run.run_id, "lost-job check failed; will retry")
                }
            }
        }
    }
    Ok(requeued)
}

async fn requeue_if_lost(
    gw: &Gateway,
    run: &delta_store::redis::QueueRun,
    cutoff: i64,
) -> Result<bool, ApiError> {
    let seq = run.job_seq.max(run.fence_seq);
    if seq > 0 && gw.queue.job_exists(seq).await? {
        return Ok(false);
    }
    // The stream had no job for it: read the run again, in case a job ran (and was acked)
    // between the first read and the stream check.
    let again = gw.store.queue_run(run.run_id).await?;
    let unchanged = again.as_ref().is_some_and(|a| {
        a.status == run.status
            && a.job_seq.max(a.fence_seq) == seq
            && a.updated_at.is_none_or(|t| t.micros() < cutoff)
    });
    if !unchanged {
        return Ok(false);
    }
    let job = Job::start(run.run_id);
    // Never published: `start:<run>` dedupes with a publish that did happen. Lost: a new id
    // per lost job, the same for every gateway that notices.
    let msg_id = if seq == 0 {
        job.msg_id()
    } else {
        format!("requeue:{}:{seq}", run.run_id)
    };
    let sent = gw
        .queue
        .publish_job_acked(&run.agent, &job, &msg_id, None)
        .await?;
    gw.store.set_job_seq(run.run_id, sent.seq).await?;
    if sent.duplicate && seq == 0 {
        // Published, and not noted: its note is written only for a job not acknowledged within
        // a second (`notes.rs`), and this one's was not (the gateway died first, or the job left
        // the stream without the run moving on, as by a purge). JetStream told its sequence:
        // noted, and looked at again by the next walk as any noted job is (the stream first,
        // then the run): still there, JetStream's to deliver; gone, lost.
        return Ok(false);
    }
    gw.metrics.jobs_requeued.inc();
    tracing::warn!(run = %run.run_id, status = %run.status, lost_seq = seq, "job lost; enqueued again");
    Ok(true)
}

/// Deletes the runs that finished more than `DELTA_RETENTION` ago (at or before `cutoff`), up
/// to [`PURGE_BATCHES`] batches of [`PURGE_BATCH`], the first of them `first` (read with the
/// round's other due entries); first, until it is done, a batch of the backfill. Returns how
/// many runs it deleted. Logs counts only, never what the runs held.
async fn retention(
    gw: &Gateway,
    cursors: &Cursors,
    first: Vec<RunId>,
    cutoff: i64,
) -> Result<usize, ApiError> {
    backfill(gw, cursors).await?;
    // The walk goes by position in the status indexes: a run deleted ahead of it would shift the
    // rest, and it would pass over as many. Nothing is deleted until it is through.
    if !cursors
        .backfill
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .is_empty()
    {
        return Ok(0);
    }
    let mut purged = 0;
    let mut skipped = 0;
    let mut deferred = 0;
    let mut first = Some(first);
    for _ in 0..PURGE_BATCHES {
        let pass = match first.take() {
            Some(due) => gw.store.purge_due(due, cutoff, PURGE_BATCH).await?,
            None => gw.store.purge_finished(cutoff, PURGE_BATCH).await?,
        };
        purged += pass.purged;
        skipped += pass.skipped;
        deferred += pass.deferred;
        gw.metrics.runs_purged.inc_by(pass.purged as u64);
        if !pass.more {
            break;
        }
    }
    crate::grants::sweep(gw, cutoff).await?;
    if purged > 0 || skipped > 0 || deferred > 0 {
        tracing::info!(
            purged,
            skipped,
            deferred,
            retention_s = gw.config.retention.map_or(0, |keep| keep.as_secs()),
            "finished runs past retention deleted"
        );
    }
    Ok(purged)
}

/// One batch of the walk that adds runs finished before the finished index existed.
async fn backfill(gw: &Gateway, cursors: &Cursors) -> Result<(), ApiError> {
    let next = cursors
        .backfill
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .first()
        .copied();
    let Some((status, offset)) = next else {
        return Ok(());
    };
    let (added, next) = gw
        .store
        .backfill_finished(status, offset, PURGE_BATCH)
        .await?;
    if added > 0 {
        tracing::info!(added, %status, "finished runs added to the retention index");
    }
    let done = {
        let mut left = cursors.backfill.lock().unwrap_or_else(|p| p.into_inner());
        match (next, left.first_mut()) {
            (0, Some(_)) => {
                left.remove(0);
                left.is_empty()
            }
            (n, Some(first)) => {
                first.1 = n;
                false
            }
            (_, None) => false,
        }
    };
    if done {
        // Every terminal status index walked: gateways started from now on walk nothing.
        gw.store.mark_finished_indexed().await?;
        tracing::info!("every finished run is in the retention index");
    }
    Ok(())
}

fn micros(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}
