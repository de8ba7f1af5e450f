//! The non-OpenAI endpoints: vLLM's `/tokenize` and `/detokenize`, and SGLang's native
//! `/generate` (text or token ids in; text, token ids and `meta_info` out).

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Json, Response};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::api::chat;
use crate::api::generate::{self, Generation, PromptInput, Update};
use crate::api::openai::{from_map, ChatMessage, CommonParams};
use crate::api::params::{validate, EndpointParams};
use crate::api::respond::finish_reason;
use crate::error::ApiError;
use crate::state::AppState;
use crate::worker::protocol::Finish;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub messages: Option<Vec<ChatMessage>>,
    pub add_special_tokens: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Vec<u32>,
}

/// `{prompt}` or `{messages}` (rendered with the chat template) -> `{count, max_model_len, tokens}`.
pub async fn tokenize(state: &AppState, req: TokenizeRequest) -> Result<Value, ApiError> {
    check_model(state, req.model.as_deref())?;
    let input = match (req.prompt, req.messages) {
        (Some(text), None) => PromptInput::Text {
            text,
            add_special_tokens: req.add_special_tokens.unwrap_or(true),
        },
        (None, Some(messages)) => chat::prompt(state, &messages)?,
        _ => {
            return Err(ApiError::bad_request(
                "give exactly one of `prompt` and `messages`",
            ))
        }
    };
    let PromptInput::Text {
        text,
        add_special_tokens,
    } = input
    else {
        unreachable!("both shapes are text");
    };
    let tokens = state.tokenizer.encode(text, add_special_tokens).await?;
    Ok(json!({
        "count": tokens.len(),
        "max_model_len": state.max_context().ok(),
        "tokens": tokens,
    }))
}

/// `{tokens}` -> `{prompt}` (special tokens kept, so tokenize/detokenize round-trips).
pub fn detokenize(state: &AppState, req: DetokenizeRequest) -> Result<Value, ApiError> {
    check_model(state, req.model.as_deref())?;
    let vocab = state.tokenizer.vocab_size();
    if let Some(t) = req.tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid(
            "tokens",
            format!("token id {t} is outside the vocabulary of {vocab}"),
        ));
    }
    Ok(json!({"prompt": state.tokenizer.decode_with_specials(&req.tokens)}))
}

/// A JSON body into one of this module's requests, errors naming the field.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    match value {
        Value::Object(map) => from_map(map),
        _ => Err(ApiError::bad_request("the body must be a JSON object")),
    }
}

fn check_model(state: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    model.map_or(Ok(()), |m| state.check_model(m))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateRequest {
    pub text: Option<String>,
    pub input_ids: Option<Vec<u32>>,
    #[serde(default)]
    pub sampling_params: Map<String, Value>,
    pub stream: Option<bool>,
}

/// SGLang's `sampling_params` names -> ours; everything else is a `CommonParams` field.
const RENAMED: [(&str, &str); 2] = [
    ("max_new_tokens", "max_tokens"),
    ("min_new_tokens", "min_tokens"),
];
/// `CommonParams` fields that are not sampling parameters.
const NOT_SAMPLING: [&str; 4] = ["stream", "stream_options", "n", "user"];

/// SGLang's native generate: `{text | input_ids, sampling_params, stream}`.
pub async fn generate(state: &AppState, req: GenerateRequest) -> Result<Response, ApiError> {
    let prompt = match (req.text, req.input_ids) {
        (Some(text), None) => PromptInput::Text {
            text,
            add_special_tokens: true,
        },
        (None, Some(ids)) => PromptInput::Ids(ids),
        _ => {
            return Err(ApiError::bad_request(
                "give exactly one of `text` and `input_ids`",
            ))
        }
    };
    let mut map = Map::new();
    for (key, value) in req.sampling_params {
        if NOT_SAMPLING.contains(&key.as_str()) {
            let message = format!("unsupported parameter `sampling_params.{key}`");
            return Err(ApiError::invalid("sampling_params", message));
        }
        let key = RENAMED
            .iter()
            .find(|(from, _)| *from == key)
            .map_or(key, |(_, to)| to.to_string());
        map.insert(key, value);
    }
    let common: CommonParams = from_map(map)?;
    let mut params = validate(&common, &EndpointParams::default())?;
    params.stream = req.stream.unwrap_or(false);
    let mut generation = generate::start(state, prompt, params.clone()).await?;
    if !params.stream {
        let (piece, finish) = generate::collect(&mut generation).await?;
        return Ok(Json(body(&generation, &piece.text, Some(finish))).into_response());
    }
    let first = generation.next().await.transpose()?;
    let events = async_stream::stream! {
        let mut text = String::new();
        let mut update = first;
        while let Some(current) = update.take() {
            match current {
                Update::Piece(piece) => {
                    text.push_str(&piece.text);
                    yield data(&body(&generation, &text, None));
                }
                Update::Finished(finish) => {
                    yield data(&body(&generation, &text, Some(finish)));
                    break;
                }
            }
            match generation.next().await {
                Some(Ok(next)) => update = Some(next),
                Some(Err(e)) => yield data(&e.body()),
                None => {}
            }
        }
        yield Ok::<Event, std::convert::Infallible>(Event::default().data("[DONE]"));
    };
    Ok(Sse::new(events).into_response())
}

/// One /generate object: the text and token ids so far (cumulative, as SGLang streams them).
fn body(generation: &Generation, text: &str, finish: Option<Finish>) -> Value {
    let usage = generation.usage();
    json!({
        "text": text,
        "output_ids": generation.output_ids(),
        "meta_info": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "cached_tokens": usage.prompt_tokens_details.cached_tokens,
            "finish_reason": finish.map(finish_reason),
        },
    })
}

fn data(value: &Value) -> Result<Event, std::convert::Infallible> {
    Ok(Event::default().data(value.to_string()))
}
