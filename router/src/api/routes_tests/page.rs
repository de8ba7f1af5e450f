//! The chat page's routes: served with their types and headers, or 404 with `--no-web-ui`.

use super::*;

fn get(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

#[tokio::test]
async fn the_page_and_its_assets_are_served_with_a_strict_policy() {
    let s = Setup::normal().await;
    for (path, kind, needle) in [
        ("/", "text/html", "<title>minisgl</title>"),
        ("/ui/chat.js", "text/javascript", "/v1/chat/completions"),
        ("/ui/chat.css", "text/css", "#composer"),
    ] {
        let resp = s.app().oneshot(get(path)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        let headers = resp.headers();
        assert!(headers["content-type"].to_str().unwrap().starts_with(kind));
        let csp = headers["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("script-src 'self'"), "{csp}");
        assert_eq!(headers["x-content-type-options"], "nosniff");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert!(String::from_utf8_lossy(&body).contains(needle), "{path}");
    }
}

#[tokio::test]
async fn no_web_ui_turns_the_page_off_and_keeps_the_api() {
    let s = Setup::without_page().await;
    for path in ["/", "/ui/chat.js", "/ui/chat.css"] {
        let (status, body) = send_json(s.app(), get(path)).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(body["error"]["message"], format!("no route for GET {path}"));
    }
    let (status, _) = send_json(s.app(), chat(json!({}))).await;
    assert_eq!(status, StatusCode::OK);
}
