"""Fast cross-covariance attention: the token-axis normalisation is folded into the ``(P, P)`` Gram matrix
(``q_hat^T k_hat = (q^T k) / (|q| |k|^T)``), so the normalised ``(N, P)`` copies of ``q`` and ``k`` are never
written. Same result as :mod:`.naive` up to rounding; the clamp matches ``F.normalize``'s ``eps``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnzoo.ops._dtypes import acc_dtype

__all__ = ["xca_fused"]

_NORM_EPS = 1e-12  # F.normalize's default: a zero column maps to zero, never to NaN


def xca_fused(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, temp: torch.Tensor, *, dropout_p: float = 0.0
) -> torch.Tensor:
    """``(B, H, N, P) x3, temp (H, 1, 1) -> (B, H, N, P)`` in ``O(N P^2)`` with one Gram matmul."""
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
