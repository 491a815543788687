//! The grants endpoints' types (`GET /v1/grants`, `GET /v1/grants/{grant_id}`,
//! `DELETE /v1/grants/{grant_id}`) and their OpenAPI declarations (docs/protocol.md §6 "Grants").

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

pub use delta_protocol::grant::{ArgMatch, Grant, GrantRequest, GrantScope, GrantState};

/// A grant as the API shows it: the stored grant and where it stands now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GrantView {
    #[serde(flatten)]
    pub grant: Grant,
    /// `ACTIVE`, `REVOKED`, `EXPIRED` or `USED_UP`, as of the moment of the answer.
    pub state: GrantState,
}

/// `GET /v1/grants`: the grants, oldest first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GrantList {
    pub grants: Vec<GrantView>,
}

/// `GET /v1/grants`' query.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct GrantsQuery {
    /// Only this agent's grants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// Only the grants that approve calls of this run: its own of scope `run`, and those of
    /// scope `agent` of its agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// `active` (default), `revoked`, `expired`, `used_up` or `all`, any case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

/// The operations, declared for the document only (the handlers are the gateway's).
#[allow(dead_code)]
pub(crate) mod paths {
    use super::*;
    use crate::RequestId;

    /// List grants, oldest first
    ///
    /// Grants are made by approving a tool call with `data.grant` (docs/protocol.md §3
    /// "Grants"). `run=` lists those that approve calls of that run (needs the run to exist).
    #[utoipa::path(
        get, path = "/v1/grants", operation_id = "listGrants", tag = "interactions",
        params(GrantsQuery),
        responses((status = 200, description = "The grants.", body = GrantList)),
    )]
    fn list_grants() {}

    /// One grant, whatever its state
    #[utoipa::path(
        get, path = "/v1/grants/{grant_id}", operation_id = "getGrant", tag = "interactions",
        params(("grant_id" = RequestId, Path, description = "A grant id (the id of the approval that made it); not a UUID: `400 bad_request`.")),
        responses((status = 200, description = "The grant.", body = GrantView)),
    )]
    fn get_grant() {}

    /// Revoke a grant
    ///
    /// From this moment the grant approves nothing (a use and a revocation are atomic with each
    /// other). Its creator (the token that approved with it) or an `operate` token may revoke
    /// it; revoking a revoked grant answers it as it is, with who revoked it first.
    #[utoipa::path(
        delete, path = "/v1/grants/{grant_id}", operation_id = "revokeGrant", tag = "interactions",
        params(("grant_id" = RequestId, Path, description = "A grant id; not a UUID: `400 bad_request`.")),
        responses((status = 200, description = "Revoked.", body = GrantView)),
    )]
    fn revoke_grant() {}
}
