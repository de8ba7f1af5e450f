"""Does running two independent streams of a model's work at once beat running them one
after the other, on the H200? A feasibility check before building it into the engine:

- two-batch decode: a decode step split into two halves, each half's layer chain on its own
  stream inside one CUDA graph, either free-running or with the attentions alternating
  (half A's attention of layer i, then half B's, then A's of layer i + 1: while one half
  reads its KV the other runs its GEMMs and norms), against the whole batch on one stream;
- prefill beside decode: a graph of an 8,192-token prefill's GEMMs on one stream while
  decode steps replay on another, against the two one after the other.

The layer chain is the decoder's kernels without RoPE, qk-norm and the KV store (add-RMSNorm,
qkv GEMM, paged tensor-core decode attention, o_proj, add-RMSNorm, gate_up, SiLU-and-mul,
down); all layers read one KV pool (KV lengths uniform in [100, 2048], page 16; ~1 GB a
layer at batch 256, far above L2) and their own weights. CUDA-event medians of graph
replays. Usage: python benches/stream_overlap.py [--model benches/models/qwen3-0.6b ...]"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from minisgl_worker.attention.flashinfer_kernels import FlashInferPagedAttention
from minisgl_worker.layers import cuda_ops

sys.path.insert(0, str(Path(__file__).parent))
from decode_step import median_ms

DEV, BF16, PAGE = torch.device("cuda"), torch.bfloat16, 16


class Shape:
    def __init__(self, path: str) -> None:
        c = json.loads((Path(path) / "config.json").read_text())
        self.name = Path(path).name
        self.h, self.inter = c["hidden_size"], c["intermediate_size"]
        self.layers = c["num_hidden_layers"]
        self.hq, self.hkv = c["num_attention_heads"], c["num_key_value_heads"]
        self.d = c.get("head_dim") or self.h // self.hq


class Weights:
    def __init__(self, s: Shape) -> None:
        def w(n: int, k: int) -> torch.Tensor:
            return torch.randn(n, k, device=DEV, dtype=BF16) * k**-0.5

        def norm() -> torch.Tensor:
            return torch.ones(s.h, device=DEV, dtype=BF16)

        self.layers = [
            {"qkv": w((s.hq + 2 * s.hkv) * s.d, s.h), "o": w(s.h, s.hq * s.d),
             "gu": w(2 * s.inter, s.h), "down": w(s.h, s.inter), "n1": norm(), "n2": norm()}
            for _ in range(s.layers)
        ]


class Half:
    """One group of decode requests: its attention plan (graph buffers) and activations."""

    def __init__(self, s: Shape, kv_lens: list[int], first_page: int) -> None:
        pages = [-(-n // PAGE) for n in kv_lens]
        self.num_pages = sum(pages)
        indptr = torch.tensor([0] + pages, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        indices = (torch.randperm(self.num_pages, dtype=torch.int32) + first_page).to(DEV)
        last = torch.tensor([n - (p - 1) * PAGE for n, p in zip(kv_lens, pages)],
                            dtype=torch.int32)
        bs = len(kv_lens)
        self.attn = FlashInferPagedAttention(s.hq, s.hkv, s.d, PAGE, BF16, DEV)
        self.attn.init_cuda_graphs([bs], self.num_pages)
        self.attn.plan_cuda_graph(indptr, indices, last)
        self.x0 = torch.randn(bs, s.h, device=DEV, dtype=BF16)
        self.x = self.x0
        self.res = torch.randn(bs, s.h, device=DEV, dtype=BF16)
        self.s = s

    def pre(self, w: dict) -> torch.Tensor:
        cuda_ops.fused_add_rmsnorm(self.x, self.res, w["n1"], 1e-6)
        qkv = F.linear(self.x, w["qkv"])
        return qkv[:, : self.s.hq * self.s.d].view(-1, self.s.hq, self.s.d)

    def post(self, w: dict, o: torch.Tensor) -> None:
        x = F.linear(o.view(o.shape[0], -1), w["o"])
        cuda_ops.fused_add_rmsnorm(x, self.res, w["n2"], 1e-6)
        self.x = F.linear(cuda_ops.silu_and_mul(F.linear(x, w["gu"])), w["down"])


def capture(fn) -> torch.cuda.CUDAGraph:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        fn()
    return g


def time_ms(run, reps: int = 30) -> float:
    for _ in range(3):  # warm-up
        run()
    return median_ms(run, reps)


def decode_graphs(s: Shape, wts: Weights, kv_lens: list[int], k: torch.Tensor,
                  v: torch.Tensor) -> dict[str, object]:
    """The three graphs by name, and "halves": the buffers they read (kept alive with them)."""
    whole = Half(s, kv_lens, 0)
    mid = len(kv_lens) // 2
    a = Half(s, kv_lens[:mid], 0)
    b = Half(s, kv_lens[mid:], a.num_pages)

    def one_stream() -> None:
        whole.x = whole.x0
        for w in wts.layers:
            whole.post(w, whole.attn.run(whole.pre(w), k, v))

    def two_streams(alternate: bool) -> None:
        main, side = torch.cuda.current_stream(), torch.cuda.Stream()
        side.wait_stream(main)  # fork
        last = None  # the last attention's end, when they alternate
        a.x, b.x = a.x0, b.x0
        for w in wts.layers:
            for half, stream in ((a, main), (b, side)):
                with torch.cuda.stream(stream):
                    q = half.pre(w)
                    if last is not None:
                        stream.wait_event(last)
                    o = half.attn.run(q, k, v)
                    if alternate:
                        last = torch.cuda.Event()
                        last.record(stream)
                    half.post(w, o)
        main.wait_stream(side)  # join

    return {"halves": (whole, a, b), "one stream": capture(one_stream),
            "two halves, free": capture(lambda: two_streams(False)),
            "two halves, attention alternating": capture(lambda: two_streams(True))}


def prefill_graph(s: Shape, wts: Weights, tokens: int) -> torch.cuda.CUDAGraph:
    x = torch.randn(tokens, s.h, device=DEV, dtype=BF16)
    res = torch.randn_like(x)

    def chain() -> None:
        h = x
        for w in wts.layers:
            cuda_ops.fused_add_rmsnorm(h, res, w["n1"], 1e-6)
            q = F.linear(h, w["qkv"])[:, : s.hq * s.d].contiguous()
            h = F.linear(q, w["o"])
            cuda_ops.fused_add_rmsnorm(h, res, w["n2"], 1e-6)
            h = F.linear(cuda_ops.silu_and_mul(F.linear(h, w["gu"])), w["down"])

    return capture(chain)


def bench(model: str, batches: list[int], prefill_tokens: int) -> list[dict]:
    s = Shape(model)
    wts = Weights(s)
    gen = torch.Generator().manual_seed(0)
    max_bs = max(batches)
    all_lens = torch.randint(100, 2049, (max_bs,), generator=gen).tolist()
    num_pages = sum(-(-n // PAGE) for n in all_lens)
    k = torch.randn(num_pages, PAGE, s.hkv, s.d, device=DEV, dtype=BF16)
    v = torch.randn_like(k)
    rows, kept = [], None
    mid_bs = batches[len(batches) // 2]
    for bs in batches:
        graphs = decode_graphs(s, wts, all_lens[:bs], k, v)
        base = None
        for name, g in graphs.items():
            if name == "halves":
                continue
            ms = time_ms(g.replay)
            base = base or ms
            rows.append({"model": s.name, "batch": bs, "case": name, "ms": ms,
                         "vs one stream": base / ms})
            print(rows[-1], flush=True)
        if bs == mid_bs:
            kept = graphs
    # prefill beside decode: the middle batch's one-stream decode graph on one stream
    assert kept is not None
    bs, dec = mid_bs, kept["one stream"]
    pre = prefill_graph(s, wts, prefill_tokens)
    t_dec, t_pre = time_ms(dec.replay), time_ms(pre.replay)
    steps = max(1, round(t_pre / t_dec))
    side = torch.cuda.Stream()

    def both() -> None:
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            pre.replay()
        for _ in range(steps):
            dec.replay()
        torch.cuda.current_stream().wait_stream(side)

    def serial() -> None:
        pre.replay()
        for _ in range(steps):
            dec.replay()

    t_serial, t_both = time_ms(serial, 10), time_ms(both, 10)
    rows.append({"model": s.name, "batch": bs, "case": f"prefill {prefill_tokens} tok + "
                 f"{steps} decode steps", "ms": t_both, "serial ms": t_serial,
                 "vs one stream": t_serial / t_both, "decode step ms": t_dec,
                 "prefill ms": t_pre})
    print(rows[-1], flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", nargs="+", default=["benches/models/qwen3-0.6b"])
    p.add_argument("--batches", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument("--prefill-tokens", type=int, default=8192)
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args()
    rows = []
    for m in args.model:
        rows += bench(m, args.batches, args.prefill_tokens)
        torch.cuda.empty_cache()
    print("\n| model | batch | case | ms | speedup vs one stream / serial |")
    print("| --- | ---: | --- | ---: | ---: |")
    for r in rows:
        print(f"| {r['model']} | {r['batch']} | {r['case']} | {r['ms']:.3f} | "
              f"{r['vs one stream']:.3f}x |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
