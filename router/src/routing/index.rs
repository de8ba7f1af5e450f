//! The prefix index: what one worker's prefix cache holds, mirrored exactly from its
//! `cache_events` (block hashes, `blocks.rs`), plus the prompts routed to it and not finished.
//!
//! - `CacheMirror` is the set of block hashes the worker reported stored and not yet
//!   removed. The worker's cache holds a block only while it holds every block before it, so
//!   the leading hashes of a prompt found here are the prefix the worker would reuse now.
//!   It is emptied at every `ready` (a restarted worker has an empty cache; a reconnected
//!   one reports everything it holds right after `ready`).
//! - `RoutedBlocks` counts the blocks of prompts in flight on the worker. Their KV is not
//!   cached yet (or its events have not arrived), but it will be by the time a request sent
//!   now is admitted behind them: the cache-aware policy counts them as held, so that a burst
//!   of requests sharing a new prefix stays on one worker. They are never part of the
//!   prediction, which is what the cache holds.
//! - `Accuracy` compares, for every request, the cached tokens the index predicted when the
//!   request was sent (`PrefixMatch::cached`) with the `cached_tokens` the worker reported.
//!   They are equal whenever nothing changes in the worker's cache between the two moments:
//!   a request sent while no other is in flight on that worker (the events of every earlier
//!   request's end arrive before its last token). Requests that overlap on a worker can
//!   differ legitimately (one admitted behind another's prefill finds more; an eviction in
//!   between leaves less), as can one sent right after an abort (an abort has no reply, so
//!   its events may still be on the way): `mismatches` counts them.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct CacheMirror {
    blocks: HashSet<u64>,
}

impl CacheMirror {
    pub fn apply(&mut self, stored: &[u64], removed: &[u64]) {
        for h in removed {
            self.blocks.remove(h);
        }
        self.blocks.extend(stored);
    }

    pub fn clear(&mut self) {
        self.blocks.clear();
    }

    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// How many of `blocks` (a prompt's hashes, in order) lead the prompt in the cache.
    pub fn leading(&self, blocks: &[u64]) -> usize {
        blocks
            .iter()
            .take_while(|h| self.blocks.contains(h))
            .count()
    }

    pub fn contains(&self, block: u64) -> bool {
        self.blocks.contains(&block)
    }
}

/// Blocks of the prompts in flight on one worker, counted (prompts share prefixes).
#[derive(Debug, Default)]
pub struct RoutedBlocks {
    counts: HashMap<u64, u32>,
}

impl RoutedBlocks {
    pub fn add(&mut self, blocks: &[u64]) {
        for &h in blocks {
            *self.counts.entry(h).or_default() += 1;
        }
    }

    pub fn remove(&mut self, blocks: &[u64]) {
        for h in blocks {
            if let Some(n) = self.counts.get_mut(h) {
                *n -= 1;
                if *n == 0 {
                    self.counts.remove(h);
                }
            }
        }
    }

    pub fn clear(&mut self) {
        self.counts.clear();
    }

    pub fn contains(&self, block: u64) -> bool {
        self.counts.contains_key(&block)
    }

    /// Distinct blocks in flight.
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }
}

/// How much of a prompt one worker holds, in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrefixMatch {
    /// The leading prompt tokens its cache holds now (the index's prediction of
    /// `cached_tokens`: at most the prompt's length minus one, in whole pages, as the
    /// worker always computes the last prompt token).
    pub cached: usize,
    /// The leading tokens held or on their way: cached, or in a prompt in flight there.
    pub expected: usize,
    /// Tokens its cache holds plus those of the prompts in flight there (its share).
    pub held: usize,
}

impl PrefixMatch {
    /// `blocks` are the prompt's hashes for this worker's `page_size`, `prompt_len` tokens.
    pub fn of(
        mirror: &CacheMirror,
        routed: &RoutedBlocks,
        blocks: &[u64],
        prompt_len: usize,
        page_size: usize,
    ) -> Self {
        let usable = prompt_len.saturating_sub(1) / page_size;
        let cached = mirror.leading(&blocks[..usable.min(blocks.len())]);
        let expected = blocks
            .iter()
            .take_while(|&&h| mirror.contains(h) || routed.contains(h))
            .count();
        Self {
            cached: cached * page_size,
            expected: expected * page_size,
            held: (mirror.len() + routed.len()) * page_size,
        }
    }
}

/// Predicted against reported cached tokens, over the requests that got a first token.
#[derive(Debug, Default)]
pub struct Accuracy {
    pub requests: AtomicU64,
    pub predicted_tokens: AtomicU64,
    pub reported_tokens: AtomicU64,
    pub mismatches: AtomicU64,
}

impl Accuracy {
    pub fn record(&self, predicted: u32, reported: u32) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.predicted_tokens
            .fetch_add(predicted.into(), Ordering::Relaxed);
        self.reported_tokens
            .fetch_add(reported.into(), Ordering::Relaxed);
        if predicted != reported {
            self.mismatches.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::blocks::block_hashes;

    #[test]
    fn the_mirror_follows_events_and_matches_leading_blocks_only() {
        let prompt: Vec<u32> = (0..10).collect();
        let h = block_hashes(&prompt, 2);
        let mut mirror = CacheMirror::default();
        let routed = RoutedBlocks::default();
        mirror.apply(&h[..3], &[]);
        let m = PrefixMatch::of(&mirror, &routed, &h, prompt.len(), 2);
        assert_eq!((m.cached, m.expected, m.held), (6, 6, 6));
        // Block 1 evicted (a worker never does that before block 2: the walk stops anyway).
        mirror.apply(&[], &h[1..2]);
        assert_eq!(PrefixMatch::of(&mirror, &routed, &h, 10, 2).cached, 2);
        mirror.apply(&h[1..5], &[]);
        // All 5 blocks cached, but the last token is always computed: 4 blocks usable.
        assert_eq!(PrefixMatch::of(&mirror, &routed, &h, 10, 2).cached, 8);
        assert_eq!(PrefixMatch::of(&mirror, &routed, &h, 11, 2).cached, 10);
        mirror.clear();
        assert!(mirror.is_empty());
    }

    #[test]
    fn routed_prompts_count_as_expected_until_they_end() {
        let a = block_hashes(&[1, 2, 3, 4, 5, 6], 2);
        let b = block_hashes(&[1, 2, 3, 4, 9, 9], 2);
        let mut mirror = CacheMirror::default();
        mirror.apply(&a[..1], &[]);
        let mut routed = RoutedBlocks::default();
        routed.add(&a);
        routed.add(&b);
        let m = PrefixMatch::of(&mirror, &routed, &b, 6, 2);
        assert_eq!((m.cached, m.expected, m.held), (2, 6, 2 * (1 + 4)));
        routed.remove(&a);
        assert_eq!(
            PrefixMatch::of(&mirror, &routed, &a, 6, 2).expected,
            4,
            "b's prefix"
        );
        routed.remove(&b);
        assert!(routed.is_empty());
        assert_eq!(PrefixMatch::of(&mirror, &routed, &a, 6, 2).expected, 2);
    }

    #[test]
    fn accuracy_counts_mismatches() {
        let acc = Accuracy::default();
        acc.record(16, 16);
        acc.record(0, 32);
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        assert_eq!(get(&acc.requests), 2);
        assert_eq!(get(&acc.predicted_tokens), 16);
        assert_eq!(get(&acc.reported_tokens), 48);
        assert_eq!(get(&acc.mismatches), 1);
    }
}
