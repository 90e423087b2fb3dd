"""How ``attnzoo selftest`` exercises softmax attention (:class:`~attnzoo.ops._spec.CheckCase`)."""

from __future__ import annotations

import torch

from attnzoo.ops._check_inputs import causal_configs, qkv, shapes
from attnzoo.ops._spec import CheckCase
from attnzoo.ops.softmax import softmax_attention


def _call(x: dict[str, torch.Tensor], cfg: dict, backend: str) -> torch.Tensor:
    return softmax_attention(x["q"], x["k"], x["v"], causal=cfg["causal"], backend=backend)


CASES = (CheckCase("softmax", qkv, _call, ("q", "k", "v"), causal_configs, shapes, {"q": 2, "k": 2, "v": 2}),)
