//! HTTP tests: `app(state).oneshot(request)` against fake workers reached over real ZMQ
//! (zmq.rs DEALERs on ipc sockets), with the tiny test tokenizer and its ChatML template.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use super::app;
use crate::policy::create_policy;
use crate::run::load_model_files;
use crate::state::{AppState, Shared};
use crate::tokenizer::tests::tiny_model_dir;
use crate::worker::fake::{FakeScript, FakeWorker};
use crate::worker::launcher::wait_ready;
use crate::worker::WorkerClient;

const ANSWER: &str = "The capital of France is Paris.";
const EOS: u32 = 2;

struct Setup {
    fake: FakeWorker,
    state: AppState,
}

impl Setup {
    async fn new(stall: bool, worker_context: u32, router_context: u32) -> Self {
        let files = load_model_files(&tiny_model_dir(), Some("tiny")).unwrap();
        let reply = files.tokenizer.encode_blocking(ANSWER, false);
        let fake = FakeWorker::start(FakeScript {
            reply,
            eos: EOS,
            max_context: worker_context,
            stall,
        })
        .await;
        let client = WorkerClient::connect(&fake.address);
        wait_ready(&client, Duration::from_secs(10)).await.unwrap();
        let state = AppState::new(Shared {
            model_name: files.name,
            tokenizer: files.tokenizer,
            template: files.template,
            workers: vec![client],
            policy: create_policy(),
            max_context: router_context.into(),
            started: 0,
        });
        Self { fake, state }
    }

    async fn normal() -> Self {
        Self::new(false, 256, 256).await
    }

    fn app(&self) -> Router {
        app(self.state.clone())
    }

    fn aborted(&self) -> Vec<u64> {
        self.fake.log.lock().unwrap().aborted.clone()
    }

    async fn wait_for(&self, what: impl Fn(&Self) -> bool) {
        for _ in 0..500 {
            if what(self) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("condition not reached");
    }
}

fn post(path: &str, body: Value) -> Request<Body> {
    Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn chat(extra: Value) -> Request<Body> {
    let mut body =
        json!({"model": "tiny", "messages": [{"role": "user", "content": "Capital of France?"}]});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    post("/v1/chat/completions", body)
}

async fn send(app: Router, req: Request<Body>) -> (StatusCode, String) {
    let resp = app.oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

async fn send_json(app: Router, req: Request<Body>) -> (StatusCode, Value) {
    let (status, text) = send(app, req).await;
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")),
    )
}

/// The `data:` payloads of an SSE body.
fn sse_events(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn chat_completion_answers_in_openai_shape() {
    let s = Setup::normal().await;
    let (status, body) = send_json(s.app(), chat(json!({"temperature": 0}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(body["model"], "tiny");
    let choice = &body["choices"][0];
    assert_eq!(
        choice["message"],
        json!({"role": "assistant", "content": ANSWER})
    );
    assert_eq!(choice["finish_reason"], "stop");
    assert!(choice["logprobs"].is_null());
    let answer_tokens = s.state.tokenizer.encode_blocking(ANSWER, false).len() as u64;
    let usage = &body["usage"];
    assert_eq!(
        usage["completion_tokens"],
        answer_tokens + 1,
        "the answer plus EOS"
    );
    let total = usage["prompt_tokens"].as_u64().unwrap() + answer_tokens + 1;
    assert_eq!(usage["total_tokens"], total);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 3);
    // The prompt went through the chat template, encoded without extra special tokens.
    let sent = s.fake.log.lock().unwrap().generated[0].1.clone();
    assert_eq!(sent[0], 1, "starts with <|im_start|>");
}

#[tokio::test]
async fn chat_stream_has_role_content_finish_usage_done() {
    let s = Setup::normal().await;
    let req = chat(json!({"stream": true, "stream_options": {"include_usage": true}}));
    let (status, body) = send(s.app(), req).await;
    assert_eq!(status, StatusCode::OK);
    let events = sse_events(&body);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, ANSWER);
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert!(usage["usage"]["completion_tokens"].as_u64().unwrap() > 1);
}

#[tokio::test]
async fn completions_stop_at_max_tokens() {
    let s = Setup::normal().await;
    let req = post(
        "/v1/completions",
        json!({"model": "tiny", "prompt": "The", "max_tokens": 3}),
    );
    let (status, body) = send_json(s.app(), req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["object"], "text_completion");
    assert!(body["id"].as_str().unwrap().starts_with("cmpl-"));
    let reply = s.state.tokenizer.encode_blocking(ANSWER, false);
    assert_eq!(
        body["choices"][0]["text"],
        s.state.tokenizer.decode(&reply[..3])
    );
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(body["usage"]["completion_tokens"], 3);
    let sampling = s.fake.log.lock().unwrap().generated[0].2.clone();
    assert_eq!(sampling.max_new_tokens, 3);
}

#[tokio::test]
async fn stop_string_cuts_the_text_and_aborts_the_request() {
    let s = Setup::normal().await;
    let (status, body) = send_json(s.app(), chat(json!({"stop": ["France", "zzz"]}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], "The capital of ");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    let rid = s.fake.log.lock().unwrap().generated[0].0;
    s.wait_for(|s| s.aborted() == [rid]).await;
}

#[tokio::test]
async fn streamed_stop_string_matches_across_tokens() {
    let s = Setup::normal().await;
    let (_, body) = send(s.app(), chat(json!({"stop": "is Par", "stream": true}))).await;
    let events = sse_events(&body);
    let text: String = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(text, "The capital of France ");
}

#[tokio::test]
async fn logprobs_come_back_in_chat_shape() {
    let s = Setup::normal().await;
    let (status, body) = send_json(
        s.app(),
        chat(json!({"logprobs": true, "top_logprobs": 2, "max_tokens": 2})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let content = body["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    assert_eq!(content.len(), 2);
    assert_eq!(content[0]["logprob"], -0.5);
    assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 2);
    let token = content[0]["token"].as_str().unwrap();
    assert_eq!(content[0]["bytes"], json!(token.as_bytes()));
}

#[tokio::test]
async fn client_disconnect_aborts_the_request() {
    let s = Setup::new(true, 256, 256).await;
    let app = s.app();
    let task = tokio::spawn(async move { app.oneshot(chat(json!({"stream": true}))).await });
    s.wait_for(|s| !s.fake.log.lock().unwrap().generated.is_empty())
        .await;
    task.abort();
    let rid = s.fake.log.lock().unwrap().generated[0].0;
    s.wait_for(|s| s.aborted() == [rid]).await;
    assert_eq!(s.state.workers[0].in_flight(), 0);
}

#[tokio::test]
async fn a_dead_worker_fails_its_requests_and_health() {
    let s = Setup::new(true, 256, 256).await;
    let (status, _) = send(
        s.app(),
        Request::get("/health").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let app = s.app();
    let pending = tokio::spawn(async move { send_json(app, chat(json!({}))).await });
    s.wait_for(|s| !s.fake.log.lock().unwrap().generated.is_empty())
        .await;
    s.fake.kill();
    let (status, body) = tokio::time::timeout(Duration::from_secs(5), pending)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("disconnected"),
        "{body}"
    );
    let (status, body) = send_json(
        s.app(),
        Request::get("/health").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["workers"][0]["status"], "dead");
    let (status, _) = send(s.app(), chat(json!({}))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn worker_refusals_are_client_errors_before_streaming_starts() {
    // The router believes in a larger context than the worker: the worker refuses.
    let s = Setup::new(false, 16, 4096).await;
    let (status, body) = send_json(s.app(), chat(json!({"stream": true}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("prompt has"),
        "{body}"
    );
}

#[tokio::test]
async fn models_and_health() {
    let s = Setup::normal().await;
    let (status, body) = send_json(
        s.app(),
        Request::get("/v1/models").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["data"][0]["id"], "tiny");
    assert_eq!(body["object"], "list");
    let (status, body) = send_json(
        s.app(),
        Request::get("/health").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(
        (status, body["status"].clone()),
        (StatusCode::OK, json!("ok"))
    );
}

async fn error_of(s: &Setup, req: Request<Body>, expected: StatusCode) -> Value {
    let (status, body) = send_json(s.app(), req).await;
    assert_eq!(status, expected, "{body}");
    let error = body["error"].clone();
    for key in ["message", "type", "param", "code"] {
        assert!(error.get(key).is_some(), "missing {key} in {body}");
    }
    error
}

#[tokio::test]
async fn client_mistakes_get_openai_errors() {
    let s = Setup::new(false, 64, 64).await;
    let e = error_of(
        &s,
        post("/v1/completions", json!({"model": "gpt-9", "prompt": "hi"})),
        StatusCode::NOT_FOUND,
    )
    .await;
    assert!(e["message"].as_str().unwrap().contains("gpt-9"));
    let e = error_of(&s, chat(json!({"best_of": 3})), StatusCode::BAD_REQUEST).await;
    assert_eq!(
        (e["message"].as_str().unwrap(), e["param"].as_str().unwrap()),
        ("unsupported parameter `best_of`", "best_of")
    );
    let e = error_of(&s, chat(json!({"n": 2})), StatusCode::BAD_REQUEST).await;
    assert_eq!(e["param"], "n");
    let long = post(
        "/v1/completions",
        json!({"model": "tiny", "prompt": "hello ".repeat(100)}),
    );
    let e = error_of(&s, long, StatusCode::BAD_REQUEST).await;
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .ends_with("the model's context is 64"),
        "{e}"
    );
    let e = error_of(
        &s,
        post(
            "/v1/completions",
            json!({"model": "tiny", "prompt": "hi", "max_tokens": 64}),
        ),
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert!(
        e["message"].as_str().unwrap().contains("context of 64"),
        "{e}"
    );
    let bad_json = Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Body::from("{\"model\": "))
        .unwrap();
    error_of(&s, bad_json, StatusCode::BAD_REQUEST).await;
    let form = Request::post("/v1/completions")
        .header("content-type", "text/plain")
        .body(Body::from("{}"))
        .unwrap();
    error_of(&s, form, StatusCode::BAD_REQUEST).await;
    let huge = Request::post("/v1/completions")
        .header("content-type", "application/json")
        .body(Body::from(vec![b' '; 5 << 20]))
        .unwrap();
    error_of(&s, huge, StatusCode::PAYLOAD_TOO_LARGE).await;
    error_of(
        &s,
        Request::get("/v1/nope").body(Body::empty()).unwrap(),
        StatusCode::NOT_FOUND,
    )
    .await;
    error_of(
        &s,
        Request::get("/v1/completions").body(Body::empty()).unwrap(),
        StatusCode::METHOD_NOT_ALLOWED,
    )
    .await;
    // Nothing above reached the worker.
    assert!(s.fake.log.lock().unwrap().generated.is_empty());
}

#[tokio::test]
async fn chat_without_a_template_is_a_400() {
    let s = Setup::normal().await;
    let mut shared_state = s.state.clone();
    // Same workers and tokenizer, no template.
    shared_state = AppState::new(Shared {
        model_name: "tiny".into(),
        tokenizer: shared_state.tokenizer.clone(),
        template: None,
        workers: shared_state.workers.clone(),
        policy: create_policy(),
        max_context: 256.into(),
        started: 0,
    });
    let (status, body) = send_json(app(shared_state), chat(json!({}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("no chat template"));
}
