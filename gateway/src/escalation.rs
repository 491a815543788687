//! Escalation as data, run by the gateway (docs/protocol.md §3 "Escalation"): a question's
//! `escalation` steps are carried out on time by the reconciler of whichever gateway gets there
//! first, with no worker running. Each step is one script on the question's hash that checks it
//! is the next step and still pending, journals it (`ESCALATED`) and counts it, so two gateways
//! never carry a step out twice; then it is announced on `…interactions.escalated.…` and the
//! live stream. `apply_default` settles the question `EXPIRED` in the same script and resumes the
//! run, which applies the default option (or fails without one), as at a deadline.

use delta_protocol::{
    Escalated, InteractionState, RequestId, Resolved, Responder, RunId, Timestamp, Via,
};
use delta_store::redis::{Escalation, StoredInteraction};

use crate::Gateway;
use crate::error::ApiError;

/// `t` plus `d`.
pub(crate) fn after(t: Timestamp, d: std::time::Duration) -> Timestamp {
    let us = t
        .micros()
        .saturating_add(i64::try_from(d.as_micros()).unwrap_or(i64::MAX / 2));
    Timestamp::from_micros(us).unwrap_or(t)
}

/// Who may answer `ix` besides its `allowed_responders`, once `more` are added: the list kept
/// so far and `more`, each once.
fn widened(ix: &StoredInteraction, more: &[String]) -> Vec<String> {
    let mut all = ix.added_responders.clone();
    for r in more {
        if !all.contains(r) {
            all.push(r.clone());
        }
    }
    all
}

/// How long a step carried out and not announced is announced again before it is given up
/// (10 minutes, in µs).
const GIVE_UP_ANNOUNCING_US: i64 = 600_000_000;

/// The event of step `n` (0-based) of `ix`'s escalation, carried out at `at`.
fn step_event(ix: &StoredInteraction, n: usize, at: Timestamp) -> Option<Escalated> {
    let q = &ix.request;
    let step = q.escalation.get(n)?;
    Some(Escalated {
        request_id: q.request_id,
        run_id: q.run_id,
        agent: q.agent.clone(),
        step: u32::try_from(n + 1).unwrap_or(u32::MAX),
        of: u32::try_from(q.escalation.len()).unwrap_or(u32::MAX),
        what: step.clone(),
        due_at: after(q.timestamp, step.after),
        at,
    })
}

impl Gateway {
    /// Carries out the due steps of question `request_id`'s escalation (several, when the
    /// gateways were down past more than one), each announced before the next is carried out:
    /// a step whose announcement is not recorded (its gateway died, or NATS would not take it)
    /// is announced first, under its own id. Returns how many steps this call carried out.
    pub async fn escalate(&self, run_id: RunId, request_id: RequestId) -> Result<usize, ApiError> {
        let mut done = 0;
        // Each round carries out or announces one step, or stops; another gateway's step makes
        // it look again.
        for _ in 0..=delta_protocol::human::MAX_ESCALATION_STEPS * 3 {
            let Some(ix) = self.store.interaction(run_id, request_id).await? else {
                self.store.drop_escalation(run_id, request_id).await?;
                return Ok(done);
            };
            let q = &ix.request;
            let n = ix.escalated as usize;
            let next_due = |i: usize| q.escalation.get(i).map(|s| after(q.timestamp, s.after));
            if ix.state == InteractionState::Pending
                && let Some(at) = ix.unannounced_step
                && let Some(event) = n.checked_sub(1).and_then(|last| step_event(&ix, last, at))
            {
                let late = Timestamp::now().micros() - at.micros();
                let check = i64::try_from(self.config.resume_check.as_micros()).unwrap_or(i64::MAX);
                if late < check {
                    // Carried out just now, by a gateway that announces it now: another
                    // gateway's round that found the question due a moment before must not
                    // announce it too (bots listening live would hear it twice). The script
                    // that carried it out has the question looked at again at the check time.
                    return Ok(done);
                }
                if late > GIVE_UP_ANNOUNCING_US {
                    // NATS refused it all along: the steps after it are not held back for good.
                    tracing::error!(request = %request_id, run = %run_id, step = event.step, "an escalation step never announced; given up, the next steps go on");
                } else if !self.announce_escalated(&event).await {
                    return Ok(done);
                }
                self.store
                    .escalation_announced(run_id, request_id, ix.escalated, next_due(n))
                    .await?;
                continue;
            }
            let step = match (ix.state, q.escalation.get(n)) {
                (InteractionState::Pending, Some(step)) => step.clone(),
                _ => {
                    self.store.drop_escalation(run_id, request_id).await?;
                    return Ok(done);
                }
            };
            let due = after(q.timestamp, step.after);
            let now = Timestamp::now();
            if now.micros() < due.micros() {
                self.store
                    .reschedule_escalation(run_id, request_id, due)
                    .await?;
                return Ok(done);
            }
            let added =
                (!step.add_responders.is_empty()).then(|| widened(&ix, &step.add_responders));
            let Some(event) = step_event(&ix, n, now) else {
                return Ok(done);
            };
            let outcome = self
                .store
                .escalate(
                    q,
                    u32::try_from(n).unwrap_or(u32::MAX),
                    &event,
                    added.as_deref(),
                    self.config.resume_check,
                )
                .await?;
            match outcome {
                Escalation::Done => {
                    done += 1;
                    delta_host::failpoint("escalate:before-announce");
                    // Not announced: the question is looked at again after `resume_check`.
                    if !self.announce_escalated(&event).await {
                        return Ok(done);
                    }
                    self.store
                        .escalation_announced(run_id, request_id, event.step, next_due(n + 1))
                        .await?;
                }
                Escalation::DefaultApplied => {
                    // Best effort: its outcome is the question's `interaction.expired`, which
                    // the resume announces (again after a crash).
                    self.announce_escalated(&event).await;
                    self.metrics.timeouts_applied.inc();
                    let default = q.default_option_id.as_deref().and_then(|d| q.option(d));
                    let resolved = Resolved {
                        request_id,
                        run_id,
                        option_id: default.map(|o| o.option_id.clone()),
                        action: default.map(|o| o.action),
                        responder: Responder {
                            id: "timeout".into(),
                            via: Via::Timeout,
                            on_behalf_of: None,
                            relayed_by: None,
                        },
                        resolved_at: event.at,
                        state: InteractionState::Expired,
                    };
                    let span = crate::trace::InteractionSpan::start(
                        &ix,
                        crate::trace::Settled::Expired {
                            escalation: true,
                            steps: u32::try_from(n + 1).unwrap_or(u32::MAX),
                        },
                    );
                    let tp = span.traceparent(ix.traceparent.as_deref());
                    let unannounced = self.maybe_unannounced(&ix).await;
                    self.resume(&ix, resolved, None, tp.as_deref(), unannounced, None)
                        .await;
                    span.end();
                    return Ok(done + 1);
                }
                Escalation::Stale(_) => {}
                Escalation::Settled(_) => return Ok(done),
            }
        }
        Ok(done)
    }

    /// Announces a step carried out; `false` if NATS would not take it.
    async fn announce_escalated(&self, event: &Escalated) -> bool {
        tracing::info!(
            request = %event.request_id,
            run = %event.run_id,
            step = event.step,
            of = event.of,
            "escalation step carried out"
        );
        match self.queue.publish_escalated(event).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %delta_host::Chain(&e), request = %event.request_id, "escalation step not announced; will retry");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use delta_protocol::human::EscalationStep;
    use delta_protocol::{Event, InteractionRequest, InteractionType, RunStatus};
    use delta_store::{RunRecord, RunStore, StatusChange};
    use futures_util::StreamExt;
    use std::time::Duration;
    use tokio_util::sync::CancellationToken;

    /// The race CI once hit with two gateways: gateway A's script carried a step out, and before
    /// A announced it, gateway B (whose round had found the question due a moment before) looked
    /// at the question, saw the step carried out and not announced, and announced it too. The
    /// stream kept one, but a bot listening live heard it twice. B now leaves a step carried out
    /// less than `resume_check` ago to the gateway carrying it out.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_step_just_carried_out_is_announced_once_by_the_gateway_carrying_it_out() {
        let redis = delta_launcher::Redis::start().expect("redis-server");
        let nats = delta_launcher::Nats::start().expect("nats-server");
        let agents = tempfile::tempdir().expect("tmp");
        let config = || {
            let mut c = Config::local(&nats.url(), &redis.url(), "esc", agents.path().into());
            c.resume_check = Duration::from_secs(30);
            c
        };
        let shutdown = CancellationToken::new();
        let a = Gateway::connect(config(), shutdown.clone())
            .await
            .expect("gateway a");
        let b = Gateway::connect(config(), shutdown.clone())
            .await
            .expect("gateway b");

        // A run paused on a question whose one step is due at once.
        let rec = RunRecord::new(RunId::new(), "a", "t", RunStatus::Running);
        let run = rec.run_id;
        a.store.create(rec).await.expect("create");
        let mut q = InteractionRequest::new(run, "a", InteractionType::UserInput, "Go?");
        q.escalation = vec![EscalationStep {
            after: Duration::ZERO,
            remind: true,
            add_responders: vec![],
            apply_default: false,
        }];
        let rid = q.request_id;
        a.store
            .append(
                run,
                vec![Event::HumanInputRequest(Box::new(q.clone()))],
                Some(StatusChange::Waiting(Box::new(q.clone()))),
            )
            .await
            .expect("pause");
        let live = a.queue.client().clone();
        let mut heard = live
            .subscribe("esc.interactions.escalated.>")
            .await
            .expect("subscribe");
        live.flush().await.expect("flush");

        // A carries the step out, as its round does, and is about to announce it.
        let ix = a
            .store
            .interaction(run, rid)
            .await
            .expect("read")
            .expect("the question");
        let event = step_event(&ix, 0, Timestamp::now()).expect("its step");
        let outcome = a
            .store
            .escalate(&ix.request, 0, &event, None, a.config.resume_check)
            .await
            .expect("escalate");
        assert!(matches!(outcome, Escalation::Done), "A carried it out");

        // B looks at the question in that moment: it carries out and announces nothing.
        assert_eq!(b.escalate(run, rid).await.expect("b"), 0);
        let early = tokio::time::timeout(Duration::from_millis(500), heard.next()).await;
        assert!(
            early.is_err(),
            "B announced A's step: {:?}",
            early.map(|m| m.map(|m| m.subject))
        );
        let ix = b
            .store
            .interaction(run, rid)
            .await
            .expect("read")
            .expect("the question");
        assert_eq!((ix.escalated, ix.unannounced_step), (1, Some(event.at)));

        // A announces it: heard once, and B has nothing more to do.
        assert!(a.announce_escalated(&event).await, "announced");
        a.store
            .escalation_announced(run, rid, 1, None)
            .await
            .expect("recorded");
        let once = tokio::time::timeout(Duration::from_secs(5), heard.next())
            .await
            .expect("heard")
            .expect("a message");
        let body: serde_json::Value = serde_json::from_slice(&once.payload).expect("JSON");
        assert_eq!(body["data"]["step"], 1, "{body}");
        assert_eq!(b.escalate(run, rid).await.expect("b"), 0);
        let again = tokio::time::timeout(Duration::from_millis(500), heard.next()).await;
        assert!(
            again.is_err(),
            "heard twice: {:?}",
            again.map(|m| m.map(|m| m.subject))
        );
        shutdown.cancel();
    }
}
