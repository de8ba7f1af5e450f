//! /v1/completions: a raw prompt (text or token ids); chunks in `text_completion` shape.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{json, Value};

use crate::api::generate::{self, Generation, Piece, PromptInput, TokenLogprob};
use crate::api::limits::{Limits, COMPLETIONS_DEFAULT_MAX_TOKENS};
use crate::api::openai::{parse_body, CompletionRequest, Prompt, Usage};
use crate::api::params::{validate, EndpointParams, GenParams};
use crate::api::prepare;
use crate::api::respond::{finish_reason, Choices, Format, Head};
use crate::error::ApiError;
use crate::state::AppState;
use crate::text::tokenizer::Tokenizer;
use crate::worker::protocol::Finish;

/// OpenAI allows at most 5 alternatives here.
const MAX_LOGPROBS: i64 = 5;

/// A completions request made ready to start: its body parsed and checked, its prompts.
pub struct CompletionPlan {
    pub model: String,
    pub echo: bool,
    pub logprobs: bool,
    pub params: GenParams,
    pub prompts: Vec<PromptInput>,
}

/// Everything a completions request needs before it starts; synchronous, so the handler
/// runs it off the async workers (`prepare::off_runtime`).
pub fn prepare(state: &AppState, body: &[u8]) -> Result<CompletionPlan, ApiError> {
    let (req, common) = parse_body::<CompletionRequest>(body)?;
    state.check_model(&req.model)?;
    let endpoint = endpoint_params(&req)?;
    let params = validate(&common, &endpoint, &state.limits, &state.sampling_defaults)?;
    Ok(CompletionPlan {
        echo: req.echo.unwrap_or(false),
        prompts: prompts(req.prompt, &state.limits)?,
        model: req.model,
        logprobs: endpoint.logprobs,
        params,
    })
}

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
        default_max_tokens: Some(COMPLETIONS_DEFAULT_MAX_TOKENS),
        logprobs: req.logprobs.is_some(),
        top_logprobs: top,
    })
}

/// The prompts of a request, in order: one string or token list, or a list of either (of
/// at most `--max-prompts`).
pub fn prompts(prompt: Prompt, limits: &Limits) -> Result<Vec<PromptInput>, ApiError> {
    let text = |text| PromptInput::Text {
        text,
        add_special_tokens: true,
    };
    let prompts: Vec<PromptInput> = match prompt {
        Prompt::Text(t) => vec![text(t)],
        Prompt::Texts(texts) => texts.into_iter().map(text).collect(),
        Prompt::Ids(ids) => vec![PromptInput::Ids(ids)],
        Prompt::IdLists(lists) => lists.into_iter().map(PromptInput::Ids).collect(),
    };
    if prompts.is_empty() {
        return Err(ApiError::invalid("prompt", "`prompt` must not be empty"));
    }
    let max = limits.max_prompts as usize;
    if prompts.len() > max {
        return Err(ApiError::invalid(
            "prompt",
            format!(
                "`prompt` may hold at most {max} prompts (--max-prompts); got {}",
                prompts.len()
            ),
        ));
    }
    Ok(prompts)
}

/// Starts `params.n` generations of each prompt, in choice order, with what to echo.
pub async fn start(
    state: &AppState,
    prompts: Vec<PromptInput>,
    params: &GenParams,
    echo: bool,
) -> Result<(Choices, Vec<Option<Echo>>), ApiError> {
    let mut slots = state
        .admission
        .admit(prompts.len() * params.n as usize)
        .await?;
    // Every prompt is checked before any starts: a bad one sends nothing to a worker.
    let many = prompts.len() > 1;
    let mut prepared = Vec::with_capacity(prompts.len());
    for (i, prompt) in prompts.into_iter().enumerate() {
        let text = match (&prompt, echo) {
            (PromptInput::Text { text, .. }, true) => Some(text.clone()),
            _ => None,
        };
        let checked = prepare::prepare(state, prompt, params.clone()).await;
        let checked = checked.map_err(|e| if many { e.in_prompt(i) } else { e })?;
        prepared.push((text, checked));
    }
    let mut generations = Vec::new();
    let mut echoes = Vec::new();
    for (text, checked) in prepared {
        let copies = generate::start_prepared(state, checked, params.n, &mut slots)?;
        for copy in &copies {
            echoes.push(echo.then(|| {
                Echo {
                    text: text
                        .clone()
                        .unwrap_or_else(|| state.tokenizer.decode_with_specials(copy.prompt_ids())),
                    ids: copy.prompt_ids().to_vec(),
                }
            }));
        }
        generations.extend(copies);
    }
    let n = params.n as usize;
    Ok((Choices { generations, n }, echoes))
}

/// An echoed prompt (`echo`): its text, and its tokens for logprobs.
pub struct Echo {
    pub text: String,
    pub ids: Vec<u32>,
}

pub struct CompletionFormat {
    pub head: Head,
    pub tokenizer: Tokenizer,
    pub logprobs: bool,
    /// Per choice: the prompt to echo before the completion.
    echoes: Vec<Option<Echo>>,
    /// Per choice: characters of text before its next token (`text_offset`).
    offsets: Vec<usize>,
}

#[derive(Serialize)]
struct TextChoice<'a> {
    index: u32,
    text: &'a str,
    logprobs: Value,
    finish_reason: Option<&'static str>,
}

/// The `logprobs` object of one piece: four parallel lists.
#[derive(Default)]
struct LogprobLists {
    tokens: Vec<String>,
    token_logprobs: Vec<Option<f64>>,
    top_logprobs: Vec<Option<BTreeMap<String, f64>>>,
    text_offset: Vec<usize>,
}

impl CompletionFormat {
    pub fn new(
        head: Head,
        tokenizer: Tokenizer,
        logprobs: bool,
        echoes: Vec<Option<Echo>>,
    ) -> Self {
        Self {
            head,
            tokenizer,
            logprobs,
            offsets: vec![0; echoes.len()],
            echoes,
        }
    }

    /// The prompt's tokens have no logprobs here (the worker does not score prompts): each
    /// is listed with a null logprob and null alternatives, as OpenAI does for the first.
    fn echo_lists(&mut self, index: u32, lists: &mut LogprobLists) {
        let Some(echo) = &self.echoes[index as usize] else {
            return;
        };
        for &id in &echo.ids {
            let text = self.tokenizer.token_text(id);
            lists.text_offset.push(self.offsets[index as usize]);
            self.offsets[index as usize] += text.chars().count();
            lists.tokens.push(text);
            lists.token_logprobs.push(None);
            lists.top_logprobs.push(None);
        }
    }

    fn completion_lists(&mut self, index: u32, entries: &[TokenLogprob], lists: &mut LogprobLists) {
        for e in entries {
            let text = self.tokenizer.token_text(e.token);
            lists.text_offset.push(self.offsets[index as usize]);
            self.offsets[index as usize] += text.chars().count();
            lists.tokens.push(text);
            lists.token_logprobs.push(Some(e.logprob));
            let top = e
                .top
                .iter()
                .map(|&(t, lp)| (self.tokenizer.token_text(t), lp))
                .collect();
            lists.top_logprobs.push(Some(top));
        }
    }

    fn render(&self, lists: LogprobLists) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        json!({
            "tokens": lists.tokens,
            "token_logprobs": lists.token_logprobs,
            "top_logprobs": lists.top_logprobs,
            "text_offset": lists.text_offset,
        })
    }

    fn echo_text(&self, index: u32) -> &str {
        self.echoes[index as usize]
            .as_ref()
            .map_or("", |e| e.text.as_str())
    }
}

impl Format for CompletionFormat {
    type View = ();
    fn view(_: &Generation) {}

    fn opening_chunk(&mut self, index: u32) -> Option<Value> {
        self.echoes[index as usize].as_ref()?;
        let mut lists = LogprobLists::default();
        self.echo_lists(index, &mut lists);
        let choice = json!({
            "index": index,
            "text": self.echo_text(index),
            "logprobs": self.render(lists),
            "finish_reason": null,
        });
        Some(self.head.object("text_completion", json!([choice])))
    }

    fn chunk(
        &mut self,
        index: u32,
        piece: &Piece,
        finish: Option<Finish>,
        _: &(),
    ) -> Option<String> {
        let mut lists = LogprobLists::default();
        self.completion_lists(index, &piece.logprobs, &mut lists);
        let choice = TextChoice {
            index,
            text: &piece.text,
            logprobs: self.render(lists),
            finish_reason: finish.map(finish_reason),
        };
        Some(self.head.chunk("text_completion", choice))
    }

    fn usage_chunk(&self, usage: Usage) -> Option<Value> {
        Some(self.head.with_usage("text_completion", json!([]), usage))
    }

    fn choice(&mut self, index: u32, piece: &Piece, finish: Finish, _: &()) -> Value {
        let mut lists = LogprobLists::default();
        self.echo_lists(index, &mut lists);
        self.completion_lists(index, &piece.logprobs, &mut lists);
        json!({
            "index": index,
            "text": format!("{}{}", self.echo_text(index), piece.text),
            "logprobs": self.render(lists),
            "finish_reason": finish_reason(finish),
        })
    }

    fn complete(&self, choices: Vec<Value>, usage: Usage) -> Value {
        self.head
            .with_usage("text_completion", Value::Array(choices), usage)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_in_any_shape_are_accepted() {
        assert!(matches!(
            prompts(Prompt::Texts(vec!["a".into()]), &Limits::default()).unwrap()[..],
            [PromptInput::Text {
                add_special_tokens: true,
                ..
            }]
        ));
        assert!(matches!(
            prompts(
                Prompt::IdLists(vec![vec![1], vec![2, 3]]),
                &Limits::default()
            )
            .unwrap()[..],
            [PromptInput::Ids(_), PromptInput::Ids(_)]
        ));
        assert_eq!(
            prompts(
                Prompt::Texts(vec!["a".into(), "b".into()]),
                &Limits::default()
            )
            .unwrap()
            .len(),
            2
        );
        let err = prompts(Prompt::Texts(vec![]), &Limits::default())
            .err()
            .unwrap();
        assert_eq!(err.body()["error"]["param"], "prompt");
        let two = Limits {
            max_prompts: 2,
            ..Limits::default()
        };
        let err = prompts(Prompt::IdLists(vec![vec![1]; 3]), &two)
            .err()
            .unwrap();
        assert_eq!(
            err.message(),
            "`prompt` may hold at most 2 prompts (--max-prompts); got 3"
        );
    }

    #[test]
    fn logprobs_count_is_bounded() {
        let req = |n| CompletionRequest {
            model: "m".into(),
            prompt: Prompt::Text("p".into()),
            logprobs: Some(n),
            echo: None,
        };
        assert_eq!(endpoint_params(&req(2)).unwrap().top_logprobs, 2);
        assert_eq!(
            endpoint_params(&req(6)).unwrap_err().message(),
            "`logprobs` must be in [0, 5]; got 6"
        );
    }
}
