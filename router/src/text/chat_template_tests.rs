//! Chat template tests: HF idioms, and byte-identical rendering against transformers.

use super::*;
use crate::text::tokenizer::tests::tiny_model_dir;

fn msg(role: &str, content: &str) -> TemplateMessage {
    TemplateMessage {
        role: role.into(),
        content: content.into(),
        ..Default::default()
    }
}

#[test]
fn renders_chatml_with_default_system_prompt() {
    let t = ChatTemplate::from_model_dir(&tiny_model_dir())
        .unwrap()
        .unwrap();
    let text = t.render(&[msg("user", "Hi")]).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by \
         Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn hf_idioms_work() {
    let source = "{% for m in messages %}{% if m.role not in ['user'] %}\
        {{ raise_exception('only user') }}{% endif %}{{ bos_token }}{{ m.content.strip() | tojson }}\
        {% if loop.index > 0 %}{% break %}{% endif %}{% endfor %}{{ eos_token }}";
    let t = ChatTemplate::new(source.into(), "<s>".into(), "</s>".into()).unwrap();
    assert_eq!(t.render(&[msg("user", "  hi ")]).unwrap(), "<s>\"hi\"</s>");
    let err = t.render(&[msg("system", "x")]).unwrap_err();
    assert_eq!(err.message(), "chat template: only user");
}

#[test]
fn optional_message_fields_are_undefined_unless_sent() {
    let source = "{% for m in messages %}{{ m.name if m.name is defined else '-' }};{% endfor %}";
    let t = ChatTemplate::new(source.into(), String::new(), String::new()).unwrap();
    let named = TemplateMessage {
        name: Some("bob".into()),
        ..msg("user", "hi")
    };
    assert_eq!(t.render(&[named, msg("user", "hi")]).unwrap(), "bob;-;");
}

#[test]
fn an_assistant_turn_s_reasoning_reaches_a_template_that_reads_it() {
    let source = "{% for m in messages %}{% if m.reasoning_content is defined %}\
        <think>{{ m.reasoning_content }}</think>{% endif %}{{ m.content }};{% endfor %}";
    let t = ChatTemplate::new(source.into(), String::new(), String::new()).unwrap();
    let reasoned = TemplateMessage {
        reasoning_content: Some("2+2 is 4".into()),
        ..msg("assistant", "4")
    };
    let rendered = t.render(&[msg("user", "2+2?"), reasoned]).unwrap();
    assert_eq!(rendered, "2+2?;<think>2+2 is 4</think>4;");
}

#[test]
fn picks_the_default_of_named_templates_and_token_maps() {
    let config = serde_json::json!({
        "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}],
        "eos_token": {"content": "</s>"}
    });
    assert_eq!(template_from_config(&config).as_deref(), Some("D"));
    assert_eq!(special_token(&config, "eos_token"), "</s>");
    assert_eq!(special_token(&config, "bos_token"), "");
}

#[test]
fn no_template_is_none() {
    let dir = std::env::temp_dir().join(format!("minisgl-no-template-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let found = ChatTemplate::from_model_dir(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(found.unwrap().is_none());
}

#[test]
fn strftime_formats_utc_dates() {
    // 2024-02-29 13:05:09 UTC
    assert_eq!(
        strftime(1_709_211_909, "%d %B %Y %H:%M:%S (%b) 100%%"),
        "29 February 2024 13:05:09 (Feb) 100%"
    );
}

#[test]
fn loop_controls_and_strftime_now() {
    let source = "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}\
        {{ m.content }}{% if loop.last %}.{% endif %}{% endfor %}{{ strftime_now('%Y')|length }}";
    let t = ChatTemplate::new(source.into(), String::new(), String::new()).unwrap();
    let messages = [msg("system", "s"), msg("user", "a"), msg("assistant", "b")];
    assert_eq!(t.render(&messages).unwrap(), "ab.4");
}

#[test]
fn developer_messages_render_as_system_unless_the_template_names_the_role() {
    let plain = "{% for m in messages %}{{ m.role }}{% endfor %}";
    let t = ChatTemplate::new(plain.into(), String::new(), String::new()).unwrap();
    assert_eq!(t.developer_role(), "system");
    let knows = "{% for m in messages %}{% if m.role == 'developer' %}D{% endif %}{% endfor %}";
    let t = ChatTemplate::new(knows.into(), String::new(), String::new()).unwrap();
    assert_eq!(t.developer_role(), "developer");
}

/// router/tests/data/chat_template_vectors.json: conversations rendered by transformers'
/// `apply_chat_template` with the default model's template (chat_template_vectors.py).
#[test]
fn default_template_renders_like_transformers() {
    let path = format!(
        "{}/tests/data/chat_template_vectors.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let data: Json = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let text = |v: &Json| v.as_str().unwrap().to_string();
    let t = ChatTemplate::new(
        text(&data["template"]),
        text(&data["bos_token"]),
        text(&data["eos_token"]),
    )
    .unwrap();
    let cases = data["cases"].as_array().unwrap();
    assert!(cases.len() >= 8);
    for case in cases {
        let messages: Vec<TemplateMessage> = case["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| msg(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect();
        assert_eq!(
            t.render(&messages).unwrap(),
            text(&case["rendered"]),
            "{case}"
        );
    }
}

#[test]
fn kwargs_must_be_variables_the_template_reads_and_not_the_servers() {
    let source = "{{ enable_thinking }}{% for m in messages %}{{ m.content }}{% endfor %}";
    let t = ChatTemplate::new(source.into(), String::new(), String::new()).unwrap();
    let kwargs = |v: serde_json::Value| match v {
        serde_json::Value::Object(map) => map,
        _ => unreachable!(),
    };
    assert!(t
        .check_kwargs(&kwargs(serde_json::json!({"enable_thinking": false})))
        .is_ok());
    let err = t
        .check_kwargs(&kwargs(serde_json::json!({"thinking": false})))
        .unwrap_err();
    assert_eq!(
        err.message(),
        "`chat_template_kwargs.thinking`: the model's chat template does not read it; \
         it reads [\"enable_thinking\"]"
    );
    let err = t
        .check_kwargs(&kwargs(serde_json::json!({"messages": []})))
        .unwrap_err();
    assert_eq!(
        err.message(),
        "`chat_template_kwargs.messages` is set by the server"
    );
    // Read by nearly every template, but the server's: it was silently overridden.
    let err = t
        .check_kwargs(&kwargs(serde_json::json!({"add_generation_prompt": false})))
        .unwrap_err();
    assert_eq!(
        err.message(),
        "`chat_template_kwargs.add_generation_prompt` is set by the server"
    );
}

#[test]
fn tools_and_kwargs_reach_the_template() {
    let source = "{% if tools %}{{ tools | length }} tools;{% endif %}[{{ enable_thinking }}]\
        {% for m in messages %}{{ m.content }}{% endfor %}";
    let t = ChatTemplate::new(source.into(), String::new(), String::new()).unwrap();
    assert!(t.supports_tools());
    let tools = serde_json::json!([{"type": "function"}]);
    let serde_json::Value::Object(kwargs) = serde_json::json!({"enable_thinking": false}) else {
        unreachable!()
    };
    let extras = RenderExtras {
        tools: Some(&tools),
        kwargs: Some(&kwargs),
    };
    let messages = [msg("user", "hi")];
    assert_eq!(
        t.render_with(&messages, &extras).unwrap(),
        "1 tools;[False]hi"
    );
    assert_eq!(t.render(&messages).unwrap(), "[]hi");
    let plain = ChatTemplate::new("{{ messages }}".into(), String::new(), String::new()).unwrap();
    assert!(!plain.supports_tools());
}

/// router/tests/data/tool_template_vectors.json: conversations with tools, calls and results
/// rendered by transformers with a Qwen 2.5-style template (tool_template_vectors.py):
/// `tojson` must write JSON as Python's `json.dumps` does (", " and ": ", no HTML escapes,
/// keys in their order).
#[test]
fn tool_templates_render_like_transformers() {
    let path = format!(
        "{}/tests/data/tool_template_vectors.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let data: Json = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let source = data["template"].as_str().unwrap().to_string();
    let t = ChatTemplate::new(source, String::new(), String::new()).unwrap();
    assert!(t.supports_tools());
    for case in data["cases"].as_array().unwrap() {
        let messages: Vec<TemplateMessage> = case["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| TemplateMessage {
                tool_call_id: m["tool_call_id"].as_str().map(str::to_string),
                tool_calls: m["tool_calls"].as_array().cloned(),
                ..msg(m["role"].as_str().unwrap(), m["content"].as_str().unwrap())
            })
            .collect();
        let tools = Some(&case["tools"]).filter(|t| !t.is_null());
        let extras = RenderExtras {
            tools,
            kwargs: None,
        };
        assert_eq!(
            t.render_with(&messages, &extras).unwrap(),
            case["rendered"].as_str().unwrap(),
            "{case}"
        );
    }
}
