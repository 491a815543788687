//! The webhooks endpoints' types (`/v1/webhooks…`, docs/protocol.md §6 "Webhooks",
//! docs/webhooks.md) and their OpenAPI declarations.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::Timestamp;

/// The body of `POST /v1/webhooks`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WebhookBody {
    /// Where to post events: `https://…` (or `http://…` to a target `DELTA_WEBHOOK_ALLOW`
    /// allows); no user or password in it.
    pub url: String,
    /// Short event names (`interaction.requested`, `interaction.answered`, `run.completed`, …);
    /// absent or empty: every event.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<String>,
    /// Agents whose events are delivered; absent or empty: every agent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agents: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 500)]
    pub description: Option<String>,
}

/// The body of `POST /v1/webhooks/{id}/rotate` (optional).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RotateBody {
    /// How long the replaced secret still signs, in seconds (default 86400, at most 7 days;
    /// 0: not at all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_seconds: Option<u64>,
}

/// A subscription as the API shows it: never its secret, and its URL without the query string.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WebhookView {
    pub id: String,
    /// The URL, its query string (if any) replaced by `?…`.
    pub url: String,
    /// Subscribed event names; empty: all.
    pub events: Vec<String>,
    /// Subscribed agents; empty: all.
    pub agents: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub created_by: String,
    pub created_at: Timestamp,
    /// `active` or `disabled`.
    pub state: String,
    /// Why it was disabled (by whom, or after failing how long).
    #[serde(default)]
    pub disabled_reason: Option<String>,
    #[serde(default)]
    pub disabled_at: Option<Timestamp>,
    /// Since when every attempt has failed.
    #[serde(default)]
    pub failing_since: Option<Timestamp>,
    #[serde(default)]
    pub last_success_at: Option<Timestamp>,
    /// The last failure (a status or a transport error; never the URL).
    #[serde(default)]
    pub last_error: Option<String>,
    /// Events delivered.
    pub deliveries: u64,
    /// Attempts that failed.
    pub failures: u64,
    /// While a rotation's grace lasts: until when the previous secret still signs.
    #[serde(default)]
    pub previous_secret_until: Option<Timestamp>,
}

/// `POST /v1/webhooks` and `POST /v1/webhooks/{id}/rotate`: the subscription and its new
/// signing secret, shown this once.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WebhookCreated {
    #[serde(flatten)]
    pub webhook: WebhookView,
    /// `whsec_` and the base64 of 32 random bytes (Standard Webhooks). Not shown again.
    pub secret: String,
}

/// `GET /v1/webhooks`: oldest first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WebhookList {
    pub webhooks: Vec<WebhookView>,
}

/// The operations, declared for the document only (the handlers are the gateway's).
#[allow(dead_code)]
pub(crate) mod paths {
    use super::*;

    /// Subscribe a URL to events
    ///
    /// The events (CloudEvents, as published) are posted signed per Standard Webhooks, at least
    /// once, in order per run, from the moment of this call. Needs `DELTA_SECRETS_KEY` (the
    /// secret is stored sealed); the URL's address is checked against `DELTA_WEBHOOK_ALLOW`.
    #[utoipa::path(
        post, path = "/v1/webhooks", operation_id = "createWebhook", tag = "webhooks",
        request_body = WebhookBody,
        responses((status = 201, description = "The subscription and its secret (shown once).", body = WebhookCreated)),
    )]
    fn create_webhook() {}

    /// List subscriptions, oldest first
    #[utoipa::path(
        get, path = "/v1/webhooks", operation_id = "listWebhooks", tag = "webhooks",
        responses((status = 200, description = "The subscriptions.", body = WebhookList)),
    )]
    fn list_webhooks() {}

    /// One subscription
    #[utoipa::path(
        get, path = "/v1/webhooks/{id}", operation_id = "getWebhook", tag = "webhooks",
        params(("id" = String, Path, description = "The subscription's id.")),
        responses((status = 200, description = "The subscription.", body = WebhookView)),
    )]
    fn get_webhook() {}

    /// Delete a subscription (its undelivered events are dropped)
    #[utoipa::path(
        delete, path = "/v1/webhooks/{id}", operation_id = "deleteWebhook", tag = "webhooks",
        params(("id" = String, Path, description = "The subscription's id.")),
        responses((status = 200, description = "Deleted: the subscription as it was.", body = WebhookView)),
    )]
    fn delete_webhook() {}

    /// Rotate the signing secret
    ///
    /// Deliveries are signed with the new secret and, for `grace_seconds` (default a day), with
    /// the old one too (two signatures in `webhook-signature`).
    #[utoipa::path(
        post, path = "/v1/webhooks/{id}/rotate", operation_id = "rotateWebhookSecret", tag = "webhooks",
        params(("id" = String, Path, description = "The subscription's id.")),
        request_body = RotateBody,
        responses((status = 200, description = "The subscription and its new secret (shown once).", body = WebhookCreated)),
    )]
    fn rotate_webhook() {}

    /// Enable a subscription: delivery resumes where it stopped
    #[utoipa::path(
        post, path = "/v1/webhooks/{id}/enable", operation_id = "enableWebhook", tag = "webhooks",
        params(("id" = String, Path, description = "The subscription's id.")),
        responses((status = 200, description = "The subscription.", body = WebhookView)),
    )]
    fn enable_webhook() {}

    /// Disable a subscription: its events wait in the events stream
    #[utoipa::path(
        post, path = "/v1/webhooks/{id}/disable", operation_id = "disableWebhook", tag = "webhooks",
        params(("id" = String, Path, description = "The subscription's id.")),
        responses((status = 200, description = "The subscription.", body = WebhookView)),
    )]
    fn disable_webhook() {}
}
