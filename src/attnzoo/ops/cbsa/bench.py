"""Benchmark case of CBSA (declared in the mechanism's ``bench``)."""

from __future__ import annotations

import torch

from attnzoo.ops._bench import Case, Shape, nbytes, randn
from attnzoo.ops.cbsa import cbsa as cbsa_op
from attnzoo.ops.cbsa.pooling import pool_reps


def cbsa(s: Shape, _causal: bool, device: torch.device, dtype: torch.dtype) -> Case:
    (w,) = randn((s.batch, s.heads, s.length, s.head_dim), device, dtype)
    # representatives pooled from the tokens inside the timed call, as the module does (M = 64)
    return [w], lambda: cbsa_op(w, pool_reps(w, num_reps=64)), 2 * nbytes(w)
