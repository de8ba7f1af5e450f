"""mini-sglang's offline benchmark workload (its benchmark/offline/bench.py), drawn in its
order from one seed: the same requests for ours (benches/offline.py) and for mini-sglang
(benches/minisgl_offline.py). Plain Python, so either side imports it without the other's
package."""

from __future__ import annotations

import random


def draw(n: int = 256, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """-> (prompts, output lengths): n prompts of random token ids in [0, 10000], lengths
    uniform in [100, 1024], then n output lengths uniform in [100, 1024]. (`random.seed(seed)`
    with the module functions, as mini-sglang's script, gives the same numbers.)"""
    rng = random.Random(seed)
    prompts = [[rng.randint(0, 10000) for _ in range(rng.randint(100, 1024))] for _ in range(n)]
    return prompts, [rng.randint(100, 1024) for _ in range(n)]
