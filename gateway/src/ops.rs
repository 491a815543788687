//! What the gateway does, whatever the channel: submit a run, answer a question, cancel a run.
//! HTTP handlers, the NATS bot bridge and the reconcilers all call these, so the rules of
//! docs/protocol.md §3 are enforced in one place.

use serde_json::Value;

use delta_api::{
    AnswerBody, AnswerStatus, ClaimBody, ClaimState, ClaimedResponder, ErrorCode, InteractionView,
    RunAccepted, Submission,
};

use delta_engine::engine::{AnswerSchema, check_answer};
use delta_protocol::{
    AcceptedAnswer, Approvals, Ballot, Change, Event, InteractionResponse, InteractionState,
    InteractionUpdate, Job, MessageLevel, OptionAction, PausedRun, REDACTED, RequestId, Resolved,
    Responder, ResponseError, RunId, RunStatus, SystemMessage, Tally, Timestamp, Via, Vote,
};
use delta_store::redis::{
    ClaimMode, Claimed, Counted, Note, Resolution, StoredInteraction, Submitted,
};
use delta_store::{RunRecord, RunStore, StatusChange, Terminal};

use crate::Gateway;
use crate::error::ApiError;

/// The longest `input` or `feedback` an answer may carry (64 KiB).
pub const MAX_ANSWER_TEXT_BYTES: usize = 64 * 1024;
/// The longest reason a cancel may give.
pub const MAX_CANCEL_REASON_CHARS: usize = 1000;

/// The most bytes of task and input a start job carries (beyond that the worker reads the run
/// from Redis): a job stays a small message however large the runs the fleet takes. A resume
/// job's is the store's `CARRIED_MAX_BYTES`.
const CARRIED_RUN_MAX_BYTES: usize = 8 * 1024;

/// Letters, digits, `-` and `_` (an agent's name is part of NATS subjects).
pub fn valid_agent_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What an accepted answer did: decided its question (`accepted`), or, a vote on a question
/// with `approvals`, was counted and left it pending (`counted`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answered {
    pub run_id: RunId,
    pub status: AnswerStatus,
    /// Where the votes stand (a question with `approvals`).
    pub tally: Option<Tally>,
}

impl Answered {
    fn decided(run_id: RunId) -> Self {
        Self {
            run_id,
            status: AnswerStatus::Accepted,
            tally: None,
        }
    }
}

/// How long a claim lasts unless its taker says (`ttl_seconds`), and the bounds of what it may say.
const CLAIM_TTL_S: u64 = 300;
const CLAIM_TTL_RANGE: std::ops::RangeInclusive<u64> = 10..=3600;

/// How long a cancel waits for the job that asked the question it closes to be let go
/// ([`Gateway::cancel`]): a worker announces a question before it lets its job go, so this is
/// the window between a pause's write and its announcement, unless the worker died in it.
const ASKER_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl Gateway {
    /// Stores a run `QUEUED` and publishes its start job (docs/architecture.md "The walk of one run", step 1).
    /// `submitted_by` is the authenticated caller, kept with the run (`approvals.exclude_requester`).
    /// Submits a run. `limited_as`: the identity whose `DELTA_SUBMIT_PER_MINUTE` the run counts
    /// against (a token's name), taken once the submission passed its checks and given back
    /// when the call found the run of its Idempotency-Key: a refused or repeated call costs none.
    pub async fn submit(
        &self,
        s: Submission,
        idempotency_key: Option<&str>,
        submitted_by: Option<&str>,
        limited_as: Option<&str>,
    ) -> Result<RunAccepted, ApiError> {
        if !valid_agent_name(&s.agent) {
            return Err(ApiError::new(
                ErrorCode::InvalidArgs,
                format!(
                    "`{}` is not an agent name (letters, digits, `-`, `_`)",
                    s.agent
                ),
            ));
        }
        if delta_engine::agent::config_file(&self.config.agents_dir.join(&s.agent)).is_none() {
            return Err(ApiError::new(
                ErrorCode::InvalidArgs,
                format!(
                    "no agent `{}` in this fleet's agents directory (DELTA_AGENTS_DIR of the gateway); check the name",
                    s.agent
                ),
            ));
        }
        if s.task.trim().is_empty() {
            return Err(ApiError::new(
                ErrorCode::InvalidArgs,
                "`task` must not be empty",
            ));
        }
        if s.task.len() > self.config.max_task_bytes {
            return Err(ApiError::new(
                ErrorCode::InvalidArgs,
                format!(
                    "`task` is {} bytes; this fleet takes at most {} (DELTA_MAX_TASK_BYTES): pass large material as a file the agent's tools read, or in `input`",
                    s.task.len(),
                    self.config.max_task_bytes
                ),
            ));
        }
        // Not the Submission serialized: these bytes (sorted keys, `input` null when absent)
        // are what stored fingerprints were made of, so a key reused across an upgrade still
        // matches its submission.
        let fingerprint = sha256_hex(
            serde_json::json!({"agent": s.agent, "task": s.task, "input": s.input})
                .to_string()
                .as_bytes(),
        );
        let key = match idempotency_key {
            Some(k) if k.is_empty() || k.len() > 255 => {
                return Err(ApiError::bad_request(
                    "Idempotency-Key must be 1 to 255 characters",
                ));
            }
            Some(k) => Some(sha256_hex(k.as_bytes())),
            None => None,
        };
        // With a key, the run goes to the key's bucket: checking and setting the key is then
        // part of the one script that creates the run.
        let run_id = match &key {
            Some(k) => self.store.run_id_for_key(k),
            None => RunId::new(),
        };
        let mut record = RunRecord::new(run_id, &s.agent, &s.task, RunStatus::Queued);
        record.input = s.input;
        record.submitted_by = submitted_by.map(str::to_owned);
        if let Some(name) = limited_as {
            self.submissions.take(name)?;
        }
        // Counted even when this fails: the run may have been written before the error (a
        // replica's acknowledgement awaited), and a retry with its key then finds it.
        let submitted = self
            .store
            .create_indexed(&record, key.as_deref().map(|k| (k, fingerprint.as_str())))
            .await?;
        if let Submitted::Existing {
            run_id,
            fingerprint: earlier,
        } = submitted
        {
            if let Some(name) = limited_as {
                self.submissions.give_back(name);
            }
            if earlier != fingerprint {
                return Err(ApiError::new(
                    ErrorCode::InvalidArgs,
                    "this Idempotency-Key was used for a different submission; use a new key for a new run",
                ));
            }
            // The first try may have been refused (`503`) because its run was not replicated
            // yet: acknowledged only once it is. A run that is not on its master any more was
            // lost at a failover with the key: this try is refused too, and the next one creates
            // the run again.
            self.store.sync(run_id).await.map_err(|e| match e {
                delta_store::Error::NotFound(_) => ApiError::unavailable(
                    "the run store (Redis) lost this submission at a failover; try again shortly with the same Idempotency-Key",
                ),
                other => other.into(),
            })?;
            let status = self.store.record(run_id).await?.status;
            return Ok(RunAccepted { run_id, status });
        }
        self.metrics.runs_submitted.inc();
        let mut job = Job::start(record.run_id);
        // The run as created, for the job's first delivery to start it without reading it back
        // (docs/protocol.md "Job messages"); a large task or input is read from Redis instead.
        let size = record.task.len() + record.input.as_ref().map_or(0, |i| i.to_string().len());
        if size <= CARRIED_RUN_MAX_BYTES {
            job.run = Some(record.fresh());
        }
        // Should this fail, the run stays QUEUED with no job: the lost-job reconciler sends it.
        match self.queue.publish_job(&s.agent, &job, None).await {
            Ok(seq) => {
                self.notes
                    .note(Note::JobSeq {
                        run_id: record.run_id,
                        seq,
                    })
                    .await;
            }
            Err(e) => {
                tracing::warn!(error = %delta_host::Chain(&e), run = %record.run_id, "start job not published; the reconciler will")
            }
        }
        Ok(RunAccepted {
            run_id: record.run_id,
            status: RunStatus::Queued,
        })
    }

    /// The responder of an answer arriving on `via`, from the caller's identity and claim.
    pub fn responder(
        &self,
        identity: Option<&str>,
        claimed: Option<&ClaimedResponder>,
        via: Via,
    ) -> Result<Responder, ApiError> {
        let claimed_id = claimed
            .and_then(|c| c.id.as_deref())
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty());
        let via = match (via, claimed.and_then(|c| c.via)) {
            (Via::Http, Some(Via::Cli)) => Via::Cli,
            (Via::Http, Some(Via::Http) | None) => Via::Http,
            // Without authentication anyone may name anyone: the Slack bridge says it is Slack.
            (Via::Http, Some(Via::Slack)) if !self.config.auth.is_on() => Via::Slack,
            (Via::Http, Some(other)) => {
                return Err(ApiError::bad_request(format!(
                    "responder.via `{}` cannot be claimed over HTTP (use http or cli)",
                    serde_json::to_value(other)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default()
                )));
            }
            (v, _) => v,
        };
        let id = match (identity, claimed_id) {
            (Some(name), Some(c)) if c != name => {
                return Err(ApiError::new(
                    ErrorCode::Forbidden,
                    format!("you are `{name}`: you cannot answer as `{c}`"),
                ));
            }
            (Some(name), _) => name.to_owned(),
            (None, Some(c))
                if c != "anonymous"
                    && crate::auth::RESERVED_RESPONDERS.contains(&c.to_lowercase().as_str()) =>
            {
                return Err(ApiError::new(
                    ErrorCode::Forbidden,
                    format!("`{c}` is the fleet's own responder id: nobody may answer as it"),
                ));
            }
            (None, Some(c)) => c,
            (None, None) => "anonymous".to_owned(),
        };
        if id.len() > 200 {
            return Err(ApiError::bad_request(
                "responder.id is longer than 200 characters",
            ));
        }
        Ok(Responder::new(id, via))
    }

    /// Who an answer or claim over HTTP acts as: the caller itself ([`Self::responder`]), or,
    /// for a `relay` token naming someone else in `responder.id`, that person of the tokens
    /// file, with their roles and groups, recorded `via` the relay's channel (`slack`) and
    /// `relayed_by` the relay. A relay never acts as the fleet's own ids nor as a name the tokens
    /// file does not know, nor for a person who may not answer.
    pub fn acting(
        &self,
        who: crate::auth::Identity,
        claimed: Option<&ClaimedResponder>,
    ) -> Result<(crate::auth::Identity, Responder), ApiError> {
        use crate::auth::Role;
        let claimed_id = claimed
            .and_then(|c| c.id.as_deref())
            .map(str::trim)
            .filter(|s| !s.is_empty());
        let relaying = who.is_relay() && claimed_id.is_some_and(|c| Some(c) != who.name.as_deref());
        if !relaying {
            if !who.has(Role::Answer) {
                return Err(ApiError::new(
                    ErrorCode::Forbidden,
                    "a relay token acts only on behalf of a person: name them in `responder.id`",
                ));
            }
            let responder = self.responder(who.name.as_deref(), claimed, Via::Http)?;
            return Ok((who, responder));
        }
        let relay = who.name.clone().unwrap_or_default();
        let id = claimed_id.unwrap_or_default();
        if crate::auth::RESERVED_RESPONDERS.contains(&id.to_lowercase().as_str()) {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                format!("`{id}` is the fleet's own responder id: no relay may act as it"),
            ));
        }
        let Some(person) = self.config.auth.person(id) else {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                format!(
                    "`{id}` is not a name of the tokens file: a relay acts only for people it names (check the bridge's user mapping)"
                ),
            ));
        };
        if !person.has(Role::Answer) {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                format!("`{id}` may not answer (the tokens file gives them no answer role)"),
            ));
        }
        let via = match claimed.and_then(|c| c.via) {
            None | Some(Via::Slack) => Via::Slack,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "responder.via `{}` cannot be relayed (a relay answers via slack)",
                    serde_json::to_value(other)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default()
                )));
            }
        };
        let mut responder = Responder::new(id, via);
        responder.relayed_by = Some(relay);
        Ok((person, responder))
    }

    /// Answers `request_id` (docs/protocol.md §3, docs/architecture.md "The walk of one run" step 5): validate, flip
    /// `PENDING → ANSWERED` atomically (first answer wins; an identical repeat is acknowledged),
    /// publish the resume job, announce `resolved`. Returns the run.
    ///
    /// On a question with `approvals` the answer is a vote (docs/protocol.md §3 "Quorum"): counted
    /// and journaled, and it decides the question when it reaches the count. `groups` are the
    /// responder's (from the tokens file), for `group:<name>` entries.
    pub async fn answer(
        &self,
        request_id: RequestId,
        body: AnswerBody,
        responder: Responder,
        groups: &[String],
    ) -> Result<Answered, ApiError> {
        let via = responder.via;
        // Not entered: its parent (the question's `interaction` span, or the span that asked)
        // is known only once the answer is handled (crate::trace).
        let span = crate::trace::answer_span(request_id, &responder);
        let mut trace = crate::trace::AnswerTrace::default();
        let result = self
            .answer_inner(request_id, body, responder, groups, &mut trace)
            .await;
        let label = crate::metrics::ViaLabel {
            via: format!("{via:?}").to_lowercase(),
        };
        match &result {
            Ok(_) => self.metrics.answers_accepted.get_or_create(&label).inc(),
            Err(_) => self.metrics.answers_refused.get_or_create(&label).inc(),
        };
        let outcome = match &result {
            Ok(a) if a.status == AnswerStatus::Counted => Ok("counted"),
            Ok(_) => Ok("accepted"),
            Err(e) => Err(e.code.as_str()),
        };
        crate::trace::finish_answer(span, trace, outcome);
        result
    }

    async fn answer_inner(
        &self,
        request_id: RequestId,
        body: AnswerBody,
        responder: Responder,
        groups: &[String],
        trace: &mut crate::trace::AnswerTrace,
    ) -> Result<Answered, ApiError> {
        if body.request_id.is_some_and(|r| r != request_id) {
            return Err(ApiError::bad_request(format!(
                "the body's request_id is not {request_id}, the request being answered"
            )));
        }
        // Stored, journaled and announced: bounded here, before anything is read or written.
        for (field, text) in [("input", &body.input), ("feedback", &body.feedback)] {
            if text
                .as_ref()
                .is_some_and(|t| t.len() > MAX_ANSWER_TEXT_BYTES)
            {
                return Err(ApiError::new(
                    ErrorCode::InvalidArgs,
                    format!(
                        "{field} is longer than {} KiB: send less (put a long text in a file or a link, and its name here)",
                        MAX_ANSWER_TEXT_BYTES / 1024
                    ),
                ));
            }
        }
        let response = InteractionResponse {
            request_id,
            option_id: body.option_id,
            input: body.input,
            data: body.data,
            feedback: body.feedback,
            responder,
            request_hash: body.request_hash,
        };
        // A question this gateway heard announced is answered with what was announced, read
        // from memory (src/heard.rs); Redis's settling script still has the last word. Anything
        // refused on this path is decided again the usual way, with the question read from
        // Redis, so that this path never refuses, nor accepts, what the usual one would not.
        // An answer to a question just asked and not heard yet waits for it, briefly.
        if let Some(heard) = self.heard.heard_soon(request_id).await {
            let heard = if heard { "true" } else { "false" };
            self.metrics
                .answers_waited
                .get_or_create(&crate::metrics::HeardLabel { heard })
                .inc();
        }
        if let Some(ix) = self.heard_question(request_id) {
            let run_id = ix.request.run_id;
            if let Ok(answered) = self
                .answer_ix(run_id, ix, response.clone(), groups, trace)
                .await
            {
                self.heard.forget(request_id);
                self.metrics.answers_heard.inc();
                return Ok(answered);
            }
        }
        let (run_id, ix) = self.find(request_id).await?;
        self.answer_ix(run_id, ix, response, groups, trace).await
    }

    /// Question `request_id` as a pending stored interaction, from what this gateway heard
    /// announced: only for a question whose answer depends on nothing it may have gained since
    /// it was asked (no votes, no escalation adding responders).
    fn heard_question(&self, request_id: RequestId) -> Option<StoredInteraction> {
        let heard = self.heard.get(request_id)?;
        let q = &heard.request;
        if q.approvals.is_some() || !q.escalation.is_empty() {
            return None;
        }
        Some(StoredInteraction {
            request: heard.request,
            state: InteractionState::Pending,
            response: None,
            answered_at: None,
            // Heard, so announced as heard; a reopen since (which the announcement heard may
            // predate) is learnt from the settling, which reads it (`answer_ix`).
            reopened_at: None,
            resume_seq: None,
            asked_by_job: None,
            unannounced: false,
            traceparent: heard.traceparent,
            claim: None,
            votes: vec![],
            escalated: 0,
            unannounced_step: None,
            added_responders: vec![],
        })
    }

    /// Answers `ix` (question `response.request_id` of run `run_id`) with `response`.
    async fn answer_ix(
        &self,
        run_id: RunId,
        ix: StoredInteraction,
        mut response: InteractionResponse,
        groups: &[String],
        trace: &mut crate::trace::AnswerTrace,
    ) -> Result<Answered, ApiError> {
        let request_id = response.request_id;
        trace.run_id = Some(run_id);
        trace.asked = ix.traceparent.clone();
        // A secret never passes through a relay (the Slack bridge, or whoever holds its token):
        // it is typed in the inbox or the CLI, straight to the gateway.
        if let Some(relay) = &response.responder.relayed_by
            && ix.request.is_sensitive()
        {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                format!(
                    "request {request_id} is sensitive: it is never answered through a relay (`{relay}`); answer it in the inbox or with `delta answer`"
                ),
            ));
        }
        // Someone who may not answer it themselves may with the authority of a person who
        // delegated to them: recorded as "on behalf of" that person.
        if !may_decide(&ix, &response.responder.id, groups) {
            response.responder.on_behalf_of = self.delegator(&ix, &response.responder.id).await?;
        }
        // A typed answer's `data` is checked against its schema instead (a field may be named
        // `args` or `tasks`).
        if let Some(data) = &response.data
            && ix.request.response_schema.is_none()
        {
            check_data_shape(data)?;
        }
        if ix.state != InteractionState::Pending {
            // A voter's same vote again (a retry after a 503), once the question is decided.
            let tally = ix
                .request
                .approvals
                .as_ref()
                .map(|a| Tally::of(&ix.votes, a.min));
            let run = match self.repeated_vote(&ix, &response) {
                true => run_id,
                false => self.settled(run_id, &ix, &response)?,
            };
            // The same answer again (a retry after a 503): acknowledged once it is on disk.
            self.store.sync(run_id).await?;
            return Ok(Answered {
                tally,
                ..Answered::decided(run)
            });
        }
        let (acting_as, acting_groups) = self.authority(&response.responder, groups);
        if !may_answer(
            &ix,
            &Responder::new(acting_as, response.responder.via),
            &acting_groups,
        ) {
            return Err(ResponseError::NotAllowed(response.responder.id.clone()).into());
        }
        let now = Timestamp::now();
        // The engine's own check, with what the question carries (the tool's parameters, the
        // agent's tool names): a bad answer is refused here and the question stays pending.
        // A question from a worker that did not yet carry them gets the protocol's rules only;
        // the engine checks the rest when it applies the answer.
        let accepted = match AnswerSchema::of_request(&ix.request) {
            Some(schema) => check_answer(&ix.request, &schema, response.clone(), now)?,
            None => ix.request.validate(response.clone(), now)?,
        };
        // Who submitted the run, read once, when a rule needs it.
        let delegated_approval = response.responder.on_behalf_of.is_some()
            && accepted.action == OptionAction::ApproveAndExecute;
        let excludes = ix
            .request
            .approvals
            .as_ref()
            .is_some_and(|a| a.exclude_requester);
        let submitted_by = match delegated_approval || excludes {
            true => self.store.record(run_id).await?.submitted_by,
            false => None,
        };
        if delegated_approval {
            let own = [
                Some(&response.responder.id),
                response.responder.on_behalf_of.as_ref(),
            ];
            if submitted_by.is_some() && own.contains(&submitted_by.as_ref()) {
                return Err(ApiError::new(
                    ErrorCode::Forbidden,
                    "a delegation never lets anyone approve their own run: ask someone else to approve it",
                ));
            }
        }
        if let Some(approvals) = ix.request.approvals.clone() {
            return self
                .vote(
                    run_id,
                    &ix,
                    &approvals,
                    response,
                    accepted,
                    &acting_groups,
                    submitted_by.as_deref(),
                    now,
                    trace,
                )
                .await;
        }
        // Whether the question may be unannounced is asked of NATS while Redis settles it.
        let (won, unannounced) = tokio::join!(
            self.store.resolve_carrying(
                &ix.request,
                Resolution::Answer(&response, now),
                self.config.resume_check,
            ),
            self.maybe_unannounced(&ix),
        );
        let won = won?;
        if won.lost.is_some() {
            // Someone else settled it between our read and our write.
            let (_, now) = self.find(request_id).await?;
            let run = self.settled(run_id, &now, &response)?;
            self.store.sync(run_id).await?;
            return Ok(Answered::decided(run));
        }
        // A copy heard announced before the engine reopened the question knows nothing of the
        // reopen, which may never have been announced (its delivery died): asked again, of the
        // reopening job, and announced under the reopen's id before its answer.
        let mut ix = ix;
        let unannounced = match won.reopened {
            Some(r) if ix.reopened_at != Some(r.at) => {
                ix.reopened_at = Some(r.at);
                ix.asked_by_job = r.job;
                self.maybe_unannounced(&ix).await
            }
            _ => unannounced,
        };
        self.decided(
            run_id,
            &ix,
            &response,
            accepted.action,
            now,
            None,
            Some(unannounced),
            won.paused,
            trace,
        )
        .await?;
        Ok(Answered::decided(run_id))
    }

    /// After this gateway settled `ix` with `response` (the last of `votes`, on a question with
    /// `approvals`): once it is on disk, the `interaction` span, the resume job and the
    /// `resolved` announcement. `unannounced`: what [`Gateway::maybe_unannounced`] said, if it
    /// was asked already; `paused`: the run for the resume job to carry, if the settling read it.
    #[allow(clippy::too_many_arguments)]
    async fn decided(
        &self,
        run_id: RunId,
        ix: &StoredInteraction,
        response: &InteractionResponse,
        action: OptionAction,
        now: Timestamp,
        votes: Option<&[Vote]>,
        unannounced: Option<bool>,
        paused: Option<PausedRun>,
        trace: &mut crate::trace::AnswerTrace,
    ) -> Result<(), ApiError> {
        let request_id = ix.request.request_id;
        // Accepted only once it is on disk: no "accepted" that a Redis crash forgets while
        // the resume it queued goes ahead. A retry of this answer is acknowledged again.
        self.store.sync(run_id).await?;
        let waited = Timestamp::now().micros() - ix.request.timestamp.micros();
        self.metrics
            .time_to_answer
            .observe(waited.max(0) as f64 / 1e6);
        delta_host::failpoint("answer:before-publish");
        let resolved = Resolved {
            request_id,
            run_id,
            option_id: response.option_id.clone(),
            action: Some(action),
            responder: response.responder.clone(),
            resolved_at: now,
            state: InteractionState::Answered,
        };
        let span = crate::trace::InteractionSpan::start(
            ix,
            crate::trace::Settled::Answered {
                responder: &response.responder,
                option_id: response.option_id.as_deref(),
                action,
                votes,
            },
        );
        let tp = span.traceparent(ix.traceparent.as_deref());
        trace.decided = Some(span);
        let unannounced = match unannounced {
            Some(u) => u,
            None => self.maybe_unannounced(ix).await,
        };
        self.resume(ix, resolved, Some(now), tp.as_deref(), unannounced, paused)
            .await;
        Ok(())
    }

    /// Whether question `ix` may never have been announced: the job that asked it is still in
    /// the stream. Its worker announces a question before it acks the job, so an acked job's
    /// question was announced; one that is not acked yet may be a worker that died in between
    /// (its job is redelivered, which announces it again, but only after `ack_wait`, and a
    /// person who found it in a listing may answer first). Asked of NATS only for a question
    /// that names its job (asked by a build of 2026-11-25 or later); `true` when NATS cannot
    /// say (announcing it again is harmless: the same `id`). A question the engine reopened is
    /// asked of the job that reopened it, even if this gateway heard it: what it heard may be
    /// the announcement before the reopen. One whose job was let go unannounced (its worker
    /// marked it: NATS would not take the announcement, and it was settled meanwhile) may be.
    pub async fn maybe_unannounced(&self, ix: &StoredInteraction) -> bool {
        if ix.reopened_at.is_none() && self.heard.contains(ix.request.request_id) {
            return false;
        }
        if ix.unannounced {
            return true;
        }
        match ix.asked_by_job {
            Some(seq) => self.queue.job_exists(seq).await.unwrap_or(true),
            None => false,
        }
    }

    /// Whether `response` is a vote its responder cast on `ix` already, the same way.
    fn repeated_vote(&self, ix: &StoredInteraction, response: &InteractionResponse) -> bool {
        ix.votes.iter().any(|v| {
            v.responder == response.responder
                && Some(&v.option_id) == response.option_id.as_ref()
                && v.feedback == vote_text(&ix.request, response)
        })
    }

    /// Counts a vote on a question with `approvals` (docs/protocol.md §3 "Quorum"): who may
    /// vote, once each, the run's submitter not at all (`exclude_requester`), and the question
    /// decided (resumed exactly once) by the vote that reaches the count.
    #[allow(clippy::too_many_arguments)]
    async fn vote(
        &self,
        run_id: RunId,
        ix: &StoredInteraction,
        approvals: &Approvals,
        response: InteractionResponse,
        accepted: AcceptedAnswer,
        groups: &[String],
        submitted_by: Option<&str>,
        now: Timestamp,
        trace: &mut crate::trace::AnswerTrace,
    ) -> Result<Answered, ApiError> {
        let q = &ix.request;
        let who = response.responder.id.clone();
        let acting_as = response.responder.on_behalf_of.as_deref().unwrap_or(&who);
        if !may_vote(ix, approvals, acting_as, groups) {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                format!(
                    "`{who}` may not vote on this question: its votes are for {}",
                    approvals.of.join(", ")
                ),
            ));
        }
        if approvals.exclude_requester
            && submitted_by.is_some()
            && [Some(who.as_str()), Some(acting_as)].contains(&submitted_by)
        {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                format!("`{who}` submitted this run: its approvals must come from other people"),
            ));
        }
        if accepted.action == OptionAction::ApproveAndExecute
            && response
                .data
                .as_ref()
                .is_some_and(|d| d.get("args").is_some())
        {
            return Err(ResponseError::InvalidArgs(format!(
                "this question needs {} approvals: each approves the call as shown, so arguments cannot be edited; reject it saying what should change",
                approvals.min
            ))
            .into());
        }
        let vote = Vote {
            request_id: q.request_id,
            responder: response.responder.clone(),
            ballot: Ballot::of(accepted.action),
            option_id: response.option_id.clone().unwrap_or_default(),
            feedback: vote_text(q, &response),
            request_hash: q.shown_hash(),
            at: now,
        };
        let counted = self
            .store
            .vote(q, &vote, &response, self.config.resume_check)
            .await?;
        let status = match counted {
            Counted::Counted { .. } => AnswerStatus::Counted,
            Counted::Decided { .. } => AnswerStatus::Accepted,
            Counted::Repeat => {
                self.store.sync(run_id).await?;
                let (_, now_ix) = self.find(q.request_id).await?;
                return Ok(Answered {
                    run_id,
                    status: match now_ix.state {
                        InteractionState::Pending => AnswerStatus::Counted,
                        _ => AnswerStatus::Accepted,
                    },
                    tally: Some(Tally::of(&now_ix.votes, approvals.min)),
                });
            }
            Counted::AlreadyVoted => return Err(ResponseError::AlreadyVoted(who).into()),
            Counted::Settled(_) => {
                let (_, now_ix) = self.find(q.request_id).await?;
                let run = self.settled(run_id, &now_ix, &response)?;
                self.store.sync(run_id).await?;
                return Ok(Answered::decided(run));
            }
            Counted::Claimed(c) => {
                return Err(ResponseError::Claimed {
                    request_id: q.request_id,
                    by: c.by,
                    until: c.until,
                }
                .into());
            }
        };
        // The votes as stored now (others may have voted at the same time).
        let votes = match self.store.interaction(run_id, q.request_id).await {
            Ok(Some(now_ix)) => now_ix.votes,
            _ => ix.votes.iter().cloned().chain([vote]).collect(),
        };
        if status == AnswerStatus::Accepted {
            let action = accepted.action;
            self.decided(
                run_id,
                ix,
                &response,
                action,
                now,
                Some(&votes),
                None,
                None,
                trace,
            )
            .await?;
        } else {
            self.store.sync(run_id).await?;
        }
        let tally = Tally::of(&votes, approvals.min);
        self.announce(q, Change::Voted, &who, None, Some(tally.clone()))
            .await;
        Ok(Answered {
            run_id,
            status,
            tally: Some(tally),
        })
    }

    /// Takes, renews or gives back `responder`'s claim on `request_id`; an operator's release of
    /// someone else's claim breaks it (docs/protocol.md §3 "Claims").
    pub async fn claim(
        &self,
        request_id: RequestId,
        body: ClaimBody,
        responder: Responder,
        groups: &[String],
        operator: bool,
    ) -> Result<ClaimState, ApiError> {
        let ttl = body.ttl_seconds.unwrap_or(CLAIM_TTL_S);
        if !CLAIM_TTL_RANGE.contains(&ttl) {
            return Err(ApiError::bad_request(format!(
                "ttl_seconds is {ttl}: a claim lasts {} to {} seconds",
                CLAIM_TTL_RANGE.start(),
                CLAIM_TTL_RANGE.end()
            )));
        }
        let (run_id, ix) = self.find(request_id).await?;
        if ix.state != InteractionState::Pending {
            return Err(ApiError::new(
                ErrorCode::AlreadyResolved,
                format!(
                    "request {request_id} is {}: there is nothing to claim",
                    ix.state.as_str().to_lowercase()
                ),
            ));
        }
        let who = responder.id.clone();
        let may_answer =
            may_decide(&ix, &who, groups) || self.delegator(&ix, &who).await?.is_some();
        let someone_elses = ix.claim.as_ref().is_some_and(|c| c.by != who);
        let mode = match (body.release, someone_elses && operator) {
            (true, true) => ClaimMode::Break,
            (true, false) => ClaimMode::Release,
            (false, _) => ClaimMode::Take(std::time::Duration::from_secs(ttl)),
        };
        if !may_answer && mode != ClaimMode::Break {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                format!("`{who}` may not answer this question, so may not claim it"),
            ));
        }
        let (change, claim) = match self.store.claim(run_id, request_id, &who, mode).await? {
            Claimed::Done(c) => match mode {
                ClaimMode::Take(_) => (Change::Claimed, c),
                ClaimMode::Release => (Change::Released, None),
                ClaimMode::Break => (Change::ClaimBroken, None),
            },
            Claimed::Held(c) => {
                return Err(ResponseError::Claimed {
                    request_id,
                    by: c.by,
                    until: c.until,
                }
                .into());
            }
            Claimed::Voted => {
                return Err(ApiError::new(
                    ErrorCode::AlreadyVoted,
                    format!(
                        "`{who}` has voted on request {request_id}: a claim would only hold the others off"
                    ),
                ));
            }
            Claimed::Settled(state) => {
                return Err(ApiError::new(
                    ErrorCode::AlreadyResolved,
                    format!(
                        "request {request_id} is {}: there is nothing to claim",
                        state.as_str().to_lowercase()
                    ),
                ));
            }
        };
        self.store.sync(run_id).await?;
        let tally = ix
            .request
            .approvals
            .as_ref()
            .map(|a| Tally::of(&ix.votes, a.min));
        self.announce(&ix.request, change, &who, claim.clone(), tally)
            .await;
        Ok(ClaimState { request_id, claim })
    }

    /// Whose authority `responder` answers with (theirs, or the delegator's) and that person's
    /// groups.
    fn authority(&self, responder: &Responder, groups: &[String]) -> (String, Vec<String>) {
        match &responder.on_behalf_of {
            Some(from) => (from.clone(), self.config.auth.groups_of(from)),
            None => (responder.id.clone(), groups.to_vec()),
        }
    }

    /// A person who delegated to `to` (a delegation in force) and may decide `ix` themselves,
    /// if there is one.
    pub async fn delegator(
        &self,
        ix: &StoredInteraction,
        to: &str,
    ) -> Result<Option<String>, ApiError> {
        let now = Timestamp::now();
        let found = self
            .store
            .delegations(now)
            .await?
            .into_iter()
            .filter(|d| d.to == to)
            .find(|d| may_decide(ix, &d.from, &self.config.auth.groups_of(&d.from)))
            .map(|d| d.from);
        Ok(found)
    }

    /// Announces a claim or a vote on `…interactions.updated.…` (best effort: the views read
    /// the store).
    async fn announce(
        &self,
        q: &delta_protocol::InteractionRequest,
        change: Change,
        by: &str,
        claim: Option<delta_protocol::Claim>,
        tally: Option<Tally>,
    ) {
        let update = InteractionUpdate {
            request_id: q.request_id,
            run_id: q.run_id,
            agent: q.agent.clone(),
            change,
            by: by.to_owned(),
            claim,
            tally,
            at: Timestamp::now(),
        };
        if let Err(e) = self.queue.publish_update(&update).await {
            tracing::warn!(error = %delta_host::Chain(&e), request = %q.request_id, "claim or vote not announced");
        }
    }

    /// The run and stored interaction of a request, or `not_found`.
    pub async fn find(
        &self,
        request_id: RequestId,
    ) -> Result<(RunId, StoredInteraction), ApiError> {
        let missing = || {
            ApiError::not_found(format!(
                "no interaction request {request_id}; GET /v1/interactions lists the pending ones"
            ))
        };
        self.store
            .find_interaction(request_id)
            .await?
            .ok_or_else(missing)
    }

    /// The reply to an answer for a request that is no longer pending: acknowledged again when
    /// it is the accepted answer itself, refused otherwise.
    fn settled(
        &self,
        run_id: RunId,
        ix: &StoredInteraction,
        response: &InteractionResponse,
    ) -> Result<RunId, ApiError> {
        let rid = ix.request.request_id;
        match ix.state {
            InteractionState::Answered => {
                // A sensitive answer is never compared for anyone who cannot prove they gave
                // it: with authentication off, "identical or not" would let anyone test guesses.
                let may_compare = !ix.request.is_sensitive() || self.config.auth.is_on();
                let same = may_compare
                    && ix
                        .response
                        .clone()
                        .and_then(|r| self.store.open(&ix.request, r).ok())
                        .is_some_and(|accepted| accepted == *response);
                if same {
                    return Ok(run_id);
                }
                let by = ix
                    .response
                    .as_ref()
                    .filter(|_| !ix.request.is_sensitive())
                    .map(|r| format!(" by {}", r.responder.id))
                    .unwrap_or_default();
                let at = ix
                    .answered_at
                    .map(|t| format!(" at {t}"))
                    .unwrap_or_default();
                Err(ApiError::new(
                    ErrorCode::AlreadyResolved,
                    format!("request {rid} was already answered{by}{at}"),
                ))
            }
            InteractionState::Expired => Err(ApiError::new(
                ErrorCode::Expired,
                format!(
                    "request {rid} expired{}; its default was applied or its run failed",
                    ix.request
                        .expires_at
                        .map(|t| format!(" at {t}"))
                        .unwrap_or_default()
                ),
            )),
            InteractionState::Cancelled => Err(ApiError::new(
                ErrorCode::AlreadyResolved,
                format!("request {rid} was closed: its run was cancelled"),
            )),
            InteractionState::Pending => Err(ApiError::unavailable("try again")),
        }
    }

    /// After an interaction was settled: announce it (`resolved`), then publish its run's resume
    /// job (idempotent) and note it. In that order, so that the settling precedes in the events
    /// stream whatever the resumed run announces next (its next question, its end), and no job
    /// goes out unannounced. `unannounced` (see [`Gateway::maybe_unannounced`]): the question
    /// itself is announced first (`requested`, its usual `id`: dropped as a duplicate if its
    /// worker did announce it), so that it precedes its answer in the stream. A failure here is
    /// left to the resume reconciler, which announces `resolved` (again: the same id) and then
    /// publishes the job.
    /// `traceparent` is the question's `interaction` span (crate::trace), or what was stored.
    pub async fn resume(
        &self,
        ix: &StoredInteraction,
        resolved: Resolved,
        answered_at: Option<Timestamp>,
        traceparent: Option<&str>,
        unannounced: bool,
        paused: Option<PausedRun>,
    ) {
        let q = &ix.request;
        let mut job = Job::resume(q.run_id, Some(q.request_id));
        // The run as the settling read it (at most 8 KiB of it), for the job's first delivery to
        // resume it without reading it back (docs/protocol.md "Job messages").
        job.paused = paused;
        let tp = traceparent;
        let announced = if unannounced {
            // Both to the events stream in one go: the question, then its settling.
            self.queue
                .publish_request_and_resolved(
                    q,
                    ix.reopened_at,
                    ix.traceparent.as_deref(),
                    &resolved,
                    tp,
                )
                .await
        } else {
            self.queue.publish_resolved(&q.agent, &resolved, tp).await
        };
        if let Err(e) = announced {
            // No job without its announcement: the reconciler does both, in this order.
            tracing::warn!(error = %delta_host::Chain(&e), request = %q.request_id, "`resolved` not announced, nor the resume published; the reconciler will");
            return;
        }
        let msg_id = job.resume_msg_id(answered_at);
        match self.queue.publish_job_as(&q.agent, &job, &msg_id, tp).await {
            Ok(seq) => {
                let recheck_us = Timestamp::now().micros()
                    + i64::try_from(self.config.lost_job_after.as_micros()).unwrap_or(i64::MAX);
                self.notes
                    .note(Note::ResumePublished {
                        run_id: q.run_id,
                        request_id: q.request_id,
                        seq,
                        recheck_us,
                    })
                    .await;
            }
            Err(e) => {
                tracing::warn!(error = %delta_host::Chain(&e), request = %q.request_id, "resume not published; the reconciler will");
            }
        }
    }

    /// The `resolved` announcement of a settled interaction, rebuilt from what is stored.
    pub fn resolved_of(&self, run_id: RunId, ix: &StoredInteraction) -> Option<Resolved> {
        let q = &ix.request;
        let (option, responder) = match (ix.state, &ix.response) {
            (InteractionState::Answered, Some(r)) => (
                r.option_id.as_deref().and_then(|o| q.option(o)),
                r.responder.clone(),
            ),
            (InteractionState::Expired, _) => (
                q.default_option_id.as_deref().and_then(|d| q.option(d)),
                Responder {
                    id: "timeout".into(),
                    via: Via::Timeout,
                    on_behalf_of: None,
                    relayed_by: None,
                },
            ),
            _ => return None,
        };
        let action = match (ix.state, option) {
            (_, Some(o)) => Some(o.action),
            (InteractionState::Answered, None) => Some(delta_protocol::OptionAction::ProvideInfo),
            _ => None,
        };
        Some(Resolved {
            request_id: q.request_id,
            run_id,
            option_id: option.map(|o| o.option_id.clone()),
            action,
            responder,
            resolved_at: ix.answered_at.unwrap_or_else(Timestamp::now),
            state: ix.state,
        })
    }

    /// Closes an expired question (the deadline reconciler): the run resumes and applies the
    /// default option, or fails without one. `false` when it was no longer pending.
    pub async fn expire(&self, run_id: RunId, request_id: RequestId) -> Result<bool, ApiError> {
        let Some(ix) = self.store.interaction(run_id, request_id).await? else {
            self.store.drop_deadline(run_id, request_id).await?;
            return Ok(false);
        };
        if ix.state != InteractionState::Pending {
            self.store.drop_deadline(run_id, request_id).await?;
            return Ok(false);
        }
        if !ix.request.is_expired_at(Timestamp::now()) {
            return Ok(false);
        }
        let at = Timestamp::now();
        let won = self
            .store
            .resolve(
                &ix.request,
                Resolution::Expired(at),
                self.config.resume_check,
            )
            .await?;
        if won.is_some() {
            return Ok(false);
        }
        self.metrics.timeouts_applied.inc();
        let default = ix
            .request
            .default_option_id
            .as_deref()
            .and_then(|d| ix.request.option(d));
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
            resolved_at: at,
            state: InteractionState::Expired,
        };
        let span = crate::trace::InteractionSpan::start(
            &ix,
            crate::trace::Settled::Expired {
                escalation: false,
                steps: ix.escalated,
            },
        );
        let tp = span.traceparent(ix.traceparent.as_deref());
        let unannounced = self.maybe_unannounced(&ix).await;
        self.resume(&ix, resolved, None, tp.as_deref(), unannounced, None)
            .await;
        span.end();
        Ok(true)
    }

    /// Cancels a run that is not final: journals who cancelled it and ends it `CANCELLED`; a
    /// question it waited on is closed. A worker still holding the run has its next write
    /// refused and drops the job.
    pub async fn cancel(
        &self,
        run_id: RunId,
        by: &str,
        reason: Option<&str>,
    ) -> Result<RunStatus, ApiError> {
        // Journaled three times and announced: bounded (a reason past NATS's largest message
        // would leave the run's end unannounced).
        if reason.is_some_and(|r| r.chars().count() > MAX_CANCEL_REASON_CHARS) {
            return Err(ApiError::new(
                ErrorCode::InvalidArgs,
                format!(
                    "reason is longer than {MAX_CANCEL_REASON_CHARS} characters: say it shorter"
                ),
            ));
        }
        let record = self.store.record(run_id).await?;
        if record.status.is_terminal() {
            // Its announcements made once more (idempotent: the same event ids): a cancel
            // retried after the gateway that took it died between ending the run and announcing
            // it. The question it closed first, as then (the cancel's write no longer names it:
            // found in the journal).
            // Not when the events stream has the run's end already (the first cancel announced
            // it): a copy past the stream's duplicate window would reach every consumer again.
            let announced = record.status == RunStatus::Cancelled
                && self
                    .queue
                    .run_end_in_stream("cancelled", &record.agent, run_id)
                    .await
                    .unwrap_or(false);
            if record.status == RunStatus::Cancelled && !announced {
                match self.store.load(run_id).await {
                    Ok(run) => {
                        let closed = delta_protocol::journal::Replay::new(&run.journal)
                            .pending()
                            .map(|q| q.request_id);
                        if let Some(ix) = self.closed_by_cancel(run_id, closed).await {
                            self.announce_cancelled(&record.agent, &ix, by).await;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %delta_host::Chain(&e), run = %run_id, "the cancelled run's question not announced again");
                    }
                }
                self.announce_ended(&record).await;
            }
            return Err(ApiError::new(
                ErrorCode::AlreadyResolved,
                format!("run {run_id} is already {}", record.status),
            ));
        }
        let why = match reason {
            Some(r) if !r.trim().is_empty() => format!("cancelled by {by}: {r}"),
            _ => format!("cancelled by {by}"),
        };
        let events = vec![
            Event::SystemMessage(SystemMessage {
                level: MessageLevel::Warn,
                content: why.clone(),
            }),
            Event::EngineEnd(delta_protocol::EngineEnd {
                status: RunStatus::Cancelled,
                result: None,
                error: Some(why.clone()),
            }),
        ];
        let change = StatusChange::Finished {
            status: Terminal::Cancelled,
            result: None,
            error: Some(why),
        };
        self.store.append(run_id, events, Some(change)).await?;
        delta_host::failpoint("cancel:before-announce");
        // A worker running one of its steps stops it (best effort: its writes are refused anyway).
        self.queue.announce_cancelled(run_id).await;
        if let Some(ix) = self
            .closed_by_cancel(run_id, record.pending_request_id)
            .await
        {
            crate::trace::InteractionSpan::start(&ix, crate::trace::Settled::Cancelled { by })
                .end();
            // The worker that asked it announces it, then lets its job go: a cancel landing in
            // between waits for that (briefly), so that the question is announced before its
            // cancellation and the run's end, not after.
            if let Some(seq) = ix.asked_by_job {
                self.job_let_go(seq, ASKER_WAIT).await;
            }
            self.announce_cancelled(&record.agent, &ix, by).await;
        }
        match self.store.record(run_id).await {
            Ok(record) => self.announce_ended(&record).await,
            Err(e) => {
                tracing::warn!(error = %delta_host::Chain(&e), run = %run_id, "the cancelled run's end not announced");
            }
        }
        Ok(RunStatus::Cancelled)
    }

    /// Waits (up to `within`) until job `seq` is no longer in the jobs stream: its worker
    /// acknowledged it (or it was removed). Gives up at once if NATS cannot say.
    async fn job_let_go(&self, seq: u64, within: std::time::Duration) {
        let until = std::time::Instant::now() + within;
        while std::time::Instant::now() < until {
            match self.queue.job_exists(seq).await {
                Ok(true) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
                _ => return,
            }
        }
    }

    /// Question `rid` of `run_id`, if a cancel closed it (not one answered already).
    async fn closed_by_cancel(
        &self,
        run_id: RunId,
        rid: Option<RequestId>,
    ) -> Option<StoredInteraction> {
        self.store
            .interaction(run_id, rid?)
            .await
            .ok()
            .flatten()
            .filter(|ix| ix.state == InteractionState::Cancelled)
    }

    /// Announces that a cancel (by `by`) closed question `ix` of a run of `agent`; best effort.
    /// Its event's id is that of its closing, the same however often it is announced.
    async fn announce_cancelled(&self, agent: &str, ix: &StoredInteraction, by: &str) {
        let resolved = Resolved {
            request_id: ix.request.request_id,
            run_id: ix.request.run_id,
            option_id: None,
            action: None,
            responder: Responder {
                id: by.to_owned(),
                via: Via::Http,
                on_behalf_of: None,
                relayed_by: None,
            },
            resolved_at: ix.answered_at.unwrap_or_else(Timestamp::now),
            state: InteractionState::Cancelled,
        };
        if let Err(e) = self.queue.publish_resolved(agent, &resolved, None).await {
            tracing::warn!(error = %delta_host::Chain(&e), "`resolved` of a cancelled run's question not announced");
        }
    }

    /// Announces that `record`'s run ended (`run.cancelled`…), if it did; best effort.
    async fn announce_ended(&self, record: &delta_store::RunRecord) {
        if let Some(ended) = record.ended()
            && let Err(e) = self.queue.publish_run_ended(&ended, None).await
        {
            tracing::warn!(error = %delta_host::Chain(&e), run = %record.run_id, "a run's end not announced");
        }
    }
}

/// `data` of an answer: an object; `args` (edited tool arguments) an object, `tasks` (an edited
/// plan) a list. The worker checks them against the agent's tools.
fn check_data_shape(data: &Value) -> Result<(), ApiError> {
    let Some(obj) = data.as_object() else {
        return Err(ApiError::new(
            ErrorCode::InvalidArgs,
            "`data` must be a JSON object (e.g. {\"args\": {…}} to edit a tool call's arguments)",
        ));
    };
    if obj.get("args").is_some_and(|a| !a.is_object()) {
        return Err(ApiError::new(
            ErrorCode::InvalidArgs,
            "`data.args` must be a JSON object of arguments",
        ));
    }
    if obj.get("tasks").is_some_and(|t| !t.is_array()) {
        return Err(ApiError::new(
            ErrorCode::InvalidArgs,
            "`data.tasks` must be a list of tasks",
        ));
    }
    Ok(())
}

/// How an interaction is shown in listings and the API: the request, its state, and its answer
/// with sensitive parts as `"***"` (docs/protocol.md §3, answer rule 9).
pub fn interaction_view(run_id: RunId, ix: &StoredInteraction) -> InteractionView {
    let response = ix.response.as_ref().map(|r| {
        let mut r = r.clone();
        if ix.request.is_sensitive() {
            let hide = |s: &mut Option<String>| {
                if s.is_some() {
                    *s = Some(REDACTED.to_owned());
                }
            };
            hide(&mut r.input);
            hide(&mut r.feedback);
            if r.data.is_some() {
                r.data = Some(Value::String(REDACTED.into()));
            }
        }
        r
    });
    InteractionView {
        request_id: ix.request.request_id,
        run_id,
        agent: ix.request.agent.clone(),
        kind: ix.request.kind,
        state: ix.state,
        created_at: ix.request.timestamp,
        expires_at: ix.request.expires_at,
        answered_at: ix.answered_at,
        request: ix.request.clone(),
        response,
        request_hash: ix.request.shown_hash(),
        claim: ix
            .claim
            .clone()
            .filter(|_| ix.state == InteractionState::Pending),
        tally: ix
            .request
            .approvals
            .as_ref()
            .map(|a| Tally::of(&ix.votes, a.min)),
        escalated: ix.escalated,
        added_responders: ix.added_responders.clone(),
    }
}

/// Whether `responder` (a member of `groups`) may answer `ix`: its `allowed_responders`, or
/// one its escalation added.
pub fn may_answer(ix: &StoredInteraction, responder: &Responder, groups: &[String]) -> bool {
    ix.request.allows(responder, groups)
        || delta_protocol::human::admitted_by(&ix.added_responders, &responder.id, groups)
}

/// Whether `id` (a member of `groups`) may decide `ix` on their own: answer it, and vote on it
/// when it takes votes.
fn may_decide(ix: &StoredInteraction, id: &str, groups: &[String]) -> bool {
    may_answer(ix, &Responder::new(id, Via::Http), groups)
        && ix
            .request
            .approvals
            .as_ref()
            .is_none_or(|a| may_vote(ix, a, id, groups))
}

/// Whether `id` (a member of `groups`) may vote on `ix`: `approvals.of`, or one its escalation
/// added.
fn may_vote(ix: &StoredInteraction, approvals: &Approvals, id: &str, groups: &[String]) -> bool {
    approvals.admits(id, groups)
        || delta_protocol::human::admitted_by(&ix.added_responders, id, groups)
}

/// The free text a vote journals: the reason given (`input`, else `feedback`), `"***"` for a
/// sensitive question.
fn vote_text(q: &delta_protocol::InteractionRequest, r: &InteractionResponse) -> Option<String> {
    r.input
        .as_deref()
        .or(r.feedback.as_deref())
        .filter(|t| !t.trim().is_empty())
        .map(|t| {
            if q.is_sensitive() {
                REDACTED.to_owned()
            } else {
                t.to_owned()
            }
        })
}

/// A key a caller chose (an A2A `messageId`, an MCP idempotency key), scoped to that caller:
/// the first 16 bytes of the SHA-256 of their name and the key, in hex. Two callers' equal keys
/// never meet.
pub fn callers_key(who: Option<&str>, key: &str) -> String {
    let input = format!("{}\n{key}", who.unwrap_or("-"));
    let digest = ring::digest::digest(&ring::digest::SHA256, input.as_bytes());
    digest.as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
