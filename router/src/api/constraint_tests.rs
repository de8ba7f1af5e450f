use serde_json::json;

use super::*;

fn common(body: Value) -> CommonParams {
    let Value::Object(map) = body else { panic!() };
    from_map(map).unwrap()
}

fn parse(body: Value) -> Result<Option<Constraint>, ApiError> {
    Ok(from_common(&common(body))?.map(|(_, c)| c))
}

fn kind_and_source(body: Value) -> (ConstraintKind, String) {
    let c = parse(body).unwrap().unwrap();
    (c.kind, c.source)
}

#[test]
fn response_format_types() {
    assert_eq!(
        parse(json!({"response_format": {"type": "text"}})).unwrap(),
        None
    );
    assert_eq!(
        kind_and_source(json!({"response_format": {"type": "json_object"}})),
        (ConstraintKind::JsonSchema, r#"{"type": "object"}"#.into())
    );
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let body = json!({"response_format": {"type": "json_schema",
        "json_schema": {"name": "thing", "schema": schema, "strict": true}}});
    // Sent with its object closed (closed_objects.rs).
    let mut sent = schema.clone();
    sent["additionalProperties"] = json!(false);
    assert_eq!(
        kind_and_source(body),
        (ConstraintKind::JsonSchema, sent.to_string())
    );
}

#[test]
fn bad_response_formats_say_what_is_wrong() {
    let message = |body: Value| parse(body).unwrap_err().message().to_string();
    assert!(message(json!({"response_format": {"type": "xml"}}))
        .contains("`type` must be \"text\", \"json_object\" or \"json_schema\"; got \"xml\""));
    assert!(message(json!({"response_format": {"type": "json_schema"}}))
        .contains("needs a `json_schema` object"));
    assert!(message(json!({"response_format": {"type": "json_schema",
        "json_schema": {"name": "has space", "schema": {}}}}))
    .contains("`json_schema.name` must be 1 to 64"));
    let bad_type = message(json!({"response_format": {"type": "json_schema",
        "json_schema": {"name": "n", "schema": {"type": "objekt"}}}}));
    assert!(
        bad_type.starts_with("invalid JSON schema at /type:") && bad_type.contains("objekt"),
        "{bad_type}"
    );
    let bad_bound = message(json!({"response_format": {"type": "json_schema",
        "json_schema": {"name": "n", "schema": {"type": "array", "minItems": -1}}}}));
    assert!(bad_bound.contains("/minItems"), "{bad_bound}");
    assert!(
        message(json!({"response_format": {"type": "json_object", "extra": 1}}))
            .contains("unsupported parameter `extra`")
    );
}

#[test]
fn sglang_and_vllm_spellings() {
    assert_eq!(
        kind_and_source(json!({"regex": "[0-9]+"})),
        (ConstraintKind::Regex, "[0-9]+".into())
    );
    assert_eq!(
        kind_and_source(json!({"ebnf": "root ::= \"a\""})).0,
        ConstraintKind::Ebnf
    );
    assert_eq!(
        kind_and_source(json!({"json_schema": "{\"type\": \"string\"}"})),
        (ConstraintKind::JsonSchema, r#"{"type":"string"}"#.into())
    );
    assert_eq!(
        kind_and_source(json!({"structured_outputs": {"choice": ["a", "b\""]}})),
        (ConstraintKind::Choice, r#"["a","b\""]"#.into())
    );
    assert_eq!(
        kind_and_source(json!({"structured_outputs": {"grammar": "start: \"a\""}})).0,
        ConstraintKind::Lark
    );
    assert_eq!(
        kind_and_source(json!({"structured_outputs": {"grammar": "root ::= \"a\""}})).0,
        ConstraintKind::Ebnf
    );
    assert_eq!(
        kind_and_source(json!({"structured_outputs": {"json": {"type": "object"}}})).0,
        ConstraintKind::JsonSchema
    );
}

#[test]
fn bad_extensions_say_what_is_wrong() {
    let message = |body: Value| parse(body).unwrap_err().message().to_string();
    assert!(message(json!({"regex": "[a-"})).starts_with("invalid regex: "));
    assert!(message(json!({"structured_outputs": {"regex": "(a"}})).contains("unclosed group"));
    assert!(message(json!({"structured_outputs": {"choice": []}}))
        .contains("`choice` must be a non-empty list"));
    assert!(
        message(json!({"structured_outputs": {"regex": "a", "choice": ["a"]}}))
            .contains("exactly one of")
    );
    assert!(message(json!({"ebnf": "  "})).contains("must not be empty"));
    assert!(message(json!({"json_schema": "{"})).contains("not valid JSON"));
    let both =
        parse(json!({"regex": "a", "response_format": {"type": "json_object"}})).unwrap_err();
    assert_eq!(
        both.message(),
        "give at most one output constraint; got response_format, regex"
    );
    assert_eq!(both.body()["error"]["param"], "regex");
}
