//! The model's tokenizer (tokenizer.json through the HF `tokenizers` crate). Encoding a long
//! prompt takes milliseconds, so it runs on tokio's blocking pool, never on a runtime thread.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use tokenizers::decoders::DecoderWrapper;

use crate::error::ApiError;

#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    /// Computed once: `get_vocab_size` builds the whole vocabulary map on every call.
    vocab_size: usize,
}

impl Tokenizer {
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| format!("cannot load {}: {e}", path.display()))?;
        Ok(Self {
            vocab_size: inner.get_vocab_size(true),
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

    /// Text of `ids` with special tokens kept (/detokenize, echo of token prompts).
    pub fn decode_with_specials(&self, ids: &[u32]) -> String {
        self.inner.decode(ids, false).unwrap_or_default()
    }

    /// Whether `id` is a special added token (EOS, chat markers): never shown as text.
    pub fn is_special(&self, id: u32) -> bool {
        self.inner
            .get_added_tokens_decoder()
            .get(&id)
            .is_some_and(|t| t.special)
    }

    /// The vocabulary string of one token, as shown in logprobs (`Ġthe`-style for byte-level BPE
    /// is turned into text by decoding the single token; specials keep their name).
    pub fn token_text(&self, id: u32) -> String {
        match self.inner.decode(&[id], false) {
            Ok(text) if !text.is_empty() => text,
            _ => self.inner.id_to_token(id).unwrap_or_default(),
        }
    }

    /// The raw bytes of one token (logprobs' `bytes`): for byte-level BPE the vocabulary string
    /// maps back to bytes exactly, even for a token that holds half a character.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let byte_level = matches!(self.inner.get_decoder(), Some(DecoderWrapper::ByteLevel(_)));
        if let (true, Some(piece)) = (byte_level, self.inner.id_to_token(id)) {
            let table = byte_level_table();
            if let Some(bytes) = piece.chars().map(|c| table.get(&c).copied()).collect() {
                return bytes;
            }
        }
        self.token_text(id).into_bytes()
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }
}

/// GPT-2's byte-level alphabet, inverted: the char that stands for each byte -> the byte.
fn byte_level_table() -> &'static HashMap<char, u8> {
    static TABLE: OnceLock<HashMap<char, u8>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut shifted = 0u32;
        (0..=255u8)
            .map(|b| {
                if printable(b) {
                    (char::from(b), b)
                } else {
                    shifted += 1;
                    (char::from_u32(255 + shifted).expect("valid char"), b)
                }
            })
            .collect()
    })
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
        assert!(tok.is_special(2));
        assert!(!tok.is_special(ids[2]));
    }

    #[test]
    fn token_bytes_are_exact_even_for_half_characters() {
        let tok = tiny();
        let text = "日本 🎉 café";
        let ids = tok.encode_blocking(text, false);
        let bytes: Vec<u8> = ids.iter().flat_map(|&t| tok.token_bytes(t)).collect();
        assert_eq!(bytes, text.as_bytes());
        assert_eq!(tok.token_bytes(2), b"<|im_end|>");
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
