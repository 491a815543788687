//! `delta-gateway`'s configuration: flags win over `DELTA_*` variables; every bad value is
//! reported at once (exit 64).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use delta_host::settings::{Setting, Settings};
use delta_protocol::secret::SecretsKey;
use delta_store::redis::Durability;

use crate::auth::Auth;

/// The settings, by their environment names (docs/protocol.md §9 and ours), with defaults.
pub const SETTINGS: &[Setting] = &[
    ("DELTA_NATS_URL", "nats-url", "nats://127.0.0.1:4222"),
    ("DELTA_REDIS_URL", "redis-url", "redis://127.0.0.1:6379"),
    ("DELTA_NATS_CA_FILE", "nats-ca-file", ""),
    ("DELTA_REDIS_CA_FILE", "redis-ca-file", ""),
    ("DELTA_REDIS_CLUSTER", "redis-cluster", "0"),
    ("DELTA_REDIS_DURABILITY", "redis-durability", ""),
    ("DELTA_REDIS_BUCKETS", "redis-buckets", ""),
    ("DELTA_STREAM_REPLICAS", "stream-replicas", "1"),
    ("DELTA_KEY_PREFIX", "key-prefix", "delta"),
    ("DELTA_AGENTS_DIR", "agents-dir", "./agents"),
    ("DELTA_GATEWAY_ADDR", "addr", "127.0.0.1:8080"),
    ("DELTA_GATEWAY_TOKENS_FILE", "tokens-file", ""),
    ("DELTA_GATEWAY_TOKEN", "token", ""),
    ("DELTA_GATEWAY_AUTH", "auth", "tokens"),
    ("DELTA_SECRETS_KEY", "secrets-key", ""),
    ("DELTA_MAX_BODY_BYTES", "max-body-bytes", "1048576"),
    ("DELTA_RECONCILE_MS", "reconcile-ms", "1000"),
    ("DELTA_RESUME_CHECK_S", "resume-check-s", "5"),
    ("DELTA_LOST_JOB_S", "lost-job-s", "60"),
    ("DELTA_MAX_CONNECTIONS", "max-connections", "4096"),
    ("DELTA_HEADER_TIMEOUT_S", "header-timeout-s", "10"),
    ("DELTA_REQUEST_TIMEOUT_S", "request-timeout-s", "30"),
    (
        "DELTA_MAX_STREAMS_PER_IDENTITY",
        "max-streams-per-identity",
        "32",
    ),
    ("DELTA_MAX_TASK_BYTES", "max-task-bytes", "65536"),
    ("DELTA_SUBMIT_PER_MINUTE", "submit-per-minute", "600"),
    ("DELTA_TICKETS_PER_MINUTE", "tickets-per-minute", "600"),
    ("DELTA_QUESTION_CACHE_MIB", "question-cache-mib", "16"),
    ("DELTA_QUESTION_WAIT_MS", "question-wait-ms", "50"),
    ("DELTA_RETENTION", "retention", "7d"),
    ("DELTA_GATEWAY_TLS_CERT", "tls-cert", ""),
    ("DELTA_GATEWAY_TLS_KEY", "tls-key", ""),
    ("DELTA_GATEWAY_PLAIN_HTTP", "plain-http", "loopback"),
    ("DELTA_STREAM_TICKET_TTL_S", "stream-ticket-ttl-s", "30"),
    ("DELTA_WEBHOOK_ALLOW", "webhook-allow", ""),
    (
        "DELTA_WEBHOOK_DISABLE_AFTER",
        "webhook-disable-after",
        "72h",
    ),
    (
        "DELTA_WEBHOOK_CONNECT_TIMEOUT_S",
        "webhook-connect-timeout-s",
        "5",
    ),
    ("DELTA_WEBHOOK_TIMEOUT_S", "webhook-timeout-s", "15"),
    ("DELTA_WEBHOOK_RETRY_FIRST_S", "webhook-retry-first-s", "1"),
    ("DELTA_WEBHOOK_RETRY_MAX_S", "webhook-retry-max-s", "600"),
    ("DELTA_WEBHOOK_ACK_WAIT_S", "webhook-ack-wait-s", "30"),
    ("DELTA_PUBLIC_URL", "public-url", ""),
    ("DELTA_ANSWER_LINK_TTL_S", "answer-link-ttl-s", "900"),
    // The A2A server (src/a2a): the key that signs push notifications (a PKCS#8 Ed25519 file).
    ("DELTA_A2A_SIGNING_KEY", "a2a-signing-key", ""),
    // What push configs that are not an operator's may reach besides public addresses.
    ("DELTA_A2A_PUSH_ALLOW", "a2a-push-allow", ""),
];

/// `DELTA_RETENTION`'s default: finished runs are kept a week.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// How a gateway runs. Its `Debug` shows the servers' URLs without their passwords.
#[derive(Clone)]
pub struct Config {
    pub nats_url: String,
    pub redis_url: String,
    /// CA certificates (PEM) that sign NATS's and Redis's TLS certificates (the system's roots
    /// when `None`).
    pub nats_ca: Option<PathBuf>,
    pub redis_ca: Option<PathBuf>,
    pub prefix: String,
    /// Where agents live: a submission must name one of them.
    pub agents_dir: PathBuf,
    pub addr: SocketAddr,
    pub auth: Auth,
    /// Seals sensitive answers (`DELTA_SECRETS_KEY`, the workers' key).
    pub secrets_key: Option<Arc<SecretsKey>>,
    /// How an accepted answer is made durable before it is acknowledged
    /// (`DELTA_REDIS_DURABILITY`).
    pub durability: Durability,
    /// `redis_url` lists seed nodes of a Redis Cluster (`DELTA_REDIS_CLUSTER`).
    pub redis_cluster: bool,
    /// How many buckets the runs are spread over in Redis (`DELTA_REDIS_BUCKETS`), fixed for
    /// the life of a deployment (docs/operations.md#redis-buckets); `None`: the count Redis
    /// holds (a new deployment's default).
    pub redis_buckets: Option<u32>,
    /// Copies of each stream on a NATS cluster (`DELTA_STREAM_REPLICAS`), as the workers.
    pub stream_replicas: usize,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// How often the reconcilers run.
    pub reconcile_every: Duration,
    /// How long after an answer its resume is checked for having been published.
    pub resume_check: Duration,
    /// How long a queued or running run may show no progress with no job in the stream before
    /// a reconciler enqueues it again (also: how long after publishing a resume it is checked).
    pub lost_job_after: Duration,
    /// HTTP connections open at once; more are closed as soon as they are accepted.
    pub max_connections: usize,
    /// How long a connection may take to send a request's headers (and how long an idle
    /// connection is kept): slow or silent clients cannot hold connections.
    pub header_timeout: Duration,
    /// How long a request may take to get its response (a live stream: to start).
    pub request_timeout: Duration,
    /// Live streams one token may hold at once (with authentication on).
    pub max_streams_per_identity: usize,
    /// The largest task a submission may carry (it is stored with the run and shown to the LLM).
    pub max_task_bytes: usize,
    /// Runs one identity may submit per minute (a burst of as many, then that rate).
    pub submit_per_minute: u32,
    /// Stream tickets and answer links one identity may get per minute (with authentication
    /// on; a burst of as many, then that rate): each is kept in Redis for its lifetime.
    pub tickets_per_minute: u32,
    /// Bytes of the questions heard announced that are kept, so that answering one reads
    /// nothing from Redis first (`DELTA_QUESTION_CACHE_MIB`, src/heard.rs); `0`: none kept.
    pub question_cache_bytes: usize,
    /// How long an answer to a question asked in the last seconds and not heard yet waits for its
    /// hearing before it reads the question from Redis (`DELTA_QUESTION_WAIT_MS`); `0`: none waits.
    pub question_wait: Duration,
    /// How long a finished run is kept before the reconcilers delete it; `None`: forever.
    pub retention: Option<Duration>,
    /// Serve HTTPS with this (`DELTA_GATEWAY_TLS_CERT` and `DELTA_GATEWAY_TLS_KEY`); `None`:
    /// plain HTTP, which tokens may cross only on loopback unless `DELTA_GATEWAY_PLAIN_HTTP=any`.
    pub tls: Option<crate::tls::ServerConfig>,
    /// How long a live-stream ticket opens its stream (`DELTA_STREAM_TICKET_TTL_S`).
    pub stream_ticket_ttl: Duration,
    /// How webhooks are delivered (`DELTA_WEBHOOK_*`).
    pub webhooks: crate::webhooks::Settings,
    /// The URL people reach this gateway at (`DELTA_PUBLIC_URL`, no trailing `/`), for the
    /// links it gives out; `None`: the scheme it serves and the `Host` the client used.
    pub public_url: Option<String>,
    /// How long a one-time answer link works (`DELTA_ANSWER_LINK_TTL_S`).
    pub answer_link_ttl: Duration,
    /// The A2A server's settings (`DELTA_A2A_*`).
    pub a2a: crate::a2a::Settings,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field(
                "nats_url",
                &delta_protocol::without_credentials(&self.nats_url),
            )
            .field(
                "redis_url",
                &delta_protocol::without_credentials(&self.redis_url),
            )
            .field("prefix", &self.prefix)
            .field("agents_dir", &self.agents_dir)
            .field("addr", &self.addr)
            .field("auth_on", &self.auth.is_on())
            .field("secrets_key", &self.secrets_key)
            .field("durability", &self.durability)
            .field("redis_cluster", &self.redis_cluster)
            .field("redis_buckets", &self.redis_buckets)
            .field("stream_replicas", &self.stream_replicas)
            .field("tls", &self.tls.is_some())
            .field("public_url", &self.public_url)
            .finish_non_exhaustive()
    }
}

impl Config {
    /// Local defaults with the given servers (tests).
    pub fn local(nats_url: &str, redis_url: &str, prefix: &str, agents_dir: PathBuf) -> Self {
        Self {
            nats_url: nats_url.to_owned(),
            redis_url: redis_url.to_owned(),
            nats_ca: None,
            redis_ca: None,
            prefix: prefix.to_owned(),
            agents_dir,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            auth: Auth::off(),
            secrets_key: None,
            durability: Durability::FsyncAlways,
            redis_cluster: false,
            redis_buckets: None,
            stream_replicas: 1,
            max_body_bytes: 1 << 20,
            reconcile_every: Duration::from_millis(1000),
            resume_check: Duration::from_secs(5),
            lost_job_after: Duration::from_secs(60),
            max_connections: 4096,
            header_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            max_streams_per_identity: 32,
            max_task_bytes: 64 * 1024,
            submit_per_minute: 600,
            tickets_per_minute: 600,
            question_cache_bytes: 16 << 20,
            question_wait: Duration::from_millis(50),
            retention: Some(DEFAULT_RETENTION),
            tls: None,
            stream_ticket_ttl: Duration::from_secs(30),
            webhooks: crate::webhooks::Settings::default(),
            public_url: None,
            answer_link_ttl: Duration::from_secs(900),
            a2a: crate::a2a::Settings::default(),
        }
    }
}

/// Builds the config from flags and an environment map.
pub fn parse(args: &[String], env: &HashMap<String, String>) -> Result<Config, Vec<String>> {
    let mut s = Settings::parse(SETTINGS, args, env);
    let servers = s.servers();
    let agents_dir = s.dir("DELTA_AGENTS_DIR", "agents");
    let (addr_text, from) = s.get("DELTA_GATEWAY_ADDR");
    let addr = match addr_text.parse::<SocketAddr>() {
        Ok(a) => Some(a),
        Err(_) => {
            s.errors.push(format!(
                "{from}: `{addr_text}` is not an address like 127.0.0.1:8080"
            ));
            None
        }
    };
    let (tokens, _) = s.get("DELTA_GATEWAY_TOKENS_FILE");
    let (operator_token, _) = s.get("DELTA_GATEWAY_TOKEN");
    let (mode, mode_from) = s.get("DELTA_GATEWAY_AUTH");
    let mut auth = if tokens.is_empty() {
        Auth::off()
    } else {
        match Auth::load(std::path::Path::new(&tokens)) {
            Ok(a) => a,
            Err(e) => {
                s.errors.push(e);
                Auth::off()
            }
        }
    };
    if !operator_token.is_empty() {
        match auth.clone().with_operator_token(&operator_token) {
            Ok(a) => auth = a,
            Err(e) => s.errors.push(e),
        }
    }
    let has_tokens = !tokens.is_empty() || !operator_token.is_empty();
    // Authentication is the default: running without it is a choice made in so many words, and
    // only on this machine's loopback (a page anywhere else could drive the fleet).
    match mode.as_str() {
        "tokens" if !has_tokens => s.errors.push(
            "no tokens: set DELTA_GATEWAY_TOKENS_FILE (or DELTA_GATEWAY_TOKEN, one operator token, e.g. `openssl rand -hex 24`), or DELTA_GATEWAY_AUTH=off (--auth off) to run without authentication on a loopback address (docs/security.md)"
                .to_owned(),
        ),
        "tokens" => {}
        "off" if has_tokens => s.errors.push(format!(
            "{mode_from}=off, but tokens are given: unset the tokens, or {mode_from}"
        )),
        "off" if addr.is_some_and(|a| !a.ip().is_loopback()) => s.errors.push(format!(
            "{mode_from}=off is for a loopback address only (127.0.0.1, ::1): without tokens, anyone who reaches {addr_text} could drive the fleet; give tokens instead"
        )),
        "off" => {}
        other => s.errors.push(format!(
            "{mode_from}: `{other}` is not `tokens` (the default) or `off`"
        )),
    }
    let secrets_key = s.secrets_key("DELTA_SECRETS_KEY");
    let max_body = s.number("DELTA_MAX_BODY_BYTES", 1024);
    let reconcile_ms = s.number("DELTA_RECONCILE_MS", 10);
    let resume_check = s.number_at_most("DELTA_RESUME_CHECK_S", 1, 86_400, "is longer than a day");
    let lost_job = s.number_at_most("DELTA_LOST_JOB_S", 1, 604_800, "is longer than a week");
    let max_connections = s.number_at_most(
        "DELTA_MAX_CONNECTIONS",
        1,
        1_000_000,
        "is more connections than one gateway holds (at most 1000000)",
    );
    let header_timeout = s.seconds("DELTA_HEADER_TIMEOUT_S", 0.1);
    let request_timeout = s.seconds("DELTA_REQUEST_TIMEOUT_S", 0.1);
    let per_identity = s.number("DELTA_MAX_STREAMS_PER_IDENTITY", 1);
    let max_task = s.number("DELTA_MAX_TASK_BYTES", 1);
    let submit_rate = s.number("DELTA_SUBMIT_PER_MINUTE", 1);
    let ticket_rate = s.number("DELTA_TICKETS_PER_MINUTE", 1);
    let question_cache = s.number_at_most(
        "DELTA_QUESTION_CACHE_MIB",
        0,
        65_536,
        "MiB is more than a gateway needs: each question kept is about a kilobyte; keep it at most 65536",
    );
    let question_wait = s.number_at_most(
        "DELTA_QUESTION_WAIT_MS",
        0,
        10_000,
        "ms is longer than an answer should wait for its question to be heard; keep it at most 10000 (the default, 50, is plenty)",
    );
    let retention = s.period("DELTA_RETENTION");
    let tls = tls_settings(&mut s, addr, has_tokens);
    let ticket_ttl = s.number("DELTA_STREAM_TICKET_TTL_S", 1);
    if ticket_ttl > 300 {
        let (_, from) = s.get("DELTA_STREAM_TICKET_TTL_S");
        s.errors.push(format!(
            "{from}: `{ticket_ttl}` s is too long for a one-time stream ticket; keep it at most 300 (30 to 60 is usual)"
        ));
    }
    let webhooks = crate::webhooks::Settings::parse(&mut s);
    let public_url = public_url(&mut s);
    let link_ttl = s.number("DELTA_ANSWER_LINK_TTL_S", 10);
    if link_ttl > 86_400 {
        let (_, from) = s.get("DELTA_ANSWER_LINK_TTL_S");
        s.errors.push(format!(
            "{from}: `{link_ttl}` s is too long for a one-time answer link; keep it at most 86400 (a day)"
        ));
    }
    let a2a = crate::a2a::Settings::parse(&mut s);
    s.finish()?;
    Ok(Config {
        nats_url: servers.nats_url,
        redis_url: servers.redis_url,
        nats_ca: servers.nats_ca,
        redis_ca: servers.redis_ca,
        prefix: servers.prefix,
        agents_dir,
        addr: addr.unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8080))),
        auth,
        secrets_key,
        durability: servers.durability,
        redis_cluster: servers.redis_cluster,
        redis_buckets: servers.redis_buckets,
        stream_replicas: servers.stream_replicas,
        max_body_bytes: usize::try_from(max_body).unwrap_or(usize::MAX),
        reconcile_every: Duration::from_millis(reconcile_ms),
        resume_check: Duration::from_secs(resume_check),
        lost_job_after: Duration::from_secs(lost_job),
        max_connections: usize::try_from(max_connections).unwrap_or(usize::MAX),
        header_timeout,
        request_timeout,
        max_streams_per_identity: usize::try_from(per_identity).unwrap_or(usize::MAX),
        max_task_bytes: usize::try_from(max_task).unwrap_or(usize::MAX),
        submit_per_minute: u32::try_from(submit_rate).unwrap_or(u32::MAX),
        tickets_per_minute: u32::try_from(ticket_rate).unwrap_or(u32::MAX),
        question_cache_bytes: usize::try_from(question_cache << 20).unwrap_or(usize::MAX),
        question_wait: Duration::from_millis(question_wait),
        retention,
        tls,
        stream_ticket_ttl: Duration::from_secs(ticket_ttl),
        webhooks,
        public_url,
        answer_link_ttl: Duration::from_secs(link_ttl),
        a2a,
    })
}

/// `DELTA_PUBLIC_URL`: an absolute `http(s)` URL with a host, and nothing after its path.
fn public_url(s: &mut Settings) -> Option<String> {
    let (url, from) = s.get("DELTA_PUBLIC_URL");
    if url.is_empty() {
        return None;
    }
    let trimmed = url.trim_end_matches('/');
    let ok = match trimmed.split_once("://") {
        Some(("http" | "https", rest)) => {
            let host = rest.split('/').next().unwrap_or("");
            !host.is_empty()
                && !host.contains('@')
                && !rest.contains(['?', '#', ' '])
                && rest.is_ascii()
        }
        _ => false,
    };
    if ok {
        Some(trimmed.to_owned())
    } else {
        s.errors.push(format!(
            "{from}: `{url}` is not an absolute URL like https://delta.example.com (http or https, a host, no user, query or fragment)"
        ));
        None
    }
}

/// The TLS settings: both files or neither. Without TLS, a gateway with tokens serves plain HTTP
/// only on a loopback address unless told `DELTA_GATEWAY_PLAIN_HTTP=any` (TLS ends in front of
/// it): elsewhere its bearer tokens and tickets would cross the network in clear.
fn tls_settings(
    s: &mut Settings,
    addr: Option<SocketAddr>,
    has_tokens: bool,
) -> Option<crate::tls::ServerConfig> {
    let (cert, cert_from) = s.get("DELTA_GATEWAY_TLS_CERT");
    let (key, key_from) = s.get("DELTA_GATEWAY_TLS_KEY");
    let (plain, plain_from) = s.get("DELTA_GATEWAY_PLAIN_HTTP");
    let plain_anywhere = match plain.as_str() {
        "loopback" => false,
        "any" => true,
        other => {
            s.errors.push(format!(
                "{plain_from}: `{other}` is not `loopback` (the default: plain HTTP on a loopback address only) or `any` (TLS ends in a proxy in front of the gateway)"
            ));
            false
        }
    };
    match (cert.is_empty(), key.is_empty()) {
        (false, false) => {
            match crate::tls::load(std::path::Path::new(&cert), std::path::Path::new(&key)) {
                Ok(config) => Some(config),
                Err(e) => {
                    s.errors.push(e);
                    None
                }
            }
        }
        (true, true) => {
            let exposed = addr.is_some_and(|a| !a.ip().is_loopback());
            if exposed && has_tokens && !plain_anywhere {
                s.errors.push(format!(
                    "{} is not a loopback address and there is no TLS: bearer tokens and stream tickets would cross the network in clear. Set DELTA_GATEWAY_TLS_CERT and DELTA_GATEWAY_TLS_KEY (PEM files), or, if a proxy or load balancer in front terminates TLS, say so with DELTA_GATEWAY_PLAIN_HTTP=any (--plain-http any; docs/security.md)",
                    addr.map(|a| a.to_string()).unwrap_or_default()
                ));
            }
            None
        }
        (false, true) => {
            s.errors.push(format!(
                "{cert_from} is set but DELTA_GATEWAY_TLS_KEY (--tls-key) is not: give both (the certificate chain and its private key, PEM), or neither"
            ));
            None
        }
        (true, false) => {
            s.errors.push(format!(
                "{key_from} is set but DELTA_GATEWAY_TLS_CERT (--tls-cert) is not: give both (the certificate chain and its private key, PEM), or neither"
            ));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_hides_the_servers_passwords() {
        let c = Config::local(
            "nats://g:nats-s3cret@10.0.0.1:4222",
            "redis://g:redis-s3cret@10.0.0.2:6379",
            "p",
            PathBuf::from("/agents"),
        );
        let shown = format!("{c:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("10.0.0.2:6379"), "{shown}");
    }

    #[test]
    fn every_bad_value_is_reported_at_once() {
        let env: HashMap<String, String> = [
            ("DELTA_GATEWAY_ADDR", "localhost"),
            ("DELTA_GATEWAY_TOKENS_FILE", "/no/such/tokens.yaml"),
            ("DELTA_RECONCILE_MS", "0"),
            ("DELTA_RETENTION", "a week"),
            // Numbers that would overflow a clock's sum or a semaphore: refused.
            ("DELTA_MAX_CONNECTIONS", "9999999999999999999"),
            ("DELTA_LOST_JOB_S", "9223372036854775807"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let args: Vec<String> = ["--nats-url", "http://x", "--agents-dir", "/no/such"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let errs = parse(&args, &env).expect_err("invalid");
        for needle in [
            "--nats-url",
            "--agents-dir",
            "DELTA_GATEWAY_ADDR",
            "tokens.yaml",
            "DELTA_RECONCILE_MS",
            "DELTA_RETENTION",
            "DELTA_MAX_CONNECTIONS",
            "DELTA_LOST_JOB_S",
        ] {
            assert!(
                errs.iter().any(|e| e.contains(needle)),
                "{needle} in {errs:#?}"
            );
        }
        assert_eq!(errs.len(), 8, "{errs:#?}");
    }

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        let agents = std::env::temp_dir().display().to_string();
        let mut env: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        env.entry("DELTA_AGENTS_DIR".to_owned()).or_insert(agents);
        env
    }

    #[test]
    fn an_answer_waits_fifty_ms_for_its_question_zero_waits_none_and_too_long_is_refused() {
        let off = ("DELTA_GATEWAY_AUTH", "off");
        let default = parse(&[], &env(&[off])).expect("valid");
        assert_eq!(default.question_wait, Duration::from_millis(50));
        let none = parse(&[], &env(&[off, ("DELTA_QUESTION_WAIT_MS", "0")])).expect("valid");
        assert_eq!(none.question_wait, Duration::ZERO);
        let flag: Vec<String> = vec!["--question-wait-ms".into(), "200".into()];
        assert_eq!(
            parse(&flag, &env(&[off])).expect("valid").question_wait,
            Duration::from_millis(200)
        );
        for bad in ["10001", "soon", "-5"] {
            let errs =
                parse(&[], &env(&[off, ("DELTA_QUESTION_WAIT_MS", bad)])).expect_err("refused");
            assert!(
                errs.len() == 1 && errs[0].contains("DELTA_QUESTION_WAIT_MS"),
                "{bad}: {errs:#?}"
            );
        }
    }

    #[test]
    fn the_question_cache_is_sixteen_mib_zero_keeps_none_and_too_much_is_refused() {
        let off = ("DELTA_GATEWAY_AUTH", "off");
        let default = parse(&[], &env(&[off])).expect("valid");
        assert_eq!(default.question_cache_bytes, 16 << 20);
        let none = parse(&[], &env(&[off, ("DELTA_QUESTION_CACHE_MIB", "0")])).expect("valid");
        assert_eq!(none.question_cache_bytes, 0);
        let flag: Vec<String> = vec!["--question-cache-mib".into(), "2".into()];
        let two = parse(&flag, &env(&[off])).expect("valid");
        assert_eq!(two.question_cache_bytes, 2 << 20);
        for bad in ["65537", "lots", "-1"] {
            let errs =
                parse(&[], &env(&[off, ("DELTA_QUESTION_CACHE_MIB", bad)])).expect_err("refused");
            assert!(
                errs.len() == 1 && errs[0].contains("DELTA_QUESTION_CACHE_MIB"),
                "{bad}: {errs:#?}"
            );
        }
    }

    #[test]
    fn tokens_cross_plain_http_only_on_loopback_unless_told() {
        let token = ("DELTA_GATEWAY_TOKEN", "operator-token-0123456789");
        let errs = parse(&[], &env(&[token, ("DELTA_GATEWAY_ADDR", "0.0.0.0:8080")]))
            .expect_err("plain HTTP with tokens on 0.0.0.0");
        assert!(
            errs.len() == 1
                && errs[0].contains("DELTA_GATEWAY_TLS_CERT")
                && errs[0].contains("DELTA_GATEWAY_PLAIN_HTTP=any"),
            "{errs:#?}"
        );
        let told = parse(
            &[],
            &env(&[
                token,
                ("DELTA_GATEWAY_ADDR", "0.0.0.0:8080"),
                ("DELTA_GATEWAY_PLAIN_HTTP", "any"),
            ]),
        )
        .expect("told: TLS ends in front");
        assert!(told.tls.is_none());
        let local = parse(
            &[],
            &env(&[token, ("DELTA_GATEWAY_ADDR", "127.0.0.1:8080")]),
        )
        .expect("loopback");
        assert!(local.tls.is_none());
        assert_eq!(local.stream_ticket_ttl, Duration::from_secs(30));
    }

    #[test]
    fn tls_needs_both_files_and_readable_ones() {
        let token = ("DELTA_GATEWAY_TOKEN", "operator-token-0123456789");
        let errs = parse(
            &[],
            &env(&[token, ("DELTA_GATEWAY_TLS_CERT", "/no/cert.pem")]),
        )
        .expect_err("a cert without a key");
        assert!(
            errs.iter()
                .any(|e| e.contains("DELTA_GATEWAY_TLS_KEY (--tls-key) is not")),
            "{errs:#?}"
        );
        let errs = parse(
            &[],
            &env(&[
                token,
                ("DELTA_GATEWAY_TLS_CERT", "/no/cert.pem"),
                ("DELTA_GATEWAY_TLS_KEY", "/no/key.pem"),
                ("DELTA_GATEWAY_PLAIN_HTTP", "sometimes"),
                ("DELTA_STREAM_TICKET_TTL_S", "3600"),
            ]),
        )
        .expect_err("unreadable files");
        for needle in ["/no/cert.pem", "sometimes", "at most 300"] {
            assert!(
                errs.iter().any(|e| e.contains(needle)),
                "{needle} in {errs:#?}"
            );
        }
    }
}
