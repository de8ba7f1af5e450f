"""Tool calling through the official `openai` client against a real router + worker serving
the default model (SmolLM2-135M-Instruct, whose template has no tool support: the default
rendering puts the tools in the system prompt in Hermes' `<tool_call>` format). Forced
choices (`required`, a named function) are decoded under a grammar, so at temperature 1 on
several seeds their calls parse and their arguments validate against the tool's schema;
streamed calls assemble to the same; a conversation with a `tool` result turn is answered;
bad tool fields are 400s naming the field."""

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest

from tests.e2e.conftest import Server, start_router, stop_router

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 12},
                          "unit": {"enum": ["celsius", "fahrenheit"]},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "unit", "days"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 8}},
        "required": ["timezone"], "additionalProperties": False}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "Time in a zone",
                                      "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK: list[Any] = [{"role": "user", "content": "What will the weather be in Paris this week?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def _chat(server: Server, **kwargs: Any) -> Any:
    args = {"model": MODEL, "messages": ASK, "tools": TOOLS, "temperature": 1.0,
            "max_tokens": 100, **kwargs}
    return server.client().chat.completions.create(**args)


def _check_calls(calls: list[tuple[str, str]], names: set[str]) -> None:
    assert calls
    for name, arguments in calls:
        assert name in names, name
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])


@pytest.mark.parametrize("choice, parallel", [(NAMED, True), ("required", False)])
def test_forced_choices_give_calls_that_validate(server: Server, choice: Any,
                                                 parallel: bool) -> None:
    names = {"get_weather"} if choice == NAMED else set(SCHEMAS)
    for seed in range(3):
        resp = _chat(server, seed=seed, tool_choice=choice, parallel_tool_calls=parallel)
        c = resp.choices[0]
        assert c.finish_reason == "tool_calls", c
        assert c.message.content is None
        calls = c.message.tool_calls or []
        assert len(calls) == 1
        assert calls[0].type == "function" and calls[0].id.startswith("call_")
        _check_calls([(t.function.name, t.function.arguments) for t in calls], names)


def test_streamed_calls_assemble_to_the_whole_answer(server: Server) -> None:
    args = {"seed": 11, "tool_choice": "required"}
    whole = _chat(server, **args).choices[0].message.tool_calls or []
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in _chat(server, stream=True, **args):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            assert not choice.delta.content
            for d in choice.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += d.id or ""
                call["name"] += (d.function.name or "") if d.function else ""
                call["arguments"] += (d.function.arguments or "") if d.function else ""
    assert finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == [
        (t.function.name, t.function.arguments) for t in whole]
    assert all(c["id"].startswith("call_") for c in calls.values())
    _check_calls([(c["name"], c["arguments"]) for c in calls.values()], set(SCHEMAS))


def test_strict_tools_under_auto_give_only_valid_calls(server: Server) -> None:
    # `strict: true` under `auto`: free text, but any call holds to its schema.
    strict = [{**t, "function": {**t["function"], "strict": True}} for t in TOOLS]
    for seed in range(3):
        c = _chat(server, seed=seed, tools=strict, tool_choice="auto").choices[0]
        calls = c.message.tool_calls or []
        if calls:
            assert c.finish_reason == "tool_calls", c
            _check_calls([(t.function.name, t.function.arguments) for t in calls], set(SCHEMAS))
        else:
            assert c.message.content and c.finish_reason in ("stop", "length"), c


def test_a_forced_call_cut_before_its_name_leaves_no_markup_in_content(server: Server) -> None:
    """`max_tokens` ends the output inside `<tool_call>`: under a forced choice the grammar
    allows only calls, so the cut opening is neither a call nor content, streamed or not."""
    for max_tokens in (2, 4):
        whole = _chat(server, tool_choice="required", max_tokens=max_tokens, temperature=0)
        c = whole.choices[0]
        assert c.finish_reason == "length" and not c.message.tool_calls, c
        assert not c.message.content, c
        chunks = _chat(server, tool_choice="required", max_tokens=max_tokens, temperature=0,
                       stream=True)
        deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
        assert not "".join(d.content or "" for d in deltas), deltas
        assert not any(d.tool_calls for d in deltas), deltas


def test_a_conversation_with_a_tool_result_is_answered(server: Server) -> None:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather",
                         "arguments": '{"city": "Paris", "unit": "celsius", "days": 1}'}}
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": '{"forecast": "sunny, 24 C"}'}]
    for choice in ("auto", "none"):
        resp = _chat(server, messages=messages, tool_choice=choice, temperature=0, max_tokens=30)
        c = resp.choices[0]
        assert c.finish_reason in ("stop", "length", "tool_calls"), c
        assert (c.message.content or c.message.tool_calls), c
        if choice == "none":
            assert c.message.tool_calls is None and c.message.content


@pytest.mark.parametrize("kwargs, param, words", [
    ({"tool_choice": {"type": "function", "function": {"name": "get_stock"}}}, "tool_choice",
     ["get_stock", "not in `tools`"]),
    ({"tool_choice": "sometimes"}, "tool_choice", ["`tool_choice` must be", "sometimes"]),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters":
                                                   {"type": "objekt"}}}]},
     "tools", ["`tools[0].function.parameters`", "objekt"]),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools",
     ["`tools[0].function.name`"]),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice",
     ["structured output"]),
    ({"extra_body": {"chat_template_kwargs": {"messages": []}}}, "chat_template_kwargs",
     ["`chat_template_kwargs.messages`"]),
    ({"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}},
     "chat_template_kwargs", ["`chat_template_kwargs.enable_thinking`", "does not read it"]),
])
def test_bad_tool_fields_are_400s_naming_the_field(server: Server, kwargs: dict, param: str,
                                                   words: list[str]) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        _chat(server, **kwargs)
    body: Any = e.value.body
    assert body["param"] == param, body
    for word in words:
        assert word in body["message"], body


@pytest.fixture(scope="module")
def parsers_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A router whose outputs are read as DeepSeek-R1 reasoning and Llama 3 JSON calls."""
    server = start_router(tmp_path_factory.mktemp("parsers"), "--reasoning-parser",
                          "deepseek-r1", "--tool-call-parser", "llama3")
    yield server
    stop_router(server)


def test_reasoning_parser_fills_reasoning_content(parsers_server: Server) -> None:
    # DeepSeek-R1's outputs start inside the reasoning; this model never closes it, so the
    # whole output is reasoning, streamed as delta.reasoning_content.
    args = {"model": MODEL, "messages": ASK, "temperature": 0, "max_tokens": 16}
    whole = parsers_server.client().chat.completions.create(**args)  # type: ignore[call-overload]
    message: Any = whole.choices[0].message
    assert message.reasoning_content and message.content == ""
    pieces = []
    for chunk in parsers_server.client().chat.completions.create(
            stream=True, **args):  # type: ignore[call-overload]
        for choice in chunk.choices:
            delta: Any = choice.delta
            assert not delta.content
            pieces.append(getattr(delta, "reasoning_content", None) or "")
    assert "".join(pieces) == message.reasoning_content


def test_forced_calls_wait_for_the_thought(parsers_server: Server) -> None:
    # With a reasoning parser, a forced call's grammar (here Llama 3 JSON) applies after
    # `</think>`; this model never ends its thought, so all it writes is reasoning, not a call
    # forced into the thought (tests/worker/constrain/test_reasoning_grammar.py: the answer
    # after a thought).
    resp = _chat(parsers_server, temperature=0, tool_choice=NAMED, max_tokens=24)
    c = resp.choices[0]
    message: Any = c.message
    assert c.finish_reason == "length" and not c.message.tool_calls, c
    assert message.reasoning_content and message.content == "", c
