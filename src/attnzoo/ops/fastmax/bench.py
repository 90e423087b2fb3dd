"""Benchmark cases of Fastmax (declared in the mechanism's ``bench``)."""

from __future__ import annotations

import torch

from attnzoo.ops._bench import Case, Shape, nbytes, randn
from attnzoo.ops.fastmax import fastmax


def _case(s: Shape, causal: bool, device: torch.device, dtype: torch.dtype, p: int, backend: str, **mask) -> Case:
    q, k, v = randn((s.batch, s.heads, s.length, s.head_dim), device, dtype, 3)
    return [q, k, v], lambda: fastmax(q, k, v, p=p, causal=causal, backend=backend, **mask), 4 * nbytes(q)


def fastmax_p1(s: Shape, causal: bool, device: torch.device, dtype: torch.dtype, **mask) -> Case:
    return _case(s, causal, device, dtype, 1, "auto", **mask)


def fastmax_p2(s: Shape, causal: bool, device: torch.device, dtype: torch.dtype, **mask) -> Case:
    return _case(s, causal, device, dtype, 2, "auto", **mask)


# "_autograd": autograd through the same chunked factorisation, the memory reference of FAST §2.5
def fastmax_p1_autograd(s: Shape, causal: bool, device: torch.device, dtype: torch.dtype) -> Case:
    return _case(s, causal, device, dtype, 1, "torch_autograd")


def fastmax_p2_autograd(s: Shape, causal: bool, device: torch.device, dtype: torch.dtype) -> Case:
    return _case(s, causal, device, dtype, 2, "torch_autograd")
