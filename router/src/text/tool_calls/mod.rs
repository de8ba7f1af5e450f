//! Tool calls in a model's output: the formats we read (`ToolFormat`), how one is chosen for
//! a model, and the streaming parser (`ToolCallParser`) that splits the output into content
//! and calls as it arrives.
//!
//! Written here rather than taken from SGLang's `tool-parser` crate: that crate brings 47
//! more crates into the build (a second set of OpenAI types, a Python parser and a bignum
//! library for formats we do not read), has an async API for pure string work, and its
//! forced-call grammars are XGrammar structural tags, which our llguidance worker does not
//! read; the three formats below are small.

mod parser;
mod scanner;
#[cfg(test)]
mod tests;

pub use parser::{CallEvent, ToolCallParser};

use serde_json::{json, Value};

use crate::text::pyjson::dumps;

/// A model family's way of writing tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ToolFormat {
    /// Hermes / Qwen 2.5 / Qwen 3: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`,
    /// one block per call. The default rendering's format (for templates without tools).
    Hermes,
    /// Llama 3.1+ JSON: the whole output is `{"name": ..., "parameters": {...}}` (optionally
    /// after `<|python_tag|>`), calls separated by `; `.
    Llama3,
    /// Mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`.
    Mistral,
}

impl ToolFormat {
    /// The format a chat template writes its calls in (its own examples of them), or Hermes
    /// (the default rendering's) when it shows none.
    pub fn detect(template_source: &str) -> Self {
        if template_source.contains("[TOOL_CALLS]") {
            Self::Mistral
        } else if template_source.contains("<|python_tag|>")
            || template_source.contains("\"parameters\": ")
        {
            Self::Llama3
        } else {
            Self::Hermes
        }
    }

    /// The key that holds the arguments in the format's call objects.
    pub fn args_key(self) -> &'static str {
        match self {
            Self::Llama3 => "parameters",
            Self::Hermes | Self::Mistral => "arguments",
        }
    }

    /// One call object as the format writes it (`arguments` already a JSON value).
    pub fn call_object(self, name: &str, arguments: &Value) -> Value {
        let mut call = json!({"name": name});
        call[self.args_key()] = arguments.clone();
        call
    }

    /// An assistant turn's calls as the model would have written them (the default
    /// rendering of a conversation's earlier calls), JSON spaced as forced calls are.
    pub fn render_calls(self, calls: &[(String, Value)]) -> String {
        let objects: Vec<Value> = calls
            .iter()
            .map(|(name, args)| self.call_object(name, args))
            .collect();
        let each = objects.iter().map(dumps);
        match self {
            Self::Hermes => each
                .map(|o| format!("<tool_call>\n{o}\n</tool_call>"))
                .collect::<Vec<_>>()
                .join("\n"),
            Self::Llama3 => each.collect::<Vec<_>>().join("; "),
            Self::Mistral => format!("[TOOL_CALLS]{}", dumps(&Value::Array(objects))),
        }
    }
}
