//! Which worker serves a prompt: the prefix index that mirrors each worker's cache from its
//! cache events (`index`, over the block hashes of `blocks`) and the policies that read it
//! (`policy`: cache-aware by default, round-robin, least-load, power-of-two), and what they
//! decided (`decisions`).

pub mod blocks;
pub mod decisions;
pub mod index;
pub mod policy;
