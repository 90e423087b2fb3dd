"""How ``attnzoo selftest`` exercises softmax attention (:class:`~attnzoo.ops._spec.CheckCase`)."""

from __future__ import annotations

import torch

from attnzoo.ops._selftest_inputs import causal_configs, qkv, shapes
from attnzoo.ops._spec import CheckCase


def _call(x: dict[str, torch.Tensor], cfg: dict, backend: str) -> torch.Tensor:
    # imported when called: a test may replace the op's functions in their module
    from attnzoo.ops.softmax import softmax_attention

    return softmax_attention(x["q"], x["k"], x["v"], causal=cfg["causal"], backend=backend)


CASES = (CheckCase("softmax", qkv, _call, ("q", "k", "v"), causal_configs, shapes, {"q": 2, "k": 2, "v": 2}),)
