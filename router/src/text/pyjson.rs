//! `tojson` as Hugging Face's chat templates have it: Python's `json.dumps(value,
//! ensure_ascii=False, indent=indent)`, i.e. `", "` and `": "` between items (`","` at line
//! ends with an indent), keys in their order, no HTML escapes. minijinja's own `tojson`
//! writes compact, HTML-safe JSON, so a tool list rendered with it is not the text the model
//! was trained on.

use minijinja::value::Kwargs;
use minijinja::{Error, ErrorKind, Value};
use serde_json::Value as Json;

/// The filter: `x | tojson` or `x | tojson(indent=4)`.
pub fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    // Python's other keywords are accepted with their Hugging Face defaults only.
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    let _: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    write(&json, indent, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

/// `json.dumps(value, ensure_ascii=False)`: one line, `", "` and `": "`.
pub fn dumps(value: &Json) -> String {
    let mut out = String::new();
    write(value, None, 0, &mut out);
    out
}

fn write(value: &Json, indent: Option<usize>, level: usize, out: &mut String) {
    match value {
        Json::Array(items) => {
            let items: Vec<(Option<&String>, &Json)> = items.iter().map(|v| (None, v)).collect();
            container(&items, ('[', ']'), indent, level, out);
        }
        Json::Object(map) => {
            let items: Vec<(Option<&String>, &Json)> =
                map.iter().map(|(k, v)| (Some(k), v)).collect();
            container(&items, ('{', '}'), indent, level, out);
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

fn container(
    items: &[(Option<&String>, &Json)],
    (open, close): (char, char),
    indent: Option<usize>,
    level: usize,
    out: &mut String,
) {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return;
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(width) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(width * level));
        }
    };
    for (i, (key, value)) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(if indent.is_some() { "," } else { ", " });
        }
        newline(out, level + 1);
        if let Some(key) = key {
            out.push_str(&Json::from(key.as_str()).to_string());
            out.push_str(": ");
        }
        write(value, indent, level + 1, out);
    }
    newline(out, level);
    out.push(close);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dumps(source: &str, indent: Option<usize>) -> String {
        let value: Json = serde_json::from_str(source).unwrap();
        let mut out = String::new();
        write(&value, indent, 0, &mut out);
        out
    }

    #[test]
    fn writes_like_python_json_dumps() {
        // json.dumps({"b": [1, 2.5, None, True], "a": {}, "s": "<é\n\"'>"}, ensure_ascii=False)
        let source = r#"{"b": [1, 2.5, null, true], "a": {}, "s": "<é\n\"'>"}"#;
        assert_eq!(
            dumps(source, None),
            r#"{"b": [1, 2.5, null, true], "a": {}, "s": "<é\n\"'>"}"#
        );
        // ... indent=2
        assert_eq!(
            dumps(r#"{"b": [1, {"c": []}], "a": 1}"#, Some(2)),
            "{\n  \"b\": [\n    1,\n    {\n      \"c\": []\n    }\n  ],\n  \"a\": 1\n}"
        );
    }
}
