"""How ``attnzoo selftest`` exercises MEGA: its EMA's cases and its attention's (:class:`~attnzoo.ops._spec.CheckCase`).

q, k ``(B, H, N, P)`` and v ``(B, H, N, P + 1)`` are B*H single-head sequences; full and chunked attention.
"""

from __future__ import annotations

import torch

from attnzoo.ops._selftest_inputs import randn, shapes
from attnzoo.ops._spec import CheckCase
from attnzoo.ops.ema import EMA


def _make(shape: tuple[int, ...], _cfg: dict, gen: torch.Generator) -> dict[str, torch.Tensor]:
    b, hh, n, p = shape
    qkv = {k: randn((b, hh, n, p + (k == "v")), gen) for k in ("q", "k", "v")}
    return {**qkv, "rel_bias": randn((2 * n - 1,), gen, 0.5)}


def _call(x: dict[str, torch.Tensor], cfg: dict, backend: str) -> torch.Tensor:
    # imported when called: a test may replace the op's functions in their module
    from attnzoo.ops.mega import mega_attention

    q, k, v = (x[n].flatten(0, 1) for n in ("q", "k", "v"))
    out = mega_attention(q, k, v, x["rel_bias"], fn=cfg["fn"], chunk_size=cfg["chunk_size"], backend=backend)
    return out.view(x["v"].shape)


def _configs(_quick: bool) -> list[dict]:
    return [dict(causal=False, fn=f, chunk_size=c) for f in ("softmax", "laplace") for c in (None, 5)]


# the layer runs the EMA op before its attention: the EMA's own cases belong to MEGA's selftest
CASES = (*EMA.check_cases(), CheckCase("mega", _make, _call, ("q", "k", "v", "rel_bias"), _configs, shapes))
