//! What a gateway or a worker is started with, passed to the real programs as the `DELTA_*`
//! settings they read (their `--help` lists them). Every other `DELTA_*` variable of the
//! caller's environment is removed, so that a process runs with exactly its spec.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::process::{Output, Process};
use crate::{Error, Programs};

/// A gateway's settings.
#[derive(Clone, Debug)]
pub struct GatewaySpec {
    /// The servers, logged in as the gateway.
    pub nats_url: String,
    pub redis_url: String,
    /// The same servers logged in as a worker, for [`WorkerSpec::joining`].
    pub worker_nats_url: String,
    pub worker_redis_url: String,
    /// CA certificates (PEM) of the servers' TLS certificates, for gateways and workers.
    pub ca_file: Option<PathBuf>,
    pub prefix: String,
    pub agents_dir: PathBuf,
    pub port: u16,
    /// A tokens file: authentication on.
    pub tokens_file: Option<PathBuf>,
    /// `DELTA_GATEWAY_TOKEN`, one token with every role: authentication on. With neither this
    /// nor a tokens file, the gateway runs without authentication, said so explicitly
    /// (`DELTA_GATEWAY_AUTH=off`), which it allows on its loopback address only.
    pub operator_token: Option<String>,
    /// `DELTA_SECRETS_KEY`, 64 hex digits.
    pub secrets_key_hex: Option<String>,
    pub reconcile_ms: u64,
    pub resume_check_s: u64,
    pub lost_job_s: u64,
    pub max_body_bytes: usize,
    /// `DELTA_FAILPOINT`: the process exits hard at that point (a crash on cue).
    pub failpoint: Option<String>,
    /// Any other of the gateway's settings, by environment name (`DELTA_MAX_CONNECTIONS`, …).
    pub extra: Vec<(&'static str, String)>,
    /// HTTPS instead of plain HTTP: the gateway's certificate and key, and the CA that signed
    /// the certificate (to check readiness, and for clients of [`GatewaySpec::url`]).
    pub tls: Option<GatewayTls>,
}

/// A gateway's TLS files (PEM). The certificate must name `127.0.0.1` (or `localhost`): the
/// gateway listens there and [`GatewaySpec::url`] says so.
#[derive(Clone, Debug)]
pub struct GatewayTls {
    /// `DELTA_GATEWAY_TLS_CERT`: the certificate chain.
    pub cert: PathBuf,
    /// `DELTA_GATEWAY_TLS_KEY`: its private key.
    pub key: PathBuf,
    /// The certificate authority that signed `cert`.
    pub ca: PathBuf,
}

impl GatewaySpec {
    /// A gateway on `port` of the fleet on these servers, logged in as its role (and its
    /// workers as theirs), with the production defaults.
    pub fn on(
        nats: &crate::Nats,
        redis: &crate::Redis,
        prefix: &str,
        agents_dir: PathBuf,
        port: u16,
    ) -> Self {
        use crate::{NatsRole, RedisRole};
        Self {
            worker_nats_url: nats.url_as(NatsRole::Worker),
            worker_redis_url: redis.url_as(RedisRole::Worker),
            ..Self::new(
                &nats.url_as(NatsRole::Gateway),
                &redis.url_as(RedisRole::Gateway),
                prefix,
                agents_dir,
                port,
            )
        }
    }

    /// A gateway on `port` with the production defaults, its workers on the same URLs.
    pub fn new(
        nats_url: &str,
        redis_url: &str,
        prefix: &str,
        agents_dir: PathBuf,
        port: u16,
    ) -> Self {
        Self {
            nats_url: nats_url.to_owned(),
            redis_url: redis_url.to_owned(),
            worker_nats_url: nats_url.to_owned(),
            worker_redis_url: redis_url.to_owned(),
            ca_file: None,
            prefix: prefix.to_owned(),
            agents_dir,
            port,
            tokens_file: None,
            operator_token: None,
            secrets_key_hex: None,
            reconcile_ms: 1000,
            resume_check_s: 5,
            lost_job_s: 60,
            max_body_bytes: 1 << 20,
            failpoint: None,
            extra: vec![],
            tls: None,
        }
    }

    /// Where the gateway listens: `https://127.0.0.1:<port>` with TLS, else `http://…`.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    fn settings(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("DELTA_NATS_URL", self.nats_url.clone()),
            ("DELTA_REDIS_URL", self.redis_url.clone()),
            ("DELTA_KEY_PREFIX", self.prefix.clone()),
            ("DELTA_AGENTS_DIR", self.agents_dir.display().to_string()),
            ("DELTA_GATEWAY_ADDR", format!("127.0.0.1:{}", self.port)),
            ("DELTA_RECONCILE_MS", self.reconcile_ms.to_string()),
            ("DELTA_RESUME_CHECK_S", self.resume_check_s.to_string()),
            ("DELTA_LOST_JOB_S", self.lost_job_s.to_string()),
            ("DELTA_MAX_BODY_BYTES", self.max_body_bytes.to_string()),
        ];
        env.extend(ca_settings(self.ca_file.as_ref()));
        if let Some(f) = &self.tokens_file {
            env.push(("DELTA_GATEWAY_TOKENS_FILE", f.display().to_string()));
        }
        if let Some(t) = &self.operator_token {
            env.push(("DELTA_GATEWAY_TOKEN", t.clone()));
        }
        if self.tokens_file.is_none() && self.operator_token.is_none() {
            env.push(("DELTA_GATEWAY_AUTH", "off".to_owned()));
        }
        if let Some(k) = &self.secrets_key_hex {
            env.push(("DELTA_SECRETS_KEY", k.clone()));
        }
        if let Some(f) = &self.failpoint {
            env.push(("DELTA_FAILPOINT", f.clone()));
        }
        if let Some(tls) = &self.tls {
            env.push(("DELTA_GATEWAY_TLS_CERT", tls.cert.display().to_string()));
            env.push(("DELTA_GATEWAY_TLS_KEY", tls.key.display().to_string()));
        }
        env.extend(self.extra.iter().cloned());
        env
    }

    /// Starts `delta-gateway` as `name` and waits (up to 30 s) until it answers `/readyz`,
    /// failing early, with the end of its log, if it exits meanwhile.
    pub async fn start(
        &self,
        programs: &Programs,
        name: &str,
        out: &Output,
    ) -> Result<GatewayProcess, Error> {
        let tls = match &self.tls {
            Some(t) => Some(tls_client(&t.ca)?),
            None => None,
        };
        let mut cmd = Command::new(&programs.gateway);
        configure(&mut cmd, &self.settings(), out);
        let mut process = Process::spawn(name, &mut cmd, out)?;
        let port = self.port;
        process
            .wait_ready_async(Duration::from_secs(30), || {
                http_ok(port, "/readyz", tls.clone())
            })
            .await?;
        Ok(GatewayProcess {
            process,
            url: self.url(),
        })
    }
}

/// A worker's settings.
#[derive(Clone, Debug)]
pub struct WorkerSpec {
    pub nats_url: String,
    pub redis_url: String,
    pub prefix: String,
    pub agents_dir: PathBuf,
    pub work_dir: PathBuf,
    pub concurrency: usize,
    pub ack_wait_ms: u64,
    pub max_deliver: i64,
    pub grace_ms: u64,
    /// Its name (a generated one when empty).
    pub worker_id: String,
    /// `DELTA_SECRETS_KEY`, 64 hex digits.
    pub secrets_key_hex: Option<String>,
    /// CA certificates (PEM) of the servers' TLS certificates.
    pub ca_file: Option<PathBuf>,
    /// Any other variables of the worker's environment, by name: its other settings
    /// (`DELTA_RETENTION`, …), or host variables such as an LLM's API key.
    pub extra: Vec<(&'static str, String)>,
}

/// `DELTA_NATS_CA_FILE` and `DELTA_REDIS_CA_FILE`, when there is one.
fn ca_settings(ca: Option<&PathBuf>) -> Vec<(&'static str, String)> {
    ca.map(|f| {
        vec![
            ("DELTA_NATS_CA_FILE", f.display().to_string()),
            ("DELTA_REDIS_CA_FILE", f.display().to_string()),
        ]
    })
    .unwrap_or_default()
}

impl WorkerSpec {
    /// A worker of the same fleet as `gateway` (its servers, prefix, agents and secrets key),
    /// with its runs' work directories under `work_dir`, with the production defaults (16 slots, `ack_wait` 30 s,
    /// 5 deliveries, 20 s of grace); named when started.
    pub fn joining(gateway: &GatewaySpec, work_dir: PathBuf) -> Self {
        Self {
            nats_url: gateway.worker_nats_url.clone(),
            redis_url: gateway.worker_redis_url.clone(),
            ca_file: gateway.ca_file.clone(),
            prefix: gateway.prefix.clone(),
            agents_dir: gateway.agents_dir.clone(),
            work_dir,
            concurrency: 16,
            ack_wait_ms: 30_000,
            max_deliver: 5,
            grace_ms: 20_000,
            worker_id: String::new(),
            secrets_key_hex: gateway.secrets_key_hex.clone(),
            extra: vec![],
        }
    }

    fn settings(&self) -> Vec<(&'static str, String)> {
        let secs = |ms: u64| format!("{}.{:03}", ms / 1000, ms % 1000);
        let mut env = vec![
            ("DELTA_NATS_URL", self.nats_url.clone()),
            ("DELTA_REDIS_URL", self.redis_url.clone()),
            ("DELTA_KEY_PREFIX", self.prefix.clone()),
            ("DELTA_AGENTS_DIR", self.agents_dir.display().to_string()),
            ("DELTA_WORK_DIR", self.work_dir.display().to_string()),
            ("DELTA_WORKER_CONCURRENCY", self.concurrency.to_string()),
            ("DELTA_ACK_WAIT_S", secs(self.ack_wait_ms)),
            ("DELTA_MAX_DELIVER", self.max_deliver.to_string()),
            ("DELTA_GRACE_S", secs(self.grace_ms)),
            ("DELTA_WORKER_ID", self.worker_id.clone()),
        ];
        if let Some(k) = &self.secrets_key_hex {
            env.push(("DELTA_SECRETS_KEY", k.clone()));
        }
        env.extend(ca_settings(self.ca_file.as_ref()));
        env.extend(self.extra.iter().cloned());
        env
    }

    /// Starts `delta-worker` as `id` (its name in the fleet and its `DELTA_WORKER_ID`).
    pub fn start(&self, programs: &Programs, id: &str, out: &Output) -> Result<Process, Error> {
        let spec = WorkerSpec {
            worker_id: id.to_owned(),
            ..self.clone()
        };
        let mut cmd = Command::new(&programs.worker);
        configure(&mut cmd, &spec.settings(), out);
        Process::spawn(id, &mut cmd, out)
    }
}

/// The child's environment: the caller's without its `DELTA_*` variables, then `settings`, the
/// log filter and the span file.
fn configure(cmd: &mut Command, settings: &[(&'static str, String)], out: &Output) {
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("DELTA_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(settings.iter().map(|(k, v)| (k, v)))
        .env("DELTA_LOG", out.filter.as_deref().unwrap_or("info"))
        .env("NO_COLOR", "1");
    if let Some(spans) = &out.spans {
        cmd.env("DELTA_SPANS_FILE", spans);
    }
}

/// A TLS client that trusts only the CA in the PEM file `ca` (ring, like the rest of the
/// workspace).
fn tls_client(ca: &std::path::Path) -> Result<tokio_rustls::TlsConnector, Error> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let io = |what: String| {
        move |e: std::io::Error| Error::Io {
            what: what.clone(),
            source: e,
        }
    };
    let pem = std::fs::read(ca).map_err(io(format!("cannot read the CA {}", ca.display())))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
            .map_err(io(format!("{}: not a PEM certificate", ca.display())))?;
        roots
            .add(cert)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
            .map_err(io(format!("{}: not a usable CA certificate", ca.display())))?;
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| std::io::Error::other(e.to_string()))
    .map_err(io("cannot set up TLS".to_owned()))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(std::sync::Arc::new(
        config,
    )))
}

/// Whether `GET <path>` on the local `port` answers 200 (over TLS with `tls`).
async fn http_ok(port: u16, path: &str, tls: Option<tokio_rustls::TlsConnector>) -> bool {
    async fn get<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
        mut s: S,
        path: &str,
    ) -> std::io::Result<bool> {
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
        let mut head = [0u8; 12];
        s.read_exact(&mut head).await?;
        Ok(head.ends_with(b" 200"))
    }
    let get = async {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        match tls {
            None => get(tcp, path).await,
            Some(connector) => {
                let name =
                    rustls::pki_types::ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
                get(connector.connect(name, tcp).await?, path).await
            }
        }
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), get).await,
        Ok(Ok(true))
    )
}

/// A gateway process, killed on drop.
#[derive(Debug)]
pub struct GatewayProcess {
    pub process: Process,
    pub url: String,
}

impl GatewayProcess {
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Waits for the process to exit by itself (a failpoint) and returns its code.
    pub fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        self.process.wait_exit(within).and_then(|s| s.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value<'a>(settings: &'a [(&'static str, String)], name: &str) -> Option<&'a str> {
        settings
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn a_worker_gets_its_fleet_and_durations_in_seconds_with_a_fraction() {
        let mut gateway = GatewaySpec::new("nats://n", "redis://r", "p", "/agents".into(), 8080);
        gateway.secrets_key_hex = Some("ab".repeat(32));
        let worker = WorkerSpec {
            ack_wait_ms: 2000,
            grace_ms: 500,
            extra: vec![("OPENAI_API_KEY", "sk-x".into())],
            ..WorkerSpec::joining(&gateway, "/work".into())
        };
        let s = worker.settings();
        assert_eq!(value(&s, "DELTA_ACK_WAIT_S"), Some("2.000"));
        assert_eq!(value(&s, "DELTA_GRACE_S"), Some("0.500"));
        assert_eq!(value(&s, "DELTA_KEY_PREFIX"), Some("p"));
        assert_eq!(
            value(&s, "DELTA_SECRETS_KEY"),
            Some("ab".repeat(32).as_str())
        );
        assert_eq!(value(&s, "OPENAI_API_KEY"), Some("sk-x"), "extra variables");
        let g = gateway.settings();
        assert_eq!(value(&g, "DELTA_GATEWAY_ADDR"), Some("127.0.0.1:8080"));
        assert_eq!(value(&g, "DELTA_GATEWAY_TOKENS_FILE"), None);
        assert_eq!(value(&g, "DELTA_FAILPOINT"), None);
    }
}
