//! What a request's omitted sampling fields become. As vLLM and SGLang do, the model folder's
//! `generation_config.json` sets them where it names them (`temperature`, `top_p`, `top_k`,
//! `min_p`, `repetition_penalty`; its `do_sample` is not read), and OpenAI's defaults fill in
//! the rest: temperature 1, top_p 1, top_k, min_p and the repetition penalty off.
//! `--sampling-defaults openai` leaves the model's file out.

use std::path::Path;

use clap::ValueEnum;
use serde::Deserialize;
use serde_json::Value as Json;

use crate::api::openai::CommonParams;
use crate::api::params::{sampling, EndpointParams};
use crate::text::chat_template::read_json;

/// `--sampling-defaults`: where omitted sampling fields come from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum SamplingSource {
    /// The model's generation_config.json, then OpenAI's defaults.
    #[default]
    Model,
    /// OpenAI's defaults only.
    Openai,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingDefaults {
    pub temperature: f64,
    pub top_p: f64,
    /// 0: off.
    pub top_k: i64,
    pub min_p: f64,
    pub repetition_penalty: f64,
}

impl Default for SamplingDefaults {
    /// OpenAI's.
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
        }
    }
}

/// The fields of generation_config.json that a request's sampling fields default to; the
/// file's other keys (token ids, `max_length`, ...) are not ours to read here.
#[derive(Deserialize)]
struct GenerationConfig {
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
    min_p: Option<f64>,
    repetition_penalty: Option<f64>,
}

impl SamplingDefaults {
    /// The defaults for the model in `dir` (its generation_config.json may be absent). A
    /// value a request could not send is refused, naming the file, the field and its range.
    pub fn load(dir: &Path, source: SamplingSource) -> Result<Self, String> {
        if source == SamplingSource::Openai {
            return Ok(Self::default());
        }
        let path = dir.join("generation_config.json");
        let hint = |e: String| format!("{e} (--sampling-defaults openai ignores the file)");
        match read_json(&path).map_err(hint)? {
            None => Ok(Self::default()),
            Some(config) => {
                Self::from_config(config).map_err(|e| hint(format!("{}: {e}", path.display())))
            }
        }
    }

    /// The defaults a generation_config.json sets, checked as a request's fields are.
    pub fn from_config(config: Json) -> Result<Self, String> {
        let g: GenerationConfig = serde_json::from_value(config).map_err(|e| e.to_string())?;
        let common = CommonParams {
            temperature: g.temperature,
            top_p: g.top_p,
            top_k: g.top_k,
            min_p: g.min_p,
            repetition_penalty: g.repetition_penalty,
            ..CommonParams::default()
        };
        let s = sampling(&common, &EndpointParams::default(), &Self::default())
            .map_err(|e| e.message().to_string())?;
        Ok(Self {
            temperature: s.temperature,
            top_p: s.top_p,
            top_k: s.top_k,
            min_p: s.min_p,
            repetition_penalty: s.repetition_penalty,
        })
    }

    /// For the start-up log: e.g. "temperature 0.6, top_p 0.9, top_k off, min_p 0, ...".
    pub fn describe(&self) -> String {
        let top_k = match self.top_k {
            0 => "off".to_string(),
            k => k.to_string(),
        };
        format!(
            "temperature {}, top_p {}, top_k {top_k}, min_p {}, repetition_penalty {}",
            self.temperature, self.top_p, self.min_p, self.repetition_penalty
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_json(text: &str) -> Result<SamplingDefaults, String> {
        SamplingDefaults::from_config(serde_json::from_str(text).unwrap())
    }

    #[test]
    fn openai_defaults_fill_what_the_file_leaves_out() {
        let d = from_json(r#"{"eos_token_id": [2, 0], "top_k": 20}"#).unwrap();
        assert_eq!(
            d,
            SamplingDefaults {
                top_k: 20,
                ..SamplingDefaults::default()
            }
        );
        assert_eq!(SamplingDefaults::default().temperature, 1.0);
        let d = from_json(
            r#"{"do_sample": true, "temperature": 0.6, "top_p": 0.9, "min_p": 0.05,
                "repetition_penalty": 1.05, "top_k": null}"#,
        )
        .unwrap();
        assert_eq!(
            (
                d.temperature,
                d.top_p,
                d.top_k,
                d.min_p,
                d.repetition_penalty
            ),
            (0.6, 0.9, 0, 0.05, 1.05)
        );
        assert_eq!(
            d.describe(),
            "temperature 0.6, top_p 0.9, top_k off, min_p 0.05, repetition_penalty 1.05"
        );
        // -1 is how vLLM spells "off"; it is sent as 0, as a request's would be
        let d = from_json(r#"{"top_k": -1}"#).unwrap();
        assert_eq!(d.top_k, 0);
    }

    #[test]
    fn a_value_a_request_could_not_send_is_refused_by_name() {
        for (text, want) in [
            (
                r#"{"temperature": 2.5}"#,
                "`temperature` must be in [0, 2]; got 2.5",
            ),
            (r#"{"top_p": 0}"#, "`top_p` must be in (0, 1]; got 0"),
            (
                r#"{"top_k": -2}"#,
                "`top_k` must be -1, 0 (off) or positive; got -2",
            ),
            (r#"{"min_p": 1}"#, "`min_p` must be in [0, 1); got 1"),
            (
                r#"{"repetition_penalty": 0}"#,
                "`repetition_penalty` must be > 0; got 0",
            ),
        ] {
            assert_eq!(from_json(text).unwrap_err(), want);
        }
        let err = from_json(r#"{"temperature": "warm"}"#).unwrap_err();
        assert!(err.starts_with("invalid type: string \"warm\""), "{err}");
    }

    #[test]
    fn the_file_is_read_unless_openai_defaults_are_asked_for() {
        let dir = std::env::temp_dir().join(format!("minisgl-gen-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(
            SamplingDefaults::load(&dir, SamplingSource::Model).unwrap(),
            SamplingDefaults::default()
        );
        std::fs::write(
            dir.join("generation_config.json"),
            r#"{"temperature": 0.3}"#,
        )
        .unwrap();
        let d = SamplingDefaults::load(&dir, SamplingSource::Model).unwrap();
        assert_eq!(d.temperature, 0.3);
        let d = SamplingDefaults::load(&dir, SamplingSource::Openai).unwrap();
        assert_eq!(d.temperature, 1.0);
        std::fs::write(dir.join("generation_config.json"), r#"{"temperature": 9}"#).unwrap();
        let err = SamplingDefaults::load(&dir, SamplingSource::Model).unwrap_err();
        assert!(
            err.ends_with(
                "generation_config.json: `temperature` must be in [0, 2]; got 9 \
                 (--sampling-defaults openai ignores the file)"
            ),
            "{err}"
        );
        assert!(SamplingDefaults::load(&dir, SamplingSource::Openai).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
