"""Structured outputs through the official `openai` client and /generate, against a real
router + worker serving the default model: sampled outputs follow their schema, regex or
choice list; free greedy requests beside constrained ones keep their text; bad schemas and
regexes are 400s naming the problem."""

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import jsonschema
import openai
import pytest
import requests
from pydantic import BaseModel, Field

from tests.e2e.conftest import Server

MODEL = "SmolLM2-135M-Instruct"
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6},
                 "minItems": 1, "maxItems": 2},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8},
                           "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "role", "tags", "address"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe a user of our system as JSON."}]


def _schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema,
                                                   "strict": True}}


def test_json_schema_outputs_validate_at_temperature_one(server: Server) -> None:
    def one(seed: int) -> tuple[str, str | None]:
        resp = server.client().chat.completions.create(
            model=MODEL, messages=ASK, temperature=1.0, seed=seed, max_tokens=80,
            response_format=_schema_format(PERSON))  # type: ignore[arg-type]
        return resp.choices[0].message.content or "", resp.choices[0].finish_reason
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(one, range(3)))
    for text, finish in results:
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), PERSON)
    assert len({text for text, _ in results}) > 1  # sampled, not one forced answer


def test_json_schema_stream_equals_the_whole_answer(server: Server) -> None:
    args = {"model": MODEL, "messages": ASK, "temperature": 1.0, "seed": 7, "max_tokens": 80,
            "response_format": _schema_format(PERSON)}
    whole = server.client().chat.completions.create(**args)  # type: ignore[call-overload]
    chunks = server.client().chat.completions.create(
        stream=True, **args)  # type: ignore[call-overload]
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    jsonschema.validate(json.loads(streamed), PERSON)


def test_objects_that_list_their_keys_take_only_those(server: Server) -> None:
    """As XGrammar's strict mode reads schemas: no `additionalProperties` is false (JSON
    Schema would allow any key, and this model then adds keys to most answers)."""
    city = {"type": "object", "required": ["city"],
            "properties": {"city": {"type": "string", "maxLength": 12},
                           "population": {"type": "integer"}}}
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}
    client = server.client()
    def answer(seed: int) -> str:
        resp = client.chat.completions.create(
            model=MODEL, temperature=1.0, seed=seed, max_tokens=60,
            messages=[{"role": "user", "content": "Tell me about Paris as JSON."}],
            response_format=_schema_format(city))  # type: ignore[arg-type]
        return resp.choices[0].message.content or ""
    def arguments(seed: int) -> str:
        resp = client.chat.completions.create(
            model=MODEL, temperature=1.0, seed=seed, max_tokens=60, tools=[tool],  # type: ignore[list-item]
            messages=[{"role": "user", "content": "call f"}], tool_choice="required")
        return resp.choices[0].message.tool_calls[0].function.arguments  # type: ignore[index, union-attr]
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(answer, range(6)))
        calls = list(pool.map(arguments, range(1, 5)))
    for text in answers:
        assert set(json.loads(text)) <= {"city", "population"}, text
    for args in calls:
        assert set(json.loads(args)) == {"a"}, args


class _Address(BaseModel):
    city: str = Field(max_length=10)
    zip: str | None = Field(max_length=6)


class _Person(BaseModel):
    name: str = Field(max_length=10)
    role: Literal["admin", "user"]
    address: _Address


class _GetWeather(BaseModel):
    city: str = Field(max_length=10)
    unit: Literal["c", "f"]


def test_the_clients_pydantic_helpers_get_parsed_objects(server: Server) -> None:
    """`chat.completions.parse` sends the client's strict schema of a pydantic model
    (`$defs`, `$ref`, nullable fields) and parses the answer into it; a
    `pydantic_function_tool` is a strict tool whose arguments parse the same way."""
    client = server.client()
    for seed in range(2):
        resp = client.chat.completions.parse(
            model=MODEL, messages=[{"role": "user", "content": "A person as JSON"}],
            response_format=_Person, temperature=1.0, seed=seed, max_tokens=100)
        assert resp.choices[0].finish_reason == "stop", resp
        assert isinstance(resp.choices[0].message.parsed, _Person)
    resp = client.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[openai.pydantic_function_tool(_GetWeather)], tool_choice="required",
        parallel_tool_calls=False, temperature=1.0, seed=1, max_tokens=100)
    calls = resp.choices[0].message.tool_calls or []
    assert calls and isinstance(calls[0].function.parsed_arguments, _GetWeather), resp


def test_json_object_outputs_parse(server: Server) -> None:
    for seed in range(2):
        resp = server.client().chat.completions.create(
            model=MODEL, temperature=1.0, seed=seed, max_tokens=120,
            messages=[{"role": "user", "content": "Give me a small JSON object about a cat."}],
            response_format={"type": "json_object"})
        content = resp.choices[0].message.content or ""
        if resp.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(content), dict), content
        else:  # cut by max_tokens: still a prefix of an object
            assert content.startswith("{"), content


def test_completions_take_response_format_too(server: Server) -> None:
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
              "required": ["answer"], "additionalProperties": False}
    resp = server.client().completions.create(
        model=MODEL, prompt="Is the sky blue? Answer in JSON:", max_tokens=30, temperature=0,
        extra_body={"response_format": _schema_format(schema)})
    assert resp.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(resp.choices[0].text), schema)


def test_greedy_free_requests_beside_constrained_ones_keep_their_text(server: Server) -> None:
    questions = ["What is the capital of France?", "Name three colors.", "What is 2 + 2?"]
    def free(q: str) -> str:
        resp = server.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": q}], temperature=0,
            max_tokens=24)
        return resp.choices[0].message.content or ""
    def constrained(seed: int) -> str:
        resp = server.client().chat.completions.create(
            model=MODEL, messages=ASK, temperature=1.0, seed=seed, max_tokens=40,
            response_format=_schema_format(PERSON))
        return resp.choices[0].message.content or ""
    alone = [free(q) for q in questions]
    with ThreadPoolExecutor(6) as pool:
        mixed = [pool.submit(constrained, s) for s in range(3)]
        beside = list(pool.map(free, questions))
        for m in mixed:
            m.result()
    assert beside == alone


def test_regex_and_choice_constrain_generate(server: Server) -> None:
    def generate(sampling: dict) -> dict:
        r = requests.post(f"{server.base_url}/generate", timeout=300, json={
            "text": "<|im_start|>user\nGive me a product code.<|im_end|>\n<|im_start|>assistant\n",
            "sampling_params": {"temperature": 1.0, "max_new_tokens": 24, **sampling}})
        assert r.status_code == 200, r.text
        return r.json()
    pattern = r"[A-Z]{3}-[0-9]{4}"
    for seed in range(3):
        out = generate({"regex": pattern, "seed": seed})
        assert re.fullmatch(pattern, out["text"]), out["text"]
        assert out["meta_info"]["finish_reason"] == "stop"
    choices = ["red", "green", "blue"]
    for seed in range(3):
        out = generate({"structured_outputs": {"choice": choices}, "seed": seed})
        assert out["text"] in choices, out["text"]
    out = generate({"ebnf": 'root ::= "yes" | "no"'})
    assert out["text"] in ("yes", "no")


def test_logprobs_of_tokens_a_grammar_masks_are_numbers(server: Server) -> None:
    """The mask leaves them -inf, which JSON cannot carry: they report vLLM's -9999.0."""
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")
    resp = client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=4, logprobs=True, top_logprobs=20,
        extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert resp.choices[0].message.content in ("yes", "no")
    tops = [t.logprob for c in resp.choices[0].logprobs.content for t in c.top_logprobs]
    assert all(isinstance(lp, float) for lp in tops), tops
    assert -9999.0 in tops and all(lp == -9999.0 or lp > -100 for lp in tops), tops


@pytest.mark.parametrize("fmt, words", [
    (_schema_format({"type": "objekt"}), ["invalid JSON schema at /type", "objekt"]),
    (_schema_format({"type": "array", "maxItems": "three"}), ["/maxItems", "three"]),
    ({"type": "yaml"}, ["`type` must be", "yaml"]),
])
def test_an_invalid_schema_is_a_400_naming_the_problem(
    server: Server, fmt: dict, words: list[str]
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        server.client().chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=8, response_format=fmt)  # type: ignore[arg-type]
    assert info.value.status_code == 400
    message = info.value.body["message"]  # type: ignore[index]
    assert all(w in message for w in words), message
    assert info.value.body["param"] == "response_format"  # type: ignore[index]


def test_invalid_regexes_and_grammars_are_400s(server: Server) -> None:
    r = requests.post(f"{server.base_url}/generate", timeout=60, json={
        "text": "x", "sampling_params": {"regex": "([0-9]+"}})
    assert r.status_code == 400 and "unclosed group" in r.json()["error"]["message"], r.text
    # The router cannot compile grammars; the worker refuses it with invalid_constraint,
    # and the 400 names the field the constraint came from.
    r = requests.post(f"{server.base_url}/generate", timeout=60, json={
        "text": "x", "sampling_params": {"ebnf": "root ::= undefined_rule"}})
    assert r.status_code == 400 and "undefined_rule" in r.json()["error"]["message"], r.text
    assert r.json()["error"]["param"] == "sampling_params.ebnf", r.text


def test_a_schema_the_grammar_engine_refuses_is_a_400_naming_its_field(server: Server) -> None:
    """Valid JSON Schema that llguidance does not implement (`not`) passes the router's
    metaschema check; the worker's refusal names the field, as the router's own do."""
    schema = {"type": "object", "not": {"required": ["a"]}}
    client = server.client()
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=8,
            response_format=_schema_format(schema))  # type: ignore[arg-type]
    body = info.value.body
    assert body["param"] == "response_format", body  # type: ignore[index]
    assert '"not"' in body["message"], body  # type: ignore[index]
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=8, tools=[tool],  # type: ignore[list-item]
            tool_choice="required")
    assert info.value.body["param"] == "tools", info.value.body  # type: ignore[index]
