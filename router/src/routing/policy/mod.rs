//! Which worker serves a request, by `--routing-policy`: cache_aware (default: the prefix
//! index over token ids, balanced by load), round_robin, least_load, power_of_two. Every
//! policy picks among the workers that are ready only; None when none is.

mod cache_aware;
mod least_load;
mod power_of_two;
mod round_robin;

pub use cache_aware::CacheAware;
pub use least_load::LeastLoad;
pub use power_of_two::PowerOfTwo;
pub use round_robin::RoundRobin;

use crate::config::RoutingPolicy;
use crate::worker::WorkerClient;

pub trait Policy: Send + Sync {
    /// The index in `workers` of the one to serve `input_ids`, or None when none is ready.
    fn pick(&self, workers: &[WorkerClient], input_ids: &[u32]) -> Option<usize>;
}

pub fn create_policy(kind: RoutingPolicy) -> Box<dyn Policy> {
    match kind {
        RoutingPolicy::CacheAware => Box::new(CacheAware::new()),
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
