//! Which worker serves a prompt: the prefix index over token ids (`radix`) and the policies
//! that read it (`policy`: cache-aware by default, round-robin).

pub mod policy;
pub mod radix;
