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
    /// The worker refused or failed the request (its `error`).
    Refused(Refusal),
    /// The request was lost without a word from the worker (it is gone, or shut down).
    Failed(ApiError),
}

/// A worker's `error` for one request. The API layer turns it into the client's error,
/// knowing which request field a constraint came from (`Refusal::into_error`).
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub code: ErrorCode,
    pub message: String,
}

impl Refusal {
    /// The client's error, by the code alone: what the client asked for is a 400 (a
    /// constraint's names `constraint_field`, the field it came from), the rest is ours.
    pub fn into_error(self, constraint_field: Option<&str>) -> ApiError {
        let message = self.message;
        match self.code {
            ErrorCode::InvalidRequest | ErrorCode::ContextTooLong => ApiError::bad_request(message),
            ErrorCode::InvalidConstraint => ApiError::BadRequest {
                message,
                param: constraint_field.map(str::to_string),
            },
            ErrorCode::BadMessage | ErrorCode::Internal => {
                ApiError::Internal(format!("worker error: {message}"))
            }
        }
    }
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

    /// Ends request `rid` with the worker's `refusal`.
    pub(super) fn refuse(&self, rid: u64, refusal: Refusal) {
        let entry = self.inner.lock().unwrap().take(rid);
        if let Some(entry) = entry {
            let _ = entry.tx.send(Event::Refused(refusal));
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
        registry.refuse(2, refusal(ErrorCode::Internal, "x"));
        registry.with_routed(|r| assert!(r.is_empty()));
    }

    fn refusal(code: ErrorCode, message: &str) -> Refusal {
        Refusal {
            code,
            message: message.into(),
        }
    }

    #[test]
    fn worker_errors_map_by_code_not_by_wording() {
        let e = refusal(ErrorCode::ContextTooLong, "prompt has 9000 tokens").into_error(None);
        assert_eq!(e, ApiError::bad_request("prompt has 9000 tokens"));
        let e = refusal(ErrorCode::InvalidRequest, "input_ids is empty").into_error(Some("x"));
        assert_eq!(e, ApiError::bad_request("input_ids is empty"));
        // The wording that used to make a 400 does not: the code decides.
        let e = refusal(ErrorCode::Internal, "invalid prompt: too long").into_error(None);
        assert_eq!(
            e,
            ApiError::Internal("worker error: invalid prompt: too long".into())
        );
        let e = refusal(ErrorCode::BadMessage, "bad generate").into_error(None);
        assert_eq!(e.status(), axum::http::StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn a_constraint_the_worker_refuses_names_the_field_it_came_from() {
        let refused = refusal(ErrorCode::InvalidConstraint, "regex constraint: bad");
        let e = refused.clone().into_error(Some("response_format"));
        assert_eq!(
            e,
            ApiError::invalid("response_format", "regex constraint: bad")
        );
        assert_eq!(
            refused.into_error(None),
            ApiError::bad_request("regex constraint: bad")
        );
    }
}
