//! The `openai` brain: any OpenAI-compatible chat-completions endpoint with tool calling.
//!
//! The conversation is rebuilt from the journal on every decision (system prompt, task, then each
//! `THOUGHT` as an assistant message with its tool calls and each `ACTION_RESULT` as the matching
//! tool message), so the brain holds nothing between calls and a run resumes anywhere. Sensitive
//! answers are `"***"` in the journal and therefore never reach the model. 429, 5xx and connection
//! failures are retried with exponential backoff (honouring `Retry-After`); other errors fail the
//! decision at once with the endpoint's message.
//!
//! With `confirm_plan`, the model also gets a `plan` tool: calling it lays out a plan (journaled
//! as `PLAN` and put to a person). The person's answer comes back as a user message: confirmed,
//! or what to change (their feedback, or their own task list), after which the model plans again.

use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

use serde_json::{Value, json};

use super::{Brain, Decision, Error, ProposedCall, View, parse_tasks};
use crate::agent::{ASK_HUMAN, Agent, LlmConfig};
use crate::tools::ParamType;
use delta_protocol::{ActionStatus, Event, OptionAction, PlanTask, RequestId};

pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
pub const DEFAULT_KEY_ENV: &str = "OPENAI_API_KEY";
/// Delta Engine's variables: its API key, and its endpoint (both used when the agent's `llm:`
/// does not name its own).
pub const DELTA_KEY_ENV: &str = "DELTA_API_KEY";
pub const DELTA_BASE_URL_ENV: &str = "DELTA_BASE_URL";
const DEFAULT_RETRIES: u32 = 5;
/// The most a model's response may be: read past this, it is refused (a broken or hostile
/// endpoint streaming without end would take the worker's memory, and every run on it).
pub const MAX_RESPONSE_BYTES: usize = 8 << 20;
/// The most of an error response read for its message.
const MAX_ERROR_BYTES: usize = 64 << 10;
/// The most tool calls one response makes; the rest are dropped (each call may run a tool for
/// its whole timeout, and `max_iterations` counts responses).
pub const MAX_CALLS_PER_RESPONSE: usize = 32;

/// Why a body was not read whole.
enum Unread {
    TooLarge,
    Failed(String),
}

/// The body of `resp`, read up to `max` bytes.
async fn read_capped(mut resp: reqwest::Response, max: usize) -> Result<Vec<u8>, Unread> {
    if resp
        .content_length()
        .is_some_and(|n| n > u64::try_from(max).unwrap_or(u64::MAX))
    {
        return Err(Unread::TooLarge);
    }
    let mut out = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(c)) => {
                if out.len() + c.len() > max {
                    return Err(Unread::TooLarge);
                }
                out.extend_from_slice(&c);
            }
            Ok(None) => return Ok(out),
            Err(e) => return Err(Unread::Failed(e.without_url().to_string())),
        }
    }
}

/// The brain of agents with an `llm:` section.
pub struct OpenAiBrain {
    /// One connection pool for every call of this agent.
    http: reqwest::Client,
    llm: LlmConfig,
    /// `{base_url}/chat/completions`.
    url: String,
    /// Bearer key, when the endpoint needs one.
    key: Option<String>,
    /// The `tools` array sent with every request (built once).
    tool_specs: Value,
    /// Whether the model is offered the `plan` tool (`confirm_plan`, and no agent tool of
    /// that name).
    plans: bool,
    /// Base delay of the exponential backoff (tests shorten it).
    backoff: Duration,
}

/// Where the requests go and with which key: the one place that pairs an endpoint with a key.
///
/// - The agent's own `llm.base_url` gets the key named by `llm.api_key_env`, else
///   `OPENAI_API_KEY` (this engine's rule before Delta Engine's variables); never
///   `DELTA_API_KEY`, which is Delta Engine's key for Delta Engine's endpoint.
/// - Otherwise `DELTA_BASE_URL` (else OpenAI's endpoint) gets `llm.api_key_env`, else
///   `DELTA_API_KEY`, else `OPENAI_API_KEY`.
/// - A key is never sent over plain `http://` to a host other than the loopback: refused.
pub struct Endpoint {
    /// The base URL (`…/v1`).
    pub base: String,
    /// Where the base URL came from: `llm.base_url`, `DELTA_BASE_URL` or `default`.
    pub base_from: &'static str,
    /// The variable the key is read from, when one is read.
    pub key_env: Option<String>,
    /// The bearer key.
    pub key: Option<String>,
    /// Keys that are set but deliberately not sent, named (values never).
    pub warnings: Vec<String>,
}

impl Endpoint {
    pub fn resolve(llm: &LlmConfig, env: &dyn Fn(&str) -> Option<String>) -> Result<Self, Error> {
        let set = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let mut warnings = vec![];
        let env_base = set(DELTA_BASE_URL_ENV);
        let (base, base_from) = match (&llm.base_url, &env_base) {
            (Some(own), _) => (own.clone(), "llm.base_url"),
            (None, Some(b)) => (b.clone(), DELTA_BASE_URL_ENV),
            (None, None) => (DEFAULT_BASE_URL.to_owned(), "default"),
        };
        let key_env = match (&llm.api_key_env, &llm.base_url) {
            (Some(own), _) => own.clone(),
            (None, Some(_)) => {
                if set(DELTA_KEY_ENV).is_some() {
                    warnings.push(format!(
                        "{DELTA_KEY_ENV} is not sent to the agent's own llm.base_url ({}): \
                         name the key's variable in `llm.api_key_env` to send one",
                        shown(&base)
                    ));
                }
                DEFAULT_KEY_ENV.to_owned()
            }
            (None, None) if set(DELTA_KEY_ENV).is_some() => DELTA_KEY_ENV.to_owned(),
            (None, None) => DEFAULT_KEY_ENV.to_owned(),
        };
        let key = set(&key_env);
        if key.is_none() && base_from == "default" {
            return Err(Error::Config(format!(
                "{key_env} is not set: export your API key (DELTA_API_KEY or OPENAI_API_KEY), or \
                 set `llm.base_url` (or DELTA_BASE_URL) to an endpoint that needs none (and \
                 `llm.api_key_env` to name another variable)"
            )));
        }
        if key.is_some() && plain_http_off_loopback(&base) {
            return Err(Error::Config(format!(
                "{} (from {base_from}) is plain http:// to a host that is not this machine: \
                 the key in {key_env} is not sent over it. Use https://, or a loopback address \
                 (an SSH tunnel), or unset {key_env} for an endpoint that needs no key",
                shown(&base)
            )));
        }
        Ok(Endpoint {
            base,
            base_from,
            key_env: key.is_some().then_some(key_env),
            key,
            warnings,
        })
    }
}

/// `http://` to anything but `localhost`, `127.0.0.0/8` or `::1`.
/// `url` as logs, errors and the journal may show it: its scheme, host, port and path, never a
/// user, password or query (an endpoint's key is sometimes in one).
pub fn shown(url: &str) -> String {
    match reqwest::Url::parse(url.trim()) {
        Ok(u) => {
            let port = u.port().map(|p| format!(":{p}")).unwrap_or_default();
            let path = u.path().trim_end_matches('/');
            format!(
                "{}://{}{port}{path}",
                u.scheme(),
                u.host_str().unwrap_or_default()
            )
        }
        Err(_) => "(an endpoint URL that does not parse)".to_owned(),
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("base", &shown(&self.base))
            .field("base_from", &self.base_from)
            .field("key_env", &self.key_env)
            .field("key", &self.key.as_ref().map(|_| "…"))
            .finish_non_exhaustive()
    }
}

fn plain_http_off_loopback(base: &str) -> bool {
    let Ok(url) = reqwest::Url::parse(base) else {
        return false;
    };
    if url.scheme() != "http" {
        return false;
    }
    let host = url.host_str().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.eq_ignore_ascii_case("localhost") {
        return false;
    }
    host.parse::<std::net::IpAddr>()
        .map_or(true, |ip| !ip.is_loopback())
}

fn install_crypto() {
    // reqwest is built without a default TLS provider: install ring once per process.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

impl OpenAiBrain {
    pub fn new(agent: &Agent) -> Result<Self, Error> {
        Self::with_env(agent, &|name| std::env::var(name).ok())
    }

    /// As [`OpenAiBrain::new`], reading the key and `DELTA_BASE_URL` through `env`.
    pub fn with_env(agent: &Agent, env: &dyn Fn(&str) -> Option<String>) -> Result<Self, Error> {
        let llm = agent
            .config
            .llm
            .clone()
            .ok_or_else(|| Error::Config("the openai brain needs an `llm:` section".into()))?;
        let endpoint = Endpoint::resolve(&llm, env)?;
        for w in &endpoint.warnings {
            tracing::warn!("{w}");
        }
        let (base, key) = (endpoint.base, endpoint.key);
        install_crypto();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(llm.timeout_s.unwrap_or(120)))
            .build()
            .map_err(|e| Error::Config(format!("HTTP client: {e}")))?;
        Ok(Self {
            http,
            url: format!("{}/chat/completions", base.trim_end_matches('/')),
            key,
            tool_specs: tool_specs(agent),
            plans: offers_plan_tool(agent),
            llm,
            backoff: Duration::from_millis(500),
        })
    }

    /// Shortens the retry backoff (for tests against a local endpoint).
    pub fn with_backoff(mut self, base: Duration) -> Self {
        self.backoff = base;
        self
    }

    async fn body(&self, view: &View<'_>) -> Result<Value, Error> {
        let messages = match &view.agent.context {
            None => messages(view),
            Some(manifest) => {
                let place = crate::context::Place {
                    agent_home: &view.agent.dir,
                    work_dir: view.work_dir,
                    run_id: view.run_id.to_string(),
                };
                if manifest.has_generators() {
                    write_journal_file(view).await?;
                }
                let blocks = crate::context::compose(manifest, &place, view.cancel)
                    .await
                    .map_err(|e| Error::Config(e.to_string()))?;
                composed(view, &blocks)
            }
        };
        let mut body = json!({
            "model": self.llm.model,
            "messages": messages,
            "tools": self.tool_specs,
        });
        if let Some(t) = self.llm.temperature {
            body["temperature"] = json!(t);
        }
        if let Some(m) = self.llm.max_tokens {
            body["max_tokens"] = json!(m);
        }
        if let Some(p) = self.llm.top_p {
            body["top_p"] = json!(p);
        }
        if let Some(p) = self.llm.frequency_penalty {
            body["frequency_penalty"] = json!(p);
        }
        if let Some(p) = self.llm.presence_penalty {
            body["presence_penalty"] = json!(p);
        }
        Ok(body)
    }

    async fn call(&self, body: &Value) -> Result<Value, Error> {
        let attempts = self.llm.max_retries.unwrap_or(DEFAULT_RETRIES).max(1);
        let mut last = String::new();
        for attempt in 0..attempts {
            let mut req = self.http.post(&self.url).json(body);
            if let Some(k) = &self.key {
                req = req.bearer_auth(k);
            }
            let wait = match req.send().await {
                Ok(resp) if resp.status().is_success() => {
                    let body = read_capped(resp, MAX_RESPONSE_BYTES).await.map_err(|e| {
                        Error::BadResponse(match e {
                            Unread::Failed(why) => format!("cut off: {why}"),
                            Unread::TooLarge => format!("larger than {MAX_RESPONSE_BYTES} bytes"),
                        })
                    })?;
                    return serde_json::from_slice::<Value>(&body)
                        .map_err(|e| Error::BadResponse(format!("not JSON: {e}")));
                }
                Ok(resp) => {
                    let status = resp.status();
                    let retry_after = resp
                        .headers()
                        .get(reqwest::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.trim().parse::<u64>().ok())
                        .map(Duration::from_secs);
                    let body = read_capped(resp, MAX_ERROR_BYTES).await.unwrap_or_default();
                    let text = String::from_utf8_lossy(&body);
                    let message = serde_json::from_str::<Value>(&text)
                        .ok()
                        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
                        .unwrap_or_else(|| text.to_string());
                    // It becomes the run's error, journaled: short, and never the key (some
                    // proxies echo part of the request back).
                    // The key first, then the cut: a key across the cut would leave its start.
                    let mut message = message;
                    if let Some(k) = self.key.as_deref().filter(|k| k.len() >= 8) {
                        message = message.replace(k, "***");
                    }
                    let message: String = message.chars().take(300).collect();
                    last = format!("HTTP {status}: {message}");
                    if !(status.as_u16() == 429 || status.is_server_error()) {
                        return Err(Error::Llm(last));
                    }
                    retry_after
                }
                Err(e) => {
                    // Neither the URL nor reqwest's copy of it: a key may be in its query.
                    last = format!("{}: {}", shown(&self.url), e.without_url());
                    None
                }
            };
            if attempt + 1 < attempts {
                let backoff = self.backoff * 2u32.saturating_pow(attempt).min(16);
                let delay = wait.unwrap_or(backoff).min(Duration::from_secs(60));
                tracing::warn!(attempt = attempt + 1, error = %last, ?delay, "LLM call failed; retrying");
                tokio::time::sleep(delay).await;
            }
        }
        Err(Error::Llm(format!("{last} (after {attempts} attempts)")))
    }
}

impl Brain for OpenAiBrain {
    async fn decide(&self, view: View<'_>) -> Result<Decision, Error> {
        let body = self.body(&view).await?;
        let resp = self.call(&body).await?;
        parse_choice(&resp, self.plans)
    }

    async fn request(&self, view: View<'_>) -> Result<Option<Value>, Error> {
        self.body(&view).await.map(Some)
    }

    async fn decide_request(
        &self,
        _view: View<'_>,
        request: Value,
    ) -> Result<(Decision, Option<Value>), Error> {
        let resp = self.call(&request).await?;
        let decision = parse_choice(&resp, self.plans)?;
        Ok((decision, Some(resp)))
    }
}

/// The name of the tool an LLM lays out a plan with.
pub const PLAN_TOOL: &str = "plan";

fn offers_plan_tool(agent: &Agent) -> bool {
    agent.config.confirm_plan && !agent.tools.contains_key(PLAN_TOOL)
}

/// Turns a chat-completions answer into a decision. With `plans`, a call of the `plan` tool
/// with a usable task list is a plan (other calls in the same answer are dropped: the plan is
/// confirmed before anything runs).
pub fn parse_choice(resp: &Value, plans: bool) -> Result<Decision, Error> {
    let msg = &resp["choices"][0]["message"];
    if msg.is_null() {
        return Err(Error::BadResponse(format!(
            "no choices[0].message in {}",
            truncate(&resp.to_string(), 300)
        )));
    }
    let content = msg["content"].as_str().unwrap_or_default().to_owned();
    let all = msg["tool_calls"]
        .as_array()
        .map(|a| a.as_slice())
        .unwrap_or_default();
    if all.len() > MAX_CALLS_PER_RESPONSE {
        tracing::warn!(
            calls = all.len(),
            kept = MAX_CALLS_PER_RESPONSE,
            "a model's response made more tool calls than one response may; the rest are dropped"
        );
    }
    let calls: Vec<ProposedCall> = all
        .iter()
        .take(MAX_CALLS_PER_RESPONSE)
        .filter_map(|c| {
            let f = &c["function"];
            let tool = f["name"].as_str()?.to_owned();
            let raw = f["arguments"].as_str().unwrap_or("{}");
            let args = if raw.trim().is_empty() {
                json!({})
            } else {
                // Unparseable arguments go to the tool check, which explains the problem back.
                serde_json::from_str(raw).unwrap_or(Value::String(raw.to_owned()))
            };
            Some(ProposedCall { tool, args })
        })
        .collect();
    if plans
        && let Some(tasks) = calls
            .iter()
            .filter(|c| c.tool == PLAN_TOOL)
            .find_map(|c| parse_tasks(c.args.get("tasks").unwrap_or(&Value::Null)).ok())
    {
        return Ok(Decision::Plan {
            thought: content,
            tasks,
        });
    }
    if calls.is_empty() {
        return Ok(Decision::Finish { result: content });
    }
    Ok(Decision::Act {
        thought: content,
        calls,
    })
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// Writes the journal where Delta Engine's generators read it ([`crate::context::journal_file`]).
async fn write_journal_file(view: &View<'_>) -> Result<(), Error> {
    let run_id = view.run_id.to_string();
    let env = crate::tools::ToolEnv {
        work_dir: view.work_dir.to_path_buf(),
        agent_home: view.agent.dir.clone(),
        vars: vec![],
    };
    let command_line = |tool: &str, args: &Value| {
        view.agent
            .tools
            .get(tool)
            .and_then(|t| t.check_args(args).ok().map(|v| (t, v)))
            .and_then(|(t, v)| t.invocation(&v, &env).ok())
            .map(|inv| inv.display())
            .unwrap_or_default()
    };
    let text = crate::context::delta_engine_journal(
        view.journal,
        &run_id,
        view.task,
        &view.agent.dir,
        command_line,
    );
    let path = crate::context::journal_file(view.work_dir, &run_id);
    tokio::task::spawn_blocking(move || {
        let fail = |e: std::io::Error| {
            Error::Config(format!(
                "context.yaml: writing {} for its generators: {e}",
                path.display()
            ))
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(fail)?;
        }
        // A new file of a name no one else uses, never through a symlink (the work directory is
        // the tools'), renamed over the old one (rename replaces a symlink, never follows it).
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let tmp = path.with_extension(format!("jsonl.{}-{nanos}.tmp", std::process::id()));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
            .open(&tmp)
            .map_err(fail)?;
        std::io::Write::write_all(&mut file, text.as_bytes())
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|e| {
                let _ = std::fs::remove_file(&tmp);
                fail(e)
            })
    })
    .await
    .map_err(|e| Error::Config(format!("context.yaml: writing the journal file: {e}")))?
}

/// The messages composed as `context.yaml` says: its blocks in order, the journal where it
/// stands; this engine's own instructions (`ask_human`, plans) as a system message first.
pub fn composed(view: &View<'_>, blocks: &[crate::context::Block]) -> Vec<Value> {
    let mut out = vec![json!({"role": "system", "content": instructions(view.agent)})];
    for b in blocks {
        match b {
            crate::context::Block::System(text) => {
                out.push(json!({"role": "system", "content": text}));
            }
            crate::context::Block::Journal { max_iterations } => {
                out.extend(crate::context::last_turns(
                    conversation(view),
                    *max_iterations,
                ));
            }
        }
    }
    out
}

/// What this engine tells every LLM about its built-in tools.
fn instructions(agent: &Agent) -> String {
    let mut system = String::from(
        "When you need information or a decision from a person, call the `ask_human` tool. \
         A sensitive answer is never shown to you: its result names a {{secret:…}} reference; \
         pass that reference verbatim as a tool argument to use the value.",
    );
    if offers_plan_tool(agent) {
        system.push_str(
            "\n\nBefore you act, lay out your plan with the `plan` tool. A person confirms it or \
             says what to change; when asked to change it, call `plan` again with the revised plan.",
        );
    }
    system
}

/// The conversation so far, from the journal.
pub fn messages(view: &View<'_>) -> Vec<Value> {
    let mut system = view.agent.system_prompt.trim().to_owned();
    if !system.is_empty() {
        system.push_str("\n\n");
    }
    system.push_str(&instructions(view.agent));
    let mut out = vec![json!({"role": "system", "content": system})];
    out.extend(conversation(view));
    out
}

/// The task as the user's message, then what the journal holds.
fn conversation(view: &View<'_>) -> Vec<Value> {
    let mut plan_requests: Vec<RequestId> = vec![];
    let mut out = vec![json!({"role": "user", "content": view.task})];
    for e in view.journal {
        match &e.event {
            Event::Thought(t) => {
                let mut m = json!({"role": "assistant", "content": t.content});
                if let Some(calls) = t.tool_calls.as_ref().filter(|c| !c.is_empty()) {
                    m["tool_calls"] = calls
                        .iter()
                        .map(|c| {
                            json!({"id": c.id, "type": "function",
                                   "function": {"name": c.tool, "arguments": c.args.to_string()}})
                        })
                        .collect();
                }
                out.push(m);
            }
            Event::Plan(p) => {
                let tasks: Vec<String> = p.tasks.iter().map(PlanTask::line).collect();
                out.push(
                    json!({"role": "assistant", "content": format!("Plan:\n{}", tasks.join("\n"))}),
                );
            }
            Event::HumanInputRequest(q) if q.is_plan_confirmation() => {
                plan_requests.push(q.request_id);
            }
            Event::HumanInputReceived(r) if plan_requests.contains(&r.request_id) => {
                let text = match r.action {
                    OptionAction::ApproveAndExecute => {
                        "The plan is confirmed. Carry it out.".to_owned()
                    }
                    OptionAction::RetryWithFeedback => {
                        let mut t = String::from("Change the plan");
                        if let Some(f) = [&r.input, &r.feedback]
                            .into_iter()
                            .flatten()
                            .find(|s| !s.trim().is_empty())
                        {
                            t.push_str(&format!(": {f}"));
                        }
                        if let Some(tasks) = r
                            .data
                            .as_ref()
                            .and_then(|d| d.get("tasks"))
                            .and_then(|v| parse_tasks(v).ok())
                        {
                            let list: Vec<String> = tasks.iter().map(PlanTask::line).collect();
                            t.push_str(&format!(
                                "\nThe person edited the task list to:\n{}",
                                list.join("\n")
                            ));
                        }
                        t.push_str("\nPropose the revised plan with the `plan` tool.");
                        t
                    }
                    _ => continue,
                };
                out.push(json!({"role": "user", "content": text}));
            }
            Event::ActionResult(r) => {
                let prefix = match r.status {
                    ActionStatus::Success => "",
                    ActionStatus::Error => "[error] ",
                    ActionStatus::Skipped => "[skipped] ",
                    ActionStatus::Rejected => "[rejected] ",
                };
                out.push(json!({"role": "tool", "tool_call_id": r.action_id,
                                "content": format!("{prefix}{}", r.observation_content)}));
            }
            _ => {}
        }
    }
    out
}

fn json_type(t: ParamType) -> &'static str {
    match t {
        ParamType::String => "string",
        ParamType::Number => "number",
        ParamType::Integer => "integer",
        ParamType::Boolean => "boolean",
    }
}

/// How the model is told to ask for a typed answer (MCP elicitation's restricted schema).
const RESPONSE_SCHEMA_HELP: &str = "For a structured answer instead of options or text: a flat JSON Schema \
     {\"type\": \"object\", \"properties\": {…}, \"required\": […]} whose properties are each a string \
     (minLength, maxLength, format email|uri|date|date-time), a number or integer (minimum, maximum), \
     a boolean, a single choice ({\"type\": \"string\", \"enum\": […]} or \"oneOf\": [{\"const\", \"title\"}]) or \
     several choices ({\"type\": \"array\", \"items\": {\"type\": \"string\", \"enum\": […]}}), with optional \
     title, description and default. The result is the answer as a JSON object. Not with options.";

/// The `tools` array: the agent's tools and the built-in `ask_human`.
fn tool_specs(agent: &Agent) -> Value {
    let mut specs: Vec<Value> = agent
        .tools
        .values()
        .map(|t| {
            let props: serde_json::Map<String, Value> = t
                .params
                .iter()
                .map(|p| {
                    let mut description = p.description.clone().unwrap_or_default();
                    if p.secret {
                        // The one kind of parameter a sensitive answer's reference may go in.
                        description.push_str(
                            " (takes a sensitive answer: pass its {{secret:…}} reference here)",
                        );
                    }
                    (
                        p.name.clone(),
                        json!({"type": json_type(p.kind), "description": description.trim_start()}),
                    )
                })
                .collect();
            let required: Vec<&str> = t
                .params
                .iter()
                .filter(|p| p.required)
                .map(|p| p.name.as_str())
                .collect();
            json!({"type": "function", "function": {
                "name": t.name, "description": t.description,
                "parameters": {"type": "object", "properties": props, "required": required}}})
        })
        .collect();
    specs.push(json!({"type": "function", "function": {
        "name": ASK_HUMAN,
        "description": "Ask a person for information, a choice or a decision. The run pauses until they answer.",
        "parameters": {"type": "object", "required": ["prompt"], "properties": {
            "prompt": {"type": "string", "description": "The question, self-contained."},
            "input_type": {"type": "string", "enum": ["text", "password", "confirmation", "choice"]},
            "sensitive": {"type": "boolean", "description": "True for secrets: the answer is hidden from you and from logs."},
            "options": {"type": "array", "description": "Choices to offer, if any.", "items": {
                "type": "object", "required": ["id", "label"],
                "properties": {"id": {"type": "string"}, "label": {"type": "string"},
                               "description": {"type": "string"}}}},
            "response_schema": {"type": "object", "description": RESPONSE_SCHEMA_HELP}
        }}}}));
    if offers_plan_tool(agent) {
        specs.push(json!({"type": "function", "function": {
            "name": PLAN_TOOL,
            "description": "Lay out your plan before acting. A person confirms it, asks for changes, or cancels the run.",
            "parameters": {"type": "object", "required": ["tasks"], "properties": {
                "tasks": {"type": "array", "description": "The steps, in order.", "items": {
                    "type": "object", "required": ["description"],
                    "properties": {"description": {"type": "string"},
                                   "tool": {"type": "string", "description": "The tool this step uses, if any."}}}}
            }}}}));
    }
    Value::Array(specs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An endpoint's URL as shown: no user, password or query (a key may be in either).
    #[test]
    fn endpoint_urls_are_shown_without_credentials_or_query() {
        assert_eq!(
            shown("https://u:p4ss@llm.example:8443/v1/chat/completions?api-key=s3cret"),
            "https://llm.example:8443/v1/chat/completions"
        );
        assert_eq!(shown("http://127.0.0.1:9/v1/"), "http://127.0.0.1:9/v1");
        assert!(!shown("not a url s3cret").contains("s3cret"));
        let e = Endpoint {
            base: "https://u:p4ss@llm.example/v1?key=s3cret".into(),
            base_from: "llm.base_url",
            key_env: Some("K".into()),
            key: Some("sk-s3cret".into()),
            warnings: vec![],
        };
        let debug = format!("{e:?}");
        assert!(
            !debug.contains("s3cret") && !debug.contains("p4ss"),
            "{debug}"
        );
    }

    fn llm(yaml: &str) -> LlmConfig {
        serde_yaml_ng::from_str(yaml).expect("llm")
    }

    fn env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |n| {
            vars.iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn delta_api_key_goes_only_to_delta_engines_endpoint() {
        let vars = &[
            ("DELTA_API_KEY", "sk-delta"),
            ("DELTA_BASE_URL", "https://delta.example/v1"),
        ];
        let e = Endpoint::resolve(&llm("model: m"), &env(vars)).expect("resolves");
        assert_eq!(
            (e.base.as_str(), e.key.as_deref()),
            ("https://delta.example/v1", Some("sk-delta"))
        );
        // The agent's own endpoint: not DELTA_API_KEY (named in a warning), only its own
        // variable or OPENAI_API_KEY.
        let own = llm("model: m\nbase_url: https://own.example/v1");
        let e = Endpoint::resolve(&own, &env(vars)).expect("resolves");
        assert_eq!(e.key, None);
        assert!(e.warnings[0].contains("DELTA_API_KEY"), "{:?}", e.warnings);
        let e = Endpoint::resolve(
            &own,
            &env(&[("DELTA_API_KEY", "sk-delta"), ("OPENAI_API_KEY", "sk-oa")]),
        )
        .expect("resolves");
        assert_eq!(e.key.as_deref(), Some("sk-oa"));
        let named = llm("model: m\nbase_url: https://own.example/v1\napi_key_env: OWN");
        let e = Endpoint::resolve(&named, &env(&[("OWN", "sk-own"), ("DELTA_API_KEY", "x")]))
            .expect("resolves");
        assert_eq!(e.key.as_deref(), Some("sk-own"));
    }

    #[test]
    fn no_key_over_plain_http_off_loopback() {
        for base in ["http://10.0.0.5:8000/v1", "http://llm.example/v1"] {
            let l = llm(&format!("model: m\nbase_url: {base}\napi_key_env: K"));
            let err = Endpoint::resolve(&l, &env(&[("K", "sk")])).unwrap_err();
            assert!(matches!(err, Error::Config(_)), "{err}");
            // Without a key it is allowed.
            assert!(Endpoint::resolve(&l, &env(&[])).is_ok());
        }
        for base in [
            "http://127.0.0.1:9/v1",
            "http://localhost:8000/v1",
            "http://[::1]:8000/v1",
            "https://llm.example/v1",
        ] {
            let l = llm(&format!("model: m\nbase_url: {base}\napi_key_env: K"));
            let e = Endpoint::resolve(&l, &env(&[("K", "sk")])).expect(base);
            assert_eq!(e.key.as_deref(), Some("sk"));
        }
        let err = Endpoint::resolve(
            &llm("model: m"),
            &env(&[
                ("DELTA_BASE_URL", "http://203.0.113.9/v1"),
                ("DELTA_API_KEY", "sk"),
            ]),
        )
        .unwrap_err();
        assert!(err.to_string().contains("DELTA_BASE_URL"), "{err}");
    }
}
