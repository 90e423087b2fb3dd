"""Recurrent causal linear attention (Katharopoulos et al., 2020, eqs. 16-20: "transformers are RNNs").

State ``(S, z)``: ``S = sum_j phi(k_j) v_j^T`` ``(B, H, P, Pv)`` and ``z = sum_j phi(k_j)`` ``(B, H, P)``, kept in
float32 (float64 for float64 inputs). Each token costs ``O(P Pv)`` whatever its position.
"""

from __future__ import annotations

import torch

from attnzoo.ops._dtypes import acc_dtype
from attnzoo.ops.linear.naive import feature_map_fn

__all__ = ["linear_attention_recurrent_loop", "init_linear_state", "linear_prompt_state", "LinearState"]

LinearState = tuple[torch.Tensor, torch.Tensor]


def init_linear_state(
    batch_size: int, heads: int, head_dim: int, value_dim: int, *, device=None, dtype=torch.float32
) -> LinearState:
    """Empty state ``(S (B, H, P, Pv), z (B, H, P))`` in the accumulation dtype of ``dtype``."""
    acc = acc_dtype(dtype)
    return (
        torch.zeros(batch_size, heads, head_dim, value_dim, device=device, dtype=acc),
        torch.zeros(batch_size, heads, head_dim, device=device, dtype=acc),
    )


def linear_prompt_state(
    k: torch.Tensor, v: torch.Tensor, *, feature_map: str = "elu", real: torch.Tensor | None = None
) -> LinearState:
    """The state the recurrent step holds after feeding the prompt's keys ``k (B, H, N, P)`` and values ``v (B, H, N,
    Pv)`` (eqs. 18-20): ``S = sum_t phi(k_t) v_t^T`` ``(B, H, P, Pv)`` and ``z = sum_t phi(k_t)`` ``(B, H, P)`` over
    each row's real tokens (``real (B, N)``, or all), in the accumulation dtype of ``k``."""
    acc = acc_dtype(k.dtype)
    fk = feature_map_fn(feature_map)(k.to(acc))
    if real is not None:  # padding adds nothing
        fk = fk * real[:, None, :, None].to(device=fk.device, dtype=acc)
    return fk.transpose(-1, -2) @ v.to(acc), fk.sum(dim=2)


def linear_attention_recurrent_loop(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state: LinearState,
    *,
    feature_map: str,
    eps: float,
) -> tuple[torch.Tensor, LinearState]:
    """Token-by-token state updates over ``N`` tokens; returns outputs ``(B, H, N, Pv)`` and the new state. ``k, v``
    have ``G`` heads dividing ``q``'s ``H``; the state is kept per key/value head ``(B, G, P, Pv)``, ``(B, G, P)``
    and read by its ``H / G`` query heads."""
    phi = feature_map_fn(feature_map)
    s, z = state
    acc = s.dtype
    fq, fk, va = phi(q.to(acc)), phi(k.to(acc)), v.to(acc)
    b, h, _, p = q.shape
    g = k.shape[1]
    outs = []
    for t in range(q.shape[-2]):
        fq_t = fq[:, :, t].reshape(b, g, h // g, p)  # each key/value head's query heads
        # eq. 18-19: fold token t into the state before reading it (the causal mask includes j = t); addcmul forms
        # the outer product phi(k_t) v_t^T inside the sum, without a (B, G, P, Pv) temporary per token
        s = torch.addcmul(s, fk[:, :, t, :, None], va[:, :, t, None, :])
        z = z + fk[:, :, t]
        den = fq_t @ z.unsqueeze(-1)  # (B, G, H / G, 1)
        outs.append(((fq_t @ s) / (den + eps)).reshape(b, h, 1, -1))
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)  # one decoded token: no copy
    return out.to(v.dtype), (s, z)
