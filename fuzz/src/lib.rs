//! What the fuzz targets share: the "clear refusal" check, fixtures taken from real runs of the
//! example agents, and the properties of an accepted answer.
//!
//! Every target calls the function the product calls on the same input (no copy of the parsing
//! logic lives here) and asserts two things: no panic (libFuzzer reports one as a crash), and
//! every refusal has a message a person can act on.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::path::Path;
use std::sync::OnceLock;

use delta_protocol::{
    InteractionRequest, InteractionResponse, OptionAction, REDACTED, Timestamp, Via,
};
use delta_engine::agent::CheckedConfig;
use delta_engine::engine::{AnswerSchema, check_answer};
use delta_engine::tools::Tool;
use serde_json::Value;

/// "Every refusal is a clear error": its message is not blank.
pub fn assert_clear(e: &dyn Display) {
    let message = e.to_string();
    assert!(!message.trim().is_empty(), "a refusal without a message");
}

/// Interaction requests as the engine wrote them (`request.json` of the example agents): free
/// text, a choice, a plan confirmation (with `expires_at`), a sensitive question and a tool
/// approval with arguments.
pub const REQUESTS: [&str; 7] = [
    include_str!("../fixtures/requests/hello.json"),
    include_str!("../fixtures/requests/chooser.json"),
    include_str!("../fixtures/requests/plan.json"),
    include_str!("../fixtures/requests/plan2.json"),
    include_str!("../fixtures/requests/secret.json"),
    include_str!("../fixtures/requests/choice.json"),
    include_str!("../fixtures/requests/approval.json"),
];

/// [`REQUESTS`], parsed.
pub fn requests() -> &'static [InteractionRequest] {
    static PARSED: OnceLock<Vec<InteractionRequest>> = OnceLock::new();
    PARSED.get_or_init(|| {
        REQUESTS
            .iter()
            .map(|t| serde_json::from_str(t).expect("a fixture request parses"))
            .collect()
    })
}

/// The fixture request picked by `selector`.
pub fn request(selector: u8) -> &'static InteractionRequest {
    let all = requests();
    &all[usize::from(selector) % all.len()]
}

/// The deployer example's tools (`check_key`, `deploy` with `dangerous_if`), which the fixture
/// requests name.
pub fn deployer_tools() -> &'static BTreeMap<String, Tool> {
    static TOOLS: OnceLock<BTreeMap<String, Tool>> = OnceLock::new();
    TOOLS.get_or_init(|| {
        let text = include_str!("../../examples/agents/deployer/config.yaml");
        CheckedConfig::parse(Path::new("config.yaml"), text, Path::new("."))
            .expect("the deployer example loads")
            .tools
    })
}

/// Splits `data` at its first `0xFF` byte (never part of UTF-8 text, so JSON and YAML seeds
/// stay readable): `(before, after)`, `after` empty when there is none.
pub fn split(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|b| *b == 0xFF) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}

/// A moment picked by `selector`: before the fixtures were asked, between, or far later
/// (past every `expires_at`).
pub fn moment(selector: u8) -> Timestamp {
    const AT: [&str; 4] = [
        "2026-11-21T04:00:00.000000Z",
        "2026-11-21T04:30:00.000000Z",
        "2026-11-21T06:00:00.000000Z",
        "9999-12-31T23:59:59.999999Z",
    ];
    AT[usize::from(selector) % AT.len()]
        .parse()
        .expect("a fixture time parses")
}

/// Runs the engine's answer check ([`check_answer`], with the deployer's tools) and asserts what
/// must hold of its outcome: an accepted answer obeys docs/protocol.md §3 and its journal record hides
/// a sensitive answer; a refusal has a code and a message.
pub fn check_and_assert(q: &InteractionRequest, resp: InteractionResponse, now: Timestamp) {
    match check_answer(q, &AnswerSchema::of_tools(deployer_tools()), resp.clone(), now) {
        Ok(accepted) => {
            assert_eq!(accepted.response, resp, "the answer is kept as given");
            assert_eq!(accepted.response.request_id, q.request_id);
            assert!(
                resp.responder.via == Via::Timeout || !q.is_expired_at(now),
                "an answer after expires_at was accepted"
            );
            let has_input = resp.input.as_deref().is_some_and(|s| !s.trim().is_empty());
            match &accepted.option {
                None => {
                    assert!(q.options.is_empty(), "no option picked among options");
                    assert!(has_input, "free text accepted without text");
                    assert_eq!(accepted.action, OptionAction::ProvideInfo);
                }
                Some(o) => {
                    assert!(q.options.contains(o), "an option the request does not have");
                    assert_eq!(accepted.action, o.action);
                    assert!(!o.requires_input || has_input, "required input missing");
                }
            }
            let record = accepted.journal_record(q);
            if q.is_sensitive() {
                for text in [&record.input, &record.feedback] {
                    assert!(
                        text.as_deref().is_none_or(|s| s == REDACTED),
                        "not redacted"
                    );
                }
                assert!(
                    record
                        .data
                        .as_ref()
                        .is_none_or(|d| d == &Value::String(REDACTED.into())),
                    "data not redacted"
                );
            }
        }
        Err(e) => {
            assert_clear(&e);
            assert!(!e.code().is_empty());
        }
    }
}
