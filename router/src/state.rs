//! What every handler shares: the model's tokenizer and template, the workers, the policy.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::select_all;

use crate::api::admission::Admission;
use crate::api::limits::Limits;
use crate::api::sampling_defaults::SamplingDefaults;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::routing::policy::Policy;
use crate::text::chat_template::ChatTemplate;
use crate::text::reasoning::ReasoningFormat;
use crate::text::tokenizer::Tokenizer;
use crate::text::tool_calls::ToolFormat;
use crate::worker::WorkerClient;

#[derive(Clone)]
pub struct AppState {
    inner: Arc<Shared>,
}

pub struct Shared {
    /// The names clients may pass as `model` (see `api::models`); never empty.
    pub model_names: Vec<String>,
    pub tokenizer: Tokenizer,
    pub template: Option<ChatTemplate>,
    pub workers: Vec<WorkerClient>,
    pub policy: Box<dyn Policy>,
    /// Held from a pick to the submission of its request (`route`).
    pub routing: Mutex<()>,
    /// The smallest `max_context` the workers reported; 0 until they all are ready.
    pub max_context: AtomicU32,
    /// Unix time the router started (the `created` of /v1/models).
    pub started: u64,
    pub metrics: Metrics,
    /// The in-flight count and its `--max-requests` limit.
    pub admission: Admission,
    /// Serve the chat page at `/` (off with `--no-web-ui`).
    pub web_ui: bool,
    /// `--log-requests`: one log line per request (`api::access`).
    pub log_requests: bool,
    /// `--api-key`: the bearer token every route but `/health` and the page wants.
    pub api_key: Option<String>,
    /// What one request may ask for (`--max-tokens-limit`, `--max-n`, ...).
    pub limits: Limits,
    /// What omitted sampling fields become (the model's generation_config.json, OpenAI's).
    pub sampling_defaults: SamplingDefaults,
    /// How the model writes tool calls (`--tool-call-parser`, or from its template).
    pub tool_format: ToolFormat,
    /// `--reasoning-parser`.
    pub reasoning: Option<ReasoningFormat>,
}

impl AppState {
    pub fn new(shared: Shared) -> Self {
        Self {
            inner: Arc::new(shared),
        }
    }

    /// The context every worker serves, or 503 while they are still loading.
    pub fn max_context(&self) -> Result<u32, ApiError> {
        match self.max_context.load(Ordering::Acquire) {
            0 => Err(ApiError::Unavailable(
                "the workers are still loading".into(),
            )),
            context => Ok(context),
        }
    }

    pub fn set_max_context(&self, context: u32) {
        self.max_context.store(context, Ordering::Release);
    }

    pub fn check_model(&self, model: &str) -> Result<(), ApiError> {
        if self.model_names.iter().any(|n| n == model) {
            return Ok(());
        }
        let names: Vec<String> = self.model_names.iter().map(|n| format!("`{n}`")).collect();
        Err(ApiError::ModelNotFound(format!(
            "The model `{model}` does not exist; this server serves {}",
            names.join(", ")
        )))
    }

    /// The first of the served names (what the page and the shell show).
    pub fn model_name(&self) -> &str {
        &self.model_names[0]
    }

    pub fn pick_worker(&self, input_ids: &[u32]) -> Result<&WorkerClient, ApiError> {
        let pick = self
            .policy
            .pick(&self.workers, input_ids)
            .ok_or_else(|| ApiError::Unavailable("no worker is ready".into()))?;
        self.metrics.routing.record(pick);
        Ok(&self.workers[pick.index])
    }

    /// Picks a worker for `input_ids` and runs `submit` on it under one lock, so that the
    /// prompt is among the worker's routed prompts (and its in-flight count) before the next
    /// request is routed: a burst of requests sharing a new prefix, arriving on several
    /// threads at once, sees its first request's choice.
    pub fn route<T>(
        &self,
        input_ids: &[u32],
        submit: impl FnOnce(&WorkerClient) -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        let _routing = self.routing.lock().unwrap();
        submit(self.pick_worker(input_ids)?)
    }

    /// A worker for `input_ids`, waiting up to `wait` for one to be ready when none is (a
    /// restarting or reconnecting worker); 503 when none is by then, or all are dead.
    pub async fn wait_for_worker(
        &self,
        input_ids: &[u32],
        wait: Duration,
    ) -> Result<&WorkerClient, ApiError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Ok(worker) = self.pick_worker(input_ids) {
                return Ok(worker);
            }
            let alive: Vec<_> = self.workers.iter().filter(|w| !w.is_dead()).collect();
            if alive.is_empty() {
                return self.pick_worker(input_ids);
            }
            let any_settles = select_all(alive.into_iter().map(|w| Box::pin(w.settled())));
            if tokio::time::timeout_at(deadline, any_settles)
                .await
                .is_err()
            {
                return self.pick_worker(input_ids);
            }
        }
    }

    pub fn all_ready(&self) -> bool {
        !self.workers.is_empty() && self.workers.iter().all(WorkerClient::is_ready)
    }

    /// Every worker ready and the server not shutting down: what /health reports as ok.
    pub fn serving(&self) -> bool {
        self.all_ready() && !self.admission.is_closed()
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.inner
    }
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
