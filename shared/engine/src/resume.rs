//! Resuming a parked run from what the store holds: one place that decides which question a
//! resume is for, reads its answer and the earlier sensitive answers, and applies them.
//!
//! ```text
//! let answers = Answers::load(&store, &run, job.request_id).await?;   // read through AnswerStore
//! let mut engine = Engine::resumed(agent, brain, &store, run, answers, settings, cancel);
//! match engine.advance_resumed().await? { Resumed::Advanced { .. } | Resumed::AlreadyApplied }
//! ```
//!
//! The host (the fleet worker) only adds what is its own: who owns the job (fencing), what to
//! acknowledge, what to publish.

use delta_protocol::{InteractionResponse, RequestId, ResponseError, RunId, RunStatus, Timestamp};
use delta_store::{self as store, AnswerStore, RunStore, StoredRun};
use tokio_util::sync::CancellationToken;

use crate::agent::{Agent, BrainKind};
use crate::brain::{Brain, Memo};
use crate::engine::{Engine, Error, Outcome, Settings};

/// Reads run `run_id` to resume it with `agent` (the agent its job names, if the host has it),
/// for a job about question `job_request` (if any): from its latest snapshot and the events
/// after it when the agent's brain can go on from there (the scripted brain, with the script
/// the snapshot was made with), else whole. The time this takes does not grow with the journal
/// when a snapshot is used, and the store may read the question with the run.
pub async fn load_run<S: RunStore>(
    store: &S,
    run_id: RunId,
    agent: Option<&Agent>,
    job_request: Option<RequestId>,
) -> Result<StoredRun, store::Error> {
    let Some(agent) = agent.filter(|a| a.brain == BrainKind::Scripted) else {
        return store.load(run_id).await;
    };
    let run = store.load_latest(run_id, job_request).await?;
    match &run.snapshot {
        Some(s) if !Memo::fits(agent, s) => {
            tracing::debug!(run = %run_id, "the snapshot was made with another script; replaying the whole journal");
            store.load(run_id).await
        }
        _ => Ok(run),
    }
}

/// Whether `run`, read without the store (a run a job carries), can be resumed as it is with
/// `agent`: its brain goes on from a snapshot (the scripted brain) and the snapshot was made
/// with the agent's script. Otherwise the host reads the run with [`load_run`].
pub fn resumable_as_carried(agent: Option<&Agent>, run: &StoredRun) -> bool {
    match (agent, &run.snapshot) {
        (Some(a), Some(s)) => a.brain == BrainKind::Scripted && Memo::fits(a, s),
        _ => false,
    }
}

/// What resuming a run needs from the store, read by [`Answers::load`].
#[derive(Clone, Debug, Default)]
pub struct Answers {
    /// The question this resume is for, if any.
    asked: Option<RequestId>,
    /// Its accepted answer (opened), if it has one.
    answer: Option<InteractionResponse>,
    /// When that answer was accepted (or the question closed).
    answered_at: Option<Timestamp>,
    /// The clock closed the question: the default option applies, or the run fails.
    expired: bool,
    /// When the answer the engine last refused for it was accepted, if it ever reopened it.
    reopened_at: Option<Timestamp>,
    /// Answers to earlier sensitive questions (opened): tools later in the run may use them.
    earlier: Vec<InteractionResponse>,
}

impl Answers {
    /// Reads what resuming `run` needs. The question is the one the job names (`job_request`),
    /// else the one the run waits on, else one its journal asked and did not apply (a job put back
    /// in the queue by an operator). Whatever brought the job, a run whose question was answered
    /// resumes with that answer: the clock never overrides an accepted answer. (The fleet's
    /// worker hands a run waiting on a settled question only to that question's resume job:
    /// docs/protocol.md "Events".)
    ///
    /// An earlier sensitive answer that cannot be opened (a wrong or missing secrets key) is left
    /// out with a warning: a tool that needs it says so, and the rest of the run goes on.
    pub async fn load<S: AnswerStore>(
        store: &S,
        run: &StoredRun,
        job_request: Option<RequestId>,
    ) -> Result<Answers, store::Error> {
        let run_id = run.record.run_id;
        // From the snapshot and the events after it, or the whole journal.
        let replay = run.replay();
        let asked = match job_request {
            Some(rid) => Some(rid),
            None if run.record.status == RunStatus::WaitingForInput => {
                run.record.pending_request_id
            }
            None => replay.pending().map(|q| q.request_id),
        };
        let mut answers = Answers {
            asked,
            ..Answers::default()
        };
        if let Some(rid) = asked
            && let Some(settled) = store.settled(run_id, rid).await?
        {
            answers.answered_at = settled.answered_at;
            answers.expired = settled.expired;
            answers.reopened_at = settled.reopened_at;
            answers.answer = settled.response;
        }
        for (q, _) in &replay.interactions {
            if !q.is_sensitive() || Some(q.request_id) == job_request {
                continue;
            }
            match store.settled(run_id, q.request_id).await {
                Ok(Some(store::Settled {
                    response: Some(a), ..
                })) => answers.earlier.push(a),
                Ok(_) => {}
                Err(e @ (store::Error::Secret(_) | store::Error::NoSecretsKey)) => {
                    tracing::warn!(error = %e, request = %q.request_id, "an earlier sensitive answer cannot be opened");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(answers)
    }

    /// The question this resume is for and when the answer last refused for it was accepted,
    /// if the engine ever reopened it: announced again while it is pending, it goes under that
    /// reopen's id.
    pub fn reopened(&self) -> Option<(RequestId, Timestamp)> {
        Some((self.asked?, self.reopened_at?))
    }

    /// The answer this resume applies and when it was accepted, if there is one.
    pub fn applying(&self) -> Option<(RequestId, Timestamp)> {
        let rid = self.asked?;
        self.answer.as_ref()?;
        Some((rid, self.answered_at?))
    }

    /// The question this resume is for, if it is settled: answered, or closed by the clock.
    pub fn settled(&self) -> Option<RequestId> {
        self.asked.filter(|_| self.answer.is_some() || self.expired)
    }
}

/// What [`Engine::advance_resumed`] did.
#[derive(Clone, Debug, PartialEq)]
pub enum Resumed {
    /// The run went on until `outcome`. `reopened`: the engine refused the stored answer (the
    /// agent changed since the gateway checked it), journaled why and opened its question again
    /// (one write); the outcome is then that question, asked again.
    Advanced { outcome: Outcome, reopened: bool },
    /// An earlier delivery applied this answer already. Whether this job may go on
    /// ([`Engine::advance`] with no answer) is the host's call: only it knows who owns the job.
    AlreadyApplied,
}

impl<'a, S: AnswerStore, B: Brain> Engine<'a, S, B> {
    /// An engine for `run` resumed with `answers`: the answer's acceptance time (its deadline is
    /// checked against it), a question the clock closed, and the sensitive answers its tools may
    /// need, even when an earlier delivery journaled the answer already.
    pub fn resumed(
        agent: &'a Agent,
        brain: &'a B,
        store: &'a S,
        run: StoredRun,
        answers: Answers,
        settings: Settings,
        cancel: CancellationToken,
    ) -> Self {
        let mut engine = Engine::new(agent, brain, store, run, settings, cancel);
        if let (Some(at), Some(_)) = (answers.answered_at, &answers.answer) {
            engine.answered_at(at);
        }
        if let (Some(rid), true) = (answers.asked, answers.expired) {
            engine.expired(rid);
        }
        for a in answers.earlier.iter().chain(answers.answer.as_ref()) {
            engine.remember_sensitive(a);
        }
        engine.resume_with(answers.answer);
        engine
    }

    /// Applies the answer the engine was resumed with (if any) and advances. An answer the engine
    /// refuses is not a dead end: the refusal is journaled, its question opened again in the
    /// store and the run paused on it again, in one write, to wait for a better answer.
    pub async fn advance_resumed(&mut self) -> Result<Resumed, Error> {
        let answer = self.take_resume_answer();
        match (self.advance(answer.clone()).await, answer) {
            (Err(Error::Answer(ResponseError::AlreadyResolved(_))), Some(_)) => {
                Ok(Resumed::AlreadyApplied)
            }
            (Err(Error::Answer(why)), Some(a)) => {
                self.note_refusal(&a, &why);
                let asked = self
                    .pending()
                    .filter(|q| q.request_id == a.request_id)
                    .cloned();
                let Some(q) = asked else {
                    // Not the question the run waits on: nothing to open again.
                    let outcome = self.advance(None).await?;
                    return Ok(Resumed::Advanced {
                        outcome,
                        reopened: false,
                    });
                };
                // The refusal journaled, the question opened again and the run paused on it
                // again: one write, so that no crash leaves a part of it. Paused here, not by
                // `advance`, which would write a stopping worker's run `INTERRUPTED` (closing
                // the question it opens) or, past its deadline, apply its default (the deadline
                // reconciler closes it as soon, from the store).
                self.store().reopen(self.record().run_id, &q);
                let outcome = match self.pause(q.clone()).await? {
                    Some(outcome) => outcome,
                    None => Outcome::Paused(Box::new(q)),
                };
                Ok(Resumed::Advanced {
                    outcome,
                    reopened: true,
                })
            }
            (other, _) => Ok(Resumed::Advanced {
                outcome: other?,
                reopened: false,
            }),
        }
    }
}
