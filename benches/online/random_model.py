"""A model folder for serving random weights in a real model's shape, that minisgl's router
(HF `tokenizers` + minijinja) and mini-sglang's server (transformers) read alike:

    python benches/random_model.py benches/models/qwen3-0.6b /tmp/models/qwen3-0.6b

It holds the shape's config.json and a word-level tokenizer over the model's whole
vocabulary (token i is the word `w{i}`, words split on whitespace, no special tokens),
whose chat template only joins the messages' contents with spaces. So a prompt of N random
tokens decoded is exactly N tokens under both servers, the chat and completions forms of a
request are the same tokens, every token a random-weight model emits decodes to one word,
and re-tokenizing an output counts its tokens exactly. The weights are the servers' own
random ones (`--load-format dummy`, `--dummy-weight`): nothing is downloaded or written
but these few files."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

CHAT_TEMPLATE = ("{% for message in messages %}{{ message['content'] }}"
                 "{% if not loop.last %} {% endif %}{% endfor %}")


def word_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def write_model(shape: Path, out: Path) -> Path:
    """shape: a folder with config.json (benches/models/NAME); out: the folder to write."""
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(shape / "config.json", out / "config.json")
    config = json.loads((out / "config.json").read_text())
    word_tokenizer(config["vocab_size"]).save(str(out / "tokenizer.json"))
    eos = config.get("eos_token_id", 0)
    eos = eos[0] if isinstance(eos, list) else eos
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
        "eos_token": f"w{eos}",
        "model_max_length": config.get("max_position_embeddings", 4096),
    }, indent=1))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("shape", type=Path, help="a folder with the shape's config.json")
    p.add_argument("out", type=Path)
    print(write_model(p.parse_args().shape, p.parse_args().out))


if __name__ == "__main__":
    main()
