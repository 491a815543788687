//! The generated OpenAPI document against the code it describes: every route of `api::router`
//! (read from the source, so a new route without docs fails here), with its methods; every
//! `ErrorCode`, with the status it has, and every code the gateway's sources produce; every
//! `$ref` resolvable.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use delta_api::ErrorCode;

const API_RS: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/api.rs"));
const PROTOCOL_RS: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/..",
    "/shared/protocol/src/lib.rs"
));

const METHODS: &[&str] = &[
    "get", "post", "put", "delete", "patch", "head", "options", "trace",
];

fn doc() -> Value {
    let doc: Value =
        serde_json::from_str(&delta_gateway::api::OPENAPI).expect("the document is JSON");
    assert!(doc.is_object(), "the document is a JSON object");
    doc
}

/// A Rust string literal starting at `s` (just after its opening quote): its text, unescaped
/// only for `\"` and `\\` (enough for paths and codes), and the rest after the closing quote.
fn string_literal(s: &str) -> (String, &str) {
    let mut out = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => {
                if let Some((_, n)) = chars.next() {
                    out.push(n);
                }
            }
            '"' => return (out, &s[i + 1..]),
            _ => out.push(c),
        }
    }
    panic!("unterminated string literal in {s:.80}");
}

/// The text inside the parentheses opening at the start of `s` (`s` starts just after `(`),
/// skipping over string literals.
fn inside_parens(s: &str) -> &str {
    let mut depth = 1usize;
    let mut in_str = false;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if in_str {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return &s[..i];
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced parentheses in {s:.80}");
}

/// The method names called at the top level of a method router expression such as
/// `post(submit).get(list_runs)` or `get(|| async { … })`.
fn top_level_methods(expr: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut depth = 0usize;
    let mut in_str = false;
    let mut escaped = false;
    let mut word = String::new();
    for c in expr.chars() {
        if in_str {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '(' | '{' | '[' => {
                if depth == 0 && METHODS.contains(&word.as_str()) {
                    found.insert(word.clone());
                }
                depth += 1;
            }
            ')' | '}' | ']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        if c.is_ascii_alphanumeric() || c == '_' {
            word.push(c);
        } else {
            word.clear();
        }
    }
    found
}

/// Every `.route("<path>", <method router>)` of `src/api.rs`: path → methods.
fn routes_in_source() -> BTreeMap<String, BTreeSet<String>> {
    let mut routes = BTreeMap::new();
    let mut rest = API_RS;
    while let Some(at) = rest.find(".route(") {
        let args = inside_parens(&rest[at + ".route(".len()..]);
        let quote = args
            .find('"')
            .expect("a .route( call starts with its path literal");
        let (path, after) = string_literal(&args[quote + 1..]);
        let router = after
            .trim_start()
            .strip_prefix(',')
            .expect("a comma after the route's path");
        let mut methods = top_level_methods(router);
        assert!(!methods.is_empty(), "no methods found for {path}: {router}");
        if router.contains("crate::sse::") {
            // Marked so that the test below checks these are documented as event streams.
            methods.insert("(sse)".into());
        }
        assert!(
            routes.insert(path.clone(), methods).is_none(),
            "{path} is registered twice"
        );
        rest = &rest[at + ".route(".len()..];
    }
    routes
}

/// The body of `fn <name>` in `src` (from its opening brace to the matching one).
fn fn_body<'a>(src: &'a str, name: &str) -> &'a str {
    let at = src
        .find(&format!("fn {name}("))
        .unwrap_or_else(|| panic!("fn {name} not found"));
    let open = at + src[at..].find('{').expect("a body");
    let mut depth = 0usize;
    for (i, c) in src[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return &src[open..=open + i];
                }
            }
            _ => {}
        }
    }
    panic!("fn {name}: unbalanced braces");
}

/// Every string literal of `src`.
fn literals(src: &str) -> Vec<String> {
    let mut out = vec![];
    let mut rest = src;
    while let Some(q) = rest.find('"') {
        let (lit, after) = string_literal(&rest[q + 1..]);
        out.push(lit);
        rest = after;
    }
    out
}

/// Every code with its status, as `delta-api` decides them.
fn statuses() -> BTreeMap<String, u16> {
    ErrorCode::ALL
        .iter()
        .map(|c| (c.as_str().to_owned(), c.status()))
        .collect()
}

/// Codes the gateway constructs: every `ErrorCode::<Variant>` named in its sources, and the
/// `ResponseError::code` literals of the shared protocol (which the gateway maps variant by
/// variant).
fn codes_constructed() -> BTreeSet<String> {
    let sources = [
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/api.rs")),
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/auth.rs")),
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/bots.rs")),
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/dlq.rs")),
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/error.rs")),
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/ops.rs")),
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/reconcile.rs")),
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/sse.rs")),
    ];
    let by_variant: BTreeMap<String, ErrorCode> = ErrorCode::ALL
        .iter()
        .map(|c| (format!("{c:?}"), *c))
        .collect();
    let mut codes = BTreeSet::new();
    for src in sources {
        let mut rest = src;
        while let Some(at) = rest.find("ErrorCode::") {
            rest = &rest[at + "ErrorCode::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if name.chars().next().is_some_and(|c| c.is_ascii_uppercase()) {
                let code = by_variant
                    .get(&name)
                    .unwrap_or_else(|| panic!("ErrorCode::{name} is not a variant"));
                codes.insert(code.as_str().to_owned());
            }
        }
        // The helpers' codes.
        for (helper, code) in [
            ("ApiError::bad_request(", ErrorCode::BadRequest),
            ("ApiError::not_found(", ErrorCode::NotFound),
            ("ApiError::unavailable(", ErrorCode::Unavailable),
        ] {
            if src.contains(helper) {
                codes.insert(code.as_str().to_owned());
            }
        }
    }
    let code_fn = fn_body(PROTOCOL_RS, "code");
    for code in literals(code_fn) {
        assert!(
            code.parse::<ErrorCode>().is_ok(),
            "ResponseError::code gives `{code}`, which is not an ErrorCode"
        );
        codes.insert(code);
    }
    codes
}

/// `v`, or what its `$ref` points at.
fn resolve(doc: &Value, v: &Value) -> Value {
    match v["$ref"].as_str() {
        Some(r) => doc
            .pointer(r.trim_start_matches('#'))
            .cloned()
            .unwrap_or_else(|| panic!("{r} resolves")),
        None => v.clone(),
    }
}

#[test]
fn it_is_openapi_3_1_and_every_ref_resolves() {
    let doc = doc();
    let version = doc["openapi"].as_str().expect("an `openapi` version");
    assert!(version.starts_with("3.1."), "OpenAPI 3.1, not {version}");
    assert!(doc["info"]["title"].is_string() && doc["info"]["version"].is_string());
    fn walk(v: &Value, doc: &Value, at: &str) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(r)) = m.get("$ref") {
                    let pointer = r
                        .strip_prefix('#')
                        .unwrap_or_else(|| panic!("{at}: external $ref {r}"));
                    assert!(
                        doc.pointer(pointer).is_some(),
                        "{at}: {r} resolves to nothing"
                    );
                }
                for (k, x) in m {
                    walk(x, doc, &format!("{at}/{k}"));
                }
            }
            Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    walk(x, doc, &format!("{at}/{i}"));
                }
            }
            _ => {}
        }
    }
    walk(&doc, &doc, "");
    let schemes = &doc["components"]["securitySchemes"]["bearerAuth"];
    assert_eq!(
        (schemes["type"].as_str(), schemes["scheme"].as_str()),
        (Some("http"), Some("bearer"))
    );
    for name in [
        "RunRecord",
        "InteractionRequest",
        "InteractionOption",
        "InteractionResponse",
        "InteractionView",
        "JournalEvent",
        "Resolved",
        "Error",
    ] {
        assert!(
            doc["components"]["schemas"][name].is_object(),
            "components/schemas/{name}"
        );
    }
}

#[test]
fn every_route_is_documented_with_its_methods_and_nothing_else_is() {
    let doc = doc();
    let paths = doc["paths"].as_object().expect("paths");
    let routes = routes_in_source();
    assert!(
        routes.len() >= 14,
        "found only {} routes in src/api.rs: {routes:?}",
        routes.len()
    );
    for (path, methods) in &routes {
        let item = paths
            .get(path)
            .unwrap_or_else(|| panic!("{path} is a route of api::router but not in openapi.json"));
        for method in methods.iter().filter(|m| !m.starts_with('(')) {
            let op = item.get(method.as_str()).unwrap_or_else(|| {
                panic!(
                    "{} {path} is served but not documented",
                    method.to_uppercase()
                )
            });
            assert!(
                op["operationId"].is_string(),
                "{method} {path}: operationId"
            );
            let responses = op["responses"].as_object().expect("responses");
            assert!(
                responses.keys().any(|s| s.starts_with('2')),
                "{method} {path}: a 2xx response"
            );
        }
        let documented: BTreeSet<String> = item
            .as_object()
            .expect("a path item")
            .keys()
            .filter(|k| METHODS.contains(&k.as_str()))
            .cloned()
            .collect();
        let served: BTreeSet<String> = methods
            .iter()
            .filter(|m| !m.starts_with('('))
            .cloned()
            .collect();
        assert_eq!(documented, served, "{path}: documented vs served methods");
        if methods.contains("(sse)") {
            assert!(
                item["get"]["responses"]["200"]["content"]["text/event-stream"].is_object(),
                "{path} streams server-sent events: document 200 as text/event-stream"
            );
        }
    }
    for path in paths.keys() {
        assert!(
            routes.contains_key(path),
            "{path} is documented but api::router has no such route"
        );
    }
}

#[test]
fn the_error_codes_are_those_of_the_code_with_their_statuses() {
    let doc = doc();
    let error = resolve(
        &doc,
        &doc["components"]["schemas"]["Error"]["properties"]["error"],
    );
    let code = resolve(&doc, &error["properties"]["code"]);
    let documented: BTreeSet<String> = code["enum"]
        .as_array()
        .expect("the Error schema's code enum")
        .iter()
        .map(|c| c.as_str().expect("a code").to_owned())
        .collect();
    let statuses = statuses();
    let in_status: BTreeSet<String> = statuses.keys().cloned().collect();
    assert_eq!(
        documented, in_status,
        "the Error code enum of the document vs ErrorCode"
    );
    let constructed = codes_constructed();
    let unmapped: Vec<&String> = constructed.difference(&in_status).collect();
    assert!(
        unmapped.is_empty(),
        "codes made in the sources that are not ErrorCodes: {unmapped:?}"
    );
    // Every code is answered, with its status, by at least one operation; and every code the
    // gateway makes is among them.
    let mut answered: BTreeSet<String> = BTreeSet::new();
    // Each operation's error responses use the Error schema and give the status of their code.
    let codes_by_status: BTreeMap<u16, BTreeSet<&str>> =
        statuses.iter().fold(BTreeMap::new(), |mut m, (c, s)| {
            m.entry(*s).or_default().insert(c.as_str());
            m
        });
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("item") {
            for (status, response) in op["responses"].as_object().expect("responses") {
                let number: u16 = status.parse().expect("numeric statuses");
                if number < 400 || path == "/readyz" {
                    continue;
                }
                let response = resolve(&doc, response);
                let content = &response["content"]["application/json"];
                assert_eq!(
                    content["schema"]["$ref"], "#/components/schemas/Error",
                    "{method} {path} {status}: the Error schema"
                );
                assert!(
                    codes_by_status.contains_key(&number),
                    "{method} {path}: no code has status {status}"
                );
                if let Some(code) = content["example"]["error"]["code"].as_str() {
                    assert_eq!(
                        statuses.get(code),
                        Some(&number),
                        "{method} {path} {status}: example code {code}"
                    );
                }
                let description = response["description"].as_str().unwrap_or_default();
                for code in &codes_by_status[&number] {
                    if description.contains(&format!("`{code}`")) {
                        answered.insert((*code).to_owned());
                    }
                }
            }
        }
    }
    let never: Vec<&String> = in_status.difference(&answered).collect();
    assert!(
        never.is_empty(),
        "codes no operation documents as an answer: {never:?}"
    );
    let undocumented: Vec<&String> = constructed.difference(&answered).collect();
    assert!(
        undocumented.is_empty(),
        "codes the gateway makes that no operation documents: {undocumented:?}"
    );
}

#[test]
fn the_route_reader_sees_methods_and_streams() {
    let methods = top_level_methods(r#" post(submit).get(list_runs)"#);
    assert_eq!(
        methods,
        BTreeSet::from(["get".to_owned(), "post".to_owned()])
    );
    let methods = top_level_methods(r#" get(|| async { Json(json!({"status": "ok"})) })"#);
    assert_eq!(methods, BTreeSet::from(["get".to_owned()]));
    let constructed = codes_constructed();
    for code in [
        "bad_request",
        "not_found",
        "unavailable",
        "invalid_args",
        "not_retryable",
    ] {
        assert!(constructed.contains(code), "the source reader sees {code}");
    }
}
