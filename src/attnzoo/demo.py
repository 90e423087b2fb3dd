"""``attnzoo demo``: build every registered mechanism and print output statistics and cost at a few lengths.

A quick smoke check that everything is installed and wired: for each mechanism (and its causal mode where
it has one) it runs a forward pass on random tokens of shape ``(B, N, dim)`` and reports the output's mean
and std, the median wall time over a few repeats, and the parameter count.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from attnzoo.layers import build_attention, list_attentions


def _time_forward(module: torch.nn.Module, x: torch.Tensor, repeats: int) -> tuple[torch.Tensor, float]:
    with torch.no_grad():
        y = module(x)  # warm-up (and the output we report)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            module(x)
            times.append(time.perf_counter() - t0)
    return y, statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="attnzoo demo", description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    torch.manual_seed(args.seed)
    header = f"{'mechanism':<18}{'N':>7}{'params':>10}{'out mean':>11}{'out std':>10}{'fwd ms':>10}"
    print(f"attnzoo demo: dim={args.dim} heads={args.heads} batch={args.batch} threads={torch.get_num_threads()}")
    print(header)
    print("-" * len(header))
    for name in list_attentions():
        modes = [False] + ([True] if name in list_attentions(causal=True) else [])
        for causal in modes:
            label = name + (" (causal)" if causal else "")
            m = build_attention(name, args.dim, args.heads, causal=causal).eval()
            n_params = sum(p.numel() for p in m.parameters())
            for n in args.lengths:
                x = torch.randn(args.batch, n, args.dim)
                try:
                    y, sec = _time_forward(m, x, args.repeats)
                except ValueError as err:  # e.g. a causal length beyond a learned position table
                    print(f"{label:<18}{n:>7}{n_params:>10}  skipped: {err}")
                    continue
                print(
                    f"{label:<18}{n:>7}{n_params:>10}{y.mean().item():>11.4f}{y.std().item():>10.4f}{sec * 1e3:>10.2f}"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
