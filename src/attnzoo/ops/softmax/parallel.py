"""Fast softmax attention through PyTorch's fused ``F.scaled_dot_product_attention`` (flash / memory-efficient
kernels on GPU, a fused math kernel on CPU)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnzoo.ops._segment_ops import attention_allowed, zero_padding
from attnzoo.ops._varlen import segments

__all__ = ["softmax_attention_sdpa"]


def softmax_attention_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float,
    dropout_p: float = 0.0,
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """``softmax(Q K^T * scale [masked]) V`` without materialising the ``(Nq, Nk)`` matrix where the kernel allows.

    With ``attention_mask``/``cu_seqlens``: SDPA with the boolean ``(B, 1, N, N)`` mask ``s(j) = s(i)``, ``j`` real
    (``j <= i`` when causal; block-diagonal for a packed row), padding rows set to 0."""
    seg = segments(q.shape[0], q.shape[2], attention_mask=attention_mask, cu_seqlens=cu_seqlens, device=q.device)
    if seg is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal, scale=scale)
    allowed = attention_allowed(seg, causal)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout_p, scale=scale)
    return zero_padding(out, seg)
