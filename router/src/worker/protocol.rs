//! The router <-> worker protocol, version 6 (docs/protocol.md is the specification).
//!
//! A frame is `{"v": 6, "msgs": [...]}` in msgpack. Field order in every struct below is the
//! wire order, and `encode_frame` writes maps keyed by name, so the bytes match the Python
//! encoder (the golden vectors in tests/data/protocol/ check both sides).

use serde::{de::DeserializeOwned, Deserialize, Serialize};

pub const VERSION: u32 = 6;

/// What a constraint's `source` holds (docs/protocol.md, "constraint").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConstraintKind {
    /// A JSON Schema, as JSON text.
    JsonSchema,
    /// A regular expression (Rust regex syntax) the whole output matches.
    Regex,
    /// A Lark grammar (llguidance's dialect).
    Lark,
    /// A GBNF grammar (`root ::= ...`, as llama.cpp and XGrammar write them).
    Ebnf,
    /// A JSON array of strings: the output is exactly one of them.
    Choice,
}

/// What the output must match; the worker masks decoding so that it does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Constraint {
    pub kind: ConstraintKind,
    pub source: String,
}

/// What the router asks of a worker's sampler; every field is validated by the router.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    pub temperature: f64,
    pub top_p: f64,
    pub top_k: i64,
    pub min_p: f64,
    pub seed: Option<u64>,
    pub max_new_tokens: u32,
    pub min_new_tokens: u32,
    pub ignore_eos: bool,
    pub stop_token_ids: Vec<u32>,
    pub frequency_penalty: f64,
    pub presence_penalty: f64,
    pub repetition_penalty: f64,
    pub logprobs: bool,
    pub top_logprobs: u32,
    /// (token, bias) pairs added to the logits before temperature; bias in [-100, 100].
    pub logit_bias: Vec<(u32, f64)>,
    /// Grammar-constrained decoding; `None` leaves the output free.
    pub constraint: Option<Constraint>,
}

impl Default for Sampling {
    /// The same defaults as Python's `SamplingParams()`.
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: None,
            max_new_tokens: 16,
            min_new_tokens: 0,
            ignore_eos: false,
            stop_token_ids: Vec::new(),
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            repetition_penalty: 1.0,
            logprobs: false,
            top_logprobs: 0,
            logit_bias: Vec::new(),
            constraint: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RouterMsg {
    Generate {
        rid: u64,
        input_ids: Vec<u32>,
        sampling: Sampling,
    },
    Abort {
        rid: u64,
    },
    Shutdown,
    /// First on every connection; the worker answers `Ready`.
    Hello,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ready {
    pub model: String,
    pub vocab_size: u32,
    pub max_context: u32,
    pub kv_capacity: u32,
    pub eos_token_ids: Vec<u32>,
    pub page_size: u32,
    pub tp_size: u32,
    pub device: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Finish {
    Stop,
    Length,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenOutput {
    pub rid: u64,
    pub token: u32,
    pub logprob: Option<f64>,
    pub top_logprobs: Option<Vec<(u32, f64)>>,
    pub finish: Option<Finish>,
    pub cached_tokens: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Load {
    pub waiting: u32,
    pub running: u32,
    pub kv_used: u32,
    pub kv_cached: u32,
    pub kv_total: u32,
    /// Cumulative: prompt tokens of every request the worker started.
    pub prompt_tokens: u64,
    /// Cumulative: of those, the tokens that came from the prefix cache.
    pub cached_prompt_tokens: u64,
}

/// Why the worker refused or failed something: the router acts on this, never on `message`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The request cannot be served as given (no input ids, a token outside the vocabulary).
    InvalidRequest,
    /// The request's constraint does not compile (the grammar engine refused it).
    InvalidConstraint,
    /// The prompt does not fit this worker's context.
    ContextTooLong,
    /// A frame or message that does not follow the protocol (the router's bug).
    BadMessage,
    /// The worker failed while serving the request.
    Internal,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WorkerMsg {
    Ready(Ready),
    Step {
        outputs: Vec<TokenOutput>,
    },
    Error {
        rid: Option<u64>,
        code: ErrorCode,
        message: String,
    },
    Load(Load),
    /// The prefix cache's net change since the previous one: block hashes
    /// (routing/blocks.rs) stored and removed. Right after `ready`: every block it holds.
    CacheEvents {
        stored: Vec<u64>,
        removed: Vec<u64>,
    },
}

#[derive(Serialize, Deserialize)]
struct Frame<M> {
    v: u32,
    msgs: Vec<M>,
}

/// One frame: every message of one tick, in order.
pub fn encode_frame<M: Serialize>(msgs: &[M]) -> Vec<u8> {
    #[derive(Serialize)]
    struct FrameRef<'a, M> {
        v: u32,
        msgs: &'a [M],
    }
    let frame = FrameRef { v: VERSION, msgs };
    rmp_serde::to_vec_named(&frame).expect("protocol messages always serialize")
}

pub fn decode_frame<M: DeserializeOwned>(data: &[u8]) -> Result<Vec<M>, String> {
    #[derive(Deserialize)]
    struct Version {
        v: u32,
    }
    let version: Version =
        rmp_serde::from_slice(data).map_err(|e| format!("frame has no version: {e}"))?;
    if version.v != VERSION {
        return Err(format!(
            "frame version must be {VERSION}; got {}",
            version.v
        ));
    }
    let frame: Frame<M> = rmp_serde::from_slice(data).map_err(|e| format!("bad frame: {e}"))?;
    Ok(frame.msgs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::blocks::block_hashes;

    /// golden.py's BLOCK_TOKENS: the cache_events hashes are computed here, independently.
    const BLOCK_TOKENS: [u32; 8] = [1, 2, 300, 70000, 5, 6, 7, 8];

    fn golden(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/../tests/data/protocol/{name}.msgpack",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// The messages of tests/data/protocol/golden.py, "router_frame".
    fn router_msgs() -> Vec<RouterMsg> {
        let sampling = Sampling {
            temperature: 0.7,
            top_p: 0.9,
            top_k: 50,
            min_p: 0.05,
            seed: Some(1234),
            max_new_tokens: 32,
            min_new_tokens: 2,
            ignore_eos: false,
            stop_token_ids: vec![2, 49152],
            frequency_penalty: 0.5,
            presence_penalty: -0.5,
            repetition_penalty: 1.1,
            logprobs: true,
            top_logprobs: 3,
            logit_bias: vec![(42, 5.0), (7, -100.0)],
            constraint: Some(Constraint {
                kind: ConstraintKind::JsonSchema,
                source: r#"{"type": "object"}"#.into(),
            }),
        };
        vec![
            RouterMsg::Generate {
                rid: 7,
                input_ids: vec![1, 2, 300, 70000],
                sampling,
            },
            RouterMsg::Generate {
                rid: 1 << 40,
                input_ids: vec![5],
                sampling: Sampling::default(),
            },
            RouterMsg::Generate {
                rid: 8,
                input_ids: vec![5],
                sampling: Sampling {
                    constraint: Some(Constraint {
                        kind: ConstraintKind::Choice,
                        source: r#"["yes", "no"]"#.into(),
                    }),
                    ..Sampling::default()
                },
            },
            RouterMsg::Abort { rid: 7 },
            RouterMsg::Shutdown,
            RouterMsg::Hello,
        ]
    }

    /// The messages of tests/data/protocol/golden.py, "worker_frame".
    fn worker_msgs() -> Vec<WorkerMsg> {
        let out = |rid, token, finish, cached_tokens| TokenOutput {
            rid,
            token,
            logprob: None,
            top_logprobs: None,
            finish,
            cached_tokens,
        };
        vec![
            WorkerMsg::Ready(Ready {
                model: "SmolLM2-135M-Instruct".into(),
                vocab_size: 49152,
                max_context: 8192,
                kv_capacity: 123456,
                eos_token_ids: vec![2],
                page_size: 1,
                tp_size: 1,
                device: "cpu".into(),
            }),
            WorkerMsg::Step {
                outputs: vec![
                    TokenOutput {
                        logprob: Some(-0.25),
                        top_logprobs: Some(vec![(42, -0.25), (17, -1.5)]),
                        ..out(7, 42, None, 0)
                    },
                    out(8, 2, Some(Finish::Stop), 16),
                    out(1 << 40, 70000, Some(Finish::Length), 0),
                ],
            },
            WorkerMsg::Error {
                rid: Some(9),
                code: ErrorCode::ContextTooLong,
                message: "prompt has 9000 tokens; the context is 8192".into(),
            },
            WorkerMsg::Error {
                rid: Some(10),
                code: ErrorCode::InvalidRequest,
                message: "input_ids is empty".into(),
            },
            WorkerMsg::Error {
                rid: Some(12),
                code: ErrorCode::InvalidConstraint,
                message: "json_schema constraint: Unimplemented keys: [\"not\"]".into(),
            },
            WorkerMsg::Error {
                rid: Some(11),
                code: ErrorCode::Internal,
                message: "worker step failed".into(),
            },
            WorkerMsg::Error {
                rid: None,
                code: ErrorCode::BadMessage,
                message: "frame version must be 1; got 2".into(),
            },
            WorkerMsg::Load(Load {
                waiting: 3,
                running: 64,
                kv_used: 1000,
                kv_cached: 500,
                kv_total: 123456,
                prompt_tokens: 4096,
                cached_prompt_tokens: 1024,
            }),
            WorkerMsg::CacheEvents {
                stored: block_hashes(&BLOCK_TOKENS, 4),
                removed: block_hashes(&[1, 2, 300, 70000, 70000, 0, 1, u32::MAX], 4)[1..].to_vec(),
            },
        ]
    }

    #[test]
    fn router_frame_matches_golden_both_ways() {
        let bytes = golden("router_frame");
        assert_eq!(decode_frame::<RouterMsg>(&bytes).unwrap(), router_msgs());
        assert_eq!(encode_frame(&router_msgs()), bytes);
    }

    #[test]
    fn worker_frame_matches_golden_both_ways() {
        let bytes = golden("worker_frame");
        assert_eq!(decode_frame::<WorkerMsg>(&bytes).unwrap(), worker_msgs());
        assert_eq!(encode_frame(&worker_msgs()), bytes);
    }

    #[test]
    fn other_versions_are_refused() {
        #[derive(Serialize)]
        struct Bad {
            v: u32,
            msgs: Vec<RouterMsg>,
        }
        let v = VERSION + 1;
        let bytes = rmp_serde::to_vec_named(&Bad { v, msgs: vec![] }).unwrap();
        let err = decode_frame::<RouterMsg>(&bytes).unwrap_err();
        assert_eq!(err, format!("frame version must be {VERSION}; got {v}"));
    }

    #[test]
    fn unknown_error_codes_are_refused() {
        let frame = |code: &str| {
            let msg = serde_json::json!({"type": "error", "rid": 1, "code": code, "message": "m"});
            rmp_serde::to_vec_named(&serde_json::json!({"v": VERSION, "msgs": [msg]})).unwrap()
        };
        let msgs = decode_frame::<WorkerMsg>(&frame("context_too_long")).unwrap();
        assert!(matches!(
            msgs[..],
            [WorkerMsg::Error {
                code: ErrorCode::ContextTooLong,
                ..
            }]
        ));
        let err = decode_frame::<WorkerMsg>(&frame("too_long")).unwrap_err();
        assert!(err.contains("unknown variant `too_long`"), "{err}");
    }
}
