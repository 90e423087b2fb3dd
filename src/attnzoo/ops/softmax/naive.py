"""Reference softmax attention: the explicit ``softmax(Q K^T * scale [masked]) V`` (Vaswani et al., 2017)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnzoo.ops._dtypes import acc_dtype  # re-exported: the name's earlier home
from attnzoo.ops._segment_ops import each_sequence_alone

__all__ = ["softmax_attention_naive", "softmax_attention_weights", "acc_dtype", "causal_mask"]


def causal_mask(n: int, device: torch.device) -> torch.Tensor:
    """``(n, n)`` boolean mask, True where key ``j`` lies in the future of query ``i`` (``j > i``)."""
    return torch.ones(n, n, dtype=torch.bool, device=device).triu(1)


def softmax_attention_weights(
    q: torch.Tensor, k: torch.Tensor, *, causal: bool, scale: float, allowed: torch.Tensor | None = None
) -> torch.Tensor:
    """Row-stochastic attention ``softmax(Q K^T * scale)``: ``(B, H, Nq, Nk)`` in the accumulation dtype.

    ``allowed`` (bool, broadcastable to ``(B, H, Nq, Nk)``, e.g. from
    :func:`~attnzoo.ops._segment_ops.attention_allowed`): keys outside it get weight 0 (every row needs one)."""
    acc = acc_dtype(q.dtype)
    logits = torch.matmul(q.to(acc), k.to(acc).transpose(-1, -2)) * scale
    if causal:
        logits = logits.masked_fill(causal_mask(q.shape[-2], q.device), float("-inf"))
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    return logits.softmax(dim=-1)


@each_sequence_alone(3)
def softmax_attention_naive(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Explicit softmax attention ``(B, H, Nq, P), (B, H, Nk, P), (B, H, Nk, Pv) -> (B, H, Nq, Pv)``.

    With ``attention_mask``/``cu_seqlens`` (``Nq == Nk``): each sequence's real tokens run alone (the definition),
    ``out_i = sum_{j: s(j) = s(i)} softmax_j(q_i k_j^T * scale [j <= i]) v_j``; padding rows are 0."""
    attn = softmax_attention_weights(q, k, causal=causal, scale=scale)
    if dropout_p > 0.0:
        attn = F.dropout(attn, p=dropout_p, training=True)
    return torch.matmul(attn, v.to(attn.dtype)).to(v.dtype)
