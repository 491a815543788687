//! `script.yaml`: the scripted brain's deterministic program.
//!
//! ```yaml
//! steps:
//!   - think: "Greeting the user"
//!   - tool: echo
//!     args: {text: "hello ${task}"}
//!   - ask_human: {prompt: "Your name?"}
//!   - ask_human:              # a typed answer: `${answer}` is its JSON, `${answer.email}` a field
//!       prompt: "Contact?"
//!       response_schema:
//!         type: object
//!         properties: {email: {type: string, format: email}, count: {type: integer, minimum: 1}}
//!         required: [email]
//!   - ask_human:
//!       prompt: "Colour?"
//!       options: [{id: red, label: Red}, {id: blue, label: Blue}]
//!   - branch:                   # on the last answer's option id (or its text)
//!       red:  [{finish: "red it is"}]
//!       default: [{fail: "no colour"}]
//!   - plan: [{description: "deploy", tool: deploy}]
//!     revise: [{description: "deploy, then ${answer}", tool: deploy}]   # after "modify"
//!   - finish: "done, ${answer}"
//! ```
//!
//! Templates: `${task}`, `${run_id}`, `${answer}` (the last answer's text, else its option id;
//! a typed answer's `data` as JSON), `${answer.<field>}` (a field of a typed answer: a string as
//! is, another value as JSON),
//! `${option}` (its option id), `${observation}` (the last tool result), `${secret}` (the latest
//! sensitive answer, however many questions ago). A sensitive answer is never put in a template:
//! `${answer}` and `${secret}` become a `{{secret:…}}` reference that only the tool runner
//! resolves, so a tool parameter is bound to the answer without the brain ever holding it.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::agent::{ASK_HUMAN, Error, parse_yaml};
use crate::tools::Tool;
use delta_protocol::schema::ResponseSchema;
use delta_protocol::{InputType, InteractionType, OptionAction};

/// The most characters of a question's prompt (and of its details).
pub const MAX_PROMPT_CHARS: usize = 16_000;
/// The most characters of a title, an option's id or label.
pub const MAX_LABEL_CHARS: usize = 200;
/// The most characters of an option's description or input prompt.
pub const MAX_DESCRIPTION_CHARS: usize = 2_000;
/// The most options a question offers.
pub const MAX_OPTIONS: usize = 50;
/// The most characters of a typed answer's field name.
pub const MAX_FIELD_NAME_CHARS: usize = 100;

/// One option of a scripted `ask_human`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ScriptOption {
    #[serde(alias = "option_id")]
    pub id: String,
    #[serde(default)]
    pub label: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    /// Default `PROVIDE_INFO`.
    #[serde(default)]
    pub action: Option<OptionAction>,
    #[serde(default)]
    pub requires_input: bool,
    #[serde(default)]
    pub input_prompt: Option<String>,
    #[serde(default, alias = "is_dangerous")]
    pub dangerous: bool,
}

/// The arguments of an `ask_human` call (a scripted step, or the brain's tool call).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AskHuman {
    pub prompt: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_type: Option<InputType>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sensitive: bool,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<InteractionType>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<ScriptOption>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_option_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<String>,
    /// Who may answer (responder ids, `group:<name>`); empty: anyone the gateway lets answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_responders: Vec<String>,
    /// Decided by votes: how many must approve, and who may vote (its options need one that
    /// approves, `APPROVE_AND_EXECUTE`, and one that does not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approvals: Option<delta_protocol::Approvals>,
    /// What happens while it waits: reminders, more responders, its default applied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub escalation: Vec<delta_protocol::EscalationStep>,
    /// A typed answer: MCP elicitation's restricted JSON Schema (docs/protocol.md §3). The
    /// answer is then a JSON object in `data`, and takes no options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_schema: Option<Value>,
}

impl AskHuman {
    /// Checks what serde cannot: options unique, the default one of them, a `response_schema`
    /// of the subset (and then no options).
    pub fn check(&self) -> Result<(), String> {
        if self.prompt.trim().is_empty() {
            return Err("`prompt` must not be empty".into());
        }
        // What a person reads and every channel shows: bounded, and nothing shown empty (a
        // model asks with these too; an empty label is a button with nothing on it, and a
        // refusal in Slack).
        let long = |what: &str, text: &str, max: usize| {
            (text.chars().count() > max).then(|| {
                format!("`{what}` is longer than {max} characters: say it shorter (put the rest in a file or a tool's output)")
            })
        };
        let mut checks = vec![long("prompt", &self.prompt, MAX_PROMPT_CHARS)];
        if let Some(t) = &self.title {
            checks.push(long("title", t, MAX_LABEL_CHARS));
        }
        if let Some(d) = &self.details {
            checks.push(long("details", d, MAX_PROMPT_CHARS));
        }
        if self.options.len() > MAX_OPTIONS {
            checks.push(Some(format!(
                "{} options: at most {MAX_OPTIONS} (ask with fewer, or a typed answer with an enum field)",
                self.options.len()
            )));
        }
        for o in &self.options {
            if o.id.trim().is_empty() {
                checks.push(Some("an option's `id` must not be empty".into()));
            }
            checks.push(long("options[].id", &o.id, MAX_LABEL_CHARS));
            if let Some(l) = &o.label {
                if l.trim().is_empty() {
                    checks.push(Some(format!(
                        "option `{}` has an empty `label`: leave it out (the id is shown) or say what it does",
                        o.id.chars().take(40).collect::<String>()
                    )));
                }
                checks.push(long("options[].label", l, MAX_LABEL_CHARS));
            }
            if let Some(d) = &o.description {
                checks.push(long("options[].description", d, MAX_DESCRIPTION_CHARS));
            }
            if let Some(p) = &o.input_prompt {
                checks.push(long("options[].input_prompt", p, MAX_DESCRIPTION_CHARS));
            }
        }
        if let Some(why) = checks.into_iter().flatten().next() {
            return Err(why);
        }
        delta_protocol::human::check_responder_list(
            "allowed_responders",
            &self.allowed_responders,
        )?;
        delta_protocol::human::check_escalation(&self.escalation)?;
        if let Some(a) = &self.approvals {
            a.check()?;
            let approves = self
                .options
                .iter()
                .any(|o| o.action == Some(delta_protocol::OptionAction::ApproveAndExecute));
            let other = self
                .options
                .iter()
                .any(|o| o.action != Some(delta_protocol::OptionAction::ApproveAndExecute));
            if !(approves && other) {
                return Err("`approvals` needs options to vote with: one whose action is APPROVE_AND_EXECUTE and one that is not".into());
            }
            if let Some(d) = &self.default_option_id
                && self.options.iter().any(|o| {
                    &o.id == d && o.action == Some(delta_protocol::OptionAction::ApproveAndExecute)
                })
            {
                return Err(format!(
                    "`default_option_id: {d}` approves, but `approvals` says votes decide: a deadline or an escalation would approve it with no vote; choose a default that does not approve"
                ));
            }
        }
        if let Some(schema) = &self.response_schema {
            ResponseSchema::parse(schema).map_err(|e| e.to_string())?;
            // A field's name is a form field's id in every channel (Slack's block ids are at
            // most 255 characters): a name, not a text. Checked where questions are made, so
            // that one asked before the bound is still answered.
            if let Some(long) = schema
                .get("properties")
                .and_then(Value::as_object)
                .and_then(|p| p.keys().find(|k| k.chars().count() > MAX_FIELD_NAME_CHARS))
            {
                return Err(format!(
                    "`response_schema`: a property's name is longer than {MAX_FIELD_NAME_CHARS} characters (`{}…`): name it shorter (its `title` is what people read)",
                    long.chars().take(20).collect::<String>()
                ));
            }
            if !self.options.is_empty() {
                return Err(
                    "`response_schema` and `options` do not go together: a typed answer is its data (offer choices as an enum field instead)"
                        .into(),
                );
            }
        }
        let mut seen = std::collections::HashSet::new();
        for o in &self.options {
            if !seen.insert(&o.id) {
                return Err(format!("option `{}` appears twice", o.id));
            }
        }
        if let Some(d) = &self.default_option_id
            && !self.options.iter().any(|o| &o.id == d)
        {
            return Err(format!(
                "`default_option_id: {d}` is not one of the options"
            ));
        }
        Ok(())
    }
}

/// A tool call step.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ToolStep {
    pub tool: String,
    #[serde(default)]
    pub args: BTreeMap<String, Value>,
    /// The thought journaled with the call.
    #[serde(default)]
    pub thought: Option<String>,
}

/// A task of a scripted plan.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PlanStep {
    pub description: String,
    #[serde(default)]
    pub tool: Option<String>,
}

/// One step of the script.
// A script is read once per run and holds a handful of steps: the size of the `ask_human` step
// (its approvals, escalation and schema) costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Step {
    Tool(ToolStep),
    Think {
        think: String,
    },
    Ask {
        ask_human: AskHuman,
    },
    /// A plan (journaled as `PLAN`; with `confirm_plan`, put to a person). After a "modify"
    /// answer the step plans again: the person's edited tasks if they sent some, else
    /// `revise` (where `${answer}` is their feedback), else the same tasks.
    Plan {
        plan: Vec<PlanStep>,
        #[serde(default)]
        revise: Option<Vec<PlanStep>>,
    },
    /// Cases keyed by option id or answer text; `default` when none matches.
    Branch {
        branch: BTreeMap<String, Vec<Step>>,
    },
    Finish {
        finish: String,
    },
    Fail {
        fail: String,
    },
}

/// A checked `script.yaml`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Script {
    pub steps: Vec<Step>,
    /// A digest of `script.yaml`'s text (hex): a run's memo of where it stands in the script
    /// is used only with the script it was made with.
    #[serde(skip)]
    pub digest: String,
}

impl Script {
    /// Loads and checks `path` against the agent's tools.
    pub fn load(path: &Path, tools: &BTreeMap<String, Tool>) -> Result<Script, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.display().to_string(),
            source,
        })?;
        Script::parse(path, &text, tools)
    }

    /// Parses and checks the text of `script.yaml` (`path` names it in errors) against the
    /// agent's tools. Pure: what [`Script::load`] runs once the file is read.
    pub fn parse(path: &Path, text: &str, tools: &BTreeMap<String, Tool>) -> Result<Script, Error> {
        let script: Script = parse_yaml(path, text).map_err(|e| match e {
            // Untagged enums say only "did not match any variant": say what a step may be.
            Error::Invalid {
                path,
                line,
                field,
                message,
            } if message.contains("untagged enum Step") => Error::Invalid {
                path,
                line,
                field,
                message: "not a step: a step is one of `think`, `tool` (+ `args`, `thought`), \
                          `ask_human`, `plan`, `branch`, `finish` or `fail`, with only its own fields"
                    .into(),
            },
            other => other,
        })?;
        check_steps(&script.steps, "steps", path, text, tools)?;
        let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
        Ok(Script {
            digest: digest.as_ref()[..12]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
            ..script
        })
    }
}

fn check_steps(
    steps: &[Step],
    at: &str,
    path: &Path,
    text: &str,
    tools: &BTreeMap<String, Tool>,
) -> Result<(), Error> {
    for (i, step) in steps.iter().enumerate() {
        let field = format!("{at}[{i}]");
        match step {
            Step::Tool(t) => {
                if t.tool == ASK_HUMAN {
                    return Err(Error::invalid(
                        path,
                        text,
                        format!("{field}.tool"),
                        Some(&format!("tool: {ASK_HUMAN}")),
                        "use an `ask_human:` step to ask a person",
                    ));
                }
                let Some(tool) = tools.get(&t.tool) else {
                    let known: Vec<&str> = tools.keys().map(String::as_str).collect();
                    return Err(Error::invalid(
                        path,
                        text,
                        format!("{field}.tool"),
                        Some(&format!("tool: {}", t.tool)),
                        format!(
                            "unknown tool `{}`; config.yaml declares: {}",
                            t.tool,
                            if known.is_empty() {
                                "no tools".into()
                            } else {
                                known.join(", ")
                            }
                        ),
                    ));
                };
                for key in t.args.keys() {
                    if !tool.params.iter().any(|p| &p.name == key) {
                        return Err(Error::invalid(
                            path,
                            text,
                            format!("{field}.args.{key}"),
                            Some(&format!("{key}:")),
                            format!("tool `{}` has no parameter `{key}`", t.tool),
                        ));
                    }
                }
            }
            Step::Ask { ask_human } => {
                ask_human.check().map_err(|m| {
                    Error::invalid(
                        path,
                        text,
                        format!("{field}.ask_human"),
                        Some(&ask_human.prompt),
                        m,
                    )
                })?;
            }
            Step::Branch { branch } => {
                for (case, steps) in branch {
                    check_steps(steps, &format!("{field}.branch.{case}"), path, text, tools)?;
                }
            }
            Step::Plan { plan, revise } => {
                let lists = [("plan", Some(plan)), ("revise", revise.as_ref())];
                for (key, list) in lists {
                    for (k, task) in list.into_iter().flatten().enumerate() {
                        if let Some(name) = &task.tool
                            && !tools.contains_key(name)
                        {
                            return Err(Error::invalid(
                                path,
                                text,
                                format!("{field}.{key}[{k}].tool"),
                                Some(&format!("tool: {name}")),
                                format!("unknown tool `{name}`"),
                            ));
                        }
                    }
                }
            }
            Step::Think { .. } | Step::Finish { .. } | Step::Fail { .. } => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(yaml: &str) -> Result<(), String> {
        let a: AskHuman = serde_yaml_ng::from_str(yaml).map_err(|e| e.to_string())?;
        a.check()
    }

    /// What a person reads is bounded, and nothing of it shows empty: a model asks with these.
    #[test]
    fn a_question_is_bounded_and_shows_nothing_empty() {
        assert_eq!(
            ask("prompt: Go?\noptions: [{id: y, label: Yes}, {id: n}]"),
            Ok(())
        );
        let long = "p".repeat(MAX_PROMPT_CHARS + 1);
        let too_many: Vec<String> = (0..=MAX_OPTIONS).map(|i| format!("{{id: o{i}}}")).collect();
        for (yaml, says) in [
            (format!("prompt: {long}"), "`prompt` is longer than"),
            (
                format!("prompt: Go?\ndetails: {long}"),
                "`details` is longer than",
            ),
            (
                format!("prompt: Go?\ntitle: {}", "t".repeat(201)),
                "`title` is longer than",
            ),
            (
                format!("prompt: Go?\noptions: [{}]", too_many.join(", ")),
                "options: at most",
            ),
            (
                "prompt: Go?\noptions: [{id: y, label: \" \"}]".to_owned(),
                "empty `label`",
            ),
            (
                "prompt: Go?\noptions: [{id: \"\"}]".to_owned(),
                "`id` must not be empty",
            ),
            (
                format!(
                    "prompt: Go?\noptions: [{{id: y, description: {}}}]",
                    "d".repeat(2001)
                ),
                "`options[].description` is longer than",
            ),
            (
                format!(
                    "prompt: Go?\nresponse_schema: {{type: object, properties: {{{}: {{type: string}}}}}}",
                    "n".repeat(MAX_FIELD_NAME_CHARS + 1)
                ),
                "name it shorter",
            ),
        ] {
            let got = ask(&yaml).expect_err(says);
            assert!(got.contains(says), "{says}: {got}");
        }
    }
}
