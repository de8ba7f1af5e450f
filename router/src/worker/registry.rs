//! The requests one worker is serving: `rid -> channel` for every request in flight. Token
//! outputs and errors are dispatched here; when the connection ends every entry gets an
//! error at once, so no client ever hangs, and a closed registry takes no new request.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tokio::sync::mpsc;

use super::protocol::{ErrorCode, TokenOutput};
use crate::error::ApiError;

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
    senders: HashMap<u64, Sender>,
    /// Set once the worker is gone: no new request may register.
    closed: bool,
}

static NEXT_RID: AtomicU64 = AtomicU64::new(1);

/// Request ids, unique within this router process.
pub fn next_rid() -> u64 {
    NEXT_RID.fetch_add(1, Ordering::Relaxed)
}

impl Registry {
    /// Registers `rid` unless the registry is closed or `ready()` (asked under the lock, so
    /// that no request slips in after `fail_all` took the senders) says no -> registered.
    pub(super) fn register(&self, rid: u64, tx: Sender, ready: impl FnOnce() -> bool) -> bool {
        let mut requests = self.inner.lock().unwrap();
        if requests.closed || !ready() {
            return false;
        }
        requests.senders.insert(rid, tx);
        true
    }

    /// Forgets `rid` -> whether it was in flight.
    pub(super) fn remove(&self, rid: u64) -> bool {
        self.inner.lock().unwrap().senders.remove(&rid).is_some()
    }

    pub(super) fn len(&self) -> usize {
        self.inner.lock().unwrap().senders.len()
    }

    /// Hands a step's outputs to their requests; a request's last output removes it.
    pub(super) fn dispatch(&self, outputs: Vec<TokenOutput>) {
        let mut requests = self.inner.lock().unwrap();
        for out in outputs {
            let done = out.finish.is_some();
            let rid = out.rid;
            if let Some(tx) = requests.senders.get(&rid) {
                let _ = tx.send(Event::Token(out));
            }
            if done {
                requests.senders.remove(&rid);
            }
        }
    }

    /// Ends request `rid` with `error` (the worker refused or failed it).
    pub(super) fn fail(&self, rid: u64, error: ApiError) {
        let tx = self.inner.lock().unwrap().senders.remove(&rid);
        if let Some(tx) = tx {
            let _ = tx.send(Event::Failed(error));
        }
    }

    /// Ends every request with 503 and `reason`; `close`: no new request may register.
    pub(super) fn fail_all(&self, close: bool, reason: &str) {
        let senders = {
            let mut requests = self.inner.lock().unwrap();
            requests.closed |= close;
            std::mem::take(&mut requests.senders)
        };
        for tx in senders.into_values() {
            let _ = tx.send(Event::Failed(ApiError::Unavailable(reason.to_string())));
        }
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

    #[test]
    fn a_last_output_removes_its_request_and_a_closed_registry_takes_none() {
        let registry = Registry::default();
        let (tx, mut rx) = mpsc::unbounded_channel();
        assert!(!registry.register(1, tx.clone(), || false), "not ready");
        assert!(registry.register(1, tx.clone(), || true));
        registry.dispatch(vec![output(1, None), output(2, None)]);
        assert_eq!(registry.len(), 1);
        registry.dispatch(vec![output(1, Some(super::super::protocol::Finish::Stop))]);
        assert_eq!(registry.len(), 0);
        assert!(matches!(rx.try_recv(), Ok(Event::Token(o)) if o.finish.is_none()));
        assert!(matches!(rx.try_recv(), Ok(Event::Token(o)) if o.finish.is_some()));
        assert!(registry.register(3, tx.clone(), || true));
        registry.fail_all(true, "gone");
        assert!(
            matches!(rx.try_recv(), Ok(Event::Failed(ApiError::Unavailable(m))) if m == "gone")
        );
        assert!(!registry.register(4, tx, || true), "closed");
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
