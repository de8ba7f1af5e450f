//! Local workers: spawn `python -m minisgl_worker` per worker (its command line, its GPU and
//! CPU threads), hand the process to its `Supervisor` (supervisor.rs: restarts), and stop it
//! cleanly: `shutdown`, then SIGTERM, then SIGKILL, and its socket file removed.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::sync::{oneshot, watch};

use super::client::WorkerClient;
use super::protocol::Ready;
use super::supervisor::Supervisor;

/// How long a worker gets to exit after `shutdown` before it is terminated.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// What every spawned worker is started with.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    pub python: String,
    pub model: PathBuf,
    pub device: String,
    pub dtype: String,
    pub page_size: Option<u32>,
    pub max_running: Option<u32>,
    pub cache: Option<&'static str>,
    pub chunk_size: Option<u32>,
    pub mixed_chunk_size: Option<u32>,
    pub mixed_step_tokens: Option<u32>,
    pub schedule_policy: Option<&'static str>,
    pub kv_tokens: Option<u64>,
    pub cuda_graph_max_bs: Option<u32>,
    pub cuda_graph_max_tokens: Option<u32>,
    pub attention_backend: Option<&'static str>,
    pub gemm: Option<&'static str>,
    pub kv_cache_dtype: Option<&'static str>,
    pub load_format: Option<&'static str>,
    /// Tensor-parallel ranks (processes, GPUs) per worker.
    pub tp: usize,
    /// Total number of local workers (to share the CPU cores).
    pub count: usize,
    /// Each worker's `CUDA_VISIBLE_DEVICES` (gpus.rs), None: left as it is.
    pub gpus: Vec<Option<String>>,
    /// The workers' Python logging level (`MINISGL_LOG_LEVEL`, unless the user set it),
    /// from the router's `--log-level`; None leaves theirs (INFO).
    pub log_level: Option<&'static str>,
}

pub struct LocalWorker {
    pub index: usize,
    socket_path: PathBuf,
    exited: watch::Receiver<bool>,
    kill: Option<oneshot::Sender<()>>,
}

impl LaunchSpec {
    fn address(&self, index: usize) -> (String, PathBuf) {
        let path = PathBuf::from(format!("/tmp/minisgl-{}-{index}.sock", std::process::id()));
        (format!("ipc://{}", path.display()), path)
    }

    fn command(&self, index: usize, address: &str) -> Command {
        let mut cmd = Command::new(&self.python);
        cmd.args(["-m", "minisgl_worker", "--model"])
            .arg(&self.model);
        cmd.args([
            "--listen",
            address,
            "--device",
            &self.device,
            "--dtype",
            &self.dtype,
            // The worker exits if the router dies without shutting it down (SIGKILL).
            "--parent-pid",
            &std::process::id().to_string(),
        ]);
        // The flags the user set; the worker's own defaults for the rest.
        let number = |v: Option<u32>| v.map(|v| v.to_string());
        let name = |v: Option<&str>| v.map(str::to_string);
        let optional = [
            ("--page-size", number(self.page_size)),
            ("--max-running", number(self.max_running)),
            ("--cache", name(self.cache)),
            ("--chunk-size", number(self.chunk_size)),
            ("--mixed-chunk-size", number(self.mixed_chunk_size)),
            ("--mixed-step-tokens", number(self.mixed_step_tokens)),
            ("--schedule-policy", name(self.schedule_policy)),
            ("--kv-tokens", self.kv_tokens.map(|v| v.to_string())),
            ("--cuda-graph-max-bs", number(self.cuda_graph_max_bs)),
            (
                "--cuda-graph-max-tokens",
                number(self.cuda_graph_max_tokens),
            ),
            ("--attention-backend", name(self.attention_backend)),
            ("--gemm", name(self.gemm)),
            ("--kv-cache-dtype", name(self.kv_cache_dtype)),
            ("--load-format", name(self.load_format)),
            ("--tp", (self.tp > 1).then(|| self.tp.to_string())),
        ];
        for (flag, value) in optional {
            if let Some(value) = value {
                cmd.args([flag, &value]);
            }
        }
        cmd.env("MINISGL_WORKER_INDEX", index.to_string());
        if let Some(level) = self
            .log_level
            .filter(|_| std::env::var_os("MINISGL_LOG_LEVEL").is_none())
        {
            cmd.env("MINISGL_LOG_LEVEL", level);
        }
        if let Some(Some(gpus)) = self.gpus.get(index) {
            cmd.env("CUDA_VISIBLE_DEVICES", gpus);
        }
        if let Some(threads) = self.cpu_threads(std::env::var_os("OMP_NUM_THREADS").is_some()) {
            cmd.env("OMP_NUM_THREADS", threads.to_string());
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit());
        // Its own process group: a Ctrl-C in the terminal reaches the router only, which
        // then shuts the workers down in order.
        #[cfg(unix)]
        cmd.process_group(0);
        cmd.kill_on_drop(true);
        cmd
    }

    /// Several CPU workers on one host share its cores: each torch process would otherwise
    /// start one thread per core and they would all oversubscribe. A user's own
    /// `OMP_NUM_THREADS` wins.
    fn cpu_threads(&self, user_set: bool) -> Option<usize> {
        if self.count < 2 || self.device == "cuda" || user_set {
            return None;
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Some((cores / self.count).max(1))
    }
}

impl LocalWorker {
    /// Spawns worker `index` and returns it with a client that connects to it.
    pub fn spawn(spec: &LaunchSpec, index: usize) -> Result<(Self, WorkerClient), String> {
        let (address, socket_path) = spec.address(index);
        let child = start_process(spec, index)?;
        let client = WorkerClient::connect(&address);
        let (exited_tx, exited) = watch::channel(false);
        let (kill, kill_rx) = oneshot::channel();
        let supervisor = Supervisor {
            spec: spec.clone(),
            index,
            client: client.clone(),
            kill: kill_rx,
        };
        tokio::spawn(async move {
            supervisor.run(child).await;
            let _ = exited_tx.send(true);
        });
        Ok((
            Self {
                index,
                socket_path,
                exited,
                kill: Some(kill),
            },
            client,
        ))
    }

    /// Asks the worker to exit, kills it after a grace period, removes its socket file.
    pub async fn stop(mut self, client: &WorkerClient) {
        // One that is not serving (loading, or waiting to be restarted) is not asked.
        let asked = client.is_ready();
        client.shutdown();
        let grace = if asked {
            SHUTDOWN_GRACE
        } else {
            Duration::ZERO
        };
        let exited = tokio::time::timeout(grace, self.exited.wait_for(|e| *e))
            .await
            .is_ok();
        if !exited {
            tracing::warn!(
                index = self.index,
                "worker did not exit after shutdown; killing it"
            );
            if let Some(kill) = self.kill.take() {
                let _ = kill.send(());
            }
            let _ = self.exited.wait_for(|e| *e).await;
        }
        remove_socket(&self.socket_path);
    }
}

impl Drop for LocalWorker {
    fn drop(&mut self) {
        remove_socket(&self.socket_path);
    }
}

fn remove_socket(path: &Path) {
    let _ = std::fs::remove_file(path);
}

pub(super) fn start_process(spec: &LaunchSpec, index: usize) -> Result<Child, String> {
    let (address, socket_path) = spec.address(index);
    let _ = std::fs::remove_file(&socket_path);
    let child = spec
        .command(index, &address)
        .spawn()
        .map_err(|e| format!("cannot start worker {index} with {}: {e}", spec.python))?;
    tracing::info!(index, pid = child.id(), %address, "spawned worker");
    Ok(child)
}

/// Waits for `ready` from a worker, failing on its death or after `timeout`.
pub async fn wait_ready(client: &WorkerClient, timeout: Duration) -> Result<Ready, String> {
    match tokio::time::timeout(timeout, client.wait_ready()).await {
        Ok(result) => result,
        Err(_) => Err(format!(
            "worker {} was not ready after {} s (--ready-timeout)",
            client.address(),
            timeout.as_secs()
        )),
    }
}

#[cfg(test)]
mod tests {
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
        let script =
            std::env::temp_dir().join(format!("minisgl-fake-python-{}", std::process::id()));
        std::fs::write(&script, "#!/bin/sh\nexec sleep 60\n").unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
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
}
