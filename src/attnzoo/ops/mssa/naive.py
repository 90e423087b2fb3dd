"""Reference multi-head subspace self-attention (MSSA; CRATE, Yu et al. 2023; AoT eqs. 3 and 5, causal form in §4.1):
per head ``w = U_k^T z``, ``softmax(q w^T * scale [masked]) w`` with the shared projection as query, key and value
(``q = w``, or ``w`` with unit-norm rows when ``normalize_query``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnzoo.ops._segment_ops import each_sequence_alone
from attnzoo.ops.softmax.naive import softmax_attention_naive, softmax_attention_weights

__all__ = ["mssa_naive", "mssa_weights", "mssa_query"]


def mssa_query(w: torch.Tensor, normalize_query: bool) -> torch.Tensor:
    """AoT §4.1's ``P(U_k^T Z)``: each token's projection put on the unit sphere (only the query side)."""
    return F.normalize(w, dim=-1) if normalize_query else w


def mssa_weights(
    w: torch.Tensor, *, causal: bool, scale: float, normalize_query: bool, allowed: torch.Tensor | None = None
) -> torch.Tensor:
    """MSSA attention map ``softmax(q w^T * scale)``: ``(B, H, N, N)``, rows are queries (``allowed``: as in
    :func:`~attnzoo.ops.softmax.naive.softmax_attention_weights`)."""
    return softmax_attention_weights(mssa_query(w, normalize_query), w, causal=causal, scale=scale, allowed=allowed)


@each_sequence_alone(1)
def mssa_naive(
    w: torch.Tensor,
    *,
    causal: bool = False,
    scale: float,
    normalize_query: bool = False,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """``(B, H, N, P) -> (B, H, N, P)``: explicit ``softmax(q w^T * scale [masked]) w``.

    With ``attention_mask``/``cu_seqlens``: each sequence's real tokens run alone (the definition),
    ``out_i = sum_{j: s(j) = s(i)} softmax_j(q_i w_j^T * scale [j <= i]) w_j``; padding rows are 0."""
    return softmax_attention_naive(
        mssa_query(w, normalize_query), w, w, causal=causal, scale=scale, dropout_p=dropout_p
    )
