"""Benchmark case of linear attention (declared in the mechanism's ``bench``)."""

from __future__ import annotations

import torch

from attnzoo.ops._bench import Case, Shape, nbytes, randn
from attnzoo.ops.linear import linear_attention


def linear(s: Shape, causal: bool, device: torch.device, dtype: torch.dtype, **mask) -> Case:
    q, k, v = randn((s.batch, s.heads, s.length, s.head_dim), device, dtype, 3)
    return [q, k, v], lambda: linear_attention(q, k, v, causal=causal, **mask), 4 * nbytes(q)
