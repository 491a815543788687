//! Agents: a directory with `agent.yaml` (or the legacy `config.yaml`: Delta Engine's format,
//! docs/protocol.md §8), an optional `system_prompt.md`, for the scripted brain a `script.yaml`,
//! and Delta Engine v1.10's optional files: tool modules named by `imports:`, `hooks.yaml`
//! ([`crate::hooks`]) and `context.yaml` ([`crate::context`]).
//!
//! What Delta Engine accepts but this engine does not use is never dropped silently: it is
//! either refused or listed in [`Agent::warnings`] by name (the hosts print or log them).
//!
//! Loading checks everything it can up front (tool forms, parameter names, the script's tools and
//! options) so that a broken agent is refused with the file, the line and the field before a run
//! starts, instead of failing halfway through one.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::script::Script;
use crate::tools::{Tool, ToolError};

/// The built-in tool every agent has.
pub const ASK_HUMAN: &str = "ask_human";

/// An agent that could not be loaded. Every variant names the file; the message says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: cannot read it")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{dir}: no agent.yaml (or legacy config.yaml): not an agent directory; `delta init <name>` \
         creates one"
    )]
    NoConfig { dir: String },
    #[error("{path}{}: {field}: {message}", line.map(|l| format!(" line {l}")).unwrap_or_default())]
    Invalid {
        path: String,
        line: Option<usize>,
        /// The field's path inside the file, e.g. `tools[1].inject_as`, or `.` for the whole file.
        field: String,
        message: String,
    },
}

impl Error {
    pub(crate) fn invalid(
        path: &Path,
        text: &str,
        field: impl Into<String>,
        needle: Option<&str>,
        message: impl Into<String>,
    ) -> Self {
        Error::Invalid {
            path: path.display().to_string(),
            line: needle.and_then(|n| line_of(text, n)),
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Whether `name` may be `llm.api_key_env`: a key's or token's name, and none of the fleet's own
/// settings (`DELTA_API_KEY`, Delta Engine's name for the LLM key, excepted).
fn api_key_variable(name: &str) -> bool {
    let named_as_key = name.ends_with("_API_KEY") || name.ends_with("_TOKEN");
    let fleets_own = name.starts_with("DELTA_") && name != "DELTA_API_KEY";
    named_as_key && !fleets_own
}

/// The first line (1-based) of `text` that contains `needle`.
pub(crate) fn line_of(text: &str, needle: &str) -> Option<usize> {
    nth_line_of(text, needle, 0)
}

/// The line (1-based) of the `n`-th (from 0) line of `text` that contains `needle`.
pub(crate) fn nth_line_of(text: &str, needle: &str, n: usize) -> Option<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| l.contains(needle))
        .nth(n)
        .map(|(i, _)| i + 1)
}

/// Parses YAML into `T`, turning errors into [`Error::Invalid`] with the line and field path.
pub(crate) fn parse_yaml<T: DeserializeOwned>(path: &Path, text: &str) -> Result<T, Error> {
    let de = serde_yaml_ng::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let field = match e.path().to_string() {
            // No field reached (a YAML syntax error): the whole file.
            unknown if unknown == "?" => ".".to_owned(),
            path => path,
        };
        let inner = e.into_inner();
        let line = inner.location().map(|l| l.line());
        let mut message = inner.to_string();
        // serde_yaml appends " at line N column M" and puts the field first: both are reported
        // separately.
        if let Some(cut) = message.find(" at line ") {
            message.truncate(cut);
        }
        if let Some(rest) = message.strip_prefix(&format!("{field}: ")) {
            message = rest.to_owned();
        }
        Error::Invalid {
            path: path.display().to_string(),
            line,
            field,
            message,
        }
    })
}

/// Which brain decides the agent's steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BrainKind {
    Openai,
    Scripted,
}

/// `llm:` in `config.yaml`.
#[derive(Clone, Debug, Deserialize)]
pub struct LlmConfig {
    pub model: String,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub frequency_penalty: Option<f64>,
    #[serde(default)]
    pub presence_penalty: Option<f64>,
    /// Any OpenAI-compatible endpoint (when absent: `$DELTA_BASE_URL`, else
    /// `https://api.openai.com/v1`).
    #[serde(default)]
    pub base_url: Option<String>,
    /// The environment variable holding the API key (when absent: `DELTA_API_KEY` if set, else
    /// `OPENAI_API_KEY`).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Attempts on 429/5xx/connection errors before the run fails (default 5).
    #[serde(default)]
    pub max_retries: Option<u32>,
    /// Seconds one chat-completions call may take (default 120).
    #[serde(default)]
    pub timeout_s: Option<u64>,
}

/// `interaction_defaults:` in `config.yaml`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InteractionDefaults {
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
    #[serde(default)]
    pub default_option_id: Option<String>,
    /// Who may answer this agent's questions (responder ids, i.e. token names); empty: anyone
    /// with the `answer` role. An `ask_human` call may name its own list.
    #[serde(default)]
    pub allowed_responders: Vec<String>,
}

/// `agent.yaml` (or `config.yaml`), as written. Unknown top-level keys are accepted so that Delta
/// Engine agents load unchanged, and named in the agent's warnings ([`config_warnings`]).
#[derive(Clone, Debug, Deserialize)]
pub struct AgentConfig {
    pub name: String,
    #[serde(default)]
    pub version: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub llm: Option<LlmConfig>,
    #[serde(default)]
    pub brain: Option<BrainKind>,
    #[serde(default)]
    pub tools: Vec<crate::tools::ToolConfig>,
    /// Brain decisions allowed per run (Delta Engine's name; default 30).
    #[serde(default)]
    pub max_iterations: Option<u32>,
    #[serde(default)]
    pub interaction_defaults: InteractionDefaults,
    /// Ask a person to confirm every plan the brain makes (`USER_CONFIRMATION`).
    #[serde(default)]
    pub confirm_plan: bool,
    /// How long a plan confirmation waits (default: `interaction_defaults.timeout_seconds`).
    #[serde(default)]
    pub plan_timeout_seconds: Option<u64>,
    /// The option applied when a plan confirmation times out: `confirm`, `modify` or `cancel`.
    #[serde(default)]
    pub plan_default: Option<String>,
    /// How many times one plan is put to a person, revisions included (default 3).
    #[serde(default)]
    pub max_plan_rounds: Option<u32>,
    /// Delta Engine's tool modules: files (relative to the agent directory) whose `tools:` come
    /// before this file's own; a later definition of a name replaces an earlier one.
    #[serde(default)]
    pub imports: Vec<String>,
    /// Delta Engine's legacy hooks (`hooks.yaml` wins when both exist).
    #[serde(default)]
    pub lifecycle_hooks: Option<crate::hooks::Hooks>,
}

/// The top-level keys this engine reads.
const KNOWN_KEYS: &[&str] = &[
    "name",
    "version",
    "description",
    "llm",
    "brain",
    "tools",
    "max_iterations",
    "interaction_defaults",
    "confirm_plan",
    "plan_timeout_seconds",
    "plan_default",
    "max_plan_rounds",
    "imports",
    "lifecycle_hooks",
];

/// The keys of `llm:` this engine reads.
const KNOWN_LLM_KEYS: &[&str] = &[
    "model",
    "temperature",
    "max_tokens",
    "top_p",
    "frequency_penalty",
    "presence_penalty",
    "base_url",
    "api_key_env",
    "max_retries",
    "timeout_s",
];

/// The keys of the agent's config file that this engine does not read, each with what it means
/// for the user. `file` is the file's name as shown (`agent.yaml`).
pub fn config_warnings(file: &str, text: &str) -> Vec<String> {
    let Ok(serde_yaml_ng::Value::Mapping(map)) = serde_yaml_ng::from_str(text) else {
        return vec![];
    };
    let mut out = vec![];
    for key in map.keys().filter_map(serde_yaml_ng::Value::as_str) {
        if KNOWN_KEYS.contains(&key) {
            continue;
        }
        out.push(match key {
            "hooks" => format!(
                "{file}: `hooks` is not read from {file} (Delta Engine ignores it there too): \
                 move it to hooks.yaml to have the hooks run"
            ),
            "timeout_seconds" => format!(
                "{file}: `timeout_seconds` (a whole-run time limit) is not supported and is \
                 ignored; each tool has its own `timeout_s`"
            ),
            other => format!("{file}: unknown key `{other}` is ignored"),
        });
    }
    if let Some(serde_yaml_ng::Value::Mapping(llm)) = map.get("llm") {
        for key in llm.keys().filter_map(serde_yaml_ng::Value::as_str) {
            if !KNOWN_LLM_KEYS.contains(&key) {
                out.push(format!("{file}: unknown key `llm.{key}` is ignored"));
            }
        }
    }
    out
}

/// The agent's config file in `dir`: `agent.yaml` (Delta Engine v1.9+), else the legacy
/// `config.yaml`; `None` when there is neither. The hosts and the gateway use this one rule.
pub fn config_file(dir: &Path) -> Option<PathBuf> {
    ["agent.yaml", "config.yaml"]
        .iter()
        .map(|f| dir.join(f))
        .find(|p| p.is_file())
}

/// The options of a plan confirmation, by id.
pub const PLAN_OPTIONS: [&str; 3] = ["confirm", "modify", "cancel"];

pub const DEFAULT_MAX_PLAN_ROUNDS: u32 = 3;

/// A loaded, checked agent.
#[derive(Clone, Debug)]
pub struct Agent {
    pub dir: PathBuf,
    pub config: AgentConfig,
    pub brain: BrainKind,
    pub system_prompt: String,
    pub tools: BTreeMap<String, Tool>,
    /// `script.yaml`, for the scripted brain.
    pub script: Option<Script>,
    /// `policy.yaml`: rules that deny, allow or require approval of tool calls (none without it).
    pub policy: crate::policy::Policy,
    /// The config file read (`agent.yaml` or `config.yaml`).
    pub config_path: PathBuf,
    /// `hooks.yaml`, else `lifecycle_hooks:` (empty: none).
    pub hooks: crate::hooks::Hooks,
    /// `context.yaml`, if any (used by the openai brain).
    pub context: Option<crate::context::Manifest>,
    /// What was accepted but is not used, or is deprecated, each naming the key or file.
    pub warnings: Vec<String>,
}

impl Agent {
    /// Whether a run of this agent may use its work directory: it runs processes (a tool that
    /// is not `builtin:`, a lifecycle hook), or its brain reads or writes files there (any brain
    /// but the scripted one: the openai brain's `context.yaml`). A scripted agent of `builtin:`
    /// tools alone never touches it, so the fleet's workers make none for its runs.
    pub fn needs_work_dir(&self) -> bool {
        self.brain != BrainKind::Scripted
            || !self.hooks.is_empty()
            || self.tools.values().any(crate::tools::Tool::runs_process)
    }
}

pub const DEFAULT_MAX_ITERATIONS: u32 = 30;

/// `config.yaml` parsed and checked: the config, the brain it picks and its tools.
#[derive(Clone, Debug)]
pub struct CheckedConfig {
    pub config: AgentConfig,
    pub brain: BrainKind,
    pub tools: BTreeMap<String, Tool>,
}

impl CheckedConfig {
    /// Parses and checks the text of `config.yaml` (`config_path` names it in errors) of the
    /// agent in `dir`. Pure: no file is read, so fuzzers and property tests run exactly what
    /// [`Agent::load`] runs.
    pub fn parse(config_path: &Path, text: &str, dir: &Path) -> Result<CheckedConfig, Error> {
        let config: AgentConfig = parse_yaml(config_path, text)?;
        Self::check(config_path, text, config, vec![], dir)
    }

    /// Checks a parsed config whose `imports:` gave `imported` tools (in order; a later one of
    /// a name, or the config's own, replaces an earlier one).
    pub(crate) fn check(
        config_path: &Path,
        text: &str,
        config: AgentConfig,
        imported: Vec<ImportedTool>,
        dir: &Path,
    ) -> Result<CheckedConfig, Error> {
        if config.name.trim().is_empty() {
            return Err(Error::invalid(
                config_path,
                text,
                "name",
                Some("name:"),
                "must not be empty",
            ));
        }
        let brain = match (config.brain, &config.llm) {
            (Some(b), _) => b,
            (None, Some(_)) => BrainKind::Openai,
            (None, None) => {
                return Err(Error::invalid(
                    config_path,
                    text,
                    "brain",
                    None,
                    "no brain: set `brain: scripted` (with a script.yaml) or an `llm:` section",
                ));
            }
        };
        if brain == BrainKind::Openai && config.llm.is_none() {
            return Err(Error::invalid(
                config_path,
                text,
                "llm",
                Some("brain:"),
                "`brain: openai` needs an `llm:` section with at least `model`",
            ));
        }
        if let Some(name) = config.llm.as_ref().and_then(|l| l.api_key_env.as_deref())
            && !api_key_variable(name)
        {
            return Err(Error::invalid(
                config_path,
                text,
                "llm.api_key_env",
                Some("api_key_env:"),
                format!(
                    "`{name}` cannot hold the LLM's key: name a variable ending in _API_KEY or \
                     _TOKEN (not one of the fleet's own DELTA_* settings), so that no other secret \
                     of the host is ever sent to the LLM endpoint"
                ),
            ));
        }
        if let Some(d) = &config.plan_default
            && !PLAN_OPTIONS.contains(&d.as_str())
        {
            return Err(Error::invalid(
                config_path,
                text,
                "plan_default",
                Some("plan_default:"),
                format!("`{d}` is not a plan option: use confirm, modify or cancel"),
            ));
        }
        if config.max_plan_rounds == Some(0) {
            return Err(Error::invalid(
                config_path,
                text,
                "max_plan_rounds",
                Some("max_plan_rounds:"),
                "must be at least 1 (the first confirmation is a round)",
            ));
        }
        let mut tools = BTreeMap::new();
        for it in imported {
            let field = format!("tools[{}]", it.index);
            let needle = format!("name: {}", it.config.name);
            if it.config.name == ASK_HUMAN {
                return Err(Error::invalid(
                    &it.path,
                    &it.text,
                    field,
                    Some(&needle),
                    "`ask_human` is built in: remove this tool or rename it",
                ));
            }
            let tool = Tool::from_config(&it.config, dir).map_err(|e: ToolError| {
                Error::invalid(&it.path, &it.text, field, Some(&needle), e.to_string())
            })?;
            tools.insert(tool.name.clone(), tool);
        }
        let mut seen = HashSet::new();
        for (i, tc) in config.tools.iter().enumerate() {
            let field = format!("tools[{i}]");
            let needle = format!("name: {}", tc.name);
            if tc.name == ASK_HUMAN {
                return Err(Error::invalid(
                    config_path,
                    text,
                    field,
                    Some(&needle),
                    "`ask_human` is built in: remove this tool or rename it",
                ));
            }
            if !seen.insert(tc.name.clone()) {
                let earlier = config.tools[..i]
                    .iter()
                    .filter(|t| t.name == tc.name)
                    .count();
                return Err(Error::Invalid {
                    path: config_path.display().to_string(),
                    line: nth_line_of(text, &needle, earlier),
                    field,
                    message: format!(
                        "a second tool named `{}`: tool names must be unique",
                        tc.name
                    ),
                });
            }
            let tool = Tool::from_config(tc, dir).map_err(|e: ToolError| {
                Error::invalid(config_path, text, field, Some(&needle), e.to_string())
            })?;
            tools.insert(tool.name.clone(), tool);
        }
        Ok(CheckedConfig {
            config,
            brain,
            tools,
        })
    }
}

impl Agent {
    /// Loads and checks the agent in `dir`.
    pub fn load(dir: &Path) -> Result<Agent, Error> {
        let Some(config_path) = config_file(dir) else {
            return Err(Error::NoConfig {
                dir: dir.display().to_string(),
            });
        };
        let file = config_path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let text = read(&config_path)?;
        let mut warnings = config_warnings(&file, &text);
        if file == "agent.yaml" && dir.join("config.yaml").is_file() {
            warnings.push(
                "both agent.yaml and config.yaml exist: agent.yaml is used; remove config.yaml"
                    .into(),
            );
        }
        let config: AgentConfig = parse_yaml(&config_path, &text)?;
        let imported = resolve_imports(dir, &config_path, &text, &config.imports, &mut warnings)?;
        for own in &config.tools {
            if let Some(it) = imported.iter().rev().find(|it| it.config.name == own.name) {
                warnings.push(format!(
                    "tool `{}` of {} is replaced by the one in {file} (the last definition wins)",
                    own.name,
                    it.path.display()
                ));
            }
        }
        let CheckedConfig {
            config,
            brain,
            tools,
        } = CheckedConfig::check(&config_path, &text, config, imported, dir)?;
        let hooks = load_hooks(dir, &config_path, &text, &config, &mut warnings)?;
        let context = load_context(dir)?;
        if let Some(m) = &context
            && !m
                .sources
                .iter()
                .any(|s| matches!(s, crate::context::Source::Journal { .. }))
        {
            warnings.push(
                "context.yaml has no `type: journal` source: the LLM sees neither the task nor \
                 any result (as in Delta Engine 1.10); add `- type: journal`"
                    .into(),
            );
        }
        if context.is_some() && brain == BrainKind::Scripted {
            warnings.push(
                "context.yaml is ignored: only the openai brain composes an LLM context \
                 (this agent is `brain: scripted`)"
                    .into(),
            );
        }
        if !hooks.is_empty() && brain == BrainKind::Scripted {
            for kind in [
                crate::hooks::HookKind::PreLlmReq,
                crate::hooks::HookKind::PostLlmResp,
            ] {
                if hooks.get(kind).is_some() {
                    warnings.push(format!(
                        "hook {} never runs: this agent is `brain: scripted` and makes no LLM \
                         request",
                        kind.name()
                    ));
                }
            }
        }
        let system_prompt = ["system_prompt.md", "system_prompt.txt"]
            .iter()
            .map(|f| dir.join(f))
            .find(|p| p.exists())
            .map(|p| read(&p))
            .transpose()?
            .unwrap_or_default();
        let script = if brain == BrainKind::Scripted {
            let path = dir.join("script.yaml");
            Some(Script::load(&path, &tools)?)
        } else {
            None
        };
        let policy = crate::policy::Policy::load(dir, &tools)?;
        let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
        Ok(Agent {
            policy,
            config_path,
            hooks,
            context,
            warnings,
            dir,
            config,
            brain,
            system_prompt,
            tools,
            script,
        })
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn max_iterations(&self) -> u32 {
        self.config.max_iterations.unwrap_or(DEFAULT_MAX_ITERATIONS)
    }

    pub fn max_plan_rounds(&self) -> u32 {
        self.config
            .max_plan_rounds
            .unwrap_or(DEFAULT_MAX_PLAN_ROUNDS)
            .max(1)
    }
}

/// A tool declared in a file named by `imports:`.
#[derive(Clone, Debug)]
pub(crate) struct ImportedTool {
    path: PathBuf,
    text: std::sync::Arc<String>,
    /// Its index in that file's `tools:`.
    index: usize,
    config: crate::tools::ToolConfig,
}

/// A file named by `imports:`: only `imports` and `tools` are read (as in Delta Engine).
#[derive(Deserialize)]
struct Module {
    #[serde(default)]
    imports: Vec<String>,
    #[serde(default)]
    tools: Vec<crate::tools::ToolConfig>,
}

/// The tools of `imports` (of the file `from`), depth first, in order. Paths are relative to
/// the agent directory, without `..`, and stay inside it; a file that imports itself, directly
/// or not, is refused naming the chain.
fn resolve_imports(
    dir: &Path,
    from: &Path,
    from_text: &str,
    imports: &[String],
    warnings: &mut Vec<String>,
) -> Result<Vec<ImportedTool>, Error> {
    let root = dir.canonicalize().map_err(|source| Error::Read {
        path: dir.display().to_string(),
        source,
    })?;
    let mut stack = vec![from.canonicalize().unwrap_or_else(|_| from.to_path_buf())];
    let mut out = vec![];
    walk_imports(
        &root, from, from_text, imports, &mut stack, &mut out, warnings,
    )?;
    // Which names a later definition replaces (the agent's own file last).
    let mut by_name: BTreeMap<&str, &Path> = BTreeMap::new();
    for it in &out {
        if let Some(earlier) = by_name.insert(&it.config.name, &it.path) {
            warnings.push(format!(
                "tool `{}` of {} is replaced by the one in {} (the last definition wins)",
                it.config.name,
                earlier.display(),
                it.path.display()
            ));
        }
    }
    Ok(out)
}

fn walk_imports(
    root: &Path,
    from: &Path,
    from_text: &str,
    imports: &[String],
    stack: &mut Vec<PathBuf>,
    out: &mut Vec<ImportedTool>,
    warnings: &mut Vec<String>,
) -> Result<(), Error> {
    for (i, rel) in imports.iter().enumerate() {
        let field = format!("imports[{i}]");
        let bad =
            |message: String| Error::invalid(from, from_text, field.clone(), Some(rel), message);
        let p = Path::new(rel);
        if p.is_absolute()
            || p.components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            return Err(bad(format!(
                "`{rel}`: an import is a path relative to the agent directory, without `..`"
            )));
        }
        let path = root.join(p);
        let real = path
            .canonicalize()
            .map_err(|e| bad(format!("`{rel}`: cannot read {} ({e})", path.display())))?;
        if !real.starts_with(root) {
            return Err(bad(format!(
                "`{rel}` leads outside the agent directory (to {})",
                real.display()
            )));
        }
        if let Some(at) = stack.iter().position(|s| *s == real) {
            let chain: Vec<String> = stack[at..]
                .iter()
                .chain(std::iter::once(&real))
                .map(|s| s.strip_prefix(root).unwrap_or(s).display().to_string())
                .collect();
            return Err(bad(format!("circular import: {}", chain.join(" -> "))));
        }
        let text = std::sync::Arc::new(read(&path)?);
        let module: Module = parse_yaml(&path, &text)?;
        if let Ok(serde_yaml_ng::Value::Mapping(map)) = serde_yaml_ng::from_str(&text) {
            let other: Vec<&str> = map
                .keys()
                .filter_map(serde_yaml_ng::Value::as_str)
                .filter(|k| *k != "imports" && *k != "tools")
                .collect();
            if !other.is_empty() {
                warnings.push(format!(
                    "{rel}: only `imports` and `tools` are read from an imported file; ignored: {}",
                    other.join(", ")
                ));
            }
        }
        stack.push(real);
        walk_imports(root, &path, &text, &module.imports, stack, out, warnings)?;
        stack.pop();
        for (index, config) in module.tools.into_iter().enumerate() {
            out.push(ImportedTool {
                path: path.clone(),
                text: text.clone(),
                index,
                config,
            });
        }
    }
    Ok(())
}

/// `hooks.yaml`, else the config's `lifecycle_hooks:`.
fn load_hooks(
    dir: &Path,
    config_path: &Path,
    config_text: &str,
    config: &AgentConfig,
    warnings: &mut Vec<String>,
) -> Result<crate::hooks::Hooks, Error> {
    let file = config_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let path = dir.join("hooks.yaml");
    let (hooks, path, text) = if path.is_file() {
        let text = read(&path)?;
        let hooks: crate::hooks::Hooks = if text.trim().is_empty() {
            crate::hooks::Hooks::default()
        } else {
            parse_yaml(&path, &text)?
        };
        if config.lifecycle_hooks.is_some() {
            warnings.push(format!(
                "{file}: `lifecycle_hooks` is ignored because hooks.yaml exists (hooks.yaml wins)"
            ));
        }
        (hooks, path, text)
    } else if let Some(h) = &config.lifecycle_hooks {
        warnings.push(format!(
            "{file}: `lifecycle_hooks` is deprecated (Delta Engine 1.9+): move it to hooks.yaml"
        ));
        (h.clone(), config_path.to_path_buf(), config_text.to_owned())
    } else {
        return Ok(crate::hooks::Hooks::default());
    };
    hooks.check().map_err(|(field, message)| {
        let needle = field.split('.').next().unwrap_or_default().to_owned();
        Error::invalid(&path, &text, field, Some(&needle), message)
    })?;
    Ok(hooks)
}

/// `context.yaml`, if the agent has one.
fn load_context(dir: &Path) -> Result<Option<crate::context::Manifest>, Error> {
    let path = dir.join("context.yaml");
    if !path.is_file() {
        return Ok(None);
    }
    let text = read(&path)?;
    let manifest: crate::context::Manifest = parse_yaml(&path, &text)?;
    manifest
        .check()
        .map_err(|(field, message)| Error::invalid(&path, &text, field, None, message))?;
    Ok(Some(manifest))
}

fn read(path: &Path) -> Result<String, Error> {
    std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn api_key_env_names_only_a_key_or_token() {
        for ok in [
            "OPENAI_API_KEY",
            "GROQ_API_KEY",
            "HF_TOKEN",
            "DELTA_API_KEY",
        ] {
            assert!(super::api_key_variable(ok), "{ok}");
        }
        for bad in [
            "DELTA_SECRETS_KEY",
            "DELTA_TOKEN",
            "HOME",
            "AWS_SECRET_ACCESS_KEY",
            "",
        ] {
            assert!(!super::api_key_variable(bad), "{bad}");
        }
    }

    use super::*;

    fn agent_dir(config: &str, script: Option<&str>) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("config.yaml"), config).expect("write");
        if let Some(s) = script {
            std::fs::write(dir.path().join("script.yaml"), s).expect("write");
        }
        dir
    }

    #[test]
    fn a_missing_config_names_both_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = Agent::load(dir.path()).unwrap_err();
        assert!(matches!(err, Error::NoConfig { .. }));
        assert!(
            err.to_string()
                .contains("agent.yaml (or legacy config.yaml)")
        );
    }

    #[test]
    fn a_bad_field_names_the_line_and_the_field() {
        let dir = agent_dir(
            "name: a\nbrain: scripted\ntools:\n  - name: t\n    command: [echo]\n    parameters:\n      - name: x\n        inject_as: sideways\n",
            Some("steps: []\n"),
        );
        let err = Agent::load(dir.path()).unwrap_err();
        match err {
            Error::Invalid {
                line, field, path, ..
            } => {
                assert!(path.ends_with("config.yaml"));
                assert_eq!(line, Some(8));
                assert_eq!(field, "tools[0].parameters[0].inject_as");
            }
            other => panic!("{other}"),
        }
    }

    #[test]
    fn a_bad_field_is_named_once() {
        // Found by the config properties: the field came twice, as serde_yaml names it too
        // (`tools[0].timeout_s: tools[0].timeout_s: invalid type…`).
        let dir = agent_dir(
            "name: a\nbrain: scripted\ntools:\n  - name: t\n    exec: echo\n    timeout_s: soon\n",
            Some("steps: []\n"),
        );
        let err = Agent::load(dir.path()).unwrap_err().to_string();
        assert!(
            err.ends_with(
                "config.yaml line 6: tools[0].timeout_s: invalid type: string \"soon\", expected u64"
            ),
            "{err}"
        );
    }

    #[test]
    fn malformed_yaml_is_reported_with_its_line() {
        let dir = agent_dir("name: a\nbrain: [scripted\n", None);
        let err = Agent::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("config.yaml line"), "{err}");
        let dir = agent_dir("name: a\nbrain: scripted\nsteps\n", None);
        let err = Agent::load(dir.path()).unwrap_err().to_string();
        assert!(err.ends_with(": .: could not find expected ':'"), "{err}");
    }

    #[test]
    fn a_brain_is_required_and_duplicates_are_refused() {
        let dir = agent_dir("name: a\n", None);
        assert!(
            Agent::load(dir.path())
                .unwrap_err()
                .to_string()
                .contains("brain")
        );
        let dir = agent_dir(
            "name: a\nbrain: scripted\ntools:\n  - name: t\n    exec: \"echo\"\n  - name: t\n    exec: \"echo\"\n",
            Some("steps: []\n"),
        );
        let err = Agent::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("line 6") && err.contains("unique"), "{err}");
    }

    #[test]
    fn plan_settings_are_checked() {
        let dir = agent_dir(
            "name: a\nbrain: scripted\nconfirm_plan: true\nplan_default: maybe\n",
            Some("steps: []\n"),
        );
        let err = Agent::load(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("line 4")
                && err.contains("plan_default")
                && err.contains("confirm, modify or cancel"),
            "{err}"
        );
        let dir = agent_dir(
            "name: a\nbrain: scripted\nmax_plan_rounds: 0\n",
            Some("steps: []\n"),
        );
        assert!(
            Agent::load(dir.path())
                .unwrap_err()
                .to_string()
                .contains("at least 1")
        );
        let dir = agent_dir(
            "name: a\nbrain: scripted\nconfirm_plan: true\nplan_default: cancel\n",
            Some("steps: []\n"),
        );
        let agent = Agent::load(dir.path()).expect("loads");
        assert_eq!(agent.max_plan_rounds(), DEFAULT_MAX_PLAN_ROUNDS);
    }

    #[test]
    fn delta_engine_configs_load_unchanged() {
        let dir = agent_dir(
            "name: my-agent\nversion: 1.0.0\ndescription: d\nllm:\n  model: gpt-4\n  temperature: 0.7\n\
             tools:\n  - name: list_files\n    command: [ls, -la]\n    parameters: []\n\
             \x20 - name: write_file\n    exec: \"tee ${filename}\"\n    stdin: content\n\
             \x20 - name: grep_pattern\n    command: [grep]\n    parameters:\n      - name: pattern\n        type: string\n        inject_as: option\n        option_flag: -e\n\
             lifecycle_hooks:\n  pre_llm_req:\n    command: [./x]\n",
            None,
        );
        let agent = Agent::load(dir.path()).expect("loads");
        assert_eq!(agent.brain, BrainKind::Openai);
        assert_eq!(agent.tools.len(), 3);
        assert_eq!(agent.max_iterations(), DEFAULT_MAX_ITERATIONS);
    }
}
