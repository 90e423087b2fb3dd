"""The causal EMA by blocks (MEGA §3.1): an exact lower-triangular product within each block, the recurrence across.

Blocks of ``L`` tokens: within block ``c`` the output is ``sum_{j <= i} k[i - j] x_j`` (``k`` the EMA kernel of
:func:`attnzoo.ops.ema.parallel.ema_kernel` for ``L`` lags, an ``(L, L)`` lower-triangular Toeplitz product per
channel), plus what
the state ``H_{c-1}`` before the block gives, ``eta^T (q^{i+1} H_{c-1})``; ``H_c = q^L H_{c-1} + sum_j
q^{L-1-j} alpha beta x_j`` (the recurrence ``h_t = alpha beta x_t + q h_{t-1}``, ``q = 1 - alpha delta``, taken a block
at a time). O(N L D + N D h) work, ``N / L`` sequential steps of size ``(B, D, h)``.

Why not the FFT for the causal form: an FFT output mixes every input by rounding, so tokens after ``t`` move the
output at ``t`` in its last bits. Here the output at ``t`` reads tokens after ``t`` only through exact zeros of the
triangle (and the state of earlier blocks only), so a causal model reads no future token, not even by rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnzoo.ops._dtypes import acc_dtype

__all__ = ["ema_scan", "decay_powers", "BLOCK"]

#: tokens per block: the triangle's work grows with it, the sequential steps shrink
BLOCK = 64


def decay_powers(q: torch.Tensor, n: int) -> torch.Tensor:
    """``q^l`` for ``l = 0 .. n - 1``, ``(..., n)``; ``q^0 = 1`` exactly, also where ``q = 0``."""
    lags = torch.arange(1, n, device=q.device, dtype=q.dtype)
    rest = torch.exp(lags * torch.log(q.clamp_min(torch.finfo(q.dtype).tiny)).unsqueeze(-1))
    return torch.cat([torch.ones_like(q).unsqueeze(-1), rest], dim=-1)


def ema_scan(
    x: torch.Tensor,
    alpha: torch.Tensor,
    delta: torch.Tensor,
    beta: torch.Tensor,
    eta: torch.Tensor,
    *,
    block: int = BLOCK,
) -> torch.Tensor:
    """The causal EMA ``x (B, N, D)`` -> ``(B, N, D)``, coefficients ``(D, h)``; sums in the accumulation dtype."""
    acc = acc_dtype(x.dtype)
    B, N, D = x.shape
    L = max(1, min(block, N))
    C = -(-N // L)
    a, d, b, e = (t.to(acc) for t in (alpha, delta, beta, eta))
    q = 1 - a * d  # (D, h)
    pw = decay_powers(q, L + 1)  # (D, h, L + 1)
    k = torch.einsum("dn,dnl->dl", e * a * b, pw[..., :L])  # the EMA kernel k[l] = sum_n eta alpha beta q^l
    i = torch.arange(L, device=x.device)
    lag = i[:, None] - i[None, :]
    tri = torch.where(lag >= 0, k[:, lag.clamp_min(0)], torch.zeros((), dtype=acc, device=x.device))  # (D, L, L)
    # zero tokens after the end lie after every real one: they reach no real output
    xb = F.pad(x.to(acc), (0, 0, 0, C * L - N)).reshape(B, C, L, D)
    y = torch.einsum("dij,bcjd->bcid", tri, xb)
    if C > 1:
        into = (a * b).unsqueeze(-1) * pw[..., :L].flip(-1)  # (D, h, L): q^{L-1-j} alpha beta, token j -> block end
        ends = torch.einsum("dnj,bcjd->bcdn", into, xb)  # each block's own contribution to the state at its end
        decay = pw[..., L]  # q^L
        states = [torch.zeros(B, D, q.shape[1], dtype=acc, device=x.device)]
        for c in range(C - 1):
            states.append(decay * states[-1] + ends[:, c])
        before = torch.stack(states, dim=1)  # (B, C, D, h): H_{c-1}
        out = e.unsqueeze(-1) * pw[..., 1:]  # (D, h, L): eta q^{i+1}
        y = y + torch.einsum("dni,bcdn->bcid", out, before)
    return y.reshape(B, C * L, D)[:, :N].to(x.dtype)
