"""Benchmark cases of TSSA (declared in the mechanism's ``bench``)."""

from __future__ import annotations

import torch

from attnzoo.ops._bench import Case, Shape, nbytes, randn
from attnzoo.ops.tssa import tssa as tssa_op


def _case(s: Shape, causal: bool, device: torch.device, dtype: torch.dtype, backend: str, **mask) -> Case:
    (w,) = randn((s.batch, s.heads, s.length, s.head_dim), device, dtype)
    temp = torch.ones(s.heads, device=device, dtype=dtype)
    bias = torch.zeros(s.heads, s.length, 1, device=device, dtype=dtype) if causal else None
    return [w], lambda: tssa_op(w, temp, causal=causal, bias=bias, backend=backend, **mask), 2 * nbytes(w)


def tssa(s: Shape, causal: bool, device: torch.device, dtype: torch.dtype, **mask) -> Case:
    # mask: attention_mask / cu_seqlens of the varlen sweep
    return _case(s, causal, device, dtype, "auto", **mask)


def tssa_torch(s: Shape, causal: bool, device: torch.device, dtype: torch.dtype) -> Case:
    # the PyTorch path, to measure what the fused CPU kernels ("auto" on CPU) gain
    return _case(s, causal, device, dtype, "torch")


def sized(options: dict, length: int, _dim: int, causal: bool) -> dict:
    # the causal layer's learned position bias must cover the sequence
    return {**options, "max_len": max(1024, length)} if causal else options
