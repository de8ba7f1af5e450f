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
use crate::api::admission::Admission;
use crate::api::limits::Limits;
use crate::api::sampling_defaults::SamplingSource;
use crate::config::RoutingPolicy;
use crate::model_files::load_model_files;
use crate::routing::policy::create_policy;
use crate::state::{AppState, Shared};
use crate::text::tokenizer::tests::tiny_model_dir;
use crate::worker::fake::{FakeScript, FakeWorker};
use crate::worker::launcher::wait_ready;
use crate::worker::WorkerClient;

mod access;
mod auth;
mod failures;
mod generation;
mod limits;
mod native;
mod overload;
mod page;

const ANSWER: &str = "The capital of France is Paris.";
const EOS: u32 = 2;

struct Setup {
    fake: FakeWorker,
    state: AppState,
}

/// How a test's router and fake worker are set up; `Options::default()` is a normal worker
/// behind a router with the default flags (and a context of 256 on both sides).
struct Options {
    /// The fake worker holds every request until `FakeWorker::resume`.
    stall: bool,
    /// The fake worker fails each request after this many tokens (`FakeScript::fail_after`).
    fail_after: Option<u32>,
    worker_context: u32,
    router_context: u32,
    max_requests: usize,
    web_ui: bool,
    /// `--log-requests`.
    log_requests: bool,
    api_key: Option<&'static str>,
    limits: Limits,
    /// The served model names (`model` must be one of them).
    model_names: &'static [&'static str],
}

impl Default for Options {
    fn default() -> Self {
        Self {
            stall: false,
            fail_after: None,
            worker_context: 256,
            router_context: 256,
            max_requests: 4096,
            web_ui: true,
            log_requests: false,
            api_key: None,
            limits: Limits::default(),
            model_names: &["tiny"],
        }
    }
}

impl Setup {
    async fn new(stall: bool, worker_context: u32, router_context: u32) -> Self {
        Self::with(Options {
            stall,
            worker_context,
            router_context,
            ..Options::default()
        })
        .await
    }

    /// A stalled worker (see `FakeWorker::resume`) behind `--max-requests max_requests`.
    async fn limited(max_requests: usize) -> Self {
        Self::with(Options {
            stall: true,
            max_requests,
            ..Options::default()
        })
        .await
    }

    /// A normal worker behind a router started with `--no-web-ui`.
    async fn without_page() -> Self {
        Self::with(Options {
            web_ui: false,
            ..Options::default()
        })
        .await
    }

    async fn with(o: Options) -> Self {
        let files =
            load_model_files(&tiny_model_dir(), Some("tiny"), SamplingSource::Model).unwrap();
        let reply = files.tokenizer.encode_blocking(ANSWER, false);
        let fake = FakeWorker::start(FakeScript {
            reply,
            eos: EOS,
            max_context: o.worker_context,
            stall: o.stall,
            fail_after: o.fail_after,
        })
        .await;
        let client = WorkerClient::connect(&fake.address);
        wait_ready(&client, Duration::from_secs(10)).await.unwrap();
        let state = AppState::new(Shared {
            model_names: o.model_names.iter().map(|n| n.to_string()).collect(),
            tokenizer: files.tokenizer,
            template: files.template,
            workers: vec![client],
            policy: create_policy(RoutingPolicy::CacheAware, Default::default()),
            routing: Default::default(),
            max_context: o.router_context.into(),
            started: 0,
            metrics: Default::default(),
            admission: Admission::new(o.max_requests, std::time::Duration::ZERO),
            web_ui: o.web_ui,
            log_requests: o.log_requests,
            api_key: o.api_key.map(str::to_string),
            limits: o.limits,
            sampling_defaults: files.sampling_defaults,
            tool_format: crate::text::tool_calls::ToolFormat::Hermes,
            reasoning: None,
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
        for _ in 0..2000 {
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

/// A stream's JSON events, after checking that `[DONE]` ends it.
fn json_events(body: &str) -> Vec<Value> {
    let events = sse_events(body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{body}");
    events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect()
}
