//! Round robin: request k goes to worker k mod N, skipping workers that are not ready. It
//! ignores load and prefixes alike: each worker gets an even share of the requests (and,
//! with shared prefixes, each computes every prefix itself), the baseline the others are
//! measured against.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::{by_policy, Pick, Policy};
use crate::worker::WorkerClient;

#[derive(Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

impl RoundRobin {
    fn pick_among(&self, ready: &[bool]) -> Option<usize> {
        let n = ready.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..n).map(|k| (start + k) % n.max(1)).find(|&i| ready[i])
    }
}

impl Policy for RoundRobin {
    fn pick(&self, workers: &[WorkerClient], _input_ids: &[u32]) -> Option<Pick> {
        let ready: Vec<bool> = workers.iter().map(WorkerClient::is_ready).collect();
        by_policy(self.pick_among(&ready))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cycles_over_ready_workers() {
        let rr = RoundRobin::default();
        let picks: Vec<_> = (0..4)
            .map(|_| rr.pick_among(&[true, true]).unwrap())
            .collect();
        assert_eq!(picks, [0, 1, 0, 1]);
    }

    #[test]
    fn skips_workers_that_are_not_ready() {
        let rr = RoundRobin::default();
        for _ in 0..5 {
            assert_eq!(rr.pick_among(&[false, true, false]), Some(1));
        }
        assert_eq!(rr.pick_among(&[false, false]), None);
        assert_eq!(rr.pick_among(&[]), None);
    }
}
