//! Constraints that leave room for reasoning: with `--reasoning-parser`, a constrained chat
//! request's grammar is wrapped so that the model may think first and the constraint applies
//! to the answer after `</think>`. The thought is a lazy Lark rule (it ends at the first
//! `</think>`); `qwen3` may skip it, `deepseek-r1` starts inside it (its template opened
//! `<think>` in the prompt).
//!
//! Wrapped: JSON schemas, choice lists and forced tool calls (grammars we write). Regexes and
//! client grammars are sent as they are; their outputs are then not split (`None`), nor are
//! any when the rendered prompt already closed the thought (`reasoning_room`).

use serde_json::{json, Value};

use crate::text::reasoning::{self, ReasoningFormat};
use crate::worker::protocol::{Constraint, ConstraintKind};

/// How a chat choice's output is split, given the reasoning parser (if any), the request's
/// constraint and its rendered prompt. A prompt whose template already closed the thought
/// (Qwen3's `enable_thinking: false` ends it with an empty `<think></think>`) leaves no room
/// for reasoning: the output is all answer, not split, and a constraint applies from its
/// first token. Otherwise a constraint is wrapped to apply after the thought; one that
/// cannot be (a regex, a client grammar) leaves no room for reasoning either.
pub fn reasoning_room(
    reasoning: Option<ReasoningFormat>,
    constraint: &mut Option<Constraint>,
    prompt: &str,
) -> Option<ReasoningFormat> {
    let format = reasoning?;
    if prompt.trim_end().ends_with(reasoning::END) {
        return None;
    }
    let Some(given) = constraint.as_ref() else {
        return Some(format);
    };
    *constraint = Some(after_reasoning(format, given)?);
    Some(format)
}

/// The constraint with a thought allowed before it, or None when its kind is not wrapped.
pub fn after_reasoning(format: ReasoningFormat, constraint: &Constraint) -> Option<Constraint> {
    let answer = match constraint.kind {
        ConstraintKind::JsonSchema => {
            let mut schema: Value = serde_json::from_str(&constraint.source).ok()?;
            if !schema.is_object() {
                return None;
            }
            schema["x-guidance"] = json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
            });
            format!("answer: %json {schema}\n")
        }
        ConstraintKind::Choice => {
            let choices: Vec<String> = serde_json::from_str(&constraint.source).ok()?;
            let quoted: Vec<String> = choices
                .iter()
                .map(|c| Value::from(c.as_str()).to_string())
                .collect();
            format!("answer: {}\n", quoted.join(" | "))
        }
        // Our forced-call grammars: their `start` becomes the answer.
        ConstraintKind::Lark if constraint.source.starts_with("start: ") => {
            format!("answer: {}\n", &constraint.source["start: ".len()..])
        }
        _ => return None,
    };
    // The blank lines a model writes after `</think>` belong to the thought: an answer
    // without one starts at once (a choice is exactly one of its strings).
    let thought = match format {
        ReasoningFormat::Qwen3 => "(\"<think>\" thought /[ \\n]*/)?",
        ReasoningFormat::DeepseekR1 => "\"<think>\"? thought /[ \\n]*/",
    };
    let source = format!(
        "%llguidance {{}}\nstart: {thought} answer\n\
         thought[lazy]: THOUGHT \"</think>\"\nTHOUGHT: /(.|\\n)*/\n{answer}"
    );
    Some(Constraint {
        kind: ConstraintKind::Lark,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wrap(format: ReasoningFormat, kind: ConstraintKind, source: &str) -> Option<String> {
        let c = Constraint {
            kind,
            source: source.into(),
        };
        after_reasoning(format, &c).map(|c| c.source)
    }

    #[test]
    fn schemas_choices_and_forced_calls_come_after_an_optional_thought() {
        let json = wrap(
            ReasoningFormat::Qwen3,
            ConstraintKind::JsonSchema,
            r#"{"type": "object"}"#,
        )
        .unwrap();
        assert_eq!(
            json,
            "%llguidance {}\nstart: (\"<think>\" thought /[ \\n]*/)? answer\n\
             thought[lazy]: THOUGHT \"</think>\"\nTHOUGHT: /(.|\\n)*/\n\
             answer: %json {\"type\":\"object\",\"x-guidance\":{\"whitespace_flexible\":false,\
             \"item_separator\":\", \",\"key_separator\":\": \"}}\n"
        );
        let choice = wrap(
            ReasoningFormat::DeepseekR1,
            ConstraintKind::Choice,
            r#"["a", "b\""]"#,
        )
        .unwrap();
        assert!(
            choice.contains("start: \"<think>\"? thought /[ \\n]*/ answer\n"),
            "{choice}"
        );
        assert!(choice.ends_with("answer: \"a\" | \"b\\\"\"\n"), "{choice}");
        let calls = wrap(
            ReasoningFormat::Qwen3,
            ConstraintKind::Lark,
            "start: call\ncall: \"x\"",
        )
        .unwrap();
        assert!(calls.ends_with("answer: call\ncall: \"x\"\n"), "{calls}");
    }

    #[test]
    fn a_prompt_that_closed_the_thought_leaves_the_constraint_as_it_is() {
        let schema = Constraint {
            kind: ConstraintKind::JsonSchema,
            source: r#"{"type": "object"}"#.into(),
        };
        let qwen3 = Some(ReasoningFormat::Qwen3);
        let open = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
        let closed = format!("{open}<think>\n\n</think>\n\n");
        let mut kept = Some(schema.clone());
        assert_eq!(reasoning_room(qwen3, &mut kept, &closed), None);
        assert_eq!(kept, Some(schema.clone()));
        let mut wrapped = Some(schema.clone());
        assert_eq!(reasoning_room(qwen3, &mut wrapped, open), qwen3);
        let wrapped = wrapped.unwrap();
        assert_eq!(wrapped.kind, ConstraintKind::Lark);
        assert!(
            wrapped.source.contains("\"<think>\" thought"),
            "{}",
            wrapped.source
        );
        // Without a constraint too, a closed thought leaves the output unsplit (a DeepSeek-R1
        // parser would otherwise take an answer without `</think>` for reasoning).
        let r1 = Some(ReasoningFormat::DeepseekR1);
        assert_eq!(reasoning_room(r1, &mut None, &closed), None);
        assert_eq!(reasoning_room(r1, &mut None, open), r1);
        let mut none = Some(schema.clone());
        assert_eq!(reasoning_room(None, &mut none, open), None);
        assert_eq!(none, Some(schema));
    }

    #[test]
    fn regexes_and_client_grammars_are_not_wrapped() {
        assert_eq!(
            wrap(ReasoningFormat::Qwen3, ConstraintKind::Regex, "a+"),
            None
        );
        assert_eq!(
            wrap(
                ReasoningFormat::Qwen3,
                ConstraintKind::Ebnf,
                "root ::= \"a\""
            ),
            None
        );
        assert_eq!(
            wrap(
                ReasoningFormat::Qwen3,
                ConstraintKind::Lark,
                "%import x\nstart: x"
            ),
            None
        );
    }
}
