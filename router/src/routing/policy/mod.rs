//! Which worker serves a request: cache-aware (prefix index over token ids) by default,
//! round-robin as the simple alternative.

mod cache_aware;
mod round_robin;

pub use cache_aware::CacheAware;
pub use round_robin::RoundRobin;

use crate::worker::WorkerClient;

pub trait Policy: Send + Sync {
    /// The index in `workers` of the one to serve `input_ids`, or None when none is ready.
    fn pick(&self, workers: &[WorkerClient], input_ids: &[u32]) -> Option<usize>;
}

pub fn create_policy() -> Box<dyn Policy> {
    Box::new(CacheAware::new())
}
