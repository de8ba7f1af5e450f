//! `tools`, `tool_choice` and `parallel_tool_calls` of a chat request, checked: every tool a
//! function with a valid name and a valid JSON-schema `parameters`, names unique, a named
//! choice naming one of them. Errors name the field.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::api::constraint::check_schema;
use crate::error::ApiError;

/// One tool of `tools`, as OpenAI's API takes it.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: Function,
}

#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Function {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A JSON schema of the arguments object; absent: no parameters (OpenAI: "omitting
    /// `parameters` defines a function with an empty parameter list"), so `{}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    /// OpenAI's "arguments always follow the schema": forced calls (`required`, a named
    /// choice) always do; under `auto`, a `strict: true` tool puts the calls under a grammar
    /// (Hermes and Mistral formats; docs/api.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

impl Function {
    /// The arguments' schema (an empty object's when the tool gives none).
    pub fn parameters_schema(&self) -> Value {
        self.parameters.clone().unwrap_or_else(|| {
            serde_json::json!({"type": "object", "properties": {}, "additionalProperties": false})
        })
    }
}

/// A call in an earlier assistant turn (`messages[i].tool_calls[j]`).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MessageToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub function: CalledFunction,
    /// Where a streamed reply numbered the call (the openai SDK's stream helper keeps it on
    /// the message it returns): the calls' order says the same.
    pub index: Option<u32>,
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CalledFunction {
    pub name: String,
    /// The arguments object as JSON text, as OpenAI returns it.
    pub arguments: String,
    /// The arguments as the openai SDK's parse helpers parsed them (on the messages they
    /// return): `arguments` is what the model wrote, and what is rendered.
    #[schema(value_type = Option<Object>)]
    pub parsed_arguments: Option<Value>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    /// No calls: the tools are not shown to the model and its output is all content.
    None,
    /// The model may answer or call tools.
    Auto,
    /// At least one call (forced by a grammar).
    Required,
    /// One call of this function (forced by a grammar).
    Named(String),
}

/// The checked tool fields of one request.
#[derive(Debug, Clone)]
pub struct ToolRequest {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    /// More than one call allowed (`parallel_tool_calls`, default true).
    pub parallel: bool,
}

impl ToolRequest {
    pub fn parse(
        tools: Option<Vec<Tool>>,
        choice: Option<&Value>,
        parallel: Option<bool>,
    ) -> Result<Self, ApiError> {
        let tools = tools.unwrap_or_default();
        for (i, tool) in tools.iter().enumerate() {
            check_tool(i, tool)?;
            if tools[..i]
                .iter()
                .any(|t| t.function.name == tool.function.name)
            {
                return Err(ApiError::invalid(
                    "tools",
                    format!(
                        "`tools[{i}].function.name` {:?} is given twice",
                        tool.function.name
                    ),
                ));
            }
        }
        let choice = match choice {
            None if tools.is_empty() => ToolChoice::None,
            None => ToolChoice::Auto,
            Some(value) => parse_choice(value)?,
        };
        let forced = matches!(choice, ToolChoice::Required | ToolChoice::Named(_));
        if forced && tools.is_empty() {
            return Err(ApiError::invalid(
                "tool_choice",
                "`tool_choice` requires a call, but `tools` is empty or absent",
            ));
        }
        if let ToolChoice::Named(name) = &choice {
            if !tools.iter().any(|t| &t.function.name == name) {
                let names: Vec<&str> = tools.iter().map(|t| t.function.name.as_str()).collect();
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!(
                        "`tool_choice` names the function {name:?}, which is not in `tools` ({})",
                        names.join(", ")
                    ),
                ));
            }
        }
        Ok(Self {
            tools,
            choice,
            parallel: parallel.unwrap_or(true),
        })
    }

    /// Whether the model is shown the tools and its output parsed for calls.
    pub fn active(&self) -> bool {
        self.choice != ToolChoice::None
    }

    /// Whether the output must be calls (decoded under a grammar).
    pub fn forced(&self) -> bool {
        matches!(self.choice, ToolChoice::Required | ToolChoice::Named(_))
    }

    /// `auto` with a tool marked `strict: true`: calls are decoded under a grammar.
    pub fn strict(&self) -> bool {
        self.choice == ToolChoice::Auto
            && self.tools.iter().any(|t| t.function.strict == Some(true))
    }

    /// The tools a forced output may call: the named one, or all.
    pub fn callable(&self) -> Vec<&Tool> {
        match &self.choice {
            ToolChoice::Named(name) => self
                .tools
                .iter()
                .filter(|t| &t.function.name == name)
                .collect(),
            _ => self.tools.iter().collect(),
        }
    }

    /// How many calls are reported: one for a named choice or `parallel_tool_calls: false`.
    pub fn max_calls(&self) -> usize {
        match (&self.choice, self.parallel) {
            (ToolChoice::Named(_), _) | (_, false) => 1,
            _ => usize::MAX,
        }
    }
}

fn check_tool(i: usize, tool: &Tool) -> Result<(), ApiError> {
    if tool.kind != "function" {
        return Err(ApiError::invalid(
            "tools",
            format!(
                "`tools[{i}].type` must be \"function\"; got {:?}",
                tool.kind
            ),
        ));
    }
    let name = &tool.function.name;
    let ok = (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !ok {
        return Err(ApiError::invalid(
            "tools",
            format!("`tools[{i}].function.name` must be 1 to 64 of a-z, A-Z, 0-9, _ and -; got {name:?}"),
        ));
    }
    if let Some(schema) = &tool.function.parameters {
        if !schema.is_object() {
            return Err(ApiError::invalid(
                "tools",
                format!("`tools[{i}].function.parameters` must be a JSON schema object"),
            ));
        }
        check_schema(schema).map_err(|e| {
            ApiError::invalid("tools", format!("`tools[{i}].function.parameters`: {e}"))
        })?;
    }
    Ok(())
}

fn parse_choice(value: &Value) -> Result<ToolChoice, ApiError> {
    let named = || -> Option<String> {
        let object = value.as_object()?;
        let function = object.get("function")?.as_object()?;
        let only_keys = object.keys().all(|k| k == "type" || k == "function")
            && function.keys().all(|k| k == "name");
        let typed = object.get("type")?.as_str()? == "function";
        (only_keys && typed).then(|| function.get("name")?.as_str().map(str::to_string))?
    };
    match value.as_str() {
        Some("none") => Ok(ToolChoice::None),
        Some("auto") => Ok(ToolChoice::Auto),
        Some("required") => Ok(ToolChoice::Required),
        _ => named().map(ToolChoice::Named).ok_or_else(|| {
            ApiError::invalid(
                "tool_choice",
                format!(
                    "`tool_choice` must be \"none\", \"auto\", \"required\" or \
                     {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}; got {value}"
                ),
            )
        }),
    }
}
