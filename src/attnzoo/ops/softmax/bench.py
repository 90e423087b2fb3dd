"""Benchmark cases of softmax attention (declared in the mechanism's ``bench``)."""

from __future__ import annotations

import torch

from attnzoo.ops._bench import Case, Shape, nbytes, randn
from attnzoo.ops.softmax import softmax_attention


def _qkv(s: Shape, device: torch.device, dtype: torch.dtype):
    return randn((s.batch, s.heads, s.length, s.head_dim), device, dtype, 3)


def softmax(s: Shape, causal: bool, device: torch.device, dtype: torch.dtype) -> Case:
    q, k, v = _qkv(s, device, dtype)
    return [q, k, v], lambda: softmax_attention(q, k, v, causal=causal), 4 * nbytes(q)


def softmax_explicit(s: Shape, causal: bool, device: torch.device, dtype: torch.dtype) -> Case:
    # the N x N scores and weights materialised (the reference): the attention the papers' memory figures compare
    # against, where SDPA streams the scores
    q, k, v = _qkv(s, device, dtype)
    return [q, k, v], lambda: softmax_attention(q, k, v, causal=causal, backend="naive"), 4 * nbytes(q)
