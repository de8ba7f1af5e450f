//! The parsers on outputs recorded from each format's models (as their chat templates and
//! model cards show them), whole and streamed in every split, plus the cases that must stay
//! content.

use super::*;
use serde_json::json;

/// The events merged: (content, [(name, arguments)]).
fn merged(events: &[CallEvent]) -> (String, Vec<(String, String)>) {
    let mut content = String::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    for e in events {
        match e {
            CallEvent::Text(t) => content.push_str(t),
            CallEvent::Start { index, name } => {
                assert_eq!(*index, calls.len(), "calls start in order");
                calls.push((name.clone(), String::new()));
            }
            CallEvent::Args { index, text } => calls[*index].1.push_str(text),
        }
    }
    (content, calls)
}

fn whole(format: ToolFormat, output: &str) -> (String, Vec<(String, String)>) {
    let mut p = ToolCallParser::new(format, usize::MAX);
    let mut events = p.push(output);
    events.extend(p.finish());
    merged(&events)
}

/// Streams `output` in pieces of `size` chars; asserts it gives what the whole output gives.
fn streamed(format: ToolFormat, output: &str, size: usize) -> (String, Vec<(String, String)>) {
    let mut p = ToolCallParser::new(format, usize::MAX);
    let chars: Vec<char> = output.chars().collect();
    let mut events = Vec::new();
    for piece in chars.chunks(size) {
        events.extend(p.push(&piece.iter().collect::<String>()));
    }
    events.extend(p.finish());
    merged(&events)
}

fn check(format: ToolFormat, output: &str, content: &str, calls: &[(&str, serde_json::Value)]) {
    let expected: Vec<(String, serde_json::Value)> = calls
        .iter()
        .map(|(n, a)| (n.to_string(), a.clone()))
        .collect();
    let parse = |(text, calls): (String, Vec<(String, String)>)| {
        let calls: Vec<(String, serde_json::Value)> = calls
            .into_iter()
            .map(|(n, a)| (n, serde_json::from_str(&a).expect("arguments are JSON")))
            .collect();
        (text, calls)
    };
    assert_eq!(
        parse(whole(format, output)),
        (content.to_string(), expected.clone()),
        "{output:?}"
    );
    for size in [1, 2, 3, 7, 16] {
        assert_eq!(
            whole(format, output),
            streamed(format, output, size),
            "{output:?} in {size}s"
        );
    }
}

#[test]
fn hermes_calls_with_text_around_them() {
    let out = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \
               {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n\
               {\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n</tool_call>";
    check(
        ToolFormat::Hermes,
        out,
        "Let me check.\n",
        &[
            ("get_weather", json!({"city": "Paris", "unit": "celsius"})),
            ("get_time", json!({"tz": "CET"})),
        ],
    );
}

#[test]
fn hermes_arguments_keep_their_text_and_strings_with_braces() {
    let out = "<tool_call>\n{\"arguments\": {\"q\": \"a } \\\" {[\", \"n\": [1, {\"x\": 2}]}, \
               \"name\": \"search\"}\n</tool_call>";
    let (_, calls) = whole(ToolFormat::Hermes, out);
    assert_eq!(calls[0].1, r#"{"q": "a } \" {[", "n": [1, {"x": 2}]}"#);
    check(
        ToolFormat::Hermes,
        out,
        "",
        &[("search", json!({"q": "a } \" {[", "n": [1, {"x": 2}]}))],
    );
}

#[test]
fn hermes_without_a_call_is_content() {
    check(
        ToolFormat::Hermes,
        "The answer is 4 < 5.",
        "The answer is 4 < 5.",
        &[],
    );
    // An opening without a call object, and an object without a name, stay content.
    check(
        ToolFormat::Hermes,
        "<tool_call> oops",
        "<tool_call> oops",
        &[],
    );
    check(
        ToolFormat::Hermes,
        "<tool_call>\n{\"x\": 1}\n</tool_call>",
        "<tool_call>\n{\"x\": 1}\n</tool_call>",
        &[],
    );
    check(
        ToolFormat::Hermes,
        "ends with <tool_ca",
        "ends with <tool_ca",
        &[],
    );
}

#[test]
fn a_call_cut_short_keeps_what_it_got_and_missing_arguments_are_empty() {
    let (_, calls) = whole(
        ToolFormat::Hermes,
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": ",
    );
    assert_eq!(calls, vec![("f".to_string(), "{\"a\": ".to_string())]);
    check(
        ToolFormat::Hermes,
        "<tool_call>\n{\"name\": \"ping\"}\n</tool_call>",
        "",
        &[("ping", json!({}))],
    );
}

#[test]
fn streaming_holds_back_only_what_may_be_a_call() {
    let mut p = ToolCallParser::new(ToolFormat::Hermes, usize::MAX);
    assert_eq!(p.push("Hi <tool"), vec![CallEvent::Text("Hi ".into())]);
    assert_eq!(
        p.push("_call>\n{\"name\": \"f\""),
        vec![CallEvent::Start {
            index: 0,
            name: "f".into()
        }]
    );
    assert_eq!(
        p.push(", \"arguments\": {\"a\""),
        vec![CallEvent::Args {
            index: 0,
            text: "{\"a\"".into()
        }]
    );
    assert_eq!(
        p.push(": 1}}\n</tool_call>"),
        vec![CallEvent::Args {
            index: 0,
            text: ": 1}".into()
        }]
    );
    assert_eq!(p.finish(), vec![]);
}

#[test]
fn parallel_tool_calls_false_reports_the_first_call_only() {
    let out = "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n\
               <tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>";
    let mut p = ToolCallParser::new(ToolFormat::Hermes, 1);
    let mut events = p.push(out);
    events.extend(p.finish());
    assert_eq!(merged(&events).1, vec![("a".to_string(), "{}".to_string())]);
    assert_eq!(p.calls(), 1);
}

#[test]
fn llama3_json_calls() {
    let out = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; \
               {\"name\": \"get_time\", \"parameters\": {}}";
    check(
        ToolFormat::Llama3,
        out,
        "",
        &[
            ("get_weather", json!({"city": "Paris"})),
            ("get_time", json!({})),
        ],
    );
    check(
        ToolFormat::Llama3,
        "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"x\": 1}}",
        "",
        &[("f", json!({"x": 1}))],
    );
}

#[test]
fn llama3_content_is_not_a_call() {
    check(
        ToolFormat::Llama3,
        "Paris is the capital {of France}.",
        "Paris is the capital {of France}.",
        &[],
    );
    check(
        ToolFormat::Llama3,
        "{\"answer\": 4}",
        "{\"answer\": 4}",
        &[],
    );
}

#[test]
fn mistral_calls_with_and_without_the_marker_text() {
    let out = "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, \
               {\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}]";
    let calls = [
        ("get_weather", json!({"city": "Paris"})),
        ("get_time", json!({"tz": "CET"})),
    ];
    check(ToolFormat::Mistral, out, "", &calls);
    // `[TOOL_CALLS]` is a special token: the detokenizer drops it.
    check(
        ToolFormat::Mistral,
        &out["[TOOL_CALLS] ".len()..],
        "",
        &calls,
    );
    check(
        ToolFormat::Mistral,
        "Sure.[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}]",
        "Sure.",
        &[("f", json!({}))],
    );
    check(
        ToolFormat::Mistral,
        "[1, 2] are numbers",
        "[1, 2] are numbers",
        &[],
    );
}

#[test]
fn formats_are_detected_from_the_template_and_render_their_calls() {
    assert_eq!(
        ToolFormat::detect("{{ '[TOOL_CALLS]' }}"),
        ToolFormat::Mistral
    );
    assert_eq!(
        ToolFormat::detect("{{- '\"parameters\": ' }}"),
        ToolFormat::Llama3
    );
    assert_eq!(ToolFormat::detect("<tool_call>"), ToolFormat::Hermes);
    assert_eq!(ToolFormat::detect("{{ messages }}"), ToolFormat::Hermes);
    let calls = vec![
        ("f".to_string(), json!({"x": 1})),
        ("g".to_string(), json!({})),
    ];
    for format in [ToolFormat::Hermes, ToolFormat::Llama3, ToolFormat::Mistral] {
        let text = format.render_calls(&calls);
        let (content, parsed) = whole(format, &text);
        assert_eq!(content, "", "{text}");
        assert_eq!(
            parsed,
            vec![("f".into(), "{\"x\": 1}".into()), ("g".into(), "{}".into())],
            "{text}"
        );
    }
}

#[test]
fn calls_of_functions_not_offered_are_content() {
    let out = "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>\n\
               <tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>";
    for size in [1, 5, out.len()] {
        let mut p =
            ToolCallParser::new(ToolFormat::Hermes, usize::MAX).with_names(vec!["f".into()]);
        let chars: Vec<char> = out.chars().collect();
        let mut events = Vec::new();
        for piece in chars.chunks(size) {
            events.extend(p.push(&piece.iter().collect::<String>()));
        }
        events.extend(p.finish());
        let (content, calls) = merged(&events);
        assert_eq!(
            content,
            "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>\n"
        );
        assert_eq!(calls, vec![("f".to_string(), "{\"x\": 1}".to_string())]);
    }
}
