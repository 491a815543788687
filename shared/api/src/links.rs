//! One-time answer links (`/v1/answer-links/…`, docs/protocols.md "Answer links"): what an agent
//! protocol gives its client instead of asking a sensitive question itself (MCP's URL-mode
//! elicitation, A2A's `auth-required`). The link opens the question in the inbox; the answer
//! goes from the browser to the gateway, never through the protocol's client.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{AnswerBody, InteractionView, RequestId, RunId, Timestamp};

/// The body of `POST /v1/answer-links/open`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LinkOpen {
    /// The link's secret: what follows `#link=` in its URL.
    #[schema(max_length = 128)]
    pub link: String,
}

/// What an answer link opens: one question, as the inbox shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct LinkView {
    pub run_id: RunId,
    pub request_id: RequestId,
    /// Whom the answer will be recorded as (the client the link was made for).
    pub responder: String,
    pub interaction: InteractionView,
    /// When the link stops working (`DELTA_ANSWER_LINK_TTL_S` after it was made).
    pub expires_at: Timestamp,
}

/// The body of `POST /v1/answer-links/answer`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LinkAnswer {
    #[schema(max_length = 128)]
    pub link: String,
    /// The answer, as `POST /v1/interactions/{request_id}/response` takes it (its `responder`
    /// must be absent: the link says who answers).
    pub answer: AnswerBody,
}

#[allow(dead_code)]
pub(crate) mod paths {
    use super::*;
    use crate::AnswerAccepted;

    /// Open an answer link
    ///
    /// Shows the one question a link was made for, without spending the link. No token: the
    /// link's secret (from its URL's fragment, which browsers never send) is the credential.
    #[utoipa::path(
        post, path = "/v1/answer-links/open", operation_id = "openAnswerLink", tag = "interactions",
        request_body = LinkOpen,
        responses((status = 200, description = "The question.", body = LinkView)),
    )]
    fn open_answer_link() {}

    /// Answer through an answer link
    ///
    /// Answers the link's question as the client the link was made for, through the same path
    /// as every answer (first answer wins). An accepted answer spends the link; a refused one
    /// (a bad value, say) leaves it usable until it expires.
    #[utoipa::path(
        post, path = "/v1/answer-links/answer", operation_id = "answerThroughLink", tag = "interactions",
        request_body = LinkAnswer,
        responses((status = 200, description = "Accepted.", body = AnswerAccepted)),
    )]
    fn answer_through_link() {}
}
