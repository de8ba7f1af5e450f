//! A chat request's messages as the chat template sees them: roles checked, text parts
//! joined, an assistant turn's calls parsed, and the fields a reply carries when it is sent
//! back as history checked.

use serde_json::Value;

use crate::api::openai::{ChatMessage, Content};
use crate::api::tools::render::template_calls;
use crate::error::ApiError;
use crate::text::chat_template::TemplateMessage;

const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// The fields a reply carries when it is sent back as history: on assistant turns only (an
/// earlier turn's calls too), and those this server never fills empty.
fn check_reply_fields(i: usize, message: &ChatMessage) -> Result<(), ApiError> {
    let on_reply = [
        ("tool_calls", message.tool_calls.is_some()),
        ("reasoning_content", message.reasoning_content.is_some()),
        ("parsed", message.parsed.is_some()),
    ];
    if let Some((field, _)) = on_reply.iter().find(|(_, set)| *set) {
        if message.role != "assistant" {
            return Err(ApiError::invalid(
                "messages",
                format!(
                    "`messages[{i}].{field}` is only allowed on assistant turns; got {:?}",
                    message.role
                ),
            ));
        }
    }
    let empty = |v: &Option<Value>| match v {
        None | Some(Value::Null) => true,
        Some(Value::Array(items)) => items.is_empty(),
        _ => false,
    };
    let unfilled = [
        ("refusal", &message.refusal),
        ("audio", &message.audio),
        ("function_call", &message.function_call),
        ("annotations", &message.annotations),
    ];
    match unfilled.iter().find(|(_, v)| !empty(v)) {
        Some((field, _)) => Err(ApiError::invalid(
            "messages",
            format!("`messages[{i}].{field}` is not supported (only null or empty)"),
        )),
        None => Ok(()),
    }
}

pub fn flatten((i, message): (usize, &ChatMessage)) -> Result<TemplateMessage, ApiError> {
    if !ROLES.contains(&message.role.as_str()) {
        return Err(ApiError::invalid(
            "messages",
            format!(
                "`messages[{i}].role` must be one of {ROLES:?}; got {:?}",
                message.role
            ),
        ));
    }
    let content = match &message.content {
        None => String::new(),
        Some(Content::Text(text)) => text.clone(),
        // Text parts joined by newlines, as vLLM and TensorRT-LLM join them.
        Some(Content::Parts(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                match (part.kind.as_str(), &part.text) {
                    ("text", Some(t)) => match part.other.keys().next() {
                        None => texts.push(t.as_str()),
                        Some(key) => {
                            let field = format!("messages[{i}].content[{j}].{key}");
                            let message = format!("unsupported parameter `{field}`");
                            return Err(ApiError::invalid(&field, message));
                        }
                    },
                    (kind, _) => {
                        return Err(ApiError::invalid(
                            "messages",
                            format!(
                            "`messages[{i}].content`: only text parts are supported; got `{kind}`"
                        ),
                        ))
                    }
                }
            }
            texts.join("\n")
        }
    };
    check_reply_fields(i, message)?;
    let tool_calls = (message.tool_calls.as_ref())
        .map(|calls| template_calls(i, calls))
        .transpose()?;
    Ok(TemplateMessage {
        role: message.role.clone(),
        content,
        name: message.name.clone(),
        tool_call_id: message.tool_call_id.clone(),
        tool_calls,
        reasoning_content: message.reasoning_content.clone(),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Map};

    use super::*;
    use crate::api::openai::ContentPart;

    fn message(role: &str, content: Option<Content>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content,
            name: None,
            tool_call_id: None,
            tool_calls: None,
            reasoning_content: None,
            parsed: None,
            refusal: None,
            audio: None,
            function_call: None,
            annotations: None,
        }
    }

    #[test]
    fn text_parts_are_joined_and_other_parts_refused() {
        let parts = vec![
            ContentPart {
                kind: "text".into(),
                text: Some("a".into()),
                other: Map::new(),
            },
            ContentPart {
                kind: "text".into(),
                text: Some("b".into()),
                other: Map::new(),
            },
        ];
        let m = flatten((0, &message("user", Some(Content::Parts(parts))))).unwrap();
        assert_eq!(m.content, "a\nb");
        let image = vec![ContentPart {
            kind: "image_url".into(),
            text: None,
            other: Map::from_iter([("image_url".to_string(), json!({"url": "x"}))]),
        }];
        let err = flatten((1, &message("user", Some(Content::Parts(image))))).unwrap_err();
        assert_eq!(
            err.message(),
            "`messages[1].content`: only text parts are supported; got `image_url`"
        );
        // A key a text part does not take (Anthropic's `cache_control`) is named.
        let cached = vec![ContentPart {
            kind: "text".into(),
            text: Some("a".into()),
            other: Map::from_iter([("cache_control".to_string(), json!({"type": "ephemeral"}))]),
        }];
        let err = flatten((2, &message("user", Some(Content::Parts(cached))))).unwrap_err();
        assert_eq!(
            err.message(),
            "unsupported parameter `messages[2].content[0].cache_control`"
        );
        assert_eq!(
            err.body()["error"]["param"],
            "messages[2].content[0].cache_control"
        );
    }

    #[test]
    fn an_earlier_turn_s_calls_are_on_assistant_turns_only() {
        let mut user = message("user", None);
        user.tool_calls = Some(vec![]);
        let err = flatten((3, &user)).unwrap_err();
        assert_eq!(
            err.message(),
            "`messages[3].tool_calls` is only allowed on assistant turns; got \"user\""
        );
    }

    #[test]
    fn unknown_roles_are_refused() {
        let err = flatten((0, &message("wizard", None))).unwrap_err();
        assert!(
            err.message()
                .starts_with("`messages[0].role` must be one of"),
            "{}",
            err.message()
        );
    }
}
