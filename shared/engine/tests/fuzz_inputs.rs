//! Property tests for the agent files and the engine's answer checks (issue 5 §3): `config.yaml`
//! and `script.yaml` as `Agent::load` checks them, and answers as the engine checks them
//! (edited tool arguments, edited plans). The cargo-fuzz targets in `fuzz/` explore the same
//! functions for longer (`scripts/fuzz.sh`).
//!
//! Properties: arbitrary text never panics and every refusal names the file; a valid config or
//! script written out parses back to what was written; the example agents mutated (a field
//! dropped, a wrong type, a huge number, unicode, deep nesting) are refused naming the field.

use std::collections::BTreeMap;
use std::path::Path;

use delta_engine::agent::{CheckedConfig, Error};
use delta_engine::engine::{AnswerSchema, check_answer};
use delta_engine::script::{AskHuman, PlanStep, Script, ScriptOption, Step, ToolStep};
use delta_engine::tools::Tool;
use delta_protocol::{
    InteractionRequest, InteractionResponse, InteractionType, OptionAction, Responder, RunId,
    Timestamp, Via,
};
use proptest::prelude::*;
use serde_json::{Value, json};
use serde_yaml_ng::Value as Yaml;

/// 256 cases: quick enough for every `cargo test`. `PROPTEST_CASES=10000` looks longer.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(256);
    ProptestConfig::with_cases(cases)
}

const EXAMPLES: [(&str, &str); 5] = [
    (
        "hello",
        include_str!("../../../examples/agents/hello/config.yaml"),
    ),
    (
        "chooser",
        include_str!("../../../examples/agents/chooser/config.yaml"),
    ),
    (
        "deployer",
        include_str!("../../../examples/agents/deployer/config.yaml"),
    ),
    (
        "openai-tools",
        include_str!("../../../examples/agents/openai-tools/config.yaml"),
    ),
    (
        "intake",
        include_str!("../../../examples/agents/intake/config.yaml"),
    ),
];

const SCRIPTS: [&str; 4] = [
    include_str!("../../../examples/agents/hello/script.yaml"),
    include_str!("../../../examples/agents/chooser/script.yaml"),
    include_str!("../../../examples/agents/deployer/script.yaml"),
    include_str!("../../../examples/agents/intake/script.yaml"),
];

fn parse_config(text: &str) -> Result<CheckedConfig, Error> {
    CheckedConfig::parse(Path::new("config.yaml"), text, Path::new("."))
}

fn deployer_tools() -> BTreeMap<String, Tool> {
    parse_config(EXAMPLES[2].1)
        .expect("the deployer loads")
        .tools
}

fn parse_script(text: &str, tools: &BTreeMap<String, Tool>) -> Result<Script, Error> {
    Script::parse(Path::new("script.yaml"), text, tools)
}

/// Text that looks like YAML: lines of config and script keys, values and indentation.
fn yamlish() -> impl Strategy<Value = String> {
    let key = prop::sample::select(vec![
        "name",
        "brain",
        "llm",
        "model",
        "tools",
        "- name",
        "exec",
        "shell",
        "command",
        "stdin",
        "parameters",
        "inject_as",
        "option_name",
        "type",
        "required",
        "approval",
        "dangerous_if",
        "timeout_s",
        "max_output_bytes",
        "confirm_plan",
        "plan_default",
        "max_plan_rounds",
        "interaction_defaults",
        "steps",
        "- think",
        "- tool",
        "args",
        "- ask_human",
        "prompt",
        "options",
        "- {id",
        "default_option_id",
        "- plan",
        "revise",
        "- branch",
        "default",
        "- finish",
        "- fail",
        "&a",
        "*a",
        "<<",
    ]);
    let value = prop_oneof![
        prop::sample::select(vec![
            "",
            "scripted",
            "openai",
            "[echo]",
            "\"echo ${text}\"",
            "\"cat ${f} | wc -l\"",
            "\"${x:raw}\"",
            "option",
            "stdin",
            "always",
            "when_dangerous",
            "{env: \"^prod\"}",
            "{env: \"(\"}",
            "18446744073709551616",
            "-1",
            "1e400",
            "true",
            "~",
            "[",
            "{",
            "'",
            "\"☃ 𝄞\"",
            "*a",
            "&a x",
            "!!binary aGk=",
            "|",
            ">-",
        ])
        .prop_map(str::to_owned),
        ".{0,12}",
    ];
    prop::collection::vec((0usize..4, key, value), 0..14).prop_map(|lines| {
        lines
            .into_iter()
            .map(|(indent, k, v)| format!("{}{k}: {v}\n", "  ".repeat(indent)))
            .collect()
    })
}

/// A parameter name as `${…}` placeholders take them.
fn param_name() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9_]{0,6}".prop_filter("not reserved", |n| n != "ask_human")
}

/// A valid `tools:` entry as YAML-ready JSON, with the parameter names it declares.
fn tool_entry() -> impl Strategy<Value = Value> {
    (
        prop::collection::btree_set(param_name(), 0..4),
        0usize..3,
        prop::option::of(1u64..100_000),
        prop::sample::select(vec!["never", "always", "when_dangerous"]),
        any::<bool>(),
        ".{0,20}",
    )
        .prop_map(
            |(params, form, timeout, approval, idempotent, description)| {
                let placeholders: Vec<String> =
                    params.iter().map(|p| format!("${{{p}}}")).collect();
                let mut t = json!({
                    "approval": approval,
                    "idempotent": idempotent,
                    "description": description,
                });
                match form {
                    0 => t["exec"] = json!(format!("echo {}", placeholders.join(" "))),
                    1 => t["shell"] = json!(format!("echo {} | wc -c", placeholders.join(" "))),
                    _ => {
                        t["command"] = json!(["echo", "--"]);
                        t["parameters"] = params
                            .iter()
                            .map(|p| json!({"name": p, "type": "string"}))
                            .collect();
                    }
                }
                if let Some(s) = timeout {
                    t["timeout_s"] = json!(s);
                }
                if let Some(first) = params.iter().next() {
                    t["dangerous_if"] = json!({ first: "^prod" });
                }
                t
            },
        )
}

/// A valid `config.yaml` as JSON: a name (any text), the scripted brain, uniquely named tools.
fn valid_config() -> impl Strategy<Value = Value> {
    (
        "[^\\s].{0,15}",
        prop::collection::btree_map("[a-z][a-z_]{0,8}", tool_entry(), 0..4),
        prop::option::of(1u32..100),
        prop::option::of(any::<u64>()),
    )
        .prop_map(|(name, tools, max_iterations, timeout)| {
            let tools: Vec<Value> = tools
                .into_iter()
                .filter(|(n, _)| n != "ask_human")
                .map(|(n, mut t)| {
                    t["name"] = json!(n);
                    t
                })
                .collect();
            let mut c = json!({"name": name, "brain": "scripted", "tools": tools});
            if let Some(m) = max_iterations {
                c["max_iterations"] = json!(m);
            }
            if let Some(t) = timeout {
                c["interaction_defaults"] = json!({"timeout_seconds": t});
            }
            c
        })
}

fn to_yaml(v: &Value) -> String {
    serde_yaml_ng::to_string(v).expect("JSON values are YAML")
}

/// A script step for the deployer's tools, and the same step as YAML-ready JSON.
fn step() -> impl Strategy<Value = (Step, Value)> {
    let text = ".{0,20}";
    let leaf = prop_oneof![
        text.prop_map(|t| (Step::Think { think: t.clone() }, json!({"think": t}))),
        text.prop_map(|t| (Step::Finish { finish: t.clone() }, json!({"finish": t}))),
        text.prop_map(|t| (Step::Fail { fail: t.clone() }, json!({"fail": t}))),
        (prop::sample::select(vec!["deploy", "check_key"]), ".{0,10}").prop_map(|(tool, v)| {
            let key = if tool == "deploy" { "env" } else { "key" };
            let step = Step::Tool(ToolStep {
                tool: tool.into(),
                args: BTreeMap::from([(key.to_owned(), json!(v))]),
                thought: None,
            });
            (step, json!({"tool": tool, "args": {key: v}}))
        }),
        (
            "[^\\s].{0,15}",
            prop::collection::btree_set("[a-z]{1,5}", 0..4),
            any::<bool>()
        )
            .prop_map(|(prompt, ids, sensitive)| {
                let options: Vec<ScriptOption> = ids
                    .iter()
                    .map(|id| ScriptOption {
                        id: id.clone(),
                        label: Some(id.to_uppercase()),
                        description: None,
                        action: Some(OptionAction::ProvideInfo),
                        requires_input: false,
                        input_prompt: None,
                        dangerous: false,
                    })
                    .collect();
                let ask = AskHuman {
                    prompt: prompt.clone(),
                    input_type: None,
                    sensitive,
                    kind: None,
                    default_option_id: ids.iter().next().cloned(),
                    options,
                    timeout_seconds: None,
                    title: None,
                    details: None,
                    allowed_responders: vec![],
                    approvals: None,
                    escalation: vec![],
                    response_schema: None,
                };
                let v = json!({"ask_human": serde_json::to_value(&ask).expect("ser")});
                (Step::Ask { ask_human: ask }, v)
            }),
        prop::collection::vec((".{1,12}", prop::option::of(Just("deploy"))), 1..3).prop_map(
            |tasks| {
                let plan: Vec<PlanStep> = tasks
                    .iter()
                    .map(|(d, t)| PlanStep {
                        description: d.clone(),
                        tool: t.map(str::to_owned),
                    })
                    .collect();
                let v: Vec<Value> = tasks
                    .iter()
                    .map(|(d, t)| match t {
                        Some(t) => json!({"description": d, "tool": t}),
                        None => json!({"description": d}),
                    })
                    .collect();
                (Step::Plan { plan, revise: None }, json!({ "plan": v }))
            }
        ),
    ];
    leaf.prop_recursive(2, 12, 3, |inner| {
        prop::collection::btree_map("[a-z]{1,5}", prop::collection::vec(inner, 0..3), 1..3)
            .prop_map(|cases| {
                let steps = cases
                    .iter()
                    .map(|(k, v)| (k.clone(), v.iter().map(|(s, _)| s.clone()).collect()))
                    .collect();
                let json: serde_json::Map<String, Value> = cases
                    .iter()
                    .map(|(k, v)| (k.clone(), v.iter().map(|(_, j)| j.clone()).collect()))
                    .collect();
                (Step::Branch { branch: steps }, json!({ "branch": json }))
            })
    })
}

/// Every path to a scalar in a YAML document: `(path, the key or index at each level)`.
fn leaves(v: &Yaml, at: &mut Vec<Yaml>, out: &mut Vec<Vec<Yaml>>) {
    match v {
        Yaml::Mapping(m) => {
            for (k, child) in m {
                at.push(k.clone());
                leaves(child, at, out);
                at.pop();
            }
        }
        Yaml::Sequence(s) => {
            for (i, child) in s.iter().enumerate() {
                at.push(Yaml::from(i as u64));
                leaves(child, at, out);
                at.pop();
            }
        }
        _ => out.push(at.clone()),
    }
}

fn at_mut<'a>(v: &'a mut Yaml, path: &[Yaml]) -> &'a mut Yaml {
    path.iter().fold(v, |v, k| match (v, k) {
        (Yaml::Sequence(s), Yaml::Number(i)) => {
            &mut s[usize::try_from(i.as_u64().expect("index")).expect("index")]
        }
        (Yaml::Mapping(m), k) => m.get_mut(k).expect("key"),
        _ => unreachable!("a path of this document"),
    })
}

/// `tools[0].timeout_s`, as serde_path_to_error names a field.
fn field_name(path: &[Yaml]) -> String {
    let mut s = String::new();
    for k in path {
        match k {
            Yaml::Number(i) => s.push_str(&format!("[{i}]")),
            Yaml::String(k) => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(k);
            }
            other => s.push_str(&format!("{other:?}")),
        }
    }
    s
}

/// YAML nested `depth` levels deep: `[[[…]]]`.
fn nested(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

// ---------------------------------------------------------------------------------------------
// config.yaml

proptest! {
    #![proptest_config(config())]

    #[test]
    fn config_text_never_panics_and_refusals_name_the_file(text in prop_oneof![".*", yamlish()]) {
        if let Err(e) = parse_config(&text) {
            prop_assert!(e.to_string().starts_with("config.yaml"), "{}", e);
        }
    }

    #[test]
    fn valid_configs_parse_back_as_written(c in valid_config()) {
        let checked = parse_config(&to_yaml(&c)).expect("a valid config");
        prop_assert_eq!(&checked.config.name, c["name"].as_str().expect("name"));
        prop_assert_eq!(checked.config.max_iterations.map(u64::from), c["max_iterations"].as_u64());
        prop_assert_eq!(
            checked.config.interaction_defaults.timeout_seconds,
            c["interaction_defaults"]["timeout_seconds"].as_u64()
        );
        let tools = c["tools"].as_array().expect("tools");
        prop_assert_eq!(checked.tools.len(), tools.len());
        for t in tools {
            let tool = &checked.tools[t["name"].as_str().expect("name")];
            prop_assert_eq!(tool.timeout.as_secs(), t["timeout_s"].as_u64().unwrap_or(120));
            prop_assert_eq!(tool.idempotent, t["idempotent"].as_bool().expect("bool"));
            prop_assert_eq!(tool.may_be_dangerous(), t.get("dangerous_if").is_some());
            let text = t["exec"].as_str().or(t["shell"].as_str()).unwrap_or_default();
            let declared = t["parameters"].as_array().map_or(0, Vec::len);
            prop_assert_eq!(tool.params.len(), text.matches("${").count().max(declared));
        }
    }
}

#[test]
fn the_example_configs_mutated_are_refused_naming_the_field() {
    let bad = [
        ("a sequence", "[1, 2]"),
        ("a mapping", "{x: 1}"),
        ("a huge number", "18446744073709551616"),
        ("a negative number", "-1"),
        ("not a number", "1e400"),
        ("unicode", "\"naïve ☃ 𝄞 \\u0000\""),
    ];
    let mut refused = 0;
    for (agent, text) in EXAMPLES {
        let doc: Yaml = serde_yaml_ng::from_str(text).expect("an example is YAML");
        let mut paths = vec![];
        leaves(&doc, &mut vec![], &mut paths);
        for path in &paths {
            let field = field_name(path);
            // Dropped: only `name` (and a tool's `name`) are required.
            let mut dropped = doc.clone();
            let (key, parent) = path.split_last().expect("a leaf has a key");
            match at_mut(&mut dropped, parent) {
                Yaml::Mapping(m) => {
                    m.remove(key);
                }
                Yaml::Sequence(s) => {
                    s.remove(usize::try_from(key.as_u64().expect("index")).expect("index"));
                }
                _ => unreachable!(),
            }
            let outcome = parse_config(&to_yaml_doc(&dropped));
            if field == "name" || field.ends_with("].name") && field.matches('[').count() == 1 {
                let e = outcome.expect_err("name is required").to_string();
                assert!(
                    e.contains("missing field `name`"),
                    "{agent} without {field}: {e}"
                );
            } else if let Err(e) = outcome {
                // A tool's declared parameter or its `dangerous_if` may depend on the field.
                assert!(
                    e.to_string().starts_with("config.yaml"),
                    "{agent} without {field}: {e}"
                );
            }
            for (what, value) in bad {
                match parse_config(&with_value(&doc, path, value)) {
                    Ok(_) => {}
                    Err(e) => {
                        refused += 1;
                        let e = e.to_string();
                        assert!(
                            e.starts_with("config.yaml"),
                            "{agent}, {field} = {what}: {e}"
                        );
                        assert!(
                            e.contains(&format!(": {field}: ")) || !e.contains("invalid type"),
                            "{agent}, {field} = {what} should name {field}: {e}"
                        );
                    }
                }
            }
        }
    }
    // Plain scalars read as text where text goes, so many mutations are accepted.
    assert!(refused > 50, "only {refused} mutations refused");
}

/// `doc` as text with the value at `path` replaced by the YAML text `value` (as text, so that
/// it may be what no YAML value holds, such as a number beyond 64 bits).
fn with_value(doc: &Yaml, path: &[Yaml], value: &str) -> String {
    const MARK: &str = "@@value@@";
    let mut mutated = doc.clone();
    *at_mut(&mut mutated, path) = Yaml::String(MARK.into());
    to_yaml_doc(&mutated).replacen(MARK, value, 1)
}

/// A YAML document as text.
fn to_yaml_doc(v: &Yaml) -> String {
    serde_yaml_ng::to_string(v).expect("a YAML value is YAML")
}

#[test]
fn configs_with_huge_numbers_or_deep_nesting_are_refused_clearly() {
    let base = "name: a\nbrain: scripted\n";
    for (extra, field) in [
        (
            "tools:\n  - name: t\n    exec: echo\n    timeout_s: 18446744073709551616\n",
            "tools[0].timeout_s",
        ),
        ("max_iterations: 4294967296\n", "max_iterations"),
        ("max_plan_rounds: -1\n", "max_plan_rounds"),
        (
            "interaction_defaults: {timeout_seconds: 1e400}\n",
            "interaction_defaults.timeout_seconds",
        ),
        (
            "tools:\n  - name: t\n    exec: echo\n    max_output_bytes: \"lots\"\n",
            "tools[0].max_output_bytes",
        ),
    ] {
        let e = parse_config(&format!("{base}{extra}"))
            .expect_err("refused")
            .to_string();
        assert!(e.contains(&format!(": {field}: ")), "{e}");
    }
    // Deep nesting where any value goes (unknown keys are ignored) or where a string belongs.
    let deep = format!("{base}x_unknown: {}\n", nested(1_000));
    parse_config(&deep).expect("skipped without recursing");
    // `lifecycle_hooks` is read now (Delta Engine's hooks): deep nesting there is refused.
    let deep = format!("{base}lifecycle_hooks: {}\n", nested(1_000));
    let e = parse_config(&deep).expect_err("not hooks").to_string();
    assert!(e.contains(": lifecycle_hooks: invalid type"), "{e}");
    let deep = format!("{base}description: {}\n", nested(1_000));
    let e = parse_config(&deep).expect_err("not text").to_string();
    assert!(
        e.ends_with("description: invalid type: sequence, expected a string"),
        "{e}"
    );
    // Unicode is fine where text goes.
    let ok = parse_config(&format!(
        "{base}description: \"naïve ☃ 𝄞\"\ntools:\n  - name: écho\n    exec: \"echo ${{t}}\"\n"
    ))
    .expect("unicode text");
    assert!(ok.tools.contains_key("écho"));
}

// ---------------------------------------------------------------------------------------------
// script.yaml

proptest! {
    #![proptest_config(config())]

    #[test]
    fn script_text_never_panics_and_refusals_name_the_file(text in prop_oneof![".*", yamlish()]) {
        if let Err(e) = parse_script(&text, &deployer_tools()) {
            prop_assert!(e.to_string().starts_with("script.yaml"), "{}", e);
        }
    }

    #[test]
    fn valid_scripts_parse_back_as_written(steps in prop::collection::vec(step(), 0..6)) {
        let (steps, json): (Vec<Step>, Vec<Value>) = steps.into_iter().unzip();
        let text = to_yaml(&json!({ "steps": json }));
        let script = parse_script(&text, &deployer_tools()).expect("a valid script");
        prop_assert_eq!(script.steps, steps);
    }

    #[test]
    fn scripts_naming_unknown_tools_or_options_are_refused_by_field(
        steps in prop::collection::vec(step(), 0..4),
        tool in "[a-z]{1,8}".prop_filter("unknown", |t| t != "deploy"),
    ) {
        let (_, mut json): (Vec<Step>, Vec<Value>) = steps.into_iter().unzip();
        let at = json.len();
        json.push(json!({"tool": tool}));
        let e = parse_script(&to_yaml(&json!({ "steps": json })), &deployer_tools())
            .expect_err("unknown tool")
            .to_string();
        let named = format!("steps[{at}].tool: unknown tool `{tool}`");
        prop_assert!(e.contains(&named), "{}", e);
    }
}

#[test]
fn the_example_scripts_mutated_are_refused_clearly() {
    let tools: BTreeMap<String, Tool> = EXAMPLES
        .iter()
        .take(3)
        .flat_map(|(_, c)| parse_config(c).expect("loads").tools)
        .collect();
    for text in SCRIPTS {
        parse_script(text, &tools).expect("an example script");
        let doc: Yaml = serde_yaml_ng::from_str(text).expect("YAML");
        let mut paths = vec![];
        leaves(&doc, &mut vec![], &mut paths);
        for path in &paths {
            for value in ["[1, 2]", "18446744073709551616", "{x: y}", "\"☃\""] {
                if let Err(e) = parse_script(&with_value(&doc, path, value), &tools) {
                    let e = e.to_string();
                    assert!(e.starts_with("script.yaml"), "{}: {e}", field_name(path));
                    assert!(!e.contains("untagged enum"), "{e}");
                }
            }
        }
    }
    let e = parse_script("steps:\n  - dance: now\n", &tools)
        .expect_err("not a step")
        .to_string();
    assert!(e.contains("steps[0]: not a step"), "{e}");
    let e = parse_script(
        "steps:\n  - ask_human: {prompt: p, default_option_id: z, options: [{id: a}]}\n",
        &tools,
    )
    .expect_err("no such default")
    .to_string();
    assert!(
        e.contains("steps[0].ask_human: `default_option_id: z`"),
        "{e}"
    );
    // A billion laughs: aliases that expand exponentially are refused, not expanded.
    let mut laughs = String::from(
        "steps:\n  - tool: echo\n    args:\n      a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n",
    );
    for i in 1..10 {
        let prev = format!("*a{}", i - 1);
        laughs.push_str(&format!(
            "      a{i}: &a{i} [{}]\n",
            vec![prev; 9].join(", ")
        ));
    }
    let e = parse_script(&laughs, &tools)
        .expect_err("refused")
        .to_string();
    assert!(e.contains("repetition limit exceeded"), "{e}");
    let deep = format!(
        "steps:\n  - tool: echo\n    args: {{text: {}}}\n",
        nested(1_000)
    );
    let e = parse_script(&deep, &tools)
        .expect_err("too deep")
        .to_string();
    assert!(e.starts_with("script.yaml"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// Answers, as the engine checks them (edited arguments, edited plans)

fn approval() -> InteractionRequest {
    let mut q = InteractionRequest::new(
        RunId::new(),
        "deployer",
        InteractionType::ToolApproval,
        "ok?",
    );
    q.options = vec![
        delta_protocol::InteractionOption::new(
            "approve",
            "Approve",
            OptionAction::ApproveAndExecute,
        ),
        delta_protocol::InteractionOption::new("reject", "Reject", OptionAction::RejectWithReason),
    ];
    q.context.insert("tool".into(), json!("deploy"));
    q.context.insert(
        "args".into(),
        json!({"env": "production", "version": "1.4.2"}),
    );
    // What the engine puts there (`tool_context`): the tool's parameters, for the gateway.
    q.context
        .insert("parameters".into(), json!(deployer_tools()["deploy"].specs));
    q
}

fn plan_confirmation() -> InteractionRequest {
    let mut q = InteractionRequest::new(
        RunId::new(),
        "deployer",
        InteractionType::UserConfirmation,
        "plan?",
    );
    q.options = vec![
        delta_protocol::InteractionOption::new(
            "confirm",
            "Confirm",
            OptionAction::ApproveAndExecute,
        ),
        delta_protocol::InteractionOption::new("modify", "Modify", OptionAction::RetryWithFeedback),
    ];
    q.context.insert("plan".into(), json!([]));
    q.context.insert(
        "tools".into(),
        json!(deployer_tools().keys().collect::<Vec<_>>()),
    );
    q
}

fn answer(q: &InteractionRequest, option: &str, data: Option<Value>) -> InteractionResponse {
    let mut r = InteractionResponse::new(
        q.request_id,
        Responder {
            id: "a".into(),
            via: Via::Http,
            on_behalf_of: None,
            relayed_by: None,
        },
    );
    r.option_id = Some(option.into());
    r.data = data;
    r
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f)
            .map(Value::Number)),
        prop::sample::select(vec![
            "env",
            "version",
            "deploy",
            "check_key",
            "description",
            "tool"
        ])
        .prop_map(Value::from),
        ".{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("env".to_owned()),
                    Just("version".to_owned()),
                    Just("description".to_owned()),
                    Just("tool".to_owned()),
                    "[a-z]{1,4}"
                ],
                inner,
                0..4
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn edited_arguments_are_checked_against_the_tool(args in json_value()) {
        let q = approval();
        let tools = deployer_tools();
        let edited = json!({"args": args});
        let now = Timestamp::now();
        let r = answer(&q, "approve", Some(edited));
        // The gateway checks with what the question carries, the engine with the agent's tools:
        // the same verdict either way.
        let carried = AnswerSchema::of_request(&q).expect("the question carries its schema");
        prop_assert_eq!(
            check_answer(&q, &carried, r.clone(), now).map(|a| a.action),
            check_answer(&q, &AnswerSchema::of_tools(&tools), r.clone(), now).map(|a| a.action)
        );
        match check_answer(&q, &carried, r, now) {
            Ok(_) => {
                let o = args.as_object().expect("accepted arguments are an object");
                prop_assert!(o.keys().all(|k| k == "env" || k == "version"));
                prop_assert!(o.get("env").is_some_and(|v| !v.is_null()) && o.get("version").is_some_and(|v| !v.is_null()));
            }
            Err(e) => {
                prop_assert_eq!(e.code(), "invalid_args");
                prop_assert!(e.to_string().starts_with("edited arguments refused: "), "{}", e);
            }
        }
    }

    #[test]
    fn edited_plans_name_known_tools(tasks in json_value(), feedback in prop::option::of(".{0,5}")) {
        let q = plan_confirmation();
        let tools = deployer_tools();
        let mut r = answer(&q, "modify", Some(json!({"tasks": tasks})));
        r.feedback = feedback;
        let now = Timestamp::now();
        let carried = AnswerSchema::of_request(&q).expect("the question carries its schema");
        prop_assert_eq!(
            check_answer(&q, &carried, r.clone(), now).map(|a| a.action),
            check_answer(&q, &AnswerSchema::of_tools(&tools), r.clone(), now).map(|a| a.action)
        );
        match check_answer(&q, &carried, r, now) {
            Ok(_) => {
                let list = tasks.as_array().expect("accepted tasks are a list");
                prop_assert!(!list.is_empty());
                for t in list {
                    if let Some(tool) = t.get("tool").and_then(Value::as_str) {
                        prop_assert!(tools.contains_key(tool));
                    }
                }
            }
            Err(e) => {
                prop_assert_eq!(e.code(), "invalid_args");
                prop_assert!(e.to_string().starts_with("edited arguments refused: data.tasks: "), "{}", e);
            }
        }
    }
}
