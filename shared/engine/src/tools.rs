//! Tools: Delta Engine's three ways to declare a command, turned into one [`Tool`] that builds
//! an argv (never a shell string from untrusted text) and runs it as a child process.
//!
//! - `command: [cmd, fixed…]` + `parameters` injected as `argument`, `option` (`option_name` /
//!   `option_flag`, optional `option_value_template` with `${value}`) or `stdin`;
//! - `exec: "cmd ${a} ${b}"`: split like a shell would, no shell runs, metacharacters refused;
//! - `shell: "cat ${file} | wc -l"`: run as `sh -c <script> -- <values…>`, each `${p}` becoming a
//!   quoted positional parameter (`${p:raw}` unquoted), so values are never parsed as shell code.
//!
//! In the first two forms a value that begins an argv word before the command's own `--` may not
//! start with `-`, so that it is never read as an option ([`Tool::invocation`]).
//!
//! `${AGENT_HOME}` and `${CWD}` expand in the fixed parts. A child runs in its own process group
//! in the work directory; on its timeout or on cancellation the whole group is killed. Output is
//! captured up to a cap per stream; the rest is drained and counted, so a chatty tool never
//! blocks on a full pipe.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

/// How a parameter reaches the command.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InjectAs {
    #[default]
    Argument,
    Stdin,
    Option,
}

/// A parameter's declared type; values are checked against it before the tool runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ParamType {
    #[default]
    String,
    Number,
    Integer,
    Boolean,
}

/// One entry of `parameters:`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamConfig {
    pub name: String,
    #[serde(default, rename = "type")]
    pub kind: ParamType,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub inject_as: InjectAs,
    #[serde(default, alias = "option_flag")]
    pub option_name: Option<String>,
    #[serde(default)]
    pub option_value_template: Option<String>,
    /// Optional parameters are left out of the command when absent (default: required).
    #[serde(default = "yes")]
    pub required: bool,
    /// Accepted for Delta Engine compatibility; arguments follow declaration order.
    #[serde(default)]
    pub position: Option<u32>,
    /// This parameter may carry a sensitive answer: a `{{secret:<request_id>}}` reference in its
    /// value becomes the secret when the tool runs. In any other parameter a reference is
    /// refused, whoever wrote it (the LLM, a task, another person's answer).
    #[serde(default)]
    pub secret: bool,
    /// This parameter's value may start with `-` where it begins a word of the command line that
    /// no `--` precedes: it is an option's argument (`grep -e ${pattern}`), or the program takes
    /// such words as data. Without it such a value is refused, so that it is never read as an
    /// option (see [`Tool::invocation`]).
    #[serde(default)]
    pub allow_leading_dash: bool,
}

fn yes() -> bool {
    true
}

/// What arguments are checked against: a parameter's name, type and whether it is required.
/// An approval question carries its tool's list in `context.parameters`, so that the gateway
/// checks edited arguments with [`check_args`] before it accepts an answer, as the engine does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamSpec {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: ParamType,
    pub required: bool,
}

impl From<&ParamConfig> for ParamSpec {
    fn from(p: &ParamConfig) -> Self {
        ParamSpec {
            name: p.name.clone(),
            kind: p.kind,
            required: p.required,
        }
    }
}

/// Checks arguments against parameters: an object, no unknown names, every required parameter
/// present, values of the declared type. Returns each given value as the text the tool receives.
pub fn check_args(params: &[ParamSpec], args: &Value) -> Result<BTreeMap<String, String>, String> {
    let obj = match args {
        Value::Object(o) => o,
        Value::Null if params.is_empty() => return Ok(BTreeMap::new()),
        other => return Err(format!("arguments must be a JSON object, got {other}")),
    };
    let mut out = BTreeMap::new();
    for key in obj.keys() {
        if !params.iter().any(|p| &p.name == key) {
            let known: Vec<&str> = params.iter().map(|p| p.name.as_str()).collect();
            return Err(format!(
                "unknown parameter `{key}` (parameters: {})",
                if known.is_empty() {
                    "none".into()
                } else {
                    known.join(", ")
                }
            ));
        }
    }
    for p in params {
        let text = match obj.get(&p.name) {
            None | Some(Value::Null) if p.required => {
                return Err(format!("missing required parameter `{}`", p.name));
            }
            None | Some(Value::Null) => continue,
            Some(v) => typed(p, v)?,
        };
        out.insert(p.name.clone(), text);
    }
    Ok(out)
}

/// `approval:` of a tool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Approval {
    #[default]
    Never,
    Always,
    WhenDangerous,
}

/// One entry of `tools:` in `config.yaml`, as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolConfig {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub command: Option<Vec<String>>,
    #[serde(default)]
    pub exec: Option<String>,
    #[serde(default)]
    pub shell: Option<String>,
    /// A tool that runs inside the worker, with no process: `echo` (returns its `text`).
    #[serde(default)]
    pub builtin: Option<String>,
    /// With `exec:`/`shell:`, the parameter fed to standard input.
    #[serde(default)]
    pub stdin: Option<String>,
    #[serde(default)]
    pub parameters: Vec<ParamConfig>,
    #[serde(default)]
    pub approval: Approval,
    /// When its calls are approved by votes: how many people, and who may vote
    /// (docs/protocol.md §3 "Quorum").
    #[serde(default)]
    pub approvals: Option<delta_protocol::Approvals>,
    /// What happens while its approval question waits (reminders, more approvers, its
    /// default applied), carried out by the gateway.
    #[serde(default)]
    pub escalation: Vec<delta_protocol::EscalationStep>,
    #[serde(default)]
    pub dangerous: bool,
    /// Argument patterns that make one call dangerous: `{parameter: regex}`. A call is dangerous
    /// when the tool is `dangerous: true` or any of these matches its argument's value.
    #[serde(default)]
    pub dangerous_if: BTreeMap<String, String>,
    /// Safe to run again after a crash left its outcome unknown.
    #[serde(default)]
    pub idempotent: bool,
    /// Whether an approval of a call may create a grant that approves later calls (default true);
    /// `false`: every call that needs approval is asked about, and grants are refused.
    #[serde(default = "yes")]
    pub grantable: bool,
    #[serde(default)]
    pub timeout_s: Option<u64>,
    /// Bytes of stdout (and of stderr) kept in the observation (default 64 KiB).
    #[serde(default)]
    pub max_output_bytes: Option<usize>,
    /// Variables of the host's environment this tool sees, besides [`BASE_ENV`]: names only,
    /// their values taken from the worker's (or `delta run`'s) environment when set. Nothing else
    /// reaches a tool: not the secrets key, not an LLM API key.
    #[serde(default)]
    pub env: Vec<String>,
    /// Processes the tool leaves running in the background outlive the call (by default its
    /// whole process group is killed once it exits: a `cmd &` it started would otherwise run on,
    /// unseen, and hold the worker's resources after the run ends).
    #[serde(default)]
    pub keep_background: bool,
}

/// What every tool sees of the host's environment (when set there): where programs are, the
/// home directory, the locale and the time zone.
pub const BASE_ENV: &[&str] = &["PATH", "HOME", "LANG", "TZ"];

/// A declaration that cannot work.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("give exactly one of `command`, `exec`, `shell` or `builtin`")]
    Form,
    #[error("no built-in tool `{0}`: the built-ins are `echo` (returns its `text` parameter)")]
    UnknownBuiltin(String),
    #[error("`command` must not be empty")]
    EmptyCommand,
    #[error("`exec` cannot contain shell syntax (`{0}`): use `shell:` for pipes and redirects")]
    ShellSyntax(String),
    #[error("cannot split `{0}` into words (unbalanced quotes?)")]
    Split(String),
    #[error("parameter `{0}` is declared twice")]
    DuplicateParam(String),
    #[error(
        "env: `{0}` is not a variable name (letters, digits and `_`, not starting with a digit)"
    )]
    EnvName(String),
    #[error(
        "env: `{0}` is one of the fleet's own settings (DELTA_*), which never reach a tool; name the variable the tool needs under another name"
    )]
    EnvReserved(String),
    #[error("parameter `{0}` uses inject_as: option but has no `option_name`")]
    NoOptionName(String),
    #[error("only one parameter can be injected as stdin (`{0}` and `{1}`)")]
    TwoStdin(String, String),
    #[error("`stdin: {0}` names no parameter")]
    UnknownStdin(String),
    #[error("`${{{0}:raw}}` is only allowed in `shell:`")]
    RawOutsideShell(String),
    #[error("`dangerous_if` names `{0}`, which is not a parameter of this tool")]
    UnknownDangerousParam(String),
    #[error("`dangerous_if.{param}`: not a valid regular expression ({message})")]
    BadPattern { param: String, message: String },
    #[error("{0}")]
    Approvals(String),
}

/// A call refused because a value would reach its program as an option: it starts with `-` and
/// begins a word of the command line that no `--` precedes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{param}` starts with `-`, which `{program}` would read as an option, not as the value of \
     `{param}`: pass a value that does not start with `-`; or, in the tool `{tool}`, end the \
     program's options with `--` before `${{{param}}}` (if `{program}` accepts it) or declare the \
     parameter `allow_leading_dash: true`"
)]
pub struct LeadingDash {
    pub tool: String,
    pub param: String,
    pub program: String,
}

/// One piece of an argv template.
#[derive(Clone, Debug, PartialEq)]
enum Piece {
    Text(String),
    Param(String),
}

/// How the argv is built from the arguments.
#[derive(Clone, Debug)]
enum Form {
    /// `command` + parameters in declared order.
    Command(Vec<String>),
    /// `exec`: words, each a sequence of literal text and parameters.
    Exec(Vec<Vec<Piece>>),
    /// `shell`: the rewritten script and the parameter behind each `$N`.
    Shell {
        script: String,
        positional: Vec<String>,
    },
    /// `builtin: echo`: returns its `text` parameter, in the worker (no process).
    Echo,
}

/// A checked tool, ready to build invocations.
#[derive(Clone, Debug)]
pub struct Tool {
    pub name: String,
    pub description: String,
    pub params: Vec<ParamConfig>,
    /// `params` as arguments are checked against them (and as approval questions carry them).
    pub specs: Vec<ParamSpec>,
    form: Form,
    pub approval: Approval,
    /// `approvals:`: its approval questions are decided by votes.
    pub approvals: Option<delta_protocol::Approvals>,
    /// `escalation:` of its approval questions.
    pub escalation: Vec<delta_protocol::EscalationStep>,
    pub dangerous: bool,
    /// `dangerous_if`, compiled: a call whose argument matches is dangerous.
    pub dangerous_if: Vec<(String, regex::Regex)>,
    pub idempotent: bool,
    /// `grantable:` (default true): grants may approve its calls.
    pub grantable: bool,
    pub timeout: Duration,
    pub max_output_bytes: usize,
    /// Host variables the tool may see besides [`BASE_ENV`] (`env:` in its declaration).
    pub env: Vec<String>,
    /// `keep_background:`: its background processes outlive the call.
    pub keep_background: bool,
}

impl Tool {
    /// Whether a call runs a process (everything but `builtin:` tools, which run in the host).
    pub fn runs_process(&self) -> bool {
        !matches!(self.form, Form::Echo)
    }
}

pub const DEFAULT_TOOL_TIMEOUT_S: u64 = 120;
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 64 * 1024;

/// Expands `${AGENT_HOME}` and `${CWD}` in fixed command parts.
fn expand_vars(s: &str, env: &ToolEnv) -> String {
    s.replace("${AGENT_HOME}", &env.agent_home.display().to_string())
        .replace("${CWD}", &env.work_dir.display().to_string())
}

const RESERVED: [&str; 2] = ["AGENT_HOME", "CWD"];

/// Splits `text` into literal text and `${name}` / `${name:raw}` placeholders.
fn placeholders(text: &str) -> Vec<(String, bool, std::ops::Range<usize>)> {
    let mut out = vec![];
    let mut rest = 0;
    while let Some(start) = text[rest..].find("${").map(|i| i + rest) {
        let Some(end) = text[start..].find('}').map(|i| i + start) else {
            break;
        };
        let inner = &text[start + 2..end];
        let (name, raw) = match inner.strip_suffix(":raw") {
            Some(n) => (n, true),
            None => (inner, false),
        };
        let valid = !name.is_empty()
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !RESERVED.contains(&name);
        if valid {
            out.push((name.to_owned(), raw, start..end + 1));
        }
        rest = end + 1;
    }
    out
}

fn pieces(word: &str) -> Result<Vec<Piece>, ToolError> {
    let mut v = vec![];
    let mut at = 0;
    for (name, raw, range) in placeholders(word) {
        if raw {
            return Err(ToolError::RawOutsideShell(name));
        }
        if range.start > at {
            v.push(Piece::Text(word[at..range.start].to_owned()));
        }
        v.push(Piece::Param(name));
        at = range.end;
    }
    if at < word.len() {
        v.push(Piece::Text(word[at..].to_owned()));
    }
    Ok(v)
}

/// Rewrites a `shell:` template: `${p}` becomes `"$N"` outside quotes and `$N` inside double
/// quotes (where it is already one word); `${p:raw}` becomes `$N`.
fn rewrite_shell(template: &str) -> (String, Vec<String>) {
    /// Where the shell is in its quoting: a command substitution (`$(…)`, backquotes) starts
    /// afresh, unquoted, even inside double quotes, and ends where it started.
    #[derive(Default)]
    struct Quoting {
        double: bool,
        single: bool,
        /// Inside `$(` (or `$((`): the parentheses open in it (it ends when they are all
        /// closed).
        parens: Option<u32>,
        /// Inside `$((…))`: arithmetic, where a value is not split into words, and where
        /// quotes are refused by some shells (dash): a value there stays `${N}`, as before.
        arithmetic: bool,
        backquoted: bool,
        /// A backquoted substitution inside double quotes: there `\"` quotes (the shell strips
        /// the backslash before it reads the substitution).
        in_double: bool,
    }
    let marks = placeholders(template);
    let mut positional: Vec<String> = vec![];
    let mut script = String::new();
    let mut stack = vec![Quoting::default()];
    let mut next = marks.iter().peekable();
    let mut i = 0;
    let bytes = template.as_bytes();
    while i < template.len() {
        let top = stack.len() - 1;
        let (in_double, in_single) = (stack[top].double, stack[top].single);
        // A backslash outside single quotes takes the next character as it is (as sh does): an
        // escaped quote does not open or close a string, an escaped backslash leaves the quote
        // after it a real one, and `\${p}` is the text `${p}`, not a placeholder.
        if bytes[i] == b'\\'
            && !in_single
            && stack[top].backquoted
            && stack[top].in_double
            && bytes.get(i + 1) == Some(&b'"')
        {
            script.push_str("\\\"");
            stack[top].double = !in_double;
            i += 2;
            continue;
        }
        if bytes[i] == b'\\' && !in_single {
            script.push('\\');
            i += 1;
            if let Some(c) = template[i..].chars().next() {
                if next.peek().is_some_and(|m| m.2.start == i) {
                    let (_, _, range) = next.next().cloned().unwrap_or_default();
                    script.push_str(&template[range.clone()]);
                    i = range.end;
                } else {
                    script.push(c);
                    i += c.len_utf8();
                }
            }
            continue;
        }
        if let Some((name, raw, range)) = next.peek().map(|m| (&m.0, m.1, m.2.clone()))
            && range.start == i
            && !in_single
        {
            let n = match positional.iter().position(|p| p == name) {
                Some(k) => k + 1,
                None => {
                    positional.push(name.clone());
                    positional.len()
                }
            };
            if raw || in_double || stack[top].arithmetic {
                script.push_str(&format!("${{{n}}}"));
            } else {
                script.push_str(&format!("\"${{{n}}}\""));
            }
            i = range.end;
            next.next();
            continue;
        }
        if let Some(m) = next.peek()
            && m.2.start == i
        {
            // Inside single quotes a placeholder is literal text.
            next.next();
        }
        let c = template[i..].chars().next().unwrap_or(' ');
        let q = &mut stack[top];
        match c {
            '\'' if in_single => q.single = false,
            _ if in_single => {}
            '"' => q.double = !q.double,
            '\'' if !in_double => q.single = true,
            '$' if bytes.get(i + 1) == Some(&b'(') && bytes.get(i + 2) == Some(&b'(') => {
                script.push_str("$((");
                i += 3;
                stack.push(Quoting {
                    parens: Some(2),
                    arithmetic: true,
                    ..Quoting::default()
                });
                continue;
            }
            '$' if bytes.get(i + 1) == Some(&b'(') => {
                script.push_str("$(");
                i += 2;
                stack.push(Quoting {
                    parens: Some(1),
                    ..Quoting::default()
                });
                continue;
            }
            '(' if !in_double => {
                if let Some(n) = q.parens.as_mut() {
                    *n += 1;
                }
            }
            ')' if !in_double => {
                if let Some(n) = q.parens.as_mut() {
                    *n -= 1;
                    if *n == 0 && stack.len() > 1 {
                        stack.pop();
                    }
                }
            }
            '`' if q.backquoted && !in_double => {
                stack.pop();
            }
            '`' => stack.push(Quoting {
                backquoted: true,
                in_double,
                ..Quoting::default()
            }),
            _ => {}
        }
        script.push(c);
        i += c.len_utf8();
    }
    (script, positional)
}

impl Tool {
    /// Checks a declaration and turns it into a tool. `agent_dir` is `${AGENT_HOME}`.
    pub fn from_config(c: &ToolConfig, _agent_dir: &Path) -> Result<Tool, ToolError> {
        let forms = [
            c.command.is_some(),
            c.exec.is_some(),
            c.shell.is_some(),
            c.builtin.is_some(),
        ];
        if forms.iter().filter(|f| **f).count() != 1 {
            return Err(ToolError::Form);
        }
        for name in &c.env {
            let mut chars = name.chars();
            let valid = chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(ToolError::EnvName(name.clone()));
            }
            if name.starts_with("DELTA_") {
                return Err(ToolError::EnvReserved(name.clone()));
            }
        }
        let mut params = c.parameters.clone();
        let mut seen = std::collections::HashSet::new();
        for p in &params {
            if !seen.insert(p.name.clone()) {
                return Err(ToolError::DuplicateParam(p.name.clone()));
            }
        }
        // exec/shell: parameters come from the placeholders; declared ones only add detail.
        let infer = |name: &str, inject_as: InjectAs, params: &mut Vec<ParamConfig>| {
            if let Some(p) = params.iter_mut().find(|p| p.name == name) {
                p.inject_as = inject_as;
            } else {
                params.push(ParamConfig {
                    name: name.to_owned(),
                    kind: ParamType::String,
                    description: None,
                    inject_as,
                    option_name: None,
                    option_value_template: None,
                    required: true,
                    position: None,
                    secret: false,
                    allow_leading_dash: false,
                });
            }
        };
        let form = if let Some(cmd) = &c.command {
            if cmd.is_empty() {
                return Err(ToolError::EmptyCommand);
            }
            Form::Command(cmd.clone())
        } else if let Some(exec) = &c.exec {
            if let Some(bad) = ["|", "&", ";", "<", ">", "`", "$("]
                .iter()
                .find(|m| exec.contains(*m))
            {
                return Err(ToolError::ShellSyntax((*bad).to_owned()));
            }
            let words = shlex::split(exec).ok_or_else(|| ToolError::Split(exec.clone()))?;
            if words.is_empty() {
                return Err(ToolError::EmptyCommand);
            }
            let words = words
                .iter()
                .map(|w| pieces(w))
                .collect::<Result<Vec<_>, _>>()?;
            for w in &words {
                for p in w {
                    if let Piece::Param(n) = p {
                        infer(n, InjectAs::Argument, &mut params);
                    }
                }
            }
            Form::Exec(words)
        } else if let Some(b) = &c.builtin {
            if b != "echo" {
                return Err(ToolError::UnknownBuiltin(b.clone()));
            }
            infer("text", InjectAs::Argument, &mut params);
            Form::Echo
        } else {
            let template = c.shell.clone().unwrap_or_default();
            let (script, positional) = rewrite_shell(&template);
            for n in &positional {
                infer(n, InjectAs::Argument, &mut params);
            }
            Form::Shell { script, positional }
        };
        if let Some(s) = &c.stdin {
            if c.command.is_some() && !params.iter().any(|p| &p.name == s) {
                return Err(ToolError::UnknownStdin(s.clone()));
            }
            infer(s, InjectAs::Stdin, &mut params);
        }
        let mut stdin_param: Option<&str> = None;
        for p in &params {
            match p.inject_as {
                InjectAs::Option if p.option_name.is_none() => {
                    return Err(ToolError::NoOptionName(p.name.clone()));
                }
                InjectAs::Stdin => {
                    if let Some(first) = stdin_param {
                        return Err(ToolError::TwoStdin(first.to_owned(), p.name.clone()));
                    }
                    stdin_param = Some(&p.name);
                }
                _ => {}
            }
        }
        if let Some(a) = &c.approvals {
            a.check().map_err(ToolError::Approvals)?;
            if c.approval == Approval::Never {
                return Err(ToolError::Approvals(
                    "`approvals` needs `approval: always` or `approval: when_dangerous` (they say when a call is put to a vote)".into(),
                ));
            }
        }
        delta_protocol::human::check_escalation(&c.escalation).map_err(ToolError::Approvals)?;
        if !c.escalation.is_empty() && c.approval == Approval::Never {
            return Err(ToolError::Approvals(
                "`escalation` needs `approval: always` or `approval: when_dangerous` (it escalates the approval question)".into(),
            ));
        }
        let mut dangerous_if = vec![];
        for (param, pattern) in &c.dangerous_if {
            if !params.iter().any(|p| &p.name == param) {
                return Err(ToolError::UnknownDangerousParam(param.clone()));
            }
            let re = regex::Regex::new(pattern).map_err(|e| ToolError::BadPattern {
                param: param.clone(),
                message: e.to_string(),
            })?;
            dangerous_if.push((param.clone(), re));
        }
        Ok(Tool {
            name: c.name.clone(),
            description: c.description.clone().unwrap_or_default(),
            specs: params.iter().map(ParamSpec::from).collect(),
            params,
            form,
            approval: c.approval,
            approvals: c.approvals.clone(),
            escalation: c.escalation.clone(),
            dangerous: c.dangerous,
            dangerous_if,
            idempotent: c.idempotent,
            grantable: c.grantable,
            timeout: Duration::from_secs(c.timeout_s.unwrap_or(DEFAULT_TOOL_TIMEOUT_S)),
            max_output_bytes: c.max_output_bytes.unwrap_or(DEFAULT_MAX_OUTPUT_BYTES),
            env: c.env.clone(),
            keep_background: c.keep_background,
        })
    }

    /// Why a call with `args` is dangerous, or `None` when it is not: the tool is declared
    /// `dangerous`, or an argument matches its `dangerous_if` pattern (values are matched in their
    /// text form, as the command would receive them).
    pub fn danger(&self, args: &Value) -> Option<String> {
        if self.dangerous {
            return Some(format!("`{}` is declared dangerous", self.name));
        }
        // Each value as the tool would get it (a number in its one spelling, [`typed`]), when
        // the arguments check; else as sent.
        let checked = self.check_args(args).ok();
        self.dangerous_if.iter().find_map(|(param, re)| {
            let text = match &checked {
                Some(values) => values.get(param)?.clone(),
                None => match args.get(param)? {
                    Value::String(s) => s.clone(),
                    Value::Null => return None,
                    other => other.to_string(),
                },
            };
            re.is_match(&text)
                .then(|| format!("`{param}` matches /{}/", re.as_str()))
        })
    }

    /// Whether some call of this tool may be dangerous (for plans, decided before the arguments
    /// are known).
    pub fn may_be_dangerous(&self) -> bool {
        self.dangerous || !self.dangerous_if.is_empty()
    }

    /// Whether a call with `args` must be approved by a person before it runs.
    pub fn needs_approval(&self, args: &Value) -> bool {
        match self.approval {
            Approval::Never => false,
            Approval::Always => true,
            Approval::WhenDangerous => self.danger(args).is_some(),
        }
    }

    /// Checks arguments against the tool's parameters ([`check_args`]).
    pub fn check_args(&self, args: &Value) -> Result<BTreeMap<String, String>, String> {
        check_args(&self.specs, args)
    }

    /// The argv and stdin for checked arguments.
    ///
    /// A value that begins a word of the argv, after the program and before any `--` the command
    /// itself holds, must not start with `-` (a lone `-` excepted): the program would read it as
    /// an option (`--help`, `-rf`, `--output=…`), whoever wrote it. Such a call is refused, with
    /// what to change in the tool, unless the parameter is declared `allow_leading_dash: true`.
    /// The engine does not insert `--` itself: it cannot know whether a word is an option's
    /// argument (`-e ${pattern}`) or whether the program accepts `--` at all (`echo` prints it),
    /// so the tool's author writes it where the program takes it (`exec: "rm -- ${file}"`).
    /// `shell:` tools are not checked: their values are `$1`, `$2`…, and whether the script
    /// passes `--` before them is the script's to say.
    pub fn invocation(
        &self,
        values: &BTreeMap<String, String>,
        env: &ToolEnv,
    ) -> Result<Invocation, LeadingDash> {
        let stdin = self
            .params
            .iter()
            .find(|p| p.inject_as == InjectAs::Stdin)
            .and_then(|p| values.get(&p.name).cloned());
        let argv = match &self.form {
            Form::Command(cmd) => {
                let mut argv: Vec<String> = cmd.iter().map(|s| expand_vars(s, env)).collect();
                let ended = cmd.iter().skip(1).any(|w| w == "--");
                for p in &self.params {
                    let Some(v) = values.get(&p.name) else {
                        continue;
                    };
                    match p.inject_as {
                        InjectAs::Argument => {
                            if !ended {
                                self.guard(&argv[0], p, v)?;
                            }
                            argv.push(v.clone());
                        }
                        InjectAs::Option => {
                            argv.push(p.option_name.clone().unwrap_or_default());
                            argv.push(match &p.option_value_template {
                                Some(t) => t.replace("${value}", v),
                                None => v.clone(),
                            });
                        }
                        InjectAs::Stdin => {}
                    }
                }
                argv
            }
            Form::Exec(words) => {
                let mut argv: Vec<String> = vec![];
                let mut ended = false;
                for (i, w) in words.iter().enumerate() {
                    // A word that is a single absent optional parameter disappears.
                    if let [Piece::Param(n)] = w.as_slice()
                        && !values.contains_key(n)
                    {
                        continue;
                    }
                    let word: String = w
                        .iter()
                        .map(|p| match p {
                            Piece::Text(t) => expand_vars(t, env),
                            Piece::Param(n) => values.get(n).cloned().unwrap_or_default(),
                        })
                        .collect();
                    if i > 0 && !ended {
                        // The value that begins the word, if a value does (empty ones skipped):
                        // the whole word is checked, not that value alone, so that `-` and
                        // `-x` in two values (or `-` and the text after it) make no option.
                        let first = w
                            .iter()
                            .map(|piece| match piece {
                                Piece::Text(t) => (None, t.as_str()),
                                Piece::Param(n) => {
                                    (Some(n), values.get(n).map_or("", String::as_str))
                                }
                            })
                            .find(|(_, text)| !text.is_empty());
                        if let Some((Some(name), _)) = first
                            && let Some(p) = self.params.iter().find(|p| &p.name == name)
                        {
                            self.guard(argv.first().map_or("", String::as_str), p, &word)?;
                        }
                    }
                    if i > 0 && matches!(w.as_slice(), [Piece::Text(t)] if t == "--") {
                        ended = true;
                    }
                    argv.push(word);
                }
                argv
            }
            Form::Shell { script, positional } => {
                let mut argv = vec![
                    "sh".to_owned(),
                    "-c".to_owned(),
                    expand_vars(script, env),
                    "--".to_owned(),
                ];
                argv.extend(
                    positional
                        .iter()
                        .map(|n| values.get(n).cloned().unwrap_or_default()),
                );
                argv
            }
            Form::Echo => vec![
                "echo".to_owned(),
                values.get("text").cloned().unwrap_or_default(),
            ],
        };
        Ok(Invocation {
            argv,
            stdin,
            env: self.env.clone(),
        })
    }

    /// Refuses `value` of `p` as the start of an argv word, where `program` would read it as an
    /// option. The value itself is never named: it may be a secret.
    fn guard(&self, program: &str, p: &ParamConfig, value: &str) -> Result<(), LeadingDash> {
        if p.allow_leading_dash || !value.starts_with('-') || value == "-" {
            return Ok(());
        }
        Err(LeadingDash {
            tool: self.name.clone(),
            param: p.name.clone(),
            program: program.to_owned(),
        })
    }

    /// The outcome of a built-in tool, run here and now; `None` for a tool that is a process.
    pub fn run_builtin(&self, values: &BTreeMap<String, String>) -> Option<Execution> {
        match self.form {
            Form::Echo => {
                // What `echo` prints: the text and a newline, kept to `max_output_bytes` like a
                // process's output.
                let full = format!("{}\n", values.get("text").map_or("", String::as_str));
                let mut cut = full.len().min(self.max_output_bytes);
                while !full.is_char_boundary(cut) {
                    cut -= 1;
                }
                let mut stdout = full[..cut].to_owned();
                if cut < full.len() {
                    stdout.push_str(&format!(
                        "\n[output truncated: {cut} of {} bytes kept]",
                        full.len()
                    ));
                }
                Some(Execution {
                    exit: Exit::Code(0),
                    stdout,
                    stderr: String::new(),
                    duration: Duration::ZERO,
                })
            }
            _ => None,
        }
    }
}

/// The text a tool gets for `v` as parameter `p`: a string as it is, a number as JSON writes
/// it; a `number` or `integer` given as a string, checked and trimmed. Policy rules,
/// `dangerous_if` and grants match this very text ([`canonical_args`]), and a rule's number
/// matches a number parameter's value however it is spelled ([`number_text`]).
fn typed(p: &ParamSpec, v: &Value) -> Result<String, String> {
    let wrong = |want: &str| Err(format!("parameter `{}` must be {want}, got {v}", p.name));
    match (p.kind, v) {
        (ParamType::String, Value::String(s)) => Ok(s.clone()),
        (ParamType::String, Value::Number(n)) => Ok(n.to_string()),
        (ParamType::String, Value::Bool(b)) => Ok(b.to_string()),
        (ParamType::String, _) => wrong("a string"),
        (ParamType::Number, Value::Number(n)) => Ok(n.to_string()),
        (ParamType::Number, Value::String(s)) if number_text(s.trim()).is_some() => {
            Ok(s.trim().to_owned())
        }
        (ParamType::Number, _) => wrong("a number"),
        (ParamType::Integer, Value::Number(n)) if n.is_i64() || n.is_u64() => Ok(n.to_string()),
        (ParamType::Integer, Value::String(s)) if s.trim().parse::<i64>().is_ok() => {
            Ok(s.trim().to_owned())
        }
        (ParamType::Integer, _) => wrong("an integer"),
        (ParamType::Boolean, Value::Bool(b)) => Ok(b.to_string()),
        (ParamType::Boolean, Value::String(s)) if s == "true" || s == "false" => Ok(s.clone()),
        (ParamType::Boolean, _) => wrong("true or false"),
    }
}

/// `text` as a JSON number would be spelled: an integer as one (`007` → `7`), else a finite
/// float as serde_json writes it; `None` for what is not a finite number (`NaN`, `inf`, `0x1`).
pub(crate) fn number_text(text: &str) -> Option<String> {
    if let Ok(i) = text.parse::<i64>() {
        return Some(i.to_string());
    }
    if let Ok(u) = text.parse::<u64>() {
        return Some(u.to_string());
    }
    let f = text.parse::<f64>().ok().filter(|f| f.is_finite())?;
    if f.fract() == 0.0 && f.abs() < 9.0e15 {
        // A whole number given with a fraction or an exponent (`5.0`, `5e0`): as the integer.
        #[allow(clippy::cast_possible_truncation)]
        return Some((f as i64).to_string());
    }
    serde_json::Number::from_f64(f).map(|n| n.to_string())
}

/// Checked arguments as the JSON object policy rules, `dangerous_if` and grants match: each
/// parameter's text as the tool gets it (see [`typed`]), as a string.
pub fn canonical_args(values: &BTreeMap<String, String>) -> Value {
    Value::Object(
        values
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect(),
    )
}

/// Where tools run.
#[derive(Clone, Debug)]
pub struct ToolEnv {
    pub work_dir: PathBuf,
    pub agent_home: PathBuf,
    /// Extra environment for the child (e.g. `DELTA_RUN_ID`).
    pub vars: Vec<(String, String)>,
}

/// A ready-to-run command.
#[derive(Clone, Debug, PartialEq)]
pub struct Invocation {
    pub argv: Vec<String>,
    pub stdin: Option<String>,
    /// The host variables the tool declared (`env:`), passed on besides [`BASE_ENV`].
    pub env: Vec<String>,
}

impl Invocation {
    /// The command line as a person would type it (for prompts and logs).
    pub fn display(&self) -> String {
        shlex::try_join(self.argv.iter().map(String::as_str))
            .unwrap_or_else(|_| self.argv.join(" "))
    }
}

/// How a child process ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
    TimedOut,
    Cancelled,
    SpawnFailed(String),
}

/// What a tool run produced.
#[derive(Clone, Debug)]
pub struct Execution {
    pub exit: Exit,
    pub stdout: String,
    pub stderr: String,
    pub duration: Duration,
}

impl Execution {
    pub fn success(&self) -> bool {
        self.exit == Exit::Code(0)
    }

    pub fn exit_code(&self) -> Option<i32> {
        match self.exit {
            Exit::Code(c) => Some(c),
            _ => None,
        }
    }

    /// The observation the brain sees: stdout, then stderr and the failure, if any.
    pub fn observation(&self, timeout: Duration) -> String {
        let mut s = self.stdout.clone();
        let mut add = |part: &str| {
            if !s.is_empty() && !s.ends_with('\n') {
                s.push('\n');
            }
            s.push_str(part);
        };
        if !self.stderr.is_empty() {
            add(&format!("[stderr]\n{}", self.stderr));
        }
        match &self.exit {
            Exit::Code(0) => {}
            Exit::Code(c) => add(&format!("[exit code {c}]")),
            Exit::Signal(sig) => add(&format!("[killed by signal {sig}]")),
            Exit::TimedOut => add(&format!(
                "[timed out after {}s and was killed]",
                timeout.as_secs()
            )),
            Exit::Cancelled => add("[cancelled]"),
            Exit::SpawnFailed(e) => add(&format!("[could not start: {e}]")),
        }
        s
    }
}

async fn capture<R: AsyncRead + Unpin>(mut r: R, cap: usize) -> String {
    let mut kept = Vec::new();
    let mut total = 0usize;
    let mut buf = [0u8; 8192];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                total += n;
                let room = cap.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
    let mut s = String::from_utf8_lossy(&kept).into_owned();
    if total > kept.len() {
        s.push_str(&format!(
            "\n[output truncated: {} of {} bytes kept]",
            kept.len(),
            total
        ));
    }
    s
}

/// Runs `inv` in `env.work_dir`, killing its process group at `timeout` or on `cancel`.
pub async fn execute(
    inv: &Invocation,
    env: &ToolEnv,
    timeout: Duration,
    max_output: usize,
    cancel: &CancellationToken,
) -> Execution {
    run_child(inv, env, timeout, max_output, cancel, false).await
}

/// As [`execute`], and the process group is killed once the process exits too: for hooks and
/// context generators, whose leftovers (a `cmd &` they started) have no business outliving them.
pub async fn execute_reaped(
    inv: &Invocation,
    env: &ToolEnv,
    timeout: Duration,
    max_output: usize,
    cancel: &CancellationToken,
) -> Execution {
    run_child(inv, env, timeout, max_output, cancel, true).await
}

/// [`execute`] (`reap` false) or [`execute_reaped`] (`reap` true).
pub async fn run_child(
    inv: &Invocation,
    env: &ToolEnv,
    timeout: Duration,
    max_output: usize,
    cancel: &CancellationToken,
    reap: bool,
) -> Execution {
    let started = Instant::now();
    let failed = |e: String| Execution {
        exit: Exit::SpawnFailed(e),
        stdout: String::new(),
        stderr: String::new(),
        duration: started.elapsed(),
    };
    let Some((program, args)) = inv.argv.split_first() else {
        return failed("empty command".into());
    };
    let mut cmd = tokio::process::Command::new(program);
    // A cleared environment: the worker's holds the secrets key and the LLM's API key, and a tool
    // (run on the LLM's word) must see neither. It gets the base variables and what it declared.
    cmd.env_clear();
    for name in BASE_ENV
        .iter()
        .copied()
        .chain(inv.env.iter().map(String::as_str))
    {
        if let Some(value) = std::env::var_os(name) {
            cmd.env(name, value);
        }
    }
    cmd.args(args)
        .current_dir(&env.work_dir)
        .envs(env.vars.iter().map(|(k, v)| (k, v)))
        .env("AGENT_HOME", &env.agent_home)
        .env("CWD", &env.work_dir)
        .stdin(if inv.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return failed(format!("{program}: {e}")),
    };
    let pgid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);
    if let (Some(mut sink), Some(text)) = (child.stdin.take(), inv.stdin.clone()) {
        tokio::spawn(async move {
            // A tool that exits without reading its stdin is not an error.
            let _ = sink.write_all(text.as_bytes()).await;
        });
    }
    let out = tokio::spawn(capture(child.stdout.take().expect("piped"), max_output));
    let err = tokio::spawn(capture(child.stderr.take().expect("piped"), max_output));
    let exit = tokio::select! {
        status = child.wait() => match status {
            Ok(s) => match (s.code(), std::os::unix::process::ExitStatusExt::signal(&s)) {
                (Some(c), _) => Exit::Code(c),
                (None, Some(sig)) => Exit::Signal(sig),
                (None, None) => Exit::Code(-1),
            },
            Err(e) => Exit::SpawnFailed(e.to_string()),
        },
        () = tokio::time::sleep(timeout) => Exit::TimedOut,
        () = cancel.cancelled() => Exit::Cancelled,
    };
    if reap || matches!(exit, Exit::TimedOut | Exit::Cancelled) {
        if let Some(pgid) = pgid {
            let _ = killpg(pgid, Signal::SIGKILL);
        }
        let _ = child.wait().await;
    }
    // Grandchildren left running (`keep_background`) may hold the pipes open: do not wait for
    // them forever, nor keep reading them after.
    let grace = Duration::from_secs(2);
    let gathered = |mut task: tokio::task::JoinHandle<String>| async move {
        match tokio::time::timeout(grace, &mut task).await {
            Ok(r) => r.unwrap_or_default(),
            Err(_) => {
                task.abort();
                String::new()
            }
        }
    };
    let stdout = gathered(out).await;
    let stderr = gathered(err).await;
    Execution {
        exit,
        stdout,
        stderr,
        duration: started.elapsed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(yaml: &str) -> Tool {
        let c: ToolConfig = serde_yaml_ng::from_str(yaml).expect("yaml");
        Tool::from_config(&c, Path::new("/agent")).expect("valid tool")
    }

    fn env(dir: &Path) -> ToolEnv {
        ToolEnv {
            work_dir: dir.to_path_buf(),
            agent_home: PathBuf::from("/agent"),
            vars: vec![],
        }
    }

    fn argv(t: &Tool, args: Value) -> Invocation {
        let values = t.check_args(&args).expect("args");
        t.invocation(&values, &env(Path::new("/work")))
            .expect("an argv")
    }

    #[test]
    fn command_form_injects_arguments_options_and_stdin() {
        let t = tool(
            "name: t\ncommand: [grep, \"${AGENT_HOME}/x\"]\nparameters:\n\
             \x20 - {name: pattern, inject_as: option, option_name: -e}\n\
             \x20 - {name: sed, inject_as: option, option_flag: --expr, option_value_template: \"s/${value}//g\"}\n\
             \x20 - {name: file, inject_as: argument}\n\
             \x20 - {name: body, inject_as: stdin}\n",
        );
        let inv = argv(
            &t,
            json!({"pattern": "a b", "sed": "x", "file": "f.txt", "body": "hello"}),
        );
        assert_eq!(
            inv.argv,
            ["grep", "/agent/x", "-e", "a b", "--expr", "s/x//g", "f.txt"]
        );
        assert_eq!(inv.stdin.as_deref(), Some("hello"));
    }

    #[test]
    fn builtin_echo_returns_its_text_without_a_process_and_unknown_builtins_are_refused() {
        let t = tool("name: echo\nbuiltin: echo\n");
        let values = t
            .check_args(&json!({"text": "run 7 step 2"}))
            .expect("args");
        let ex = t.run_builtin(&values).expect("a built-in");
        assert!(ex.success());
        assert_eq!(ex.stdout, "run 7 step 2\n", "as `echo` prints it");
        let small = tool("name: echo\nbuiltin: echo\nmax_output_bytes: 4\n");
        let v = small
            .check_args(&json!({"text": "abcdefgh"}))
            .expect("args");
        let cut = small.run_builtin(&v).expect("a built-in").stdout;
        assert!(
            cut.starts_with("abcd\n[output truncated: 4 of 9 bytes kept]"),
            "{cut}"
        );
        assert_eq!(
            t.invocation(&values, &env(Path::new("/work")))
                .expect("an argv")
                .argv,
            ["echo", "run 7 step 2"],
            "shown as what it does"
        );
        assert!(
            t.check_args(&json!({"txt": "x"})).is_err(),
            "its one parameter is `text`"
        );
        let c: ToolConfig = serde_yaml_ng::from_str("name: t\nbuiltin: sleep\n").expect("yaml");
        let e = Tool::from_config(&c, Path::new(".")).expect_err("unknown");
        assert!(
            matches!(e, ToolError::UnknownBuiltin(ref b) if b == "sleep"),
            "{e}"
        );
        let c: ToolConfig =
            serde_yaml_ng::from_str("name: t\nbuiltin: echo\nexec: \"echo\"\n").expect("yaml");
        assert!(matches!(
            Tool::from_config(&c, Path::new(".")),
            Err(ToolError::Form)
        ));
        let exec = tool("name: e\nexec: \"echo ${text}\"\n");
        let v = exec.check_args(&json!({"text": "x"})).expect("args");
        assert!(
            exec.run_builtin(&v).is_none(),
            "a process tool is not a built-in"
        );
    }

    #[test]
    fn exec_form_infers_parameters_and_refuses_shell_syntax() {
        let t = tool("name: t\nexec: \"cp ${src} --to=${dst} '${CWD}/z'\"\nstdin: body\n");
        let names: Vec<&str> = t.params.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["src", "dst", "body"]);
        let inv = argv(&t, json!({"src": "a; rm -rf /", "dst": "b", "body": "x"}));
        assert_eq!(inv.argv, ["cp", "a; rm -rf /", "--to=b", "/work/z"]);
        let bad: ToolConfig =
            serde_yaml_ng::from_str("name: t\nexec: \"cat ${f} | wc\"").expect("yaml");
        assert!(matches!(
            Tool::from_config(&bad, Path::new("/")),
            Err(ToolError::ShellSyntax(_))
        ));
    }

    #[test]
    fn shell_form_passes_values_as_positional_parameters() {
        let t = tool(
            "name: t\nshell: 'grep -c \"${pat}\" ${file} | wc -l; echo ${flags:raw} ${file}'\n",
        );
        let inv = argv(
            &t,
            json!({"pat": "p", "file": "$(reboot)", "flags": "-n -e"}),
        );
        assert_eq!(inv.argv[..2], ["sh", "-c"]);
        assert_eq!(
            inv.argv[2],
            "grep -c \"${1}\" \"${2}\" | wc -l; echo ${3} \"${2}\""
        );
        assert_eq!(inv.argv[3..], ["--", "p", "$(reboot)", "-n -e"]);
    }

    /// A command substitution starts its quoting afresh, even inside double quotes: a value in
    /// it is quoted there, and the quoting outside it goes on after it ends.
    #[test]
    fn a_value_inside_a_command_substitution_is_quoted_there() {
        for (template, script) in [
            (
                r#""n=$(grep -c ${p} app.log)""#,
                r#""n=$(grep -c "${1}" app.log)""#,
            ),
            (r#""$(cat "${p}")""#, r#""$(cat "${1}")""#),
            ("\"`cat ${p}`\"", "\"`cat \"${1}\"`\""),
            (r#""a ${p} $(b (c)) ${q}""#, r#""a ${1} $(b (c)) ${2}""#),
            (r#"echo $((1 + 2)) ${p}"#, r#"echo $((1 + 2)) "${1}""#),
            // Arithmetic: no word splitting there, and dash refuses quotes in it.
            (
                r#"echo "$(( ${p} + 1 ))" ${p}"#,
                r#"echo "$(( ${1} + 1 ))" "${1}""#,
            ),
            (r#"echo $((${p}*2))"#, r#"echo $((${1}*2))"#),
            // Backquotes inside double quotes: `\"` quotes inside them.
            (
                r#""`printf '%s|' \"${p}\"`""#,
                r#""`printf '%s|' \"${1}\"`""#,
            ),
            (r#"echo '$(x ${p})' ${p}"#, r#"echo '$(x ${p})' "${1}""#),
        ] {
            assert_eq!(rewrite_shell(template).0, script, "{template}");
        }
        // What `sh` (dash here) prints for a shell tool's call.
        let printed = |yaml: &str, args: Value| {
            let t = tool(yaml);
            let values = t.check_args(&args).expect("args");
            let inv = t.invocation(&values, &env(Path::new("/"))).expect("argv");
            let out = std::process::Command::new(&inv.argv[0])
                .args(&inv.argv[1..])
                .current_dir("/")
                .output()
                .expect("sh");
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        };
        // Three words and a glob stay one argument inside the substitution.
        assert_eq!(
            printed(
                "name: t\nshell: 'echo \"n=$(printf \"%s\\n\" ${p} | wc -l)\"'\n",
                json!({"p": "a b *"})
            ),
            "n=1"
        );
        // Arithmetic on a value still works.
        assert_eq!(
            printed(
                "name: t\nshell: 'echo \"$(( ${n} + 1 ))\"'\n",
                json!({"n": "41"})
            ),
            "42"
        );
    }

    /// The argv of `args`, or the refusal of a value that would be read as an option.
    fn try_argv(t: &Tool, args: Value) -> Result<Vec<String>, LeadingDash> {
        let values = t.check_args(&args).expect("args");
        t.invocation(&values, &env(Path::new("/work")))
            .map(|inv| inv.argv)
    }

    #[test]
    fn a_value_that_starts_a_word_never_becomes_an_option() {
        let ls = tool("name: list\nexec: \"ls -la ${dir}\"\n");
        for value in ["--help", "-rf", "--output=/etc/passwd", "--"] {
            let e = try_argv(&ls, json!({"dir": value})).expect_err(value);
            assert_eq!((e.param.as_str(), e.program.as_str()), ("dir", "ls"));
            let text = e.to_string();
            assert!(
                text.contains("`dir` starts with `-`") && text.contains("allow_leading_dash"),
                "{text}"
            );
            // The value is never repeated (it may be a secret); `--` is in the advice itself.
            assert!(
                value == "--" || !text.contains(value),
                "the value is never repeated: {text}"
            );
        }
        // Data that merely contains a dash, and a lone `-` (an operand by convention), pass.
        for value in ["docs", "a-b", "-", " -x", "./-rf"] {
            assert_eq!(
                try_argv(&ls, json!({"dir": value})).expect(value),
                ["ls", "-la", value]
            );
        }
        // After the command's own `--`, a value is data, whatever it starts with.
        let rm = tool("name: rm\nexec: \"rm -f -- ${file} ${other}\"\n");
        assert_eq!(
            try_argv(&rm, json!({"file": "-rf", "other": "--help"})).expect("after --"),
            ["rm", "-f", "--", "-rf", "--help"]
        );
        // Inside a word the template starts, a value cannot start an option.
        let cp = tool("name: cp\nexec: \"cp --target=${dst} ./${src} ${AGENT_HOME}/${x}\"\n");
        assert!(try_argv(&cp, json!({"dst": "-x", "src": "-y", "x": "-z"})).is_ok());
        // A word whose first value is empty starts with the next one.
        let two = tool("name: t\nexec: \"x ${a}${b}\"\n");
        let e = try_argv(&two, json!({"a": "", "b": "-r"})).expect_err("-r starts the word");
        assert_eq!(e.param, "b");
        assert!(try_argv(&two, json!({"a": "ok", "b": "-r"})).is_ok());
        // The whole word counts, not its first value alone: `-` and `-orphan` in two values,
        // or `-` before the template's own text, make no option either.
        let e = try_argv(&two, json!({"a": "-", "b": "-orphan=x"})).expect_err("split dash");
        assert_eq!(e.param, "a");
        let glued = tool("name: t\nexec: \"git checkout ${a}orphan\"\n");
        assert!(try_argv(&glued, json!({"a": "--"})).is_err());
        assert!(
            try_argv(&two, json!({"a": "-", "b": ""})).is_ok(),
            "a lone -"
        );
        // An option's argument is declared to take such values; the positional one is not.
        let grep = tool(
            "name: grep\nexec: \"grep -e ${pattern} ${file}\"\n\
             parameters: [{name: pattern, allow_leading_dash: true}]\n",
        );
        assert_eq!(
            try_argv(&grep, json!({"pattern": "-v", "file": "f"})).expect("an option argument"),
            ["grep", "-e", "-v", "f"]
        );
        let e = try_argv(&grep, json!({"pattern": "x", "file": "-r"})).expect_err("file");
        assert_eq!((e.param.as_str(), e.program.as_str()), ("file", "grep"));
        // An absent optional parameter leaves no word to check.
        let opt =
            tool("name: t\nexec: \"ls ${dir}\"\nparameters: [{name: dir, required: false}]\n");
        assert_eq!(try_argv(&opt, json!({})).expect("absent"), ["ls"]);
    }

    #[test]
    fn command_form_arguments_are_guarded_unless_the_command_ends_its_options() {
        let grep = tool(
            "name: grep\ncommand: [grep]\nparameters:\n\
             \x20 - {name: pattern, inject_as: option, option_name: -e}\n\
             \x20 - {name: file, inject_as: argument}\n",
        );
        // An option's value follows its option name: it is that option's argument.
        assert_eq!(
            try_argv(&grep, json!({"pattern": "--foo", "file": "f"})).expect("option value"),
            ["grep", "-e", "--foo", "f"]
        );
        let e = try_argv(&grep, json!({"pattern": "x", "file": "--help"})).expect_err("file");
        assert_eq!(e.param, "file");
        let rm =
            tool("name: rm\ncommand: [rm, --]\nparameters: [{name: file, inject_as: argument}]\n");
        assert_eq!(
            try_argv(&rm, json!({"file": "-rf"})).expect("after --"),
            ["rm", "--", "-rf"]
        );
    }

    #[test]
    fn shell_and_builtin_values_are_not_checked() {
        // `shell:` values are `$1`, `$2`…: whether they follow `--` is the script's to say.
        let sh = tool("name: t\nshell: 'ls -- ${d}'\n");
        assert_eq!(
            try_argv(&sh, json!({"d": "--help"})).expect("shell")[3..],
            ["--", "--help"]
        );
        let echo = tool("name: echo\nbuiltin: echo\n");
        assert!(try_argv(&echo, json!({"text": "-n"})).is_ok(), "no process");
    }

    #[test]
    fn a_backslash_never_leaves_a_placeholder_unquoted() {
        // `\\"` is a backslash, then a real quote: the placeholder is inside double quotes.
        let t = tool("name: t\nshell: 'echo \\\\\"${x}\" \\\"${y}'\n");
        let inv = argv(&t, json!({"x": "a  *", "y": "b  *"}));
        assert_eq!(inv.argv[2], "echo \\\\\"${1}\" \\\"\"${2}\"");
        // `\${x}` is text, as in sh.
        let t = tool("name: t\nshell: 'echo \\${x} ${x}'\n");
        let inv = argv(&t, json!({"x": "v"}));
        assert_eq!(inv.argv[2], "echo \\${x} \"${1}\"");
    }

    #[test]
    fn arguments_are_checked_against_parameters() {
        let t = tool(
            "name: t\ncommand: [x]\nparameters:\n  - {name: n, type: integer}\n  - {name: o, required: false}\n",
        );
        assert!(t.check_args(&json!({"n": 3})).is_ok());
        assert!(t.check_args(&json!({"n": "3"})).is_ok());
        assert!(
            t.check_args(&json!({}))
                .unwrap_err()
                .contains("missing required parameter `n`")
        );
        assert!(
            t.check_args(&json!({"n": 1, "zz": 1}))
                .unwrap_err()
                .contains("unknown parameter `zz`")
        );
        assert!(
            t.check_args(&json!({"n": "x"}))
                .unwrap_err()
                .contains("integer")
        );
        assert!(
            t.check_args(&json!([1]))
                .unwrap_err()
                .contains("JSON object")
        );
    }

    #[test]
    fn bad_declarations_are_refused() {
        for (yaml, want) in [
            ("name: t\n", "exactly one"),
            ("name: t\ncommand: []\n", "must not be empty"),
            (
                "name: t\ncommand: [x]\nparameters:\n  - {name: a, inject_as: option}\n",
                "option_name",
            ),
            ("name: t\nexec: \"x ${a:raw}\"\n", ":raw"),
            ("name: t\ncommand: [x]\nstdin: nope\n", "names no parameter"),
            (
                "name: t\nexec: \"x ${a}\"\ndangerous_if: {b: \"x\"}\n",
                "`b`, which is not a parameter",
            ),
            (
                "name: t\nexec: \"x ${a}\"\ndangerous_if: {a: \"(\"}\n",
                "not a valid regular expression",
            ),
        ] {
            let c: ToolConfig = serde_yaml_ng::from_str(yaml).expect("yaml");
            let err = Tool::from_config(&c, Path::new("/"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{yaml}: {err}");
        }
    }

    #[test]
    fn dangerous_if_decides_per_call() {
        let t = tool(
            "name: deploy\nexec: \"deploy ${env} ${replicas}\"\napproval: when_dangerous\n\
             dangerous_if: {env: \"^prod\", replicas: \"^[0-9]{3,}$\"}\n",
        );
        assert!(t.may_be_dangerous());
        let staging = json!({"env": "staging", "replicas": 2});
        assert_eq!(t.danger(&staging), None);
        assert!(!t.needs_approval(&staging));
        let prod = json!({"env": "prod-eu", "replicas": 2});
        assert_eq!(t.danger(&prod).as_deref(), Some("`env` matches /^prod/"));
        assert!(t.needs_approval(&prod));
        // Numbers are matched in their text form.
        assert!(t.needs_approval(&json!({"env": "staging", "replicas": 500})));

        let always = tool("name: t\nexec: \"x ${a}\"\napproval: always\n");
        assert!(always.needs_approval(&json!({"a": "1"})) && always.danger(&json!({})).is_none());
        let declared = tool("name: t\nexec: \"x\"\napproval: when_dangerous\ndangerous: true\n");
        assert!(declared.needs_approval(&json!({})));
        let never = tool("name: t\nexec: \"x ${a}\"\ndangerous_if: {a: \".\"}\n");
        assert!(
            !never.needs_approval(&json!({"a": "1"})) && never.danger(&json!({"a": "1"})).is_some()
        );
    }

    #[tokio::test]
    async fn execution_captures_output_and_exit_codes() {
        let dir = tempfile::tempdir().expect("tmp");
        let t = tool("name: t\nshell: 'cat; echo \"${x}\"; echo oops >&2; exit 3'\nstdin: body\n");
        let inv = argv(&t, json!({"x": "arg", "body": "from stdin\n"}));
        let ex = execute(
            &inv,
            &env(dir.path()),
            Duration::from_secs(10),
            1024,
            &CancellationToken::new(),
        )
        .await;
        assert_eq!(ex.exit, Exit::Code(3));
        assert_eq!(ex.stdout, "from stdin\narg\n");
        assert_eq!(ex.stderr, "oops\n");
        let obs = ex.observation(Duration::from_secs(10));
        assert!(
            obs.contains("[stderr]\noops") && obs.contains("[exit code 3]"),
            "{obs}"
        );
    }

    #[tokio::test]
    async fn a_hanging_tool_is_killed_at_its_timeout_with_its_children() {
        let dir = tempfile::tempdir().expect("tmp");
        let t = tool("name: t\nshell: 'sleep 30 & sleep 30; echo never'\n");
        let inv = argv(&t, json!({}));
        let ex = execute(
            &inv,
            &env(dir.path()),
            Duration::from_millis(300),
            1024,
            &CancellationToken::new(),
        )
        .await;
        assert_eq!(ex.exit, Exit::TimedOut);
        assert!(ex.duration < Duration::from_secs(10));
        assert!(!ex.stdout.contains("never"));
    }

    #[tokio::test]
    async fn output_is_capped_but_drained() {
        let dir = tempfile::tempdir().expect("tmp");
        let t = tool("name: t\nshell: 'head -c 200000 /dev/zero | tr \"\\\\0\" x'\n");
        let inv = argv(&t, json!({}));
        let ex = execute(
            &inv,
            &env(dir.path()),
            Duration::from_secs(10),
            100,
            &CancellationToken::new(),
        )
        .await;
        assert_eq!(ex.exit, Exit::Code(0));
        assert!(ex.stdout.starts_with(&"x".repeat(100)));
        assert!(
            ex.stdout.contains("100 of 200000 bytes kept"),
            "{}",
            &ex.stdout[..ex.stdout.len().min(300)]
        );
    }

    #[tokio::test]
    async fn a_missing_program_is_a_spawn_failure() {
        let dir = tempfile::tempdir().expect("tmp");
        let inv = Invocation {
            argv: vec!["/no/such/program".into()],
            stdin: None,
            env: vec![],
        };
        let ex = execute(
            &inv,
            &env(dir.path()),
            Duration::from_secs(1),
            100,
            &CancellationToken::new(),
        )
        .await;
        assert!(matches!(ex.exit, Exit::SpawnFailed(_)));
    }
}
