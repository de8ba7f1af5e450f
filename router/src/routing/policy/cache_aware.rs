//! Cache-aware routing (after sgl-router's `cache_aware`): send a prompt to the worker whose
//! KV cache already holds most of its prefix, unless that would pile work on one worker.
//!
//! - Balance first: when the busiest ready worker has more than `BALANCE_ABS` requests in
//!   flight beyond the idlest and more than `BALANCE_REL` times as many, the idlest worker
//!   gets the request (a hot prefix must not starve the others).
//! - Otherwise, if some worker holds at least `CACHE_THRESHOLD` of the prompt, the one
//!   holding most gets it (ties: fewer in flight).
//! - Otherwise the worker holding the fewest tokens gets it, spreading new prefixes over
//!   the caches.
//!
//! "Holds" is read from the prefix index (routing/index.rs): what the worker's cache holds
//! by its own cache events, exactly, plus the prompts in flight there, whose KV will be
//! cached by the time this one is admitted behind them (so that a burst of requests sharing
//! a new prefix lands on one worker before any of it is computed). A restarted worker
//! holds nothing: its index is emptied at its `ready`.
//!
//! The thresholds, against SGLang's gateway (sgl-project/sglang, sgl-router): its
//! `CacheAwareConfig::default()` (src/policies/mod.rs) has cache 0.5, balance 32 absolute,
//! 1.1 relative; its launcher's flags (src/main.rs) default to 0.3, 64 and 1.5. Its load is
//! the same quantity as ours, requests in flight from the router. We keep 0.5 (a worker
//! must hold half the prompt to be worth queueing behind), 32 (below a worker's batch of
//! running requests, so a hot prefix spills over before its worker queues), and 1.5 (the
//! launcher's: 1.1 would break affinity at every small imbalance between two workers).

use super::Policy;
use crate::routing::index::PrefixMatch;
use crate::worker::WorkerClient;

const CACHE_THRESHOLD: f64 = 0.5;
const BALANCE_ABS: usize = 32;
const BALANCE_REL: f64 = 1.5;

#[derive(Default)]
pub struct CacheAware;

/// What the policy looks at for one ready worker.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Candidate {
    pub index: usize,
    pub in_flight: usize,
    /// How much of the prompt it holds, and how much it holds in all.
    pub matched: PrefixMatch,
}

impl CacheAware {
    pub fn new() -> Self {
        Self
    }

    pub(crate) fn decide(candidates: &[Candidate], prompt_len: usize) -> Option<usize> {
        let idlest = *candidates.iter().min_by_key(|c| c.in_flight)?;
        let busiest = candidates.iter().map(|c| c.in_flight).max().unwrap_or(0);
        let imbalanced = busiest - idlest.in_flight > BALANCE_ABS
            && busiest as f64 > BALANCE_REL * idlest.in_flight as f64;
        if imbalanced || prompt_len == 0 {
            return Some(idlest.index);
        }
        let best = candidates
            .iter()
            .max_by_key(|c| (c.matched.expected, std::cmp::Reverse(c.in_flight)))?;
        if best.matched.expected as f64 >= CACHE_THRESHOLD * prompt_len as f64 {
            return Some(best.index);
        }
        candidates
            .iter()
            .min_by_key(|c| (c.matched.held, c.in_flight))
            .map(|c| c.index)
    }
}

impl Policy for CacheAware {
    fn pick(&self, workers: &[WorkerClient], input_ids: &[u32]) -> Option<usize> {
        let candidates: Vec<Candidate> = workers
            .iter()
            .enumerate()
            .filter_map(|(index, w)| {
                Some(Candidate {
                    index,
                    in_flight: w.in_flight(),
                    matched: w.prefix_match(input_ids)?,
                })
            })
            .collect();
        Self::decide(&candidates, input_ids.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Workers with (requests in flight, prompt tokens held, tokens held in all).
    fn workers(state: &[(usize, usize, usize)]) -> Vec<Candidate> {
        state
            .iter()
            .enumerate()
            .map(|(index, &(in_flight, expected, held))| Candidate {
                index,
                in_flight,
                matched: PrefixMatch {
                    cached: expected,
                    expected,
                    held,
                },
            })
            .collect()
    }

    #[test]
    fn the_worker_holding_most_of_the_prompt_gets_it() {
        let w = workers(&[(3, 64, 1000), (0, 96, 5000), (0, 0, 0)]);
        assert_eq!(CacheAware::decide(&w, 100), Some(1));
        // A tie goes to the one with fewer in flight.
        let w = workers(&[(3, 96, 1000), (1, 96, 5000)]);
        assert_eq!(CacheAware::decide(&w, 100), Some(1));
    }

    #[test]
    fn a_new_prefix_goes_to_the_emptier_cache() {
        // Holding 40 of 100 tokens is below the threshold.
        let w = workers(&[(0, 40, 5000), (2, 0, 1000)]);
        assert_eq!(CacheAware::decide(&w, 100), Some(1));
        let w = workers(&[(1, 0, 0), (0, 0, 0)]);
        assert_eq!(CacheAware::decide(&w, 100), Some(1), "then fewer in flight");
    }

    #[test]
    fn imbalance_overrides_cache_affinity() {
        let w = workers(&[(100, 100, 100), (10, 0, 0)]);
        assert_eq!(CacheAware::decide(&w, 100), Some(1));
        // 20 more than the idlest is within BALANCE_ABS: affinity stands.
        let w = workers(&[(60, 100, 100), (40, 0, 0)]);
        assert_eq!(
            CacheAware::decide(&w, 100),
            Some(0),
            "not imbalanced enough"
        );
    }

    #[test]
    fn no_candidates_no_pick() {
        assert_eq!(CacheAware::decide(&[], 1), None);
    }
}
