"""Helpers of the ops' benchmark cases (``ops/<op>/bench.py``, named by each :class:`~attnzoo.ops._spec.BenchCase`)."""

from __future__ import annotations

from typing import Callable

import torch

from attnzoo.ops._spec import Shape

__all__ = ["Case", "Shape", "nbytes", "randn"]

#: what a case builder returns: the tensors that receive gradients, the timed call, the ideal bytes moved
Case = tuple[list[torch.Tensor], Callable[[], torch.Tensor], int]


def randn(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype, n: int = 1) -> list[torch.Tensor]:
    return [torch.randn(*shape, device=device, dtype=dtype) for _ in range(n)]


def nbytes(*ts: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in ts)
