"""Benchmark case of XCA (declared in the mechanism's ``bench``)."""

from __future__ import annotations

import torch

from attnzoo.ops._bench import Case, Shape, nbytes, randn
from attnzoo.ops.xca import xca as xca_op


def xca(s: Shape, _causal: bool, device: torch.device, dtype: torch.dtype) -> Case:
    q, k, v = randn((s.batch, s.heads, s.length, s.head_dim), device, dtype, 3)
    temp = torch.ones(s.heads, device=device, dtype=dtype)
    return [q, k, v], lambda: xca_op(q, k, v, temp), 4 * nbytes(q)
