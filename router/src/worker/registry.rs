//! The requests one worker is serving: `rid -> channel` for every request in flight. Token
//! outputs and errors are dispatched here; when the connection ends every entry gets an
//! error at once, so no client ever hangs, and a closed registry takes no new request.
//! It also keeps the block hashes of the prompts in flight (`RoutedBlocks`, for the
//! cache-aware policy) and checks each request's predicted cached tokens against the
//! worker's report on its first output (`Accuracy`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tokio::sync::mpsc;

use super::protocol::{ErrorCode, TokenOutput};
use crate::error::ApiError;
use crate::routing::index::{Accuracy, RoutedBlocks};

/// What a request's stream receives.
#[derive(Debug)]
pub enum Event {
    Token(TokenOutput),
    Failed(ApiError),
}

pub(super) type Sender = mpsc::UnboundedSender<Event>;

#[derive(Default)]
pub(super) struct Registry {
    inner: Mutex<Requests>,
}

#[derive(Default)]
struct Requests {
    entries: HashMap<u64, Entry>,
    /// The blocks of every entry's prompt.
    routed: RoutedBlocks,
    /// Set once the worker is gone: no new request may register.
    closed: bool,
}

/// One request in flight.
pub(super) struct Entry {
    pub tx: Sender,
    /// Its prompt's block hashes.
    pub blocks: Vec<u64>,
    /// The cached tokens the index predicted when it was sent; None once compared.
    pub predicted: Option<u32>,
}

impl Requests {
    fn take(&mut self, rid: u64) -> Option<Entry> {
        let entry = self.entries.remove(&rid)?;
        self.routed.remove(&entry.blocks);
        Some(entry)
    }
}

static NEXT_RID: AtomicU64 = AtomicU64::new(1);

/// Request ids, unique within this router process.
pub fn next_rid() -> u64 {
    NEXT_RID.fetch_add(1, Ordering::Relaxed)
}

impl Registry {
    /// Registers `rid` unless the registry is closed or `ready()` (asked under the lock, so
    /// that no request slips in after `fail_all` took the senders) says no -> registered.
    pub(super) fn register(&self, rid: u64, entry: Entry, ready: impl FnOnce() -> bool) -> bool {
        let mut requests = self.inner.lock().unwrap();
        if requests.closed || !ready() {
            return false;
        }
        requests.routed.add(&entry.blocks);
        requests.entries.insert(rid, entry);
        true
    }

    /// Forgets `rid` -> whether it was in flight.
    pub(super) fn remove(&self, rid: u64) -> bool {
        self.inner.lock().unwrap().take(rid).is_some()
    }

    pub(super) fn len(&self) -> usize {
        self.inner.lock().unwrap().entries.len()
    }

    /// Runs `f` on the blocks of the prompts in flight.
    pub(super) fn with_routed<T>(&self, f: impl FnOnce(&RoutedBlocks) -> T) -> T {
        f(&self.inner.lock().unwrap().routed)
    }

    /// Hands a step's outputs to their requests; a request's last output removes it. A
    /// request's first output has its prediction checked in `accuracy`.
    pub(super) fn dispatch(&self, outputs: Vec<TokenOutput>, accuracy: &Accuracy) {
        let mut requests = self.inner.lock().unwrap();
        for out in outputs {
            let done = out.finish.is_some();
            let rid = out.rid;
            if let Some(entry) = requests.entries.get_mut(&rid) {
                if let Some(predicted) = entry.predicted.take() {
                    accuracy.record(predicted, out.cached_tokens);
                }
                let _ = entry.tx.send(Event::Token(out));
            }
            if done {
                requests.take(rid);
            }
        }
    }

    /// Ends request `rid` with `error` (the worker refused or failed it).
    pub(super) fn fail(&self, rid: u64, error: ApiError) {
        let entry = self.inner.lock().unwrap().take(rid);
        if let Some(entry) = entry {
            let _ = entry.tx.send(Event::Failed(error));
        }
    }

    /// Ends every request with 503 and `reason` -> their rids; `close`: no new request may
    /// register.
    pub(super) fn fail_all(&self, close: bool, reason: &str) -> Vec<u64> {
        let entries = {
            let mut requests = self.inner.lock().unwrap();
            requests.closed |= close;
            requests.routed.clear();
            std::mem::take(&mut requests.entries)
        };
        let mut rids = Vec::with_capacity(entries.len());
        for (rid, entry) in entries {
            let error = ApiError::Unavailable(reason.to_string());
            let _ = entry.tx.send(Event::Failed(error));
            rids.push(rid);
        }
        rids
    }
}

/// A worker's error as the client sees it, by its code: what the client asked for is a 400,
/// the rest is ours (500).
pub(super) fn worker_error(code: ErrorCode, message: String) -> ApiError {
    match code {
        ErrorCode::InvalidRequest | ErrorCode::ContextTooLong => ApiError::bad_request(message),
        ErrorCode::BadMessage | ErrorCode::Internal => {
            ApiError::Internal(format!("worker error: {message}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(rid: u64, finish: Option<super::super::protocol::Finish>) -> TokenOutput {
        TokenOutput {
            rid,
            token: 5,
            logprob: None,
            top_logprobs: None,
            finish,
            cached_tokens: 0,
        }
    }

    #[test]
    fn rids_are_unique_and_increasing() {
        let a = next_rid();
        let b = next_rid();
        assert!(b > a);
    }

    fn entry(tx: &Sender, blocks: &[u64]) -> Entry {
        Entry {
            tx: tx.clone(),
            blocks: blocks.to_vec(),
            predicted: Some(0),
        }
    }

    #[test]
    fn a_last_output_removes_its_request_and_a_closed_registry_takes_none() {
        let registry = Registry::default();
        let accuracy = Accuracy::default();
        let (tx, mut rx) = mpsc::unbounded_channel();
        assert!(
            !registry.register(1, entry(&tx, &[]), || false),
            "not ready"
        );
        assert!(registry.register(1, entry(&tx, &[]), || true));
        registry.dispatch(vec![output(1, None), output(2, None)], &accuracy);
        assert_eq!(registry.len(), 1);
        let last = output(1, Some(super::super::protocol::Finish::Stop));
        registry.dispatch(vec![last], &accuracy);
        assert_eq!(registry.len(), 0);
        assert!(matches!(rx.try_recv(), Ok(Event::Token(o)) if o.finish.is_none()));
        assert!(matches!(rx.try_recv(), Ok(Event::Token(o)) if o.finish.is_some()));
        assert!(registry.register(3, entry(&tx, &[]), || true));
        assert_eq!(registry.fail_all(true, "gone"), [3]);
        assert!(
            matches!(rx.try_recv(), Ok(Event::Failed(ApiError::Unavailable(m))) if m == "gone")
        );
        assert!(!registry.register(4, entry(&tx, &[]), || true), "closed");
    }

    #[test]
    fn prompts_in_flight_are_routed_blocks_and_first_outputs_are_compared() {
        let registry = Registry::default();
        let accuracy = Accuracy::default();
        let (tx, _rx) = mpsc::unbounded_channel();
        registry.register(1, entry(&tx, &[10, 11]), || true);
        registry.register(2, entry(&tx, &[10, 12]), || true);
        registry.register(3, entry(&tx, &[20]), || true);
        registry.dispatch(vec![output(1, None), output(1, None)], &accuracy);
        // One comparison per request (the worker reports cached_tokens on every output).
        assert_eq!(accuracy.requests.load(Ordering::Relaxed), 1);
        assert_eq!(accuracy.mismatches.load(Ordering::Relaxed), 0);
        let finish = Some(super::super::protocol::Finish::Length);
        registry.dispatch(vec![output(1, finish)], &accuracy);
        registry.remove(3);
        registry.with_routed(|r| {
            assert!(r.contains(10) && r.contains(12) && !r.contains(11) && !r.contains(20))
        });
        registry.fail(2, ApiError::Internal("x".into()));
        registry.with_routed(|r| assert!(r.is_empty()));
    }

    #[test]
    fn worker_errors_map_by_code_not_by_wording() {
        let e = worker_error(ErrorCode::ContextTooLong, "prompt has 9000 tokens".into());
        assert_eq!(e, ApiError::bad_request("prompt has 9000 tokens"));
        let e = worker_error(ErrorCode::InvalidRequest, "input_ids is empty".into());
        assert_eq!(e.status(), axum::http::StatusCode::BAD_REQUEST);
        // The wording that used to make a 400 does not: the code decides.
        let e = worker_error(ErrorCode::Internal, "invalid prompt: too long".into());
        assert_eq!(
            e,
            ApiError::Internal("worker error: invalid prompt: too long".into())
        );
        let e = worker_error(ErrorCode::BadMessage, "bad generate".into());
        assert_eq!(e.status(), axum::http::StatusCode::INTERNAL_SERVER_ERROR);
    }
}
