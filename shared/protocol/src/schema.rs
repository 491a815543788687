//! Typed answers: a request's `response_schema` (docs/protocol.md §3).
//!
//! The accepted schemas are exactly the restricted JSON Schema of MCP elicitation's
//! `requestedSchema`: a flat object whose properties are primitives, so that every UI (the web
//! inbox's form, `delta run -i`'s field-by-field prompts, a bot) can render and check them.
//!
//! ```json
//! {"type": "object",
//!  "properties": {
//!    "email": {"type": "string", "format": "email", "title": "Contact"},
//!    "count": {"type": "integer", "minimum": 1, "maximum": 10},
//!    "urgent": {"type": "boolean", "default": false},
//!    "env": {"type": "string", "oneOf": [{"const": "stg", "title": "Staging"}, {"const": "prd", "title": "Production"}]},
//!    "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 2}},
//!  "required": ["email"]}
//! ```
//!
//! A property is one of: a string (`minLength`, `maxLength`, `format` of `email`, `uri`,
//! `date`, `date-time`), a number or integer (`minimum`, `maximum`), a boolean, a single-select
//! enum (`enum` with optional `enumNames`, or `oneOf: [{const, title}]`), or a multi-select enum
//! (`type: array` with `items` of `enum` or `anyOf: [{const, title}]`, `minItems`, `maxItems`).
//! Each may have `title`, `description` and `default`. Anything else (nesting, `pattern`, a
//! keyword of full JSON Schema) is refused when the schema is declared, never when it is answered.
//!
//! Pure: [`ResponseSchema::parse`] checks a schema, [`ResponseSchema::check`] an answer.

use std::fmt;

use serde_json::{Map, Value};

/// A checked `response_schema`: its fields, in the order UIs ask them (the names listed in
/// `required`, in that order, then the others by name).
#[derive(Clone, Debug, PartialEq)]
pub struct ResponseSchema {
    pub fields: Vec<Field>,
}

/// One property of the schema.
#[derive(Clone, Debug, PartialEq)]
pub struct Field {
    pub name: String,
    pub title: Option<String>,
    pub description: Option<String>,
    /// Listed in `required`: an answer must have it.
    pub required: bool,
    pub kind: FieldKind,
}

/// What a field takes, with its bounds and its default.
#[derive(Clone, Debug, PartialEq)]
pub enum FieldKind {
    /// `type: string` without `enum`/`oneOf`.
    Text {
        min_length: Option<u64>,
        max_length: Option<u64>,
        format: Option<Format>,
        default: Option<String>,
    },
    /// `type: number` or `type: integer`.
    Number {
        integer: bool,
        minimum: Option<f64>,
        maximum: Option<f64>,
        default: Option<serde_json::Number>,
    },
    /// `type: boolean`.
    Boolean { default: Option<bool> },
    /// A single-select enum: the answer is one of the choices' values.
    Choice {
        choices: Vec<Choice>,
        default: Option<String>,
    },
    /// A multi-select enum (`type: array`): the answer is a list of distinct choices' values.
    Choices {
        choices: Vec<Choice>,
        min_items: Option<u64>,
        max_items: Option<u64>,
        default: Option<Vec<String>>,
    },
}

/// A value of an enum and what to show for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    pub value: String,
    /// `enumNames`, or the `title` of a `oneOf`/`anyOf` item; `None`: show the value.
    pub title: Option<String>,
}

impl Choice {
    /// What a UI shows for this choice.
    pub fn label(&self) -> &str {
        self.title.as_deref().unwrap_or(&self.value)
    }
}

/// The string formats MCP elicitation knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Email,
    Uri,
    Date,
    DateTime,
}

impl Format {
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Email => "email",
            Format::Uri => "uri",
            Format::Date => "date",
            Format::DateTime => "date-time",
        }
    }

    /// What a value of this format looks like, for error messages and prompts.
    pub fn example(self) -> &'static str {
        match self {
            Format::Email => "ada@example.com",
            Format::Uri => "https://example.com/page",
            Format::Date => "2026-11-24",
            Format::DateTime => "2026-11-24T10:00:00Z",
        }
    }

    fn accepts(self, s: &str) -> bool {
        match self {
            Format::Email => is_email(s),
            Format::Uri => is_uri(s),
            Format::Date => {
                chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").is_ok() && s.len() == 10
            }
            Format::DateTime => chrono::DateTime::parse_from_rfc3339(s).is_ok(),
        }
    }
}

/// `local@domain`: one `@`, something on both sides, no spaces, a domain without empty labels.
fn is_email(s: &str) -> bool {
    let Some((local, domain)) = s.split_once('@') else {
        return false;
    };
    !local.is_empty()
        && !domain.is_empty()
        && !domain.contains('@')
        && !s.chars().any(|c| c.is_whitespace() || c.is_control())
        && domain.split('.').all(|label| !label.is_empty())
}

/// An absolute URI (RFC 3986): a scheme (a letter, then letters, digits, `+`, `-`, `.`), `:`,
/// and more, without spaces.
fn is_uri(s: &str) -> bool {
    let Some((scheme, rest)) = s.split_once(':') else {
        return false;
    };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        && !rest.is_empty()
        && !s.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// Why a schema is not one Delta accepts: the property at fault (none: the schema as a whole)
/// and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct SchemaError {
    pub property: Option<String>,
    pub message: String,
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.property {
            Some(p) => write!(f, "response_schema property `{p}`: {}", self.message),
            None => write!(f, "response_schema: {}", self.message),
        }
    }
}

/// Why an answer's `data` does not fit the schema: the field at fault (none: `data` as a whole)
/// and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct FieldError {
    pub field: Option<String>,
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.field {
            Some(name) => write!(f, "field `{name}`: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

fn field_error(name: &str, message: impl Into<String>) -> FieldError {
    FieldError {
        field: Some(name.to_owned()),
        message: message.into(),
    }
}

const TOP_KEYS: &[&str] = &["$schema", "type", "properties", "required"];
const COMMON: &[&str] = &["type", "title", "description", "default"];

impl ResponseSchema {
    /// Checks that `v` is a schema of the subset and reads it.
    pub fn parse(v: &Value) -> Result<ResponseSchema, SchemaError> {
        let whole = |message: String| SchemaError {
            property: None,
            message,
        };
        let Some(top) = v.as_object() else {
            return Err(whole(
                "must be a JSON object like {\"type\": \"object\", \"properties\": {…}, \"required\": […]}"
                    .into(),
            ));
        };
        if let Some(k) = top.keys().find(|k| !TOP_KEYS.contains(&k.as_str())) {
            return Err(whole(format!(
                "unknown keyword `{k}`; the top level takes only {}",
                TOP_KEYS.join(", ")
            )));
        }
        if top.get("type").and_then(Value::as_str) != Some("object") {
            return Err(whole("`type` must be \"object\"".into()));
        }
        let Some(props) = top.get("properties").and_then(Value::as_object) else {
            return Err(whole(
                "`properties` must be an object of fields, e.g. {\"email\": {\"type\": \"string\", \"format\": \"email\"}}"
                    .into(),
            ));
        };
        if props.is_empty() {
            return Err(whole("`properties` names no field".into()));
        }
        let mut required: Vec<String> = vec![];
        match top.get("required") {
            None => {}
            Some(Value::Array(list)) => {
                for r in list {
                    let Some(name) = r.as_str() else {
                        return Err(whole(format!("`required` lists {r}, which is not a name")));
                    };
                    if !props.contains_key(name) {
                        return Err(whole(format!(
                            "`required` names `{name}`, which is not in `properties`"
                        )));
                    }
                    if required.iter().any(|n| n == name) {
                        return Err(whole(format!("`required` names `{name}` twice")));
                    }
                    required.push(name.to_owned());
                }
            }
            Some(_) => return Err(whole("`required` must be a list of field names".into())),
        }
        let mut fields = Vec::with_capacity(props.len());
        for (name, p) in props {
            if name.trim().is_empty() {
                return Err(whole("a property has an empty name".into()));
            }

            let mut f = parse_field(name, p).map_err(|message| SchemaError {
                property: Some(name.clone()),
                message,
            })?;
            f.required = required.contains(name);
            fields.push(f);
        }
        // The required fields first, in their listed order: the one order a schema can give
        // (its `properties` object has none once parsed).
        fields.sort_by_key(|f| {
            (
                required
                    .iter()
                    .position(|r| r == &f.name)
                    .unwrap_or(usize::MAX),
                f.name.clone(),
            )
        });
        Ok(ResponseSchema { fields })
    }

    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }

    /// The field names, in order, for messages.
    pub fn names(&self) -> String {
        self.fields
            .iter()
            .map(|f| f.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Checks an answer's `data` (`None`: none was given): an object with every required field,
    /// no unknown one, and each value of its field's type, bounds, format or choices.
    pub fn check(&self, data: Option<&Value>) -> Result<(), FieldError> {
        self.check_as(data, false)
    }

    /// [`ResponseSchema::check`], its errors without the values given when `hide` (a sensitive
    /// question's: an error reaches a bot's inbox, which other bots may read, and a log).
    pub fn check_as(&self, data: Option<&Value>, hide: bool) -> Result<(), FieldError> {
        let Some(data) = data else {
            return Err(FieldError {
                field: None,
                message: format!(
                    "this request takes its answer as a JSON object in `data` with the fields: {}",
                    self.names()
                ),
            });
        };
        let Some(obj) = data.as_object() else {
            return Err(FieldError {
                field: None,
                message: format!(
                    "`data` must be a JSON object with the fields: {}",
                    self.names()
                ),
            });
        };
        if let Some(k) = obj.keys().find(|k| self.field(k).is_none()) {
            return Err(field_error(
                k,
                format!("unknown field; this request's fields: {}", self.names()),
            ));
        }
        for f in &self.fields {
            match obj.get(&f.name) {
                None if f.required => return Err(field_error(&f.name, "is required")),
                None => {}
                Some(v) => f.check_as(v, hide).map_err(|m| field_error(&f.name, m))?,
            }
        }
        Ok(())
    }
}

impl Field {
    /// What a UI shows as the field's name.
    pub fn label(&self) -> &str {
        self.title.as_deref().unwrap_or(&self.name)
    }

    /// Checks one value; the error says what is wrong (without the field's name).
    pub fn check(&self, v: &Value) -> Result<(), String> {
        self.check_as(v, false)
    }

    /// [`Field::check`], the error without the value when `hide`.
    pub fn check_as(&self, v: &Value, hide: bool) -> Result<(), String> {
        // What the error calls the value: itself, or (hidden) nothing of it.
        let it = |shown: String| if hide { "it".to_owned() } else { shown };
        let is = |v: &Value| match hide {
            true => String::new(),
            false => format!(" (it is {v})"),
        };
        match &self.kind {
            FieldKind::Text {
                min_length,
                max_length,
                format,
                ..
            } => {
                let Some(s) = v.as_str() else {
                    return Err(format!("must be a string, not {}", kind_of(v)));
                };
                let len = s.chars().count() as u64;
                // A hidden value's length is not told either.
                let has = |len: u64| match hide {
                    true => String::new(),
                    false => format!(" (it has {len})"),
                };
                if let Some(min) = min_length.filter(|m| len < *m) {
                    return Err(format!(
                        "must be at least {min} characters long{}",
                        has(len)
                    ));
                }
                if let Some(max) = max_length.filter(|m| len > *m) {
                    return Err(format!("must be at most {max} characters long{}", has(len)));
                }
                if let Some(fmt) = format.filter(|f| !f.accepts(s)) {
                    return Err(format!(
                        "{} is not a valid {} (e.g. {})",
                        it(format!("`{s}`")),
                        fmt.as_str(),
                        fmt.example()
                    ));
                }
                Ok(())
            }
            FieldKind::Number {
                integer,
                minimum,
                maximum,
                ..
            } => {
                let Some(n) = v.as_f64().filter(|_| v.is_number()) else {
                    return Err(format!(
                        "must be {}, not {}",
                        if *integer { "an integer" } else { "a number" },
                        kind_of(v)
                    ));
                };
                if *integer && !is_integer(v) {
                    return Err(match hide {
                        true => "must be an integer".to_owned(),
                        false => format!("must be an integer, not {v}"),
                    });
                }
                if let Some(min) = minimum.filter(|m| n < *m) {
                    return Err(format!("must be at least {}{}", number_text(min), is(v)));
                }
                if let Some(max) = maximum.filter(|m| n > *m) {
                    return Err(format!("must be at most {}{}", number_text(max), is(v)));
                }
                Ok(())
            }
            FieldKind::Boolean { .. } => match v {
                Value::Bool(_) => Ok(()),
                other => Err(format!("must be true or false, not {}", kind_of(other))),
            },
            FieldKind::Choice { choices, .. } => match v.as_str() {
                Some(s) if choices.iter().any(|c| c.value == s) => Ok(()),
                Some(s) => Err(format!(
                    "{} is not one of the choices: {}",
                    it(format!("`{s}`")),
                    values(choices)
                )),
                None => Err(format!(
                    "must be one of the choices ({}), not {}",
                    values(choices),
                    kind_of(v)
                )),
            },
            FieldKind::Choices {
                choices,
                min_items,
                max_items,
                ..
            } => {
                let Some(list) = v.as_array() else {
                    return Err(format!(
                        "must be a list of choices ({}), not {}",
                        values(choices),
                        kind_of(v)
                    ));
                };
                let mut seen: Vec<&str> = vec![];
                for item in list {
                    let Some(s) = item
                        .as_str()
                        .filter(|s| choices.iter().any(|c| c.value == *s))
                    else {
                        return Err(format!(
                            "{} is not one of the choices: {}",
                            if hide {
                                "an item".to_owned()
                            } else {
                                item.to_string()
                            },
                            values(choices)
                        ));
                    };
                    if seen.contains(&s) {
                        return Err(format!("{} is chosen twice", it(format!("`{s}`"))));
                    }
                    seen.push(s);
                }
                let n = list.len() as u64;
                if let Some(min) = min_items.filter(|m| n < *m) {
                    return Err(format!("needs at least {min} choice(s) (it has {n})"));
                }
                if let Some(max) = max_items.filter(|m| n > *m) {
                    return Err(format!("takes at most {max} choice(s) (it has {n})"));
                }
                Ok(())
            }
        }
    }

    /// The field's `default` as an answer value, if it has one.
    pub fn default_value(&self) -> Option<Value> {
        match &self.kind {
            FieldKind::Text { default, .. } | FieldKind::Choice { default, .. } => {
                default.clone().map(Value::String)
            }
            FieldKind::Number { default, .. } => default.clone().map(Value::Number),
            FieldKind::Boolean { default } => default.map(Value::Bool),
            FieldKind::Choices { default, .. } => default
                .as_ref()
                .map(|d| Value::Array(d.iter().cloned().map(Value::String).collect())),
        }
    }
}

fn is_integer(v: &Value) -> bool {
    v.as_i64().is_some() || v.as_u64().is_some() || v.as_f64().is_some_and(|f| f.fract() == 0.0)
}

/// A bound as people write it: `10`, not `10.0`.
pub fn number_text(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        n.to_string()
    }
}

fn values(choices: &[Choice]) -> String {
    choices
        .iter()
        .map(|c| c.value.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// The keywords of one property; anything else is refused.
fn only(p: &Map<String, Value>, allowed: &[&str], what: &str) -> Result<(), String> {
    match p
        .keys()
        .find(|k| !COMMON.contains(&k.as_str()) && !allowed.contains(&k.as_str()))
    {
        Some(k) => {
            let mut all: Vec<&str> = COMMON.to_vec();
            all.extend_from_slice(allowed);
            Err(format!(
                "unknown keyword `{k}` for {what}; it takes only {}",
                all.join(", ")
            ))
        }
        None => Ok(()),
    }
}

fn opt_string(p: &Map<String, Value>, key: &str) -> Result<Option<String>, String> {
    match p.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("`{key}` must be a string")),
    }
}

fn opt_count(p: &Map<String, Value>, key: &str) -> Result<Option<u64>, String> {
    match p.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("`{key}` must be a whole number of 0 or more, not {v}")),
    }
}

fn opt_number(p: &Map<String, Value>, key: &str) -> Result<Option<f64>, String> {
    match p.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_f64()
            .filter(|_| v.is_number())
            .map(Some)
            .ok_or_else(|| format!("`{key}` must be a number, not {v}")),
    }
}

fn ordered<T: PartialOrd + fmt::Display>(
    low: Option<T>,
    high: Option<T>,
    names: (&str, &str),
) -> Result<(), String> {
    match (low, high) {
        (Some(l), Some(h)) if l > h => Err(format!(
            "`{}` ({l}) is greater than `{}` ({h})",
            names.0, names.1
        )),
        _ => Ok(()),
    }
}

/// The choices of `enum` (+ `enumNames`) or of a list of `{const, title}` under `key`.
fn choices_of(p: &Map<String, Value>, titled_key: &str) -> Result<Option<Vec<Choice>>, String> {
    let mut out: Vec<Choice> = vec![];
    match (p.get("enum"), p.get(titled_key)) {
        (None, None) => return Ok(None),
        (Some(_), Some(_)) => {
            return Err(format!("give `enum` or `{titled_key}`, not both"));
        }
        (Some(e), None) => {
            let Some(list) = e.as_array() else {
                return Err("`enum` must be a list of strings".into());
            };
            let names = match p.get("enumNames") {
                None => None,
                Some(Value::Array(n))
                    if n.len() == list.len() && n.iter().all(Value::is_string) =>
                {
                    Some(n)
                }
                Some(_) => {
                    return Err(
                        "`enumNames` must be a list of strings, one for each value of `enum`"
                            .into(),
                    );
                }
            };
            for (i, v) in list.iter().enumerate() {
                let Some(value) = v.as_str() else {
                    return Err(format!("`enum` holds {v}, which is not a string"));
                };
                out.push(Choice {
                    value: value.to_owned(),
                    title: names.and_then(|n| n[i].as_str()).map(str::to_owned),
                });
            }
        }
        (None, Some(t)) => {
            let Some(list) = t.as_array() else {
                return Err(format!(
                    "`{titled_key}` must be a list of {{\"const\": \"value\", \"title\": \"Shown\"}}"
                ));
            };
            for item in list {
                let o = item.as_object();
                let value = o.and_then(|o| o.get("const")).and_then(Value::as_str);
                let title = o.and_then(|o| o.get("title")).and_then(Value::as_str);
                let extra = o.is_some_and(|o| o.keys().any(|k| k != "const" && k != "title"));
                let (Some(value), Some(title), false) = (value, title, extra) else {
                    return Err(format!(
                        "`{titled_key}` holds {item}; each item must be {{\"const\": \"value\", \"title\": \"Shown\"}} (strings)"
                    ));
                };
                out.push(Choice {
                    value: value.to_owned(),
                    title: Some(title.to_owned()),
                });
            }
        }
    }
    if out.is_empty() {
        return Err("the list of choices is empty".into());
    }
    for (i, c) in out.iter().enumerate() {
        if out[..i].iter().any(|d| d.value == c.value) {
            return Err(format!("the choice `{}` appears twice", c.value));
        }
    }
    Ok(Some(out))
}

fn parse_field(name: &str, v: &Value) -> Result<Field, String> {
    let Some(p) = v.as_object() else {
        return Err(format!(
            "must be an object like {{\"type\": \"string\"}}, not {v}"
        ));
    };
    let title = opt_string(p, "title")?;
    let description = opt_string(p, "description")?;
    let ty = match p.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(other) => return Err(format!("`type` must be a string, not {other}")),
        None => return Err("has no `type` (string, number, integer, boolean or array)".into()),
    };
    let default = p.get("default");
    let kind = match ty {
        "string" if p.contains_key("enum") || p.contains_key("oneOf") => {
            only(p, &["enum", "enumNames", "oneOf"], "a single-select enum")?;
            if p.contains_key("enumNames") && !p.contains_key("enum") {
                return Err("`enumNames` goes with `enum`".into());
            }
            let choices = choices_of(p, "oneOf")?.unwrap_or_default();
            let default = match default {
                None => None,
                Some(Value::String(d)) if choices.iter().any(|c| &c.value == d) => Some(d.clone()),
                Some(d) => return Err(format!("`default` {d} is not one of the choices")),
            };
            FieldKind::Choice { choices, default }
        }
        "string" => {
            only(p, &["minLength", "maxLength", "format"], "a string")?;
            let min_length = opt_count(p, "minLength")?;
            let max_length = opt_count(p, "maxLength")?;
            ordered(min_length, max_length, ("minLength", "maxLength"))?;
            let format = match p.get("format") {
                None => None,
                Some(f) => Some(match f.as_str() {
                    Some("email") => Format::Email,
                    Some("uri") => Format::Uri,
                    Some("date") => Format::Date,
                    Some("date-time") => Format::DateTime,
                    _ => {
                        return Err(format!(
                            "`format` {f} is not one of email, uri, date, date-time"
                        ));
                    }
                }),
            };
            let kind = FieldKind::Text {
                min_length,
                max_length,
                format,
                default: None,
            };
            let default = default_of(name, &kind, default, Value::is_string)?;
            FieldKind::Text {
                min_length,
                max_length,
                format,
                default: default.and_then(|v| v.as_str().map(str::to_owned)),
            }
        }
        "number" | "integer" => {
            only(p, &["minimum", "maximum"], "a number")?;
            let minimum = opt_number(p, "minimum")?;
            let maximum = opt_number(p, "maximum")?;
            ordered(minimum, maximum, ("minimum", "maximum"))?;
            let kind = FieldKind::Number {
                integer: ty == "integer",
                minimum,
                maximum,
                default: None,
            };
            let default = default_of(name, &kind, default, Value::is_number)?;
            let FieldKind::Number {
                integer,
                minimum,
                maximum,
                ..
            } = kind
            else {
                unreachable!("built above")
            };
            FieldKind::Number {
                integer,
                minimum,
                maximum,
                default: default.and_then(|v| match v {
                    Value::Number(n) => Some(n),
                    _ => None,
                }),
            }
        }
        "boolean" => {
            only(p, &[], "a boolean")?;
            let default = match default {
                None => None,
                Some(Value::Bool(b)) => Some(*b),
                Some(d) => return Err(format!("`default` {d} is not true or false")),
            };
            FieldKind::Boolean { default }
        }
        "array" => {
            only(p, &["items", "minItems", "maxItems"], "a multi-select enum")?;
            let Some(items) = p.get("items").and_then(Value::as_object) else {
                return Err(
                    "a list is a multi-select enum: it needs `items` with `enum` or `anyOf`".into(),
                );
            };
            if let Some(k) = items
                .keys()
                .find(|k| !matches!(k.as_str(), "type" | "enum" | "anyOf"))
            {
                return Err(format!(
                    "unknown keyword `{k}` in `items`; it takes only type, enum, anyOf"
                ));
            }
            if items.get("type").is_some_and(|t| t != "string") {
                return Err("`items.type` must be \"string\"".into());
            }
            let Some(choices) = choices_of(items, "anyOf").map_err(|e| format!("items: {e}"))?
            else {
                return Err("`items` needs `enum` or `anyOf`: the choices".into());
            };
            let min_items = opt_count(p, "minItems")?;
            let max_items = opt_count(p, "maxItems")?;
            ordered(min_items, max_items, ("minItems", "maxItems"))?;
            let kind = FieldKind::Choices {
                choices,
                min_items,
                max_items,
                default: None,
            };
            let default = default_of(name, &kind, default, Value::is_array)?;
            let FieldKind::Choices {
                choices,
                min_items,
                max_items,
                ..
            } = kind
            else {
                unreachable!("built above")
            };
            FieldKind::Choices {
                choices,
                min_items,
                max_items,
                default: default.and_then(|v| {
                    v.as_array().map(|a| {
                        a.iter()
                            .filter_map(|s| s.as_str().map(str::to_owned))
                            .collect()
                    })
                }),
            }
        }
        "object" => return Err("nested objects are not supported: a schema is flat".into()),
        other => {
            return Err(format!(
                "`type` \"{other}\" is not one of string, number, integer, boolean, array"
            ));
        }
    };
    Ok(Field {
        name: name.to_owned(),
        title,
        description,
        required: false,
        kind,
    })
}

/// A field's `default`, checked as an answer to the field would be.
fn default_of(
    name: &str,
    kind: &FieldKind,
    default: Option<&Value>,
    shape: impl Fn(&Value) -> bool,
) -> Result<Option<Value>, String> {
    let Some(d) = default else {
        return Ok(None);
    };
    if !shape(d) {
        return Err(format!("`default` {d} is not of the field's type"));
    }
    let probe = Field {
        name: name.to_owned(),
        title: None,
        description: None,
        required: false,
        kind: kind.clone(),
    };
    probe
        .check(d)
        .map_err(|e| format!("`default` {d} does not fit: {e}"))?;
    Ok(Some(d.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema(props: Value, required: &[&str]) -> ResponseSchema {
        ResponseSchema::parse(&json!({"type": "object", "properties": props, "required": required}))
            .expect("a valid schema")
    }

    fn refused(props: Value) -> SchemaError {
        ResponseSchema::parse(&json!({"type": "object", "properties": props})).expect_err("refused")
    }

    fn field_of(e: FieldError) -> Option<String> {
        e.field
    }

    /// A sensitive question's errors say what is wrong without the value given (they reach a
    /// bot's inbox, which other bots may read); others repeat it.
    #[test]
    fn hidden_errors_never_repeat_the_value() {
        let s = schema(
            json!({
                "mail": {"type": "string", "format": "email"},
                "pin": {"type": "string", "minLength": 4, "maxLength": 6},
                "n": {"type": "integer", "minimum": 1, "maximum": 9},
                "one": {"type": "string", "enum": ["a", "b"]},
                "many": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}},
            }),
            &[],
        );
        for (data, secret) in [
            (json!({"mail": "s3cr3t-mail"}), "s3cr3t-mail"),
            (json!({"pin": "12"}), "has 2"),
            (json!({"pin": "12345678"}), "has 8"),
            (json!({"n": 4.5}), "4.5"),
            (json!({"n": 777}), "777"),
            (json!({"n": -555}), "-555"),
            (json!({"one": "s3cr3t-one"}), "s3cr3t-one"),
            (json!({"many": ["s3cr3t-item"]}), "s3cr3t-item"),
            (json!({"many": ["a", "a"]}), "`a`"),
        ] {
            let shown = s.check_as(Some(&data), false).expect_err("refused");
            assert!(shown.message.contains(secret), "{}", shown.message);
            let hidden = s.check_as(Some(&data), true).expect_err("refused");
            assert!(!hidden.message.contains(secret), "{}", hidden.message);
            assert_eq!(hidden.field, shown.field);
        }
    }

    #[test]
    fn strings_check_length_and_format() {
        let s = schema(
            json!({
                "name": {"type": "string", "minLength": 2, "maxLength": 4, "title": "Name"},
                "email": {"type": "string", "format": "email"},
                "site": {"type": "string", "format": "uri"},
                "day": {"type": "string", "format": "date"},
                "at": {"type": "string", "format": "date-time"},
            }),
            &[],
        );
        assert!(s.check(Some(&json!({"name": "Ada"}))).is_ok());
        assert!(
            s.check(Some(&json!({"name": "Ådå"}))).is_ok(),
            "characters, not bytes"
        );
        for (data, field) in [
            (json!({"name": "A"}), "name"),
            (json!({"name": "Adaaa"}), "name"),
            (json!({"name": 3}), "name"),
            (json!({"email": "ada"}), "email"),
            (json!({"email": "a da@x.org"}), "email"),
            (json!({"email": "ada@"}), "email"),
            (json!({"site": "example.com"}), "site"),
            (json!({"site": "http:"}), "site"),
            (json!({"day": "2026-13-01"}), "day"),
            (json!({"day": "24/11/2026"}), "day"),
            (json!({"at": "2026-11-24 10:00"}), "at"),
        ] {
            let e = s.check(Some(&data)).expect_err("refused");
            assert_eq!(field_of(e), Some(field.to_owned()), "{data}");
        }
        assert!(
            s.check(Some(
                &json!({"email": "ada@example.com", "site": "https://x.org/a?b=1",
                "day": "2026-11-24", "at": "2026-11-24T10:00:00+01:00"})
            ))
            .is_ok()
        );
        let e = s.check(Some(&json!({"email": "nope"}))).expect_err("bad");
        assert_eq!(
            e.to_string(),
            "field `email`: `nope` is not a valid email (e.g. ada@example.com)"
        );
    }

    #[test]
    fn numbers_and_integers_check_type_and_bounds() {
        let s = schema(
            json!({
                "count": {"type": "integer", "minimum": 1, "maximum": 10},
                "ratio": {"type": "number", "minimum": 0.5},
            }),
            &[],
        );
        assert!(s.check(Some(&json!({"count": 3, "ratio": 0.5}))).is_ok());
        assert!(
            s.check(Some(&json!({"count": 3.0}))).is_ok(),
            "3.0 is an integer"
        );
        for data in [
            json!({"count": 0}),
            json!({"count": 11}),
            json!({"count": 2.5}),
            json!({"count": "3"}),
            json!({"ratio": 0.4}),
            json!({"ratio": true}),
        ] {
            assert!(s.check(Some(&data)).is_err(), "{data}");
        }
        let e = s.check(Some(&json!({"count": 11}))).expect_err("bad");
        assert_eq!(
            e.to_string(),
            "field `count`: must be at most 10 (it is 11)"
        );
    }

    #[test]
    fn booleans_take_only_true_or_false() {
        let s = schema(json!({"ok": {"type": "boolean", "default": true}}), &["ok"]);
        assert!(s.check(Some(&json!({"ok": false}))).is_ok());
        assert!(s.check(Some(&json!({"ok": "yes"}))).is_err());
        assert_eq!(s.fields[0].default_value(), Some(json!(true)));
    }

    #[test]
    fn single_select_enums_in_every_form() {
        let s = schema(
            json!({
                "plain": {"type": "string", "enum": ["a", "b"]},
                "legacy": {"type": "string", "enum": ["s", "p"], "enumNames": ["Staging", "Production"]},
                "titled": {"type": "string", "oneOf": [{"const": "s", "title": "Staging"}], "default": "s"},
            }),
            &[],
        );
        assert!(
            s.check(Some(&json!({"plain": "a", "legacy": "p", "titled": "s"})))
                .is_ok()
        );
        for data in [
            json!({"plain": "c"}),
            json!({"legacy": "Staging"}),
            json!({"titled": 1}),
        ] {
            assert!(s.check(Some(&data)).is_err(), "{data}");
        }
        let FieldKind::Choice { choices, .. } = &s.field("legacy").expect("field").kind else {
            panic!("a choice")
        };
        assert_eq!(choices[1].label(), "Production");
    }

    #[test]
    fn multi_select_enums_check_choices_and_counts() {
        let s = schema(
            json!({
                "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]},
                         "minItems": 1, "maxItems": 2},
                "envs": {"type": "array", "items": {"anyOf": [{"const": "s", "title": "Staging"},
                                                             {"const": "p", "title": "Prod"}]},
                         "default": ["s"]},
            }),
            &[],
        );
        assert!(
            s.check(Some(&json!({"tags": ["a", "c"], "envs": []})))
                .is_ok()
        );
        for data in [
            json!({"tags": []}),
            json!({"tags": ["a", "b", "c"]}),
            json!({"tags": ["a", "a"]}),
            json!({"tags": ["d"]}),
            json!({"tags": "a"}),
            json!({"envs": ["Staging"]}),
        ] {
            assert!(s.check(Some(&data)).is_err(), "{data}");
        }
    }

    #[test]
    fn required_and_unknown_fields_are_named() {
        let s = schema(
            json!({"email": {"type": "string"}, "note": {"type": "string"}}),
            &["email"],
        );
        let e = s.check(Some(&json!({"note": "x"}))).expect_err("missing");
        assert_eq!(e.to_string(), "field `email`: is required");
        let e = s
            .check(Some(&json!({"email": "x", "args": {}})))
            .expect_err("unknown");
        assert_eq!(e.field.as_deref(), Some("args"));
        assert!(s.check(None).is_err());
        assert!(s.check(Some(&json!("x"))).is_err());
        assert!(s.check(Some(&json!({"email": "x"}))).is_ok());
        assert!(
            s.check(Some(&json!({"email": null}))).is_err(),
            "null is not a string"
        );
    }

    #[test]
    fn required_fields_come_first_in_their_order() {
        let s = schema(
            json!({"a": {"type": "string"}, "b": {"type": "string"}, "c": {"type": "string"},
                   "d": {"type": "string"}}),
            &["c", "b"],
        );
        let order: Vec<&str> = s.fields.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(order, ["c", "b", "a", "d"]);
        assert!(s.fields[0].required && !s.fields[2].required);
    }

    #[test]
    fn schemas_outside_the_subset_are_refused_naming_the_property() {
        for (props, property, says) in [
            (
                json!({"x": {"type": "object", "properties": {}}}),
                "x",
                "nested",
            ),
            (
                json!({"x": {"type": "string", "pattern": "^a"}}),
                "x",
                "`pattern`",
            ),
            (
                json!({"x": {"type": "string", "format": "ipv4"}}),
                "x",
                "ipv4",
            ),
            (
                json!({"x": {"type": "integer", "minimum": 5, "maximum": 1}}),
                "x",
                "greater",
            ),
            (
                json!({"x": {"type": "string", "minLength": -1}}),
                "x",
                "minLength",
            ),
            (json!({"x": {"type": "string", "enum": []}}), "x", "empty"),
            (
                json!({"x": {"type": "string", "enum": ["a", "a"]}}),
                "x",
                "twice",
            ),
            (
                json!({"x": {"type": "string", "enum": ["a"], "enumNames": []}}),
                "x",
                "enumNames",
            ),
            (
                json!({"x": {"type": "string", "oneOf": [{"const": "a"}]}}),
                "x",
                "const",
            ),
            (
                json!({"x": {"type": "array", "items": {"type": "string"}}}),
                "x",
                "enum",
            ),
            (
                json!({"x": {"type": "array", "items": {"type": "integer", "enum": [1]}}}),
                "x",
                "items.type",
            ),
            (json!({"x": {"type": "null"}}), "x", "null"),
            (json!({"x": {"title": "no type"}}), "x", "no `type`"),
            (
                json!({"x": {"type": "integer", "default": 2.5}}),
                "x",
                "default",
            ),
            (
                json!({"x": {"type": "string", "maxLength": 2, "default": "abc"}}),
                "x",
                "default",
            ),
            (
                json!({"x": {"type": "boolean", "default": "yes"}}),
                "x",
                "default",
            ),
            (json!({"x": "string"}), "x", "object"),
        ] {
            let e = refused(props.clone());
            assert_eq!(e.property.as_deref(), Some(property), "{props}");
            assert!(e.to_string().contains(says), "{props}: {e}");
        }
        for (whole, says) in [
            (json!({"type": "object"}), "properties"),
            (
                json!({"type": "array", "properties": {"a": {"type": "string"}}}),
                "object",
            ),
            (json!({"type": "object", "properties": {}}), "no field"),
            (
                json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]}),
                "`b`",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": false}),
                "additionalProperties",
            ),
            (json!("string"), "JSON object"),
        ] {
            let e = ResponseSchema::parse(&whole).expect_err("refused");
            assert_eq!(e.property, None);
            assert!(e.to_string().contains(says), "{whole}: {e}");
        }
        assert!(
            ResponseSchema::parse(
                &json!({"$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object", "properties": {"a": {"type": "string"}}})
            )
            .is_ok()
        );
    }
}
