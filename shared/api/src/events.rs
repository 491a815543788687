//! A JSON Schema (2020-12) for each of the fleet's CloudEvents (docs/events/), generated from
//! the same types the fleet publishes (`delta_protocol::events`) and its OpenAPI document's
//! schemas of their `data`. The files in docs/events/ are held against this by a test; after a
//! change to an event's types, `DELTA_BLESS=1 cargo test -p delta-api events` writes them anew.

use serde_json::{Map, Value, json};
use utoipa::OpenApi;

use delta_protocol::events::{EventType, RunFinished};
use delta_protocol::{Escalated, InteractionRequest, InteractionUpdate, Resolved};

#[derive(OpenApi)]
#[openapi(components(schemas(
    InteractionRequest,
    Resolved,
    InteractionUpdate,
    Escalated,
    RunFinished
)))]
struct EventData;

/// The name of the schema of `ty`'s `data`.
fn data_schema(ty: EventType) -> &'static str {
    match ty {
        EventType::InteractionRequested => "InteractionRequest",
        EventType::InteractionAnswered
        | EventType::InteractionExpired
        | EventType::InteractionCancelled => "Resolved",
        EventType::InteractionUpdated => "InteractionUpdate",
        EventType::InteractionEscalated => "Escalated",
        EventType::RunCompleted | EventType::RunFailed | EventType::RunCancelled => "RunFinished",
    }
}

/// `#/components/schemas/X` references made `#/$defs/X`, everywhere in `v`.
fn rebase_refs(v: &mut Value) {
    match v {
        Value::Object(o) => {
            for (k, x) in o.iter_mut() {
                if k == "$ref"
                    && let Value::String(s) = x
                    && let Some(name) = s.strip_prefix("#/components/schemas/")
                {
                    *s = format!("#/$defs/{name}");
                } else {
                    rebase_refs(x);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(rebase_refs),
        _ => {}
    }
}

/// A type that flattens another (`#[serde(flatten)]`, `allOf` with a `$ref`) gets a copy of the
/// flattened schema without `additionalProperties: false`: in JSON Schema each part of an
/// `allOf` is checked alone, so a strict part refuses the other parts' fields (an `Escalated`
/// event's `step`, `at`… refused by `EscalationStep`), though serde reads them together.
fn inline_flattened(defs: &mut Map<String, Value>) {
    let originals = defs.clone();
    for v in defs.values_mut() {
        let Some(parts) = v.get_mut("allOf").and_then(Value::as_array_mut) else {
            continue;
        };
        for part in parts.iter_mut() {
            let Some(name) = part
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|r| r.strip_prefix("#/$defs/"))
            else {
                continue;
            };
            let Some(mut copy) = originals.get(name).cloned() else {
                continue;
            };
            if let Some(o) = copy.as_object_mut() {
                o.remove("additionalProperties");
            }
            *part = copy;
        }
    }
}

/// The file name of `ty`'s schema in docs/events/.
pub fn file_name(ty: EventType) -> String {
    format!("{}.schema.json", ty.ce_type())
}

/// The JSON Schema of `ty`'s events.
pub fn schema(ty: EventType) -> Value {
    let doc = serde_json::to_value(EventData::openapi()).unwrap_or(Value::Null);
    let mut defs: Map<String, Value> = doc["components"]["schemas"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    for v in defs.values_mut() {
        rebase_refs(v);
    }
    inline_flattened(&mut defs);
    let interaction = !matches!(
        ty,
        EventType::RunCompleted | EventType::RunFailed | EventType::RunCancelled
    );
    let uuid = json!({"type": "string", "format": "uuid"});
    let subject = if interaction {
        "^runs/[0-9a-fA-F-]{36}/interactions/[0-9a-fA-F-]{36}$"
    } else {
        "^runs/[0-9a-fA-F-]{36}$"
    };
    let mut required = vec![
        "specversion",
        "id",
        "source",
        "type",
        "subject",
        "time",
        "datacontenttype",
        "deltaagent",
        "deltarun",
        "data",
    ];
    if interaction {
        required.push("deltarequest");
    }
    json!({
        "title": ty.ce_type(),
        "description": format!(
            "Delta Fleet's `{}` event: a CloudEvent 1.0 in structured JSON mode (docs/protocol.md §4, Events).",
            ty.name()
        ),
        "type": "object",
        "required": required,
        "properties": {
            "specversion": {"const": "1.0"},
            "id": {"type": "string", "minLength": 1},
            "source": {"type": "string", "pattern": "^/delta/[^/]+/agents/[^/]+$"},
            "type": {"const": ty.ce_type()},
            "subject": {"type": "string", "pattern": subject},
            "time": {"type": "string", "format": "date-time"},
            "datacontenttype": {"const": "application/json"},
            "deltaagent": {"type": "string", "minLength": 1},
            "deltarun": uuid,
            "deltarequest": uuid,
            "traceparent": {"type": "string", "pattern": "^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"},
            "data": {"$ref": format!("#/$defs/{}", data_schema(ty))},
        },
        "$defs": defs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events_dir() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/events")
    }

    /// docs/events/ holds exactly one schema per event type, each what [`schema`] gives.
    #[test]
    fn the_documented_event_schemas_are_the_generated_ones() {
        let dir = events_dir();
        let bless = std::env::var_os("DELTA_BLESS").is_some();
        let mut stale = vec![];
        for ty in EventType::ALL {
            let path = dir.join(file_name(ty));
            let want = serde_json::to_string_pretty(&schema(ty)).unwrap() + "\n";
            if bless {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&path, &want).unwrap();
            } else if std::fs::read_to_string(&path).ok().as_deref() != Some(want.as_str()) {
                stale.push(path.display().to_string());
            }
        }
        assert!(
            stale.is_empty(),
            "out of date (run `DELTA_BLESS=1 cargo test -p delta-api events`): {stale:?}"
        );
        let mut extra: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".schema.json"))
            .filter(|n| !EventType::ALL.iter().any(|t| file_name(*t) == *n))
            .collect();
        extra.sort();
        assert!(extra.is_empty(), "schemas of no event type: {extra:?}");
    }

    #[test]
    fn every_reference_resolves_inside_the_schema() {
        fn refs(v: &Value, out: &mut Vec<String>) {
            match v {
                Value::Object(o) => {
                    for (k, x) in o {
                        match (k.as_str(), x) {
                            ("$ref", Value::String(s)) => out.push(s.clone()),
                            _ => refs(x, out),
                        }
                    }
                }
                Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
                _ => {}
            }
        }
        for ty in EventType::ALL {
            let s = schema(ty);
            let mut found = vec![];
            refs(&s, &mut found);
            assert!(!found.is_empty());
            for r in found {
                let name = r.strip_prefix("#/$defs/").unwrap_or_else(|| panic!("{r}"));
                assert!(s["$defs"][name].is_object(), "{ty}: {r} dangles");
            }
        }
    }
}
