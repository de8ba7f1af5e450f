//! Happy paths: shapes of answers and streams, stop strings, logprobs, models, health.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};

use super::*;

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
    let chunks = json_events(&body);
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

/// A chat completion's `logprobs.content`, with `top_logprobs` alternatives a token.
async fn chat_logprobs(top_logprobs: u32, max_tokens: u32) -> Vec<Value> {
    let s = Setup::normal().await;
    let body = json!({"logprobs": true, "top_logprobs": top_logprobs, "max_tokens": max_tokens});
    let (status, body) = send_json(s.app(), chat(body)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .clone()
}

#[tokio::test]
async fn logprobs_come_back_in_chat_shape() {
    let content = chat_logprobs(2, 2).await;
    assert_eq!(content.len(), 2);
    assert_eq!(content[0]["logprob"], -0.5);
    assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 2);
    let token = content[0]["token"].as_str().unwrap();
    assert_eq!(content[0]["bytes"], json!(token.as_bytes()));
}

#[tokio::test]
async fn a_token_the_sampler_could_not_pick_reports_a_finite_floor() {
    let top = &chat_logprobs(3, 1).await[0]["top_logprobs"];
    assert_eq!(top[2]["logprob"], json!(-9999.0), "{top}");
    assert_eq!(top[1]["logprob"], json!(-1.5), "{top}");
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

#[tokio::test]
async fn completion_stream_has_text_chunks_only() {
    let s = Setup::normal().await;
    let body = json!({"model": "tiny", "prompt": [[5, 6]], "max_tokens": 4, "stream": true});
    let (status, text) = send(s.app(), post("/v1/completions", body)).await;
    assert_eq!(status, StatusCode::OK);
    let chunks = json_events(&text);
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));
    assert!(chunks[..chunks.len() - 1]
        .iter()
        .all(|c| c["choices"][0]["finish_reason"].is_null()));
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    let reply = s.state.tokenizer.encode_blocking(ANSWER, false);
    assert_eq!(streamed, s.state.tokenizer.decode(&reply[..4]));
    assert_eq!(s.fake.log.lock().unwrap().generated[0].1, [5, 6]);
}

#[tokio::test]
async fn every_served_name_is_accepted_and_a_404_lists_them() {
    let s = Setup::with(Options {
        model_names: &["tiny", "/models/tiny"],
        ..Options::default()
    })
    .await;
    let (_, body) = send_json(
        s.app(),
        Request::get("/v1/models").body(Body::empty()).unwrap(),
    )
    .await;
    let ids: Vec<&str> = body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["tiny", "/models/tiny"]);
    for name in &ids {
        // The openai SDK's `models.retrieve(name)`: GET /v1/models/{name}, slashes and all.
        let uri = format!("/v1/models/{name}");
        let (status, body) =
            send_json(s.app(), Request::get(uri).body(Body::empty()).unwrap()).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            (&body["id"], &body["object"]),
            (&json!(name), &json!("model"))
        );
    }
    let missing = Request::get("/v1/models/gpt-4")
        .body(Body::empty())
        .unwrap();
    let (status, body) = send_json(s.app(), missing).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "model_not_found");
    for name in ids {
        let req = post(
            "/v1/completions",
            json!({"model": name, "prompt": "Capital?", "max_tokens": 2}),
        );
        let (status, body) = send_json(s.app(), req).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["model"], name, "the name the client used is echoed");
    }
    let (status, body) = send_json(s.app(), chat(json!({"model": "gpt-4"}))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        body["error"]["message"],
        "The model `gpt-4` does not exist; this server serves `tiny`, `/models/tiny`"
    );
    assert_eq!(body["error"]["code"], "model_not_found");
}

#[tokio::test]
async fn an_assistant_reply_with_its_reasoning_can_be_sent_back() {
    let s = Setup::normal().await;
    let turns = |role: &str| {
        json!({"messages": [
            {"role": "user", "content": "Capital of France?"},
            {"role": role, "content": "Paris.", "reasoning_content": "It is Paris."},
            {"role": "user", "content": "And of Italy?"},
        ]})
    };
    let (status, body) = send_json(s.app(), chat(turns("assistant"))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = send_json(s.app(), chat(turns("user"))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(
        body["error"]["message"],
        "`messages[1].reasoning_content` is only allowed on assistant turns; got \"user\""
    );
}

#[tokio::test]
async fn a_reply_the_openai_sdk_s_helpers_returned_can_be_sent_back() {
    let s = Setup::normal().await;
    // As `messages.append(completion.choices[0].message)` sends a `parse()` or `stream()`
    // helper's message: the parsed content and arguments, and OpenAI's empty reply fields.
    let reply = |refusal: Value| {
        json!({"messages": [
            {"role": "user", "content": "Capital of France?"},
            {"role": "assistant", "content": "{\"city\": \"Paris\"}", "parsed": {"city": "Paris"},
             "refusal": refusal, "audio": null, "function_call": null, "annotations": [],
             "tool_calls": [{"id": "call_1", "type": "function", "index": 0,
                 "function": {"name": "f", "arguments": "{}", "parsed_arguments": {}}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
        ]})
    };
    let (status, body) = send_json(s.app(), chat(reply(Value::Null))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = send_json(s.app(), chat(reply(json!("I can't")))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(
        body["error"]["message"],
        "`messages[1].refusal` is not supported (only null or empty)"
    );
}
