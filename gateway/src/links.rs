//! One-time answer links: how an agent protocol's client gets a person to answer a question it
//! must not carry itself (docs/protocols.md "Answer links").
//!
//! A sensitive question (a password, a token) is never asked through MCP or A2A: the secret
//! would pass through the client, its logs and its model. The client gets a link instead (MCP's
//! URL-mode elicitation, A2A's `auth-required`), opens it for its person, and the answer goes
//! from the browser to the gateway. The link
//!
//! - opens the one question it was made for, in the inbox (`/answer#link=…`: the secret rides in
//!   the fragment, which browsers never send, so it reaches no log and no `Referer`);
//! - answers it as the client it was made for: its token's name, with the roles and groups the
//!   tokens file gives that name when the answer arrives (a name whose tokens are gone, or that
//!   may no longer answer, answers nothing), recorded `via` the client's protocol;
//! - works once: an accepted answer spends it (a refused one, a mistyped value say, leaves it
//!   usable), and only for `DELTA_ANSWER_LINK_TTL_S`;
//! - is 256 random bits, kept in Redis as its SHA-256 (like the stream tickets), so any gateway
//!   of the fleet honours it. A link given again at each read of a task ([`shown_link`]) is
//!   kept whole besides, sealed with `DELTA_SECRETS_KEY` (without the key, every read makes a
//!   new link instead).

use axum::http::{HeaderMap, header};
use ring::digest;
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};

use delta_api::links::{LinkAnswer, LinkOpen, LinkView};
use delta_api::{AnswerAccepted, ClaimedResponder, ErrorCode};
use delta_protocol::{RequestId, RunId, Timestamp, Via};

use crate::Gateway;
use crate::auth::{Identity, Role};
use crate::error::ApiError;
use crate::ops::interaction_view;

/// The path of the inbox page that opens a link (its route in `api.rs` says it again).
pub const PAGE: &str = "/answer";

/// Links are 64 hex digits; anything longer is refused before Redis is asked.
const MAX_LINK_LEN: usize = 128;

/// What a link grants, as stored (JSON) under the digest of its secret.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Grant {
    run_id: RunId,
    request_id: RequestId,
    identity: Identity,
    /// The responder id the answer is recorded with: the identity's name, or (authentication
    /// off) what the client called itself.
    responder: String,
    via: Via,
    expires_at: Timestamp,
}

fn digest_of(link: &str) -> String {
    let hex: String = digest::digest(&digest::SHA256, link.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    // Beside the stream tickets, in a namespace of their own: a ticket never opens a link.
    format!("link:{hex}")
}

/// The absolute URL this gateway is reached at: `DELTA_PUBLIC_URL`, or else the scheme it
/// serves and the `Host` the client used (the link goes back to that same client).
pub fn base_url(gw: &Gateway, headers: &HeaderMap) -> Result<String, ApiError> {
    Ok(base(gw, headers)?.0)
}

/// [`base_url`], and whether a person's browser would reach it in clear over a network: plain
/// HTTP to a name that is not this machine's loopback (a gateway behind a proxy that ends TLS
/// must be told its public URL).
fn base(gw: &Gateway, headers: &HeaderMap) -> Result<(String, bool), ApiError> {
    if let Some(url) = &gw.config.public_url {
        return Ok((url.clone(), false));
    }
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .filter(|h| {
            !h.is_empty()
                && h.len() <= 255
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        })
        .ok_or_else(|| {
            ApiError::bad_request(
                "no usable Host header to make a link with; send one, or set DELTA_PUBLIC_URL on the gateway",
            )
        })?;
    let tls = gw.config.tls.is_some();
    let scheme = if tls { "https" } else { "http" };
    let in_clear = !tls && !crate::api::is_loopback_host(host);
    Ok((format!("{scheme}://{host}"), in_clear))
}

/// Makes a one-time link for `identity` to answer `request_id` of `run_id` in the inbox, and
/// returns its absolute URL. `responder` names the answerer when authentication is off (the
/// client's own name); with it on, the identity's name is used.
pub async fn answer_link(
    gw: &Gateway,
    headers: &HeaderMap,
    identity: &Identity,
    responder: Option<&str>,
    via: Via,
    run_id: RunId,
    request_id: RequestId,
) -> Result<String, ApiError> {
    if !identity.has(Role::Answer) {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            format!(
                "`{}` may not answer questions, so it gets no answer link (the tokens file gives it no answer role)",
                identity.name.as_deref().unwrap_or("?")
            ),
        ));
    }
    let (base, in_clear) = base(gw, headers)?;
    if in_clear {
        return Err(ApiError::unavailable(
            "this gateway serves plain HTTP: a link to it would carry a person's answer in clear. Set DELTA_PUBLIC_URL to the https:// address people reach it at (a proxy ending TLS in front of it)",
        ));
    }
    // Each link is kept in Redis for its lifetime, as a ticket is: the same share bounds both.
    if let Some(name) = &identity.name {
        gw.tickets.take(name)?;
    }
    let ttl = gw.config.answer_link_ttl;
    let now = Timestamp::now();
    let micros = i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX);
    let expires_at = Timestamp::from_micros(now.micros().saturating_add(micros)).unwrap_or(now);
    let responder = match &identity.name {
        Some(name) => name.clone(),
        None => responder
            .map(str::trim)
            .filter(|r| !r.is_empty())
            .unwrap_or("anonymous")
            .chars()
            .take(200)
            .collect(),
    };
    let grant = serde_json::to_string(&Grant {
        run_id,
        request_id,
        identity: identity.clone(),
        responder,
        via,
        expires_at,
    })
    .map_err(|e| ApiError::unavailable(format!("cannot record the link: {e}")))?;
    let rng = SystemRandom::new();
    for _ in 0..3 {
        let mut bytes = [0u8; 32];
        rng.fill(&mut bytes).map_err(|_| {
            ApiError::unavailable("no randomness for a link on this gateway; try again")
        })?;
        let link: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        if gw.store.put_ticket(&digest_of(&link), &grant, ttl).await? {
            return Ok(format!("{base}{PAGE}#link={link}"));
        }
    }
    Err(ApiError::unavailable(
        "could not make a unique link; try again",
    ))
}

/// [`answer_link`], made once per channel, caller and question and given again while it works:
/// a client that reads a waiting task over and over (an MCP task, an A2A task) gets the same
/// link each time rather than a new one per read. The link's URL is kept beside it for its
/// lifetime (`<p>:ticket:shown:<sha256 of channel, caller and question>`).
#[allow(clippy::too_many_arguments)]
pub async fn shown_link(
    gw: &Gateway,
    headers: &HeaderMap,
    identity: &Identity,
    responder: Option<&str>,
    via: Via,
    run_id: RunId,
    request_id: RequestId,
) -> Result<String, ApiError> {
    let Some(secrets) = gw.config.secrets_key.clone() else {
        return answer_link(gw, headers, identity, responder, via, run_id, request_id).await;
    };
    let who = identity.name.as_deref().or(responder).unwrap_or("-");
    let (base, _) = base(gw, headers)?;
    let context = format!("{via:?}\n{who}\n{request_id}\n{base}");
    let key = {
        let d = digest::digest(&digest::SHA256, context.as_bytes());
        let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        format!("shown:{hex}")
    };
    if let Some(sealed) = gw.store.peek_ticket(&key).await?
        && let Ok(url) = secrets.open(&format!("answer-link:{context}"), &sealed)
        && link_alive(gw, &url).await?
    {
        return Ok(url);
    }
    let url = answer_link(gw, headers, identity, responder, via, run_id, request_id).await?;
    // Should two reads race, each made a link and the last one kept is shown from then on;
    // both work.
    if let Ok(sealed) = secrets.seal(&format!("answer-link:{context}"), &url) {
        let _ = gw
            .store
            .put_ticket(&key, &sealed, gw.config.answer_link_ttl)
            .await;
    }
    Ok(url)
}

/// Whether the link `url` still works (not spent, not expired).
async fn link_alive(gw: &Gateway, url: &str) -> Result<bool, ApiError> {
    let Some((_, link)) = url.rsplit_once("#link=") else {
        return Ok(false);
    };
    Ok(gw.store.peek_ticket(&digest_of(link)).await?.is_some())
}

/// Whether the link [`shown_link`] gives `who` for `request_id` still works: `false` once it
/// was spent or expired (a client polling a question it was given a link for asks again then).
pub async fn shown_alive(
    gw: &Gateway,
    headers: &HeaderMap,
    identity: &Identity,
    responder: Option<&str>,
    via: Via,
    request_id: RequestId,
) -> Result<bool, ApiError> {
    let Some(secrets) = gw.config.secrets_key.clone() else {
        return Ok(false);
    };
    let who = identity.name.as_deref().or(responder).unwrap_or("-");
    let (base, _) = base(gw, headers)?;
    let context = format!("{via:?}\n{who}\n{request_id}\n{base}");
    let d = digest::digest(&digest::SHA256, context.as_bytes());
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    let Some(sealed) = gw.store.peek_ticket(&format!("shown:{hex}")).await? else {
        return Ok(false);
    };
    match secrets.open(&format!("answer-link:{context}"), &sealed) {
        Ok(url) => link_alive(gw, &url).await,
        Err(_) => Ok(false),
    }
}

fn unknown() -> ApiError {
    ApiError::not_found(
        "this answer link is unknown, used or expired: ask the client that gave it to you for the question again",
    )
}

async fn grant_of(gw: &Gateway, link: &str) -> Result<(String, Grant), ApiError> {
    if link.is_empty() || link.len() > MAX_LINK_LEN {
        return Err(unknown());
    }
    let digest = digest_of(link);
    let stored = gw.store.peek_ticket(&digest).await?.ok_or_else(unknown)?;
    // Written by a gateway of this fleet; unreadable only if Redis was tampered with.
    let grant: Grant = serde_json::from_str(&stored).map_err(|_| unknown())?;
    Ok((digest, grant))
}

/// Who the link's answer is given as, now: with authentication on, the tokens file's current
/// word on the name the link was made for (its roles and groups today), which must still allow
/// answering; off, the identity it was made with.
fn current(gw: &Gateway, grant: &Grant) -> Result<Identity, ApiError> {
    if !gw.config.auth.is_on() {
        return Ok(grant.identity.clone());
    }
    let name = grant.identity.name.as_deref().unwrap_or_default();
    gw.config
        .auth
        .current(name)
        .filter(|i| i.has(Role::Answer))
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::Forbidden,
                format!("`{name}`, whom this link answers as, may no longer answer (the gateway's tokens file changed)"),
            )
        })
}

/// `POST /v1/answer-links/open`: the question, without spending the link.
pub async fn open(gw: &Gateway, body: LinkOpen) -> Result<LinkView, ApiError> {
    let (_, grant) = grant_of(gw, &body.link).await?;
    current(gw, &grant)?;
    let ix = gw
        .store
        .interaction(grant.run_id, grant.request_id)
        .await?
        .ok_or_else(unknown)?;
    Ok(LinkView {
        run_id: grant.run_id,
        request_id: grant.request_id,
        responder: grant.responder,
        interaction: interaction_view(grant.run_id, &ix),
        expires_at: grant.expires_at,
    })
}

/// `POST /v1/answer-links/answer`: answers as the link's client; an accepted answer (or a
/// question settled meanwhile) spends the link.
pub async fn answer(gw: &Gateway, body: LinkAnswer) -> Result<AnswerAccepted, ApiError> {
    let (digest, grant) = grant_of(gw, &body.link).await?;
    if body.answer.responder.is_some() {
        return Err(ApiError::bad_request(
            "`answer.responder` must be absent: an answer link says who answers",
        ));
    }
    let identity = current(gw, &grant)?;
    let claimed = ClaimedResponder {
        id: identity.name.is_none().then(|| grant.responder.clone()),
        via: None,
    };
    let responder = gw.responder(identity.name.as_deref(), Some(&claimed), grant.via)?;
    let result = gw
        .answer(grant.request_id, body.answer, responder, identity.groups())
        .await;
    let spent = match &result {
        Ok(_) => true,
        Err(e) => matches!(
            e.code,
            ErrorCode::AlreadyResolved | ErrorCode::Expired | ErrorCode::NotFound
        ),
    };
    if spent && let Err(e) = gw.store.drop_ticket(&digest).await {
        // It expires on its own; the question is settled and answers nothing more.
        tracing::warn!(error = %delta_host::Chain(&e), "answer link not removed; it expires on its own");
    }
    let answered = result?;
    Ok(AnswerAccepted {
        status: answered.status,
        run_id: answered.run_id,
        tally: answered.tally,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_is_stored_under_its_digest_only_apart_from_tickets() {
        let link = "ab".repeat(32);
        let d = digest_of(&link);
        assert!(d.starts_with("link:") && d.len() == 5 + 64, "{d}");
        assert!(!d.contains(&link));
        assert_eq!(d, digest_of(&link), "stable across gateways");
    }
}
