//! The router's handle on one worker: its state (connecting, ready, down, dead), its last
//! load, reconnection, and failure; the requests it serves are in `registry.rs`.
//!
//! The socket itself lives in `socket.rs` tasks; this side is what handlers touch. When the
//! worker goes away every request in its registry gets an error at once, so no client ever
//! hangs. `Down` is temporary: the connection is made again (a remote worker that restarted
//! or stopped answering; a local one its launcher restarts). `Dead` is final.
//!
//! It also holds the worker's part of the prefix index (routing/index.rs): the mirror of its
//! cache, fed by its `cache_events` and emptied at each `ready`, and how exact it was.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::protocol::{Load, Ready, RouterMsg, Sampling};
use super::registry::{next_rid, Entry, Registry};
use super::request::RequestStream;
use crate::error::ApiError;
use crate::routing::blocks::block_hashes;
use crate::routing::index::{Accuracy, CacheMirror, PrefixMatch};

#[derive(Debug, Clone, PartialEq)]
pub enum WorkerState {
    Connecting,
    Ready(Ready),
    /// Gone for now (why); requests are refused until it says `ready` again.
    Down(String),
    Dead(String),
}

impl WorkerState {
    /// Its name in /health and /metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Connecting => "connecting",
            Self::Ready(_) => "ready",
            Self::Down(_) => "down",
            Self::Dead(_) => "dead",
        }
    }

    pub const NAMES: [&'static str; 4] = ["connecting", "ready", "down", "dead"];
}

/// A remote worker that sends nothing for this long (it sends `load` each second while
/// idle) is marked down and its requests failed, as if it had died; the router then
/// connects again, and it serves once it answers.
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(4);

#[derive(Clone)]
pub struct WorkerClient {
    inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) address: String,
    outbox: mpsc::UnboundedSender<RouterMsg>,
    pub(super) requests: Registry,
    state: watch::Sender<WorkerState>,
    load: Mutex<Option<Load>>,
    /// Shutdown was asked for: the worker going away is expected, not an error.
    stopping: AtomicBool,
    /// It said `ready` once (it may be dead since).
    was_ready: AtomicBool,
    /// How many times it has said `ready` (once per connection that got one).
    readies: AtomicU64,
    /// How many times its launcher started it again after it exited.
    restarts: AtomicU64,
    /// Requests aborted because their client went away.
    disconnects: AtomicU64,
    /// Bumped to end the current connection (its process died: the next one is new).
    pub(super) epoch: watch::Sender<u64>,
    /// Silence after which the worker counts as gone (remote workers; a local one's
    /// launcher sees its process exit).
    pub(super) heartbeat: Option<Duration>,
    /// Its first `ready`: a worker that comes back must serve the same model.
    first_ready: Mutex<Option<Ready>>,
    /// What its prefix cache holds, from its `cache_events` since its last `ready`.
    pub(super) cache: Mutex<CacheMirror>,
    /// Predicted against reported cached tokens of the requests it served.
    pub(super) accuracy: Accuracy,
}

impl WorkerClient {
    /// Starts connecting to a worker that binds `address` (`ipc://...` or `tcp://...`): one
    /// this router spawned. When the connection ends its requests fail and it is down until
    /// it answers a new `hello` (its launcher restarts it, or declares it dead).
    pub fn connect(address: &str) -> Self {
        Self::start(address, None)
    }

    /// The same for a worker started elsewhere (`--worker tcp://...`), with a heartbeat: when
    /// the connection ends (it restarted, the network broke) or it is silent for
    /// `HEARTBEAT_TIMEOUT`, its requests fail and the router connects again; it serves once
    /// it has answered the new `hello` with the same model.
    pub fn connect_remote(address: &str) -> Self {
        Self::start(address, Some(HEARTBEAT_TIMEOUT))
    }

    pub(super) fn start(address: &str, heartbeat: Option<Duration>) -> Self {
        let (outbox, outgoing) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            address: address.to_string(),
            outbox,
            requests: Registry::default(),
            state: watch::channel(WorkerState::Connecting).0,
            load: Mutex::new(None),
            stopping: AtomicBool::new(false),
            was_ready: AtomicBool::new(false),
            readies: AtomicU64::new(0),
            restarts: AtomicU64::new(0),
            disconnects: AtomicU64::new(0),
            epoch: watch::channel(0).0,
            heartbeat,
            first_ready: Mutex::new(None),
            cache: Mutex::new(CacheMirror::default()),
            accuracy: Accuracy::default(),
        });
        tokio::spawn(super::socket::run(inner.clone(), outgoing));
        Self { inner }
    }

    pub fn address(&self) -> &str {
        &self.inner.address
    }

    pub fn state(&self) -> WorkerState {
        self.inner.state.borrow().clone()
    }

    pub fn ready_info(&self) -> Option<Ready> {
        match &*self.inner.state.borrow() {
            WorkerState::Ready(r) => Some(r.clone()),
            _ => None,
        }
    }

    pub fn is_ready(&self) -> bool {
        matches!(*self.inner.state.borrow(), WorkerState::Ready(_))
    }

    pub fn is_dead(&self) -> bool {
        matches!(*self.inner.state.borrow(), WorkerState::Dead(_))
    }

    pub fn load(&self) -> Option<Load> {
        *self.inner.load.lock().unwrap()
    }

    /// Waits until the worker is ready (its `ready` info) or dead (the reason).
    pub async fn wait_ready(&self) -> Result<Ready, String> {
        let mut rx = self.inner.state.subscribe();
        let state = rx
            .wait_for(|s| matches!(s, WorkerState::Ready(_) | WorkerState::Dead(_)))
            .await
            .map_err(|_| "worker client dropped".to_string())?;
        match &*state {
            WorkerState::Ready(r) => Ok(r.clone()),
            WorkerState::Dead(reason) => Err(reason.clone()),
            _ => unreachable!("waited for ready or dead"),
        }
    }

    /// Resolves once the worker is ready or dead (a retry waits on this).
    pub async fn settled(&self) {
        let _ = self.wait_ready().await;
    }

    /// How much of `ids` this worker holds (None when it is not ready).
    pub fn prefix_match(&self, ids: &[u32]) -> Option<PrefixMatch> {
        let page_size = self.ready_info()?.page_size as usize;
        Some(self.match_blocks(&block_hashes(ids, page_size), ids.len(), page_size))
    }

    fn match_blocks(&self, blocks: &[u64], prompt_len: usize, page_size: usize) -> PrefixMatch {
        let cache = self.inner.cache.lock().unwrap();
        (self.inner.requests)
            .with_routed(|routed| PrefixMatch::of(&cache, routed, blocks, prompt_len, page_size))
    }

    /// Blocks its prefix cache holds (by its events).
    pub fn cached_blocks(&self) -> usize {
        self.inner.cache.lock().unwrap().len()
    }

    pub fn accuracy(&self) -> &Accuracy {
        &self.inner.accuracy
    }

    /// Sends `generate`; the returned stream yields its outputs and aborts it when dropped
    /// early. The index's prediction of its cached tokens is taken now, and compared with
    /// the worker's report on its first output.
    pub fn submit(
        &self,
        input_ids: Vec<u32>,
        sampling: Sampling,
    ) -> Result<RequestStream, ApiError> {
        let rid = next_rid();
        let (tx, rx) = mpsc::unbounded_channel();
        let not_ready = || ApiError::Unavailable(format!("worker {} is not ready", self.address()));
        let page_size = self.ready_info().ok_or_else(not_ready)?.page_size as usize;
        let blocks = block_hashes(&input_ids, page_size);
        let predicted = self
            .match_blocks(&blocks, input_ids.len(), page_size)
            .cached;
        let entry = Entry {
            tx,
            blocks,
            predicted: Some(predicted as u32),
        };
        if !self.inner.requests.register(rid, entry, || self.is_ready()) {
            return Err(not_ready());
        }
        self.inner.send(RouterMsg::Generate {
            rid,
            input_ids,
            sampling,
        });
        Ok(RequestStream::new(rid, rx, self.clone()))
    }

    /// Forgets `rid` and tells the worker to free it (after a stop string, or a client gone).
    pub fn abort(&self, rid: u64) {
        let was_live = self.inner.requests.remove(rid);
        if was_live {
            self.inner.send(RouterMsg::Abort { rid });
        }
    }

    /// Ends every request in flight with 503 and `reason` and tells the worker to free them
    /// (the shutdown timeout ran out) -> how many there were.
    pub fn abort_all(&self, reason: &str) -> usize {
        let rids = self.inner.requests.fail_all(false, reason);
        for &rid in &rids {
            self.inner.send(RouterMsg::Abort { rid });
        }
        rids.len()
    }

    /// `abort` for a request whose client went away (counted).
    pub fn abort_disconnected(&self, rid: u64) {
        if self.inner.requests.remove(rid) {
            self.inner.disconnects.fetch_add(1, Ordering::Relaxed);
            self.inner.send(RouterMsg::Abort { rid });
        }
    }

    /// Requests aborted because their client went away.
    pub fn disconnects(&self) -> u64 {
        self.inner.disconnects.load(Ordering::Relaxed)
    }

    pub fn shutdown(&self) {
        self.inner.stopping.store(true, Ordering::Relaxed);
        if !matches!(self.state(), WorkerState::Dead(_)) {
            self.inner.send(RouterMsg::Shutdown);
        }
    }

    /// The worker is gone for good: mark it dead and end every request it was serving.
    pub fn fail(&self, reason: &str) {
        self.inner.fail(reason);
    }

    /// Its process exited and will be started again: end every request it was serving
    /// now, refuse new ones, and connect afresh (the next process is a new worker).
    pub fn go_down(&self, reason: &str) {
        self.inner.go_down(reason);
        self.inner.epoch.send_modify(|e| *e += 1);
    }

    /// Its launcher started it again.
    pub fn count_restart(&self) {
        self.inner.restarts.fetch_add(1, Ordering::Relaxed);
    }

    pub fn restarts(&self) -> u64 {
        self.inner.restarts.load(Ordering::Relaxed)
    }

    /// Shutdown was asked for (its exit is expected).
    pub fn was_ready(&self) -> bool {
        self.inner.was_ready.load(Ordering::Relaxed)
    }

    pub fn is_stopping(&self) -> bool {
        self.inner.stopping.load(Ordering::Relaxed)
    }

    /// How many times it has said `ready`: more than once, it came back with an empty cache.
    pub fn readies(&self) -> u64 {
        self.inner.readies.load(Ordering::Relaxed)
    }

    pub fn in_flight(&self) -> usize {
        self.inner.requests.len()
    }
}

impl Inner {
    pub(super) fn is_ready(&self) -> bool {
        matches!(*self.state.borrow(), WorkerState::Ready(_))
    }

    pub(super) fn send(&self, msg: RouterMsg) {
        // Only fails when the socket task is gone, and then the worker is already failed.
        let _ = self.outbox.send(msg);
    }

    pub(super) fn set_ready(&self, ready: Ready) {
        let first = self
            .first_ready
            .lock()
            .unwrap()
            .get_or_insert_with(|| ready.clone())
            .clone();
        if (&first.model, first.vocab_size) != (&ready.model, ready.vocab_size) {
            self.fail(&format!(
                "worker {} came back serving {} (vocabulary {}), not {} (vocabulary {})",
                self.address, ready.model, ready.vocab_size, first.model, first.vocab_size
            ));
            return;
        }
        // Its cache is reported afresh right after every `ready` (empty after a restart).
        // Cleared outside the state's lock: `submit` holds the registry's while it reads
        // the state, and `prefix_match` the cache's while it takes the registry's.
        self.cache.lock().unwrap().clear();
        self.state.send_if_modified(|s| {
            let connecting = matches!(s, WorkerState::Connecting | WorkerState::Down(_));
            if connecting {
                self.was_ready.store(true, Ordering::Relaxed);
                self.readies.fetch_add(1, Ordering::Relaxed);
                *s = WorkerState::Ready(ready);
            }
            connecting
        });
    }

    /// The connection ended: end its requests -> whether to connect again.
    pub(super) fn lose_connection(&self, reason: &str) -> bool {
        let dead = matches!(*self.state.borrow(), WorkerState::Dead(_));
        if dead || self.stopping.load(Ordering::Relaxed) {
            self.fail(reason);
            return false;
        }
        if !matches!(*self.state.borrow(), WorkerState::Down(_)) {
            tracing::warn!(worker = %self.address, "{reason}; connecting again");
        }
        self.go_down(reason);
        true
    }

    /// Not ready (first, so that no request registers after the senders are taken), then
    /// every request in flight fails with `reason`.
    fn go_down(&self, reason: &str) {
        let down = self.state.send_if_modified(|s| {
            let alive = !matches!(s, WorkerState::Dead(_));
            if alive {
                *s = WorkerState::Down(reason.to_string());
            }
            alive
        });
        if down {
            *self.load.lock().unwrap() = None;
            self.cache.lock().unwrap().clear();
            self.requests.fail_all(false, reason);
        }
    }

    pub(super) fn apply_cache_events(&self, stored: &[u64], removed: &[u64]) {
        self.cache.lock().unwrap().apply(stored, removed);
    }

    pub(super) fn set_load(&self, load: Load) {
        *self.load.lock().unwrap() = Some(load);
    }

    pub(super) fn fail(&self, reason: &str) {
        let already_dead = matches!(*self.state.borrow(), WorkerState::Dead(_));
        if !already_dead {
            if self.stopping.load(Ordering::Relaxed) {
                tracing::info!(worker = %self.address, "{reason}");
            } else {
                tracing::error!(worker = %self.address, "{reason}");
            }
            self.state
                .send_replace(WorkerState::Dead(reason.to_string()));
        }
        self.requests.fail_all(true, reason);
    }
}

#[cfg(test)]
#[path = "client_tests.rs"]
mod tests;
