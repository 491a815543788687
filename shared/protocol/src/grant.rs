//! Scoped grants ("always allow"): an approval of a tool call that approves later calls like it
//! (docs/protocol.md §3 "Grants").
//!
//! A person creates a grant with an approving answer (`data.grant`, a [`GrantRequest`]); the
//! engine stores it as a [`Grant`] when it applies the answer, under the id of the request it
//! answered, so a replayed resume never makes a second one. Later calls of the same tool whose
//! arguments match the grant's constraints run without a question while the grant is live: not
//! revoked, not expired, with uses left ([`Grant::live_at`]). Matching with regular expressions is
//! the engine's (`delta_engine::grants`); this module is the data.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{RequestId, Responder, RunId, Timestamp};

/// Which runs a grant approves calls of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum GrantScope {
    /// Only the run whose approval created it (the default: the narrowest).
    #[default]
    Run,
    /// Every run of the same agent, this one and later ones.
    Agent,
}

impl GrantScope {
    pub fn as_str(self) -> &'static str {
        match self {
            GrantScope::Run => "run",
            GrantScope::Agent => "agent",
        }
    }
}

impl fmt::Display for GrantScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for GrantScope {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "run" => Ok(GrantScope::Run),
            "agent" => Ok(GrantScope::Agent),
            other => Err(format!("`{other}` is not a grant scope: use run or agent")),
        }
    }
}

/// What a grant requires of one parameter of a later call, compared with the parameter's value
/// in its text form (as the tool receives it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ArgMatch {
    /// Exactly this value.
    Exact(String),
    /// A value the regular expression matches as a whole (it is anchored at both ends).
    Regex(String),
    /// The parameter is not given (it was not in the approved call).
    Absent,
}

/// `data.grant` of an approving answer: what the approver asks to be approved from now on.
/// Everything is optional: `{}` approves calls with exactly the approved arguments, in this run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct GrantRequest {
    /// `run` (default) or `agent`.
    #[serde(default)]
    pub scope: GrantScope,
    /// Per parameter: a value (string, number or boolean: exactly that value) or
    /// `{"regex": "…"}` (a pattern the whole value must match). A parameter left out keeps the
    /// approved call's own value: a grant never widens beyond what the approver saw unless told.
    #[serde(default)]
    pub args: BTreeMap<String, Value>,
    /// Seconds from the answer until the grant ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in: Option<u64>,
    /// When the grant ends (instead of `expires_in`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Timestamp>,
    /// How many later calls it may approve (unlimited when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_uses: Option<u64>,
}

/// A stored grant (docs/protocol.md §3 "Grants").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Grant {
    /// The id of the approval request whose answer created it (one grant per request).
    pub grant_id: RequestId,
    pub agent: String,
    pub scope: GrantScope,
    /// The run it was created in; the only run it approves calls of when `scope` is `run`.
    pub run_id: RunId,
    pub tool: String,
    /// One constraint per parameter of the tool.
    pub args: BTreeMap<String, ArgMatch>,
    /// Who approved with it (the answer's responder).
    pub created_by: Responder,
    pub created_at: Timestamp,
    #[serde(default)]
    pub expires_at: Option<Timestamp>,
    #[serde(default)]
    pub max_uses: Option<u64>,
    /// Calls it approved so far.
    #[serde(default)]
    pub uses: u64,
    #[serde(default)]
    pub revoked_at: Option<Timestamp>,
    #[serde(default)]
    pub revoked_by: Option<String>,
}

/// Where a grant stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum GrantState {
    Active,
    Revoked,
    Expired,
    /// Every one of its `max_uses` was used.
    UsedUp,
}

impl GrantState {
    pub fn as_str(self) -> &'static str {
        match self {
            GrantState::Active => "ACTIVE",
            GrantState::Revoked => "REVOKED",
            GrantState::Expired => "EXPIRED",
            GrantState::UsedUp => "USED_UP",
        }
    }
}

impl Grant {
    /// Where the grant stands at `now`: revoked wins over expired, expired over used up.
    pub fn state_at(&self, now: Timestamp) -> GrantState {
        if self.revoked_at.is_some() {
            GrantState::Revoked
        } else if self.expires_at.is_some_and(|e| now >= e) {
            GrantState::Expired
        } else if self.max_uses.is_some_and(|m| self.uses >= m) {
            GrantState::UsedUp
        } else {
            GrantState::Active
        }
    }

    /// Whether it may approve a call of run `run_id` at `now`.
    pub fn live_at(&self, run_id: RunId, now: Timestamp) -> bool {
        self.state_at(now) == GrantState::Active
            && (self.scope == GrantScope::Agent || self.run_id == run_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Via;

    fn grant() -> Grant {
        Grant {
            grant_id: RequestId::new(),
            agent: "a".into(),
            scope: GrantScope::Run,
            run_id: RunId::new(),
            tool: "deploy".into(),
            args: BTreeMap::from([
                ("env".into(), ArgMatch::Exact("staging".into())),
                ("version".into(), ArgMatch::Regex("1\\..*".into())),
                ("note".into(), ArgMatch::Absent),
            ]),
            created_by: Responder::new("alice", Via::Http),
            created_at: Timestamp::now(),
            expires_at: None,
            max_uses: Some(2),
            uses: 0,
            revoked_at: None,
            revoked_by: None,
        }
    }

    #[test]
    fn a_grant_round_trips_and_its_state_follows_revocation_expiry_and_uses() {
        let mut g = grant();
        let json = serde_json::to_value(&g).unwrap_or_default();
        assert_eq!(json["args"]["env"], serde_json::json!({"exact": "staging"}));
        assert_eq!(json["args"]["note"], serde_json::json!("absent"));
        let back: Grant = serde_json::from_value(json).expect("round trip");
        assert_eq!(back, g);
        let now = Timestamp::now();
        assert!(g.live_at(g.run_id, now));
        assert!(!g.live_at(RunId::new(), now), "scope run: its own run only");
        g.scope = GrantScope::Agent;
        assert!(g.live_at(RunId::new(), now));
        g.uses = 2;
        assert_eq!(g.state_at(now), GrantState::UsedUp);
        g.expires_at = Some(now);
        assert_eq!(g.state_at(now), GrantState::Expired);
        g.revoked_at = Some(now);
        assert_eq!(g.state_at(now), GrantState::Revoked);
    }

    #[test]
    fn a_grant_request_is_parsed_strictly() {
        let r: GrantRequest = serde_json::from_value(serde_json::json!({})).expect("empty");
        assert_eq!(r.scope, GrantScope::Run);
        let bad = serde_json::from_value::<GrantRequest>(serde_json::json!({"scope": "world"}));
        assert!(bad.is_err());
        let bad = serde_json::from_value::<GrantRequest>(serde_json::json!({"uses": 3}));
        assert!(bad.is_err());
    }
}
