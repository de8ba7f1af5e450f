//! Validation messages and the mapping onto the protocol's `sampling`.

use super::*;
use crate::api::limits::Limits;
use crate::api::openai::{parse_body, ChatRequest};

fn params(extra: &str) -> Result<GenParams, ApiError> {
    params_with(extra, &SamplingDefaults::default())
}

fn params_with(extra: &str, defaults: &SamplingDefaults) -> Result<GenParams, ApiError> {
    let body = format!(r#"{{"model":"m","messages":[]{extra}}}"#);
    let (req, common) = parse_body::<ChatRequest>(body.as_bytes()).unwrap();
    let endpoint = EndpointParams {
        max_completion_tokens: req.max_completion_tokens,
        default_max_tokens: None,
        logprobs: req.logprobs.unwrap_or(false),
        top_logprobs: req.top_logprobs.unwrap_or(0),
    };
    validate(&common, &endpoint, &Limits::default(), defaults)
}

fn message(extra: &str) -> String {
    params(extra).unwrap_err().message().to_string()
}

#[test]
fn omitted_fields_take_openais_defaults_or_the_models() {
    let p = params("").unwrap();
    assert_eq!(
        p.sampling,
        Sampling {
            temperature: 1.0,
            max_new_tokens: 0,
            ..Sampling::default()
        }
    );
    assert!(!p.stream && p.stops.is_empty());
    let model = SamplingDefaults {
        temperature: 0.6,
        top_p: 0.9,
        top_k: 20,
        min_p: 0.05,
        repetition_penalty: 1.1,
    };
    // What the model's file would set, taken where the request is silent, and only there.
    let defaulted = |extra: &str| {
        let s = params_with(extra, &model).unwrap().sampling;
        (
            s.temperature,
            s.top_p,
            s.top_k,
            s.min_p,
            s.repetition_penalty,
        )
    };
    assert_eq!(defaulted(""), (0.6, 0.9, 20, 0.05, 1.1));
    let sent = r#","temperature":0,"top_p":1,"top_k":-1,"min_p":0,"repetition_penalty":1"#;
    assert_eq!(defaulted(sent), (0.0, 1.0, 0, 0.0, 1.0));
}

#[test]
fn limits_are_named_in_messages() {
    assert_eq!(
        message(r#","top_p":1.5"#),
        "`top_p` must be in (0, 1]; got 1.5"
    );
    assert_eq!(
        message(r#","temperature":2.5"#),
        "`temperature` must be in [0, 2]; got 2.5"
    );
    assert_eq!(message(r#","min_p":1"#), "`min_p` must be in [0, 1); got 1");
    assert_eq!(
        message(r#","repetition_penalty":0"#),
        "`repetition_penalty` must be > 0; got 0"
    );
    assert_eq!(
        message(r#","presence_penalty":-3"#),
        "`presence_penalty` must be in [-2, 2]; got -3"
    );
    assert_eq!(
        message(r#","n":0"#),
        "`n` must be in [1, 64] (--max-n); got 0"
    );
    assert_eq!(
        message(r#","logit_bias":{"x":1}"#),
        "`logit_bias` keys must be token ids; got \"x\""
    );
    assert_eq!(
        message(r#","logit_bias":{"5":101}"#),
        "`logit_bias` values must be in [-100, 100]; got 101 for token 5"
    );
    assert_eq!(
        message(r#","max_tokens":0"#),
        "`max_tokens` must be at least 1; got 0"
    );
    assert_eq!(
        message(r#","top_logprobs":21"#),
        "`top_logprobs` must be in [0, 20]; got 21"
    );
    assert_eq!(
        message(r#","stop":["a","b","c","d","e"]"#),
        "`stop` may hold at most 4 strings; got 5"
    );
    assert_eq!(
        message(r#","stream_options":{"include_usage":true}"#),
        "`stream_options` is only allowed with `stream` = true"
    );
}

#[test]
fn values_map_onto_sampling() {
    let p = params(r#","temperature":0.7,"top_k":-1,"seed":5,"stop":"\n","stream":true,
        "stream_options":{"include_usage":true},"min_tokens":3,"ignore_eos":true,"logprobs":true,"top_logprobs":2"#)
        .unwrap();
    assert_eq!(p.sampling.temperature, 0.7);
    assert_eq!(p.sampling.top_k, 0);
    assert_eq!(p.sampling.seed, Some(5));
    assert_eq!(p.sampling.min_new_tokens, 3);
    assert!(p.sampling.ignore_eos && p.sampling.logprobs);
    assert_eq!(p.sampling.top_logprobs, 2);
    assert_eq!(p.stops, ["\n"]);
    assert!(p.stream && p.include_usage);
    let p = params(r#","logit_bias":{"7":-100,"3":2.5}"#).unwrap();
    assert_eq!(p.sampling.logit_bias, [(3, 2.5), (7, -100.0)]);
}

#[test]
fn context_limits() {
    let mut p = params("").unwrap();
    p.fit_to_context(10, 100).unwrap();
    assert_eq!(p.sampling.max_new_tokens, 90);
    assert_eq!(
        p.fit_to_context(100, 100).unwrap_err().message(),
        "prompt has 100 tokens; the model's context is 100"
    );
    let mut p = params(r#","max_completion_tokens":95"#).unwrap();
    assert_eq!(
        p.fit_to_context(10, 100).unwrap_err().message(),
        "`max_completion_tokens` (95) plus the prompt's 10 tokens exceeds the model's context of 100"
    );
}

#[test]
fn min_tokens_must_fit_in_what_the_request_may_generate() {
    let mut p = params(r#","max_tokens":3,"min_tokens":3"#).unwrap();
    p.fit_to_context(10, 100).unwrap();
    let mut p = params(r#","max_tokens":3,"min_tokens":10"#).unwrap();
    let err = p.fit_to_context(10, 100).unwrap_err();
    assert_eq!(err.body()["error"]["param"], "min_tokens");
    assert_eq!(
        err.message(),
        "`min_tokens` (10) must be at most `max_tokens` (3)"
    );
    let mut p = params(r#","min_tokens":95"#).unwrap();
    assert_eq!(
        p.fit_to_context(10, 100).unwrap_err().message(),
        "`min_tokens` (95) must be at most 90, the most this request may generate (the default \
         `max_tokens` or the rest of the context)"
    );
}

fn limited(
    extra: &str,
    default_max_tokens: Option<u32>,
    limit: Option<u32>,
) -> Result<GenParams, ApiError> {
    let body = format!(r#"{{"model":"m","messages":[]{extra}}}"#);
    let (_, common) = parse_body::<ChatRequest>(body.as_bytes()).unwrap();
    let endpoint = EndpointParams {
        default_max_tokens,
        ..EndpointParams::default()
    };
    let limits = Limits {
        max_tokens_limit: limit,
        max_n: 4,
        ..Limits::default()
    };
    validate(&common, &endpoint, &limits, &SamplingDefaults::default())
}

#[test]
fn max_tokens_defaults_and_the_servers_limit() {
    // The endpoint's default (completions: 16), shortened by the room left in the context.
    let mut p = limited("", Some(16), None).unwrap();
    p.fit_to_context(10, 100).unwrap();
    assert_eq!(p.sampling.max_new_tokens, 16);
    p.fit_to_context(90, 100).unwrap();
    assert_eq!(p.sampling.max_new_tokens, 10);
    // --max-tokens-limit caps the default (chat: the rest of the context) ...
    let mut p = limited("", None, Some(8)).unwrap();
    p.fit_to_context(10, 100).unwrap();
    assert_eq!(p.sampling.max_new_tokens, 8);
    let mut p = limited("", Some(16), Some(8)).unwrap();
    p.fit_to_context(10, 100).unwrap();
    assert_eq!(p.sampling.max_new_tokens, 8);
    // ... and refuses more, naming the field and the flag.
    assert!(limited(r#","max_tokens":8"#, None, Some(8)).is_ok());
    let err = limited(r#","max_tokens":9"#, None, Some(8)).unwrap_err();
    assert_eq!(err.body()["error"]["param"], "max_tokens");
    assert_eq!(
        err.message(),
        "`max_tokens` must be at most 8 (--max-tokens-limit); got 9"
    );
    assert_eq!(
        limited(r#","n":5"#, None, None).unwrap_err().message(),
        "`n` must be in [1, 4] (--max-n); got 5"
    );
}
