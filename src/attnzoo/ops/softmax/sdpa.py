"""Fast softmax attention through PyTorch's fused ``F.scaled_dot_product_attention`` (flash / memory-efficient
kernels on GPU, a fused math kernel on CPU)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["softmax_attention_sdpa"]


def softmax_attention_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """``softmax(Q K^T * scale [masked]) V`` without materialising the ``(Nq, Nk)`` matrix where the kernel allows."""
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal, scale=scale)
