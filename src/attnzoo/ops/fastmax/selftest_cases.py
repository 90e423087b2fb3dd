"""How ``attnzoo selftest`` exercises Fastmax, one case per order p (:class:`~attnzoo.ops._spec.CheckCase`)."""

from __future__ import annotations

import functools

import torch

from attnzoo.ops._selftest_inputs import causal_configs, qkv, shapes
from attnzoo.ops._spec import CheckCase


def _scale(cfg: dict, d: int) -> float | None:
    # p=1 with scale > 1/D can have negative weights and near-zero normalisers: ill-conditioned comparisons
    # (the op's module doc); 1/D keeps p=1 an average, as the tests do.
    return 1.0 / d if cfg["p"] == 1 else None


def _call(x: dict[str, torch.Tensor], cfg: dict, backend: str) -> torch.Tensor:
    # imported when called: a test may replace the op's functions in their module
    from attnzoo.ops.fastmax import fastmax

    d = x["q"].shape[-1]
    return fastmax(
        x["q"],
        x["k"],
        x["v"],
        p=cfg["p"],
        causal=cfg["causal"],
        scale=_scale(cfg, d),
        chunk_size=cfg.get("chunk_size"),
        backend=backend,
    )


def _step(x: dict[str, torch.Tensor], cfg: dict) -> torch.Tensor:
    from attnzoo.ops.fastmax import fastmax_init_state, fastmax_step

    q, k, v = x["q"], x["k"], x["v"]
    b, h, n, d = q.shape
    state = fastmax_init_state(b, h, d, v.shape[-1], p=cfg["p"], device=q.device, dtype=q.dtype)
    outs = []
    for t in range(n):
        sl = slice(t, t + 1)
        o, state = fastmax_step(q[:, :, sl], k[:, :, sl], v[:, :, sl], state, p=cfg["p"], scale=_scale(cfg, d))
        outs.append(o)
    return torch.cat(outs, dim=2)


def _configs(quick: bool, p: int) -> list[dict]:
    # chunk_size=5: many masked chunks (and ragged ones) in the causal sweeps at small N (max_n: shapes up to)
    return causal_configs(quick, p=p) + ([] if quick else [dict(causal=True, p=p, chunk_size=5, max_n=130)])


def _shapes(quick: bool) -> list[tuple[int, ...]]:
    # p=2 features are 1 + D + D^2 wide: D=64 alone would dominate the run
    return [s for s in shapes(quick) if s[3] <= 32]


def _case(p: int) -> CheckCase:

    configs = functools.partial(_configs, p=p)
    return CheckCase(f"fastmax p={p}", qkv, _call, ("q", "k", "v"), configs, _shapes, {"q": 2, "k": 2, "v": 2}, _step)


CASES = (_case(1), _case(2))
