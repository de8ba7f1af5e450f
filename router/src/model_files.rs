//! What the router reads from the model folder itself: the tokenizer, the chat template,
//! the sampling defaults (generation_config.json) and the name it is served under. The
//! workers read the weights and config.json.

use std::path::Path;

use crate::api::sampling_defaults::{SamplingDefaults, SamplingSource};
use crate::text::chat_template::ChatTemplate;
use crate::text::tokenizer::Tokenizer;

/// The model folder's tokenizer, chat template, sampling defaults and served name.
pub struct ModelFiles {
    pub name: String,
    pub tokenizer: Tokenizer,
    pub template: Option<ChatTemplate>,
    pub sampling_defaults: SamplingDefaults,
}

pub fn load_model_files(
    dir: &Path,
    served_name: Option<&str>,
    sampling: SamplingSource,
) -> Result<ModelFiles, String> {
    if !dir.is_dir() {
        return Err(format!("--model {} is not a folder", dir.display()));
    }
    let tokenizer = Tokenizer::from_file(&dir.join("tokenizer.json"))?;
    let template = ChatTemplate::from_model_dir(dir)?;
    if template.is_none() {
        tracing::warn!(
            "{} has no chat template: /v1/chat/completions will refuse requests",
            dir.display()
        );
    }
    let folder_name = dir
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
    let name = served_name
        .map(str::to_string)
        .or(folder_name)
        .unwrap_or_else(|| "model".into());
    let sampling_defaults = SamplingDefaults::load(dir, sampling)?;
    tracing::info!("sampling defaults: {}", sampling_defaults.describe());
    Ok(ModelFiles {
        name,
        tokenizer,
        template,
        sampling_defaults,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::tokenizer::tests::tiny_model_dir;

    #[test]
    fn model_folder_gives_name_tokenizer_and_template() {
        let files = load_model_files(&tiny_model_dir(), None, SamplingSource::Model).unwrap();
        assert_eq!(files.name, "tiny-model");
        assert!(files.template.is_some());
        let files =
            load_model_files(&tiny_model_dir(), Some("served"), SamplingSource::Model).unwrap();
        assert_eq!(files.name, "served");
    }
}
