"""EMA as a long convolution (MEGA §3.1, the recurrence unrolled): ``y = K * x`` with the kernel of the damped
recurrence, computed by FFT in O(N log N).

Unrolling MEGA's recurrence gives ``y_t = sum_{s <= t} k[t - s] x_s`` with
``k[l] = sum_n eta_n alpha_n beta_n (1 - alpha_n delta_n)^l`` per channel (a Vandermonde product). The backward
direction of the bidirectional EMA reads ``sum_{s >= t} k'[s - t] x_s``, a correlation: with both zero-padded to
``n >= 2N`` no circular term wraps in, so one forward FFT of ``x`` and one inverse give both directions.
"""

from __future__ import annotations

import contextlib

import torch

from attnzoo.ops._dtypes import acc_dtype
from attnzoo.ops._varlen import Segments
from attnzoo.ops.ema.scan import ema_scan
from attnzoo.ops.ema.varlen import ema_leak, holed

__all__ = ["ema_fft", "ema_kernel"]


def ema_kernel(
    alpha: torch.Tensor, delta: torch.Tensor, beta: torch.Tensor, eta: torch.Tensor, length: int
) -> torch.Tensor:
    """The EMA's convolution kernel ``(..., D, length)``: ``k[l] = sum_n eta alpha beta (1 - alpha delta)^l``.

    Coefficients ``(..., D, h)``; computed in their accumulation dtype. ``q^l = exp(l log q)`` keeps the
    Vandermonde matrix one broadcast (``0 <= q <= 1`` for alpha, delta in [0, 1]; ``q = 0`` gives ``log 0 = -inf``
    and ``exp(0 * -inf)`` would be NaN at ``l = 0``, so lag 0 is set apart).
    """
    acc = acc_dtype(alpha.dtype)
    a, d, b, e = (t.to(acc) for t in (alpha, delta, beta, eta))
    q = 1 - a * d
    lags = torch.arange(1, length, device=a.device, dtype=acc)
    # (..., D, h, length - 1): q^l for l >= 1; clamp keeps log finite where q underflowed to 0 (its powers are 0)
    powers = torch.exp(lags * torch.log(q.clamp_min(torch.finfo(acc).tiny)).unsqueeze(-1))
    powers = torch.cat([torch.ones_like(q).unsqueeze(-1), powers], dim=-1)
    return torch.einsum("...dn,...dnl->...dl", e * a * b, powers)


def _next_fast_len(n: int) -> int:
    # FFT sizes with only factors 2, 3 and 5 run at full speed in pocketfft and cuFFT
    while True:
        m = n
        for f in (2, 3, 5):
            while m % f == 0:
                m //= f
        if m == 1:
            return n
        n += 1


def ema_fft(
    x: torch.Tensor,
    alpha: torch.Tensor,
    delta: torch.Tensor,
    beta: torch.Tensor,
    eta: torch.Tensor,
    *,
    causal: bool,
    toks: Segments | None = None,
) -> torch.Tensor:
    """MEGA's EMA by FFT convolution: ``x (B, N, D)`` -> ``(B, N, D)``; coefficients ``(D, h)`` when ``causal``
    (then by blocks, :mod:`attnzoo.ops.ema.scan`: exactly causal), else ``(2, D, h)`` (forward then backward
    direction). Accumulates in float32 (float64 for float64).

    ``toks``: sequences of a padded batch or packed row; each restarts (:mod:`attnzoo.ops.ema.varlen`)."""
    if toks is not None:
        return _ema_fft_segments(x, alpha, delta, beta, eta, causal=causal, toks=toks)
    acc = acc_dtype(x.dtype)
    N = x.shape[1]
    n = _next_fast_len(2 * N)
    # autocast would run the kernel's einsum in half precision, and cuFFT takes no bfloat16: the kernel's powers
    # and the spectra stay in the accumulation dtype under mixed precision too
    dev = x.device.type
    with torch.autocast(dev, enabled=False) if torch.amp.is_autocast_available(dev) else contextlib.nullcontext():
        if causal:
            # the FFT would let later tokens move earlier outputs by rounding: the exactly causal block scan
            return ema_scan(x, alpha, delta, beta, eta)
        k = ema_kernel(alpha, delta, beta, eta, N)  # (D, N) or (2, D, N)
        xf = torch.fft.rfft(x.to(acc).transpose(1, 2), n=n)  # (B, D, n // 2 + 1)
        if causal:
            kf = torch.fft.rfft(k, n=n)
        else:
            # forward: convolution with k[0]; backward: correlation with k[1] (conjugate spectrum)
            kf = torch.fft.rfft(k[0], n=n) + torch.fft.rfft(k[1], n=n).conj()
        y = torch.fft.irfft(xf * kf, n=n)[..., :N]
    return y.transpose(1, 2).to(x.dtype)


def _ema_fft_segments(x, alpha, delta, beta, eta, *, causal: bool, toks: Segments) -> torch.Tensor:
    """The row's FFT EMA with padding zeroed, less what earlier (later, backwards) sequences leak in."""
    if holed(toks):
        # padding between real tokens (a mask, so one sequence per row): the real tokens moved together, in order,
        # make a left-aligned row; the result goes back to their places
        order = torch.sort((~toks.real).to(torch.int8), dim=1, stable=True).indices  # (B, N)
        gather = order.unsqueeze(-1).expand_as(x)
        packed = Segments(toks.ids.gather(1, order), toks.pos.gather(1, order), toks.num, toks.lengths)
        y = _ema_fft_segments(x.gather(1, gather), alpha, delta, beta, eta, causal=causal, toks=packed)
        return torch.zeros_like(y).scatter(1, gather, y)
    real = toks.real.unsqueeze(-1).to(x.dtype)
    x = x * real
    y = ema_fft(x, alpha, delta, beta, eta, causal=causal).to(acc_dtype(x.dtype))
    if toks.num > 1:
        ids, pos, lengths = toks.ids, toks.pos, toks.lengths
        fwd = (alpha, delta, beta, eta) if causal else (alpha[0], delta[0], beta[0], eta[0])
        y = y - ema_leak(x, *fwd, ids, pos, lengths)
        if not causal:  # the backward EMA is the forward one on the reversed row, sequences in reverse order
            length = lengths.gather(1, ids.clamp_min(0))
            rev_ids = torch.where(ids >= 0, toks.num - 1 - ids, -1).flip(1)
            rev_pos = (length - 1 - pos).flip(1)
            bwd = (alpha[1], delta[1], beta[1], eta[1])
            y = y - ema_leak(x.flip(1), *bwd, rev_ids, rev_pos, lengths.flip(1)).flip(1)
    return (y * real).to(x.dtype)
