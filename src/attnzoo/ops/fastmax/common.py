"""Shared pieces of the Fastmax op: eps, validation, the polynomial kernel f (FAST eq 8) and its feature map.

The factorisation of FAST eqs 24-29 is written here as an explicit feature map ``phi`` with
``phi(q) . phi(k) = f(q . k)``::

    p = 1:  phi(x) = [1, x]                          (P = 1 + D)
    p = 2:  phi(x) = [1, x, vec(x x^T) / sqrt(2)]    (P = 1 + D + D^2)

so ``sum_n phi(k_n) [v_n, 1]^T`` stacks the paper's moment sums: its rows are x^(1), x^(2), x^(3)/sqrt(2)
(numerator, eq 28) and its last column y^(1), y^(2), y^(3)/sqrt(2) (denominator, eq 29). Splitting the 1/2!
of f as 1/sqrt(2) on each side keeps phi the same for queries and keys, so one vjp serves both. Where nothing
reads single features (decoding's running sums, the fused CPU kernel; not the feature dropout of FAST §2.4),
p = 2 uses the symmetric half of the quadratic block, :func:`half_features` (P = 1 + D + D(D+1)/2).
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F

from attnzoo._checks import check_ndim, check_positive_int
from attnzoo.ops._dtypes import acc_dtype

__all__ = [
    "EPS",
    "VALID_P",
    "DEFAULT_CHUNK",
    "check_p",
    "resolve_scale",
    "compute_dtype",
    "standardize",
    "kernel",
    "kernel_grad",
    "feature_dim",
    "features",
    "features_vjp",
    "half_block",
    "half_feature_dim",
    "half_features",
    "validate_qkv",
    "validate_options",
]

#: eps added to the per-token variance in the standardisation (eq 6); shared by every path
EPS = 1e-5
VALID_P = (1, 2)
#: tokens per chunk of the chunked sweeps (bounds temporaries to chunk * D^p per head)
DEFAULT_CHUNK = 64

SQRT_HALF = math.sqrt(0.5)  # phi's weight on its quadratic block (eq 27)


def check_p(p) -> None:
    """Raise ``ValueError`` unless ``p`` is one of the orders FAST factorises (1 or 2)."""
    if isinstance(p, bool) or not isinstance(p, int) or p not in VALID_P:
        raise ValueError(f"p={p!r} is not supported; Fastmax's Taylor order p must be one of {list(VALID_P)}")


def resolve_scale(scale, d: int) -> float:
    """``None`` -> ``D**-0.5``; otherwise a finite positive number (``1.0`` is FAST's literal eq 7)."""
    if scale is None:
        return float(d) ** -0.5
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale={scale!r} must be a finite positive number (or None for head_dim**-0.5)")
    return float(scale)


#: float64 stays float64; everything else (fp16/bf16/fp32) is computed and accumulated in float32
compute_dtype = acc_dtype


def standardize(x: torch.Tensor, eps: float = EPS, scale: float = 1.0) -> torch.Tensor:
    """Eqs 5-6: per-token mean 0 and population std 1 over the last dim, ``scale * (x - mean) / sqrt(var + eps)``.

    The scale rides in layer norm's affine weight: no extra pass over ``x`` (and on CPU layer norm with a
    weight runs faster than without one).
    """
    d = x.shape[-1]
    return F.layer_norm(x, (d,), weight=x.new_full((d,), scale), eps=eps)


def kernel(s: torch.Tensor, p: int) -> torch.Tensor:
    """Eq 8: ``f(s) = sum_{l <= p} s^l / l!``."""
    if p == 1:
        return 1.0 + s
    return 1.0 + s + 0.5 * s * s


def kernel_grad(s: torch.Tensor, p: int) -> torch.Tensor:
    """``f'(s)``: 1 for p=1, ``1 + s`` for p=2 (the factor of eqs 14-15, 36)."""
    if p == 1:
        return torch.ones_like(s)
    return 1.0 + s


def feature_dim(d: int, p: int) -> int:
    """Length P of ``phi``: ``1 + D`` (p=1) or ``1 + D + D^2`` (p=2)."""
    return 1 + d + (d * d if p == 2 else 0)


def features(x: torch.Tensor, p: int) -> torch.Tensor:
    """``phi(x)``: ``(..., N, D) -> (..., N, P)`` with ``phi(q) . phi(k) = f(q . k)`` (eqs 24-27)."""
    parts = [x.new_ones(x.shape[:-1] + (1,)), x]
    if p == 2:
        parts.append((x.unsqueeze(-1) * x.unsqueeze(-2)).flatten(-2) * SQRT_HALF)
    return torch.cat(parts, dim=-1)


def half_feature_dim(d: int, p: int) -> int:
    """Length of :func:`half_features`: ``1 + D`` (p=1) or ``1 + D + D(D+1)/2`` (p=2)."""
    return 1 + d + (d * (d + 1) // 2 if p == 2 else 0)


def _half_index(d: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows and columns of the upper triangle of a ``D x D`` block, row by row, and whether each is diagonal."""
    rows, cols = torch.triu_indices(d, d, device=device)
    return rows, cols, rows == cols


def half_features(x: torch.Tensor, p: int) -> torch.Tensor:
    """``phi(x)`` with p=2's quadratic block reduced to its symmetric half: ``(..., N, D) -> (..., N, P)``,
    ``[1, x, (x_a x_b)_{a <= b} * (1/sqrt(2) if a = b else 1)]`` row by row (the layout of the fused CPU kernel).
    The same ``phi(q) . phi(k) = f(q . k)``, since ``(q . k)^2 / 2 = sum_a q_a^2 k_a^2 / 2 + sum_{a<b} (q_a q_b)
    (k_a k_b)``, with 2,145 features at D = 64 instead of 4,161: the running sums of decoding are half as large."""
    if p == 1:
        return features(x, p)
    rows, cols, diag = _half_index(x.shape[-1], x.device)
    quad = x[..., rows] * x[..., cols]
    quad = torch.where(diag, quad * SQRT_HALF, quad)
    return torch.cat([x.new_ones(x.shape[:-1] + (1,)), x, quad], dim=-1)


def half_block(m: torch.Tensor) -> torch.Tensor:
    """The symmetric half of a stacked quadratic block: ``m (..., D, D, X) -> (..., D(D+1)/2, X)`` in
    :func:`half_features`' order, the diagonal rows times ``1/sqrt(2)``: ``sum_n (k_n k_n^T) (x) v_n`` becomes the
    p=2 rows of ``sum_n half_features(k_n) v_n^T``."""
    rows, cols, diag = _half_index(m.shape[-3], m.device)
    half = m[..., rows, cols, :]
    return torch.where(diag[:, None], half * SQRT_HALF, half)


def features_vjp(x: torch.Tensor, u: torch.Tensor, p: int) -> torch.Tensor:
    """``d/dx (phi(x) . u)`` per token: ``x (..., N, D)``, ``u (..., N, P)`` -> ``(..., N, D)``."""
    d = x.shape[-1]
    g = u[..., 1 : 1 + d]
    if p == 2:
        u2 = u[..., 1 + d :].unflatten(-1, (d, d))
        # d/dx (x^T U x / sqrt2) = (U + U^T) x / sqrt2; symmetrising keeps this exact for any u
        g = g + torch.einsum("...de,...e->...d", u2 + u2.transpose(-1, -2), x) * SQRT_HALF
    return g


def validate_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Shapes ``q, k (B, H, N, D)`` and ``v (B, H, N, Dv)`` on one device with one dtype, N >= 1."""
    check_ndim("q", q, 4, "(B, H, N, D)")
    check_ndim("k", k, 4, "(B, H, N, D)")
    check_ndim("v", v, 4, "(B, H, N, Dv)")
    if q.shape != k.shape:
        raise ValueError(f"q and k must have the same shape (B, H, N, D): got {tuple(q.shape)} and {tuple(k.shape)}")
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v must agree with q on (B, H, N): got v {tuple(v.shape)} and q {tuple(q.shape)}")
    if q.shape[2] < 1:
        raise ValueError(f"sequences must hold at least one token (N >= 1), got N={q.shape[2]}")
    if q.shape[3] < 1 or v.shape[3] < 1:
        raise ValueError(f"head dims must be >= 1, got D={q.shape[3]} and Dv={v.shape[3]}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")


def validate_options(p, scale, chunk_size, d: int) -> tuple[float, int]:
    """Validate op options (the backend is the dispatcher's); returns the resolved ``(scale, chunk_size)``."""
    check_p(p)
    if chunk_size is None:
        chunk_size = DEFAULT_CHUNK
    else:
        check_positive_int("chunk_size", chunk_size)
    return resolve_scale(scale, d), chunk_size
