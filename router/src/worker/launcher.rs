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
#[path = "launcher_tests.rs"]
mod tests;
