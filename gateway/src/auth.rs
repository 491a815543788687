//! Who may do what. Off by default (local use): everyone may do everything, and an answer's
//! responder id is whatever the caller says. With a tokens file (`DELTA_GATEWAY_TOKENS_FILE`),
//! every API call carries `Authorization: Bearer <token>` (bots over NATS: the same header on
//! their request message), the token names an identity with roles, and that identity is the
//! responder recorded with an answer.
//!
//! ```yaml
//! - name: alice            # the responder id journaled with her answers
//!   token: "…"             # at least 16 characters
//!   roles: [answer]        # submit, answer, operate, relay
//!   groups: [leads, oncall] # optional: `group:leads` in allowed_responders or approvals.of
//! ```
//!
//! Tokens are kept as SHA-256 digests only.

use std::collections::HashMap;
use std::path::Path;

use ring::digest;
use serde::{Deserialize, Serialize};

use delta_api::ErrorCode;

use crate::error::ApiError;

/// What a token allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Submit runs (and read them).
    Submit,
    /// Answer questions (and read them and their runs).
    Answer,
    /// Everything: cancel runs, read the queue, and all of the above (but `relay`).
    Operate,
    /// Answer, vote and claim on behalf of a person the tokens file names (`responder.id`), as
    /// that person: their roles, groups and rules apply, and the journal records the relaying
    /// token (`relayed_by`). For a bridge such as `delta slack`; never implied by `operate`.
    Relay,
}

/// The caller, once authenticated. A stream ticket carries it (as JSON, in Redis) to whichever
/// gateway the stream is opened on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Identity {
    /// The token's name; `None` with authentication off.
    pub name: Option<String>,
    roles: Vec<Role>,
    /// The groups the tokens file puts it in (none with authentication off: a group is only
    /// ever what the tokens file says).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    groups: Vec<String>,
}

impl Identity {
    pub fn has(&self, role: Role) -> bool {
        self.roles.contains(&role) || (role != Role::Relay && self.roles.contains(&Role::Operate))
    }

    /// Whether it may act on behalf of people of the tokens file ([`Role::Relay`]).
    pub fn is_relay(&self) -> bool {
        self.roles.contains(&Role::Relay)
    }

    /// The groups it is a member of.
    pub fn groups(&self) -> &[String] {
        &self.groups
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    name: String,
    token: String,
    roles: Vec<Role>,
    #[serde(default)]
    groups: Vec<String>,
}

/// The configured tokens; empty means authentication is off.
#[derive(Clone, Debug, Default)]
pub struct Auth {
    by_digest: HashMap<Vec<u8>, Identity>,
    /// The digest of `DELTA_GATEWAY_TOKEN`, whose identity (`operator`) is the fleet's, not a
    /// person of the tokens file: no relay acts for it.
    fleet_token: Option<Vec<u8>>,
}

/// Responder ids that belong to the fleet itself: the clock's (`timeout`), the one recorded when
/// authentication is off and none is given (`anonymous`), and the engine's (`system`). No token
/// and no caller may take them, or an answer could pass for the clock's.
pub const RESERVED_RESPONDERS: &[&str] = &["timeout", "anonymous", "system"];

/// The identity of `DELTA_GATEWAY_TOKEN`, the fleet's own operator token: no entry of the
/// tokens file may take it.
pub const FLEET_TOKEN_NAME: &str = "operator";

/// Equal, in a time that does not depend on where the two first differ.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn sha256(s: &str) -> Vec<u8> {
    digest::digest(&digest::SHA256, s.as_bytes())
        .as_ref()
        .to_vec()
}

impl Auth {
    /// Authentication off.
    pub fn off() -> Self {
        Self::default()
    }

    pub fn is_on(&self) -> bool {
        !self.by_digest.is_empty()
    }

    /// Adds one token for the whole fleet (`DELTA_GATEWAY_TOKEN`): the identity `operator`, with
    /// every role. For a small deployment, or `delta dev`, that needs no tokens file.
    pub fn with_operator_token(mut self, token: &str) -> Result<Self, String> {
        if token.chars().count() < 16 {
            return Err(
                "DELTA_GATEWAY_TOKEN is shorter than 16 characters (make one with `openssl rand -hex 24`)"
                    .into(),
            );
        }
        let identity = Identity {
            name: Some(FLEET_TOKEN_NAME.to_owned()),
            roles: vec![Role::Operate],
            groups: vec![],
        };
        if self.by_digest.insert(sha256(token), identity).is_some() {
            return Err("DELTA_GATEWAY_TOKEN is also a token of the tokens file".into());
        }
        self.fleet_token = Some(sha256(token));
        Ok(self)
    }

    /// Reads a tokens file; every problem is named.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("{}: cannot read the tokens file: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses the tokens file's YAML.
    pub fn parse(text: &str) -> Result<Self, String> {
        let entries: Vec<TokenEntry> = serde_yaml_ng::from_str(text).map_err(|e| {
            format!(
                "not a list of {{name, token, roles: [submit|answer|operate|relay], groups}}: {e}"
            )
        })?;
        if entries.is_empty() {
            return Err("no tokens: list at least one, or unset the tokens file to run without authentication".into());
        }
        let mut by_digest = HashMap::new();
        for e in entries {
            if e.name.trim().is_empty() {
                return Err("a token has an empty name".into());
            }
            if RESERVED_RESPONDERS.contains(&e.name.trim().to_lowercase().as_str()) {
                return Err(format!(
                    "`{}` is a name the fleet keeps for itself ({}): give the token another name",
                    e.name,
                    RESERVED_RESPONDERS.join(", ")
                ));
            }
            // `DELTA_GATEWAY_TOKEN`'s identity: a person of that name would answer as it (a
            // relay could act for them), and the journal could not tell the two apart.
            if e.name.trim().eq_ignore_ascii_case(FLEET_TOKEN_NAME) {
                return Err(format!(
                    "`{}` is DELTA_GATEWAY_TOKEN's identity: give the token another name",
                    e.name
                ));
            }
            if e.token.chars().count() < 16 {
                return Err(format!(
                    "the token of `{}` is shorter than 16 characters",
                    e.name
                ));
            }
            if e.roles.is_empty() {
                return Err(format!("`{}` has no roles", e.name));
            }
            for g in &e.groups {
                let name_ok = !g.is_empty()
                    && g.len() <= 100
                    && g.chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
                if !name_ok {
                    return Err(format!(
                        "`{}` has a group `{g}` that is not a group name (letters, digits, `-`, `_`, `.`)",
                        e.name
                    ));
                }
            }
            let identity = Identity {
                name: Some(e.name.clone()),
                roles: e.roles,
                groups: e.groups,
            };
            if by_digest.insert(sha256(&e.token), identity).is_some() {
                return Err(format!("the token of `{}` is used twice", e.name));
            }
        }
        Ok(Self {
            by_digest,
            fleet_token: None,
        })
    }

    /// Whether a token of the tokens file is named `name`.
    /// Whether a token named `name` (the tokens file's, or `DELTA_GATEWAY_TOKEN`'s `operator`)
    /// grants `role`; with authentication off, everyone may everything.
    pub fn grants(&self, name: Option<&str>, role: Role) -> bool {
        if !self.is_on() {
            return true;
        }
        let Some(name) = name else { return false };
        self.by_digest
            .values()
            .any(|i| i.name.as_deref() == Some(name) && i.has(role))
    }

    pub fn knows(&self, name: &str) -> bool {
        self.by_digest
            .values()
            .any(|i| i.name.as_deref() == Some(name))
    }

    /// The person the tokens file names `name` (the groups of all its tokens), as a relay may
    /// act for them: to answer, vote and claim, never with more (an `operate` person's other
    /// powers, such as breaking someone's claim, stay theirs); `None` for a name the tokens file
    /// does not know, and for `DELTA_GATEWAY_TOKEN`'s `operator`, which is nobody's.
    pub fn person(&self, name: &str) -> Option<Identity> {
        let mut roles: Vec<Role> = self
            .by_digest
            .iter()
            .filter(|(digest, _)| self.fleet_token.as_ref() != Some(*digest))
            .map(|(_, i)| i)
            .filter(|i| i.name.as_deref() == Some(name))
            .flat_map(|i| i.roles.iter().copied())
            .collect();
        if roles.is_empty() {
            return None;
        }
        if roles.contains(&Role::Answer) || roles.contains(&Role::Operate) {
            roles = vec![Role::Answer];
        } else {
            roles.retain(|r| *r == Role::Submit);
        }
        roles.dedup();
        Some(Identity {
            name: Some(name.to_owned()),
            roles,
            groups: self.groups_of(name),
        })
    }

    /// Who `name` is now: the roles and groups of every token of that name (the operator
    /// token's included); `None` when no token has that name any more. A one-time answer link
    /// answers as this, not as what its maker held when it was made.
    pub fn current(&self, name: &str) -> Option<Identity> {
        let mut roles: Vec<Role> = self
            .by_digest
            .values()
            .filter(|i| i.name.as_deref() == Some(name))
            .flat_map(|i| i.roles.iter().copied())
            .collect();
        if roles.is_empty() {
            return None;
        }
        roles.sort_by_key(|r| *r as u8);
        roles.dedup();
        Some(Identity {
            name: Some(name.to_owned()),
            roles,
            groups: self.groups_of(name),
        })
    }

    /// The groups the tokens file puts `name` in (none for an unknown name).
    pub fn groups_of(&self, name: &str) -> Vec<String> {
        // Every token of that name (a rotation keeps two): the same answer on every gateway.
        let mut groups: Vec<String> = self
            .by_digest
            .values()
            .filter(|i| i.name.as_deref() == Some(name))
            .flat_map(|i| i.groups.iter().cloned())
            .collect();
        groups.sort();
        groups.dedup();
        groups
    }

    /// The caller behind an `Authorization` header value, if it has `role`.
    pub fn check(&self, authorization: Option<&str>, role: Role) -> Result<Identity, ApiError> {
        self.check_any(authorization, &[role])
    }

    /// The caller behind an `Authorization` header value, if it has one of `roles`.
    pub fn check_any(
        &self,
        authorization: Option<&str>,
        roles: &[Role],
    ) -> Result<Identity, ApiError> {
        if !self.is_on() {
            return Ok(Identity {
                name: None,
                roles: vec![Role::Operate],
                groups: vec![],
            });
        }
        let Some(header) = authorization else {
            return Err(ApiError::new(
                ErrorCode::Unauthorized,
                "this gateway needs `Authorization: Bearer <token>`; ask an operator for a token",
            ));
        };
        // The scheme is case-insensitive (RFC 9110): `Bearer`, `bearer`, `BEARER`.
        let token = match header.trim_start().split_once(' ') {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("bearer") => rest.trim(),
            _ => "",
        };
        // Every digest is compared, each in constant time: how long the check takes says
        // nothing about which token came close.
        let digest = sha256(token);
        let found = self.by_digest.iter().fold(None, |hit, (d, identity)| {
            if same_bytes(d, &digest) {
                Some(identity)
            } else {
                hit
            }
        });
        let Some(identity) = found else {
            return Err(ApiError::new(
                ErrorCode::Unauthorized,
                "the bearer token is not known to this gateway",
            ));
        };
        if !roles.iter().any(|r| identity.has(*r)) {
            let names: Vec<String> = roles
                .iter()
                .map(|r| format!("{r:?}").to_lowercase())
                .collect();
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                format!(
                    "`{}` may not do this: it needs the role {}",
                    identity.name.as_deref().unwrap_or("?"),
                    names.join(" or ")
                ),
            ));
        }
        Ok(identity.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "- name: alice\n  token: alice-token-0123456789\n  roles: [answer]\n- name: ops\n  token: ops-token-0123456789ab\n  roles: [operate]\n";

    #[test]
    fn tokens_grant_their_roles_and_operate_grants_all() {
        let auth = Auth::parse(FILE).expect("valid");
        let alice = auth
            .check(Some("Bearer alice-token-0123456789"), Role::Answer)
            .expect("alice answers");
        assert_eq!(alice.name.as_deref(), Some("alice"));
        let e = auth
            .check(Some("Bearer alice-token-0123456789"), Role::Submit)
            .expect_err("alice does not submit");
        assert_eq!(e.code, ErrorCode::Forbidden);
        assert!(
            auth.check(Some("Bearer ops-token-0123456789ab"), Role::Submit)
                .is_ok()
        );
        assert_eq!(
            auth.check(None, Role::Answer).expect_err("no token").code,
            ErrorCode::Unauthorized
        );
        assert_eq!(
            auth.check(Some("Bearer nope"), Role::Answer)
                .expect_err("bad")
                .code,
            ErrorCode::Unauthorized
        );
    }

    #[test]
    fn bad_files_are_refused_with_the_reason() {
        for (text, needle) in [
            ("[]", "no tokens"),
            (
                "- name: a\n  token: short\n  roles: [answer]\n",
                "shorter than 16",
            ),
            (
                "- name: a\n  token: 0123456789abcdefg\n  roles: [admin]\n",
                "roles",
            ),
            (
                "- name: a\n  token: 0123456789abcdefg\n  roles: []\n",
                "no roles",
            ),
            (
                "- name: a\n  token: 0123456789abcdefg\n  roles: [answer]\n- name: b\n  token: 0123456789abcdefg\n  roles: [answer]\n",
                "used twice",
            ),
        ] {
            let e = Auth::parse(text).expect_err(text);
            assert!(e.contains(needle), "{e} should mention {needle}");
        }
    }

    #[test]
    fn the_scheme_is_case_insensitive_and_reserved_names_are_refused() {
        let auth = Auth::parse(FILE).expect("valid");
        for header in [
            "Bearer alice-token-0123456789",
            "bearer alice-token-0123456789",
            "BEARER alice-token-0123456789",
        ] {
            assert!(auth.check(Some(header), Role::Answer).is_ok(), "{header}");
        }
        assert!(
            auth.check(Some("Basic alice-token-0123456789"), Role::Answer)
                .is_err()
        );
        for name in ["timeout", "Anonymous", "system"] {
            let e = Auth::parse(&format!(
                "- name: {name}\n  token: 0123456789abcdefg\n  roles: [answer]\n"
            ))
            .expect_err(name);
            assert!(e.contains("keeps for itself"), "{e}");
        }
        // DELTA_GATEWAY_TOKEN's identity: a person of that name would pass for it.
        for name in ["operator", " Operator"] {
            let e = Auth::parse(&format!(
                "- name: \"{name}\"\n  token: 0123456789abcdefg\n  roles: [answer]\n"
            ))
            .expect_err(name);
            assert!(e.contains("DELTA_GATEWAY_TOKEN's identity"), "{e}");
        }
        assert!(
            same_bytes(b"abc", b"abc") && !same_bytes(b"abc", b"abd") && !same_bytes(b"ab", b"abc")
        );
    }

    #[test]
    fn relay_is_never_implied_and_people_are_found_by_name() {
        let auth = Auth::parse(&format!(
            "{FILE}- name: slack\n  token: slack-token-0123456789\n  roles: [relay]\n"
        ))
        .expect("valid");
        let ops = auth
            .check(Some("Bearer ops-token-0123456789ab"), Role::Operate)
            .expect("ops");
        assert!(!ops.has(Role::Relay) && !ops.is_relay());
        let slack = auth
            .check_any(Some("Bearer slack-token-0123456789"), &[Role::Relay])
            .expect("relay");
        assert!(slack.is_relay() && !slack.has(Role::Answer));
        let alice = auth.person("alice").expect("alice");
        assert!(alice.has(Role::Answer) && !alice.is_relay());
        assert!(auth.person("mallory").is_none());
        // An operator is relayed as one who answers, never with the rest of `operate`; the
        // fleet's own token is nobody a relay may act for.
        let ops = auth.person("ops").expect("ops");
        assert!(ops.has(Role::Answer) && !ops.has(Role::Operate));
        let auth = auth
            .with_operator_token("fleet-token-0123456789")
            .expect("token");
        assert!(auth.person("operator").is_none());
    }

    /// What a name's tokens grant (an A2A push config stored before its creator's role was
    /// recorded is judged so).
    #[test]
    fn grants_by_name() {
        let auth = Auth::parse(FILE)
            .expect("valid")
            .with_operator_token("fleet-token-0123456789")
            .expect("operator");
        assert!(auth.grants(Some("ops"), Role::Operate));
        assert!(auth.grants(Some("operator"), Role::Operate));
        assert!(auth.grants(Some("alice"), Role::Answer));
        assert!(!auth.grants(Some("alice"), Role::Operate));
        assert!(!auth.grants(Some("nobody"), Role::Answer));
        assert!(!auth.grants(None, Role::Answer));
        assert!(Auth::off().grants(None, Role::Operate));
    }

    #[test]
    fn off_lets_everyone_in_anonymously() {
        let id = Auth::off().check(None, Role::Operate).expect("off");
        assert_eq!(id.name, None);
    }
}
