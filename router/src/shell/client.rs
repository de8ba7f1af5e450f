//! The shell's side of the HTTP API: the served model's name, and one streamed chat answer
//! (SSE from `/v1/chat/completions`) handed over piece by piece. Dropping an answer's future
//! closes its connection, which makes the router abort the request in the worker.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};

pub struct ChatClient {
    http: reqwest::Client,
    base: String,
    api_key: Option<String>,
}

/// What one answer produced and how fast.
pub struct Answer {
    pub content: String,
    pub ttft: Option<Duration>,
    pub elapsed: Duration,
    pub completion_tokens: Option<u64>,
}

impl ChatClient {
    /// `base` is the server's root URL (`http://HOST:PORT`).
    pub fn new(base: &str, api_key: Option<String>) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| format!("cannot make an HTTP client: {e}"))?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_string(),
            api_key,
        })
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self.http.request(method, format!("{}{path}", self.base));
        match &self.api_key {
            Some(key) => request.bearer_auth(key),
            None => request,
        }
    }

    /// The name `/v1/models` lists first.
    pub async fn model(&self) -> Result<String, String> {
        let response = self
            .send(self.request(reqwest::Method::GET, "/v1/models"))
            .await?;
        let bytes = response
            .bytes()
            .await
            .map_err(|e| format!("/v1/models: {e}"))?;
        let body: Value = serde_json::from_slice(&bytes).map_err(|e| format!("/v1/models: {e}"))?;
        body["data"][0]["id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("/v1/models lists no model: {body}"))
    }

    /// Streams the answer to `body` (a chat request without `stream`), calling `on_text`
    /// with each piece as it arrives.
    pub async fn chat(
        &self,
        mut body: Value,
        mut on_text: impl FnMut(&str),
    ) -> Result<Answer, String> {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let started = Instant::now();
        let request = self
            .request(reqwest::Method::POST, "/v1/chat/completions")
            .header("content-type", "application/json")
            .body(body.to_string());
        let response = self.send(request).await?;
        let mut answer = Answer {
            content: String::new(),
            ttft: None,
            elapsed: Duration::ZERO,
            completion_tokens: None,
        };
        let mut bytes = response.bytes_stream();
        let mut buffer = String::new();
        'stream: while let Some(chunk) = bytes.next().await {
            let chunk = chunk.map_err(|e| format!("the stream broke: {e}"))?;
            buffer.push_str(&String::from_utf8_lossy(&chunk));
            for data in take_events(&mut buffer) {
                if data == "[DONE]" {
                    break 'stream;
                }
                let event: Value =
                    serde_json::from_str(&data).map_err(|e| format!("bad event {data}: {e}"))?;
                if let Some(message) = event["error"]["message"].as_str() {
                    return Err(message.to_string());
                }
                if let Some(n) = event["usage"]["completion_tokens"].as_u64() {
                    answer.completion_tokens = Some(n);
                }
                if let Some(text) = event["choices"][0]["delta"]["content"].as_str() {
                    if !text.is_empty() {
                        answer.ttft.get_or_insert_with(|| started.elapsed());
                        answer.content.push_str(text);
                        on_text(text);
                    }
                }
            }
        }
        answer.elapsed = started.elapsed();
        Ok(answer)
    }

    /// Sends; a status other than 2xx becomes its OpenAI error message.
    async fn send(&self, request: reqwest::RequestBuilder) -> Result<reqwest::Response, String> {
        let response = request
            .send()
            .await
            .map_err(|e| format!("cannot reach {}: {e}", self.base))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let text = response.text().await.unwrap_or_default();
        let message = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
            .unwrap_or(text);
        Err(format!("{}: {message}", status.as_u16()))
    }
}

/// Removes every complete SSE event from `buffer` -> their `data:` payloads, in order.
fn take_events(buffer: &mut String) -> Vec<String> {
    let mut events = Vec::new();
    while let Some(end) = buffer.find("\n\n") {
        let block: String = buffer.drain(..end + 2).collect();
        let data: Vec<&str> = block
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
            .collect();
        if !data.is_empty() {
            events.push(data.join("\n"));
        }
    }
    events
}

impl Answer {
    /// `TTFT 0.21 s · 25.3 tok/s · 8 tokens`, as the chat page shows it.
    pub fn stats(&self) -> String {
        let ttft = self.ttft.unwrap_or(self.elapsed);
        let mut parts = vec![format!("TTFT {:.2} s", ttft.as_secs_f64())];
        if let Some(n) = self.completion_tokens {
            let decode = (self.elapsed - ttft).as_secs_f64();
            if n > 1 && decode > 0.0 {
                parts.push(format!("{:.1} tok/s", (n - 1) as f64 / decode));
            }
            parts.push(format!("{n} tokens"));
        }
        parts.join(" · ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_taken_whole_and_in_order() {
        let mut buffer = String::from("data: {\"a\":1}\n\ndata: [DONE]\n\ndata: {\"b\"");
        assert_eq!(take_events(&mut buffer), ["{\"a\":1}", "[DONE]"]);
        assert_eq!(buffer, "data: {\"b\"");
        buffer.push_str(":2}\n\n");
        assert_eq!(take_events(&mut buffer), ["{\"b\":2}"]);
        assert!(buffer.is_empty());
    }

    #[test]
    fn stats_read_like_the_page() {
        let answer = Answer {
            content: "x".into(),
            ttft: Some(Duration::from_millis(250)),
            elapsed: Duration::from_millis(1250),
            completion_tokens: Some(11),
        };
        assert_eq!(answer.stats(), "TTFT 0.25 s · 10.0 tok/s · 11 tokens");
    }
}
