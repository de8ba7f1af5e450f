//! Schemas as constrained decoding reads them: an object schema that lists its keys
//! (`properties` or `patternProperties`) and says nothing of `additionalProperties` takes
//! only those keys, and a tuple (`prefixItems`) that says nothing of `items` takes only its
//! listed items. JSON Schema would allow anything more, and a constrained model then spends
//! its tokens on keys nobody asked for (the default model adds `"type": "integer"` beside a
//! tool's one argument). XGrammar's strict mode, the default of vLLM and SGLang, and
//! llama.cpp read schemas the same way; a schema that wants an open object says
//! `"additionalProperties": true`.
//!
//! Only subschemas are visited: objects inside `enum`, `const`, `default` or `examples` are
//! data. Where an object's keys may be spread over parts, each part naming only some of
//! them, nothing is closed at that level: a schema with `allOf` (of two parts or more),
//! `$ref`, `if`/`then`/`else` or `dependentSchemas` beside its own keywords, or with
//! `anyOf`/`oneOf` beside properties of its own, and those parts themselves (`anyOf`
//! branches of a schema without properties are whole objects, and are closed).

use serde_json::Value;

/// Keywords whose value is a map of name -> a schema of a value of its own.
const SCHEMA_MAPS: [&str; 4] = ["properties", "patternProperties", "$defs", "definitions"];
/// Keywords whose value is a schema (or a list of them) of a value of its own: a key, an
/// item, another property.
const SCHEMAS: [&str; 8] = [
    "additionalProperties",
    "unevaluatedProperties",
    "propertyNames",
    "items",
    "additionalItems",
    "unevaluatedItems",
    "contains",
    "prefixItems",
];
/// Keywords whose schemas describe the same value as the schema they sit in.
const PARTS: [&str; 7] = ["allOf", "anyOf", "oneOf", "if", "then", "else", "not"];

/// Closes the objects and tuples of `schema` (the module's rule), in place.
pub fn close_objects(schema: &mut Value) {
    visit(schema, true);
}

fn visit(schema: &mut Value, close_here: bool) {
    let Value::Object(map) = schema else {
        return;
    };
    let says = |keys: &[&str]| keys.iter().any(|k| map.contains_key(*k));
    let lists_keys = says(&["properties", "patternProperties"]);
    let several_parts = map
        .get("allOf")
        .and_then(Value::as_array)
        .is_some_and(|parts| parts.len() > 1);
    let composed = several_parts
        || says(&["$ref", "if", "then", "else", "dependentSchemas"])
        || (lists_keys && says(&["anyOf", "oneOf"]));
    if close_here && !composed {
        let open_object = lists_keys && !says(&["additionalProperties", "unevaluatedProperties"]);
        let open_tuple = says(&["prefixItems"]) && !says(&["items", "unevaluatedItems"]);
        if open_object {
            map.insert("additionalProperties".into(), Value::Bool(false));
        }
        if open_tuple {
            map.insert("items".into(), Value::Bool(false));
        }
    }
    for (key, value) in map.iter_mut() {
        let key = key.as_str();
        if SCHEMA_MAPS.contains(&key) {
            if let Value::Object(named) = value {
                named.values_mut().for_each(|s| visit(s, true));
            }
        } else if SCHEMAS.contains(&key) {
            visit_one_or_many(value, true);
        } else if key == "dependentSchemas" {
            if let Value::Object(named) = value {
                named.values_mut().for_each(|s| visit(s, false));
            }
        } else if PARTS.contains(&key) {
            // A single allOf part, or the branches of a union that lists no keys of its
            // own, are whole objects.
            let whole = match key {
                "allOf" => !several_parts,
                "anyOf" | "oneOf" => !lists_keys,
                _ => false,
            };
            visit_one_or_many(value, whole);
        }
    }
}

fn visit_one_or_many(value: &mut Value, close_here: bool) {
    match value {
        Value::Array(schemas) => schemas.iter_mut().for_each(|s| visit(s, close_here)),
        schema => visit(schema, close_here),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn closed(mut schema: Value) -> Value {
        close_objects(&mut schema);
        schema
    }

    #[test]
    fn objects_that_list_their_keys_take_only_those() {
        let person = json!({"type": "object", "properties": {"name": {"type": "string"}}});
        let schema = closed(json!({
            "type": "object",
            "properties": {
                "people": {"type": "array", "items": person},
                "tags": {"patternProperties": {"^t": {"type": "string"}}},
                "pair": {"prefixItems": [{"type": "integer"}, person]},
            },
            "$defs": {"p": person},
        }));
        assert_eq!(schema["additionalProperties"], false);
        let props = &schema["properties"];
        assert_eq!(props["people"]["items"]["additionalProperties"], false);
        assert_eq!(props["tags"]["additionalProperties"], false);
        assert_eq!(props["pair"]["items"], false);
        assert_eq!(
            props["pair"]["prefixItems"][1]["additionalProperties"],
            false
        );
        assert_eq!(schema["$defs"]["p"]["additionalProperties"], false);
        // A property named like a keyword is a name, not a schema.
        let named = closed(json!({"properties": {"properties": {"type": "object"}}}));
        assert_eq!(named["properties"]["properties"], json!({"type": "object"}));
    }

    #[test]
    fn what_the_schema_says_and_data_are_left_as_they_are() {
        for schema in [
            json!({"type": "object"}),
            json!({"properties": {"a": {}}, "additionalProperties": true}),
            json!({"properties": {"a": {}}, "additionalProperties": {"type": "integer"}}),
            json!({"properties": {"a": {}}, "unevaluatedProperties": true}),
            json!({"prefixItems": [{}], "items": {"type": "string"}}),
            json!({"enum": [{"properties": {"a": 1}}], "const": {"prefixItems": []}}),
            json!({"default": {"properties": {}}, "examples": [{"properties": {}}]}),
            json!(true),
        ] {
            assert_eq!(closed(schema.clone()), schema);
        }
    }

    #[test]
    fn the_parts_of_a_composed_object_stay_open() {
        let a = json!({"properties": {"a": {}}});
        let b = json!({"properties": {"b": {}}});
        let schema = closed(json!({"allOf": [a, b], "properties": {"c": {}}}));
        assert_eq!(schema, json!({"allOf": [a, b], "properties": {"c": {}}}));
        let schema = closed(json!({"$ref": "#/$defs/a", "properties": {"c": {}}}));
        assert!(schema.get("additionalProperties").is_none());
        // One part is the whole object; anyOf's branches are whole objects too.
        let one = closed(json!({"allOf": [a]}));
        assert_eq!(one["allOf"][0]["additionalProperties"], false);
        let any = closed(json!({"anyOf": [a, b]}));
        assert_eq!(any["anyOf"][1]["additionalProperties"], false);
        // Deeper objects inside a part are closed.
        let deep = closed(json!({"allOf": [{"properties": {"x": a}}, b]}));
        assert_eq!(
            deep["allOf"][0]["properties"]["x"]["additionalProperties"],
            false
        );
        assert!(deep["allOf"][0].get("additionalProperties").is_none());
        // Branches beside the schema's own properties, and conditional parts, are parts.
        for schema in [
            json!({"properties": {"c": {}}, "anyOf": [a, b]}),
            json!({"properties": {"c": {}}, "if": a, "then": b, "else": a}),
            json!({"properties": {"c": {}}, "dependentSchemas": {"c": a}}),
            json!({"not": a}),
        ] {
            assert_eq!(closed(schema.clone()), schema);
        }
    }
}
