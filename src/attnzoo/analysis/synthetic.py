"""Synthetic token data: AoT's mixture of noisy low-rank Gaussians (Definition 1) and CBSA Fig. 4's
noisy one-dimensional subspaces. Tokens are rows: ``Z: (N, d)``.
"""

from __future__ import annotations

import torch

from attnzoo._checks import check_positive_int

__all__ = ["orthonormal_bases", "subspace_mixture", "noisy_lines"]


def _check_nonneg(name: str, value) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
        raise ValueError(f"{name} must be a non-negative number, got {value!r}")


def orthonormal_bases(
    k: int, d: int, p: int, *, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """``K`` mutually orthogonal ``p``-dim subspaces of ``R^d``: ``U: (K, d, p)`` with ``[U_1 … U_K] ∈ O(d, Kp)``
    (AoT eq 7)."""
    for name, v in (("k", k), ("d", d), ("p", p)):
        check_positive_int(name, v)
    if k * p > d:
        raise ValueError(f"K*p = {k}*{p} = {k * p} orthogonal directions do not fit in d={d}; need K*p <= d")
    g = torch.randn(d, k * p, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(g)
    q = q * torch.sign(torch.diagonal(r))  # make the factorisation unique (Haar-distributed q)
    return q.T.reshape(k, p, d).transpose(1, 2).contiguous().to(dtype)


def subspace_mixture(
    k: int,
    p: int,
    n_per: int,
    *,
    d: int | None = None,
    delta: float = 0.1,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens from AoT Definition 1: ``z_i = U_k a_i + Σ_{j≠k} U_j e_{i,j}`` for ``i ∈ C_k`` (eq 1).

    ``a_i ~ N(0, I_p)``, ``e_{i,j} ~ N(0, δ² I_p)``, orthogonal subspaces (eq 7), ``N_k = n_per``.
    Returns ``Z: (K·n_per, d)`` (clusters contiguous, as in AoT's arrangement), ``labels: (N,)``,
    ``U: (K, d, p)``. ``d`` defaults to ``K·p``.
    """
    check_positive_int("n_per", n_per)
    _check_nonneg("delta", delta)
    d = k * p if d is None else d
    u = orthonormal_bases(k, d, p, generator=generator)
    coeff = delta * torch.randn(k, n_per, k, p, generator=generator, dtype=torch.float64)
    signal = torch.randn(k, n_per, p, generator=generator, dtype=torch.float64)
    idx = torch.arange(k)
    coeff[idx, :, idx, :] = signal  # own subspace: signal a_i; other subspaces: noise e_{i,j}
    z = torch.einsum("cnkp,kdp->cnd", coeff, u).reshape(k * n_per, d)
    labels = torch.arange(k).repeat_interleave(n_per)
    return z.to(dtype), labels, u.to(dtype)


def noisy_lines(
    classes: int = 10,
    n_per: int = 50,
    *,
    dim: int = 3,
    noise: float = 0.1,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CBSA Fig. 4 data: per class, points ``t·u_c + noise`` on a random line through 0 in ``R^dim``.

    ``t ~ N(0, 1)``, noise ``~ N(0, noise² I)``. Returns ``Z: (classes, n_per, dim)``,
    ``labels: (classes·n_per,)`` and unit ``directions: (classes, dim)``.
    """
    check_positive_int("classes", classes)
    check_positive_int("n_per", n_per)
    check_positive_int("dim", dim)
    _check_nonneg("noise", noise)
    dirs = torch.randn(classes, dim, generator=generator, dtype=torch.float64)
    dirs = dirs / dirs.norm(dim=-1, keepdim=True)
    t = torch.randn(classes, n_per, 1, generator=generator, dtype=torch.float64)
    z = t * dirs[:, None, :] + noise * torch.randn(classes, n_per, dim, generator=generator, dtype=torch.float64)
    labels = torch.arange(classes).repeat_interleave(n_per)
    return z.to(dtype), labels, dirs.to(dtype)
