//! Workers: the wire protocol, the ZMQ client per worker, and the launcher of local workers.

pub mod client;
#[cfg(test)]
pub mod fake;
pub mod gpus;
pub mod launcher;
pub mod protocol;
mod registry;
pub mod request;
mod socket;
mod supervisor;
pub mod tp_check;

pub use client::{WorkerClient, WorkerState};
pub use registry::{Event, Refusal};
pub use request::RequestStream;
