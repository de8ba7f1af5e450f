//! The model's tokenizer (tokenizer.json through the HF `tokenizers` crate). Encoding a long
//! prompt takes milliseconds, so it runs on tokio's blocking pool, never on a runtime thread.

use std::path::Path;
use std::sync::Arc;

use crate::error::ApiError;

#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
}

impl Tokenizer {
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| format!("cannot load {}: {e}", path.display()))?;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// Chat prompts come out of the template with their special tokens already in place, so
    /// they are encoded with `add_special_tokens = false`; plain completions with `true`.
    pub async fn encode(
        &self,
        text: String,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, ApiError> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || inner.encode_fast(text, add_special_tokens))
            .await
            .map_err(|e| ApiError::Internal(format!("tokenizer task failed: {e}")))?
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|e| ApiError::Internal(format!("cannot tokenize the prompt: {e}")))
    }

    pub fn encode_blocking(&self, text: &str, add_special_tokens: bool) -> Vec<u32> {
        self.inner
            .encode_fast(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .unwrap_or_default()
    }

    /// Text of `ids`, special tokens left out (the detokenizer's view).
    pub fn decode(&self, ids: &[u32]) -> String {
        self.inner.decode(ids, true).unwrap_or_default()
    }

    /// The vocabulary string of one token, as shown in logprobs (`Ġthe`-style for byte-level BPE
    /// is turned into text by decoding the single token; specials keep their name).
    pub fn token_text(&self, id: u32) -> String {
        match self.inner.decode(&[id], false) {
            Ok(text) if !text.is_empty() => text,
            _ => self.inner.id_to_token(id).unwrap_or_default(),
        }
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn tiny_model_dir() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny-model")
    }

    pub fn tiny() -> Tokenizer {
        Tokenizer::from_file(&tiny_model_dir().join("tokenizer.json")).unwrap()
    }

    #[tokio::test]
    async fn round_trips_text() {
        let tok = tiny();
        let text = "The capital of France is Paris. 日本語 🎉";
        let ids = tok.encode(text.to_string(), false).await.unwrap();
        assert!(ids.len() > 3);
        assert_eq!(tok.decode(&ids), text);
    }

    #[tokio::test]
    async fn special_tokens_are_recognised_and_skipped_in_decode() {
        let tok = tiny();
        let ids = tok
            .encode("<|im_start|>user\nhi<|im_end|>".into(), false)
            .await
            .unwrap();
        assert_eq!(ids[0], 1);
        assert_eq!(ids.last(), Some(&2));
        assert_eq!(tok.decode(&ids), "user\nhi");
        assert_eq!(tok.token_text(2), "<|im_end|>");
    }

    #[test]
    fn missing_file_is_a_clear_error() {
        let err = Tokenizer::from_file(Path::new("/nonexistent/tokenizer.json"))
            .err()
            .unwrap();
        assert!(
            err.starts_with("cannot load /nonexistent/tokenizer.json"),
            "{err}"
        );
    }
}
