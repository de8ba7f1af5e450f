//! Router-side admission control: at most `--max-requests` generations in flight at once.
//!
//! A request reserves one slot per generation it will start (each of `n` copies, each prompt
//! of a batch) before anything is tokenized or sent, all or nothing; when the slots are not
//! there it gets a 429. Each generation's slot then travels with its [`RequestStream`] and
//! is freed exactly once, by `Drop`, when the request finishes, fails, is aborted, its
//! client disconnects or its worker dies.
//!
//! [`RequestStream`]: crate::worker::RequestStream

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::error::ApiError;

/// The in-flight count and its limit.
pub struct Admission {
    in_flight: Arc<AtomicUsize>,
    limit: usize,
}

impl Admission {
    pub fn new(limit: usize) -> Self {
        Self {
            in_flight: Arc::new(AtomicUsize::new(0)),
            limit,
        }
    }

    /// Generations sent to workers (or about to be) and not finished.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Reserves `count` slots at once, or refuses with 429 naming the numbers.
    pub fn admit(&self, count: usize) -> Result<Slots, ApiError> {
        let reserved = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                now.checked_add(count).filter(|&after| after <= self.limit)
            });
        match reserved {
            Ok(_) => Ok(Slots {
                in_flight: self.in_flight.clone(),
                count,
            }),
            Err(now) => {
                let needs = match count {
                    1 => String::new(),
                    _ => format!(" and this request needs {count}"),
                };
                Err(ApiError::Overloaded(format!(
                    "server overloaded: {now} requests in flight (limit {}){needs}; retry later",
                    self.limit
                )))
            }
        }
    }
}

/// Reserved slots not yet handed to a generation; dropping them frees the rest.
pub struct Slots {
    in_flight: Arc<AtomicUsize>,
    count: usize,
}

impl Slots {
    /// One slot for one generation; None once all are handed out.
    pub fn take(&mut self) -> Option<Slot> {
        if self.count == 0 {
            return None;
        }
        self.count -= 1;
        Some(Slot {
            in_flight: self.in_flight.clone(),
        })
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(self.count, Ordering::AcqRel);
    }
}

/// One generation's place in the count, freed when dropped.
pub struct Slot {
    in_flight: Arc<AtomicUsize>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reserved_all_or_nothing_and_freed_on_drop() {
        let a = Admission::new(3);
        let mut two = a.admit(2).unwrap();
        assert_eq!(a.in_flight(), 2);
        let err = a.admit(2).err().unwrap();
        assert_eq!(
            err.message(),
            "server overloaded: 2 requests in flight (limit 3) and this request needs 2; retry later"
        );
        assert_eq!(a.in_flight(), 2);
        let one = two.take().unwrap();
        drop(two);
        assert_eq!(a.in_flight(), 1);
        let mut other = a.admit(2).unwrap();
        assert_eq!(
            a.admit(1).err().unwrap().message(),
            "server overloaded: 3 requests in flight (limit 3); retry later"
        );
        let (x, y) = (other.take().unwrap(), other.take().unwrap());
        assert!(other.take().is_none());
        drop((one, x, other));
        assert_eq!(a.in_flight(), 1);
        drop(y);
        assert_eq!(a.in_flight(), 0);
    }
}
