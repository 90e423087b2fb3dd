"""Benchmark case of XCA (declared in the mechanism's ``bench``)."""

from __future__ import annotations

import torch

from attnzoo import ops
from attnzoo.ops._bench import Case, Shape, nbytes, randn


def xca(s: Shape, _causal: bool, device: torch.device, dtype: torch.dtype) -> Case:
    q, k, v = randn((s.batch, s.heads, s.length, s.head_dim), device, dtype, 3)
    temp = torch.ones(s.heads, device=device, dtype=dtype)
    return [q, k, v], lambda: ops.xca(q, k, v, temp), 4 * nbytes(q)
