"""Reference damped EMA: the recurrence of MEGA §3.1 written literally, one token at a time.

``u_t = beta x_t``, ``h_t = alpha * u_t + (1 - alpha * delta) * h_{t-1}``, ``y_t = eta^T h_t`` per channel, with
``h`` of ``ndim`` expanded dimensions per channel (MEGA §3.1, "multi-dimensional damped EMA"); the bidirectional
form adds a second EMA with its own coefficients run from the last token to the first (MEGA §3.1, encoders).
"""

from __future__ import annotations

import torch

from attnzoo.ops._dtypes import acc_dtype

__all__ = ["ema_naive", "ema_recurrence"]


def ema_recurrence(
    x: torch.Tensor,
    alpha: torch.Tensor,
    delta: torch.Tensor,
    beta: torch.Tensor,
    eta: torch.Tensor,
    h: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One direction of MEGA's §3.1 recurrence in the accumulation dtype of ``x``.

    ``x (B, N, D)``; ``alpha, delta, beta, eta (D, h)``; ``h (B, D, h)`` the state before token 0 (zeros when
    ``None``). Returns ``y (B, N, D)`` in the accumulation dtype and the state after the last token.
    """
    acc = acc_dtype(x.dtype)
    xa = x.to(acc)
    a, d, b, e = (t.to(acc) for t in (alpha, delta, beta, eta))
    decay = 1 - a * d  # MEGA's damping: (1 - alpha ⊙ delta)
    if h is None:
        h = xa.new_zeros(x.shape[0], x.shape[2], a.shape[1])
    h = h.to(acc)
    ys = []
    for t in range(x.shape[1]):
        u = b * xa[:, t, :, None]  # u_t = beta x_t, (B, D, h)
        h = a * u + decay * h
        ys.append((h * e).sum(-1))  # y_t = eta^T h_t
    y = torch.stack(ys, dim=1) if ys else xa.new_zeros(x.shape)
    return y, h


def ema_naive(
    x: torch.Tensor,
    alpha: torch.Tensor,
    delta: torch.Tensor,
    beta: torch.Tensor,
    eta: torch.Tensor,
    *,
    causal: bool,
    toks=None,
) -> torch.Tensor:
    """MEGA's EMA by its recurrence: ``x (B, N, D)`` -> ``(B, N, D)``; coefficients ``(D, h)`` when ``causal``,
    else ``(2, D, h)`` (forward then backward direction). ``toks`` (:class:`~attnzoo.ops._varlen.Segments`): every
    sequence alone, its state starting from zero; padding gives zeros."""
    if toks is not None:
        out = torch.zeros_like(x)
        for row, idx in toks.sequences():
            out[row, idx] = ema_naive(x[row : row + 1, idx], alpha, delta, beta, eta, causal=causal)[0]
        return out
    if causal:
        return ema_recurrence(x, alpha, delta, beta, eta)[0].to(x.dtype)
    fwd = ema_recurrence(x, alpha[0], delta[0], beta[0], eta[0])[0]
    bwd = ema_recurrence(x.flip(1), alpha[1], delta[1], beta[1], eta[1])[0].flip(1)
    return (fwd + bwd).to(x.dtype)
