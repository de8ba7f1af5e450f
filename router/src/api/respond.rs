//! Turning generations into a response: one JSON body, or an SSE stream of chunks
//! (`data: {json}`), ending with the finish chunk, the usage chunk when asked, `data: [DONE]`.
//! This is the one SSE loop; `Format` is what differs between /v1/chat/completions,
//! /v1/completions and /generate.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Json, Response};
use futures::future::join_all;
use futures::stream::{select_all, StreamExt};
use serde::Serialize;
use serde_json::{json, Value};

use crate::api::generate::{collect, Generation, Piece, Update};
use crate::api::openai::Usage;
use crate::error::ApiError;
use crate::state::unix_now;
use crate::worker::protocol::Finish;

pub trait Format: Send + 'static {
    /// What a chunk reads off its generation besides the piece, taken as each update
    /// arrives (the stream owns the generations): `()` for OpenAI's chunks, the token ids
    /// so far for /generate's.
    type View: Send + 'static;
    fn view(generation: &Generation) -> Self::View;
    /// What opens choice `index`'s stream, if anything (chat's `role`, an echoed prompt).
    fn opening_chunk(&mut self, index: u32) -> Option<Value>;
    /// A streamed chunk of choice `index` (a piece of text, or the finish), serialized: it is
    /// the per-token hot path, so it is written straight from borrowed fields. None: nothing
    /// to send for this piece (chat holds back text that may start a tool call).
    fn chunk(
        &mut self,
        index: u32,
        piece: &Piece,
        finish: Option<Finish>,
        view: &Self::View,
    ) -> Option<String>;
    /// The chunk that closes a stream asked for with `include_usage`; None for a format
    /// whose every chunk carries its usage.
    fn usage_chunk(&self, usage: Usage) -> Option<Value>;
    /// Choice `index` of a complete (non-streamed) response.
    fn choice(&mut self, index: u32, piece: &Piece, finish: Finish, view: &Self::View) -> Value;
    /// The complete response around its choices.
    fn complete(&self, choices: Vec<Value>, usage: Usage) -> Value;
}

pub fn finish_reason(finish: Finish) -> &'static str {
    match finish {
        Finish::Stop => "stop",
        Finish::Length => "length",
    }
}

/// The generations of one response: `n` copies of each prompt, in choice order (prompt-major,
/// as OpenAI numbers choices). Usage counts each prompt once and every completion.
pub struct Choices {
    pub generations: Vec<Generation>,
    pub n: usize,
}

fn total_usage(usages: &[Usage], n: usize) -> Usage {
    let mut total = Usage::default();
    for (i, u) in usages.iter().enumerate() {
        if i % n == 0 {
            total.prompt_tokens += u.prompt_tokens;
            total.prompt_tokens_details.cached_tokens += u.prompt_tokens_details.cached_tokens;
        }
        total.completion_tokens += u.completion_tokens;
    }
    total.total_tokens = total.prompt_tokens + total.completion_tokens;
    total
}

pub async fn respond<F: Format>(
    choices: Choices,
    mut format: F,
    stream: bool,
    include_usage: bool,
) -> Result<Response, ApiError> {
    let Choices { mut generations, n } = choices;
    if !stream {
        let results = join_all(generations.iter_mut().map(collect)).await;
        let mut body = Vec::with_capacity(results.len());
        for (i, result) in results.into_iter().enumerate() {
            let (piece, finish) = result?;
            let view = F::view(&generations[i]);
            body.push(format.choice(i as u32, &piece, finish, &view));
        }
        let usages: Vec<Usage> = generations.iter().map(Generation::usage).collect();
        return Ok(Json(format.complete(body, total_usage(&usages, n))).into_response());
    }
    let mut usages = vec![Usage::default(); generations.len()];
    let mut merged = select_all(generations.into_iter().enumerate().map(|(i, g)| {
        Box::pin(futures::stream::unfold(g, move |mut g| async move {
            let update = g.next().await?;
            Some(((i as u32, update, g.usage(), F::view(&g)), g))
        }))
    }));
    // Wait for the first update so that a request the worker refuses is an HTTP error, not
    // a 200 followed by an error event.
    let first = match merged.next().await {
        Some((_, Err(e), _, _)) => return Err(e),
        other => other,
    };
    let count = usages.len() as u32;
    let events = async_stream::stream! {
        for index in 0..count {
            if let Some(opening) = format.opening_chunk(index) {
                yield data(&opening);
            }
        }
        let mut item = first;
        while let Some((index, update, usage, view)) = item.take() {
            match update {
                Ok(Update::Piece(piece)) => {
                    if let Some(chunk) = format.chunk(index, &piece, None, &view) {
                        yield text(chunk);
                    }
                }
                Ok(Update::Finished(finish)) => {
                    usages[index as usize] = usage;
                    if let Some(chunk) = format.chunk(index, &Piece::default(), Some(finish), &view) {
                        yield text(chunk);
                    }
                }
                Err(e) => {
                    // Its prompt and the tokens it streamed count as a finish's would.
                    usages[index as usize] = usage;
                    yield data(&e.body());
                }
            }
            item = merged.next().await;
        }
        let usage_chunk = match include_usage {
            true => format.usage_chunk(total_usage(&usages, n)),
            false => None,
        };
        if let Some(chunk) = usage_chunk {
            yield data(&chunk);
        }
        yield Ok::<Event, Infallible>(Event::default().data("[DONE]"));
    };
    Ok(Sse::new(events).into_response())
}

fn data(value: &Value) -> Result<Event, Infallible> {
    text(value.to_string())
}

fn text(json: String) -> Result<Event, Infallible> {
    Ok(Event::default().data(json))
}

/// A streamed object with one choice, serialized from borrowed fields (no `Value` tree).
#[derive(Serialize)]
struct ChunkRef<'a, C> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [C; 1],
}

/// The common head of every response object.
pub struct Head {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Head {
    /// A fresh head; ids are unique within this router (creation time and a counter).
    pub fn new(prefix: &str, model: &str) -> Self {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let created = unix_now();
        Self {
            id: format!("{prefix}-{created:x}{n:08x}"),
            created,
            model: model.to_string(),
        }
    }

    pub fn object(&self, object: &str, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    /// A streamed chunk with one choice, serialized.
    pub fn chunk<C: Serialize>(&self, object: &'static str, choice: C) -> String {
        let chunk = ChunkRef {
            id: &self.id,
            object,
            created: self.created,
            model: &self.model,
            choices: [choice],
        };
        serde_json::to_string(&chunk).expect("chunks always serialize")
    }

    pub fn with_usage(&self, object: &str, choices: Value, usage: Usage) -> Value {
        let mut value = self.object(object, choices);
        value["usage"] = json!(usage);
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_renders_openai_fields() {
        let head = Head::new("chatcmpl", "m");
        assert_ne!(head.id, Head::new("chatcmpl", "m").id);
        let v = head.with_usage("chat.completion", json!([]), Usage::new(3, 2, 1));
        assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
        assert_eq!(v["model"], "m");
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["usage"]["total_tokens"], 5);
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 1);
        assert_eq!(finish_reason(Finish::Length), "length");
    }

    #[test]
    fn usage_counts_each_prompt_once() {
        // Two prompts (5 and 7 tokens) with n = 2.
        let usages = [
            Usage::new(5, 3, 4),
            Usage::new(5, 2, 4),
            Usage::new(7, 1, 0),
            Usage::new(7, 6, 0),
        ];
        assert_eq!(total_usage(&usages, 2), Usage::new(12, 12, 4));
    }
}
