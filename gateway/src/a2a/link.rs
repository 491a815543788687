//! The one-time inbox link an `auth-required` status carries ([`crate::links`]), and the
//! gateway's address for the agent card.

use axum::http::HeaderMap;

use delta_protocol::{RequestId, RunId, Via};

use crate::Gateway;
use crate::auth::{Identity, Role};
use crate::error::ApiError;

/// A one-time link for `identity` to answer `request_id` of `run_id` in the inbox, recorded as
/// an A2A answer, the same one at every read while it works ([`crate::links::shown_link`]);
/// `None` for a caller that may not answer (a reader still sees the task).
pub async fn answer_link(
    gw: &Gateway,
    headers: &HeaderMap,
    identity: &Identity,
    run_id: RunId,
    request_id: RequestId,
) -> Result<Option<String>, ApiError> {
    if !identity.has(Role::Answer) {
        return Ok(None);
    }
    crate::links::shown_link(gw, headers, identity, None, Via::A2a, run_id, request_id)
        .await
        .map(Some)
}

/// The gateway's address as links give it (`DELTA_PUBLIC_URL`, else the scheme it serves and
/// the client's `Host`); `http://localhost` for a request without a usable `Host`.
pub fn base_url(gw: &Gateway, headers: &HeaderMap) -> String {
    crate::links::base_url(gw, headers).unwrap_or_else(|_| "http://localhost".to_owned())
}
