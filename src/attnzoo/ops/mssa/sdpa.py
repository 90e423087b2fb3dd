"""Fast MSSA: fused ``F.scaled_dot_product_attention`` with the one projection ``w`` as key and value (and query,
unless ``normalize_query``); autograd sums the three gradient paths into ``w``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnzoo.ops.mssa.naive import mssa_query

__all__ = ["mssa_sdpa"]


def mssa_sdpa(
    w: torch.Tensor, *, causal: bool = False, scale: float, normalize_query: bool = False, dropout_p: float = 0.0
) -> torch.Tensor:
    """``(B, H, N, P) -> (B, H, N, P)`` without materialising the ``(N, N)`` map where the kernel allows."""
    return F.scaled_dot_product_attention(
        mssa_query(w, normalize_query), w, w, dropout_p=dropout_p, is_causal=causal, scale=scale
    )
