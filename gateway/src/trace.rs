//! The gateway's spans in a run's trace (docs/operations.md "Tracing"): one `interaction` span
//! per question, from when it was asked to when it was decided, and the handling of each answer
//! (`answer`) below it.
//!
//! A question is asked by a worker and decided by a gateway, usually another process much later,
//! so no process holds a span open for the wait. The gateway that settles the question (an
//! answer, the vote that reaches the count, the deadline, an escalation's `apply_default`, a
//! cancel) builds the span afterwards with OpenTelemetry's API: it starts at the question's
//! `timestamp`, ends when the gateway is done with the decision, and its parent is the span
//! that asked (the `traceparent` stored with the question). The run's resume job carries this
//! span's context, so the trace reads: the worker's `job` that asked → `interaction` → the
//! `job` that resumed.
//!
//! Attributes say what was decided and how, never what was said: no answer text, feedback,
//! `data` or prompt goes into a span (a vote's reason neither); responder ids and option ids do.
//! Names come from OpenTelemetry's GenAI semantic conventions where they have one (`gen_ai.*`),
//! else they are ours under `delta.`.

use std::time::{Duration, SystemTime};

use opentelemetry::trace::{SpanKind, TraceContextExt as _, Tracer as _};
use opentelemetry::{Context, KeyValue, StringValue, Value};

use delta_protocol::{Ballot, InteractionState, OptionAction, Responder, Tally, Timestamp, Vote};
use delta_store::redis::StoredInteraction;

/// The gateway's `service.name`, and the name of its tracer.
pub const SERVICE: &str = "delta-gateway";

/// What settled a question, for its `interaction` span.
#[derive(Clone, Copy, Debug)]
pub enum Settled<'a> {
    /// An answer (`votes`: with the votes that decided it, on a question with `approvals`).
    Answered {
        responder: &'a Responder,
        option_id: Option<&'a str>,
        action: OptionAction,
        votes: Option<&'a [Vote]>,
    },
    /// Its deadline passed (`escalation: false`), or its escalation's last step applied the
    /// default (`escalation: true`); `steps`: the escalation steps carried out, that one included.
    Expired { escalation: bool, steps: u32 },
    /// Its run was cancelled by `by`.
    Cancelled { by: &'a str },
}

/// A question's `interaction` span, started (in the past) once the question is decided, ended
/// by [`InteractionSpan::end`] (or when dropped). A no-op when nothing is exported.
pub struct InteractionSpan {
    /// The run's trace context with this span in it: the parent of what follows.
    cx: Context,
}

impl InteractionSpan {
    /// Starts the `interaction` span of `ix`, settled as `settled`, in its run's trace.
    pub fn start(ix: &StoredInteraction, settled: Settled<'_>) -> Self {
        let tracer = delta_host::tracer(SERVICE);
        let parent = delta_host::remote_context(ix.traceparent.as_deref());
        let now = Timestamp::now();
        let builder = tracer
            .span_builder("interaction")
            .with_kind(SpanKind::Internal)
            .with_start_time(system_time(ix.request.timestamp))
            .with_attributes(attributes(ix, settled, now))
            .with_events(events(ix, settled));
        let span = tracer.build_with_context(builder, &parent);
        Self {
            cx: parent.with_span(span),
        }
    }

    /// The run's trace context with this span in it (the parent of the answer handling).
    pub fn context(&self) -> Context {
        self.cx.clone()
    }

    /// The `traceparent` for the resume job: this span when it is exported, else `stored`
    /// (the question's own) unchanged, so that a gateway that exports nothing cuts no trace.
    pub fn traceparent(&self, stored: Option<&str>) -> Option<String> {
        delta_host::traceparent_of(&self.cx).or_else(|| stored.map(str::to_owned))
    }

    /// Ends the span now (the decision is done with).
    pub fn end(self) {
        self.cx.span().end();
    }
}

/// The span of one answer's handling (HTTP, CLI or a bot), not yet entered: its parent is
/// chosen once the handling is done ([`finish_answer`]).
pub fn answer_span(request_id: delta_protocol::RequestId, responder: &Responder) -> tracing::Span {
    tracing::info_span!(
        "answer",
        "delta.interaction.request_id" = %request_id,
        "delta.responder.id" = %responder.id,
        "delta.responder.via" = via(responder),
        run_id = tracing::field::Empty,
        "delta.answer.status" = tracing::field::Empty,
        "error.type" = tracing::field::Empty,
    )
}

/// What one answer's handling learned for its span.
#[derive(Default)]
pub struct AnswerTrace {
    /// The question's run, once the question was found.
    pub run_id: Option<delta_protocol::RunId>,
    /// The question's stored `traceparent` (the span that asked), once the question was found.
    pub asked: Option<String>,
    /// The `interaction` span, when this answer decided the question.
    pub decided: Option<InteractionSpan>,
}

/// Closes an answer's span: a child of the `interaction` span when the answer decided the
/// question, else of the span that asked (a vote counted, a refusal, a repeat), else a trace of
/// its own (no such question). Then ends the `interaction` span, so that it encloses its child.
pub fn finish_answer(span: tracing::Span, trace: AnswerTrace, outcome: Result<&str, &str>) {
    if let Some(run) = trace.run_id {
        span.record("run_id", tracing::field::display(run));
    }
    match outcome {
        Ok(status) => span.record("delta.answer.status", status),
        Err(code) => {
            span.record("delta.answer.status", "refused");
            span.record("error.type", code)
        }
    };
    match &trace.decided {
        Some(i) => delta_host::set_parent(&span, i.context()),
        None if trace.asked.is_some() => {
            delta_host::continue_trace(&span, trace.asked.as_deref());
        }
        None => {}
    }
    drop(span);
    if let Some(i) = trace.decided {
        i.end();
    }
}

fn system_time(t: Timestamp) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_micros(u64::try_from(t.micros()).unwrap_or(0))
}

fn via(r: &Responder) -> &'static str {
    match r.via {
        delta_protocol::Via::Http => "http",
        delta_protocol::Via::Nats => "nats",
        delta_protocol::Via::Cli => "cli",
        delta_protocol::Via::File => "file",
        delta_protocol::Via::Stdin => "stdin",
        delta_protocol::Via::Timeout => "timeout",
        delta_protocol::Via::Slack => "slack",
        delta_protocol::Via::Mcp => "mcp",
        delta_protocol::Via::A2a => "a2a",
    }
}

/// The protocol's spelling of an enum (`TOOL_APPROVAL`, `APPROVE_AND_EXECUTE`).
fn wire<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn strings(items: &[String]) -> Value {
    Value::Array(
        items
            .iter()
            .map(|s| StringValue::from(s.clone()))
            .collect::<Vec<_>>()
            .into(),
    )
}

/// The `interaction` span's attributes (docs/operations.md "Tracing" lists them). Nothing a
/// person wrote goes in: only ids, the question's type and hash, the decision, the counts.
pub fn attributes(ix: &StoredInteraction, settled: Settled<'_>, now: Timestamp) -> Vec<KeyValue> {
    let q = &ix.request;
    let waited_ms = (now.micros() - q.timestamp.micros()).max(0) / 1000;
    let state = match settled {
        Settled::Answered { .. } => InteractionState::Answered,
        Settled::Expired { .. } => InteractionState::Expired,
        Settled::Cancelled { .. } => InteractionState::Cancelled,
    };
    let mut a = vec![
        // GenAI semantic conventions: the run is the conversation, the agent asked.
        KeyValue::new("gen_ai.conversation.id", q.run_id.to_string()),
        KeyValue::new("gen_ai.agent.name", q.agent.clone()),
        // As on the workers' spans.
        KeyValue::new("run_id", q.run_id.to_string()),
        KeyValue::new("delta.interaction.request_id", q.request_id.to_string()),
        KeyValue::new("delta.interaction.type", wire(&q.kind)),
        KeyValue::new("delta.interaction.state", state.as_str()),
        KeyValue::new("delta.interaction.wait_ms", waited_ms),
        KeyValue::new("delta.interaction.request_hash", q.shown_hash()),
        KeyValue::new("delta.interaction.sensitive", q.is_sensitive()),
    ];
    // The tool call the question belongs to: the call awaiting approval, or the agent's
    // `ask_human` call itself.
    if let Some(tool) = q.context.get("tool").and_then(|t| t.as_str()) {
        a.push(KeyValue::new("gen_ai.tool.name", tool.to_owned()));
    }
    if let Some(action_id) = q.action_id() {
        a.push(KeyValue::new("gen_ai.tool.call.id", action_id.to_owned()));
    }
    let default = || q.default_option_id.as_deref().and_then(|d| q.option(d));
    let (source, responder_id, responder_via, option, action) = match settled {
        Settled::Answered {
            responder,
            option_id,
            action,
            votes,
        } => (
            if votes.is_some() { "quorum" } else { "answer" },
            responder.id.clone(),
            via(responder),
            option_id.map(str::to_owned),
            Some(action),
        ),
        Settled::Expired { escalation, .. } => (
            if escalation { "escalation" } else { "deadline" },
            "timeout".to_owned(),
            "timeout",
            default().map(|o| o.option_id.clone()),
            default().map(|o| o.action),
        ),
        Settled::Cancelled { by } => ("cancel", by.to_owned(), "http", None, None),
    };
    a.push(KeyValue::new("delta.decision.source", source));
    a.push(KeyValue::new("delta.responder.id", responder_id));
    a.push(KeyValue::new("delta.responder.via", responder_via));
    if let Settled::Answered { responder, .. } = settled
        && let Some(from) = &responder.on_behalf_of
    {
        a.push(KeyValue::new("delta.responder.on_behalf_of", from.clone()));
    }
    if let Some(o) = option {
        a.push(KeyValue::new("delta.decision.option_id", o));
    }
    if let Some(act) = action {
        a.push(KeyValue::new("delta.decision.action", wire(&act)));
    }
    if let (Settled::Answered { votes: Some(v), .. }, Some(approvals)) = (settled, &q.approvals) {
        let t = Tally::of(v, approvals.min);
        a.push(KeyValue::new("delta.votes.count", v.len() as i64));
        a.push(KeyValue::new("delta.votes.needed", i64::from(t.needed)));
        a.push(KeyValue::new(
            "delta.votes.approvals",
            i64::from(t.approvals),
        ));
        a.push(KeyValue::new(
            "delta.votes.rejections",
            i64::from(t.rejections),
        ));
        a.push(KeyValue::new(
            "delta.votes.approved_by",
            strings(&t.approved_by),
        ));
        a.push(KeyValue::new(
            "delta.votes.rejected_by",
            strings(&t.rejected_by),
        ));
    }
    let steps = match settled {
        Settled::Expired { steps, .. } => steps,
        _ => ix.escalated,
    };
    if !q.escalation.is_empty() {
        a.push(KeyValue::new("delta.escalation.steps", i64::from(steps)));
        a.push(KeyValue::new(
            "delta.escalation.of",
            q.escalation.len() as i64,
        ));
    }
    // A call a grant or a policy rule decides asks nobody: it has no `interaction` span; the
    // worker records `delta.grant.id` / `delta.policy.rule` as an event (docs/operations.md).
    a
}

/// The `interaction` span's events: each escalation step carried out (at its due time, from
/// the question's declaration) and each vote (at its time, who and which way; never its reason).
fn events(ix: &StoredInteraction, settled: Settled<'_>) -> Vec<opentelemetry::trace::Event> {
    let q = &ix.request;
    let steps = match settled {
        Settled::Expired { steps, .. } => steps,
        _ => ix.escalated,
    } as usize;
    let mut out = vec![];
    for (i, step) in q.escalation.iter().take(steps).enumerate() {
        let due = crate::escalation::after(q.timestamp, step.after).micros();
        let mut attrs = vec![
            KeyValue::new("delta.escalation.step", (i + 1) as i64),
            KeyValue::new("delta.escalation.remind", step.remind),
            KeyValue::new("delta.escalation.apply_default", step.apply_default),
        ];
        if !step.add_responders.is_empty() {
            attrs.push(KeyValue::new(
                "delta.escalation.add_responders",
                strings(&step.add_responders),
            ));
        }
        out.push(opentelemetry::trace::Event::new(
            "escalated",
            SystemTime::UNIX_EPOCH + Duration::from_micros(u64::try_from(due).unwrap_or(0)),
            attrs,
            0,
        ));
    }
    if let Settled::Answered {
        votes: Some(votes), ..
    } = settled
    {
        for v in votes {
            out.push(opentelemetry::trace::Event::new(
                "vote",
                system_time(v.at),
                vec![
                    KeyValue::new("delta.responder.id", v.responder.id.clone()),
                    KeyValue::new("delta.responder.via", via(&v.responder)),
                    KeyValue::new(
                        "delta.vote.ballot",
                        match v.ballot {
                            Ballot::Approve => "approve",
                            Ballot::Reject => "reject",
                        },
                    ),
                    KeyValue::new("delta.decision.option_id", v.option_id.clone()),
                ],
                0,
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use delta_protocol::{InteractionRequest, InteractionType, RunId, Via};

    fn stored(q: InteractionRequest) -> StoredInteraction {
        StoredInteraction {
            request: q,
            state: InteractionState::Pending,
            response: None,
            answered_at: None,
            reopened_at: None,
            resume_seq: None,
            asked_by_job: None,
            unannounced: false,
            traceparent: None,
            claim: None,
            votes: vec![],
            escalated: 0,
            unannounced_step: None,
            added_responders: vec![],
        }
    }

    fn get<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a Value> {
        attrs
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| &kv.value)
    }

    /// The prompt, the answer's text and its feedback never reach the span; ids and the
    /// decision do.
    #[test]
    fn an_answer_is_described_but_never_quoted() {
        let mut q = InteractionRequest::new(
            RunId::new(),
            "hello",
            InteractionType::UserInput,
            "secret prompt",
        );
        q.sensitive = true;
        let ix = stored(q);
        let who = Responder::new("alice", Via::Nats);
        let attrs = attributes(
            &ix,
            Settled::Answered {
                responder: &who,
                option_id: None,
                action: OptionAction::ProvideInfo,
                votes: None,
            },
            Timestamp::now(),
        );
        let text = format!("{attrs:?}");
        assert!(!text.contains("secret prompt"), "{text}");
        assert_eq!(
            get(&attrs, "delta.responder.id").map(|v| v.as_str().into_owned()),
            Some("alice".into())
        );
        assert_eq!(
            get(&attrs, "delta.responder.via").map(|v| v.as_str().into_owned()),
            Some("nats".into())
        );
        assert_eq!(
            get(&attrs, "delta.decision.action").map(|v| v.as_str().into_owned()),
            Some("PROVIDE_INFO".into())
        );
        assert_eq!(
            get(&attrs, "delta.interaction.type").map(|v| v.as_str().into_owned()),
            Some("USER_INPUT".into())
        );
        assert_eq!(
            get(&attrs, "delta.decision.source").map(|v| v.as_str().into_owned()),
            Some("answer".into())
        );
    }

    /// Without an exporter the span is the no-op one: the resume job carries the question's
    /// own `traceparent`, unchanged.
    #[test]
    fn without_export_the_stored_traceparent_passes_through() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut ix = stored(InteractionRequest::new(
            RunId::new(),
            "hello",
            InteractionType::UserInput,
            "Name?",
        ));
        ix.traceparent = Some(tp.to_owned());
        let span = InteractionSpan::start(
            &ix,
            Settled::Expired {
                escalation: false,
                steps: 0,
            },
        );
        assert_eq!(span.traceparent(Some(tp)).as_deref(), Some(tp));
        span.end();
    }
}
