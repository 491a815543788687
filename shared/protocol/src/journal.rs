//! The journal as data: parsing `journal.jsonl`, checking its sequence, and replaying it.
//!
//! Replay is the one place that answers "where did this run stop?": which tool calls of the
//! brain's last decision are done, which action is unfinished, which interaction is pending and
//! which answer arrived. The engine resumes from it, the CLI and the gateway describe runs with it,
//! so the resume rules exist once. Pure data: no I/O.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::{
    ActionRequest, ActionResult, EngineEnd, EngineStart, Event, HumanInputReceived,
    InteractionRequest, JournalEvent, Plan, RequestId, RunStatus, ToolCall,
};

/// A journal that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "journal line {line}: not a valid event ({source}); the journal is corrupt, restore it or start a new run"
    )]
    Corrupt {
        line: usize,
        #[source]
        source: serde_json::Error,
    },
    #[error("journal line {line}: seq {found} where {expected} was expected (seq must grow by 1)")]
    Sequence {
        line: usize,
        expected: u64,
        found: u64,
    },
    #[error(
        "journal line {line}: an event after seq {}, the largest seq there is",
        u64::MAX
    )]
    SeqOverflow { line: usize },
}

/// The result of parsing a journal file's text.
#[derive(Debug, Default)]
pub struct Parsed {
    pub events: Vec<JournalEvent>,
    /// Byte length of the well-formed prefix. A crash in the middle of an append leaves a last
    /// line without its newline that does not parse: that torn tail was never acknowledged, and
    /// is cut off by the store. `None` when the text ends cleanly.
    pub torn_tail_at: Option<usize>,
}

/// Parses JSON lines, checking that `seq` grows by one from 1. Blank lines are ignored; any other
/// bad line is an error naming its line number, except a torn last line (see [`Parsed`]).
pub fn parse_jsonl(text: &str) -> Result<Parsed, Error> {
    parse_jsonl_from(text, 1)
}

/// Like [`parse_jsonl`] for a part of a journal: `seq` grows by one from `first`.
pub fn parse_jsonl_from(text: &str, first: u64) -> Result<Parsed, Error> {
    let mut parsed = Parsed::default();
    let mut offset = 0;
    for (index, raw) in text.split_inclusive('\n').enumerate() {
        let line = index + 1;
        let complete = raw.ends_with('\n');
        let body = raw.trim();
        if !body.is_empty() {
            match parse_line(body) {
                Ok(event) => {
                    let expected = u64::try_from(parsed.events.len())
                        .ok()
                        .and_then(|n| first.checked_add(n))
                        .ok_or(Error::SeqOverflow { line })?;
                    if event.seq != expected {
                        return Err(Error::Sequence {
                            line,
                            expected,
                            found: event.seq,
                        });
                    }
                    parsed.events.push(event);
                }
                Err(_) if !complete => {
                    parsed.torn_tail_at = Some(offset);
                    return Ok(parsed);
                }
                Err(source) => return Err(Error::Corrupt { line, source }),
            }
        }
        offset += raw.len();
    }
    Ok(parsed)
}

/// How deeply a journal line may nest. Values from outside (tool arguments, answers' `data`) are
/// parsed with serde_json's limit of 128 levels, and a line wraps them in a few levels of its own
/// (`payload`, `tool_calls`, `context`…), so the default limit refused lines the engine had just
/// written. This leaves room for all of those, and still bounds recursion (and the stack) for
/// whatever a corrupt file holds.
pub const MAX_LINE_DEPTH: usize = 256;

/// One event from one line, with the depth bound above in place of serde_json's.
fn parse_line(body: &str) -> Result<JournalEvent, serde_json::Error> {
    if nesting(body) > MAX_LINE_DEPTH {
        return Err(serde::de::Error::custom(format!(
            "nested deeper than {MAX_LINE_DEPTH} levels"
        )));
    }
    let mut de = serde_json::Deserializer::from_str(body);
    de.disable_recursion_limit();
    let event = serde::Deserialize::deserialize(&mut de)?;
    de.end()?;
    Ok(event)
}

/// The deepest nesting of arrays and objects in JSON text (strings skipped).
fn nesting(text: &str) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0, false, false);
    for b in text.bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// One journal line, as written to `journal.jsonl` (with its newline).
pub fn to_line(event: &JournalEvent) -> String {
    // Serialising our own types to a string cannot fail: no maps with non-string keys.
    let mut s = serde_json::to_string(event).unwrap_or_default();
    s.push('\n');
    s
}

/// Where a run stands, derived from its journal alone.
///
/// Serialisable, so that a [`Snapshot`] can carry it: a resume then applies only the events
/// after the snapshot. Its fields default, so a snapshot written without one still reads.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Replay {
    /// The first `ENGINE_START`: the run's identity (not kept in a snapshot: the record has it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start: Option<EngineStart>,
    /// How many times an engine started on this run.
    pub attempts: u32,
    /// The last `ENGINE_END`, if no engine started after it.
    pub end: Option<EngineEnd>,
    /// Brain decisions made so far (`THOUGHT` and `PLAN` events).
    pub turns: u32,
    /// The tool calls of the most recent `THOUGHT`, in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub current_calls: Vec<ToolCall>,
    #[serde(skip_serializing_if = "HashMap::is_empty")]
    requested: HashMap<String, ActionRequest>,
    #[serde(skip_serializing_if = "HashMap::is_empty")]
    results: HashMap<String, ActionResult>,
    /// Interactions in journal order, with their answer when one arrived.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub interactions: Vec<(InteractionRequest, Option<HumanInputReceived>)>,
    /// The ids of answered interactions a snapshot left out ([`Replay::pruned`]): a repeat of
    /// their answer is refused as already answered, not as unknown.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    answered: Vec<RequestId>,
    /// When the brain's most recent decision is a `PLAN`: that plan, and the index in
    /// `interactions` of the request asking to confirm it, once asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    current_plan: Option<(Plan, Option<usize>)>,
    /// The round of a plan whose confirmation was answered "modify", until the next plan.
    #[serde(skip_serializing_if = "Option::is_none")]
    revising: Option<u32>,
    /// The last `seq` seen.
    pub last_seq: u64,
}

/// The next thing to do about the brain's current decision.
#[derive(Debug, PartialEq)]
pub enum NextCall<'a> {
    /// A call of the current decision that has not been journaled yet.
    Fresh(&'a ToolCall),
    /// A call whose `ACTION_REQUEST` is journaled without its `ACTION_RESULT`.
    Unfinished(&'a ActionRequest),
    /// Every call of the current decision has its result: time to ask the brain.
    None,
}

impl Replay {
    pub fn new(events: &[JournalEvent]) -> Self {
        let mut r = Replay::default();
        for e in events {
            r.apply(e);
        }
        r
    }

    /// Folds one more event in.
    pub fn apply(&mut self, e: &JournalEvent) {
        self.last_seq = e.seq;
        match &e.event {
            Event::EngineStart(s) => {
                if self.start.is_none() {
                    self.start = Some(s.clone());
                }
                self.attempts += 1;
                self.end = None;
            }
            Event::Thought(t) => {
                self.turns += 1;
                self.current_calls = t.tool_calls.clone().unwrap_or_default();
                self.current_plan = None;
            }
            Event::Plan(p) => {
                self.turns += 1;
                self.current_calls.clear();
                self.current_plan = Some((p.clone(), None));
                self.revising = None;
            }
            Event::ActionRequest(a) => {
                self.requested.insert(a.action_id.clone(), a.clone());
            }
            Event::ActionResult(a) => {
                self.results.insert(a.action_id.clone(), a.clone());
            }
            Event::HumanInputRequest(req) => {
                self.interactions.push(((**req).clone(), None));
                if req.is_plan_confirmation()
                    && let Some((_, asked)) = &mut self.current_plan
                {
                    *asked = Some(self.interactions.len() - 1);
                }
            }
            Event::HumanInputReceived(rec) => {
                if let Some(slot) = self
                    .interactions
                    .iter_mut()
                    .find(|(q, a)| q.request_id == rec.request_id && a.is_none())
                {
                    slot.1 = Some(rec.clone());
                }
                if let Some((plan, Some(index))) = &self.current_plan
                    && self.interactions.get(*index).map(|(q, _)| q.request_id)
                        == Some(rec.request_id)
                    && rec.action == crate::OptionAction::RetryWithFeedback
                {
                    self.revising = Some(plan.round);
                }
            }
            Event::SystemMessage(_) | Event::HumanVote(_) | Event::Escalated(_) => {}
            Event::EngineEnd(end) => self.end = Some(end.clone()),
        }
    }

    /// Forgets a terminal end: the run was put back in the queue (a dead-lettered job retried),
    /// so it goes on from here.
    pub fn reopen(&mut self) {
        if self.terminal().is_some() {
            self.end = None;
        }
    }

    /// Whether the run reached a terminal status.
    pub fn terminal(&self) -> Option<&EngineEnd> {
        self.end.as_ref().filter(|e| e.status.is_terminal())
    }

    /// What to do next about the brain's current decision.
    pub fn next_call(&self) -> NextCall<'_> {
        for call in &self.current_calls {
            if self.results.contains_key(&call.id) {
                continue;
            }
            return match self.requested.get(&call.id) {
                Some(req) => NextCall::Unfinished(req),
                None => NextCall::Fresh(call),
            };
        }
        NextCall::None
    }

    pub fn result(&self, action_id: &str) -> Option<&ActionResult> {
        self.results.get(action_id)
    }

    /// The latest interaction about `action_id`, with its answer if it has one.
    pub fn interaction_for(
        &self,
        action_id: &str,
    ) -> Option<&(InteractionRequest, Option<HumanInputReceived>)> {
        self.interactions
            .iter()
            .rev()
            .find(|(q, _)| q.action_id() == Some(action_id))
    }

    /// The plan of the brain's most recent decision, if that decision was a `PLAN`.
    pub fn current_plan(&self) -> Option<&Plan> {
        self.current_plan.as_ref().map(|(p, _)| p)
    }

    /// The round of the plan a person sent back for changes ("modify"), while no new plan has
    /// been made: nothing should run until one is.
    pub fn revising(&self) -> Option<u32> {
        self.revising
    }

    /// The request to confirm the current plan, with its answer if it has one.
    pub fn plan_confirmation(&self) -> Option<&(InteractionRequest, Option<HumanInputReceived>)> {
        let index = self.current_plan.as_ref()?.1?;
        self.interactions.get(index)
    }

    /// The interaction still waiting for an answer, if any.
    pub fn pending(&self) -> Option<&InteractionRequest> {
        self.interactions
            .iter()
            .rev()
            .find(|(_, a)| a.is_none())
            .map(|(q, _)| q)
    }

    /// Whether interaction `id` was asked and answered (kept, or left out by a snapshot).
    pub fn answered(&self, id: RequestId) -> bool {
        self.answered.contains(&id)
            || self
                .interactions
                .iter()
                .any(|(q, a)| q.request_id == id && a.is_some())
    }

    /// Looks an interaction up by id. An answered one that a snapshot left out (neither
    /// sensitive nor about the current decision) is not found: see [`Replay::answered`].
    pub fn interaction(
        &self,
        id: RequestId,
    ) -> Option<&(InteractionRequest, Option<HumanInputReceived>)> {
        self.interactions.iter().find(|(q, _)| q.request_id == id)
    }

    /// What a snapshot keeps: everything the rest of the run can ask, without what it never
    /// will: the identity, which the record holds; the requests and results of decisions before
    /// the current one (action ids carry their turn, so no later call reuses them); and the
    /// answered interactions that are neither sensitive (their answers are masked for the rest
    /// of the run) nor about the current decision, of which only the ids are kept. So a
    /// snapshot stays small however many questions a run asked.
    pub fn pruned(&self) -> Replay {
        let current = |id: &str| self.current_calls.iter().any(|c| c.id == id);
        let plan_asked = self.current_plan.as_ref().and_then(|(_, i)| *i);
        let mut answered = self.answered.clone();
        let mut interactions = Vec::new();
        let mut current_plan = self.current_plan.clone();
        for (i, (q, a)) in self.interactions.iter().enumerate() {
            let keep = a.is_none()
                || q.is_sensitive()
                || q.action_id().is_some_and(current)
                || plan_asked == Some(i);
            if !keep {
                answered.push(q.request_id);
                continue;
            }
            if plan_asked == Some(i)
                && let Some((_, asked)) = &mut current_plan
            {
                *asked = Some(interactions.len());
            }
            interactions.push((q.clone(), a.clone()));
        }
        fn of_current<T: Clone>(
            map: &HashMap<String, T>,
            current: impl Fn(&str) -> bool,
        ) -> HashMap<String, T> {
            map.iter()
                .filter(|(id, _)| current(id))
                .map(|(id, v)| (id.clone(), v.clone()))
                .collect()
        }
        Replay {
            start: None,
            requested: of_current(&self.requested, current),
            results: of_current(&self.results, current),
            interactions,
            answered,
            current_plan,
            attempts: self.attempts,
            end: self.end.clone(),
            turns: self.turns,
            current_calls: self.current_calls.clone(),
            revising: self.revising,
            last_seq: self.last_seq,
        }
    }

    /// The status the journal implies, for stores that must reconcile a record with it.
    pub fn implied_status(&self) -> Option<RunStatus> {
        match &self.end {
            Some(end) => Some(end.status),
            None if self.attempts > 0 => Some(RunStatus::Running),
            None => None,
        }
    }
}

/// The format of the [`Snapshot`]s this build writes. Changing what a snapshot holds means a new
/// number. Format 2 names the question the run waits on by its id (`asked`) instead of copying
/// it (the store keeps the question anyway). Format 1 (the question copied in) is still read;
/// a snapshot of any other format is ignored and the journal replayed.
pub const SNAPSHOT_FORMAT: u32 = 2;

/// Where a run stood at journal seq `seq`, so that a resume reads this and the events after it
/// rather than the whole journal (docs/protocol.md, "Snapshots"). Derived data only: the journal
/// stays the truth, and a snapshot that is missing, unreadable, of another format or for another
/// seq is ignored and the journal replayed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Snapshot {
    /// [`SNAPSHOT_FORMAT`] when written.
    pub format: u32,
    /// The last journal seq it covers.
    pub seq: u64,
    /// [`Replay::pruned`] after event `seq`.
    pub replay: Replay,
    /// Lifecycle-hook calls journaled up to `seq` (they number the hooks' I/O directories).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hook_calls: u64,
    /// The ids of the grant notes (`grant <id> …` system messages) journaled up to `seq`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub grants_noted: Vec<String>,
    /// The brain's own memory of the run (the scripted brain's place in its script), in the
    /// brain's format; `None` for a brain that reads the whole journal anyway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brain: Option<serde_json::Value>,
    /// Only as stored ([`Snapshot::encode`]): the id of the question the run waits on, which the
    /// stored `replay` then leaves out. [`Snapshot::decode`] puts the store's copy back, so in
    /// memory this is always `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asked: Option<RequestId>,
    /// Only as stored: the current calls whose `ACTION_REQUEST` is the call itself (the same
    /// tool and arguments, as it nearly always is), which the stored `replay` then leaves out of
    /// its requests. Empty in memory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requested: Vec<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Snapshot {
    /// The snapshot `text` holds if it is one this build can use for journal seq `seq`, or why
    /// not (for the caller to log). `question` is the store's copy of the question the run waits
    /// on, read with the snapshot: a snapshot naming another question (or one not read) is not
    /// usable.
    pub fn decode(
        text: &str,
        seq: u64,
        question: Option<&InteractionRequest>,
    ) -> Result<Snapshot, String> {
        #[derive(Deserialize)]
        struct Head {
            format: u32,
        }
        let head: Head = serde_json::from_str(text).map_err(|e| format!("unreadable: {e}"))?;
        if head.format != SNAPSHOT_FORMAT && head.format != 1 {
            return Err(format!(
                "format {} where this build reads 1 and {SNAPSHOT_FORMAT}",
                head.format
            ));
        }
        let mut snap: Snapshot =
            serde_json::from_str(text).map_err(|e| format!("unreadable: {e}"))?;
        if snap.seq != seq || snap.replay.last_seq != seq {
            return Err(format!(
                "it covers seq {} (replay at {}) where the store says {seq}",
                snap.seq, snap.replay.last_seq
            ));
        }
        // Counters the engine adds to: none so large that the next step would overflow it (a
        // tampered store, or a resume job's copy; the journal is replayed instead).
        const MAX_COUNT: u64 = 1 << 53;
        if snap.seq > MAX_COUNT
            || snap.hook_calls > MAX_COUNT
            || snap.replay.attempts > u32::MAX / 2
            || snap.replay.turns > u32::MAX / 2
        {
            return Err(format!(
                "its counters are out of range (seq {}, hook calls {}, attempts {}, turns {})",
                snap.seq, snap.hook_calls, snap.replay.attempts, snap.replay.turns
            ));
        }
        if let Some(id) = snap.asked.take() {
            let q = question
                .filter(|q| q.request_id == id)
                .ok_or_else(|| format!("it waits on question {id}, which was not read with it"))?;
            snap.replay.interactions.push((q.clone(), None));
        }
        for id in std::mem::take(&mut snap.requested) {
            let call = snap
                .replay
                .current_calls
                .iter()
                .find(|c| c.id == id)
                .ok_or_else(|| format!("it names a request of call {id}, which is not current"))?;
            let request = ActionRequest {
                action_id: call.id.clone(),
                tool: call.tool.clone(),
                args: call.args.clone(),
            };
            snap.replay.requested.insert(id, request);
        }
        Ok(snap)
    }

    /// The snapshot as stored (compact JSON, [`SNAPSHOT_FORMAT`]): the question the run waits on
    /// named by its id, when it is the last one asked.
    pub fn encode(&self) -> String {
        let mut stored = self.clone();
        stored.format = SNAPSHOT_FORMAT;
        if let Some((q, None)) = stored.replay.interactions.last() {
            stored.asked = Some(q.request_id);
            stored.replay.interactions.pop();
        }
        for call in &self.replay.current_calls {
            let as_called = |r: &ActionRequest| r.tool == call.tool && r.args == call.args;
            if stored.replay.requested.get(&call.id).is_some_and(as_called) {
                stored.replay.requested.remove(&call.id);
                stored.requested.push(call.id.clone());
            }
        }
        // Our own types, string keys only: serialising cannot fail.
        serde_json::to_string(&stored).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ActionStatus, RunId, Thought, Timestamp};
    use serde_json::json;

    fn ev(seq: u64, event: Event) -> JournalEvent {
        JournalEvent {
            seq,
            timestamp: Timestamp::now(),
            event,
        }
    }

    fn sample() -> Vec<JournalEvent> {
        vec![
            ev(
                1,
                Event::EngineStart(EngineStart {
                    run_id: RunId::new(),
                    agent: "a".into(),
                    task: "t".into(),
                    worker: "local".into(),
                    attempt: 1,
                }),
            ),
            ev(
                2,
                Event::Thought(Thought {
                    content: "two calls".into(),
                    tool_calls: Some(vec![
                        ToolCall {
                            id: "a1".into(),
                            tool: "echo".into(),
                            args: json!({}),
                        },
                        ToolCall {
                            id: "a2".into(),
                            tool: "echo".into(),
                            args: json!({}),
                        },
                    ]),
                }),
            ),
            ev(
                3,
                Event::ActionRequest(ActionRequest {
                    action_id: "a1".into(),
                    tool: "echo".into(),
                    args: json!({}),
                }),
            ),
        ]
    }

    #[test]
    fn replay_tracks_the_current_plan_and_its_confirmation() {
        use crate::{InteractionType, Plan, RiskLevel};
        let mut events = sample();
        let plan = Plan {
            tasks: vec![],
            risk_level: RiskLevel::Low,
            round: 1,
        };
        events.push(ev(4, Event::Plan(plan.clone())));
        let r = Replay::new(&events);
        assert_eq!(r.current_plan(), Some(&plan));
        assert!(r.plan_confirmation().is_none());
        assert_eq!(r.next_call(), NextCall::None, "a plan has no calls");

        let mut q =
            InteractionRequest::new(RunId::new(), "a", InteractionType::UserConfirmation, "ok?");
        q.context.insert("plan".into(), json!([]));
        events.push(ev(5, Event::HumanInputRequest(Box::new(q.clone()))));
        let r = Replay::new(&events);
        assert_eq!(
            r.plan_confirmation().map(|(p, _)| p.request_id),
            Some(q.request_id)
        );

        events.push(ev(
            6,
            Event::Thought(Thought {
                content: "acting".into(),
                tool_calls: None,
            }),
        ));
        let r = Replay::new(&events);
        assert!(r.current_plan().is_none() && r.plan_confirmation().is_none());
    }

    #[test]
    fn parse_reports_corrupt_lines_by_number() {
        let mut text: String = sample().iter().map(to_line).collect();
        text.push_str("{not json}\n");
        match parse_jsonl(&text) {
            Err(Error::Corrupt { line, .. }) => assert_eq!(line, 4),
            other => panic!("expected corrupt line 4, got {other:?}"),
        }
    }

    #[test]
    fn parse_detects_a_torn_last_line() {
        let text: String = sample().iter().map(to_line).collect();
        let whole = text.len();
        let torn = format!("{text}{{\"seq\": 4, \"timest");
        let parsed = parse_jsonl(&torn).expect("torn tail is not an error");
        assert_eq!(parsed.events.len(), 3);
        assert_eq!(parsed.torn_tail_at, Some(whole));
    }

    #[test]
    fn what_the_engine_writes_reads_back_however_deep_its_values() {
        // Found by the journal properties: arguments nested 125 to 127 levels deep (which
        // serde_json accepts from an LLM or an HTTP body) made a line the journal refused to
        // read back ("recursion limit exceeded"): the run could never resume.
        // `deep(n)` is nested n + 1 levels: deep(126) is as deep as serde_json accepts.
        let deep = |depth: usize| (0..depth).fold(json!([]), |v, _| json!([v]));
        let mut events = sample();
        events[2].event = Event::ActionRequest(ActionRequest {
            action_id: "a1".into(),
            tool: "echo".into(),
            args: json!({"x": deep(126)}),
        });
        let text: String = events.iter().map(to_line).collect();
        assert_eq!(parse_jsonl(&text).expect("parses").events, events);
        // Deeper than any value the product accepts: refused with the line, never a stack
        // overflow.
        let mut text: String = sample()[..2].iter().map(to_line).collect();
        text.push_str(&format!(
            "{{\"seq\": 3, \"x\": {}{}}}\n",
            "[".repeat(100_000),
            "]".repeat(100_000)
        ));
        let e = parse_jsonl(&text).expect_err("too deep").to_string();
        assert!(
            e.starts_with("journal line 3") && e.contains("nested deeper than 256 levels"),
            "{e}"
        );
        // Brackets inside strings are text.
        assert_eq!(nesting(r#"{"a": "[[[{{\"]]", "b": [[]]}"#), 3);
    }

    #[test]
    fn no_seq_follows_the_largest() {
        // Found by the journal properties: a page read from near the end of u64 overflowed
        // (a panic in debug builds; in release, seq 0 was accepted after u64::MAX).
        let mut events = sample();
        events[0].seq = u64::MAX - 1;
        events[1].seq = u64::MAX;
        events[2].seq = 0;
        let text: String = events.iter().map(to_line).collect();
        assert!(matches!(
            parse_jsonl_from(&text, u64::MAX - 1),
            Err(Error::SeqOverflow { line: 3 })
        ));
        let two: String = events[..2].iter().map(to_line).collect();
        assert_eq!(
            parse_jsonl_from(&two, u64::MAX - 1)
                .expect("parses")
                .events
                .len(),
            2
        );
    }

    #[test]
    fn floats_read_back_bit_for_bit() {
        // Found by the journal round-trip property: without serde_json's `float_roundtrip`,
        // -2.16833424327429e-54 came back as -2.1683342432742902e-54.
        let mut events = sample();
        let args = json!({"x": -2.16833424327429e-54, "y": 0.1, "z": 1.7976931348623157e308});
        events[2].event = Event::ActionRequest(ActionRequest {
            action_id: "a1".into(),
            tool: "echo".into(),
            args,
        });
        let text: String = events.iter().map(to_line).collect();
        assert_eq!(parse_jsonl(&text).expect("parses").events, events);
    }

    #[test]
    fn parse_refuses_gaps_in_seq() {
        let mut events = sample();
        events[2].seq = 5;
        let text: String = events.iter().map(to_line).collect();
        assert!(matches!(
            parse_jsonl(&text),
            Err(Error::Sequence {
                line: 3,
                expected: 3,
                found: 5
            })
        ));
    }

    #[test]
    fn replay_finds_the_unfinished_and_the_fresh_call() {
        let mut events = sample();
        let r = Replay::new(&events);
        assert!(matches!(r.next_call(), NextCall::Unfinished(a) if a.action_id == "a1"));
        events.push(ev(
            4,
            Event::ActionResult(ActionResult {
                action_id: "a1".into(),
                status: ActionStatus::Success,
                observation_content: "".into(),
                exit_code: Some(0),
                duration_ms: 1,
            }),
        ));
        let r = Replay::new(&events);
        assert!(matches!(r.next_call(), NextCall::Fresh(c) if c.id == "a2"));
        assert_eq!(r.implied_status(), Some(RunStatus::Running));
        assert_eq!(r.turns, 1);
    }
}
