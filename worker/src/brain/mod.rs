//! Brains decide the next step of a run from its journal.
//!
//! A brain is a pure function of the journal (the scripted one exactly, the LLM one as far as the
//! model is): it holds no per-run state, so any process can ask it about any run after a resume.
//! It only ever sees the journal, where sensitive answers are already `"***"`.

use std::future::Future;

use serde_json::Value;

use crate::agent::{Agent, BrainKind};
use delta_shared::protocol::{JournalEvent, PlanTask, RunId};

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

/// What a brain sees of a run.
#[derive(Clone, Copy, Debug)]
pub struct View<'a> {
    pub run_id: RunId,
    pub task: &'a str,
    pub journal: &'a [JournalEvent],
    pub agent: &'a Agent,
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
}

/// The brain an agent's config asks for.
pub enum AnyBrain {
    Scripted(scripted::ScriptedBrain),
    Openai(Box<openai::OpenAiBrain>),
}

impl AnyBrain {
    /// Builds the agent's brain. Fails when the OpenAI key variable is named but unset.
    pub fn for_agent(agent: &Agent) -> Result<AnyBrain, Error> {
        match agent.brain {
            BrainKind::Scripted => Ok(AnyBrain::Scripted(scripted::ScriptedBrain)),
            BrainKind::Openai => {
                openai::OpenAiBrain::new(agent).map(|b| AnyBrain::Openai(Box::new(b)))
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
}
