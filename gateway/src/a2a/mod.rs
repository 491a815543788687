//! The A2A server (docs/protocols.md "A2A"; A2A protocol 1.0, JSON-RPC binding): this gateway
//! is one A2A agent whose skills are the fleet's agents ([`crate::catalog`]).
//!
//! - `GET /.well-known/agent-card.json`: the agent card (public, like the JWKS).
//! - `POST /a2a`: JSON-RPC 2.0 ([`rpc`]): `SendMessage` starts a run, or, for a message that
//!   continues a task in `input-required`, answers its question through the gateway's one answer
//!   path; `GetTask`, `CancelTask`; `SendStreamingMessage` and `SubscribeToTask` ([`stream`],
//!   fed by the live events); push-notification configs ([`push`]).
//! - `GET /.well-known/jwks.json`: the public key that signs push notifications ([`jwt`]).
//!
//! A task is a run: its id and context id are the run id, and it is read from the store at
//! every request ([`task`]). The only A2A state of its own is the push configs, in Redis
//! (`delta_store::redis::A2aPushConfig`), delivered from durable JetStream consumers.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::{get, post};
use serde_json::{Value, json};

use delta_host::settings::Settings as Parsed;

use crate::Gateway;

pub mod events;
pub mod jwt;
pub mod link;
pub mod push;
pub mod rpc;
pub mod stream;
pub mod task;

/// The A2A protocol version this server speaks.
pub const PROTOCOL_VERSION: &str = "1.0";

/// The A2A settings (`DELTA_A2A_*`).
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// Signs push notifications (`DELTA_A2A_SIGNING_KEY`, a PKCS#8 Ed25519 key file); `None`:
    /// push notifications are off.
    pub signing_key: Option<Arc<jwt::SigningKey>>,
    /// What a push config that is not an operator's may reach besides public addresses
    /// (`DELTA_A2A_PUSH_ALLOW`, as `DELTA_WEBHOOK_ALLOW` is written; none by default). An
    /// operator's may reach what either setting names.
    pub push_allow: Arc<crate::webhooks::allow::Allow>,
}

impl Settings {
    /// Reads the `DELTA_A2A_*` settings, adding any error to `s`.
    pub fn parse(s: &mut Parsed) -> Settings {
        let (allow_text, allow_from) = s.get("DELTA_A2A_PUSH_ALLOW");
        let setting = "DELTA_A2A_PUSH_ALLOW";
        let push_allow = match crate::webhooks::allow::Allow::parse_for(&allow_text, setting) {
            Ok(a) => Arc::new(a),
            Err(e) => {
                s.errors.push(format!("{allow_from}: {e}"));
                Arc::new(crate::webhooks::allow::Allow::none(setting))
            }
        };
        let (path, from) = s.get("DELTA_A2A_SIGNING_KEY");
        if path.is_empty() {
            return Settings {
                signing_key: None,
                push_allow,
            };
        }
        let key = match std::fs::read(&path) {
            Ok(bytes) => match jwt::SigningKey::from_bytes(&bytes) {
                Ok(k) => Some(Arc::new(k)),
                Err(e) => {
                    s.errors.push(format!("{from}: `{path}`: {e}"));
                    None
                }
            },
            Err(e) => {
                s.errors.push(format!(
                    "{from}: cannot read `{path}`, the A2A signing key: {e}"
                ));
                None
            }
        };
        Settings {
            signing_key: key,
            push_allow,
        }
    }
}

/// The A2A routes.
pub fn router() -> Router<Arc<Gateway>> {
    Router::new()
        .route("/a2a", post(rpc::endpoint))
        .route("/.well-known/agent-card.json", get(card))
        .route("/.well-known/jwks.json", get(jwks))
}

/// The agent card: this gateway as one agent, the fleet's agents as its skills.
pub fn agent_card(gw: &Gateway, headers: &HeaderMap) -> Value {
    let base = link::base_url(gw, headers);
    let skills: Vec<Value> = gw
        .agents()
        .into_iter()
        .map(|a| {
            json!({
                "id": a.name,
                "name": a.name,
                "description": a.description,
                "tags": ["delta-fleet", "human-in-the-loop"],
                "examples": [],
                "inputModes": ["text/plain", "application/json"],
                "outputModes": ["text/plain", "application/json"],
            })
        })
        .collect();
    let mut card = json!({
        "name": "Delta Fleet",
        "description": "Durable agent runs that pause to ask people. Each skill is one of this fleet's agents: a message starts a run (name the skill in the message's metadata, {\"skill\": \"<agent>\"}; with one agent it is the default); a run waiting on a question is input-required, and a message on that task answers it. Sensitive questions are auth-required and answered only in the inbox.",
        "supportedInterfaces": [{
            "url": format!("{base}/a2a"),
            "protocolBinding": "JSONRPC",
            "protocolVersion": PROTOCOL_VERSION,
        }],
        "provider": {"organization": "Delta Fleet", "url": base},
        "version": env!("CARGO_PKG_VERSION"),
        "capabilities": {
            "streaming": true,
            "pushNotifications": gw.config.a2a.signing_key.is_some(),
            "extendedAgentCard": false,
        },
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["text/plain", "application/json"],
        "skills": skills,
    });
    if gw.config.auth.is_on() {
        card["securitySchemes"] = json!({
            "bearer": {"httpAuthSecurityScheme": {
                "scheme": "Bearer",
                "description": "A token of the gateway's tokens file (docs/security.md)",
            }}
        });
        card["securityRequirements"] = json!([{"schemes": {"bearer": {"list": []}}}]);
    }
    card
}

async fn card(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> Json<Value> {
    Json(agent_card(&gw, &headers))
}

async fn jwks(State(gw): State<Arc<Gateway>>) -> Json<Value> {
    Json(jwt::jwks(gw.config.a2a.signing_key.as_deref()))
}
