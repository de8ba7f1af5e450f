//! `x-request-id` on every answer (`api::access`), whatever the route and status, and what
//! `--log-requests` leaves of a response.

use super::*;

fn with_id(mut req: Request<Body>, id: &str) -> Request<Body> {
    req.headers_mut()
        .insert("x-request-id", id.parse().unwrap());
    req
}

fn id_of(resp: &axum::response::Response) -> Option<String> {
    let value = resp.headers().get("x-request-id")?;
    Some(value.to_str().unwrap().to_string())
}

#[tokio::test]
async fn every_answer_carries_the_clients_id_or_a_new_one() {
    let s = Setup::normal().await;
    let get = |path: &str| Request::get(path).body(Body::empty()).unwrap();
    let requests = || {
        vec![
            get("/health"),
            chat(json!({"max_tokens": 4})),
            chat(json!({"max_tokens": 4, "stream": true})),
            chat(json!({"max_tokens": -1})), // 400
            get("/nope"),                    // 404
        ]
    };
    let mut made_up = Vec::new();
    for req in requests() {
        let resp = s.app().oneshot(req).await.unwrap();
        let id = id_of(&resp).expect("x-request-id");
        assert!(id.starts_with("req-"), "{id}");
        made_up.push(id);
    }
    made_up.sort();
    made_up.dedup();
    assert_eq!(made_up.len(), 5, "ids repeat: {made_up:?}");
    for (i, req) in requests().into_iter().enumerate() {
        let id = format!("client-{i}");
        let resp = s.app().oneshot(with_id(req, &id)).await.unwrap();
        assert_eq!(id_of(&resp).as_deref(), Some(id.as_str()));
    }
}

#[tokio::test]
async fn a_refused_key_still_names_the_request() {
    let s = Setup::with(Options {
        api_key: Some("sk-k"),
        ..Options::default()
    })
    .await;
    let resp = s
        .app()
        .oneshot(with_id(chat(json!({})), "abc"))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(id_of(&resp).as_deref(), Some("abc"));
}

#[tokio::test]
async fn a_bad_id_is_a_400_naming_the_header() {
    let s = Setup::normal().await;
    for bad in ["has space", &"x".repeat(129)] {
        let (status, body) = send_json(s.app(), with_id(chat(json!({})), bad)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("`x-request-id`"), "{message}");
    }
}

#[tokio::test]
async fn logged_responses_keep_their_length_and_their_stream() {
    let s = Setup::with(Options {
        log_requests: true,
        ..Options::default()
    })
    .await;
    let resp = s
        .app()
        .oneshot(chat(json!({"max_tokens": 4})))
        .await
        .unwrap();
    let length: usize = resp.headers()["content-length"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(bytes.len(), length);
    let stream = chat(json!({"max_tokens": 4, "stream": true}));
    let (status, body) = send(s.app(), stream).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json_events(&body).len(), 6, "{body}"); // role, 4 tokens, finish
}
