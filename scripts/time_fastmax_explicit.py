"""Fastmax forward + backward, the factorised form (``backend="torch"``) against the explicit N x N one
(``backend="explicit"``), at the shapes of docs/performance.md's table (one thread).

    python scripts/time_fastmax_explicit.py
"""

from __future__ import annotations

import time

import torch

from attnzoo.ops.fastmax import fastmax

CASES = [(64, 4, 17, 16, False), (32, 4, 64, 16, True), (32, 4, 128, 16, False), (16, 4, 256, 16, True)]


def _ms(backend: str, q, k, v, causal: bool, seconds: float = 1.5) -> float:
    def once():
        fastmax(q, k, v, p=2, causal=causal, backend=backend).sum().backward()

    once()
    once()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        once()
        n += 1
    return 1e3 * (time.perf_counter() - t0) / n


def main() -> None:
    torch.set_num_threads(1)
    print("| B | N | causal | factorised | explicit | ratio |")
    for b, h, n, d, causal in CASES:
        q, k, v = (torch.randn(b, h, n, d, requires_grad=True) for _ in "qkv")
        fact, expl = _ms("torch", q, k, v, causal), _ms("explicit", q, k, v, causal)
        print(f"| {b} | {n} | {'yes' if causal else 'no'} | {fact:.1f} ms | {expl:.1f} ms | {fact / expl:.2f}x |")


if __name__ == "__main__":
    main()
