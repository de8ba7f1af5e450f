//! One chat choice's output split as it streams: reasoning (`--reasoning-parser`) first,
//! then the answer into content and tool calls (when the request has tools), as OpenAI's
//! delta fields. A non-streamed message is the same pieces merged, so a streamed answer
//! assembles to the non-streamed one.

use rand::RngExt;
use serde_json::{json, Value};

use crate::text::reasoning::{ReasoningFormat, ReasoningParser};
use crate::text::tool_calls::{CallEvent, ToolCallParser, ToolFormat};

/// What parses a request's outputs.
#[derive(Debug, Clone, Default)]
pub struct OutputPlan {
    /// The call format, how many calls to report and the functions that may be called.
    pub tools: Option<(ToolFormat, usize, Vec<String>)>,
    /// The answer is calls alone (a forced `tool_choice`, whose grammar allows nothing
    /// else): what the call parser does not read as a call, the opening of one that
    /// `max_tokens` cut before its name, is not content.
    pub forced: bool,
    pub reasoning: Option<ReasoningFormat>,
}

impl OutputPlan {
    /// Nothing to split: the text is all content.
    pub fn is_plain(&self) -> bool {
        self.tools.is_none() && self.reasoning.is_none()
    }
}

/// A piece of one choice's output, as delta fields.
#[derive(Debug, Default, PartialEq)]
pub struct Parts {
    pub reasoning: String,
    pub content: String,
    /// OpenAI's `delta.tool_calls` entries.
    pub tool_calls: Vec<Value>,
}

impl Parts {
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty() && self.tool_calls.is_empty()
    }
}

pub struct ChoiceOutput {
    reasoning: Option<ReasoningParser>,
    tools: Option<ToolCallParser>,
    forced: bool,
}

impl ChoiceOutput {
    pub fn new(plan: &OutputPlan) -> Self {
        Self {
            reasoning: plan.reasoning.map(ReasoningParser::new),
            tools: plan.tools.as_ref().map(|(format, max, names)| {
                ToolCallParser::new(*format, *max).with_names(names.clone())
            }),
            forced: plan.forced,
        }
    }

    /// Whether calls were reported (the finish reason is then `tool_calls`).
    pub fn made_calls(&self) -> bool {
        self.tools.as_ref().is_some_and(|t| t.calls() > 0)
    }

    pub fn push(&mut self, text: &str) -> Parts {
        let (reasoning, answer) = match &mut self.reasoning {
            Some(r) => {
                let split = r.push(text);
                (split.reasoning, split.content)
            }
            None => (String::new(), text.to_string()),
        };
        let mut parts = self.answer(&answer, false);
        parts.reasoning = reasoning;
        parts
    }

    /// The end of the output: what the parsers held back.
    pub fn finish(&mut self) -> Parts {
        let (reasoning, answer) = match &mut self.reasoning {
            Some(r) => {
                let split = r.finish();
                (split.reasoning, split.content)
            }
            None => (String::new(), String::new()),
        };
        let mut parts = self.answer(&answer, true);
        parts.reasoning = reasoning;
        parts
    }

    fn answer(&mut self, text: &str, last: bool) -> Parts {
        let mut parts = Parts::default();
        let Some(tools) = &mut self.tools else {
            parts.content = text.to_string();
            return parts;
        };
        let mut events = tools.push(text);
        if last {
            events.extend(tools.finish());
        }
        for event in events {
            match event {
                CallEvent::Text(_) if self.forced => {}
                CallEvent::Text(t) => parts.content.push_str(&t),
                CallEvent::Start { index, name } => parts.tool_calls.push(json!({
                    "index": index,
                    "id": call_id(),
                    "type": "function",
                    "function": {"name": name, "arguments": ""},
                })),
                CallEvent::Args { index, text } => match parts.tool_calls.last_mut() {
                    Some(last) if last["index"] == index => {
                        let args = last["function"]["arguments"].as_str().unwrap_or("");
                        last["function"]["arguments"] = json!(format!("{args}{text}"));
                    }
                    _ => parts
                        .tool_calls
                        .push(json!({"index": index, "function": {"arguments": text}})),
                },
            }
        }
        parts
    }
}

/// A call's id: `call_` and 24 random letters and digits, as OpenAI's look.
fn call_id() -> String {
    const CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    let id: String = (0..24)
        .map(|_| CHARS[rng.random_range(0..CHARS.len())] as char)
        .collect();
    format!("call_{id}")
}

/// A complete (non-streamed) message's fields.
#[derive(Debug)]
pub struct Message {
    /// None without a reasoning parser, or when the output held no reasoning (as a stream
    /// then sends no `reasoning_content`).
    pub reasoning: Option<String>,
    pub content: String,
    /// OpenAI's `message.tool_calls` (`id`, `type`, `function.name`, `function.arguments`).
    pub tool_calls: Vec<Value>,
}

/// The message of a whole output.
pub fn whole_message(plan: &OutputPlan, text: &str) -> Message {
    let mut output = ChoiceOutput::new(plan);
    let mut parts = output.push(text);
    let rest = output.finish();
    parts.reasoning.push_str(&rest.reasoning);
    parts.content.push_str(&rest.content);
    parts.tool_calls.extend(rest.tool_calls);
    let mut calls: Vec<Value> = Vec::new();
    for delta in parts.tool_calls {
        let index = delta["index"].as_u64().unwrap_or(0) as usize;
        if index == calls.len() {
            let mut call = delta.clone();
            call.as_object_mut().map(|o| o.remove("index"));
            calls.push(call);
        } else if let Some(call) = calls.get_mut(index) {
            let args = call["function"]["arguments"]
                .as_str()
                .unwrap_or("")
                .to_string();
            let more = delta["function"]["arguments"].as_str().unwrap_or("");
            call["function"]["arguments"] = json!(args + more);
        }
    }
    Message {
        reasoning: plan
            .reasoning
            .and(Some(parts.reasoning))
            .filter(|r| !r.is_empty()),
        content: parts.content,
        tool_calls: calls,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> OutputPlan {
        OutputPlan {
            tools: Some((ToolFormat::Hermes, usize::MAX, vec!["get_weather".into()])),
            forced: false,
            reasoning: Some(ReasoningFormat::Qwen3),
        }
    }
    const OUTPUT: &str = "<think>Weather, so call.</think>\n\nChecking.\n<tool_call>\n\
        {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

    #[test]
    fn reasoning_content_and_calls_are_split() {
        let m = whole_message(&plan(), OUTPUT);
        assert_eq!(m.reasoning.as_deref(), Some("Weather, so call."));
        assert_eq!(m.content, "Checking.\n");
        let calls = m.tool_calls;
        assert_eq!(calls.len(), 1);
        assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(calls[0]["type"], "function");
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        assert_eq!(calls[0]["function"]["arguments"], "{\"city\": \"Paris\"}");
    }

    #[test]
    fn a_forced_call_cut_before_its_name_is_not_content() {
        let forced = OutputPlan {
            forced: true,
            ..plan()
        };
        for cut in [
            "<tool_",
            "<tool_call>\n{\"na",
            "<think>Hm.</think>\n\n<tool_call>",
        ] {
            let m = whole_message(&forced, cut);
            assert_eq!((m.content.as_str(), m.tool_calls.len()), ("", 0), "{cut:?}");
        }
        // Under `auto` the model may write text that looks like an opening: it is kept.
        assert_eq!(whole_message(&plan(), "<tool_").content, "<tool_");
        let m = whole_message(&forced, OUTPUT.split_once("Checking.\n").unwrap().1);
        assert_eq!((m.content.as_str(), m.tool_calls.len()), ("", 1));
    }

    #[test]
    fn an_answer_without_a_thought_has_no_reasoning_content() {
        let m = whole_message(&plan(), "Paris.");
        assert_eq!((m.reasoning, m.content.as_str()), (None, "Paris."));
    }

    #[test]
    fn streamed_deltas_carry_the_id_and_name_once_then_argument_pieces() {
        let mut output = ChoiceOutput::new(&plan());
        let mut deltas = Vec::new();
        let mut reasoning = String::new();
        for c in OUTPUT.chars() {
            let parts = output.push(&c.to_string());
            reasoning.push_str(&parts.reasoning);
            deltas.extend(parts.tool_calls);
        }
        assert!(output.finish().is_empty());
        assert_eq!(reasoning, "Weather, so call.");
        assert!(deltas[0]["id"].is_string() && deltas[0]["function"]["name"] == "get_weather");
        assert!(deltas[1..]
            .iter()
            .all(|d| d.get("id").is_none() && d["index"] == 0));
        let args: String = deltas
            .iter()
            .map(|d| d["function"]["arguments"].as_str().unwrap())
            .collect();
        assert_eq!(args, "{\"city\": \"Paris\"}");
    }

    #[test]
    fn plain_plans_pass_text_through() {
        let m = whole_message(&OutputPlan::default(), OUTPUT);
        assert_eq!(
            (m.reasoning, m.content.as_str(), m.tool_calls.len()),
            (None, OUTPUT, 0)
        );
    }
}
