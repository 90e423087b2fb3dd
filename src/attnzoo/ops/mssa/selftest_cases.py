"""How ``attnzoo selftest`` exercises MSSA (:class:`~attnzoo.ops._spec.CheckCase`)."""

from __future__ import annotations

import torch

from attnzoo.ops._selftest_inputs import randn, shapes
from attnzoo.ops._spec import CheckCase


def _make(shape: tuple[int, ...], _cfg: dict, gen: torch.Generator) -> dict[str, torch.Tensor]:
    return {"w": randn(shape, gen)}


def _call(x: dict[str, torch.Tensor], cfg: dict, backend: str) -> torch.Tensor:
    # imported when called: a test may replace the op's functions in their module
    from attnzoo.ops.mssa import mssa

    return mssa(x["w"], causal=cfg["causal"], normalize_query=cfg["normalize_query"], backend=backend)


def _configs(quick: bool) -> list[dict]:

    return [dict(causal=c, normalize_query=nq) for c in (False, True) for nq in (False, True) if not quick or c == nq]


CASES = (CheckCase("mssa", _make, _call, ("w",), _configs, shapes, {"w": 2}),)
