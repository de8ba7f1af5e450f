//! Least load: the ready worker with the fewest requests in flight from this router (the
//! router's own count: exact and current, where a worker's `load` report is up to a second
//! old). Ties go round-robin, so that an idle pool is still spread over. It ignores the
//! prefix caches; use it when prompts share little.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::{by_policy, ready_loads, Pick, Policy};
use crate::worker::WorkerClient;

#[derive(Default)]
pub struct LeastLoad {
    next: AtomicUsize,
}

impl LeastLoad {
    /// `loads`: (index, in flight) of the ready workers.
    fn pick_among(&self, loads: &[(usize, usize)]) -> Option<usize> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let n = loads.len().max(1);
        (0..loads.len())
            .map(|k| loads[(start + k) % n])
            .min_by_key(|&(_, in_flight)| in_flight)
            .map(|(index, _)| index)
    }
}

impl Policy for LeastLoad {
    fn pick(&self, workers: &[WorkerClient], _input_ids: &[u32]) -> Option<Pick> {
        by_policy(self.pick_among(&ready_loads(workers)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idlest_worker_wins_and_ties_rotate() {
        let p = LeastLoad::default();
        assert_eq!(p.pick_among(&[(0, 5), (2, 1), (3, 4)]), Some(2));
        let ties: Vec<_> = (0..4)
            .map(|_| p.pick_among(&[(0, 0), (1, 0)]).unwrap())
            .collect();
        assert_eq!(ties.iter().filter(|&&i| i == 0).count(), 2, "{ties:?}");
        assert_eq!(p.pick_among(&[]), None);
    }
}
