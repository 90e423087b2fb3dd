"""Reference CSP: explicit per-channel permutation matrices ``P_c = T_c S_{J_c}`` (CSP eqs 3-5)."""

from __future__ import annotations

import torch

__all__ = ["csp_naive", "csp_permutations_naive", "shift_matrix"]


def shift_matrix(N: int, J: int, *, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """``S_J = [[0, I_J], [I_{N-J}, 0]]`` of CSP eq 3, ``(N, N)``; ``J`` is taken mod N."""
    J = J % N
    S = torch.zeros(N, N, dtype=dtype, device=device)
    S[:J, N - J :] = torch.eye(J, dtype=dtype, device=device)
    S[J:, : N - J] = torch.eye(N - J, dtype=dtype, device=device)
    return S


def _sort_block(ref: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``T^(k)`` ``(G, G)``: the r-th smallest of ``u`` goes to the position of the r-th smallest of ``ref``.

    Ties are broken by position (stable sort) in both vectors.
    """
    G = ref.shape[0]
    order_ref = torch.argsort(ref, stable=True)
    order_u = torch.argsort(u, stable=True)
    T = torch.zeros(G, G, dtype=u.dtype, device=u.device)
    for r in range(G):
        T[order_ref[r], order_u[r]] = 1
    return T


def csp_permutations_naive(v: torch.Tensor, shifts: list[int], groups: int) -> torch.Tensor:
    """Implicit attention maps ``P_c = BlkDiag({T_c^(k)}) S_{J_c}`` of CSP eq 5 as ``(B, C, N, N)``.

    ``v`` is ``(B, N, C)``; ``shifts`` are ``C`` python ints; the reference is the shifted channel 0.
    """
    B, N, C = v.shape
    G = N // groups
    vd = v.detach()
    out = torch.zeros(B, C, N, N, dtype=v.dtype, device=v.device)
    S = [shift_matrix(N, int(j), dtype=v.dtype, device=v.device) for j in shifts]
    for b in range(B):
        ref = S[0] @ vd[b, :, 0]
        for c in range(C):
            u = S[c] @ vd[b, :, c]
            T = torch.zeros(N, N, dtype=v.dtype, device=v.device)
            for k in range(groups):
                sl = slice(k * G, (k + 1) * G)
                T[sl, sl] = _sort_block(ref[sl], u[sl])
            out[b, c] = T @ S[c]
    return out


def csp_naive(v: torch.Tensor, shifts: list[int], groups: int) -> torch.Tensor:
    """CSP eq 4, ``||_c P_c v_c``: ``v`` ``(B, N, C)`` -> ``(B, N, C)`` as explicit N x N matmuls."""
    P = csp_permutations_naive(v, shifts, groups)
    # P is piecewise constant in v, so gradients reach v only through the matmul.
    return torch.einsum("bcij,bjc->bic", P, v)
