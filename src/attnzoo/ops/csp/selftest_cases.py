"""How ``attnzoo selftest`` exercises CSP (:class:`~attnzoo.ops._spec.CheckCase`); shapes are ``(B, N, C, groups)``."""

from __future__ import annotations

import torch

from attnzoo.ops._selftest_inputs import randn
from attnzoo.ops._spec import CheckCase


def _shapes(quick: bool) -> list[tuple[int, ...]]:
    # complete sort, pure shift, groups of 2 (min/max path), odd N, N=1
    if quick:
        return [(2, 12, 5, 4), (1, 9, 4, 1)]
    return [(1, 1, 3, 1), (2, 6, 4, 1), (2, 6, 4, 3), (2, 7, 5, 7), (2, 12, 5, 6), (1, 15, 3, 3), (2, 300, 16, 10)]


def _make(shape: tuple[int, ...], _cfg: dict, gen: torch.Generator) -> dict[str, torch.Tensor]:
    b, n, c, _ = shape
    # continuous random values are distinct (ties would make the permutation, hence gradients, tie-rule
    # dependent; both backends break ties alike, but float32 rounding could create ties float64 lacks)
    return {"v": randn((b, n, c), gen)}


def _smallest_factor(n: int) -> int:
    return next((f for f in range(2, n + 1) if n % f == 0), 1)


def _call(x: dict[str, torch.Tensor], cfg: dict, backend: str) -> torch.Tensor:
    # imported when called: a test may replace the op's functions in their module
    from attnzoo.ops.csp import csp, csp_shifts

    v = x["v"]
    n, c = v.shape[1], v.shape[2]
    shifts = csp_shifts(n, c) if cfg["shifts"] == "schedule" else [(3 * i * i + 1) % (2 * n + 1) - n for i in range(c)]
    groups = {"complete sort": 1, "small groups": n // _smallest_factor(n), "shift only": n}[cfg["groups"]]
    return csp(v, shifts, groups, backend=backend)


def _configs(quick: bool) -> list[dict]:

    cfgs = [
        dict(causal=False, shifts="schedule", groups="small groups"),
        dict(causal=False, shifts="arbitrary", groups="complete sort"),
    ]
    return cfgs if quick else cfgs + [dict(causal=False, shifts="arbitrary", groups="shift only")]


CASES = (CheckCase("csp", _make, _call, ("v",), _configs, _shapes),)
