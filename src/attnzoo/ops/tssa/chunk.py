"""Memory-lean TSSA (the ``"torch"`` and ``"cpu"`` backends): Alg. 1 / Alg. 2 of ToST with hand-written backward
passes. The ``"cpu"`` backend runs the same formulas in the fused C++ kernels of ``cpu.cpp`` (three passes over
``w`` forward, four backward); this module holds the PyTorch versions, which are also its specification.

Why custom ``autograd.Function``s: differentiating the reference (``naive.py``) with autograd keeps about
5x (non-causal) and 8x (causal) the size of ``w`` alive between forward and backward (``w_normed``,
``w**2``, ``w * Pi``, prefix sums, ...; measured with ``saved_tensors_hooks`` at B=2, H=4, N=4096, P=64).
Here forward saves only ``w`` itself plus ``(B, H, N)`` / ``(B, H, P)`` statistics and backward recomputes
the ``(B, H, N, P)`` intermediates, which are O(NP) and cheap. Backward is first-order only
(``once_differentiable``); use ``backend="naive"`` for double backward.

All reductions over tokens run in float32 or better (also for fp16/bf16 ``w``). Causal prefix sums are
two-level (within chunks of about sqrt(N) tokens, then across chunk totals), so the rounding error grows
like ``2 sqrt(N)`` ulps instead of ``N`` ulps for a sequential float32 scan.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from attnzoo._checks import explain_nonfinite
from attnzoo.ops._cpu_kernels import unit_stride
from attnzoo.ops._varlen import Segments
from attnzoo.ops.tssa.naive import compute_dtype, safe_denominator

__all__ = ["tssa_torch", "tssa_pi_torch", "tssa_torch_varlen", "chunked_cumsum", "reverse_chunked_cumsum"]

# F.normalize(w, dim=-2) divides by max(||w||, 1e-12); squared, that is max(sum w^2, 1e-24).
_NORM_EPS_SQ = 1e-24
# Alg. 1 adds 1e-8 to <pi_k, 1> before normalising pi_k (kept exactly as in the paper).
_PI_SUM_EPS = 1e-8


def _chunk_size(n: int) -> int:
    # power of two near sqrt(n) balances the within-chunk and across-chunk scan lengths
    return max(16, 1 << math.ceil(math.log2(max(n, 1)) / 2))


def chunked_cumsum(x: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    """Inclusive prefix sum over tokens (dim -2) of ``(..., N, P)``, computed as a two-level scan."""
    n = x.shape[-2]
    chunk = _chunk_size(n) if chunk is None else chunk
    if n <= chunk:
        return torch.cumsum(x, dim=-2)
    n_chunks = -(-n // chunk)
    pad = n_chunks * chunk - n
    xc = (F.pad(x, (0, 0, 0, pad)) if pad else x).unflatten(-2, (n_chunks, chunk))  # (..., C, chunk, P)
    intra = torch.cumsum(xc, dim=-2)
    totals = torch.cumsum(intra[..., -1, :], dim=-2)  # (..., C, P)
    # exclusive carry: chunk c starts from the sum of all previous chunks
    carry = F.pad(totals[..., :-1, :], (0, 0, 1, 0))
    intra += carry.unsqueeze(-2)
    return intra.flatten(-3, -2)[..., :n, :]


def reverse_chunked_cumsum(x: torch.Tensor) -> torch.Tensor:
    """Suffix sum over tokens (dim -2): ``out[n] = sum_{m >= n} x[m]`` (the adjoint of a prefix sum)."""
    return chunked_cumsum(x.flip(-2)).flip(-2)


def _safe_(den: torch.Tensor) -> torch.Tensor:
    # In place version of naive.safe_denominator (den >= 0 here: sums of squares / probabilities).
    return den.masked_fill_(den <= 0, 1.0)


# ---------------------------------------------------------------------------------------------------
# non-causal, Alg. 1
# ---------------------------------------------------------------------------------------------------
def _rowdot(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``(..., N, P), (..., P) -> (..., N)``: ``sum_p x[..., n, p] * v[..., p]``.

    Written as ``v^T x^T``: on CPU that GEMV orientation streams ``x`` about 2x faster than ``x @ v``.
    """
    return torch.matmul(v.unsqueeze(-2), x.transpose(-1, -2)).squeeze(-2)


class NonCausalStats(NamedTuple):
    """Alg. 1's statistics of ``wc`` (float32+): what the forward computes and the backward reuses."""

    w2: torch.Tensor  # (B, H, N, P) squared entries
    c: torch.Tensor  # (B, H, P) squared feature norms over tokens
    r: torch.Tensor  # (B, H, P) their clamped reciprocals
    s: torch.Tensor  # (B, H, N) sum_p of the normalised squares
    pi: torch.Tensor  # (B, H, N) membership (eq. 10)
    den: torch.Tensor  # (B, H, 1) sum_n pi + eps
    dots: torch.Tensor  # (B, H, P) Pi-weighted second moment


def _noncausal_stats(wc: torch.Tensor, temp: torch.Tensor) -> NonCausalStats:
    w2 = wc * wc  # the one (B, H, N, P) temporary, shared by all three token reductions
    c = w2.sum(dim=-2)  # (B, H, P) squared feature norms over tokens
    r = 1.0 / c.clamp_min(_NORM_EPS_SQ)
    s = _rowdot(w2, r)  # (B, H, N) = sum_p w_normed^2
    pi = torch.softmax(s * temp[:, None], dim=1)
    den = pi.sum(dim=-1, keepdim=True) + _PI_SUM_EPS  # (B, H, 1)
    dots = torch.matmul((pi / den).unsqueeze(-2), w2).squeeze(-2)  # (B, H, P) weighted second moment
    return NonCausalStats(w2, c, r, s, pi, den, dots)


def _noncausal_fused(kernels, w: torch.Tensor, wc: torch.Tensor, tc: torch.Tensor):
    """Alg. 1's forward in three passes over ``w`` with the fused CPU kernels (``cpu.cpp``)."""
    wc = unit_stride(wc)
    c = kernels.tssa_colsum_sq(wc, None)
    if not bool(torch.isfinite(c).all()):  # as in the PyTorch path: NaN/Inf in w shows in c
        explain_nonfinite("tssa", "w", w, "the per-feature sum of w^2 over N tokens")
    r = 1.0 / c.clamp_min(_NORM_EPS_SQ)
    s, pi, num, den = kernels.tssa_token_stats(wc, r, tc.contiguous())
    den = den.unsqueeze(-1) + _PI_SUM_EPS
    g = 1.0 / (1.0 + num / den)
    return kernels.tssa_scale(wc, pi, g), c, r, s, pi, den, g


def _noncausal_backward_fused(kernels, wc, tc, gc, c, r, s, pi, den, g):
    """The backward below in four passes over ``w`` (two also read the output's gradient) with the CPU kernels;
    the ``(B, H, N)`` and ``(B, H, P)`` steps in between stay in PyTorch."""
    wc, gc = unit_stride(wc), unit_stride(gc)
    d_pi, u = kernels.tssa_bwd_gw(wc, gc, pi, g)  # -sum_p G w g,  sum_n pi G w
    d_dots = u * g * g
    d_q = kernels.tssa_rowdot_sq(wc, d_dots)
    d_pi += d_q / den - (d_q * pi).sum(dim=-1, keepdim=True) / (den * den)
    d_a = pi * (d_pi - (pi * d_pi).sum(dim=1, keepdim=True))
    d_temp = (d_a * s).sum(dim=(0, 2))
    d_s = d_a * tc[:, None]
    d_r = kernels.tssa_colsum_sq(wc, d_s)
    d_c = torch.where(c > _NORM_EPS_SQ, -d_r * r * r, torch.zeros_like(d_r))
    # dw = 2 w (q d_dots + d_s r + d_c) - G pi g
    dw = kernels.tssa_bwd_dw(wc, gc, 2.0 * (pi / den), d_dots, 2.0 * d_s, r, 2.0 * d_c, pi, g)
    return dw, d_temp


class _TSSANonCausal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w: torch.Tensor, temp: torch.Tensor, kernels=None) -> torch.Tensor:
        cdt = compute_dtype(w.dtype)
        wc, tc = w.to(cdt), temp.to(cdt)
        if kernels is not None:
            out, c, r, s, pi, den, g = _noncausal_fused(kernels, w, wc, tc)
            ctx.save_for_backward(w, temp, c, r, s, pi, den, g)
            ctx.kernels = kernels
            return out.to(w.dtype)
        ctx.kernels = None
        w2, c, r, s, pi, den, dots = _noncausal_stats(wc, tc)
        # A NaN/Inf anywhere in w makes its feature's sum of squares non-finite: tssa() leaves the check
        # of w to this point. (A finite w whose c overflowed also lands here and is reported as overflow.)
        if not torch.compiler.is_compiling() and not bool(torch.isfinite(c).all()):
            explain_nonfinite("tssa", "w", w, "the per-feature sum of w^2 over N tokens")
        g = 1.0 / (1.0 + dots)
        # two passes over (B, H, N, P), written into w2's buffer (no longer needed): the sign rides on g
        # (Dynamo refuses out= on a non-contiguous tensor, which w2 is when w is a strided view.)
        if w2.is_contiguous() and not torch.compiler.is_compiling():
            out = torch.mul(wc, pi.unsqueeze(-1), out=w2)
        else:
            out = wc * pi.unsqueeze(-1)
        out.mul_(-g.unsqueeze(-2))
        ctx.save_for_backward(w, temp, c, r, s, pi, den, g)
        return out.to(w.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        w, temp, c, r, s, pi, den, g = ctx.saved_tensors
        cdt = c.dtype
        wc, tc, gc = w.to(cdt), temp.to(cdt), grad_out.to(cdt)
        if ctx.kernels is not None:
            dw, d_temp = _noncausal_backward_fused(ctx.kernels, wc, tc, gc, c, r, s, pi, den, g)
            return dw.to(w.dtype), d_temp.to(temp.dtype), None
        # out = -w * pi * g  with g = 1 / (1 + dots)
        gw = gc * wc
        d_pi = -_rowdot(gw, g)  # (B, H, N)
        d_dots = torch.matmul(pi.unsqueeze(-2), gw).squeeze(-2) * g * g  # (B, H, P)
        del gw
        # dots = (pi / den) @ w^2
        w2 = wc * wc
        q = pi / den
        d_q = _rowdot(w2, d_dots)
        d_pi += d_q / den - (d_q * pi).sum(dim=-1, keepdim=True) / (den * den)
        # pi = softmax over heads of s * temp
        d_a = pi * (d_pi - (pi * d_pi).sum(dim=1, keepdim=True))
        d_temp = (d_a * s).sum(dim=(0, 2))
        d_s = d_a * tc[:, None]
        # s = w^2 @ r,  r = 1 / max(c, eps),  c = sum_n w^2
        d_r = torch.matmul(d_s.unsqueeze(-2), w2).squeeze(-2)
        del w2
        d_c = torch.where(c > _NORM_EPS_SQ, -d_r * r * r, torch.zeros_like(d_r))
        coef = q.unsqueeze(-1) * d_dots.unsqueeze(-2)
        coef.addcmul_(d_s.unsqueeze(-1), r.unsqueeze(-2)).add_(d_c.unsqueeze(-2)).mul_(wc).mul_(2.0)
        direct = gc * pi.unsqueeze(-1)
        coef.sub_(direct.mul_(g.unsqueeze(-2)))
        return coef.to(w.dtype), d_temp.to(temp.dtype), None


# ---------------------------------------------------------------------------------------------------
# causal, Alg. 2 / eq. 28
# ---------------------------------------------------------------------------------------------------
class _TSSACausal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w: torch.Tensor, temp: torch.Tensor, bias: torch.Tensor, kernels=None) -> torch.Tensor:
        # bias: (H, N), already sliced to the sequence length
        cdt = compute_dtype(w.dtype)
        wc, tc, bc = w.to(cdt), temp.to(cdt), bias.to(cdt)
        ctx.bias_dtype = bias.dtype
        if kernels is not None:
            out, s, pi, den = kernels.tssa_causal(unit_stride(wc), tc.contiguous(), bc.contiguous())
            ctx.save_for_backward(w, temp, s, pi, den)
            ctx.kernels = kernels
            return out.to(w.dtype)
        ctx.kernels = None
        p = w.shape[-1]
        x = wc * wc
        ratio = _safe_(chunked_cumsum(x))
        torch.div(x, ratio, out=ratio)
        # sum_p (w^2 / cumsum(w^2) + b) = sum_p w^2 / cumsum(w^2) + P * b, as in Alg. 2
        s = ratio.sum(dim=-1) + p * bc
        del ratio
        pi = torch.softmax(s * tc[:, None], dim=1)
        den = chunked_cumsum(pi.unsqueeze(-1)).squeeze(-1)  # (B, H, N)
        x.mul_(pi.unsqueeze(-1))
        g = chunked_cumsum(x)
        del x
        g.div_(_safe_(den.clone()).unsqueeze(-1)).add_(1.0).reciprocal_()
        g.mul_(wc).mul_(pi.unsqueeze(-1)).neg_()
        ctx.save_for_backward(w, temp, s, pi, den)
        return g.to(w.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        w, temp, s, pi, den = ctx.saved_tensors
        cdt = s.dtype
        wc, tc, gc = w.to(cdt), temp.to(cdt), grad_out.to(cdt)
        p = w.shape[-1]
        if ctx.kernels is not None:  # the same formulas in four fused passes (cpu.cpp, causal backward)
            d_a, dw = ctx.kernels.tssa_causal_bwd(unit_stride(wc), unit_stride(gc), tc.contiguous(), pi, den)
            d_s = d_a * tc[:, None]
            return (
                dw.to(w.dtype),
                (d_a * s).sum(dim=(0, 2)).to(temp.dtype),
                (d_s.sum(dim=0) * p).to(ctx.bias_dtype),
                None,
            )
        pi_ = pi.unsqueeze(-1)
        den_pos = den > 0
        den_safe = _safe_(den.clone())
        x = wc * wc
        dots = chunked_cumsum(x * pi_).div_(den_safe.unsqueeze(-1))
        g = 1.0 / (1.0 + dots)
        # out = -w * pi * g
        gw = gc * wc
        d_pi = -(gw * g).sum(dim=-1)
        d_dots = gw.mul_(pi_).mul_(g).mul_(g)  # (B, H, N, P)
        # dots = cumsum(x * pi) / cumsum(pi)
        d_den = torch.where(den_pos, -(d_dots * dots).sum(dim=-1) / den_safe, torch.zeros_like(den))
        del dots
        d_num = reverse_chunked_cumsum(d_dots.div_(den_safe.unsqueeze(-1)))  # grad of x * pi
        del d_dots
        d_pi += (d_num * x).sum(dim=-1)
        d_pi += reverse_chunked_cumsum(d_den.unsqueeze(-1)).squeeze(-1)
        dx = d_num.mul_(pi_)
        # pi = softmax over heads of s * temp;  s = sum_p x / cumsum(x) + P * b
        d_a = pi * (d_pi - (pi * d_pi).sum(dim=1, keepdim=True))
        d_temp = (d_a * s).sum(dim=(0, 2))
        d_s = d_a * tc[:, None]
        d_bias = d_s.sum(dim=0) * p
        inv_S = _safe_(chunked_cumsum(x)).reciprocal_()
        d_s_ = d_s.unsqueeze(-1)
        dx.addcmul_(d_s_, inv_S)
        # d/dS of x / S is -x / S^2 (zero where S == 0, since x == 0 there)
        d_S = inv_S.mul_(inv_S).mul_(x).mul_(d_s_).neg_()
        del x
        dx += reverse_chunked_cumsum(d_S)
        del d_S
        dw = dx.mul_(wc).mul_(2.0)
        direct = gc * pi_
        dw.sub_(direct.mul_(g))
        return dw.to(w.dtype), d_temp.to(temp.dtype), d_bias.to(ctx.bias_dtype), None


def tssa_torch(
    w: torch.Tensor,
    temp: torch.Tensor,
    *,
    causal: bool = False,
    bias: torch.Tensor | None = None,
    kernels=None,
) -> torch.Tensor:
    """Memory-lean TSSA ``(B, H, N, P) -> (B, H, N, P)``: Alg. 1 (eq. 11) or Alg. 2 (eq. 28).

    ``temp``: ``(H,)``; ``bias``: ``(H, N_max, 1)`` or ``None`` (causal only). Inputs are assumed validated.
    ``kernels``: ``torch.ops.attnzoo_cpu`` to run forward and backward in the fused CPU kernels (CPU
    tensors), or ``None`` for the PyTorch versions below.
    """
    if not causal:
        return _TSSANonCausal.apply(w, temp, kernels)
    n = w.shape[-2]
    if bias is None:
        bias_hn = torch.zeros(w.shape[1], n, device=w.device, dtype=compute_dtype(w.dtype))
    else:
        bias_hn = bias[:, :n, 0]
    return _TSSACausal.apply(w, temp, bias_hn, kernels)


def tssa_pi_torch(
    w: torch.Tensor, temp: torch.Tensor, *, causal: bool = False, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Membership Pi ``(B, H, N)`` of eq. 10 (Alg. 1) or eq. 39 (Alg. 2), in float32 or better."""
    cdt = compute_dtype(w.dtype)
    wc, tc = w.to(cdt), temp.to(cdt)
    if not causal:
        return _noncausal_stats(wc, tc).pi
    x = wc * wc
    s = (x / _safe_(chunked_cumsum(x))).sum(dim=-1)
    if bias is not None:
        s = s + w.shape[-1] * bias[:, : w.shape[-2], 0].to(cdt)
    return torch.softmax(s * tc[:, None], dim=1)


# ---------------------------------------------------------------------------------------------------
# padded batches and packed rows (Segments): one vectorised pass, differentiated by autograd
# ---------------------------------------------------------------------------------------------------
def _seg_sum(x: torch.Tensor, seg: Segments) -> torch.Tensor:
    """``(B, H, N[, P]) -> (B, H, S[, P])``: sums over the tokens of each sequence (padding must be zero in ``x``).

    A padded batch has one sequence per row (a plain sum over tokens); a packed row has ``B == 1`` and no padding,
    so one ``index_add`` by sequence id does it.
    """
    if seg.num == 1:
        return x.sum(dim=2, keepdim=True)
    shape = list(x.shape)
    shape[2] = seg.num
    return x.new_zeros(shape).index_add_(2, seg.ids[0], x)


def _seg_read(stat: torch.Tensor, seg: Segments) -> torch.Tensor:
    """``(B, H, S[, P]) -> (B, H, N or 1[, P])``: each token's sequence statistic (broadcast for one per row)."""
    return stat if seg.num == 1 else stat.index_select(2, seg.ids[0])


def _seg_cumsum(x: torch.Tensor, seg: Segments) -> torch.Tensor:
    """Inclusive prefix sum over tokens (dim 2) of ``(B, H, N, P)`` restarted at each sequence's first token.

    Padding must already be zero in ``x``. One sequence per row (a padded batch) is a plain two-level scan. A packed
    row subtracts the prefix before each sequence's start from a row-wide prefix sum: in float64 for float32 input
    (the cancellation then stays far below float32 rounding, and an all-zero prefix stays exactly 0); for float64
    input, which has no wider type, a segmented Hillis-Steele scan (log2 of the longest sequence doubling steps,
    each adding the partial sum ``d`` tokens back where that token is in the same sequence), exact of cancellation.
    """
    if seg.num == 1:
        return chunked_cumsum(x)
    n, ids = x.shape[2], seg.ids
    if x.dtype != torch.float64:
        cum = torch.cumsum(x.double(), dim=2)
        start = torch.arange(n, device=x.device) - seg.pos  # (B, N): index of the sequence's first token
        before = F.pad(cum, (0, 0) * (x.ndim - 3) + (1, 0))  # before[:, :, i] = sum of tokens < i
        idx = start.view(start.shape[0], 1, n, *([1] * (x.ndim - 3))).expand(x.shape)
        return (cum - before.gather(2, idx)).to(x.dtype)
    out, d, longest = x, 1, int(seg.lengths.max())
    while d < longest:
        same = (ids[:, d:] == ids[:, :-d]).view(ids.shape[0], 1, n - d, *([1] * (x.ndim - 3)))
        out = out + F.pad(torch.where(same, out[:, :, : n - d], 0.0), (0, 0) * (x.ndim - 3) + (d, 0))
        d *= 2
    return out


def _varlen_noncausal(wc: torch.Tensor, tc: torch.Tensor, seg: Segments) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 10 / 11 per sequence: norms, ``<pi_k, 1>`` and second moments over its real tokens. ``(out, pi)``."""
    w2 = wc * wc
    r = 1.0 / _seg_sum(w2, seg).clamp_min(_NORM_EPS_SQ)  # (B, H, S, P)
    s = (w2 * _seg_read(r, seg)).sum(dim=-1)  # (B, H, N) = sum_p w_normed^2
    pi = torch.softmax(s * tc[:, None], dim=1) * seg.real.unsqueeze(1)
    den = _seg_sum(pi, seg) + _PI_SUM_EPS  # (B, H, S)
    dots = _seg_sum(w2 * pi.unsqueeze(-1), seg) / den.unsqueeze(-1)
    return -(wc * pi.unsqueeze(-1)) / (1.0 + _seg_read(dots, seg)), pi


def _varlen_causal(wc, tc, bias_pos, seg: Segments) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 28 / 39 per sequence: prefix sums restarted at its first token, bias ``(B, H, N)`` read at ``pos``."""
    x = wc * wc
    s = (x / safe_denominator(_seg_cumsum(x, seg))).sum(dim=-1) + wc.shape[-1] * bias_pos
    pi = torch.softmax(s * tc[:, None], dim=1) * seg.real.unsqueeze(1)
    pi_ = pi.unsqueeze(-1)
    dots = _seg_cumsum(x * pi_, seg) / safe_denominator(_seg_cumsum(pi_, seg))
    return -(wc * pi_) / (1.0 + dots), pi


def _varlen(w, temp, seg: Segments, causal: bool, bias) -> tuple[torch.Tensor, torch.Tensor]:
    cdt = compute_dtype(w.dtype)
    # padding (whatever it holds) becomes exact zeros: zero output, zero gradient, no NaN from pads
    wc = torch.where(seg.real[:, None, :, None], w.to(cdt), 0.0)
    tc = temp.to(cdt)
    if not causal:
        return _varlen_noncausal(wc, tc, seg)
    if bias is None:
        bias_pos = torch.zeros((), device=w.device, dtype=cdt)
    else:
        bias_pos = bias[:, :, 0].to(cdt)[:, seg.pos].transpose(0, 1)  # (B, H, N): bias at the in-sequence position
    return _varlen_causal(wc, tc, bias_pos, seg)


def tssa_torch_varlen(
    w: torch.Tensor, temp: torch.Tensor, seg: Segments, *, causal: bool = False, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """TSSA (eq. 11 / 28) of every sequence of ``seg`` in one vectorised pass, ``(B, H, N, P)``, zero at padding.

    Statistics are segment sums (``scatter_add`` over each token's sequence id), causal sums prefix sums restarted
    at each sequence's start; no padding, no loop over sequences. Differentiated by autograd.
    """
    return _varlen(w, temp, seg, causal, bias)[0].to(w.dtype)


def tssa_pi_torch_varlen(
    w: torch.Tensor, temp: torch.Tensor, seg: Segments, *, causal: bool = False, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Membership Pi ``(B, H, N)`` (eq. 10 / 39) per sequence of ``seg``, zero at padding, float32 or better."""
    return _varlen(w, temp, seg, causal, bias)[1]


# ---------------------------------------------------------------------------------------------------
# padded batches and packed rows in the fused CPU kernels (non-causal): a task table, no copy of w
# ---------------------------------------------------------------------------------------------------
# tokens per task of the kernels' table (their default chunks are 256-2048 tokens)
_TASK_LEN = 512


class VarlenTasks:
    """The kernels' work list for ``Segments``: runs of real tokens of one sequence, at most ``_TASK_LEN`` long.

    ``table`` ``(T, 5)`` int64: row b, first token n0, end n1, slot (b * S + sequence id), pos of n0, in (b, n0)
    order; ``slots``: number of per-sequence statistic slots (B * S).
    """

    def __init__(self, table: torch.Tensor, slots: int, seg: Segments) -> None:
        self.table, self.slots, self.seg = table, slots, seg


def _offset_tasks(offsets: list[int]) -> list[list[int]]:
    """The table's rows for a packed row: each sequence ``offsets[s] .. offsets[s + 1]`` cut every ``_TASK_LEN``."""
    return [
        [0, n0, min(n0 + _TASK_LEN, e), s, n0 - a]
        for s, (a, e) in enumerate(zip(offsets[:-1], offsets[1:], strict=True))
        for n0 in range(a, e, _TASK_LEN)
    ]


def varlen_tasks(seg: Segments, kernels=None) -> VarlenTasks:
    """The task table of ``seg``: a packed row's from its offsets (host integers, no tensor op), a padded batch's
    from its mask by one scan in the kernels (``tssa_mask_tasks``); otherwise :func:`varlen_tasks_vectorised`.
    These replace ~15 small aten ops per call (a sixth of a 14k-token forward)."""
    if seg.offsets is not None:
        table = torch.tensor(_offset_tasks(seg.offsets), dtype=torch.long).view(-1, 5)
        return VarlenTasks(table, seg.num, seg)
    if seg.mask is not None and kernels is not None:
        return VarlenTasks(kernels.tssa_mask_tasks(seg.mask.contiguous(), _TASK_LEN), seg.mask.shape[0], seg)
    return varlen_tasks_vectorised(seg)


def varlen_tasks_vectorised(seg: Segments) -> VarlenTasks:
    """The task table of any ``seg`` from its ``ids`` and ``pos`` (a run starts where the previous token is padding
    or of another sequence, or at every ``_TASK_LEN``-th position of its sequence)."""
    real, ids, pos = seg.real, seg.ids, seg.pos
    b_n = ids.shape[0]
    prev_real = F.pad(real[:, :-1], (1, 0), value=False)
    prev_ids = F.pad(ids[:, :-1], (1, 0), value=-1)
    start = real & (~prev_real | (ids != prev_ids) | (pos % _TASK_LEN == 0))
    next_start = F.pad(start[:, 1:], (0, 1), value=True)
    next_real = F.pad(real[:, 1:], (0, 1), value=False)
    end = real & (~next_real | next_start)
    bs, n0 = start.nonzero().unbind(1)
    _, n1 = end.nonzero().unbind(1)
    slot_of = torch.where(real, torch.arange(b_n, device=ids.device)[:, None] * seg.num + ids, b_n * seg.num)
    table = torch.stack([bs, n0, n1 + 1, slot_of[bs, n0], pos[bs, n0]], dim=1).contiguous()
    return VarlenTasks(table, b_n * seg.num, seg)


def _slot_sum(kernels, x: torch.Tensor, vt: VarlenTasks) -> torch.Tensor:
    """``(B, H, N) -> (slots, H)``: per-sequence sums over real tokens (one pass over the task table)."""
    if vt.seg.num == 1:  # one sequence per row: the slot is the row (``x`` is zero at padding)
        return x.sum(dim=-1)
    return kernels.tssa_slot_sum(x, vt.table, vt.slots)


def _slot_read(kernels, stat: torch.Tensor, vt: VarlenTasks) -> torch.Tensor:
    """``(slots, H) -> (B, H, N or 1)``: each token's sequence statistic, 1 at padding (every use below is
    multiplied by ``pi`` or divides what is zero there; one sequence per row broadcasts its row's)."""
    if vt.seg.num == 1:
        return stat.unsqueeze(-1)
    b_n, n = vt.seg.ids.shape
    return kernels.tssa_slot_read(stat, vt.table, b_n, n, 1.0)


def _noncausal_fused_varlen(kernels, w, wc, tc, vt: VarlenTasks):
    """Eq. 10 / 11 per sequence in the fused kernels' three passes, statistics per slot ``(slots, H, P)``."""
    wc, tab, ns = unit_stride(wc), vt.table, vt.slots
    c = kernels.tssa_colsum_sq(wc, None, tab, ns)
    if not bool(torch.isfinite(c).all()):
        explain_nonfinite("tssa", "w", w, "the per-feature sum of w^2 over each sequence's tokens")
    r = 1.0 / c.clamp_min(_NORM_EPS_SQ)
    s, pi, num, den = kernels.tssa_token_stats(wc, r, tc.contiguous(), tab, ns)
    den = den.unsqueeze(-1) + _PI_SUM_EPS  # (slots, H, 1)
    g = 1.0 / (1.0 + num / den)
    return kernels.tssa_scale(wc, pi, g, tab, ns), c, r, s, pi, den, g


def _noncausal_backward_fused_varlen(kernels, wc, tc, gc, saved, vt: VarlenTasks):
    """:func:`_noncausal_backward_fused` per sequence: its sums over tokens per slot."""
    c, r, s, pi, den, g = saved
    wc, gc, tab, ns = unit_stride(wc), unit_stride(gc), vt.table, vt.slots
    d_pi, u = kernels.tssa_bwd_gw(wc, gc, pi, g, tab, ns)
    d_dots = u * g * g
    d_q = kernels.tssa_rowdot_sq(wc, d_dots, tab, ns)
    den_tok = _slot_read(kernels, den[..., 0], vt)  # (B, H, N or 1)
    d_pi += d_q / den_tok - _slot_read(kernels, _slot_sum(kernels, d_q * pi, vt) / (den[..., 0] * den[..., 0]), vt)
    d_a = pi * (d_pi - (pi * d_pi).sum(dim=1, keepdim=True))  # zero at padding, where pi is
    d_temp = (d_a * s).sum(dim=(0, 2))
    d_s = (d_a * tc[:, None]).contiguous()
    d_r = kernels.tssa_colsum_sq(wc, d_s, tab, ns)
    d_c = torch.where(c > _NORM_EPS_SQ, -d_r * r * r, torch.zeros_like(d_r))
    coef = (2.0 * (pi / den_tok)).contiguous()
    dw = kernels.tssa_bwd_dw(wc, gc, coef, d_dots, 2.0 * d_s, r, 2.0 * d_c, pi, g, tab, ns)
    return dw, d_temp


class _TSSANonCausalVarlen(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w: torch.Tensor, temp: torch.Tensor, kernels, vt: VarlenTasks) -> torch.Tensor:
        cdt = compute_dtype(w.dtype)
        out, *saved = _noncausal_fused_varlen(kernels, w, w.to(cdt), temp.to(cdt), vt)
        ctx.save_for_backward(w, temp, *saved)
        ctx.kernels, ctx.vt = kernels, vt
        return out.to(w.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        w, temp, *saved = ctx.saved_tensors
        cdt = saved[0].dtype
        dw, d_temp = _noncausal_backward_fused_varlen(
            ctx.kernels, w.to(cdt), temp.to(cdt), grad_out.to(cdt), saved, ctx.vt
        )
        return dw.to(w.dtype), d_temp.to(temp.dtype), None, None


class _TSSACausalVarlen(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, temp, bias, kernels, vt: VarlenTasks) -> torch.Tensor:
        # bias: (H, N_max), read by the kernels at each token's position within its sequence
        cdt = compute_dtype(w.dtype)
        wc, tc, bc = unit_stride(w.to(cdt)), temp.to(cdt).contiguous(), bias.to(cdt).contiguous()
        out, s, pi, den = kernels.tssa_causal(wc, tc, bc, vt.table, vt.slots)
        ctx.save_for_backward(w, temp, s, pi, den)
        ctx.kernels, ctx.vt, ctx.bias_shape, ctx.bias_dtype = kernels, vt, bias.shape, bias.dtype
        return out.to(w.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        w, temp, s, pi, den = ctx.saved_tensors
        cdt, (h, n_max), vt = s.dtype, ctx.bias_shape, ctx.vt
        wc, gc = unit_stride(w.to(cdt)), unit_stride(grad_out.to(cdt))
        d_a, dw = ctx.kernels.tssa_causal_bwd(wc, gc, temp.to(cdt).contiguous(), pi, den, vt.table, vt.slots)
        d_bias = None
        if ctx.needs_input_grad[2]:
            d_s = d_a * temp.to(cdt)[:, None]  # zero at padding, where pi is
            # s = ... + P * bias[h, pos]: the bias gradient gathers each token's d_s at its position
            pos = vt.seg.pos.reshape(-1)
            d_bias = d_s.new_zeros(h, n_max).index_add_(1, pos, d_s.transpose(0, 1).reshape(h, -1))
            d_bias = (d_bias * w.shape[-1]).to(ctx.bias_dtype)
        return dw.to(w.dtype), (d_a * s).sum(dim=(0, 2)).to(temp.dtype), d_bias, None, None


def tssa_cpu_varlen(
    w: torch.Tensor, temp: torch.Tensor, seg: Segments, kernels, *, causal: bool = False, bias=None
) -> torch.Tensor:
    """TSSA (eq. 11 / 28) of every sequence of ``seg`` in the fused CPU kernels, ``(B, H, N, P)``, zero at padding:
    the kernels run over a table of runs of real tokens (:func:`varlen_tasks`), sums and carries per sequence,
    the causal bias ``(H, N_max, 1)`` read at each token's position within its sequence."""
    vt = varlen_tasks(seg, kernels)
    if not causal:
        return _TSSANonCausalVarlen.apply(w, temp, kernels, vt)
    # no bias: zeros over the grid's N positions (every position within a sequence is below N; no host read)
    bias_hn = w.new_zeros(w.shape[1], w.shape[2]) if bias is None else bias[:, :, 0]
    return _TSSACausalVarlen.apply(w, temp, bias_hn, kernels, vt)
