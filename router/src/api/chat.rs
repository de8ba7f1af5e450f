//! /v1/chat/completions: messages -> chat template -> prompt; chunks in `chat.completion` shape.

use serde::Serialize;
use serde_json::{json, Value};

use crate::api::generate::{Generation, Piece, PromptInput, TokenLogprob};
use crate::api::openai::{ChatMessage, ChatRequest, Content, Usage};
use crate::api::params::EndpointParams;
use crate::api::respond::{finish_reason, Format, Head};
use crate::error::ApiError;
use crate::state::AppState;
use crate::text::chat_template::TemplateMessage;
use crate::text::tokenizer::Tokenizer;
use crate::worker::protocol::Finish;

const ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

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

/// Renders the conversation with the model's chat template.
pub fn prompt(state: &AppState, messages: &[ChatMessage]) -> Result<PromptInput, ApiError> {
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
    let messages = messages
        .iter()
        .enumerate()
        .map(flatten)
        .collect::<Result<Vec<_>, _>>()?;
    let text = template.render(&messages)?;
    Ok(PromptInput::Text {
        text,
        add_special_tokens: false,
    })
}

fn flatten((i, message): (usize, &ChatMessage)) -> Result<TemplateMessage, ApiError> {
    if !ROLES.contains(&message.role.as_str()) {
        return Err(ApiError::invalid(
            "messages",
            format!(
                "`messages[{i}].role` must be one of {ROLES:?}; got {:?}",
                message.role
            ),
        ));
    }
    let content = match &message.content {
        None => String::new(),
        Some(Content::Text(text)) => text.clone(),
        Some(Content::Parts(parts)) => {
            let mut text = String::new();
            for part in parts {
                match (part.kind.as_str(), &part.text) {
                    ("text", Some(t)) => text.push_str(t),
                    (kind, _) => {
                        return Err(ApiError::invalid(
                            "messages",
                            format!(
                            "`messages[{i}].content`: only text parts are supported; got `{kind}`"
                        ),
                        ))
                    }
                }
            }
            text
        }
    };
    Ok(TemplateMessage {
        role: message.role.clone(),
        content,
        name: message.name.clone(),
        tool_call_id: message.tool_call_id.clone(),
    })
}

#[derive(Serialize)]
struct DeltaChoice<'a> {
    index: u32,
    delta: Delta<'a>,
    logprobs: Value,
    finish_reason: Option<&'static str>,
}

/// `{"content": ...}`, or `{}` in the finish chunk.
#[derive(Serialize)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
}

pub struct ChatFormat {
    pub head: Head,
    pub tokenizer: Tokenizer,
    pub logprobs: bool,
}

impl ChatFormat {
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

    fn chunk(&mut self, index: u32, piece: &Piece, finish: Option<Finish>, _: &()) -> String {
        let (content, logprobs) = match finish {
            Some(_) => (None, Value::Null),
            None => (Some(piece.text.as_str()), self.logprobs(&piece.logprobs)),
        };
        let choice = DeltaChoice {
            index,
            delta: Delta { content },
            logprobs,
            finish_reason: finish.map(finish_reason),
        };
        self.head.chunk("chat.completion.chunk", choice)
    }

    fn usage_chunk(&self, usage: Usage) -> Option<Value> {
        let chunk = self
            .head
            .with_usage("chat.completion.chunk", json!([]), usage);
        Some(chunk)
    }

    fn choice(&mut self, index: u32, piece: &Piece, finish: Finish, _: &()) -> Value {
        json!({
            "index": index,
            "message": {"role": "assistant", "content": piece.text},
            "logprobs": self.logprobs(&piece.logprobs),
            "finish_reason": finish_reason(finish),
        })
    }

    fn complete(&self, choices: Vec<Value>, usage: Usage) -> Value {
        self.head
            .with_usage("chat.completion", Value::Array(choices), usage)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::openai::ContentPart;

    fn message(role: &str, content: Option<Content>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content,
            name: None,
            tool_call_id: None,
        }
    }

    #[test]
    fn text_parts_are_joined_and_other_parts_refused() {
        let parts = vec![
            ContentPart {
                kind: "text".into(),
                text: Some("a".into()),
            },
            ContentPart {
                kind: "text".into(),
                text: Some("b".into()),
            },
        ];
        let m = flatten((0, &message("user", Some(Content::Parts(parts))))).unwrap();
        assert_eq!(m.content, "ab");
        let image = vec![ContentPart {
            kind: "image_url".into(),
            text: None,
        }];
        let err = flatten((1, &message("user", Some(Content::Parts(image))))).unwrap_err();
        assert_eq!(
            err.message(),
            "`messages[1].content`: only text parts are supported; got `image_url`"
        );
    }

    #[test]
    fn unknown_roles_are_refused() {
        let err = flatten((0, &message("wizard", None))).unwrap_err();
        assert!(
            err.message()
                .starts_with("`messages[0].role` must be one of"),
            "{}",
            err.message()
        );
    }
}
