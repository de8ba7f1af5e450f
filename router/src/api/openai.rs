//! OpenAI request and response types (the subset minisgl serves, in OpenAI's exact shapes).
//!
//! A body is split by key: the endpoint's own fields go to `ChatRequest`/`CompletionRequest`,
//! the rest to `CommonParams`; both deny unknown fields, so a parameter we do not honor is
//! a 400 naming it, never silently dropped.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::api::tools::request::{MessageToolCall, Tool};
use crate::error::ApiError;

/// The fields shared by both endpoints (sampling, stopping, streaming).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CommonParams {
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub ignore_eos: Option<bool>,
    pub min_tokens: Option<i64>,
    pub frequency_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<i64>,
    /// Token id (as a string) -> bias in [-100, 100], added to the logits.
    pub logit_bias: Option<std::collections::BTreeMap<String, f64>>,
    /// Informational in OpenAI's API; accepted and ignored.
    pub user: Option<String>,
    /// Structured outputs (api/constraint.rs): OpenAI's, SGLang's and vLLM's spellings.
    pub response_format: Option<Value>,
    pub regex: Option<String>,
    pub ebnf: Option<String>,
    pub json_schema: Option<Value>,
    pub structured_outputs: Option<Value>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

pub trait Endpoint: DeserializeOwned {
    /// The top-level keys that belong to this endpoint rather than to `CommonParams`.
    const FIELDS: &'static [&'static str];
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<ChatMessage>,
    pub max_completion_tokens: Option<i64>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    /// Tool calling (api/tools/): the functions the model may call, whether and which.
    pub tools: Option<Vec<Tool>>,
    /// `"none"`, `"auto"`, `"required"` or `{"type": "function", "function": {"name": ...}}`.
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    /// Extra variables for the chat template (e.g. `{"enable_thinking": false}`).
    pub chat_template_kwargs: Option<Map<String, Value>>,
}

impl Endpoint for ChatRequest {
    const FIELDS: &'static [&'static str] = &[
        "model",
        "messages",
        "max_completion_tokens",
        "logprobs",
        "top_logprobs",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "chat_template_kwargs",
    ];
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    pub role: String,
    pub content: Option<Content>,
    pub name: Option<String>,
    pub tool_call_id: Option<String>,
    /// An assistant turn's calls.
    pub tool_calls: Option<Vec<MessageToolCall>>,
    /// An assistant turn's reasoning, as this server returns it (`--reasoning-parser`), so
    /// a reply can be sent back as it came: given to a template that reads it (Qwen3's
    /// renders it in the turns after the last user message), else not rendered.
    pub reasoning_content: Option<String>,
    /// What the openai SDK's helpers put on the assistant messages they return, so that
    /// one sent back as history is taken: `parsed` (the content parsed; the content is what
    /// is rendered) and OpenAI's reply fields this server never fills, which must be null
    /// or empty (`refusal`, `audio`, `function_call`, `annotations`).
    #[schema(value_type = Option<Object>)]
    pub parsed: Option<Value>,
    #[schema(value_type = Option<Object>)]
    pub refusal: Option<Value>,
    #[schema(value_type = Option<Object>)]
    pub audio: Option<Value>,
    #[schema(value_type = Option<Object>)]
    pub function_call: Option<Value>,
    #[schema(value_type = Option<Object>)]
    pub annotations: Option<Value>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
    /// Any other key: refused by name when the message is read (an untagged `Content`
    /// cannot say which key its parts did not take).
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub other: Map<String, Value>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompletionRequest {
    pub model: String,
    pub prompt: Prompt,
    pub logprobs: Option<i64>,
    /// Prepend the prompt to the completion.
    pub echo: Option<bool>,
}

impl Endpoint for CompletionRequest {
    const FIELDS: &'static [&'static str] = &["model", "prompt", "logprobs", "echo"];
}

/// A string, a list of strings, a list of token ids, or a list of token-id lists.
// `serde(untagged)` only shapes the OpenAPI schema: the deserializer below is by hand.
#[derive(Debug, ToSchema)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdLists(Vec<Vec<u32>>),
}

/// By hand rather than `#[serde(untagged)]`, which buffers a 512-id prompt and retries each
/// shape on it: this reads the shape off the first element.
impl<'de> Deserialize<'de> for Prompt {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let value = Value::deserialize(d)?;
        let shape = || {
            D::Error::custom(
                "must be a string, a list of strings, a list of token ids or a list of token-id lists",
            )
        };
        let ids = |v: &Value| -> Option<Vec<u32>> {
            v.as_array()?
                .iter()
                .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                .collect()
        };
        match &value {
            Value::String(s) => Ok(Self::Text(s.clone())),
            Value::Array(items) => match items.first() {
                None | Some(Value::String(_)) => items
                    .iter()
                    .map(|v| v.as_str().map(str::to_string))
                    .collect::<Option<_>>()
                    .map(Self::Texts)
                    .ok_or_else(shape),
                Some(Value::Number(_)) => ids(&value).map(Self::Ids).ok_or_else(shape),
                Some(Value::Array(_)) => items
                    .iter()
                    .map(ids)
                    .collect::<Option<_>>()
                    .map(Self::IdLists)
                    .ok_or_else(shape),
                Some(_) => Err(shape()),
            },
            _ => Err(shape()),
        }
    }
}

/// Parses a JSON body into the endpoint's fields and the common ones.
pub fn parse_body<E: Endpoint>(body: &[u8]) -> Result<(E, CommonParams), ApiError> {
    let (own, common): (Map<String, Value>, Map<String, Value>) = json_object(body)?
        .into_iter()
        .partition(|(k, _)| E::FIELDS.contains(&k.as_str()));
    Ok((from_map(own)?, from_map(common)?))
}

/// Parses a JSON body into one request type whole (the native endpoints' bodies).
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    from_map(json_object(body)?)
}

/// Every body is a JSON object; this is the one place that reads it.
fn json_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    match value {
        Value::Object(map) => Ok(map),
        _ => Err(ApiError::bad_request("the body must be a JSON object")),
    }
}

pub fn from_map<T: DeserializeOwned>(map: Map<String, Value>) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(Value::Object(map)).map_err(|e| {
        let inner = e.inner().to_string();
        let path = e.path().to_string();
        if let Some(field) = unknown_field(&inner) {
            // The path names it inside an object of the body (`messages[1].refusal`).
            let field = if path == "." { field } else { path };
            return ApiError::invalid(&field, format!("unsupported parameter `{field}`"));
        }
        if path == "." {
            // A missing required field: serde says "missing field `x`".
            let field = inner.split('`').nth(1).unwrap_or("").to_string();
            return ApiError::invalid(&field, inner);
        }
        let top = path.split(['.', '[']).next().unwrap_or(&path).to_string();
        ApiError::invalid(&top, format!("`{path}`: {inner}"))
    })
}

/// serde's "unknown field `x`, expected ..." names the field between the first backticks.
fn unknown_field(message: &str) -> Option<String> {
    let rest = message.strip_prefix("unknown field `")?;
    Some(rest.split('`').next()?.to_string())
}

#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, ToSchema)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    pub prompt_tokens_details: PromptTokensDetails,
}

#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, ToSchema)]
pub struct PromptTokensDetails {
    pub cached_tokens: u32,
}

impl Usage {
    pub fn new(prompt_tokens: u32, completion_tokens: u32, cached_tokens: u32) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: &str) -> Result<(ChatRequest, CommonParams), ApiError> {
        parse_body::<ChatRequest>(body.as_bytes())
    }

    #[test]
    fn splits_endpoint_and_common_fields() {
        let (req, common) = chat(
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.5,
                "stop":["a","b"],"stream_options":{"include_usage":true},"user":"u"}"#,
        )
        .unwrap();
        assert_eq!(req.model, "m");
        assert_eq!(common.temperature, Some(0.5));
        assert!(matches!(common.stop, Some(Stop::Many(ref v)) if v.len() == 2));
        assert_eq!(common.stream_options.unwrap().include_usage, Some(true));
    }

    #[test]
    fn unknown_fields_are_named() {
        let err = chat(r#"{"model":"m","messages":[],"functions":[]}"#).unwrap_err();
        assert_eq!(err.message(), "unsupported parameter `functions`");
        let err = chat(r#"{"model":"m","messages":[],"stream_options":{"x":1}}"#).unwrap_err();
        assert_eq!(err.message(), "unsupported parameter `stream_options.x`");
        assert_eq!(err.body()["error"]["param"], "stream_options.x");
        let turns = r#"{"model":"m","messages":[{"role":"user","content":"hi"},
            {"role":"assistant","content":"yo","weight":0}]}"#;
        let err = chat(turns).unwrap_err();
        assert_eq!(err.message(), "unsupported parameter `messages[1].weight`");
        let part = r#"{"model":"m","messages":[{"role":"user","content":[
            {"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]}]}"#;
        let (req, _) = chat(part).unwrap();
        let Some(Content::Parts(parts)) = &req.messages[0].content else {
            panic!("parts")
        };
        assert!(parts[0].other.contains_key("cache_control"));
        let err = parse_body::<CompletionRequest>(br#"{"model":"m","prompt":"p","messages":[]}"#)
            .unwrap_err();
        assert_eq!(err.message(), "unsupported parameter `messages`");
    }

    #[test]
    fn type_errors_name_the_field() {
        let err = chat(r#"{"model":"m","messages":[],"temperature":"hot"}"#).unwrap_err();
        assert!(
            err.message().starts_with("`temperature`: invalid type"),
            "{}",
            err.message()
        );
        assert_eq!(err.body()["error"]["param"], "temperature");
        let err = chat(r#"{"messages":[]}"#).unwrap_err();
        assert_eq!(err.message(), "missing field `model`");
    }

    #[test]
    fn bad_json_and_non_objects_are_bad_requests() {
        assert!(chat("{")
            .unwrap_err()
            .message()
            .starts_with("the body is not valid JSON"));
        assert_eq!(
            chat("[1]").unwrap_err().message(),
            "the body must be a JSON object"
        );
    }

    #[test]
    fn prompts_come_in_four_shapes() {
        let parse = |p: &str| {
            parse_body::<CompletionRequest>(format!(r#"{{"model":"m","prompt":{p}}}"#).as_bytes())
                .unwrap()
                .0
                .prompt
        };
        assert!(matches!(parse(r#""hi""#), Prompt::Text(_)));
        assert!(matches!(parse(r#"["hi"]"#), Prompt::Texts(_)));
        assert!(matches!(parse("[1,2]"), Prompt::Ids(_)));
        assert!(matches!(parse("[[1,2]]"), Prompt::IdLists(_)));
        let err =
            parse_body::<CompletionRequest>(br#"{"model":"m","prompt":[1,"a"]}"#).unwrap_err();
        assert!(
            err.message().starts_with("`prompt`: must be a string"),
            "{}",
            err.message()
        );
    }
}
