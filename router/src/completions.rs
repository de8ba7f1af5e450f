//! /v1/completions: a raw prompt (text or token ids); chunks in `text_completion` shape.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::error::ApiError;
use crate::generate::{Piece, PromptInput, TokenLogprob};
use crate::openai::{CompletionRequest, Prompt, Usage};
use crate::params::EndpointParams;
use crate::respond::{finish_reason, Format, Head};
use crate::tokenizer::Tokenizer;
use crate::worker::protocol::Finish;

/// OpenAI allows at most 5 alternatives here.
const MAX_LOGPROBS: i64 = 5;

pub fn endpoint_params(req: &CompletionRequest) -> Result<EndpointParams, ApiError> {
    let top = req.logprobs.unwrap_or(0);
    if !(0..=MAX_LOGPROBS).contains(&top) {
        return Err(ApiError::invalid(
            "logprobs",
            format!("`logprobs` must be in [0, {MAX_LOGPROBS}]; got {top}"),
        ));
    }
    Ok(EndpointParams {
        max_completion_tokens: None,
        logprobs: req.logprobs.is_some(),
        top_logprobs: top,
    })
}

pub fn prompt(prompt: Prompt) -> Result<PromptInput, ApiError> {
    let several = || {
        ApiError::invalid(
            "prompt",
            "several prompts in one request are not supported yet; send one",
        )
    };
    Ok(match prompt {
        Prompt::Text(text) => PromptInput::Text {
            text,
            add_special_tokens: true,
        },
        Prompt::Texts(mut texts) if texts.len() == 1 => PromptInput::Text {
            text: texts.remove(0),
            add_special_tokens: true,
        },
        Prompt::Ids(ids) => PromptInput::Ids(ids),
        Prompt::IdLists(mut lists) if lists.len() == 1 => PromptInput::Ids(lists.remove(0)),
        Prompt::Texts(_) | Prompt::IdLists(_) => return Err(several()),
    })
}

pub struct CompletionFormat {
    pub head: Head,
    pub tokenizer: Tokenizer,
    pub logprobs: bool,
    /// Characters of completion text before the next token (`text_offset`).
    offset: usize,
}

impl CompletionFormat {
    pub fn new(head: Head, tokenizer: Tokenizer, logprobs: bool) -> Self {
        Self {
            head,
            tokenizer,
            logprobs,
            offset: 0,
        }
    }

    fn logprobs(&mut self, entries: &[TokenLogprob]) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        let mut tokens = Vec::new();
        let mut offsets = Vec::new();
        for e in entries {
            let text = self.tokenizer.token_text(e.token);
            offsets.push(self.offset);
            self.offset += text.len();
            tokens.push(text);
        }
        let top: Vec<BTreeMap<String, f64>> = entries
            .iter()
            .map(|e| {
                e.top
                    .iter()
                    .map(|&(t, lp)| (self.tokenizer.token_text(t), lp))
                    .collect()
            })
            .collect();
        json!({
            "tokens": tokens,
            "token_logprobs": entries.iter().map(|e| e.logprob).collect::<Vec<_>>(),
            "top_logprobs": top,
            "text_offset": offsets,
        })
    }
}

impl Format for CompletionFormat {
    fn opening_chunk(&mut self) -> Option<Value> {
        None
    }

    fn chunk(&mut self, piece: &Piece, finish: Option<Finish>) -> Value {
        let choice = json!({
            "index": 0,
            "text": piece.text,
            "logprobs": self.logprobs(&piece.logprobs),
            "finish_reason": finish.map(finish_reason),
        });
        self.head.object("text_completion", json!([choice]))
    }

    fn usage_chunk(&self, usage: Usage) -> Value {
        self.head.with_usage("text_completion", json!([]), usage)
    }

    fn complete(&mut self, piece: &Piece, finish: Finish, usage: Usage) -> Value {
        let choice = json!({
            "index": 0,
            "text": piece.text,
            "logprobs": self.logprobs(&piece.logprobs),
            "finish_reason": finish_reason(finish),
        });
        self.head
            .with_usage("text_completion", json!([choice]), usage)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_prompts_in_any_shape_are_accepted() {
        assert!(matches!(
            prompt(Prompt::Texts(vec!["a".into()])),
            Ok(PromptInput::Text {
                add_special_tokens: true,
                ..
            })
        ));
        assert!(matches!(
            prompt(Prompt::IdLists(vec![vec![1]])),
            Ok(PromptInput::Ids(_))
        ));
        let err = prompt(Prompt::Texts(vec!["a".into(), "b".into()]))
            .err()
            .unwrap();
        assert_eq!(err.body()["error"]["param"], "prompt");
    }

    #[test]
    fn logprobs_count_is_bounded() {
        let req = |n| CompletionRequest {
            model: "m".into(),
            prompt: Prompt::Text("p".into()),
            logprobs: Some(n),
        };
        assert_eq!(endpoint_params(&req(2)).unwrap().top_logprobs, 2);
        assert_eq!(
            endpoint_params(&req(6)).unwrap_err().message(),
            "`logprobs` must be in [0, 5]; got 6"
        );
    }
}
