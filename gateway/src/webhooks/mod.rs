//! Signed webhooks (docs/webhooks.md): subscriptions to the fleet's events, kept in Redis
//! ([`delta_store::redis::Webhook`]), managed through `/v1/webhooks` by operators, and delivered
//! by [`deliver`] from a durable JetStream consumer per subscription, signed per Standard
//! Webhooks ([`sign`]), to addresses the allowlist permits ([`allow`]).

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use delta_api::{ErrorCode, RotateBody, WebhookBody, WebhookCreated, WebhookList, WebhookView};
use delta_host::settings::Settings as Parsed;
use delta_protocol::Timestamp;
use delta_protocol::events::EventType;
use delta_store::redis::{Webhook, WebhookState};

use crate::Gateway;
use crate::api::{caller, strict_json};
use crate::auth::Role;
use crate::error::ApiError;

pub mod allow;
pub mod deliver;
pub mod sign;

/// The longest a rotation's grace may be.
const MAX_GRACE: Duration = Duration::from_secs(7 * 24 * 3600);
/// A rotation's grace unless told otherwise.
const DEFAULT_GRACE: Duration = Duration::from_secs(24 * 3600);
/// Subscriptions one fleet may have.
const MAX_WEBHOOKS: usize = 100;

/// How webhooks are delivered (`DELTA_WEBHOOK_*`, docs/protocol.md §9).
#[derive(Clone, Debug)]
pub struct Settings {
    /// What may be reached besides public addresses (`DELTA_WEBHOOK_ALLOW`).
    pub allow: Arc<allow::Allow>,
    /// A subscription failing this long without a success is disabled
    /// (`DELTA_WEBHOOK_DISABLE_AFTER`; `None`: never).
    pub disable_after: Option<Duration>,
    /// To connect (`DELTA_WEBHOOK_CONNECT_TIMEOUT_S`).
    pub connect_timeout: Duration,
    /// For a whole attempt, connect to response (`DELTA_WEBHOOK_TIMEOUT_S`).
    pub timeout: Duration,
    /// The first retry's delay (`DELTA_WEBHOOK_RETRY_FIRST_S`), doubled each time…
    pub retry_first: Duration,
    /// …up to this (`DELTA_WEBHOOK_RETRY_MAX_S`).
    pub retry_max: Duration,
    /// How long an event handed to a gateway waits for it (kept alive while it retries) before
    /// JetStream hands it out again; also how long a gateway that takes a subscription over
    /// waits for its predecessor's events before delivering (`DELTA_WEBHOOK_ACK_WAIT_S`).
    pub ack_wait: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            allow: Arc::default(),
            disable_after: Some(Duration::from_secs(72 * 3600)),
            connect_timeout: Duration::from_secs(5),
            timeout: Duration::from_secs(15),
            retry_first: Duration::from_secs(1),
            retry_max: Duration::from_secs(600),
            ack_wait: Duration::from_secs(30),
        }
    }
}

impl Settings {
    /// Reads the `DELTA_WEBHOOK_*` settings, adding any error to `s`.
    pub fn parse(s: &mut Parsed) -> Settings {
        let (allow_text, allow_from) = s.get("DELTA_WEBHOOK_ALLOW");
        let allow = match allow::Allow::parse(&allow_text) {
            Ok(a) => a,
            Err(e) => {
                s.errors.push(format!("{allow_from}: {e}"));
                allow::Allow::default()
            }
        };
        let disable_after = s.period("DELTA_WEBHOOK_DISABLE_AFTER");
        let connect_timeout = s.seconds("DELTA_WEBHOOK_CONNECT_TIMEOUT_S", 0.1);
        let timeout = s.seconds("DELTA_WEBHOOK_TIMEOUT_S", 0.1);
        let retry_first = s.seconds("DELTA_WEBHOOK_RETRY_FIRST_S", 0.01);
        let retry_max = s.seconds("DELTA_WEBHOOK_RETRY_MAX_S", 0.01);
        let ack_wait = s.seconds("DELTA_WEBHOOK_ACK_WAIT_S", 1.0);
        Settings {
            allow: Arc::new(allow),
            disable_after,
            connect_timeout,
            timeout,
            retry_first,
            retry_max: retry_max.max(retry_first),
            ack_wait,
        }
    }
}

type Shared = State<Arc<Gateway>>;

/// The URL as shown and logged: its scheme, host and port only. Receivers often carry a
/// token in the path (`/services/T…/B…/<token>`) or the query, and both stay hidden.
pub fn redacted(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(u) => {
            let host = u.host_str().unwrap_or_default();
            let port = u.port().map(|p| format!(":{p}")).unwrap_or_default();
            let rest = if u.path() == "/" && u.query().is_none() {
                "/"
            } else {
                "/…"
            };
            format!("{}://{host}{port}{rest}", u.scheme())
        }
        Err(_) => "(not a URL)".to_owned(),
    }
}

fn view(w: &Webhook) -> WebhookView {
    WebhookView {
        id: w.id.clone(),
        url: redacted(&w.url),
        events: w.events.clone(),
        agents: w.agents.clone(),
        description: w.description.clone(),
        created_by: w.created_by.clone(),
        created_at: w.created_at,
        state: match w.state {
            WebhookState::Active => "active".into(),
            WebhookState::Disabled => "disabled".into(),
        },
        disabled_reason: w.disabled_reason.clone(),
        disabled_at: w.disabled_at,
        failing_since: w.failing_since,
        last_success_at: w.last_success_at,
        last_error: w.last_error.clone(),
        deliveries: w.deliveries,
        failures: w.failures,
        previous_secret_until: w
            .previous_secret_until
            .filter(|u| u.micros() > Timestamp::now().micros()),
    }
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::InvalidArgs, message)
}

fn no_key() -> ApiError {
    invalid(
        "webhooks need DELTA_SECRETS_KEY on the gateways: their signing secrets are stored sealed with it, never in clear (docs/webhooks.md)",
    )
}

fn missing(id: &str) -> ApiError {
    ApiError::not_found(format!("no webhook {id}; GET /v1/webhooks lists them"))
}

fn body_or_empty<T: serde::de::DeserializeOwned + Default>(
    bytes: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let bytes = crate::api::body_bytes(bytes)?;
    if bytes.is_empty() {
        return Ok(T::default());
    }
    strict_json(&bytes)
}

/// Checks a subscription's settings; the event types as the consumer filters them.
pub async fn check(b: &WebhookBody, settings: &Settings) -> Result<Vec<EventType>, ApiError> {
    if b.url.len() > 2048 {
        return Err(invalid("`url` is longer than 2048 characters"));
    }
    let mut events = vec![];
    for e in &b.events {
        let ty: EventType = e
            .parse()
            .map_err(|m: String| invalid(format!("`events`: {m}")))?;
        if !events.contains(&ty) {
            events.push(ty);
        }
    }
    if b.agents.len() > 100 {
        return Err(invalid("`agents`: at most 100"));
    }
    for a in &b.agents {
        if !crate::ops::valid_agent_name(a) {
            return Err(invalid(format!("`agents`: `{a}` is not an agent name")));
        }
    }
    if b.description.as_ref().is_some_and(|d| d.len() > 500) {
        return Err(invalid("`description` is longer than 500 characters"));
    }
    // The address last: resolving a name is the one slow check.
    let target = allow::check_url(&b.url, &settings.allow).map_err(invalid)?;
    allow::check_resolved(&target, &settings.allow)
        .await
        .map_err(invalid)?;
    Ok(events)
}

pub async fn create(
    State(gw): Shared,
    headers: HeaderMap,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let who = caller(&gw, &headers, &[Role::Operate])?;
    let bytes = crate::api::body_bytes(bytes)?;
    if bytes.is_empty() {
        return Err(ApiError::bad_request(
            "the body is empty: send the subscription as JSON, e.g. {\"url\": \"https://…\"}",
        ));
    }
    let b: WebhookBody = strict_json(&bytes)?;
    if !gw.store.can_seal() {
        return Err(no_key());
    }
    let events = check(&b, &gw.config.webhooks).await?;
    if gw.store.webhooks().await?.len() >= MAX_WEBHOOKS {
        return Err(invalid(format!(
            "this fleet has {MAX_WEBHOOKS} webhooks already: delete one first"
        )));
    }
    let secret = sign::new_secret()
        .map_err(|e| ApiError::unavailable(format!("cannot make a secret: {e}")))?;
    let mut agents = b.agents.clone();
    agents.dedup();
    let w = Webhook {
        id: uuid::Uuid::now_v7().to_string(),
        url: b.url.trim().to_owned(),
        events: events.iter().map(|e| e.name().to_owned()).collect(),
        agents,
        description: b.description.filter(|d| !d.trim().is_empty()),
        created_by: who.name.clone().unwrap_or_else(|| "anonymous".into()),
        created_at: Timestamp::now(),
        state: WebhookState::Active,
        disabled_reason: None,
        disabled_at: None,
        failing_since: None,
        last_success_at: None,
        last_error: None,
        deliveries: 0,
        failures: 0,
        previous_secret_until: None,
    };
    // The consumer first: its start is the subscription's, and a subscription without one
    // would be delivered from wherever a gateway happened to create it.
    gw.queue
        .webhook_consumer(&deliver::consumer_of(&gw, &w, &events))
        .await?;
    if let Err(e) = gw.store.create_webhook(&w, &secret).await {
        // No subscription, so no consumer left behind for it.
        if let Err(d) = gw.queue.delete_webhook_consumer(&w.id).await {
            tracing::warn!(id = %w.id, error = %delta_host::Chain(&d), "webhooks: the consumer of a subscription that was not stored is left behind");
        }
        return Err(e.into());
    }
    tracing::info!(id = %w.id, url = %redacted(&w.url), "webhook subscribed");
    Ok((
        StatusCode::CREATED,
        Json(WebhookCreated {
            webhook: view(&w),
            secret,
        }),
    )
        .into_response())
}

pub async fn list(State(gw): Shared, headers: HeaderMap) -> Result<Json<WebhookList>, ApiError> {
    caller(&gw, &headers, &[Role::Operate])?;
    Ok(Json(WebhookList {
        webhooks: gw.store.webhooks().await?.iter().map(view).collect(),
    }))
}

pub async fn get(
    State(gw): Shared,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<WebhookView>, ApiError> {
    caller(&gw, &headers, &[Role::Operate])?;
    let w = gw.store.webhook(&id).await?.ok_or_else(|| missing(&id))?;
    Ok(Json(view(&w)))
}

pub async fn delete(
    State(gw): Shared,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<WebhookView>, ApiError> {
    caller(&gw, &headers, &[Role::Operate])?;
    let Some(w) = gw.store.webhook(&id).await? else {
        // A delete retried after it removed the subscription but not its consumer (NATS away,
        // the gateway stopped): the consumer goes now, or it would be left for ever.
        if uuid::Uuid::parse_str(&id).is_ok()
            && let Ok(true) = gw.queue.delete_webhook_consumer(&id).await
        {
            tracing::info!(id = %id, "webhooks: a deleted subscription's consumer removed");
        }
        return Err(missing(&id));
    };
    gw.store.delete_webhook(&id).await?;
    gw.queue.delete_webhook_consumer(&id).await?;
    tracing::info!(id = %id, "webhook deleted");
    Ok(Json(view(&w)))
}

pub async fn rotate(
    State(gw): Shared,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Json<WebhookCreated>, ApiError> {
    caller(&gw, &headers, &[Role::Operate])?;
    let b: RotateBody = body_or_empty(bytes)?;
    let grace = b.grace_seconds.map_or(DEFAULT_GRACE, Duration::from_secs);
    if grace > MAX_GRACE {
        return Err(invalid(format!(
            "`grace_seconds` is at most {} (7 days)",
            MAX_GRACE.as_secs()
        )));
    }
    if !gw.store.can_seal() {
        return Err(no_key());
    }
    let secret = sign::new_secret()
        .map_err(|e| ApiError::unavailable(format!("cannot make a secret: {e}")))?;
    let until = Timestamp::now().plus_seconds(grace.as_secs());
    if !gw.store.rotate_webhook_secret(&id, &secret, until).await? {
        return Err(missing(&id));
    }
    let w = gw.store.webhook(&id).await?.ok_or_else(|| missing(&id))?;
    tracing::info!(id = %id, grace_s = grace.as_secs(), "webhook secret rotated");
    Ok(Json(WebhookCreated {
        webhook: view(&w),
        secret,
    }))
}

pub async fn enable(
    State(gw): Shared,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<WebhookView>, ApiError> {
    caller(&gw, &headers, &[Role::Operate])?;
    if !gw.store.enable_webhook(&id).await? {
        return Err(missing(&id));
    }
    let w = gw.store.webhook(&id).await?.ok_or_else(|| missing(&id))?;
    tracing::info!(id = %id, "webhook enabled");
    Ok(Json(view(&w)))
}

pub async fn disable(
    State(gw): Shared,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<WebhookView>, ApiError> {
    let who = caller(&gw, &headers, &[Role::Operate])?;
    let by = who.name.unwrap_or_else(|| "an operator".into());
    let reason = format!("disabled by {by}");
    if !gw
        .store
        .disable_webhook(&id, &reason, Timestamp::now())
        .await?
    {
        return Err(missing(&id));
    }
    let w = gw.store.webhook(&id).await?.ok_or_else(|| missing(&id))?;
    tracing::info!(id = %id, "webhook disabled");
    Ok(Json(view(&w)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<crate::Config, Vec<String>> {
        let mut env: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        env.insert(
            "DELTA_AGENTS_DIR".into(),
            std::env::temp_dir().display().to_string(),
        );
        env.insert("DELTA_GATEWAY_AUTH".into(), "off".into());
        crate::config::parse(&[], &env)
    }

    #[test]
    fn settings_have_defaults_and_bad_ones_are_all_reported() {
        let c = parse(&[]).expect("defaults");
        let w = &c.webhooks;
        assert_eq!(w.disable_after, Some(Duration::from_secs(72 * 3600)));
        assert_eq!(w.timeout, Duration::from_secs(15));
        assert!(w.allow.permits("x", "10.0.0.1".parse().unwrap()).is_err());
        let c = parse(&[
            ("DELTA_WEBHOOK_ALLOW", "10.0.0.0/8, hooks.internal"),
            ("DELTA_WEBHOOK_DISABLE_AFTER", "off"),
        ])
        .expect("valid");
        assert!(
            c.webhooks
                .allow
                .permits("x", "10.0.0.1".parse().unwrap())
                .is_ok()
        );
        assert_eq!(c.webhooks.disable_after, None);
        let errs = parse(&[
            ("DELTA_WEBHOOK_ALLOW", "10.0.0.0/40"),
            ("DELTA_WEBHOOK_DISABLE_AFTER", "soon"),
            ("DELTA_WEBHOOK_TIMEOUT_S", "0"),
        ])
        .expect_err("invalid");
        for needle in [
            "DELTA_WEBHOOK_ALLOW",
            "DELTA_WEBHOOK_DISABLE_AFTER",
            "DELTA_WEBHOOK_TIMEOUT_S",
        ] {
            assert!(
                errs.iter().any(|e| e.contains(needle)),
                "{needle}: {errs:#?}"
            );
        }
    }

    #[test]
    fn a_url_is_shown_without_its_path_or_query() {
        assert_eq!(
            redacted("https://h.example/a?token=s3cret"),
            "https://h.example/…"
        );
        assert_eq!(
            redacted("https://hooks.example:8443/services/T1/B2/s3cret"),
            "https://hooks.example:8443/…"
        );
        assert_eq!(redacted("https://h.example/"), "https://h.example/");
        assert_eq!(redacted("not a url"), "(not a URL)");
    }
}
