"""Reference Fastmax with an explicit N x N weight matrix (FAST eqs 5-12 unmasked, 30-31 masked)."""

from __future__ import annotations

import torch

from attnzoo.ops._varlen import Segments
from attnzoo.ops.fastmax.common import EPS, compute_dtype, kernel, validate_options, validate_qkv

__all__ = ["standardize_naive", "explicit_attention", "explicit_attention_from_hat", "fastmax_naive", "naive_from_hat"]


def standardize_naive(x: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """Eqs 5-6 written out: ``(x - mean(x)) / sqrt(mean((x - mean)^2) + eps)`` over the last dim."""
    centred = x - x.mean(dim=-1, keepdim=True)
    var = (centred * centred).mean(dim=-1, keepdim=True)
    return centred / torch.sqrt(var + eps)


def explicit_attention_from_hat(qs: torch.Tensor, k_hat: torch.Tensor, *, p: int, causal: bool) -> torch.Tensor:
    """Eqs 7/10 on already standardised (and scaled) ``qs, k_hat (B, H, N, D)`` -> ``A (B, H, N, N)``."""
    w = kernel(qs @ k_hat.transpose(-1, -2), p)
    if causal:
        n = w.shape[-1]
        keep = torch.ones(n, n, dtype=torch.bool, device=w.device).tril()
        w = torch.where(keep, w, torch.zeros((), dtype=w.dtype, device=w.device))
    return w / w.sum(dim=-1, keepdim=True)


def naive_from_hat(qs: torch.Tensor, k_hat: torch.Tensor, v: torch.Tensor, *, p: int, causal: bool) -> torch.Tensor:
    """Eq 11/12 (eq 30-31 when causal): ``A @ v`` with A built explicitly from ``qs, k_hat``."""
    return explicit_attention_from_hat(qs, k_hat, p=p, causal=causal) @ v


def explicit_attention(
    q: torch.Tensor, k: torch.Tensor, *, p: int = 2, causal: bool = False, scale: float | None = None
) -> torch.Tensor:
    """Fastmax weight matrix ``A (B, H, N, N)`` (eqs 5-10) from raw ``q, k (B, H, N, D)``; rows sum to 1.

    Computed in float32 (float64 for float64 inputs) and returned in that dtype, for analysis.
    """
    validate_qkv(q, k, k)
    scale, _ = validate_options(p, scale, None, q.shape[-1])
    cd = compute_dtype(q.dtype)
    qs = standardize_naive(q.to(cd)) * scale
    return explicit_attention_from_hat(qs, standardize_naive(k.to(cd)), p=p, causal=causal)


def fastmax_naive(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    p: int = 2,
    causal: bool = False,
    scale: float | None = None,
    segs: Segments | None = None,
) -> torch.Tensor:
    """Eqs 5-12 / 30-31 via the explicit N x N matrix: ``q, k (B, H, N, D)``, ``v (B, H, N, Dv)`` -> same as v.

    With ``segs`` (padding masks, packed rows) each sequence runs alone on its real tokens: the definition the
    fast paths must equal; padding positions get zero output."""
    validate_qkv(q, k, v)
    scale, _ = validate_options(p, scale, None, q.shape[-1])
    if segs is not None:
        return _per_sequence(q, k, v, segs, p=p, causal=causal, scale=scale)
    cd = compute_dtype(q.dtype)
    qs = standardize_naive(q.to(cd)) * scale
    out = naive_from_hat(qs, standardize_naive(k.to(cd)), v.to(cd), p=p, causal=causal)
    return out.to(v.dtype)


def _per_sequence(q, k, v, segs: Segments, *, p: int, causal: bool, scale: float) -> torch.Tensor:
    """Each sequence of ``segs`` alone (a loop: this is the reference), scattered into a zero ``(B, H, N, Dv)``."""
    out = v.new_zeros(v.shape)
    for row, idx in segs.sequences():
        idx = idx.to(q.device)
        pick = (slice(row, row + 1), slice(None), idx)
        out[row, :, idx] = fastmax_naive(q[pick], k[pick], v[pick], p=p, causal=causal, scale=scale)[0]
    return out
