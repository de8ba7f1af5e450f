"""The soak's clients (benches/online/soak.py): each loops over the request kinds its
docstring lists and tallies what came back."""

from __future__ import annotations

import argparse
import json
import random
import re
import threading
import time
from collections import Counter

import requests

PROMPTS = ["Tell me about the sea.", "What is 2 + 2?", "Write a haiku about rain.",
           "Name three colours.", "Why is the sky blue?", "Describe a cat in one sentence."]
BAD_BODIES = [  # (body or raw bytes, what it breaks)
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, "type"),
    ({"messages": [{"role": "user", "content": "hi"}], "frobnicate": 1}, "unknown field"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}, "range"),
    (b'{"messages": [{"role": "user", "content": "hi"', "truncated"),
    ({"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}, "model"),
]

WORDS = r"[a-z]{1,8}( [a-z]{1,8}){0,3}"


def _number(content: str, _calls: list[str]) -> bool:
    return isinstance(json.loads(content)["n"], int)


def _words(content: str, _calls: list[str]) -> bool:
    return re.fullmatch(WORDS, content) is not None


def _lookups(_content: str, calls: list[str]) -> bool:
    return bool(calls) and all(isinstance(json.loads(a)["q"], str) for a in calls)


CONSTRAINTS = [  # (the request's constraint, the finish_reason and the answer it must give)
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {
        "type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                               "maximum": 999}},
        "required": ["n"], "additionalProperties": False}}}}, "stop", _number),
    ({"structured_outputs": {"regex": WORDS}}, "stop", _words),
    ({"tools": [{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"q": {"type": "string", "maxLength": 12}},
        "required": ["q"]}}}], "tool_choice": "required"}, "tool_calls", _lookups),
]


class Load:
    """The clients' loop and its tally (kind -> outcomes; unexpected failures with why)."""

    def __init__(self, url: str, model: str, args: argparse.Namespace, deadline: float):
        self.url, self.model, self.args, self.deadline = url, model, args, deadline
        self.outcomes: Counter[str] = Counter()
        self.failures: list[str] = []
        self.lock = threading.Lock()

    def count(self, outcome: str, failure: str | None = None) -> None:
        with self.lock:
            self.outcomes[outcome] += 1
            if failure is not None:
                self.failures.append(failure)

    def chat(self, rng: random.Random, stream: bool) -> dict:
        return {"model": self.model, "stream": stream, "temperature": rng.choice([0, 0.7]),
                "max_tokens": rng.randint(1, self.args.max_tokens),
                "messages": [{"role": "user", "content": rng.choice(PROMPTS)}]}

    def run(self, client: int) -> None:
        rng = random.Random(self.args.seed * 1000 + client)
        while time.monotonic() < self.deadline:
            kind = rng.choices(["stream", "whole", "cancel", "bad", "constrained"],
                               [30, 25, 15, 10, 20])[0]
            try:
                getattr(self, kind)(rng)
            except requests.RequestException as e:
                self.count(f"{kind}: error", f"{kind}: {type(e).__name__}: {e}")

    def stream(self, rng: random.Random) -> None:
        body = self.chat(rng, stream=True)
        with requests.post(f"{self.url}/v1/chat/completions", json=body, stream=True,
                           timeout=300) as r:
            if r.status_code != 200:
                return self.count("stream: status", f"stream: {r.status_code} {r.text[:200]}")
            lines = [line for line in r.iter_lines() if line]
        finished = any(b'"finish_reason":"' in line for line in lines)
        if lines[-1:] != [b"data: [DONE]"] or not finished or b'"error"' in b"".join(lines):
            return self.count("stream: dropped", f"stream: ended without a finish: {lines[-2:]}")
        self.count("stream: ok")

    def whole(self, rng: random.Random) -> None:
        body = {"model": self.model, "prompt": rng.choice(PROMPTS),
                "max_tokens": rng.randint(1, self.args.max_tokens), "temperature": 0}
        r = requests.post(f"{self.url}/v1/completions", json=body, timeout=300)
        if r.status_code != 200:
            return self.count("whole: status", f"whole: {r.status_code} {r.text[:200]}")
        choice = r.json()["choices"][0]
        if choice["finish_reason"] not in ("length", "stop"):
            return self.count("whole: finish", f"whole: finish_reason {choice}")
        self.count("whole: ok")

    def cancel(self, rng: random.Random) -> None:
        with requests.post(f"{self.url}/v1/chat/completions", json=self.chat(rng, True),
                           stream=True, timeout=300) as r:
            if r.status_code != 200:
                return self.count("cancel: status", f"cancel: {r.status_code} {r.text[:200]}")
            chunks = rng.randint(0, 3)
            for i, _ in enumerate(r.iter_lines()):
                if i >= chunks:
                    break
        self.count("cancel: ok")  # the connection closes here, mid-stream or before it

    def constrained(self, rng: random.Random) -> None:
        extra, want, followed = rng.choice(CONSTRAINTS)
        stream = rng.random() < 0.6
        body = {**self.chat(rng, stream), **extra, "max_tokens": 48}
        with requests.post(f"{self.url}/v1/chat/completions", json=body, stream=stream,
                           timeout=300) as r:
            if r.status_code != 200:
                return self.count("constrained: status", f"constrained: {r.status_code}")
            if stream and rng.random() < 0.3:
                chunks = rng.randint(0, 3)
                for i, _ in enumerate(r.iter_lines()):
                    if i >= chunks:
                        break
                return self.count("constrained: cancelled")
            finish, content, calls = answer(r, stream)
        if finish == "length":
            return self.count("constrained: length")
        try:
            ok = finish == want and followed(content, calls)
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            return self.count("constrained: broken",
                              f"constrained ({want}): {finish} {content!r} {calls}")
        self.count("constrained: ok")

    def bad(self, rng: random.Random) -> None:
        body, why = rng.choice(BAD_BODIES)
        if isinstance(body, bytes):
            r = requests.post(f"{self.url}/v1/chat/completions", data=body, timeout=60,
                              headers={"Content-Type": "application/json"})
        else:
            r = requests.post(f"{self.url}/v1/chat/completions", json={"model": self.model,
                              **body}, timeout=60)
        shaped = r.headers.get("content-type", "").startswith("application/json") and \
            "message" in r.json().get("error", {})
        if not 400 <= r.status_code < 500 or not shaped:
            return self.count("bad: status", f"bad ({why}): {r.status_code} {r.text[:200]}")
        self.count("bad: refused")


def answer(r: requests.Response, stream: bool) -> tuple[str | None, str, list[str]]:
    """A chat response, whole or streamed -> finish_reason, content, tool-call arguments."""
    if not stream:
        choice = r.json()["choices"][0]
        calls = choice["message"].get("tool_calls") or []
        return (choice["finish_reason"], choice["message"]["content"] or "",
                [c["function"]["arguments"] for c in calls])
    finish, content, args = None, "", {}
    for line in r.iter_lines():
        if not line.startswith(b"data: {"):
            continue
        for choice in json.loads(line[6:])["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                piece = call.get("function", {}).get("arguments") or ""
                args[call["index"]] = args.get(call["index"], "") + piece
            finish = choice.get("finish_reason") or finish
    return finish, content, [args[i] for i in sorted(args)]
