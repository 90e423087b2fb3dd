"""Fast cross-covariance attention: the token-axis normalisation is folded into the ``(P, P)`` Gram matrix
(``q_hat^T k_hat = (q^T k) / (|q| |k|^T)``), so the normalised ``(N, P)`` copies of ``q`` and ``k`` are never
written. Same result as :mod:`.naive` up to rounding; the clamp matches ``F.normalize``'s ``eps``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnzoo.ops._dtypes import acc_dtype
from attnzoo.ops._segment_ops import apply_per_segment, real_4d, segment_onehot, zero_padding
from attnzoo.ops._varlen import Segments, segments

__all__ = ["xca_fused", "xca_segment_weights"]

_NORM_EPS = 1e-12  # F.normalize's default: a zero column maps to zero, never to NaN


def xca_fused(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    temp: torch.Tensor,
    *,
    dropout_p: float = 0.0,
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(B, H, N, P) x3, temp (H, 1, 1) -> (B, H, N, P)`` in ``O(N P^2)`` with one Gram matmul."""
    seg = segments(q.shape[0], q.shape[2], attention_mask=attention_mask, cu_seqlens=cu_seqlens, device=q.device)
    if seg is not None:
        return _xca_segments(q, k, v, temp, seg, dropout_p)
    acc = acc_dtype(q.dtype)
    qa, ka = q.to(acc), k.to(acc)
    gram = torch.matmul(qa.transpose(-1, -2), ka)  # (B, H, P, P)
    qnorm = torch.linalg.vector_norm(qa, dim=-2).clamp_min(_NORM_EPS)  # (B, H, P)
    knorm = torch.linalg.vector_norm(ka, dim=-2).clamp_min(_NORM_EPS)
    logits = gram * (temp.to(acc) / (qnorm.unsqueeze(-1) * knorm.unsqueeze(-2)))
    attn = logits.softmax(dim=-1)
    if dropout_p > 0.0:
        attn = F.dropout(attn, p=dropout_p, training=True)
    return torch.matmul(v.to(acc), attn.transpose(-1, -2)).to(v.dtype)


def xca_segment_weights(q: torch.Tensor, k: torch.Tensor, temp: torch.Tensor, seg: Segments) -> torch.Tensor:
    """Per sequence ``s``: ``G_s = sum_{n in s} q_n^T k_n`` ``(P, P)``, ``|q|_s^2 = sum_{n in s} q_n^2`` (real
    tokens only, by one-hot segment sums), ``A_s = softmax(G_s * temp / (|q|_s |k|_s^T))``: ``(B, H, S, P, P)``."""
    acc = acc_dtype(q.dtype)
    real = real_4d(seg)
    zero = torch.zeros((), dtype=acc, device=q.device)
    # padding zeroed before any sum (``where``: its loud values never meet the arithmetic, and get zero gradient)
    qa, ka = (torch.where(real, t.to(acc), zero) for t in (q, k))
    onehot = segment_onehot(seg, acc)  # (B, N, S)
    if seg.num == 1:
        gram = torch.matmul(qa.transpose(-1, -2), ka).unsqueeze(2)  # (B, H, 1, P, P)
    else:
        gram = torch.einsum("bns,bhnp,bhnr->bhspr", onehot, qa, ka)
    qnorm = torch.einsum("bns,bhnp->bhsp", onehot, qa * qa).sqrt().clamp_min(_NORM_EPS)  # (B, H, S, P)
    knorm = torch.einsum("bns,bhnp->bhsp", onehot, ka * ka).sqrt().clamp_min(_NORM_EPS)
    logits = gram * (temp.to(acc).unsqueeze(1) / (qnorm.unsqueeze(-1) * knorm.unsqueeze(-2)))
    return logits.softmax(dim=-1)


def _xca_segments(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, temp: torch.Tensor, seg: Segments, dropout_p: float
) -> torch.Tensor:
    """``out_n = v_n A_{s(n)}^T`` with :func:`xca_segment_weights`; padding rows 0."""
    attn = xca_segment_weights(q, k, temp, seg)
    if dropout_p > 0.0:
        attn = F.dropout(attn, p=dropout_p, training=True)
    va = torch.where(real_4d(seg), v.to(attn.dtype), torch.zeros((), dtype=attn.dtype, device=v.device))
    return zero_padding(apply_per_segment(va, attn.transpose(-1, -2), seg), seg).to(v.dtype)
