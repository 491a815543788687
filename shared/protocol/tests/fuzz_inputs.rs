//! Property tests for the outside inputs `delta-shared` decodes (issue 5 §3): job messages,
//! interaction responses checked against their requests, journal lines. The cargo-fuzz targets
//! in `fuzz/` explore the same functions for longer (`scripts/fuzz.sh`); these run in every
//! `cargo test`, so the cases are kept few.
//!
//! Properties: arbitrary input never panics and every refusal has a message; what the product
//! writes parses back equal; valid inputs mutated (a field dropped, a wrong type, a huge number,
//! unicode, deep nesting) are refused with a message naming what was wrong.

use delta_protocol::journal::{self, parse_jsonl, parse_jsonl_from, to_line};
use delta_protocol::{
    ActionRequest, ActionResult, ActionStatus, EngineEnd, EngineStart, Event, FreshRun,
    HumanInputReceived, InputType, InteractionOption, InteractionRequest, InteractionResponse,
    InteractionType, Job, JobKind, JournalEvent, MessageLevel, OptionAction, Plan, PlanTask,
    REDACTED, RequestId, Responder, RiskLevel, RunId, RunStatus, SystemMessage, Thought, Timestamp,
    ToolCall, Via,
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

// ---------------------------------------------------------------------------------------------
// Strategies

fn run_id() -> impl Strategy<Value = RunId> {
    any::<u128>().prop_map(|n| {
        uuid::Uuid::from_u128(n)
            .to_string()
            .parse()
            .expect("a UUID is a run id")
    })
}

fn request_id() -> impl Strategy<Value = RequestId> {
    any::<u128>().prop_map(|n| {
        uuid::Uuid::from_u128(n)
            .to_string()
            .parse()
            .expect("a UUID is a request id")
    })
}

/// Any time the contract can write (years 0000–9999), and some it cannot (clamped).
fn timestamp() -> impl Strategy<Value = Timestamp> {
    prop_oneof![
        (-62_167_219_200_000_000i64..=253_402_300_799_999_999).prop_map(Timestamp::from_micros),
        any::<i64>().prop_map(Timestamp::from_micros),
    ]
    .prop_filter_map("representable", |t| t)
}

/// Any text: control characters, unicode, quotes, newlines.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        ".*",
        "[a-z_]{1,8}",
        Just(String::new()),
        Just("\u{0}\n\"\\".into())
    ]
}

/// Any JSON value, nested a few levels.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f)
            .map(Value::Number)),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(text(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// An optional `data`: JSON `null` is "none" (a `Some(Value::Null)` reads back as `None`).
fn data() -> impl Strategy<Value = Option<Value>> {
    prop::option::of(json_value()).prop_map(|d| d.filter(|v| !v.is_null()))
}

fn via() -> impl Strategy<Value = Via> {
    prop_oneof![
        Just(Via::Http),
        Just(Via::Nats),
        Just(Via::Cli),
        Just(Via::File),
        Just(Via::Stdin),
        Just(Via::Timeout),
    ]
}

fn action() -> impl Strategy<Value = OptionAction> {
    prop_oneof![
        Just(OptionAction::ApproveAndExecute),
        Just(OptionAction::RetryWithFeedback),
        Just(OptionAction::RejectWithReason),
        Just(OptionAction::Terminate),
        Just(OptionAction::ProvideInfo),
        Just(OptionAction::Skip),
        Just(OptionAction::Custom),
    ]
}

fn responder() -> impl Strategy<Value = Responder> {
    (text(), via()).prop_map(|(id, via)| Responder::new(id, via))
}

fn option() -> impl Strategy<Value = InteractionOption> {
    ("[a-z]{1,6}", text(), action(), any::<bool>(), any::<bool>()).prop_map(
        |(id, label, action, requires_input, is_dangerous)| InteractionOption {
            requires_input,
            is_dangerous,
            ..InteractionOption::new(id, label, action)
        },
    )
}

fn interaction_type() -> impl Strategy<Value = InteractionType> {
    prop_oneof![
        Just(InteractionType::ToolApproval),
        Just(InteractionType::MissingInfo),
        Just(InteractionType::UserConfirmation),
        Just(InteractionType::UserChoice),
        Just(InteractionType::UserInput),
        Just(InteractionType::Custom),
    ]
}

fn request() -> impl Strategy<Value = InteractionRequest> {
    (
        (run_id(), request_id(), text(), interaction_type(), text()),
        (
            prop_oneof![
                Just(InputType::Text),
                Just(InputType::Password),
                Just(InputType::Choice),
                text().prop_map(|s| InputType::from(s.as_str())),
            ],
            any::<bool>(),
            prop::collection::vec(option(), 0..4),
            prop::option::of(any::<u64>()),
            timestamp(),
            prop::collection::btree_map("[a-z_]{1,8}", json_value(), 0..3),
        ),
    )
        .prop_map(
            |(
                (run, id, agent, kind, prompt),
                (input_type, sensitive, options, timeout, at, context),
            )| {
                let mut q = InteractionRequest::new(run, &agent, kind, prompt);
                q.request_id = id;
                q.timestamp = at;
                q.input_type = input_type;
                q.sensitive = sensitive;
                q.default_option_id = options.first().map(|o| o.option_id.clone());
                q.options = options;
                q.timeout_seconds = timeout;
                q.expires_at = timeout.map(|t| at.plus_seconds(t));
                q.context = context;
                q
            },
        )
}

/// An answer to `q`: mostly naming it, with one of its options, another id, or none.
fn response_to(
    q: InteractionRequest,
) -> impl Strategy<Value = (InteractionRequest, InteractionResponse)> {
    let ids: Vec<String> = q.options.iter().map(|o| o.option_id.clone()).collect();
    let option_id = prop_oneof![
        Just(None),
        "[a-z]{1,6}".prop_map(Some),
        proptest::sample::select(if ids.is_empty() {
            vec!["x".to_owned()]
        } else {
            ids
        })
        .prop_map(Some),
    ];
    let same = q.request_id;
    (
        prop_oneof![4 => Just(same), 1 => request_id()],
        option_id,
        prop::option::of(text()),
        data(),
        prop::option::of(text()),
        responder(),
    )
        .prop_map(
            move |(request_id, option_id, input, data, feedback, responder)| {
                let r = InteractionResponse {
                    request_id,
                    option_id,
                    input,
                    data,
                    feedback,
                    responder,
                    request_hash: None,
                };
                (q.clone(), r)
            },
        )
}

fn event() -> impl Strategy<Value = Event> {
    let call = ("[a-z0-9-]{1,6}", text(), json_value()).prop_map(|(id, tool, args)| ToolCall {
        id,
        tool,
        args,
    });
    let risk = prop_oneof![
        Just(RiskLevel::Low),
        Just(RiskLevel::Medium),
        Just(RiskLevel::High)
    ];
    let status = prop_oneof![
        Just(RunStatus::Completed),
        Just(RunStatus::Failed),
        Just(RunStatus::WaitingForInput),
        Just(RunStatus::Interrupted),
    ];
    prop_oneof![
        (run_id(), text(), text(), text(), any::<u32>()).prop_map(
            |(run_id, agent, task, worker, attempt)| {
                Event::EngineStart(EngineStart {
                    run_id,
                    agent,
                    task,
                    worker,
                    attempt,
                })
            }
        ),
        (text(), prop::option::of(prop::collection::vec(call, 0..3))).prop_map(
            |(content, tool_calls)| Event::Thought(Thought {
                content,
                tool_calls
            })
        ),
        (
            prop::collection::vec(
                (any::<u32>(), text(), prop::option::of(text()), risk.clone()),
                0..3
            ),
            risk,
            1u32..5
        )
            .prop_map(|(tasks, risk_level, round)| Event::Plan(Plan {
                tasks: tasks
                    .into_iter()
                    .map(|(index, description, tool, risk)| PlanTask {
                        index,
                        description,
                        tool,
                        risk
                    })
                    .collect(),
                risk_level,
                round,
            })),
        (text(), text(), json_value()).prop_map(|(action_id, tool, args)| Event::ActionRequest(
            ActionRequest {
                action_id,
                tool,
                args
            }
        )),
        (text(), text(), prop::option::of(any::<i32>()), any::<u64>()).prop_map(
            |(action_id, observation_content, exit_code, duration_ms)| Event::ActionResult(
                ActionResult {
                    action_id,
                    status: ActionStatus::Error,
                    observation_content,
                    exit_code,
                    duration_ms,
                }
            )
        ),
        request().prop_map(|q| Event::HumanInputRequest(Box::new(q))),
        (
            request_id(),
            prop::option::of(text()),
            action(),
            responder(),
            prop::option::of(text()),
            data()
        )
            .prop_map(|(request_id, option_id, action, responder, input, data)| {
                Event::HumanInputReceived(HumanInputReceived {
                    request_id,
                    option_id,
                    action,
                    responder,
                    input,
                    data,
                    feedback: None,
                    edited_args: None,
                    request_hash: None,
                })
            }),
        text().prop_map(|content| Event::SystemMessage(SystemMessage {
            level: MessageLevel::Warn,
            content
        })),
        (status, prop::option::of(text()), prop::option::of(text())).prop_map(
            |(status, result, error)| Event::EngineEnd(EngineEnd {
                status,
                result,
                error
            })
        ),
    ]
}

fn journal_of(events: Vec<(Timestamp, Event)>, first: u64) -> Vec<JournalEvent> {
    events
        .into_iter()
        .zip(first..)
        .map(|((timestamp, event), seq)| JournalEvent {
            seq,
            timestamp,
            event,
        })
        .collect()
}

/// A JSON value nested `depth` levels deep.
fn deep_value(depth: usize) -> Value {
    (0..depth).fold(json!([]), |v, _| json!([v]))
}

/// JSON nested `depth` levels deep: `[[[…]]]`.
fn nested(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

// ---------------------------------------------------------------------------------------------
// Job messages (`delta.jobs.<agent>`)

const RUN: &str = "0190a7a8-0000-7000-8000-000000000001";
const REQ: &str = "0190a7a8-0000-7000-8000-000000000002";

proptest! {
    #![proptest_config(config())]

    #[test]
    fn job_decode_never_panics_and_refusals_say_why(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        if let Err(e) = Job::decode(&bytes) {
            prop_assert!(e.to_string().starts_with("not a job message ("), "{e}");
            prop_assert!(!e.reason.is_empty());
        }
    }

    #[test]
    fn job_text_never_panics(text in ".*") {
        if let Err(e) = Job::decode(text.as_bytes()) {
            prop_assert!(!e.reason.is_empty());
        }
    }

    #[test]
    fn jobs_round_trip(
        run in run_id(),
        resume in any::<bool>(),
        request in prop::option::of(request_id()),
        fresh in prop::option::of((text(), prop::option::of(json_value()), "[a-z_]{1,8}", timestamp(), prop::option::of(text()))),
    ) {
        // A start job's run, as a gateway carries it.
        let fresh = fresh.map(|(task, input, agent, created_at, submitted_by)| FreshRun {
            agent,
            task,
            input: input.filter(|i| !i.is_null()),
            created_at,
            submitted_by,
        });
        let job = Job { run_id: run, kind: if resume { JobKind::Resume } else { JobKind::Start }, request_id: request, run: fresh, paused: None };
        let bytes = serde_json::to_vec(&job).expect("serialises");
        prop_assert_eq!(Job::decode(&bytes), Ok(job.clone()));
        let named = match (job.kind, request) {
            (JobKind::Resume, Some(r)) => r.to_string(),
            _ => run.to_string(),
        };
        prop_assert!(job.msg_id().ends_with(&named), "{}", job.msg_id());
    }

    #[test]
    fn mutated_jobs_are_refused_naming_what_is_wrong(
        field in prop::sample::select(vec!["run_id", "kind", "request_id"]),
        bad in prop_oneof![
            Just(json!(null)), Just(json!(5)), Just(json!(-1.5e300)), Just(json!("18446744073709551616")),
            Just(json!([])), Just(json!({})), Just(json!("démarrer ☃")), Just(json!(true)),
        ],
    ) {
        let mut job = json!({"run_id": RUN, "kind": "resume", "request_id": REQ});
        job[field] = bad.clone();
        let bytes = serde_json::to_vec(&job).expect("serialises");
        match Job::decode(&bytes) {
            // `request_id` is optional: null is "none".
            Ok(j) => prop_assert!(field == "request_id" && bad.is_null() && j.request_id.is_none()),
            Err(e) => prop_assert!(
                // serde_json names the type or variant it wanted (for a null enum only "expected
                // value") and always where: the line and column.
                (e.reason.contains("invalid") || e.reason.contains("unknown variant")
                    || e.reason.contains("expected value"))
                    && e.reason.contains("at line 1 column"),
                "{e}"
            ),
        }
    }
}

#[test]
fn jobs_missing_a_field_or_with_extra_ones_are_refused_by_name() {
    for field in ["run_id", "kind"] {
        let mut job = json!({"run_id": RUN, "kind": "start"});
        job.as_object_mut().expect("object").remove(field);
        let e = Job::decode(job.to_string().as_bytes()).expect_err("refused");
        assert!(
            e.reason.contains(&format!("missing field `{field}`")),
            "{e}"
        );
    }
    let e =
        Job::decode(format!(r#"{{"run_id": "{RUN}", "kind": "start", "priority": 1}}"#).as_bytes())
            .expect_err("refused");
    assert!(e.reason.contains("unknown field `priority`"), "{e}");
    let e = Job::decode(format!(r#"{{"run_id": "{RUN}", "kind": "start"}} {{}}"#).as_bytes())
        .expect_err("trailing data");
    assert!(e.reason.contains("trailing"), "{e}");
    let deep = format!(
        r#"{{"run_id": "{RUN}", "kind": "start", "request_id": {}}}"#,
        nested(100_000)
    );
    let e = Job::decode(deep.as_bytes()).expect_err("not a request id");
    assert!(e.reason.contains("invalid type: sequence"), "{e}");
    assert!(e.preview.chars().count() <= 200);
}

// ---------------------------------------------------------------------------------------------
// Interaction responses, checked against their requests (docs/protocol.md §3)

proptest! {
    #![proptest_config(config())]

    #[test]
    fn validation_never_panics_and_accepts_only_what_section_3_allows(
        (q, r) in request().prop_flat_map(response_to),
        now in timestamp(),
    ) {
        match q.validate(r.clone(), now) {
            Ok(a) => {
                prop_assert_eq!(&a.response, &r);
                prop_assert_eq!(r.request_id, q.request_id);
                prop_assert!(r.responder.via == Via::Timeout || !q.is_expired_at(now));
                let has_input = r.input.as_deref().is_some_and(|s| !s.trim().is_empty());
                match &a.option {
                    None => prop_assert!(q.options.is_empty() && has_input && a.action == OptionAction::ProvideInfo),
                    Some(o) => {
                        prop_assert!(q.options.contains(o));
                        prop_assert_eq!(a.action, o.action);
                        prop_assert!(!o.requires_input || has_input);
                    }
                }
                let rec = a.journal_record(&q);
                if q.is_sensitive() {
                    prop_assert!(rec.input.as_deref().is_none_or(|s| s == REDACTED));
                    prop_assert!(rec.feedback.as_deref().is_none_or(|s| s == REDACTED));
                    prop_assert!(rec.data.as_ref().is_none_or(|d| d == &json!(REDACTED)));
                }
            }
            Err(e) => {
                prop_assert!(!e.to_string().trim().is_empty());
                prop_assert!(!e.code().is_empty());
                match e.code() {
                    "not_found" => prop_assert_ne!(r.request_id, q.request_id),
                    "invalid_option" => prop_assert!(e.to_string().contains("is not an option")),
                    _ => {}
                }
            }
        }
    }

    #[test]
    fn requests_and_responses_round_trip((q, r) in request().prop_flat_map(response_to)) {
        let back: InteractionRequest = serde_json::from_str(&serde_json::to_string(&q).expect("ser")).expect("de");
        prop_assert_eq!(back, q);
        let back: InteractionResponse = serde_json::from_str(&serde_json::to_string(&r).expect("ser")).expect("de");
        prop_assert_eq!(back, r);
    }

    #[test]
    fn response_json_never_panics(text in ".*") {
        if let Err(e) = serde_json::from_str::<InteractionResponse>(&text) {
            prop_assert!(!e.to_string().is_empty());
        }
    }

    #[test]
    fn an_unknown_option_is_refused_naming_it_and_the_valid_ones(
        q in request().prop_filter("has options", |q| !q.options.is_empty()),
        given in "[A-Z]{1,6}",
    ) {
        let mut r = InteractionResponse::new(q.request_id, Responder::new("a", Via::Timeout));
        r.option_id = Some(given.clone());
        let e = q.validate(r, Timestamp::now()).expect_err("not an option");
        prop_assert_eq!(e.code(), "invalid_option");
        let message = e.to_string();
        let named = format!("`{given}`");
        prop_assert!(message.contains(&named), "{}", message);
        for o in &q.options {
            prop_assert!(message.contains(&o.option_id), "{}", message);
        }
    }

    #[test]
    fn blank_input_is_not_input(blank in "[ \t\n\r\u{a0}\u{2003}\u{3000}]{0,5}") {
        let mut q = InteractionRequest::new(RunId::new(), "a", InteractionType::UserInput, "?");
        let r = |option: Option<&str>| {
            let mut r = InteractionResponse::new(q.request_id, Responder::new("a", Via::Http));
            r.option_id = option.map(str::to_owned);
            r.input = Some(blank.clone());
            r
        };
        prop_assert_eq!(q.validate(r(None), Timestamp::now()).expect_err("blank").code(), "input_required");
        q.options.push(InteractionOption { requires_input: true, ..InteractionOption::new("why", "Why", OptionAction::RejectWithReason) });
        let e = q.validate(r(Some("why")), Timestamp::now()).expect_err("blank");
        prop_assert_eq!(e.code(), "input_required");
        prop_assert!(e.to_string().contains("`why`"));
    }
}

#[test]
fn mutated_responses_are_refused_naming_what_is_wrong() {
    let valid = json!({"request_id": REQ, "option_id": "approve", "input": "x", "data": {"a": 1},
                       "feedback": "f", "responder": {"id": "alice", "via": "http"}});
    for field in ["request_id", "responder"] {
        let mut r = valid.clone();
        r.as_object_mut().expect("object").remove(field);
        let e = serde_json::from_value::<InteractionResponse>(r).expect_err("refused");
        assert!(
            e.to_string().contains(&format!("missing field `{field}`")),
            "{e}"
        );
    }
    for (field, bad) in [
        ("request_id", json!("not-a-uuid")),
        ("option_id", json!(7)),
        ("input", json!(["a"])),
        ("responder", json!({"id": "a", "via": "carrier pigeon"})),
        ("responder", json!("alice")),
        ("input", json!(1e308)),
    ] {
        let mut r = valid.clone();
        r[field] = bad;
        let e = serde_json::from_value::<InteractionResponse>(r).expect_err("refused");
        assert!(
            e.to_string().contains("invalid") || e.to_string().contains("unknown variant"),
            "{field}: {e}"
        );
    }
    let mut r = valid.clone();
    r["optionid"] = json!("approve");
    let e = serde_json::from_value::<InteractionResponse>(r).expect_err("refused");
    assert!(e.to_string().contains("unknown field `optionid`"), "{e}");
    // Unicode and deep data are answers like any other; too deep for the parser is refused.
    let mut r = valid.clone();
    r["input"] = json!("naïve ☃ \u{0} 𝄞");
    serde_json::from_value::<InteractionResponse>(r).expect("unicode is fine");
    let deep = format!(
        r#"{{"request_id": "{REQ}", "responder": {{"id": "a", "via": "http"}}, "data": {}}}"#,
        nested(10_000)
    );
    let e = serde_json::from_str::<InteractionResponse>(&deep).expect_err("too deep");
    assert!(e.to_string().contains("recursion limit"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// Journal lines (`journal.jsonl`, pages read back from Redis)

proptest! {
    #![proptest_config(config())]

    #[test]
    fn journal_text_never_panics_and_refusals_name_their_line(text in ".*(\n.*){0,3}", first in prop_oneof![Just(1u64), 1u64..100, Just(u64::MAX - 1)]) {
        match parse_jsonl_from(&text, first) {
            Ok(p) => {
                if let Some(cut) = p.torn_tail_at {
                    prop_assert!(text.is_char_boundary(cut));
                    let again = parse_jsonl_from(&text[..cut], first).expect("the part before a torn tail");
                    prop_assert_eq!(again.events, p.events);
                }
            }
            Err(e) => prop_assert!(e.to_string().starts_with("journal line "), "{e}"),
        }
    }

    #[test]
    fn journals_round_trip(events in prop::collection::vec((timestamp(), event()), 0..6), first in 1u64..1000) {
        let journal = journal_of(events, first);
        let text: String = journal.iter().map(to_line).collect();
        let parsed = parse_jsonl_from(&text, first).expect("what the product writes parses");
        prop_assert_eq!(parsed.torn_tail_at, None);
        prop_assert_eq!(&parsed.events, &journal);
        let replay = journal::Replay::new(&parsed.events);
        prop_assert_eq!(replay.last_seq, journal.last().map_or(0, |e| e.seq));
    }

    #[test]
    fn a_torn_last_line_is_cut_off(events in prop::collection::vec((timestamp(), event()), 1..5), keep in 0.0f64..1.0) {
        let journal = journal_of(events, 1);
        let text: String = journal.iter().map(to_line).collect();
        let last = to_line(&journal[journal.len() - 1]);
        let whole = text.len() - last.len();
        // Cut the last line short of its newline, at a character boundary.
        let mut cut = whole + ((last.len() - 1) as f64 * keep) as usize;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        let parsed = parse_jsonl(&text[..cut]).expect("a torn tail is not an error");
        prop_assert_eq!(&parsed.events[..], &journal[..journal.len() - 1]);
        prop_assert_eq!(parsed.torn_tail_at, (cut > whole).then_some(whole));
    }

    #[test]
    fn corrupt_lines_are_refused_by_line_number(
        events in prop::collection::vec((timestamp(), event()), 2..5),
        mutation in 0usize..8,
        at in any::<prop::sample::Index>(),
    ) {
        let journal = journal_of(events, 1);
        let i = at.index(journal.len());
        let mut line: Value = serde_json::to_value(&journal[i]).expect("ser");
        // A field every payload of this type needs.
        let required = match journal[i].event.type_name() {
            "ENGINE_START" => "run_id",
            "THOUGHT" => "content",
            "PLAN" => "tasks",
            "ACTION_REQUEST" => "action_id",
            "ACTION_RESULT" => "status",
            "HUMAN_INPUT_REQUEST" => "request_id",
            "HUMAN_INPUT_RECEIVED" => "action",
            "SYSTEM_MESSAGE" => "level",
            _ => "status",
        };
        match mutation {
            0 => { line.as_object_mut().expect("object").remove("timestamp"); }
            1 => { line.as_object_mut().expect("object").remove("type"); }
            2 => line["seq"] = json!("one"),
            3 => line["seq"] = json!(-1),
            4 => line["timestamp"] = json!("yesterday"),
            5 => line["type"] = json!("COFFEE_BREAK"),
            6 => line["payload"] = deep_value(300),
            _ => { line["payload"].as_object_mut().expect("an object").remove(required); }
        }
        let mut text: String = journal.iter().map(to_line).collect::<Vec<_>>().concat();
        let lines: Vec<String> = text.lines().map(str::to_owned).collect();
        text = lines
            .iter()
            .enumerate()
            .map(|(k, l)| if k == i { format!("{line}\n") } else { format!("{l}\n") })
            .collect();
        let e = parse_jsonl(&text).expect_err("a mutated line");
        let message = e.to_string();
        prop_assert!(message.starts_with(&format!("journal line {}:", i + 1)), "{}", message);
        let named = match mutation {
            0 => "missing field `timestamp`".to_owned(),
            1 => "missing field `type`".to_owned(),
            4 => "`yesterday` is not an RFC 3339 time".to_owned(),
            5 => "unknown variant `COFFEE_BREAK`".to_owned(),
            6 => "nested deeper than 256 levels".to_owned(),
            7 => format!("missing field `{required}`"),
            _ => "invalid".to_owned(),
        };
        prop_assert!(message.contains(&named), "{} should name {}", message, named);
    }

    #[test]
    fn gaps_in_seq_are_refused(events in prop::collection::vec((timestamp(), event()), 2..5), skip in 1u64..u64::MAX / 2) {
        let mut journal = journal_of(events, 1);
        let last = journal.len() - 1;
        journal[last].seq += skip;
        let text: String = journal.iter().map(to_line).collect();
        let e = parse_jsonl(&text).expect_err("a gap");
        prop_assert!(matches!(e, journal::Error::Sequence { .. }), "{e}");
        let named = format!("journal line {}", journal.len());
        prop_assert!(e.to_string().contains(&named), "{}", e);
    }
}

#[test]
fn huge_numbers_and_deep_payloads_in_the_journal_are_refused_by_line() {
    let ok = r#"{"seq":1,"timestamp":"2026-11-20T10:00:00.000000Z","type":"SYSTEM_MESSAGE","payload":{"level":"info","content":"x"}}"#;
    for bad in [
        r#"{"seq":18446744073709551616,"timestamp":"2026-11-20T10:00:00.000000Z","type":"SYSTEM_MESSAGE","payload":{"level":"info","content":"x"}}"#.to_owned(),
        r#"{"seq":2,"timestamp":"+262142-12-31T23:59:59.999999Z","type":"SYSTEM_MESSAGE","payload":{"level":"info","content":"x"}}"#.to_owned(),
        format!(r#"{{"seq":2,"timestamp":"2026-11-20T10:00:00.000000Z","type":"ACTION_REQUEST","payload":{{"action_id":"a","tool":"t","args":{}}}}}"#, nested(100_000)),
    ] {
        let e = parse_jsonl(&format!("{ok}\n{bad}\n")).expect_err("refused");
        assert!(e.to_string().starts_with("journal line 2: not a valid event"), "{e}");
    }
    // A page starting near the end of u64: the seq after u64::MAX does not exist.
    let line = |seq: u64| ok.replace(r#""seq":1"#, &format!(r#""seq":{seq}"#));
    let text = [u64::MAX - 1, u64::MAX, 0].map(|s| line(s) + "\n").concat();
    let e = parse_jsonl_from(&text, u64::MAX - 1).expect_err("no seq after u64::MAX");
    assert!(
        e.to_string()
            .starts_with("journal line 3: an event after seq 18446744073709551615"),
        "{e}"
    );
    // Unicode anywhere in the strings is fine.
    let unicode = ok.replace(r#""x""#, r#""naïve ☃ 𝄞 \u0000""#);
    assert_eq!(
        parse_jsonl(&format!("{unicode}\n"))
            .expect("ok")
            .events
            .len(),
        1
    );
}

// ---------------------------------------------------------------------------------------------
// Typed answers: `response_schema` and the data checked against it

/// A property of a schema: mostly of the subset's shape, with keywords and values that may be
/// wrong (so that both acceptance and refusal are explored).
fn schema_property() -> impl Strategy<Value = Value> {
    let ty = prop::sample::select(vec![
        "string", "number", "integer", "boolean", "array", "object", "null",
    ]);
    let keyword = prop::sample::select(vec![
        "minLength",
        "maxLength",
        "format",
        "minimum",
        "maximum",
        "default",
        "enum",
        "enumNames",
        "oneOf",
        "items",
        "minItems",
        "maxItems",
        "title",
        "description",
        "pattern",
    ]);
    let value = prop_oneof![
        json_value(),
        (0u64..10).prop_map(Value::from),
        prop::sample::select(vec!["email", "uri", "date", "date-time", "ipv4"])
            .prop_map(Value::from),
        prop::collection::vec("[a-c]", 0..4).prop_map(|v| json!(v)),
        prop::collection::vec("[a-c]", 0..3).prop_map(|v| json!(
            v.iter()
                .map(|c| json!({"const": c, "title": c.to_uppercase()}))
                .collect::<Vec<_>>()
        )),
        Just(json!({"type": "string", "enum": ["a", "b"]})),
        Just(json!({"anyOf": [{"const": "a", "title": "A"}]})),
    ];
    (ty, prop::collection::btree_map(keyword, value, 0..4)).prop_map(|(t, kws)| {
        let mut p: serde_json::Map<String, Value> =
            kws.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        p.insert("type".into(), json!(t));
        Value::Object(p)
    })
}

fn response_schema() -> impl Strategy<Value = Value> {
    (
        prop::collection::btree_map("[a-e]", schema_property(), 0..4),
        prop::collection::vec("[a-f]", 0..3),
    )
        .prop_map(|(props, required)| {
            json!({"type": "object", "properties": props, "required": required})
        })
}

proptest! {
    #![proptest_config(config())]

    /// Any schema is accepted or refused with a message (naming the property at fault when one
    /// is); an accepted one checks any data without panicking, takes its own defaults, and
    /// refuses unknown fields naming them.
    #[test]
    fn response_schemas_are_checked_and_check_answers_without_panicking(
        schema in response_schema(),
        data in json_value(),
    ) {
        use delta_protocol::schema::ResponseSchema;
        match ResponseSchema::parse(&schema) {
            Err(e) => {
                prop_assert!(!e.message.trim().is_empty());
                if let Some(p) = &e.property {
                    prop_assert!(schema["properties"].get(p).is_some(), "{e}");
                }
            }
            Ok(s) => {
                if let Err(e) = s.check(Some(&data)) {
                    prop_assert!(!e.to_string().trim().is_empty());
                }
                let mut defaults = serde_json::Map::new();
                for f in &s.fields {
                    if let Some(d) = f.default_value() {
                        prop_assert!(f.check(&d).is_ok(), "{}: default {d}", f.name);
                        defaults.insert(f.name.clone(), d);
                    }
                }
                if s.fields.iter().all(|f| !f.required || defaults.contains_key(&f.name)) {
                    prop_assert!(s.check(Some(&Value::Object(defaults.clone()))).is_ok());
                }
                defaults.insert("zz-unknown".into(), json!(1));
                let e = s.check(Some(&Value::Object(defaults))).expect_err("unknown field");
                prop_assert!(e.field.is_some());
            }
        }
    }
}
