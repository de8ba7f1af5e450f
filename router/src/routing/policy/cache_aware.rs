//! Cache-aware routing (after sgl-router's `cache_aware`): send a prompt to the worker whose
//! KV cache most likely already holds its prefix, unless that would pile work on one worker.
//!
//! - Balance first: when the busiest ready worker has more than `BALANCE_ABS` requests in
//!   flight beyond the idlest and more than `BALANCE_REL` times as many, the idlest worker
//!   gets the request (a hot prefix must not starve the others).
//! - Otherwise, if some worker shares at least `CACHE_THRESHOLD` of the prompt (by the
//!   prefix index), the one sharing most gets it (ties: fewer in flight).
//! - Otherwise the worker holding the fewest tokens in the index gets it, spreading new
//!   prefixes over the caches.
//!
//! The chosen worker is then recorded in the index for this prompt, and its share of the
//! index is capped at its KV capacity (LRU, evicting down to 90%), since its own cache can
//! hold no more. A worker that has said `ready` again since (restarted, or reconnected)
//! starts with an empty cache: its share of the index is dropped.
//!
//! The thresholds, against SGLang's gateway (sgl-project/sglang, sgl-router): its
//! `CacheAwareConfig::default()` (src/policies/mod.rs) has cache 0.5, balance 32 absolute,
//! 1.1 relative; its launcher's flags (src/main.rs) default to 0.3, 64 and 1.5. Its load is
//! the same quantity as ours, requests in flight from the router. We keep 0.5 (a worker
//! must hold half the prompt to be worth queueing behind), 32 (below a worker's batch of
//! running requests, so a hot prefix spills over before its worker queues), and 1.5 (the
//! launcher's: 1.1 would break affinity at every small imbalance between two workers).

use std::collections::HashMap;
use std::sync::Mutex;

use super::Policy;
use crate::routing::radix::PrefixIndex;
use crate::worker::WorkerClient;

const CACHE_THRESHOLD: f64 = 0.5;
const BALANCE_ABS: usize = 32;
const BALANCE_REL: f64 = 1.5;

#[derive(Default)]
pub struct CacheAware {
    index: Mutex<PrefixIndex>,
    /// Per worker, its `readies` when the index last recorded a prompt for it.
    readies: Mutex<HashMap<usize, u64>>,
}

/// What the policy looks at for one ready worker.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Candidate {
    pub index: usize,
    pub in_flight: usize,
    pub capacity: usize,
    /// How many times it has said `ready` (more than once: it restarted, its cache empty).
    pub readies: u64,
}

impl CacheAware {
    pub fn new() -> Self {
        Self {
            index: Mutex::new(PrefixIndex::new()),
            readies: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn choose(&self, candidates: &[Candidate], ids: &[u32]) -> Option<usize> {
        let mut index = self.index.lock().unwrap();
        let mut readies = self.readies.lock().unwrap();
        for c in candidates {
            if readies
                .insert(c.index, c.readies)
                .is_some_and(|r| r != c.readies)
            {
                index.evict(c.index, 0);
            }
        }
        drop(readies);
        let chosen = Self::decide(&index, candidates, ids)?;
        index.insert(ids, chosen.index);
        if index.tokens_of(chosen.index) > chosen.capacity {
            // Down to 90%, so that the eviction scan runs once per many requests.
            index.evict(chosen.index, chosen.capacity / 10 * 9);
        }
        Some(chosen.index)
    }

    fn decide(index: &PrefixIndex, candidates: &[Candidate], ids: &[u32]) -> Option<Candidate> {
        let idlest = *candidates.iter().min_by_key(|c| c.in_flight)?;
        let busiest = candidates.iter().map(|c| c.in_flight).max().unwrap_or(0);
        let imbalanced = busiest - idlest.in_flight > BALANCE_ABS
            && busiest as f64 > BALANCE_REL * idlest.in_flight as f64;
        if imbalanced || ids.is_empty() {
            return Some(idlest);
        }
        let matched = index.match_prefix(ids);
        let shared = |c: &Candidate| matched.get(&c.index).copied().unwrap_or(0);
        let best = candidates
            .iter()
            .max_by_key(|c| (shared(c), std::cmp::Reverse(c.in_flight)))
            .copied()?;
        if shared(&best) as f64 >= CACHE_THRESHOLD * ids.len() as f64 {
            return Some(best);
        }
        candidates
            .iter()
            .min_by_key(|c| (index.tokens_of(c.index), c.in_flight))
            .copied()
    }
}

impl Policy for CacheAware {
    fn pick(&self, workers: &[WorkerClient], input_ids: &[u32]) -> Option<usize> {
        let candidates: Vec<Candidate> = workers
            .iter()
            .enumerate()
            .filter_map(|(index, w)| {
                let ready = w.ready_info()?;
                let capacity = (ready.kv_capacity as usize).max(1);
                Some(Candidate {
                    index,
                    in_flight: w.in_flight(),
                    capacity,
                    readies: w.readies(),
                })
            })
            .collect();
        self.choose(&candidates, input_ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAPACITY: usize = 1 << 20;

    fn workers(in_flight: &[usize]) -> Vec<Candidate> {
        in_flight
            .iter()
            .enumerate()
            .map(|(index, &in_flight)| Candidate {
                index,
                in_flight,
                capacity: CAPACITY,
                readies: 1,
            })
            .collect()
    }

    #[test]
    fn a_worker_that_said_ready_again_has_forgotten_its_prefixes() {
        let policy = CacheAware::new();
        let idle = workers(&[0, 0]);
        let a = policy.choose(&idle, &[1, 2, 3, 4]).unwrap();
        policy.choose(&idle, &[9, 8, 7, 6]).unwrap();
        assert_eq!(policy.choose(&idle, &[1, 2, 3, 5]), Some(a));
        let mut restarted = idle.clone();
        restarted[a].readies = 2;
        policy.choose(&restarted, &[5, 5, 5, 5]);
        let index = policy.index.lock().unwrap();
        // `a` kept only the prompt just routed to it (if any); the other's share is intact.
        assert!(index.tokens_of(a) <= 4, "{}", index.tokens_of(a));
        assert_eq!(index.match_prefix(&[1, 2, 3, 5]).get(&a), None);
        assert_eq!(index.tokens_of(1 - a), 4);
    }

    #[test]
    fn new_prefixes_spread_then_stick_to_their_worker() {
        let policy = CacheAware::new();
        let idle = workers(&[0, 0]);
        let a = policy.choose(&idle, &[1, 2, 3, 4]).unwrap();
        let b = policy.choose(&idle, &[9, 8, 7, 6]).unwrap();
        assert_ne!(a, b, "the second prefix goes to the emptier cache");
        // Same system prompt, different question: still the worker that has the prefix.
        assert_eq!(policy.choose(&idle, &[1, 2, 3, 5]), Some(a));
        assert_eq!(policy.choose(&idle, &[9, 8, 7, 0]), Some(b));
    }

    #[test]
    fn imbalance_overrides_cache_affinity() {
        let policy = CacheAware::new();
        let first = policy.choose(&workers(&[0, 0]), &[1, 2, 3, 4]).unwrap();
        let mut loads = [0, 0];
        loads[first] = 100;
        let other = 1 - first;
        assert_eq!(policy.choose(&workers(&loads), &[1, 2, 3, 4]), Some(other));
    }

    #[test]
    fn a_short_shared_prefix_is_not_enough() {
        let policy = CacheAware::new();
        let idle = workers(&[0, 0]);
        let a = policy.choose(&idle, &[1, 2, 3, 4]).unwrap();
        // Shares 1 of 4 tokens with `a`'s prompt: below the threshold, the emptier worker wins.
        assert_ne!(policy.choose(&idle, &[1, 7, 7, 7]), Some(a));
    }

    #[test]
    fn a_workers_share_of_the_index_is_capped_at_its_capacity() {
        let policy = CacheAware::new();
        let small = [Candidate {
            index: 0,
            in_flight: 0,
            capacity: 100,
            readies: 1,
        }];
        for i in 0..50u32 {
            policy.choose(&small, &[i, i + 1, i + 2, i + 3]);
        }
        assert!(policy.index.lock().unwrap().tokens_of(0) <= 100);
    }

    #[test]
    fn no_candidates_no_pick() {
        assert_eq!(CacheAware::new().choose(&[], &[1]), None);
    }
}
