//! Gateways as real `delta-gateway` processes (from the launcher, so tests can kill them), and
//! a small HTTP client for their API.

use std::path::{Path, PathBuf};
use std::time::Duration;

use delta_api::{
    AnswerAccepted, AnswerBody, CancelBody, CancelResult, ErrorCode, ErrorResponse,
    InteractionPage, InteractionView, Journal, RequestId, RunAccepted, RunDetail, RunId,
    Submission,
};
pub use delta_launcher::{GatewayProcess, GatewaySpec as Spec, Output};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A gateway spec on a free port with fast reconcilers, for the servers and prefix given (each
/// role logged in as itself; a cluster's every node), with the example agents. The clusters'
/// own settings are the fleet's to add ([`crate::servers::cluster_settings`]).
pub fn spec(
    nats: &crate::servers::NatsServers,
    redis: &crate::servers::RedisServers,
    prefix: &str,
) -> Spec {
    use crate::{NatsRole, RedisRole};
    Spec {
        reconcile_ms: 200,
        resume_check_s: 1,
        lost_job_s: 3,
        max_body_bytes: 64 * 1024,
        worker_nats_url: nats.url_as(NatsRole::Worker),
        worker_redis_url: redis.url_as(RedisRole::Worker),
        ..Spec::new(
            &nats.url_as(NatsRole::Gateway),
            &redis.url_as(RedisRole::Gateway),
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

/// Why a typed call of [`Client`] gave no typed body.
#[derive(Debug)]
pub enum CallError {
    /// No HTTP answer at all.
    Http(reqwest::Error),
    /// The gateway refused, in the API's error shape.
    Refused { status: u16, error: ErrorResponse },
    /// An answer that is not the type expected (nor the API's error): the contract is broken.
    Unexpected {
        status: u16,
        body: Value,
        why: String,
    },
}

impl CallError {
    /// The refusal's code, if the gateway refused.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            CallError::Refused { error, .. } => Some(error.error.code),
            _ => None,
        }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Http(e) => write!(f, "no HTTP answer: {e}"),
            CallError::Refused { status, error } => {
                write!(f, "{status} {}: {}", error.error.code, error.error.message)
            }
            CallError::Unexpected { status, body, why } => {
                write!(f, "{status} with a body not of the API ({why}): {body}")
            }
        }
    }
}

impl std::error::Error for CallError {}

/// A small JSON client of the gateway's API: `(status, body)` for every call, as raw JSON (tests
/// assert on the wire on purpose); and typed calls (`*_as`, [`Client::submit`]…) that read the
/// bodies as `delta-api`'s types, so a test also proves the gateway keeps to the contract.
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

    /// The same gateway, trusting only the CA certificate(s) in `ca_pem` (a gateway started with
    /// [`Spec::tls`]).
    pub fn trusting(self, ca_pem: &[u8]) -> Self {
        let roots = reqwest::Certificate::from_pem_bundle(ca_pem).expect("a PEM CA");
        let http = reqwest::Client::builder()
            .tls_certs_only(roots)
            .build()
            .expect("an HTTPS client");
        Self { http, ..self }
    }

    /// A client of the gateway `spec` describes: trusting its CA when it serves HTTPS.
    pub fn of(spec: &Spec, url: &str, token: Option<&str>) -> Self {
        let client = Self::new(url, token);
        match &spec.tls {
            Some(tls) => client.trusting(&std::fs::read(&tls.ca).expect("the gateway's CA")),
            None => client,
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

    pub async fn delete(&self, path: &str) -> Result<(u16, Value), reqwest::Error> {
        Self::send(self.req(reqwest::Method::DELETE, path)).await
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

    /// A typed call: the body as `T` on a 2xx, else the API's refusal.
    async fn typed<T: DeserializeOwned>(r: reqwest::RequestBuilder) -> Result<T, CallError> {
        let (status, body) = Self::send(r).await.map_err(CallError::Http)?;
        if (200..300).contains(&status) {
            return T::deserialize(&body).map_err(|e| CallError::Unexpected {
                status,
                why: e.to_string(),
                body,
            });
        }
        match ErrorResponse::deserialize(&body) {
            Ok(error) => Err(CallError::Refused { status, error }),
            Err(e) => Err(CallError::Unexpected {
                status,
                why: e.to_string(),
                body,
            }),
        }
    }

    /// `GET path`, typed.
    pub async fn get_as<T: DeserializeOwned>(&self, path: &str) -> Result<T, CallError> {
        Self::typed(self.req(reqwest::Method::GET, path)).await
    }

    /// `POST path` with a typed body, typed.
    pub async fn post_as<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, CallError> {
        Self::typed(self.req(reqwest::Method::POST, path).json(body)).await
    }

    /// `DELETE path`, typed.
    pub async fn delete_as<T: DeserializeOwned>(&self, path: &str) -> Result<T, CallError> {
        Self::typed(self.req(reqwest::Method::DELETE, path)).await
    }

    /// `POST /v1/runs`.
    pub async fn submit(&self, submission: &Submission) -> Result<RunAccepted, CallError> {
        self.post_as("/v1/runs", submission).await
    }

    /// `GET /v1/runs/{run_id}`.
    pub async fn run(&self, run: RunId) -> Result<RunDetail, CallError> {
        self.get_as(&format!("/v1/runs/{run}")).await
    }

    /// `GET /v1/runs/{run_id}/journal` (the first 1000 events).
    pub async fn journal(&self, run: RunId) -> Result<Journal, CallError> {
        self.get_as(&format!("/v1/runs/{run}/journal")).await
    }

    /// `POST /v1/runs/{run_id}/cancel`.
    pub async fn cancel(
        &self,
        run: RunId,
        reason: Option<&str>,
    ) -> Result<CancelResult, CallError> {
        let body = CancelBody {
            reason: reason.map(str::to_owned),
        };
        self.post_as(&format!("/v1/runs/{run}/cancel"), &body).await
    }

    /// `GET /v1/interactions?<query>` (`query` without the `?`; empty: the pending ones).
    pub async fn interactions(&self, query: &str) -> Result<InteractionPage, CallError> {
        self.get_as(&format!("/v1/interactions?{query}")).await
    }

    /// `GET /v1/interactions/{request_id}`.
    pub async fn interaction(&self, rid: RequestId) -> Result<InteractionView, CallError> {
        self.get_as(&format!("/v1/interactions/{rid}")).await
    }

    /// `POST /v1/interactions/{request_id}/response`.
    pub async fn answer(
        &self,
        rid: RequestId,
        answer: &AnswerBody,
    ) -> Result<AnswerAccepted, CallError> {
        self.post_as(&format!("/v1/interactions/{rid}/response"), answer)
            .await
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
            buf: vec![],
        })
    }
}

/// One server-sent event.
pub use delta_api::sse::Event as SseEvent;

/// Reads events off an SSE response.
pub struct SseReader {
    resp: reqwest::Response,
    /// Bytes received and not yet parsed.
    buf: Vec<u8>,
}

impl SseReader {
    pub fn status(&self) -> u16 {
        self.resp.status().as_u16()
    }

    /// The next event (comments skipped), or `None` at the end of the stream or after `within`.
    pub async fn next(&mut self, within: Duration) -> Option<SseEvent> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(ev) = delta_api::sse::take_event(&mut self.buf) {
                return Some(ev);
            }
            let chunk = tokio::time::timeout_at(deadline, self.resp.chunk()).await;
            match chunk {
                Ok(Ok(Some(bytes))) => self.buf.extend(bytes.iter().filter(|b| **b != b'\r')),
                _ => return None,
            }
        }
    }
}
