"""How ``attnzoo selftest`` exercises cross-covariance attention (:class:`~attnzoo.ops._spec.CheckCase`)."""

from __future__ import annotations

import torch

from attnzoo.ops._selftest_inputs import randn, shapes
from attnzoo.ops._spec import CheckCase


def _make(shape: tuple[int, ...], _cfg: dict, gen: torch.Generator) -> dict[str, torch.Tensor]:
    h = shape[1]
    return {
        "q": randn(shape, gen),
        "k": randn(shape, gen),
        "v": randn(shape, gen),
        "temp": 0.5 + torch.rand(h, generator=gen, dtype=torch.float64),
    }


def _call(x: dict[str, torch.Tensor], _cfg: dict, backend: str) -> torch.Tensor:
    # imported when called: a test may replace the op's functions in their module
    from attnzoo.ops.xca import xca

    return xca(x["q"], x["k"], x["v"], x["temp"], backend=backend)


def _configs(_quick: bool) -> list[dict]:

    return [dict(causal=False)]


CASES = (CheckCase("xca", _make, _call, ("q", "k", "v", "temp"), _configs, shapes),)
