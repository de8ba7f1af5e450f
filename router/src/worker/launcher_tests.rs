//! Tests of `launcher.rs`: the worker command line, its environment, the CPU split.

use super::super::supervisor::TERM_GRACE;
use super::*;

fn spec(python: &str, count: usize, device: &str) -> LaunchSpec {
    LaunchSpec {
        python: python.into(),
        model: "/models/m".into(),
        device: device.into(),
        dtype: "auto".into(),
        page_size: Some(16),
        max_running: None,
        cache: Some("naive"),
        chunk_size: None,
        mixed_chunk_size: Some(256),
        mixed_step_tokens: Some(192),
        schedule_policy: None,
        kv_tokens: None,
        cuda_graph_max_bs: Some(0),
        cuda_graph_max_tokens: None,
        attention_backend: Some("torch"),
        gemm: Some("cublas"),
        kv_cache_dtype: Some("fp8_e4m3"),
        load_format: Some("dummy"),
        tp: 1,
        count,
        gpus: vec![None; count],
        log_level: Some("WARNING"),
    }
}

#[test]
fn cpu_workers_split_the_cores_unless_the_user_chose() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(spec("python3", 1, "cpu").cpu_threads(false), None);
    assert_eq!(spec("python3", 2, "cuda").cpu_threads(false), None);
    assert_eq!(spec("python3", 2, "cpu").cpu_threads(true), None);
    assert_eq!(
        spec("python3", 2, "cpu").cpu_threads(false),
        Some((cores / 2).max(1))
    );
    assert_eq!(
        spec("python3", 2, "auto").cpu_threads(false),
        Some((cores / 2).max(1))
    );
    assert_eq!(
        spec("python3", 4 * cores, "cpu").cpu_threads(false),
        Some(1)
    );
}

#[test]
fn command_line_carries_the_worker_flags() {
    let s = spec("python3", 1, "cpu");
    let cmd = s.command(0, "ipc:///tmp/x.sock");
    let args: Vec<_> = cmd
        .as_std()
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        args,
        [
            "-m",
            "minisgl_worker",
            "--model",
            "/models/m",
            "--listen",
            "ipc:///tmp/x.sock",
            "--device",
            "cpu",
            "--dtype",
            "auto",
            "--parent-pid",
            &std::process::id().to_string(),
            "--page-size",
            "16",
            "--cache",
            "naive",
            "--mixed-chunk-size",
            "256",
            "--mixed-step-tokens",
            "192",
            "--cuda-graph-max-bs",
            "0",
            "--attention-backend",
            "torch",
            "--gemm",
            "cublas",
            "--kv-cache-dtype",
            "fp8_e4m3",
            "--load-format",
            "dummy"
        ]
    );
    let level = cmd
        .as_std()
        .get_envs()
        .find(|(k, _)| *k == "MINISGL_LOG_LEVEL")
        .and_then(|(_, v)| v.map(|v| v.to_string_lossy().into_owned()));
    if std::env::var_os("MINISGL_LOG_LEVEL").is_none() {
        assert_eq!(
            level.as_deref(),
            Some("WARNING"),
            "--log-level warn reaches the worker"
        );
    }
}

#[test]
fn tp_and_gpus_reach_the_worker() {
    let mut s = spec("python3", 2, "cuda");
    s.tp = 2;
    s.gpus = vec![Some("0,1".into()), Some("2,3".into())];
    let cmd = s.command(1, "ipc:///tmp/x.sock");
    let args: Vec<_> = cmd
        .as_std()
        .get_args()
        .map(|a| a.to_string_lossy())
        .collect();
    assert!(
        args.windows(2).any(|w| w[0] == "--tp" && w[1] == "2"),
        "{args:?}"
    );
    let env: Vec<_> = cmd.as_std().get_envs().collect();
    assert!(env.contains(&(
        std::ffi::OsStr::new("CUDA_VISIBLE_DEVICES"),
        Some(std::ffi::OsStr::new("2,3"))
    )));
}

#[tokio::test]
async fn a_worker_that_dies_before_ready_fails_startup_with_its_status() {
    // `false` ignores its arguments and exits 1 at once.
    let (worker, client) = LocalWorker::spawn(&spec("false", 1, "cpu"), 0).unwrap();
    let err = wait_ready(&client, Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(err.contains("worker 0 exited before it was ready"), "{err}");
    assert!(err.contains("exit status: 1"), "{err}");
    worker.stop(&client).await;
}

#[tokio::test]
async fn a_worker_that_ignores_shutdown_is_terminated() {
    let script = std::env::temp_dir().join(format!("minisgl-fake-python-{}", std::process::id()));
    std::fs::write(&script, "#!/bin/sh\nexec sleep 60\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (worker, client) =
        LocalWorker::spawn(&spec(script.to_str().unwrap(), 1, "cpu"), 7).unwrap();
    let socket_path = worker.socket_path.clone();
    let mut exited = worker.exited.clone();
    let started = std::time::Instant::now();
    worker.stop(&client).await;
    assert!(*exited.wait_for(|e| *e).await.unwrap());
    assert!(started.elapsed() < SHUTDOWN_GRACE + TERM_GRACE);
    assert!(!socket_path.exists());
    let _ = std::fs::remove_file(script);
}

#[test]
fn a_missing_python_is_a_clear_error() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let err = LocalWorker::spawn(&spec("/nonexistent/python", 1, "cpu"), 0)
        .err()
        .unwrap();
    assert!(
        err.starts_with("cannot start worker 0 with /nonexistent/python"),
        "{err}"
    );
}
