//! The scripted brain: walks `script.yaml`, taking branches from the answers in the journal.
//!
//! Its position is derived, never stored: the number of decisions already journaled (`THOUGHT`
//! and `PLAN` events) says how many turn-taking steps are behind it, and each `branch` on the way
//! is decided by the last answer received before that point. Replaying a journal therefore puts
//! the brain exactly where it was, in any process.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde_json::Value;

use super::{Brain, Decision, Error, ProposedCall, View, parse_tasks};
use crate::agent::ASK_HUMAN;
use crate::script::{PlanStep, Step};
use delta_protocol::{Event, OptionAction, PlanTask, RequestId, RiskLevel};

/// Deterministic brain of `brain: scripted` agents.
#[derive(Clone, Copy, Debug, Default)]
pub struct ScriptedBrain;

/// An answer as the script sees it.
#[derive(Clone, Debug)]
struct Answer {
    option_id: Option<String>,
    /// The text, or a `{{secret:…}}` reference when the request was sensitive; of a typed
    /// answer, its `data` as JSON.
    text: Option<String>,
    /// A typed answer's object (not kept when sensitive), for `${answer.<field>}`.
    data: Option<Value>,
    /// A sensitive typed answer's request: `${answer.<field>}` is `{{secret:<id>.<field>}}`.
    sealed: Option<RequestId>,
}

/// A "modify" answer to the plan of the last decision: the plan step is to plan again.
#[derive(Clone, Debug)]
struct Revision {
    /// The answer, whose text is the person's feedback.
    answer: Answer,
    /// The person's own task list (`data.tasks`), if they sent one.
    tasks: Option<Vec<PlanTask>>,
}

/// What the journal says, turn by turn.
#[derive(Debug, Default)]
struct History {
    /// Steps of the script behind the run: `THOUGHT`s and first-round `PLAN`s (a revised plan
    /// is the same step again).
    turns: usize,
    /// Set when the last decision is a plan that a person asked to modify.
    revision: Option<Revision>,
    /// `(turns before it, answer)`, in journal order.
    answers: Vec<(usize, Answer)>,
    /// `(turns before it, observation)`, in journal order.
    observations: Vec<(usize, String)>,
    /// `(turns before it, {{secret:…}} reference)` of each sensitive answer, in journal order.
    secrets: Vec<(usize, String)>,
}

/// How a tool gets a sensitive answer: the engine swaps this reference for the secret.
pub fn secret_ref(request_id: RequestId) -> String {
    format!("{{{{secret:{request_id}}}}}")
}

impl History {
    fn from(view: &View<'_>) -> History {
        let mut h = History::default();
        let mut sensitive = std::collections::HashSet::new();
        let mut plan_requests = std::collections::HashSet::new();
        let mut typed = std::collections::HashSet::new();
        for e in view.journal {
            match &e.event {
                Event::Thought(_) => {
                    h.turns += 1;
                    h.revision = None;
                }
                Event::Plan(p) => {
                    if p.round <= 1 {
                        h.turns += 1;
                    }
                    h.revision = None;
                }
                Event::HumanInputRequest(q) => {
                    if q.is_sensitive() {
                        sensitive.insert(q.request_id);
                    }
                    if q.is_plan_confirmation() {
                        plan_requests.insert(q.request_id);
                    }
                    if q.response_schema.is_some() {
                        typed.insert(q.request_id);
                    }
                }
                Event::HumanInputReceived(r) => {
                    let is_typed = typed.contains(&r.request_id);
                    let data = r.data.clone().filter(|_| is_typed);
                    let text = if sensitive.contains(&r.request_id) {
                        h.secrets.push((h.turns, secret_ref(r.request_id)));
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
                        data: data.clone().filter(|_| !sensitive.contains(&r.request_id)),
                        sealed: data
                            .filter(|_| sensitive.contains(&r.request_id))
                            .map(|_| r.request_id),
                    };
                    if plan_requests.contains(&r.request_id)
                        && r.action == OptionAction::RetryWithFeedback
                    {
                        h.revision = Some(Revision {
                            answer: answer.clone(),
                            tasks: r
                                .data
                                .as_ref()
                                .and_then(|d| d.get("tasks"))
                                .and_then(|t| parse_tasks(t).ok()),
                        });
                    }
                    h.answers.push((h.turns, answer));
                }
                Event::ActionResult(r) => h
                    .observations
                    .push((h.turns, r.observation_content.clone())),
                _ => {}
            }
        }
        h
    }

    /// The last answer received after at most `turns` decisions.
    fn answer_at(&self, turns: usize) -> Option<&Answer> {
        self.answers
            .iter()
            .rev()
            .find(|(t, _)| *t <= turns)
            .map(|(_, a)| a)
    }
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

/// The branch case a given answer selects.
fn pick<'s>(cases: &'s BTreeMap<String, Vec<Step>>, answer: Option<&Answer>) -> &'s [Step] {
    let keys = answer
        .into_iter()
        .flat_map(|a| [a.option_id.as_deref(), a.text.as_deref()])
        .flatten();
    for k in keys {
        if let Some(steps) = cases.get(k.trim()) {
            return steps;
        }
        if let Some((_, steps)) = cases.iter().find(|(c, _)| c.eq_ignore_ascii_case(k.trim())) {
            return steps;
        }
    }
    cases.get("default").map(Vec::as_slice).unwrap_or(&[])
}

impl Brain for ScriptedBrain {
    async fn decide(&self, view: View<'_>) -> Result<Decision, Error> {
        let Some(script) = &view.agent.script else {
            return Err(Error::Config("a scripted agent needs a script.yaml".into()));
        };
        let history = History::from(&view);
        // A plan to revise is the step just behind: walk up to it again.
        let turns = history
            .turns
            .saturating_sub(usize::from(history.revision.is_some()));
        let mut passed = 0usize;
        // A stack of step lists being walked, with the index of the next step in each.
        let mut stack: Vec<(&[Step], usize)> = vec![(&script.steps, 0)];
        while let Some((steps, i)) = stack.last_mut() {
            let Some(step) = steps.get(*i) else {
                stack.pop();
                continue;
            };
            *i += 1;
            if let Step::Branch { branch } = step {
                stack.push((pick(branch, history.answer_at(passed)), 0));
                continue;
            }
            let t = Templates {
                task: view.task,
                run_id: view.run_id.to_string(),
                answer: history.answer_at(passed),
                observation: history
                    .observations
                    .iter()
                    .rev()
                    .find(|(t, _)| *t <= passed)
                    .map(|(_, o)| o.as_str()),
                secret: history
                    .secrets
                    .iter()
                    .rev()
                    .find(|(t, _)| *t <= passed)
                    .map(|(_, r)| r.as_str()),
            };
            match step {
                Step::Finish { finish } => {
                    return Ok(Decision::Finish {
                        result: t.expand(finish),
                    });
                }
                Step::Fail { fail } => {
                    return Ok(Decision::Fail {
                        error: t.expand(fail),
                    });
                }
                _ if passed < turns => {
                    passed += 1;
                    continue;
                }
                Step::Think { think } => {
                    return Ok(Decision::Act {
                        thought: t.expand(think),
                        calls: vec![],
                    });
                }
                Step::Tool(ts) => {
                    let args = Value::Object(
                        ts.args
                            .iter()
                            .map(|(k, v)| (k.clone(), t.expand_value(v)))
                            .collect(),
                    );
                    return Ok(Decision::Act {
                        thought: ts
                            .thought
                            .as_deref()
                            .map(|s| t.expand(s))
                            .unwrap_or_else(|| format!("Calling {}", ts.tool)),
                        calls: vec![ProposedCall {
                            tool: ts.tool.clone(),
                            args,
                        }],
                    });
                }
                Step::Ask { ask_human } => {
                    let mut ask = ask_human.clone();
                    ask.prompt = t.expand(&ask.prompt);
                    let args = serde_json::to_value(&ask)
                        .map_err(|e| Error::Script(format!("ask_human step: {e}")))?;
                    return Ok(Decision::Act {
                        thought: format!("Asking a human: {}", ask.prompt),
                        calls: vec![ProposedCall {
                            tool: ASK_HUMAN.into(),
                            args,
                        }],
                    });
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
                    return Ok(Decision::Plan {
                        thought: format!("{thought} of {} step(s)", tasks.len()),
                        tasks,
                    });
                }
                Step::Branch { .. } => unreachable!("handled above"),
            }
        }
        if passed < turns {
            return Err(Error::Script(format!(
                "the journal holds {} decisions but the script has only {passed} on this path; \
                 was script.yaml changed during the run?",
                history.turns
            )));
        }
        // Falling off the end of the script finishes with the last observation.
        Ok(Decision::Finish {
            result: history
                .observations
                .last()
                .map(|(_, o)| o.clone())
                .unwrap_or_default(),
        })
    }
}
