"""Reference linear attention (Katharopoulos et al., 2020, eqs. 4-6 and 9): explicit ``(N, N)`` kernel matrix
``phi(Q) phi(K)^T`` [lower-triangular when causal], row-normalised, times ``V``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnzoo.ops._dtypes import acc_dtype
from attnzoo.ops._segment_ops import attention_allowed, each_sequence_alone
from attnzoo.ops._varlen import segments

__all__ = ["FEATURE_MAPS", "feature_map_fn", "linear_attention_naive", "linear_attention_weights"]


def _elu_plus_one(x: torch.Tensor) -> torch.Tensor:
    # Katharopoulos et al. eq. 7: phi(x) = elu(x) + 1 keeps features positive with non-vanishing gradient.
    return F.elu(x) + 1.0


FEATURE_MAPS = {"elu": _elu_plus_one, "relu": F.relu}


def feature_map_fn(name: str):
    if not isinstance(name, str) or name not in FEATURE_MAPS:
        raise ValueError(f"feature_map={name!r} is not supported; valid feature maps: {sorted(FEATURE_MAPS)}")
    return FEATURE_MAPS[name]


def linear_attention_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    causal: bool,
    feature_map: str,
    eps: float,
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """The normalised kernel matrix ``phi(q_i)^T phi(k_j) / (sum_j' phi(q_i)^T phi(k_j') + eps)``: ``(B, H, N, N)``
    (with ``attention_mask``/``cu_seqlens``: ``j, j'`` over ``i``'s own sequence's real tokens; padding rows 0)."""
    phi = feature_map_fn(feature_map)
    acc = acc_dtype(q.dtype)
    a = torch.matmul(phi(q.to(acc)), phi(k.to(acc)).transpose(-1, -2))
    if causal:
        a = torch.tril(a)
    seg = segments(q.shape[0], q.shape[2], attention_mask=attention_mask, cu_seqlens=cu_seqlens, device=q.device)
    if seg is not None:
        a = a.masked_fill(~attention_allowed(seg, causal, pad_self=False), 0.0)
    return a / (a.sum(dim=-1, keepdim=True) + eps)


@each_sequence_alone(3)
def linear_attention_naive(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    feature_map: str = "elu",
    eps: float = 1e-6,
) -> torch.Tensor:
    """``(B, H, N, P) x3 -> (B, H, N, Pv)`` through the explicit normalised kernel matrix (O(N^2)).

    With ``attention_mask``/``cu_seqlens``: each sequence's real tokens run alone (the definition),
    ``out_i = sum_{j: s(j) = s(i) [, j <= i]} phi(q_i)^T phi(k_j) v_j / (sum_j phi(q_i)^T phi(k_j) + eps)``;
    padding rows are 0."""
    attn = linear_attention_weights(q, k, causal=causal, feature_map=feature_map, eps=eps)
    return torch.matmul(attn, v.to(attn.dtype)).to(v.dtype)
