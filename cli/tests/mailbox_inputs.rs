//! Property tests for the file mailbox (issue 5 §3): `response.txt` and `response.json` as
//! `delta run` ingests them ([`Mailbox::parse_answer`]). The cargo-fuzz target `mailbox_answer`
//! explores the same function for longer (`scripts/fuzz.sh`).
//!
//! Properties: arbitrary bytes never panic and every refusal names its file and a docs/protocol.md
//! code; an answer written as people write it reads back as meant (free text, an option by id,
//! label or number, a full `response.json`); mutated `response.json` files are refused naming
//! what is wrong.

use std::path::Path;

use delta_cli::mailbox::{Error, Mailbox};
use delta_protocol::{
    InteractionOption, InteractionRequest, InteractionResponse, InteractionType, OptionAction,
    RequestId, Responder, RunId, Via,
};
use proptest::prelude::*;
use serde_json::{Value, json};

/// 256 cases: quick enough for every `cargo test`. `PROPTEST_CASES=10000` looks longer.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(256);
    ProptestConfig::with_cases(cases)
}

fn mailbox() -> Mailbox {
    Mailbox::new(Path::new(".delta"))
}

/// A question with these options (`(id, label)`); free text when there are none.
fn request(options: &[(String, String)]) -> InteractionRequest {
    let kind = if options.is_empty() {
        InteractionType::UserInput
    } else {
        InteractionType::UserChoice
    };
    let mut q = InteractionRequest::new(RunId::new(), "a", kind, "?");
    q.options = options
        .iter()
        .map(|(id, label)| InteractionOption::new(id, label, OptionAction::ProvideInfo))
        .collect();
    q
}

/// A tool approval whose arguments may be edited.
fn approval() -> InteractionRequest {
    let mut q = InteractionRequest::new(RunId::new(), "a", InteractionType::ToolApproval, "ok?");
    q.options = vec![
        InteractionOption::new("approve", "Approve", OptionAction::ApproveAndExecute),
        InteractionOption::new("reject", "Reject", OptionAction::RejectWithReason),
    ];
    q.context.insert(
        "args".into(),
        json!({"env": "production", "replicas": 2, "dry_run": false}),
    );
    q
}

/// Options with distinct ids and labels that are neither numbers nor each other's ids.
fn options() -> impl Strategy<Value = Vec<(String, String)>> {
    prop::collection::btree_map("[a-z_]{1,8}", "[A-Z][a-z ]{0,8}[a-z]", 0..5).prop_map(|m| {
        let mut seen = std::collections::HashSet::new();
        m.into_iter()
            .filter(|(_, label)| seen.insert(label.to_lowercase()))
            .collect()
    })
}

fn assert_refusal(e: &Error, file: &str) -> Result<(), TestCaseError> {
    let message = e.to_string();
    prop_assert!(message.starts_with(".delta/interaction"), "{}", message);
    prop_assert!(message.contains(file), "{} should name {}", message, file);
    prop_assert!(message.contains(": refused ("), "{}", message);
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_answers_never_panic_and_refusals_name_the_file(
        options in options(),
        approve in any::<bool>(),
        bytes in prop::collection::vec(any::<u8>(), 0..64),
        text in ".{0,40}",
        which in 0u8..3,
    ) {
        let q = if approve { approval() } else { request(&options) };
        for body in [bytes.as_slice(), text.as_bytes()] {
            let (txt, json) = match which {
                0 => (Some(body), None),
                1 => (None, Some(body)),
                _ => (Some(body), Some(body)),
            };
            match mailbox().parse_answer(&q, txt, json) {
                Ok(Some(r)) => {
                    prop_assert_eq!(r.request_id, q.request_id);
                    if let Some(o) = &r.option_id {
                        prop_assert!(q.option(o).is_some() || which == 1);
                    }
                }
                Ok(None) => prop_assert!(false, "a file was given"),
                Err(e) => match which {
                    0 => assert_refusal(&e, "response.txt")?,
                    1 => assert_refusal(&e, "response.json")?,
                    _ => prop_assert!(e.to_string().contains("keep only one"), "{}", e),
                },
            }
        }
    }

    #[test]
    fn free_text_reads_back_as_written(text in "[^\r\n]*\\S[^\r\n]*(\n[^\r\n]+){0,3}", newline in prop::sample::select(vec!["", "\n", "\r\n", "\n\n"])) {
        let q = request(&[]);
        let file = format!("{text}{newline}");
        let r = mailbox().parse_answer(&q, Some(file.as_bytes()), None).expect("free text").expect("an answer");
        prop_assert_eq!(r.input.as_deref(), Some(text.as_str()));
        prop_assert_eq!(r.option_id, None);
        prop_assert_eq!(r.responder.via, Via::File);
    }

    #[test]
    fn an_option_is_found_by_id_label_or_number_with_its_text(
        options in options().prop_filter("some options", |o| !o.is_empty()),
        pick in any::<prop::sample::Index>(),
        how in 0u8..3,
        input in prop::option::of("[a-z][a-z ]{0,10}[a-z]"),
    ) {
        let q = request(&options);
        let i = pick.index(options.len());
        let (id, label) = &options[i];
        let named = match how {
            0 => id.clone(),
            1 => label.to_uppercase(),
            _ => (i + 1).to_string(),
        };
        // An id may be another option's label (any case), which wins by id first: skip those.
        prop_assume!(options.iter().all(|(other, l)| other == id || !l.eq_ignore_ascii_case(&named)));
        prop_assume!(how == 0 || options.iter().all(|(other, _)| other != &named));
        let file = match &input {
            Some(t) => format!("{named}: {t}\n"),
            None => format!("{named}\n"),
        };
        let r = mailbox().parse_answer(&q, Some(file.as_bytes()), None).expect("an option").expect("an answer");
        prop_assert_eq!(r.option_id.as_deref(), Some(id.as_str()));
        prop_assert_eq!(r.input, input);
    }

    #[test]
    fn an_unknown_option_is_refused_listing_the_valid_ones(
        options in options().prop_filter("some options", |o| !o.is_empty()),
        given in "[1-9][0-9]{2,4}|[A-Z]{9,12}!",
    ) {
        let q = request(&options);
        let e = mailbox().parse_answer(&q, Some(given.as_bytes()), None).expect_err("not an option");
        assert_refusal(&e, "response.txt")?;
        let message = e.to_string();
        prop_assert!(message.contains("(invalid_option)"), "{}", message);
        prop_assert!(message.contains(&format!("`{given}` is not an option")), "{}", message);
        for (id, _) in &options {
            prop_assert!(message.contains(id.as_str()), "{}", message);
        }
    }

    #[test]
    fn edits_of_an_approved_call_keep_their_types(replicas in any::<i64>(), env in "[a-z][a-z0-9-]{0,10}", dry in any::<bool>()) {
        let q = approval();
        let file = format!("approve\nreplicas = {replicas}\nenv={env}\ndry_run={dry}\n");
        let r = mailbox().parse_answer(&q, Some(file.as_bytes()), None).expect("edits").expect("an answer");
        prop_assert_eq!(r.option_id.as_deref(), Some("approve"));
        prop_assert_eq!(r.data, Some(json!({"args": {"env": env, "replicas": replicas, "dry_run": dry}})));
    }

    #[test]
    fn full_responses_read_back(
        option in prop::option::of("[a-z]{1,6}"),
        input in prop::option::of(".{0,20}"),
        feedback in prop::option::of(".{0,20}"),
        data in prop::option::of(prop_oneof![Just(json!({"args": {"a": 1}})), Just(json!([1, "two", null])), Just(json!("x"))]),
        by in prop::option::of(("[a-z]{1,6}", prop::sample::select(vec![Via::Http, Via::Cli, Via::File]))),
        with_id in any::<bool>(),
    ) {
        let q = request(&[]);
        let responder = by.map(|(id, via)| Responder::new(id, via));
        let mut doc = serde_json::Map::new();
        if with_id {
            doc.insert("request_id".into(), json!(q.request_id));
        }
        for (k, v) in [("option_id", option.clone().map(Value::from)), ("input", input.clone().map(Value::from)), ("feedback", feedback.clone().map(Value::from)), ("data", data.clone())] {
            if let Some(v) = v {
                doc.insert(k.into(), v);
            }
        }
        if let Some(r) = &responder {
            doc.insert("responder".into(), serde_json::to_value(r).expect("ser"));
        }
        let file = serde_json::to_vec(&Value::Object(doc)).expect("ser");
        let r = mailbox().parse_answer(&q, None, Some(&file)).expect("a response").expect("an answer");
        let expected = InteractionResponse {
            request_id: q.request_id,
            option_id: option,
            input,
            data,
            feedback,
            responder: responder.unwrap_or_else(|| r.responder.clone()),
            request_hash: None,
        };
        prop_assert_eq!(&r, &expected);
        prop_assert!(r.responder.via != Via::File || !r.responder.id.is_empty());
    }
}

#[test]
fn mutated_response_json_is_refused_naming_what_is_wrong() {
    let q = request(&[("a".into(), "A".into())]);
    let refused = |text: &str| -> String {
        mailbox()
            .parse_answer(&q, None, Some(text.as_bytes()))
            .expect_err(text)
            .to_string()
    };
    for (text, named) in [
        (r#"{"option": "a"}"#, "unknown field `option`"),
        (
            r#"{"option_id": 1}"#,
            "invalid type: integer `1`, expected a string",
        ),
        (
            r#"{"option_id": "a", "input": ["x"]}"#,
            "invalid type: sequence",
        ),
        (
            r#"{"option_id": "a", "responder": {"id": "x", "via": "owl"}}"#,
            "unknown variant `owl`",
        ),
        (
            r#"{"option_id": "a", "responder": {"via": "cli"}}"#,
            "missing field `id`",
        ),
        (
            r#"{"option_id": "a"} {"option_id": "a"}"#,
            "trailing characters",
        ),
        (r#"{"option_id": "a""#, "EOF while parsing"),
        ("", "EOF while parsing"),
        (
            r#"{"option_id": "a", "input": 1e999}"#,
            "number out of range",
        ),
    ] {
        let e = refused(text);
        assert!(
            e.contains("response.json: refused (bad_request)") && e.contains(named),
            "{text}: {e}"
        );
    }
    let other = format!(
        r#"{{"request_id": "{}", "option_id": "a"}}"#,
        RequestId::new()
    );
    assert!(refused(&other).contains("refused (not_found)"));
    let deep = format!(
        r#"{{"option_id": "a", "data": {}{}}}"#,
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    assert!(refused(&deep).contains("recursion limit exceeded"));
    // Unicode text is an answer like any other, and invalid UTF-8 is read lossily.
    let r = mailbox()
        .parse_answer(
            &q,
            None,
            Some("{\"option_id\": \"a\", \"input\": \"naïve ☃ 𝄞\"}".as_bytes()),
        )
        .expect("unicode")
        .expect("an answer");
    assert_eq!(r.input.as_deref(), Some("naïve ☃ 𝄞"));
    let free = request(&[]);
    let r = mailbox()
        .parse_answer(&free, Some(b"caf\xe9\n"), None)
        .expect("lossy")
        .expect("an answer");
    assert_eq!(r.input.as_deref(), Some("caf\u{fffd}"));
}
