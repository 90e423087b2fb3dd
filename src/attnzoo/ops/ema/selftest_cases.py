"""How ``attnzoo selftest`` exercises MEGA's EMA (:class:`~attnzoo.ops._spec.CheckCase`).

``x (B, H, N, P)`` is B*H sequences of P channels; h = 3 expanded dimensions; alpha, delta pass through a sigmoid.
"""

from __future__ import annotations

import torch

from attnzoo.ops._selftest_inputs import causal_configs, randn, shapes
from attnzoo.ops._spec import CheckCase


def _make(shape: tuple[int, ...], cfg: dict, gen: torch.Generator) -> dict[str, torch.Tensor]:
    p = shape[3]
    lead = (p, 3) if cfg["causal"] else (2, p, 3)
    return {"x": randn(shape, gen), **{k: randn(lead, gen) for k in ("alpha", "delta", "beta", "eta")}}


def _args(x: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return x["x"].flatten(0, 1), torch.sigmoid(x["alpha"]), torch.sigmoid(x["delta"]), x["beta"], x["eta"]


def _call(x: dict[str, torch.Tensor], cfg: dict, backend: str) -> torch.Tensor:
    # imported when called: a test may replace the op's functions in their module
    from attnzoo.ops.ema import ema

    return ema(*_args(x), causal=cfg["causal"], backend=backend).view(x["x"].shape)


def _step(x: dict[str, torch.Tensor], _cfg: dict) -> torch.Tensor:
    from attnzoo.ops.ema import ema_step

    xs, *coeffs = _args(x)
    state, outs = None, []
    for t in range(xs.shape[1]):
        y, state = ema_step(xs[:, t : t + 1], state, *coeffs)
        outs.append(y)
    return torch.cat(outs, dim=1).view(x["x"].shape)


CASES = (
    CheckCase("ema", _make, _call, ("x", "alpha", "delta", "beta", "eta"), causal_configs, shapes, {"x": 2}, _step),
)
