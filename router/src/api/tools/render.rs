//! A conversation with tools, rendered. A chat template that reads a `tools` variable (as
//! Hugging Face templates with tool support do) gets the tools and the messages' own
//! `tool_calls` (arguments as JSON objects, as transformers passes them) and `tool` turns.
//!
//! A template without tool support gets the default rendering, in the tool-call format the
//! router parses (`--tool-call-parser`, Hermes unless the template shows another):
//! - the tool list and how to call them, appended to the system message (one is added at the
//!   front when the conversation has none): `TOOLS_HEADER`, the tools as JSON (spaced as
//!   Python writes it), one a line,
//!   then the call syntax;
//! - an assistant turn's `tool_calls` appended to its content as the model would write them;
//! - `tool` turns as a user turn `<tool_response>\n...\n</tool_response>` (consecutive
//!   results joined in one turn), so templates that want user and assistant turns to
//!   alternate still render.

use serde_json::{json, Value};

use super::request::{MessageToolCall, ToolRequest};
use crate::error::ApiError;
use crate::text::chat_template::TemplateMessage;
use crate::text::pyjson::dumps;
use crate::text::tool_calls::ToolFormat;

pub const TOOLS_HEADER: &str = "# Tools\n\nYou may call one or more functions to assist with \
the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n";

/// A message's calls as the template sees them (`arguments` parsed from their JSON text).
pub fn template_calls(i: usize, calls: &[MessageToolCall]) -> Result<Vec<Value>, ApiError> {
    calls
        .iter()
        .enumerate()
        .map(|(j, call)| {
            let args: Value = serde_json::from_str(&call.function.arguments).map_err(|e| {
                ApiError::invalid(
                    "messages",
                    format!("`messages[{i}].tool_calls[{j}].function.arguments` is not JSON: {e}"),
                )
            })?;
            Ok(json!({
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": args},
            }))
        })
        .collect()
}

/// The messages in the default rendering (for a template without tool support).
pub fn default_rendering(
    messages: Vec<TemplateMessage>,
    tools: &ToolRequest,
    format: ToolFormat,
) -> Vec<TemplateMessage> {
    let mut out: Vec<TemplateMessage> = Vec::with_capacity(messages.len() + 1);
    for mut m in messages {
        if let Some(calls) = m.tool_calls.take() {
            let calls: Vec<(String, Value)> = calls
                .iter()
                .map(|c| {
                    (
                        c["function"]["name"].as_str().unwrap_or("").to_string(),
                        c["function"]["arguments"].clone(),
                    )
                })
                .collect();
            let rendered = format.render_calls(&calls);
            m.content = match m.content.is_empty() {
                true => rendered,
                false => format!("{}\n{rendered}", m.content),
            };
        }
        if m.role == "tool" {
            let response = format!("<tool_response>\n{}\n</tool_response>", m.content);
            match out.last_mut() {
                Some(last) if last.role == "user" && last.content.ends_with("</tool_response>") => {
                    last.content.push('\n');
                    last.content.push_str(&response);
                }
                _ => out.push(TemplateMessage {
                    role: "user".into(),
                    content: response,
                    ..Default::default()
                }),
            }
            continue;
        }
        out.push(m);
    }
    if tools.active() {
        let block = tools_block(tools, format);
        match out.first_mut() {
            Some(first) if first.role == "system" => {
                first.content = format!("{}\n\n{block}", first.content);
            }
            _ => out.insert(
                0,
                TemplateMessage {
                    role: "system".into(),
                    content: block,
                    ..Default::default()
                },
            ),
        }
    }
    out
}

/// The tool list and the call syntax of `format`.
fn tools_block(tools: &ToolRequest, format: ToolFormat) -> String {
    let list: Vec<String> = tools
        .tools
        .iter()
        .map(|t| dumps(&serde_json::to_value(t).expect("tools serialize")))
        .collect();
    let args = format.args_key();
    let syntax = match format {
        ToolFormat::Hermes => format!(
            "For each function call, return a json object with function name and arguments \
             within <tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \
             \"{args}\": <args-json-object>}}\n</tool_call>"
        ),
        ToolFormat::Llama3 => format!(
            "To call a function, respond with only a JSON object {{\"name\": <function-name>, \
             \"{args}\": <args-json-object>}}; separate several calls with \"; \"."
        ),
        ToolFormat::Mistral => format!(
            "To call functions, respond with only [TOOL_CALLS] followed by a JSON list of \
             {{\"name\": <function-name>, \"{args}\": <args-json-object>}} objects."
        ),
    };
    format!("{TOOLS_HEADER}{}\n</tools>\n\n{syntax}", list.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::tools::request::{CalledFunction, Tool};

    fn message(role: &str, content: &str) -> TemplateMessage {
        TemplateMessage {
            role: role.into(),
            content: content.into(),
            ..Default::default()
        }
    }

    #[test]
    fn the_default_rendering_shows_tools_calls_and_results_in_the_format() {
        let tools: Vec<Tool> = serde_json::from_value(json!([
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        ]))
        .unwrap();
        let request = ToolRequest::parse(Some(tools), None, None).unwrap();
        let call = MessageToolCall {
            id: "call_1".into(),
            kind: Some("function".into()),
            function: CalledFunction {
                name: "f".into(),
                arguments: "{\"x\": 1}".into(),
                parsed_arguments: None,
            },
            index: None,
        };
        let mut assistant = message("assistant", "");
        assistant.tool_calls = Some(template_calls(1, &[call]).unwrap());
        let conversation = vec![
            message("user", "hi"),
            assistant,
            message("tool", "1"),
            message("tool", "2"),
        ];
        let out = default_rendering(conversation, &request, ToolFormat::Hermes);
        let roles: Vec<&str> = out.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        assert!(
            out[0].content.starts_with(TOOLS_HEADER),
            "{}",
            out[0].content
        );
        assert!(out[0].content.contains(
            r#"{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}"#
        ));
        assert_eq!(
            out[2].content,
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>"
        );
        assert_eq!(
            out[3].content,
            "<tool_response>\n1\n</tool_response>\n<tool_response>\n2\n</tool_response>"
        );
        let bad = MessageToolCall {
            id: "c".into(),
            kind: None,
            function: CalledFunction {
                name: "f".into(),
                arguments: "{oops".into(),
                parsed_arguments: None,
            },
            index: None,
        };
        let err = template_calls(3, &[bad]).unwrap_err();
        assert!(err
            .message()
            .starts_with("`messages[3].tool_calls[0].function.arguments` is not JSON"));
    }
}
