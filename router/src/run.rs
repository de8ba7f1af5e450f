//! The server's life: load the model folder, bind the port, start and attach workers, wait
//! for their `ready`, serve until Ctrl-C/SIGTERM, then stop the workers cleanly.

use std::future::{Future, IntoFuture};
use std::time::Duration;

use futures::future::join_all;
use tokio::net::TcpListener;

use crate::api::admission::Admission;
use crate::api::routes::app;
use crate::config::Config;
use crate::model_files::{load_model_files, ModelFiles};
use crate::routing::policy::create_policy;
use crate::signals::Signals;
use crate::state::{unix_now, AppState, Shared};
use crate::text::tool_calls::ToolFormat;
use crate::worker::launcher::{wait_ready, LaunchSpec, LocalWorker};
use crate::worker::WorkerClient;
use crate::worker::{gpus, tp_check};

/// How long open connections get to close once no request is in flight any more.
const DRAIN: Duration = Duration::from_secs(5);
/// How often the shutdown looks whether the requests in flight have finished.
const DRAIN_POLL: Duration = Duration::from_millis(50);

/// Runs the server to the end; the exit code (0 after a clean shutdown, 1 on startup failure).
pub fn run(config: Config, python: String) -> i32 {
    init_logging(&config.log_level);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("cannot start the async runtime: {e}")),
    };
    let result = match &config.url {
        Some(url) => runtime.block_on(crate::shell::run(url, config.api_key.clone())),
        None => runtime.block_on(serve(config, python)),
    };
    match result {
        Ok(()) => 0,
        Err(message) => fail(&message),
    }
}

fn fail(message: &str) -> i32 {
    eprintln!("minisgl-router: error: {message}");
    1
}

/// Python's logging level for a plain `--log-level` (a RUST_LOG-style filter such as
/// `minisgl=debug` leaves the workers at their INFO).
fn python_log_level(level: &str) -> Option<&'static str> {
    match level.trim().to_ascii_lowercase().as_str() {
        "error" => Some("ERROR"),
        "warn" | "warning" => Some("WARNING"),
        "info" => Some("INFO"),
        "debug" | "trace" => Some("DEBUG"),
        _ => None,
    }
}

fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .try_init();
}

async fn serve(config: Config, python: String) -> Result<(), String> {
    config.check()?;
    if let Some(warning) = config.exposure_warning() {
        tracing::warn!("{warning}");
    }
    let mut signals = Signals::new()?;
    let model_dir = config.model.clone().ok_or("no --model given")?;
    let files = load_model_files(&model_dir, None, config.sampling_defaults)?;
    if config.local_workers() > 0 {
        tp_check::check(&model_dir, config.tp)?;
    }
    let address = format!("{}:{}", config.host, config.port);
    let listener = crate::listen::listen(&address)
        .await
        .map_err(|e| format!("cannot listen on {address}: {e}"))?;
    let spec = LaunchSpec {
        python,
        model: model_dir,
        device: config.device.as_str().into(),
        dtype: config.dtype.as_str().into(),
        page_size: config.page_size,
        max_running: config.max_running,
        cache: config.cache.map(|c| c.as_str()),
        chunk_size: config.chunk_size,
        mixed_chunk_size: config.mixed_chunk_size,
        mixed_step_tokens: config.mixed_step_tokens,
        schedule_policy: config.schedule_policy.map(|p| p.as_str()),
        kv_tokens: config.kv_tokens,
        cuda_graph_max_bs: config.cuda_graph_max_bs,
        cuda_graph_max_tokens: config.cuda_graph_max_tokens,
        attention_backend: config.attention_backend.map(|b| b.as_str()),
        gemm: config.gemm.map(|g| g.as_str()),
        kv_cache_dtype: config.kv_cache_dtype.map(|d| d.as_str()),
        load_format: config.load_format.map(|f| f.as_str()),
        tp: config.tp,
        count: config.local_workers(),
        log_level: python_log_level(&config.log_level),
        gpus: gpus::assign(
            config.device.as_str(),
            config.local_workers(),
            config.tp,
            std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(),
            gpus::found(),
        )?,
    };
    let mut local = Vec::new();
    let mut clients = Vec::new();
    for index in 0..spec.count {
        match LocalWorker::spawn(&spec, index) {
            Ok((worker, client)) => {
                local.push(worker);
                clients.push(client);
            }
            Err(e) => {
                stop_workers(local, &clients).await;
                return Err(e);
            }
        }
    }
    clients.extend(
        config
            .remote_workers
            .iter()
            .map(|a| WorkerClient::connect_remote(a)),
    );
    let result = serve_http(listener, files, clients.clone(), &config, &mut signals).await;
    stop_workers(local, &clients).await;
    result
}

/// Waits for every worker's `ready`; the smallest context any of them serves.
async fn wait_all_ready(clients: &[WorkerClient], timeout: Duration) -> Result<u32, String> {
    let started = std::time::Instant::now();
    tracing::info!("waiting for {} worker(s) to be ready", clients.len());
    let results = join_all(clients.iter().map(|c| wait_ready(c, timeout))).await;
    let mut max_context = u32::MAX;
    for result in results {
        max_context = max_context.min(result?.max_context);
    }
    let secs = started.elapsed().as_secs_f64();
    tracing::info!("{} worker(s) ready in {secs:.1} s", clients.len());
    Ok(max_context)
}

/// Serves HTTP from the start (/health says 503 while the workers load) until a signal, or
/// with `--shell` until the shell ends.
async fn serve_http(
    listener: TcpListener,
    files: ModelFiles,
    workers: Vec<WorkerClient>,
    config: &Config,
    signals: &mut Signals,
) -> Result<(), String> {
    let tool_format = config.chat.tool_call_parser.unwrap_or_else(|| {
        let template = files.template.as_ref();
        template.map_or(ToolFormat::Hermes, |t| ToolFormat::detect(t.source()))
    });
    let state = AppState::new(Shared {
        model_names: crate::api::models::served_names(config, &files.name),
        tokenizer: files.tokenizer,
        template: files.template,
        workers: workers.clone(),
        policy: create_policy(config.routing_policy, config.cache_aware),
        routing: Default::default(),
        max_context: 0.into(),
        started: unix_now(),
        metrics: Default::default(),
        admission: Admission::new(config.max_requests.get(), config.limits.admission_wait()),
        web_ui: !config.no_web_ui,
        log_requests: config.log_requests,
        api_key: config.api_key.clone(),
        limits: config.limits.clone(),
        sampling_defaults: files.sampling_defaults,
        tool_format,
        reasoning: config.chat.reasoning_parser,
    });
    let address = listener
        .local_addr()
        .map_err(|e| format!("cannot read the bound address: {e}"))?;
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let server = axum::serve(listener, app(state.clone())).with_graceful_shutdown(async move {
        let _ = stop_rx.wait_for(|s| *s).await;
    });
    let server = tokio::spawn(server.into_future());
    let ready = tokio::select! {
        ready = wait_all_ready(&workers, config.ready_timeout()) => ready.map(Some),
        _ = signals.next(true) => Ok(None),
    };
    let result = match ready {
        Ok(Some(max_context)) => {
            state.set_max_context(max_context);
            let url = local_url(address);
            let page = if config.no_web_ui {
                String::new()
            } else {
                format!("chat page {url}/ , ")
            };
            tracing::info!(model = %state.model_name(), max_context, "ready: {page}API {url}/v1");
            let served = serve_until_stopped(config, &url, signals).await;
            drain(&state, config.shutdown_timeout(), signals.next(true)).await;
            served
        }
        Ok(None) => {
            tracing::info!("shutting down while the workers were starting");
            Ok(())
        }
        Err(e) => Err(e),
    };
    let _ = stop_tx.send(true);
    if tokio::time::timeout(DRAIN, server).await.is_err() {
        tracing::warn!(
            "open requests did not finish within {} s; closing them",
            DRAIN.as_secs()
        );
    }
    result
}

/// Stops admitting (new requests get 503), gives the requests in flight up to `timeout` to
/// finish (`cut_short`, a second signal, ends the wait), then aborts the rest in their
/// workers (their clients get a 503 error naming `--shutdown-timeout`).
pub async fn drain(state: &AppState, timeout: Duration, cut_short: impl Future<Output = ()>) {
    state.admission.close();
    let in_flight = state.admission.in_flight();
    if in_flight == 0 {
        tracing::info!("shutting down");
        return;
    }
    tracing::info!(
        "shutting down: waiting up to {} s for {in_flight} request(s) in flight \
         (--shutdown-timeout); new requests get 503",
        timeout.as_secs_f32()
    );
    let started = tokio::time::Instant::now();
    let finished = async {
        while state.admission.in_flight() > 0 {
            tokio::time::sleep(DRAIN_POLL).await;
        }
    };
    tokio::select! {
        _ = tokio::time::timeout(timeout, finished) => {}
        _ = cut_short => tracing::info!("a second signal: aborting them now"),
    }
    let reason = "the server shut down before this request finished (--shutdown-timeout)";
    let aborted: usize = state.workers.iter().map(|w| w.abort_all(reason)).sum();
    if aborted > 0 {
        tracing::warn!(
            "aborted {aborted} request(s) still in flight after {:.0} s",
            started.elapsed().as_secs_f32()
        );
    }
}

/// Until SIGTERM or Ctrl-C; with `--shell`, until the shell ends or SIGTERM (Ctrl-C is the
/// shell's then: it stops an answer).
async fn serve_until_stopped(
    config: &Config,
    url: &str,
    signals: &mut Signals,
) -> Result<(), String> {
    if !config.shell {
        signals.next(true).await;
        return Ok(());
    }
    tokio::select! {
        result = crate::shell::run(url, config.api_key.clone()) => result,
        _ = signals.next(false) => Ok(()),
    }
}

/// The URL this process reaches its own server at (loopback when bound to every address).
fn local_url(mut address: std::net::SocketAddr) -> String {
    if address.ip().is_unspecified() {
        address.set_ip(match address {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    format!("http://{address}")
}

async fn stop_workers(local: Vec<LocalWorker>, clients: &[WorkerClient]) {
    // Remote workers keep running: they were started elsewhere (the next router to connect
    // to one says hello, and it drops what this one left).
    join_all(
        local
            .into_iter()
            .zip(clients)
            .map(|(worker, client)| worker.stop(client)),
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::sampling_defaults::SamplingSource;
    use crate::text::tokenizer::tests::tiny_model_dir;
    use clap::Parser;
    use std::path::Path;

    #[test]
    fn plain_log_levels_reach_the_workers_filters_do_not() {
        assert_eq!(python_log_level("warn"), Some("WARNING"));
        assert_eq!(python_log_level("DEBUG"), Some("DEBUG"));
        assert_eq!(python_log_level("trace"), Some("DEBUG"));
        assert_eq!(python_log_level("minisgl=debug,info"), None);
    }

    #[test]
    fn a_missing_model_folder_fails_startup_with_one_line() {
        let config =
            Config::try_parse_from(["r", "--model", "/nonexistent/model", "--port", "0"]).unwrap();
        assert_eq!(run(config, "python3".into()), 1);
        let err = load_model_files(Path::new("/nonexistent/model"), None, SamplingSource::Model)
            .err()
            .unwrap();
        assert_eq!(err, "--model /nonexistent/model is not a folder");
    }

    #[tokio::test]
    async fn a_worker_dying_before_ready_fails_startup() {
        let model = tiny_model_dir().display().to_string();
        let config = Config::try_parse_from(["r", "--model", &model, "--port", "0"]).unwrap();
        // `false` stands in for python: the worker exits 1 at once.
        let err = serve(config, "false".into()).await.unwrap_err();
        assert_eq!(err, "worker 0 exited before it was ready (exit status: 1)");
    }

    #[tokio::test]
    async fn a_port_in_use_fails_startup() {
        let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = taken.local_addr().unwrap().port().to_string();
        let model = tiny_model_dir().display().to_string();
        let config = Config::try_parse_from(["r", "--model", &model, "--port", &port]).unwrap();
        let err = serve(config, "python3".into()).await.unwrap_err();
        assert!(
            err.starts_with(&format!("cannot listen on 127.0.0.1:{port}")),
            "{err}"
        );
    }
}
