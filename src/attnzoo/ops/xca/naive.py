"""Reference cross-covariance attention (XCiT, El-Nouby et al., 2021, eq. 2): ``q, k`` L2-normalised along the
token axis, a ``(P, P)`` channel-attention map ``softmax(q_hat^T k_hat * tau)`` per head, applied to ``v``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnzoo.ops._dtypes import acc_dtype
from attnzoo.ops._segment_ops import each_sequence_alone

__all__ = ["xca_naive", "xca_weights"]


def xca_weights(q: torch.Tensor, k: torch.Tensor, temp: torch.Tensor) -> torch.Tensor:
    """``softmax(q_hat^T k_hat * temp)`` over the last axis: ``(B, H, P, P)`` in the accumulation dtype."""
    acc = acc_dtype(q.dtype)
    qn = F.normalize(q.to(acc), dim=-2)
    kn = F.normalize(k.to(acc), dim=-2)
    logits = torch.matmul(qn.transpose(-1, -2), kn) * temp.to(acc)
    return logits.softmax(dim=-1)


@each_sequence_alone(3)
def xca_naive(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    temp: torch.Tensor,
    *,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """``(B, H, N, P) x3, temp (H, 1, 1) -> (B, H, N, P)``: ``out[n, i] = sum_j A[i, j] v[n, j]``.

    With ``attention_mask``/``cu_seqlens``: each sequence's real tokens run alone (the definition): ``A_s`` from the
    norms and covariance of sequence ``s``'s tokens, ``out[n] = A_{s(n)} v[n]``; padding rows are 0."""
    attn = xca_weights(q, k, temp)
    if dropout_p > 0.0:
        attn = F.dropout(attn, p=dropout_p, training=True)
    return torch.matmul(v.to(attn.dtype), attn.transpose(-1, -2)).to(v.dtype)
