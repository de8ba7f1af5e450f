//! Routes and thin handlers: `fn app(state) -> Router`, so tests drive it with `oneshot`.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request, State};
use axum::http::{header, Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};

use crate::api::access;
use crate::api::auth::require_key;
use crate::api::chat::{self, ChatFormat};
use crate::api::completions::{self, CompletionFormat};
use crate::api::generate;
use crate::api::models;
use crate::api::native;
use crate::api::openapi;
use crate::api::page;
use crate::api::prepare::off_runtime;
use crate::api::respond::{respond, Choices, Head};
use crate::error::ApiError;
use crate::state::AppState;
use crate::worker::WorkerState;

/// Larger bodies get 413.
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

pub fn app(state: AppState) -> Router {
    let page = match state.web_ui {
        true => page::routes(),
        false => Router::new(),
    };
    page.route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models::list))
        .route("/v1/models/{*id}", get(models::retrieve))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/generate", post(generate_native))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi::serve))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(state.clone(), require_key))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            access::identify,
        ))
        .with_state(state)
}

/// The routes counted by name in `minisgl_requests_total`; anything else is "other".
const ROUTES: [&str; 10] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/models",
    "/tokenize",
    "/detokenize",
    "/generate",
    "/health",
    "/metrics",
    "/openapi.json",
    "/",
];

async fn count_requests(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let endpoint = ROUTES
        .iter()
        .find(|&&r| r == path)
        .copied()
        .unwrap_or("other");
    let response = next.run(req).await;
    state
        .metrics
        .count_request(endpoint, response.status().as_u16());
    response
}

async fn chat_completions(
    State(state): State<AppState>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let s = state.clone();
    let chat = off_runtime(move || chat::prepare(&s, &body)).await?;
    let params = chat.params;
    let mut slots = state.admission.admit(params.n as usize).await?;
    let generations =
        generate::start_n(&state, chat.prompt, params.clone(), params.n, &mut slots).await?;
    let head = Head::new("chatcmpl", &chat.model);
    let format = ChatFormat::new(head, state.tokenizer.clone(), chat.logprobs, chat.plan);
    let choices = Choices {
        generations,
        n: params.n as usize,
    };
    respond(choices, format, params.stream, params.include_usage).await
}

async fn completions(
    State(state): State<AppState>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let s = state.clone();
    let plan = off_runtime(move || completions::prepare(&s, &body)).await?;
    let params = plan.params;
    let (choices, echoes) = completions::start(&state, plan.prompts, &params, plan.echo).await?;
    let head = Head::new("cmpl", &plan.model);
    let format = CompletionFormat::new(head, state.tokenizer.clone(), plan.logprobs, echoes);
    respond(choices, format, params.stream, params.include_usage).await
}

async fn tokenize(
    State(state): State<AppState>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    native::tokenize(&state, body).await.map(Json)
}

async fn detokenize(
    State(state): State<AppState>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    native::detokenize(&state, body).await.map(Json)
}

async fn generate_native(
    State(state): State<AppState>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    native::generate(&state, body).await
}

async fn metrics(State(state): State<AppState>) -> Response {
    let text = state.metrics.render(&state.workers, &state.admission);
    let content_type = "text/plain; version=0.0.4; charset=utf-8";
    ([(header::CONTENT_TYPE, content_type)], text).into_response()
}

/// 200 when every worker is ready, else 503; the body lists each worker's state (connecting,
/// ready, down: restarting or reconnecting, dead), why it is not ready, and its restarts.
async fn health(State(state): State<AppState>) -> Response {
    let workers: Vec<_> = state
        .workers
        .iter()
        .map(|w| {
            let worker = w.state();
            let detail = match &worker {
                WorkerState::Down(reason) | WorkerState::Dead(reason) => Some(reason.clone()),
                WorkerState::Connecting | WorkerState::Ready(_) => None,
            };
            json!({"address": w.address(), "status": worker.name(), "detail": detail,
                "restarts": w.restarts(), "in_flight": w.in_flight(), "load": w.load()})
        })
        .collect();
    let (code, status) = match state.serving() {
        true => (StatusCode::OK, "ok"),
        false => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
    };
    (code, Json(json!({"status": status, "workers": workers}))).into_response()
}

async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no route for {method} {}", uri.path()))
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed(format!("{method} is not allowed on {}", uri.path()))
}

/// A request body that must be JSON, with every rejection in OpenAI's error shape.
pub struct JsonBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let content_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        let is_json = content_type
            .map(|ct| {
                ct.split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .eq_ignore_ascii_case("application/json")
            })
            .unwrap_or(false);
        if !is_json {
            return Err(ApiError::bad_request(format!(
                "the body must be JSON with `Content-Type: application/json`; got {}",
                content_type.unwrap_or("no Content-Type")
            )));
        }
        match Bytes::from_request(req, state).await {
            Ok(bytes) => Ok(Self(bytes)),
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(ApiError::PayloadTooLarge(format!(
                    "the body is larger than {} MiB",
                    MAX_BODY_BYTES >> 20
                )))
            }
            Err(e) => Err(ApiError::bad_request(format!("cannot read the body: {e}"))),
        }
    }
}

#[cfg(test)]
#[path = "routes_tests/mod.rs"]
mod tests;
