//! Brains decide the next step of a run from its journal.
//!
//! A brain is a pure function of the journal (the scripted one exactly, the LLM one as far as the
//! model is): it holds no per-run state, so any process can ask it about any run after a resume.
//! It only ever sees the journal, where sensitive answers are already `"***"`.
//!
//! What a brain derives from the journal it may keep in the run's [`Memo`], which the engine
//! holds for the run and stores in its snapshots ([`Brain::remember`]): the scripted brain keeps
//! its place in the script there, so that a decision costs the same at the 10,000th event as at
//! the 10th, and a resume from a snapshot needs only the events after it. The memo is derived
//! data: from the whole journal the brain rebuilds it, and decides the same.

use std::future::Future;

use serde_json::Value;

use crate::agent::{Agent, BrainKind};
use delta_protocol::{JournalEvent, PlanTask, RiskLevel, RunId};

pub mod openai;
pub mod scripted;

/// A tool call the brain wants; the engine gives it its action id.
#[derive(Clone, Debug, PartialEq)]
pub struct ProposedCall {
    pub tool: String,
    pub args: Value,
}

/// What the brain decided.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Think, and call these tools in order (none: a pure thought).
    Act {
        thought: String,
        calls: Vec<ProposedCall>,
    },
    /// Lay out a plan (journaled as `PLAN`).
    Plan {
        thought: String,
        tasks: Vec<PlanTask>,
    },
    Finish {
        result: String,
    },
    Fail {
        error: String,
    },
}

/// What a brain remembers of one run between decisions (and, through a snapshot, between
/// processes). Held by the engine; each brain uses its own part.
#[derive(Debug, Default)]
pub struct Memo {
    scripted: std::sync::Mutex<Option<scripted::ScriptMemo>>,
}

/// A memo as a snapshot stores it: `{"scripted": …}`.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum SavedMemo {
    Scripted(scripted::ScriptMemo),
}

impl Memo {
    /// The memo a snapshot stored (`None`, or one that does not read, gives an empty memo).
    pub fn restore(saved: Option<&Value>) -> Memo {
        let scripted = match saved.map(|v| serde_json::from_value::<SavedMemo>(v.clone())) {
            Some(Ok(SavedMemo::Scripted(m))) => Some(m),
            _ => None,
        };
        Memo {
            scripted: std::sync::Mutex::new(scripted),
        }
    }

    /// Whether a resume of `agent` can go on from `snapshot` and the events after it: its brain
    /// keeps what it needs in the snapshot, made with this very script, up to the snapshot's
    /// seq, at a place of the script the next walk can start from.
    /// Otherwise the host reads the whole journal ([`delta_store::RunStore::load`]).
    pub fn fits(agent: &Agent, snapshot: &delta_protocol::journal::Snapshot) -> bool {
        let (BrainKind::Scripted, Some(script), Some(saved)) =
            (agent.brain, &agent.script, &snapshot.brain)
        else {
            return false;
        };
        match serde_json::from_value::<SavedMemo>(saved.clone()) {
            Ok(SavedMemo::Scripted(m)) => {
                m.fits(script) && m.covers(snapshot.seq) && m.walks(script)
            }
            Err(_) => false,
        }
    }

    fn scripted(&self) -> std::sync::MutexGuard<'_, Option<scripted::ScriptMemo>> {
        self.scripted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// What a brain sees of a run.
#[derive(Clone, Copy, Debug)]
pub struct View<'a> {
    pub run_id: RunId,
    pub task: &'a str,
    /// The journal: whole, or the events after the snapshot the run was resumed from (the brain
    /// then finds the rest in `memo`).
    pub journal: &'a [JournalEvent],
    /// What the brain remembers of this run.
    pub memo: &'a Memo,
    pub agent: &'a Agent,
    /// The run's work directory (`${CWD}` of `context.yaml`, where its generators run).
    pub work_dir: &'a std::path::Path,
    /// Stops a `context.yaml` generator when the host stops.
    pub cancel: &'a tokio_util::sync::CancellationToken,
}

/// A task list as a person (`data.tasks` of a plan "modify") or an LLM (the `plan` tool) writes
/// it: a JSON list whose items are `"description"` or `{"description": "…", "tool": "…"}`.
/// Indexes are numbered from 1; risks are left `low` for the engine to set from the tools.
pub fn parse_tasks(v: &Value) -> Result<Vec<PlanTask>, String> {
    const EXPECTED: &str = "a task list is a JSON list of tasks, e.g. \
         [{\"description\": \"check the key\", \"tool\": \"check_key\"}, \"tell the team\"]";
    let Value::Array(items) = v else {
        return Err(format!("{EXPECTED}; got {}", short_json(v)));
    };
    let mut tasks = vec![];
    for (item, index) in items.iter().zip(1..) {
        let (description, tool) = match item {
            Value::String(s) => (s.clone(), None),
            Value::Object(o) => {
                if let Some(k) = o.keys().find(|k| *k != "description" && *k != "tool") {
                    return Err(format!("task {index}: unknown field `{k}`; {EXPECTED}"));
                }
                let description = o
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                let tool = match o.get("tool") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(t)) => Some(t.clone()),
                    Some(other) => {
                        return Err(format!(
                            "task {index}: `tool` must be a tool name, got {}",
                            short_json(other)
                        ));
                    }
                };
                (description, tool)
            }
            other => {
                return Err(format!("task {index} is {}; {EXPECTED}", short_json(other)));
            }
        };
        if description.trim().is_empty() {
            return Err(format!("task {index} has no description; {EXPECTED}"));
        }
        tasks.push(PlanTask {
            index,
            description,
            tool,
            risk: RiskLevel::Low,
        });
    }
    if tasks.is_empty() {
        return Err(format!("the task list is empty; {EXPECTED}"));
    }
    Ok(tasks)
}

fn short_json(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 80 {
        format!("{}…", s.chars().take(80).collect::<String>())
    } else {
        s
    }
}

/// A brain that could not decide (after its own retries).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the LLM endpoint failed: {0}")]
    Llm(String),
    #[error("the LLM endpoint's answer could not be used: {0}")]
    BadResponse(String),
    #[error("configuration: {0}")]
    Config(String),
    #[error("the script and the journal disagree: {0}")]
    Script(String),
}

/// Decides steps. One implementation per kind of brain.
pub trait Brain: Send + Sync {
    fn decide(&self, view: View<'_>) -> impl Future<Output = Result<Decision, Error>> + Send;

    /// The request the next decision would send to an LLM, for a `pre_llm_req` hook to see
    /// and replace; `None` for a brain that sends none.
    fn request(
        &self,
        _view: View<'_>,
    ) -> impl Future<Output = Result<Option<Value>, Error>> + Send {
        async { Ok(None) }
    }

    /// Decides by sending `request` (from [`Brain::request`], as a hook left it); returns the
    /// decision and the LLM's raw response (for a `post_llm_resp` hook).
    fn decide_request(
        &self,
        view: View<'_>,
        _request: Value,
    ) -> impl Future<Output = Result<(Decision, Option<Value>), Error>> + Send {
        async move { self.decide(view).await.map(|d| (d, None)) }
    }

    /// The brain's memory of the run brought up to the end of `view.journal`, as a snapshot
    /// stores it; `None` for a brain that reads the whole journal at each decision anyway (a
    /// snapshot is then of no use to it, and none is written).
    fn remember(&self, view: View<'_>) -> Result<Option<Value>, Error> {
        let _ = view;
        Ok(None)
    }
}

/// The brain an agent's config asks for.
pub enum AnyBrain {
    Scripted(scripted::ScriptedBrain),
    Openai(Box<openai::OpenAiBrain>),
}

impl AnyBrain {
    /// Builds the agent's brain. Fails when the OpenAI key variable is named but unset.
    pub fn for_agent(agent: &Agent) -> Result<AnyBrain, Error> {
        Self::for_agent_with(agent, &|name| std::env::var(name).ok())
    }

    /// As [`AnyBrain::for_agent`], reading the LLM's variables (key, `DELTA_BASE_URL`) through
    /// `env` (`delta run` adds Delta Engine's `.env` files to the process's environment).
    pub fn for_agent_with(
        agent: &Agent,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<AnyBrain, Error> {
        match agent.brain {
            BrainKind::Scripted => Ok(AnyBrain::Scripted(scripted::ScriptedBrain)),
            BrainKind::Openai => {
                openai::OpenAiBrain::with_env(agent, env).map(|b| AnyBrain::Openai(Box::new(b)))
            }
        }
    }
}

impl Brain for AnyBrain {
    async fn decide(&self, view: View<'_>) -> Result<Decision, Error> {
        match self {
            AnyBrain::Scripted(b) => b.decide(view).await,
            AnyBrain::Openai(b) => b.decide(view).await,
        }
    }

    async fn request(&self, view: View<'_>) -> Result<Option<Value>, Error> {
        match self {
            AnyBrain::Scripted(b) => b.request(view).await,
            AnyBrain::Openai(b) => b.request(view).await,
        }
    }

    async fn decide_request(
        &self,
        view: View<'_>,
        request: Value,
    ) -> Result<(Decision, Option<Value>), Error> {
        match self {
            AnyBrain::Scripted(b) => b.decide_request(view, request).await,
            AnyBrain::Openai(b) => b.decide_request(view, request).await,
        }
    }

    fn remember(&self, view: View<'_>) -> Result<Option<Value>, Error> {
        match self {
            AnyBrain::Scripted(b) => b.remember(view),
            AnyBrain::Openai(b) => b.remember(view),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn task_lists_are_strings_or_objects() {
        let tasks = parse_tasks(&json!(["look", {"description": "deploy", "tool": "deploy"}]))
            .expect("valid");
        assert_eq!(tasks.len(), 2);
        assert_eq!(
            (tasks[1].index, tasks[1].tool.as_deref()),
            (2, Some("deploy"))
        );
        for (bad, says) in [
            (json!("deploy it"), "a task list is a JSON list"),
            (json!({"tasks": []}), "a task list is a JSON list"),
            (json!([]), "empty"),
            (json!([3]), "task 1 is 3"),
            (json!([{"description": " "}]), "no description"),
            (
                json!([{"description": "x", "risk": "low"}]),
                "unknown field `risk`",
            ),
            (
                json!([{"description": "x", "tool": 1}]),
                "must be a tool name",
            ),
        ] {
            let err = parse_tasks(&bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }
}
