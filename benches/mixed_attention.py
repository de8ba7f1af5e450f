"""Could a capped mixed step's attention run faster split in two, the decode rows on our
whole-KV Triton kernel and the prompt rows on FA2, each in its own stream of one CUDA graph?

The mixed-step graphs (attention/mixed_graph.py) run the whole step as one FA2 launch. In
decode-only steps our kernel reads the KV 2-4% faster than FlashInfer's; in the mixed
steps' fit (RESULTS.md, eleventh session) the KV costs ~5% more than in the decode graphs.
This bench takes the offline workload's steps under lof:8192:256 (schedule_model.schedule:
the decodes' KV lengths and the prompt chunks), builds one layer's paged KV for them (page
16, shuffled pages) and times, each as a CUDA graph replayed back to back:

- fa2: the worker's MixedGraphAttention over the step, padded to 256 rows (what runs now);
- triton-decodes: WholeKVDecode over the decode rows alone;
- fa2-prompts: MixedGraphAttention over the prompt rows alone (a graph of that many rows);
- both, one stream: triton-decodes then fa2-prompts;
- both, two streams: fa2-prompts forked onto a second stream beside triton-decodes;
- prompts at high priority: the same, the second stream of high priority (a graph keeps
  each node's priority, so its CTAs are dispatched ahead of the decodes' waiting ones).

and checks the split outputs against fa2's.

    python benches/mixed_attention.py [--layout qwen3-0.6b|llama-3.1-8b] [--steps 200,400,700]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from minisgl_worker.attention.flashinfer_backend import paged_kv_meta
from minisgl_worker.attention.flashinfer_kernels import FlashInferPagedAttention
from minisgl_worker.attention.mixed_graph import MixedGraphAttention
from minisgl_worker.attention.triton_decode import WholeKVDecode

sys.path.insert(0, str(Path(__file__).parent))
from decode_step import median_ms
from offline import step_budget
from schedule_model import schedule
from stream_overlap import capture

DEV, BF16, PAGE, ROWS = torch.device("cuda"), torch.bfloat16, 16, 256
LAYOUTS = {"qwen3-0.6b": (16, 8, 128), "llama-3.1-8b": (32, 8, 128)}


class Step:
    """One step's requests in one layer's pool: decodes first, then prompt chunks (as the
    scheduler orders a batch), each request a page-table row of shuffled pages."""

    def __init__(self, decode_kv: list[int], chunks: list[tuple[int, int]], hkv: int, d: int):
        self.decode_kv = decode_kv
        self.kv_lens = decode_kv + [before + n for before, n in chunks]
        self.q_lens = [1] * len(decode_kv) + [n for _, n in chunks]
        pages = [-(-n // PAGE) for n in self.kv_lens]
        num_pages = sum(pages) + 1  # + the dummy page, last
        self.dummy_page = num_pages - 1
        self.k = torch.randn(num_pages, PAGE, hkv, d, dtype=BF16, device=DEV)
        self.v = torch.randn_like(self.k)
        perm = torch.randperm(num_pages - 1)
        width = max(pages) * PAGE
        self.table = torch.zeros(len(pages), width, dtype=torch.int32)
        first = 0
        for row, n in enumerate(pages):
            own = perm[first : first + n]
            first += n
            slots = own[:, None] * PAGE + torch.arange(PAGE)
            self.table[row, : n * PAGE] = slots.flatten().to(torch.int32)
        self.table = self.table.to(DEV)
        self.max_pages = max(pages)


def graph_time(fn, replays: int = 50, trials: int = 5) -> float:
    """Median us of one call of fn, captured in a CUDA graph and replayed back to back
    (`trials` timings of `replays` replays each)."""
    g = capture(fn)
    return median_ms(lambda: [g.replay() for _ in range(replays)], trials) * 1e3 / replays


def bench_step(step: Step, hq: int, hkv: int, d: int) -> dict[str, float]:
    n_dec, rows = len(step.decode_kv), sum(step.q_lens)
    n_req = len(step.kv_lens)
    attn = FlashInferPagedAttention(hq, hkv, d, PAGE, BF16, DEV)
    prompt_rows = rows - n_dec
    mixed = MixedGraphAttention(attn, step.table, [ROWS, max(prompt_rows, 1)],
                                step.dummy_page, step.max_pages)
    meta = paged_kv_meta(step.table, list(range(n_dec)), step.decode_kv, [1] * n_dec, PAGE)
    whole = WholeKVDecode(n_dec, hq, hkv, d, PAGE, d**-0.5, meta.kv_indices)
    whole.plan(meta.kv_indptr, meta.kv_last_page_len)
    q = torch.randn(ROWS, hq, d, dtype=BF16, device=DEV)
    out_all = torch.empty_like(q)
    out_split = torch.empty_like(q)
    side = torch.cuda.Stream(DEV)
    urgent = torch.cuda.Stream(DEV, priority=-1)  # high: its CTAs are dispatched first

    def plan_all() -> None:
        mixed.plan(ROWS, list(range(n_req)), step.kv_lens, step.q_lens)

    def plan_prompts() -> None:
        mixed.plan(max(prompt_rows, 1), list(range(n_dec, n_req)), step.kv_lens[n_dec:],
                   step.q_lens[n_dec:])

    def fa2() -> None:
        attn.run(q, step.k, step.v, out=out_all)

    def decodes() -> None:
        whole.run(q[:n_dec], (step.k, step.v), out=out_split[:n_dec])

    def prompts() -> None:
        attn.run(q[n_dec:rows], step.k, step.v, out=out_split[n_dec:rows])

    def two_streams(stream: torch.cuda.Stream = side) -> None:
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            prompts()
        decodes()
        torch.cuda.current_stream().wait_stream(stream)

    times = {}
    plan_all()
    times["fa2"] = graph_time(fa2)
    times["triton-decodes"] = graph_time(decodes)
    plan_prompts()
    times["fa2-prompts"] = graph_time(prompts)
    times["both, one stream"] = graph_time(lambda: (decodes(), prompts()))
    times["both, two streams"] = graph_time(two_streams)
    times["prompts at high priority"] = graph_time(lambda: two_streams(urgent))
    torch.cuda.synchronize()
    ref = out_all[:rows].float()
    err = float((out_split[:rows].float() - ref).norm() / ref.norm())
    times["error"] = err
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layout", default="qwen3-0.6b", choices=list(LAYOUTS))
    p.add_argument("--steps", default="200,400,700")
    args = p.parse_args()
    hq, hkv, d = LAYOUTS[args.layout]
    wanted = [int(s) for s in args.steps.split(",")]
    steps = {i: s for i, s in enumerate(schedule(step_budget("lof:8192:256", 8192)))
             if i in wanted}
    names = ["fa2", "triton-decodes", "fa2-prompts", "both, one stream", "both, two streams",
             "prompts at high priority"]
    print(f"{args.layout}, lof:8192:256 steps, one layer, us (median of 5 x 50 replays)")
    print("| step | decodes | KV tokens | prompt rows | " + " | ".join(names)
          + " | high priority / fa2 | error vs fa2 |")
    print("| ---: " * 4 + "| ---: " * len(names) + "| ---: | ---: |")
    for i, s in sorted(steps.items()):
        torch.manual_seed(i)
        step = Step(s.decode_kv, s.chunks, hkv, d)
        t = bench_step(step, hq, hkv, d)
        cells = " | ".join(f"{t[n]:.1f}" for n in names)
        print(f"| {i} | {len(s.decode_kv)} | {sum(step.kv_lens)} | "
              f"{sum(n for _, n in s.chunks)} | {cells} | "
              f"{t['prompts at high priority'] / t['fa2']:.3f} | {t['error']:.1e} |")
        del step
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
