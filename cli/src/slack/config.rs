//! The bridge's configuration: a YAML file (strict: an unknown key is refused by name) for what
//! is not secret, and the environment for what is (the bot token, the signing secret, the
//! gateway token, NATS credentials). Every problem is reported at once.
//!
//! ```yaml
//! gateway_url: http://127.0.0.1:8080   # plain http only to this machine, unless…
//! gateway_plain_http: false       # …true: TLS ends in a proxy or mesh between them
//! nats: {url: "nats://127.0.0.1:4222", prefix: delta}
//! listen: 0.0.0.0:3000            # POST /slack/interactivity
//! inbox_url: https://delta.example.com/inbox
//! slack_api_url: https://slack.com/api/   # the default
//! slack_timeout_secs: 30          # a Slack call that takes longer failed (tried again later)
//! team_id: T0123ABC               # optional: answer only for people of this workspace
//! routes:
//!   - {agents: [deployer], channel: C0123DEPLOY, dm: true}
//!   - {agents: ["*"], channel: C0456OTHERS}
//! users:
//!   by_id: {U012ALICE: alice}
//!   by_email: {bob@example.com: bob}
//!   file: users.yaml               # optional: more of the same two maps
//! ```

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The environment variables the bridge reads.
pub const ENV_BOT_TOKEN: &str = "SLACK_BOT_TOKEN";
pub const ENV_SIGNING_SECRET: &str = "SLACK_SIGNING_SECRET";
pub const ENV_GATEWAY_TOKEN: &str = "DELTA_TOKEN";
pub const ENV_NATS_URL: &str = "DELTA_NATS_URL";

/// How long one Slack call may take by default, in seconds.
pub const SLACK_TIMEOUT_SECS: u64 = 30;

/// The default Slack Web API.
pub const SLACK_API_URL: &str = "https://slack.com/api/";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    gateway_url: String,
    /// Plain `http://` to a gateway off this machine, whose TLS a proxy or mesh terminates: the
    /// relay token crosses that network in clear otherwise, so it is refused unless said.
    #[serde(default)]
    gateway_plain_http: bool,
    #[serde(default)]
    gateway_ca: Option<PathBuf>,
    nats: NatsFile,
    listen: String,
    #[serde(default)]
    inbox_url: Option<String>,
    #[serde(default)]
    slack_api_url: Option<String>,
    /// Seconds a Slack call may take, rate-limit waits included (default 30).
    #[serde(default)]
    slack_timeout_secs: Option<u64>,
    #[serde(default)]
    team_id: Option<String>,
    routes: Vec<RouteFile>,
    #[serde(default)]
    users: UsersFile,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NatsFile {
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    ca_file: Option<PathBuf>,
    #[serde(default)]
    prefix: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteFile {
    agents: Vec<String>,
    #[serde(default)]
    channel: Option<String>,
    #[serde(default)]
    dm: bool,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct UsersFile {
    #[serde(default)]
    file: Option<PathBuf>,
    #[serde(default)]
    by_id: BTreeMap<String, String>,
    #[serde(default)]
    by_email: BTreeMap<String, String>,
}

/// A user mapping file: the same two maps as the `users` section.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct MappingFile {
    #[serde(default)]
    by_id: BTreeMap<String, String>,
    #[serde(default)]
    by_email: BTreeMap<String, String>,
}

/// Where one agent's questions go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// Agent names; `*` matches every agent, `name*` every agent whose name starts so.
    pub agents: Vec<String>,
    /// The channel id (`C…`) to post in, if any.
    pub channel: Option<String>,
    /// Also send the question to each person its `allowed_responders` names, in a DM.
    pub dm: bool,
}

impl Route {
    fn matches(&self, agent: &str) -> bool {
        self.agents.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => agent.starts_with(prefix),
            None => p == agent,
        })
    }
}

/// Slack users → responder identities (names of the gateway's tokens file).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Users {
    pub by_id: HashMap<String, String>,
    /// Keys in lower case.
    pub by_email: HashMap<String, String>,
}

/// Everything the bridge runs with.
#[derive(Clone)]
pub struct Config {
    pub gateway_url: String,
    /// The file's `gateway_plain_http`: see [`Config::check_gateway_transport`].
    pub gateway_plain_http: bool,
    pub gateway_ca: Option<PathBuf>,
    /// From `DELTA_NATS_URL` (which may carry `user:password@`), else the file's `nats.url`.
    pub nats_url: String,
    pub nats_ca: Option<PathBuf>,
    pub prefix: String,
    pub listen: SocketAddr,
    pub inbox_url: Option<String>,
    /// Without a trailing `/` (how the Slack client joins method names).
    pub slack_api_url: String,
    /// How long one Slack call may take (its rate-limit waits and retries included) before it
    /// is given up as failed: a hung call never holds the events.
    pub slack_timeout: std::time::Duration,
    /// The workspace (`T…`) whose people the bridge answers for, when set: a click from
    /// another team (a Slack Connect guest in a shared channel) is refused.
    pub team_id: Option<String>,
    pub routes: Vec<Route>,
    pub users: Users,
    pub bot_token: String,
    pub signing_secret: String,
    /// The gateway token (a `relay` token when the gateway has a tokens file).
    pub gateway_token: Option<String>,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("gateway_url", &self.gateway_url)
            .field("prefix", &self.prefix)
            .field("listen", &self.listen)
            .field("routes", &self.routes)
            .finish_non_exhaustive()
    }
}

impl Config {
    /// The route of `agent`: the first that matches.
    pub fn route(&self, agent: &str) -> Option<&Route> {
        self.routes.iter().find(|r| r.matches(agent))
    }

    /// Reads the file at `path` and the environment `env`; every problem, each naming what to fix.
    pub fn load(path: &Path, env: &HashMap<String, String>) -> Result<Config, Vec<String>> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            vec![format!(
                "{}: cannot read the Slack bridge's config file: {e}",
                path.display()
            )]
        })?;
        let base = path.parent().unwrap_or_else(|| Path::new("."));
        Self::parse(&text, base, env).map_err(|errors| {
            errors
                .into_iter()
                .map(|e| format!("{}: {e}", path.display()))
                .collect()
        })
    }

    /// Parses the file's text; relative paths in it are below `base`.
    pub fn parse(
        text: &str,
        base: &Path,
        env: &HashMap<String, String>,
    ) -> Result<Config, Vec<String>> {
        let de = serde_yaml_ng::Deserializer::from_str(text);
        let file: FileConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            let at = e.path().to_string();
            let at = if at == "." {
                String::new()
            } else {
                format!("{at}: ")
            };
            vec![format!("{at}{}", e.inner())]
        })?;
        let mut errors = vec![];
        let secret = |name: &str, errors: &mut Vec<String>, what: &str| match env
            .get(name)
            .map(|s| s.trim())
            .filter(|s| !s.is_empty())
        {
            Some(v) => v.to_owned(),
            None => {
                errors.push(format!("{name} is not set: {what}"));
                String::new()
            }
        };
        let bot_token = secret(
            ENV_BOT_TOKEN,
            &mut errors,
            "the app's Bot User OAuth Token (xoxb-…, under OAuth & Permissions)",
        );
        let signing_secret = secret(
            ENV_SIGNING_SECRET,
            &mut errors,
            "the app's Signing Secret (under Basic Information › App Credentials)",
        );
        let gateway_token = env
            .get(ENV_GATEWAY_TOKEN)
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty());
        if !file.gateway_url.starts_with("http://") && !file.gateway_url.starts_with("https://") {
            errors.push(format!(
                "gateway_url `{}` must start with http:// or https://",
                file.gateway_url
            ));
        } else if let Err(e) = reqwest::Url::parse(file.gateway_url.trim()) {
            errors.push(format!(
                "gateway_url `{}` is not a URL ({e}): write it as https://host[:port]",
                file.gateway_url
            ));
        }
        if let Some(u) = &file.nats.url
            && u.contains('@')
        {
            errors.push(
                "nats.url carries credentials: put them in DELTA_NATS_URL (the environment), never in the file"
                    .into(),
            );
        }
        let nats_url = match (
            env.get(ENV_NATS_URL).filter(|s| !s.trim().is_empty()),
            &file.nats.url,
        ) {
            (Some(u), _) => u.trim().to_owned(),
            (None, Some(u)) => u.clone(),
            (None, None) => {
                errors.push("nats.url is missing (or set DELTA_NATS_URL)".into());
                String::new()
            }
        };
        if !nats_url.is_empty()
            && !nats_url
                .split(',')
                .all(|u| u.trim().starts_with("nats://") || u.trim().starts_with("tls://"))
        {
            errors.push("the NATS URL must start with nats:// or tls://".into());
        }
        let prefix = env
            .get("DELTA_KEY_PREFIX")
            .cloned()
            .or(file.nats.prefix.clone())
            .unwrap_or_else(|| "delta".to_owned());
        let prefix_ok = !prefix.is_empty()
            && prefix.len() <= 32
            && prefix
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !prefix_ok {
            errors.push(format!(
                "nats.prefix `{prefix}` must be 1 to 32 lower-case letters, digits or `_`"
            ));
        }
        let listen = file.listen.parse::<SocketAddr>().unwrap_or_else(|_| {
            errors.push(format!(
                "listen `{}` is not an address and port (e.g. 0.0.0.0:3000)",
                file.listen
            ));
            SocketAddr::from(([127, 0, 0, 1], 0))
        });
        let slack_api_url = file
            .slack_api_url
            .unwrap_or_else(|| SLACK_API_URL.to_owned());
        let to_loopback =
            slack_api_url.starts_with("http://") && !plain_off_loopback(&slack_api_url);
        if !slack_api_url.starts_with("https://") && !to_loopback {
            errors.push(format!(
                "slack_api_url `{slack_api_url}` must start with https:// (or http:// to this machine, for a test's stand-in): the bot token goes with every call"
            ));
        }
        let slack_timeout_secs = file.slack_timeout_secs.unwrap_or(SLACK_TIMEOUT_SECS);
        if !(1..=600).contains(&slack_timeout_secs) {
            errors.push(format!(
                "slack_timeout_secs {slack_timeout_secs} must be 1 to 600 (seconds a Slack call may take)"
            ));
        }
        if let Some(t) = &file.team_id
            && (!t.starts_with('T') || t.len() < 2)
        {
            errors.push(format!(
                "team_id `{t}` must be a workspace id (T…, in the workspace's settings or a Slack URL)"
            ));
        }
        if let Some(u) = &file.inbox_url
            && !u.starts_with("https://")
            && !u.starts_with("http://")
        {
            errors.push(format!(
                "inbox_url `{u}` must start with https:// or http://"
            ));
        }
        if file.routes.is_empty() {
            errors.push(
                "routes is empty: add at least one, e.g. `- {agents: [\"*\"], channel: C0123ABC}`"
                    .into(),
            );
        }
        let mut routes = vec![];
        for (i, r) in file.routes.into_iter().enumerate() {
            if r.agents.is_empty() || r.agents.iter().any(|a| a.trim().is_empty()) {
                errors.push(format!("routes[{i}].agents must list agent names (or `*`)"));
            }
            if r.channel.is_none() && !r.dm {
                errors.push(format!(
                    "routes[{i}] has neither a channel nor `dm: true`: its questions would go nowhere"
                ));
            }
            if let Some(c) = &r.channel
                && (c.trim().is_empty() || c.starts_with('#'))
            {
                errors.push(format!(
                    "routes[{i}].channel `{c}` must be a channel id (C…, in the channel's details), not a name"
                ));
            }
            routes.push(Route {
                agents: r.agents,
                channel: r.channel,
                dm: r.dm,
            });
        }
        let mut users = Users::default();
        let mut add = |by_id: BTreeMap<String, String>,
                       by_email: BTreeMap<String, String>,
                       errors: &mut Vec<String>| {
            for (k, v) in by_id {
                if v.trim().is_empty() {
                    errors.push(format!("users.by_id `{k}` maps to an empty identity"));
                }
                users.by_id.insert(k, v);
            }
            for (k, v) in by_email {
                if !k.contains('@') {
                    errors.push(format!("users.by_email `{k}` is not an e-mail address"));
                }
                if v.trim().is_empty() {
                    errors.push(format!("users.by_email `{k}` maps to an empty identity"));
                }
                users.by_email.insert(k.to_lowercase(), v);
            }
        };
        if let Some(f) = &file.users.file {
            let path = base.join(f);
            match std::fs::read_to_string(&path) {
                Err(e) => errors.push(format!(
                    "users.file {}: cannot read it: {e}",
                    path.display()
                )),
                Ok(text) => {
                    let de = serde_yaml_ng::Deserializer::from_str(&text);
                    match serde_path_to_error::deserialize::<_, MappingFile>(de) {
                        Ok(m) => add(m.by_id, m.by_email, &mut errors),
                        Err(e) => errors.push(format!(
                            "users.file {}: {}: {}",
                            path.display(),
                            e.path(),
                            e.inner()
                        )),
                    }
                }
            }
        }
        add(file.users.by_id, file.users.by_email, &mut errors);
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Config {
            gateway_url: file.gateway_url,
            gateway_plain_http: file.gateway_plain_http,
            gateway_ca: file.gateway_ca.map(|p| base.join(p)),
            nats_url,
            nats_ca: file.nats.ca_file.map(|p| base.join(p)),
            prefix,
            listen,
            inbox_url: file.inbox_url,
            slack_api_url: slack_api_url.trim_end_matches('/').to_owned(),
            slack_timeout: std::time::Duration::from_secs(slack_timeout_secs),
            team_id: file.team_id,
            routes,
            users,
            bot_token,
            signing_secret,
            gateway_token,
        })
    }
}

impl Config {
    /// Refuses a `gateway_url` of plain `http://` to another machine: the relay token goes with
    /// every call, and would cross that network in clear, unless the file says a proxy or mesh
    /// between them ends TLS (`gateway_plain_http: true`). Checked when the bridge starts, on the
    /// URL it uses (`delta dev --slack` replaces the file's with its own, on this machine).
    pub fn check_gateway_transport(&self) -> Result<(), String> {
        if self.gateway_plain_http || !plain_off_loopback(&self.gateway_url) {
            return Ok(());
        }
        Err(format!(
            "gateway_url `{}` is plain http to another machine: the relay token would cross the network in clear. Use https:// (gateway_ca for a private CA), or set gateway_plain_http: true where a proxy or mesh between them terminates TLS",
            self.gateway_url
        ))
    }
}

/// Whether `url` is plain `http://` to a host other than this machine's loopback (an
/// unparsable URL counts as such: it is refused either way).
fn plain_off_loopback(url: &str) -> bool {
    reqwest::Url::parse(url.trim()).map_or(true, |u| crate::client::plain_off_loopback(&u))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> HashMap<String, String> {
        [
            (ENV_BOT_TOKEN, "xoxb-1"),
            (ENV_SIGNING_SECRET, "s3cret"),
            (ENV_GATEWAY_TOKEN, "relay-token-0123456789"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    const GOOD: &str = "gateway_url: http://127.0.0.1:8080\nnats: {url: \"nats://127.0.0.1:4222\"}\nlisten: 127.0.0.1:3000\nroutes:\n  - {agents: [deployer], channel: C1, dm: true}\n  - {agents: [\"ops-*\"], channel: C2}\n  - {agents: [\"*\"], channel: C3}\nusers:\n  by_id: {U1: alice}\n  by_email: {Bob@Example.com: bob}\n";

    #[test]
    fn a_good_file_routes_first_match_wins() {
        let c = Config::parse(GOOD, Path::new("."), &env()).expect("valid");
        assert_eq!(
            c.route("deployer").and_then(|r| r.channel.as_deref()),
            Some("C1")
        );
        assert!(c.route("deployer").is_some_and(|r| r.dm));
        assert_eq!(
            c.route("ops-db").and_then(|r| r.channel.as_deref()),
            Some("C2")
        );
        assert_eq!(
            c.route("hello").and_then(|r| r.channel.as_deref()),
            Some("C3")
        );
        assert_eq!(c.slack_api_url, "https://slack.com/api");
        assert_eq!(c.prefix, "delta");
        assert_eq!(
            c.users.by_email.get("bob@example.com").map(String::as_str),
            Some("bob")
        );
    }

    /// The relay token and the bot token never go over plain HTTP to another machine: the
    /// gateway only where its TLS ends in between (said in so many words), Slack's API never.
    #[test]
    fn tokens_never_cross_a_network_in_clear() {
        let to = |url: &str| GOOD.replace("http://127.0.0.1:8080", url);
        let parse = |text: &str| Config::parse(text, Path::new("."), &env()).expect("parses");
        for ok in [
            "http://127.0.0.1:8080",
            "http://localhost:8080",
            "http://[::1]:8080",
            "https://gateway:8443",
        ] {
            assert!(parse(&to(ok)).check_gateway_transport().is_ok(), "{ok}");
        }
        let e = parse(&to("http://gateway:8080"))
            .check_gateway_transport()
            .expect_err("plain http off this machine");
        assert!(
            e.contains("relay token") && e.contains("gateway_plain_http"),
            "{e}"
        );
        let said = format!("{}gateway_plain_http: true\n", to("http://gateway:8080"));
        assert!(parse(&said).check_gateway_transport().is_ok());
        for (api, ok) in [
            ("https://slack.example/api/", true),
            ("http://127.0.0.1:9/api/", true),
            ("http://slack.example/api/", false),
        ] {
            let text = format!("{GOOD}slack_api_url: {api}\n");
            let parsed = Config::parse(&text, Path::new("."), &env());
            assert_eq!(parsed.is_ok(), ok, "{api}: {:?}", parsed.err());
        }
    }

    #[test]
    fn unknown_keys_are_refused_by_name() {
        let text = GOOD.replace("listen:", "listne: x\nlisten:");
        let e = Config::parse(&text, Path::new("."), &env()).expect_err("unknown key");
        assert!(e[0].contains("listne"), "{e:?}");
        let text = GOOD.replace("dm: true", "dm: true, chanel: C9");
        let e = Config::parse(&text, Path::new("."), &env()).expect_err("unknown key");
        assert!(
            e[0].contains("chanel") && e[0].contains("routes[0]"),
            "{e:?}"
        );
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let text = "gateway_url: ftp://x\nnats: {url: \"nats://u:p@h:4222\"}\nlisten: nowhere\nslack_timeout_secs: 0\nteam_id: acme\nroutes:\n  - {agents: [a]}\n  - {agents: [b], channel: \"#general\"}\n";
        let e = Config::parse(text, Path::new("."), &HashMap::new()).expect_err("bad");
        let all = e.join("\n");
        for needle in [
            "SLACK_BOT_TOKEN",
            "SLACK_SIGNING_SECRET",
            "gateway_url",
            "credentials",
            "listen",
            "neither a channel",
            "channel id",
            "slack_timeout_secs 0",
            "team_id `acme`",
        ] {
            assert!(all.contains(needle), "{needle} missing in {all}");
        }
    }

    #[test]
    fn the_environment_gives_the_nats_url_with_its_credentials() {
        let mut env = env();
        env.insert(
            ENV_NATS_URL.into(),
            "nats://delta-slack:pw@10.0.0.1:4222".into(),
        );
        let c = Config::parse(GOOD, Path::new("."), &env).expect("valid");
        assert_eq!(c.nats_url, "nats://delta-slack:pw@10.0.0.1:4222");
    }
}
