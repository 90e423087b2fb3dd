"""Fastmax over padded batches and packed rows: FAST eqs 24-29 / 32-35 per sequence, in one pass.

With :class:`~attnzoo.ops._varlen.Segments` ``ids`` (the sequence of each token, ``-1`` at padding), the moment
sums of query i run over the real keys of its own sequence only::

    out_i = sum_{n: id_n = id_i [, n <= i]} f(qs_i . k_n) v_n  /  sum_{n: id_n = id_i [, n <= i]} f(qs_i . k_n)

The tokens of one sequence are in order along the row and the ids never decrease over real tokens (a padded
batch has one sequence per row, a packed row its sequences one after another), so the sums are chunked sweeps
whose state restarts where the sequence changes: a chunk's queries read the state carried from earlier chunks
only when that state belongs to their own sequence, and the tokens of their own chunk through the explicit C x C
weights masked to equal ids (and ``n <= i`` when causal). Non-causal rows add a reverse sweep (the suffix state).
Padding keys enter no sum (their ``[v, 1]`` rows are zero) and padding queries give zero output. No padding to a
common length, no loop over sequences: the loops run over token chunks, all rows and sequences at once.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch

from attnzoo.ops._varlen import Segments
from attnzoo.ops.fastmax.chunk import unmasked_backward, unmasked_forward
from attnzoo.ops.fastmax.common import feature_dim, features, features_vjp, kernel, kernel_grad

__all__ = ["masked_sweeps", "MaskedFastmaxFunction"]


def _spans(n: int, chunk: int) -> list[tuple[int, int]]:
    return [(s, min(s + chunk, n)) for s in range(0, n, chunk)]


def _carried(
    x: torch.Tensor, vals: torch.Tensor, ids: torch.Tensor, p: int, chunk: int, reverse: bool, read: Callable
) -> list[torch.Tensor]:
    """Per chunk: ``read(s, e, S)`` at the tokens whose sequence ``S`` belongs to (zero elsewhere), where ``S`` is
    ``sum_n phi(x_n) vals_n^T`` over the earlier chunks' tokens (later ones when ``reverse``) of one sequence: the
    carried moments (eqs 28-29), restarted where the sequence changes (module doc)."""
    b, h, n, _ = x.shape
    state = x.new_zeros(b, h, features(x[..., :1, :], p).shape[-1], vals.shape[-1])
    carry = torch.full((b,), -1, dtype=ids.dtype, device=ids.device)  # the sequence the state belongs to
    spans = _spans(n, chunk)
    parts: list[torch.Tensor] = [x.new_zeros(0)] * len(spans)
    for j in reversed(range(len(spans))) if reverse else range(len(spans)):
        s, e = spans[j]
        idc = ids[:, s:e]
        reads = (idc == carry[:, None]) & (idc >= 0)
        parts[j] = torch.where(reads[:, None, :, None], read(s, e, state), 0.0)
        # the sequence the state holds after this chunk: the chunk's last (first when reverse) real one
        edge = torch.where(idc >= 0, idc, -1).amax(-1) if not reverse else torch.where(idc >= 0, idc, n).amin(-1)
        edge = torch.where((edge >= 0) & (edge < n), edge, carry)  # a chunk of padding only leaves it unchanged
        add = (idc == edge[:, None]) & (idc >= 0)
        keep = (edge == carry)[:, None, None, None]
        vc = torch.where(add[:, None, :, None], vals[..., s:e, :], 0.0)
        state = torch.where(keep, state, 0.0) + features(x[..., s:e, :], p).transpose(-1, -2) @ vc
        carry = edge
    return parts


def _same(ids: torch.Tensor, s: int, e: int, causal: bool) -> torch.Tensor:
    """``(B, C, C)``: key n of the chunk counts for query i (same sequence, real, ``n <= i`` when causal)."""
    idc = ids[:, s:e]
    same = (idc[:, :, None] == idc[:, None, :]) & (idc[:, None, :] >= 0)
    return same.tril() if causal else same


def _augmented(v: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """``[v, 1]`` with zero rows at padding, so padding keys enter no sum."""
    va = torch.cat([v, v.new_ones(v.shape[:-1] + (1,))], dim=-1)
    return torch.where(real[:, None, :, None], va, 0.0)


# Tokens per chunk of a one-sequence-per-row non-causal call, which has no C x C terms: as many as give this many
# feature elements per head (the unmasked path's rule), so few Python steps at long N.
_TOTAL_FEATURES = 1 << 18


def _total_spans(x: torch.Tensor, p: int, chunk: int) -> list[tuple[int, int]]:
    return _spans(x.shape[-2], max(chunk, _TOTAL_FEATURES // feature_dim(x.shape[-1], p)))


def _total(x: torch.Tensor, vals: torch.Tensor, p: int, spans: list[tuple[int, int]]) -> torch.Tensor:
    """``sum_n phi(x_n) vals_n^T`` over the whole row (``vals`` is zero at padding): ``(B, H, P, X)``."""
    return sum(features(x[..., s:e, :], p).transpose(-1, -2) @ vals[..., s:e, :] for s, e in spans)


def _forward(qs, k, v, ids, p: int, causal: bool, chunk: int, single: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``out (B, H, N, Dv)`` (zero at padding) and denominators ``G (B, H, N)`` (1 at padding). ``single``: one
    sequence per row (a padded batch) and not causal, where every query reads its row's total moments."""
    n, dv = qs.shape[-2], v.shape[-1]
    real = ids >= 0
    va = _augmented(v, real)
    keep = real[:, None, :, None]
    if single:
        spans = _total_spans(qs, p, chunk)
        state = _total(k, va, p, spans)
        out_aug = torch.cat([features(qs[..., s:e, :], p) @ state for s, e in spans], dim=-2)
        den = torch.where(keep, out_aug[..., dv:], 1.0)
        return torch.where(keep, out_aug[..., :dv] / den, 0.0), den[..., 0]

    def read(s, e, state):
        return features(qs[..., s:e, :], p) @ state

    sweeps = [_carried(k, va, ids, p, chunk, rev, read) for rev in ((False,) if causal else (False, True))]
    parts = []
    for j, (s, e) in enumerate(_spans(n, chunk)):
        w = kernel(qs[..., s:e, :] @ k[..., s:e, :].transpose(-1, -2), p)
        acc = torch.where(_same(ids, s, e, causal)[:, None], w, 0.0) @ va[..., s:e, :]
        parts.append(sum((sw[j] for sw in sweeps), acc))
    out_aug = torch.cat(parts, dim=-2)
    den = torch.where(keep, out_aug[..., dv:], 1.0)  # padding queries: no keys, zero output (not 0/0)
    return torch.where(keep, out_aug[..., :dv] / den, 0.0), den[..., 0]


def _backward(qs, k, v, ids, out, den, dout, p: int, causal: bool, chunk: int, single: bool):
    """FAST §2.5 (eqs 36-37) per sequence: ``(dqs, dk, dv)`` from the carried states of both sweeps.

    With ``ga_i = [g_i, -g_i . o_i]`` (``g = dO / G``) and ``ds_in = (ga_i . va_n) f'(s_in)`` on the counted
    pairs: ``dqs_i = vjp phi(qs_i) . (S_i ga_i)`` with ``S`` the key moments carried as in the forward,
    ``dk_n = vjp phi(k_n) . (T_n va_n)`` and ``dv_n = phi(k_n) . T_n[:, :Dv]`` with ``T = sum_i phi(qs_i) ga_i^T``
    carried the other way, plus the explicit C x C terms inside each chunk."""
    n, d, dv_dim = qs.shape[-2], qs.shape[-1], v.shape[-1]
    real = ids >= 0
    va = _augmented(v, real)
    g = torch.where(real[:, None, :, None], dout / den.unsqueeze(-1), 0.0)
    ga = torch.cat([g, -(g * out).sum(dim=-1, keepdim=True)], dim=-1)

    def read_q(s, e, state):
        return features_vjp(qs[..., s:e, :], ga[..., s:e, :] @ state.transpose(-1, -2), p)

    def read_k(s, e, state):
        kc = k[..., s:e, :]
        return torch.cat(
            [features_vjp(kc, va[..., s:e, :] @ state.transpose(-1, -2), p), features(kc, p) @ state[..., :dv_dim]], -1
        )

    if single:  # the total moments S and T of the whole row (zero rows at padding in va, ga)
        spans = _total_spans(qs, p, chunk)
        s_tot, t_tot = _total(k, va, p, spans), _total(qs, ga, p, spans)
        dq = torch.cat([read_q(s, e, s_tot) for s, e in spans], dim=-2)
        dkv = torch.cat([read_k(s, e, t_tot) for s, e in spans], dim=-2)
        dkv = torch.where(real[:, None, :, None], dkv, 0.0)  # phi(k_n) . T is not zero at padding keys
        return dq, dkv[..., :d], dkv[..., d:]
    dirs_q = (False,) if causal else (False, True)
    dirs_k = (True,) if causal else (False, True)
    sq = [_carried(k, va, ids, p, chunk, rev, read_q) for rev in dirs_q]
    sk = [_carried(qs, ga, ids, p, chunk, rev, read_k) for rev in dirs_k]
    dq, dkv = [], []
    for j, (s, e) in enumerate(_spans(n, chunk)):
        qc, kc = qs[..., s:e, :], k[..., s:e, :]
        same = _same(ids, s, e, causal)[:, None]
        sc = qc @ kc.transpose(-1, -2)
        ds = torch.where(same, kernel_grad(sc, p), 0.0) * (ga[..., s:e, :] @ va[..., s:e, :].transpose(-1, -2))
        w = torch.where(same, kernel(sc, p), 0.0)
        dq.append(sum((x[j] for x in sq), ds @ kc))
        intra = torch.cat([ds.transpose(-1, -2) @ qc, w.transpose(-1, -2) @ g[..., s:e, :]], -1)
        dkv.append(sum((x[j] for x in sk), intra))
    dkv = torch.cat(dkv, dim=-2)
    return torch.cat(dq, dim=-2), dkv[..., :d], dkv[..., d:]


class _PaddedTotals(torch.autograd.Function):
    """A padded non-causal batch through the unmasked moment-form forward and backward (``factorized``), on inputs
    zeroed at padding: a zero key adds only f(0) = 1 to the sums, so N becomes the row's real count."""

    @staticmethod
    def forward(ctx, qs, k, v, count, p: int):
        out, den = unmasked_forward(qs, k, v, p, count=count)
        ctx.save_for_backward(qs, k, v, out, den)
        ctx.p = p
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        qs, k, v, out, den = ctx.saved_tensors
        return *unmasked_backward(qs, k, v, out, den, dout.contiguous(), ctx.p), None, None


def _padded_totals(qs, k, v, ids, p: int) -> torch.Tensor:
    """:class:`_PaddedTotals` with the padding zeroed by ``where`` (its inputs get exactly zero gradient) and
    padding outputs zero; an all-padding row counts 1 so that no 0/0 appears."""
    real = ids >= 0
    keep = real[:, None, :, None]
    qs, k, v = (torch.where(keep, x, 0.0) for x in (qs, k, v))
    count = real.sum(-1).clamp_min(1)
    return torch.where(keep, _PaddedTotals.apply(qs, k, v, count, p), 0.0)


class MaskedFastmaxFunction(torch.autograd.Function):
    """The masked sweeps with the FAST §2.5 backward: saves only ``qs, k, v, out, G`` (O(N D) per head)."""

    @staticmethod
    def forward(ctx, qs, k, v, ids, p: int, causal: bool, chunk: int, single: bool):
        out, den = _forward(qs, k, v, ids, p, causal, chunk, single)
        ctx.save_for_backward(qs, k, v, ids, out, den)
        ctx.p, ctx.causal, ctx.chunk, ctx.single = p, causal, chunk, single
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        qs, k, v, ids, out, den = ctx.saved_tensors
        dq, dk, dv = _backward(qs, k, v, ids, out, den, dout, ctx.p, ctx.causal, ctx.chunk, ctx.single)
        return dq, dk, dv, None, None, None, None, None


def masked_sweeps(
    qs: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    segs: Segments,
    *,
    p: int,
    causal: bool,
    chunk: int,
    custom_grad: bool = True,
) -> torch.Tensor:
    """Module doc's sums on standardised ``qs = scale * q_hat``, ``k = k_hat`` ``(B, H, N, D)``, ``v (B, H, N, Dv)``
    -> ``(B, H, N, Dv)`` (zero at padding). ``custom_grad``: FAST §2.5's backward (:class:`MaskedFastmaxFunction`),
    else autograd through the sweeps; either way padding inputs get exactly zero gradient (every sum masks by
    ``where``)."""
    ids = segs.ids.to(qs.device)
    single = not causal and segs.num == 1
    if single and custom_grad and not torch.compiler.is_compiling():
        return _padded_totals(qs, k, v, ids, p)
    if custom_grad and torch.is_grad_enabled() and (qs.requires_grad or k.requires_grad or v.requires_grad):
        return MaskedFastmaxFunction.apply(qs, k, v, ids, p, causal, chunk, single)
    with torch.no_grad() if custom_grad else contextlib.nullcontext():
        return _forward(qs, k, v, ids, p, causal, chunk, single)[0]
