"""Writes chat_template_vectors.json: conversations rendered by transformers'
`apply_chat_template` with the default model's template (SmolLM2-135M-Instruct), the
reference that router/src/text/chat_template.rs must match byte for byte.

Run once after the default model or the conversations change:
    PYTHONPATH=python .venv/bin/python router/tests/data/chat_template_vectors.py
The JSON carries the template and special tokens too, so the Rust test needs no model cache.
"""

import json
from pathlib import Path

from minisgl_worker.default_model import ensure_default_model
from transformers import AutoTokenizer

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
    ],
    [
        {"role": "user", "content": "Count to three."},
        {"role": "assistant", "content": "One, two, three."},
        {"role": "user", "content": "Now backwards."},
    ],
    [{"role": "user", "content": "Ünïcödé: 日本語, emoji 🦀, RTL שלום"}],
    [{"role": "user", "content": "  leading and trailing spaces \n\n and blank lines\n"}],
    [{"role": "user", "content": ""}],
    [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Calling the tool."},
        {"role": "tool", "content": '{"temp": 21}'},
    ],
    [{"role": "user", "content": "Jinja-looking text: {{ x }} {% if %} <|im_end|> \\n"}],
    [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d"},
        {"role": "user", "content": "e"},
    ],
]


def main() -> None:
    folder = ensure_default_model()
    tok = AutoTokenizer.from_pretrained(folder)
    cases = [
        {
            "messages": messages,
            "rendered": tok.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            ),
        }
        for messages in CONVERSATIONS
    ]
    out = {
        "model": Path(folder).name,
        "template": tok.chat_template,
        "bos_token": tok.bos_token or "",
        "eos_token": tok.eos_token or "",
        "cases": cases,
    }
    path = Path(__file__).with_name("chat_template_vectors.json")
    path.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(cases)} cases to {path}")


if __name__ == "__main__":
    main()
