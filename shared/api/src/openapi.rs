//! The OpenAPI 3.1 document of the gateway, generated from this crate's types (`utoipa`): the
//! gateway serves it at `GET /openapi.json`, and its tests hold it against the router.
//!
//! The operations are declared below on documentation-only functions (the handlers live in the
//! gateway, which this crate must not depend on). What every operation shares is filled in by one
//! modifier from [`OPERATIONS`]: the roles it needs and the error codes it can answer, each
//! response with the status [`ErrorCode::status`] gives the code, so a status is never written
//! twice.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use utoipa::openapi::extensions::ExtensionsBuilder;
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder, Schema};
use utoipa::{Modify, OpenApi};

use crate::grants::{ArgMatch, Grant, GrantList, GrantRequest, GrantScope, GrantState, GrantView};
use crate::{
    AnswerAccepted, AnswerBody, AnswerStatus, BotReply, CancelBody, CancelResult, ClaimBody,
    ClaimState, ClaimedResponder, DeadLetterDropped, DeadLetterPage, DeadLetterRetried,
    DeadLetterView, Delegation, DelegationBody, DelegationPage, DlqQuery, DroppedStatus, ErrorBody,
    ErrorCode, ErrorResponse, Escalated, EscalationStep, Health, HealthStatus, InteractionPage,
    InteractionRequest, InteractionResponse, InteractionUpdate, InteractionView, InteractionsQuery,
    Journal, JournalEvent, JournalQuery, QueueStats, Reachability, Readiness, RequeuedStatus,
    Resolved, Run, RunAccepted, RunDetail, RunEnded, RunPage, RunsQuery, StreamQuery, StreamTarget,
    StreamTicket, Submission, WorkerSeen,
};

/// The document as served.
pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// The document as JSON text (what `GET /openapi.json` sends).
pub fn json() -> String {
    // A document of plain maps, strings and numbers always serializes.
    serde_json::to_string_pretty(&document()).unwrap_or_default()
}

/// Roles a token needs (with authentication on).
const READ: &[&str] = &["submit", "answer", "operate"];
const ANSWER: &[&str] = &["answer", "operate"];
/// Answering, and relaying a person's answer (`relay`: the Slack bridge).
const ANSWER_OR_RELAY: &[&str] = &["answer", "operate", "relay"];
const OPERATE: &[&str] = &["operate"];
const OPEN: &[&str] = &[];

use ErrorCode::{
    AlreadyResolved, AlreadyVoted, BadRequest, Claimed, Expired, Forbidden, InputRequired,
    InvalidArgs, InvalidData, InvalidOption, NotFound, NotRetryable, PayloadTooLarge, RateLimited,
    Stale, Unauthorized, Unavailable,
};

/// Every operation by `operationId`: the roles it needs (none: open to all) and the codes it may
/// refuse with.
pub const OPERATIONS: &[(&str, &[&str], &[ErrorCode])] = &[
    (
        "submitRun",
        &["submit"],
        &[
            BadRequest,
            Unauthorized,
            Forbidden,
            PayloadTooLarge,
            InvalidArgs,
            Unavailable,
            RateLimited,
        ],
    ),
    (
        "listRuns",
        READ,
        &[BadRequest, Unauthorized, Forbidden, Unavailable],
    ),
    (
        "getRun",
        READ,
        &[BadRequest, Unauthorized, Forbidden, NotFound, Unavailable],
    ),
    (
        "getJournal",
        READ,
        &[BadRequest, Unauthorized, Forbidden, NotFound, Unavailable],
    ),
    (
        "followRun",
        READ,
        &[BadRequest, Unauthorized, Forbidden, NotFound, Unavailable],
    ),
    (
        "createStreamTicket",
        READ,
        &[
            BadRequest,
            Unauthorized,
            Forbidden,
            NotFound,
            PayloadTooLarge,
            Unavailable,
        ],
    ),
    (
        "cancelRun",
        OPERATE,
        &[
            BadRequest,
            Unauthorized,
            Forbidden,
            NotFound,
            AlreadyResolved,
            PayloadTooLarge,
            Unavailable,
        ],
    ),
    (
        "listInteractions",
        ANSWER,
        &[BadRequest, Unauthorized, Forbidden, Unavailable],
    ),
    (
        "followInteractions",
        ANSWER,
        &[BadRequest, Unauthorized, Forbidden, Unavailable],
    ),
    (
        "getInteraction",
        ANSWER_OR_RELAY,
        &[BadRequest, Unauthorized, Forbidden, NotFound, Unavailable],
    ),
    ("openAnswerLink", OPEN, &[BadRequest, NotFound, Unavailable]),
    (
        "answerThroughLink",
        OPEN,
        &[
            BadRequest,
            Forbidden,
            NotFound,
            AlreadyResolved,
            Expired,
            PayloadTooLarge,
            InvalidOption,
            InputRequired,
            InvalidArgs,
            InvalidData,
            Stale,
            Claimed,
            AlreadyVoted,
            Unavailable,
        ],
    ),
    (
        "answerInteraction",
        ANSWER_OR_RELAY,
        &[
            BadRequest,
            Unauthorized,
            Forbidden,
            NotFound,
            AlreadyResolved,
            Expired,
            PayloadTooLarge,
            InvalidOption,
            InputRequired,
            InvalidArgs,
            InvalidData,
            Stale,
            Claimed,
            AlreadyVoted,
            Unavailable,
        ],
    ),
    (
        "claimInteraction",
        ANSWER_OR_RELAY,
        &[
            BadRequest,
            Unauthorized,
            Forbidden,
            NotFound,
            AlreadyResolved,
            Claimed,
            PayloadTooLarge,
            Unavailable,
        ],
    ),
    (
        "createDelegation",
        ANSWER,
        &[
            BadRequest,
            Unauthorized,
            Forbidden,
            InvalidArgs,
            PayloadTooLarge,
            Unavailable,
        ],
    ),
    (
        "listDelegations",
        ANSWER,
        &[Unauthorized, Forbidden, Unavailable],
    ),
    (
        "deleteDelegation",
        ANSWER,
        &[Unauthorized, Forbidden, NotFound, Unavailable],
    ),
    (
        "queueStats",
        OPERATE,
        &[Unauthorized, Forbidden, Unavailable],
    ),
    (
        "listDeadLetters",
        OPERATE,
        &[BadRequest, Unauthorized, Forbidden, Unavailable],
    ),
    (
        "dropDeadLetter",
        OPERATE,
        &[BadRequest, Unauthorized, Forbidden, NotFound, Unavailable],
    ),
    (
        "retryDeadLetter",
        OPERATE,
        &[
            BadRequest,
            Unauthorized,
            Forbidden,
            NotFound,
            NotRetryable,
            Unavailable,
        ],
    ),
    (
        "listGrants",
        ANSWER,
        &[BadRequest, Unauthorized, Forbidden, NotFound, Unavailable],
    ),
    (
        "getGrant",
        ANSWER,
        &[BadRequest, Unauthorized, Forbidden, NotFound, Unavailable],
    ),
    (
        "revokeGrant",
        ANSWER,
        &[BadRequest, Unauthorized, Forbidden, NotFound, Unavailable],
    ),
    (
        "createWebhook",
        OPERATE,
        &[
            BadRequest,
            Unauthorized,
            Forbidden,
            InvalidArgs,
            PayloadTooLarge,
            Unavailable,
        ],
    ),
    (
        "listWebhooks",
        OPERATE,
        &[Unauthorized, Forbidden, Unavailable],
    ),
    (
        "getWebhook",
        OPERATE,
        &[Unauthorized, Forbidden, NotFound, Unavailable],
    ),
    (
        "deleteWebhook",
        OPERATE,
        &[Unauthorized, Forbidden, NotFound, Unavailable],
    ),
    (
        "rotateWebhookSecret",
        OPERATE,
        &[
            BadRequest,
            Unauthorized,
            Forbidden,
            NotFound,
            InvalidArgs,
            PayloadTooLarge,
            Unavailable,
        ],
    ),
    (
        "enableWebhook",
        OPERATE,
        &[Unauthorized, Forbidden, NotFound, Unavailable],
    ),
    (
        "disableWebhook",
        OPERATE,
        &[Unauthorized, Forbidden, NotFound, Unavailable],
    ),
    ("healthz", OPEN, &[]),
    ("readyz", OPEN, &[]),
    ("metrics", OPEN, &[]),
    ("openapi", OPEN, &[]),
    ("inboxPage", OPEN, &[]),
    ("inboxRunPage", OPEN, &[]),
    ("inboxAnswerPage", OPEN, &[]),
    ("inboxScript", OPEN, &[]),
    ("inboxStyle", OPEN, &[]),
];

/// When the document says a code is answered.
fn meaning(code: ErrorCode) -> &'static str {
    match code {
        BadRequest => {
            "malformed or empty JSON, a wrong type, an unknown field or query parameter, a path id that is not a UUID, a bad `limit`, `cursor`, filter or header"
        }
        Unauthorized => {
            "authentication is on and the bearer token is missing or unknown; on a live stream, also: a `ticket` that is unknown, used, expired or for another stream"
        }
        Forbidden => {
            "the token lacks the role this needs, names another responder than its own, or is not in the request's `allowed_responders`"
        }
        NotFound => "no such run, interaction request or dead letter",
        AlreadyResolved => {
            "answered before (differently), closed because its run was cancelled, or the run is already over"
        }
        NotRetryable => {
            "the letter holds no job, its run does not exist, the run is not `FAILED` (it went on), or it failed since for another reason (a stale letter): drop it"
        }
        Expired => "past `expires_at`; its default was applied or its run failed",
        PayloadTooLarge => "the body is larger than `DELTA_MAX_BODY_BYTES` (1 MiB by default)",
        InvalidOption => {
            "no `option_id` for a request with options, an unknown one, or one for a free-text request"
        }
        InputRequired => "a blank `input` where it is needed",
        InvalidArgs => {
            "a submission's `agent` is not a name or not in the agents directory, its `task` is blank, or its `Idempotency-Key` was used for a different body; an answer's `data` is not an object, `data.args` not an object, `data.tasks` not a list, or edited arguments the tool refuses; a webhook's URL the allowlist refuses (`DELTA_WEBHOOK_ALLOW`), an unknown event or agent name, or no `DELTA_SECRETS_KEY` to seal its secret"
        }
        InvalidData => {
            "the request has a `response_schema` and the answer's `data` does not fit it: not an object, a required field missing, an unknown field, or a value of the wrong type, out of its bounds, not of its format or not one of its choices (the message names the field)"
        }
        Unavailable => {
            "Redis or NATS cannot be reached (try again), or a sensitive answer reached a gateway without `DELTA_SECRETS_KEY`"
        }
        RateLimited => {
            "the caller is at one of its limits: more runs in the last minute than `DELTA_SUBMIT_PER_MINUTE` allows, more stream tickets and answer links than `DELTA_TICKETS_PER_MINUTE`, as many live streams as `DELTA_MAX_STREAMS_PER_IDENTITY`, or an A2A push config limit; try again later (or close or delete one first)"
        }
        Stale => {
            "the answer's `request_hash` is not the pending request's: it was shown another version; load it again"
        }
        Claimed => {
            "someone else holds a live claim on the question (the message says who and until when)"
        }
        AlreadyVoted => "the caller voted on this question before, otherwise: a person votes once",
    }
}

/// An example message of each code.
fn example(code: ErrorCode) -> &'static str {
    match code {
        BadRequest => {
            "`option`: unknown field `option`, expected one of `request_id`, `option_id`, `input`, `data`, `feedback`, `responder`"
        }
        Unauthorized => {
            "this gateway needs `Authorization: Bearer <token>`; ask an operator for a token"
        }
        Forbidden => "`ci` may not do this: it needs the role answer or operate",
        NotFound => "no run 0193a1b2-0000-7000-8000-00000000a001",
        AlreadyResolved => {
            "request 0193a1b2-0000-7000-8000-00000000b002 was already answered by ada at 2026-11-21T10:00:00.000000Z"
        }
        NotRetryable => {
            "run 0193a1b2-0000-7000-8000-00000000a001 is COMPLETED; only a run the dead-lettering failed can be retried (drop this letter: the run went on)"
        }
        Expired => {
            "request 0193a1b2-0000-7000-8000-00000000b002 expired at 2026-11-21T10:15:00.000000Z"
        }
        PayloadTooLarge => {
            "the request body is larger than this gateway accepts (DELTA_MAX_BODY_BYTES)"
        }
        InvalidOption => {
            "`moon` is not an option of this request; choose one of: staging, production, other, stop"
        }
        InputRequired => "option `other` needs a non-empty input",
        InvalidArgs => "`task` must not be empty",
        InvalidData => {
            "data refused: field `email`: `ada` is not a valid email (e.g. ada@example.com)"
        }
        Unavailable => "the run store (Redis) is unavailable; try again shortly",
        RateLimited => {
            "`ci` submitted 600 runs in the last minute, as many as one identity may; try again in a few seconds"
        }
        Stale => {
            "request 0193a1b2-0000-7000-8000-00000000b002 is not the one you were shown (its request_hash differs): load it again and answer what it asks now"
        }
        Claimed => {
            "request 0193a1b2-0000-7000-8000-00000000b002 is claimed by ada until 2026-11-21T10:05:00.000000Z: only they may answer until then"
        }
        AlreadyVoted => "`ada` has voted on this request already: a person votes once",
    }
}

/// Fills in what every operation shares: `x-roles` and its security, and its error responses.
struct Contract;

impl Modify for Contract {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        if let Some(RefOr::T(Schema::Object(codes))) = components.schemas.get_mut("ErrorCode") {
            let statuses: Vec<String> = ErrorCode::ALL
                .iter()
                .map(|c| format!("`{c}` {}", c.status()))
                .collect();
            codes.description = Some(format!(
                "The HTTP status of each code: {}.",
                statuses.join(", ")
            ));
        }
        components.add_security_scheme(
            "bearerAuth",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "Off by default: enforced only when the gateway is given a tokens file (`--tokens-file` / `DELTA_GATEWAY_TOKENS_FILE`), a YAML list of `{name, token, roles: [submit|answer|operate|relay]}` (tokens of 16 characters or more). The token's `name` is the responder recorded with an answer; a `relay` token (the Slack bridge) answers, votes and claims as the person of the tokens file it names in `responder.id`, recorded `via: slack` and `relayed_by` the relay. The token is never taken from a URL: a client that cannot set headers on a live stream (a browser's `EventSource`) gets a one-time ticket from `POST /v1/stream-tickets` and passes `?ticket=`.",
                    ))
                    .build(),
            ),
        );
        for item in doc.paths.paths.values_mut() {
            for op in [&mut item.get, &mut item.post, &mut item.delete]
                .into_iter()
                .flatten()
            {
                let id = op.operation_id.clone().unwrap_or_default();
                if let Some((_, roles, codes)) = OPERATIONS.iter().find(|(o, ..)| *o == id) {
                    shared_parts(op, roles, codes);
                }
            }
        }
    }
}

fn shared_parts(op: &mut Operation, roles: &[&str], codes: &[ErrorCode]) {
    if roles.is_empty() {
        // Open: no token needed, whatever the gateway's authentication.
        op.security = Some(vec![]);
    } else {
        let list: Vec<String> = roles.iter().map(|r| format!("`{r}`")).collect();
        let line = format!("Roles: {} (with authentication on).", list.join(", "));
        op.description = Some(match op.description.take() {
            Some(d) if !d.is_empty() => format!("{d}\n\n{line}"),
            _ => line,
        });
        op.extensions.get_or_insert_with(Default::default).merge(
            ExtensionsBuilder::new()
                .add("x-roles", json!(roles))
                .build(),
        );
    }
    let mut by_status: BTreeMap<u16, Vec<ErrorCode>> = BTreeMap::new();
    for code in codes {
        by_status.entry(code.status()).or_default().push(*code);
    }
    for (status, codes) in by_status {
        let description = codes
            .iter()
            .map(|c| format!("`{c}`: {}.", meaning(*c)))
            .collect::<Vec<_>>()
            .join(" ");
        let first = codes[0];
        let content = ContentBuilder::new()
            .schema(Some(Ref::from_schema_name("Error")))
            .example(Some(
                json!({"error": {"code": first, "message": example(first)}}),
            ))
            .build();
        let response = ResponseBuilder::new()
            .description(description)
            .content("application/json", content)
            .build();
        op.responses
            .responses
            .insert(status.to_string(), RefOr::T(response));
    }
}

/// Names the server-sent events of a stream's `200` (`x-events`: event name → its data's schema).
struct Streams;

impl Modify for Streams {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let streams: [(&str, Value); 2] = [
            (
                "/v1/runs/{run_id}/events",
                json!({
                    crate::sse::JOURNAL: {"$ref": "#/components/schemas/JournalEvent"},
                    crate::sse::STATUS: {"$ref": "#/components/schemas/RunEnded"},
                }),
            ),
            (
                "/v1/interactions/stream",
                json!({
                    crate::sse::REQUESTED: {"$ref": "#/components/schemas/InteractionRequest"},
                    crate::sse::RESOLVED: {"$ref": "#/components/schemas/Resolved"},
                    crate::sse::UPDATED: {"$ref": "#/components/schemas/InteractionUpdate"},
                    crate::sse::ESCALATED: {"$ref": "#/components/schemas/Escalated"},
                }),
            ),
        ];
        for (path, events) in streams {
            let ok = doc
                .paths
                .paths
                .get_mut(path)
                .and_then(|item| item.get.as_mut())
                .and_then(|op| op.responses.responses.get_mut("200"));
            if let Some(RefOr::T(response)) = ok {
                response
                    .extensions
                    .get_or_insert_with(Default::default)
                    .merge(ExtensionsBuilder::new().add("x-events", events).build());
            }
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Delta Fleet gateway",
        description = "The HTTP API of docs/protocol.md §6, served by `delta-gateway`; generated from the types of the `delta-api` crate.

- Bodies are JSON, parsed strictly: unknown fields, wrong types and trailing data are `400 bad_request` naming the field; an empty body where one is needed is `400`; a body over `DELTA_MAX_BODY_BYTES` (1 MiB) is `413`. `Content-Type` is not checked.
- Every refusal is `{\"error\": {\"code\", \"message\"}}` (schema `Error`) with the status of its code; an unknown path is `404 not_found` in that shape. A known path with a method it does not serve is answered `405` with an empty body (the router's default).
- Authentication is off by default: without a tokens file (`DELTA_GATEWAY_TOKENS_FILE`) everyone may do everything and answers are recorded with the responder id the caller names. With tokens, every `/v1` call needs `Authorization: Bearer <token>` and a role (`x-roles` of each operation; `operate` implies the others); `/healthz`, `/readyz`, `/metrics`, `/openapi.json` and the web inbox's static files (`/`, `/runs/{run_id}`, `/inbox.js`, `/inbox.css`) stay open: the inbox asks for a token and sends it on its own `/v1` calls.
- Bots answer over NATS (core request-reply on `<prefix>.interactions.respond.<request_id>`, same body as `AnswerBody`, the token in an `Authorization` message header) through the same code and get a `BotReply`: `{\"ok\": true, \"run_id\"}` or `{\"ok\": false, \"error\": {\"code\", \"message\"}}` with these codes.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    servers(
        (url = "http://127.0.0.1:8080", description = "The default `DELTA_GATEWAY_ADDR` (plain HTTP: loopback only, unless told otherwise)."),
        (url = "https://127.0.0.1:8080", description = "With `DELTA_GATEWAY_TLS_CERT` and `DELTA_GATEWAY_TLS_KEY`."),
    ),
    tags(
        (name = "runs", description = "Submit, read, follow and cancel runs."),
        (name = "interactions", description = "The questions runs ask, and their answers."),
        (name = "operations", description = "Health, readiness, metrics, the queue, the dead letters, live-stream tickets, this document."),
        (name = "webhooks", description = "Signed webhooks: subscriptions to the fleet's events (docs/webhooks.md)."),
        (name = "inbox", description = "The web inbox: static files (HTML, JavaScript, CSS, no build step) that use this API from the browser."),
    ),
    security(("bearerAuth" = [])),
    paths(
        paths::submit_run,
        paths::list_runs,
        paths::get_run,
        paths::get_journal,
        paths::follow_run,
        paths::create_stream_ticket,
        paths::cancel_run,
        paths::list_interactions,
        paths::follow_interactions,
        paths::get_interaction,
        paths::answer_interaction,
        paths::claim_interaction,
        paths::create_delegation,
        paths::list_delegations,
        paths::delete_delegation,
        paths::queue_stats,
        paths::list_dead_letters,
        paths::drop_dead_letter,
        paths::retry_dead_letter,
        crate::grants::paths::list_grants,
        crate::grants::paths::get_grant,
        crate::grants::paths::revoke_grant,
        crate::links::paths::open_answer_link,
        crate::links::paths::answer_through_link,
        crate::webhooks::paths::create_webhook,
        crate::webhooks::paths::list_webhooks,
        crate::webhooks::paths::get_webhook,
        crate::webhooks::paths::delete_webhook,
        crate::webhooks::paths::rotate_webhook,
        crate::webhooks::paths::enable_webhook,
        crate::webhooks::paths::disable_webhook,
        paths::healthz,
        paths::readyz,
        paths::metrics,
        paths::openapi,
        paths::inbox_page,
        paths::inbox_run_page,
        paths::inbox_answer_page,
        paths::inbox_script,
        paths::inbox_style,
    ),
    components(schemas(
        ErrorResponse, ErrorBody, ErrorCode, BotReply,
        Submission, RunAccepted, Run, RunPage, RunDetail, Journal, CancelBody, CancelResult, RunEnded,
        StreamTarget, StreamTicket,
        InteractionView, InteractionPage, InteractionRequest, InteractionResponse, AnswerBody,
        ClaimedResponder, AnswerStatus, AnswerAccepted, Resolved, JournalEvent,
        ClaimBody, ClaimState, InteractionUpdate, Escalated, EscalationStep,
        Delegation, DelegationBody, DelegationPage,
        WorkerSeen, QueueStats, Health, HealthStatus, Reachability, Readiness,
        DeadLetterView, DeadLetterPage, DeadLetterRetried, RequeuedStatus, DeadLetterDropped, DroppedStatus,
        GrantView, GrantList, Grant, GrantRequest, GrantScope, GrantState, ArgMatch,
        crate::webhooks::WebhookBody, crate::webhooks::RotateBody, crate::webhooks::WebhookView,
        crate::webhooks::WebhookCreated, crate::webhooks::WebhookList,
        crate::links::LinkOpen, crate::links::LinkView, crate::links::LinkAnswer,
    )),
    modifiers(&Contract, &Streams),
)]
struct ApiDoc;

/// The operations, declared on functions that only carry their documentation (the gateway's
/// handlers are elsewhere; `tests/openapi.rs` of the gateway checks that both list the same
/// routes). Each one's first doc line is its summary, the rest its description.
#[allow(dead_code)]
mod paths {
    use super::*;
    use crate::{RequestId, RunId};

    /// Submit a run
    ///
    /// Stores the run `QUEUED` and publishes its start job on `<prefix>.jobs.<agent>`. Should
    /// the publish fail, the run stays `QUEUED` and the lost-job reconciler sends it later.
    #[utoipa::path(
        post, path = "/v1/runs", operation_id = "submitRun", tag = "runs",
        params(("Idempotency-Key" = Option<String>, Header, description = "1 to 255 visible ASCII characters, remembered for 24 hours. The same key with the same body returns the run made the first time (`202`, with its current status) and makes no new one; with a different body it is `422 invalid_args`.")),
        request_body = Submission,
        responses((status = 202, description = "Accepted (new, or the earlier run of the same `Idempotency-Key`).", body = RunAccepted)),
    )]
    fn submit_run() {}

    /// List runs, newest first
    #[utoipa::path(
        get, path = "/v1/runs", operation_id = "listRuns", tag = "runs",
        params(RunsQuery),
        responses((status = 200, description = "A page of runs.", body = RunPage)),
    )]
    fn list_runs() {}

    /// A run with its pending interaction
    #[utoipa::path(
        get, path = "/v1/runs/{run_id}", operation_id = "getRun", tag = "runs",
        params(("run_id" = RunId, Path, description = "A run id; not a UUID: `400 bad_request`.")),
        responses((status = 200, description = "The run.", body = RunDetail)),
    )]
    fn get_run() {}

    /// A run's journal events
    ///
    /// Sensitive answers show as `"***"`.
    #[utoipa::path(
        get, path = "/v1/runs/{run_id}/journal", operation_id = "getJournal", tag = "runs",
        params(("run_id" = RunId, Path, description = "A run id; not a UUID: `400 bad_request`."), JournalQuery),
        responses((status = 200, description = "Events from `from_seq` on.", body = Journal)),
    )]
    fn get_journal() {}

    /// Follow a run's journal live (server-sent events)
    ///
    /// Sends the journal from `Last-Event-ID` + 1 (or from `from_seq`, or from the start), then
    /// live. Each journal event is an SSE event `journal` with `id` = its `seq` and `data` = the
    /// `JournalEvent`. After the terminal `ENGINE_END` (or at once, for a run already over with
    /// nothing left to send), one `status` event (`RunEnded`, no `id`) and the stream ends. A
    /// reconnect with the last `id` seen gets every later event exactly once. Keep-alive
    /// comments every 15 s. The stream also ends when the gateway shuts down.
    #[utoipa::path(
        get, path = "/v1/runs/{run_id}/events", operation_id = "followRun", tag = "runs",
        params(
            ("run_id" = RunId, Path, description = "A run id; not a UUID: `400 bad_request`."),
            StreamQuery,
            ("Last-Event-ID" = Option<u64>, Header, description = "The `id` of the last event received: the stream goes on after it (it wins over `from_seq`). Not a whole number: `400 bad_request`."),
        ),
        responses((status = 200, description = "An event stream: `journal` events (`JournalEvent`), then one `status` event (`RunEnded`).", content_type = "text/event-stream", body = String)),
    )]
    fn follow_run() {}

    /// Get a one-time ticket for a live stream
    ///
    /// For clients that cannot set headers on a stream (a browser's `EventSource`): the bearer
    /// token is never accepted in a URL (proxies and servers log URLs), so such a client asks
    /// for a ticket with its token here and opens the stream with `?ticket=<ticket>`. A ticket
    /// opens only the stream it names (`{"stream": "interactions"}` or
    /// `{"stream": "run", "run_id": "…"}`), only once, only until `expires_at`
    /// (`DELTA_STREAM_TICKET_TTL_S`, 30 s by default), as the identity and roles of the token
    /// that asked for it; any gateway of the fleet accepts it (tickets live in Redis, under a
    /// hash of the ticket). A wrong, used or expired ticket is `401 unauthorized`: ask for a new
    /// one before every connection, reconnects included. Clients that can set headers may open
    /// the streams with `Authorization: Bearer` instead.
    #[utoipa::path(
        post, path = "/v1/stream-tickets", operation_id = "createStreamTicket", tag = "operations",
        request_body = StreamTarget,
        responses((status = 200, description = "The ticket.", body = StreamTicket)),
    )]
    fn create_stream_ticket() {}

    /// Cancel a run that is not over
    ///
    /// Journals `SYSTEM_MESSAGE` (`cancelled by <who>[: <reason>]`) and `ENGINE_END`
    /// `CANCELLED`; a question the run waited on becomes `CANCELLED` (announced as `resolved`
    /// with `state: CANCELLED`). A worker still holding the run has its next write refused. The
    /// body may be empty.
    #[utoipa::path(
        post, path = "/v1/runs/{run_id}/cancel", operation_id = "cancelRun", tag = "runs",
        params(("run_id" = RunId, Path, description = "A run id; not a UUID: `400 bad_request`.")),
        request_body(content = CancelBody, description = "Optional: an empty body cancels without a reason."),
        responses((status = 200, description = "Cancelled.", body = CancelResult)),
    )]
    fn cancel_run() {}

    /// List interactions, oldest first
    #[utoipa::path(
        get, path = "/v1/interactions", operation_id = "listInteractions", tag = "interactions",
        params(InteractionsQuery),
        responses((status = 200, description = "A page of interactions.", body = InteractionPage)),
    )]
    fn list_interactions() {}

    /// Questions asked and resolved, live (server-sent events)
    ///
    /// SSE events `requested` (`data` = the `InteractionRequest`), `updated` (`InteractionUpdate`) and `resolved` (`data` =
    /// `Resolved`), each with `id` = its sequence in the interactions stream
    /// (`<PREFIX>_INTERACTIONS`). Without `Last-Event-ID` or `from_seq` only new events are
    /// sent; with them the stream catches up first, for as long as the stream keeps messages
    /// (7 days by default). Keep-alive comments every 15 s; the stream ends only when the
    /// client leaves or the gateway shuts down.
    #[utoipa::path(
        get, path = "/v1/interactions/stream", operation_id = "followInteractions", tag = "interactions",
        params(
            StreamQuery,
            ("Last-Event-ID" = Option<u64>, Header, description = "The `id` of the last event received: the stream goes on after it (it wins over `from_seq`). Not a whole number: `400 bad_request`."),
        ),
        responses((status = 200, description = "An event stream: `requested` (`InteractionRequest`), `resolved` (`Resolved`) and `updated` (`InteractionUpdate`: a claim or a vote) events.", content_type = "text/event-stream", body = String)),
    )]
    fn follow_interactions() {}

    /// One interaction with its state and (redacted) answer
    #[utoipa::path(
        get, path = "/v1/interactions/{request_id}", operation_id = "getInteraction", tag = "interactions",
        params(("request_id" = RequestId, Path, description = "An interaction request id; not a UUID: `400 bad_request`.")),
        responses((status = 200, description = "The interaction.", body = InteractionView)),
    )]
    fn get_interaction() {}

    /// Answer a question
    ///
    /// docs/protocol.md §3 rules. The first accepted answer wins, atomically, across every gateway
    /// and channel (HTTP and NATS bots); the run's resume job is then published and a
    /// `resolved` announcement sent. The same answer again (same option, input, data, feedback
    /// and responder) is acknowledged again with `200`; any other later answer is
    /// `409 already_resolved`.
    #[utoipa::path(
        post, path = "/v1/interactions/{request_id}/response", operation_id = "answerInteraction", tag = "interactions",
        params(("request_id" = RequestId, Path, description = "An interaction request id; not a UUID: `400 bad_request`.")),
        request_body = AnswerBody,
        responses((status = 200, description = "Accepted.", body = AnswerAccepted)),
    )]
    fn answer_interaction() {}

    /// Claim a question, renew or give back one's claim
    ///
    /// docs/protocol.md §3 "Claims". A claim is a lease (`ttl_seconds`, 300 by default): while it
    /// holds, others' answers and votes are `409 claimed`, naming the holder and until when. The
    /// holder renews it by claiming again, gives it back with `release`; an operator's `release`
    /// breaks anyone's. Each change is announced (`updated` on the live stream). Only someone who
    /// may answer the question may claim it.
    #[utoipa::path(
        post, path = "/v1/interactions/{request_id}/claim", operation_id = "claimInteraction", tag = "interactions",
        params(("request_id" = RequestId, Path, description = "An interaction request id; not a UUID: `400 bad_request`.")),
        request_body = ClaimBody,
        responses((status = 200, description = "The claim as it is now.", body = ClaimState)),
    )]
    fn claim_interaction() {}

    /// Delegate one's authority to answer
    ///
    /// docs/protocol.md §3 "Delegation". Until `until`, `to` may answer (and vote on) whatever
    /// `from` may, recorded as "`to` on behalf of `from`"; it never lets anyone approve their
    /// own run. `from` is the caller unless the caller is an operator.
    #[utoipa::path(
        post, path = "/v1/delegations", operation_id = "createDelegation", tag = "interactions",
        request_body = DelegationBody,
        responses((status = 201, description = "The delegation.", body = Delegation)),
    )]
    fn create_delegation() {}

    /// The delegations in force
    #[utoipa::path(
        get, path = "/v1/delegations", operation_id = "listDelegations", tag = "interactions",
        responses((status = 200, description = "Oldest first.", body = DelegationPage)),
    )]
    fn list_delegations() {}

    /// End a delegation (its `from`, its maker, or an operator)
    #[utoipa::path(
        delete, path = "/v1/delegations/{id}", operation_id = "deleteDelegation", tag = "interactions",
        params(("id" = String, Path, description = "The delegation's id.")),
        responses((status = 200, description = "Ended: the delegation as it was.", body = Delegation)),
    )]
    fn delete_delegation() {}

    /// JetStream figures and the workers seen
    #[utoipa::path(
        get, path = "/v1/queue", operation_id = "queueStats", tag = "operations",
        responses((status = 200, description = "The queue.", body = QueueStats)),
    )]
    fn queue_stats() {}

    /// Jobs in the dead-letter stream, oldest first
    ///
    /// Jobs that used up `max_deliver` or were poison (bad JSON, unknown run, broken agent).
    /// Each shows why, its run and the run's status; `retryable` is true when the run is
    /// `FAILED` with this letter's reason as its error (as dead-lettering leaves it).
    #[utoipa::path(
        get, path = "/v1/dlq", operation_id = "listDeadLetters", tag = "operations",
        params(DlqQuery),
        responses((status = 200, description = "A page of dead letters.", body = DeadLetterPage)),
    )]
    fn list_dead_letters() {}

    /// Remove a dead letter without retrying it
    ///
    /// The run is left as it is.
    #[utoipa::path(
        delete, path = "/v1/dlq/{seq}", operation_id = "dropDeadLetter", tag = "operations",
        params(("seq" = u64, Path, minimum = 1, description = "The dead letter's sequence in the dead-letter stream (`seq` in `GET /v1/dlq`).")),
        responses((status = 200, description = "Dropped.", body = DeadLetterDropped)),
    )]
    fn drop_dead_letter() {}

    /// Put a dead letter's run back in the queue
    ///
    /// For a run that this dead-lettering left `FAILED` (its error is the letter's reason),
    /// once the cause is mended (an agent's config fixed, a crashing tool repaired): the run
    /// becomes `QUEUED` again (an extension of docs/protocol.md §1: `FAILED` is otherwise final)
    /// with a `SYSTEM_MESSAGE` journaled (`retried from the dead-letter queue by <who> …`), a
    /// new start job is published and the letter removed. The run goes on from where its
    /// journal stops: an unfinished idempotent tool runs again, another becomes a
    /// `TOOL_APPROVAL` question, an answered question is applied, and a question the failure
    /// closed before its deadline is open again. No body.
    #[utoipa::path(
        post, path = "/v1/dlq/{seq}/retry", operation_id = "retryDeadLetter", tag = "operations",
        params(("seq" = u64, Path, minimum = 1, description = "The dead letter's sequence in the dead-letter stream (`seq` in `GET /v1/dlq`).")),
        responses((status = 200, description = "Requeued.", body = DeadLetterRetried)),
    )]
    fn retry_dead_letter() {}

    /// Liveness
    ///
    /// Always `200` while the process serves HTTP. No authentication.
    #[utoipa::path(
        get, path = "/healthz", operation_id = "healthz", tag = "operations",
        responses((status = 200, description = "Alive.", body = Health)),
    )]
    fn healthz() {}

    /// Readiness: Redis and NATS reachable
    ///
    /// No authentication.
    #[utoipa::path(
        get, path = "/readyz", operation_id = "readyz", tag = "operations",
        responses(
            (status = 200, description = "Both reachable.", body = Readiness),
            (status = 503, description = "One of them is not (this body, not the `Error` shape).", body = Readiness),
        ),
    )]
    fn readyz() {}

    /// Prometheus metrics (OpenMetrics text)
    ///
    /// Gauges `delta_runs{status}`, `delta_interactions_pending`, `delta_jobs_pending`,
    /// `delta_jobs_in_flight`, `delta_jobs_redelivered`, `delta_jobs_dead_lettered` (read from
    /// Redis and JetStream at scrape time: fleet-wide); counters `delta_runs_submitted_total`,
    /// `delta_answers_accepted_total{via}`, `delta_answers_refused_total{via}`,
    /// `delta_timeouts_applied_total`, `delta_resumes_republished_total`,
    /// `delta_jobs_requeued_total`; histograms `delta_time_to_answer_seconds`,
    /// `delta_answer_to_resume_seconds` (this gateway's own). No authentication.
    #[utoipa::path(
        get, path = "/metrics", operation_id = "metrics", tag = "operations",
        responses((status = 200, description = "The exposition.", content_type = "application/openmetrics-text", body = String)),
    )]
    fn metrics() {}

    /// This document
    ///
    /// Generated from the types of the `delta-api` crate. No authentication.
    #[utoipa::path(
        get, path = "/openapi.json", operation_id = "openapi", tag = "operations",
        responses((status = 200, description = "The OpenAPI document.", body = Value)),
    )]
    fn openapi() {}

    /// The web inbox
    ///
    /// The pending questions, oldest first, live: the page reads `GET /v1/interactions` (every
    /// page of it), then the `requested` and `resolved` events of `GET /v1/interactions/stream`,
    /// and answers through `POST /v1/interactions/{request_id}/response`. No authentication to
    /// load it: with tokens on, the page asks for one, keeps it in the browser's `localStorage`
    /// and sends it as `Authorization: Bearer`; each live stream it opens with a fresh one-time
    /// ticket (`POST /v1/stream-tickets`), never with the token in the URL.
    #[utoipa::path(
        get, path = "/", operation_id = "inboxPage", tag = "inbox",
        responses((status = 200, description = "The page (`text/html; charset=utf-8`).", content_type = "text/html", body = String)),
    )]
    fn inbox_page() {}

    /// The web inbox: one run
    ///
    /// The same page as `/`, showing one run: its status and facts, its journal live
    /// (`GET /v1/runs/{run_id}/events`) and its pending question, answerable there. Served for
    /// any id: the page itself says when there is no such run.
    #[utoipa::path(
        get, path = "/runs/{run_id}", operation_id = "inboxRunPage", tag = "inbox",
        params(("run_id" = String, Path, description = "A run id (not checked: the page says when there is no such run).")),
        responses((status = 200, description = "The page (`text/html; charset=utf-8`).", content_type = "text/html", body = String)),
    )]
    fn inbox_run_page() {}

    /// The web inbox: one question, through an answer link
    ///
    /// The same page as `/`, opened by a one-time answer link (`/answer#link=…`, made for an
    /// MCP or A2A client's sensitive question): it shows the link's question
    /// (`POST /v1/answer-links/open`) and answers it (`POST /v1/answer-links/answer`). The
    /// link's secret is in the fragment, which the browser never sends.
    #[utoipa::path(
        get, path = "/answer", operation_id = "inboxAnswerPage", tag = "inbox",
        responses((status = 200, description = "The page (`text/html; charset=utf-8`).", content_type = "text/html", body = String)),
    )]
    fn inbox_answer_page() {}

    /// The web inbox's script
    ///
    /// Plain JavaScript, no build step.
    #[utoipa::path(
        get, path = "/inbox.js", operation_id = "inboxScript", tag = "inbox",
        responses((status = 200, description = "The script (`text/javascript; charset=utf-8`).", content_type = "text/javascript", body = String)),
    )]
    fn inbox_script() {}

    /// The web inbox's stylesheet
    ///
    /// Plain CSS.
    #[utoipa::path(
        get, path = "/inbox.css", operation_id = "inboxStyle", tag = "inbox",
        responses((status = 200, description = "The stylesheet (`text/css; charset=utf-8`).", content_type = "text/css", body = String)),
    )]
    fn inbox_style() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn operation_ids(doc: &Value) -> Vec<String> {
        let mut ids = vec![];
        for item in doc["paths"]
            .as_object()
            .into_iter()
            .flat_map(|m| m.values())
        {
            for op in item.as_object().into_iter().flat_map(|m| m.values()) {
                if let Some(id) = op["operationId"].as_str() {
                    ids.push(id.to_owned());
                }
            }
        }
        ids.sort();
        ids
    }

    #[test]
    fn every_operation_has_its_roles_and_codes_and_no_other_is_listed() {
        let doc: Value = serde_json::from_str(&json()).expect("the document is JSON");
        let ids = operation_ids(&doc);
        let mut listed: Vec<String> = OPERATIONS.iter().map(|(o, ..)| (*o).to_owned()).collect();
        listed.sort();
        assert_eq!(ids, listed, "operations of the document vs OPERATIONS");
    }

    #[test]
    fn every_code_is_answered_somewhere() {
        for code in ErrorCode::ALL {
            assert!(
                OPERATIONS.iter().any(|(_, _, codes)| codes.contains(&code)),
                "{code} is answered by no operation"
            );
        }
    }
}
