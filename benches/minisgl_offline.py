"""mini-sglang's own offline benchmark (its benchmark/offline/bench.py), run from a copy of
its `python/` folder, side by side with ours in one device call:

    PYTHONPATH=.ref/python python benches/minisgl_offline.py --model benches/models/qwen3-0.6b

`.ref/` is git-ignored: copy mini-sglang's `python/` there (`fetch` sgl-project/mini-sglang);
its code is never committed. This script repeats its bench's settings (page size 256,
max_extend_tokens 16384, CUDA graphs to batch 256, max_seq_len 4096, bf16) and FlashInfer
attention (`attention_backend="fi"`, as in ../shared/GPU.md's anchor: its SM90 default pairs
FlashInfer with sgl_kernel's FA3, which cannot travel to the device), with its dummy
weights, on the config.json of a real shape. mini-sglang also loads a tokenizer (for its
warm-up prompt and the eos id) and none can be downloaded on the device: a two-word
tokenizer is written beside the config; the workload itself is token ids.

One timed run of the workload per process, after a warm-up on one short prompt: its
prefix cache is cold, as ours is at each of our repetitions (benches/offline.py empties
it). So each repetition is a fresh process (scripts/gpu-compare runs REF_REPEATS of them):
a second run in the same process would find three quarters of the prompt tokens cached
(../shared/GPU.md). Its first process on a machine is the slower one, so
benches/compare_table.py divides by its best run. Prints one line like its bench
and appends a JSON line to --json."""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from common import draw


def model_dir(config: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    d = Path(tempfile.mkdtemp(prefix="minisgl-ref-"))
    shutil.copy(config, d / "config.json")
    tok = Tokenizer(models.WordLevel({"<unk>": 0, "<eos>": 1, "Benchmark:": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>",
                            eos_token="<eos>").save_pretrained(d)
    return d


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="benches/models/qwen3-0.6b")
    p.add_argument("--json", help="append one JSON line of results to this file")
    args = p.parse_args()
    t0 = time.perf_counter()
    folder = model_dir(Path(args.model) / "config.json")
    try:
        run(folder, Path(args.model).name, t0, args.json)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run(folder: Path, name: str, t0: float, json_path: str | None) -> None:
    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    llm = LLM(str(folder), use_dummy_weight=True, max_seq_len_override=4096,
              max_extend_tokens=16384, cuda_graph_max_bs=256, page_size=256,
              attention_backend="fi")
    startup = time.perf_counter() - t0
    prompts, output_lens = draw(256)  # the requests benches/offline.py gives ours
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=m)
              for m in output_lens]
    t = time.perf_counter()
    llm.generate(["Benchmark: "], SamplingParams(temperature=0.1))  # its flashinfer warm-up
    warmup = time.perf_counter() - t
    t = time.perf_counter()
    llm.generate(prompts, params)
    seconds = time.perf_counter() - t
    tokens = sum(sp.max_tokens for sp in params)
    print(f"mini-sglang {name}: startup {startup:.1f} s, warm-up {warmup:.1f} s; "
          f"Total: {tokens}tok, Time: {seconds:.2f}s, Throughput: {tokens / seconds:.2f}tok/s")
    if json_path:
        with open(json_path, "a") as f:
            f.write(json.dumps({"engine": "mini-sglang", "model": name, "output_tokens": tokens,
                                "seconds": round(seconds, 3),
                                "tok_s": round(tokens / seconds, 1),
                                "startup_s": round(startup, 1)}) + "\n")


if __name__ == "__main__":
    main()
