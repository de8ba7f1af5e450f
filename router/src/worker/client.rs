//! The router's handle on one worker: its connection state (connecting, ready, dead), its
//! last load, reconnection, and failure; the requests it serves are in `registry.rs`.
//!
//! The socket itself lives in `socket.rs` tasks; this side is what handlers touch. When the
//! worker dies every request in its registry gets an error, so no client ever hangs.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, watch};

use super::protocol::{Load, Ready, RouterMsg, Sampling};
use super::registry::{next_rid, Registry};
use super::request::RequestStream;
use crate::error::ApiError;

#[derive(Debug, Clone, PartialEq)]
pub enum WorkerState {
    Connecting,
    Ready(Ready),
    Dead(String),
}

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
    /// Connect again when the connection ends (a remote worker; a spawned one's end is
    /// final, and its launcher says why).
    reconnect: bool,
    /// Its first `ready`: a worker that comes back must serve the same model.
    first_ready: Mutex<Option<Ready>>,
}

impl WorkerClient {
    /// Starts connecting to a worker that binds `address` (`ipc://...` or `tcp://...`); when
    /// the connection ends, the worker is dead (one this router spawned).
    pub fn connect(address: &str) -> Self {
        Self::start(address, false)
    }

    /// The same for a worker started elsewhere (`--worker tcp://...`): when the connection
    /// ends (it restarted, the network broke) its requests fail, and the router connects
    /// again; it serves once it has answered the new `hello` with the same model.
    pub fn connect_remote(address: &str) -> Self {
        Self::start(address, true)
    }

    fn start(address: &str, reconnect: bool) -> Self {
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
            reconnect,
            first_ready: Mutex::new(None),
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

    pub fn load(&self) -> Option<Load> {
        *self.inner.load.lock().unwrap()
    }

    /// Waits until the worker is ready (its `ready` info) or dead (the reason).
    pub async fn wait_ready(&self) -> Result<Ready, String> {
        let mut rx = self.inner.state.subscribe();
        let state = rx
            .wait_for(|s| !matches!(s, WorkerState::Connecting))
            .await
            .map_err(|_| "worker client dropped".to_string())?;
        match &*state {
            WorkerState::Ready(r) => Ok(r.clone()),
            WorkerState::Dead(reason) => Err(reason.clone()),
            WorkerState::Connecting => unreachable!("waited past Connecting"),
        }
    }

    /// Sends `generate`; the returned stream yields its outputs and aborts it when dropped early.
    pub fn submit(
        &self,
        input_ids: Vec<u32>,
        sampling: Sampling,
    ) -> Result<RequestStream, ApiError> {
        let rid = next_rid();
        let (tx, rx) = mpsc::unbounded_channel();
        if !self.inner.requests.register(rid, tx, || self.is_ready()) {
            return Err(ApiError::Unavailable(format!(
                "worker {} is not ready",
                self.address()
            )));
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

    pub fn shutdown(&self) {
        self.inner.stopping.store(true, Ordering::Relaxed);
        if !matches!(self.state(), WorkerState::Dead(_)) {
            self.inner.send(RouterMsg::Shutdown);
        }
    }

    /// The worker is gone: mark it dead and end every request it was serving.
    pub fn fail(&self, reason: &str) {
        self.inner.fail(reason);
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
        self.state.send_if_modified(|s| {
            let connecting = matches!(s, WorkerState::Connecting);
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
        if !self.reconnect || dead || self.stopping.load(Ordering::Relaxed) {
            self.fail(reason);
            return false;
        }
        tracing::warn!(worker = %self.address, "{reason}; connecting again");
        // Not ready first, so that no request registers after the senders are taken.
        self.state.send_replace(WorkerState::Connecting);
        *self.load.lock().unwrap() = None;
        self.requests.fail_all(false, reason);
        true
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
mod tests {
    use std::time::Duration;

    use super::super::fake::{FakeScript, FakeWorker};
    use super::super::registry::Event;
    use super::*;

    fn script(stall: bool) -> FakeScript {
        FakeScript {
            reply: vec![5, 6, 7],
            eos: 2,
            max_context: 100,
            stall,
        }
    }

    async fn until_state(client: &WorkerClient, want: fn(&WorkerState) -> bool) {
        let mut rx = client.inner.state.subscribe();
        let wait = rx.wait_for(want);
        tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .expect("state change within 10 s")
            .unwrap();
    }

    #[tokio::test]
    async fn a_remote_worker_that_comes_back_serves_again() {
        let first = FakeWorker::start(script(true)).await;
        let client = WorkerClient::connect_remote(&first.address);
        client.wait_ready().await.unwrap();
        let mut stream = client.submit(vec![1, 2], Sampling::default()).unwrap();
        let address = first.address.clone();
        first.stop().await; // it goes away with a request in flight
        match stream.next().await {
            Some(Event::Failed(ApiError::Unavailable(m))) => assert!(m.contains(&address), "{m}"),
            other => panic!("unexpected {other:?}"),
        }
        until_state(&client, |s| matches!(s, WorkerState::Connecting)).await;
        assert!(client.submit(vec![1], Sampling::default()).is_err());
        let second = FakeWorker::start_at(&address, script(false)).await;
        until_state(&client, |s| matches!(s, WorkerState::Ready(_))).await;
        let sampling = Sampling {
            max_new_tokens: 2,
            ..Sampling::default()
        };
        let mut stream = client.submit(vec![1, 2], sampling).unwrap();
        let mut tokens = Vec::new();
        while let Some(Event::Token(out)) = stream.next().await {
            tokens.push(out.token);
        }
        assert_eq!(tokens, [5, 6]);
        assert_eq!(client.readies(), 2);
        assert_eq!(second.log.lock().unwrap().generated.len(), 1);
    }

    #[tokio::test]
    async fn a_spawned_worker_that_goes_away_is_dead() {
        let worker = FakeWorker::start(script(true)).await;
        let client = WorkerClient::connect(&worker.address);
        client.wait_ready().await.unwrap();
        drop(worker);
        until_state(&client, |s| matches!(s, WorkerState::Dead(_))).await;
        assert!(client.submit(vec![1], Sampling::default()).is_err());
    }

    #[tokio::test]
    async fn failing_a_worker_ends_its_requests_and_refuses_new_ones() {
        let client = WorkerClient::connect("ipc:///tmp/minisgl-test-nobody-listens.sock");
        client.inner.set_ready(Ready {
            model: "m".into(),
            vocab_size: 10,
            max_context: 100,
            kv_capacity: 100,
            eos_token_ids: vec![0],
            page_size: 1,
            tp_size: 1,
            device: "cpu".into(),
        });
        let mut stream = client.submit(vec![1, 2], Sampling::default()).unwrap();
        client.fail("worker 0 exited with status 1");
        match stream.next().await {
            Some(Event::Failed(ApiError::Unavailable(m))) => assert!(m.contains("exited")),
            other => panic!("unexpected {other:?}"),
        }
        assert!(client.submit(vec![1], Sampling::default()).is_err());
        assert_eq!(
            client.wait_ready().await,
            Err("worker 0 exited with status 1".into())
        );
    }
}
