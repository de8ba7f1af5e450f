"""Request sets for benches/online.py, generated locally from a seed (nothing downloaded):
the same seed and tokenizer give every system the same prompts, byte for byte.

- random: input and output lengths uniform in [L * (1 - r), L * (1 + r)] (vllm's
  --random-range-ratio r). Prompt text is random token ids decoded (`ids`: re-encoded and
  corrected until it is exactly the drawn length, as vllm's random dataset does) or random
  English words (`words`: with a tokenizer, the most words that stay within the length;
  each request records its true count).
- shared-prefix: `groups` system prompts of `system_len` tokens; each request is one of
  them (round-robin, then shuffled) and a question of its own, as a chat app's traffic.
- sharegpt: log-normal input and output lengths (medians and sigmas are flags, clipped to
  [4, max]): the long-tailed mix of ShareGPT conversations, without the data.

Token counts need the serving model's tokenizer (`tokenizers`' tokenizer.json). Without
one, prompts are words and a word stands for a token (the server's usage, when it sends
it, gives the true count)."""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass

import numpy as np

WORDS = (
    "time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child", "world",
    "school", "state", "family", "student", "group", "country", "problem", "hand", "part",
    "place", "case", "week", "company", "system", "program", "question", "work", "government",
    "number", "night", "point", "home", "water", "room", "mother", "area", "money", "story",
    "fact", "month", "lot", "right", "study", "book", "eye", "job", "word", "business", "issue",
    "side", "kind", "head", "house", "service", "friend", "father", "power", "hour", "game",
    "line", "end", "member", "law", "car", "city",
)


@dataclass
class Request:
    messages: list[dict[str, str]]  # the chat form (system prompt first, if any)
    prompt_len: int  # tokens of `text` (words, without a tokenizer)
    output_len: int

    @property
    def text(self) -> str:  # the completions form: the messages' contents, space-joined
        return " ".join(m["content"] for m in self.messages)


class PromptMaker:
    """Random text of an exact token length under `tokenizer` (a tokenizers.Tokenizer)."""

    def __init__(self, tokenizer, kind: str, rng: random.Random) -> None:
        if kind not in ("ids", "words"):
            raise ValueError(f"--prompt-kind must be ids or words; got {kind!r}")
        if kind == "ids" and tokenizer is None:
            raise ValueError("--prompt-kind ids needs --tokenizer")
        self.tok, self.kind, self.rng = tokenizer, kind, rng
        if tokenizer is not None:
            special = set(tokenizer.get_added_tokens_decoder())
            self.ids = [i for i in range(tokenizer.get_vocab_size()) if i not in special]

    def count(self, text: str) -> int:
        if self.tok is None:
            return len(text.split())
        return len(self.tok.encode(text, add_special_tokens=False).ids)

    def make(self, n: int) -> tuple[str, int]:
        """(text, its token count): n tokens, or as close as 10 corrections get."""
        if self.kind == "words":
            return self._words(n)
        ids = [self.rng.choice(self.ids) for _ in range(n)]
        text = self.tok.decode(ids)
        for _ in range(10):
            ids = self.tok.encode(text, add_special_tokens=False).ids
            if len(ids) == n:
                break
            ids = ids[:n] + [self.rng.choice(self.ids) for _ in range(n - len(ids))]
            text = self.tok.decode(ids)
        return text, self.count(text)

    def _words(self, n: int) -> tuple[str, int]:
        words = [self.rng.choice(WORDS) for _ in range(n)]
        lo, hi = 1, n  # the most words whose text has at most n tokens (monotone in words)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.count(" ".join(words[:mid])) <= n else (lo, mid - 1)
        text = " ".join(words[:lo])
        return text, self.count(text)


def uniform_lengths(rng: random.Random, n: int, length: int, ratio: float) -> list[int]:
    if not 0 <= ratio < 1:
        raise ValueError(f"--range-ratio must be in [0, 1); got {ratio}")
    lo, hi = max(1, int(length * (1 - ratio))), int(length * (1 + ratio))
    return [rng.randint(lo, hi) for _ in range(n)]


def random_set(maker: PromptMaker, n: int, input_len: int, output_len: int,
               ratio: float) -> list[Request]:
    ins = uniform_lengths(maker.rng, n, input_len, ratio)
    outs = uniform_lengths(maker.rng, n, output_len, ratio)
    reqs = []
    for i, o in zip(ins, outs):
        text, count = maker.make(i)
        reqs.append(Request([{"role": "user", "content": text}], count, o))
    return reqs


def shared_prefix_set(maker: PromptMaker, n: int, groups: int, system_len: int,
                      question_len: int, output_len: int) -> list[Request]:
    if groups < 1:
        raise ValueError(f"--groups must be >= 1; got {groups}")
    systems = [maker.make(system_len)[0] for _ in range(groups)]
    reqs = []
    for i in range(n):
        question, _ = maker.make(question_len)
        messages = [{"role": "system", "content": systems[i % groups]},
                    {"role": "user", "content": question}]
        req = Request(messages, 0, output_len)
        req.prompt_len = maker.count(req.text)
        reqs.append(req)
    maker.rng.shuffle(reqs)
    return reqs


def lognormal_lengths(rng: np.random.Generator, n: int, median: float, sigma: float,
                      cap: int) -> list[int]:
    return [int(x) for x in np.clip(rng.lognormal(np.log(median), sigma, n), 4, cap)]


def sharegpt_set(maker: PromptMaker, n: int, seed: int, in_median: float, in_sigma: float,
                 out_median: float, out_sigma: float, in_max: int,
                 out_max: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    ins = lognormal_lengths(rng, n, in_median, in_sigma, in_max)
    outs = lognormal_lengths(rng, n, out_median, out_sigma, out_max)
    reqs = []
    for i, o in zip(ins, outs):
        text, count = maker.make(i)
        reqs.append(Request([{"role": "user", "content": text}], count, o))
    return reqs


def fingerprint(reqs: list[Request]) -> str:
    """sha256 of the prompts and output lengths: equal for two systems that got the same."""
    blob = json.dumps([[r.messages, r.output_len] for r in reqs], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
