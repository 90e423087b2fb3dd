"""Parameter-free iterations the papers analyse, and explicit reference layers for rank-collapse stacks.

- AoT eq 3: ``Z⁺ = Z + η Σ_k U_k U_kᵀ Z φ(Zᵀ U_k U_kᵀ Z)`` with ``φ`` = soft-max or Theorem 1's
  thresholded soft-max ``h(σ(·))``, ``h(x) = τ·1{x > τ}``.
- CBSA eq 12 (linear-attention variant): ``Z⁺ = Z − κ Σ_k U_k L_k (I + Σ_k²/ε²)⁻¹ L_kᵀ U_kᵀ Z``.
- Dong et al. / CSP: a multi-head softmax self-attention layer (written out) and a CSP layer (eq 4, through
  :func:`attnzoo.ops.csp`), both without skip connections or projections after the value map, so stacks can
  be probed without any module.

Tokens are rows: ``Z: (..., N, d)``; bases ``U: (K, d, p)``.
"""

from __future__ import annotations

import math

import torch

from attnzoo import ops
from attnzoo._checks import check_choice, check_positive_finite, check_positive_int
from attnzoo.ops.csp import csp_shifts

__all__ = [
    "aot_denoise_step",
    "aot_denoise",
    "cbsa_linear_step",
    "softmax_attention_reference",
    "csp_reference",
]


def _check_z_u(z: torch.Tensor, u: torch.Tensor) -> None:
    if not isinstance(z, torch.Tensor) or z.ndim < 2 or not z.is_floating_point():
        raise ValueError("Z must be a floating-point tensor of shape (..., N, d)")
    if not isinstance(u, torch.Tensor) or u.ndim != 3 or u.shape[1] != z.shape[-1]:
        shape = tuple(u.shape) if isinstance(u, torch.Tensor) else type(u).__name__
        raise ValueError(f"U must have shape (K, d={z.shape[-1]}, p), got {shape}")


def aot_denoise_step(
    z: torch.Tensor, u: torch.Tensor, *, eta: float = 0.5, phi: str = "threshold", tau: float = 0.75
) -> torch.Tensor:
    """One step of AoT eq 3 on ``Z: (..., N, d)`` with bases ``U: (K, d, p)``.

    ``phi="softmax"`` uses ``φ = σ`` column-wise (eq 4); ``phi="threshold"`` uses Theorem 1's
    ``φ(x) = h(σ(x))``, ``h(x) = τ·1{x > τ}``.
    """
    _check_z_u(z, u)
    check_choice("phi", phi, ["softmax", "threshold"])
    check_positive_finite("eta", eta)
    if phi == "threshold" and not 0 < tau <= 1:
        raise ValueError(f"tau must lie in (0, 1] (Theorem 1 takes tau in (1/2, 1]), got {tau!r}")
    u = u.to(z.dtype)
    proj = torch.einsum("...nd,kdp->...knp", z, u)  # rows: (U_kᵀ z_j)ᵀ
    m = proj @ proj.transpose(-1, -2)  # M_k = Zᵀ U_k U_kᵀ Z, symmetric (N, N)
    # φ acts on each column m_i of M_k; by symmetry the column soft-max is the row soft-max transposed,
    # and the update's row i needs φ(m_i)ᵀ, i.e. the row soft-max itself.
    s = torch.softmax(m, dim=-1)
    if phi == "threshold":
        s = torch.where(s > tau, torch.full_like(s, tau), torch.zeros_like(s))
    update = torch.einsum("...kij,...kjp,kdp->...id", s, proj, u)
    return z + eta * update


def aot_denoise(
    z: torch.Tensor, u: torch.Tensor, layers: int, *, eta: float = 0.5, phi: str = "threshold", tau: float = 0.75
) -> list[torch.Tensor]:
    """Unroll :func:`aot_denoise_step` ``layers`` times; returns ``[Z⁽⁰⁾, …, Z⁽ᴸ⁾]``."""
    check_positive_int("layers", layers)
    out = [z]
    for _ in range(layers):
        out.append(aot_denoise_step(out[-1], u, eta=eta, phi=phi, tau=tau))
    return out


def cbsa_linear_step(z: torch.Tensor, u: torch.Tensor, *, eps: float = 0.1, kappa: float = 0.5) -> torch.Tensor:
    """One forward step of CBSA's linear-attention variant (eq 12) with the residual of eq 6.

    ``Z⁺ = Z − κ Σ_k U_k L_k (I + Σ_k²/ε²)⁻¹ L_kᵀ U_kᵀ Z`` where ``U_kᵀZ = L_k Σ_k R_kᵀ`` (eq 10): the
    principal directions of each subspace are kept, low-variance directions shrink. ``Z: (..., N, d)``.
    """
    _check_z_u(z, u)
    check_positive_finite("eps", eps)
    check_positive_finite("kappa", kappa)
    u = u.to(z.dtype)
    proj = torch.einsum("...nd,kdp->...knp", z, u)  # (..., K, N, p)
    cov = proj.transpose(-1, -2) @ proj  # (U_kᵀZ)(U_kᵀZ)ᵀ = L Σ² Lᵀ, (p, p)
    lam, vecs = torch.linalg.eigh(0.5 * (cov + cov.transpose(-1, -2)))
    gain = eps**2 / (eps**2 + lam.clamp_min(0))  # f(λ) = ε²/(ε²+λ) on the spectrum
    shrink = (vecs * gain[..., None, :]) @ vecs.transpose(-1, -2)
    update = torch.einsum("...knp,...kpq,kdq->...nd", proj, shrink, u)
    return z - kappa * update


def softmax_attention_reference(
    x: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor, heads: int
) -> torch.Tensor:
    """Multi-head softmax self-attention without skip (Dong et al. 2021): ``‖_h softmax(Q_h K_hᵀ/√D) V_h``.

    ``x: (..., N, C)``, ``w*: (C, C)`` (``Q = x wq``); heads split the channels. Returns ``(..., N, C)``.
    """
    # Not ops.softmax_attention: the op multiplies the scores by D^-1/2 where Dong et al. (and this reference) divide
    # by √D; for a head size D that is not a power of 4 the two differ in the last bit, which the rank-collapse stacks
    # amplify (5.9109e-12 vs 5.9108e-12 after the smoke probe's 4 layers) into different published residuals.
    check_positive_int("heads", heads)
    c = x.shape[-1]
    if c % heads:
        raise ValueError(f"channels C={c} must be divisible by heads={heads}")

    def split(t: torch.Tensor) -> torch.Tensor:
        return t.unflatten(-1, (heads, c // heads)).transpose(-2, -3)  # (..., H, N, D)

    q, k, v = split(x @ wq), split(x @ wk), split(x @ wv)
    a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(c // heads), dim=-1)
    return (a @ v).transpose(-2, -3).flatten(-2)


def csp_reference(x: torch.Tensor, w: torch.Tensor, *, group_size: int = 2) -> torch.Tensor:
    """Channel-wise sample permutation (CSP eq 4) without skip: :func:`attnzoo.ops.csp` on ``V = x w``.

    Channel ``c`` (0-based) is circularly shifted by ``J_c = c·⌈N/C⌉ mod N`` (eq 3, the ``"linear"`` schedule)
    and then, within consecutive groups of ``group_size`` samples, re-ordered so that its ranks follow those
    of channel 0 (the reference channel, ``P_1 = I``). ``x: (..., N, C)``, ``w: (C, C)``; a last group
    shorter than ``group_size`` (``N`` not a multiple of it) is sorted on its own.
    """
    check_positive_int("group_size", group_size)
    v = x @ w
    n, c = v.shape[-2], v.shape[-1]
    flat = v.reshape(-1, n, c)  # ops.csp takes (B, N, C)
    shifts = csp_shifts(n, c, "linear")
    whole = n - n % group_size
    if whole == n:
        return ops.csp(flat, shifts, n // group_size).reshape(v.shape)
    # ops.csp splits N into equal groups; a ragged last group (the probes' N need not divide by group_size)
    # is the same shift (groups of one token) followed by the group sorts of the two parts, unshifted
    shifted = ops.csp(flat, shifts, n)
    no_shift = torch.zeros(c, dtype=torch.long)
    parts = [ops.csp(shifted[:, :whole], no_shift, whole // group_size)] if whole else []
    parts.append(ops.csp(shifted[:, whole:], no_shift, 1))
    return torch.cat(parts, dim=1).reshape(v.shape)
