//! Which worker serves a request. Round-robin now; a cache-aware policy (prefix index over
//! token ids) plugs in through the same trait.

mod round_robin;

pub use round_robin::RoundRobin;

use crate::worker::WorkerClient;

pub trait Policy: Send + Sync {
    /// The index in `workers` of the one to serve `input_ids`, or None when none is ready.
    fn pick(&self, workers: &[WorkerClient], input_ids: &[u32]) -> Option<usize>;
}

pub fn create_policy() -> Box<dyn Policy> {
    Box::new(RoundRobin::default())
}
