//! Gateways as real `delta-gateway` processes (from the launcher, so tests can kill them), and
//! a small HTTP client for their API.

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use delta_launcher::{GatewayProcess, GatewaySpec as Spec, Output};
use serde_json::Value;

/// A gateway spec on a free port with fast reconcilers, for the servers and prefix given, with
/// the example agents.
pub fn spec(nats: &crate::Nats, redis: &crate::Redis, prefix: &str) -> Spec {
    Spec {
        reconcile_ms: 200,
        resume_check_s: 1,
        lost_job_s: 3,
        max_body_bytes: 64 * 1024,
        ..Spec::new(
            &nats.url(),
            &redis.url(),
            prefix,
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/agents"),
            crate::free_port().expect("free port"),
        )
    }
}

/// Starts a gateway process and waits until it is ready.
pub async fn spawn(spec: &Spec, log: Option<&Path>) -> GatewayProcess {
    // `DELTA_E2E_GATEWAY_LOG=<file>` keeps every gateway's log when none is given (debugging).
    let env_log = std::env::var_os("DELTA_E2E_GATEWAY_LOG").map(PathBuf::from);
    let output = Output {
        log: log.map(Path::to_path_buf).or(env_log),
        ..Default::default()
    };
    spawn_with(spec, &output).await
}

/// Starts a gateway process reporting as `output` says (log file, filter, spans), and waits
/// until it is ready.
pub async fn spawn_with(spec: &Spec, output: &Output) -> GatewayProcess {
    let name = format!("gateway-{}", spec.port);
    spec.start(&crate::workers::programs(), &name, output)
        .await
        .unwrap_or_else(|e| panic!("starting {name}: {}", e.chain()))
}

/// A small JSON client of the gateway's API: `(status, body)` for every call.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Client {
    pub fn new(base: &str, token: Option<&str>) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        Self {
            http: reqwest::Client::new(),
            base: base.trim_end_matches('/').to_owned(),
            token: token.map(str::to_owned),
        }
    }

    /// The same gateway with another token (or none).
    pub fn with_token(&self, token: Option<&str>) -> Self {
        Self {
            token: token.map(str::to_owned),
            ..self.clone()
        }
    }

    fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    async fn send(r: reqwest::RequestBuilder) -> Result<(u16, Value), reqwest::Error> {
        let resp = r.send().await?;
        let status = resp.status().as_u16();
        let text = resp.text().await?;
        Ok((
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        ))
    }

    pub async fn get(&self, path: &str) -> Result<(u16, Value), reqwest::Error> {
        Self::send(self.req(reqwest::Method::GET, path)).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Result<(u16, Value), reqwest::Error> {
        Self::send(self.req(reqwest::Method::POST, path).json(body)).await
    }

    /// POSTs raw bytes (malformed bodies).
    pub async fn post_raw(
        &self,
        path: &str,
        body: Vec<u8>,
        headers: &[(&str, &str)],
    ) -> Result<(u16, Value), reqwest::Error> {
        let mut r = self
            .req(reqwest::Method::POST, path)
            .header("content-type", "application/json")
            .body(body);
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        Self::send(r).await
    }

    /// An SSE stream: the response, to be read with [`SseReader`].
    pub async fn sse(
        &self,
        path: &str,
        last_event_id: Option<u64>,
    ) -> Result<SseReader, reqwest::Error> {
        let mut r = self
            .req(reqwest::Method::GET, path)
            .header("accept", "text/event-stream");
        if let Some(id) = last_event_id {
            r = r.header("last-event-id", id.to_string());
        }
        Ok(SseReader {
            resp: r.send().await?,
            buf: String::new(),
        })
    }
}

/// One server-sent event.
#[derive(Clone, Debug, Default)]
pub struct SseEvent {
    pub id: Option<String>,
    pub event: String,
    pub data: String,
}

/// Reads events off an SSE response.
pub struct SseReader {
    resp: reqwest::Response,
    buf: String,
}

impl SseReader {
    pub fn status(&self) -> u16 {
        self.resp.status().as_u16()
    }

    /// The next event (comments skipped), or `None` at the end of the stream or after `within`.
    pub async fn next(&mut self, within: Duration) -> Option<SseEvent> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut ev = SseEvent::default();
                let mut data = vec![];
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        ev.id = Some(v.trim().to_owned());
                    } else if let Some(v) = line.strip_prefix("event:") {
                        ev.event = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push(v.strip_prefix(' ').unwrap_or(v).to_owned());
                    }
                }
                if ev.event.is_empty() && data.is_empty() {
                    continue;
                }
                ev.data = data.join("\n");
                return Some(ev);
            }
            let chunk = tokio::time::timeout_at(deadline, self.resp.chunk()).await;
            match chunk {
                Ok(Ok(Some(bytes))) => self.buf.push_str(&String::from_utf8_lossy(&bytes)),
                _ => return None,
            }
        }
    }
}
