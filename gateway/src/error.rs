//! The one error of the HTTP API and the bot bridge: `{"error": {"code", "message"}}` with the
//! status its [`ErrorCode`] has (`delta-api` decides it, in one place). Internals of a 5xx are
//! logged, not shown.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use delta_api::{ErrorBody, ErrorCode, ErrorResponse};
use delta_protocol::ResponseError;
use delta_queue as queue;
use delta_store as store;

/// A refusal: the contract's code, and a message that says what was wrong and what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::BadRequest, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message)
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Unavailable, message)
    }

    /// The HTTP status of the code.
    pub fn status(&self) -> StatusCode {
        // Every code's status is a valid one; 500 would only mean a typo in `delta-api`.
        StatusCode::from_u16(self.code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// The JSON body's `error` (also the `error` of a bot's reply).
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            code: self.code,
            message: self.message.clone(),
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let unauthorized = self.code == ErrorCode::Unauthorized;
        let body = ErrorResponse {
            error: ErrorBody {
                code: self.code,
                message: self.message,
            },
        };
        let mut response = (status, axum::Json(body)).into_response();
        if unauthorized {
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
        let code = match &e {
            ResponseError::NotFound(_) => ErrorCode::NotFound,
            ResponseError::AlreadyResolved(_) => ErrorCode::AlreadyResolved,
            ResponseError::Expired { .. } => ErrorCode::Expired,
            ResponseError::InvalidOption { .. } => ErrorCode::InvalidOption,
            ResponseError::InputRequired(_) | ResponseError::EmptyInput => ErrorCode::InputRequired,
            ResponseError::InvalidArgs(_) => ErrorCode::InvalidArgs,
            ResponseError::NotAllowed(_) => ErrorCode::Forbidden,
            ResponseError::Stale(_) => ErrorCode::Stale,
            ResponseError::Claimed { .. } => ErrorCode::Claimed,
            ResponseError::AlreadyVoted(_) => ErrorCode::AlreadyVoted,
            ResponseError::InvalidData(_) => ErrorCode::InvalidData,
        };
        Self::new(code, e.to_string())
    }
}

impl From<store::Error> for ApiError {
    fn from(e: store::Error) -> Self {
        match e {
            store::Error::NotFound(run) => Self::not_found(format!("no run {run}")),
            store::Error::Terminal { run_id, status } => Self::new(
                ErrorCode::AlreadyResolved,
                format!("run {run_id} is already {status}"),
            ),
            store::Error::Claimed(c) => Self::new(
                ErrorCode::Claimed,
                format!(
                    "this question is claimed by {} until {}: only they may answer until then",
                    c.by, c.until
                ),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The protocol names each refusal's code as a string; it must be the code the gateway sends.
    #[test]
    fn response_errors_keep_the_protocols_code() {
        let rid = delta_protocol::RequestId::new();
        for e in [
            ResponseError::NotFound("x".into()),
            ResponseError::AlreadyResolved(rid),
            ResponseError::Expired {
                request_id: rid,
                expires_at: delta_protocol::Timestamp::now(),
            },
            ResponseError::InvalidOption {
                given: "a".into(),
                valid: "b".into(),
            },
            ResponseError::InputRequired("o".into()),
            ResponseError::EmptyInput,
            ResponseError::InvalidArgs("x".into()),
            ResponseError::NotAllowed("bob".into()),
            ResponseError::Stale(rid),
            ResponseError::Claimed {
                request_id: rid,
                by: "ada".into(),
                until: delta_protocol::Timestamp::now(),
            },
            ResponseError::AlreadyVoted("ada".into()),
            ResponseError::InvalidData(delta_protocol::schema::FieldError {
                field: Some("email".into()),
                message: "is required".into(),
            }),
        ] {
            let code = e.code();
            assert_eq!(ApiError::from(e).code.as_str(), code);
        }
    }
}
