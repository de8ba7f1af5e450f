//! Prometheus metrics, rendered by hand in the text exposition format (version 0.0.4).
//! Why hand-written: the router needs a few counters and four fixed-bucket histograms that
//! are updated on every token; atomics do that without locks, and the text format is a page
//! of `format!`s. The `prometheus` or `metrics-exporter-prometheus` crates would add a
//! registry, label hashing and a dozen dependencies to build for no extra function.
//!
//! Series: `minisgl_requests_total{endpoint, status}`; latency histograms (seconds)
//! `minisgl_time_to_first_token_seconds`, `minisgl_time_per_output_token_seconds`,
//! `minisgl_inter_token_latency_seconds`, `minisgl_e2e_request_latency_seconds`; token
//! counters; `minisgl_requests_in_flight` and its `--max-requests` limit (429s are counted
//! in `minisgl_requests_total` with status 429); and per worker (label `worker`, its address) the last `load` it sent: waiting
//! and running requests, `minisgl_kv_cache_used_tokens` (held by live requests),
//! `minisgl_kv_cache_cached_tokens` (evictable cached prefixes), the KV capacity, the
//! cumulative prompt / cached prompt tokens and their ratio `minisgl_prefix_cache_hit_rate`;
//! its state `minisgl_worker_state{worker, state}` (1 for the current one) and
//! `minisgl_worker_restarts_total{worker}`; `minisgl_request_retries_total`;
//! `minisgl_request_timeouts_total` (generations stopped by `--request-timeout`);
//! `minisgl_client_disconnects_total{worker}` (generations aborted because their client
//! went away); the router's own `minisgl_router_tasks` and `process_resident_memory_bytes`;
//! and how exact the prefix index is (routing/index.rs), per worker: the tokens it holds
//! (`minisgl_prefix_index_cached_tokens`), the requests compared, their predicted and
//! reported cached tokens, and the requests where the two differed; and which rule of the
//! routing policy sent how many requests where (`minisgl_routing_decisions_total`).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::api::admission::Admission;
use crate::routing::decisions::Decisions;
use crate::worker::{WorkerClient, WorkerState};

/// Upper bounds in seconds; the last bucket is +Inf.
const LATENCY_BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// A fixed-bucket histogram; observing is a few relaxed atomic adds.
pub struct Histogram {
    counts: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_micros: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_micros: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    pub fn observe(&self, value: Duration) {
        let secs = value.as_secs_f64();
        let bucket = LATENCY_BUCKETS
            .iter()
            .position(|&bound| secs <= bound)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add(value.as_micros() as u64, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, count) in self.counts.iter().enumerate() {
            cumulative += count.load(Ordering::Relaxed);
            let le = LATENCY_BUCKETS
                .get(i)
                .map_or("+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
        }
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {cumulative}");
    }
}

#[derive(Default)]
pub struct Metrics {
    /// (endpoint, status code) -> count.
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    pub ttft: Histogram,
    pub tpot: Histogram,
    pub inter_token: Histogram,
    pub e2e: Histogram,
    pub prompt_tokens: AtomicU64,
    pub generation_tokens: AtomicU64,
    /// Generations sent again to a worker after theirs failed before their first token.
    pub retries: AtomicU64,
    /// The routing policy's picks, by worker and rule.
    pub routing: Decisions,
    /// Generations stopped by `--request-timeout` (answered 504 or an SSE timeout event).
    pub timeouts: AtomicU64,
}

impl Metrics {
    pub fn count_request(&self, endpoint: &str, status: u16) {
        let mut requests = self.requests.lock().unwrap();
        *requests.entry((endpoint.to_string(), status)).or_default() += 1;
    }

    /// One finished generation: `ttft` to its first token, `total` to its last, `tokens` made.
    pub fn observe_generation(&self, ttft: Duration, total: Duration, tokens: u32) {
        self.ttft.observe(ttft);
        self.e2e.observe(total);
        if tokens > 1 {
            self.tpot.observe((total - ttft) / (tokens - 1));
        }
    }

    pub fn render(&self, workers: &[WorkerClient], admission: &Admission) -> String {
        let mut out = String::new();
        out.push_str("# HELP minisgl_requests_total HTTP requests by endpoint and status.\n");
        out.push_str("# TYPE minisgl_requests_total counter\n");
        for ((endpoint, status), n) in self.requests.lock().unwrap().iter() {
            let _ = writeln!(
                out,
                "minisgl_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {n}"
            );
        }
        self.ttft.render(
            &mut out,
            "minisgl_time_to_first_token_seconds",
            "Time from the request to its first token.",
        );
        self.tpot.render(
            &mut out,
            "minisgl_time_per_output_token_seconds",
            "Mean time per output token after the first, per request.",
        );
        self.inter_token.render(
            &mut out,
            "minisgl_inter_token_latency_seconds",
            "Time between consecutive tokens of a request.",
        );
        self.e2e.render(
            &mut out,
            "minisgl_e2e_request_latency_seconds",
            "Time from the request to its last token.",
        );
        counter(
            &mut out,
            "minisgl_prompt_tokens_total",
            "Prompt tokens of generations started.",
            self.prompt_tokens.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "minisgl_generation_tokens_total",
            "Tokens generated.",
            self.generation_tokens.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "minisgl_request_retries_total",
            "Generations sent again after their worker failed before their first token.",
            self.retries.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "minisgl_request_timeouts_total",
            "Generations stopped because they ran past --request-timeout.",
            self.timeouts.load(Ordering::Relaxed),
        );
        gauge(
            &mut out,
            "minisgl_requests_in_flight",
            "Generations sent to workers and not finished (each of n copies counts).",
            admission.in_flight(),
        );
        gauge(
            &mut out,
            "minisgl_requests_in_flight_limit",
            "The --max-requests limit; past it requests get 429.",
            admission.limit(),
        );
        render_worker_states(&mut out, workers);
        render_workers(&mut out, workers);
        render_index(&mut out, workers);
        self.routing.render(&mut out, workers);
        render_process(&mut out);
        out
    }
}

/// The router process itself: its live tokio tasks and its resident memory, so that a leak
/// (a task or a buffer per request that outlives it) shows as growth under steady load.
fn render_process(out: &mut String) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        gauge(
            out,
            "minisgl_router_tasks",
            "Live tokio tasks in the router.",
            runtime.metrics().num_alive_tasks(),
        );
    }
    if let Some(bytes) = resident_bytes() {
        gauge(
            out,
            "process_resident_memory_bytes",
            "Resident memory of the router process in bytes.",
            bytes,
        );
    }
}

/// The process's resident set size, from /proc/self/statm (Linux; None elsewhere).
fn resident_bytes() -> Option<usize> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: usize = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * usize::try_from(page_size).ok()?)
}

/// Each worker's state (one series per state, 1 for the current one) and its restarts.
fn render_worker_states(out: &mut String, workers: &[WorkerClient]) {
    let name = "minisgl_worker_state";
    let _ = writeln!(
        out,
        "# HELP {name} 1 for the state each worker is in (connecting, ready, down, dead).\n\
         # TYPE {name} gauge"
    );
    for w in workers {
        let now = w.state().name();
        for state in WorkerState::NAMES {
            let value = u8::from(state == now);
            let address = w.address();
            let _ = writeln!(
                out,
                "{name}{{worker=\"{address}\",state=\"{state}\"}} {value}"
            );
        }
    }
    let name = "minisgl_worker_restarts_total";
    let _ = writeln!(
        out,
        "# HELP {name} Times a local worker was started again after it exited.\n\
         # TYPE {name} counter"
    );
    for w in workers {
        let _ = writeln!(out, "{name}{{worker=\"{}\"}} {}", w.address(), w.restarts());
    }
    let name = "minisgl_client_disconnects_total";
    let _ = writeln!(
        out,
        "# HELP {name} Generations aborted in their worker because their client went away.\n\
         # TYPE {name} counter"
    );
    for w in workers {
        let _ = writeln!(
            out,
            "{name}{{worker=\"{}\"}} {}",
            w.address(),
            w.disconnects()
        );
    }
}

/// Per worker: the prefix index's share, and its predictions against the worker's reports.
fn render_index(out: &mut String, workers: &[WorkerClient]) {
    type Field = fn(&WorkerClient) -> u64;
    let series: [(&str, &str, &str, Field); 5] = [
        (
            "minisgl_prefix_index_cached_tokens",
            "gauge",
            "Tokens the router's index says the worker's prefix cache holds.",
            |w| {
                let page = w.ready_info().map_or(0, |r| r.page_size);
                (w.cached_blocks() as u64) * u64::from(page)
            },
        ),
        (
            "minisgl_prefix_index_requests_total",
            "counter",
            "Requests whose predicted cached tokens were compared with the worker's report.",
            |w| w.accuracy().requests.load(Ordering::Relaxed),
        ),
        (
            "minisgl_prefix_index_predicted_tokens_total",
            "counter",
            "Cached prompt tokens the index predicted when the requests were sent.",
            |w| w.accuracy().predicted_tokens.load(Ordering::Relaxed),
        ),
        (
            "minisgl_prefix_index_reported_tokens_total",
            "counter",
            "Cached prompt tokens the worker reported for the same requests.",
            |w| w.accuracy().reported_tokens.load(Ordering::Relaxed),
        ),
        (
            "minisgl_prefix_index_mismatches_total",
            "counter",
            "Requests whose predicted and reported cached tokens differ.",
            |w| w.accuracy().mismatches.load(Ordering::Relaxed),
        ),
    ];
    for (name, kind, help, field) in series {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for w in workers {
            let _ = writeln!(out, "{name}{{worker=\"{}\"}} {}", w.address(), field(w));
        }
    }
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
    );
}

fn gauge(out: &mut String, name: &str, help: &str, value: usize) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
    );
}

/// Per worker gauges from its last `load` message (absent until it sent one).
fn render_workers(out: &mut String, workers: &[WorkerClient]) {
    type Field = fn(&crate::worker::protocol::Load) -> f64;
    let series: [(&str, &str, &str, Field); 8] = [
        (
            "minisgl_num_requests_waiting",
            "gauge",
            "Requests queued in the worker.",
            |l| l.waiting.into(),
        ),
        (
            "minisgl_num_requests_running",
            "gauge",
            "Requests the worker is running.",
            |l| l.running.into(),
        ),
        (
            "minisgl_kv_cache_used_tokens",
            "gauge",
            "KV cache tokens held by live requests.",
            |l| l.kv_used.into(),
        ),
        (
            "minisgl_kv_cache_cached_tokens",
            "gauge",
            "KV cache tokens of evictable cached prefixes.",
            |l| l.kv_cached.into(),
        ),
        (
            "minisgl_kv_cache_total_tokens",
            "gauge",
            "KV cache capacity in tokens.",
            |l| l.kv_total.into(),
        ),
        (
            "minisgl_worker_prompt_tokens_total",
            "counter",
            "Prompt tokens the worker started.",
            |l| l.prompt_tokens as f64,
        ),
        (
            "minisgl_worker_cached_prompt_tokens_total",
            "counter",
            "Prompt tokens served from the prefix cache.",
            |l| l.cached_prompt_tokens as f64,
        ),
        (
            "minisgl_prefix_cache_hit_rate",
            "gauge",
            "Cached prompt tokens / prompt tokens since the worker started.",
            |l| {
                if l.prompt_tokens == 0 {
                    0.0
                } else {
                    l.cached_prompt_tokens as f64 / l.prompt_tokens as f64
                }
            },
        ),
    ];
    let loads: Vec<_> = workers.iter().map(|w| (w.address(), w.load())).collect();
    for (name, kind, help, field) in series {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (address, load) in &loads {
            if let Some(load) = load {
                let _ = writeln!(out, "{name}{{worker=\"{address}\"}} {}", field(load));
            }
        }
    }
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
