//! Turning a `Generation` into OpenAI's responses: one JSON body, or an SSE stream of chunks
//! (`data: {json}`), ending with the finish chunk, the usage chunk when asked, `data: [DONE]`.
//! `Format` is what differs between /v1/chat/completions and /v1/completions.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Json, Response};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::generate::{collect, Generation, Piece, Update};
use crate::openai::Usage;
use crate::state::unix_now;
use crate::worker::protocol::Finish;

pub trait Format: Send + 'static {
    /// The chunk that opens a stream, if the endpoint has one (chat's `role`).
    fn opening_chunk(&mut self) -> Option<Value>;
    /// A streamed chunk: a piece of text, or the finish.
    fn chunk(&mut self, piece: &Piece, finish: Option<Finish>) -> Value;
    fn usage_chunk(&self, usage: Usage) -> Value;
    fn complete(&mut self, piece: &Piece, finish: Finish, usage: Usage) -> Value;
}

pub fn finish_reason(finish: Finish) -> &'static str {
    match finish {
        Finish::Stop => "stop",
        Finish::Length => "length",
    }
}

pub async fn respond<F: Format>(
    mut generation: Generation,
    mut format: F,
    stream: bool,
    include_usage: bool,
) -> Result<Response, ApiError> {
    if !stream {
        let (piece, finish) = collect(&mut generation).await?;
        return Ok(Json(format.complete(&piece, finish, generation.usage())).into_response());
    }
    // Wait for the first update so that a request the worker refuses is an HTTP error, not
    // a 200 followed by an error event.
    let first = generation.next().await.transpose()?;
    let events = async_stream::stream! {
        if let Some(opening) = format.opening_chunk() {
            yield data(&opening);
        }
        let mut update = first;
        while let Some(current) = update.take() {
            match current {
                Update::Piece(piece) => yield data(&format.chunk(&piece, None)),
                Update::Finished(finish) => {
                    yield data(&format.chunk(&Piece::default(), Some(finish)));
                    if include_usage {
                        yield data(&format.usage_chunk(generation.usage()));
                    }
                    break;
                }
            }
            match generation.next().await {
                Some(Ok(next)) => update = Some(next),
                Some(Err(e)) => yield data(&e.body()),
                None => {}
            }
        }
        yield Ok::<Event, Infallible>(Event::default().data("[DONE]"));
    };
    Ok(Sse::new(events).into_response())
}

fn data(value: &Value) -> Result<Event, Infallible> {
    Ok(Event::default().data(value.to_string()))
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
}
