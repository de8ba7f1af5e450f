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

/// Runs a request's synchronous preparation (the body parsed, schemas compiled, the chat
/// template rendered) on tokio's blocking pool: a large body or schema costs milliseconds,
/// and an async worker that spends them stalls every stream it serves.
pub async fn off_runtime<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::Internal(format!("request preparation failed: {e}")))?
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

    #[tokio::test]
    async fn preparation_runs_off_the_runtime_and_a_panic_in_it_is_a_500() {
        let here = std::thread::current().id();
        let there = off_runtime(|| Ok(std::thread::current().id())).await;
        assert_ne!(there, Ok(here));
        let refused = off_runtime(|| Err::<(), _>(ApiError::invalid("n", "too many"))).await;
        assert_eq!(refused, Err(ApiError::invalid("n", "too many")));
        let panicked = off_runtime(|| -> Result<(), ApiError> { panic!("bad schema") }).await;
        let err = panicked.unwrap_err();
        assert_eq!(err.status(), axum::http::StatusCode::INTERNAL_SERVER_ERROR);
        assert!(err.message().contains("bad schema"), "{}", err.message());
    }
}
