//! What goes wrong: client mistakes, refusals, disconnects, dead workers.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};
use tower::ServiceExt;

use super::*;

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

async fn health(s: &Setup) -> (StatusCode, Value) {
    send_json(
        s.app(),
        Request::get("/health").body(Body::empty()).unwrap(),
    )
    .await
}

#[tokio::test]
async fn a_dead_worker_fails_its_requests_and_health() {
    let s = Setup::new(true, 256, 256).await;
    assert_eq!(health(&s).await.0, StatusCode::OK);
    let app = s.app();
    let pending = tokio::spawn(async move { send(app, chat(json!({}))).await });
    s.wait_for(|s| !s.fake.log.lock().unwrap().generated.is_empty())
        .await;
    s.fake.kill();
    // Its launcher's verdict (it died before serving): the retry finds no worker.
    s.state.workers[0].fail("worker 0 exited before it was ready (exit status: 1)");
    let (status, body) = tokio::time::timeout(Duration::from_secs(5), pending)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("no worker is ready"), "{body}");
    let (status, body) = health(&s).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["workers"][0]["status"], "dead");
    assert!(body["workers"][0]["detail"]
        .as_str()
        .unwrap()
        .contains("exit status: 1"));
    let response = s.app().oneshot(chat(json!({}))).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "1");
}

#[tokio::test]
async fn a_request_whose_worker_goes_away_before_its_first_token_is_retried() {
    let s = Setup::new(true, 256, 256).await;
    let app = s.app();
    let pending = tokio::spawn(async move { send(app, chat(json!({"stream": true}))).await });
    s.wait_for(|s| !s.fake.log.lock().unwrap().generated.is_empty())
        .await;
    s.fake.kill();
    let worker = &s.state.workers[0];
    let mut down = Box::pin(async {
        while worker.is_ready() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    tokio::time::timeout(Duration::from_secs(5), &mut down)
        .await
        .unwrap();
    let (status, body) = health(&s).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["workers"][0]["status"], "down", "{body}");
    // The worker comes back (its launcher restarted it): the request is sent again to it.
    let back = FakeWorker::start_at(
        &s.fake.address,
        FakeScript {
            reply: s.state.tokenizer.encode_blocking(ANSWER, false),
            eos: EOS,
            max_context: 256,
            stall: false,
            fail_after: None,
        },
    )
    .await;
    let (status, _) = tokio::time::timeout(Duration::from_secs(10), pending)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(back.log.lock().unwrap().generated.len(), 1);
    let metrics = send(
        s.app(),
        Request::get("/metrics").body(Body::empty()).unwrap(),
    )
    .await
    .1;
    assert!(
        metrics.contains("\nminisgl_request_retries_total 1\n"),
        "{metrics}"
    );
    assert!(metrics.contains("state=\"ready\"} 1\n"), "{metrics}");
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
async fn a_constraint_the_worker_refuses_is_a_400_naming_its_field() {
    let s = Setup::new(false, 4096, 4096).await;
    let schema = json!({"type": "object", "not": {"required": ["a"]}});
    let format = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}});
    let tool = json!({"type": "function", "function": {"name": "f", "parameters": schema}});
    for (body, field) in [
        (json!({"response_format": format}), "response_format"),
        (json!({"tools": [tool], "tool_choice": "required"}), "tools"),
        (
            json!({"tools": [tool], "stream": true, "tool_choice": "required"}),
            "tools",
        ),
    ] {
        let e = error_of(&s, chat(body), StatusCode::BAD_REQUEST).await;
        assert_eq!(e["param"], field, "{e}");
        assert_eq!(e["type"], "invalid_request_error", "{e}");
        assert!(e["message"].as_str().unwrap().contains("not"), "{e}");
    }
    let body = json!({"text": "hi", "sampling_params": {"json_schema": schema.to_string()}});
    let e = error_of(&s, post("/generate", body), StatusCode::BAD_REQUEST).await;
    assert_eq!(e["param"], "sampling_params.json_schema", "{e}");
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
    let e = error_of(&s, chat(json!({"n": 0})), StatusCode::BAD_REQUEST).await;
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
        model_names: vec!["tiny".into()],
        tokenizer: shared_state.tokenizer.clone(),
        template: None,
        workers: shared_state.workers.clone(),
        policy: create_policy(crate::config::RoutingPolicy::CacheAware, Default::default()),
        routing: Default::default(),
        max_context: 256.into(),
        started: 0,
        metrics: Default::default(),
        admission: Admission::new(16, std::time::Duration::ZERO),
        web_ui: true,
        log_requests: false,
        api_key: None,
        limits: Default::default(),
        sampling_defaults: Default::default(),
        tool_format: crate::text::tool_calls::ToolFormat::Hermes,
        reasoning: None,
    });
    let (status, body) = send_json(app(shared_state), chat(json!({}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("no chat template"));
}

#[tokio::test]
async fn a_stream_that_fails_part_way_still_counts_its_usage() {
    let s = Setup::with(Options {
        fail_after: Some(2),
        ..Options::default()
    })
    .await;
    let stream = json!({"stream": true, "n": 2, "stream_options": {"include_usage": true}});
    let (status, body) = send(s.app(), chat(stream)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let chunks = json_events(&body);
    let errors = chunks.iter().filter(|c| c.get("error").is_some()).count();
    assert_eq!(errors, 2, "{body}");
    let usage = &chunks.last().unwrap()["usage"];
    let prompt = s.fake.log.lock().unwrap().generated[0].1.len() as u64;
    assert_eq!(usage["prompt_tokens"], prompt, "{body}");
    assert_eq!(usage["completion_tokens"], 4, "{body}");
    assert_eq!(usage["total_tokens"], prompt + 4, "{body}");
}
