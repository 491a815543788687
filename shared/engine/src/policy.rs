//! `policy.yaml`: rules an agent's operator writes to deny a tool call outright, allow it without
//! a question, or require a person's approval of it, whatever the tool's own `approval:` says
//! (docs/agents.md "Policy").
//!
//! ```yaml
//! rules:
//!   - name: no-prod-deletes         # required, unique: journaled with every decision it makes
//!     tool: delete_db               # a tool of the agent, or "*" for every tool
//!     args: {env: "prod.*"}         # optional; every one must match (patterns match whole values)
//!     effect: deny                  # deny | allow | require_approval
//!     reason: "ask the DBA team"    # optional: told to the agent with a denial
//! ```
//!
//! The engine evaluates the rules before each new tool call, in order; the first rule that
//! matches decides. No rule matching leaves the tool's own `approval:` to decide. A deny always
//! wins: it is decided before grants are looked at, so no grant can approve a denied call. A call
//! that needs approval (by its tool or by `require_approval`) is then approved by a live matching
//! grant, if the tool is grantable, or put to a person. Why Rust YAML rules rather than Cedar:
//! the decisions are three, over one tool name and its argument values; a list read top to
//! bottom, first match wins, is what an operator can check at a glance, and the errors name the
//! file, line and rule.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use regex::Regex;
use serde::Deserialize;
use serde_json::Value;

use crate::agent::{Error, parse_yaml};
use crate::grants::{arg_text, compile};
use crate::tools::{ParamType, Tool};

/// What a rule does with a call it matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// The call is not run: the agent is told it was denied, by which rule, and the run goes on.
    Deny,
    /// The call runs without a question, even if its tool asks for approval.
    Allow,
    /// A person approves the call first (or a grant does), even if its tool would not ask.
    RequireApproval,
}

impl Effect {
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::Deny => "deny",
            Effect::Allow => "allow",
            Effect::RequireApproval => "require_approval",
        }
    }
}

/// One argument's condition.
#[derive(Clone, Debug)]
pub enum ArgPattern {
    /// The value, in its text form, is exactly this.
    Equals(String),
    /// The value is this number, however it is spelled (`0`, `00`, `+0`, ` 0`, `0.0`): the text
    /// of [`crate::tools::number_text`].
    Number(String),
    /// The whole value matches this (anchored) expression.
    Regex(Regex),
}

impl ArgPattern {
    fn number(n: &serde_json::Number) -> Self {
        let text = n.to_string();
        ArgPattern::Number(crate::tools::number_text(&text).unwrap_or(text))
    }

    fn matches(&self, value: Option<&str>) -> bool {
        match (self, value) {
            (ArgPattern::Equals(want), Some(v)) => want == v,
            (ArgPattern::Number(want), Some(v)) => {
                crate::tools::number_text(v.trim()).is_some_and(|n| &n == want)
            }
            (ArgPattern::Regex(re), Some(v)) => re.is_match(v),
            (_, None) => false,
        }
    }
}

/// A checked rule.
#[derive(Clone, Debug)]
pub struct Rule {
    pub name: String,
    /// `None`: every tool (`tool: "*"`).
    pub tool: Option<String>,
    pub args: Vec<(String, ArgPattern)>,
    pub effect: Effect,
    pub reason: Option<String>,
}

impl Rule {
    fn matches(&self, tool: &str, args: &Value) -> bool {
        self.tool.as_deref().is_none_or(|t| t == tool)
            && self
                .args
                .iter()
                .all(|(name, p)| p.matches(arg_text(args, name).as_deref()))
    }
}

/// An agent's policy: its rules in order (none without `policy.yaml`).
#[derive(Clone, Debug, Default)]
pub struct Policy {
    pub rules: Vec<Rule>,
}

/// `policy.yaml` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(default)]
    rules: Vec<RuleConfig>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleConfig {
    name: String,
    tool: String,
    #[serde(default)]
    args: BTreeMap<String, Value>,
    effect: Effect,
    #[serde(default)]
    reason: Option<String>,
}

pub const POLICY_FILE: &str = "policy.yaml";

impl Policy {
    /// The policy of the agent in `dir`: its `policy.yaml`, or none when there is no such file.
    pub fn load(dir: &Path, tools: &BTreeMap<String, Tool>) -> Result<Policy, Error> {
        let path = dir.join(POLICY_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Policy::default()),
            Err(source) => {
                return Err(Error::Read {
                    path: path.display().to_string(),
                    source,
                });
            }
        };
        Policy::parse(&path, &text, tools)
    }

    /// Parses and checks `policy.yaml`'s text (`path` names it in errors) against the agent's
    /// tools: every rule named, names unique, the tool one of the agent's (or `*`), the arguments
    /// its parameters, the patterns valid.
    pub fn parse(path: &Path, text: &str, tools: &BTreeMap<String, Tool>) -> Result<Policy, Error> {
        if text.trim().is_empty() {
            return Ok(Policy::default());
        }
        let file: PolicyFile = parse_yaml(path, text)?;
        let mut seen = HashSet::new();
        let mut rules = vec![];
        for (i, rc) in file.rules.into_iter().enumerate() {
            let field = format!("rules[{i}]");
            let needle = format!("name: {}", rc.name);
            let bad = |sub: &str, msg: String| {
                Error::invalid(path, text, format!("{field}{sub}"), Some(&needle), msg)
            };
            if rc.name.trim().is_empty() {
                return Err(Error::invalid(
                    path,
                    text,
                    format!("{field}.name"),
                    None,
                    "must not be empty: the journal names the rule that decided",
                ));
            }
            if !seen.insert(rc.name.clone()) {
                return Err(bad(
                    ".name",
                    format!(
                        "a second rule named `{}`: rule names must be unique",
                        rc.name
                    ),
                ));
            }
            let tool = match rc.tool.as_str() {
                "*" => None,
                name => {
                    if !tools.contains_key(name) {
                        let known: Vec<&str> = tools.keys().map(String::as_str).collect();
                        return Err(bad(
                            ".tool",
                            format!(
                                "`{name}` is not a tool of this agent (tools: {}; or \"*\" for every tool)",
                                if known.is_empty() {
                                    "none".to_owned()
                                } else {
                                    known.join(", ")
                                }
                            ),
                        ));
                    }
                    Some(name.to_owned())
                }
            };
            let mut args = vec![];
            for (param, v) in &rc.args {
                let sub = format!(".args.{param}");
                if let Some(t) = tool.as_deref().and_then(|t| tools.get(t))
                    && !t.specs.iter().any(|p| &p.name == param)
                {
                    let known: Vec<&str> = t.specs.iter().map(|p| p.name.as_str()).collect();
                    return Err(bad(
                        &sub,
                        format!(
                            "`{param}` is not a parameter of `{}` (parameters: {})",
                            t.name,
                            if known.is_empty() {
                                "none".to_owned()
                            } else {
                                known.join(", ")
                            }
                        ),
                    ));
                }
                // A number matches a number parameter's value as a number (`0`, `00`, ` 0`,
                // `0.0` alike); any other parameter's, as its exact text.
                let numeric = tool
                    .as_deref()
                    .and_then(|t| tools.get(t))
                    .and_then(|t| t.specs.iter().find(|p| &p.name == param))
                    .is_some_and(|p| matches!(p.kind, ParamType::Number | ParamType::Integer));
                let number = |n: &serde_json::Number| {
                    if numeric {
                        ArgPattern::number(n)
                    } else {
                        ArgPattern::Equals(n.to_string())
                    }
                };
                let pattern = match v {
                    Value::String(s) => ArgPattern::Regex(compile(s).map_err(|e| bad(&sub, e))?),
                    Value::Number(n) => number(n),
                    Value::Bool(_) => ArgPattern::Equals(v.to_string()),
                    Value::Object(o) if o.len() == 1 => match (o.get("equals"), o.get("regex")) {
                        (Some(Value::String(s)), _) => ArgPattern::Equals(s.clone()),
                        (Some(Value::Number(n)), _) => number(n),
                        (Some(e @ Value::Bool(_)), _) => ArgPattern::Equals(e.to_string()),
                        (_, Some(Value::String(s))) => {
                            ArgPattern::Regex(compile(s).map_err(|e| bad(&sub, e))?)
                        }
                        _ => return Err(bad(&sub, pattern_help())),
                    },
                    _ => return Err(bad(&sub, pattern_help())),
                };
                args.push((param.clone(), pattern));
            }
            rules.push(Rule {
                name: rc.name,
                tool,
                args,
                effect: rc.effect,
                reason: rc.reason.filter(|r| !r.trim().is_empty()),
            });
        }
        Ok(Policy { rules })
    }

    /// The rule that decides a call of `tool` with `args`: the first that matches.
    pub fn decide(&self, tool: &str, args: &Value) -> Option<&Rule> {
        self.rules.iter().find(|r| r.matches(tool, args))
    }
}

fn pattern_help() -> String {
    "give a pattern (a string: a regular expression the whole value must match), a number or \
     boolean, {equals: <value>} or {regex: <pattern>}"
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::CheckedConfig;
    use serde_json::json;

    fn tools() -> BTreeMap<String, Tool> {
        let config = "name: t\nbrain: scripted\ntools:\n  - name: deploy\n    exec: \"echo ${env} ${version}\"\n  - name: echo\n    builtin: echo\n    parameters: [{name: text}]\n";
        CheckedConfig::parse(Path::new("config.yaml"), config, Path::new("."))
            .expect("config")
            .tools
    }

    fn parse(text: &str) -> Result<Policy, Error> {
        Policy::parse(Path::new("policy.yaml"), text, &tools())
    }

    /// A number in a rule is a number for a number parameter (however the value spells it),
    /// and exact text for any other (a string `05` is not the version `5`).
    #[test]
    fn a_rules_number_is_a_number_only_for_a_number_parameter() {
        let config = "name: t\nbrain: scripted\ntools:\n  - name: scale\n    exec: \"echo ${n} ${tag}\"\n    parameters: [{name: n, type: integer}, {name: tag}]\n";
        let tools = CheckedConfig::parse(Path::new("config.yaml"), config, Path::new("."))
            .expect("config")
            .tools;
        let p = Policy::parse(
            Path::new("policy.yaml"),
            "rules:\n  - {name: zero, tool: scale, args: {n: 0}, effect: deny}\n  - {name: five, tool: scale, args: {tag: 5}, effect: allow}\n",
            &tools,
        )
        .expect("policy");
        let rule = |args: Value| p.decide("scale", &args).map(|r| r.name.clone());
        for n in ["0", "00", "+0", "-0", "0.0"] {
            assert_eq!(
                rule(json!({"n": n, "tag": "x"})),
                Some("zero".into()),
                "{n}"
            );
        }
        assert_eq!(rule(json!({"n": "1", "tag": "5"})), Some("five".into()));
        assert_eq!(rule(json!({"n": "1", "tag": "05"})), None);
        assert_eq!(rule(json!({"n": "1", "tag": "5.0"})), None);
    }

    #[test]
    fn the_first_matching_rule_decides() {
        let p = parse(
            "rules:\n\
             - {name: no-prod, tool: deploy, args: {env: \"prod.*\"}, effect: deny, reason: ask the DBA}\n\
             - {name: staging-ok, tool: deploy, args: {env: {equals: staging}}, effect: allow}\n\
             - {name: everything-else, tool: \"*\", effect: require_approval}\n",
        )
        .expect("valid");
        let rule = |tool: &str, args: Value| p.decide(tool, &args).map(|r| r.name.clone());
        assert_eq!(
            rule("deploy", json!({"env": "production"})).as_deref(),
            Some("no-prod")
        );
        assert_eq!(
            rule("deploy", json!({"env": "preprod"})).as_deref(),
            Some("everything-else"),
            "patterns match whole values"
        );
        assert_eq!(
            rule("deploy", json!({"env": "staging"})).as_deref(),
            Some("staging-ok")
        );
        assert_eq!(
            rule("echo", json!({"text": "x"})).as_deref(),
            Some("everything-else")
        );
        assert_eq!(
            p.decide("deploy", &json!({"env": "prod1"}))
                .map(|r| r.effect),
            Some(Effect::Deny)
        );
        assert_eq!(
            rule("deploy", json!({})).as_deref(),
            Some("everything-else"),
            "a missing argument matches no pattern"
        );
        assert!(parse("").expect("empty").rules.is_empty());
        assert!(parse("rules: []\n").expect("no rules").rules.is_empty());
    }

    #[test]
    fn a_bad_policy_names_the_file_the_line_and_the_rule() {
        let cases = [
            (
                "rules:\n  - {name: a, tool: nope, effect: deny}\n",
                "rules[0].tool",
                "not a tool",
            ),
            (
                "rules:\n  - {name: a, tool: deploy, effect: maybe}\n",
                "rules[0].effect",
                "unknown variant",
            ),
            (
                "rules:\n  - {name: a, tool: deploy, args: {who: x}, effect: deny}\n",
                "rules[0].args.who",
                "not a parameter",
            ),
            (
                "rules:\n  - {name: a, tool: deploy, args: {env: \"(\"}, effect: deny}\n",
                "rules[0].args.env",
                "not a valid regular expression",
            ),
            (
                "rules:\n  - {name: a, tool: deploy, effect: deny}\n  - {name: a, tool: echo, effect: allow}\n",
                "rules[1].name",
                "unique",
            ),
            (
                "rules:\n  - {name: a, tool: deploy, effect: deny, when: now}\n",
                "rules[0]",
                "unknown field",
            ),
            (
                "rules:\n  - {name: a, tool: deploy, args: {env: [1]}, effect: deny}\n",
                "rules[0].args.env",
                "give a pattern",
            ),
            (
                "rules:\n  - {name: \" \", tool: deploy, effect: deny}\n",
                "rules[0].name",
                "must not be empty",
            ),
        ];
        for (text, field, says) in cases {
            match parse(text) {
                Err(Error::Invalid {
                    path,
                    field: f,
                    message,
                    line,
                }) => {
                    assert_eq!(path, "policy.yaml");
                    assert!(f.starts_with(field), "{text}: field {f}, want {field}");
                    assert!(message.contains(says), "{text}: {message}");
                    assert!(line.is_some() || f.ends_with(".name"), "{text}: a line");
                }
                other => panic!("{text}: {other:?}"),
            }
        }
    }
}
