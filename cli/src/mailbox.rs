//! Delta Engine v1.2's file mailbox (docs/protocol.md §7): `.delta/interaction/request.json` is the
//! question, `response.txt` (free text, or an option) or `response.json` (the full response) the
//! answer.
//!
//! The mailbox is only ever trusted for the request it was written for: `request.json` carries
//! the request id, and an answer found beside a `request.json` of another request is stale (its
//! request was already journaled as answered before a crash) and is discarded, never applied to
//! the next question.

use std::fs;
use std::path::{Path, PathBuf};

use delta_protocol::{
    InteractionRequest, InteractionResponse, InteractionType, OptionAction, RequestId, Responder,
    Via,
};
use delta_store::file::write_atomically;
use serde::Deserialize;
use serde_json::Value;

/// The mailbox under `<work dir>/.delta/interaction`.
pub struct Mailbox {
    dir: PathBuf,
}

/// Why the answer in the mailbox cannot be used. The mailbox is left as it is.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: refused ({code}): {message}")]
    Bad {
        path: String,
        /// The docs/protocol.md code of the refusal (`invalid_option`, `input_required`, …).
        code: &'static str,
        message: String,
    },
    #[error("{0}: cannot read it ({1})")]
    Io(String, std::io::Error),
}

/// `response.json` as people write it: only `option_id` and/or `input` are needed.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LooseResponse {
    #[serde(default)]
    request_id: Option<String>,
    #[serde(default)]
    option_id: Option<String>,
    #[serde(default)]
    input: Option<String>,
    #[serde(default)]
    data: Option<Value>,
    #[serde(default)]
    feedback: Option<String>,
    #[serde(default)]
    responder: Option<Responder>,
    /// The request's `request_hash` as the person saw it: a mismatch is refused (`stale`).
    #[serde(default)]
    request_hash: Option<String>,
}

/// Who answers through the mailbox: the local user.
pub fn local_responder(via: Via) -> Responder {
    let id = std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "local".into());
    Responder::new(id, via)
}

impl Mailbox {
    pub fn new(delta_dir: &Path) -> Self {
        Self {
            dir: delta_dir.join("interaction"),
        }
    }

    pub fn request_path(&self) -> PathBuf {
        self.dir.join("request.json")
    }

    pub fn txt_path(&self) -> PathBuf {
        self.dir.join("response.txt")
    }

    pub fn json_path(&self) -> PathBuf {
        self.dir.join("response.json")
    }

    /// Writes `request.json` (atomically).
    pub fn write_request(&self, q: &InteractionRequest) -> Result<(), delta_store::Error> {
        let mut bytes = serde_json::to_vec_pretty(q).unwrap_or_default();
        bytes.push(b'\n');
        write_atomically(&self.request_path(), &bytes)
    }

    /// The id in `request.json`, if there is a readable one.
    pub fn request_on_file(&self) -> Option<RequestId> {
        let text = fs::read(self.request_path()).ok()?;
        let v: Value = serde_json::from_slice(&text).ok()?;
        v.get("request_id")?.as_str()?.parse().ok()
    }

    /// Removes the answer files (after the answer was journaled, or when they are stale).
    pub fn clear_responses(&self) {
        for p in [self.txt_path(), self.json_path()] {
            let _ = fs::remove_file(p);
        }
    }

    /// Removes everything: no question is pending.
    pub fn clear(&self) {
        self.clear_responses();
        let _ = fs::remove_file(self.request_path());
    }

    /// The answer waiting for `q`, if any.
    pub fn read_answer(
        &self,
        q: &InteractionRequest,
    ) -> Result<Option<InteractionResponse>, Error> {
        let txt = read_opt(&self.txt_path())?;
        let json = read_opt(&self.json_path())?;
        self.parse_answer(q, txt.as_deref(), json.as_deref())
    }

    /// The answer for `q` in the contents of `response.txt` and `response.json` (`None`: the
    /// file is absent). Pure: what [`Mailbox::read_answer`] does once the files are read.
    pub fn parse_answer(
        &self,
        q: &InteractionRequest,
        txt: Option<&[u8]>,
        json: Option<&[u8]>,
    ) -> Result<Option<InteractionResponse>, Error> {
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        match (txt, json) {
            (None, None) => Ok(None),
            (Some(_), Some(_)) => Err(Error::Bad {
                path: self.dir.display().to_string(),
                code: "bad_request",
                message: "both response.txt and response.json are there: keep only one".into(),
            }),
            (Some(b), None) => parse_txt(q, &text(b))
                .map(Some)
                .map_err(|r| r.at(&self.txt_path())),
            (None, Some(b)) => parse_json(q, &text(b))
                .map(Some)
                .map_err(|r| r.at(&self.json_path())),
        }
    }
}

fn read_opt(path: &Path) -> Result<Option<Vec<u8>>, Error> {
    match fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::Io(path.display().to_string(), e)),
    }
}

/// A mailbox answer that cannot be read as a response: its docs/protocol.md code and what to write.
#[derive(Debug, PartialEq, Eq)]
pub struct Refused {
    pub code: &'static str,
    pub message: String,
}

impl Refused {
    fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    fn at(self, path: &Path) -> Error {
        Error::Bad {
            path: path.display().to_string(),
            code: self.code,
            message: self.message,
        }
    }
}

/// `response.txt`: free text; or, for a request with options, the option (its id, its label or
/// its number) on the first line, optionally followed by `: text` or by more lines of input.
pub fn parse_txt(q: &InteractionRequest, text: &str) -> Result<InteractionResponse, Refused> {
    let text = text.trim_end_matches(['\n', '\r']);
    let mut resp = InteractionResponse::new(q.request_id, local_responder(Via::File));
    if q.response_schema.is_some() {
        return Err(Refused::new(
            "invalid_data",
            format!(
                "this request takes a typed answer: write it as {{\"data\": {}}} into response.json instead",
                typed_example(q)
            ),
        ));
    }
    if q.options.is_empty() {
        if text.trim().is_empty() {
            return Err(Refused::new(
                "input_required",
                "the answer is empty: write the answer text into the file",
            ));
        }
        resp.input = Some(text.to_owned());
        return Ok(resp);
    }
    let (first, rest) = text.split_once('\n').unwrap_or((text, ""));
    let (choice, inline) = match find_option(q, first.trim()) {
        Some(id) => (Some(id), None),
        None => match first.split_once(':') {
            Some((head, tail)) => (find_option(q, head.trim()), Some(tail.trim())),
            None => (None, None),
        },
    };
    let Some(option_id) = choice else {
        let valid: Vec<String> = q
            .options
            .iter()
            .enumerate()
            .map(|(i, o)| format!("{} ({}, or {})", o.option_id, o.label, i + 1))
            .collect();
        return Err(Refused::new(
            "invalid_option",
            format!(
                "`{}` is not an option of this request; write one of: {}",
                first.trim(),
                valid.join("; ")
            ),
        ));
    };
    let input = [inline.unwrap_or(""), rest.trim()]
        .iter()
        .filter(|s| !s.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join("\n");
    if let Some(args) = editable_args(q, &option_id)
        && !input.is_empty()
    {
        // Approving a tool call: the lines after the option edit its arguments.
        let lines: Vec<&str> = input.lines().collect();
        let edited = apply_edits(args, &lines).map_err(|e| {
            Refused::new(
                "invalid_args",
                format!(
                    "{e}; after `{option_id}`, write one key=value per line to edit the arguments"
                ),
            )
        })?;
        resp.data = Some(serde_json::json!({ "args": edited }));
        resp.option_id = Some(option_id);
        return Ok(resp);
    }
    resp.option_id = Some(option_id);
    resp.input = (!input.is_empty()).then_some(input);
    Ok(resp)
}

/// One line per field of `q`'s typed answer (none without a usable schema), e.g.
/// `email (required): Contact email - email` or `env: one of staging, production`.
pub fn typed_fields(q: &InteractionRequest) -> Vec<String> {
    use delta_protocol::schema::{FieldKind, ResponseSchema, number_text};
    let Some(schema) = q
        .response_schema
        .as_ref()
        .and_then(|v| ResponseSchema::parse(v).ok())
    else {
        return vec![];
    };
    let range = |lo: Option<String>, hi: Option<String>| match (lo, hi) {
        (Some(l), Some(h)) => format!(" {l} to {h}"),
        (Some(l), None) => format!(" from {l}"),
        (None, Some(h)) => format!(" up to {h}"),
        (None, None) => String::new(),
    };
    let values = |c: &[delta_protocol::schema::Choice]| {
        c.iter()
            .map(|c| c.value.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    schema
        .fields
        .iter()
        .map(|f| {
            let what = match &f.kind {
                FieldKind::Text {
                    format,
                    min_length,
                    max_length,
                    ..
                } => {
                    let len = range(
                        min_length.map(|n| n.to_string()),
                        max_length.map(|n| n.to_string()),
                    );
                    let kind = format.map(|f| f.as_str()).unwrap_or("text");
                    if len.is_empty() {
                        kind.to_owned()
                    } else {
                        format!("{kind},{len} characters")
                    }
                }
                FieldKind::Number {
                    integer,
                    minimum,
                    maximum,
                    ..
                } => format!(
                    "{}{}",
                    if *integer { "integer" } else { "number" },
                    range(minimum.map(number_text), maximum.map(number_text))
                ),
                FieldKind::Boolean { .. } => "true or false".to_owned(),
                FieldKind::Choice { choices, .. } => format!("one of {}", values(choices)),
                FieldKind::Choices { choices, .. } => format!("a list of {}", values(choices)),
            };
            format!(
                "{}{}{} - {what}",
                f.name,
                if f.required { " (required)" } else { "" },
                f.title
                    .as_deref()
                    .map(|t| format!(": {t}"))
                    .unwrap_or_default()
            )
        })
        .collect()
}

/// An example of a typed answer's `data` for `q`: each field with its default or a value of its
/// kind (`{}` when `q` has no usable schema).
pub fn typed_example(q: &InteractionRequest) -> String {
    use delta_protocol::schema::{FieldKind, ResponseSchema};
    let Some(schema) = q
        .response_schema
        .as_ref()
        .and_then(|v| ResponseSchema::parse(v).ok())
    else {
        return "{}".into();
    };
    let mut obj = serde_json::Map::new();
    for f in &schema.fields {
        let v = f.default_value().unwrap_or_else(|| match &f.kind {
            FieldKind::Text { format, .. } => {
                Value::String(format.map(|f| f.example()).unwrap_or("…").to_owned())
            }
            FieldKind::Number { minimum, .. } => {
                serde_json::json!(minimum.map(|m| m.max(0.0)).unwrap_or(1.0) as i64)
            }
            FieldKind::Boolean { .. } => Value::Bool(true),
            FieldKind::Choice { choices, .. } => {
                Value::String(choices.first().map(|c| c.value.clone()).unwrap_or_default())
            }
            FieldKind::Choices { choices, .. } => serde_json::json!(
                choices
                    .first()
                    .map(|c| vec![c.value.clone()])
                    .unwrap_or_default()
            ),
        });
        obj.insert(f.name.clone(), v);
    }
    Value::Object(obj).to_string()
}

/// The arguments an answer picking `option_id` may edit: those of the tool call a
/// `TOOL_APPROVAL` is about, when the option approves it.
pub fn editable_args<'q>(q: &'q InteractionRequest, option_id: &str) -> Option<&'q Value> {
    let approves = q
        .option(option_id)
        .is_some_and(|o| o.action == OptionAction::ApproveAndExecute);
    let args = q.context.get("args").filter(|a| a.is_object())?;
    (approves && q.kind == InteractionType::ToolApproval).then_some(args)
}

/// Applies `key=value` lines to `args` (blank lines are skipped). A value replaces the argument
/// as text, or as a number/boolean when the argument was one and the text reads as one.
pub fn apply_edits(args: &Value, lines: &[&str]) -> Result<Value, String> {
    let mut out = args.as_object().cloned().unwrap_or_default();
    for line in lines.iter().map(|l| l.trim()).filter(|l| !l.is_empty()) {
        let Some((key, value)) = line.split_once('=') else {
            return Err(format!("`{line}` is not key=value"));
        };
        let key = key.trim();
        if key.is_empty() {
            return Err(format!("`{line}` has no key before `=`"));
        }
        let value = value.trim();
        let typed = match out.get(key) {
            Some(Value::Number(_) | Value::Bool(_)) => serde_json::from_str::<Value>(value)
                .ok()
                .filter(|v| v.is_number() || v.is_boolean()),
            _ => None,
        };
        out.insert(
            key.to_owned(),
            typed.unwrap_or_else(|| Value::String(value.to_owned())),
        );
    }
    Ok(Value::Object(out))
}

/// An option by id, then by label (any case), then by its 1-based number.
pub fn find_option(q: &InteractionRequest, s: &str) -> Option<String> {
    if s.is_empty() {
        return None;
    }
    q.options
        .iter()
        .find(|o| o.option_id == s)
        .or_else(|| q.options.iter().find(|o| o.label.eq_ignore_ascii_case(s)))
        .or_else(|| {
            s.parse::<usize>()
                .ok()
                .and_then(|n| n.checked_sub(1))
                .and_then(|i| q.options.get(i))
        })
        .map(|o| o.option_id.clone())
}

/// `response.json`: the §3 response; `request_id` and `responder` may be left out.
pub fn parse_json(q: &InteractionRequest, text: &str) -> Result<InteractionResponse, Refused> {
    let loose: LooseResponse = serde_json::from_str(text).map_err(|e| {
        Refused::new(
            "bad_request",
            format!(
                "not a valid response ({e}); expected e.g. {{\"option_id\": \"approve\", \"input\": \"…\"}}"
            ),
        )
    })?;
    if let Some(id) = &loose.request_id
        && id != &q.request_id.to_string()
    {
        return Err(Refused::new(
            "not_found",
            format!(
                "it answers request {id}, but the pending request is {}",
                q.request_id
            ),
        ));
    }
    // Only the clock answers as `timeout` (such an answer skips the deadline check).
    if let Some(r) = &loose.responder
        && r.via == Via::Timeout
    {
        return Err(Refused::new(
            "bad_request",
            "responder.via is `timeout`, which only the clock may be: leave `via` out or write \"file\"",
        ));
    }
    Ok(InteractionResponse {
        request_id: q.request_id,
        option_id: loose.option_id,
        input: loose.input,
        data: loose.data,
        feedback: loose.feedback,
        responder: loose
            .responder
            .unwrap_or_else(|| local_responder(Via::File)),
        request_hash: loose.request_hash,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use delta_protocol::{InputType, InteractionOption, InteractionType, OptionAction, RunId};

    fn request(options: &[(&str, &str)]) -> InteractionRequest {
        let mut q = InteractionRequest::new(RunId::new(), "a", InteractionType::UserChoice, "?");
        q.input_type = InputType::Choice;
        q.options = options
            .iter()
            .map(|(id, label)| InteractionOption::new(*id, *label, OptionAction::ProvideInfo))
            .collect();
        q
    }

    #[test]
    fn txt_picks_options_by_id_label_or_number_with_input() {
        let q = request(&[("approve", "Approve it"), ("reject", "Reject")]);
        assert_eq!(
            parse_txt(&q, "approve\n").expect("ok").option_id.as_deref(),
            Some("approve")
        );
        assert_eq!(
            parse_txt(&q, "APPROVE IT")
                .expect("ok")
                .option_id
                .as_deref(),
            Some("approve")
        );
        assert_eq!(
            parse_txt(&q, "2").expect("ok").option_id.as_deref(),
            Some("reject")
        );
        let r = parse_txt(&q, "reject: too risky").expect("ok");
        assert_eq!(
            (r.option_id.as_deref(), r.input.as_deref()),
            (Some("reject"), Some("too risky"))
        );
        let r = parse_txt(&q, "reject\nline one\nline two\n").expect("ok");
        assert_eq!(r.input.as_deref(), Some("line one\nline two"));
        let e = parse_txt(&q, "maybe").unwrap_err();
        assert_eq!(e.code, "invalid_option");
        assert!(
            e.message.contains("`maybe` is not an option")
                && e.message.contains("approve (Approve it, or 1)"),
            "{e:?}"
        );
    }

    #[test]
    fn txt_edits_the_arguments_of_an_approved_call() {
        let mut q = request(&[("approve", "Approve"), ("reject", "Reject")]);
        q.kind = InteractionType::ToolApproval;
        q.options[0].action = OptionAction::ApproveAndExecute;
        q.options[1].action = OptionAction::RejectWithReason;
        q.context.insert(
            "args".into(),
            serde_json::json!({"env": "production", "version": "1.0", "replicas": 2}),
        );
        let r = parse_txt(&q, "approve\nversion=1.1\nreplicas = 3\n").expect("ok");
        assert_eq!(r.option_id.as_deref(), Some("approve"));
        assert_eq!(r.input, None);
        assert_eq!(
            r.data,
            Some(
                serde_json::json!({"args": {"env": "production", "version": "1.1", "replicas": 3}})
            )
        );
        let r = parse_txt(&q, "approve: env=staging").expect("inline edit");
        assert_eq!(r.data.expect("data")["args"]["env"], "staging");
        let e = parse_txt(&q, "approve\nplease go\n").unwrap_err();
        assert_eq!(e.code, "invalid_args");
        assert!(
            e.message.contains("`please go` is not key=value")
                && e.message.contains("one key=value per line"),
            "{e:?}"
        );
        // Other options keep their text as input.
        let r = parse_txt(&q, "reject\nversion=1.1 is broken").expect("ok");
        assert_eq!(r.input.as_deref(), Some("version=1.1 is broken"));
        assert_eq!(r.data, None);
    }

    #[test]
    fn txt_free_text_must_not_be_empty() {
        let q = request(&[]);
        assert_eq!(
            parse_txt(&q, "Ada Lovelace\n")
                .expect("ok")
                .input
                .as_deref(),
            Some("Ada Lovelace")
        );
        assert_eq!(parse_txt(&q, " \n").unwrap_err().code, "input_required");
    }

    #[test]
    fn json_is_checked() {
        let q = request(&[("a", "A")]);
        let r = parse_json(&q, r#"{"option_id": "a", "input": "x"}"#).expect("ok");
        assert_eq!(r.responder.via, Via::File);
        let e = parse_json(&q, "{not json").unwrap_err();
        assert_eq!(e.code, "bad_request");
        assert!(e.message.contains("not a valid response"), "{e:?}");
        assert!(parse_json(&q, r#"{"option": "a"}"#).is_err());
        let other = format!(
            r#"{{"request_id": "{}", "option_id": "a"}}"#,
            RequestId::new()
        );
        let e = parse_json(&q, &other).unwrap_err();
        assert_eq!(e.code, "not_found");
        assert!(e.message.contains("pending request is"), "{e:?}");
        // Only the clock answers as `timeout` (its answers skip the deadline check).
        let e = parse_json(
            &q,
            r#"{"option_id": "a", "responder": {"id": "timeout", "via": "timeout"}}"#,
        )
        .unwrap_err();
        assert_eq!(e.code, "bad_request");
        assert!(e.message.contains("responder.via is `timeout`"), "{e:?}");
        let r = parse_json(
            &q,
            r#"{"option_id": "a", "responder": {"id": "ops", "via": "file"}}"#,
        )
        .expect("a named responder through the file");
        assert_eq!(r.responder.id, "ops");
    }
}
