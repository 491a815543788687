//! The engine: advances one run from its journal until it must stop, and says why.
//!
//! ```text
//! advance(answer?) -> Outcome::{Completed, Failed, Cancelled, Paused(request), Interrupted}
//! ```
//!
//! It never blocks on a human: a question is journaled and returned as `Paused`, and what happens
//! then is the host's business (prompt on a terminal, write the mailbox, publish on NATS). Resume is
//! replay: the journal says which call of the brain's last decision is unfinished; an unfinished
//! `ask_human` (or gated call) takes the answer, an unfinished idempotent tool runs again, and an
//! unfinished non-idempotent tool becomes a `TOOL_APPROVAL` ("this may already have run").
//!
//! Writes are batched: events are buffered and committed in one store call right before anything
//! that must not be lost or repeated (a tool's side effect, a slow LLM call, a pause, the end), so
//! a run costs a handful of store round trips however many events it journals. Whatever was
//! buffered but not committed when a process dies is re-derived on replay, because every decision
//! before a side effect is deterministic from the committed journal.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::agent::{ASK_HUMAN, Agent, BrainKind};
use crate::brain::scripted::secret_ref;
use crate::brain::{Brain, Decision, Memo, View, parse_tasks};
use crate::grants;
use crate::policy::Effect;
use crate::script::AskHuman;
use crate::tools::{self, Approval, Tool, ToolEnv};
use delta_protocol::journal::{NextCall, Replay, SNAPSHOT_FORMAT, Snapshot};
use delta_protocol::schema::{FieldKind, ResponseSchema};
use delta_protocol::{
    AcceptedAnswer, ActionRequest, ActionResult, ActionStatus, EngineEnd, EngineStart, Event,
    InputType, InteractionOption, InteractionRequest, InteractionResponse, InteractionType,
    JournalEvent, MessageLevel, OptionAction, Plan, PlanTask, RequestId, Responder, ResponseError,
    RiskLevel, RunStatus, SystemMessage, Thought, Timestamp, ToolCall, Via, args_diff,
};
use delta_store::{self as store, RunRecord, RunStore, StatusChange, StoredRun, Terminal};

/// Why `advance` stopped.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Completed {
        result: String,
    },
    Failed {
        error: String,
    },
    Cancelled {
        reason: String,
    },
    /// Waiting for a human; the request is journaled.
    Paused(Box<InteractionRequest>),
    /// Stopped by the host (signal); checkpointed as `INTERRUPTED`, resumable.
    Interrupted,
}

impl Outcome {
    /// The run status this outcome leaves behind.
    pub fn status(&self) -> RunStatus {
        match self {
            Outcome::Completed { .. } => RunStatus::Completed,
            Outcome::Failed { .. } => RunStatus::Failed,
            Outcome::Cancelled { .. } => RunStatus::Cancelled,
            Outcome::Paused(_) => RunStatus::WaitingForInput,
            Outcome::Interrupted => RunStatus::Interrupted,
        }
    }
}

/// What stops `advance` without an outcome.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The store refused or failed; nothing after the last committed event happened.
    #[error(transparent)]
    Store(#[from] store::Error),
    /// The answer was refused; nothing was written.
    #[error(transparent)]
    Answer(#[from] ResponseError),
}

/// What to do with a question.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PauseMode {
    /// Journal `ENGINE_END(WAITING_FOR_INPUT)` and park the run (mailbox, fleet).
    Park,
    /// Keep the run `RUNNING`: the host asks right away and calls `advance` again (`-i`).
    Hold,
}

/// How this host runs the engine.
#[derive(Clone, Debug)]
pub struct Settings {
    /// `local`, or the worker's id.
    pub worker: String,
    /// Where tools run.
    pub work_dir: PathBuf,
    pub pause: PauseMode,
}

type Observer = Arc<dyn Fn(&JournalEvent) + Send + Sync>;

/// One run being advanced by one process.
pub struct Engine<'a, S, B> {
    agent: &'a Agent,
    brain: &'a B,
    store: &'a S,
    settings: Settings,
    cancel: CancellationToken,
    record: RunRecord,
    /// Committed events, then the provisional (buffered) ones: the whole journal, or the events
    /// after the snapshot the run was resumed from.
    journal: Vec<JournalEvent>,
    /// The seq of the last event before `journal` (the snapshot's; 0 for a whole journal).
    base_seq: u64,
    /// The seq of the latest snapshot stored (or resumed from).
    snapshot_seq: u64,
    /// Hook calls and grant notes journaled before `journal` (the snapshot's).
    base_hook_calls: u64,
    base_grants: Vec<String>,
    /// What the brain remembers of the run.
    memo: Memo,
    /// How many events of `journal` are committed.
    committed: usize,
    replay: Replay,
    /// Whether this process has journaled its `ENGINE_START`.
    started: bool,
    /// Sensitive answers received by this process, by request: they reach tools, nothing else.
    secrets: HashMap<RequestId, String>,
    /// Called with every committed event (the CLI prints them).
    observer: Option<Observer>,
    /// When the answer given to `advance` was accepted (by the gateway), if earlier than now:
    /// its deadline is checked against that moment, not against when a worker got to it.
    answered_at: Option<Timestamp>,
    /// A request the store already closed as expired (the gateway's clock decided).
    expired: Option<RequestId>,
    /// The stored answer a resumed engine applies first ([`Engine::resumed`]).
    resume_answer: Option<InteractionResponse>,
    /// Hook calls so far in this run (numbers each call's I/O directory).
    hook_calls: u64,
}

/// A snapshot is stored at each pause and interruption, and at least every this many events.
const SNAPSHOT_EVERY: u64 = 256;

/// How a hook's call is journaled: `SYSTEM_MESSAGE` whose content starts so.
const HOOK_PREFIX: &str = "hook ";

/// The longest a hook may run while the host is stopping (milliseconds).
const STOPPING_HOOK_MS: u64 = 5_000;

/// The observation a tool sees in place of a sensitive value, should it echo one.
const MASK: &str = "***";

/// What an answer is checked against beyond the question's own rules: the tools it may name, each
/// with its parameters. The engine takes it from the agent ([`AnswerSchema::of_tools`]); the
/// gateway from the question itself ([`AnswerSchema::of_request`]), which carries what it needs:
/// an approval its tool's `context.parameters`, a plan confirmation the agent's tool names in
/// `context.tools`. Both then run the same [`check_answer`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AnswerSchema {
    tools: BTreeMap<String, Vec<tools::ParamSpec>>,
}

impl AnswerSchema {
    /// The schema of an agent's tools.
    pub fn of_tools(tools: &BTreeMap<String, Tool>) -> Self {
        AnswerSchema {
            tools: tools
                .iter()
                .map(|(name, t)| (name.clone(), t.specs.clone()))
                .collect(),
        }
    }

    /// The schema a question carries, or `None` when it carries none it would need (a question
    /// asked by a worker older than these fields): then only the protocol's rules can be checked
    /// without the agent, and the engine's own check at resume is the only one of the rest.
    pub fn of_request(q: &InteractionRequest) -> Option<Self> {
        let mut tools = BTreeMap::new();
        if q.is_plan_confirmation() {
            let names = q.context.get("tools")?.as_array()?;
            for n in names {
                tools.insert(n.as_str()?.to_owned(), vec![]);
            }
        } else if q.kind == InteractionType::ToolApproval {
            let tool = q.context.get("tool")?.as_str()?;
            let params = q.context.get("parameters")?;
            let params: Vec<tools::ParamSpec> = serde_json::from_value(params.clone()).ok()?;
            tools.insert(tool.to_owned(), params);
        }
        Some(AnswerSchema { tools })
    }

    /// The parameters of `tool`, if the schema knows it.
    pub(crate) fn params(&self, tool: &str) -> Option<&[tools::ParamSpec]> {
        self.tools.get(tool).map(Vec::as_slice)
    }

    /// The tools' names, for an approval's or a plan's context.
    fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }
}

/// Checks an answer to the pending request `pending` as the engine applies it (at `now`): the
/// rules of the protocol ([`InteractionRequest::validate`]: the option, required input, the
/// deadline), then edited tool arguments (`data.args` of an approval) against the tool's
/// parameters in `schema`, and the edit of a plan ("modify": feedback, or `data.tasks` naming
/// known tools). Pure: the gateway runs it before it accepts an answer, the engine again when it
/// applies one (the agent may have changed in between), and the fuzzers run exactly this.
pub fn check_answer(
    pending: &InteractionRequest,
    schema: &AnswerSchema,
    resp: InteractionResponse,
    now: Timestamp,
) -> Result<AcceptedAnswer, ResponseError> {
    let accepted = pending.validate(resp, now)?;
    if accepted.action == OptionAction::ApproveAndExecute
        && let Some(edited) = accepted.response.data.as_ref().and_then(|d| d.get("args"))
    {
        let params = pending
            .context
            .get("tool")
            .and_then(Value::as_str)
            .and_then(|t| schema.tools.get(t))
            .filter(|_| pending.kind == InteractionType::ToolApproval)
            .ok_or_else(|| {
                ResponseError::InvalidArgs("this request has no tool arguments to edit".into())
            })?;
        tools::check_args(params, edited).map_err(ResponseError::InvalidArgs)?;
    }
    if pending.is_plan_confirmation() && accepted.action == OptionAction::RetryWithFeedback {
        check_plan_edit(schema, &accepted.response)?;
    }
    // A grant asked for with an approval (`data.grant`): checked as the engine will build it.
    let tool = pending.context.get("tool").and_then(Value::as_str);
    let grantable = pending.context.get("grantable") == Some(&Value::Bool(true));
    grants::grant_of(
        pending,
        tool.and_then(|t| schema.params(t)),
        grantable,
        &accepted,
        now,
    )?;
    Ok(accepted)
}

/// A "modify" of a plan needs feedback, or a task list in `data.tasks` naming known tools.
fn check_plan_edit(schema: &AnswerSchema, r: &InteractionResponse) -> Result<(), ResponseError> {
    let Some(tasks) = r.data.as_ref().and_then(|d| d.get("tasks")) else {
        let said = [&r.input, &r.feedback]
            .into_iter()
            .flatten()
            .any(|s| !s.trim().is_empty());
        return if said {
            Ok(())
        } else {
            Err(ResponseError::InputRequired(
                r.option_id.clone().unwrap_or_default(),
            ))
        };
    };
    let tasks =
        parse_tasks(tasks).map_err(|e| ResponseError::InvalidArgs(format!("data.tasks: {e}")))?;
    let unknown = tasks.iter().find_map(|t| {
        t.tool
            .as_deref()
            .filter(|n| !schema.tools.contains_key(*n))
            .map(|n| (t.index, n))
    });
    if let Some((index, tool)) = unknown {
        let known: Vec<&str> = schema.names().collect();
        return Err(ResponseError::InvalidArgs(format!(
            "data.tasks: task {index} names the unknown tool `{tool}`; the agent's tools: {}",
            known.join(", ")
        )));
    }
    Ok(())
}

impl<'a, S: RunStore, B: Brain> Engine<'a, S, B> {
    pub fn new(
        agent: &'a Agent,
        brain: &'a B,
        store: &'a S,
        run: StoredRun,
        settings: Settings,
        cancel: CancellationToken,
    ) -> Self {
        let (mut replay, base_seq, base_hook_calls, base_grants, memo) = match run.snapshot {
            Some(s) => (
                s.replay,
                s.seq,
                s.hook_calls,
                s.grants_noted,
                Memo::restore(s.brain.as_ref()),
            ),
            None => (Replay::default(), 0, 0, vec![], Memo::default()),
        };
        run.journal.iter().for_each(|e| replay.apply(e));
        if !run.record.status.is_terminal() {
            // The run's status is the source of truth: a failed run an operator put back in the
            // queue (a dead-lettered job retried) goes on from where its journal stops.
            replay.reopen();
        }
        Self {
            agent,
            brain,
            store,
            settings,
            cancel,
            record: run.record,
            committed: run.journal.len(),
            journal: run.journal,
            base_seq,
            snapshot_seq: base_seq,
            base_hook_calls,
            base_grants,
            memo,
            replay,
            started: false,
            secrets: HashMap::new(),
            observer: None,
            answered_at: None,
            expired: None,
            resume_answer: None,
            hook_calls: 0,
        }
        .count_hook_calls()
    }

    fn count_hook_calls(mut self) -> Self {
        self.hook_calls = self.base_hook_calls + self.journaled_hook_calls();
        self
    }

    /// Hook calls journaled in `journal` (the events after the snapshot, if any).
    fn journaled_hook_calls(&self) -> u64 {
        self.journal
            .iter()
            .filter(|e| {
                matches!(&e.event, Event::SystemMessage(m) if m.content.starts_with(HOOK_PREFIX))
            })
            .count() as u64
    }

    /// The ids of the grant notes journaled (before the snapshot and after it).
    fn grants_noted(&self) -> impl Iterator<Item = &str> {
        self.base_grants
            .iter()
            .map(String::as_str)
            .chain(self.journal.iter().filter_map(|e| match &e.event {
                Event::SystemMessage(m) => m.content.strip_prefix("grant ")?.split(' ').next(),
                _ => None,
            }))
    }

    /// What the brain sees of the run: the journal as this engine holds it.
    fn view(&self) -> View<'_> {
        View {
            run_id: self.record.run_id,
            task: &self.record.task,
            journal: &self.journal,
            memo: &self.memo,
            agent: self.agent,
            work_dir: &self.settings.work_dir,
            cancel: &self.cancel,
        }
    }

    /// A snapshot of the run as it stands with the buffered events, if one is due with
    /// `change` and the brain keeps what it needs in one.
    fn snapshot_for(&self, change: Option<&StatusChange>) -> Option<Snapshot> {
        let seq = self.replay.last_seq;
        let due = matches!(
            change,
            Some(StatusChange::Waiting(_) | StatusChange::Interrupted)
        ) || seq >= self.snapshot_seq + SNAPSHOT_EVERY;
        if !due || seq <= self.snapshot_seq || !self.store.keeps_snapshots() {
            return None;
        }
        self.snapshot()
    }

    /// A snapshot of the run as this engine holds it (with any buffered events): what it stores
    /// at a pause. `None` when the brain reads the whole journal anyway, or cannot say where
    /// the run stands.
    pub fn snapshot(&self) -> Option<Snapshot> {
        let seq = self.replay.last_seq;
        let view = self.view();
        let brain = match self.brain.remember(view) {
            Ok(Some(b)) => b,
            Ok(None) => return None,
            Err(e) => {
                tracing::debug!(error = %e, "no snapshot: the brain cannot say where the run stands");
                return None;
            }
        };
        Some(Snapshot {
            format: SNAPSHOT_FORMAT,
            seq,
            replay: self.replay.pruned(),
            hook_calls: self.base_hook_calls + self.journaled_hook_calls(),
            grants_noted: self.grants_noted().map(str::to_owned).collect(),
            brain: Some(brain),
            asked: None,
            requested: Vec::new(),
        })
    }

    /// Runs hook `kind` if the agent has it, journaling the call; `None` when it has none.
    async fn hook(
        &mut self,
        kind: crate::hooks::HookKind,
        payload: Value,
        cancel: &CancellationToken,
    ) -> Option<crate::hooks::HookOutcome> {
        let mut spec = self.agent.hooks.get(kind)?.clone();
        if self.cancel.is_cancelled() {
            // The host is stopping (a hook after the cancel, e.g. on_error): it may not hold it up
            // for long.
            let ms = spec.timeout_ms.unwrap_or(crate::hooks::DEFAULT_TIMEOUT_MS);
            spec.timeout_ms = Some(ms.min(STOPPING_HOOK_MS));
        }
        self.hook_calls += 1;
        let host = crate::hooks::HookHost {
            run_id: self.record.run_id.to_string(),
            work_dir: self.settings.work_dir.clone(),
            agent_home: self.agent.dir.clone(),
        };
        let out = host
            .run(kind, &spec, self.hook_calls, &payload, cancel)
            .await;
        let audit = self.mask(out.audit.clone());
        if !out.success {
            tracing::warn!(run_id = %self.record.run_id, hook = kind.name(), "{audit}");
        }
        self.push(Event::SystemMessage(SystemMessage {
            level: if out.success {
                MessageLevel::Info
            } else {
                MessageLevel::Warn
            },
            content: audit,
        }));
        Some(out)
    }

    /// `on_run_end` (and, for a failure, `on_error`) before the run's end is journaled.
    async fn end_hooks(&mut self, status: RunStatus, result: Option<&str>, error: Option<&str>) {
        use crate::hooks::HookKind;
        if status == RunStatus::Interrupted {
            // Not the run's end: it resumes (another worker, the next `delta run`).
            return;
        }
        let cancel = self.cancel.clone();
        if status == RunStatus::Failed {
            let payload = json!({
                "error_type": "FATAL_ERROR",
                "message": error.unwrap_or_default(),
                "context": {"iteration": self.replay.turns, "run_id": self.record.run_id},
            });
            self.hook(HookKind::OnError, payload, &cancel).await;
        }
        let payload = json!({
            "run_id": self.record.run_id,
            "status": status,
            "result": result,
            "error": error,
            "iterations": self.replay.turns,
        });
        self.hook(HookKind::OnRunEnd, payload, &cancel).await;
    }

    /// The answer [`Engine::advance_resumed`] applies.
    pub(crate) fn resume_with(&mut self, answer: Option<InteractionResponse>) {
        self.resume_answer = answer;
    }

    pub(crate) fn take_resume_answer(&mut self) -> Option<InteractionResponse> {
        self.resume_answer.take()
    }

    pub(crate) fn store(&self) -> &'a S {
        self.store
    }

    /// Journals (with the next commit) that `answer`, accepted elsewhere, was refused here.
    pub fn note_refusal(&mut self, answer: &InteractionResponse, why: &ResponseError) {
        self.push(Event::SystemMessage(SystemMessage {
            level: MessageLevel::Warn,
            content: format!(
                "the answer by {} to request {} was refused ({}): {why}; the question is open again",
                answer.responder.id,
                answer.request_id,
                why.code()
            ),
        }));
    }

    /// The answer about to be given was accepted at `at` (by a gateway): its deadline is
    /// checked against that moment.
    pub fn answered_at(&mut self, at: Timestamp) {
        self.answered_at = Some(at);
    }

    /// `request_id` expired in the store: the run applies its default option (or fails) even
    /// if this host's clock has not reached `expires_at` yet.
    pub fn expired(&mut self, request_id: RequestId) {
        self.expired = Some(request_id);
    }

    /// Calls `f` with every event as it is committed.
    pub fn observe(mut self, f: impl Fn(&JournalEvent) + Send + Sync + 'static) -> Self {
        self.observer = Some(Arc::new(f));
        self
    }

    /// Secrets a host kept from an earlier call (e.g. `-i` across questions).
    /// Keeps the input of a sensitive answer for the tools, whether or not the answer is already
    /// journaled (a redelivered resume job hands it over again).
    pub fn remember_sensitive(&mut self, answer: &InteractionResponse) {
        if let Some((q, _)) = self.replay.interaction(answer.request_id)
            && q.is_sensitive()
            && let Some(value) = secret_of(q, answer)
        {
            self.secrets.insert(answer.request_id, value);
        }
    }

    pub fn remember_secret(&mut self, request_id: RequestId, value: String) {
        self.secrets.insert(request_id, value);
    }

    pub fn journal(&self) -> &[JournalEvent] {
        &self.journal[..self.committed]
    }

    pub fn record(&self) -> &RunRecord {
        &self.record
    }

    /// The interaction the run waits on, if any.
    pub fn pending(&self) -> Option<&InteractionRequest> {
        self.replay.pending()
    }

    // -- journal plumbing ------------------------------------------------------------------

    fn push(&mut self, event: Event) {
        if !self.started {
            self.started = true;
            let start = Event::EngineStart(EngineStart {
                run_id: self.record.run_id,
                agent: self.record.agent.clone(),
                task: self.record.task.clone(),
                worker: self.settings.worker.clone(),
                attempt: self.replay.attempts + 1,
            });
            self.push_raw(start);
        }
        self.push_raw(event);
    }

    fn push_raw(&mut self, mut event: Event) {
        // Asking is the last step of building a request: what it shows is then fixed, and so is
        // its hash (as in `pause`, which stores the same request).
        if let Event::HumanInputRequest(q) = &mut event
            && q.request_hash.is_none()
        {
            q.seal_hash();
        }
        let e = JournalEvent {
            seq: self.base_seq + self.journal.len() as u64 + 1,
            timestamp: Timestamp::now(),
            event,
        };
        self.replay.apply(&e);
        self.journal.push(e);
    }

    /// Before a side effect that the run's writes do not fence (a hook, a grant used or made):
    /// that this engine's store handle may still write the run ([`RunStore::confirm`]: a run
    /// its job carried, ended or taken by another delivery since, is refused here, as at its
    /// first write).
    async fn confirm(&self) -> Result<(), Error> {
        Ok(self.store.confirm(self.record.run_id).await?)
    }

    /// Makes the buffered events durable, with `change` (or `RUNNING` if the run was not).
    async fn commit(&mut self, change: Option<StatusChange>) -> Result<(), Error> {
        let events: Vec<Event> = self.journal[self.committed..]
            .iter()
            .map(|e| e.event.clone())
            .collect();
        let change = change.or_else(|| {
            (self.started && self.record.status != RunStatus::Running)
                .then_some(StatusChange::Running)
        });
        if events.is_empty() && change.is_none() {
            return Ok(());
        }
        let snapshot = self.snapshot_for(change.as_ref());
        let stored = self
            .store
            .append_with_snapshot(
                self.record.run_id,
                events,
                change.clone(),
                snapshot.as_ref(),
            )
            .await?;
        // The store keeps a snapshot only when the journal ends at its seq.
        if let Some(s) = &snapshot
            && stored.last().map(|e| e.seq) == Some(s.seq)
        {
            self.snapshot_seq = s.seq;
        }
        if let Some(c) = &change {
            // As the store wrote it: the write's time is its events' (so `record()` is the
            // stored record, and the host need not read it back).
            let at = stored.last().map_or_else(Timestamp::now, |e| e.timestamp);
            c.apply_to(&mut self.record, at);
        }
        self.journal.truncate(self.committed);
        if let Some(f) = &self.observer {
            stored.iter().for_each(|e| f(e));
        }
        self.committed += stored.len();
        self.journal.extend(stored);
        Ok(())
    }

    // -- the loop ----------------------------------------------------------------------------

    /// Advances the run, applying `answer` to the pending interaction first if one is given.
    /// A refused answer returns `Error::Answer` and writes nothing.
    pub async fn advance(&mut self, answer: Option<InteractionResponse>) -> Result<Outcome, Error> {
        if let Some(end) = self.replay.terminal().cloned() {
            if let Some(resp) = answer {
                return Err(self.refusal_for(resp.request_id).into());
            }
            return Ok(outcome_of(&end));
        }
        let mut answer = match answer {
            Some(resp) => Some(self.check_answer(resp)?),
            None => None,
        };
        loop {
            if self.cancel.is_cancelled() {
                return self.interrupt().await;
            }
            let next = match self.replay.next_call() {
                NextCall::Fresh(call) => {
                    let call = call.clone();
                    let req = ActionRequest {
                        action_id: call.id,
                        tool: call.tool,
                        args: call.args,
                    };
                    self.push(Event::ActionRequest(req.clone()));
                    Some((req, true))
                }
                NextCall::Unfinished(req) => Some((req.clone(), false)),
                NextCall::None => None,
            };
            let stop = match next {
                Some((req, fresh)) => self.act(req, fresh, &mut answer).await?,
                None => match self.plan_gate(&mut answer).await? {
                    Some(outcome) => Some(outcome),
                    None => self.decide().await?,
                },
            };
            if let Some(outcome) = stop {
                return Ok(outcome);
            }
        }
    }

    /// Parks a run held at a question (`-i` whose terminal went away): from now on it waits as
    /// `WAITING_FOR_INPUT`, to be answered through the mailbox or any other channel.
    pub async fn park(&mut self) -> Result<Outcome, Error> {
        self.settings.pause = PauseMode::Park;
        self.advance(None).await
    }

    /// Checkpoints the run as `INTERRUPTED` (the host's answer to SIGINT/SIGTERM). A run parked
    /// on a question that this engine has written nothing to is left as it is: it was not
    /// running, so there is nothing to interrupt, and an `INTERRUPTED` write would close the
    /// question its person may still answer.
    pub async fn interrupt(&mut self) -> Result<Outcome, Error> {
        let parked = self.record.status == RunStatus::WaitingForInput
            && self.committed == self.journal.len()
            && self.replay.pending().is_some();
        if parked {
            return Ok(Outcome::Interrupted);
        }
        if self.replay.terminal().is_none() {
            // No `on_run_end`: an interrupted run is not over (it resumes).
            self.push(Event::EngineEnd(EngineEnd {
                status: RunStatus::Interrupted,
                result: None,
                error: None,
            }));
            self.commit(Some(StatusChange::Interrupted)).await?;
        }
        Ok(Outcome::Interrupted)
    }

    fn refusal_for(&self, request_id: RequestId) -> ResponseError {
        if self.replay.answered(request_id) {
            ResponseError::AlreadyResolved(request_id)
        } else {
            ResponseError::NotFound(request_id.to_string())
        }
    }

    fn check_answer(&self, resp: InteractionResponse) -> Result<AcceptedAnswer, ResponseError> {
        let Some(pending) = self
            .replay
            .pending()
            .filter(|q| q.request_id == resp.request_id)
        else {
            return Err(self.refusal_for(resp.request_id));
        };
        let accepted = check_answer(
            pending,
            &AnswerSchema::of_tools(&self.agent.tools),
            resp,
            self.answered_at.unwrap_or_else(Timestamp::now),
        )?;
        // The question said the tool was grantable when it was asked; the agent may say
        // otherwise now, and the agent as loaded decides.
        let asks_grant = accepted
            .response
            .data
            .as_ref()
            .is_some_and(|d| d.get("grant").is_some());
        let tool = pending.context.get("tool").and_then(Value::as_str);
        if asks_grant
            && let Some(t) = tool.and_then(|t| self.agent.tools.get(t))
            && !grants::tool_takes_grants(t)
        {
            return Err(ResponseError::InvalidArgs(format!(
                "data.grant: `{}` takes no grants (it is declared `grantable: false`, or its approvals are decided by a vote): each of its calls must be approved on its own",
                t.name
            )));
        }
        Ok(accepted)
    }

    /// Asks the brain for the next decision.
    #[tracing::instrument(name = "decide", skip_all, fields(run_id = %self.record.run_id, turn = self.replay.turns))]
    async fn decide(&mut self) -> Result<Option<Outcome>, Error> {
        if self.replay.turns >= self.agent.max_iterations() {
            let error = format!(
                "reached max_iterations ({}) without finishing; raise `max_iterations` in config.yaml if the task needs more steps",
                self.agent.max_iterations()
            );
            return self
                .finish(Terminal::Failed, None, Some(error))
                .await
                .map(Some);
        }
        if self.agent.brain != BrainKind::Scripted {
            // An LLM call is slow and not free: keep what happened so far before making it.
            self.commit(None).await?;
        }
        let hooked =
            self.agent.hooks.pre_llm_req.is_some() || self.agent.hooks.post_llm_resp.is_some();
        if hooked {
            self.confirm().await?;
        }
        let decided = if hooked {
            self.decide_hooked().await
        } else {
            let view = self.view();
            tokio::select! {
                d = self.brain.decide(view) => Some(d),
                () = self.cancel.cancelled() => None,
            }
        };
        let Some(decided) = decided else {
            return self.interrupt().await.map(Some);
        };
        let decision = match decided {
            Ok(d) => d,
            Err(e) => {
                // An error may quote what a tool or generator printed: masked like its output.
                let error = self.mask(e.to_string());
                return self
                    .finish(Terminal::Failed, None, Some(error))
                    .await
                    .map(Some);
            }
        };
        let turn = self.replay.turns + 1;
        match decision {
            Decision::Act { thought, calls } => {
                let calls: Vec<ToolCall> = calls
                    .into_iter()
                    .zip(1..)
                    .map(|(c, i)| ToolCall {
                        id: format!("a{turn}-{i}"),
                        tool: c.tool,
                        args: c.args,
                    })
                    .collect();
                self.push(Event::Thought(Thought {
                    content: thought,
                    tool_calls: (!calls.is_empty()).then_some(calls),
                }));
                Ok(None)
            }
            Decision::Plan { tasks, .. } => {
                // A plan made after one was sent back ("modify") is its next round.
                let round = self.replay.revising().map_or(1, |r| r.saturating_add(1));
                let tasks: Vec<PlanTask> = tasks
                    .into_iter()
                    .zip(1..)
                    .map(|(mut t, index)| {
                        t.index = index;
                        t.risk = task_risk(t.tool.as_deref().and_then(|n| self.agent.tools.get(n)));
                        t
                    })
                    .collect();
                let risk_level = tasks.iter().map(|t| t.risk).max().unwrap_or(RiskLevel::Low);
                self.push(Event::Plan(Plan {
                    tasks,
                    risk_level,
                    round,
                }));
                Ok(None)
            }
            Decision::Finish { result } => self
                .finish(Terminal::Completed, Some(result), None)
                .await
                .map(Some),
            Decision::Fail { error } => self
                .finish(Terminal::Failed, None, Some(error))
                .await
                .map(Some),
        }
    }

    /// A decision with the LLM hooks: `pre_llm_req` sees (and may replace) the request,
    /// `post_llm_resp` sees the response. `None`: cancelled.
    async fn decide_hooked(&mut self) -> Option<Result<Decision, crate::brain::Error>> {
        use crate::hooks::HookKind;
        let view = self.view();
        let request = tokio::select! {
            r = self.brain.request(view) => r,
            () = self.cancel.cancelled() => return None,
        };
        let mut request = match request {
            Ok(Some(r)) => r,
            // A brain that sends no request: its hooks have nothing to see.
            Ok(None) => {
                let view = self.view();
                return tokio::select! {
                    d = self.brain.decide(view) => Some(d),
                    () = self.cancel.cancelled() => None,
                };
            }
            Err(e) => return Some(Err(e)),
        };
        let cancel = self.cancel.clone();
        if let Some(out) = self
            .hook(HookKind::PreLlmReq, request.clone(), &cancel)
            .await
            && let Some(p) = out.final_payload
        {
            request = p;
        }
        if cancel.is_cancelled() {
            return None;
        }
        let view = self.view();
        let decided = tokio::select! {
            d = self.brain.decide_request(view, request) => d,
            () = self.cancel.cancelled() => return None,
        };
        match decided {
            Ok((decision, response)) => {
                if let Some(resp) = response {
                    self.hook(HookKind::PostLlmResp, resp, &cancel).await;
                }
                Some(Ok(decision))
            }
            Err(e) => Some(Err(e)),
        }
    }

    async fn finish(
        &mut self,
        status: Terminal,
        result: Option<String>,
        error: Option<String>,
    ) -> Result<Outcome, Error> {
        if self.agent.hooks.on_run_end.is_some() || self.agent.hooks.on_error.is_some() {
            self.confirm().await?;
        }
        self.end_hooks(status.into(), result.as_deref(), error.as_deref())
            .await;
        self.push(Event::EngineEnd(EngineEnd {
            status: status.into(),
            result: result.clone(),
            error: error.clone(),
        }));
        self.commit(Some(StatusChange::Finished {
            status,
            result: result.clone(),
            error: error.clone(),
        }))
        .await?;
        Ok(match status {
            Terminal::Completed => Outcome::Completed {
                result: result.unwrap_or_default(),
            },
            Terminal::Failed => Outcome::Failed {
                error: error.unwrap_or_default(),
            },
            Terminal::Cancelled => Outcome::Cancelled {
                reason: error.unwrap_or_default(),
            },
        })
    }

    /// Asks question `q`: journals it and pauses the run on it, its hash sealed once for both.
    async fn ask(&mut self, mut q: InteractionRequest) -> Result<Option<Outcome>, Error> {
        if q.request_hash.is_none() {
            q.seal_hash();
        }
        self.push(Event::HumanInputRequest(Box::new(q.clone())));
        self.pause(q).await
    }

    pub(crate) async fn pause(
        &mut self,
        mut q: InteractionRequest,
    ) -> Result<Option<Outcome>, Error> {
        if q.request_hash.is_none() {
            q.seal_hash();
        }
        match self.settings.pause {
            PauseMode::Hold => self.commit(None).await?,
            PauseMode::Park => {
                let parked = self.record.status == RunStatus::WaitingForInput
                    && self.record.pending_request_id == Some(q.request_id)
                    && self.committed == self.journal.len();
                if !parked {
                    self.push(Event::EngineEnd(EngineEnd {
                        status: RunStatus::WaitingForInput,
                        result: None,
                        error: None,
                    }));
                    self.commit(Some(StatusChange::Waiting(Box::new(q.clone()))))
                        .await?;
                }
            }
        }
        Ok(Some(Outcome::Paused(Box::new(q))))
    }

    fn result(
        &mut self,
        action_id: &str,
        status: ActionStatus,
        text: String,
        exit: Option<i32>,
        ms: u64,
    ) {
        self.push(Event::ActionResult(ActionResult {
            action_id: action_id.to_owned(),
            status,
            observation_content: text,
            exit_code: exit,
            duration_ms: ms,
        }));
    }

    /// Handles one journaled, unfinished action.
    async fn act(
        &mut self,
        req: ActionRequest,
        fresh: bool,
        answer: &mut Option<AcceptedAnswer>,
    ) -> Result<Option<Outcome>, Error> {
        let interaction = self.replay.interaction_for(&req.action_id).cloned();
        match interaction {
            Some((q, Some(rec))) => {
                // The answer is journaled but its effect is not: apply it (again). An approval
                // is journaled with the commit just before its tool starts, so a call approved
                // but without a result may have run: a tool that is not idempotent is not run
                // again without a person (as a call found unfinished without a question).
                let input = rec.input.clone().filter(|_| !q.is_sensitive());
                let accepted = AcceptedAnswer {
                    option: rec.option_id.as_deref().and_then(|o| q.option(o)).cloned(),
                    action: rec.action,
                    response: InteractionResponse {
                        request_id: rec.request_id,
                        option_id: rec.option_id.clone(),
                        input,
                        data: rec.data.clone(),
                        feedback: rec.feedback.clone(),
                        responder: rec.responder.clone(),
                        request_hash: rec.request_hash.clone(),
                    },
                };
                if rec.action == OptionAction::ApproveAndExecute
                    && req.tool != ASK_HUMAN
                    && let Some(tool) = self.agent.tools.get(&req.tool)
                {
                    if !tool.idempotent {
                        // What was approved stands: the grant it asked for is made, and the
                        // question names the call as approved (edited arguments and all), which
                        // is what "run it again" runs.
                        self.create_grant(&q, &accepted).await?;
                        let ran = ActionRequest {
                            args: approved_args(&q, &accepted.response, &req),
                            ..req.clone()
                        };
                        let q = self.may_have_run_request(&ran, tool);
                        return self.ask(q).await;
                    }
                    self.push(Event::SystemMessage(SystemMessage {
                        level: MessageLevel::Info,
                        content: format!(
                            "re-running interrupted action {} (`{}` is idempotent)",
                            req.action_id, req.tool
                        ),
                    }));
                }
                self.apply_answer(&req, &q, accepted).await
            }
            Some((q, None)) => {
                let accepted = match self.receive(&q, answer).await? {
                    Received::Answer(a) => *a,
                    Received::Stop(outcome) => return Ok(outcome),
                };
                let mut record = accepted.journal_record(&q);
                if accepted.action == OptionAction::ApproveAndExecute
                    && let Some(edited) =
                        accepted.response.data.as_ref().and_then(|d| d.get("args"))
                {
                    record.edited_args = args_diff(&req.args, edited);
                }
                self.push(Event::HumanInputReceived(record));
                if q.is_sensitive()
                    && let Some(secret) = secret_of(&q, &accepted.response)
                {
                    self.secrets.insert(q.request_id, secret);
                }
                self.apply_answer(&req, &q, accepted).await
            }
            None if req.tool == ASK_HUMAN => match self.ask_request(&req) {
                Ok(q) => self.ask(q).await,
                Err(msg) => {
                    self.result(&req.action_id, ActionStatus::Error, msg, None, 0);
                    Ok(None)
                }
            },
            None => {
                let Some(tool) = self.agent.tools.get(&req.tool) else {
                    let known: Vec<&str> = self.agent.tools.keys().map(String::as_str).collect();
                    let msg = format!(
                        "unknown tool `{}`; available tools: {}, {ASK_HUMAN}",
                        req.tool,
                        known.join(", ")
                    );
                    self.result(&req.action_id, ActionStatus::Error, msg, None, 0);
                    return Ok(None);
                };
                if fresh && self.plan_sent_back() {
                    // The person asked for a different plan: nothing runs until one is confirmed.
                    let msg =
                        "not run: the plan was sent back for changes; propose the revised plan \
                               (the `plan` tool) and wait for its confirmation before acting"
                            .to_owned();
                    self.result(&req.action_id, ActionStatus::Error, msg, None, 0);
                    return Ok(None);
                }
                if fresh {
                    // Arguments first: a call that cannot run is not decided, granted or put to
                    // a person (and a question carrying unbounded arguments is not stored). The
                    // gate matches the arguments as the tool would get them.
                    let canonical = match tool.check_args(&req.args) {
                        Ok(values) => tools::canonical_args(&values),
                        Err(msg) => {
                            let text = format!("invalid arguments: {msg}");
                            self.result(&req.action_id, ActionStatus::Error, text, None, 0);
                            return Ok(None);
                        }
                    };
                    match self.gate(&req, &canonical, tool).await? {
                        Gate::Run => {}
                        Gate::Deny(text) => {
                            self.result(&req.action_id, ActionStatus::Rejected, text, None, 0);
                            return Ok(None);
                        }
                        Gate::Ask(rule) => {
                            let mut q = self.approval_request(&req, tool);
                            if let Some(rule) = rule {
                                q.context.insert("policy_rule".into(), json!(rule));
                            }
                            return self.ask(q).await;
                        }
                    }
                }
                if !fresh && !tool.idempotent {
                    let q = self.may_have_run_request(&req, tool);
                    return self.ask(q).await;
                }
                if !fresh {
                    self.push(Event::SystemMessage(SystemMessage {
                        level: MessageLevel::Info,
                        content: format!(
                            "re-running interrupted action {} (`{}` is idempotent)",
                            req.action_id, req.tool
                        ),
                    }));
                }
                self.run_tool(&req, &req.args).await
            }
        }
    }

    /// The answer to the pending request `q`: the one given, or its default once it expired.
    /// Otherwise the run pauses on it (or fails, expired without a default).
    async fn receive(
        &mut self,
        q: &InteractionRequest,
        answer: &mut Option<AcceptedAnswer>,
    ) -> Result<Received, Error> {
        match answer.take() {
            Some(a) if a.response.request_id == q.request_id => Ok(Received::Answer(Box::new(a))),
            _ if q.is_expired_at(Timestamp::now()) || self.expired == Some(q.request_id) => {
                self.apply_timeout(q).await
            }
            _ => Ok(Received::Stop(self.pause(q.clone()).await?)),
        }
    }

    /// The clock's answer to `q`: its default option, or the run fails without one.
    async fn apply_timeout(&mut self, q: &InteractionRequest) -> Result<Received, Error> {
        match timeout_answer(q) {
            Some(a) => {
                let when = match q.expires_at.filter(|_| q.is_expired_at(Timestamp::now())) {
                    Some(t) => format!("before {t}"),
                    // Closed by the last step of its escalation, before any deadline.
                    None => "by the last step of its escalation".to_owned(),
                };
                self.push(Event::SystemMessage(SystemMessage {
                    level: MessageLevel::Warn,
                    content: format!(
                        "no answer to request {} {when}: applied the default option `{}`",
                        q.request_id,
                        a.response.option_id.clone().unwrap_or_default()
                    ),
                }));
                Ok(Received::Answer(Box::new(a)))
            }
            None => {
                let error = match q.expires_at.filter(|_| q.is_expired_at(Timestamp::now())) {
                    Some(t) => format!(
                        "interaction {} expired at {t} without an answer and has no default option",
                        q.request_id
                    ),
                    None => format!(
                        "interaction {} was closed by the last step of its escalation (apply_default) and has no default option",
                        q.request_id
                    ),
                };
                let outcome = self.finish(Terminal::Failed, None, Some(error)).await?;
                Ok(Received::Stop(Some(outcome)))
            }
        }
    }

    /// With `confirm_plan`: whether the current plan's confirmation was answered "modify", so a
    /// revised plan must come (and be confirmed) before any tool runs.
    fn plan_sent_back(&self) -> bool {
        self.agent.config.confirm_plan && self.replay.revising().is_some()
    }

    /// With `confirm_plan`, a plan is put to a person before the brain goes on: ask, wait for
    /// the answer, apply it. `None`: go on and ask the brain (confirmed, or to revise the plan).
    async fn plan_gate(
        &mut self,
        answer: &mut Option<AcceptedAnswer>,
    ) -> Result<Option<Outcome>, Error> {
        if !self.agent.config.confirm_plan {
            return Ok(None);
        }
        let Some(plan) = self.replay.current_plan().cloned() else {
            return Ok(None);
        };
        let record = match self.replay.plan_confirmation().cloned() {
            None => {
                let q = self.plan_request(&plan);
                return self.ask(q).await;
            }
            Some((_, Some(record))) => record,
            Some((q, None)) => {
                let accepted = match self.receive(&q, answer).await? {
                    Received::Answer(a) => *a,
                    Received::Stop(outcome) => return Ok(outcome),
                };
                let record = accepted.journal_record(&q);
                self.push(Event::HumanInputReceived(record.clone()));
                record
            }
        };
        if record.action != OptionAction::Terminate {
            // Confirmed: the brain carries on. Modified: the brain sees the answer and re-plans.
            return Ok(None);
        }
        let why = [&record.input, &record.feedback]
            .into_iter()
            .flatten()
            .find(|s| !s.trim().is_empty())
            .map(|r| format!(": {r}"))
            .unwrap_or_default();
        let reason = format!("plan cancelled by {}{why}", record.responder.id);
        self.finish(Terminal::Cancelled, None, Some(reason))
            .await
            .map(Some)
    }

    /// Applies an accepted answer to the action it belongs to.
    async fn apply_answer(
        &mut self,
        req: &ActionRequest,
        q: &InteractionRequest,
        a: AcceptedAnswer,
    ) -> Result<Option<Outcome>, Error> {
        let r = &a.response;
        let who = &r.responder.id;
        let given = r
            .input
            .clone()
            .or_else(|| r.feedback.clone())
            .filter(|s| !s.trim().is_empty());
        // A sensitive answer's text reaches tools only: whatever the action, it never becomes a
        // result, the run's error, or the LLM's context (a prompt-injected model could otherwise
        // ask for a password with a "retry" option and read it back).
        let reason = if q.is_sensitive() {
            given.map(|_| "(the reason given is hidden: the answer is sensitive)".to_owned())
        } else {
            given
        };
        let id = &req.action_id;
        let is_ask = req.tool == ASK_HUMAN;
        match a.action {
            OptionAction::ApproveAndExecute if !is_ask => {
                let edited = r
                    .data
                    .as_ref()
                    .and_then(|d| d.get("args"))
                    .filter(|a| a.is_object())
                    .cloned();
                // A deny always wins, over a person too: arguments edited into a denied call do
                // not run (the approval was of the call as edited, not of the rule).
                if let Some(edited) = &edited
                    && let Some(tool) = self.agent.tools.get(&req.tool)
                    && let Ok(values) = tool.check_args(edited)
                    && let Some(rule) = self
                        .agent
                        .policy
                        .decide(&req.tool, &tools::canonical_args(&values))
                    && rule.effect == Effect::Deny
                {
                    let why = rule
                        .reason
                        .as_deref()
                        .map(|w| format!(": {w}"))
                        .unwrap_or_default();
                    let text = format!(
                        "not run: the arguments as {who} edited them are denied by policy rule `{}`{why}",
                        rule.name
                    );
                    self.result(id, ActionStatus::Rejected, text, None, 0);
                    return Ok(None);
                }
                let args = approved_args(q, r, req);
                self.create_grant(q, &a).await?;
                return self.run_tool(req, &args).await;
            }
            OptionAction::ProvideInfo | OptionAction::ApproveAndExecute => {
                let text = if is_ask {
                    answer_observation(q, &a)
                } else {
                    // "Mark as done": the person's text is the tool's output.
                    reason.unwrap_or_else(|| format!("marked as done by {who}"))
                };
                self.result(id, ActionStatus::Success, text, None, 0);
            }
            OptionAction::RejectWithReason => {
                let text = format!(
                    "rejected: {}",
                    reason.unwrap_or_else(|| format!("by {who}"))
                );
                self.result(id, ActionStatus::Rejected, text, None, 0);
            }
            OptionAction::RetryWithFeedback => {
                let text = format!(
                    "not run; {who} asks you to think again: {}",
                    reason.unwrap_or_default()
                );
                self.result(id, ActionStatus::Rejected, text, None, 0);
            }
            OptionAction::Skip => {
                self.result(
                    id,
                    ActionStatus::Skipped,
                    format!("skipped by {who}"),
                    None,
                    0,
                );
            }
            OptionAction::Terminate => {
                let why = format!(
                    "terminated by {who}{}",
                    reason.map(|r| format!(": {r}")).unwrap_or_default()
                );
                self.result(id, ActionStatus::Rejected, why.clone(), None, 0);
                return self
                    .finish(Terminal::Cancelled, None, Some(why))
                    .await
                    .map(Some);
            }
            OptionAction::Custom => {
                let text = if q.is_sensitive() {
                    answer_observation(q, &a)
                } else {
                    json!({"option_id": r.option_id, "input": r.input, "data": r.data, "feedback": r.feedback})
                        .to_string()
                };
                self.result(id, ActionStatus::Success, text, None, 0);
            }
        }
        Ok(None)
    }

    // -- policy and grants ---------------------------------------------------------------------

    /// Decides how a new call of `tool` goes ahead: `policy.yaml` first (the first matching rule;
    /// a deny always wins, before any grant), then, when the call needs approval (by its tool's
    /// `approval:` or a `require_approval` rule), a live grant that matches it, else a person.
    /// Every decision of a rule or a grant is journaled, naming it.
    /// `args`: the call's checked arguments ([`tools::canonical_args`]), the text each
    /// parameter's value reaches the tool as.
    async fn gate(
        &mut self,
        req: &ActionRequest,
        args: &Value,
        tool: &Tool,
    ) -> Result<Gate, Error> {
        let agent = self.agent;
        let rule = agent.policy.decide(&req.tool, args);
        let note = |rule: &crate::policy::Rule, did: &str| {
            format!(
                "policy.yaml rule `{}` ({}) {did} call {} of `{}`",
                rule.name,
                rule.effect.as_str(),
                req.action_id,
                req.tool
            )
        };
        if let Some(r) = rule {
            // No question is asked for what a rule decides: the trace says which rule did.
            tracing::info!(
                delta.policy.rule = %r.name,
                delta.policy.effect = r.effect.as_str(),
                action_id = %req.action_id,
                "policy rule decided a call"
            );
        }
        let needs = match rule {
            Some(r) if r.effect == Effect::Deny => {
                self.push(Event::SystemMessage(SystemMessage {
                    level: MessageLevel::Warn,
                    content: note(r, "denied"),
                }));
                let why = r
                    .reason
                    .as_deref()
                    .map(|w| format!(": {w}"))
                    .unwrap_or_default();
                return Ok(Gate::Deny(format!(
                    "denied by policy rule `{}`{why}; this call is not allowed, do something else",
                    r.name
                )));
            }
            Some(r) if r.effect == Effect::Allow => {
                self.push(Event::SystemMessage(SystemMessage {
                    level: MessageLevel::Info,
                    content: note(r, "allowed, without approval,"),
                }));
                return Ok(Gate::Run);
            }
            Some(r) => {
                self.push(Event::SystemMessage(SystemMessage {
                    level: MessageLevel::Info,
                    content: note(r, "requires approval of"),
                }));
                true
            }
            None => tool.needs_approval(args),
        };
        if !needs {
            return Ok(Gate::Run);
        }
        if grants::tool_takes_grants(tool)
            && let Some(g) = self.take_grant(req, args).await?
        {
            let uses = match g.max_uses {
                Some(m) => format!("use {} of {m}", g.uses),
                None => format!("use {}", g.uses),
            };
            tracing::info!(
                delta.grant.id = %g.grant_id,
                action_id = %req.action_id,
                "a grant approved a call"
            );
            self.push(Event::SystemMessage(SystemMessage {
                level: MessageLevel::Info,
                content: format!(
                    "call {} of `{}` approved by grant {} (scope {}, created by {} via {} when approving request {} of run {}; {uses})",
                    req.action_id,
                    req.tool,
                    g.grant_id,
                    g.scope,
                    who_of(&g.created_by),
                    via_name(g.created_by.via),
                    g.grant_id,
                    g.run_id
                ),
            }));
            return Ok(Gate::Run);
        }
        Ok(Gate::Ask(rule.map(|r| r.name.clone())))
    }

    /// Takes a use of a live grant that approves `req`, if there is one: the grant after the use.
    /// The store re-checks the grant as it takes the use, so a grant revoked or used up since it
    /// was listed approves nothing, and the next one is tried.
    async fn take_grant(
        &mut self,
        req: &ActionRequest,
        args: &Value,
    ) -> Result<Option<delta_protocol::grant::Grant>, Error> {
        let run_id = self.record.run_id;
        let now = Timestamp::now();
        let candidates = self.store.grants(Some(&self.record.agent)).await?;
        for g in candidates
            .iter()
            .filter(|g| g.live_at(run_id, now) && grants::matches(g, &req.tool, args))
        {
            self.confirm().await?;
            let taken = self
                .store
                .use_grant(&g.agent, g.grant_id, run_id, &req.action_id, now)
                .await?;
            if let Ok(used) = taken {
                return Ok(Some(used));
            }
        }
        Ok(None)
    }

    /// Stores the grant an approval asked for (`data.grant`), once: its id is the request's, so
    /// an answer applied again (a replay) finds it stored and journals nothing new. A grant the
    /// agent as loaded now refuses (an answer journaled before the agent changed) is not made,
    /// and the journal says why; the approval itself stands.
    async fn create_grant(
        &mut self,
        q: &InteractionRequest,
        a: &AcceptedAnswer,
    ) -> Result<(), Error> {
        let asked = a
            .response
            .data
            .as_ref()
            .is_some_and(|d| d.get("grant").is_some());
        if !asked {
            return Ok(());
        }
        let tool = q
            .context
            .get("tool")
            .and_then(Value::as_str)
            .and_then(|t| self.agent.tools.get(t));
        let made = grants::grant_of(
            q,
            tool.map(|t| t.specs.as_slice()),
            tool.is_some_and(grants::tool_takes_grants),
            a,
            Timestamp::now(),
        );
        let mark = q.request_id.to_string();
        let journaled = self.grants_noted().any(|id| id == mark);
        let content = match made {
            Ok(None) => return Ok(()),
            Ok(Some(g)) => {
                self.confirm().await?;
                self.store.put_grant(&g).await?;
                format!(
                    "grant {} created by {} via {}: scope {}, tool `{}`, {}{}{}",
                    g.grant_id,
                    who_of(&g.created_by),
                    via_name(g.created_by.via),
                    g.scope,
                    g.tool,
                    grants::describe_args(&g),
                    g.expires_at
                        .map(|t| format!(", until {t}"))
                        .unwrap_or_default(),
                    g.max_uses
                        .map(|m| format!(", at most {m} use(s)"))
                        .unwrap_or_default()
                )
            }
            Err(why) => format!("grant {} not created: {why}", q.request_id),
        };
        if !journaled {
            self.push(Event::SystemMessage(SystemMessage {
                level: MessageLevel::Info,
                content,
            }));
        }
        Ok(())
    }

    /// Runs a tool call: checks its arguments, commits the journal, runs it, journals the result.
    #[tracing::instrument(name = "tool", skip_all, fields(run_id = %self.record.run_id, tool = %req.tool, action_id = %req.action_id))]
    async fn run_tool(
        &mut self,
        req: &ActionRequest,
        args: &Value,
    ) -> Result<Option<Outcome>, Error> {
        let Some(tool) = self.agent.tools.get(&req.tool) else {
            self.result(
                &req.action_id,
                ActionStatus::Error,
                format!("unknown tool `{}`", req.tool),
                None,
                0,
            );
            return Ok(None);
        };
        let values = match tool.check_args(args) {
            Ok(v) => v,
            Err(msg) => {
                self.result(
                    &req.action_id,
                    ActionStatus::Error,
                    format!("invalid arguments: {msg}"),
                    None,
                    0,
                );
                return Ok(None);
            }
        };
        let values = match self.reveal(tool, values) {
            Ok(v) => v,
            Err(msg) => {
                self.result(&req.action_id, ActionStatus::Error, msg, None, 0);
                return Ok(None);
            }
        };
        let env = self.tool_env();
        let inv = match tool.invocation(&values, &env) {
            Ok(inv) => inv,
            Err(e) => {
                let text = format!("invalid arguments: {e}");
                self.result(&req.action_id, ActionStatus::Error, text, None, 0);
                return Ok(None);
            }
        };
        if self.agent.hooks.pre_tool_exec.is_some() {
            self.confirm().await?;
            // The arguments that run: a person's edits included.
            let payload = json!({
                "tool_name": req.tool,
                "tool_args": args,
                "resolved_command": self.command_line(tool, args),
            });
            let cancel = self.cancel.clone();
            if let Some(out) = self
                .hook(crate::hooks::HookKind::PreToolExec, payload, &cancel)
                .await
            {
                if out.cancelled || self.cancel.is_cancelled() {
                    // Cancelled while the guard ran: the tool does not start.
                    return self.interrupt().await.map(Some);
                }
                // The guard's `skip` counts whatever its exit code, and a guard that failed
                // without a readable answer fails closed.
                let text = if out.skips() {
                    Some("Tool execution skipped by pre_tool_exec hook".to_owned())
                } else if !out.success {
                    Some(
                        "Tool execution skipped: the pre_tool_exec hook failed (see its journal \
                         line); a failed guard does not let the tool run"
                            .to_owned(),
                    )
                } else {
                    None
                };
                if let Some(text) = text {
                    self.result(&req.action_id, ActionStatus::Skipped, text, None, 0);
                    return Ok(None);
                }
            }
        }
        if self.cancel.is_cancelled() {
            return self.interrupt().await.map(Some);
        }
        // The request must be durable before the side effect: stored, and on disk when the tool
        // must not run twice (a lost record would run it again on resume).
        self.commit(None).await?;
        if !tool.idempotent {
            self.store.sync(self.record.run_id).await?;
        }
        let ex = match tool.run_builtin(&values) {
            Some(ex) => ex,
            None => {
                let reap = !tool.keep_background;
                let cancel = &self.cancel;
                tools::run_child(
                    &inv,
                    &env,
                    tool.timeout,
                    tool.max_output_bytes,
                    cancel,
                    reap,
                )
                .await
            }
        };
        if ex.exit == tools::Exit::Cancelled {
            // Left unfinished on purpose: the resume decides (re-run if idempotent, else ask).
            return self.interrupt().await.map(Some);
        }
        let status = if ex.success() {
            ActionStatus::Success
        } else {
            ActionStatus::Error
        };
        let text = self.mask(ex.observation(tool.timeout));
        let ms = u64::try_from(ex.duration.as_millis()).unwrap_or(u64::MAX);
        self.result(&req.action_id, status, text, ex.exit_code(), ms);
        self.tool_hooks(req, args, &ex).await;
        Ok(None)
    }

    /// `post_tool_exec` after a tool ran, and `on_error` when it could not run or was killed.
    async fn tool_hooks(&mut self, req: &ActionRequest, args: &Value, ex: &tools::Execution) {
        use crate::hooks::HookKind;
        let cancel = self.cancel.clone();
        let failure = match &ex.exit {
            tools::Exit::SpawnFailed(e) => Some(format!("could not start: {e}")),
            tools::Exit::TimedOut => Some("timed out and was killed".to_owned()),
            _ => None,
        };
        if let Some(message) = failure {
            let payload = json!({
                "error_type": "TOOL_EXECUTION_ERROR",
                "message": message,
                "context": {"tool_name": req.tool, "tool_args": args},
            });
            self.hook(HookKind::OnError, payload, &cancel).await;
        }
        if self.agent.hooks.post_tool_exec.is_some() {
            let payload = json!({
                "tool_name": req.tool,
                "exit_code": ex.exit_code().unwrap_or(-1),
                "stdout": self.mask(ex.stdout.clone()),
                "stderr": self.mask(ex.stderr.clone()),
            });
            self.hook(HookKind::PostToolExec, payload, &cancel).await;
        }
    }

    fn tool_env(&self) -> ToolEnv {
        ToolEnv {
            work_dir: self.settings.work_dir.clone(),
            agent_home: self.agent.dir.clone(),
            vars: vec![("DELTA_RUN_ID".into(), self.record.run_id.to_string())],
        }
    }

    /// Swaps `{{secret:<request_id>}}` references for the secrets this process holds, in the
    /// parameters `tool` declares `secret: true`. A reference anywhere else is refused: a secret
    /// goes only where the agent's definition binds it, whoever wrote the reference.
    fn reveal(
        &self,
        tool: &Tool,
        mut values: std::collections::BTreeMap<String, String>,
    ) -> Result<std::collections::BTreeMap<String, String>, String> {
        for (name, v) in values.iter_mut() {
            if !v.contains("{{secret:") {
                continue;
            }
            let binds = tool.params.iter().any(|p| &p.name == name && p.secret);
            if !binds {
                return Err(format!(
                    "parameter `{name}` of `{}` does not take sensitive answers: only a parameter \
                     declared `secret: true` in the agent's config.yaml receives one",
                    tool.name
                ));
            }
            // Rebuilt left to right: a secret's own text is never searched for references.
            let mut out = String::with_capacity(v.len());
            let mut rest = v.as_str();
            while let Some(start) = rest.find("{{secret:") {
                let Some(len) = rest[start..].find("}}") else {
                    break;
                };
                let id = &rest[start + 9..start + len];
                // `<request_id>.<field>`: one field of a sensitive typed answer.
                let (rid, field) = id.split_once('.').unwrap_or((id, ""));
                let secret = rid
                    .parse::<RequestId>()
                    .ok()
                    .and_then(|rid| self.secrets.get(&rid))
                    .and_then(|s| secret_field(s, field))
                    .ok_or_else(|| {
                        format!(
                            "the sensitive answer {{{{secret:{id}}}}} is not available: secrets are never stored, \
                             so one given before the run stopped is gone; ask for it again"
                        )
                    })?;
                out.push_str(&rest[..start]);
                out.push_str(&secret);
                rest = &rest[start + len + 2..];
            }
            out.push_str(rest);
            *v = out;
        }
        Ok(values)
    }

    /// Hides every secret this process holds from text bound for the journal.
    fn mask(&self, text: String) -> String {
        let mut hidden: Vec<String> = vec![];
        for (rid, s) in self.secrets.iter().filter(|(_, s)| !s.is_empty()) {
            hidden.push(s.clone());
            // A typed answer's secret is its object: each text field's value is hidden too, and
            // each number of 4 characters or more (a PIN, an account number: shorter ones would
            // hide every such digit in the output). Not its choices or booleans, which the
            // schema itself shows.
            let schema = self
                .replay
                .interaction(*rid)
                .and_then(|(q, _)| q.response_schema.as_ref())
                .and_then(|v| ResponseSchema::parse(v).ok());
            if let (Some(schema), Ok(Value::Object(fields))) =
                (schema, serde_json::from_str::<Value>(s))
            {
                for f in &schema.fields {
                    match (&f.kind, fields.get(&f.name)) {
                        (FieldKind::Text { .. }, Some(Value::String(t))) if !t.is_empty() => {
                            hidden.push(t.clone());
                        }
                        (FieldKind::Number { .. }, Some(n @ Value::Number(_)))
                            if n.to_string().len() >= 4 =>
                        {
                            hidden.push(n.to_string());
                        }
                        _ => {}
                    }
                }
            }
        }
        mask_all(text, &hidden)
    }

    // -- interaction requests -------------------------------------------------------------

    fn new_request(
        &self,
        kind: InteractionType,
        prompt: String,
        action_id: &str,
    ) -> InteractionRequest {
        let mut q = InteractionRequest::new(self.record.run_id, &self.record.agent, kind, prompt);
        q.request_id = self.store.new_request_id(self.record.run_id);
        q.context.insert("action_id".to_owned(), json!(action_id));
        q
    }

    fn with_timeout(
        &self,
        q: &mut InteractionRequest,
        timeout: Option<u64>,
        default: Option<String>,
    ) {
        let defaults = &self.agent.config.interaction_defaults;
        q.timeout_seconds = timeout.or(defaults.timeout_seconds);
        q.expires_at = q.timeout_seconds.map(|t| q.timestamp.plus_seconds(t));
        q.default_option_id = default
            .or_else(|| defaults.default_option_id.clone())
            .filter(|d| q.option(d).is_some());
        // The agent's list bounds any list the call names: a call (an LLM's, perhaps) may
        // narrow who answers, never widen it.
        let agent_list = &defaults.allowed_responders;
        if q.allowed_responders.is_empty() {
            q.allowed_responders.clone_from(agent_list);
        } else if !agent_list.is_empty() {
            q.allowed_responders.retain(|r| agent_list.contains(r));
            if q.allowed_responders.is_empty() {
                // Nobody in both lists: the agent's list stands.
                q.allowed_responders.clone_from(agent_list);
            }
        }
        // Escalation may add responders only within the agent's list too (a call could
        // otherwise widen, a step later, what it may only narrow now).
        if !agent_list.is_empty() {
            for step in &mut q.escalation {
                step.add_responders.retain(|r| agent_list.contains(r));
            }
        }
        // Votes decide a question with `approvals`: its default may not approve (an escalation
        // or the deadline would approve it with no vote at all).
        if q.approvals.is_some()
            && q.default_option_id
                .as_deref()
                .and_then(|d| q.option(d))
                .is_some_and(|o| o.action == OptionAction::ApproveAndExecute)
        {
            q.default_option_id = None;
        }
        let chosen = q.default_option_id.clone();
        for o in &mut q.options {
            o.is_default = chosen.as_deref() == Some(o.option_id.as_str());
        }
    }

    /// The request an `ask_human` call makes, or why its arguments are unusable.
    fn ask_request(&self, req: &ActionRequest) -> Result<InteractionRequest, String> {
        let ask: AskHuman = serde_json::from_value(req.args.clone())
            .map_err(|e| format!("ask_human: invalid arguments: {e}"))?;
        ask.check().map_err(|e| format!("ask_human: {e}"))?;
        let kind = ask.kind.unwrap_or(if ask.options.is_empty() {
            InteractionType::UserInput
        } else {
            InteractionType::UserChoice
        });
        let mut q = self.new_request(kind, ask.prompt.clone(), &req.action_id);
        q.title = ask.title.clone();
        q.details = ask.details.clone();
        q.sensitive = ask.sensitive;
        q.allowed_responders.clone_from(&ask.allowed_responders);
        q.approvals.clone_from(&ask.approvals);
        q.escalation.clone_from(&ask.escalation);
        q.input_type = ask.input_type.clone().unwrap_or(if ask.options.is_empty() {
            if ask.sensitive {
                InputType::Password
            } else {
                InputType::Text
            }
        } else {
            InputType::Choice
        });
        q.options = ask
            .options
            .iter()
            .map(|o| {
                let mut opt = InteractionOption::new(
                    o.id.clone(),
                    o.label.clone().unwrap_or_else(|| o.id.clone()),
                    o.action.unwrap_or(OptionAction::ProvideInfo),
                );
                opt.description = o.description.clone();
                opt.requires_input = o.requires_input;
                opt.input_prompt = o.input_prompt.clone();
                opt.is_dangerous = o.dangerous;
                opt
            })
            .collect();
        q.context.insert("tool".into(), json!(ASK_HUMAN));
        q.response_schema.clone_from(&ask.response_schema);
        self.with_timeout(&mut q, ask.timeout_seconds, ask.default_option_id.clone());
        Ok(q)
    }

    fn command_line(&self, tool: &Tool, args: &Value) -> String {
        match tool.check_args(args) {
            Ok(values) => match tool.invocation(&values, &self.tool_env()) {
                Ok(inv) => inv.display(),
                Err(e) => format!("({e})"),
            },
            Err(e) => format!("({e})"),
        }
    }

    /// `context` of a request about a tool call: the tool, its args, the command line that would
    /// run, the risk level and, when dangerous, why.
    fn tool_context(&self, q: &mut InteractionRequest, req: &ActionRequest, tool: &Tool) {
        q.context.insert("tool".into(), json!(req.tool));
        q.context.insert("args".into(), req.args.clone());
        // What edited arguments are checked against, by the gateway before it accepts them.
        q.context.insert("parameters".into(), json!(tool.specs));
        q.context.insert(
            "command_line".into(),
            json!(self.command_line(tool, &req.args)),
        );
        q.context
            .insert("risk_level".into(), json!(call_risk(tool, &req.args)));
        if let Some(why) = tool.danger(&req.args) {
            q.context.insert("dangerous_because".into(), json!(why));
        }
    }

    /// `approval: always` (or `when_dangerous` on a dangerous tool): ask before running.
    fn approval_request(&self, req: &ActionRequest, tool: &Tool) -> InteractionRequest {
        let cmd = self.command_line(tool, &req.args);
        let mut q = self.new_request(
            InteractionType::ToolApproval,
            format!("Run `{cmd}`?"),
            &req.action_id,
        );
        q.title = Some(format!("Approve tool call: {}", tool.name));
        q.input_type = InputType::Confirmation;
        let mut approve =
            InteractionOption::new("approve", "Approve", OptionAction::ApproveAndExecute);
        let danger = tool.danger(&req.args);
        approve.is_dangerous = danger.is_some();
        q.details = danger.map(|why| format!("Dangerous: {why}."));
        approve.description =
            Some("Run the call (optionally with edited arguments in data.args)".into());
        let mut retry = InteractionOption::new(
            "retry",
            "Retry with feedback",
            OptionAction::RetryWithFeedback,
        );
        retry.requires_input = true;
        retry.input_prompt = Some("What should the agent do instead?".into());
        let mut reject = InteractionOption::new("reject", "Reject", OptionAction::RejectWithReason);
        reject.requires_input = true;
        reject.input_prompt = Some("Why is it rejected?".into());
        let mut terminate =
            InteractionOption::new("terminate", "Terminate the run", OptionAction::Terminate);
        terminate.is_dangerous = true;
        q.options = vec![approve, retry, reject, terminate];
        q.approvals.clone_from(&tool.approvals);
        q.escalation.clone_from(&tool.escalation);
        self.tool_context(&mut q, req, tool);
        // Whether an approval may come with `data.grant` (checked by the gateway before it
        // accepts one).
        q.context
            .insert("grantable".into(), json!(grants::tool_takes_grants(tool)));
        self.with_timeout(&mut q, None, None);
        q
    }

    /// `confirm_plan`: confirm / modify / cancel the plan, with `plan_timeout_seconds` and
    /// `plan_default`. The last allowed round cannot be modified any more.
    fn plan_request(&self, plan: &Plan) -> InteractionRequest {
        let max = self.agent.max_plan_rounds();
        let last = plan.round >= max;
        let mut q = InteractionRequest::new(
            self.record.run_id,
            &self.record.agent,
            InteractionType::UserConfirmation,
            format!(
                "Carry out this plan of {} step(s) (risk: {})?",
                plan.tasks.len(),
                risk_name(plan.risk_level)
            ),
        );
        q.request_id = self.store.new_request_id(self.record.run_id);
        q.title = Some(format!("Confirm the plan (round {} of {max})", plan.round));
        let mut details: Vec<String> = plan
            .tasks
            .iter()
            .map(|t| {
                format!(
                    "{}. {}{} [risk {}]",
                    t.index,
                    t.description,
                    t.tool
                        .as_deref()
                        .map(|n| format!(" (tool {n})"))
                        .unwrap_or_default(),
                    risk_name(t.risk)
                )
            })
            .collect();
        if last && max > 1 {
            details.push("This is the last round: the plan can be confirmed or cancelled.".into());
        }
        q.details = Some(details.join("\n"));
        q.input_type = InputType::Confirmation;
        let mut confirm =
            InteractionOption::new("confirm", "Confirm", OptionAction::ApproveAndExecute);
        confirm.description = Some("Carry out the plan as shown".into());
        confirm.is_dangerous = plan.risk_level == RiskLevel::High;
        let mut modify =
            InteractionOption::new("modify", "Modify", OptionAction::RetryWithFeedback);
        modify.description = Some(
            "Say what should change (input), or send the edited task list in data.tasks".into(),
        );
        modify.input_prompt = Some("What should change?".into());
        let mut cancel =
            InteractionOption::new("cancel", "Cancel the run", OptionAction::Terminate);
        cancel.description = Some("Stop here; nothing of the plan is done".into());
        q.options = if last {
            vec![confirm, cancel]
        } else {
            vec![confirm, modify, cancel]
        };
        q.context.insert(
            "plan".into(),
            serde_json::to_value(&plan.tasks).unwrap_or_default(),
        );
        q.context
            .insert("risk_level".into(), json!(plan.risk_level));
        q.context.insert("round".into(), json!(plan.round));
        q.context.insert("max_rounds".into(), json!(max));
        // The tools an edited task list may name, checked by the gateway before it accepts one.
        q.context.insert(
            "tools".into(),
            json!(self.agent.tools.keys().collect::<Vec<_>>()),
        );
        self.with_timeout(
            &mut q,
            self.agent.config.plan_timeout_seconds,
            self.agent.config.plan_default.clone(),
        );
        q
    }

    /// A non-idempotent call found unfinished on replay: a person decides.
    fn may_have_run_request(&self, req: &ActionRequest, tool: &Tool) -> InteractionRequest {
        let cmd = self.command_line(tool, &req.args);
        let mut q = self.new_request(
            InteractionType::ToolApproval,
            format!(
                "The run stopped while `{cmd}` was running, so it may already have run. \
                 Run it again, skip it, or mark it as done?"
            ),
            &req.action_id,
        );
        q.title = Some("This action may already have run".into());
        q.input_type = InputType::Confirmation;
        let mut rerun =
            InteractionOption::new("rerun", "Run it again", OptionAction::ApproveAndExecute);
        rerun.is_dangerous = true;
        let skip = InteractionOption::new("skip", "Skip it", OptionAction::Skip);
        let mut done =
            InteractionOption::new("mark_done", "Mark as done", OptionAction::ProvideInfo);
        done.requires_input = true;
        done.input_prompt = Some("The output to record for it".into());
        let mut terminate =
            InteractionOption::new("terminate", "Terminate the run", OptionAction::Terminate);
        terminate.is_dangerous = true;
        q.options = vec![rerun, skip, done, terminate];
        self.tool_context(&mut q, req, tool);
        q.context.insert("may_have_run".into(), json!(true));
        q
    }
}

/// The arguments an approval `r` of question `q` about call `req` runs: as edited in the answer
/// (`data.args`), else as the question showed them (`context.args`: a "may have run" question
/// shows the arguments that were approved, edits included), else the call's own.
fn approved_args(q: &InteractionRequest, r: &InteractionResponse, req: &ActionRequest) -> Value {
    r.data
        .as_ref()
        .and_then(|d| d.get("args"))
        .filter(|a| a.is_object())
        .or_else(|| q.context.get("args").filter(|a| a.is_object()))
        .cloned()
        .unwrap_or_else(|| req.args.clone())
}

/// How a new tool call goes ahead ([`Engine::gate`]).
enum Gate {
    /// Run it now.
    Run,
    /// Do not run it: the observation says why (a policy rule denied it).
    Deny(String),
    /// Ask a person first; the policy rule that requires it, if one does.
    Ask(Option<String>),
}

/// What [`Engine::receive`] got.
enum Received {
    Answer(Box<AcceptedAnswer>),
    /// Paused, or ended: return this from the loop.
    Stop(Option<Outcome>),
}

fn risk_name(r: RiskLevel) -> &'static str {
    match r {
        RiskLevel::Low => "low",
        RiskLevel::Medium => "medium",
        RiskLevel::High => "high",
    }
}

/// The risk of one call: high when dangerous, medium when it needs approval anyway, else low.
fn call_risk(tool: &Tool, args: &Value) -> RiskLevel {
    if tool.danger(args).is_some() {
        RiskLevel::High
    } else if tool.approval == Approval::Always {
        RiskLevel::Medium
    } else {
        RiskLevel::Low
    }
}

/// The risk of a plan task using `tool`, decided before its arguments are known: a tool that is
/// or may be dangerous makes it high, one that always asks for approval medium.
fn task_risk(tool: Option<&Tool>) -> RiskLevel {
    match tool {
        Some(t) if t.may_be_dangerous() => RiskLevel::High,
        Some(t) if t.approval == Approval::Always => RiskLevel::Medium,
        _ => RiskLevel::Low,
    }
}

/// What the brain is told of an answer to `ask_human`.
fn answer_observation(q: &InteractionRequest, a: &AcceptedAnswer) -> String {
    if q.is_sensitive() {
        return format!(
            "(a sensitive answer was given; it is hidden from you. To use it, pass {} as a tool argument)",
            secret_ref(q.request_id)
        );
    }
    if q.response_schema.is_some()
        && let Some(data) = &a.response.data
    {
        // A typed answer: the object itself, as JSON.
        return data.to_string();
    }
    let input = a.response.input.clone().filter(|s| !s.trim().is_empty());
    match (&a.option, input) {
        (None, Some(text)) => text,
        (None, None) => String::new(),
        (Some(o), None) => format!("chose \"{}\" (option {})", o.label, o.option_id),
        (Some(o), Some(text)) => format!("chose \"{}\" (option {}): {text}", o.label, o.option_id),
    }
}

/// `text` with every string of `hidden` replaced by the mask; and where a tool's output was cut
/// (`[output truncated: …]`), a secret the cut went through is masked too: the start of it that
/// ends the kept output would not match it whole.
fn mask_all(mut text: String, hidden: &[String]) -> String {
    for h in hidden.iter().filter(|h| !h.is_empty()) {
        text = text.replace(h.as_str(), MASK);
    }
    const CUT: &str = "\n[output truncated:";
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(at) = rest.find(CUT) {
        let mut kept = &rest[..at];
        // The longest start of a secret that ends the kept part, if any.
        let start = hidden
            .iter()
            .filter_map(|h| {
                h.char_indices()
                    .skip(1)
                    .map(|(i, _)| &h[..i])
                    .filter(|p| kept.ends_with(p))
                    .map(str::len)
                    .max()
            })
            .max();
        if let Some(n) = start {
            kept = &kept[..kept.len() - n];
            out.push_str(kept);
            out.push_str(MASK);
        } else {
            out.push_str(kept);
        }
        out.push_str(CUT);
        rest = &rest[at + CUT.len()..];
    }
    out.push_str(rest);
    out
}

/// The secret itself (`field` empty), or one field of a typed answer's object: a string as it
/// is, any other value as JSON.
fn secret_field<'s>(secret: &'s str, field: &str) -> Option<std::borrow::Cow<'s, str>> {
    if field.is_empty() {
        return Some(std::borrow::Cow::Borrowed(secret));
    }
    match serde_json::from_str::<Value>(secret).ok()?.get(field)? {
        Value::String(s) => Some(std::borrow::Cow::Owned(s.clone())),
        other => Some(std::borrow::Cow::Owned(other.to_string())),
    }
}

/// The value a sensitive answer gives the tools through `{{secret:…}}`: its text, or the JSON of
/// a typed answer's `data`.
fn secret_of(q: &InteractionRequest, answer: &InteractionResponse) -> Option<String> {
    match (&q.response_schema, &answer.data) {
        (Some(_), Some(data)) => Some(data.to_string()),
        _ => answer.input.clone(),
    }
}

/// The answer the clock gives when a request expires: its default option, if it has one.
pub fn timeout_answer(q: &InteractionRequest) -> Option<AcceptedAnswer> {
    let option = q.option(q.default_option_id.as_deref()?)?;
    let mut resp = InteractionResponse::new(
        q.request_id,
        Responder {
            id: "timeout".into(),
            via: Via::Timeout,
            on_behalf_of: None,
            relayed_by: None,
        },
    );
    resp.option_id = Some(option.option_id.clone());
    // Options that want text (a reason, feedback) get one that says what happened.
    resp.input = (option.requires_input || option.action == OptionAction::RetryWithFeedback)
        .then(|| "no answer before the timeout".to_owned());
    q.validate(resp, Timestamp::now()).ok()
}

fn outcome_of(end: &EngineEnd) -> Outcome {
    match end.status {
        RunStatus::Completed => Outcome::Completed {
            result: end.result.clone().unwrap_or_default(),
        },
        RunStatus::Cancelled => Outcome::Cancelled {
            reason: end.error.clone().unwrap_or_default(),
        },
        _ => Outcome::Failed {
            error: end.error.clone().unwrap_or_default(),
        },
    }
}

/// Who answered, for a journal note: `bob`, or `bob on behalf of alice` (a delegation).
fn who_of(r: &Responder) -> String {
    match &r.on_behalf_of {
        Some(from) => format!("{} on behalf of {from}", r.id),
        None => r.id.clone(),
    }
}

/// A channel's name as the protocol writes it (`http`, `nats`, …).
fn via_name(via: Via) -> String {
    serde_json::to_value(via)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// A duration for humans: `850ms`, `3.2s`.
pub fn human_duration(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every secret is masked where it is whole, and where a cut of the output went through it
    /// (its start ends the kept part); nothing else is.
    #[test]
    fn secrets_are_masked_whole_and_where_a_cut_went_through_them() {
        let hidden = vec!["hunter2-pass".to_owned(), "123456".to_owned()];
        let masked = mask_all("pw=hunter2-pass pin=123456 n=12".to_owned(), &hidden);
        assert_eq!(masked, format!("pw={MASK} pin={MASK} n=12"));
        let cut = "log: the key is hunter2-pa\n[output truncated: 26 of 900 bytes kept]";
        let masked = mask_all(cut.to_owned(), &hidden);
        assert_eq!(
            masked,
            format!("log: the key is {MASK}\n[output truncated: 26 of 900 bytes kept]")
        );
        assert!(!masked.contains("hunter2"), "{masked}");
        let plain = "nothing secret\n[output truncated: 14 of 90 bytes kept]";
        assert_eq!(mask_all(plain.to_owned(), &hidden), plain);
    }
}
