//! The bot bridge: bots answer on `<p>.interactions.respond.<request_id>` (core NATS
//! request-reply, served by every gateway in the queue group `<p>-gateway`), through the same
//! code path as HTTP. The request's payload is the answer (`{"option_id", "input", "data",
//! "feedback", "responder": {"id"}}`), with `Authorization: Bearer <token>` as a message header
//! when the gateway has tokens. The reply is `{"ok": true, "run_id"}` or `{"ok": false,
//! "error": {"code", "message"}}`, with the codes of the HTTP API.
//!
//! Also here: the workers' `resumed` notes, which feed the answer→resume latency histogram.

use std::sync::Arc;

use futures_util::StreamExt;

use delta_api::{AnswerBody, BotReply, ClaimBody, ClaimState, ErrorCode};
use delta_protocol::{RequestId, Via};

use crate::Gateway;
use crate::auth::{Identity, Role};
use crate::error::ApiError;

/// Serves the respond subjects until shutdown.
pub async fn serve(gw: Arc<Gateway>) -> Result<(), async_nats::SubscribeError> {
    let names = gw.queue.names().clone();
    let client = gw.queue.client().clone();
    let mut answers = client
        .queue_subscribe(names.respond_subject("*"), names.gateway_group())
        .await?;
    let mut claims = client
        .queue_subscribe(names.claim_subject("*"), names.gateway_group())
        .await?;
    let mut resumed = client
        .queue_subscribe(names.resumed_subject(), names.gateway_group())
        .await?;
    loop {
        tokio::select! {
            msg = answers.next() => {
                let Some(msg) = msg else { return Ok(()) };
                // Bounded: when all slots are busy, the next message waits here.
                let Ok(permit) = gw.bot_answers.clone().acquire_owned().await else {
                    return Ok(());
                };
                let gw2 = gw.clone();
                let client = client.clone();
                gw.tasks.spawn(async move {
                    let _permit = permit;
                    let reply = handle(&gw2, &msg).await;
                    // Replies go to request-reply inboxes only: a bot cannot make the gateway
                    // publish on a subject of its choosing.
                    if let Some(to) = msg.reply.filter(|to| to.starts_with("_INBOX.")) {
                        let body = reply.unwrap_or_else(|e| BotReply::refused(e.body()));
                        // Plain data (strings and ids) always serializes.
                        let body = serde_json::to_vec(&body).unwrap_or_default();
                        let _ = client.publish(to, body.into()).await;
                    }
                });
            }
            msg = claims.next() => {
                let Some(msg) = msg else { return Ok(()) };
                let Ok(permit) = gw.bot_answers.clone().acquire_owned().await else {
                    return Ok(());
                };
                let gw2 = gw.clone();
                let client = client.clone();
                gw.tasks.spawn(async move {
                    let _permit = permit;
                    let reply = handle_claim(&gw2, &msg).await;
                    if let Some(to) = msg.reply.filter(|to| to.starts_with("_INBOX.")) {
                        let body = match reply {
                            Ok(state) => serde_json::to_vec(&state),
                            Err(e) => serde_json::to_vec(&BotReply::refused(e.body())),
                        };
                        let _ = client.publish(to, body.unwrap_or_default().into()).await;
                    }
                });
            }
            msg = resumed.next() => {
                let Some(msg) = msg else { return Ok(()) };
                observe_resume(&gw, &msg.payload);
            }
            () = gw.shutdown.cancelled() => return Ok(()),
        }
    }
}

/// The request id a bot's message is about (its subject's last token) and who sent it (its
/// `Authorization` header), refusing what no channel accepts: an unknown token, a role that
/// may not answer, a payload over the limit.
fn bot_caller(gw: &Gateway, msg: &async_nats::Message) -> Result<(RequestId, Identity), ApiError> {
    let raw = msg.subject.as_str().rsplit('.').next().unwrap_or("");
    let request_id: RequestId = raw
        .parse()
        .map_err(|_| ApiError::bad_request(format!("`{raw}` is not a request id (a UUID)")))?;
    let authorization = msg
        .headers
        .as_ref()
        .and_then(|h| h.get("Authorization"))
        .map(|v| v.as_str().to_owned());
    let who = gw
        .config
        .auth
        .check_any(authorization.as_deref(), &[Role::Answer, Role::Operate])?;
    if msg.payload.len() > gw.config.max_body_bytes {
        return Err(ApiError::new(
            ErrorCode::PayloadTooLarge,
            "the message is larger than this gateway accepts (DELTA_MAX_BODY_BYTES)",
        ));
    }
    Ok((request_id, who))
}

async fn handle(gw: &Gateway, msg: &async_nats::Message) -> Result<BotReply, ApiError> {
    let (request_id, who) = bot_caller(gw, msg)?;
    if msg.payload.is_empty() {
        return Err(ApiError::bad_request(
            "the message is empty: send the answer as a JSON object",
        ));
    }
    let body: AnswerBody = crate::api::strict_json(&msg.payload)?;
    let responder = gw.responder(who.name.as_deref(), body.responder.as_ref(), Via::Nats)?;
    let answered = gw.answer(request_id, body, responder, who.groups()).await?;
    Ok(match answered.tally {
        Some(tally) => BotReply::voted(answered.run_id, answered.status, tally),
        None => BotReply::accepted(answered.run_id),
    })
}

/// A bot's claim (`…interactions.claim.<request_id>`, body `ClaimBody`): the reply is the
/// `ClaimState`, or `{"ok": false, "error"}` as for answers.
async fn handle_claim(gw: &Gateway, msg: &async_nats::Message) -> Result<ClaimState, ApiError> {
    let (request_id, who) = bot_caller(gw, msg)?;
    let body: ClaimBody = if msg.payload.is_empty() {
        ClaimBody::default()
    } else {
        crate::api::strict_json(&msg.payload)?
    };
    let responder = gw.responder(who.name.as_deref(), body.responder.as_ref(), Via::Nats)?;
    let operator = who.has(Role::Operate);
    gw.claim(request_id, body, responder, who.groups(), operator)
        .await
}

/// Feeds a `resumed` message's notes to the answer→resume histogram: a JSON array of notes, or
/// one note alone (workers before 2026-11-28). Anything else is ignored.
fn observe_resume(gw: &Gateway, payload: &[u8]) {
    for note in resumed_notes(payload) {
        let us = note.resumed_at.micros() - note.answered_at.micros();
        gw.metrics.answer_to_resume.observe(us.max(0) as f64 / 1e6);
    }
}

/// The notes of a `resumed` message (none when it is not one).
fn resumed_notes(payload: &[u8]) -> Vec<delta_queue::ResumedNote> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Notes {
        Many(Vec<delta_queue::ResumedNote>),
        One(delta_queue::ResumedNote),
    }
    match serde_json::from_slice::<Notes>(payload) {
        Ok(Notes::Many(notes)) => notes,
        Ok(Notes::One(note)) => vec![note],
        Err(_) => vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::resumed_notes;

    #[test]
    fn a_resumed_message_is_a_list_of_notes_or_one_note() {
        let one = r#"{"request_id":"01a2217f-9c41-7642-9633-c24506defd8c","answered_at":"2026-11-28T09:32:20.931928Z","resumed_at":"2026-11-28T09:32:20.934928Z"}"#;
        let notes = resumed_notes(one.as_bytes());
        assert_eq!(notes.len(), 1);
        assert_eq!(
            notes[0].resumed_at.micros() - notes[0].answered_at.micros(),
            3000
        );
        let many = format!("[{one},{one}]");
        assert_eq!(resumed_notes(many.as_bytes()).len(), 2);
        for junk in ["", "{}", "[1]", "null", r#"{"request_id":"x"}"#] {
            assert!(resumed_notes(junk.as_bytes()).is_empty(), "{junk}");
        }
    }
}
