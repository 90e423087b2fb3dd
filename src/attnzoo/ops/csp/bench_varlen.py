"""CSP's fused CPU kernel with masks against the same kernel (or path) without, at equal real tokens.

``python -m attnzoo.ops.csp.bench_varlen [--rounds R] [--channels C] [--threads T]``: the masked call is
``(B, 2L, C)`` with every row's second half padding (right-padded) or the B sequences packed in one ``(1, B L, C)``
row, the unmasked one ``(B, L, C)``: the same ``B L`` real tokens. The two calls alternate within each round (their
order flips every round) so that a shared machine's load falls on both alike; the ratio is the median over rounds
of masked time / unmasked time, with the medians of the times themselves. Times are the process's CPU time
(``time.process_time``; run with one thread), which waits for a busy machine's cores do not inflate. Without masks
the "cpu" backend runs the fused kernel for groups of two only (the rest is the PyTorch path), so the other group
sizes compare the masked kernel with that path, and every case also with the masked PyTorch path
(``backend="torch"``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch

from attnzoo.ops.csp import csp, csp_shifts


def _timed(fn: Callable[[], None]) -> float:
    # CPU time of the process, not wall time: on a machine shared by more processes than cores, wall time counts the
    # waits for a core (several times the work); with one thread the work is all this process's CPU time
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def _step(v: torch.Tensor, call: Callable[[torch.Tensor], torch.Tensor], backward: bool) -> Callable[[], None]:
    def run() -> None:
        x = v.detach().requires_grad_(backward)
        out = call(x)
        if backward:
            out.backward(torch.ones_like(out))

    return run


def compare(
    a: Callable[[], None], b: Callable[[], None], rounds: int, warmup: int = 2
) -> tuple[float, float, float, float]:
    """Median ratio a / b over alternating rounds, the median times of a and b (s), and the ratios' spread
    (max / min)."""
    for _ in range(warmup):
        a()
        b()
    ta, tb, ratios = [], [], []
    for r in range(rounds):
        if r % 2:
            y, x = _timed(b), _timed(a)
        else:
            x, y = _timed(a), _timed(b)
        ta.append(x)
        tb.append(y)
        ratios.append(x / y)
    return statistics.median(ratios), statistics.median(ta), statistics.median(tb), max(ratios) / min(ratios)


def main(argv: list[str] | None = None) -> None:
    """Print the masked / unmasked ratios (module doc)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--length", type=int, default=4096, help="N of the padded rows; half of each row is real")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--sizes", type=int, nargs="*", default=[2, 8, 0], help="tokens per group G; 0: the whole sequence")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    b, n, c = args.batch, args.length, args.channels
    half = n // 2
    g = torch.Generator().manual_seed(0)
    padded = torch.randn(b, n, c, generator=g)
    mask = torch.zeros(b, n, dtype=torch.bool)
    mask[:, :half] = True
    dense = padded[:, :half].contiguous()
    packed = dense.reshape(1, b * half, c)
    cu = torch.arange(0, b * half + 1, half, dtype=torch.int32)
    shifts = csp_shifts(half, c, "linear")
    print(
        f"CSP masked / unmasked at equal real tokens: {b} sequences of L={half} (padded rows N={n}), C={c}, "
        f"float32, {args.threads} thread(s), {args.rounds} alternating rounds; CPU times, medians (ms)"
    )
    print(f"{'G':>5} {'pass':>7} {'masked':>8} {'vs':>14} {'ratio':>6} {'masked ms':>9} {'vs ms':>8} {'spread':>6}")
    for size in args.sizes:
        size = size or half
        if size < 1 or half % size:
            raise ValueError(f"group sizes must divide L={half}, got {size}")
        groups = half // size

        def unmasked(x, groups=groups):
            return csp(x, shifts, groups, backend="cpu")

        def right(x, groups=groups, backend="cpu"):
            return csp(x, shifts, groups, backend=backend, attention_mask=mask)

        def pack(x, groups=groups):
            return csp(x, shifts, groups, backend="cpu", cu_seqlens=cu)

        against = "cpu (pairs)" if size == 2 else "cpu (=torch)"
        for backward in (False, True):
            kind = "fwd+bwd" if backward else "fwd"
            rows = [
                ("right-pad", _step(padded, right, backward), against, _step(dense, unmasked, backward)),
                ("packed", _step(packed, pack, backward), against, _step(dense, unmasked, backward)),
                (
                    "right-pad",
                    _step(padded, right, backward),
                    "torch masked",
                    _step(padded, lambda x, groups=groups: right(x, groups, "torch"), backward),
                ),
            ]
            for name, a, vs, bfn in rows:
                ratio, ta, tb, spread = compare(a, bfn, args.rounds)
                print(
                    f"{size:>5} {kind:>7} {name:>8} {vs:>14} {ratio:6.2f} {1e3 * ta:9.2f} {1e3 * tb:8.2f} {spread:6.1f}"
                )


if __name__ == "__main__":
    main()
