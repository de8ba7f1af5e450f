//! One generation from the HTTP side: prepare it (prepare.rs: tokenize, check, fit to the
//! context), pick a worker, submit; then turn the worker's token outputs into text pieces
//! (incremental detokenization, stop strings) and a finish reason. Dropping a `Generation`
//! early aborts it on the worker.
//!
//! A generation whose worker goes away before its first token is sent once more, to a
//! ready worker (waiting up to `RETRY_WAIT` for one: the restarted worker, when it was
//! the only one), so that a crash costs the client latency, not an error. Once a token
//! came, the client may have seen it: the error is passed on (an SSE error event).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::api::admission::Slots;
use crate::api::openai::Usage;
use crate::api::params::GenParams;
use crate::api::prepare::{prepare, Prepared};
use crate::error::ApiError;
use crate::state::AppState;
use crate::text::detokenize::IncrementalDecoder;
use crate::text::stop::StopMatcher;
use crate::worker::protocol::{Finish, Sampling, TokenOutput};
use crate::worker::{Event, RequestStream};

pub enum PromptInput {
    Text {
        text: String,
        add_special_tokens: bool,
    },
    Ids(Vec<u32>),
}

impl PromptInput {
    /// The prompt's text ("" for token ids).
    pub fn text(&self) -> &str {
        match self {
            Self::Text { text, .. } => text,
            Self::Ids(_) => "",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f64,
    /// The most likely alternatives, most likely first.
    pub top: Vec<(u32, f64)>,
}

/// What a response reports for a token the sampler could not pick (a grammar's mask
/// leaves it -inf, which JSON cannot carry and serde would write as `null`): vLLM's floor.
const MIN_LOGPROB: f64 = -9999.0;

fn json_logprob(logprob: f64) -> f64 {
    logprob.max(MIN_LOGPROB)
}

/// Text that can be shown now, with the logprobs of the tokens that produced it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Piece {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
}

#[derive(Debug, PartialEq)]
pub enum Update {
    Piece(Piece),
    Finished(Finish),
}

/// How long a retry waits for a worker to be ready when none is.
const RETRY_WAIT: Duration = Duration::from_secs(30);

pub struct Generation {
    request: Option<RequestStream>,
    /// What it was sent with, to send it again (once) if its worker fails first.
    sampling: Sampling,
    /// The request field its constraint came from, named when the worker refuses it.
    constraint_field: Option<&'static str>,
    retried: bool,
    state: AppState,
    decoder: IncrementalDecoder,
    stop: StopMatcher,
    queue: VecDeque<Update>,
    prompt_ids: Arc<Vec<u32>>,
    output_ids: Vec<u32>,
    cached_tokens: u32,
    started: Instant,
    /// `--request-timeout` after `started`: past it the request is aborted (504).
    deadline: Option<tokio::time::Instant>,
    /// When the first and the latest token came.
    first_token: Option<Instant>,
    last_token: Option<Instant>,
}

pub async fn start(
    state: &AppState,
    prompt: PromptInput,
    params: GenParams,
) -> Result<Generation, ApiError> {
    let mut slots = state.admission.admit(1).await?;
    let mut copies = start_n(state, prompt, params, 1, &mut slots).await?;
    Ok(copies.remove(0))
}

/// `n` generations of one prompt, all on the same worker so that they share the prompt's
/// KV through its prefix cache; with a seed, copy i uses seed + i so the copies differ.
/// Each copy takes one of `slots` (reserved by the caller with `state.admission.admit`).
pub async fn start_n(
    state: &AppState,
    prompt: PromptInput,
    params: GenParams,
    n: u32,
    slots: &mut Slots,
) -> Result<Vec<Generation>, ApiError> {
    let prepared = prepare(state, prompt, params).await?;
    start_prepared(state, prepared, n, slots)
}

/// The `n` generations of a prepared prompt (`start_n`).
pub fn start_prepared(
    state: &AppState,
    prepared: Prepared,
    n: u32,
    slots: &mut Slots,
) -> Result<Vec<Generation>, ApiError> {
    let Prepared {
        prompt_ids,
        params,
        started,
    } = prepared;
    let seeded = |i: u32| {
        let mut sampling = params.sampling.clone();
        sampling.seed = sampling.seed.map(|s| s.wrapping_add(u64::from(i)));
        sampling
    };
    let requests = state.route(&prompt_ids, |worker| {
        (0..n)
            .map(|i| {
                let slot = slots.take().ok_or_else(|| {
                    ApiError::Internal("a generation started without an admission slot".into())
                })?;
                let mut request = worker.submit(prompt_ids.to_vec(), seeded(i))?;
                request.hold(slot);
                Ok(request)
            })
            .collect::<Result<Vec<_>, ApiError>>()
    })?;
    let mut copies = Vec::with_capacity(n as usize);
    for (i, request) in (0..n).zip(requests) {
        let sampling = seeded(i);
        state
            .metrics
            .prompt_tokens
            .fetch_add(prompt_ids.len() as u64, Ordering::Relaxed);
        copies.push(Generation {
            request: Some(request),
            sampling,
            constraint_field: params.constraint_field,
            retried: false,
            state: state.clone(),
            decoder: IncrementalDecoder::new(),
            stop: StopMatcher::new(params.stops.clone()),
            queue: VecDeque::new(),
            prompt_ids: prompt_ids.clone(),
            output_ids: Vec::new(),
            cached_tokens: 0,
            started,
            deadline: state
                .limits
                .request_timeout()
                .map(|t| tokio::time::Instant::from_std(started) + t),
            first_token: None,
            last_token: None,
        });
    }
    Ok(copies)
}

impl Generation {
    /// The next piece of text or the finish; None once finished; an error ends it.
    pub async fn next(&mut self) -> Option<Result<Update, ApiError>> {
        loop {
            if let Some(update) = self.queue.pop_front() {
                return Some(Ok(update));
            }
            let request = self.request.as_mut()?;
            let event = match self.deadline {
                None => request.next().await,
                Some(deadline) => match tokio::time::timeout_at(deadline, request.next()).await {
                    Ok(event) => event,
                    Err(_) => return Some(Err(self.time_out())),
                },
            };
            match event {
                Some(Event::Token(out)) => self.on_token(out),
                Some(Event::Refused(refusal)) => {
                    self.request = None;
                    return Some(Err(refusal.into_error(self.constraint_field)));
                }
                Some(Event::Failed(e)) => {
                    let failed = self.request.take()?;
                    if !self.retryable(&e) {
                        return Some(Err(e));
                    }
                    if let Err(e) = self.retry(failed, &e).await {
                        return Some(Err(e));
                    }
                }
                None => {
                    self.request = None;
                    return Some(Err(ApiError::Internal(
                        "the worker dropped the request".into(),
                    )));
                }
            }
        }
    }

    /// How long a retry waits for a ready worker: `RETRY_WAIT`, within the deadline.
    fn retry_wait(&self) -> Duration {
        let left = self
            .deadline
            .map(|d| d.saturating_duration_since(tokio::time::Instant::now()));
        left.map_or(RETRY_WAIT, |left| left.min(RETRY_WAIT))
    }

    /// Aborts the request in the worker (its KV is freed at once): the 504 to send.
    fn time_out(&mut self) -> ApiError {
        if let Some(request) = self.request.take() {
            request.abort();
        }
        self.state.metrics.timeouts.fetch_add(1, Ordering::Relaxed);
        let secs = self.state.limits.request_timeout.unwrap_or_default();
        ApiError::Timeout(format!(
            "the request ran past the server's limit of {secs} s (--request-timeout) and was \
             stopped after {} tokens",
            self.output_ids.len()
        ))
    }

    /// Its worker went away (503) and nothing of it was produced yet (and the server is not
    /// shutting down: then the 503 is the shutdown's).
    fn retryable(&self, error: &ApiError) -> bool {
        matches!(error, ApiError::Unavailable(_))
            && self.output_ids.is_empty()
            && !self.retried
            && !self.state.admission.is_closed()
    }

    /// Sends the generation again, to a ready worker, with the failed one's slot.
    async fn retry(&mut self, mut failed: RequestStream, error: &ApiError) -> Result<(), ApiError> {
        self.retried = true;
        let slot = failed.take_slot();
        let from = failed.worker().address().to_string();
        drop(failed);
        let worker = self
            .state
            .wait_for_worker(&self.prompt_ids, self.retry_wait())
            .await?;
        tracing::warn!(from = %from, to = %worker.address(), "retrying a request: {error}");
        let mut request = worker.submit(self.prompt_ids.to_vec(), self.sampling.clone())?;
        if let Some(slot) = slot {
            request.hold(slot);
        }
        self.state.metrics.retries.fetch_add(1, Ordering::Relaxed);
        self.request = Some(request);
        Ok(())
    }

    pub fn usage(&self) -> Usage {
        Usage::new(
            self.prompt_ids.len() as u32,
            self.output_ids.len() as u32,
            self.cached_tokens,
        )
    }

    pub fn prompt_ids(&self) -> &[u32] {
        &self.prompt_ids
    }

    /// Every token the worker produced so far (a final EOS or stop token id included).
    pub fn output_ids(&self) -> &[u32] {
        &self.output_ids
    }

    /// A `stop` finish token is EOS or a stop token id, never shown as text; but a
    /// constrained request also stops on the token that completes its grammar, which is text.
    fn is_end_token(&self, out: &TokenOutput) -> bool {
        out.finish == Some(Finish::Stop)
            && (self.sampling.constraint.is_none()
                || self.sampling.stop_token_ids.contains(&out.token)
                || self.state.tokenizer.is_special(out.token))
    }

    fn on_token(&mut self, out: TokenOutput) {
        self.record_timing();
        self.output_ids.push(out.token);
        self.cached_tokens = out.cached_tokens;
        let mut piece = Piece::default();
        if !self.is_end_token(&out) {
            piece.text = self.decoder.step(&self.state.tokenizer, out.token);
            if let Some(logprob) = out.logprob {
                let top = out.top_logprobs.unwrap_or_default();
                piece.logprobs.push(TokenLogprob {
                    token: out.token,
                    logprob: json_logprob(logprob),
                    top: top
                        .into_iter()
                        .map(|(t, lp)| (t, json_logprob(lp)))
                        .collect(),
                });
            }
        }
        if out.finish.is_some() {
            piece
                .text
                .push_str(&self.decoder.finish(&self.state.tokenizer));
        }
        let outcome = self.stop.push(&piece.text);
        piece.text = outcome.text;
        let finish = if outcome.stopped {
            if let Some(request) = self.request.take() {
                request.abort();
            }
            Some(Finish::Stop)
        } else if let Some(finish) = out.finish {
            piece.text.push_str(&self.stop.flush());
            self.request = None;
            Some(finish)
        } else {
            None
        };
        if !piece.text.is_empty() || !piece.logprobs.is_empty() {
            self.queue.push_back(Update::Piece(piece));
        }
        if let Some(finish) = finish {
            if let (Some(first), Some(last)) = (self.first_token, self.last_token) {
                let tokens = self.output_ids.len() as u32;
                self.state.metrics.observe_generation(
                    first - self.started,
                    last - self.started,
                    tokens,
                );
            }
            self.queue.push_back(Update::Finished(finish));
        }
    }

    fn record_timing(&mut self) {
        let now = Instant::now();
        let metrics = &self.state.metrics;
        metrics.generation_tokens.fetch_add(1, Ordering::Relaxed);
        match self.last_token {
            Some(last) => metrics.inter_token.observe(now - last),
            None => self.first_token = Some(now),
        }
        self.last_token = Some(now);
    }
}

/// Runs a generation to its end: (text, logprobs, finish).
pub async fn collect(generation: &mut Generation) -> Result<(Piece, Finish), ApiError> {
    let mut all = Piece::default();
    while let Some(update) = generation.next().await {
        match update? {
            Update::Piece(piece) => {
                all.text.push_str(&piece.text);
                all.logprobs.extend(piece.logprobs);
            }
            Update::Finished(finish) => return Ok((all, finish)),
        }
    }
    Err(ApiError::Internal(
        "the generation ended without a finish reason".into(),
    ))
}

// The streaming behaviour (stop strings, aborts, EOS) is tested end to end over a fake
// worker in api/routes_tests/; the checks before a start in prepare.rs.
