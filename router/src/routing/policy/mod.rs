//! Which worker serves a request, by `--routing-policy`: cache_aware (default: the prefix
//! index over token ids, balanced by load), round_robin, least_load, power_of_two. Every
//! policy picks among the workers that are ready only; None when none is. A pick names the
//! rule that made it (`minisgl_routing_decisions_total{worker, reason}`), so that a run
//! shows how often cache affinity gave way to balance.

mod cache_aware;
mod least_load;
mod power_of_two;
mod round_robin;

pub use cache_aware::{CacheAware, Thresholds};
pub use least_load::LeastLoad;
pub use power_of_two::PowerOfTwo;
pub use round_robin::RoundRobin;

use crate::config::RoutingPolicy;
use crate::worker::WorkerClient;

/// The worker chosen (its index in the router's list) and the rule that chose it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pick {
    pub index: usize,
    pub reason: Reason,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    /// cache_aware: the worker holding most of the prompt (at least the cache threshold).
    Prefix,
    /// cache_aware: no worker holds enough of it; the one holding fewest tokens.
    Spread,
    /// cache_aware: load was imbalanced; the idlest, whatever it holds.
    Balance,
    /// round_robin's turn, or least_load's / power_of_two's load.
    Policy,
}

impl Reason {
    pub const ALL: [Reason; 4] = [
        Reason::Prefix,
        Reason::Spread,
        Reason::Balance,
        Reason::Policy,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Prefix => "prefix",
            Reason::Spread => "spread",
            Reason::Balance => "balance",
            Reason::Policy => "policy",
        }
    }
}

pub trait Policy: Send + Sync {
    /// The worker to serve `input_ids`, or None when none is ready.
    fn pick(&self, workers: &[WorkerClient], input_ids: &[u32]) -> Option<Pick>;
}

/// A pick by a policy that has one rule.
fn by_policy(index: Option<usize>) -> Option<Pick> {
    index.map(|index| Pick {
        index,
        reason: Reason::Policy,
    })
}

pub fn create_policy(kind: RoutingPolicy, thresholds: Thresholds) -> Box<dyn Policy> {
    match kind {
        RoutingPolicy::CacheAware => Box::new(CacheAware::new(thresholds)),
        RoutingPolicy::RoundRobin => Box::new(RoundRobin::default()),
        RoutingPolicy::LeastLoad => Box::new(LeastLoad::default()),
        RoutingPolicy::PowerOfTwo => Box::new(PowerOfTwo),
    }
}

/// (index, requests in flight from this router) of every ready worker.
fn ready_loads(workers: &[WorkerClient]) -> Vec<(usize, usize)> {
    workers
        .iter()
        .enumerate()
        .filter(|(_, w)| w.is_ready())
        .map(|(i, w)| (i, w.in_flight()))
        .collect()
}
