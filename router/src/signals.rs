//! SIGTERM and SIGINT (Ctrl-C), listened to from the moment the server starts: a signal
//! that arrives while the workers are being spawned is then neither lost nor left to its
//! default action (which would kill the router before it could stop its workers).

#[cfg(unix)]
use tokio::signal::unix::{signal, Signal, SignalKind};

pub struct Signals {
    #[cfg(unix)]
    terminate: Signal,
    #[cfg(unix)]
    interrupt: Signal,
}

impl Signals {
    /// Starts listening (inside the runtime).
    pub fn new() -> Result<Self, String> {
        #[cfg(unix)]
        {
            let listen = |kind: SignalKind| {
                signal(kind).map_err(|e| format!("cannot listen for signals: {e}"))
            };
            Ok(Self {
                terminate: listen(SignalKind::terminate())?,
                interrupt: listen(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    /// The next SIGTERM, or SIGINT too when `ctrl_c` (with `--shell`, Ctrl-C is the shell's:
    /// it stops an answer). One that arrived since the last call counts.
    pub async fn next(&mut self, ctrl_c: bool) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.terminate.recv() => {}
            _ = self.interrupt.recv(), if ctrl_c => {}
        }
        #[cfg(not(unix))]
        match ctrl_c {
            true => drop(tokio::signal::ctrl_c().await),
            false => std::future::pending().await,
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_signal_that_arrived_before_the_wait_is_not_lost() {
        let mut signals = Signals::new().unwrap();
        // SAFETY: raise(3) sends a signal to this process; tokio's handler is installed.
        unsafe { libc::raise(libc::SIGINT) };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let got = tokio::time::timeout(Duration::from_secs(5), signals.next(true)).await;
        assert!(got.is_ok(), "the earlier SIGINT counts");
        let ignored = tokio::time::timeout(Duration::from_millis(100), signals.next(false)).await;
        assert!(
            ignored.is_err(),
            "without ctrl_c only SIGTERM ends the wait"
        );
    }
}
