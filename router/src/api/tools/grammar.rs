//! The grammar that forces `tool_choice: "required"` and named choices: the format's call
//! syntax around a JSON schema of each callable tool's call object (its name as a constant,
//! its `parameters` as the arguments), sent as a Lark constraint (llguidance reads
//! `%json {schema}` inside Lark). Forced output therefore always parses into calls whose
//! arguments follow their schema. Schemas are compact JSON (", " and ": ", no other
//! whitespace), as the worker's JSON-schema constraints are.
//!
//! Mistral's list and Llama 3's objects are forced without their special-token markers
//! (`[TOOL_CALLS]`, `<|python_tag|>`), which the parsers take as optional.

use serde_json::{json, Value};

use super::request::Tool;
use crate::api::closed_objects::close_objects;
use crate::text::tool_calls::ToolFormat;
use crate::worker::protocol::{Constraint, ConstraintKind};

/// The constraint for a forced choice among `tools`; `max_calls` 1 allows exactly one call.
pub fn forced_calls(format: ToolFormat, tools: &[&Tool], max_calls: usize) -> Constraint {
    let one = max_calls == 1;
    let source = match format {
        ToolFormat::Hermes => {
            let calls = if one { "call" } else { r#"call ("\n" call)*"# };
            format!(
                "start: {calls}\ncall: \"<tool_call>\\n\" object \"\\n</tool_call>\"\nobject: %json {}",
                with_options(call_schema(format, tools))
            )
        }
        ToolFormat::Llama3 => {
            let calls = if one {
                "object"
            } else {
                r#"object ("; " object)*"#
            };
            format!(
                "start: {calls}\nobject: %json {}",
                with_options(call_schema(format, tools))
            )
        }
        ToolFormat::Mistral => {
            let mut list =
                json!({"type": "array", "items": call_schema(format, tools), "minItems": 1});
            if one {
                list["maxItems"] = json!(1);
            }
            format!("start: list\nlist: %json {}", with_options(list))
        }
    };
    Constraint {
        kind: ConstraintKind::Lark,
        source,
    }
}

/// `tool_choice: "auto"` when a tool is `strict`: free text, and calls that hold to their
/// schema wherever the model opens one (a lazy rule ends the text at the first opening), so
/// a strict function's arguments always follow its `parameters` (the others' are any
/// object, and only offered names may be called). Hermes and Mistral, whose calls open
/// with a marker; None for Llama 3, whose calls are the whole output.
pub fn strict_auto(format: ToolFormat, tools: &[&Tool], max_calls: usize) -> Option<Constraint> {
    let (open, body) = match format {
        ToolFormat::Hermes => (
            "<tool_call>\\n",
            format!(
                "%json {} \"\\n</tool_call>\"",
                with_options(call_schema(format, tools))
            ),
        ),
        ToolFormat::Mistral => {
            let list = json!({"type": "array", "items": call_schema(format, tools), "minItems": 1});
            ("[TOOL_CALLS]", format!("%json {}", with_options(list)))
        }
        ToolFormat::Llama3 => return None,
    };
    let calls = if max_calls == 1 { "call?" } else { "call*" };
    let source = format!(
        "%llguidance {{}}\nstart: {calls} TEXT\nTEXT: /(.|\\n)*/\n\
         opening[lazy]: TEXT \"{open}\"\ncall: opening {body}\n"
    );
    Some(Constraint {
        kind: ConstraintKind::Lark,
        source,
    })
}

/// `{"name": <const>, <args key>: <parameters>}` for each tool, any one of them (a tool
/// marked `strict: false` takes any arguments object).
fn call_schema(format: ToolFormat, tools: &[&Tool]) -> Value {
    let args = format.args_key();
    let mut objects: Vec<Value> = tools
        .iter()
        .map(|t| {
            let mut properties = serde_json::Map::new();
            properties.insert("name".into(), json!({"const": t.function.name}));
            let parameters = match t.function.strict {
                Some(false) => json!({"type": "object"}),
                _ => {
                    let mut schema = t.function.parameters_schema();
                    close_objects(&mut schema);
                    schema
                }
            };
            properties.insert(args.into(), parameters);
            json!({
                "type": "object",
                "properties": properties,
                "required": ["name", args],
                "additionalProperties": false,
            })
        })
        .collect();
    match objects.len() {
        1 => objects.remove(0),
        _ => json!({"anyOf": objects}),
    }
}

/// llguidance's per-schema options: compact separators, no free whitespace.
fn with_options(mut schema: Value) -> Value {
    schema["x-guidance"] = json!({
        "whitespace_flexible": false,
        "item_separator": ", ",
        "key_separator": ": ",
    });
    schema
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::tools::request::Function;

    fn tool(name: &str, parameters: Value) -> Tool {
        Tool {
            kind: "function".into(),
            function: Function {
                name: name.into(),
                description: None,
                parameters: Some(parameters),
                strict: None,
            },
        }
    }

    #[test]
    fn hermes_forces_tagged_calls_of_the_callable_tools() {
        let a = tool("a", json!({"type": "object"}));
        let b = tool(
            "b",
            json!({"type": "object", "properties": {"x": {"type": "integer"}}}),
        );
        let c = forced_calls(ToolFormat::Hermes, &[&a, &b], usize::MAX);
        assert_eq!(c.kind, ConstraintKind::Lark);
        let (grammar, schema) = c.source.split_once("object: %json ").unwrap();
        assert_eq!(
            grammar,
            "start: call (\"\\n\" call)*\ncall: \"<tool_call>\\n\" object \"\\n</tool_call>\"\n"
        );
        let schema: Value = serde_json::from_str(schema).unwrap();
        assert_eq!(
            schema["anyOf"][1]["properties"]["name"],
            json!({"const": "b"})
        );
        assert_eq!(
            schema["anyOf"][1]["properties"]["arguments"]["properties"]["x"],
            json!({"type": "integer"})
        );
        assert_eq!(schema["x-guidance"]["whitespace_flexible"], json!(false));
        let one = forced_calls(ToolFormat::Hermes, &[&a], 1);
        assert!(one.source.starts_with("start: call\n"), "{}", one.source);
    }

    #[test]
    fn strict_auto_lets_text_through_and_holds_calls_to_their_schemas() {
        let a = tool(
            "a",
            json!({"type": "object", "properties": {"x": {"type": "integer"}}}),
        );
        let c = strict_auto(ToolFormat::Hermes, &[&a], usize::MAX).unwrap();
        let (head, tail) = c.source.split_once("%json ").unwrap();
        assert_eq!(
            head,
            "%llguidance {}\nstart: call* TEXT\nTEXT: /(.|\\n)*/\n\
             opening[lazy]: TEXT \"<tool_call>\\n\"\ncall: opening "
        );
        assert!(tail.ends_with("} \"\\n</tool_call>\"\n"), "{tail}");
        let schema: Value = serde_json::from_str(tail.rsplit_once(" \"").unwrap().0).unwrap();
        assert_eq!(
            schema["properties"]["arguments"]["properties"]["x"]["type"],
            "integer"
        );
        let mistral = strict_auto(ToolFormat::Mistral, &[&a], 1).unwrap().source;
        assert!(mistral.contains("start: call? TEXT\n") && mistral.contains("\"[TOOL_CALLS]\""));
        assert!(strict_auto(ToolFormat::Llama3, &[&a], 1).is_none());
    }

    #[test]
    fn a_tool_without_parameters_takes_an_empty_object_unless_not_strict() {
        let mut now = tool("now", json!({}));
        now.function.parameters = None;
        let args = |t: &Tool| {
            let c = forced_calls(ToolFormat::Mistral, &[t], 1).source;
            let schema: Value = serde_json::from_str(c.split_once("%json ").unwrap().1).unwrap();
            schema["items"]["properties"]["arguments"].clone()
        };
        assert_eq!(
            args(&now),
            json!({"type": "object", "properties": {}, "additionalProperties": false})
        );
        now.function.strict = Some(false);
        assert_eq!(args(&now), json!({"type": "object"}));
    }

    #[test]
    fn llama3_and_mistral_force_their_own_shapes() {
        let a = tool("a", json!({"type": "object"}));
        let llama = forced_calls(ToolFormat::Llama3, &[&a], usize::MAX).source;
        assert!(
            llama.starts_with("start: object (\"; \" object)*\nobject: %json {"),
            "{llama}"
        );
        assert!(
            llama.contains(r#""required":["name","parameters"]"#),
            "{llama}"
        );
        let mistral = forced_calls(ToolFormat::Mistral, &[&a], 1).source;
        let schema: Value = serde_json::from_str(mistral.split_once("%json ").unwrap().1).unwrap();
        assert_eq!(
            (schema["minItems"].clone(), schema["maxItems"].clone()),
            (json!(1), json!(1))
        );
        assert_eq!(schema["items"]["required"], json!(["name", "arguments"]));
    }
}
