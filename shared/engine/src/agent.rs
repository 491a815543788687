//! Agents: a directory with `config.yaml` (Delta Engine's format, docs/protocol.md §8), an optional
//! `system_prompt.md`, and for the scripted brain a `script.yaml`.
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
    /// Any OpenAI-compatible endpoint (`https://api.openai.com/v1` when absent).
    #[serde(default)]
    pub base_url: Option<String>,
    /// The environment variable holding the API key (`OPENAI_API_KEY` when absent).
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

/// `config.yaml`, as written. Unknown top-level keys (Delta Engine's `lifecycle_hooks`, …) are
/// accepted and ignored so that Delta Engine agents load unchanged.
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
        let config_path = dir.join("config.yaml");
        let text = read(&config_path)?;
        let CheckedConfig {
            config,
            brain,
            tools,
        } = CheckedConfig::parse(&config_path, &text, dir)?;
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
    fn a_missing_config_names_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = Agent::load(dir.path()).unwrap_err();
        assert!(matches!(err, Error::Read { ref path, .. } if path.ends_with("config.yaml")));
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
