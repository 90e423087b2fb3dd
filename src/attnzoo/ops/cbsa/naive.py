"""Reference CBSA, written literally in the paper's column convention (tokens are columns).

Per head k the paper's matrices are ``U_k^T Z`` ``(P, N)`` = ``w^T`` and ``U_k^T Q`` ``(P, M)`` = ``reps^T``;
every softmax normalises columns (``dim=-2``) as in eqs 5, 8 and 9, and the exact contraction forms the
``(I + p/(m eps^2) Q^T Q)^{-1}`` of eq 7 with an explicit matrix inverse. Inputs are assumed validated
by :func:`attnzoo.ops.cbsa.cbsa`. O(N M P) for "cbsa"/"agent", O(N^2 P + N^3) for "mssa".
"""

from __future__ import annotations

import torch

__all__ = ["cbsa_naive"]


def _mT(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(-1, -2)


def _eye_like(n: int, ref: torch.Tensor) -> torch.Tensor:
    return torch.eye(n, dtype=ref.dtype, device=ref.device)


def _contract(Q: torch.Tensor, contraction: str, eps: float, scale: float, p: int):
    """Contraction of eq 7 ("exact") or eq 8 ("softmax") on ``Q`` ``(B, H, P, m)``; returns (Q G, G)."""
    m = Q.shape[-1]
    gram = _mT(Q) @ Q
    if contraction == "softmax":
        G = torch.softmax(gram * scale, dim=-2)
    else:
        G = torch.linalg.inv(_eye_like(m, Q) + (p / (m * eps**2)) * gram)
    return Q @ G, G


def cbsa_naive(
    w: torch.Tensor,
    reps: torch.Tensor | None,
    *,
    variant: str,
    contraction: str | None,
    eps: float,
    scale: float,
    eta,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CBSA(Z | U) of eqs 5, 7/8 and its §3.3 variants; ``w``: ``(B, H, N, P)`` -> ``(B, H, N, P)``."""
    Z = _mT(w)  # (B, H, P, N) = U_k^T Z
    p = Z.shape[-2]
    internals: dict[str, torch.Tensor] = {}

    if variant in ("cbsa", "agent"):
        Q_ini = _mT(reps)  # (B, H, P, M)
        # eq 5: A_k = softmax((U_k^T Z)^T (U_k^T Q_ini)), (N, M), each column a distribution over tokens
        A = torch.softmax((_mT(Z) @ Q_ini) * scale, dim=-2)
        Q = Q_ini + eta * (Z @ A)
        internals["attn_extract"] = _mT(A)
        internals["reps"] = _mT(Q)
        if variant == "agent":
            C = Q  # Fig. 9 / Table 4: CBSA without the contraction step
        else:
            C, G = _contract(Q, contraction, eps, scale, p)
            internals["attn_contract"] = _mT(G)
            internals["contracted"] = _mT(C)
        out = C @ _mT(A)  # broadcast: Contraction · A_k^T, (P, N)
        return _mT(out), internals

    if variant == "mssa":
        # §3.3 / eq 9: Q = Z (self-expressed tokens, m = N) and A_k = I, so the broadcast is the identity
        C, G = _contract(Z, contraction, eps, scale, p)
        internals["attn_contract"] = _mT(G)
        return _mT(C), internals

    if variant == "linear":
        # eqs 10-11 and 14: representatives are the principal directions U_k^T Q = L_k Sigma_k with
        # coefficients A_k = R_k, pushed through the exact contraction (7) with m = p, i.e. 1/eps^2.
        L, S, Vh = torch.linalg.svd(Z, full_matrices=False)  # Z = L diag(S) Vh, rank r = min(P, N)
        Q = L * S.unsqueeze(-2)
        A = _mT(Vh)  # (N, r)
        r = Q.shape[-1]
        G = torch.linalg.inv(_eye_like(r, Q) + (_mT(Q) @ Q) / eps**2)
        out = (Q @ G) @ _mT(A)
        # spectral filter F(Z Z^T) of eq 12 on the whole subspace: f = eps^2/(eps^2 + s^2), and f(0) = 1 off the span
        f = eps**2 / (eps**2 + S**2)
        internals["filter"] = _eye_like(p, Z) - (L * (1 - f).unsqueeze(-2)) @ _mT(L)
        return _mT(out), internals

    if variant == "channel":
        # eq 13: principal directions fixed to the basis vectors u_ki, D_k = Diag(f((u_ki^T Z)(u_ki^T Z)^T))
        second_moment = torch.diagonal(Z @ _mT(Z), dim1=-2, dim2=-1)  # (B, H, P)
        D = torch.diag_embed(eps**2 / (eps**2 + second_moment))
        internals["filter"] = D
        return _mT(D @ Z), internals

    raise AssertionError(f"unvalidated variant {variant!r}")  # pragma: no cover
