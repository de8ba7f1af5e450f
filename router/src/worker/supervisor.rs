//! The supervisor of one local worker's process: it waits for the process to exit and starts
//! it again. A worker that exits before its first `ready` fails for good (startup failed). One
//! that exits after serving goes down at once (every request it held gets an error, new ones
//! go elsewhere or get 503) and a new process is started after a backoff (`Backoff`: 1 s
//! doubling to 30 s, back to 1 s once a process has lived a minute), so a crash loop costs
//! little and shows in the log and in `minisgl_worker_restarts_total`.

use std::time::{Duration, Instant};

use tokio::process::Child;
use tokio::sync::oneshot;

use super::client::WorkerClient;
use super::launcher::{start_process, LaunchSpec};

/// After SIGTERM, how long a worker gets to exit before SIGKILL.
pub(super) const TERM_GRACE: Duration = Duration::from_secs(3);

/// Restart delays: the first, the cap, and how long a process must live to reset them.
const BACKOFF_FIRST: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
const HEALTHY_UPTIME: Duration = Duration::from_secs(60);
/// From this many exits in a row (each within a minute of its start) it is a crash loop.
const CRASH_LOOP: u32 = 3;

/// The delay before each restart of one worker.
#[derive(Debug)]
struct Backoff {
    next: Duration,
    /// Exits in a row, each within `HEALTHY_UPTIME` of its start.
    quick_exits: u32,
}

impl Backoff {
    fn new() -> Self {
        Self {
            next: BACKOFF_FIRST,
            quick_exits: 0,
        }
    }

    /// A process that lived `uptime` exited -> how long to wait before the next one.
    fn after_exit(&mut self, uptime: Duration) -> Duration {
        if uptime >= HEALTHY_UPTIME {
            *self = Self::new();
        }
        self.quick_exits += 1;
        let delay = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        delay
    }
}

/// Watches one local worker's process and starts it again when it exits.
pub(super) struct Supervisor {
    pub(super) spec: LaunchSpec,
    pub(super) index: usize,
    pub(super) client: WorkerClient,
    /// Fired by `LocalWorker::stop` when the worker did not exit in its grace period.
    pub(super) kill: oneshot::Receiver<()>,
}

impl Supervisor {
    /// Until the worker is stopped, or dies before its first `ready`.
    pub(super) async fn run(mut self, first: Child) {
        let mut backoff = Backoff::new();
        let mut child = Some(first);
        loop {
            let started = Instant::now();
            let exit = match child.as_mut() {
                Some(process) => tokio::select! {
                    status = process.wait() => describe(status),
                    _ = &mut self.kill => {
                        let status = describe(terminate(process).await);
                        return self.client.fail(&self.exit_message(&status));
                    }
                },
                None => "it could not be started".to_string(),
            };
            let message = self.exit_message(&exit);
            if self.client.is_stopping() || !self.client.was_ready() {
                // An expected exit, or a startup failure: final either way.
                return self.client.fail(&message);
            }
            let delay = backoff.after_exit(started.elapsed());
            let restarts = self.client.restarts() + 1;
            let plan = format!("{message}; restart {restarts} in {} s", delay.as_secs());
            tracing::error!("{plan}");
            if backoff.quick_exits >= CRASH_LOOP {
                tracing::error!(
                    "worker {} is crash-looping: {} exits in a row within a minute of starting; \
                     see its log above",
                    self.index,
                    backoff.quick_exits
                );
            }
            self.client.go_down(&plan);
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                _ = &mut self.kill => return self.client.fail(&message),
            }
            if self.client.is_stopping() {
                return self.client.fail(&message);
            }
            self.client.count_restart();
            child = match start_process(&self.spec, self.index) {
                Ok(process) => Some(process),
                Err(e) => {
                    tracing::error!("{e}");
                    None
                }
            };
        }
    }

    fn exit_message(&self, status: &str) -> String {
        let when = if self.client.was_ready() {
            ""
        } else {
            " before it was ready"
        };
        format!("worker {} exited{when} ({status})", self.index)
    }
}

fn describe(status: std::io::Result<std::process::ExitStatus>) -> String {
    match status {
        Ok(s) => s.to_string(),
        Err(e) => format!("unknown status ({e})"),
    }
}

/// SIGTERM (the worker unwinds and closes its socket), then SIGKILL if it lingers.
async fn terminate(child: &mut Child) -> std::io::Result<std::process::ExitStatus> {
    #[cfg(unix)]
    if let Some(pid) = child.id() {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
        if let Ok(status) = tokio::time::timeout(TERM_GRACE, child.wait()).await {
            return status;
        }
    }
    let _ = child.kill().await;
    child.wait().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_back_off_doubling_to_a_cap_and_reset_after_a_healthy_minute() {
        let mut b = Backoff::new();
        let quick = Duration::from_secs(2);
        let delays: Vec<u64> = (0..7).map(|_| b.after_exit(quick).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(b.quick_exits, 7);
        assert_eq!(b.after_exit(HEALTHY_UPTIME).as_secs(), 1);
        assert_eq!(b.quick_exits, 1);
        assert_eq!(b.after_exit(quick).as_secs(), 2);
    }
}
