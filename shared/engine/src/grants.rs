//! Scoped grants ("always allow"), the engine's half: checking a grant asked for in an approval
//! (`data.grant`), building the [`Grant`] it makes, and matching later calls against grants.
//!
//! The rules (docs/security.md "Grants"):
//!
//! - Only an approving answer (`APPROVE_AND_EXECUTE`) to a tool's approval question can ask for
//!   one; not the "may already have run" question, not a sensitive question, not for a tool
//!   declared `grantable: false`.
//! - A grant never widens beyond what the approver saw unless they say so: every parameter they
//!   do not name is held to the approved call's own value (or to being absent), and the approved
//!   call itself must match what they name.
//! - Patterns match a value as a whole (anchored at both ends), in its text form, as the tool
//!   receives it. A call with a parameter the grant does not know (the tool changed) matches no
//!   grant.
//!
//! The same [`grant_of`] runs in the gateway before it accepts an answer (through
//! [`crate::engine::check_answer`]) and in the engine when it applies the answer and stores the
//! grant, so what is refused is refused everywhere with the same message.

use std::collections::BTreeMap;

use regex::Regex;
use serde_json::{Value, json};

use crate::tools::{ParamSpec, check_args};
use delta_protocol::grant::{ArgMatch, Grant, GrantRequest};
use delta_protocol::{
    AcceptedAnswer, InteractionRequest, InteractionType, OptionAction, ResponseError, Timestamp,
};

/// The longest pattern accepted (in a grant or in `policy.yaml`).
pub const MAX_PATTERN_LEN: usize = 1024;

/// The longest a grant may last, when it says how long: ten years.
pub const MAX_EXPIRES_IN: u64 = 10 * 365 * 24 * 3600;

/// Compiles `pattern` to match a whole value (anchored at both ends), with a bound on its size.
pub fn compile(pattern: &str) -> Result<Regex, String> {
    if pattern.len() > MAX_PATTERN_LEN {
        return Err(format!(
            "the pattern is {} characters long; at most {MAX_PATTERN_LEN}",
            pattern.len()
        ));
    }
    regex::RegexBuilder::new(&format!("^(?:{pattern})$"))
        .size_limit(1 << 20)
        .build()
        .map_err(|e| format!("`{pattern}` is not a valid regular expression ({e})"))
}

/// Whether grants may approve `tool`'s calls (and an approval of one may make a grant): it is
/// `grantable`, and its approvals are not decided by a vote of several people (`approvals.min`
/// above 1), which a grant made by one voter would let later calls skip.
pub fn tool_takes_grants(tool: &crate::tools::Tool) -> bool {
    // With `approvals`, a grant made by one voter would let later calls skip the vote, and one
    // made by an approver would approve their own runs later (`exclude_requester`).
    tool.grantable
        && tool
            .approvals
            .as_ref()
            .is_none_or(|a| a.min <= 1 && !a.exclude_requester)
}

/// A call's argument `name` in the text form the tool receives (`None`: not given).
pub fn arg_text(args: &Value, name: &str) -> Option<String> {
    match args.get(name)? {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// Whether a call of `tool` with `args` is one `grant` approves (its state aside).
pub fn matches(grant: &Grant, tool: &str, args: &Value) -> bool {
    if grant.tool != tool {
        return false;
    }
    if let Some(obj) = args.as_object()
        && obj
            .iter()
            .any(|(k, v)| !v.is_null() && !grant.args.contains_key(k))
    {
        return false;
    }
    grant.args.iter().all(|(name, m)| {
        let given = arg_text(args, name);
        match (m, given) {
            (ArgMatch::Absent, given) => given.is_none(),
            (ArgMatch::Exact(want), Some(v)) => *want == v,
            (ArgMatch::Regex(p), Some(v)) => compile(p).is_ok_and(|re| re.is_match(&v)),
            (_, None) => false,
        }
    })
}

fn invalid(msg: impl Into<String>) -> ResponseError {
    ResponseError::InvalidArgs(msg.into())
}

/// The grant an accepted answer to `q` asks for (`data.grant`), checked and built: `Ok(None)`
/// when it asks for none. `params` are the tool's parameters (`None`: unknown, refused), and
/// `grantable` whether the tool may be approved by grants. `now` starts `expires_in`.
pub fn grant_of(
    q: &InteractionRequest,
    params: Option<&[ParamSpec]>,
    grantable: bool,
    accepted: &AcceptedAnswer,
    now: Timestamp,
) -> Result<Option<Grant>, ResponseError> {
    let Some(raw) = accepted.response.data.as_ref().and_then(|d| d.get("grant")) else {
        return Ok(None);
    };
    let tool = q.context.get("tool").and_then(Value::as_str);
    let is_call_approval = q.kind == InteractionType::ToolApproval
        && !q.context.contains_key("may_have_run")
        && tool.is_some();
    if !is_call_approval || accepted.action != OptionAction::ApproveAndExecute {
        return Err(invalid(
            "data.grant: only an approval of a tool call (the `approve` option of a TOOL_APPROVAL question) can create a grant",
        ));
    }
    let tool = tool.unwrap_or_default();
    if q.is_sensitive() {
        return Err(invalid(
            "data.grant: a sensitive question cannot create a grant (its values would be stored in clear)",
        ));
    }
    if let Some(a) = q.approvals.as_ref().filter(|a| a.min > 1) {
        return Err(invalid(format!(
            "data.grant: this call is decided by a vote of {} approvers; a grant made by one of them would let later calls skip the vote",
            a.min
        )));
    }
    if !grantable {
        return Err(invalid(format!(
            "data.grant: `{tool}` is declared `grantable: false`: each of its calls must be approved on its own"
        )));
    }
    let Some(params) = params else {
        return Err(invalid(format!(
            "data.grant: the parameters of `{tool}` are not known here, so no grant can be made"
        )));
    };
    let req: GrantRequest = serde_json::from_value(raw.clone()).map_err(|e| {
        invalid(format!(
            "data.grant: {e} (expected {{\"scope\": \"run\"|\"agent\", \"args\": {{…}}, \"expires_in\": seconds, \"expires_at\": time, \"max_uses\": n}})"
        ))
    })?;
    // What was approved: the edited arguments if any, else the call's own.
    let approved = accepted
        .response
        .data
        .as_ref()
        .and_then(|d| d.get("args"))
        .or_else(|| q.context.get("args"))
        .cloned()
        .unwrap_or(Value::Null);
    let names: Vec<&str> = params.iter().map(|p| p.name.as_str()).collect();
    if let Some(unknown) = req.args.keys().find(|k| !names.contains(&k.as_str())) {
        return Err(invalid(format!(
            "data.grant.args: `{unknown}` is not a parameter of `{tool}` (parameters: {})",
            if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            }
        )));
    }
    // Pinned as the tool got them (a number given as ` 5` is `5`): the text later calls are
    // matched by ([`crate::tools::canonical_args`]).
    let checked = crate::tools::check_args(params, &approved).ok();
    let mut args = BTreeMap::new();
    for p in params {
        let m = match req.args.get(&p.name) {
            None => match checked
                .as_ref()
                .and_then(|c| c.get(&p.name).cloned())
                .or_else(|| arg_text(&approved, &p.name))
            {
                Some(v) => ArgMatch::Exact(v),
                None => ArgMatch::Absent,
            },
            Some(v) => arg_match(tool, p, v)?,
        };
        args.insert(p.name.clone(), m);
    }
    let expires_at = match (req.expires_in, req.expires_at) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "data.grant: give `expires_in` or `expires_at`, not both",
            ));
        }
        (Some(0), None) => return Err(invalid("data.grant.expires_in: at least 1 second")),
        (Some(s), None) if s > MAX_EXPIRES_IN => {
            return Err(invalid(format!(
                "data.grant.expires_in: at most {MAX_EXPIRES_IN} seconds (ten years); leave it out for a grant without end"
            )));
        }
        (Some(s), None) => Some(now.plus_seconds(s)),
        (None, Some(t)) if t <= now => {
            return Err(invalid(format!(
                "data.grant.expires_at: {t} is not in the future"
            )));
        }
        (None, at) => at,
    };
    if req.max_uses == Some(0) {
        return Err(invalid(
            "data.grant.max_uses: at least 1 (leave it out for no limit)",
        ));
    }
    let grant = Grant {
        grant_id: q.request_id,
        agent: q.agent.clone(),
        scope: req.scope,
        run_id: q.run_id,
        tool: tool.to_owned(),
        args,
        created_by: accepted.response.responder.clone(),
        created_at: now,
        expires_at,
        max_uses: req.max_uses,
        uses: 0,
        revoked_at: None,
        revoked_by: None,
    };
    if !matches(&grant, tool, &approved) {
        return Err(invalid(
            "data.grant.args: the grant would not approve the very call being approved; give patterns the approved values match",
        ));
    }
    Ok(Some(grant))
}

/// One parameter's constraint as the approver wrote it: a value, `null` (must be absent), or
/// `{"regex": "…"}`.
fn arg_match(tool: &str, p: &ParamSpec, v: &Value) -> Result<ArgMatch, ResponseError> {
    let field = format!("data.grant.args.{}", p.name);
    match v {
        Value::Null => Ok(ArgMatch::Absent),
        Value::Object(o) => {
            let pattern = match (o.len(), o.get("regex")) {
                (1, Some(Value::String(s))) => s,
                _ => {
                    return Err(invalid(format!(
                        "{field}: give a value, or {{\"regex\": \"<pattern>\"}}"
                    )));
                }
            };
            compile(pattern).map_err(|e| invalid(format!("{field}: {e}")))?;
            Ok(ArgMatch::Regex(pattern.clone()))
        }
        Value::Array(_) => Err(invalid(format!(
            "{field}: give a value, or {{\"regex\": \"<pattern>\"}}"
        ))),
        value => {
            let spec = ParamSpec {
                required: false,
                ..p.clone()
            };
            let texts = check_args(&[spec], &json!({ p.name.clone(): value }))
                .map_err(|e| invalid(format!("{field}: {e} (tool `{tool}`)")))?;
            Ok(ArgMatch::Exact(
                texts.get(&p.name).cloned().unwrap_or_default(),
            ))
        }
    }
}

/// A grant's constraints in a line for people: `env = "staging", version ~ /1\..*/`.
pub fn describe_args(grant: &Grant) -> String {
    if grant.args.is_empty() {
        return "any arguments".to_owned();
    }
    grant
        .args
        .iter()
        .map(|(k, m)| match m {
            ArgMatch::Exact(v) => format!("{k} = {}", json!(v)),
            ArgMatch::Regex(p) => format!("{k} ~ /{p}/"),
            ArgMatch::Absent => format!("{k} absent"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::ParamType;
    use delta_protocol::grant::GrantScope;
    use delta_protocol::{InteractionOption, InteractionResponse, Responder, RunId, Via};

    fn params() -> Vec<ParamSpec> {
        ["env", "version", "note"]
            .iter()
            .map(|n| ParamSpec {
                name: (*n).into(),
                kind: ParamType::String,
                required: *n != "note",
            })
            .collect()
    }

    fn approval(args: Value) -> InteractionRequest {
        let mut q = InteractionRequest::new(
            RunId::new(),
            "deployer",
            InteractionType::ToolApproval,
            "Run it?",
        );
        q.options = vec![
            InteractionOption::new("approve", "Approve", OptionAction::ApproveAndExecute),
            InteractionOption::new("reject", "Reject", OptionAction::RejectWithReason),
        ];
        q.context.insert("tool".into(), json!("deploy"));
        q.context.insert("args".into(), args);
        q.context.insert("grantable".into(), json!(true));
        q
    }

    fn answer(q: &InteractionRequest, option: &str, data: Value) -> AcceptedAnswer {
        let mut r = InteractionResponse::new(q.request_id, Responder::new("alice", Via::Http));
        r.option_id = Some(option.into());
        r.data = Some(data);
        q.validate(r, Timestamp::now()).expect("valid answer")
    }

    fn grant(q: &InteractionRequest, data: Value) -> Result<Option<Grant>, ResponseError> {
        let a = answer(q, "approve", data);
        grant_of(q, Some(&params()), true, &a, Timestamp::now())
    }

    #[test]
    fn by_default_a_grant_holds_every_parameter_to_the_approved_value() {
        let q = approval(json!({"env": "staging", "version": "1.4.2"}));
        let g = grant(&q, json!({"grant": {}}))
            .expect("ok")
            .expect("a grant");
        assert_eq!(g.grant_id, q.request_id);
        assert_eq!(g.scope, GrantScope::Run);
        assert!(matches(
            &g,
            "deploy",
            &json!({"env": "staging", "version": "1.4.2"})
        ));
        assert!(!matches(
            &g,
            "deploy",
            &json!({"env": "staging", "version": "1.4.3"})
        ));
        assert!(
            !matches(
                &g,
                "deploy",
                &json!({"env": "staging", "version": "1.4.2", "note": "x"})
            ),
            "a parameter absent from the approved call must stay absent"
        );
        assert!(!matches(
            &g,
            "other",
            &json!({"env": "staging", "version": "1.4.2"})
        ));
        assert!(
            !matches(
                &g,
                "deploy",
                &json!({"env": "staging", "version": "1.4.2", "new": "x"})
            ),
            "a parameter the grant does not know matches nothing"
        );
    }

    #[test]
    fn patterns_match_whole_values_and_edited_arguments_are_what_was_approved() {
        let q = approval(json!({"env": "staging", "version": "1.4.2"}));
        let g = grant(
            &q,
            json!({"args": {"env": "qa", "version": "1.4.2"}, "grant": {"scope": "agent", "args": {"version": {"regex": "1\\.4\\.[0-9]+"}}}}),
        )
        .expect("ok")
        .expect("a grant");
        assert_eq!(g.scope, GrantScope::Agent);
        assert_eq!(
            g.args["env"],
            ArgMatch::Exact("qa".into()),
            "the edited value"
        );
        assert!(matches(
            &g,
            "deploy",
            &json!({"env": "qa", "version": "1.4.17"})
        ));
        assert!(
            !matches(&g, "deploy", &json!({"env": "qa", "version": "21.4.1"})),
            "anchored at the start"
        );
        assert!(
            !matches(&g, "deploy", &json!({"env": "qa", "version": "1.4.1-evil"})),
            "anchored at the end"
        );
        assert!(!matches(
            &g,
            "deploy",
            &json!({"env": "staging", "version": "1.4.2"})
        ));
    }

    #[test]
    fn bad_grant_requests_are_refused_with_what_is_wrong() {
        let q = approval(json!({"env": "staging", "version": "1.4.2"}));
        let cases = [
            (json!({"grant": {"args": {"nope": "x"}}}), "not a parameter"),
            (
                json!({"grant": {"args": {"env": {"regex": "("}}}}),
                "not a valid regular expression",
            ),
            (
                json!({"grant": {"args": {"env": "production"}}}),
                "would not approve",
            ),
            (json!({"grant": {"scope": "world"}}), "data.grant"),
            (json!({"grant": {"max_uses": 0}}), "max_uses"),
            (json!({"grant": {"expires_in": 0}}), "expires_in"),
            (
                json!({"grant": {"expires_in": 5, "expires_at": "2999-01-01T00:00:00.000000Z"}}),
                "not both",
            ),
            (
                json!({"grant": {"expires_at": "2001-01-01T00:00:00.000000Z"}}),
                "not in the future",
            ),
            (
                json!({"grant": {"args": {"env": {"regex": "a", "x": 1}}}}),
                "regex",
            ),
            (json!({"grant": "yes"}), "data.grant"),
        ];
        for (data, says) in cases {
            match grant(&q, data.clone()) {
                Err(ResponseError::InvalidArgs(m)) => assert!(m.contains(says), "{data}: {m}"),
                other => panic!("{data}: {other:?}"),
            }
        }
        let a = answer(&q, "reject", json!({"grant": {}}));
        assert!(grant_of(&q, Some(&params()), true, &a, Timestamp::now()).is_err());
        let a = answer(&q, "approve", json!({"grant": {}}));
        let refused = grant_of(&q, Some(&params()), false, &a, Timestamp::now());
        assert!(
            matches!(&refused, Err(ResponseError::InvalidArgs(m)) if m.contains("grantable: false")),
            "{refused:?}"
        );
        let mut sensitive = q.clone();
        sensitive.sensitive = true;
        let a = answer(&sensitive, "approve", json!({"grant": {}}));
        assert!(grant_of(&sensitive, Some(&params()), true, &a, Timestamp::now()).is_err());
        let mut voted = q.clone();
        voted.approvals = serde_json::from_value(json!({"min": 2})).ok();
        let a = answer(&voted, "approve", json!({"grant": {}}));
        let refused = grant_of(&voted, Some(&params()), true, &a, Timestamp::now());
        assert!(
            matches!(&refused, Err(ResponseError::InvalidArgs(m)) if m.contains("vote of 2")),
            "{refused:?}"
        );
        let mut may_have_run = q.clone();
        may_have_run
            .context
            .insert("may_have_run".into(), json!(true));
        let a = answer(&may_have_run, "approve", json!({"grant": {}}));
        assert!(grant_of(&may_have_run, Some(&params()), true, &a, Timestamp::now()).is_err());
        let a = answer(&q, "approve", json!({"args": {}}));
        assert_eq!(
            grant_of(&q, Some(&params()), false, &a, Timestamp::now()),
            Ok(None),
            "no grant asked, nothing refused"
        );
    }
}
