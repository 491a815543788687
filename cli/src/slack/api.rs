//! The Slack Web API calls the bridge makes, through slack-morphism's client on hyper with
//! rustls on ring. Its rate control spaces calls by Slack's tiers and retries a `429` after the
//! `Retry-After` it was given; its base URL is configurable so that tests reach a stand-in over
//! plain `http://`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use slack_morphism::errors::SlackClientError;
use slack_morphism::prelude::*;

/// The message metadata's event type: every question the bridge posts carries its request id.
pub const METADATA_EVENT: &str = "delta_question";

/// Why a Slack call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Slack's {method} refused: {code}")]
    Api { method: &'static str, code: String },
    #[error("Slack's {method} failed: {what}")]
    Failed { method: &'static str, what: String },
    #[error("Slack's {method} did not answer within {after:?}")]
    Timeout {
        method: &'static str,
        after: Duration,
    },
}

/// How far a refusal reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// The same call can work later (Slack down, rate limited past the retries, a timeout, an
    /// error Slack does not say is final): try again.
    Transient,
    /// This channel, user or message refuses for good until someone changes something there
    /// (invite the bot, fix the route or the mapping); other targets are not concerned.
    Target,
    /// Every call fails until the app is fixed (its token, its scopes).
    Bridge,
}

/// Slack's error codes that no retry changes, and whom they concern.
fn reach_of(code: &str) -> Reach {
    match code {
        "not_in_channel"
        | "channel_not_found"
        | "is_archived"
        | "invalid_blocks"
        | "invalid_blocks_format"
        | "msg_too_long"
        | "no_text"
        | "too_many_attachments"
        | "invalid_metadata_format"
        | "invalid_metadata_schema"
        | "metadata_too_large"
        | "user_not_found"
        | "users_not_found"
        | "user_not_in_channel"
        | "cannot_dm_bot"
        | "message_not_found"
        | "cant_update_message"
        | "edit_window_closed"
        | "restricted_action"
        | "restricted_action_read_only_channel"
        | "restricted_action_thread_only_channel"
        | "restricted_action_non_threadable_channel"
        | "thread_not_found"
        | "channel_is_archived"
        | "ekm_access_denied" => Reach::Target,
        "missing_scope"
        | "invalid_auth"
        | "not_authed"
        | "account_inactive"
        | "token_revoked"
        | "token_expired"
        | "no_permission"
        | "not_allowed_token_type"
        | "org_login_required"
        | "team_access_not_granted" => Reach::Bridge,
        // Slack's own trouble, documented as worth trying again.
        "fatal_error"
        | "internal_error"
        | "service_unavailable"
        | "request_timeout"
        | "ratelimited"
        | "rate_limited"
        | "message_limit_exceeded"
        | "team_added_to_org" => Reach::Transient,
        // Any other refusal is of this call (its blocks, its arguments, a DM the person's
        // settings close): trying it again for a day would only hold the event, and every event
        // behind it, for nothing.
        _ => Reach::Target,
    }
}

/// How many pages of a channel's history (200 messages each) a search for a post reads.
const HISTORY_PAGES: usize = 10;

impl Error {
    /// Whether trying again can help, and if not, whom the refusal concerns.
    pub fn reach(&self) -> Reach {
        match self {
            Error::Api { code, .. } => reach_of(code),
            Error::Failed { .. } | Error::Timeout { .. } => Reach::Transient,
        }
    }

    /// What an operator can do about a refusal.
    pub fn advice(&self) -> &'static str {
        match self.code().unwrap_or_default() {
            "not_in_channel" | "user_not_in_channel" => {
                "invite the bot to the channel (/invite @delta)"
            }
            "channel_not_found" => {
                "check the route's channel id (C…) and that the bot may see the channel"
            }
            "is_archived" | "channel_is_archived" => {
                "unarchive the channel, or route the agent to another"
            }
            "user_not_found" | "users_not_found" | "cannot_dm_bot" => {
                "check the bridge's user mapping (users:)"
            }
            "message_not_found" | "cant_update_message" | "edit_window_closed" => {
                "the message was deleted or can no longer be edited: nothing to do"
            }
            "missing_scope" | "no_permission" => {
                "give the app the scopes docs/slack.md lists and reinstall it"
            }
            "invalid_auth"
            | "not_authed"
            | "account_inactive"
            | "token_revoked"
            | "token_expired"
            | "not_allowed_token_type" => {
                "SLACK_BOT_TOKEN is not a working bot token (xoxb-…): install the app again and restart the bridge with its token"
            }
            "invalid_blocks"
            | "invalid_blocks_format"
            | "msg_too_long"
            | "no_text"
            | "invalid_metadata_format"
            | "invalid_metadata_schema"
            | "metadata_too_large" => {
                "the bridge made a message Slack refuses: report it with this log line"
            }
            _ => "see Slack's documentation of this error",
        }
    }

    fn of(method: &'static str, e: SlackClientError) -> Self {
        match e {
            SlackClientError::ApiError(a) => Error::Api {
                method,
                code: a.code,
            },
            other => Error::Failed {
                method,
                what: other.to_string(),
            },
        }
    }

    /// Slack's error code, when Slack answered with one.
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::Api { code, .. } => Some(code),
            Error::Failed { .. } | Error::Timeout { .. } => None,
        }
    }
}

type Connector = SlackClientHyperConnector<HttpsConnector<HttpConnector>>;

/// A handle on the Web API with the bot's token.
#[derive(Clone)]
pub struct Slack {
    client: Arc<SlackClient<Connector>>,
    token: SlackApiToken,
    /// How long one call may take, its rate-limit waits and retries included: the client's own
    /// `max_delay_timeout` bounds only the waits it decides on, not a request that hangs.
    timeout: Duration,
}

/// A posted message: where it is.
#[derive(Clone, Debug)]
pub struct Posted {
    pub channel: String,
    pub ts: String,
}

impl Slack {
    /// A client of `api_url` (`https://slack.com/api`, or a test's `http://…/api`).
    pub fn new(api_url: &str, bot_token: &str, timeout: Duration) -> Result<Self, String> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let builder = hyper_rustls::HttpsConnectorBuilder::new();
        let builder = match builder.with_native_roots() {
            Ok(b) => b,
            // No system roots (a bare container): only a plain-HTTP stand-in can be reached.
            Err(_) => hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(
                rustls::ClientConfig::builder()
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth(),
            ),
        };
        let https = builder.https_or_http().enable_http1().build();
        let rate = SlackApiRateControlConfig::new()
            .with_max_retries(5)
            .with_max_delay_timeout(timeout);
        let connector = SlackClientHyperConnector::with_connector(https)
            .with_rate_control(rate)
            .with_slack_api_url(api_url);
        Ok(Self {
            client: Arc::new(SlackClient::new(connector)),
            token: SlackApiToken::new(SlackApiTokenValue::new(bot_token.to_owned())),
            timeout,
        })
    }

    /// `call` (Slack's `method`), given up after the timeout.
    async fn timed<T>(
        &self,
        method: &'static str,
        call: impl std::future::Future<Output = Result<T, SlackClientError>>,
    ) -> Result<Result<T, SlackClientError>, Error> {
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| Error::Timeout {
                method,
                after: self.timeout,
            })
    }

    /// `chat.postMessage`: blocks, fallback text, the question's id as metadata, in a thread
    /// when `thread_ts` is given.
    pub async fn post(
        &self,
        channel: &str,
        blocks: Vec<SlackBlock>,
        text: String,
        request_id: Option<&str>,
        thread_ts: Option<&str>,
    ) -> Result<Posted, Error> {
        let mut content = SlackMessageContent::new().with_text(text);
        if !blocks.is_empty() {
            content = content.with_blocks(blocks);
        }
        if let Some(r) = request_id {
            content = content.with_metadata(
                SlackMessageMetadata::new(METADATA_EVENT.to_owned())
                    .with_event_payload(HashMap::from([("request_id".to_owned(), r.to_owned())])),
            );
        }
        // No previews: a link in the agent's text is not fetched and shown as a card.
        let mut req =
            SlackApiChatPostMessageRequest::new(SlackChannelId::new(channel.into()), content)
                .with_unfurl_links(false)
                .with_unfurl_media(false);
        if let Some(t) = thread_ts {
            req = req.with_thread_ts(SlackTs::new(t.to_owned()));
        }
        let session = self.client.open_session(&self.token);
        let r = self
            .timed("chat.postMessage", session.chat_post_message(&req))
            .await?
            .map_err(|e| Error::of("chat.postMessage", e))?;
        Ok(Posted {
            channel: r.channel.to_string(),
            ts: r.ts.to_string(),
        })
    }

    /// `chat.update` of a message the bridge posted.
    pub async fn update(
        &self,
        channel: &str,
        ts: &str,
        blocks: Vec<SlackBlock>,
        text: String,
    ) -> Result<(), Error> {
        let content = SlackMessageContent::new()
            .with_text(text)
            .with_blocks(blocks);
        let req = SlackApiChatUpdateRequest::new(
            SlackChannelId::new(channel.into()),
            content,
            SlackTs::new(ts.to_owned()),
        );
        let session = self.client.open_session(&self.token);
        self.timed("chat.update", session.chat_update(&req))
            .await?
            .map_err(|e| Error::of("chat.update", e))?;
        Ok(())
    }

    /// `chat.postEphemeral`: `text` shown to `user` only, in `channel`.
    pub async fn ephemeral(&self, channel: &str, user: &str, text: &str) -> Result<(), Error> {
        let req = SlackApiChatPostEphemeralRequest::new(
            SlackChannelId::new(channel.into()),
            SlackUserId::new(user.into()),
            SlackMessageContent::new().with_text(text.to_owned()),
        );
        let session = self.client.open_session(&self.token);
        self.timed("chat.postEphemeral", session.chat_post_ephemeral(&req))
            .await?
            .map_err(|e| Error::of("chat.postEphemeral", e))?;
        Ok(())
    }

    /// `views.open`: a modal for the click whose `trigger_id` is given.
    pub async fn open_modal(&self, trigger_id: &str, view: SlackModalView) -> Result<(), Error> {
        let req = SlackApiViewsOpenRequest::new(
            SlackTriggerId::new(trigger_id.to_owned()),
            SlackView::Modal(view),
        );
        let session = self.client.open_session(&self.token);
        match self.timed("views.open", session.views_open(&req)).await? {
            Ok(_) => Ok(()),
            // Slack answered `ok` with a view this client could not read: the modal is open.
            Err(SlackClientError::ProtocolError(_)) => Ok(()),
            Err(e) => Err(Error::of("views.open", e)),
        }
    }

    /// `users.info`: the user's e-mail address, if the app may read it.
    pub async fn email_of(&self, user: &str) -> Result<Option<String>, Error> {
        let req = SlackApiUsersInfoRequest::new(SlackUserId::new(user.into()));
        let session = self.client.open_session(&self.token);
        let r = self
            .timed("users.info", session.users_info(&req))
            .await?
            .map_err(|e| Error::of("users.info", e))?;
        Ok(r.user.profile.and_then(|p| p.email).map(|e| e.to_string()))
    }

    /// `users.lookupByEmail`: the Slack user id of an address (`None`: no such user).
    pub async fn user_by_email(&self, email: &str) -> Result<Option<String>, Error> {
        let req = SlackApiUsersLookupByEmailRequest::new(EmailAddress::new(email.to_owned()));
        let session = self.client.open_session(&self.token);
        match self
            .timed("users.lookupByEmail", session.users_lookup_by_email(&req))
            .await?
        {
            Ok(r) => Ok(Some(r.user.id.to_string())),
            Err(SlackClientError::ApiError(a)) if a.code == "users_not_found" => Ok(None),
            Err(e) => Err(Error::of("users.lookupByEmail", e)),
        }
    }

    /// `conversations.history` since `oldest` (Unix seconds): the message of `request_id` the
    /// bridge posted there, if any (its metadata says so).
    pub async fn find_posted(
        &self,
        channel: &str,
        oldest: i64,
        request_id: &str,
    ) -> Result<Option<String>, Error> {
        let session = self.client.open_session(&self.token);
        let mut cursor = None;
        // Every page since the question was asked (a busy channel, or a long outage before the
        // restart, puts more than one page after it), up to HISTORY_PAGES.
        for _ in 0..HISTORY_PAGES {
            let mut req = SlackApiConversationsHistoryRequest::new()
                .with_channel(SlackChannelId::new(channel.into()))
                .with_oldest(SlackTs::new(format!("{oldest}.000000")))
                .with_limit(200)
                .with_include_all_metadata(true);
            if let Some(c) = cursor.take() {
                req = req.with_cursor(c);
            }
            let r = self
                .timed("conversations.history", session.conversations_history(&req))
                .await?
                .map_err(|e| Error::of("conversations.history", e))?;
            let found = r.messages.into_iter().find_map(|m| {
                let md = m.content.metadata?;
                let ours = md.event_type == METADATA_EVENT
                    && md
                        .event_payload
                        .as_ref()
                        .and_then(|p| p.get("request_id"))
                        .is_some_and(|r| r == request_id);
                ours.then(|| m.origin.ts.to_string())
            });
            if found.is_some() {
                return Ok(found);
            }
            cursor = r
                .response_metadata
                .and_then(|m| m.next_cursor)
                .filter(|c| !c.to_string().is_empty());
            if cursor.is_none() || r.has_more == Some(false) {
                return Ok(None);
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What Slack documents as passing is tried again; its refusals of the app are the bridge's;
    /// any other code is a refusal of that one call, never retried for a day.
    #[test]
    fn error_codes_are_passing_the_apps_or_the_calls() {
        for code in [
            "ratelimited",
            "rate_limited",
            "message_limit_exceeded",
            "internal_error",
            "fatal_error",
            "service_unavailable",
        ] {
            assert_eq!(reach_of(code), Reach::Transient, "{code}");
        }
        for code in ["invalid_auth", "token_revoked", "missing_scope"] {
            assert_eq!(reach_of(code), Reach::Bridge, "{code}");
        }
        for code in [
            "not_in_channel",
            "invalid_blocks",
            "messages_tab_disabled",
            "a_code_slack_adds_later",
        ] {
            assert_eq!(reach_of(code), Reach::Target, "{code}");
        }
    }
}
