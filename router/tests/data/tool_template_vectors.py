"""Writes tool_template_vectors.json: conversations with tools, calls and tool results
rendered by transformers' `apply_chat_template` with a Qwen 2.5-style template (the shape of
Hugging Face templates with tool support: `tools` and `tool_call.arguments` through `tojson`),
the reference that router/src/text/chat_template.rs must match byte for byte.

Run once after the template or the conversations change:
    PYTHONPATH=python .venv/bin/python router/tests/data/tool_template_vectors.py
"""

import json
from pathlib import Path

from minisgl_worker.default_model import ensure_default_model
from transformers import AutoTokenizer

TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- elif messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather <forecast> & 'now', in °C",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string"},
                                      "days": {"type": "integer", "minimum": 1}},
                       "required": ["city"]}}},
    {"type": "function", "function": {"name": "ping"}},
]

CASES = [
    {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS},
    {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Zürich and ping?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"days": 2, "city": "Zürich"}}},
            {"id": "call_2", "type": "function", "function": {"name": "ping", "arguments": {}}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
        {"role": "tool", "tool_call_id": "call_2", "content": "pong"},
    ], "tools": TOOLS},
    {"messages": [{"role": "system", "content": "No tools."},
                  {"role": "user", "content": "Hi"}], "tools": None},
]


def main() -> None:
    tok = AutoTokenizer.from_pretrained(ensure_default_model())
    cases = [{**case, "rendered": tok.apply_chat_template(
        case["messages"], tools=case["tools"], chat_template=TEMPLATE, tokenize=False,
        add_generation_prompt=True)} for case in CASES]
    out = Path(__file__).with_name("tool_template_vectors.json")
    out.write_text(json.dumps({"template": TEMPLATE, "cases": cases}, indent=1,
                              ensure_ascii=False) + "\n")
    print(f"wrote {len(cases)} cases to {out}")


if __name__ == "__main__":
    main()
