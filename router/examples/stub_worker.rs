//! A stub worker in its own process: the instant mock of examples/common/mock_worker.rs bound
//! on `--listen`, for a router started with `--worker` and driven by any HTTP client
//! (benches/router_stub.sh drives it with benches/online/online.py). It does no model work, so what
//! a client measures through the router is the router's own cost plus the client's.
//!
//!   cargo run --release --example stub_worker -- --listen tcp://127.0.0.1:5599 [--model DIR]
//!
//! Every request gets the tokens of one English sentence (from DIR's tokenizer.json; default:
//! the embedded default model's folder) repeated up to its `max_tokens`.

#[path = "common/mock_worker.rs"]
mod mock_worker;

use _router::api::sampling_defaults::SamplingSource;
use _router::model_files::load_model_files;

const REPLY: &str = " the quick brown fox jumps over the lazy dog, and then";

fn main() {
    let mut listen = None;
    let home = std::env::var("HOME").unwrap_or_default();
    let mut model =
        std::path::PathBuf::from(format!("{home}/.cache/minisgl/SmolLM2-135M-Instruct"));
    let argv: Vec<String> = std::env::args().skip(1).collect();
    for pair in argv.chunks(2) {
        let value = pair.get(1).cloned().unwrap_or_default();
        match pair[0].as_str() {
            "--listen" => listen = Some(value),
            "--model" => model = value.into(),
            other => panic!("unknown argument {other}; usage: --listen ADDR [--model DIR]"),
        }
    }
    let listen = listen.expect("--listen ADDR (tcp://HOST:PORT or ipc://PATH) is required");
    let files = load_model_files(&model, None, SamplingSource::Model).expect("model folder");
    let reply = files.tokenizer.encode_blocking(REPLY, false);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    eprintln!("stub worker on {listen}");
    rt.block_on(mock_worker::mock_worker(listen, reply));
}
