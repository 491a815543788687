//! The inbox link an `auth-required` status carries, and the gateway's own address as a client
//! reached it.
//!
//! TEMPORARY: until the lead's `crate::links::answer_link` (one-time answer links) is on main,
//! this stand-in with the same signature links to the run's page in the inbox (not one-time).
//! Replace its body with a call to `crate::links::answer_link` when merging.

use axum::http::{HeaderMap, header};

use delta_protocol::{RequestId, RunId};

use crate::Gateway;
use crate::auth::Identity;
use crate::error::ApiError;

/// A link to answer `request_id` of `run_id` in the inbox, for `identity`.
pub async fn answer_link(
    gw: &Gateway,
    headers: &HeaderMap,
    _identity: &Identity,
    run_id: RunId,
    _request_id: RequestId,
) -> Result<String, ApiError> {
    Ok(format!("{}/runs/{run_id}", base_url(gw, headers)))
}

/// The gateway's address as the client named it: `https` with TLS on, and the `Host` header
/// (`localhost` when there is none).
pub fn base_url(gw: &Gateway, headers: &HeaderMap) -> String {
    let scheme = if gw.config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .filter(|h| {
            !h.is_empty()
                && h.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-.:[]".contains(c))
        })
        .unwrap_or("localhost");
    format!("{scheme}://{host}")
}
