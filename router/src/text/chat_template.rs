//! The model's chat template (Jinja, as Hugging Face renders it) through minijinja.
//!
//! Found in tokenizer_config.json (`chat_template`: a string, or a list of `{name, template}`
//! of which "default" is used) or in chat_template.jinja. Rendered like transformers does:
//! trim_blocks and lstrip_blocks on, Python string methods (pycompat), `raise_exception`,
//! `tojson` as Python's `json.dumps` writes (`text::pyjson`), `strftime_now`, loop controls,
//! maps in insertion order, with `bos_token`/`eos_token` and `add_generation_prompt = true`.

use std::collections::BTreeSet;
use std::path::Path;

use minijinja::{context, Environment, Error, ErrorKind};
use serde::Serialize;
use serde_json::Value as Json;

use crate::error::ApiError;

const TEMPLATE_NAME: &str = "chat";

pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    /// The template's text (which tool-call format it shows: `ToolFormat::detect`).
    source: String,
    /// The variables it reads (`tools`: Hugging Face's tool support).
    variables: BTreeSet<String>,
}

/// The role OpenAI's newer clients send their instructions in; a template that never names
/// it gets it as `system`, the role it replaced (as llama.cpp does).
pub const DEVELOPER: &str = "developer";

/// What a chat request adds to the messages: its tools (when the template takes them) and
/// `chat_template_kwargs`.
#[derive(Debug, Default)]
pub struct RenderExtras<'a> {
    pub tools: Option<&'a Json>,
    pub kwargs: Option<&'a serde_json::Map<String, Json>>,
}

/// Variables the router sets, which `chat_template_kwargs` may not (a chat completion
/// always opens the assistant's turn: `add_generation_prompt` is true).
const RESERVED_VARIABLES: [&str; 5] = [
    "messages",
    "tools",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
];

/// One message as the template sees it (content already flattened to text).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct TemplateMessage {
    pub role: String,
    pub content: String,
    /// Absent (undefined in the template) unless the client sent it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// An assistant turn's calls, `arguments` as JSON objects (as transformers passes them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Json>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl ChatTemplate {
    /// The template of the model folder `dir`, or None when it has none.
    pub fn from_model_dir(dir: &Path) -> Result<Option<Self>, String> {
        let config = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Json::Null);
        let jinja = dir.join("chat_template.jinja");
        let source = match template_from_config(&config) {
            Some(source) => source,
            None if jinja.exists() => std::fs::read_to_string(&jinja)
                .map_err(|e| format!("cannot read {}: {e}", jinja.display()))?,
            None => return Ok(None),
        };
        let bos = special_token(&config, "bos_token");
        let eos = special_token(&config, "eos_token");
        Self::new(source, bos, eos).map(Some)
    }

    pub fn new(source: String, bos_token: String, eos_token: String) -> Result<Self, String> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", crate::text::pyjson::tojson);
        env.add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(|e| format!("the chat template does not parse: {e}"))?;
        let variables = env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| e.to_string())?
            .undeclared_variables(false)
            .into_iter()
            .collect();
        Ok(Self {
            env,
            bos_token,
            eos_token,
            source,
            variables,
        })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn supports_tools(&self) -> bool {
        self.variables.contains("tools")
    }

    /// Checks `chat_template_kwargs`: the server's own variables are refused, and so is a
    /// variable the template never reads (it would change nothing).
    pub fn check_kwargs(&self, kwargs: &serde_json::Map<String, Json>) -> Result<(), ApiError> {
        let refuse = |message: String| Err(ApiError::invalid("chat_template_kwargs", message));
        for key in kwargs.keys() {
            if RESERVED_VARIABLES.contains(&key.as_str()) {
                return refuse(format!("`chat_template_kwargs.{key}` is set by the server"));
            }
            if !self.variables.contains(key) {
                let free: Vec<&str> = (self.variables.iter().map(String::as_str))
                    .filter(|v| !RESERVED_VARIABLES.contains(v))
                    .collect();
                return refuse(format!(
                    "`chat_template_kwargs.{key}`: the model's chat template does not read it; \
                     it reads {free:?}"
                ));
            }
        }
        Ok(())
    }

    /// The role a `developer` message is rendered with.
    pub fn developer_role(&self) -> &'static str {
        match self.source.contains(DEVELOPER) {
            true => DEVELOPER,
            false => "system",
        }
    }

    pub fn render(&self, messages: &[TemplateMessage]) -> Result<String, ApiError> {
        self.render_with(messages, &RenderExtras::default())
    }

    /// Renders with a request's tools and template variables (`chat_template_kwargs`,
    /// checked by the caller with `check_kwargs`).
    pub fn render_with(
        &self,
        messages: &[TemplateMessage],
        extras: &RenderExtras,
    ) -> Result<String, ApiError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .expect("added in new()");
        let kwargs = minijinja::Value::from_serialize(extras.kwargs);
        let ctx = context! {
            messages => messages,
            tools => extras.tools,
            add_generation_prompt => true,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
            ..kwargs
        };
        // A template error is nearly always about the messages (e.g. roles out of order),
        // so it is the client's to fix.
        template.render(ctx).map_err(|e| {
            ApiError::invalid("messages", format!("chat template: {}", error_text(&e)))
        })
    }
}

fn error_text(e: &Error) -> String {
    match e.detail() {
        Some(detail) => detail.to_string(),
        None => e.to_string(),
    }
}

/// The JSON file at `path`, None if there is none; errors name the file.
pub(crate) fn read_json(path: &Path) -> Result<Option<Json>, String> {
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| format!("{} is not valid JSON: {e}", path.display()))
}

fn template_from_config(config: &Json) -> Option<String> {
    match config.get("chat_template")? {
        Json::String(s) => Some(s.clone()),
        Json::Array(named) => named
            .iter()
            .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
        _ => None,
    }
}

/// `bos_token` / `eos_token` may be a string or an AddedToken map `{"content": ...}`.
fn special_token(config: &Json, key: &str) -> String {
    match config.get(key) {
        Some(Json::String(s)) => s.clone(),
        Some(map) => map
            .get("content")
            .and_then(Json::as_str)
            .unwrap_or("")
            .to_string(),
        None => String::new(),
    }
}

fn raise_exception(message: String) -> Result<String, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    strftime(secs, &format)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// The subset of strftime that chat templates use (UTC): %Y %m %d %B %b %H %M %S %%.
fn strftime(unix_secs: i64, format: &str) -> String {
    let (year, month, day) = civil_from_days(unix_secs.div_euclid(86_400));
    let secs_of_day = unix_secs.rem_euclid(86_400);
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('B') => out.push_str(month_name),
            Some('b') => out.push_str(&month_name[..3]),
            Some('H') => out.push_str(&format!("{:02}", secs_of_day / 3600)),
            Some('M') => out.push_str(&format!("{:02}", secs_of_day / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", secs_of_day % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 to (year, month, day); Howard Hinnant's algorithm.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
#[path = "chat_template_tests.rs"]
mod tests;
