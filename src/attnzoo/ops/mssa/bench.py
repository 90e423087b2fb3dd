"""Benchmark case of MSSA (declared in the mechanism's ``bench``)."""

from __future__ import annotations

import torch

from attnzoo.ops._bench import Case, Shape, nbytes, randn
from attnzoo.ops.mssa import mssa as mssa_op


def mssa(s: Shape, causal: bool, device: torch.device, dtype: torch.dtype) -> Case:
    (w,) = randn((s.batch, s.heads, s.length, s.head_dim), device, dtype)
    return [w], lambda: mssa_op(w, causal=causal, normalize_query=causal), 2 * nbytes(w)
