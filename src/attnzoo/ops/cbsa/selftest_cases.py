"""How ``attnzoo selftest`` exercises CBSA and its variants (:class:`~attnzoo.ops._spec.CheckCase`).

Shapes are ``(B, H, N, P, M)``: M < P, M > P (the exact solve's push-through branch), M > N.
"""

from __future__ import annotations

import torch

from attnzoo.ops._selftest_inputs import randn
from attnzoo.ops._spec import CheckCase

_VARIANTS = [
    ("cbsa", "softmax"),
    ("cbsa", "exact"),
    ("agent", None),
    ("mssa", "softmax"),
    ("mssa", "exact"),
    ("linear", None),
    ("channel", None),
]


def _shapes(quick: bool) -> list[tuple[int, ...]]:
    if quick:
        return [(2, 3, 7, 5, 3), (1, 2, 16, 8, 9)]
    return [(1, 1, 1, 4, 1), (2, 3, 7, 5, 3), (2, 2, 9, 3, 5), (1, 2, 16, 8, 4), (1, 1, 3, 2, 6), (2, 2, 200, 16, 8)]


def _make(shape: tuple[int, ...], cfg: dict, gen: torch.Generator) -> dict[str, torch.Tensor]:
    b, h, n, p, m = shape
    x = {"w": randn((b, h, n, p), gen)}
    if cfg["variant"] in ("cbsa", "agent"):
        x["reps"] = randn((b, h, m, p), gen)
        x["eta"] = randn((h, 1, 1), gen)
    return x


def _call(x: dict[str, torch.Tensor], cfg: dict, backend: str) -> torch.Tensor:
    # imported when called: a test may replace the op's functions in their module
    from attnzoo.ops.cbsa import cbsa

    kw = dict(variant=cfg["variant"], contraction=cfg["contraction"], eps=0.7, backend=backend)
    if "eta" in x:
        kw["eta"] = x["eta"]
    return cbsa(x["w"], x.get("reps"), **kw)


def _configs(_quick: bool) -> list[dict]:

    return [dict(causal=False, variant=v, contraction=c) for v, c in _VARIANTS]


CASES = (CheckCase("cbsa", _make, _call, ("w", "reps", "eta"), _configs, _shapes),)
