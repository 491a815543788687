//! A2A push notifications: per-task configs (`Create`/`Get`/`List`/`Delete`
//! `TaskPushNotificationConfig`), kept in Redis ([`delta_store::redis::A2aPushConfig`]), and
//! their delivery.
//!
//! **Ownership and limits.** A config is its creator's (`created_by`, the token's name): only
//! they or an operator get, replace or delete it; `List` shows the caller's own (all to an
//! operator); another caller's config is "not found", as in the SDK's reference server, which
//! keeps configs per owner. Its id is unique within the task, so a create reusing another
//! caller's id is refused. Limits: [`MAX_PER_TASK`] per caller and task, [`MAX_PER_CALLER`] per
//! caller, [`MAX_FLEET`] in all, checked and written in one Redis script.
//!
//! **Cost.** One durable consumer per config, pulled by every gateway (a pull waits
//! [`PULL_EXPIRY`]); the config set is read every [`EVERY`]. A consumer nobody pulled for
//! [`INACTIVE`] is removed by JetStream, so one leaked by a config deleted while the gateways
//! were down goes away. One shared consumer fanning out to the configs would cost less at
//! scale; the per-config design is kept for its ordering and failover, under these limits.
//!
//! **Delivery** is driven from JetStream, not memory: each config has a durable consumer
//! `<p>-a2apush-<hash>` on the events stream, filtered to its run's events, from the run's
//! first event on. Every gateway pulls from every config's consumer; the consumer hands out one
//! event at a time (`max_ack_pending` 1), so a task's notifications are posted in order, by
//! whichever gateway holds it, and an event is acknowledged only once its receiver answered 2xx:
//! a gateway that dies mid-delivery leaves it to be handed out again after the ack wait
//! (`DELTA_WEBHOOK_ACK_WAIT_S`). At least once: a receiver may see a notification twice.
//!
//! Each notification is a `StreamResponse` with a `statusUpdate` made from the event itself
//! (a question asked: `input-required` or `auth-required`, without a link; answered or expired:
//! `working`; the run's end), posted with the same outbound protections as webhooks
//! (`DELTA_WEBHOOK_ALLOW`, timeouts, no redirects, no proxies: [`crate::webhooks::deliver::client`])
//! and retried with their backoff (`DELTA_WEBHOOK_RETRY_*`). It carries
//! `Authorization: Bearer <JWT>` signed with the gateway's key ([`super::jwt`]), its `aud` the
//! origin of the config's URL ([`audience`]), and the config's `token` in
//! `X-A2A-Notification-Token`. A post longer than the ack wait is kept with progress acks. The
//! give-up rule (`DELTA_WEBHOOK_DISABLE_AFTER`) counts from the first failure of the event for
//! the config; this gateway's own failures (a token it cannot open) never count, and a gateway
//! without `DELTA_SECRETS_KEY` leaves configs with a token to the others. Once the run's end is delivered, the config
//! and its consumer are deleted.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer};
use axum::http::HeaderMap;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use delta_api::ErrorCode;
use delta_protocol::events::{self as ev, EventType, RunFinished};
use delta_protocol::{InteractionRequest, RunId, Timestamp};
use delta_store::redis::{A2aPushConfig, DeletePush, PutPush};

use super::rpc::{self, PUSH_NOT_SUPPORTED, READ, RpcError};
use super::task::{self, State};
use crate::Gateway;
use crate::api::caller;
use crate::auth::{Identity, Role};
use crate::error::ApiError;
use crate::webhooks::{allow, deliver};

/// Configs one caller may have on one task.
pub const MAX_PER_TASK: usize = 10;
/// Configs one caller may have on the fleet.
pub const MAX_PER_CALLER: usize = 100;
/// Configs the fleet may have (each is a JetStream consumer and a puller on every gateway).
pub const MAX_FLEET: usize = 2000;
/// How often the configs are listed (a config made on this gateway is seen at once).
const EVERY: Duration = Duration::from_secs(5);
/// How long a pull waits for an event before asking again.
const PULL_EXPIRY: Duration = Duration::from_secs(30);
/// How often a session checks that its run still exists (retention deletes runs).
const RUN_CHECK: Duration = Duration::from_secs(60);
/// A config's consumer that no gateway pulled from for this long is deleted by JetStream: a
/// consumer leaked by a config deleted while its gateway was down goes away.
const INACTIVE: Duration = Duration::from_secs(6 * 3600);

/// Wakes this gateway's delivery loop when a config is made here.
static RESCAN: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// The limits, as the store applies them.
const LIMITS: delta_store::redis::PushLimits = delta_store::redis::PushLimits {
    per_task: MAX_PER_TASK,
    per_caller: MAX_PER_CALLER,
    fleet: MAX_FLEET,
};

/// `TaskPushNotificationConfig` as a client sends it.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConfigIn {
    #[serde(default)]
    pub tenant: Option<String>,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub task_id: Option<String>,
    pub url: String,
    #[serde(default)]
    pub token: Option<String>,
    #[serde(default)]
    pub authentication: Option<Value>,
}

/// `Get…` and `Delete…` params.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConfigRef {
    #[serde(default)]
    pub tenant: Option<String>,
    pub task_id: String,
    pub id: String,
}

/// `ListTaskPushNotificationConfigs` params.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConfigList {
    #[serde(default)]
    pub tenant: Option<String>,
    pub task_id: String,
    #[serde(default)]
    pub page_size: Option<i64>,
    #[serde(default)]
    pub page_token: Option<String>,
}

/// A config as shown: its URL without path or query (receivers carry tokens there) and never
/// its token.
fn view(c: &A2aPushConfig) -> Value {
    json!({
        "id": c.id,
        "taskId": c.task_id,
        "url": crate::webhooks::redacted(&c.url),
    })
}

fn invalid(message: impl Into<String>) -> RpcError {
    ApiError::new(ErrorCode::InvalidArgs, message).into()
}

fn supported(gw: &Gateway) -> Result<(), RpcError> {
    if gw.config.a2a.signing_key.is_none() {
        return Err(RpcError::new(
            PUSH_NOT_SUPPORTED,
            "push notifications are off on this fleet: they need DELTA_A2A_SIGNING_KEY (docs/protocols.md)",
        ));
    }
    Ok(())
}

fn valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// The durable consumer of a config.
fn consumer_name(gw: &Gateway, task_id: &str, id: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, format!("{task_id}/{id}").as_bytes());
    let hex: String = digest.as_ref()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{}-a2apush-{hex}", gw.config.prefix)
}

async fn events_stream(gw: &Gateway) -> Result<jetstream::stream::Stream, String> {
    jetstream::new(gw.queue.client().clone())
        .get_stream(gw.queue.names().interactions_stream())
        .await
        .map_err(|e| format!("cannot open the events stream: {e}"))
}

/// Creates a config's consumer, or gets it.
async fn ensure_consumer(
    gw: &Gateway,
    run_id: RunId,
    id: &str,
) -> Result<consumer::PullConsumer, String> {
    let name = consumer_name(gw, &run_id.to_string(), id);
    events_stream(gw)
        .await?
        .get_or_create_consumer(
            &name,
            consumer::pull::Config {
                durable_name: Some(name.clone()),
                description: Some("A2A push notifications of one task (docs/protocols.md)".into()),
                filter_subjects: super::events::run_filters(gw, run_id),
                deliver_policy: consumer::DeliverPolicy::All,
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: gw.config.webhooks.ack_wait,
                max_ack_pending: 1,
                inactive_threshold: INACTIVE,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| format!("cannot create the consumer: {e}"))
}

async fn delete_consumer(gw: &Gateway, task_id: &str, id: &str) {
    let name = consumer_name(gw, task_id, id);
    if let Ok(stream) = events_stream(gw).await
        && let Err(e) = stream.delete_consumer(&name).await
    {
        tracing::debug!(error = %e, "a2a push: consumer not deleted");
    }
}

/// Checks a config's settings, before anything is started or stored: the URL (allowlist,
/// resolved now, under [`policy`] for `listed`), the id, the token and `authentication`. The
/// config's id.
pub async fn check(gw: &Gateway, c: &ConfigIn, listed: bool) -> Result<String, RpcError> {
    supported(gw)?;
    if c.authentication.is_some() {
        return Err(invalid(
            "`authentication` is not kept: notifications carry a JWT signed with this gateway's key (JWKS at /.well-known/jwks.json), and `token` is echoed in X-A2A-Notification-Token",
        ));
    }
    let id =
        c.id.clone()
            .filter(|i| !i.is_empty())
            .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
    if !valid_id(&id) {
        return Err(invalid("`id`: 1 to 64 letters, digits, `-`, `_` or `.`"));
    }
    if c.url.len() > 2048 {
        return Err(invalid("`url` is longer than 2048 characters"));
    }
    if c.token.as_ref().is_some_and(|t| t.len() > 512) {
        return Err(invalid("`token` is longer than 512 characters"));
    }
    if c.token.as_ref().is_some_and(|t| !t.is_empty()) && !gw.store.can_seal() {
        return Err(invalid(
            "a push config's `token` is stored sealed: this fleet needs DELTA_SECRETS_KEY for it (or send no token)",
        ));
    }
    let allow = policy(gw, listed);
    let target = allow::check_url(&c.url, &allow).map_err(invalid)?;
    allow::check_resolved(&target, &allow)
        .await
        .map_err(invalid)?;
    Ok(id)
}

/// Where a config may send besides public addresses: `DELTA_A2A_PUSH_ALLOW`'s exceptions
/// (none by default), and `DELTA_WEBHOOK_ALLOW`'s as well for a config an operator set
/// (`listed`). Any caller who may read a task may set its configs, so the webhooks' exceptions,
/// which are for the operators' own receivers (often private addresses), would otherwise let
/// anyone with a token have the gateway post into them.
fn policy(gw: &Gateway, listed: bool) -> Arc<allow::Allow> {
    if listed {
        Arc::new(gw.config.webhooks.allow.and(&gw.config.a2a.push_allow))
    } else {
        gw.config.a2a.push_allow.clone()
    }
}

/// The two policies of deliveries ([`policy`]), each with its HTTP client, which resolves names
/// to the addresses the policy allows only.
#[derive(Clone)]
struct Clients {
    listed: (Arc<allow::Allow>, reqwest::Client),
    public: (Arc<allow::Allow>, reqwest::Client),
}

impl Clients {
    fn new(gw: &Gateway) -> Result<Clients, reqwest::Error> {
        let under = |listed: bool| {
            let allow = policy(gw, listed);
            let settings = crate::webhooks::Settings {
                allow: allow.clone(),
                ..gw.config.webhooks.clone()
            };
            deliver::client(&settings).map(|client| (allow, client))
        };
        Ok(Clients {
            listed: under(true)?,
            public: under(false)?,
        })
    }

    /// Config `c`'s policy and client.
    fn of(&self, gw: &Gateway, c: &A2aPushConfig) -> &(Arc<allow::Allow>, reqwest::Client) {
        if listed(gw, c) {
            &self.listed
        } else {
            &self.public
        }
    }
}

/// Whether config `c` may reach `DELTA_WEBHOOK_ALLOW`'s exceptions: an operator set it. A config
/// stored before that was recorded is judged by its creator's roles now (with authentication
/// off, everyone is an operator), so an operator's config to a private receiver goes on.
fn listed(gw: &Gateway, c: &A2aPushConfig) -> bool {
    c.allow_listed.unwrap_or_else(|| {
        gw.config
            .auth
            .grants(c.created_by.as_deref(), crate::auth::Role::Operate)
    })
}

/// `CreateTaskPushNotificationConfig`, or a `SendMessage`'s config for the task it started
/// or continued (`task`; checked with [`check`] before the message was taken).
pub async fn create(
    gw: &Arc<Gateway>,
    headers: &HeaderMap,
    c: ConfigIn,
    task: Option<RunId>,
) -> Result<Value, RpcError> {
    supported(gw)?;
    let who = caller(gw, headers, READ)?;
    let id = check(gw, &c, who.has(Role::Operate)).await?;
    let run_id = match (task, c.task_id.as_deref()) {
        (Some(t), _) => t,
        (None, Some(t)) => rpc::task_id(t)?,
        (None, None) => return Err(RpcError::params("`params.taskId` is required")),
    };
    gw.store.record(run_id).await?;
    // Keyed on the canonical run id, whatever spelling of it the client sent.
    let task_id = run_id.to_string();
    let sealed_token = match c.token.as_deref().filter(|t| !t.is_empty()) {
        Some(t) => Some(gw.store.a2a_seal_token(&task_id, &id, t).map_err(|_| {
            invalid("a push config's `token` is stored sealed: this fleet needs DELTA_SECRETS_KEY for it (or send no token)")
        })?),
        None => None,
    };
    // An operator replacing someone's config leaves it theirs (the store refuses anyone else).
    let operator = who.has(Role::Operate);
    let mut created_by = who.name.clone();
    if operator
        && let Some(old) = gw.store.a2a_push(&task_id, &id).await?
        && old.created_by != created_by
    {
        created_by = old.created_by;
    }
    let config = A2aPushConfig {
        id: id.clone(),
        task_id: task_id.clone(),
        url: c.url.trim().to_owned(),
        sealed_token,
        created_by,
        created_at: Timestamp::now(),
        allow_listed: Some(operator),
    };
    // The consumer first: it starts at the run's first event whenever it is made, and a config
    // without one would wait for the delivery loop to make it.
    ensure_consumer(gw, run_id, &id).await.map_err(|e| {
        tracing::warn!(error = %e, "a2a push: no consumer");
        RpcError::from(ApiError::unavailable(
            "cannot set up the delivery (NATS); try again",
        ))
    })?;
    let full = |what: String| -> RpcError {
        ApiError::new(ErrorCode::RateLimited, format!("{what}: delete one first")).into()
    };
    let refused = match gw.store.a2a_put_push(&config, operator, LIMITS).await? {
        PutPush::Stored => None,
        PutPush::Taken => {
            // The consumer made above is the config's owner's: it stays.
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                format!("push config `{id}` of this task is someone else's: choose another id"),
            )
            .into());
        }
        PutPush::TaskFull => Some(full(format!(
            "you have {MAX_PER_TASK} push configs on this task, the most one caller may"
        ))),
        PutPush::CallerFull => Some(full(format!(
            "you have {MAX_PER_CALLER} push configs, the most one caller may"
        ))),
        PutPush::FleetFull => Some(full(format!(
            "this fleet has {MAX_FLEET} push configs, the most it keeps"
        ))),
    };
    if let Some(refused) = refused {
        // No config has this id (else it would have been replaced or taken): the consumer made
        // for it goes, or refused calls would leave consumers past every limit.
        delete_consumer(gw, &task_id, &id).await;
        return Err(refused);
    }
    RESCAN.notify_one();
    tracing::info!(task = %task_id, id = %id, url = %crate::webhooks::redacted(&config.url), "a2a push config set");
    Ok(view(&config))
}

/// Whether `who` may see and change config `c`: its creator, or an operator.
fn owns(who: &Identity, c: &A2aPushConfig) -> bool {
    who.has(Role::Operate) || c.created_by == who.name
}

fn not_found(id: &str) -> RpcError {
    ApiError::new(
        ErrorCode::NotFound,
        format!(
            "no push config `{}` of yours on this task",
            id.chars().take(64).collect::<String>()
        ),
    )
    .into()
}

/// Config `id` of task `task_id`, if `who` may see it (someone else's is not found, as in the
/// SDK's reference server, which keeps configs per owner).
async fn found(
    gw: &Gateway,
    who: &Identity,
    task_id: &str,
    id: &str,
) -> Result<(RunId, A2aPushConfig), RpcError> {
    let run_id = rpc::task_id(task_id)?;
    gw.store.record(run_id).await?;
    match gw.store.a2a_push(&run_id.to_string(), id).await? {
        Some(c) if owns(who, &c) => Ok((run_id, c)),
        _ => Err(not_found(id)),
    }
}

pub async fn get(gw: &Arc<Gateway>, headers: &HeaderMap, p: ConfigRef) -> Result<Value, RpcError> {
    supported(gw)?;
    let who = caller(gw, headers, READ)?;
    Ok(view(&found(gw, &who, &p.task_id, &p.id).await?.1))
}

pub async fn list(
    gw: &Arc<Gateway>,
    headers: &HeaderMap,
    p: ConfigList,
) -> Result<Value, RpcError> {
    supported(gw)?;
    let who = caller(gw, headers, READ)?;
    let run_id = rpc::task_id(&p.task_id)?;
    gw.store.record(run_id).await?;
    let configs: Vec<Value> = gw
        .store
        .a2a_pushes_of(&run_id.to_string())
        .await?
        .iter()
        .filter(|c| owns(&who, c))
        .map(view)
        .collect();
    Ok(json!({"configs": configs, "nextPageToken": ""}))
}

pub async fn delete(
    gw: &Arc<Gateway>,
    headers: &HeaderMap,
    p: ConfigRef,
) -> Result<Value, RpcError> {
    supported(gw)?;
    let who = caller(gw, headers, READ)?;
    let (run_id, _) = found(gw, &who, &p.task_id, &p.id).await?;
    let task_id = run_id.to_string();
    let by = (!who.has(Role::Operate)).then_some(who.name.as_deref());
    match gw.store.a2a_delete_push(&task_id, &p.id, by).await? {
        DeletePush::Deleted => {}
        DeletePush::NotFound | DeletePush::NotYours => return Err(not_found(&p.id)),
    }
    delete_consumer(gw, &task_id, &p.id).await;
    tracing::info!(task = %task_id, id = %p.id, "a2a push config deleted");
    Ok(json!({}))
}

/// Deletes a config and its consumer, whoever made it (the delivery loop, and a `SendMessage`
/// whose answer was refused after its config was made).
pub(crate) async fn forget(gw: &Gateway, task_id: &str, id: &str) {
    if let Err(e) = gw.store.a2a_delete_push(task_id, id, None).await {
        tracing::warn!(task = %task_id, id = %id, error = %delta_host::Chain(&e), "a2a push: config not deleted");
    }
    delete_consumer(gw, task_id, id).await;
}

/// Keeps a delivery session per config until shutdown.
pub async fn run(gw: Arc<Gateway>) {
    if gw.config.a2a.signing_key.is_none() {
        return;
    }
    let http = match Clients::new(&gw) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %delta_host::Chain(&e), "a2a push: no HTTP client; none will be delivered by this gateway");
            return;
        }
    };
    let mut sessions: HashMap<(String, String), (CancellationToken, tokio::task::JoinHandle<()>)> =
        HashMap::new();
    // Configs whose token this gateway cannot open (no DELTA_SECRETS_KEY): not delivered here.
    let mut sealed: HashSet<(String, String)> = HashSet::new();
    loop {
        tokio::select! {
            () = tokio::time::sleep(EVERY) => {}
            () = RESCAN.notified() => {}
            () = gw.shutdown.cancelled() => break,
        }
        sessions.retain(|_, (_, h)| !h.is_finished());
        let all: HashSet<(String, String)> = match gw.store.a2a_all_pushes().await {
            Ok(l) => l.into_iter().collect(),
            Err(e) => {
                tracing::warn!(error = %delta_host::Chain(&e), "a2a push: cannot list configs");
                continue;
            }
        };
        for (key, (stop, _)) in &sessions {
            if !all.contains(key) {
                stop.cancel();
            }
        }
        sealed.retain(|k| all.contains(k));
        for key in all {
            if sessions.contains_key(&key) || sealed.contains(&key) {
                continue;
            }
            if !gw.store.can_seal()
                && let Ok(Some(c)) = gw.store.a2a_push(&key.0, &key.1).await
                && c.sealed_token.is_some()
            {
                tracing::warn!(task = %key.0, id = %key.1, "a2a push: the config has a token and this gateway has no DELTA_SECRETS_KEY to open it; it is left to gateways that have");
                sealed.insert(key);
                continue;
            }
            let stop = gw.shutdown.child_token();
            let handle = tokio::spawn(session(
                gw.clone(),
                http.clone(),
                key.0.clone(),
                key.1.clone(),
                stop.clone(),
            ));
            sessions.insert(key, (stop, handle));
        }
    }
    for (_, (stop, handle)) in sessions {
        stop.cancel();
        let _ = handle.await;
    }
}

async fn session(
    gw: Arc<Gateway>,
    http: Clients,
    task_id: String,
    id: String,
    stop: CancellationToken,
) {
    if let Err(e) = session_inner(&gw, &http, &task_id, &id, &stop).await {
        tracing::warn!(task = %task_id, id = %id, error = %e, "a2a push session ended; starting again");
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
            () = stop.cancelled() => {}
        }
    }
}

/// Whether run `run_id` was deleted (retention): its configs go with it.
async fn run_gone(gw: &Gateway, run_id: RunId) -> bool {
    matches!(
        gw.store.record(run_id).await,
        Err(delta_store::Error::NotFound(_))
    )
}

async fn session_inner(
    gw: &Arc<Gateway>,
    http: &Clients,
    task_id: &str,
    id: &str,
    stop: &CancellationToken,
) -> Result<(), String> {
    let Ok(run_id) = task_id.parse::<RunId>() else {
        forget(gw, task_id, id).await;
        return Ok(());
    };
    if run_gone(gw, run_id).await {
        forget(gw, task_id, id).await;
        return Ok(());
    }
    let consumer = ensure_consumer(gw, run_id, id).await?;
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(1)
        .expires(PULL_EXPIRY)
        .messages()
        .await
        .map_err(|e| format!("cannot pull: {e}"))?;
    let mut run_check = tokio::time::interval(RUN_CHECK);
    run_check.tick().await;
    loop {
        let msg = tokio::select! {
            () = stop.cancelled() => return Ok(()),
            _ = run_check.tick() => {
                if run_gone(gw, run_id).await {
                    forget(gw, task_id, id).await;
                    return Ok(());
                }
                continue;
            }
            m = messages.next() => match m {
                None => return Err("the pull ended".into()),
                Some(Err(e)) => return Err(format!("pull: {e}")),
                Some(Ok(msg)) => msg,
            },
        };
        let Some(config) = gw
            .store
            .a2a_push(task_id, id)
            .await
            .map_err(|e| delta_host::Chain(&e).to_string())?
        else {
            // Deleted meanwhile: the event stays for nobody.
            delete_consumer(gw, task_id, id).await;
            return Ok(());
        };
        if run_gone(gw, run_id).await {
            forget(gw, task_id, id).await;
            return Ok(());
        }
        let Some((body, end, event_id)) = notification(run_id, &msg.payload) else {
            let _ = msg.double_ack().await;
            continue;
        };
        let delivered = msg.info().map(|i| i.delivered).unwrap_or(1);
        let s = &gw.config.webhooks;
        // The post may outlast the ack wait (slow receiver, retries of DNS): the event is kept
        // ours meanwhile, as webhooks do.
        let mut progress = tokio::time::interval((s.ack_wait / 3).max(Duration::from_millis(500)));
        progress.tick().await;
        let mut attempt = std::pin::pin!(post(gw, http, &config, &body));
        let outcome = loop {
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                _ = progress.tick() => {
                    let _ = msg.ack_with(AckKind::Progress).await;
                }
                r = &mut attempt => break r,
            }
        };
        match outcome {
            Ok(()) => {
                if let Err(e) = msg.double_ack().await {
                    tracing::warn!(task = %task_id, error = %e, "a2a push: an ack was lost (a duplicate may follow)");
                }
                if let Err(e) = gw.store.a2a_push_delivered(task_id, id).await {
                    tracing::debug!(error = %delta_host::Chain(&e), "a2a push: failures not cleared");
                }
                if end {
                    forget(gw, task_id, id).await;
                    return Ok(());
                }
            }
            Err(Failure::Ours(why)) => {
                // Not the receiver's doing: never counted against the config.
                tracing::warn!(task = %task_id, id = %id, error = %why, "a2a push: cannot post; retrying later");
                let _ = msg.ack_with(AckKind::Nak(Some(s.retry_max))).await;
            }
            Err(Failure::Receiver(why)) => {
                // As a webhook is disabled (DELTA_WEBHOOK_DISABLE_AFTER): an event refused for
                // that long since its first failure ends the config, rather than holding the
                // task's later ones forever.
                if let Some(after) = s.disable_after {
                    let now = Timestamp::now();
                    let since = gw
                        .store
                        .a2a_push_failing_since(
                            task_id,
                            id,
                            &event_id,
                            now,
                            after + Duration::from_secs(86_400),
                        )
                        .await
                        .unwrap_or(now);
                    let failing = Duration::from_micros(
                        u64::try_from(now.micros().saturating_sub(since.micros())).unwrap_or(0),
                    );
                    if failing >= after {
                        tracing::warn!(task = %task_id, id = %id, error = %why, "a2a push: an event refused for longer than DELTA_WEBHOOK_DISABLE_AFTER; the config is deleted");
                        forget(gw, task_id, id).await;
                        return Ok(());
                    }
                }
                let wait = deliver::backoff(
                    s.retry_first,
                    s.retry_max,
                    u32::try_from(delivered).unwrap_or(u32::MAX),
                    0.0,
                );
                tracing::info!(task = %task_id, id = %id, attempt = delivered, error = %why, "a2a push attempt failed");
                let _ = msg.ack_with(AckKind::Nak(Some(wait))).await;
            }
        }
    }
}

/// Why a post failed.
enum Failure {
    /// The receiver: counted towards DELTA_WEBHOOK_DISABLE_AFTER.
    Receiver(String),
    /// This gateway (no signing key, a token it cannot open): never counted.
    Ours(String),
}

/// The notification of one event of `run_id`: a `StreamResponse` with its `statusUpdate`, and
/// whether it ends the run, and the event's id; `None` for an event that changes nothing a client sees (a claim, an
/// escalation, a question closed because its run was cancelled: the run's end follows).
pub fn notification(run_id: RunId, payload: &[u8]) -> Option<(Vec<u8>, bool, String)> {
    let ce = ev::decode::<Value>(payload).ok()?;
    let ty = EventType::from_ce_type(&ce.ty)?;
    let (state, message) = match ty {
        EventType::InteractionRequested => {
            let q: InteractionRequest = serde_json::from_value(ce.data.clone()).ok()?;
            let (state, message) = task::question_status(run_id, &q, Ok(None));
            (state, Some(message))
        }
        EventType::InteractionAnswered | EventType::InteractionExpired => (State::Working, None),
        EventType::RunCompleted | EventType::RunFailed | EventType::RunCancelled => {
            let f: RunFinished = serde_json::from_value(ce.data.clone()).ok()?;
            task::ended_status(run_id, f.status, f.result, f.error)
        }
        EventType::InteractionCancelled
        | EventType::InteractionUpdated
        | EventType::InteractionEscalated => return None,
    };
    let mut status = json!({"state": state.wire(), "timestamp": ce.time.to_string()});
    if let Some(m) = message {
        status["message"] = m;
    }
    let body = json!({"statusUpdate": {
        "taskId": run_id.to_string(),
        "contextId": run_id.to_string(),
        "status": status,
        "metadata": {"event": ce.ty, "eventId": ce.id, "agent": ce.deltaagent},
    }});
    Some((body.to_string().into_bytes(), state.is_terminal(), ce.id))
}

/// The JWT's audience: the origin of the config's URL (`scheme://host[:port]`), which a
/// receiver checks is its own.
pub fn audience(url: &str) -> Option<String> {
    let u = reqwest::Url::parse(url.trim()).ok()?;
    Some(u.origin().ascii_serialization())
}

/// One attempt to post `body` to a config's URL.
async fn post(gw: &Gateway, http: &Clients, c: &A2aPushConfig, body: &[u8]) -> Result<(), Failure> {
    let key = gw
        .config
        .a2a
        .signing_key
        .as_ref()
        .ok_or_else(|| Failure::Ours("no signing key".into()))?;
    let token = gw
        .store
        .a2a_open_token(c)
        .map_err(|e| Failure::Ours(format!("cannot open the token: {}", delta_host::Chain(&e))))?;
    let (allow, client) = http.of(gw, c);
    let target = allow::check_url(&c.url, allow).map_err(Failure::Receiver)?;
    let aud = audience(&c.url).ok_or_else(|| Failure::Receiver("the URL has no origin".into()))?;
    let iat = Timestamp::now().micros() / 1_000_000;
    let issuer = format!("delta-fleet:{}", gw.config.prefix);
    let jwt = key.notification_jwt(&issuer, &aud, &c.task_id, body, iat);
    let mut request = client
        .post(target.url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(reqwest::header::AUTHORIZATION, format!("Bearer {jwt}"))
        .body(body.to_vec());
    if let Some(token) = token {
        request = request.header("X-A2A-Notification-Token", token);
    }
    let resp = request.send().await.map_err(|e| {
        let kind = if e.is_timeout() {
            "timed out"
        } else if e.is_connect() {
            "cannot connect"
        } else {
            "request failed"
        };
        Failure::Receiver(format!("{kind}: {}", delta_host::Chain(&e.without_url())))
    })?;
    let status = resp.status();
    if status.is_success() {
        Ok(())
    } else if status.is_redirection() {
        Err(Failure::Receiver(format!(
            "HTTP {status} (redirects are not followed)"
        )))
    } else {
        Err(Failure::Receiver(format!("HTTP {status}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use delta_protocol::events::{encode, requested, run_ended};
    use delta_protocol::{InteractionType, RunStatus};

    fn parse(body: &[u8]) -> Value {
        serde_json::from_slice(body).unwrap()
    }

    #[test]
    fn a_question_is_input_required_and_a_sensitive_one_auth_required_without_a_link() {
        let run = RunId::new();
        let mut q = InteractionRequest::new(run, "hello", InteractionType::UserInput, "Name?");
        let (body, end, _) =
            notification(run, &encode(&requested("delta", &q, None, None))).unwrap();
        assert!(!end);
        let n = parse(&body);
        let u = &n["statusUpdate"];
        assert_eq!(u["taskId"], run.to_string());
        assert_eq!(u["status"]["state"], "TASK_STATE_INPUT_REQUIRED");
        assert_eq!(
            u["status"]["message"]["parts"][1]["data"]["prompt"],
            "Name?"
        );
        assert_eq!(u["metadata"]["event"], "dev.delta.interaction.requested");
        q.sensitive = true;
        let (body, _, _) = notification(run, &encode(&requested("delta", &q, None, None))).unwrap();
        let n = parse(&body);
        assert_eq!(
            n["statusUpdate"]["status"]["state"],
            "TASK_STATE_AUTH_REQUIRED"
        );
        assert_eq!(
            n["statusUpdate"]["status"]["message"]["parts"][1]["data"]["url"],
            Value::Null
        );
    }

    #[test]
    fn a_runs_end_maps_directly_and_ends_the_deliveries() {
        let run = RunId::new();
        for (status, state) in [
            (RunStatus::Completed, "TASK_STATE_COMPLETED"),
            (RunStatus::Failed, "TASK_STATE_FAILED"),
            (RunStatus::Cancelled, "TASK_STATE_CANCELED"),
        ] {
            let f = RunFinished {
                run_id: run,
                agent: "hello".into(),
                status,
                result: Some("done".into()),
                error: Some("why".into()),
                submitted_by: None,
                created_at: Timestamp::now(),
                ended_at: Timestamp::now(),
            };
            let ce = run_ended("delta", &f, None).unwrap();
            let (body, end, _) = notification(run, &encode(&ce)).unwrap();
            assert!(end);
            assert_eq!(parse(&body)["statusUpdate"]["status"]["state"], state);
        }
    }

    #[test]
    fn what_a_client_does_not_see_and_garbage_are_skipped() {
        let run = RunId::new();
        assert!(notification(run, b"not json").is_none());
        assert!(notification(run, br#"{"specversion":"1.0"}"#).is_none());
    }

    #[test]
    fn config_ids_are_checked() {
        assert!(valid_id("a-1_b.c"));
        assert!(!valid_id(""));
        assert!(!valid_id("a/b"));
        assert!(!valid_id(&"x".repeat(65)));
    }
}
