//! Every response names its request in `x-request-id`: the client's own id (1 to 128
//! visible ASCII characters; anything else is a 400 naming the header), or one the router
//! makes up (`req-` and 16 random hex digits), as vLLM's `--enable-request-id-headers` does.
//!
//! What the router logs while it serves a request (a retry, say) is in a `request{id=...}`
//! span: the handler and every poll of the response's body, a stream's included.
//!
//! With `--log-requests` the router logs one line per request when its response has been
//! sent, or when the client went away first: the id, method, path, status, the time to the
//! response's head and to its last byte. A streamed completion's line comes when its stream
//! ends, so the times are what its client saw.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body::{Body as _, Frame, SizeHint};
use tracing::{Instrument, Span};

use crate::error::ApiError;
use crate::state::AppState;

pub const HEADER: &str = "x-request-id";
pub const MAX_ID_LEN: usize = 128;
/// The id a `--log-requests` line gives a request refused for its `x-request-id`.
pub const BAD_ID: &str = "(a bad x-request-id)";

/// The client's id from its `x-request-id` header, or a new one.
pub fn request_id(header: Option<&HeaderValue>) -> Result<String, ApiError> {
    let Some(value) = header else {
        return Ok(format!("req-{:016x}", rand::random::<u64>()));
    };
    let bytes = value.as_bytes();
    if bytes.is_empty() || bytes.len() > MAX_ID_LEN || !bytes.iter().all(u8::is_ascii_graphic) {
        return Err(ApiError::bad_request(format!(
            "the `{HEADER}` header must be 1 to {MAX_ID_LEN} visible ASCII characters \
             (no spaces); got {} bytes",
            bytes.len()
        )));
    }
    Ok(String::from_utf8_lossy(bytes).into_owned())
}

/// The middleware: names the request, answers with its id, and logs it (`--log-requests`).
pub async fn identify(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let (id, span, response) = match request_id(req.headers().get(HEADER)) {
        Ok(id) => {
            let span = tracing::info_span!("request", id = %id);
            let mut response = next.run(req).instrument(span.clone()).await;
            let value = HeaderValue::from_str(&id).expect("checked: visible ASCII");
            response.headers_mut().insert(HEADER, value);
            (id, span, response)
        }
        // refused before it ran, but still one line of --log-requests
        Err(e) => (BAD_ID.to_string(), Span::none(), e.into_response()),
    };
    let done: Option<Done> = state.log_requests.then(|| {
        let access = Access {
            id,
            method,
            path,
            status: response.status().as_u16(),
            head: start.elapsed(),
        };
        Box::new(move |sent| {
            let line = access.line(start.elapsed(), sent);
            tracing::info!(target: "minisgl_router::requests", "{line}");
        }) as Done
    });
    watch(response, span, done)
}

/// What `--log-requests` says of one request.
pub struct Access {
    pub id: String,
    pub method: Method,
    pub path: String,
    pub status: u16,
    /// From the request's arrival to its response's head.
    pub head: Duration,
}

impl Access {
    /// `request ID: METHOD PATH STATUS, head T, sent T` (or `client gone after T`), `end`
    /// counted from the request's arrival.
    pub fn line(&self, end: Duration, sent: bool) -> String {
        let end_word = if sent { "sent" } else { "client gone after" };
        format!(
            "request {}: {} {} {}, head {:.1} ms, {end_word} {:.1} ms",
            self.id,
            self.method,
            self.path,
            self.status,
            self.head.as_secs_f64() * 1e3,
            end.as_secs_f64() * 1e3
        )
    }
}

/// Called once with whether a response's body was sent to its end.
pub type Done = Box<dyn FnOnce(bool) + Send>;

/// `response` whose body is polled (and dropped) in `span`, and calls `done(sent)` once:
/// `true` when its last byte was taken, `false` when it was dropped before (the client went
/// away). Its size hint is kept, so a whole JSON body still goes out with its
/// `Content-Length`.
pub fn watch(response: Response, span: Span, done: Option<Done>) -> Response {
    let (parts, inner) = response.into_parts();
    Response::from_parts(parts, Body::new(Watched { inner, span, done }))
}

struct Watched {
    inner: Body,
    span: Span,
    done: Option<Done>,
}

impl Watched {
    fn report(&mut self, sent: bool) {
        if let Some(done) = self.done.take() {
            done(sent);
        }
    }
}

impl http_body::Body for Watched {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        let poll = {
            let _in_request = this.span.enter();
            Pin::new(&mut this.inner).poll_frame(cx)
        };
        if let Poll::Ready(None) = poll {
            this.report(true);
        }
        poll
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Watched {
    /// The server may drop a body it knows has ended without polling it to `None`; a stream
    /// dropped early (its generation aborted) is dropped in the request's span.
    fn drop(&mut self) {
        let sent = self.inner.is_end_stream();
        self.report(sent);
        let _in_request = self.span.enter();
        drop(std::mem::take(&mut self.inner));
    }
}

#[cfg(test)]
#[path = "access_tests.rs"]
mod tests;
