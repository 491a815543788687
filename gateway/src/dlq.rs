//! The dead-letter queue, for operators: list the jobs that were given up on, put one back in the
//! queue once its cause is mended (`FAILED` → `QUEUED`, a journal note, a new start job), or drop
//! it. A retried run goes on from where its journal stops: an unfinished idempotent tool is run
//! again, another becomes an approval question, an answered question is applied.

use delta_api::{DeadLetterView, ErrorCode};
use delta_protocol::journal::Replay;
use delta_protocol::{Job, RunId, RunStatus};
use delta_queue::DeadLetter;
use delta_store::RunStore;
use delta_store::redis::Requeue;

use crate::Gateway;
use crate::error::ApiError;

/// What a retry did.
pub struct Retried {
    pub run_id: RunId,
    /// The new start job's sequence in the job stream.
    pub job_seq: u64,
}

impl Gateway {
    /// Up to `limit` dead letters from `from` on (of one agent, or all), each with its run's
    /// status and whether it can be retried; and the cursor that continues, if more follow.
    pub async fn dead_letters(
        &self,
        agent: Option<&str>,
        from: u64,
        limit: usize,
    ) -> Result<(Vec<DeadLetterView>, Option<String>), ApiError> {
        let (letters, more) = self.queue.dead_letters(agent, from, limit).await?;
        let ids: Vec<RunId> = letters
            .iter()
            .filter_map(|l| l.job.as_ref().map(|j| j.run_id))
            .collect();
        let records = self.store.records(&ids).await?;
        let next = more
            .then(|| letters.last().map(|l| (l.seq + 1).to_string()))
            .flatten();
        let views = letters
            .iter()
            .map(|l| {
                let record = l
                    .job
                    .as_ref()
                    .and_then(|j| records.iter().find(|r| r.run_id == j.run_id));
                let retryable = record.is_some_and(|r| failed_by(r, l));
                view(l, record.map(|r| r.status), retryable)
            })
            .collect();
        Ok((views, next))
    }

    /// Puts the run of dead letter `seq` back in the queue and removes the letter.
    ///
    /// Only a run that this dead-lettering failed (its error is the letter's reason), so a stale
    /// letter never revives a run that failed otherwise. Crash-safe in this order: the run is
    /// `QUEUED` first (a crash here leaves a queued run with no job, which the lost-job
    /// reconciler sends), then its job is published, then the letter is removed (a crash before
    /// leaves it listed, and a second retry is refused because the run is no longer `FAILED`).
    pub async fn retry_dead_letter(&self, seq: u64, by: &str) -> Result<Retried, ApiError> {
        let letter = self.letter(seq).await?;
        let Some(job) = &letter.job else {
            return Err(ApiError::new(
                ErrorCode::NotRetryable,
                format!(
                    "dead letter {seq} holds no job (its payload is not one), so there is no run to retry; drop it"
                ),
            ));
        };
        let run_id = job.run_id;
        // Its job still in the work queue: a worker is dead-lettering it now (an exhausted job
        // is removed last, once its run is failed, and should that worker die, another takes
        // it up). Retried meanwhile, the run could be failed again by that worker.
        if let Some(job_seq) = letter.job_seq
            && self.queue.job_exists(job_seq).await?
        {
            return Err(ApiError::new(
                ErrorCode::Unavailable,
                format!(
                    "dead letter {seq}'s job is still being dead-lettered by a worker; try again in a minute"
                ),
            ));
        }
        let note = format!(
            "retried from the dead-letter queue by {by} (it was dead-lettered: {})",
            letter.reason
        );
        // A question the journal left open: the failure closed it, the retry opens it again.
        let run = match self.store.load(run_id).await {
            Ok(r) => r,
            Err(delta_store::Error::NotFound(_)) => {
                return Err(ApiError::new(
                    ErrorCode::NotRetryable,
                    format!("run {run_id} of dead letter {seq} does not exist; drop the letter"),
                ));
            }
            Err(e) => return Err(e.into()),
        };
        let open = Replay::new(&run.journal).pending().cloned();
        let seq_note = match self
            .store
            .requeue_failed(run_id, &note, &letter.reason, open.as_ref())
            .await?
        {
            Requeue::Queued { seq } => seq,
            Requeue::NotFailed(status) => {
                return Err(ApiError::new(
                    ErrorCode::NotRetryable,
                    format!(
                        "run {run_id} is {status}; only a run the dead-lettering failed can be retried (drop this letter: the run went on)"
                    ),
                ));
            }
            Requeue::FailedOtherwise(error) => {
                return Err(ApiError::new(
                    ErrorCode::NotRetryable,
                    format!(
                        "run {run_id} failed for another reason since ({error}); drop this stale letter"
                    ),
                ));
            }
        };
        // A start job whatever the letter held: the worker resumes a run from its journal and
        // applies an answered question it finds there.
        let start = Job::start(run_id);
        let job_seq = self
            .queue
            .publish_job_as(
                &letter.agent,
                &start,
                // Unique per retry (the note's journal seq), so a retry is never deduplicated.
                &format!("retry:{run_id}:{seq_note}"),
                letter.traceparent.as_deref(),
            )
            .await?;
        self.store.set_job_seq(run_id, job_seq).await?;
        self.queue.drop_dead_letter(seq).await?;
        tracing::info!(%run_id, seq, by, "dead letter retried");
        Ok(Retried { run_id, job_seq })
    }

    /// Removes dead letter `seq` without retrying it; its run, if this dead-lettering failed it,
    /// is no longer kept for a retry (retention deletes it as any finished run).
    pub async fn drop_dead_letter(&self, seq: u64, by: &str) -> Result<(), ApiError> {
        let letter = self.queue.dead_letter_at(seq).await?;
        if !self.queue.drop_dead_letter(seq).await? {
            return Err(no_letter(seq));
        }
        tracing::info!(seq, by, "dead letter dropped");
        if let Some((l, job)) = letter.as_ref().and_then(|l| Some((l, l.job.as_ref()?))) {
            let run = job.run_id;
            // Best effort: a mark left keeps the run until the letter would have gone.
            match self.store.record(run).await {
                Ok(r) if failed_by(&r, l) => {
                    if let Err(e) = self.store.forget_dead_letter(run).await {
                        tracing::warn!(error = %e, %run, "a dropped letter's run still kept as long as the letter would have been");
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    async fn letter(&self, seq: u64) -> Result<DeadLetter, ApiError> {
        self.queue
            .dead_letter_at(seq)
            .await?
            .ok_or_else(|| no_letter(seq))
    }
}

/// Whether `record`'s run is `FAILED` by letter `l`'s dead-lettering (its error is the letter's
/// reason): only such a run may be retried, and only its mark goes with the letter.
fn failed_by(record: &delta_store::RunRecord, l: &DeadLetter) -> bool {
    record.status == RunStatus::Failed
        && record
            .error
            .as_deref()
            .map(|e| e.replace(['\r', '\n'], " "))
            .as_deref()
            == Some(l.reason.as_str())
}

fn no_letter(seq: u64) -> ApiError {
    ApiError::not_found(format!(
        "no dead letter {seq} (retried or dropped already?); GET /v1/dlq lists them"
    ))
}

/// A dead letter as the API shows it.
pub fn view(l: &DeadLetter, run_status: Option<RunStatus>, retryable: bool) -> DeadLetterView {
    DeadLetterView {
        seq: l.seq,
        agent: l.agent.clone(),
        reason: l.reason.clone(),
        job_seq: l.job_seq,
        dead_lettered_at: l.at,
        run_id: l.job.as_ref().map(|j| j.run_id),
        kind: l.job.as_ref().map(|j| j.kind),
        request_id: l.job.as_ref().and_then(|j| j.request_id),
        run_status,
        retryable,
        // The payload only when it is not a job (a job is shown by its fields).
        payload: l.job.is_none().then(|| l.payload.clone()),
    }
}
