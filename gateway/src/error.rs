//! The one error of the HTTP API and the bot bridge: `{"error": {"code", "message"}}` with the
//! status PROTOCOL.md §6 gives each code. Internals of a 5xx are logged, not shown.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use delta_protocol::ResponseError;
use delta_queue as queue;
use delta_store as store;

/// A refusal: the contract's code, and a message that says what was wrong and what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new("bad_request", message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new("not_found", message)
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new("unavailable", message)
    }

    /// The HTTP status of the code.
    pub fn status(&self) -> StatusCode {
        match self.code {
            "bad_request" => StatusCode::BAD_REQUEST,
            "unauthorized" => StatusCode::UNAUTHORIZED,
            "forbidden" => StatusCode::FORBIDDEN,
            "not_found" => StatusCode::NOT_FOUND,
            "already_resolved" | "not_retryable" => StatusCode::CONFLICT,
            "expired" => StatusCode::GONE,
            "payload_too_large" => StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_option" | "input_required" | "invalid_args" => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            _ => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The JSON body (also the `error` of a bot's reply).
    pub fn body(&self) -> serde_json::Value {
        json!({"code": self.code, "message": self.message})
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response =
            (self.status(), axum::Json(json!({"error": self.body()}))).into_response();
        if self.code == "unauthorized" {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}

impl From<ResponseError> for ApiError {
    fn from(e: ResponseError) -> Self {
        Self::new(e.code(), e.to_string())
    }
}

impl From<store::Error> for ApiError {
    fn from(e: store::Error) -> Self {
        match e {
            store::Error::NotFound(run) => Self::not_found(format!("no run {run}")),
            store::Error::Terminal { run_id, status } => Self::new(
                "already_resolved",
                format!("run {run_id} is already {status}"),
            ),
            store::Error::NoSecretsKey => Self::unavailable(
                "this answer is sensitive and the gateway has no DELTA_SECRETS_KEY to seal it with; an operator must set the same key on gateways and workers",
            ),
            other => {
                tracing::error!(error = %delta_host::Chain(&other), "store failure");
                Self::unavailable("the run store (Redis) is unavailable; try again shortly")
            }
        }
    }
}

impl From<queue::Error> for ApiError {
    fn from(e: queue::Error) -> Self {
        tracing::error!(error = %delta_host::Chain(&e), "queue failure");
        Self::unavailable("the queue (NATS JetStream) is unavailable; try again shortly")
    }
}
