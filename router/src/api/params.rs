//! Validation of the sampling and stopping parameters at the edge, and their mapping onto the
//! protocol's `sampling` map. Every message names the field and the limit.

use crate::api::constraint;
use crate::api::limits::Limits;
use crate::api::openai::{CommonParams, Stop};
use crate::api::sampling_defaults::SamplingDefaults;
use crate::error::ApiError;
use crate::worker::protocol::{Constraint, Sampling};

const MAX_STOPS: usize = 4;
const MAX_TOP_LOGPROBS: i64 = 20;

/// A validated request, before its prompt length is known.
#[derive(Debug, Clone, PartialEq)]
pub struct GenParams {
    /// `max_new_tokens` is filled in by `fit_to_context`.
    pub sampling: Sampling,
    pub max_tokens: Option<u32>,
    /// What `max_tokens` is when the request gives none: the endpoint's default and
    /// `--max-tokens-limit`, the smaller; None: the rest of the context.
    pub default_max_tokens: Option<u32>,
    /// The field that set `max_tokens` (for messages): `max_tokens` or `max_completion_tokens`.
    pub max_tokens_field: &'static str,
    /// The field `sampling.constraint` came from, which a worker's refusal of it names.
    pub constraint_field: Option<&'static str>,
    pub stops: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// Choices per prompt.
    pub n: u32,
}

/// The endpoint-specific knobs, already read from their own fields.
#[derive(Debug, Default)]
pub struct EndpointParams {
    pub max_completion_tokens: Option<i64>,
    /// `max_tokens` when the request gives none (None: the rest of the context).
    pub default_max_tokens: Option<u32>,
    pub logprobs: bool,
    pub top_logprobs: i64,
}

/// `common` and `endpoint` checked against `limits`; omitted sampling fields take `defaults`.
pub fn validate(
    common: &CommonParams,
    endpoint: &EndpointParams,
    limits: &Limits,
    defaults: &SamplingDefaults,
) -> Result<GenParams, ApiError> {
    let n = common.n.unwrap_or(1);
    let max_n = limits.max_n;
    if !(1..=i64::from(max_n)).contains(&n) {
        return Err(ApiError::invalid(
            "n",
            format!("`n` must be in [1, {max_n}] (--max-n); got {n}"),
        ));
    }
    let (max_tokens, max_tokens_field) = match endpoint.max_completion_tokens {
        Some(v) => (
            Some(at_least("max_completion_tokens", v, 1)?),
            "max_completion_tokens",
        ),
        None => (
            common
                .max_tokens
                .map(|v| at_least("max_tokens", v, 1))
                .transpose()?,
            "max_tokens",
        ),
    };
    if let (Some(m), Some(limit)) = (max_tokens, limits.max_tokens_limit) {
        if m > limit {
            return Err(ApiError::invalid(
                max_tokens_field,
                format!(
                    "`{max_tokens_field}` must be at most {limit} (--max-tokens-limit); got {m}"
                ),
            ));
        }
    }
    let default_max_tokens = match (endpoint.default_max_tokens, limits.max_tokens_limit) {
        (Some(d), Some(limit)) => Some(d.min(limit)),
        (d, limit) => d.or(limit),
    };
    let stream = common.stream.unwrap_or(false);
    let include_usage = common
        .stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    if common.stream_options.is_some() && !stream {
        return Err(ApiError::invalid(
            "stream_options",
            "`stream_options` is only allowed with `stream` = true",
        ));
    }
    let sampling = sampling(common, endpoint, defaults)?;
    let (constraint_field, constraint) = constraint(common)?.unzip();
    Ok(GenParams {
        sampling: Sampling {
            constraint,
            ..sampling
        },
        max_tokens,
        default_max_tokens,
        max_tokens_field,
        constraint_field,
        stops: stops(common.stop.as_ref())?,
        stream,
        include_usage,
        n: n as u32,
    })
}

/// The sampling fields of `c` and `e`, each checked; `d` fills in those `c` leaves out.
pub(crate) fn sampling(
    c: &CommonParams,
    e: &EndpointParams,
    d: &SamplingDefaults,
) -> Result<Sampling, ApiError> {
    let top_k = c.top_k.unwrap_or(d.top_k);
    if top_k < -1 {
        return Err(ApiError::invalid(
            "top_k",
            format!("`top_k` must be -1, 0 (off) or positive; got {top_k}"),
        ));
    }
    Ok(Sampling {
        temperature: in_range("temperature", c.temperature, 0.0, 2.0, d.temperature)?,
        top_p: check(
            c.top_p,
            d.top_p,
            "top_p",
            |v| v > 0.0 && v <= 1.0,
            "in (0, 1]",
        )?,
        top_k: top_k.max(0),
        min_p: check(
            c.min_p,
            d.min_p,
            "min_p",
            |v| (0.0..1.0).contains(&v),
            "in [0, 1)",
        )?,
        seed: c.seed.map(|s| s as u64),
        max_new_tokens: 0,
        min_new_tokens: c
            .min_tokens
            .map(|v| at_least("min_tokens", v, 0))
            .transpose()?
            .unwrap_or(0),
        ignore_eos: c.ignore_eos.unwrap_or(false),
        stop_token_ids: c.stop_token_ids.clone().unwrap_or_default(),
        frequency_penalty: in_range("frequency_penalty", c.frequency_penalty, -2.0, 2.0, 0.0)?,
        presence_penalty: in_range("presence_penalty", c.presence_penalty, -2.0, 2.0, 0.0)?,
        repetition_penalty: check(
            c.repetition_penalty,
            d.repetition_penalty,
            "repetition_penalty",
            |v| v > 0.0,
            "> 0",
        )?,
        logprobs: e.logprobs,
        top_logprobs: top_logprobs(e)?,
        logit_bias: logit_bias(c)?,
        constraint: None, // with the field it came from, by `constraint`
    })
}

/// The output constraint; `min_tokens` cannot be combined with one (the grammar alone
/// decides where a constrained output may end).
fn constraint(c: &CommonParams) -> Result<Option<(&'static str, Constraint)>, ApiError> {
    let found = constraint::from_common(c)?;
    if found.is_some() && c.min_tokens.unwrap_or(0) > 0 {
        return Err(ApiError::invalid(
            "min_tokens",
            "`min_tokens` cannot be combined with a structured output constraint",
        ));
    }
    Ok(found)
}

/// OpenAI's `{"token id": bias}` map as (token, bias) pairs; the vocabulary bound is checked
/// once the tokenizer is at hand (`generate::start`).
fn logit_bias(c: &CommonParams) -> Result<Vec<(u32, f64)>, ApiError> {
    let Some(map) = &c.logit_bias else {
        return Ok(Vec::new());
    };
    map.iter()
        .map(|(token, &bias)| {
            let id = token.parse::<u32>().map_err(|_| {
                ApiError::invalid(
                    "logit_bias",
                    format!("`logit_bias` keys must be token ids; got {token:?}"),
                )
            })?;
            if !(bias.is_finite() && (-100.0..=100.0).contains(&bias)) {
                return Err(ApiError::invalid(
                    "logit_bias",
                    format!(
                        "`logit_bias` values must be in [-100, 100]; got {bias} for token {id}"
                    ),
                ));
            }
            Ok((id, bias))
        })
        .collect()
}

fn top_logprobs(e: &EndpointParams) -> Result<u32, ApiError> {
    let n = e.top_logprobs;
    if !(0..=MAX_TOP_LOGPROBS).contains(&n) {
        return Err(ApiError::invalid(
            "top_logprobs",
            format!("`top_logprobs` must be in [0, {MAX_TOP_LOGPROBS}]; got {n}"),
        ));
    }
    Ok(n as u32)
}

fn check(
    value: Option<f64>,
    default: f64,
    field: &str,
    ok: impl Fn(f64) -> bool,
    limit: &str,
) -> Result<f64, ApiError> {
    match value {
        None => Ok(default),
        Some(v) if v.is_finite() && ok(v) => Ok(v),
        Some(v) => Err(ApiError::invalid(
            field,
            format!("`{field}` must be {limit}; got {v}"),
        )),
    }
}

fn in_range(
    field: &str,
    value: Option<f64>,
    lo: f64,
    hi: f64,
    default: f64,
) -> Result<f64, ApiError> {
    check(
        value,
        default,
        field,
        |v| (lo..=hi).contains(&v),
        &format!("in [{lo}, {hi}]"),
    )
}

fn at_least(field: &str, value: i64, min: i64) -> Result<u32, ApiError> {
    if value < min || value > i64::from(u32::MAX) {
        return Err(ApiError::invalid(
            field,
            format!("`{field}` must be at least {min}; got {value}"),
        ));
    }
    Ok(value as u32)
}

fn stops(stop: Option<&Stop>) -> Result<Vec<String>, ApiError> {
    let stops = match stop {
        None => vec![],
        Some(Stop::One(s)) => vec![s.clone()],
        Some(Stop::Many(v)) => v.clone(),
    };
    if stops.len() > MAX_STOPS {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "`stop` may hold at most {MAX_STOPS} strings; got {}",
                stops.len()
            ),
        ));
    }
    if stops.iter().any(String::is_empty) {
        return Err(ApiError::invalid(
            "stop",
            "`stop` strings must not be empty",
        ));
    }
    Ok(stops)
}

impl GenParams {
    /// Sets `max_new_tokens` from the prompt length and the model's context, or says why not.
    pub fn fit_to_context(&mut self, prompt_tokens: usize, context: u32) -> Result<(), ApiError> {
        let context = context as usize;
        if prompt_tokens == 0 {
            return Err(ApiError::bad_request("the prompt is empty"));
        }
        if prompt_tokens >= context {
            return Err(ApiError::bad_request(format!(
                "prompt has {prompt_tokens} tokens; the model's context is {context}"
            )));
        }
        let room = context - prompt_tokens;
        let max_new = match self.max_tokens {
            Some(m) if m as usize > room => {
                let field = self.max_tokens_field;
                return Err(ApiError::invalid(field, format!(
                    "`{field}` ({m}) plus the prompt's {prompt_tokens} tokens exceeds the model's context of {context}"
                )));
            }
            Some(m) => m,
            None => self
                .default_max_tokens
                .map_or(room, |d| room.min(d as usize)) as u32,
        };
        let min = self.sampling.min_new_tokens;
        if min > max_new {
            let most = match self.max_tokens {
                Some(m) => format!("`{}` ({m})", self.max_tokens_field),
                None => format!(
                    "{max_new}, the most this request may generate (the default `max_tokens` \
                     or the rest of the context)"
                ),
            };
            return Err(ApiError::invalid(
                "min_tokens",
                format!("`min_tokens` ({min}) must be at most {most}"),
            ));
        }
        self.sampling.max_new_tokens = max_new;
        Ok(())
    }
}

#[cfg(test)]
#[path = "params_tests.rs"]
mod tests;
