"""Fast MSSA: fused ``F.scaled_dot_product_attention`` with the one projection ``w`` as key and value (and query,
unless ``normalize_query``); autograd sums the three gradient paths into ``w``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnzoo.ops._segment_ops import attention_allowed, zero_padding
from attnzoo.ops._varlen import segments
from attnzoo.ops.mssa.naive import mssa_query

__all__ = ["mssa_sdpa"]


def mssa_sdpa(
    w: torch.Tensor,
    *,
    causal: bool = False,
    scale: float,
    normalize_query: bool = False,
    dropout_p: float = 0.0,
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(B, H, N, P) -> (B, H, N, P)`` without materialising the ``(N, N)`` map where the kernel allows.

    With ``attention_mask``/``cu_seqlens``: SDPA with the boolean ``(B, 1, N, N)`` mask ``s(j) = s(i)``, ``j`` real
    (``j <= i`` when causal); the query normalisation is per token, so it needs no mask; padding rows set to 0."""
    q = mssa_query(w, normalize_query)
    seg = segments(w.shape[0], w.shape[2], attention_mask=attention_mask, cu_seqlens=cu_seqlens, device=w.device)
    if seg is None:
        return F.scaled_dot_product_attention(q, w, w, dropout_p=dropout_p, is_causal=causal, scale=scale)
    out = F.scaled_dot_product_attention(
        q, w, w, attn_mask=attention_allowed(seg, causal), dropout_p=dropout_p, scale=scale
    )
    return zero_padding(out, seg)
