use std::sync::{Arc, Mutex};

use futures::{stream, StreamExt};
use http_body::Body as _;
use http_body_util::BodyExt;

use super::*;

#[test]
fn a_request_without_an_id_gets_a_new_one() {
    let (a, b) = (request_id(None).unwrap(), request_id(None).unwrap());
    assert_ne!(a, b);
    for id in [a, b] {
        let hex = id.strip_prefix("req-").unwrap();
        assert_eq!(hex.len(), 16, "{id}");
        assert!(hex.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
    }
}

#[test]
fn the_clients_id_is_kept_when_it_is_1_to_128_visible_characters() {
    for id in ["a", "client-42/retry#3", &"x".repeat(MAX_ID_LEN)] {
        let value = HeaderValue::from_str(id).unwrap();
        assert_eq!(request_id(Some(&value)).unwrap(), id);
    }
    let long = "x".repeat(MAX_ID_LEN + 1);
    let bad = [
        HeaderValue::from_static(""),
        HeaderValue::from_static("two words"),
        HeaderValue::from_str(&long).unwrap(),
        HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap(),
    ];
    for value in bad {
        let err = request_id(Some(&value)).unwrap_err();
        assert_eq!(err.status(), 400);
        let message = err.message();
        assert!(
            message.contains("`x-request-id`") && message.contains("1 to 128"),
            "{message}"
        );
    }
}

#[test]
fn the_log_line_names_the_request_and_its_times() {
    let access = |id: &str, method, path: &str, status| Access {
        id: id.into(),
        method,
        path: path.into(),
        status,
        head: Duration::from_micros(2_345),
    };
    let end = Duration::from_millis(1_500);
    let sent = access("req-1", Method::POST, "/v1/completions", 200).line(end, true);
    assert_eq!(
        sent,
        "request req-1: POST /v1/completions 200, head 2.3 ms, sent 1500.0 ms"
    );
    let gone = access("c-9", Method::GET, "/health", 503).line(end, false);
    assert!(
        gone.ends_with("503, head 2.3 ms, client gone after 1500.0 ms"),
        "{gone}"
    );
}

/// A response whose body end `watch` reports into the returned list.
fn reported(body: Body) -> (Response, Arc<Mutex<Vec<bool>>>) {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let sink = calls.clone();
    let done: Done = Box::new(move |sent| sink.lock().unwrap().push(sent));
    let response = watch(Response::new(body), Span::none(), Some(done));
    (response, calls)
}

#[tokio::test]
async fn a_whole_body_is_reported_sent_once_and_keeps_its_length() {
    let (response, calls) = reported(Body::from("{\"ok\": true}"));
    assert_eq!(response.body().size_hint().exact(), Some(12)); // Content-Length survives
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&bytes[..], b"{\"ok\": true}");
    assert_eq!(*calls.lock().unwrap(), [true]);
}

#[tokio::test]
async fn a_stream_dropped_before_its_end_is_reported_unsent() {
    let chunks = stream::iter(["data: 1\n\n", "data: 2\n\n", "data: [DONE]\n\n"])
        .map(|c| Ok::<_, std::io::Error>(Bytes::from(c)));
    let (response, calls) = reported(Body::from_stream(chunks));
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&first[..], b"data: 1\n\n");
    assert!(calls.lock().unwrap().is_empty());
    drop(body); // the client went away
    assert_eq!(*calls.lock().unwrap(), [false]);
}

#[tokio::test]
async fn a_stream_read_to_its_end_is_reported_sent() {
    let chunks = stream::iter(["a", "b"]).map(|c| Ok::<_, std::io::Error>(Bytes::from(c)));
    let (response, calls) = reported(Body::from_stream(chunks));
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&bytes[..], b"ab");
    assert_eq!(*calls.lock().unwrap(), [true]);
}

#[test]
fn an_empty_body_dropped_unpolled_counts_as_sent() {
    let (response, calls) = reported(Body::empty());
    drop(response);
    assert_eq!(*calls.lock().unwrap(), [true]);
}

/// What the router's `tracing` events print, captured.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn what_a_stream_logs_is_in_its_requests_span() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);
    let chunks = stream::iter(["a", "b"]).map(|c| {
        tracing::warn!("sending {c}");
        Ok::<_, std::io::Error>(Bytes::from(c))
    });
    let span = tracing::info_span!("request", id = %"client-7"); // as `identify` records it
    let response = watch(Response::new(Body::from_stream(chunks)), span, None);
    response.into_body().collect().await.unwrap();
    tracing::warn!("after the response");
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines[0].contains("request{id=client-7}") && lines[0].ends_with("sending a"),
        "{text}"
    );
    assert!(lines[1].contains("request{id=client-7}") && lines[1].ends_with("sending b"));
    assert!(!lines[2].contains("request{"), "{text}");
}
