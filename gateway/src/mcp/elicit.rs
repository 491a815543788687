//! A parked question as an MCP elicitation, and an elicitation's result as an answer
//! (docs/protocols.md "MCP: questions as elicitations"). Pure: no I/O, so every mapping is
//! unit-tested here.
//!
//! | the question | the elicitation (form mode) | accept's `content` → the answer |
//! |---|---|---|
//! | options | `option`: a string enum of the option ids, titled with their labels; `input` (string) when an option takes text | `option_id`, `input` |
//! | `response_schema` of flat primitive fields | the same fields | `data` |
//! | free text | `answer`: a string | `input` |
//! | sensitive, or a schema forms cannot carry | URL mode: a one-time inbox link | nothing: the person answers in the inbox |
//!
//! `decline` on a form picks the question's one `REJECT_WITH_REASON` option (never `TERMINATE`:
//! a client's generic "no" must not end a run for everyone); with none or several, and on a link,
//! it answers nothing, as `cancel` does: the question stays pending for anyone else, and the
//! call ends.

use serde::Deserialize;
use serde_json::{Map, Value, json};

use delta_api::AnswerBody;
use delta_protocol::{InteractionRequest, InteractionType, OptionAction};

/// How a question is put to an MCP client.
#[derive(Clone, Debug, PartialEq)]
pub enum Ask {
    /// A form: the message and the `requestedSchema`.
    Form { message: String, schema: Value },
    /// A link to the inbox, for what must not pass through the client.
    Url { message: String },
}

/// The message shown with a question: its title, prompt and details, and what it is about.
pub fn message(q: &InteractionRequest) -> String {
    let mut parts = vec![];
    if let Some(t) = q.title.as_deref().filter(|t| !t.trim().is_empty()) {
        parts.push(t.to_owned());
    }
    parts.push(q.prompt.clone());
    if let Some(d) = q.details.as_deref().filter(|d| !d.trim().is_empty()) {
        parts.push(d.to_owned());
    }
    if let Some(plan) = q.context.get("plan").and_then(Value::as_array) {
        let steps: Vec<String> = plan
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let d = t
                    .get("description")
                    .and_then(Value::as_str)
                    .map_or_else(|| t.to_string(), str::to_owned);
                format!("{}. {d}", i + 1)
            })
            .collect();
        parts.push(format!("The plan:\n{}", steps.join("\n")));
    }
    if let Some(tool) = q.context.get("tool").and_then(Value::as_str)
        && q.kind == InteractionType::ToolApproval
    {
        let args = q
            .context
            .get("args")
            .map(Value::to_string)
            .unwrap_or_default();
        parts.push(format!("Tool call: {tool} {args}"));
    }
    parts.join("\n\n")
}

/// The elicitation for `q`.
pub fn ask(q: &InteractionRequest) -> Ask {
    let message = message(q);
    if q.sensitive || q.input_type.as_str() == "password" {
        return Ask::Url { message };
    }
    if let Some(schema) = &q.response_schema {
        return match flat_schema(schema) {
            Some(schema) => Ask::Form { message, schema },
            None => Ask::Url { message },
        };
    }
    if q.options.is_empty() {
        return Ask::Form {
            message,
            schema: json!({
                "type": "object",
                "properties": {"answer": {"type": "string", "title": "Answer", "minLength": 1}},
                "required": ["answer"],
            }),
        };
    }
    let ids: Vec<&str> = q.options.iter().map(|o| o.option_id.as_str()).collect();
    let titles: Vec<String> = q
        .options
        .iter()
        .map(|o| match &o.description {
            Some(d) if !d.is_empty() => format!("{} ({d})", o.label),
            _ => o.label.clone(),
        })
        .collect();
    let mut properties = Map::new();
    let mut option = json!({"type": "string", "title": "Choice", "enum": ids, "enumNames": titles});
    if let Some(d) = q.default_option_id.as_deref() {
        option["default"] = json!(d);
    }
    properties.insert("option".into(), option);
    let with_text: Vec<String> = q
        .options
        .iter()
        .filter(|o| o.requires_input || o.input_prompt.is_some())
        .map(|o| {
            format!(
                "{}: {}",
                o.label,
                o.input_prompt.as_deref().unwrap_or("say more")
            )
        })
        .collect();
    if !with_text.is_empty() {
        properties.insert(
            "input".into(),
            json!({"type": "string", "title": "Text", "description": format!("For {}", with_text.join("; "))}),
        );
    }
    Ask::Form {
        message,
        schema: json!({"type": "object", "properties": properties, "required": ["option"]}),
    }
}

/// `schema` when a form can carry it: an object whose properties are all strings (with or
/// without `enum` and `format`), numbers, integers or booleans; `None` otherwise.
fn flat_schema(schema: &Value) -> Option<Value> {
    let props = schema.get("properties")?.as_object()?;
    if props.is_empty() || schema.get("type").is_some_and(|t| t != "object") {
        return None;
    }
    const KEEP: &[&str] = &[
        "type",
        "title",
        "description",
        "enum",
        "format",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "default",
    ];
    let mut out = Map::new();
    for (name, p) in props {
        let p = p.as_object()?;
        let kind = p.get("type")?.as_str()?;
        if !["string", "number", "integer", "boolean"].contains(&kind) {
            return None;
        }
        if p.get("enum").is_some_and(|e| {
            kind != "string" || !e.as_array().is_some_and(|a| a.iter().all(Value::is_string))
        }) {
            return None;
        }
        let kept: Map<String, Value> = p
            .iter()
            .filter(|(k, _)| KEEP.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        out.insert(name.clone(), Value::Object(kept));
    }
    let mut flat = json!({"type": "object", "properties": out});
    if let Some(required) = schema.get("required").filter(|r| r.is_array()) {
        flat["required"] = required.clone();
    }
    // Only what the SDK (and so the spec's restricted schema) takes: a `format` it does not
    // know, a default of the wrong type… and the question goes by link instead.
    serde_json::from_value::<rmcp::model::ElicitationSchema>(flat.clone()).ok()?;
    Some(flat)
}

/// An elicitation's result, as the client sends it.
#[derive(Debug, Deserialize)]
struct ElicitResult {
    action: String,
    #[serde(default)]
    content: Option<Map<String, Value>>,
}

/// What a client's elicitation result does to the question.
#[derive(Debug, PartialEq)]
pub enum Reply {
    /// Answer it with this body.
    Answer(Box<AnswerBody>),
    /// A link was opened (`accept` in URL mode): the person answers in the inbox; wait.
    Wait,
    /// The client dismissed it (`cancel`, or a `decline` that no option means): it stays
    /// pending for anyone else, and the call ends.
    Leave,
}

/// Maps the client's result for `q` onto an answer; `Err` says what was wrong with it.
pub fn reply(q: &InteractionRequest, result: &Value) -> Result<Reply, String> {
    let r: ElicitResult = serde_json::from_value(result.clone()).map_err(|e| {
        format!("an elicitation result is {{\"action\": \"accept\"|\"decline\"|\"cancel\", \"content\": {{…}}}}: {e}")
    })?;
    let mut body = AnswerBody {
        request_hash: q.request_hash.clone(),
        ..AnswerBody::default()
    };
    let by_link = matches!(ask(q), Ask::Url { .. });
    match r.action.as_str() {
        "cancel" => Ok(Reply::Leave),
        "accept" if by_link => Ok(Reply::Wait),
        "decline" if by_link => Ok(Reply::Leave),
        "decline" => {
            let rejecting: Vec<_> = q
                .options
                .iter()
                .filter(|o| o.action == OptionAction::RejectWithReason)
                .collect();
            match rejecting.as_slice() {
                [o] => {
                    body.option_id = Some(o.option_id.clone());
                    if o.requires_input {
                        body.input = Some("declined through MCP".into());
                    }
                    Ok(Reply::Answer(Box::new(body)))
                }
                _ => Ok(Reply::Leave),
            }
        }
        "accept" => {
            let content = r.content.unwrap_or_default();
            if q.response_schema.is_some() {
                body.data = Some(Value::Object(content));
            } else if q.options.is_empty() {
                body.input = Some(
                    content
                        .get("answer")
                        .and_then(Value::as_str)
                        .ok_or("`content.answer` (a string) is missing")?
                        .to_owned(),
                );
            } else {
                body.option_id = Some(
                    content
                        .get("option")
                        .and_then(Value::as_str)
                        .ok_or("`content.option` (one of the option ids) is missing")?
                        .to_owned(),
                );
                body.input = content
                    .get("input")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned);
            }
            Ok(Reply::Answer(Box::new(body)))
        }
        other => Err(format!(
            "`{other}` is not an elicitation action (accept, decline, cancel)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use delta_protocol::{InteractionOption, RunId};

    fn question(options: Vec<InteractionOption>) -> InteractionRequest {
        let mut q =
            InteractionRequest::new(RunId::new(), "a", InteractionType::UserChoice, "Which one?");
        q.options = options;
        q
    }

    #[test]
    fn options_become_an_enum_and_text_a_field() {
        let mut other = InteractionOption::new("other", "Another", OptionAction::ProvideInfo);
        other.requires_input = true;
        other.input_prompt = Some("Which?".into());
        let q = question(vec![
            InteractionOption::new("staging", "Staging", OptionAction::ApproveAndExecute),
            other,
        ]);
        let Ask::Form { message, schema } = ask(&q) else {
            panic!("a form")
        };
        assert_eq!(message, "Which one?");
        assert_eq!(
            schema["properties"]["option"]["enum"],
            json!(["staging", "other"])
        );
        assert_eq!(schema["required"], json!(["option"]));
        assert!(
            schema["properties"]["input"]["description"]
                .as_str()
                .is_some_and(|d| d.contains("Which?"))
        );
        let Reply::Answer(a) = reply(
            &q,
            &json!({"action": "accept", "content": {"option": "other", "input": "qa"}}),
        )
        .unwrap() else {
            panic!("an answer")
        };
        assert_eq!(
            (a.option_id.as_deref(), a.input.as_deref()),
            (Some("other"), Some("qa"))
        );
        assert!(reply(&q, &json!({"action": "accept", "content": {}})).is_err());
        assert_eq!(
            reply(&q, &json!({"action": "cancel"})).unwrap(),
            Reply::Leave
        );
        assert_eq!(
            reply(&q, &json!({"action": "decline"})).unwrap(),
            Reply::Leave,
            "no rejecting option: left to others"
        );
        assert!(reply(&q, &json!({"action": "maybe"})).is_err());
        assert!(reply(&q, &json!("accept")).is_err());
    }

    #[test]
    fn decline_picks_the_one_rejecting_option_and_never_terminates() {
        let q = question(vec![
            InteractionOption::new("yes", "Approve", OptionAction::ApproveAndExecute),
            InteractionOption::new("no", "Reject", OptionAction::RejectWithReason),
            InteractionOption::new("stop", "Stop the run", OptionAction::Terminate),
        ]);
        let Reply::Answer(a) = reply(&q, &json!({"action": "decline"})).unwrap() else {
            panic!("an answer")
        };
        assert_eq!(a.option_id.as_deref(), Some("no"));
        let only_stop = question(vec![
            InteractionOption::new("yes", "Approve", OptionAction::ApproveAndExecute),
            InteractionOption::new("stop", "Stop the run", OptionAction::Terminate),
        ]);
        assert_eq!(
            reply(&only_stop, &json!({"action": "decline"})).unwrap(),
            Reply::Leave
        );
    }

    #[test]
    fn sensitive_questions_and_deep_schemas_go_by_link() {
        let mut q = question(vec![]);
        q.sensitive = true;
        assert!(matches!(ask(&q), Ask::Url { .. }));
        assert_eq!(
            reply(
                &q,
                &json!({"action": "accept", "content": {"answer": "secret"}})
            )
            .unwrap(),
            Reply::Wait,
            "a secret sent back anyway is dropped, never answered"
        );
        assert_eq!(
            reply(&q, &json!({"action": "decline"})).unwrap(),
            Reply::Leave
        );
        let mut typed = question(vec![]);
        typed.response_schema = Some(json!({"type": "object", "properties": {
            "email": {"type": "string", "format": "email"},
            "copies": {"type": "integer", "minimum": 1},
        }, "required": ["email"]}));
        let Ask::Form { schema, .. } = ask(&typed) else {
            panic!("a form")
        };
        assert_eq!(schema["required"], json!(["email"]));
        assert_eq!(schema["properties"]["copies"]["minimum"], json!(1));
        typed.response_schema = Some(json!({"type": "object", "properties": {
            "topics": {"type": "array", "items": {"type": "string"}},
        }}));
        assert!(matches!(ask(&typed), Ask::Url { .. }));
        typed.response_schema = Some(json!({"type": "object", "properties": {
            "host": {"type": "string", "format": "hostname"},
        }}));
        assert!(
            matches!(ask(&typed), Ask::Url { .. }),
            "a format the restricted schema has not goes by link"
        );
    }

    #[test]
    fn free_text_is_one_string() {
        let q = question(vec![]);
        let Reply::Answer(a) = reply(
            &q,
            &json!({"action": "accept", "content": {"answer": "Ada"}}),
        )
        .unwrap() else {
            panic!("an answer")
        };
        assert_eq!(a.input.as_deref(), Some("Ada"));
    }
}
