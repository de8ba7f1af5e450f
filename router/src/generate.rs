//! One generation from the HTTP side: tokenize, fit to the context, pick a worker, submit;
//! then turn the worker's token outputs into text pieces (incremental detokenization, stop
//! strings) and a finish reason. Dropping a `Generation` early aborts it on the worker.

use std::collections::VecDeque;

use crate::detokenize::IncrementalDecoder;
use crate::error::ApiError;
use crate::openai::Usage;
use crate::params::GenParams;
use crate::state::AppState;
use crate::stop::StopMatcher;
use crate::tokenizer::Tokenizer;
use crate::worker::protocol::{Finish, TokenOutput};
use crate::worker::{Event, RequestStream};

pub enum PromptInput {
    Text {
        text: String,
        add_special_tokens: bool,
    },
    Ids(Vec<u32>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f64,
    /// The most likely alternatives, most likely first.
    pub top: Vec<(u32, f64)>,
}

/// Text that can be shown now, with the logprobs of the tokens that produced it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Piece {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
}

#[derive(Debug, PartialEq)]
pub enum Update {
    Piece(Piece),
    Finished(Finish),
}

pub struct Generation {
    request: Option<RequestStream>,
    tokenizer: Tokenizer,
    decoder: IncrementalDecoder,
    stop: StopMatcher,
    queue: VecDeque<Update>,
    prompt_tokens: u32,
    completion_tokens: u32,
    cached_tokens: u32,
}

pub async fn start(
    state: &AppState,
    prompt: PromptInput,
    mut params: GenParams,
) -> Result<Generation, ApiError> {
    let input_ids = match prompt {
        PromptInput::Text {
            text,
            add_special_tokens,
        } => state.tokenizer.encode(text, add_special_tokens).await?,
        PromptInput::Ids(ids) => check_ids(ids, state.tokenizer.vocab_size())?,
    };
    params.fit_to_context(input_ids.len(), state.max_context()?)?;
    let prompt_tokens = input_ids.len() as u32;
    let request = state
        .pick_worker(&input_ids)?
        .submit(input_ids, params.sampling)?;
    Ok(Generation {
        request: Some(request),
        tokenizer: state.tokenizer.clone(),
        decoder: IncrementalDecoder::new(),
        stop: StopMatcher::new(params.stops),
        queue: VecDeque::new(),
        prompt_tokens,
        completion_tokens: 0,
        cached_tokens: 0,
    })
}

fn check_ids(ids: Vec<u32>, vocab_size: usize) -> Result<Vec<u32>, ApiError> {
    match ids.iter().find(|&&t| t as usize >= vocab_size) {
        Some(t) => Err(ApiError::invalid(
            "prompt",
            format!("token id {t} is outside the vocabulary of {vocab_size}"),
        )),
        None => Ok(ids),
    }
}

impl Generation {
    /// The next piece of text or the finish; None once finished; an error ends it.
    pub async fn next(&mut self) -> Option<Result<Update, ApiError>> {
        loop {
            if let Some(update) = self.queue.pop_front() {
                return Some(Ok(update));
            }
            let event = self.request.as_mut()?.next().await;
            match event {
                Some(Event::Token(out)) => self.on_token(out),
                Some(Event::Failed(e)) => {
                    self.request = None;
                    return Some(Err(e));
                }
                None => {
                    self.request = None;
                    return Some(Err(ApiError::Internal(
                        "the worker dropped the request".into(),
                    )));
                }
            }
        }
    }

    pub fn usage(&self) -> Usage {
        Usage::new(
            self.prompt_tokens,
            self.completion_tokens,
            self.cached_tokens,
        )
    }

    fn on_token(&mut self, out: TokenOutput) {
        self.completion_tokens += 1;
        self.cached_tokens = out.cached_tokens;
        let mut piece = Piece::default();
        // A `stop` finish token is EOS or a stop token id: never shown as text.
        if out.finish != Some(Finish::Stop) {
            piece.text = self.decoder.step(&self.tokenizer, out.token);
            if let Some(logprob) = out.logprob {
                let top = out.top_logprobs.unwrap_or_default();
                piece.logprobs.push(TokenLogprob {
                    token: out.token,
                    logprob,
                    top,
                });
            }
        }
        if out.finish.is_some() {
            piece.text.push_str(&self.decoder.finish(&self.tokenizer));
        }
        let outcome = self.stop.push(&piece.text);
        piece.text = outcome.text;
        let finish = if outcome.stopped {
            if let Some(request) = self.request.take() {
                request.abort();
            }
            Some(Finish::Stop)
        } else if let Some(finish) = out.finish {
            piece.text.push_str(&self.stop.flush());
            self.request = None;
            Some(finish)
        } else {
            None
        };
        if !piece.text.is_empty() || !piece.logprobs.is_empty() {
            self.queue.push_back(Update::Piece(piece));
        }
        if let Some(finish) = finish {
            self.queue.push_back(Update::Finished(finish));
        }
    }
}

/// Runs a generation to its end: (text, logprobs, finish).
pub async fn collect(generation: &mut Generation) -> Result<(Piece, Finish), ApiError> {
    let mut all = Piece::default();
    while let Some(update) = generation.next().await {
        match update? {
            Update::Piece(piece) => {
                all.text.push_str(&piece.text);
                all.logprobs.extend(piece.logprobs);
            }
            Update::Finished(finish) => return Ok((all, finish)),
        }
    }
    Err(ApiError::Internal(
        "the generation ended without a finish reason".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_ids_outside_the_vocabulary_are_refused() {
        assert_eq!(check_ids(vec![1, 2], 10), Ok(vec![1, 2]));
        let err = check_ids(vec![1, 10], 10).unwrap_err();
        assert_eq!(err.message(), "token id 10 is outside the vocabulary of 10");
    }
    // The streaming behaviour (stop strings, aborts, EOS) is tested end to end over a fake
    // worker in server_tests.rs.
}
