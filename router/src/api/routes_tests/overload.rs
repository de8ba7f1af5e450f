//! Admission control (`--max-requests`): 429 past the limit, and the in-flight count going
//! back down however a request ends.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};
use tower::ServiceExt;

use super::*;

impl Setup {
    fn generated(&self) -> usize {
        self.fake.log.lock().unwrap().generated.len()
    }

    fn in_flight(&self) -> usize {
        self.state.admission.in_flight()
    }

    /// Starts a chat request in the background (its body read to the end).
    fn spawn_chat(&self, extra: Value) -> tokio::task::JoinHandle<(StatusCode, String)> {
        let app = self.app();
        tokio::spawn(async move { send(app, chat(extra)).await })
    }

    /// Sends `req`, expects 429 with `Retry-After: 1`; the error object.
    async fn refused(&self, req: Request<Body>) -> Value {
        // Bounded: a request wrongly admitted would wait on the stalled fake worker forever.
        let resp = tokio::time::timeout(Duration::from_secs(5), self.app().oneshot(req))
            .await
            .expect("a request past the limit must be refused at once, not admitted")
            .unwrap();
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(resp.headers()["retry-after"], "1");
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let body: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(body["error"]["type"], "rate_limit_exceeded", "{body}");
        assert_eq!(body["error"]["code"], "too_many_requests", "{body}");
        body["error"].clone()
    }

    async fn metrics_text(&self) -> String {
        let req = Request::get("/metrics").body(Body::empty()).unwrap();
        send(self.app(), req).await.1
    }
}

const FULL: &str = "server overloaded: 2 requests in flight (limit 2); retry later";

#[tokio::test]
async fn a_request_past_the_limit_gets_429_until_the_others_finish() {
    let s = Setup::limited(2).await;
    let first = s.spawn_chat(json!({}));
    let second = s.spawn_chat(json!({"stream": true}));
    s.wait_for(|s| s.generated() == 2).await;
    assert_eq!(s.in_flight(), 2);
    let e = s.refused(chat(json!({}))).await;
    assert_eq!(e["message"], FULL);
    let completion = post("/v1/completions", json!({"model": "tiny", "prompt": "hi"}));
    assert_eq!(s.refused(completion).await["message"], FULL);
    let native = post("/generate", json!({"text": "hi"}));
    assert_eq!(s.refused(native).await["message"], FULL);
    assert_eq!(s.generated(), 2, "a refused request reached the worker");
    let metrics = s.metrics_text().await;
    assert!(
        metrics.contains("\nminisgl_requests_in_flight 2\n"),
        "{metrics}"
    );
    let refused = "minisgl_requests_total{endpoint=\"/v1/chat/completions\",status=\"429\"} 1\n";
    assert!(metrics.contains(refused), "{metrics}");

    s.fake.resume();
    for task in [first, second] {
        let (status, body) = tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    assert_eq!(s.in_flight(), 0);
    let (status, body) = send(s.app(), chat(json!({"n": 2}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(s.in_flight(), 0);
    assert!(s
        .metrics_text()
        .await
        .contains("\nminisgl_requests_in_flight 0\n"));
}

#[tokio::test]
async fn a_client_disconnect_frees_its_slot() {
    let s = Setup::limited(2).await;
    let first = s.spawn_chat(json!({"stream": true}));
    let _second = s.spawn_chat(json!({}));
    s.wait_for(|s| s.generated() == 2).await;
    assert_eq!(s.refused(chat(json!({}))).await["message"], FULL);
    first.abort();
    s.wait_for(|s| s.in_flight() == 1).await;
    assert_eq!(s.aborted().len(), 1);
    // Admitted again: it reaches the worker, and the limit is full once more.
    let _third = s.spawn_chat(json!({}));
    s.wait_for(|s| s.generated() == 3).await;
    assert_eq!(s.in_flight(), 2);
    assert_eq!(s.refused(chat(json!({}))).await["message"], FULL);
}

#[tokio::test]
async fn a_dead_worker_frees_the_slots_of_its_requests() {
    let s = Setup::limited(2).await;
    let first = s.spawn_chat(json!({"n": 2}));
    s.wait_for(|s| s.generated() == 2).await;
    assert_eq!(s.in_flight(), 2);
    s.fake.kill();
    // Its launcher gives up on it: the retries find no worker.
    s.state.workers[0].fail("worker 0 exited before it was ready (exit status: 1)");
    let (status, body) = tokio::time::timeout(Duration::from_secs(5), first)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(s.in_flight(), 0);
    // Not 429: the slots are free, there is just no worker.
    let (status, _) = send(s.app(), chat(json!({}))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(s.in_flight(), 0);
}

#[tokio::test]
async fn copies_past_the_limit_are_refused_before_reaching_the_worker() {
    // More generations than --max-requests could ever admit: a 400, not a 429 to retry.
    let s = Setup::limited(2).await;
    s.fake.resume();
    let (status, e) = send_json(s.app(), chat(json!({"n": 3}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        e["error"]["message"],
        "this request needs 3 generations (prompts times `n`); the server runs at most 2 at once (--max-requests)"
    );
    let batch = post(
        "/v1/completions",
        json!({"model": "tiny", "prompt": ["a", "b", "c"]}),
    );
    let (status, e) = send_json(s.app(), batch).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        e["error"]["message"].as_str().unwrap().contains("needs 3"),
        "{e}"
    );
    assert_eq!(s.generated(), 0);
    assert_eq!(s.in_flight(), 0);
    // Two copies fit.
    let (status, body) = send(s.app(), chat(json!({"n": 2}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!((s.generated(), s.in_flight()), (2, 0));
}

#[tokio::test]
async fn shutdown_refuses_new_requests_and_waits_for_those_in_flight() {
    let s = Setup::limited(4).await;
    let first = s.spawn_chat(json!({}));
    s.wait_for(|s| s.generated() == 1).await;
    let state = s.state.clone();
    let drained = tokio::spawn(async move {
        let pending = std::future::pending::<()>();
        crate::run::drain(&state, Duration::from_secs(30), pending).await
    });
    s.wait_for(|s| s.state.admission.is_closed()).await;
    let (status, body) = send(s.app(), chat(json!({}))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("the server is shutting down"), "{body}");
    assert!(!drained.is_finished(), "one request is still in flight");
    s.fake.resume();
    assert_eq!(first.await.unwrap().0, StatusCode::OK);
    tokio::time::timeout(Duration::from_secs(5), drained)
        .await
        .expect("the drain ends once nothing is in flight")
        .unwrap();
    assert!(s.aborted().is_empty());
}

#[tokio::test]
async fn shutdown_aborts_what_is_still_in_flight_at_the_timeout() {
    let s = Setup::limited(4).await;
    let stream = s.spawn_chat(json!({"stream": true}));
    s.wait_for(|s| s.generated() == 1).await;
    let timeout = Duration::from_millis(300);
    crate::run::drain(&s.state, timeout, std::future::pending()).await;
    let (status, body) = stream.await.unwrap();
    // A stream that had not sent its first token is refused outright.
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("(--shutdown-timeout)"), "{body}");
    s.wait_for(|s| s.aborted().len() == 1).await;
    assert_eq!(s.in_flight(), 0);
}
