//! Text <-> token ids: the model's tokenizer, its chat template, the incremental
//! detokenizer and the stop-string matcher that run on every generated token.

pub mod chat_template;
pub mod detokenize;
pub mod markers;
pub mod pyjson;
pub mod reasoning;
pub mod stop;
pub mod tokenizer;
pub mod tool_calls;
