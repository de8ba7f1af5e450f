//! Cache-aware routing (after sgl-router's `cache_aware`): send a prompt to the worker whose
//! KV cache already holds most of its prefix, unless that would pile work on one worker.
//!
//! - Balance first: when the busiest ready worker has more than `--balance-abs-threshold`
//!   requests in flight beyond the idlest and more than `--balance-rel-threshold` times as
//!   many, the idlest worker gets the request (a hot prefix must not starve the others).
//! - Otherwise, if some worker holds at least `--cache-threshold` of the prompt, the one
//!   holding most gets it (ties: fewer in flight).
//! - Otherwise the worker holding the fewest tokens gets it, spreading new prefixes over
//!   the caches.
//!
//! Each pick names its rule (`Reason::Balance`, `Prefix`, `Spread`), counted per worker in
//! /metrics.
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
//! must hold half the prompt to be worth queueing behind), the launcher's 64 and 1.5. Why
//! 64 and not 32: when a worker ends a batch of requests together, its in-flight count
//! drops by that batch at once while the freed clients' next requests spread over every
//! worker, so two workers with 128 in flight swing by about 32 in normal operation. On one
//! H200 (benches/routing.py, two workers, 128 in flight, RESULTS.md) 32 broke affinity for
//! 67 of 512 requests (hit rate 68%, 1.33x round robin), 64 for 18 (84%, 1.71x), and no
//! balance at all gave 86% and 1.65x; 1.1 relative would break it at every small swing.

use super::{Pick, Policy, Reason};
use crate::routing::index::PrefixMatch;
use crate::worker::WorkerClient;

/// The policy's knobs, as flags (named as SGLang's gateway names them).
#[derive(Debug, Clone, Copy, PartialEq, clap::Args)]
pub struct Thresholds {
    /// cache_aware: the share of a prompt (0 to 1) a worker must hold for the prompt to go
    /// to it rather than to the emptiest cache.
    #[arg(long, value_name = "SHARE", default_value_t = 0.5, value_parser = share)]
    pub cache_threshold: f64,
    /// cache_aware: load is imbalanced, and the idlest worker gets the request whatever it
    /// holds, when the busiest has more than this many requests in flight beyond it ...
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub balance_abs_threshold: usize,
    /// ... and more than this many times as many (at least 1).
    #[arg(long, value_name = "RATIO", default_value_t = 1.5, value_parser = ratio)]
    pub balance_rel_threshold: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            cache_threshold: 0.5,
            balance_abs_threshold: 64,
            balance_rel_threshold: 1.5,
        }
    }
}

fn share(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    (0.0..=1.0)
        .contains(&v)
        .then_some(v)
        .ok_or_else(|| format!("must be between 0 and 1, not {v}"))
}

fn ratio(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    (v >= 1.0 && v.is_finite())
        .then_some(v)
        .ok_or_else(|| format!("must be at least 1, not {v}"))
}

#[derive(Default)]
pub struct CacheAware {
    thresholds: Thresholds,
}

/// What the policy looks at for one ready worker.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Candidate {
    pub index: usize,
    pub in_flight: usize,
    /// How much of the prompt it holds, and how much it holds in all.
    pub matched: PrefixMatch,
}

impl CacheAware {
    pub fn new(thresholds: Thresholds) -> Self {
        Self { thresholds }
    }

    pub(crate) fn decide(&self, candidates: &[Candidate], prompt_len: usize) -> Option<Pick> {
        let t = &self.thresholds;
        let pick = |c: &Candidate, reason| Pick {
            index: c.index,
            reason,
        };
        let idlest = candidates.iter().min_by_key(|c| c.in_flight)?;
        let busiest = candidates.iter().map(|c| c.in_flight).max().unwrap_or(0);
        let imbalanced = busiest - idlest.in_flight > t.balance_abs_threshold
            && busiest as f64 > t.balance_rel_threshold * idlest.in_flight as f64;
        if imbalanced || prompt_len == 0 {
            return Some(pick(idlest, Reason::Balance));
        }
        let best = candidates
            .iter()
            .max_by_key(|c| (c.matched.expected, std::cmp::Reverse(c.in_flight)))?;
        if best.matched.expected as f64 >= t.cache_threshold * prompt_len as f64 {
            return Some(pick(best, Reason::Prefix));
        }
        candidates
            .iter()
            .min_by_key(|c| (c.matched.held, c.in_flight))
            .map(|c| pick(c, Reason::Spread))
    }
}

impl Policy for CacheAware {
    fn pick(&self, workers: &[WorkerClient], input_ids: &[u32]) -> Option<Pick> {
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
        self.decide(&candidates, input_ids.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default policy's pick's worker.
    fn decide(w: &[Candidate], prompt_len: usize) -> Option<usize> {
        CacheAware::default().decide(w, prompt_len).map(|p| p.index)
    }

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
        assert_eq!(decide(&w, 100), Some(1));
        // A tie goes to the one with fewer in flight.
        let w = workers(&[(3, 96, 1000), (1, 96, 5000)]);
        assert_eq!(decide(&w, 100), Some(1));
    }

    #[test]
    fn a_new_prefix_goes_to_the_emptier_cache() {
        // Holding 40 of 100 tokens is below the threshold.
        let w = workers(&[(0, 40, 5000), (2, 0, 1000)]);
        assert_eq!(decide(&w, 100), Some(1));
        let w = workers(&[(1, 0, 0), (0, 0, 0)]);
        assert_eq!(decide(&w, 100), Some(1), "then fewer in flight");
    }

    #[test]
    fn imbalance_overrides_cache_affinity() {
        let w = workers(&[(100, 100, 100), (10, 0, 0)]);
        assert_eq!(decide(&w, 100), Some(1));
        // 20 more than the idlest is within BALANCE_ABS: affinity stands.
        let w = workers(&[(60, 100, 100), (40, 0, 0)]);
        assert_eq!(decide(&w, 100), Some(0), "not imbalanced enough");
    }

    #[test]
    fn each_pick_names_its_rule_and_thresholds_are_the_flags() {
        let policy = CacheAware::default();
        let reason = |w: &[Candidate]| policy.decide(w, 100).unwrap().reason;
        assert_eq!(reason(&workers(&[(0, 96, 96), (0, 0, 0)])), Reason::Prefix);
        assert_eq!(reason(&workers(&[(0, 10, 96), (0, 0, 0)])), Reason::Spread);
        assert_eq!(
            reason(&workers(&[(90, 96, 96), (0, 0, 0)])),
            Reason::Balance
        );
        // A looser balance rule keeps the affinity that the default one breaks.
        let loose = CacheAware::new(Thresholds {
            balance_abs_threshold: 100,
            ..Thresholds::default()
        });
        let w = workers(&[(90, 96, 96), (0, 0, 0)]);
        assert_eq!(loose.decide(&w, 100).unwrap().reason, Reason::Prefix);
        // A lower cache threshold counts a smaller share as affinity.
        let eager = CacheAware::new(Thresholds {
            cache_threshold: 0.05,
            ..Thresholds::default()
        });
        let w = workers(&[(0, 10, 96), (0, 0, 0)]);
        assert_eq!(
            eager.decide(&w, 100).unwrap(),
            Pick {
                index: 0,
                reason: Reason::Prefix
            }
        );
    }

    #[test]
    fn no_candidates_no_pick() {
        assert_eq!(decide(&[], 1), None);
    }
}
