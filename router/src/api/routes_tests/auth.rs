//! `--api-key`: 401 on every route but /health and the page without the right key, the
//! usual answers with it.

use super::*;

const KEY: &str = "sk-test-key";

/// One request per route (unknown paths included), each valid once the key is there.
fn every_route() -> Vec<Request<Body>> {
    let get = |path: &str| Request::get(path).body(Body::empty()).unwrap();
    vec![
        chat(json!({})),
        post(
            "/v1/completions",
            json!({"model": "tiny", "prompt": "Capital?"}),
        ),
        get("/v1/models"),
        post("/tokenize", json!({"prompt": "hi"})),
        post("/detokenize", json!({"tokens": [5]})),
        post("/generate", json!({"text": "Capital?"})),
        get("/metrics"),
        get("/openapi.json"),
    ]
}

fn with_header(mut req: Request<Body>, value: &str) -> Request<Body> {
    req.headers_mut()
        .insert("authorization", value.parse().unwrap());
    req
}

#[tokio::test]
async fn no_key_or_a_wrong_key_gets_401_everywhere_but_health_and_the_page() {
    let s = Setup::with(Options {
        api_key: Some(KEY),
        ..Options::default()
    })
    .await;
    let unknown = || Request::get("/nope").body(Body::empty()).unwrap();
    for (header, message) in [
        (
            None,
            "this server needs an API key: send `Authorization: Bearer KEY`",
        ),
        (Some("Bearer sk-wrong"), "incorrect API key"),
        (Some(KEY), "the `Authorization` header must be `Bearer KEY`"),
    ] {
        for req in every_route().into_iter().chain([unknown()]) {
            let path = req.uri().path().to_string();
            let req = match header {
                Some(h) => with_header(req, h),
                None => req,
            };
            let resp = s.app().oneshot(req).await.unwrap();
            assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{path}");
            assert_eq!(resp.headers()["www-authenticate"], "Bearer");
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            let body: Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(body["error"]["message"], message, "{path}");
            assert_eq!(body["error"]["code"], "invalid_api_key");
            assert_eq!(body["error"]["type"], "invalid_request_error");
        }
    }
    assert!(s.fake.log.lock().unwrap().generated.is_empty());
    for path in ["/health", "/", "/ui/chat.js", "/ui/chat.css"] {
        let (status, _) = send(s.app(), Request::get(path).body(Body::empty()).unwrap()).await;
        assert_eq!(status, StatusCode::OK, "{path}");
    }
}

#[tokio::test]
async fn the_key_opens_every_route() {
    let s = Setup::with(Options {
        api_key: Some(KEY),
        ..Options::default()
    })
    .await;
    for req in every_route() {
        let path = req.uri().path().to_string();
        let (status, body) = send(s.app(), with_header(req, &format!("Bearer {KEY}"))).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
    }
    let req = with_header(
        Request::get("/nope").body(Body::empty()).unwrap(),
        &format!("Bearer {KEY}"),
    );
    assert_eq!(send(s.app(), req).await.0, StatusCode::NOT_FOUND);
    // Counted like any other answer.
    let metrics = Request::get("/metrics")
        .header("authorization", format!("Bearer {KEY}"))
        .body(Body::empty())
        .unwrap();
    let (_, text) = send(s.app(), metrics).await;
    assert!(
        text.contains("minisgl_requests_total{endpoint=\"/metrics\",status=\"200\"}"),
        "{text}"
    );
}
