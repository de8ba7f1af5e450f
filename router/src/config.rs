//! Command-line flags of `minisgl-router`.

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use crate::api::sampling_defaults::SamplingSource;
use crate::routing::policy::Thresholds;

// The headings of `--help`, in the order they first appear.
const MODEL: &str = "Model";
const SERVER: &str = "Server";
const WORKERS: &str = "Workers and routing";
const ENGINE: &str = "Spawned workers' engine (their defaults when absent)";
const LIMITS: &str = "Request limits";
const CHAT: &str = "Chat: tool calls and reasoning";
const SHELL: &str = "Terminal chat";

#[derive(Debug, Clone, Parser)]
#[command(
    name = "minisgl-router",
    version,
    about = "minisgl's OpenAI-compatible server: a Rust router in front of Python workers."
)]
pub struct Config {
    /// Hugging Face-style model folder (tokenizer.json, tokenizer_config.json, config.json,
    /// weights); without it the embedded default model is served.
    #[arg(help_heading = MODEL, long, value_name = "PATH")]
    pub model: Option<PathBuf>,
    /// A name clients pass as `model` (repeatable); default: the model folder's name and
    /// the --model argument as given.
    #[arg(help_heading = MODEL, long, value_name = "NAME")]
    pub served_model_name: Vec<String>,
    /// `--model` was filled in with the embedded default model's folder (not a flag).
    #[arg(skip)]
    pub default_model: bool,
    /// Address to listen on; anything but loopback wants --api-key (a warning says so).
    #[arg(help_heading = SERVER, long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(help_heading = SERVER, long, default_value_t = 8000)]
    pub port: u16,
    /// Local workers to spawn (default 1, or 0 when --worker is given).
    #[arg(help_heading = WORKERS, long, value_name = "N")]
    pub workers: Option<usize>,
    /// Tensor-parallel ranks of each spawned worker: N processes on N GPUs (worker i gets
    /// the i-th N of CUDA_VISIBLE_DEVICES; --workers 2 --tp 2 uses 4), on CPU they share
    /// the cores. A --worker group is started with its own --tp.
    #[arg(help_heading = WORKERS, long, value_name = "N", default_value_t = 1, value_parser = clap::builder::TypedValueParser::map(clap::value_parser!(u16).range(1..), usize::from))]
    pub tp: usize,
    /// Attach a worker started elsewhere with `python -m minisgl_worker --listen ...` (repeatable).
    #[arg(help_heading = WORKERS, long = "worker", value_name = "tcp://HOST:PORT")]
    pub remote_workers: Vec<String>,
    /// Which worker serves a request: cache_aware (the one whose prefix cache holds most of
    /// the prompt, unless load is imbalanced), round_robin, least_load (fewest in flight), or
    /// power_of_two (the less loaded of two random workers).
    #[arg(help_heading = WORKERS, long, value_enum, default_value_t = RoutingPolicy::CacheAware)]
    pub routing_policy: RoutingPolicy,
    #[command(flatten, next_help_heading = WORKERS)]
    pub cache_aware: Thresholds,
    /// Device of the spawned workers.
    #[arg(help_heading = MODEL, long, value_enum, default_value_t = Device::Auto)]
    pub device: Device,
    /// Weight and activation dtype of the spawned workers.
    #[arg(help_heading = MODEL, long, value_enum, default_value_t = Dtype::Auto)]
    pub dtype: Dtype,
    /// KV cache page size of the spawned workers (their default when absent).
    #[arg(help_heading = ENGINE, long)]
    pub page_size: Option<u32>,
    /// Most requests a spawned worker runs at once (its default when absent).
    #[arg(help_heading = ENGINE, long)]
    pub max_running: Option<u32>,
    /// Prefix cache of the spawned workers: radix (shared prefixes are computed once) or
    /// naive (none); their default, radix, when absent.
    #[arg(help_heading = ENGINE, long, value_enum)]
    pub cache: Option<Cache>,
    /// Prefill tokens per scheduler step of the spawned workers (their default when absent).
    #[arg(help_heading = ENGINE, long, value_parser = clap::value_parser!(u32).range(1..))]
    pub chunk_size: Option<u32>,
    /// Prefill tokens per step beside running decodes, at most the chunk size: smaller
    /// keeps decodes from stalling behind long prompts (their default: the chunk size).
    #[arg(help_heading = ENGINE, long, value_parser = clap::value_parser!(u32).range(1..))]
    pub mixed_chunk_size: Option<u32>,
    /// Once N/4 or more requests decode, a step of the spawned workers holds at most N
    /// tokens, decodes included, and prompt chunks fill the rest (at least N/8 a step);
    /// with `--schedule-policy lof`, 256 suits large models' batch jobs (their default: off).
    #[arg(help_heading = ENGINE, long, value_parser = clap::value_parser!(u32).range(4..))]
    pub mixed_step_tokens: Option<u32>,
    /// Queue order of the spawned workers: fcfs; lof (longest max_tokens first, which
    /// shortens a batch job submitted at once but lets long requests overtake short ones);
    /// or spf (shortest prompt first, overtaking bounded by arrival time). Their default
    /// when absent: spf when serving on a GPU, fcfs on CPU.
    #[arg(help_heading = ENGINE, long, value_enum)]
    pub schedule_policy: Option<Policy>,
    /// KV cache capacity of each spawned worker, in tokens (their default when absent: what
    /// 90% of the GPU's memory leaves after weights, activations and CUDA graphs; 1 GiB
    /// worth on CPU).
    #[arg(help_heading = ENGINE, long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub kv_tokens: Option<u64>,
    /// Largest decode batch the spawned workers replay as a CUDA graph; 0: none (their
    /// default when absent: 256 on GPUs with >= 80 GiB, else 128).
    #[arg(help_heading = ENGINE, long, value_name = "N")]
    pub cuda_graph_max_bs: Option<u32>,
    /// Largest batch with prompt tokens the spawned workers replay as piecewise CUDA
    /// graphs: 0 (none) or >= 16 (their default when absent: 512).
    #[arg(help_heading = ENGINE, long, value_name = "N", value_parser = graph_tokens)]
    pub cuda_graph_max_tokens: Option<u32>,
    /// Attention kernels of the spawned workers (their default when absent: auto, i.e.
    /// FlashInfer on CUDA when it is installed, torch otherwise).
    #[arg(help_heading = ENGINE, long, value_enum)]
    pub attention_backend: Option<AttentionBackend>,
    /// GEMM of the spawned workers' bias-free linears: auto (on Hopper in bf16, cuBLAS or
    /// CUTLASS with PDL per shape and batch size, chosen once and kept on disk) or cublas
    /// everywhere (their default when absent: auto).
    #[arg(help_heading = ENGINE, long, value_enum)]
    pub gemm: Option<Gemm>,
    /// KV cache storage of the spawned workers: auto (the model's dtype) or fp8_e4m3 (half
    /// the bytes of bf16, about twice the KV tokens; every attention backend).
    #[arg(help_heading = ENGINE, long, value_enum)]
    pub kv_cache_dtype: Option<KvCacheDtype>,
    /// Weights of the spawned workers: safetensors (the model folder's, their default when
    /// absent) or dummy (random weights in the model's shape: benchmarks without a checkpoint).
    #[arg(help_heading = MODEL, long, value_enum)]
    pub load_format: Option<LoadFormat>,
    /// Most generations in flight across all workers (each of `n` copies and each prompt of
    /// a batch counts); past it requests get 429 with `Retry-After: 1`. The default, 4096,
    /// is 16 times a CUDA worker's 256 running requests: deep enough queues that a
    /// saturated server stays busy, a bound on what a flood can pile up in the router.
    #[arg(help_heading = LIMITS, long, value_name = "N", default_value_t = NonZeroUsize::new(4096).unwrap())]
    pub max_requests: NonZeroUsize,
    #[command(flatten, next_help_heading = LIMITS)]
    pub limits: crate::api::limits::Limits,
    /// What a request's omitted temperature, top_p, top_k, min_p and repetition_penalty
    /// become: model (the model folder's generation_config.json where it sets them, OpenAI's
    /// defaults otherwise: temperature 1, top_p 1, the rest off, as vLLM and SGLang do) or
    /// openai (OpenAI's alone).
    #[arg(help_heading = MODEL, long, value_enum, default_value_t = SamplingSource::Model)]
    pub sampling_defaults: SamplingSource,
    #[command(flatten, next_help_heading = CHAT)]
    pub chat: crate::api::tools::ChatOptions,
    /// Seconds to wait for every worker's `ready`.
    #[arg(help_heading = SERVER, long, value_name = "SECS", default_value_t = 600)]
    pub ready_timeout: u64,
    /// After SIGTERM or Ctrl-C: seconds the requests in flight get to finish (new ones get
    /// 503 meanwhile) before they are aborted and the workers stopped.
    #[arg(help_heading = SERVER, long, value_name = "SECS", default_value_t = 30)]
    pub shutdown_timeout: u64,
    /// Chat in this terminal once the server is ready (over its HTTP API); quitting the
    /// shell (/exit, Ctrl-D) shuts the server down.
    #[arg(help_heading = SHELL, long)]
    pub shell: bool,
    /// With --shell: chat with the server already running at this URL instead of starting
    /// one (http only).
    #[arg(help_heading = SHELL, long, value_name = "http://HOST:PORT", requires = "shell")]
    pub url: Option<String>,
    /// Every route but /health and the chat page wants `Authorization: Bearer KEY` (401
    /// otherwise); with --shell, the key the shell sends.
    #[arg(
        help_heading = SERVER,
        long,
        value_name = "KEY",
        env = "MINISGL_API_KEY",
        hide_env_values = true
    )]
    pub api_key: Option<String>,
    /// Do not serve the chat page at `/` (it is a 404 then).
    #[arg(help_heading = SERVER, long)]
    pub no_web_ui: bool,
    /// Log one line per request once its response is sent: its x-request-id, method, path,
    /// status and times.
    #[arg(help_heading = SERVER, long)]
    pub log_requests: bool,
    /// error, warn, info, debug or trace (RUST_LOG-style filters work too).
    #[arg(help_heading = SERVER, long, default_value = "info")]
    pub log_level: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum RoutingPolicy {
    CacheAware,
    RoundRobin,
    LeastLoad,
    PowerOfTwo,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Device {
    Auto,
    Cpu,
    Cuda,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Cache {
    Radix,
    Naive,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AttentionBackend {
    Auto,
    Torch,
    Flashinfer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Gemm {
    Auto,
    Cublas,
}

impl Gemm {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Cublas => "cublas",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KvCacheDtype {
    Auto,
    #[value(name = "fp8_e4m3")]
    Fp8E4m3,
}

impl KvCacheDtype {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Fp8E4m3 => "fp8_e4m3",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LoadFormat {
    Safetensors,
    Dummy,
}

impl LoadFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Safetensors => "safetensors",
            Self::Dummy => "dummy",
        }
    }
}

/// `--cuda-graph-max-tokens`: 0 or at least 16 (a piecewise graph's smallest bucket).
fn graph_tokens(text: &str) -> Result<u32, String> {
    let n: u32 = text.parse().map_err(|e| format!("{e}"))?;
    if n != 0 && n < 16 {
        return Err(format!("must be 0 (no piecewise graphs) or >= 16; got {n}"));
    }
    Ok(n)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Dtype {
    Auto,
    Float32,
    Bfloat16,
    Float16,
}

impl Config {
    /// How many workers to spawn here.
    pub fn local_workers(&self) -> usize {
        self.workers
            .unwrap_or(if self.remote_workers.is_empty() { 1 } else { 0 })
    }

    pub fn ready_timeout(&self) -> Duration {
        Duration::from_secs(self.ready_timeout)
    }

    /// Why the server is exposed, if it is: bound beyond loopback with no --api-key.
    pub fn exposure_warning(&self) -> Option<String> {
        if self.api_key.is_some() || crate::api::auth::is_loopback(&self.host) {
            return None;
        }
        Some(format!(
            "--host {} is reachable from other machines and there is no --api-key: anyone \
             who can reach it can use the API",
            self.host
        ))
    }

    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_secs(self.shutdown_timeout)
    }

    pub fn check(&self) -> Result<(), String> {
        if self.api_key.as_deref() == Some("") {
            return Err("--api-key (or MINISGL_API_KEY) must not be empty".into());
        }
        if self.local_workers() == 0 && self.remote_workers.is_empty() {
            return Err("no workers: give --workers N (N >= 1) or --worker tcp://HOST:PORT".into());
        }
        if self.tp > 1 && self.local_workers() == 0 {
            return Err(format!(
                "--tp {} applies to the workers this router spawns (--workers N); a --worker \
                 group is started with its own --tp",
                self.tp
            ));
        }
        if let Some(bad) = self
            .remote_workers
            .iter()
            .find(|w| !(w.starts_with("tcp://") || w.starts_with("ipc://")))
        {
            return Err(format!(
                "--worker must be tcp://HOST:PORT or ipc://PATH; got {bad}"
            ));
        }
        Ok(())
    }
}

impl Device {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Cpu => "cpu",
            Self::Cuda => "cuda",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Policy {
    Fcfs,
    Lof,
    Spf,
}

impl Policy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fcfs => "fcfs",
            Self::Lof => "lof",
            Self::Spf => "spf",
        }
    }
}

impl Cache {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Radix => "radix",
            Self::Naive => "naive",
        }
    }
}

impl AttentionBackend {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Torch => "torch",
            Self::Flashinfer => "flashinfer",
        }
    }
}

impl Dtype {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Float32 => "float32",
            Self::Bfloat16 => "bfloat16",
            Self::Float16 => "float16",
        }
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
