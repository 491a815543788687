//! A small client of the gateway's HTTP API (docs/protocol.md §6) for the operator commands.
//!
//! A call returns the body as its `delta-api` type together with the gateway's JSON as is (a
//! [`Reply`]: the type for reading, the JSON for `--json`), or an [`Error`] that already says
//! which exit code it means: the gateway refused (its `ErrorResponse`), the thing asked for does
//! not exist, or the gateway could not be reached (connection refused, timeout, a 5xx).

use std::time::Duration;

use reqwest::{Method, RequestBuilder, StatusCode, Url};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use delta_api::{ErrorCode, ErrorResponse};

/// How long a plain call may take (streams have no limit).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a call to the gateway did not give an answer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The gateway refused: a 4xx other than `not_found`.
    #[error("{}: {message}", code_or_status(*.code, *.status))]
    Refused {
        status: u16,
        /// The refusal's code; `None` when the body is not the API's error (a proxy's page, or a
        /// code newer than this CLI).
        code: Option<ErrorCode>,
        message: String,
    },
    /// A 404: no such run, request or endpoint.
    #[error("not_found: {message}")]
    NotFound { message: String },
    /// No connection, a timeout, or a 5xx (`unavailable`).
    #[error("{what}")]
    Unreachable {
        /// The gateway's base URL.
        url: String,
        /// What happened, for people.
        what: String,
        /// The gateway's error body, when it answered at all.
        body: Option<ErrorResponse>,
    },
}

/// A refusal's code as printed: the API's, else `http_<status>`.
fn code_or_status(code: Option<ErrorCode>, status: u16) -> String {
    code.map_or_else(|| format!("http_{status}"), |c| c.as_str().to_owned())
}

impl Error {
    /// The `{"error": {"code", "message"}}` document printed with `--json`: the gateway's own
    /// when it sent one, else the same shape with this CLI's codes (`unreachable`, `http_<status>`
    /// for a refusal that is not the API's, which is why this is not an `ErrorResponse`).
    pub fn json(&self) -> Value {
        let (code, message) = match self {
            Error::Refused {
                code,
                status,
                message,
            } => (code_or_status(*code, *status), message.clone()),
            Error::NotFound { message } => (ErrorCode::NotFound.to_string(), message.clone()),
            Error::Unreachable { body: Some(b), .. } => {
                return serde_json::to_value(b).unwrap_or_default();
            }
            Error::Unreachable { what, .. } => ("unreachable".to_owned(), what.clone()),
        };
        serde_json::json!({"error": {"code": code, "message": message}})
    }
}

/// A gateway's answer: its body as the API's type, and the JSON it came as (what `--json` prints,
/// as is: fields this CLI does not know included).
#[derive(Clone, Debug)]
pub struct Reply<T> {
    pub body: T,
    pub json: Value,
}

/// A handle on one gateway, with the caller's token.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: Url,
    token: Option<String>,
}

/// A URL as messages show it: without a user, a password, a query or a fragment (any of them
/// may hold a secret), parsed or not.
pub fn shown_url(url: &str) -> String {
    let cut = url.split(['?', '#']).next().unwrap_or_default();
    delta_protocol::without_credentials(cut)
}

impl Client {
    /// A client of the gateway at `base` (`http://host:port` or `https://…`, maybe with a path
    /// prefix). An `https://` gateway's certificate is checked against the system's roots and,
    /// when given, the CA certificates of the PEM file `ca` (`--gateway-ca`).
    pub fn new(
        base: &str,
        token: Option<String>,
        ca: Option<&std::path::Path>,
    ) -> Result<Self, String> {
        let shown = shown_url(base);
        let mut url = Url::parse(base).map_err(|e| {
            format!("--gateway-url / DELTA_GATEWAY_URL `{shown}` is not a URL ({e}); e.g. http://127.0.0.1:8080")
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!(
                "--gateway-url / DELTA_GATEWAY_URL `{shown}` must start with http:// or https://"
            ));
        }
        // Paths are joined below the base: make it a directory.
        if !url.path().ends_with('/') {
            let path = format!("{}/", url.path());
            url.set_path(&path);
        }
        // The workspace builds reqwest with rustls but no crypto provider: install ring once.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(concat!("delta-cli/", env!("CARGO_PKG_VERSION")));
        if let Some(ca) = ca {
            builder = builder.tls_certs_merge(ca_certificates(ca)?);
        }
        let http = builder
            .build()
            .map_err(|e| format!("cannot set up an HTTP client: {e}"))?;
        Ok(Self {
            http,
            base: url,
            token: token.filter(|t| !t.trim().is_empty()),
        })
    }

    /// The gateway's base URL for messages: as given, without a user, password or query.
    pub fn url(&self) -> String {
        let mut base = self.base.clone();
        let _ = base.set_username("");
        let _ = base.set_password(None);
        shown_url(base.as_str()).trim_end_matches('/').to_owned()
    }

    /// Whether calls carry a bearer token.
    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// Whether a token sent to this gateway would cross a network in clear: plain `http://` to a
    /// host other than this machine's loopback.
    pub fn token_in_clear(&self) -> bool {
        plain_off_loopback(&self.base)
    }

    fn request(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<RequestBuilder, Error> {
        let mut url =
            self.base
                .join(path.trim_start_matches('/'))
                .map_err(|e| Error::Unreachable {
                    url: self.url(),
                    what: format!("cannot build the URL of {path}: {e}"),
                    body: None,
                })?;
        if !query.is_empty() {
            url.query_pairs_mut()
                .extend_pairs(query.iter().map(|(k, v)| (*k, v.as_str())));
        }
        let r = self.http.request(method, url);
        Ok(match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        })
    }

    /// `GET path?query`: the JSON body as is, whatever its shape.
    pub async fn get(&self, path: &str, query: &[(&str, String)]) -> Result<Value, Error> {
        self.get_as(path, query).await.map(|r: Reply<Value>| r.json)
    }

    /// `POST path` with a JSON body and extra headers: the JSON body as is.
    pub async fn post(
        &self,
        path: &str,
        body: &Value,
        headers: &[(&str, &str)],
    ) -> Result<Value, Error> {
        self.post_as(path, body, headers)
            .await
            .map(|r: Reply<Value>| r.json)
    }

    /// `GET path?query`: the body as `T`.
    pub async fn get_as<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<Reply<T>, Error> {
        let r = self
            .request(Method::GET, path, query)?
            .timeout(CALL_TIMEOUT);
        self.send(r).await
    }

    /// `GET path?query` with the query string of one of the API's query types (`RunsQuery`…):
    /// the body as `T`.
    pub async fn get_with<Q: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        query: &Q,
    ) -> Result<Reply<T>, Error> {
        let pairs = query_pairs(query);
        let pairs: Vec<(&str, String)> =
            pairs.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        self.get_as(path, &pairs).await
    }

    /// `POST path` with a JSON body and extra headers: the reply's body as `T`.
    pub async fn post_as<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        headers: &[(&str, &str)],
    ) -> Result<Reply<T>, Error> {
        let mut r = self
            .request(Method::POST, path, &[])?
            .json(body)
            .timeout(CALL_TIMEOUT);
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        self.send(r).await
    }

    /// `DELETE path`: the reply's body as `T`.
    pub async fn delete_as<T: DeserializeOwned>(&self, path: &str) -> Result<Reply<T>, Error> {
        let r = self
            .request(Method::DELETE, path, &[])?
            .timeout(CALL_TIMEOUT);
        self.send(r).await
    }

    /// Opens a server-sent events stream, resuming after `last_event_id` when given.
    pub async fn sse(&self, path: &str, last_event_id: Option<u64>) -> Result<SseStream, Error> {
        let mut r = self
            .request(Method::GET, path, &[])?
            .header("accept", "text/event-stream");
        if let Some(id) = last_event_id {
            r = r.header("last-event-id", id.to_string());
        }
        let resp = r.send().await.map_err(|e| self.transport(e))?;
        if !resp.status().is_success() {
            let status = resp.status();
            let text = resp.text().await.unwrap_or_default();
            return Err(self.refusal(status, &text));
        }
        Ok(SseStream { resp, buf: vec![] })
    }

    async fn send<T: DeserializeOwned>(&self, r: RequestBuilder) -> Result<Reply<T>, Error> {
        let resp = r.send().await.map_err(|e| self.transport(e))?;
        let status = resp.status();
        let path = resp.url().path().to_owned();
        let text = resp.text().await.map_err(|e| self.transport(e))?;
        if !status.is_success() {
            return Err(self.refusal(status, &text));
        }
        let json: Value = serde_json::from_str(&text).map_err(|e| Error::Unreachable {
            url: self.url(),
            what: format!(
                "the gateway at {} answered {status} with a body that is not JSON ({e}); is DELTA_GATEWAY_URL a Delta gateway?",
                self.url()
            ),
            body: None,
        })?;
        let body = T::deserialize(&json).map_err(|e| Error::Unreachable {
            url: self.url(),
            what: format!(
                "the gateway at {} answered {path} with a body this delta cannot read ({e}); are the gateway and this CLI of the same version?",
                self.url()
            ),
            body: None,
        })?;
        Ok(Reply { body, json })
    }

    fn transport(&self, e: reqwest::Error) -> Error {
        let url = self.url();
        let why = if e.is_timeout() {
            "it did not answer in time".to_owned()
        } else if e.is_connect() {
            // The innermost cause says it best ("Connection refused", "dns error…").
            let mut source: &dyn std::error::Error = &e;
            while let Some(s) = source.source() {
                source = s;
            }
            let why = source.to_string();
            if why.to_lowercase().contains("certificate") {
                format!(
                    "{why} (a gateway with a certificate of your own CA: give that CA's PEM file with --gateway-ca or DELTA_GATEWAY_CA)"
                )
            } else {
                why
            }
        } else {
            e.to_string()
        };
        Error::Unreachable {
            what: format!(
                "cannot reach the gateway at {url}: {why}. Is it running? Set DELTA_GATEWAY_URL (or --gateway-url) to where it listens"
            ),
            url,
            body: None,
        }
    }

    fn refusal(&self, status: StatusCode, text: &str) -> Error {
        let body: Option<ErrorResponse> = serde_json::from_str(text).ok();
        let code = body.as_ref().map(|b| b.error.code);
        let message = body.as_ref().map_or_else(
            || {
                let t = text.trim();
                if t.is_empty() {
                    status.to_string()
                } else {
                    t.chars().take(300).collect()
                }
            },
            |b| b.error.message.clone(),
        );
        if status.is_server_error() {
            return Error::Unreachable {
                url: self.url(),
                what: format!(
                    "{}: {message} (gateway at {}; DELTA_GATEWAY_URL / --gateway-url)",
                    code.unwrap_or(ErrorCode::Unavailable),
                    self.url()
                ),
                body,
            };
        }
        if status == StatusCode::NOT_FOUND {
            return Error::NotFound { message };
        }
        Error::Refused {
            status: status.as_u16(),
            code,
            message,
        }
    }
}

/// The CA certificates of a PEM file (`--gateway-ca` / `DELTA_GATEWAY_CA`), or why not.
fn ca_certificates(file: &std::path::Path) -> Result<Vec<reqwest::Certificate>, String> {
    let pem = std::fs::read(file).map_err(|e| {
        format!(
            "--gateway-ca / DELTA_GATEWAY_CA {}: cannot read it ({e}); give the PEM file of the CA that signed the gateway's certificate",
            file.display()
        )
    })?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
        format!(
            "--gateway-ca / DELTA_GATEWAY_CA {}: not PEM certificates ({e}); give the CA's certificate, `-----BEGIN CERTIFICATE-----`",
            file.display()
        )
    })?;
    if certs.is_empty() {
        return Err(format!(
            "--gateway-ca / DELTA_GATEWAY_CA {}: holds no `-----BEGIN CERTIFICATE-----` block; give the CA's certificate in PEM",
            file.display()
        ));
    }
    Ok(certs)
}

/// A query type's parameters as name and text: its fields as it serializes them (absent ones are
/// left out by the type), numbers and booleans written out.
fn query_pairs<Q: Serialize>(query: &Q) -> Vec<(String, String)> {
    let Ok(Value::Object(fields)) = serde_json::to_value(query) else {
        return vec![];
    };
    fields
        .into_iter()
        .filter_map(|(k, v)| match v {
            Value::Null => None,
            Value::String(s) => Some((k, s)),
            other => Some((k, other.to_string())),
        })
        .collect()
}

/// One server-sent event.
pub use delta_api::sse::Event as SseEvent;

/// Reads events off an SSE response.
pub struct SseStream {
    resp: reqwest::Response,
    /// Bytes received and not yet parsed (a chunk may end inside a character or an event).
    buf: Vec<u8>,
}

impl SseStream {
    /// The next event (comments and keep-alives skipped); `None` when the stream ends or breaks.
    pub async fn next(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(ev) = self.take_event() {
                return Some(ev);
            }
            match self.resp.chunk().await {
                Ok(Some(bytes)) => self.buf.extend(bytes.iter().filter(|b| **b != b'\r')),
                _ => return None,
            }
        }
    }

    fn take_event(&mut self) -> Option<SseEvent> {
        delta_api::sse::take_event(&mut self.buf)
    }
}

/// Whether `url` is plain `http://` to a host other than this machine's loopback: what is sent
/// to it (a token) crosses a network in clear.
pub fn plain_off_loopback(url: &reqwest::Url) -> bool {
    let host = url.host_str().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    url.scheme() == "http" && !loopback
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_http_off_loopback_puts_a_token_in_clear() {
        let clear = |url: &str| {
            Client::new(url, Some("t".into()), None)
                .expect("a client")
                .token_in_clear()
        };
        assert!(clear("http://gateway.example:8080"));
        assert!(clear("http://10.0.0.7:8080/prefix"));
        assert!(!clear("https://gateway.example:8080"));
        assert!(!clear("http://127.0.0.1:8080"));
        assert!(!clear("http://localhost:8080"));
        assert!(!clear("http://[::1]:8080"));
    }

    #[test]
    fn the_gateway_url_is_shown_without_its_credentials() {
        let c = Client::new(
            "http://ops:s3cret@gw.example:8080/base?sig=s3cret",
            None,
            None,
        )
        .expect("a client");
        assert_eq!(c.url(), "http://gw.example:8080/base");
        for bad in ["ftp://ops:s3cret@gw.example", "http://ops:s3cret@[gw"] {
            let Err(e) = Client::new(bad, None, None) else {
                panic!("{bad} refused");
            };
            assert!(!e.contains("s3cret") && e.contains("gw"), "{e}");
        }
    }

    #[test]
    fn a_query_type_becomes_its_parameters() {
        let q = delta_api::InteractionsQuery {
            state: Some("pending".into()),
            kind: Some("USER_CHOICE".into()),
            limit: Some(500),
            ..Default::default()
        };
        let mut pairs = query_pairs(&q);
        pairs.sort();
        assert_eq!(
            pairs,
            [
                ("limit".to_owned(), "500".to_owned()),
                ("state".to_owned(), "pending".to_owned()),
                ("type".to_owned(), "USER_CHOICE".to_owned()),
            ]
        );
    }
}
