//! The HTTP side, in the order a request meets it: `auth` (`--api-key`), `routes` (every route and its thin
//! handler) -> `openai` (the body parsed, unknown keys refused by name) -> `params`
//! (validated, limits named, omitted sampling fields from `sampling_defaults`; `constraint`: structured outputs, their schemas' objects closed by `closed_objects`; `tools`: tool calls and reasoning) -> the endpoint's prompt (`chat`, `completions`, `native`) ->
//! `admission` (a slot per generation, or 429) -> `generate` (tokenize, pick a worker,
//! submit; tokens back to text) -> `respond` (one JSON body, or the one SSE loop). Beside them, `page`: the chat page at `/`.

pub mod access;
pub mod admission;
pub mod auth;
pub mod chat;
pub mod closed_objects;
pub mod completions;
pub mod constraint;
pub mod generate;
pub mod limits;
pub mod messages;
pub mod models;
pub mod native;
pub mod openai;
pub mod openapi;
pub mod page;
pub mod params;
pub mod prepare;
pub mod respond;
pub mod routes;
pub mod sampling_defaults;
pub mod tools;

pub use routes::app;
