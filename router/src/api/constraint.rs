//! Structured outputs: the request fields that constrain the output, checked here and turned
//! into the protocol's `constraint` (the worker masks decoding with it; docs/api.md lists
//! the fields).
//!
//! - OpenAI's `response_format`: `{"type": "text"}` (no constraint), `{"type":
//!   "json_object"}` (any JSON object), `{"type": "json_schema", "json_schema": {"name",
//!   "schema", "strict", "description"}}`;
//! - SGLang's `regex`, `ebnf` and `json_schema` (a schema, as an object or JSON text);
//! - vLLM's `structured_outputs`: exactly one of `json`, `regex`, `choice`, `grammar`
//!   (GBNF when it has `::=`, Lark otherwise).
//!
//! A request gives at most one of them. Schemas are checked against their metaschema (the
//! `jsonschema` crate) and regexes parsed (`regex-syntax`, the syntax llguidance reads),
//! so a mistake is a 400 naming it before anything reaches a worker; a grammar that does
//! not compile is refused by the worker (`invalid_constraint`, also a 400 naming the field).

use serde::Deserialize;
use serde_json::Value;

use crate::api::closed_objects::close_objects;
use crate::api::openai::{from_map, CommonParams};
use crate::error::ApiError;
use crate::worker::protocol::{Constraint, ConstraintKind};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResponseFormat {
    #[serde(rename = "type")]
    kind: String,
    json_schema: Option<JsonSchemaFormat>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonSchemaFormat {
    name: String,
    schema: Option<Value>,
    /// Outputs always follow the schema exactly (decoding is constrained either way).
    #[allow(dead_code)]
    strict: Option<bool>,
    #[allow(dead_code)]
    description: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StructuredOutputs {
    json: Option<Value>,
    regex: Option<String>,
    choice: Option<Vec<String>>,
    grammar: Option<String>,
}

/// The request's constraint, if any, with the field it came from; every source checked.
pub fn from_common(c: &CommonParams) -> Result<Option<(&'static str, Constraint)>, ApiError> {
    let mut found: Vec<(&str, Constraint)> = Vec::new();
    if let Some(v) = &c.response_format {
        if let Some(constraint) = response_format(v)? {
            found.push(("response_format", constraint));
        }
    }
    if let Some(r) = &c.regex {
        found.push(("regex", regex("regex", r)?));
    }
    if let Some(g) = &c.ebnf {
        found.push(("ebnf", grammar("ebnf", g, ConstraintKind::Ebnf)?));
    }
    if let Some(s) = &c.json_schema {
        found.push(("json_schema", json_schema("json_schema", s)?));
    }
    if let Some(v) = &c.structured_outputs {
        found.push(("structured_outputs", structured_outputs(v)?));
    }
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.pop()),
        _ => {
            let names: Vec<&str> = found.iter().map(|(n, _)| *n).collect();
            Err(ApiError::invalid(
                names[1],
                format!(
                    "give at most one output constraint; got {}",
                    names.join(", ")
                ),
            ))
        }
    }
}

fn response_format(value: &Value) -> Result<Option<Constraint>, ApiError> {
    let Value::Object(map) = value else {
        return Err(invalid(
            "response_format",
            "must be an object with a `type`",
        ));
    };
    let format: ResponseFormat = from_map(map.clone()).map_err(|e| {
        ApiError::invalid(
            "response_format",
            format!("`response_format`: {}", e.message()),
        )
    })?;
    match (format.kind.as_str(), format.json_schema) {
        ("text", None) => Ok(None),
        ("json_object", None) => Ok(Some(Constraint {
            kind: ConstraintKind::JsonSchema,
            source: r#"{"type": "object"}"#.into(),
        })),
        ("json_schema", Some(spec)) => {
            check_name(&spec.name)?;
            let schema = spec
                .schema
                .ok_or_else(|| invalid("response_format", "`json_schema.schema` is required"))?;
            Ok(Some(schema_constraint("response_format", &schema)?))
        }
        ("json_schema", None) => Err(invalid(
            "response_format",
            "`type` \"json_schema\" needs a `json_schema` object",
        )),
        ("text" | "json_object", Some(_)) => Err(invalid(
            "response_format",
            "`json_schema` is only allowed with `type` \"json_schema\"",
        )),
        (other, _) => Err(invalid(
            "response_format",
            format!("`type` must be \"text\", \"json_object\" or \"json_schema\"; got {other:?}"),
        )),
    }
}

/// OpenAI's rule for `json_schema.name`: 1 to 64 of a-z, A-Z, 0-9, `_` and `-`.
fn check_name(name: &str) -> Result<(), ApiError> {
    let ok = (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok {
        return Ok(());
    }
    Err(invalid(
        "response_format",
        format!("`json_schema.name` must be 1 to 64 of a-z, A-Z, 0-9, _ and -; got {name:?}"),
    ))
}

fn structured_outputs(value: &Value) -> Result<Constraint, ApiError> {
    const FIELD: &str = "structured_outputs";
    let Value::Object(map) = value else {
        return Err(invalid(FIELD, "must be an object"));
    };
    let so: StructuredOutputs = from_map(map.clone())
        .map_err(|e| ApiError::invalid(FIELD, format!("`{FIELD}`: {}", e.message())))?;
    let given = [
        so.json.is_some(),
        so.regex.is_some(),
        so.choice.is_some(),
        so.grammar.is_some(),
    ];
    if given.iter().filter(|&&g| g).count() != 1 {
        return Err(invalid(
            FIELD,
            "give exactly one of `json`, `regex`, `choice` and `grammar`",
        ));
    }
    if let Some(schema) = &so.json {
        return json_schema(FIELD, schema);
    }
    if let Some(r) = &so.regex {
        return regex(FIELD, r);
    }
    if let Some(choices) = so.choice {
        return choice(choices);
    }
    let g = so.grammar.unwrap_or_default();
    let kind = if g.contains("::=") {
        ConstraintKind::Ebnf
    } else {
        ConstraintKind::Lark
    };
    grammar(FIELD, &g, kind)
}

/// A schema given as an object or as JSON text.
fn json_schema(field: &str, value: &Value) -> Result<Constraint, ApiError> {
    match value {
        Value::String(text) => {
            let schema: Value = serde_json::from_str(text)
                .map_err(|e| invalid(field, format!("the schema is not valid JSON: {e}")))?;
            schema_constraint(field, &schema)
        }
        other => schema_constraint(field, other),
    }
}

fn schema_constraint(field: &str, schema: &Value) -> Result<Constraint, ApiError> {
    if !(schema.is_object() || schema.is_boolean()) {
        return Err(invalid(field, "the schema must be a JSON object"));
    }
    check_schema(schema).map_err(|e| invalid(field, e))?;
    let mut schema = schema.clone();
    close_objects(&mut schema);
    Ok(Constraint {
        kind: ConstraintKind::JsonSchema,
        source: schema.to_string(),
    })
}

/// Checks a schema against its metaschema and compiles it; the error says what is wrong.
pub fn check_schema(schema: &Value) -> Result<(), String> {
    if let Err(e) = jsonschema::meta::validate(schema) {
        let at = e.instance_path().to_string();
        let at = if at.is_empty() { "/".to_string() } else { at };
        return Err(format!("invalid JSON schema at {at}: {e}"));
    }
    jsonschema::validator_for(schema)
        .map(|_| ())
        .map_err(|e| format!("invalid JSON schema: {e}"))
}

fn regex(field: &str, pattern: &str) -> Result<Constraint, ApiError> {
    if pattern.is_empty() {
        return Err(invalid(field, "the regex must not be empty"));
    }
    regex_syntax::Parser::new()
        .parse(pattern)
        .map_err(|e| invalid(field, format!("invalid regex: {e}")))?;
    Ok(Constraint {
        kind: ConstraintKind::Regex,
        source: pattern.to_string(),
    })
}

fn choice(choices: Vec<String>) -> Result<Constraint, ApiError> {
    if choices.is_empty() || choices.iter().any(String::is_empty) {
        return Err(invalid(
            "structured_outputs",
            "`choice` must be a non-empty list of non-empty strings",
        ));
    }
    Ok(Constraint {
        kind: ConstraintKind::Choice,
        source: Value::from(choices).to_string(),
    })
}

fn grammar(field: &str, source: &str, kind: ConstraintKind) -> Result<Constraint, ApiError> {
    if source.trim().is_empty() {
        return Err(invalid(field, "the grammar must not be empty"));
    }
    Ok(Constraint {
        kind,
        source: source.to_string(),
    })
}

fn invalid(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::invalid(field, message)
}

#[cfg(test)]
#[path = "constraint_tests.rs"]
mod tests;
