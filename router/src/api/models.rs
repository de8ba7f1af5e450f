//! The names a client may pass as `model`, and `/v1/models`, which lists them.
//!
//! Clients of vLLM and SGLang send the `--model` argument as given (their default served
//! name), others the folder's name: both are accepted, the folder's name first (the one
//! the chat page and `--shell` show). `--served-model-name` (repeatable) replaces both.

use axum::extract::{Path, State};
use axum::Json;
use serde_json::{json, Value};

use crate::config::Config;
use crate::error::ApiError;
use crate::state::AppState;

/// The accepted names, in the order `/v1/models` lists them.
pub fn served_names(config: &Config, folder_name: &str) -> Vec<String> {
    let mut names = match config.served_model_name.is_empty() {
        false => config.served_model_name.clone(),
        true => {
            let given = config.model.as_ref().filter(|_| !config.default_model);
            let given = given.map(|p| p.to_string_lossy().into_owned());
            std::iter::once(folder_name.to_string())
                .chain(given)
                .collect()
        }
    };
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| seen.insert(n.clone()));
    names
}

/// `GET /v1/models`: one entry per accepted name (the same model).
pub async fn list(State(state): State<AppState>) -> Json<Value> {
    let data: Vec<Value> = state
        .model_names
        .iter()
        .map(|name| entry(&state, name))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// `GET /v1/models/{id}` (the openai SDK's `models.retrieve`): the entry of a served name,
/// which may hold slashes (`Qwen/Qwen3-8B`), else the 404 that lists them.
pub async fn retrieve(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    state.check_model(&id)?;
    Ok(Json(entry(&state, &id)))
}

fn entry(state: &AppState, name: &str) -> Value {
    json!({
        "id": name,
        "object": "model",
        "created": state.started,
        "owned_by": "minisgl",
        "max_model_len": state.max_context().ok(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn names(args: &[&str]) -> Vec<String> {
        let config = Config::try_parse_from(std::iter::once("r").chain(args.iter().copied()));
        served_names(&config.unwrap(), "Qwen3-8B")
    }

    #[test]
    fn the_argument_as_given_and_the_folder_name_or_the_served_names() {
        assert_eq!(
            names(&["--model", "/models/Qwen3-8B"]),
            ["Qwen3-8B", "/models/Qwen3-8B"]
        );
        assert_eq!(names(&["--model", "Qwen3-8B"]), ["Qwen3-8B"]);
        assert_eq!(
            names(&[
                "--model",
                "/models/Qwen3-8B",
                "--served-model-name",
                "qwen",
                "--served-model-name",
                "gpt-4o",
                "--served-model-name",
                "qwen",
            ]),
            ["qwen", "gpt-4o"]
        );
        // The embedded default model: its cache path was not given by anyone.
        let mut config = Config::try_parse_from(["r", "--model", "/cache/SmolLM2"]).unwrap();
        config.default_model = true;
        assert_eq!(served_names(&config, "SmolLM2"), ["SmolLM2"]);
    }
}
