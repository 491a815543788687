//! The web inbox (docs/protocol.md §6 `GET /`): three static files embedded in the binary, no build
//! step. The page itself needs no token; every data call it makes goes to the `/v1` API with
//! the token the person types in (kept in the browser's `localStorage`), so the API's rules,
//! roles and refusals are the only ones there are.
//!
//! - `GET /`: the pending questions, live (`inbox.js` reads `GET /v1/interactions`, then the
//!   `requested` / `resolved` events of `GET /v1/interactions/stream`).
//! - `GET /runs/{run_id}`: the same page, showing one run: its status, its journal live
//!   (`GET /v1/runs/{run_id}/events`) and its pending question. The script reads the path.
//! - `GET /inbox.js`, `GET /inbox.css`.
//!
//! Every answer is `Cache-Control: no-cache` (a new gateway version is picked up on reload) and
//! carries a Content-Security-Policy that allows only this origin's script, style and API: the
//! script writes server text with `textContent` only, and the policy is the second wall.

use axum::http::{HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};

const INDEX_HTML: &str = include_str!("inbox/index.html");
const INBOX_JS: &str = include_str!("inbox/inbox.js");
const INBOX_CSS: &str = include_str!("inbox/inbox.css");

/// Only this origin: no inline script or style, no frames, no plugins.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn file(content_type: &'static str, body: &'static str) -> Response {
    let headers: [(HeaderName, HeaderValue); 5] = [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        ),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
    ];
    (headers, body).into_response()
}

/// `GET /` and `GET /runs/{run_id}`: the page (the script decides what it shows from the path).
pub async fn page() -> Response {
    file("text/html; charset=utf-8", INDEX_HTML)
}

/// `GET /inbox.js`.
pub async fn script() -> Response {
    file("text/javascript; charset=utf-8", INBOX_JS)
}

/// `GET /inbox.css`.
pub async fn style() -> Response {
    file("text/css; charset=utf-8", INBOX_CSS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_its_own_files() {
        assert!(INDEX_HTML.contains(r#"src="/inbox.js""#));
        assert!(INDEX_HTML.contains(r#"href="/inbox.css""#));
        // CSP forbids inline script and style: the page must not rely on them.
        assert!(!INDEX_HTML.contains("<script>"));
        assert!(!INDEX_HTML.contains("<style"));
        assert!(!INDEX_HTML.contains("style=\""));
        assert!(!INDEX_HTML.contains("onclick"));
    }

    #[test]
    fn the_script_never_writes_markup() {
        // Server text goes in through textContent only (the CSP is the second wall).
        for banned in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
        ] {
            assert!(!INBOX_JS.contains(banned), "inbox.js uses {banned}");
        }
    }
}
