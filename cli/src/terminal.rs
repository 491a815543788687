//! `-i`: asking on the terminal. Prompts go to stderr (stdout stays clean for `--json`), answers
//! come from stdin: hidden when sensitive and stdin is a terminal, plain lines otherwise (so
//! `-i` works with piped input too).

use std::io::{BufRead, IsTerminal, Write};

use delta_protocol::{InteractionRequest, InteractionResponse, Timestamp, Via};
use tokio_util::sync::CancellationToken;

use crate::mailbox::{apply_edits, editable_args, find_option, local_responder};
use delta_protocol::OptionAction;
use delta_protocol::schema::{Field, FieldKind, ResponseSchema, number_text};
use serde_json::Value;

/// How a prompt ended.
// One value per question asked at a terminal: its size does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Asked {
    Answer(InteractionResponse),
    /// stdin closed: nobody is there to answer.
    Eof,
    Cancelled,
    /// `expires_at` passed while waiting.
    Expired,
}

enum Line {
    Text(String),
    Eof,
    Cancelled,
    Expired,
}

async fn read_line(hidden: bool, cancel: &CancellationToken, deadline: Option<Timestamp>) -> Line {
    let task = tokio::task::spawn_blocking(move || -> Option<String> {
        if hidden && std::io::stdin().is_terminal() {
            return rpassword::read_password().ok();
        }
        let mut s = String::new();
        match std::io::stdin().lock().read_line(&mut s) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(s.trim_end_matches(['\n', '\r']).to_owned()),
        }
    });
    let wait = async {
        match deadline {
            Some(t) => {
                let left = (t.micros() - Timestamp::now().micros()).max(0) as u64;
                tokio::time::sleep(std::time::Duration::from_micros(left)).await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        r = task => match r {
            Ok(Some(s)) => Line::Text(s),
            _ => Line::Eof,
        },
        () = cancel.cancelled() => Line::Cancelled,
        () = wait => Line::Expired,
    }
}

/// Writes to stderr, as [`crate::table::for_terminal`] shows it: the question's text is the
/// agent's, never trusted with the terminal.
fn say(text: &str) {
    let mut e = std::io::stderr().lock();
    let _ = write!(e, "{}", crate::table::for_terminal(text));
    let _ = e.flush();
}

/// Shows the request and reads an answer, re-asking until it is well-formed for the request.
pub async fn ask(q: &InteractionRequest, cancel: &CancellationToken) -> Asked {
    let hidden = q.is_sensitive();
    let mut header = String::from("\n");
    if let Some(t) = &q.title {
        header.push_str(&format!("== {t} ==\n"));
    }
    header.push_str(&format!("? {}\n", q.prompt));
    for line in q.details.iter().flat_map(|d| d.lines()) {
        header.push_str(&format!("  {line}\n"));
    }
    if let Some(cmd) = q.context.get("command_line").and_then(|v| v.as_str()) {
        header.push_str(&format!("  command: {cmd}\n"));
    }
    if let Some(args) = q.context.get("args").filter(|a| a.is_object()) {
        header.push_str(&format!("  args:    {args}\n"));
    }
    if let Some(risk) = q.context.get("risk_level").and_then(|v| v.as_str()) {
        let why = q
            .context
            .get("dangerous_because")
            .and_then(|v| v.as_str())
            .map(|w| format!(" ({w})"))
            .unwrap_or_default();
        header.push_str(&format!("  risk:    {risk}{why}\n"));
    }
    if let Some(e) = q.expires_at {
        let default = q
            .default_option_id
            .as_deref()
            .unwrap_or("none: the run fails");
        header.push_str(&format!(
            "  (answer before {e}; then the default applies: {default})\n"
        ));
    }
    if let Some(a) = &q.approvals {
        // Votes, claims and escalation belong to the fleet's gateway; here one person answers.
        header.push_str(&format!(
            "  (in the fleet this needs {} approvals; here, your answer decides it)\n",
            a.min
        ));
    }
    for (i, o) in q.options.iter().enumerate() {
        let mut line = format!("  {}) {}", i + 1, o.label);
        if o.label != o.option_id {
            line.push_str(&format!(" [{}]", o.option_id));
        }
        if let Some(d) = &o.description {
            line.push_str(&format!(" - {d}"));
        }
        if o.is_dangerous {
            line.push_str("  !! dangerous");
        }
        if o.is_default {
            line.push_str("  (default)");
        }
        if o.requires_input {
            line.push_str("  (asks for text)");
        }
        header.push_str(&line);
        header.push('\n');
    }
    if q.context.get("grantable") == Some(&serde_json::Value::Bool(true)) {
        header.push_str(&format!(
            "  always allow: add +run or +agent to the approval (`approve +agent`) to approve later calls like this one in this run, or in every run of {}\n",
            q.agent
        ));
    }
    say(&header);
    if q.is_expired_at(Timestamp::now()) {
        return Asked::Expired;
    }
    let mut resp = InteractionResponse::new(q.request_id, local_responder(Via::Stdin));
    if let Some(v) = &q.response_schema {
        let schema = match ResponseSchema::parse(v) {
            Ok(s) => s,
            Err(e) => {
                // Checked when the agent asked; a request written by something else may not be.
                say(&format!("  this question cannot be answered here: {e}\n"));
                return Asked::Eof;
            }
        };
        return match ask_fields(&schema, hidden, cancel, q.expires_at).await {
            Ok(data) => {
                resp.data = Some(data);
                Asked::Answer(resp)
            }
            Err(stop) => stop,
        };
    }
    if q.options.is_empty() {
        loop {
            say(if hidden { "(hidden) > " } else { "> " });
            match read_line(hidden, cancel, q.expires_at).await {
                Line::Text(t) if t.trim().is_empty() => {
                    say("  an answer is needed (Ctrl+C to stop)\n")
                }
                Line::Text(t) => {
                    resp.input = Some(t);
                    return Asked::Answer(resp);
                }
                Line::Eof => return Asked::Eof,
                Line::Cancelled => return Asked::Cancelled,
                Line::Expired => return Asked::Expired,
            }
        }
    }
    let (option, grant) = loop {
        say(&format!(
            "choose 1-{} (or an option id) > ",
            q.options.len()
        ));
        match read_line(false, cancel, q.expires_at).await {
            Line::Text(t) => {
                let (text, grant) = split_grant(t.trim());
                match find_option(q, text) {
                    Some(id) => break (id, grant),
                    None => say(&format!("  `{}` is not one of the options\n", t.trim())),
                }
            }
            Line::Eof => return Asked::Eof,
            Line::Cancelled => return Asked::Cancelled,
            Line::Expired => return Asked::Expired,
        }
    };
    let chosen = q.option(&option);
    // Feedback and reasons are text the engine needs, whether or not the option says so.
    let wants_text = chosen.is_some_and(|o| {
        o.requires_input
            || (o.input_prompt.is_some()
                && matches!(
                    o.action,
                    OptionAction::RetryWithFeedback | OptionAction::RejectWithReason
                ))
    });
    if wants_text {
        let prompt = chosen
            .and_then(|o| o.input_prompt.clone())
            .unwrap_or_else(|| "text".into());
        loop {
            say(&format!(
                "{prompt}{} > ",
                if hidden { " (hidden)" } else { "" }
            ));
            match read_line(hidden, cancel, q.expires_at).await {
                Line::Text(t) if t.trim().is_empty() => say("  this option needs text\n"),
                Line::Text(t) => {
                    resp.input = Some(t);
                    break;
                }
                Line::Eof => return Asked::Eof,
                Line::Cancelled => return Asked::Cancelled,
                Line::Expired => return Asked::Expired,
            }
        }
    }
    if let Some(args) = editable_args(q, &option) {
        match edit_args(args, cancel, q).await {
            Ok(Some(edited)) => resp.data = Some(serde_json::json!({ "args": edited })),
            Ok(None) => {}
            Err(stop) => return stop,
        }
    }
    if let Some(scope) = grant {
        // Checked with the rest of the answer (an option that does not approve, a tool that is
        // not grantable: refused, and asked again).
        let grant = serde_json::json!({ "scope": scope });
        match resp.data.as_mut().and_then(|d| d.as_object_mut()) {
            Some(obj) => {
                obj.insert("grant".into(), grant);
            }
            None => resp.data = Some(serde_json::json!({ "grant": grant })),
        }
    }
    resp.option_id = Some(option);
    Asked::Answer(resp)
}

/// An option line's "always allow" suffix: `approve +agent` is the option `approve` with a grant
/// of scope `agent` (`+run`: this run only).
fn split_grant(line: &str) -> (&str, Option<&'static str>) {
    for (suffix, scope) in [("+agent", "agent"), ("+run", "run")] {
        if let Some(rest) = line.strip_suffix(suffix) {
            return (rest.trim_end(), Some(scope));
        }
    }
    (line, None)
}

/// Editor-free argument editing: `key=value` lines until an empty one. `None`: unchanged.
async fn edit_args(
    args: &serde_json::Value,
    cancel: &CancellationToken,
    q: &InteractionRequest,
) -> Result<Option<serde_json::Value>, Asked> {
    say(
        "  edit the arguments? one key=value per line, an empty line to run (just Enter: as shown)\n",
    );
    let mut lines: Vec<String> = vec![];
    loop {
        say("edit > ");
        match read_line(false, cancel, q.expires_at).await {
            Line::Text(t) if t.trim().is_empty() => break,
            Line::Text(t) => match apply_edits(args, &[t.as_str()]) {
                Ok(_) => lines.push(t),
                Err(e) => say(&format!(
                    "  {e}: write key=value, or an empty line to finish\n"
                )),
            },
            // Nothing more to read: run with the edits given so far.
            Line::Eof => break,
            Line::Cancelled => return Err(Asked::Cancelled),
            Line::Expired => return Err(Asked::Expired),
        }
    }
    if lines.is_empty() {
        return Ok(None);
    }
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    let edited = apply_edits(args, &refs).map_err(|_| Asked::Eof)?;
    say(&format!("  running with: {edited}\n"));
    Ok(Some(edited))
}

/// A typed answer, asked field by field: each field's title, description, bounds and choices, its
/// default on an empty line, and the question again until the value fits.
async fn ask_fields(
    schema: &ResponseSchema,
    hidden: bool,
    cancel: &CancellationToken,
    deadline: Option<Timestamp>,
) -> Result<Value, Asked> {
    say("  (one field at a time; an empty line takes the default, or skips an optional field)\n");
    let mut data = serde_json::Map::new();
    for f in &schema.fields {
        say(&field_header(f));
        loop {
            say(&format!("{} > ", f.label()));
            let text = match read_line(hidden && is_text(f), cancel, deadline).await {
                Line::Text(t) => t,
                Line::Eof => return Err(Asked::Eof),
                Line::Cancelled => return Err(Asked::Cancelled),
                Line::Expired => return Err(Asked::Expired),
            };
            match field_value(f, &text) {
                Ok(Some(v)) => {
                    data.insert(f.name.clone(), v);
                    break;
                }
                Ok(None) => break,
                Err(e) => say(&format!("  {e}\n")),
            }
        }
    }
    Ok(Value::Object(data))
}

fn is_text(f: &Field) -> bool {
    matches!(f.kind, FieldKind::Text { .. })
}

/// What is shown before a field is asked: its name, what it takes, its choices.
fn field_header(f: &Field) -> String {
    let mut s = format!("  {}", f.label());
    if f.label() != f.name {
        s.push_str(&format!(" [{}]", f.name));
    }
    s.push_str(if f.required {
        " (required)"
    } else {
        " (optional)"
    });
    if let Some(d) = &f.description {
        s.push_str(&format!(" - {d}"));
    }
    let bounds = |low: Option<String>, high: Option<String>, unit: &str| match (low, high) {
        (Some(l), Some(h)) => format!(" {l} to {h}{unit}"),
        (Some(l), None) => format!(" at least {l}{unit}"),
        (None, Some(h)) => format!(" at most {h}{unit}"),
        (None, None) => String::new(),
    };
    let what = match &f.kind {
        FieldKind::Text {
            min_length,
            max_length,
            format,
            ..
        } => {
            let mut w = match format {
                Some(fm) => format!("{} (e.g. {})", fm.as_str(), fm.example()),
                None => "text".to_owned(),
            };
            w.push_str(&bounds(
                min_length.map(|n| n.to_string()),
                max_length.map(|n| n.to_string()),
                " characters",
            ));
            w
        }
        FieldKind::Number {
            integer,
            minimum,
            maximum,
            ..
        } => format!(
            "{}{}",
            if *integer {
                "a whole number"
            } else {
                "a number"
            },
            bounds(minimum.map(number_text), maximum.map(number_text), "")
        ),
        FieldKind::Boolean { .. } => "yes or no".to_owned(),
        FieldKind::Choice { .. } => "one of these, by number or value".to_owned(),
        FieldKind::Choices {
            min_items,
            max_items,
            ..
        } => format!(
            "any of these, by number or value, separated by commas{}",
            bounds(
                min_items.map(|n| n.to_string()),
                max_items.map(|n| n.to_string()),
                " of them"
            )
        ),
    };
    s.push_str(&format!("\n    {what}"));
    if let Some(d) = f.default_value() {
        s.push_str(&format!("; default: {}", shown(&d)));
    }
    s.push('\n');
    if let FieldKind::Choice { choices, .. } | FieldKind::Choices { choices, .. } = &f.kind {
        for (i, c) in choices.iter().enumerate() {
            s.push_str(&format!("    {}) {}", i + 1, c.label()));
            if c.label() != c.value {
                s.push_str(&format!(" [{}]", c.value));
            }
            s.push('\n');
        }
    }
    s
}

fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Bool(true) => "yes".into(),
        Value::Bool(false) => "no".into(),
        Value::Array(a) => a.iter().map(shown).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    }
}

/// The value `text` gives field `f`: `Ok(None)` leaves an optional field out; `Err` says what
/// to type instead. The value is checked against the field's bounds, format and choices.
pub fn field_value(f: &Field, text: &str) -> Result<Option<Value>, String> {
    let text = text.trim();
    if text.is_empty() {
        if let Some(d) = f.default_value() {
            return Ok(Some(d));
        }
        if !f.required {
            return Ok(None);
        }
        if !matches!(f.kind, FieldKind::Choices { .. }) {
            return Err("this field is required".into());
        }
    }
    let pick = |choices: &[delta_protocol::schema::Choice], s: &str| -> Result<String, String> {
        let s = s.trim();
        choices
            .iter()
            .find(|c| c.value == s)
            .or_else(|| choices.iter().find(|c| c.label().eq_ignore_ascii_case(s)))
            .or_else(|| {
                s.parse::<usize>()
                    .ok()
                    .and_then(|n| n.checked_sub(1))
                    .and_then(|i| choices.get(i))
            })
            .map(|c| c.value.clone())
            .ok_or_else(|| format!("`{s}` is not one of the choices (1-{})", choices.len()))
    };
    let v = match &f.kind {
        FieldKind::Text { .. } => Value::String(text.to_owned()),
        FieldKind::Number { integer, .. } => {
            let n = serde_json::from_str::<Value>(text)
                .ok()
                .filter(Value::is_number)
                .ok_or_else(|| {
                    format!(
                        "`{text}` is not {}",
                        if *integer {
                            "a whole number"
                        } else {
                            "a number"
                        }
                    )
                })?;
            // `3.0` for an integer field is 3.
            match n.as_f64() {
                Some(x)
                    if *integer && x.fract() == 0.0 && n.as_i64().is_none() && x.abs() < 9e15 =>
                {
                    Value::from(x as i64)
                }
                _ => n,
            }
        }
        FieldKind::Boolean { .. } => match text.to_ascii_lowercase().as_str() {
            "y" | "yes" | "true" | "1" => Value::Bool(true),
            "n" | "no" | "false" | "0" => Value::Bool(false),
            _ => return Err(format!("`{text}` is not yes or no")),
        },
        FieldKind::Choice { choices, .. } => Value::String(pick(choices, text)?),
        FieldKind::Choices { choices, .. } => Value::Array(
            text.split(',')
                .filter(|s| !s.trim().is_empty())
                .map(|s| pick(choices, s).map(Value::String))
                .collect::<Result<_, _>>()?,
        ),
    };
    f.check(&v)?;
    Ok(Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> ResponseSchema {
        ResponseSchema::parse(&json!({"type": "object", "properties": {
            "email": {"type": "string", "format": "email"},
            "count": {"type": "integer", "minimum": 1, "default": 2},
            "ok": {"type": "boolean"},
            "env": {"type": "string", "oneOf": [{"const": "stg", "title": "Staging"}, {"const": "prd", "title": "Production"}]},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1}
        }, "required": ["email", "tags"]}))
        .expect("schema")
    }

    #[test]
    fn typed_lines_become_checked_values() {
        let s = schema();
        let f = |n: &str| s.field(n).expect("field");
        assert_eq!(field_value(f("email"), "a@b.c"), Ok(Some(json!("a@b.c"))));
        assert!(field_value(f("email"), "ab").is_err());
        assert!(field_value(f("email"), "").is_err(), "required");
        assert_eq!(
            field_value(f("count"), ""),
            Ok(Some(json!(2))),
            "the default"
        );
        assert_eq!(field_value(f("count"), "3.0"), Ok(Some(json!(3))));
        assert!(field_value(f("count"), "0").is_err());
        assert!(field_value(f("count"), "x").is_err());
        assert_eq!(field_value(f("ok"), "Yes"), Ok(Some(json!(true))));
        assert_eq!(field_value(f("ok"), ""), Ok(None), "optional: left out");
        assert_eq!(field_value(f("env"), "2"), Ok(Some(json!("prd"))));
        assert_eq!(field_value(f("env"), "staging"), Ok(Some(json!("stg"))));
        assert!(field_value(f("env"), "3").is_err());
        assert_eq!(field_value(f("tags"), "1, c"), Ok(Some(json!(["a", "c"]))));
        assert!(field_value(f("tags"), "").is_err(), "minItems 1");
        assert!(field_value(f("tags"), "a,a").is_err());
    }
}
