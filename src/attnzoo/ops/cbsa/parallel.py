"""Fast CBSA in row layout ``(B, H, N, P)``: O(N M P) for "cbsa"/"agent", O(N P^2) for "linear", "channel"
and the exact "mssa" contraction, with no N x N matrix except in the softmax "mssa" variant (fused SDPA).

The exact contraction ``(I_m + a R R^T)^{-1} R`` (eq 7, row form) is solved with a Cholesky factor of
whichever Gram is smaller, using the push-through identity ``(I_m + a R R^T)^{-1} R = R (I_P + a R^T R)^{-1}``:
that is what makes the exact MSSA contraction (m = N) linear in N. Both matrices are >= I, hence
well conditioned. Inputs are assumed validated by :func:`attnzoo.ops.cbsa.cbsa`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnzoo.ops._varlen import Segments
from attnzoo.ops.cbsa.varlen import cbsa_varlen

__all__ = ["cbsa_fast"]


def _mT(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(-1, -2)


def _spd_solve_left(K: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """``K^{-1} X`` for symmetric positive-definite ``K``."""
    return torch.cholesky_solve(X, torch.linalg.cholesky(K))


def _exact_contract(R: torch.Tensor, a: float, need_matrix: bool):
    """Row-form eq 7: ``(I_m + a R R^T)^{-1} R`` for ``R`` ``(B, H, m, P)``; optionally the (m, m) inverse."""
    m, p = R.shape[-2:]
    if m <= p:
        K = torch.eye(m, dtype=R.dtype, device=R.device) + a * (R @ _mT(R))
        Lk = torch.linalg.cholesky(K)
        C = torch.cholesky_solve(R, Lk)
        G = torch.cholesky_inverse(Lk) if need_matrix else None
    else:
        K = torch.eye(p, dtype=R.dtype, device=R.device) + a * (_mT(R) @ R)
        C = _mT(_spd_solve_left(K, _mT(R)))  # K symmetric: R K^{-1} = (K^{-1} R^T)^T
        G = None
        if need_matrix:  # only when internals are asked for: O(m^2) memory is then unavoidable
            G = torch.linalg.inv(torch.eye(m, dtype=R.dtype, device=R.device) + a * (R @ _mT(R)))
    return C, G


def cbsa_fast(
    w: torch.Tensor,
    reps: torch.Tensor | None,
    *,
    variant: str,
    contraction: str | None,
    eps: float,
    scale: float,
    eta,
    need_internals: bool = False,
    toks: Segments | None = None,
    reps_seg: Segments | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CBSA(Z | U) of eqs 5, 7/8 and its §3.3 variants; ``w``: ``(B, H, N, P)`` -> ``(B, H, N, P)``.

    ``toks`` / ``reps_seg``: sequences of the tokens and representatives (padded batch or packed row)."""
    if toks is not None:
        kw = dict(variant=variant, contraction=contraction, eps=eps, scale=scale, eta=eta)
        return cbsa_varlen(w, reps, toks, reps_seg, **kw), {}
    p = w.shape[-1]
    internals: dict[str, torch.Tensor] = {}

    if variant in ("cbsa", "agent"):
        # extraction (eq 5): each representative attends over all N tokens (prefix tokens included)
        attn = torch.softmax((reps @ _mT(w)) * scale, dim=-1)  # (B, H, M, N) = A_k^T
        R = reps + eta * (attn @ w)
        if variant == "agent":
            C = R
        elif contraction == "softmax":  # eq 8, an M x M self-attention among the representatives
            G = torch.softmax((R @ _mT(R)) * scale, dim=-1)
            C = G @ R
        else:
            C, G = _exact_contract(R, p / (R.shape[-2] * eps**2), need_internals)
        if need_internals:
            internals["attn_extract"] = attn
            internals["reps"] = R
            if variant != "agent":
                internals["attn_contract"] = G
                internals["contracted"] = C
        return _mT(attn) @ C, internals  # broadcast with A_k

    if variant == "mssa":
        n = w.shape[-2]
        if contraction == "softmax":
            out = F.scaled_dot_product_attention(w, w, w, scale=scale)
            if need_internals:
                internals["attn_contract"] = torch.softmax((w @ _mT(w)) * scale, dim=-1)
            return out, internals
        out, G = _exact_contract(w, p / (n * eps**2), need_internals)
        if need_internals:
            internals["attn_contract"] = G
        return out, internals

    if variant == "linear":
        # eq 12 in closed form: W F(W^T W) with F(S) = eps^2 (eps^2 I + S)^{-1} = (I + S / eps^2)^{-1}
        K = torch.eye(p, dtype=w.dtype, device=w.device) + (_mT(w) @ w) / eps**2
        Lk = torch.linalg.cholesky(K)
        out = _mT(torch.cholesky_solve(_mT(w), Lk))
        if need_internals:
            internals["filter"] = torch.cholesky_inverse(Lk)
        return out, internals

    if variant == "channel":
        # eq 13: per-channel scaling by f of the channel's second moment over tokens
        d = eps**2 / (eps**2 + (w * w).sum(dim=-2, keepdim=True))  # (B, H, 1, P)
        if need_internals:
            internals["filter"] = torch.diag_embed(d.squeeze(-2))
        return w * d, internals

    raise AssertionError(f"unvalidated variant {variant!r}")  # pragma: no cover
