//! What one request may ask for: the flags behind the router's per-request limits, each
//! with a default that suits a server on one machine, and each named by the 400 it causes.
//! (`--max-requests`, the in-flight cap, and the 4 MiB body limit live beside admission and
//! the routes.)

use std::time::Duration;

use clap::Args;

/// `max_tokens` of /v1/completions when the request gives none, as in OpenAI's and vLLM's
/// completions API (chat's default is the rest of the context).
pub const COMPLETIONS_DEFAULT_MAX_TOKENS: u32 = 16;

#[derive(Debug, Clone, PartialEq, Args)]
pub struct Limits {
    /// Most tokens a request may ask to generate (`max_tokens` and its aliases; 400 past
    /// it); a request that names none gets at most this many. Default: the model's context.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tokens_limit: Option<u32>,
    /// Most choices a request may ask for (`n`).
    #[arg(long, value_name = "N", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_n: u32,
    /// Most prompts in one /v1/completions request (a list of strings or of token lists).
    #[arg(long, value_name = "N", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_prompts: u32,
    /// Seconds a request may wait for an in-flight slot (`--max-requests`) before its 429;
    /// 0, the default, refuses at once (a load balancer can retry elsewhere at once).
    #[arg(long, value_name = "SECS", default_value_t = 0.0, value_parser = seconds)]
    pub admission_wait: f64,
    /// Seconds a generation may run, from its admission: past it the worker aborts it (its
    /// KV is freed) and the client gets 504 (an error event when streaming). Default: none.
    #[arg(long, value_name = "SECS", value_parser = positive_seconds)]
    pub request_timeout: Option<f64>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_tokens_limit: None,
            max_n: 64,
            max_prompts: 256,
            admission_wait: 0.0,
            request_timeout: None,
        }
    }
}

impl Limits {
    pub fn admission_wait(&self) -> Duration {
        Duration::from_secs_f64(self.admission_wait)
    }

    pub fn request_timeout(&self) -> Option<Duration> {
        self.request_timeout.map(Duration::from_secs_f64)
    }
}

/// A number of seconds: finite, >= 0 and at most a day.
fn seconds(text: &str) -> Result<f64, String> {
    let secs: f64 = text.parse().map_err(|e| format!("{e}"))?;
    if !(0.0..=86_400.0).contains(&secs) {
        return Err(format!("must be in [0, 86400] seconds; got {text}"));
    }
    Ok(secs)
}

/// A number of seconds above 0 (and at most a day).
fn positive_seconds(text: &str) -> Result<f64, String> {
    match seconds(text)? {
        0.0 => Err("must be above 0 seconds (leave the flag out for no limit)".into()),
        secs => Ok(secs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        limits: Limits,
    }

    fn parse(args: &[&str]) -> Result<Limits, clap::Error> {
        Flags::try_parse_from(std::iter::once("r").chain(args.iter().copied())).map(|f| f.limits)
    }

    #[test]
    fn defaults_match_the_flags_defaults() {
        assert_eq!(parse(&[]).unwrap(), Limits::default());
        let l = parse(&["--max-tokens-limit", "8", "--admission-wait", "1.5"]).unwrap();
        assert_eq!(l.request_timeout(), None);
        let t = parse(&["--request-timeout", "2.5"])
            .unwrap()
            .request_timeout();
        assert_eq!(t, Some(Duration::from_millis(2500)));
        assert_eq!(l.max_tokens_limit, Some(8));
        assert_eq!(l.admission_wait(), Duration::from_millis(1500));
    }

    #[test]
    fn out_of_range_values_are_refused() {
        for args in [
            ["--max-tokens-limit", "0"],
            ["--max-n", "0"],
            ["--max-prompts", "0"],
            ["--admission-wait", "-1"],
            ["--admission-wait", "NaN"],
            ["--request-timeout", "0"],
            ["--request-timeout", "inf"],
        ] {
            assert!(parse(&args).is_err(), "{args:?}");
        }
    }
}
