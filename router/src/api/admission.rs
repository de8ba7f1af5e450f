//! Router-side admission control: at most `--max-requests` generations in flight at once.
//!
//! A request reserves one slot per generation it will start (each of `n` copies, each prompt
//! of a batch) before anything is tokenized or sent, all or nothing. When the slots are not
//! there it waits up to `--admission-wait` for them (woken each time a slot is freed), then
//! gets a 429; a request that needs more slots than there are is a 400 at once. Each
//! generation's slot then travels with its [`RequestStream`] and is freed exactly once, by
//! `Drop`, when the request finishes, fails, is aborted, its client disconnects or its
//! worker dies.
//!
//! On shutdown admission closes: new requests, and those still waiting, get 503 while the
//! ones in flight finish.
//!
//! [`RequestStream`]: crate::worker::RequestStream

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::error::ApiError;

/// The in-flight count and its limit.
pub struct Admission {
    count: Arc<Count>,
    limit: usize,
    wait: Duration,
    /// The server is shutting down: no new request is admitted.
    closed: AtomicBool,
}

/// Generations in flight, and a wake-up for the requests waiting for one to end.
#[derive(Default)]
struct Count {
    in_flight: AtomicUsize,
    freed: Notify,
}

impl Count {
    fn release(&self, slots: usize) {
        if slots > 0 {
            self.in_flight.fetch_sub(slots, Ordering::AcqRel);
            self.freed.notify_waiters();
        }
    }
}

impl Admission {
    /// At most `limit` in flight; a request waits up to `wait` for its slots.
    pub fn new(limit: usize, wait: Duration) -> Self {
        Self {
            count: Arc::default(),
            limit,
            wait,
            closed: AtomicBool::new(false),
        }
    }

    /// Generations sent to workers (or about to be) and not finished.
    pub fn in_flight(&self) -> usize {
        self.count.in_flight.load(Ordering::Acquire)
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// From now on every request gets 503 (the server is shutting down); those waiting for
    /// a slot too.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.count.freed.notify_waiters();
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Reserves `count` slots at once, waiting up to `--admission-wait` for them; or
    /// refuses with 429 (400 when the request could never fit) naming the numbers, or 503
    /// once closed.
    pub async fn admit(&self, count: usize) -> Result<Slots, ApiError> {
        if count > self.limit {
            return Err(ApiError::bad_request(format!(
                "this request needs {count} generations (prompts times `n`); the server runs \
                 at most {} at once (--max-requests)",
                self.limit
            )));
        }
        let deadline = tokio::time::Instant::now() + self.wait;
        loop {
            // Registered before the attempt, so a slot freed in between still wakes us.
            let freed = self.count.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if self.is_closed() {
                return Err(ApiError::Unavailable(
                    "the server is shutting down; no new requests are accepted".into(),
                ));
            }
            let now = match self.try_admit(count) {
                Ok(slots) => return Ok(slots),
                Err(now) => now,
            };
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return Err(self.overloaded(now, count));
            }
        }
    }

    fn try_admit(&self, count: usize) -> Result<Slots, usize> {
        self.count
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                now.checked_add(count).filter(|&after| after <= self.limit)
            })?;
        Ok(Slots {
            count: self.count.clone(),
            slots: count,
        })
    }

    fn overloaded(&self, now: usize, count: usize) -> ApiError {
        let needs = match count {
            1 => String::new(),
            _ => format!(" and this request needs {count}"),
        };
        let waited = match self.wait.is_zero() {
            true => String::new(),
            false => format!(
                " after waiting {} s (--admission-wait)",
                self.wait.as_secs_f64()
            ),
        };
        ApiError::Overloaded(format!(
            "server overloaded: {now} requests in flight (limit {}){needs}{waited}; retry later",
            self.limit
        ))
    }
}

/// Reserved slots not yet handed to a generation; dropping them frees the rest.
pub struct Slots {
    count: Arc<Count>,
    slots: usize,
}

impl Slots {
    /// One slot for one generation; None once all are handed out.
    pub fn take(&mut self) -> Option<Slot> {
        if self.slots == 0 {
            return None;
        }
        self.slots -= 1;
        Some(Slot {
            count: self.count.clone(),
        })
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        self.count.release(self.slots);
    }
}

/// One generation's place in the count, freed when dropped.
pub struct Slot {
    count: Arc<Count>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.count.release(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn slots_are_reserved_all_or_nothing_and_freed_on_drop() {
        let a = Admission::new(3, Duration::ZERO);
        let mut two = a.admit(2).await.unwrap();
        assert_eq!(a.in_flight(), 2);
        let err = a.admit(2).await.err().unwrap();
        assert_eq!(
            err.message(),
            "server overloaded: 2 requests in flight (limit 3) and this request needs 2; retry later"
        );
        assert_eq!(a.in_flight(), 2);
        let one = two.take().unwrap();
        drop(two);
        assert_eq!(a.in_flight(), 1);
        let mut other = a.admit(2).await.unwrap();
        assert_eq!(
            a.admit(1).await.err().unwrap().message(),
            "server overloaded: 3 requests in flight (limit 3); retry later"
        );
        let (x, y) = (other.take().unwrap(), other.take().unwrap());
        assert!(other.take().is_none());
        drop((one, x, other));
        assert_eq!(a.in_flight(), 1);
        drop(y);
        assert_eq!(a.in_flight(), 0);
    }

    #[tokio::test]
    async fn more_than_the_limit_is_a_400() {
        let a = Admission::new(3, Duration::from_secs(60));
        let err = a.admit(4).await.err().unwrap();
        assert_eq!(err.status(), axum::http::StatusCode::BAD_REQUEST);
        assert_eq!(
            err.message(),
            "this request needs 4 generations (prompts times `n`); the server runs at most 3 at once (--max-requests)"
        );
    }

    #[tokio::test]
    async fn a_request_waits_for_a_freed_slot_up_to_the_admission_wait() {
        let a = Arc::new(Admission::new(1, Duration::from_secs(30)));
        let held = a.admit(1).await.unwrap();
        let waiter = tokio::spawn({
            let a = a.clone();
            async move { a.admit(1).await.map(|_| ()) }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished());
        drop(held);
        let admitted = tokio::time::timeout(Duration::from_secs(5), waiter).await;
        assert!(matches!(admitted, Ok(Ok(Ok(())))));
        let short = Admission::new(1, Duration::from_millis(100));
        let _held = short.admit(1).await.unwrap();
        let started = std::time::Instant::now();
        let err = short.admit(1).await.err().unwrap();
        assert!(started.elapsed() >= Duration::from_millis(100));
        assert_eq!(
            err.message(),
            "server overloaded: 1 requests in flight (limit 1) after waiting 0.1 s (--admission-wait); retry later"
        );
    }

    #[tokio::test]
    async fn a_closed_admission_refuses_with_503_also_those_waiting() {
        let a = Arc::new(Admission::new(1, Duration::from_secs(60)));
        let held = a.admit(1).await.unwrap();
        let waiter = tokio::spawn({
            let a = a.clone();
            async move { a.admit(1).await.err().unwrap() }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        a.close();
        let err = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("a waiting request is refused at once")
            .unwrap();
        assert_eq!(err.status(), axum::http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            err.message(),
            "the server is shutting down; no new requests are accepted"
        );
        assert_eq!(a.in_flight(), 1);
        drop(held);
        assert_eq!(a.in_flight(), 0);
    }
}
