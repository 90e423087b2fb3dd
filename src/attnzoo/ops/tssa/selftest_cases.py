"""How ``attnzoo selftest`` exercises TSSA (:class:`~attnzoo.ops._spec.CheckCase`)."""

from __future__ import annotations

import torch

from attnzoo.ops._selftest_inputs import causal_configs, randn, shapes
from attnzoo.ops._spec import CheckCase


def _make(shape: tuple[int, ...], cfg: dict, gen: torch.Generator) -> dict[str, torch.Tensor]:
    _, h, n, p = shape
    # features of different scales and temperatures away from 1 keep Pi far from uniform (as tests/ops do)
    x = {
        "w": randn(shape, gen) * torch.exp(randn((1, h, 1, p), gen)),
        "temp": 0.5 + 2 * torch.rand(h, generator=gen, dtype=torch.float64),
    }
    if cfg["causal"]:
        x["bias"] = randn((h, n + 3, 1), gen, 0.3)  # N_max > N, as a module's max_len is
    return x


def _call(x: dict[str, torch.Tensor], cfg: dict, backend: str) -> torch.Tensor:
    # imported when called: a test may replace the op's functions in their module
    from attnzoo.ops.tssa import tssa

    return tssa(x["w"], x["temp"], causal=cfg["causal"], bias=x.get("bias"), backend=backend)


def _step(x: dict[str, torch.Tensor], _cfg: dict) -> torch.Tensor:
    from attnzoo.ops.tssa import tssa_init_state, tssa_step

    w = x["w"]
    b, h, n, p = w.shape
    state = tssa_init_state(b, h, p, device=w.device, dtype=w.dtype)
    outs = []
    for t in range(n):
        o, state = tssa_step(w[:, :, t], x["temp"], state, bias=x["bias"])
        outs.append(o)
    return torch.stack(outs, dim=2)


CASES = (CheckCase("tssa", _make, _call, ("w", "temp", "bias"), causal_configs, shapes, {"w": 2, "bias": 1}, _step),)
