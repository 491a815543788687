//! One-time tickets for the live streams (issue 14, finding 10).
//!
//! A browser's `EventSource` cannot set headers, and a bearer token in a URL ends up in proxy and
//! server logs, browser history and `Referer`s. So a client that cannot set headers asks for a
//! ticket with its token (`POST /v1/stream-tickets`, a plain authenticated call) and opens the
//! stream with `?ticket=`. What may leak from a URL is then worth little: a ticket
//!
//! - opens one stream, the one it was made for (`interactions`, or one run's events);
//! - opens it once (taken from Redis with `GETDEL`, atomically, whichever gateway takes it);
//! - only for `DELTA_STREAM_TICKET_TTL_S` (30 s by default; a Redis TTL);
//! - as the identity and roles of the token that asked for it (checked again on use).
//!
//! Tickets are 256 random bits; Redis keeps only their SHA-256 (a dump opens nothing), next to
//! what they grant. Behind a load balancer, a ticket made by one gateway opens the stream on
//! any other of the fleet.

use ring::digest;
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};

use delta_api::{ErrorCode, StreamTarget, StreamTicket};
use delta_protocol::Timestamp;

use crate::Gateway;
use crate::auth::{Identity, Role};
use crate::error::ApiError;

/// What a ticket grants, as stored (JSON) under the ticket's digest.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Grant {
    /// [`StreamTarget::name`] of the one stream it opens.
    stream: String,
    /// Who asked for it.
    identity: Identity,
}

/// Tickets are 64 hex digits; anything much longer is refused before Redis is asked.
const MAX_TICKET_LEN: usize = 128;

/// The roles a stream needs: the interactions stream is for those who answer; a run's events
/// for anyone who may read runs.
pub fn roles_for(target: &StreamTarget) -> &'static [Role] {
    match target {
        StreamTarget::Interactions {} => &[Role::Answer, Role::Operate],
        StreamTarget::Run { .. } => &[Role::Submit, Role::Answer, Role::Operate],
    }
}

/// The key a ticket is stored under: its SHA-256, in hex.
fn digest_of(ticket: &str) -> String {
    digest::digest(&digest::SHA256, ticket.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Makes a ticket for `who` to open `target` once, within the configured time.
pub async fn issue(
    gw: &Gateway,
    who: Identity,
    target: &StreamTarget,
) -> Result<StreamTicket, ApiError> {
    // Each ticket is kept in Redis for its lifetime: a token's share of them is bounded.
    if let Some(name) = &who.name {
        gw.tickets.take(name)?;
    }
    let ttl = gw.config.stream_ticket_ttl;
    let grant = serde_json::to_string(&Grant {
        stream: target.name(),
        identity: who,
    })
    .map_err(|e| ApiError::unavailable(format!("cannot record the ticket: {e}")))?;
    let rng = SystemRandom::new();
    // 256 random bits do not collide; should they, the store says so and another is made.
    for _ in 0..3 {
        let mut bytes = [0u8; 32];
        rng.fill(&mut bytes).map_err(|_| {
            ApiError::unavailable("no randomness for a ticket on this gateway; try again")
        })?;
        let ticket: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let now = Timestamp::now();
        if gw
            .store
            .put_ticket(&digest_of(&ticket), &grant, ttl)
            .await?
        {
            let micros = i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX);
            let expires_at =
                Timestamp::from_micros(now.micros().saturating_add(micros)).unwrap_or(now);
            return Ok(StreamTicket { ticket, expires_at });
        }
    }
    Err(ApiError::unavailable(
        "could not make a unique ticket; try again",
    ))
}

fn refused(message: String) -> ApiError {
    ApiError::new(ErrorCode::Unauthorized, message)
}

/// The identity a ticket was made for, if it is a live ticket for `target` and that identity
/// holds one of the stream's roles. The ticket is spent by this call whatever the outcome: a
/// ticket tried on the wrong stream is gone too.
pub async fn redeem(
    gw: &Gateway,
    ticket: &str,
    target: &StreamTarget,
) -> Result<Identity, ApiError> {
    let again = format!(
        "ask for a new one with POST /v1/stream-tickets (a ticket opens one stream, once, within {} s)",
        gw.config.stream_ticket_ttl.as_secs()
    );
    let unknown = || {
        refused(format!(
            "this stream ticket is unknown, used or expired: {again}"
        ))
    };
    if ticket.is_empty() || ticket.len() > MAX_TICKET_LEN {
        return Err(unknown());
    }
    let Some(stored) = gw.store.take_ticket(&digest_of(ticket)).await? else {
        return Err(unknown());
    };
    // Written by a gateway of this fleet; unreadable only if Redis was tampered with.
    let grant: Grant = serde_json::from_str(&stored).map_err(|_| unknown())?;
    if grant.stream != target.name() {
        return Err(refused(format!(
            "this stream ticket is for another stream; it is spent now: {again}, naming this stream"
        )));
    }
    let roles = roles_for(target);
    if !roles.iter().any(|r| grant.identity.has(*r)) {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            format!(
                "`{}` may not follow this stream",
                grant.identity.name.as_deref().unwrap_or("?")
            ),
        ));
    }
    Ok(grant.identity)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_is_stored_under_its_digest_only() {
        let ticket = "00".repeat(32);
        let d = digest_of(&ticket);
        assert_eq!(d.len(), 64);
        assert_ne!(d, ticket);
        assert_eq!(d, digest_of(&ticket), "stable across gateways");
    }
}
