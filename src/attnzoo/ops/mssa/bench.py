"""Benchmark case of MSSA (declared in the mechanism's ``bench``)."""

from __future__ import annotations

import torch

from attnzoo import ops
from attnzoo.ops._bench import Case, Shape, nbytes, randn


def mssa(s: Shape, causal: bool, device: torch.device, dtype: torch.dtype) -> Case:
    (w,) = randn((s.batch, s.heads, s.length, s.head_dim), device, dtype)
    return [w], lambda: ops.mssa(w, causal=causal, normalize_query=causal), 2 * nbytes(w)
