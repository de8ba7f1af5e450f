//! /v1/chat/completions: messages -> chat template -> prompt; chunks in `chat.completion` shape.

use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::api::generate::{Generation, Piece, PromptInput, TokenLogprob};
use crate::api::messages::flatten;
use crate::api::openai::{parse_body, ChatMessage, ChatRequest, Usage};
use crate::api::params::{validate, EndpointParams, GenParams};
use crate::api::respond::{finish_reason, Format, Head};
use crate::api::tools;
use crate::api::tools::output::{whole_message, ChoiceOutput, OutputPlan};
use crate::api::tools::render::default_rendering;
use crate::api::tools::request::ToolRequest;
use crate::error::ApiError;
use crate::state::AppState;
use crate::text::chat_template::{RenderExtras, DEVELOPER};
use crate::text::tokenizer::Tokenizer;
use crate::worker::protocol::Finish;

/// A chat request made ready to admit: its body parsed and checked, its tools and output
/// plan, and its prompt rendered by the chat template.
pub struct ChatPlan {
    pub model: String,
    pub logprobs: bool,
    pub params: GenParams,
    pub plan: OutputPlan,
    pub prompt: PromptInput,
}

/// Everything a chat request needs before admission; synchronous, so the handler runs it
/// off the async workers (`prepare::off_runtime`).
pub fn prepare(state: &AppState, body: &[u8]) -> Result<ChatPlan, ApiError> {
    let (mut req, common) = parse_body::<ChatRequest>(body)?;
    state.check_model(&req.model)?;
    let endpoint = endpoint_params(&req)?;
    let mut params = validate(&common, &endpoint, &state.limits, &state.sampling_defaults)?;
    let (tools, mut plan) = tools::prepare(state, &mut req, &common, &mut params)?;
    let kwargs = req.chat_template_kwargs.as_ref();
    let prompt = prompt_with(state, &req.messages, &tools, kwargs)?;
    let constraint = &mut params.sampling.constraint;
    plan.reasoning = tools::reasoning_room(state.reasoning, constraint, prompt.text());
    Ok(ChatPlan {
        model: req.model,
        logprobs: endpoint.logprobs,
        params,
        plan,
        prompt,
    })
}

pub fn endpoint_params(req: &ChatRequest) -> Result<EndpointParams, ApiError> {
    let logprobs = req.logprobs.unwrap_or(false);
    let top_logprobs = req.top_logprobs.unwrap_or(0);
    if top_logprobs != 0 && !logprobs {
        return Err(ApiError::invalid(
            "top_logprobs",
            "`top_logprobs` requires `logprobs` = true",
        ));
    }
    Ok(EndpointParams {
        max_completion_tokens: req.max_completion_tokens,
        default_max_tokens: None,
        logprobs,
        top_logprobs,
    })
}

/// Renders a conversation without tools (/generate's `messages`).
pub fn prompt(state: &AppState, messages: &[ChatMessage]) -> Result<PromptInput, ApiError> {
    let no_tools = ToolRequest::parse(None, None, None)?;
    prompt_with(state, messages, &no_tools, None)
}

/// Renders the conversation with the model's chat template, the request's tools and its
/// `chat_template_kwargs`.
pub fn prompt_with(
    state: &AppState,
    messages: &[ChatMessage],
    tools: &ToolRequest,
    kwargs: Option<&Map<String, Value>>,
) -> Result<PromptInput, ApiError> {
    let template = state.template.as_ref().ok_or_else(|| {
        ApiError::bad_request(format!(
            "the model `{}` has no chat template; use /v1/completions",
            state.model_name()
        ))
    })?;
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must not be empty",
        ));
    }
    if let Some(kwargs) = kwargs {
        template.check_kwargs(kwargs)?;
    }
    let mut messages = messages
        .iter()
        .enumerate()
        .map(flatten)
        .collect::<Result<Vec<_>, _>>()?;
    for m in messages.iter_mut().filter(|m| m.role == DEVELOPER) {
        m.role = template.developer_role().into();
    }
    let tool_list = match template.supports_tools() {
        true => tools
            .active()
            .then(|| serde_json::to_value(&tools.tools).expect("tools serialize")),
        false => {
            messages = default_rendering(messages, tools, state.tool_format);
            None
        }
    };
    let extras = RenderExtras {
        tools: tool_list.as_ref(),
        kwargs,
    };
    let text = template.render_with(&messages, &extras)?;
    Ok(PromptInput::Text {
        text,
        add_special_tokens: false,
    })
}

#[derive(Serialize)]
struct DeltaChoice<'a> {
    index: u32,
    delta: Delta<'a>,
    logprobs: Value,
    finish_reason: Option<&'static str>,
}

/// `{"content": ...}` (with `reasoning_content` and `tool_calls` when parsed), or `{}`.
#[derive(Serialize, Default)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<&'a [Value]>,
}

pub struct ChatFormat {
    head: Head,
    tokenizer: Tokenizer,
    logprobs: bool,
    plan: OutputPlan,
    /// Each choice's output parsers (created as choices first stream).
    outputs: Vec<ChoiceOutput>,
}

fn non_empty(text: &str) -> Option<&str> {
    (!text.is_empty()).then_some(text)
}

/// `tool_calls` when a stopped output made calls.
fn chat_finish_reason(finish: Finish, made_calls: bool) -> &'static str {
    match (finish, made_calls) {
        (Finish::Stop, true) => "tool_calls",
        _ => finish_reason(finish),
    }
}

impl ChatFormat {
    pub fn new(head: Head, tokenizer: Tokenizer, logprobs: bool, plan: OutputPlan) -> Self {
        Self {
            head,
            tokenizer,
            logprobs,
            plan,
            outputs: Vec::new(),
        }
    }

    fn output(&mut self, index: u32) -> &mut ChoiceOutput {
        let i = index as usize;
        while self.outputs.len() <= i {
            self.outputs.push(ChoiceOutput::new(&self.plan));
        }
        &mut self.outputs[i]
    }

    fn logprobs(&self, entries: &[TokenLogprob]) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        let entry = |token: u32, logprob: f64| {
            let text = self.tokenizer.token_text(token);
            let bytes = self.tokenizer.token_bytes(token);
            json!({"token": text, "logprob": logprob, "bytes": bytes})
        };
        let content: Vec<Value> = entries
            .iter()
            .map(|e| {
                let mut v = entry(e.token, e.logprob);
                v["top_logprobs"] = e.top.iter().map(|&(t, lp)| entry(t, lp)).collect();
                v
            })
            .collect();
        json!({ "content": content })
    }
}

impl Format for ChatFormat {
    type View = ();
    fn view(_: &Generation) {}

    fn opening_chunk(&mut self, index: u32) -> Option<Value> {
        let delta = json!({"role": "assistant", "content": ""});
        let choice =
            json!({"index": index, "delta": delta, "logprobs": null, "finish_reason": null});
        Some(self.head.object("chat.completion.chunk", json!([choice])))
    }

    fn chunk(
        &mut self,
        index: u32,
        piece: &Piece,
        finish: Option<Finish>,
        _: &(),
    ) -> Option<String> {
        let logprobs = match finish {
            Some(_) => Value::Null,
            None => self.logprobs(&piece.logprobs),
        };
        if self.plan.is_plain() {
            let choice = DeltaChoice {
                index,
                delta: Delta {
                    content: finish.is_none().then_some(piece.text.as_str()),
                    ..Delta::default()
                },
                logprobs,
                finish_reason: finish.map(finish_reason),
            };
            return Some(self.head.chunk("chat.completion.chunk", choice));
        }
        let output = self.output(index);
        let parts = match finish {
            None => output.push(&piece.text),
            Some(_) => output.finish(),
        };
        if finish.is_none() && parts.is_empty() && piece.logprobs.is_empty() {
            return None; // held back (a marker may be starting)
        }
        let made_calls = output.made_calls();
        let choice = DeltaChoice {
            index,
            delta: Delta {
                content: non_empty(&parts.content),
                reasoning_content: non_empty(&parts.reasoning),
                tool_calls: (!parts.tool_calls.is_empty()).then_some(&parts.tool_calls[..]),
            },
            logprobs,
            finish_reason: finish.map(|f| chat_finish_reason(f, made_calls)),
        };
        Some(self.head.chunk("chat.completion.chunk", choice))
    }

    fn usage_chunk(&self, usage: Usage) -> Option<Value> {
        let chunk = self
            .head
            .with_usage("chat.completion.chunk", json!([]), usage);
        Some(chunk)
    }

    fn choice(&mut self, index: u32, piece: &Piece, finish: Finish, _: &()) -> Value {
        let m = whole_message(&self.plan, &piece.text);
        let calls = !m.tool_calls.is_empty();
        let mut message = json!({"role": "assistant", "content": m.content});
        if calls && m.content.is_empty() {
            message["content"] = Value::Null;
        }
        if let Some(reasoning) = m.reasoning {
            message["reasoning_content"] = json!(reasoning);
        }
        if calls {
            message["tool_calls"] = json!(m.tool_calls);
        }
        json!({
            "index": index,
            "message": message,
            "logprobs": self.logprobs(&piece.logprobs),
            "finish_reason": chat_finish_reason(finish, calls),
        })
    }

    fn complete(&self, choices: Vec<Value>, usage: Usage) -> Value {
        self.head
            .with_usage("chat.completion", Value::Array(choices), usage)
    }
}
