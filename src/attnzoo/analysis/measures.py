"""White-box measures: coding rates (MCR², CBSA eq 1-2; ToST eq 1, 4), subspace SNR (AoT eq 6),
rank-collapse residual (CSP eq 6 with the (1, ∞)-norm) and spectra.

Convention: tokens are the *rows* of ``Z`` with shape ``(..., N, d)`` (PyTorch layout), i.e. the
papers' ``Z ∈ R^{d×N}`` transposed. Leading dims are batch dims; every measure returns one value per
batch element (shape ``(...)``). Subspace bases are stacked as ``U: (K, d, p)`` (``U[k]`` = ``U_k``).
Log-determinants are computed in float64.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "coding_rate",
    "compression_term",
    "crate_compression_term",
    "partition_compression",
    "variational_compression",
    "normalize_tokens",
    "subspace_snr",
    "rank1_residual",
    "norm_1_inf",
    "rank_collapse_residual",
    "singular_spectrum",
    "subspace_gram",
]


def _check_tokens(name: str, z: torch.Tensor, min_ndim: int = 2) -> None:
    if not isinstance(z, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape (..., N, d), got {type(z).__name__}")
    if z.ndim < min_ndim:
        raise ValueError(f"{name} must have shape (..., N, d) (at least {min_ndim} dims), got {tuple(z.shape)}")
    if not z.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {z.dtype}")
    if z.shape[-2] < 1 or z.shape[-1] < 1:
        raise ValueError(f"{name} must hold at least one token of at least one feature, got {tuple(z.shape)}")


def _check_eps(eps: float) -> None:
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps > 0 or not math.isfinite(eps):
        raise ValueError(f"eps must be a positive finite number (the quantisation precision ε), got {eps!r}")


def _check_bases(u: torch.Tensor, d: int) -> None:
    if not isinstance(u, torch.Tensor) or u.ndim != 3:
        shape = tuple(u.shape) if isinstance(u, torch.Tensor) else type(u).__name__
        raise ValueError(f"U must be a tensor of subspace bases with shape (K, d, p), got {shape}")
    if u.shape[1] != d:
        raise ValueError(f"U has ambient dimension {u.shape[1]} but the tokens have d={d}; U must be (K, {d}, p)")


def _logdet_i_plus(gram: torch.Tensor, scale: float | torch.Tensor) -> torch.Tensor:
    """``log det(I + scale * gram)`` for PSD ``gram`` (..., m, m), in float64."""
    g = gram.to(torch.float64)
    eye = torch.eye(g.shape[-1], dtype=torch.float64, device=g.device)
    if isinstance(scale, torch.Tensor):
        scale = scale.to(torch.float64)[..., None, None]
    m = eye + scale * g
    # Symmetrise: round-off can make the Gram slightly asymmetric, which slogdet does not mind but
    # the Cholesky path (used for speed and PD-checking) does.
    m = 0.5 * (m + m.transpose(-1, -2))
    chol, info = torch.linalg.cholesky_ex(m)
    if bool((info == 0).all()):
        return 2.0 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(-1)
    return torch.linalg.slogdet(m).logabsdet


def _gram_small(z: torch.Tensor) -> torch.Tensor:
    """The smaller of ``Z^T Z`` (d×d) and ``Z Z^T`` (N×N): equal nonzero spectra (Sylvester)."""
    n, d = z.shape[-2], z.shape[-1]
    z = z.to(torch.float64)
    return z.transpose(-1, -2) @ z if d <= n else z @ z.transpose(-1, -2)


def normalize_tokens(z: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Scale every token (row) to unit ℓ2 norm, as for CBSA Fig. 5's normalised coding rate."""
    _check_tokens("Z", z)
    return z / z.norm(dim=-1, keepdim=True).clamp_min(eps)


def coding_rate(z: torch.Tensor, eps: float = 0.5) -> torch.Tensor:
    """Coding rate ``R(Z) = ½ log det(I + d/(N ε²) ZᵀZ)`` of tokens ``Z: (..., N, d)`` (CBSA eq 1).

    Returns shape ``(...)``. For ``N = d`` orthonormal tokens, ``R = d/2 · log(1 + 1/ε²)``.
    """
    _check_tokens("Z", z)
    _check_eps(eps)
    n, d = z.shape[-2], z.shape[-1]
    return 0.5 * _logdet_i_plus(_gram_small(z), d / (n * eps**2))


def compression_term(z: torch.Tensor, u: torch.Tensor, eps: float = 0.5, *, normalize: bool = False) -> torch.Tensor:
    """MCR² compression term ``R_c(Z | U_[K]) = Σ_k R(U_kᵀ Z)`` (CBSA eq 2), ``R`` as in eq 1 with ``d → p``.

    ``Z: (..., N, d)``, ``U: (K, d, p)``; ``normalize=True`` first scales tokens to unit norm (the
    normalised variant of CBSA Fig. 5). Returns shape ``(...)``.
    """
    _check_tokens("Z", z)
    _check_bases(u, z.shape[-1])
    if normalize:
        z = normalize_tokens(z)
    proj = torch.einsum("...nd,kdp->...knp", z.to(torch.float64), u.to(torch.float64))
    return coding_rate(proj, eps).sum(-1)


def crate_compression_term(
    z: torch.Tensor, u: torch.Tensor, eps: float = 0.1, *, normalize: bool = True
) -> torch.Tensor:
    """The compression term as CRATE's code measures it per layer (Yu et al., CRATE, the layer-wise
    ``R^c(Z^ℓ | U^ℓ)`` plots; CBSA Fig. 5 measures the same term of eq 2):

    ``R^c(Z | U_[K]) = Σ_k ½ log det(I + p/(N ε²) (U_kᵀ Z)ᵀ (U_kᵀ Z))``

    where each *projected* token ``U_kᵀ z_j`` (one head's ``p`` coordinates) is scaled to unit ℓ2 norm
    before the log-determinant, and ``ε² = 0.01`` (``eps=0.1``). This differs from
    :func:`compression_term` with ``normalize=True``, which scales the ambient token ``z_j`` before
    projecting: here every head sees unit-norm codes, so the value depends only on the angles between
    the tokens' codes *within* each subspace (not on their magnitudes), and each head contributes at
    most ``½ p log(1 + 1/ε²)`` (``N >= p``; the trace of ``WᵀW`` is ``N``, the bound is attained by
    isotropic codes).

    ``Z: (..., N, d)``, ``U: (K, d, p)``. ``normalize=False`` skips the per-head normalisation and is
    exactly :func:`compression_term` (the raw eq 2) at the same ``eps``. Returns shape ``(...)``.
    """
    _check_tokens("Z", z)
    _check_bases(u, z.shape[-1])
    _check_eps(eps)
    proj = torch.einsum("...nd,kdp->...knp", z.to(torch.float64), u.to(torch.float64))  # rows: (U_kᵀ z_j)ᵀ
    if normalize:
        # a zero code (a token orthogonal to the whole subspace) stays zero instead of dividing by 0
        proj = proj / proj.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    return coding_rate(proj, eps).sum(-1)


def _check_pi(pi: torch.Tensor, z: torch.Tensor) -> None:
    if not isinstance(pi, torch.Tensor) or pi.ndim < 2:
        raise ValueError("Pi must be a membership tensor of shape (..., N, K)")
    if pi.shape[-2] != z.shape[-2]:
        raise ValueError(f"Pi has {pi.shape[-2]} rows but Z has N={z.shape[-2]} tokens; Pi must be (..., N, K)")
    if bool((pi < 0).any()):
        raise ValueError("Pi must be element-wise non-negative (a soft group assignment)")


def partition_compression(z: torch.Tensor, pi: torch.Tensor, eps: float = 0.5) -> torch.Tensor:
    """ToST eq 1's compression term ``R_c(Z, Π) = ½ Σ_k (n_k/n) log det(I + d/(ε² n_k) Z Diag(π_k) Zᵀ)``.

    ``Z: (..., N, d)``, ``Π: (..., N, K)`` (rows are membership probabilities). Groups with
    ``n_k = 0`` contribute 0. Returns shape ``(...)``.
    """
    _check_tokens("Z", z)
    _check_pi(pi, z)
    _check_eps(eps)
    n, d = z.shape[-2], z.shape[-1]
    z64, pi64 = z.to(torch.float64), pi.to(torch.float64)
    nk = pi64.sum(-2)  # (..., K)
    cov = torch.einsum("...nk,...nd,...ne->...kde", pi64, z64, z64)  # Z Diag(π_k) Zᵀ
    safe_nk = nk.clamp_min(torch.finfo(torch.float64).tiny)
    logdet = _logdet_i_plus(cov, d / (eps**2 * safe_nk))
    return 0.5 * (torch.where(nk > 0, nk / n * logdet, torch.zeros_like(logdet))).sum(-1)


def variational_compression(
    z: torch.Tensor, pi: torch.Tensor, u: torch.Tensor, eps: float = 0.5, *, normalize: bool = False
) -> torch.Tensor:
    """ToST's variational compression ``R^var_c(Z, Π | U_[K])`` (eq 4) with ``f(x) = log(1 + d x / ε²)``.

    ``½ Σ_k (n_k/n) Σ_i f((1/n_k) (U_kᵀ Z Diag(π_k) Zᵀ U_k)_ii)``; ``Z: (..., N, d)``,
    ``Π: (..., N, K)``, ``U: (K, d, p)``. It upper-bounds :func:`partition_compression` for
    orthogonal ``U_k`` and equals it when each ``U_k`` diagonalises ``Z Diag(π_k) Zᵀ`` (Theorem 1).
    ``normalize=True`` scales tokens to unit norm first. Returns shape ``(...)``.
    """
    _check_tokens("Z", z)
    _check_pi(pi, z)
    _check_bases(u, z.shape[-1])
    _check_eps(eps)
    if pi.shape[-1] != u.shape[0]:
        raise ValueError(f"Pi has K={pi.shape[-1]} groups but U has {u.shape[0]} bases; they must agree")
    if normalize:
        z = normalize_tokens(z)
    n, d = z.shape[-2], z.shape[-1]
    z64, pi64, u64 = z.to(torch.float64), pi.to(torch.float64), u.to(torch.float64)
    nk = pi64.sum(-2)  # (..., K)
    proj_sq = torch.einsum("...nd,kdp->...knp", z64, u64).square()  # (U_kᵀ z_j)_i²
    weighted = torch.einsum("...knp,...nk->...kp", proj_sq, pi64)  # Σ_j Π_jk (U_kᵀ z_j)_i²
    safe_nk = nk.clamp_min(torch.finfo(torch.float64).tiny)
    second_moment = weighted / safe_nk[..., None]
    per_group = torch.log1p(d / eps**2 * second_moment).sum(-1)
    return 0.5 * torch.where(nk > 0, nk / n * per_group, torch.zeros_like(per_group)).sum(-1)


def subspace_snr(z: torch.Tensor, u: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-subspace SNR ``‖U_k U_kᵀ Z_k‖_F / ‖(I − U_k U_kᵀ) Z_k‖_F`` (AoT eq 6).

    ``Z: (..., N, d)``, ``U: (K, d, p)`` orthonormal bases, ``labels: (N,)`` integer cluster of each
    token. Returns ``(..., K)``; ``inf`` where a cluster has no noise, ``nan`` where it is empty.
    """
    _check_tokens("Z", z)
    _check_bases(u, z.shape[-1])
    if not isinstance(labels, torch.Tensor) or labels.ndim != 1 or labels.shape[0] != z.shape[-2]:
        raise ValueError(f"labels must be an integer tensor of shape (N,) = ({z.shape[-2]},)")
    if labels.is_floating_point():
        raise TypeError(f"labels must be an integer tensor, got dtype {labels.dtype}")
    k_count = u.shape[0]
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= k_count):
        raise ValueError(
            f"labels must lie in [0, {k_count - 1}] (one per subspace), got range "
            f"[{int(labels.min())}, {int(labels.max())}]"
        )
    z64, u64 = z.to(torch.float64), u.to(torch.float64)
    out = []
    for k in range(k_count):
        zk = z64[..., labels == k, :]
        signal = zk @ u64[k] @ u64[k].T
        num = signal.flatten(-2).norm(dim=-1)
        den = (zk - signal).flatten(-2).norm(dim=-1)
        if zk.shape[-2] == 0:
            out.append(torch.full_like(num, float("nan")))
        else:
            out.append(
                torch.where(
                    den > 0, num / den.clamp_min(torch.finfo(torch.float64).tiny), torch.full_like(num, float("inf"))
                )
            )
    return torch.stack(out, -1)


def rank1_residual(x: torch.Tensor, center: str = "mean") -> torch.Tensor:
    """Rank-collapse residual ``ε(X) = X − 1 x̂ᵀ`` (CSP eq 6) of ``X: (..., N, C)``.

    ``x̂`` minimises ``‖X − 1xᵀ‖``: ``center="mean"`` is the column mean (exact for the Frobenius
    norm), ``center="median"`` the column median (exact for the column-sum norm ``‖·‖_1``).
    ``ε(X) = 0`` iff every row (token) is the same, i.e. ``X = 1xᵀ`` has collapsed to rank 1.
    """
    _check_tokens("X", x)
    if center == "mean":
        xhat = x.mean(-2, keepdim=True)
    elif center == "median":
        # .contiguous(): torch.median over dim -2 of an expanded (stride-0) tensor returns garbage
        xhat = x.contiguous().median(-2, keepdim=True).values
    else:
        raise ValueError(f"center={center!r} is not supported; valid choices: ['mean', 'median']")
    return x - xhat


def norm_1_inf(x: torch.Tensor) -> torch.Tensor:
    """``‖X‖_{1,∞} = sqrt(‖X‖_1 ‖X‖_∞)`` with ``‖X‖_1`` the max column sum and ``‖X‖_∞`` the max row sum.

    ``X: (..., N, C)`` → ``(...)`` (CSP Section 3.2.1, after Dong et al. 2021).
    """
    _check_tokens("X", x)
    a = x.abs().to(torch.float64)
    return torch.sqrt(a.sum(-2).amax(-1) * a.sum(-1).amax(-1))


def rank_collapse_residual(x: torch.Tensor, *, relative: bool = False, center: str = "mean") -> torch.Tensor:
    """``‖ε(X)‖_{1,∞}`` (CSP eq 6); ``relative=True`` divides by ``‖X‖_{1,∞}`` (scale-free). ``(...)``."""
    r = norm_1_inf(rank1_residual(x, center))
    if relative:
        r = r / norm_1_inf(x).clamp_min(torch.finfo(torch.float64).tiny)
    return r


def singular_spectrum(x: torch.Tensor, *, normalize: bool = True) -> torch.Tensor:
    """Singular values of ``X: (..., N, C)`` in decreasing order (CSP Fig. 3); ``normalize`` divides by the largest."""
    _check_tokens("X", x)
    s = torch.linalg.svdvals(x.to(torch.float64))
    if normalize:
        s = s / s[..., :1].clamp_min(torch.finfo(torch.float64).tiny)
    return s


def subspace_gram(
    u: torch.Tensor, *, directions: int | None = None, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Gram ``[U_1,…,U_K]ᵀ[U_1,…,U_K]`` of column-normalised bases ``U: (K, d, p)`` (ToST Fig. 11).

    ``directions`` keeps that many randomly chosen columns per subspace (the paper shows 4).
    Returns ``(K·p', K·p')`` whose ``(i, j)`` block is ``U_iᵀ U_j``; entries are cosines in [-1, 1].
    """
    if not isinstance(u, torch.Tensor) or u.ndim != 3:
        raise ValueError("U must be a tensor of subspace bases with shape (K, d, p)")
    k, _, p = u.shape
    u = u.to(torch.float64)
    if directions is not None:
        if not isinstance(directions, int) or isinstance(directions, bool) or not 1 <= directions <= p:
            raise ValueError(f"directions must be an integer in [1, p={p}], got {directions!r}")
        idx = torch.stack([torch.randperm(p, generator=generator)[:directions] for _ in range(k)])
        u = torch.gather(u, 2, idx[:, None, :].expand(k, u.shape[1], directions))
    u = u / u.norm(dim=1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    flat = u.permute(1, 0, 2).reshape(u.shape[1], -1)  # (d, K p')
    return flat.T @ flat
