//! Per-request limits over HTTP: what `max_tokens` becomes when a request names none, and
//! the 400s of `--max-tokens-limit`, `--max-n` and `--max-prompts`.

use super::*;

impl Setup {
    /// The `max_new_tokens` the fake worker was sent for each request so far.
    fn max_new_tokens(&self) -> Vec<u32> {
        let log = self.fake.log.lock().unwrap();
        log.generated.iter().map(|g| g.2.max_new_tokens).collect()
    }
}

#[tokio::test]
async fn completions_default_to_16_tokens_and_chat_to_the_rest_of_the_context() {
    let s = Setup::normal().await;
    let req = post(
        "/v1/completions",
        json!({"model": "tiny", "prompt": "Capital?"}),
    );
    let (status, body) = send_json(s.app(), req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = send_json(s.app(), chat(json!({}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let prompt_tokens = body["usage"]["prompt_tokens"].as_u64().unwrap() as u32;
    assert_eq!(s.max_new_tokens(), [16, 256 - prompt_tokens]);
}

#[tokio::test]
async fn the_servers_limits_are_named_in_400s() {
    let s = Setup::with(Options {
        limits: Limits {
            max_tokens_limit: Some(8),
            max_n: 2,
            max_prompts: 2,
            ..Limits::default()
        },
        ..Options::default()
    })
    .await;
    for (req, param, message) in [
        (
            chat(json!({"max_completion_tokens": 9})),
            "max_completion_tokens",
            "`max_completion_tokens` must be at most 8 (--max-tokens-limit); got 9",
        ),
        (
            post(
                "/generate",
                json!({"text": "x", "sampling_params": {"max_new_tokens": 9}}),
            ),
            "sampling_params.max_new_tokens",
            "`sampling_params.max_new_tokens` must be at most 8 (--max-tokens-limit); got 9",
        ),
        (
            chat(json!({"n": 3})),
            "n",
            "`n` must be in [1, 2] (--max-n); got 3",
        ),
        (
            post(
                "/v1/completions",
                json!({"model": "tiny", "prompt": [[5], [6], [7]]}),
            ),
            "prompt",
            "`prompt` may hold at most 2 prompts (--max-prompts); got 3",
        ),
    ] {
        let (status, body) = send_json(s.app(), req).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(body["error"]["param"], param);
        assert_eq!(body["error"]["message"], message);
    }
    assert!(s.max_new_tokens().is_empty());
    // A request that names no max_tokens gets the limit, in chat and completions alike.
    let (status, _) = send(s.app(), chat(json!({}))).await;
    assert_eq!(status, StatusCode::OK);
    let req = post(
        "/v1/completions",
        json!({"model": "tiny", "prompt": "Capital?"}),
    );
    assert_eq!(send(s.app(), req).await.0, StatusCode::OK);
    assert_eq!(s.max_new_tokens(), [8, 8]);
}

#[tokio::test]
async fn a_request_past_the_timeout_is_aborted_in_the_worker_and_gets_504() {
    let s = Setup::with(Options {
        stall: true,
        limits: Limits {
            request_timeout: Some(0.3),
            ..Limits::default()
        },
        ..Options::default()
    })
    .await;
    for extra in [json!({}), json!({"stream": true})] {
        let started = std::time::Instant::now();
        let (status, body) = send_json(s.app(), chat(extra)).await;
        let took = started.elapsed();
        assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(3),
            "{took:?}"
        );
        assert_eq!(body["error"]["type"], "timeout");
        assert_eq!(
            body["error"]["message"],
            "the request ran past the server's limit of 0.3 s (--request-timeout) and was stopped after 0 tokens"
        );
    }
    s.wait_for(|s| s.aborted().len() == 2).await;
    assert_eq!(s.state.admission.in_flight(), 0);
}
