"""Dtype rules shared by every op: which dtype reductions accumulate in."""

from __future__ import annotations

import torch

__all__ = ["acc_dtype"]


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: float64 stays float64, everything else (fp16/bf16/fp32) is reduced in float32.

    Sums over tokens of half-precision values lose digits quickly; float32 is the narrowest safe accumulator.
    """
    return torch.float64 if dtype == torch.float64 else torch.float32
