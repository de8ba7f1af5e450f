//! /tokenize, /detokenize, /generate, /metrics, and several choices (n, prompt lists, echo).

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};

use super::*;

#[tokio::test]
async fn tokenize_and_detokenize_round_trip() {
    let s = Setup::normal().await;
    let req = post("/tokenize", json!({"model": "tiny", "prompt": ANSWER}));
    let (status, body) = send_json(s.app(), req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let tokens = body["tokens"].clone();
    assert_eq!(body["count"], tokens.as_array().unwrap().len());
    assert_eq!(body["max_model_len"], 256);
    let req = post("/detokenize", json!({"model": "tiny", "tokens": tokens}));
    let (status, body) = send_json(s.app(), req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["prompt"], ANSWER);
    // Messages go through the chat template.
    let messages = json!([{"role": "user", "content": "hi"}]);
    let req = post("/tokenize", json!({"messages": messages}));
    let (_, body) = send_json(s.app(), req).await;
    assert_eq!(body["tokens"][0], 1, "starts with <|im_start|>");
    let req = post("/detokenize", json!({"tokens": [100000]}));
    let (status, body) = send_json(s.app(), req).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["param"], "tokens");
}

#[tokio::test]
async fn native_generate_returns_text_ids_and_meta_info() {
    let s = Setup::normal().await;
    let params = json!({"max_new_tokens": 3, "temperature": 0});
    let req = post(
        "/generate",
        json!({"text": "Capital?", "sampling_params": params}),
    );
    let (status, body) = send_json(s.app(), req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["text"], "The capital of");
    assert_eq!(body["output_ids"].as_array().unwrap().len(), 3);
    assert_eq!(body["meta_info"]["completion_tokens"], 3);
    assert_eq!(body["meta_info"]["finish_reason"], "length");
    assert_eq!(s.fake.log.lock().unwrap().generated[0].2.max_new_tokens, 3);
    let req = post("/generate", json!({"input_ids": [5, 6], "stream": true}));
    let (status, body) = send(s.app(), req).await;
    assert_eq!(status, StatusCode::OK);
    let events = sse_events(&body);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let last: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(last["text"], ANSWER);
    assert_eq!(last["meta_info"]["finish_reason"], "stop");
    let req = post(
        "/generate",
        json!({"text": "x", "sampling_params": {"n": 2}}),
    );
    let (status, body) = send_json(s.app(), req).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        body["error"]["message"],
        "unsupported parameter `sampling_params.n`"
    );
    assert_eq!(body["error"]["param"], "sampling_params.n");
}

#[tokio::test]
async fn native_errors_name_the_fields_as_the_client_wrote_them() {
    let s = Setup::normal().await;
    for (body, param, message) in [
        (
            json!({"text": "x", "sampling_params": {"max_new_tokens": 0}}),
            "sampling_params.max_new_tokens",
            "`sampling_params.max_new_tokens` must be at least 1; got 0",
        ),
        (
            json!({"text": "x", "sampling_params": {"max_new_tokens": 999}}),
            "sampling_params.max_new_tokens",
            "`sampling_params.max_new_tokens` (999) plus the prompt's",
        ),
        (
            json!({"text": "x", "sampling_params": {"min_new_tokens": "2"}}),
            "sampling_params.min_new_tokens",
            "`sampling_params.min_new_tokens`: invalid type",
        ),
        (
            json!({"text": "x", "sampling_params": {"temperature": 3}}),
            "sampling_params.temperature",
            "`sampling_params.temperature` must be in [0, 2]; got 3",
        ),
        (
            json!({"text": "x", "sampling_params": {"foo": 1}}),
            "sampling_params.foo",
            "unsupported parameter `sampling_params.foo`",
        ),
        (
            json!({"input_ids": [1, 99999]}),
            "input_ids",
            "token id 99999 is outside the vocabulary",
        ),
    ] {
        let (status, out) = send_json(s.app(), post("/generate", body.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {out}");
        assert_eq!(out["error"]["param"], param, "{body}: {out}");
        let said = out["error"]["message"].as_str().unwrap();
        assert!(said.starts_with(message), "{body}: {said}");
    }
}

#[tokio::test]
async fn native_streams_cumulative_objects_and_refusals_before_the_stream() {
    let s = Setup::normal().await;
    let req = post("/generate", json!({"text": "Capital?", "stream": true}));
    let (status, body) = send(s.app(), req).await;
    assert_eq!(status, StatusCode::OK);
    let objects = json_events(&body);
    assert!(objects.len() > 2, "{body}");
    let mut text = String::new();
    let mut ids = 0;
    for (i, object) in objects.iter().enumerate() {
        let now = object["text"].as_str().unwrap();
        assert!(
            now.starts_with(&text),
            "cumulative text: {now:?} after {text:?}"
        );
        let count = object["output_ids"].as_array().unwrap().len();
        assert!(count > ids || i == objects.len() - 1, "cumulative ids");
        assert_eq!(object["meta_info"]["completion_tokens"], count);
        let last = i == objects.len() - 1;
        assert_eq!(object["meta_info"]["finish_reason"].is_null(), !last);
        (text, ids) = (now.to_string(), count);
    }
    let answer = s.state.tokenizer.encode_blocking(ANSWER, false);
    assert_eq!(text, ANSWER);
    assert_eq!(ids, answer.len() + 1, "the ids end with EOS");
    // The worker refuses a prompt longer than its context: a 400, not a 200 and an event.
    let s = Setup::new(false, 16, 4096).await;
    let req = post(
        "/generate",
        json!({"text": "a b c d e f g h i j k l m n o p q", "stream": true}),
    );
    let (status, body) = send_json(s.app(), req).await;
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
async fn every_body_goes_through_one_parser() {
    let s = Setup::normal().await;
    // Every POST route with a body it would serve, but for one unknown key.
    let messages = json!([{"role": "user", "content": "hi"}]);
    let routes = [
        (
            "/v1/chat/completions",
            json!({"model": "tiny", "messages": messages}),
        ),
        ("/v1/completions", json!({"model": "tiny", "prompt": "hi"})),
        ("/tokenize", json!({"prompt": "hi"})),
        ("/detokenize", json!({"tokens": [1]})),
        ("/generate", json!({"text": "hi"})),
    ];
    let raw = |path: &str, content_type: &str, body: &str| {
        Request::post(path)
            .header("content-type", content_type)
            .body(Body::from(body.to_string()))
            .unwrap()
    };
    for (path, mut good) in routes {
        let cases = [
            (raw(path, "text/plain", "{}"), "the body must be JSON with"),
            (
                raw(path, "application/json", "{"),
                "the body is not valid JSON",
            ),
            (
                raw(path, "application/json", "[1]"),
                "the body must be a JSON object",
            ),
        ];
        for (req, message) in cases {
            let (status, body) = send_json(s.app(), req).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
            let got = body["error"]["message"].as_str().unwrap();
            assert!(got.starts_with(message), "{path}: {got}");
        }
        good["bogus"] = json!(1);
        let (status, body) = send_json(s.app(), post(path, good)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
        assert_eq!(
            body["error"]["message"], "unsupported parameter `bogus`",
            "{path}"
        );
        assert_eq!(body["error"]["param"], "bogus", "{path}");
    }
    assert!(s.fake.log.lock().unwrap().generated.is_empty());
}

#[tokio::test]
async fn n_copies_go_to_one_worker_with_successive_seeds() {
    let s = Setup::normal().await;
    let (status, body) = send_json(s.app(), chat(json!({"n": 3, "seed": 10}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let indexes: Vec<_> = body["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["index"].clone())
        .collect();
    assert_eq!(indexes, [0, 1, 2]);
    let seeds: Vec<_> = s
        .fake
        .log
        .lock()
        .unwrap()
        .generated
        .iter()
        .map(|g| g.2.seed)
        .collect();
    assert_eq!(seeds, [Some(10), Some(11), Some(12)]);
    let answer = s.state.tokenizer.encode_blocking(ANSWER, false).len() as u64 + 1;
    assert_eq!(body["usage"]["completion_tokens"], 3 * answer);
}

#[tokio::test]
async fn a_bad_prompt_of_a_list_starts_none_of_them_and_is_named() {
    let s = Setup::normal().await;
    let body = json!({"model": "tiny", "prompt": [[1, 2, 3], [4, 5, 6], [99999999]], "n": 2});
    let (status, body) = send_json(s.app(), post("/v1/completions", body)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["param"], "prompt");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("`prompt[2]`: token id 99999999 is outside the vocabulary of "),
        "{message}"
    );
    let body = json!({"model": "tiny", "prompt": ["A", ""]});
    let (status, body) = send_json(s.app(), post("/v1/completions", body)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["param"], "prompt");
    assert_eq!(body["error"]["message"], "`prompt[1]`: the prompt is empty");
    assert!(
        s.fake.log.lock().unwrap().generated.is_empty(),
        "nothing reached the worker"
    );
    assert_eq!(s.state.admission.in_flight(), 0);
}

#[tokio::test]
async fn prompt_lists_times_n_with_echo_number_choices_prompt_major() {
    let s = Setup::normal().await;
    let body = json!({"model": "tiny", "prompt": ["A", "B"], "n": 2, "echo": true,
        "max_tokens": 2, "stream": true, "logprobs": 1});
    let (status, body) = send(s.app(), post("/v1/completions", body)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let mut texts = [String::new(), String::new(), String::new(), String::new()];
    for event in sse_events(&body).iter().filter(|e| *e != "[DONE]") {
        let chunk: Value = serde_json::from_str(event).unwrap();
        let choice = &chunk["choices"][0];
        let index = choice["index"].as_u64().unwrap() as usize;
        texts[index].push_str(choice["text"].as_str().unwrap());
    }
    assert_eq!(
        texts,
        [
            "AThe capital",
            "AThe capital",
            "BThe capital",
            "BThe capital"
        ]
    );
    let body = json!({"model": "tiny", "prompt": [[5, 6]], "echo": true, "max_tokens": 1,
        "logprobs": 0});
    let (_, body) = send_json(s.app(), post("/v1/completions", body)).await;
    let logprobs = &body["choices"][0]["logprobs"];
    assert_eq!(
        logprobs["token_logprobs"][0],
        Value::Null,
        "prompt tokens are not scored"
    );
    assert_eq!(logprobs["tokens"].as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn logit_bias_reaches_the_worker_and_is_checked_against_the_vocabulary() {
    let s = Setup::normal().await;
    let (status, _) = send_json(s.app(), chat(json!({"logit_bias": {"5": 100}}))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        s.fake.log.lock().unwrap().generated[0].2.logit_bias,
        [(5, 100.0)]
    );
    let (status, body) = send_json(s.app(), chat(json!({"logit_bias": {"99999": 1}}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["param"], "logit_bias");
}

#[tokio::test]
async fn stop_token_ids_are_checked_against_the_vocabulary() {
    let s = Setup::normal().await;
    let (status, _) = send_json(s.app(), chat(json!({"stop_token_ids": [5]}))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        s.fake.log.lock().unwrap().generated[0].2.stop_token_ids,
        [5]
    );
    let body = json!({"stop_token_ids": [5, 4000000000u32], "min_tokens": 1});
    let (status, body) = send_json(s.app(), chat(body)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["param"], "stop_token_ids");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("token id 4000000000 is outside the vocabulary of "));
    assert_eq!(
        s.fake.log.lock().unwrap().generated.len(),
        1,
        "nothing more reached the worker"
    );
}

#[tokio::test]
async fn metrics_count_requests_and_latencies() {
    let s = Setup::normal().await;
    let (status, _) = send(s.app(), chat(json!({}))).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = send(s.app(), chat(json!({"top_p": 2}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let req = Request::get("/metrics")
        .body(axum::body::Body::empty())
        .unwrap();
    let (status, text) = send(s.app(), req).await;
    assert_eq!(status, StatusCode::OK);
    for line in [
        "minisgl_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 1",
        "minisgl_requests_total{endpoint=\"/v1/chat/completions\",status=\"400\"} 1",
        "minisgl_time_to_first_token_seconds_count 1",
        "minisgl_e2e_request_latency_seconds_count 1",
        "minisgl_time_per_output_token_seconds_count 1",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
    assert!(text.contains("# TYPE minisgl_inter_token_latency_seconds histogram"));
}
