//! A prompt made ready to start: tokenized, its token ids and the sampling's checked
//! against the vocabulary, its parameters fitted to the context. Nothing has reached a
//! worker yet, so a batch checks all its prompts before it starts any.

use std::sync::Arc;
use std::time::Instant;

use crate::api::generate::PromptInput;
use crate::api::params::GenParams;
use crate::error::ApiError;
use crate::state::AppState;

/// A prompt tokenized and checked, its parameters fitted to the context: nothing has
/// reached a worker yet (a batch checks all its prompts before it starts any).
pub struct Prepared {
    pub prompt_ids: Arc<Vec<u32>>,
    pub params: GenParams,
    pub started: Instant,
}

pub async fn prepare(
    state: &AppState,
    prompt: PromptInput,
    mut params: GenParams,
) -> Result<Prepared, ApiError> {
    let started = Instant::now();
    let vocab_size = state.tokenizer.vocab_size();
    let input_ids = match prompt {
        PromptInput::Text {
            text,
            add_special_tokens,
        } => state.tokenizer.encode(text, add_special_tokens).await?,
        PromptInput::Ids(ids) => check_ids(ids, vocab_size)?,
    };
    let bias = params.sampling.logit_bias.iter().map(|&(t, _)| t);
    check_tokens("logit_bias", bias, vocab_size)?;
    let stop_ids = params.sampling.stop_token_ids.iter().copied();
    check_tokens("stop_token_ids", stop_ids, vocab_size)?;
    params.fit_to_context(input_ids.len(), state.max_context()?)?;
    Ok(Prepared {
        prompt_ids: Arc::new(input_ids),
        params,
        started,
    })
}

fn check_ids(ids: Vec<u32>, vocab_size: usize) -> Result<Vec<u32>, ApiError> {
    check_tokens("prompt", ids.iter().copied(), vocab_size)?;
    Ok(ids)
}

/// The first of `ids` outside the vocabulary, as a 400 naming `field`.
pub fn check_tokens(
    field: &str,
    mut ids: impl Iterator<Item = u32>,
    vocab_size: usize,
) -> Result<(), ApiError> {
    match ids.find(|&t| t as usize >= vocab_size) {
        Some(t) => Err(ApiError::invalid(
            field,
            format!("token id {t} is outside the vocabulary of {vocab_size}"),
        )),
        None => Ok(()),
    }
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
}
