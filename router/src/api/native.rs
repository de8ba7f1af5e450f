//! The non-OpenAI endpoints: vLLM's `/tokenize` and `/detokenize`, and SGLang's native
//! `/generate` (text or token ids in; text, token ids and `meta_info` out).

use axum::body::Bytes;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use utoipa::ToSchema;

use crate::api::chat;
use crate::api::generate::{self, Generation, Piece, PromptInput};
use crate::api::openai::{from_map, parse, ChatMessage, CommonParams, Usage};
use crate::api::params::{validate, EndpointParams, GenParams};
use crate::api::prepare::{check_tokens, off_runtime};
use crate::api::respond::{finish_reason, respond, Choices, Format};
use crate::error::ApiError;
use crate::state::AppState;
use crate::worker::protocol::Finish;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub messages: Option<Vec<ChatMessage>>,
    pub add_special_tokens: Option<bool>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Vec<u32>,
}

/// `{prompt}` or `{messages}` (rendered with the chat template) -> `{count, max_model_len, tokens}`.
pub async fn tokenize(state: &AppState, body: Bytes) -> Result<Value, ApiError> {
    let s = state.clone();
    let (text, add_special_tokens) = off_runtime(move || tokenize_input(&s, parse(&body)?)).await?;
    let tokens = state.tokenizer.encode(text, add_special_tokens).await?;
    Ok(json!({
        "count": tokens.len(),
        "max_model_len": state.max_context().ok(),
        "tokens": tokens,
    }))
}

/// The text to tokenize and whether to add special tokens.
fn tokenize_input(state: &AppState, req: TokenizeRequest) -> Result<(String, bool), ApiError> {
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
    Ok((text, add_special_tokens))
}

/// `{tokens}` -> `{prompt}` (special tokens kept, so tokenize/detokenize round-trips).
pub async fn detokenize(state: &AppState, body: Bytes) -> Result<Value, ApiError> {
    let s = state.clone();
    off_runtime(move || {
        let req: DetokenizeRequest = parse(&body)?;
        check_model(&s, req.model.as_deref())?;
        let vocab = s.tokenizer.vocab_size();
        check_tokens("tokens", req.tokens.iter().copied(), vocab)?;
        Ok(json!({"prompt": s.tokenizer.decode_with_specials(&req.tokens)}))
    })
    .await
}

fn check_model(state: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    model.map_or(Ok(()), |m| state.check_model(m))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GenerateRequest {
    pub text: Option<String>,
    pub input_ids: Option<Vec<u32>>,
    /// SGLang's names: `max_new_tokens`, `min_new_tokens`, and the sampling fields of
    /// /v1/completions (`temperature`, `top_p`, `stop`, ...).
    #[serde(default)]
    #[schema(value_type = Object)]
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

/// SGLang's native generate: `{text | input_ids, sampling_params, stream}`. Its errors name
/// the fields as its client wrote them (`native_error`).
pub async fn generate(state: &AppState, body: Bytes) -> Result<Response, ApiError> {
    let s = state.clone();
    let (prompt, params) = off_runtime(move || {
        let req: GenerateRequest = parse(&body)?;
        as_openai(&s, req).map_err(native_error)
    })
    .await?;
    let stream = params.stream;
    let generation = generate::start(state, prompt, params)
        .await
        .map_err(native_error)?;
    let choices = Choices {
        generations: vec![generation],
        n: 1,
    };
    respond(choices, NativeFormat::default(), stream, false)
        .await
        .map_err(native_error)
}

/// An error about a field in our names (`validate`'s, the shared generation's) named as
/// /generate's client wrote it: a sampling field under `sampling_params.`, by SGLang's name
/// (`sampling_params.max_new_tokens` for our `max_tokens`); token ids as `input_ids`.
fn native_error(error: ApiError) -> ApiError {
    let ApiError::BadRequest {
        message,
        param: Some(param),
    } = error
    else {
        return error;
    };
    if param == "prompt" {
        return ApiError::invalid("input_ids", message.replace("`prompt`", "`input_ids`"));
    }
    let name = RENAMED
        .iter()
        .find(|(_, ours)| *ours == param)
        .map_or(param.as_str(), |(native, _)| native);
    let native = format!("sampling_params.{name}");
    let message = message.replace(&format!("`{param}`"), &format!("`{native}`"));
    ApiError::invalid(&native, message)
}

/// The request in OpenAI's terms: its prompt and validated parameters.
fn as_openai(state: &AppState, req: GenerateRequest) -> Result<(PromptInput, GenParams), ApiError> {
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
            return Err(ApiError::invalid(
                &key,
                format!("unsupported parameter `{key}`"),
            ));
        }
        let key = RENAMED
            .iter()
            .find(|(from, _)| *from == key)
            .map_or(key, |(_, to)| to.to_string());
        map.insert(key, value);
    }
    let common: CommonParams = from_map(map)?;
    let mut params = validate(
        &common,
        &EndpointParams::default(),
        &state.limits,
        &state.sampling_defaults,
    )?;
    params.stream = req.stream.unwrap_or(false);
    Ok((prompt, params))
}

/// /generate's objects: the text and token ids so far (cumulative, as SGLang streams them)
/// and `meta_info`, streamed or whole.
#[derive(Default)]
struct NativeFormat {
    /// The text streamed so far (one choice: /generate has no `n`).
    text: String,
}

/// What a /generate object reads off its generation.
struct Progress {
    usage: Usage,
    output_ids: Vec<u32>,
}

impl Format for NativeFormat {
    type View = Progress;

    fn view(generation: &Generation) -> Progress {
        Progress {
            usage: generation.usage(),
            output_ids: generation.output_ids().to_vec(),
        }
    }

    fn opening_chunk(&mut self, _: u32) -> Option<Value> {
        None
    }

    fn chunk(
        &mut self,
        _: u32,
        piece: &Piece,
        finish: Option<Finish>,
        view: &Progress,
    ) -> Option<String> {
        self.text.push_str(&piece.text);
        Some(body(&self.text, view, finish).to_string())
    }

    fn usage_chunk(&self, _: Usage) -> Option<Value> {
        None
    }

    fn choice(&mut self, _: u32, piece: &Piece, finish: Finish, view: &Progress) -> Value {
        body(&piece.text, view, Some(finish))
    }

    fn complete(&self, choices: Vec<Value>, _: Usage) -> Value {
        let [choice] = <[Value; 1]>::try_from(choices).expect("/generate serves one choice");
        choice
    }
}

/// One /generate object: `text` and the ids so far, and `meta_info`.
fn body(text: &str, view: &Progress, finish: Option<Finish>) -> Value {
    let usage = view.usage;
    json!({
        "text": text,
        "output_ids": view.output_ids,
        "meta_info": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "cached_tokens": usage.prompt_tokens_details.cached_tokens,
            "finish_reason": finish.map(finish_reason),
        },
    })
}
