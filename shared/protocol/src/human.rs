//! The human loop beyond one person's answer (docs/protocol.md §3, "Quorum", "Claims", "What the
//! approver saw"): who may vote and how many must agree, a person's claim on a question, and
//! the hash that ties an answer to the exact request its author saw.
//!
//! Pure data and rules: the gateway applies them before any worker is involved, the Redis store
//! counts votes and holds claims atomically, the engine journals the hash with the decision.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{InteractionRequest, OptionAction, RequestId, Responder, Timestamp};

/// The prefix of a group entry in `allowed_responders` and `approvals.of`: `group:oncall`.
pub const GROUP_PREFIX: &str = "group:";

/// Whether `id` (with its `groups`) is admitted by `list`: an entry is a responder id, or
/// `group:<name>` for every member of that group. An empty list admits no one; callers decide
/// what an empty list means for them (anyone, usually).
pub fn admitted_by(list: &[String], id: &str, groups: &[String]) -> bool {
    list.iter()
        .any(|entry| match entry.strip_prefix(GROUP_PREFIX) {
            Some(group) => groups.iter().any(|g| g == group),
            None => entry == id,
        })
}

/// Checks a list of responders (`allowed_responders`, `approvals.of`): each entry a non-empty
/// id or `group:<name>` of letters, digits, `-`, `_`, `.`, at most 200 characters.
pub fn check_responder_list(what: &str, list: &[String]) -> Result<(), String> {
    for entry in list {
        let name = entry.strip_prefix(GROUP_PREFIX).unwrap_or(entry);
        if name.trim().is_empty() || entry.len() > 200 {
            return Err(format!(
                "`{what}` has an empty or over-long entry `{entry}` (a responder id, or group:<name>)"
            ));
        }
        if entry.starts_with(GROUP_PREFIX)
            && !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(format!(
                "`{what}`: `{entry}` is not a group name (letters, digits, `-`, `_`, `.`)"
            ));
        }
    }
    Ok(())
}

/// `approvals:` of a tool in `config.yaml` or of an `ask_human` call: the question is decided
/// by votes. It resumes its run once, when `min` distinct people admitted by `of` approved it;
/// one rejection decides it with `veto`, else `min` rejections do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Approvals {
    /// How many distinct people must approve (1 to 50).
    pub min: u32,
    /// Who may vote: responder ids and `group:<name>`; empty: whoever may answer the question.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub of: Vec<String>,
    /// Votes are by distinct people: always `true` (a person's second vote is refused).
    #[serde(default = "yes")]
    pub distinct: bool,
    /// The person who submitted the run may not vote on its questions (default `true`).
    #[serde(default = "yes")]
    pub exclude_requester: bool,
    /// One rejection decides (default `false`: `min` rejections do).
    #[serde(default)]
    pub veto: bool,
}

fn yes() -> bool {
    true
}

/// The most approvals a question may require.
pub const MAX_APPROVALS: u32 = 50;

impl Approvals {
    /// What serde cannot check, with a message naming the field.
    pub fn check(&self) -> Result<(), String> {
        if self.min == 0 || self.min > MAX_APPROVALS {
            return Err(format!(
                "`approvals.min` is {}: it must be 1 to {MAX_APPROVALS}",
                self.min
            ));
        }
        if !self.distinct {
            return Err(
                "`approvals.distinct: false` is not supported: votes are always by distinct people (leave it out)"
                    .into(),
            );
        }
        check_responder_list("approvals.of", &self.of)
    }

    /// Whether `id` may vote (the question's `allowed_responders` are checked apart).
    pub fn admits(&self, id: &str, groups: &[String]) -> bool {
        self.of.is_empty() || admitted_by(&self.of, id, groups)
    }

    /// The question's options need one that approves and one that does not.
    pub fn check_options(&self, request: &InteractionRequest) -> Result<(), String> {
        let approves = request
            .options
            .iter()
            .any(|o| o.action == OptionAction::ApproveAndExecute);
        let other = request
            .options
            .iter()
            .any(|o| o.action != OptionAction::ApproveAndExecute);
        if approves && other {
            Ok(())
        } else {
            Err("`approvals` needs options to vote with: one whose action is APPROVE_AND_EXECUTE and one that is not".into())
        }
    }
}

/// A vote's side: an option that approves (`APPROVE_AND_EXECUTE`), or any other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Ballot {
    Approve,
    Reject,
}

impl Ballot {
    pub fn of(action: OptionAction) -> Self {
        if action == OptionAction::ApproveAndExecute {
            Ballot::Approve
        } else {
            Ballot::Reject
        }
    }
}

/// One vote on a question with `approvals` (the journal's `HUMAN_VOTE`, written by the gateway
/// atomically with the count). Free text of a sensitive question is `"***"` here.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Vote {
    pub request_id: RequestId,
    pub responder: Responder,
    pub ballot: Ballot,
    pub option_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feedback: Option<String>,
    /// The hash of the request the voter saw ([`request_hash`]).
    pub request_hash: String,
    pub at: Timestamp,
}

/// Where the votes on a question stand.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Tally {
    pub approvals: u32,
    pub rejections: u32,
    /// `approvals.min`.
    pub needed: u32,
    /// Who approved, in order.
    pub approved_by: Vec<String>,
    /// Who rejected, in order.
    pub rejected_by: Vec<String>,
}

impl Tally {
    /// The tally of `votes` on a question needing `needed` approvals.
    pub fn of(votes: &[Vote], needed: u32) -> Self {
        let mut t = Tally {
            needed,
            ..Tally::default()
        };
        for v in votes {
            match v.ballot {
                Ballot::Approve => t.approved_by.push(v.responder.id.clone()),
                Ballot::Reject => t.rejected_by.push(v.responder.id.clone()),
            }
        }
        t.approvals = u32::try_from(t.approved_by.len()).unwrap_or(u32::MAX);
        t.rejections = u32::try_from(t.rejected_by.len()).unwrap_or(u32::MAX);
        t
    }

    /// "1 of 2 approvals (alice)", as every channel shows it.
    pub fn summary(&self) -> String {
        let mut s = format!("{} of {} approvals", self.approvals, self.needed);
        if !self.approved_by.is_empty() {
            s.push_str(&format!(" ({})", self.approved_by.join(", ")));
        }
        if self.rejections > 0 {
            s.push_str(&format!(
                ", {} rejected ({})",
                self.rejections,
                self.rejected_by.join(", ")
            ));
        }
        s
    }
}

/// A person's lease on a question: while it holds, others' answers are refused (`409 claimed`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Claim {
    pub by: String,
    pub until: Timestamp,
}

/// One step of `escalation:` (docs/protocol.md §3 "Escalation"): once the question has been
/// pending for `after`, remind people of it, let more people answer it, or apply its default.
/// The gateway carries each step out once, on time, with no worker running.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct EscalationStep {
    /// How long after the question was asked: `90s`, `15m`, `1h`, `1h 30m`, or seconds.
    #[serde(with = "after")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "15m"))]
    pub after: std::time::Duration,
    /// Announce it again (`escalated`, with `remind: true`): channels notify people anew.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub remind: bool,
    /// Let these responders (ids, `group:<name>`) answer and vote too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub add_responders: Vec<String>,
    /// Settle the question with its default option (the run fails without one), as its
    /// deadline would. Only the last step may.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub apply_default: bool,
}

/// The most steps an escalation may have, and the longest `after`.
pub const MAX_ESCALATION_STEPS: usize = 10;
pub const MAX_ESCALATION_AFTER: std::time::Duration =
    std::time::Duration::from_secs(90 * 24 * 3600);

/// Checks an `escalation:` list, with a message naming the step that is wrong.
pub fn check_escalation(steps: &[EscalationStep]) -> Result<(), String> {
    if steps.len() > MAX_ESCALATION_STEPS {
        return Err(format!(
            "`escalation` has {} steps; at most {MAX_ESCALATION_STEPS}",
            steps.len()
        ));
    }
    let mut last = std::time::Duration::ZERO;
    for (i, s) in steps.iter().enumerate() {
        let n = i + 1;
        if s.after < std::time::Duration::from_secs(1) || s.after > MAX_ESCALATION_AFTER {
            return Err(format!(
                "`escalation` step {n}: `after` must be 1 s to 90 days"
            ));
        }
        if i > 0 && s.after <= last {
            return Err(format!(
                "`escalation` step {n}: `after` ({}) must be later than the step before ({})",
                humantime::format_duration(s.after),
                humantime::format_duration(last)
            ));
        }
        last = s.after;
        if !s.remind && s.add_responders.is_empty() && !s.apply_default {
            return Err(format!(
                "`escalation` step {n} does nothing: give it `remind: true`, `add_responders` or `apply_default: true`"
            ));
        }
        if s.apply_default && n != steps.len() {
            return Err(format!(
                "`escalation` step {n}: only the last step may `apply_default` (the question is settled then)"
            ));
        }
        check_responder_list("escalation.add_responders", &s.add_responders)?;
    }
    Ok(())
}

/// `after` as people write it (`15m`, `1h 30m`) or as seconds; written back as `15m`.
mod after {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Secs(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Secs(s) => Ok(Duration::from_secs(s)),
            Raw::Text(t) => {
                // humantime 2.x panics on a sum of exactly u64::MAX seconds and a full second
                // of nanoseconds: no text that long or with numbers that large is a step's
                // wait (at most 90 days), so it is refused before it gets there.
                let digits = t
                    .split(|c: char| !c.is_ascii_digit())
                    .map(str::len)
                    .max()
                    .unwrap_or(0);
                if t.len() > 64 || digits > 10 {
                    return Err(D::Error::custom(format!(
                        "`after: {}` is not a duration a step may wait (at most 90 days); write e.g. 90s, 15m, 1h or 1h 30m",
                        t.chars().take(40).collect::<String>()
                    )));
                }
                humantime::parse_duration(t.trim()).map_err(|e| {
                    D::Error::custom(format!(
                        "`after: {t}` is not a duration ({e}); write e.g. 90s, 15m, 1h or 1h 30m"
                    ))
                })
            }
        }
    }
}

/// An escalation step carried out (the journal's `ESCALATED`, and the payload of
/// `…interactions.escalated.<agent>.<run_id>` and the live stream's `escalated` event).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Escalated {
    pub request_id: RequestId,
    pub run_id: crate::RunId,
    pub agent: String,
    /// Which step (1 for the first) of how many.
    pub step: u32,
    pub of: u32,
    /// The step as declared.
    #[serde(flatten)]
    pub what: EscalationStep,
    /// When it was due, and when it was carried out.
    pub due_at: Timestamp,
    pub at: Timestamp,
}

/// A delegation (`delta delegations add`): until `until`, `to` may answer (and vote on)
/// whatever `from` may, recorded as "`to` on behalf of `from`". It never lets anyone approve
/// a run they submitted themselves.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Delegation {
    pub id: String,
    pub from: String,
    pub to: String,
    pub until: Timestamp,
    /// Who made it: `from`, or an operator.
    pub created_by: String,
    pub created_at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Delegation {
    /// Whether it is in force at `now`.
    pub fn live_at(&self, now: Timestamp) -> bool {
        now.micros() < self.until.micros()
    }
}

/// What changed on a pending question short of settling it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Someone took or renewed a claim (`claim` is it).
    Claimed,
    /// The holder gave their claim back.
    Released,
    /// An operator broke someone's claim.
    ClaimBroken,
    /// A vote was counted (`tally` is where the votes stand).
    Voted,
}

/// What `…interactions.updated.<agent>.<run_id>` carries, and the live stream's `updated` event:
/// a claim taken, given back or broken, a vote counted. A question's settling is `resolved`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InteractionUpdate {
    pub request_id: RequestId,
    pub run_id: crate::RunId,
    pub agent: String,
    pub change: Change,
    /// Who did it.
    pub by: String,
    /// The claim now (`null`: nobody holds it).
    pub claim: Option<Claim>,
    /// Where the votes stand (a question with `approvals`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tally: Option<Tally>,
    pub at: Timestamp,
}

/// The SHA-256 (hex) of `request`'s canonical JSON: what the person was shown. Everything the
/// request says is in it (prompt, options, tool, arguments, plan, schema, deadline…) but the
/// hash itself and `allowed_responders`, which says who may answer rather than what.
pub fn request_hash(request: &InteractionRequest) -> String {
    let mut v = serde_json::to_value(request).unwrap_or(Value::Null);
    if let Some(o) = v.as_object_mut() {
        o.remove("request_hash");
        o.remove("allowed_responders");
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, canonical(&v).as_bytes());
    let mut hex = String::with_capacity(64);
    for b in digest.as_ref() {
        use std::fmt::Write;
        let _ = write!(hex, "{b:02x}");
    }
    hex
}

/// JSON with object keys sorted at every level and no spaces (numbers and strings as serde_json
/// writes them), whatever order the map kept them in.
pub fn canonical(v: &Value) -> String {
    let mut out = String::with_capacity(512);
    write_canonical(v, &mut out);
    out
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (k, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                // A key is escaped as serde_json escapes any string.
                out.push_str(&serde_json::to_string(k.as_str()).unwrap_or_default());
                out.push(':');
                write_canonical(item, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        other => {
            use std::fmt::Write;
            let _ = write!(out, "{other}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{InteractionOption, InteractionType, RunId, Via};
    use serde_json::json;

    /// A step's `after` that humantime would panic on (a sum of u64::MAX seconds and a full
    /// second of nanoseconds) is refused, as is any text too long for a step's wait; an LLM
    /// may write one.
    #[test]
    fn an_after_humantime_would_panic_on_is_refused() {
        for after in [
            "18446744073709551615s 1000000000ns",
            "18446744073709551615s",
            "1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s",
        ] {
            let e =
                serde_json::from_value::<EscalationStep>(json!({"after": after, "remind": true}))
                    .expect_err(after);
            assert!(e.to_string().contains("at most 90 days"), "{e}");
        }
        let ok: EscalationStep =
            serde_json::from_value(json!({"after": "1h 30m", "remind": true})).expect("valid");
        assert_eq!(ok.after.as_secs(), 5400);
    }

    fn request() -> InteractionRequest {
        let mut q = InteractionRequest::new(
            RunId::new(),
            "deployer",
            InteractionType::ToolApproval,
            "Deploy?",
        );
        q.options = vec![
            InteractionOption::new("approve", "Approve", OptionAction::ApproveAndExecute),
            InteractionOption::new("reject", "Reject", OptionAction::RejectWithReason),
        ];
        q.context
            .insert("args".into(), json!({"env": "prod", "n": 3}));
        q
    }

    #[test]
    fn the_hash_changes_with_what_was_shown_and_only_with_it() {
        let q = request();
        let h = request_hash(&q);
        assert_eq!(h.len(), 64);
        assert_eq!(h, request_hash(&q.clone()), "stable");
        let mut sealed = q.clone();
        sealed.request_hash = Some(h.clone());
        sealed.allowed_responders = vec!["group:oncall".into()];
        assert_eq!(
            request_hash(&sealed),
            h,
            "the hash and who may answer are not in it"
        );
        let mut args = q.clone();
        args.context
            .insert("args".into(), json!({"env": "prod", "n": 4}));
        assert_ne!(request_hash(&args), h);
        let mut prompt = q.clone();
        prompt.prompt.push('!');
        assert_ne!(request_hash(&prompt), h);
        let mut options = q.clone();
        options.options.pop();
        assert_ne!(request_hash(&options), h);
    }

    #[test]
    fn canonical_json_sorts_keys_at_every_level() {
        let a: Value =
            serde_json::from_str(r#"{"b": {"y": 1, "x": [2, {"q": "é", "p": null}]}, "a": 1.5}"#)
                .unwrap();
        assert_eq!(
            canonical(&a),
            r#"{"a":1.5,"b":{"x":[2,{"p":null,"q":"é"}],"y":1}}"#
        );
        // Keys and strings escaped as JSON writes them, every kind of value: what stored hashes
        // were made with, so it must never change.
        let b: Value = serde_json::from_str(
            r#"{"k\"\n\u0001": "t\"\\", "Z": [true, false, -3, 1e3, "", {}, []]}"#,
        )
        .unwrap();
        assert_eq!(
            canonical(&b),
            r#"{"Z":[true,false,-3,1000.0,"",{},[]],"k\"\n\u0001":"t\"\\"}"#
        );
    }

    #[test]
    fn groups_and_ids_admit_their_members() {
        let list = vec!["alice".to_owned(), "group:oncall".to_owned()];
        assert!(admitted_by(&list, "alice", &[]));
        assert!(admitted_by(&list, "bob", &["oncall".into()]));
        assert!(!admitted_by(&list, "bob", &["dev".into()]));
        assert!(
            !admitted_by(&list, "group:oncall", &[]),
            "an id is not a group"
        );
        assert!(check_responder_list("x", &list).is_ok());
        assert!(check_responder_list("x", &["group:".into()]).is_err());
        assert!(check_responder_list("x", &["group:a b".into()]).is_err());
    }

    #[test]
    fn approvals_are_checked_with_the_field_named() {
        let a: Approvals =
            serde_json::from_value(json!({"min": 2, "of": ["group:leads"]})).unwrap();
        assert!(a.distinct && a.exclude_requester && !a.veto);
        assert!(a.check().is_ok());
        assert!(a.check_options(&request()).is_ok());
        let mut only_approve = request();
        only_approve.options.pop();
        assert!(a.check_options(&only_approve).is_err());
        let zero: Approvals = serde_json::from_value(json!({"min": 0})).unwrap();
        assert!(zero.check().unwrap_err().contains("approvals.min"));
        let loose: Approvals =
            serde_json::from_value(json!({"min": 1, "distinct": false})).unwrap();
        assert!(loose.check().unwrap_err().contains("distinct"));
        assert!(serde_json::from_value::<Approvals>(json!({"min": 1, "quorum": 2})).is_err());
        assert!(a.admits("x", &["leads".into()]) && !a.admits("x", &[]));
    }

    #[test]
    fn escalation_steps_read_as_people_write_them_and_are_checked() {
        let steps: Vec<EscalationStep> = serde_json::from_value(json!([
            {"after": "15m", "remind": true},
            {"after": "1h", "add_responders": ["group:oncall"]},
            {"after": 14400, "apply_default": true}
        ]))
        .unwrap();
        assert_eq!(steps[0].after.as_secs(), 900);
        assert_eq!(steps[2].after.as_secs(), 4 * 3600);
        assert!(check_escalation(&steps).is_ok());
        assert_eq!(serde_json::to_value(&steps[1]).unwrap()["after"], "1h");
        let bad = |v: Value| -> String {
            match serde_json::from_value::<Vec<EscalationStep>>(v) {
                Ok(s) => check_escalation(&s).unwrap_err(),
                Err(e) => e.to_string(),
            }
        };
        assert!(bad(json!([{"after": "soon", "remind": true}])).contains("not a duration"));
        assert!(
            bad(json!([{"after": "1h", "remind": true}, {"after": "30m", "remind": true}]))
                .contains("step 2")
        );
        assert!(bad(json!([{"after": "1h"}])).contains("does nothing"));
        assert!(
            bad(json!([{"after": "1h", "apply_default": true}, {"after": "2h", "remind": true}]))
                .contains("only the last")
        );
        assert!(
            bad(json!([{"after": "1h", "add_responders": ["group:"]}])).contains("add_responders")
        );
        assert!(
            bad(json!([{"after": "1h", "remind": true, "page": true}])).contains("unknown field")
        );
    }

    #[test]
    fn a_tally_counts_each_side_and_says_so() {
        let vote = |id: &str, ballot| Vote {
            request_id: RequestId::new(),
            responder: Responder {
                id: id.into(),
                via: Via::Http,
                on_behalf_of: None,
                relayed_by: None,
            },
            ballot,
            option_id: "approve".into(),
            feedback: None,
            request_hash: String::new(),
            at: Timestamp::now(),
        };
        let t = Tally::of(
            &[
                vote("alice", Ballot::Approve),
                vote("carol", Ballot::Reject),
            ],
            2,
        );
        assert_eq!((t.approvals, t.rejections, t.needed), (1, 1, 2));
        assert_eq!(t.summary(), "1 of 2 approvals (alice), 1 rejected (carol)");
    }
}
