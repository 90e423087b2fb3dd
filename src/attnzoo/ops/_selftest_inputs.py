"""Inputs, shapes and configs the ops' selftest cases (``ops/<op>/selftest_cases.py``) share."""

from __future__ import annotations

import torch

__all__ = ["SHAPES_FULL", "SHAPES_QUICK", "causal_configs", "qkv", "randn", "shapes"]

# Shapes (B, H, N, P): N=1, odd N, a head dim that is not a power of two, N across the chunks of the
# PyTorch scans (32-64 tokens) and of the CPU kernels (64-token blocks, 256-token chunks), and the head dims
# the CPU kernels unroll (16, 32, 64). --quick keeps two of them.
SHAPES_QUICK = [(2, 3, 7, 5), (1, 2, 70, 16)]
SHAPES_FULL = [
    (1, 1, 1, 3),
    (2, 3, 7, 5),
    (1, 4, 33, 3),
    (2, 2, 300, 6),
    (1, 3, 777, 16),
    (1, 2, 130, 32),
    (1, 1, 70, 64),
    (2, 2, 1100, 8),
]


def randn(shape: tuple[int, ...], gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """Standard normal float64 CPU values times ``scale``, drawn from ``gen``."""
    return torch.randn(shape, generator=gen, dtype=torch.float64) * scale


def shapes(quick: bool) -> list[tuple[int, ...]]:
    """The shared ``(B, H, N, P)`` shapes (a copy: a case may filter it)."""
    return list(SHAPES_QUICK if quick else SHAPES_FULL)


def causal_configs(_quick: bool, **extra) -> list[dict]:
    """The bidirectional and the causal config, each with ``extra``."""
    return [dict(causal=c, **extra) for c in (False, True)]


def qkv(shape: tuple[int, ...], _cfg: dict, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """``q, k (B, H, N, P)`` and ``v (B, H, N, P + 1)``: a value width unlike the key's catches swapped axes."""
    b, h, n, p = shape
    return {"q": randn(shape, gen), "k": randn(shape, gen), "v": randn((b, h, n, p + 1), gen)}
