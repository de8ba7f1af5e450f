//! Incremental detokenization (the vLLM scheme).
//!
//! Decoding one token alone is wrong for byte-level BPE (a character may span tokens) and
//! for tokenizers whose decoders look at neighbours (leading spaces). So each step decodes a
//! short window twice: `ids[prefix_offset..read_offset]` (text already shown, re-decoded as
//! context) and `ids[prefix_offset..]`; the new text is the difference. While the window's
//! text ends in U+FFFD the last character is incomplete, so nothing is shown until the next
//! token completes it. Special tokens are skipped.

use crate::text::tokenizer::Tokenizer;

#[derive(Debug, Default)]
pub struct IncrementalDecoder {
    ids: Vec<u32>,
    /// Start of the context window (already shown text, decoded again for context).
    prefix_offset: usize,
    /// End of what has been shown.
    read_offset: usize,
}

impl IncrementalDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one token; returns the text it completes (often empty, never broken UTF-8).
    pub fn step(&mut self, tokenizer: &Tokenizer, token: u32) -> String {
        self.ids.push(token);
        let shown = tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset]);
        let full = tokenizer.decode(&self.ids[self.prefix_offset..]);
        if full.ends_with('\u{FFFD}') {
            return String::new();
        }
        let Some(new_text) = full.get(shown.len()..).filter(|_| full.starts_with(&shown)) else {
            // The context decoded differently once extended: show nothing new this step,
            // the window stays put and the next step compares again.
            return String::new();
        };
        let new_text = new_text.to_string();
        if !new_text.is_empty() {
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
        }
        new_text
    }

    /// The request is over: whatever is still held back (a dangling partial character).
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> String {
        let shown = tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset]);
        let full = tokenizer.decode(&self.ids[self.prefix_offset..]);
        self.prefix_offset = self.ids.len();
        self.read_offset = self.ids.len();
        match full.strip_prefix(shown.as_str()) {
            Some(rest) => rest.to_string(),
            None => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::tokenizer::tests::tiny;

    fn stream(tok: &Tokenizer, ids: &[u32]) -> String {
        let mut d = IncrementalDecoder::new();
        let mut out: String = ids.iter().map(|&t| d.step(tok, t)).collect();
        out.push_str(&d.finish(tok));
        out
    }

    #[test]
    fn multibyte_characters_split_across_tokens_come_out_whole() {
        let tok = tiny();
        let text = "emoji 🎉🚀 and 日本語のテキスト, café";
        let ids = tok.encode_blocking(text, false);
        let mut d = IncrementalDecoder::new();
        for &t in &ids {
            let piece = d.step(&tok, t);
            assert!(!piece.contains('\u{FFFD}'), "broken piece {piece:?}");
        }
        assert_eq!(stream(&tok, &ids), text);
    }

    #[test]
    fn special_tokens_are_skipped() {
        let tok = tiny();
        let ids = tok.encode_blocking("Hello<|im_end|> world", false);
        assert_eq!(stream(&tok, &ids), "Hello world");
    }

    /// xorshift64*: deterministic random numbers, no extra dependency.
    fn rng(mut state: u64) -> impl FnMut() -> u64 {
        move || {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
    }

    /// The default model's tokenizer (49152 tokens), when this machine has converted it.
    fn default_model_tokenizer() -> Option<Tokenizer> {
        let home = std::env::var("HOME").ok()?;
        let path =
            std::path::Path::new(&home).join(".cache/minisgl/SmolLM2-135M-Instruct/tokenizer.json");
        Tokenizer::from_file(&path).ok()
    }

    #[test]
    fn real_vocabulary_random_sequences_stream_losslessly() {
        let Some(tok) = default_model_tokenizer() else {
            eprintln!("skipped: the default model is not converted on this machine");
            return;
        };
        let mut next = rng(42);
        let vocab = tok.vocab_size() as u64;
        for _ in 0..200 {
            let len = (next() % 30) as usize;
            let ids: Vec<u32> = (0..len).map(|_| (next() % vocab) as u32).collect();
            assert_eq!(stream(&tok, &ids), tok.decode(&ids), "ids {ids:?}");
        }
        let text = "Ünïcödé 日本語 🎉 — “quotes” and code: fn main() {}";
        assert_eq!(stream(&tok, &tok.encode_blocking(text, false)), text);
    }

    /// Property: for random token sequences (including ones that cut characters in half and
    /// never complete them), the streamed pieces concatenate to the decode of the whole.
    #[test]
    fn streamed_pieces_equal_whole_decode_for_random_sequences() {
        let tok = tiny();
        let vocab = tok.vocab_size() as u64;
        let mut next = rng(0x9E37_79B9_7F4A_7C15);
        for _ in 0..300 {
            let len = (next() % 40) as usize;
            let ids: Vec<u32> = (0..len).map(|_| (next() % vocab) as u32).collect();
            assert_eq!(stream(&tok, &ids), tok.decode(&ids), "ids {ids:?}");
        }
    }
}
