//! The scripted brain: walks `script.yaml`, taking branches from the answers in the journal.
//!
//! Its position is derived from the journal: the number of decisions already journaled
//! (`THOUGHT` and `PLAN` events) says how many turn-taking steps are behind it, and each `branch`
//! on the way is decided by the last answer received before that point. Replaying a journal
//! therefore puts the brain exactly where it was, in any process.
//!
//! It keeps that position in the run's memo ([`ScriptMemo`]): each decision folds in only the
//! events since the last one and walks on from where the last walk stopped, so a decision costs
//! the same at any journal length, and a snapshot carries the memo to the next process.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Brain, Decision, Error, ProposedCall, View, parse_tasks};
use crate::agent::ASK_HUMAN;
use crate::script::{PlanStep, Script, Step};
use delta_protocol::{Event, JournalEvent, OptionAction, PlanTask, RequestId, RiskLevel};

/// Deterministic brain of `brain: scripted` agents.
#[derive(Clone, Copy, Debug, Default)]
pub struct ScriptedBrain;

/// An answer as the script sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Answer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    option_id: Option<String>,
    /// The text, or a `{{secret:…}}` reference when the request was sensitive; of a typed
    /// answer, its `data` as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    text: Option<String>,
    /// A typed answer's object (not kept when sensitive), for `${answer.<field>}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    data: Option<Value>,
    /// A sensitive typed answer's request: `${answer.<field>}` is `{{secret:<id>.<field>}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sealed: Option<RequestId>,
}

/// A "modify" answer to the plan of the last decision: the plan step is to plan again.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Revision {
    /// The answer, whose text is the person's feedback.
    answer: Answer,
    /// The person's own task list (`data.tasks`), if they sent one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tasks: Option<Vec<PlanTask>>,
}

/// What the journal says, turn by turn, folded one event at a time.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct History {
    /// Steps of the script behind the run: `THOUGHT`s and first-round `PLAN`s (a revised plan
    /// is the same step again).
    turns: usize,
    /// Set when the last decision is a plan that a person asked to modify.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    revision: Option<Revision>,
    /// `(turns before it, answer)`, in journal order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    answers: Vec<(usize, Answer)>,
    /// `(turns before it, observation)`, in journal order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    observations: Vec<(usize, String)>,
    /// `(turns before it, {{secret:…}} reference)` of each sensitive answer, in journal order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    secrets: Vec<(usize, String)>,
    /// Requests asked so far that are sensitive, that confirm a plan, that expect typed data.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    sensitive: BTreeSet<RequestId>,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    plan_requests: BTreeSet<RequestId>,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    typed: BTreeSet<RequestId>,
    /// Built from the whole journal, nothing left out: a walk may start from the top.
    #[serde(skip)]
    whole: bool,
}

/// How a tool gets a sensitive answer: the engine swaps this reference for the secret.
pub fn secret_ref(request_id: RequestId) -> String {
    format!("{{{{secret:{request_id}}}}}")
}

impl History {
    /// Folds one more event in.
    fn apply(&mut self, e: &JournalEvent) {
        match &e.event {
            Event::Thought(_) => {
                self.turns += 1;
                self.revision = None;
            }
            Event::Plan(p) => {
                if p.round <= 1 {
                    self.turns += 1;
                }
                self.revision = None;
            }
            Event::HumanInputRequest(q) => {
                if q.is_sensitive() {
                    self.sensitive.insert(q.request_id);
                }
                if q.is_plan_confirmation() {
                    self.plan_requests.insert(q.request_id);
                }
                if q.response_schema.is_some() {
                    self.typed.insert(q.request_id);
                }
            }
            Event::HumanInputReceived(r) => {
                let sensitive = self.sensitive.contains(&r.request_id);
                let data = r
                    .data
                    .clone()
                    .filter(|_| self.typed.contains(&r.request_id));
                let text = if sensitive {
                    self.secrets.push((self.turns, secret_ref(r.request_id)));
                    Some(secret_ref(r.request_id))
                } else if let Some(d) = &data {
                    Some(d.to_string())
                } else {
                    r.input
                        .clone()
                        .or_else(|| r.feedback.clone())
                        .filter(|s| !s.is_empty())
                };
                let answer = Answer {
                    option_id: r.option_id.clone(),
                    text,
                    data: data.clone().filter(|_| !sensitive),
                    sealed: data.filter(|_| sensitive).map(|_| r.request_id),
                };
                if self.plan_requests.contains(&r.request_id)
                    && r.action == OptionAction::RetryWithFeedback
                {
                    self.revision = Some(Revision {
                        answer: answer.clone(),
                        tasks: r
                            .data
                            .as_ref()
                            .and_then(|d| d.get("tasks"))
                            .and_then(|t| parse_tasks(t).ok()),
                    });
                }
                self.answers.push((self.turns, answer));
            }
            Event::ActionResult(r) => self
                .observations
                .push((self.turns, r.observation_content.clone())),
            _ => {}
        }
    }

    /// The history without what no walk from `passed` decisions on can ask for: for answers,
    /// observations and secrets, the last one at or before `passed` and those after it.
    fn pruned(&self, passed: usize) -> History {
        fn from<T: Clone>(v: &[(usize, T)], passed: usize) -> Vec<(usize, T)> {
            let after = v.partition_point(|(t, _)| *t <= passed);
            v[after.saturating_sub(1)..].to_vec()
        }
        History {
            answers: from(&self.answers, passed),
            observations: from(&self.observations, passed),
            secrets: from(&self.secrets, passed),
            whole: false,
            ..self.clone()
        }
    }

    /// The last answer received after at most `turns` decisions.
    fn answer_at(&self, turns: usize) -> Option<&Answer> {
        last_at(&self.answers, turns)
    }

    /// The decisions the next step comes after: a plan to revise is the step just behind.
    fn target(&self) -> usize {
        self.turns
            .saturating_sub(usize::from(self.revision.is_some()))
    }
}

/// The last entry of `v` made after at most `turns` decisions.
fn last_at<T>(v: &[(usize, T)], turns: usize) -> Option<&T> {
    v.iter().rev().find(|(t, _)| *t <= turns).map(|(_, x)| x)
}

/// A place in the script: the frames of the walk, outermost first. Frame 0 is the index of the
/// next step in `steps`; every later frame is the case taken at the `branch` step just before
/// its parent frame's index (`None`: no case matched, nothing to walk) and the index of the next
/// step in that case. No frames: the script is walked to its end.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Place {
    /// Decision steps passed on the way here.
    passed: usize,
    frames: Vec<(Option<String>, usize)>,
}

/// The scripted brain's memory of one run (kept in the engine's [`super::Memo`] and in the
/// run's snapshots): the journal folded up to `seq`, and where in the script the latest walk
/// stopped. A decision folds the new events in and walks on from `at`, so it costs the same
/// however long the journal.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptMemo {
    /// The digest of the script walked ([`Script::digest`]): with another script the memo is
    /// of no use, and the whole journal is read again.
    script: String,
    /// The last journal seq folded into `history`.
    seq: u64,
    history: History,
    /// Where the latest walk stopped: in front of the step it found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    at: Option<Place>,
}

impl ScriptMemo {
    /// Whether this memo was made with `script`.
    pub fn fits(&self, script: &Script) -> bool {
        self.script == script.digest
    }

    /// Whether this memo holds the journal up to `seq` (a snapshot's) and knows where the run
    /// stands: a snapshot's memo must, for a resume to read only the events after it.
    pub fn covers(&self, seq: u64) -> bool {
        self.seq == seq && self.at.is_some()
    }

    /// Whether the next walk can start where this memo says the run stands in `script` (a
    /// damaged or mistaken memo cannot): checked before a resume relies on it, so that it reads
    /// the whole journal instead of failing the run.
    pub fn walks(&self, script: &Script) -> bool {
        walk(
            script,
            &self.history,
            self.at.as_ref(),
            self.history.target(),
        )
        .is_ok()
    }

    /// What a snapshot stores: the history without what no later walk needs.
    fn pruned(&self) -> ScriptMemo {
        let passed = self.at.as_ref().map_or(0, |p| p.passed);
        ScriptMemo {
            history: self.history.pruned(passed),
            ..self.clone()
        }
    }
}

/// The memo in `slot` brought up to the end of `journal`: made afresh from the journal when
/// there is none or it is of another script (the journal must then be whole).
fn catch_up<'m>(
    slot: &'m mut Option<ScriptMemo>,
    script: &Script,
    journal: &[JournalEvent],
) -> Result<&'m mut ScriptMemo, Error> {
    let first = journal.first().map(|e| e.seq);
    let usable = slot
        .as_ref()
        .is_some_and(|m| m.fits(script) && first.is_none_or(|f| f <= m.seq + 1));
    if !usable {
        if first.is_some_and(|f| f != 1) {
            return Err(Error::Script(format!(
                "the run was resumed from a snapshot (journal from seq {}) that does not fit this \
                 script; its whole journal must be read (a bug: please report it)",
                first.unwrap_or_default()
            )));
        }
        *slot = Some(ScriptMemo {
            script: script.digest.clone(),
            seq: 0,
            history: History {
                whole: true,
                ..History::default()
            },
            at: None,
        });
    }
    let Some(memo) = slot.as_mut() else {
        unreachable!("set just above")
    };
    let from = journal.partition_point(|e| e.seq <= memo.seq);
    for e in &journal[from..] {
        memo.history.apply(e);
        memo.seq = e.seq;
    }
    Ok(memo)
}

/// The step lists of the frames of `place` in `script` (`None` if the script has no such place).
fn resolve<'s>(script: &'s Script, place: &Place) -> Option<Vec<(&'s [Step], usize)>> {
    let mut stack: Vec<(&'s [Step], usize)> = Vec::with_capacity(place.frames.len());
    for (depth, (case, next)) in place.frames.iter().enumerate() {
        let steps: &'s [Step] = if depth == 0 {
            if case.is_some() {
                return None;
            }
            &script.steps
        } else {
            let (parent, at) = stack.last()?;
            let Step::Branch { branch } = parent.get(at.checked_sub(1)?)? else {
                return None;
            };
            match case {
                Some(c) => branch.get(c)?,
                None => &[],
            }
        };
        if *next > steps.len() {
            return None;
        }
        stack.push((steps, *next));
    }
    Some(stack)
}

/// Walks `script` from `from` (or its top) past `turns` decision steps, to the step of the next
/// decision. Returns where the walk had `keep` steps behind it (the place the next walk starts
/// from), the step found (none at the end of the script) and the steps passed before it.
///
/// `keep` is one decision less than the journal holds: a later walk may have to stop one step
/// earlier (a plan sent back for changes is the step behind), and a `branch` met after the last
/// decision is decided by the latest answer, which may still arrive (the answer to a question
/// just asked comes with the same number of decisions behind it). Both lie after that place, so
/// the next walk goes over them again; branches before it are settled, since every later answer
/// comes after more decisions.
fn walk<'s>(
    script: &'s Script,
    history: &History,
    from: Option<&Place>,
    turns: usize,
) -> Result<(Place, Option<&'s Step>, usize), Error> {
    let keep = history.turns.saturating_sub(1).min(turns);
    let resumed = from
        .filter(|p| p.passed <= keep)
        .and_then(|p| Some((resolve(script, p)?, p)));
    let (mut stack, mut cases, mut passed) = match resumed {
        Some((stack, p)) => (
            stack,
            p.frames.iter().map(|f| f.0.clone()).collect(),
            p.passed,
        ),
        None if history.whole => (vec![(script.steps.as_slice(), 0)], vec![None], 0),
        None => {
            return Err(Error::Script(
                "the run's snapshot does not say where it stands in the script; its whole \
                 journal must be read (a bug: please report it)"
                    .into(),
            ));
        }
    };
    let place = |stack: &[(&[Step], usize)], cases: &[Option<String>], passed| Place {
        passed,
        frames: cases
            .iter()
            .cloned()
            .zip(stack.iter().map(|(_, i)| *i))
            .collect(),
    };
    let mut mark = (passed == keep).then(|| place(&stack, &cases, passed));
    while let Some((steps, i)) = stack.last_mut() {
        let Some(step) = steps.get(*i) else {
            stack.pop();
            cases.pop();
            continue;
        };
        match step {
            Step::Branch { branch } => {
                *i += 1;
                let (case, steps) = pick(branch, history.answer_at(passed));
                stack.push((steps, 0));
                cases.push(case.map(str::to_owned));
            }
            Step::Finish { .. } | Step::Fail { .. } => {
                let at = mark.unwrap_or_else(|| place(&stack, &cases, passed));
                return Ok((at, Some(step), passed));
            }
            _ if passed < turns => {
                *i += 1;
                passed += 1;
                if passed == keep {
                    mark = Some(place(&stack, &cases, passed));
                }
            }
            _ => {
                let at = mark.unwrap_or_else(|| place(&stack, &cases, passed));
                return Ok((at, Some(step), passed));
            }
        }
    }
    if passed < turns {
        return Err(Error::Script(format!(
            "the journal holds {} decisions but the script has only {passed} on this path; \
             was script.yaml changed during the run?",
            history.turns
        )));
    }
    let at = mark.unwrap_or_else(|| place(&stack, &cases, passed));
    Ok((at, None, passed))
}

struct Templates<'a> {
    task: &'a str,
    run_id: String,
    answer: Option<&'a Answer>,
    observation: Option<&'a str>,
    /// The reference of the latest sensitive answer, for `${secret}`.
    secret: Option<&'a str>,
}

impl Templates<'_> {
    /// The value of `${name}`, or `None` for a name that is no template.
    fn value(&self, name: &str) -> Option<Cow<'_, str>> {
        if let Some(field) = name.strip_prefix("answer.") {
            if let Some(id) = self.answer.and_then(|a| a.sealed) {
                // Sensitive: a reference only the tool runner resolves.
                let whole = secret_ref(id);
                return Some(Cow::Owned(format!(
                    "{}.{field}}}}}",
                    &whole[..whole.len() - 2]
                )));
            }
            // A field of a typed answer: a string as it is, anything else as JSON.
            let v = self
                .answer
                .and_then(|a| a.data.as_ref())
                .and_then(|d| d.get(field));
            return Some(match v {
                None => Cow::Borrowed(""),
                Some(Value::String(s)) => Cow::Borrowed(s.as_str()),
                Some(other) => Cow::Owned(other.to_string()),
            });
        }
        Some(Cow::Borrowed(match name {
            "task" => self.task,
            "run_id" => &self.run_id,
            "answer" => self
                .answer
                .and_then(|a| a.text.as_deref().or(a.option_id.as_deref()))
                .unwrap_or(""),
            "option" => self
                .answer
                .and_then(|a| a.option_id.as_deref())
                .unwrap_or(""),
            "observation" => self.observation.unwrap_or(""),
            "secret" => self.secret.unwrap_or(""),
            _ => return None,
        }))
    }

    /// `s` with its templates replaced in one pass: what a template inserts (a task, a person's
    /// answer, a tool's output) is never searched for templates again, so text that says
    /// `${secret}` cannot pull a secret's reference into an argument.
    fn expand(&self, s: &str) -> String {
        let mut out = String::with_capacity(s.len());
        let mut rest = s;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            let Some(end) = after.find('}') else {
                out.push_str(&rest[start..]);
                return out;
            };
            match self.value(&after[..end]) {
                Some(v) => out.push_str(&v),
                None => out.push_str(&rest[start..start + 2 + end + 1]),
            }
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        out
    }

    fn expand_value(&self, v: &Value) -> Value {
        match v {
            Value::String(s) => Value::String(self.expand(s)),
            Value::Array(a) => Value::Array(a.iter().map(|x| self.expand_value(x)).collect()),
            Value::Object(o) => Value::Object(
                o.iter()
                    .map(|(k, x)| (k.clone(), self.expand_value(x)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
}

/// The branch case a given answer selects, by its key (`None`: no case, and no `default`).
fn pick<'s>(
    cases: &'s BTreeMap<String, Vec<Step>>,
    answer: Option<&Answer>,
) -> (Option<&'s str>, &'s [Step]) {
    let keys = answer
        .into_iter()
        .flat_map(|a| [a.option_id.as_deref(), a.text.as_deref()])
        .flatten();
    for k in keys {
        if let Some((c, steps)) = cases.get_key_value(k.trim()) {
            return (Some(c), steps);
        }
        if let Some((c, steps)) = cases.iter().find(|(c, _)| c.eq_ignore_ascii_case(k.trim())) {
            return (Some(c), steps);
        }
    }
    match cases.get_key_value("default") {
        Some((c, steps)) => (Some(c), steps),
        None => (None, &[]),
    }
}

impl ScriptedBrain {
    /// The memo of `view`'s run brought up to its journal, walked to the next decision: the
    /// step found, with the history to fill its templates from.
    fn next<R>(
        view: &View<'_>,
        then: impl FnOnce(&Script, &History, usize, Option<&Step>) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let Some(script) = &view.agent.script else {
            return Err(Error::Config("a scripted agent needs a script.yaml".into()));
        };
        let mut slot = view.memo.scripted();
        let memo = catch_up(&mut slot, script, view.journal)?;
        let (place, step, passed) = walk(
            script,
            &memo.history,
            memo.at.as_ref(),
            memo.history.target(),
        )?;
        memo.at = Some(place);
        then(script, &memo.history, passed, step)
    }
}

impl Brain for ScriptedBrain {
    fn remember(&self, view: View<'_>) -> Result<Option<Value>, Error> {
        Self::next(&view, |_, _, _, _| Ok(()))?;
        let slot = view.memo.scripted();
        let saved = slot
            .as_ref()
            .map(|m| super::SavedMemo::Scripted(m.pruned()));
        serde_json::to_value(saved)
            .map(Some)
            .map_err(|e| Error::Script(format!("the script's memo: {e}")))
    }

    async fn decide(&self, view: View<'_>) -> Result<Decision, Error> {
        Self::next(&view, |_, history, passed, step| {
            decision(&view, history, passed, step)
        })
    }
}

/// The decision of `step`, found after `passed` decisions, with its templates filled.
fn decision(
    view: &View<'_>,
    history: &History,
    passed: usize,
    step: Option<&Step>,
) -> Result<Decision, Error> {
    let Some(step) = step else {
        // Falling off the end of the script finishes with the last observation.
        return Ok(Decision::Finish {
            result: history
                .observations
                .last()
                .map(|(_, o)| o.clone())
                .unwrap_or_default(),
        });
    };
    let t = Templates {
        task: view.task,
        run_id: view.run_id.to_string(),
        answer: history.answer_at(passed),
        observation: last_at(&history.observations, passed).map(String::as_str),
        secret: last_at(&history.secrets, passed).map(String::as_str),
    };
    match step {
        Step::Finish { finish } => Ok(Decision::Finish {
            result: t.expand(finish),
        }),
        Step::Fail { fail } => Ok(Decision::Fail {
            error: t.expand(fail),
        }),
        Step::Think { think } => Ok(Decision::Act {
            thought: t.expand(think),
            calls: vec![],
        }),
        Step::Tool(ts) => {
            let args = Value::Object(
                ts.args
                    .iter()
                    .map(|(k, v)| (k.clone(), t.expand_value(v)))
                    .collect(),
            );
            Ok(Decision::Act {
                thought: ts
                    .thought
                    .as_deref()
                    .map(|s| t.expand(s))
                    .unwrap_or_else(|| format!("Calling {}", ts.tool)),
                calls: vec![ProposedCall {
                    tool: ts.tool.clone(),
                    args,
                }],
            })
        }
        Step::Ask { ask_human } => {
            let mut ask = ask_human.clone();
            ask.prompt = t.expand(&ask.prompt);
            let args = serde_json::to_value(&ask)
                .map_err(|e| Error::Script(format!("ask_human step: {e}")))?;
            Ok(Decision::Act {
                thought: format!("Asking a human: {}", ask.prompt),
                calls: vec![ProposedCall {
                    tool: ASK_HUMAN.into(),
                    args,
                }],
            })
        }
        Step::Plan { plan, revise } => {
            let expand = |steps: &[PlanStep], t: &Templates<'_>| -> Vec<PlanTask> {
                steps
                    .iter()
                    .zip(1..)
                    .map(|(p, index)| PlanTask {
                        index,
                        description: t.expand(&p.description),
                        tool: p.tool.clone(),
                        // The engine sets risks from the tools.
                        risk: RiskLevel::Low,
                    })
                    .collect()
            };
            let (thought, tasks) = match &history.revision {
                None => ("A plan".to_owned(), expand(plan, &t)),
                Some(Revision {
                    tasks: Some(tasks), ..
                }) => ("The plan as the person edited it".to_owned(), tasks.clone()),
                Some(Revision { answer, .. }) => {
                    let feedback = Templates {
                        answer: Some(answer),
                        ..t
                    };
                    let steps = revise.as_deref().unwrap_or(plan);
                    ("A revised plan".to_owned(), expand(steps, &feedback))
                }
            };
            Ok(Decision::Plan {
                thought: format!("{thought} of {} step(s)", tasks.len()),
                tasks,
            })
        }
        Step::Branch { .. } => Err(Error::Script("a walk stopped at a branch".into())),
    }
}
