//! Votes and claims on a pending question (docs/protocol.md §3 "Quorum" and "Claims"), each one
//! script on the question's hash, so that any number of gateways counting votes and taking
//! claims at once see one order: a person votes once, the vote that reaches `min` decides the
//! question exactly once, and an answer or vote against someone else's live claim is refused.
//!
//! In the question's hash (`…:ix:<request_id>`): `vote:<responder>` (the vote's JSON, as
//! journaled), `votefp:<responder>` (what an identical repeat must match), `approvals` and
//! `rejections` (counts), `claim_by` and `claim_until` (µs). The claim holder's vote (or
//! answer) ends their claim. A vote is journaled (`HUMAN_VOTE`)
//! in the same script: the run is waiting, no worker writes to it, and the resume its deciding
//! vote queues comes after.

use std::sync::LazyLock;
use std::time::Duration;

use delta_protocol::{
    Ballot, Claim, Event, InteractionRequest, InteractionResponse, InteractionState, RunId,
    Timestamp, Vote,
};
use redis::Script;

use super::{RedisRunStore, script_error};
use crate::Error;

/// Counts a vote. KEYS: the question, the run, its journal. ARGV: voter, ballot (`approve` |
/// `reject`), the vote's JSON, its fingerprint, the answer's JSON (applied if this vote decides),
/// now, now (µs), min, veto (`1` or ``), bucket tag, request id, resume member, when to check
/// the resume (µs), the journal event (its JSON after `{"seq":…,"timestamp":…,`), whose
/// authority the vote uses (the voter's own, or the delegator's: one vote per authority too, so
/// delegates cannot fill a quorum with one person's authority).
/// Returns `{outcome, a, b}`: `COUNTED`/`DECIDED` with the counts, `REPEAT` (this very vote
/// again) or `VOTED` (another vote of this voter) with the state, `STATE` (not pending) with it,
/// `CLAIMED` with who and until (µs).
const VOTE: &str = r#"
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return redis.error_reply('NOTFOUND') end
local voter = ARGV[1]
if redis.call('HEXISTS', KEYS[1], 'vote:' .. voter) == 1 then
  if redis.call('HGET', KEYS[1], 'votefp:' .. voter) == ARGV[4] then return {'REPEAT', st, ''} end
  return {'VOTED', st, ''}
end
local authority = ARGV[15]
if redis.call('HEXISTS', KEYS[1], 'auth:' .. authority) == 1 then return {'VOTED', st, ''} end
if st ~= 'PENDING' then return {'STATE', st, ''} end
local by = redis.call('HGET', KEYS[1], 'claim_by')
local till = redis.call('HGET', KEYS[1], 'claim_until')
if by and by ~= voter and tonumber(till or '0') > tonumber(ARGV[7]) then
  return {'CLAIMED', by, till}
end
redis.call('HSET', KEYS[1], 'vote:' .. voter, ARGV[3], 'votefp:' .. voter, ARGV[4], 'auth:' .. authority, voter)
-- The holder's vote ends their claim: they are done with it, and the others may vote.
if by == voter then redis.call('HDEL', KEYS[1], 'claim_by', 'claim_until') end
local a = redis.call('HINCRBY', KEYS[1], 'approvals', ARGV[2] == 'approve' and 1 or 0)
local r = redis.call('HINCRBY', KEYS[1], 'rejections', ARGV[2] == 'reject' and 1 or 0)
local seq = tonumber(redis.call('HGET', KEYS[2], 'seq') or '0') + 1
redis.call('XADD', KEYS[3], seq .. '-0', 'e', '{"seq":' .. seq .. ',"timestamp":"' .. ARGV[6] .. '",' .. ARGV[14])
redis.call('HSET', KEYS[2], 'seq', seq, 'updated_at', ARGV[6])
local min = tonumber(ARGV[8])
local decided = a >= min or (ARGV[2] == 'reject' and (ARGV[9] == '1' or r >= min))
if not decided then return {'COUNTED', tostring(a), tostring(r)} end
redis.call('HSET', KEYS[1], 'state', 'ANSWERED', 'answered_at', ARGV[6], 'response', ARGV[5])
redis.call('HDEL', KEYS[1], 'claim_by', 'claim_until')
redis.call('ZREM', ARGV[10] .. ':interactions:pending', ARGV[11])
redis.call('ZREM', ARGV[10] .. ':interactions:deadlines', ARGV[11])
redis.call('ZREM', ARGV[10] .. ':interactions:escalations', ARGV[11])
redis.call('ZADD', ARGV[10] .. ':resumes', ARGV[13], ARGV[12])
return {'DECIDED', tostring(a), tostring(r)}
"#;

/// Takes, renews, releases or breaks a claim. KEYS: the question. ARGV: who, mode (`take`,
/// `release`, `break`), until (µs), now (µs). Returns `{outcome, by, until}`: `OK` with the claim
/// now (or `''` when none; for `break`, whose claim it was), `HELD` with the other holder's,
/// `STATE` with the state when the question is not pending.
const CLAIM: &str = r#"
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return redis.error_reply('NOTFOUND') end
if st ~= 'PENDING' then return {'STATE', st, ''} end
local by = redis.call('HGET', KEYS[1], 'claim_by')
local till = redis.call('HGET', KEYS[1], 'claim_until') or '0'
local held = by and tonumber(till) > tonumber(ARGV[4])
local mode = ARGV[2]
if mode == 'break' then
  redis.call('HDEL', KEYS[1], 'claim_by', 'claim_until')
  if held then return {'OK', by, till} end
  return {'OK', '', ''}
end
if held and by ~= ARGV[1] then return {'HELD', by, till} end
if mode == 'take' and redis.call('HEXISTS', KEYS[1], 'vote:' .. ARGV[1]) == 1 then
  -- A voter is done with it: a claim would only hold the others off.
  return {'VOTED', '', ''}
end
if mode == 'take' then
  redis.call('HSET', KEYS[1], 'claim_by', ARGV[1], 'claim_until', ARGV[3])
  return {'OK', ARGV[1], ARGV[3]}
end
redis.call('HDEL', KEYS[1], 'claim_by', 'claim_until')
return {'OK', '', ''}
"#;

/// Carries out step `n` (0-based) of a question's escalation, once: journals it, counts it
/// (`escalated`, with when in `escalated_at`), widens who may answer (`added_responders`) or,
/// with `apply_default`, settles the question `EXPIRED` and queues its resume. A step not
/// applying the default is marked not announced yet (`escalated_unannounced` is `n + 1`): the
/// question is looked at again at the check time, when the caller has not announced it and
/// scheduled the next step by then ([`ESCALATION_ANNOUNCED`]). KEYS: the question, the run, its journal.
/// ARGV: n, now, now (µs), the journal event (after its opening brace), the added responders'
/// JSON after this step (`''`: unchanged), `1` to apply the default, bucket tag, request id,
/// resume member, when to look again (µs). Returns `{outcome, x}`: `DONE`, `DEFAULT`, `STALE`
/// (another gateway did this step: x is how many are done), `STATE` (not pending: x is the
/// state).
const ESCALATE: &str = r#"
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return redis.error_reply('NOTFOUND') end
if st ~= 'PENDING' then
  redis.call('ZREM', ARGV[7] .. ':interactions:escalations', ARGV[8])
  return {'STATE', st}
end
local done = tonumber(redis.call('HGET', KEYS[1], 'escalated') or '0')
if done ~= tonumber(ARGV[1]) then return {'STALE', tostring(done)} end
local seq = tonumber(redis.call('HGET', KEYS[2], 'seq') or '0') + 1
redis.call('XADD', KEYS[3], seq .. '-0', 'e', '{"seq":' .. seq .. ',"timestamp":"' .. ARGV[2] .. '",' .. ARGV[4])
redis.call('HSET', KEYS[2], 'seq', seq, 'updated_at', ARGV[2])
redis.call('HSET', KEYS[1], 'escalated', done + 1, 'escalated_at', ARGV[3])
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'added_responders', ARGV[5]) end
if ARGV[6] == '1' then
  redis.call('HSET', KEYS[1], 'state', 'EXPIRED', 'answered_at', ARGV[2])
  redis.call('HDEL', KEYS[1], 'claim_by', 'claim_until')
  redis.call('ZREM', ARGV[7] .. ':interactions:pending', ARGV[8])
  redis.call('ZREM', ARGV[7] .. ':interactions:deadlines', ARGV[8])
  redis.call('ZREM', ARGV[7] .. ':interactions:escalations', ARGV[8])
  redis.call('ZADD', ARGV[7] .. ':resumes', ARGV[10], ARGV[9])
  return {'DEFAULT', ''}
end
redis.call('HSET', KEYS[1], 'escalated_unannounced', done + 1)
redis.call('ZADD', ARGV[7] .. ':interactions:escalations', ARGV[10], ARGV[8])
return {'DONE', ''}
"#;

/// Records that a question's escalation steps up to its `k`-th are announced, and schedules the
/// look at its next step (at its due time, `''`: none, the question leaves the index), if the
/// question is still pending and its `k`-th step is still its last carried out (another
/// gateway's later step is that gateway's to announce). KEYS: the question, the escalation
/// index. ARGV: k, the next step's due time (µs) or `''`, request id. Returns 1 if recorded.
const ESCALATION_ANNOUNCED: &str = r#"
if redis.call('HGET', KEYS[1], 'state') ~= 'PENDING' then
  redis.call('ZREM', KEYS[2], ARGV[3])
  return 0
end
if redis.call('HGET', KEYS[1], 'escalated') ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], 'escalated_unannounced')
if ARGV[2] ~= '' then
  redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
else
  redis.call('ZREM', KEYS[2], ARGV[3])
end
return 1
"#;

/// Schedules a question's next escalation look, only while it is pending (a settle racing it
/// must not leave an entry behind). KEYS: the question, the escalation index. ARGV: when (µs),
/// request id.
const RESCHEDULE: &str = r#"
if redis.call('HGET', KEYS[1], 'state') ~= 'PENDING' then
  redis.call('ZREM', KEYS[2], ARGV[2])
  return 0
end
redis.call('ZADD', KEYS[2], ARGV[1], ARGV[2])
return 1
"#;

/// Marks a settled question that its asking job let go while it may be unannounced
/// (`unannounced`), if it is still there and still settled: a pending one (reopened since the
/// caller read it) is announced by the job that reopened it, and a reopen clears the mark.
/// KEYS: the question.
const UNANNOUNCED: &str = r#"
local st = redis.call('HGET', KEYS[1], 'state')
if not st or st == 'PENDING' then return 0 end
redis.call('HSET', KEYS[1], 'unannounced', '1')
return 1
"#;

/// Stores a delegation and removes the others of its pair (`from`, `to`). KEYS: the delegations
/// hash. ARGV: id, from, to, JSON. Returns how many it replaced.
const PUT_DELEGATION: &str = r#"
local all = redis.call('HGETALL', KEYS[1])
local replaced = 0
for i = 1, #all, 2 do
  local ok, d = pcall(cjson.decode, all[i + 1])
  if ok and type(d) == 'table' and d['from'] == ARGV[2] and d['to'] == ARGV[3] and all[i] ~= ARGV[1] then
    redis.call('HDEL', KEYS[1], all[i])
    replaced = replaced + 1
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[4])
return replaced
"#;

/// The scripts, hashed once.
static UNANNOUNCED_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(UNANNOUNCED));
static VOTE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(VOTE));
static CLAIM_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(CLAIM));
static ESCALATE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(ESCALATE));
static RESCHEDULE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RESCHEDULE));
static PUT_DELEGATION_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(PUT_DELEGATION));
static ESCALATION_ANNOUNCED_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(ESCALATION_ANNOUNCED));

/// What [`RedisRunStore::escalate`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Escalation {
    /// The step is journaled and counted; the caller announces it, then records that
    /// ([`RedisRunStore::escalation_announced`]), which schedules the next step.
    Done,
    /// The step applied the default: the question is settled `EXPIRED`, its resume queued.
    DefaultApplied,
    /// Another gateway carried this step out already (`n` steps are done).
    Stale(u32),
    /// The question is no longer pending.
    Settled(InteractionState),
}

/// What became of a vote ([`RedisRunStore::vote`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Counted {
    /// Counted; the question is still pending.
    Counted { approvals: u32, rejections: u32 },
    /// Counted, and it decided the question: its run's resume is queued.
    Decided { approvals: u32, rejections: u32 },
    /// This voter's same vote, counted before (a retry): acknowledged, nothing changed.
    Repeat,
    /// This voter voted otherwise before: refused.
    AlreadyVoted,
    /// The question is no longer pending.
    Settled(InteractionState),
    /// Someone else holds a live claim on it.
    Claimed(Claim),
}

/// What a claim call did ([`RedisRunStore::claim`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claimed {
    /// Done: the claim as it is now (`None`: released; for a break, the claim it broke).
    Done(Option<Claim>),
    /// Someone else holds a live claim.
    Held(Claim),
    /// The question is no longer pending.
    Settled(InteractionState),
    /// The claimant voted on it already: they may not hold the others off.
    Voted,
}

/// What a claim call asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimMode {
    /// Take it, or renew one's own, for this long.
    Take(Duration),
    /// Give one's own back.
    Release,
    /// End whoever's claim (an operator).
    Break,
}

pub(super) fn claim_of(by: String, until: &str) -> Option<Claim> {
    let until = Timestamp::from_micros(until.parse().ok()?)?;
    (!by.is_empty()).then_some(Claim { by, until })
}

impl RedisRunStore {
    /// Counts `vote` (by `response.responder`) on `request`, pending with `approvals`, and
    /// journals it; decides the question with `response` as its answer when the vote reaches
    /// `min` approvals (or is a rejection that decides). The answer is sealed as [`Self::resolve`]
    /// seals it; a sensitive question's vote carries no free text.
    pub async fn vote(
        &self,
        request: &InteractionRequest,
        vote: &Vote,
        response: &InteractionResponse,
        check_after: Duration,
    ) -> Result<Counted, Error> {
        let run_id = request.run_id;
        let Some(approvals) = &request.approvals else {
            return Err(Error::Corrupt(format!(
                "request {} needs no votes",
                request.request_id
            )));
        };
        let stored = self.seal(request, response)?;
        let rid = request.request_id.to_string();
        let now = vote.at;
        let check_at = now.micros() + i64::try_from(check_after.as_micros()).unwrap_or(0);
        let event = serde_json::to_string(&Event::HumanVote(vote.clone())).unwrap_or_default();
        // The journal line's head (`{"seq":…,"timestamp":…,`) is the script's: the event's JSON
        // goes in after its opening brace.
        let tail = event.strip_prefix('{').unwrap_or(&event).to_owned();
        let fingerprint = format!(
            "{}\n{}",
            vote.option_id,
            vote.feedback.as_deref().unwrap_or_default()
        );
        let mut inv = VOTE_SCRIPT.key(self.interaction_key(run_id, &rid));
        inv.key(self.run_key(run_id))
            .key(self.journal_key(run_id))
            .arg(&vote.responder.id)
            .arg(match vote.ballot {
                Ballot::Approve => "approve",
                Ballot::Reject => "reject",
            })
            .arg(serde_json::to_string(vote).unwrap_or_default())
            .arg(fingerprint)
            .arg(serde_json::to_string(&stored).unwrap_or_default())
            .arg(now.to_string())
            .arg(now.micros())
            .arg(approvals.min)
            .arg(if approvals.veto { "1" } else { "" })
            .arg(self.run_tag(run_id))
            .arg(&rid)
            .arg(format!("{run_id}/{rid}"))
            .arg(check_at)
            .arg(tail)
            .arg(
                vote.responder
                    .on_behalf_of
                    .as_deref()
                    .unwrap_or(&vote.responder.id),
            );
        let (reply, replicated) = self
            .invoke_replicated::<(String, String, String)>(run_id, &inv)
            .await;
        let (outcome, a, b) = reply.map_err(|e| script_error(e, run_id))?;
        let count = |s: &str| s.parse::<u32>().unwrap_or(0);
        let state = |s: &str| s.parse::<InteractionState>().map_err(Error::Corrupt);
        let counted = match outcome.as_str() {
            "COUNTED" => Counted::Counted {
                approvals: count(&a),
                rejections: count(&b),
            },
            "DECIDED" => Counted::Decided {
                approvals: count(&a),
                rejections: count(&b),
            },
            "REPEAT" => Counted::Repeat,
            "VOTED" => Counted::AlreadyVoted,
            "STATE" => Counted::Settled(state(&a)?),
            "CLAIMED" => match claim_of(a, &b) {
                Some(c) => Counted::Claimed(c),
                None => return Err(Error::Corrupt(format!("request {rid}: bad claim"))),
            },
            other => return Err(Error::Corrupt(format!("vote: unexpected `{other}`"))),
        };
        // A vote counted or a question decided is acknowledged only once a replica has it.
        if matches!(counted, Counted::Counted { .. } | Counted::Decided { .. }) {
            replicated?;
        }
        Ok(counted)
    }

    /// Carries out step `n` (0-based) of `request`'s escalation, described by `event`, once
    /// across every gateway: see [`ESCALATE`]. `added` is who may answer besides
    /// `allowed_responders` after this step (`None`: unchanged). Unless it applied the default,
    /// the question is looked at again after `check_after` if the step's announcement is not
    /// recorded by then ([`Self::escalation_announced`]).
    pub async fn escalate(
        &self,
        request: &InteractionRequest,
        n: u32,
        event: &delta_protocol::Escalated,
        added: Option<&[String]>,
        check_after: Duration,
    ) -> Result<Escalation, Error> {
        let run_id = request.run_id;
        let rid = request.request_id.to_string();
        let now = event.at;
        let json = serde_json::to_string(&Event::Escalated(event.clone())).unwrap_or_default();
        let tail = json.strip_prefix('{').unwrap_or(&json).to_owned();
        let check_at = now.micros() + i64::try_from(check_after.as_micros()).unwrap_or(0);
        let mut inv = ESCALATE_SCRIPT.key(self.interaction_key(run_id, &rid));
        inv.key(self.run_key(run_id))
            .key(self.journal_key(run_id))
            .arg(n)
            .arg(now.to_string())
            .arg(now.micros())
            .arg(tail)
            .arg(
                added
                    .map(|a| serde_json::to_string(a).unwrap_or_default())
                    .unwrap_or_default(),
            )
            .arg(if event.what.apply_default { "1" } else { "" })
            .arg(self.run_tag(run_id))
            .arg(&rid)
            .arg(format!("{run_id}/{rid}"))
            .arg(check_at);
        let (reply, replicated) = self
            .invoke_replicated::<(String, String)>(run_id, &inv)
            .await;
        let (outcome, x) = reply.map_err(|e| script_error(e, run_id))?;
        match outcome.as_str() {
            "DONE" => replicated.map(|()| Escalation::Done),
            "DEFAULT" => replicated.map(|()| Escalation::DefaultApplied),
            "STALE" => Ok(Escalation::Stale(x.parse().unwrap_or(0))),
            "STATE" => Ok(Escalation::Settled(x.parse().map_err(Error::Corrupt)?)),
            other => Err(Error::Corrupt(format!("escalate: unexpected `{other}`"))),
        }
    }

    /// Records that question `request_id`'s escalation steps up to its `k`-th are announced, and
    /// schedules the look at its next one for `next_due` (`None`: it has no more); see
    /// [`ESCALATION_ANNOUNCED`]. `false`: not recorded (the question is settled, or a later step
    /// was carried out since).
    pub async fn escalation_announced(
        &self,
        run_id: RunId,
        request_id: delta_protocol::RequestId,
        k: u32,
        next_due: Option<Timestamp>,
    ) -> Result<bool, Error> {
        let rid = request_id.to_string();
        let mut inv = ESCALATION_ANNOUNCED_SCRIPT.key(self.interaction_key(run_id, &rid));
        inv.key(self.run_index(run_id, "interactions:escalations"))
            .arg(k)
            .arg(next_due.map(|t| t.micros().to_string()).unwrap_or_default())
            .arg(&rid);
        let mut conn = self.connection();
        inv.invoke_async::<i64>(&mut conn)
            .await
            .map(|n| n == 1)
            .map_err(super::backend)
    }

    /// Schedules the look at a question's next escalation step for `due`, while it is pending.
    pub async fn reschedule_escalation(
        &self,
        run_id: RunId,
        request_id: delta_protocol::RequestId,
        due: Timestamp,
    ) -> Result<(), Error> {
        let rid = request_id.to_string();
        let mut inv = RESCHEDULE_SCRIPT.key(self.interaction_key(run_id, &rid));
        inv.key(self.run_index(run_id, "interactions:escalations"))
            .arg(due.micros())
            .arg(&rid);
        let mut conn = self.connection();
        inv.invoke_async::<i64>(&mut conn)
            .await
            .map(drop)
            .map_err(super::backend)
    }

    /// Notes that settled question `request_id` of `run_id` may never have been announced: the
    /// job that asked it is let go while it may not have announced it (NATS would not take it,
    /// or its worker died first), so whoever announces its settling announces the question first
    /// (docs/protocol.md "Events"). `false` when the question is gone or pending (reopened).
    /// Replicated, with replica durability: the job is let go once this returns.
    pub async fn mark_unannounced(
        &self,
        run_id: RunId,
        request_id: delta_protocol::RequestId,
    ) -> Result<bool, Error> {
        let inv = UNANNOUNCED_SCRIPT.key(self.interaction_key(run_id, &request_id.to_string()));
        let (n, replicated) = self.invoke_replicated::<i64>(run_id, &inv).await;
        if n.map_err(super::backend)? == 0 {
            return Ok(false);
        }
        replicated?;
        Ok(true)
    }

    /// Takes, renews, releases or breaks `who`'s claim on question `request_id` of `run_id`.
    pub async fn claim(
        &self,
        run_id: RunId,
        request_id: delta_protocol::RequestId,
        who: &str,
        mode: ClaimMode,
    ) -> Result<Claimed, Error> {
        let now = Timestamp::now();
        let (name, until) = match mode {
            ClaimMode::Take(ttl) => (
                "take",
                now.micros() + i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX / 2),
            ),
            ClaimMode::Release => ("release", 0),
            ClaimMode::Break => ("break", 0),
        };
        let mut inv = CLAIM_SCRIPT.key(self.interaction_key(run_id, &request_id.to_string()));
        inv.arg(who).arg(name).arg(until).arg(now.micros());
        let (reply, replicated) = self
            .invoke_replicated::<(String, String, String)>(run_id, &inv)
            .await;
        let (outcome, by, till) = reply.map_err(|e| script_error(e, run_id))?;
        match outcome.as_str() {
            "OK" => {
                replicated?;
                Ok(Claimed::Done(claim_of(by, &till)))
            }
            "HELD" => claim_of(by, &till)
                .map(Claimed::Held)
                .ok_or_else(|| Error::Corrupt(format!("request {request_id}: bad claim"))),
            "STATE" => Ok(Claimed::Settled(by.parse().map_err(Error::Corrupt)?)),
            "VOTED" => Ok(Claimed::Voted),
            other => Err(Error::Corrupt(format!("claim: unexpected `{other}`"))),
        }
    }
}

/// The claim and votes kept in a question's hash: a claim only while it lasts (at `now`), the
/// votes in the order they were cast.
pub(super) fn claim_and_votes(
    h: &std::collections::HashMap<String, String>,
    now: Timestamp,
) -> (Option<Claim>, Vec<Vote>) {
    let claim = match (h.get("claim_by"), h.get("claim_until")) {
        (Some(by), Some(until)) => {
            claim_of(by.clone(), until).filter(|c| c.until.micros() > now.micros())
        }
        _ => None,
    };
    let mut votes: Vec<Vote> = h
        .iter()
        .filter(|(k, _)| k.starts_with("vote:"))
        .filter_map(|(_, v)| serde_json::from_str(v).ok())
        .collect();
    votes.sort_by_key(|v: &Vote| v.at.micros());
    (claim, votes)
}

impl RedisRunStore {
    /// Where delegations are kept: one hash, `<prefix>:delegations`, id → JSON (few, read on
    /// every answer that needs one).
    fn delegations_key(&self) -> String {
        self.index("delegations")
    }

    /// Stores a delegation, replacing any other from the same person to the same one (one per
    /// pair), in one step: two made at once for a pair leave one.
    pub async fn put_delegation(&self, d: &delta_protocol::Delegation) -> Result<(), Error> {
        let mut conn = self.connection();
        let mut inv = PUT_DELEGATION_SCRIPT.key(self.delegations_key());
        inv.arg(&d.id)
            .arg(&d.from)
            .arg(&d.to)
            .arg(serde_json::to_string(d).unwrap_or_default());
        inv.invoke_async::<i64>(&mut conn)
            .await
            .map(drop)
            .map_err(super::backend)
    }

    /// Every delegation in force at `now`; lapsed ones are removed on the way.
    pub async fn delegations(
        &self,
        now: Timestamp,
    ) -> Result<Vec<delta_protocol::Delegation>, Error> {
        let mut conn = self.connection();
        let all: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
            .arg(self.delegations_key())
            .query_async(&mut conn)
            .await
            .map_err(super::backend)?;
        let mut live = vec![];
        let mut lapsed = vec![];
        for (id, json) in all {
            match serde_json::from_str::<delta_protocol::Delegation>(&json) {
                Ok(d) if d.live_at(now) => live.push(d),
                _ => lapsed.push(id),
            }
        }
        if !lapsed.is_empty() {
            let _: Result<(), _> = redis::cmd("HDEL")
                .arg(self.delegations_key())
                .arg(&lapsed)
                .query_async(&mut conn)
                .await;
        }
        live.sort_by_key(|d| d.created_at.micros());
        Ok(live)
    }

    /// Removes delegation `id`; `false` when there was none.
    pub async fn delete_delegation(&self, id: &str) -> Result<bool, Error> {
        let mut conn = self.connection();
        let n: i64 = redis::cmd("HDEL")
            .arg(self.delegations_key())
            .arg(id)
            .query_async(&mut conn)
            .await
            .map_err(super::backend)?;
        Ok(n == 1)
    }
}
