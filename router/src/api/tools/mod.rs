//! Tool calling and reasoning on /v1/chat/completions: the request's tool fields checked
//! (`request`), the prompt rendered with them (`render`), forced choices turned into a
//! grammar (`grammar`; with a reasoning parser it applies after the thought: `think`), and
//! each choice's output split into reasoning, content and calls (`output`). The parsers
//! themselves live in `text::tool_calls` and `text::reasoning`.

pub mod grammar;
pub mod output;
pub mod render;
pub mod request;
pub mod think;

use clap::Args;

use crate::api::openai::{ChatRequest, CommonParams};
use crate::api::params::GenParams;
use crate::error::ApiError;
use crate::state::AppState;
use crate::text::reasoning::ReasoningFormat;
use crate::text::tool_calls::ToolFormat;
use grammar::{forced_calls, strict_auto};
use output::OutputPlan;
use request::ToolRequest;
pub use think::reasoning_room;

/// The router's flags for chat outputs.
#[derive(Debug, Clone, Default, PartialEq, Args)]
pub struct ChatOptions {
    /// How the model writes tool calls: hermes (`<tool_call>` JSON, Qwen 2.5/3 and the
    /// default rendering), llama3 (bare JSON) or mistral (`[TOOL_CALLS]`). Default: the
    /// format the chat template shows, else hermes.
    #[arg(long, value_enum, value_name = "NAME")]
    pub tool_call_parser: Option<ToolFormat>,
    /// Split `<think>...</think>` reasoning into `reasoning_content`: qwen3 or deepseek-r1.
    /// Default: none (reasoning stays in the content).
    #[arg(long, value_enum, value_name = "NAME")]
    pub reasoning_parser: Option<ReasoningFormat>,
}

/// The request's tool fields checked; a forced choice (`required`, a named function) puts
/// its grammar in `params`. Returns how the outputs are parsed too, but for `reasoning`,
/// which the caller sets once the prompt is rendered (`reasoning_room`).
pub fn prepare(
    state: &AppState,
    req: &mut ChatRequest,
    common: &CommonParams,
    params: &mut GenParams,
) -> Result<(ToolRequest, OutputPlan), ApiError> {
    let tools = ToolRequest::parse(
        req.tools.take(),
        req.tool_choice.as_ref(),
        req.parallel_tool_calls,
    )?;
    if tools.forced() {
        if params.sampling.constraint.is_some() || common.min_tokens.unwrap_or(0) > 0 {
            return Err(ApiError::invalid(
                "tool_choice",
                "a forced `tool_choice` cannot be combined with a structured output \
                 constraint or `min_tokens`",
            ));
        }
        let constraint = forced_calls(state.tool_format, &tools.callable(), tools.max_calls());
        params.sampling.constraint = Some(constraint);
        params.constraint_field = Some("tools");
    } else if tools.strict() && params.sampling.constraint.is_none() {
        if common.min_tokens.unwrap_or(0) > 0 {
            return Err(ApiError::invalid(
                "min_tokens",
                "`min_tokens` cannot be combined with `strict` tools (their calls are decoded \
                 under a grammar)",
            ));
        }
        let constraint = strict_auto(state.tool_format, &tools.callable(), tools.max_calls());
        params.constraint_field = constraint.as_ref().map(|_| "tools");
        params.sampling.constraint = constraint;
    }
    let plan = OutputPlan {
        tools: tools.active().then(|| {
            let names = tools.tools.iter().map(|t| t.function.name.clone());
            (state.tool_format, tools.max_calls(), names.collect())
        }),
        forced: tools.forced(),
        reasoning: None, // `reasoning_room`, once the prompt is rendered
    };
    Ok((tools, plan))
}
