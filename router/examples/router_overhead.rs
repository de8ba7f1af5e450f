//! benches/router_overhead: the router's own cost, against a mock worker that answers
//! instantly. Not a test; run `benches/router_overhead.sh`.
//!
//! Three parts in one process, each on its own runtime as they would be in production: the
//! router (`api::app` on a multi-thread runtime, TCP on 127.0.0.1), the instant mock worker
//! of examples/common/mock_worker.rs on its own thread (a request's 64 tokens come in 64
//! consecutive steps, batched like a real worker's), and a hyper HTTP/1.1 client.
//!
//! 1. Throughput: `--connections` keep-alive clients in a closed loop, each sending streamed
//!    /v1/completions requests (512-token text prompt, distinct per request; 64 tokens,
//!    ignore_eos) and reading every SSE event to `[DONE]`.
//! 2. Latency at a fixed rate (open loop, `--rate` req/s, one connection per request): time
//!    to the first token event and to `[DONE]`. The mock does no work, so this is what the
//!    router (tokenize, route, ZMQ, detokenize, SSE) adds, plus the mock's own loop.

#[path = "common/mock_worker.rs"]
mod mock_worker;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use _router::api::admission::Admission;
use _router::api::app;
use _router::api::sampling_defaults::SamplingSource;
use _router::config::RoutingPolicy;
use _router::model_files::load_model_files;
use _router::routing::policy::create_policy;
use _router::state::{AppState, Shared};
use _router::worker::launcher::wait_ready;
use _router::worker::WorkerClient;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;

const PROMPT_TOKENS: usize = 512;
const MAX_TOKENS: u32 = 64;

struct Args {
    model: std::path::PathBuf,
    connections: usize,
    seconds: f64,
    rate: f64,
    /// Send the prompts as token ids (no tokenization in the router).
    ids: bool,
}

fn args() -> Args {
    let mut a = Args {
        model: dirs_default_model(),
        connections: 256,
        seconds: 5.0,
        rate: 500.0,
        ids: false,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    a.ids = argv.iter().any(|x| x == "--ids");
    let argv: Vec<String> = argv.into_iter().filter(|x| x != "--ids").collect();
    for pair in argv.chunks(2) {
        let value = pair.get(1).cloned().unwrap_or_default();
        match pair[0].as_str() {
            "--model" => a.model = value.into(),
            "--connections" => a.connections = value.parse().unwrap(),
            "--seconds" => a.seconds = value.parse().unwrap(),
            "--rate" => a.rate = value.parse().unwrap(),
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

fn dirs_default_model() -> std::path::PathBuf {
    let home = std::env::var("HOME").unwrap_or_default();
    format!("{home}/.cache/minisgl/SmolLM2-135M-Instruct").into()
}

fn main() {
    let args = args();
    let files = load_model_files(&args.model, None, SamplingSource::Model).expect("model folder");
    // A prompt of exactly PROMPT_TOKENS tokens: " hello" is one token in SmolLM2's vocabulary.
    let unit = " hello";
    let base = unit.repeat(PROMPT_TOKENS - 8);
    let reply: Vec<u32> = files.tokenizer.encode_blocking(
        " the quick brown fox jumps over the lazy dog, and then",
        false,
    );
    let socket_file = format!("/tmp/minisgl-bench-{}.sock", std::process::id());
    let address = format!("ipc://{socket_file}");
    let mock_address = address.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(mock_worker::mock_worker(mock_address, reply));
    });
    let router_rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let probe_text = format!("Request 0:{base}");
    let prompts = Prompts {
        ids: args.ids.then(|| {
            let hello = files.tokenizer.encode_blocking(unit, false)[0];
            vec![hello; PROMPT_TOKENS]
        }),
        text: base,
    };
    let port = router_rt.block_on(async move {
        let client = WorkerClient::connect(&address);
        let ready = wait_ready(&client, Duration::from_secs(10)).await.unwrap();
        let state = AppState::new(Shared {
            model_names: vec![files.name],
            tokenizer: files.tokenizer,
            template: files.template,
            workers: vec![client],
            policy: create_policy(RoutingPolicy::CacheAware, Default::default()),
            routing: Default::default(),
            max_context: ready.max_context.into(),
            started: 0,
            metrics: Default::default(),
            admission: Admission::new(usize::MAX, std::time::Duration::ZERO),
            web_ui: true,
            log_requests: false,
            api_key: None,
            limits: Default::default(),
            sampling_defaults: files.sampling_defaults,
            tool_format: _router::text::tool_calls::ToolFormat::Hermes,
            reasoning: None,
        });
        let probe = state.tokenizer.encode_blocking(&probe_text, true);
        eprintln!("text prompt: {} tokens", probe.len());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, app(state)).await.unwrap() });
        port
    });
    let client_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    client_rt.block_on(async move {
        let prompts = Arc::new(prompts);
        throughput(port, prompts.clone(), args.connections, args.seconds).await;
        latency(port, prompts, args.rate, args.seconds).await;
    });
    let _ = std::fs::remove_file(socket_file); // the mock worker bound it; zmq leaves it
}

/// Distinct 512-token prompts: text (tokenized by the router) or token ids.
struct Prompts {
    text: String,
    ids: Option<Vec<u32>>,
}

fn body(prompts: &Prompts, i: u64) -> Bytes {
    let prompt = match &prompts.ids {
        // A distinct first token per request, then the shared body.
        Some(ids) => {
            let mut ids = ids.clone();
            ids[0] = 1000 + (i % 40_000) as u32;
            serde_json::json!(ids)
        }
        None => serde_json::json!(format!("Request {i}:{}", prompts.text)),
    };
    serde_json::json!({"model": "SmolLM2-135M-Instruct", "prompt": prompt, "max_tokens": MAX_TOKENS,
        "ignore_eos": true, "stream": true, "temperature": 0})
    .to_string()
    .into()
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(port: u16) -> Sender {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    stream.set_nodelay(true).unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

/// Sends one streamed completion; returns (time to first event, time to [DONE]).
async fn one(sender: &mut Sender, body: Bytes) -> (Duration, Duration) {
    let start = Instant::now();
    let req = Request::post("/v1/completions")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(body))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut first = None;
    let mut tail = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            first.get_or_insert_with(|| start.elapsed());
            // The last bytes seen, across frame boundaries.
            tail.extend_from_slice(&data);
            let cut = tail.len().saturating_sub(32);
            tail.drain(..cut);
        }
    }
    assert!(String::from_utf8_lossy(&tail).contains("[DONE]"));
    (first.unwrap(), start.elapsed())
}

async fn throughput(port: u16, base: Arc<Prompts>, connections: usize, seconds: f64) {
    let counter = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let warmup = Duration::from_secs(1);
    let deadline = Instant::now() + warmup + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for c in 0..connections {
        let (base, counter, done) = (base.clone(), counter.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut sender = connect(port).await;
            let start = Instant::now();
            let mut i = c as u64 * 1_000_000;
            while Instant::now() < deadline {
                one(&mut sender, body(&base, i)).await;
                i += 1;
                if start.elapsed() > warmup {
                    done.fetch_add(1, Ordering::Relaxed);
                }
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let n = done.load(Ordering::Relaxed);
    println!(
        "throughput: {connections} connections, {seconds} s after 1 s warm-up: {n} streamed completions, {:.0} req/s ({:.0} tokens/s out)",
        n as f64 / seconds,
        n as f64 * f64::from(MAX_TOKENS) / seconds
    );
}

async fn latency(port: u16, base: Arc<Prompts>, rate: f64, seconds: f64) {
    let total = (rate * seconds) as u64;
    let interval = Duration::from_secs_f64(1.0 / rate);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..total {
        let due = start + interval * i as u32;
        tokio::time::sleep_until(due.into()).await;
        let base = base.clone();
        tasks.push(tokio::spawn(async move {
            let mut sender = connect(port).await;
            one(&mut sender, body(&base, 10_000_000 + i)).await
        }));
    }
    let mut first = Vec::new();
    let mut full = Vec::new();
    for t in tasks {
        let (f, e) = t.await.unwrap();
        first.push(f);
        full.push(e);
    }
    let achieved = total as f64 / start.elapsed().as_secs_f64();
    println!(
        "latency at {rate} req/s offered ({achieved:.0} achieved, {total} requests): \
         first token p50 {} p99 {}; [DONE] p50 {} p99 {}",
        ms(pct(&mut first, 0.50)),
        ms(pct(&mut first, 0.99)),
        ms(pct(&mut full, 0.50)),
        ms(pct(&mut full, 0.99)),
    );
}

fn pct(v: &mut [Duration], q: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}
