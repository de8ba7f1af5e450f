//! minisgl's router: the OpenAI-compatible HTTP front end (tokenization, chat templates,
//! detokenization, stop strings) in front of Python workers reached over ZeroMQ.
//!
//! Built into the wheel as `minisgl_worker._router`; `minisgl-router` calls [`main`].
//!
//! The folders follow a request: `api/` (routes, body parsing, validation, admission, one
//! generation's life, the responses and their one SSE loop; start at `api/routes.rs`) ->
//! `text/` (tokenizer, chat template, detokenizer, stop strings) -> `routing/` (prefix
//! index and policies: which worker) -> `worker/` (protocol, ZMQ client, launcher). Around
//! them: `config.rs` (flags), `model_files.rs` (what the router reads from the model
//! folder), `run.rs` (start, serve, stop), `state.rs` (what handlers
//! share), `error.rs` (the one error enum, in OpenAI's shape) and `metrics.rs`; `shell/` is
//! `--shell`, a terminal chat over the HTTP API.

pub mod api;
pub mod config;
pub mod error;
pub mod listen;
pub mod metrics;
pub mod model_files;
pub mod routing;
pub mod run;
pub mod shell;
pub mod signals;
pub mod state;
pub mod text;
pub mod worker;

use clap::Parser;
use pyo3::prelude::*;

/// `_router.main(argv, python, default_model) -> exit code`.
///
/// `argv[0]` is the program name. `python` is the interpreter that spawns the workers.
/// `default_model` is called (with the GIL) for a model folder when `--model` is absent.
/// The server runs with the GIL released; every failure is one line on stderr, never a
/// traceback.
#[pyfunction]
fn main(py: Python<'_>, argv: Vec<String>, python: String, default_model: Py<PyAny>) -> i32 {
    let mut config = match config::Config::try_parse_from(&argv) {
        Ok(config) => config,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    // `--shell --url` talks to a server elsewhere: no model here.
    if config.model.is_none() && config.url.is_none() {
        match default_model
            .bind(py)
            .call0()
            .and_then(|path| path.str().map(|s| s.to_string()))
        {
            Ok(path) => {
                config.model = Some(path.into());
                config.default_model = true;
            }
            Err(e) => {
                eprintln!("minisgl-router: error: cannot prepare the default model: {e}");
                return 1;
            }
        }
    }
    let code = py.detach(|| run::run(config, python));
    // The Ctrl-C that stopped the server also reached Python's handler (tokio chains to it):
    // consume the pending KeyboardInterrupt here, or it would surface as a traceback.
    let _ = py.check_signals();
    code
}

#[pymodule]
fn _router(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(main, m)?)
}
