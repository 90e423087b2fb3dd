"""Triton kernels for TSSA (ToST): non-causal Alg. 1 / eq. 11 and causal Alg. 2 / eq. 28, forward and backward.

Public entry point :func:`tssa_triton` (used by ``tssa(..., backend="triton")``; ``"auto"`` keeps the
PyTorch path). The math and the saved tensors follow ``chunk.py`` (the ``"torch"`` backend): forward saves
``w`` plus ``(B, H, N)`` / ``(B, H, P)`` statistics, backward recomputes the ``(B, H, N, P)`` intermediates.
Every sum over tokens accumulates in float32 (float64 for float64 ``w``) also for fp16 ``w``.

Kernel layout. ``w`` is viewed as ``(B*H, N, P)``. Token reductions are "column" kernels (one program per
``(b, h, P-block)`` looping over token blocks); per-token reductions over ``P`` are "row" kernels (one
program per ``(b, h, token block)`` looping over P-blocks); the softmax over heads is a tiny kernel on
``(B, H, N)`` with one program per ``(b, token block)`` holding all heads. Causal prefix sums are two-level
scans: ``tl.cumsum`` inside a block of ``BLOCK_N`` tokens plus a float32 carry across blocks, one program
per ``(b, h, P-block)``; the backward's reverse (suffix) scans re-create the forward prefix inside a block
from the block-start carries that its forward sweep stored (``(B, H, N/BLOCK_N, P)``, small).

Padded batches and packed rows (``seg``): the kernels read per-token sequence ids and first/last-token flags
(``(B, N)`` int32, :func:`_seg_meta`) and nothing else changes in the data flow (no copy or re-padding of ``w``,
no loop over sequences). Token sums become segmented scans (``tl.associative_scan`` with a combine that restarts
at a flagged token, plus the carry from earlier blocks up to the block's first flag); a non-causal sequence's total
is its scan value at its last token, stored in a ``(BH, S, P)`` per-sequence statistic that the per-token kernels
read at the token's sequence. Causal prefix sums restart at each sequence's first token, reverse sums at its last;
padding is loaded as 0 and gets ``pi = 0``, so it gives zero output and zero gradient.

Memory traffic, in units of one ``(B, H, N, P)`` tensor ``|w|`` (the ``(B, H, N)`` traffic is ~``1/P`` of it):

* non-causal forward: reads ``w`` 4x (column norms, Pi's logits, Pi-weighted moments, output), writes 1x.
* non-causal backward: reads ``w`` 4x and ``grad_out`` 3x, writes ``grad_w`` 1x.
* causal forward: reads ``w`` 2x, writes 1x. Causal backward: reads ``w`` and ``grad_out`` 3x each, writes 1x.

Parallelism is over ``B*H*(P/BLOCK_P)`` programs for scans (token-sequential inside), which saturates a
GPU for training-size batches; a single long sequence with few heads uses few SMs (correctness first).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from attnzoo.ops._triton_utils import check_launchable, interpreting, pow2, tl_acc_dtype
from attnzoo.ops._varlen import Segments
from attnzoo.ops.tssa.chunk import reverse_chunked_cumsum
from attnzoo.ops.tssa.naive import compute_dtype

__all__ = ["tssa_triton"]

# Same constants as chunk.py / naive.py: F.normalize's eps squared, and Alg. 1's 1e-8 on <pi_k, 1>.
_NORM_EPS_SQ = 1e-24
_PI_SUM_EPS = 1e-8


# ---------------------------------------------------------------------------------------------------
# padded batches and packed rows: per-token sequence ids and start/end flags (see _seg_meta)
# ---------------------------------------------------------------------------------------------------
@triton.jit
def _seg_add(a, fa, b, fb):
    """Combine of a segmented sum: a flagged element (a sequence boundary) restarts the running sum."""
    return tl.where(fb != 0, b, a + b), fa | fb


@triton.jit
def _seg_tokens(ids_ptr, flags_ptr, bh, H, N, offs_n, nmask):
    """Per token of a block: real flag, slot (sequence id, 0 at padding), first-token and last-token flags."""
    row = (bh // H) * N
    ids = tl.load(ids_ptr + row + offs_n, mask=nmask, other=-1)
    fl = tl.load(flags_ptr + row + offs_n, mask=nmask, other=0)
    return ids >= 0, tl.maximum(ids, 0), fl & 1, (fl >> 1) & 1


@triton.jit
def _seg_scan(x, flag, carry, REVERSE: tl.constexpr):
    """Prefix (suffix if REVERSE) sums over axis 0 of ``x (BLOCK_N, BLOCK_P)`` restarted at rows with ``flag``
    (a sequence's first token; its last when REVERSE), plus ``carry`` on the rows before (after) the first flag."""
    fb = tl.broadcast_to(flag[:, None], x.shape)
    s, _ = tl.associative_scan((x, fb), 0, _seg_add, reverse=REVERSE)
    seen = tl.cumsum(flag, 0, reverse=REVERSE)
    return s + tl.where(seen[:, None] == 0, carry[None, :], 0.0)


@triton.jit
def _seg_scan1(x, flag, carry, REVERSE: tl.constexpr):
    """:func:`_seg_scan` of a ``(BLOCK_N,)`` vector with a scalar carry."""
    s, _ = tl.associative_scan((x, flag), 0, _seg_add, reverse=REVERSE)
    seen = tl.cumsum(flag, 0, reverse=REVERSE)
    return s + tl.where(seen == 0, carry, 0.0)


@triton.jit
def _edge_row(s, ROW: tl.constexpr, BLOCK_N: tl.constexpr):
    """Row ``ROW`` of a ``(BLOCK_N, BLOCK_P)`` tile (the carry into the next block of a scan)."""
    return tl.sum(tl.where((tl.arange(0, BLOCK_N) == ROW)[:, None], s, 0.0), axis=0)


@triton.jit
def _edge(s, ROW: tl.constexpr, BLOCK_N: tl.constexpr):
    return tl.sum(tl.where(tl.arange(0, BLOCK_N) == ROW, s, 0.0), axis=0)


@triton.jit
def _slot_tile(ptr, bh, S, slot, offs_p, m, P):
    """``stat[bh, slot[n], p]`` of a ``(BH, S, P)`` per-sequence statistic as a ``(BLOCK_N, BLOCK_P)`` tile."""
    return tl.load(ptr + (bh * S + slot)[:, None] * P + offs_p[None, :], mask=m, other=0.0)


@triton.jit
def _feature_stat(ptr, bh, S, slot, offs_p, m, P, SEG: tl.constexpr):
    """A per-feature statistic as read by the tokens of a ``(BLOCK_N, BLOCK_P)`` tile: with SEG the token's sequence's
    (``(BH, S, P)``, :func:`_slot_tile`), else the row's ``(BH, P)`` broadcast over the tokens."""
    if SEG:
        t = _slot_tile(ptr, bh, S, slot, offs_p, m, P)
    else:
        t = tl.load(ptr + bh * P + offs_p, mask=offs_p < P, other=0.0)[None, :]
    return t


@triton.jit
def _block_tokens(ids_ptr, flags_ptr, bh, H, N, offs_n, SEG: tl.constexpr):
    """Per token of a block: in range, real (in range and, with SEG, not padding), and with SEG its slot (sequence
    id), first-token and last-token flags (:func:`_seg_tokens`; without SEG placeholders that are never read)."""
    nmask = offs_n < N
    lmask, slot, first, last = nmask, offs_n, nmask, nmask
    if SEG:
        real, slot, first, last = _seg_tokens(ids_ptr, flags_ptr, bh, H, N, offs_n, nmask)
        lmask = nmask & real
    return nmask, lmask, slot, first, last


@triton.jit
def _tile_idx(bh, offs_n, offs_p, N, P):
    """Offsets of the ``(BLOCK_N, BLOCK_P)`` tile at tokens ``offs_n``, features ``offs_p`` of a ``(BH, N, P)`` view."""
    return bh * N * P + offs_n[:, None] * P + offs_p[None, :]


@triton.jit
def _scan(x, flag, carry, SEG: tl.constexpr, REVERSE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Inclusive prefix (suffix if REVERSE) sums over the tokens of ``x (BLOCK_N, BLOCK_P)`` plus ``carry (BLOCK_P,)``
    from the blocks before (after), restarted with SEG at each sequence's first (last) token ``flag``; returns the
    sums and the carry into the next block."""
    if SEG:
        run = _seg_scan(x, flag, carry, REVERSE)
        if REVERSE:
            nxt = _edge_row(run, 0, BLOCK_N)
        else:
            nxt = _edge_row(run, BLOCK_N - 1, BLOCK_N)
    else:
        run = tl.cumsum(x, axis=0, reverse=REVERSE) + carry[None, :]
        nxt = carry + tl.sum(x, axis=0)
    return run, nxt


# ---------------------------------------------------------------------------------------------------
# generic kernels (views: x, y (BH, N, P); per-token vectors (BH, N); per-feature vectors (BH, P))
# ---------------------------------------------------------------------------------------------------
@triton.jit
def _col_reduce_kernel(
    x_ptr,
    y_ptr,
    a_ptr,
    out_ptr,
    ids_ptr,
    flags_ptr,
    H,
    S,
    N,
    P,
    HAS_Y: tl.constexpr,
    HAS_A: tl.constexpr,
    SEG: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """out[bh, p] = sum_n a[bh, n] * x[bh, n, p] * (y if HAS_Y else x)[bh, n, p]; with SEG out[bh, s, p] sums the
    real tokens of sequence s only (a segmented scan whose value at a sequence's last token is its total)."""
    bh = tl.program_id(0).to(tl.int64)
    offs_p = tl.program_id(1) * BLOCK_P + tl.arange(0, BLOCK_P)
    pmask = offs_p < P
    acc = tl.zeros((BLOCK_P,), ACC)
    for start in range(0, N, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        _, lmask, slot, first, last = _block_tokens(ids_ptr, flags_ptr, bh, H, N, offs_n, SEG)
        m = lmask[:, None] & pmask[None, :]
        idx = _tile_idx(bh, offs_n, offs_p, N, P)
        x = tl.load(x_ptr + idx, mask=m, other=0.0).to(ACC)
        if HAS_Y:
            t = x * tl.load(y_ptr + idx, mask=m, other=0.0).to(ACC)
        else:
            t = x * x
        if HAS_A:
            t = t * tl.load(a_ptr + bh * N + offs_n, mask=lmask, other=0.0).to(ACC)[:, None]
        if SEG:
            run, acc = _scan(t, first, acc, SEG, False, BLOCK_N)
            dst = out_ptr + (bh * S + slot)[:, None] * P + offs_p[None, :]
            tl.store(dst, run, mask=(last != 0)[:, None] & m)
        else:
            acc += tl.sum(t, axis=0)
    if not SEG:
        tl.store(out_ptr + bh * P + offs_p, acc, mask=pmask)


@triton.jit
def _row_reduce_kernel(
    x_ptr,
    y_ptr,
    u_ptr,
    v_ptr,
    out_ptr,
    ids_ptr,
    flags_ptr,
    H,
    S,
    N,
    P,
    HAS_Y: tl.constexpr,
    SEG: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """out[bh, n] = sum_p x^2 u[bh, p] (+ x y v[bh, p] if HAS_Y); with SEG u, v are per sequence ``(BH, S, P)``,
    read at the token's sequence, and padding gives 0."""
    bh = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask, rmask, slot, first, last = _block_tokens(ids_ptr, flags_ptr, bh, H, N, offs_n, SEG)
    acc = tl.zeros((BLOCK_N,), ACC)
    for start in range(0, P, BLOCK_P):
        offs_p = start + tl.arange(0, BLOCK_P)
        m = rmask[:, None] & (offs_p < P)[None, :]
        idx = _tile_idx(bh, offs_n, offs_p, N, P)
        x = tl.load(x_ptr + idx, mask=m, other=0.0).to(ACC)
        t = x * x * _feature_stat(u_ptr, bh, S, slot, offs_p, m, P, SEG)
        if HAS_Y:
            y = tl.load(y_ptr + idx, mask=m, other=0.0).to(ACC)
            t += x * y * _feature_stat(v_ptr, bh, S, slot, offs_p, m, P, SEG)
        acc += tl.sum(t, axis=1)
    tl.store(out_ptr + bh * N + offs_n, acc, mask=nmask)


@triton.jit
def _head_softmax_kernel(
    s_ptr, temp_ptr, pi_ptr, ids_ptr, H, N, SEG: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr
):
    """pi[b, :, n] = softmax over heads of s[b, :, n] * temp (eq. 10 / 39); one program holds all heads. With
    SEG, 0 at padding (padding enters no sum over tokens)."""
    b = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_h = tl.arange(0, BLOCK_H)
    hmask = offs_h < H
    nmask = offs_n < N
    m = hmask[:, None] & nmask[None, :]
    idx = b * H * N + offs_h[:, None] * N + offs_n[None, :]
    s = tl.load(s_ptr + idx, mask=m, other=0.0)
    t = tl.load(temp_ptr + offs_h, mask=hmask, other=0.0)
    a = tl.where(hmask[:, None], s * t[:, None], float("-inf"))
    e = tl.exp(a - tl.max(a, axis=0)[None, :])
    pi = e / tl.sum(e, axis=0)[None, :]
    if SEG:
        real = tl.load(ids_ptr + b * N + offs_n, mask=nmask, other=-1) >= 0
        pi = tl.where(real[None, :], pi, 0.0)
    tl.store(pi_ptr + idx, pi, mask=m)


@triton.jit
def _token_feature_tile(ids_ptr, flags_ptr, H, N, P, SEG: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_P: tl.constexpr):
    """The ``(BLOCK_N, BLOCK_P)`` tile of a program of the grid ``(BH, N / BLOCK_N, P / BLOCK_P)``: its row ``bh``,
    token and feature offsets, the in-range token mask, the in-range tile mask ``m``, ``m`` at real tokens only and
    the tokens' slots (:func:`_block_tokens`)."""
    bh = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_p = tl.program_id(2) * BLOCK_P + tl.arange(0, BLOCK_P)
    nmask, lmask, slot, first, last = _block_tokens(ids_ptr, flags_ptr, bh, H, N, offs_n, SEG)
    pmask = offs_p < P
    return bh, offs_n, offs_p, nmask, nmask[:, None] & pmask[None, :], lmask[:, None] & pmask[None, :], slot


@triton.jit
def _nc_out_kernel(
    w_ptr,
    pi_ptr,
    g_ptr,
    out_ptr,
    ids_ptr,
    flags_ptr,
    H,
    S,
    N,
    P,
    SEG: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """eq. 11: out = -w * pi[n] * g[p] with g = 1 / (1 + dots) (with SEG g of the token's sequence, 0 at padding)."""
    bh, offs_n, offs_p, nmask, m, mr, slot = _token_feature_tile(ids_ptr, flags_ptr, H, N, P, SEG, BLOCK_N, BLOCK_P)
    idx = _tile_idx(bh, offs_n, offs_p, N, P)
    g = _feature_stat(g_ptr, bh, S, slot, offs_p, mr, P, SEG)
    w = tl.load(w_ptr + idx, mask=mr, other=0.0).to(ACC)
    pi = tl.load(pi_ptr + bh * N + offs_n, mask=nmask, other=0.0)
    tl.store(out_ptr + idx, (-w * pi[:, None] * g).to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _nc_dw_kernel(
    w_ptr,
    go_ptr,
    q_ptr,
    ds_ptr,
    pi_ptr,
    ddots_ptr,
    r_ptr,
    dc_ptr,
    g_ptr,
    dw_ptr,
    ids_ptr,
    flags_ptr,
    H,
    S,
    N,
    P,
    SEG: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """dw = 2 w (q[n] d_dots[p] + d_s[n] r[p] + d_c[p]) - grad_out pi[n] g[p] (chain rule of Alg. 1); with SEG
    the per-feature statistics are the token's sequence's and padding gets 0."""
    bh, offs_n, offs_p, nmask, m, mr, slot = _token_feature_tile(ids_ptr, flags_ptr, H, N, P, SEG, BLOCK_N, BLOCK_P)
    idx = _tile_idx(bh, offs_n, offs_p, N, P)
    dd = _feature_stat(ddots_ptr, bh, S, slot, offs_p, mr, P, SEG)
    r = _feature_stat(r_ptr, bh, S, slot, offs_p, mr, P, SEG)
    dc = _feature_stat(dc_ptr, bh, S, slot, offs_p, mr, P, SEG)
    g = _feature_stat(g_ptr, bh, S, slot, offs_p, mr, P, SEG)
    w = tl.load(w_ptr + idx, mask=mr, other=0.0).to(ACC)
    go = tl.load(go_ptr + idx, mask=mr, other=0.0).to(ACC)
    q = tl.load(q_ptr + bh * N + offs_n, mask=nmask, other=0.0)
    ds = tl.load(ds_ptr + bh * N + offs_n, mask=nmask, other=0.0)
    pi = tl.load(pi_ptr + bh * N + offs_n, mask=nmask, other=0.0)
    inner = q[:, None] * dd + ds[:, None] * r + dc
    dw = 2.0 * w * inner - go * pi[:, None] * g
    tl.store(dw_ptr + idx, dw.to(dw_ptr.dtype.element_ty), mask=m)


# ---------------------------------------------------------------------------------------------------
# causal scans
# ---------------------------------------------------------------------------------------------------
@triton.jit
def _c_logits_kernel(
    w_ptr,
    spart_ptr,
    ids_ptr,
    flags_ptr,
    H,
    N,
    P,
    SEG: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """Alg. 2: spart[bh, pb, n] = sum over this P-block of w^2 / cumsum_n(w^2) (0/0 := 0); with SEG the prefix
    sums restart at each sequence's first token and padding gives 0."""
    bh = tl.program_id(0).to(tl.int64)
    pb = tl.program_id(1)
    offs_p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    pmask = offs_p < P
    carry = tl.zeros((BLOCK_P,), ACC)
    for start in range(0, N, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        nmask, lmask, slot, first, last = _block_tokens(ids_ptr, flags_ptr, bh, H, N, offs_n, SEG)
        m = lmask[:, None] & pmask[None, :]
        w = tl.load(w_ptr + _tile_idx(bh, offs_n, offs_p, N, P), mask=m, other=0.0).to(ACC)
        x = w * w
        S, carry = _scan(x, first, carry, SEG, False, BLOCK_N)
        ratio = x / tl.where(S > 0, S, 1.0)
        tl.store(spart_ptr + (bh * tl.num_programs(1) + pb) * N + offs_n, tl.sum(ratio, axis=1), mask=nmask)


@triton.jit
def _c_out_kernel(
    w_ptr,
    pi_ptr,
    den_ptr,
    out_ptr,
    ids_ptr,
    flags_ptr,
    H,
    N,
    P,
    SEG: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """eq. 28: out = -w pi / (1 + cumsum(w^2 pi) / cumsum(pi)); P-block 0 also writes den = cumsum(pi). With SEG
    the prefix sums restart at each sequence's first token (pi is 0 at padding)."""
    bh = tl.program_id(0).to(tl.int64)
    pb = tl.program_id(1)
    offs_p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    pmask = offs_p < P
    carry_num = tl.zeros((BLOCK_P,), ACC)
    carry_den = tl.sum(tl.zeros((BLOCK_P,), ACC), axis=0)
    for start in range(0, N, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        nmask, lmask, slot, first, last = _block_tokens(ids_ptr, flags_ptr, bh, H, N, offs_n, SEG)
        idx = _tile_idx(bh, offs_n, offs_p, N, P)
        w = tl.load(w_ptr + idx, mask=lmask[:, None] & pmask[None, :], other=0.0).to(ACC)
        pi = tl.load(pi_ptr + bh * N + offs_n, mask=nmask, other=0.0)
        xp = w * w * pi[:, None]
        if SEG:
            den = _seg_scan1(pi, first, carry_den, False)
            carry_den = _edge(den, BLOCK_N - 1, BLOCK_N)
        else:
            den = tl.cumsum(pi, axis=0) + carry_den
            carry_den += tl.sum(pi, axis=0)
        num, carry_num = _scan(xp, first, carry_num, SEG, False, BLOCK_N)
        dots = num / tl.where(den > 0, den, 1.0)[:, None]
        out = -w * pi[:, None] / (1.0 + dots)
        tl.store(out_ptr + idx, out.to(out_ptr.dtype.element_ty), mask=nmask[:, None] & pmask[None, :])
        if pb == 0:
            tl.store(den_ptr + bh * N + offs_n, den, mask=nmask)


@triton.jit
def _c_bwd_fwd_sweep_kernel(
    w_ptr,
    go_ptr,
    pi_ptr,
    den_ptr,
    a1_ptr,
    a2_ptr,
    cS_ptr,
    cN_ptr,
    ids_ptr,
    flags_ptr,
    H,
    N,
    P,
    NC,
    SEG: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """Backward forward-sweep: per-P-block partials a1 = -sum_p go w g, a2 = sum_p d_dots dots, and the
    block-start carries of cumsum(w^2) (cS) and cumsum(w^2 pi) (cN) for the reverse sweeps (segmented with SEG)."""
    bh = tl.program_id(0).to(tl.int64)
    pb = tl.program_id(1)
    offs_p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    pmask = offs_p < P
    carry_S = tl.zeros((BLOCK_P,), ACC)
    carry_N = tl.zeros((BLOCK_P,), ACC)
    part = (bh * tl.num_programs(1) + pb) * N
    for c in range(0, NC):
        offs_n = c * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask, lmask, slot, first, last = _block_tokens(ids_ptr, flags_ptr, bh, H, N, offs_n, SEG)
        m = lmask[:, None] & pmask[None, :]
        idx = _tile_idx(bh, offs_n, offs_p, N, P)
        tl.store(cS_ptr + (bh * NC + c) * P + offs_p, carry_S, mask=pmask)
        tl.store(cN_ptr + (bh * NC + c) * P + offs_p, carry_N, mask=pmask)
        w = tl.load(w_ptr + idx, mask=m, other=0.0).to(ACC)
        go = tl.load(go_ptr + idx, mask=m, other=0.0).to(ACC)
        pi = tl.load(pi_ptr + bh * N + offs_n, mask=nmask, other=0.0)
        den = tl.load(den_ptr + bh * N + offs_n, mask=nmask, other=1.0)
        x = w * w
        xp = x * pi[:, None]
        num, carry_N = _scan(xp, first, carry_N, SEG, False, BLOCK_N)
        dots = num / tl.where(den > 0, den, 1.0)[:, None]
        g = 1.0 / (1.0 + dots)
        gw = go * w
        tl.store(a1_ptr + part + offs_n, -tl.sum(gw * g, axis=1), mask=nmask)
        d_dots = gw * pi[:, None] * g * g
        tl.store(a2_ptr + part + offs_n, tl.sum(d_dots * dots, axis=1), mask=nmask)
        _, carry_S = _scan(x, first, carry_S, SEG, False, BLOCK_N)


@triton.jit
def _c_bwd_rev_sweep_kernel(
    w_ptr,
    go_ptr,
    pi_ptr,
    den_ptr,
    cS_ptr,
    cN_ptr,
    ds_ptr,
    a3_ptr,
    dw_ptr,
    ids_ptr,
    flags_ptr,
    H,
    N,
    P,
    NC,
    FINAL: tl.constexpr,
    SEG: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """Backward reverse sweep. d_num = suffix-sum of d_dots / den. FINAL=False: a3 = sum_p d_num w^2 (for
    d_pi). FINAL=True: dw = 2 w (d_num pi + d_s / S + suffix-sum(-w^2 d_s / S^2)) - go pi g. With SEG the
    prefix sums restart at each sequence's first token and the suffix sums at its last."""
    bh = tl.program_id(0).to(tl.int64)
    pb = tl.program_id(1)
    offs_p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    pmask = offs_p < P
    suf_num = tl.zeros((BLOCK_P,), ACC)
    suf_S = tl.zeros((BLOCK_P,), ACC)
    part = (bh * tl.num_programs(1) + pb) * N
    for i in range(0, NC):
        c = NC - 1 - i
        offs_n = c * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask, lmask, slot, first, last = _block_tokens(ids_ptr, flags_ptr, bh, H, N, offs_n, SEG)
        m = lmask[:, None] & pmask[None, :]
        idx = _tile_idx(bh, offs_n, offs_p, N, P)
        cS = tl.load(cS_ptr + (bh * NC + c) * P + offs_p, mask=pmask, other=0.0)
        cN = tl.load(cN_ptr + (bh * NC + c) * P + offs_p, mask=pmask, other=0.0)
        w = tl.load(w_ptr + idx, mask=m, other=0.0).to(ACC)
        go = tl.load(go_ptr + idx, mask=m, other=0.0).to(ACC)
        pi = tl.load(pi_ptr + bh * N + offs_n, mask=nmask, other=0.0)
        den = tl.load(den_ptr + bh * N + offs_n, mask=nmask, other=1.0)
        den_safe = tl.where(den > 0, den, 1.0)
        x = w * w
        xp = x * pi[:, None]
        num, _ = _scan(xp, first, cN, SEG, False, BLOCK_N)
        dots = num / den_safe[:, None]
        g = 1.0 / (1.0 + dots)
        y = go * w * pi[:, None] * g * g / den_safe[:, None]
        d_num, suf_num = _scan(y, last, suf_num, SEG, True, BLOCK_N)
        if FINAL:
            ds = tl.load(ds_ptr + bh * N + offs_n, mask=nmask, other=0.0)
            S, _ = _scan(x, first, cS, SEG, False, BLOCK_N)
            inv_S = 1.0 / tl.where(S > 0, S, 1.0)
            d_S = -x * inv_S * inv_S * ds[:, None]
            suf, suf_S = _scan(d_S, last, suf_S, SEG, True, BLOCK_N)
            dx = d_num * pi[:, None] + ds[:, None] * inv_S + suf
            dw = 2.0 * w * dx - go * pi[:, None] * g
            tl.store(dw_ptr + idx, dw.to(dw_ptr.dtype.element_ty), mask=nmask[:, None] & pmask[None, :])
        else:
            tl.store(a3_ptr + part + offs_n, tl.sum(d_num * x, axis=1), mask=nmask)


@triton.jit
def _seg_rev_cumsum_kernel(x_ptr, out_ptr, ids_ptr, flags_ptr, H, N, ACC: tl.constexpr, BLOCK_N: tl.constexpr):
    """out[bh, n] = sum of x[bh, m] over the tokens m >= n of n's sequence (x is 0 at padding)."""
    bh = tl.program_id(0).to(tl.int64)
    carry = tl.sum(tl.zeros((BLOCK_N,), ACC), axis=0)
    nb = tl.cdiv(N, BLOCK_N)
    for i in range(0, nb):
        offs_n = (nb - 1 - i) * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = offs_n < N
        real, slot, first, last = _seg_tokens(ids_ptr, flags_ptr, bh, H, N, offs_n, nmask)
        x = tl.load(x_ptr + bh * N + offs_n, mask=nmask & real, other=0.0).to(ACC)
        s = _seg_scan1(x, last, carry, True)
        tl.store(out_ptr + bh * N + offs_n, s, mask=nmask)
        carry = _edge(s, 0, BLOCK_N)


# ---------------------------------------------------------------------------------------------------
# host side
# ---------------------------------------------------------------------------------------------------
class _SegMeta(NamedTuple):
    """What the kernels read of :class:`~attnzoo.ops._varlen.Segments`: ``ids`` ``(B, N)`` int32 (the token's
    sequence within its row, -1 at padding), ``flags`` ``(B, N)`` int32 (bit 0: the sequence's first token, bit 1:
    its last), ``num`` sequences per row, ``pos`` ``(B, N)`` int64 (the position within the sequence)."""

    ids: torch.Tensor
    flags: torch.Tensor
    num: int
    pos: torch.Tensor


def _seg_meta(seg: Segments) -> _SegMeta:
    real, pos = seg.real, seg.pos
    length = seg.lengths.gather(1, seg.ids.clamp_min(0))  # (B, N): the length of the token's sequence
    flags = (real & (pos == 0)).int() | ((real & (pos == length - 1)).int() << 1)
    return _SegMeta(seg.ids.int().contiguous(), flags.contiguous(), seg.num, pos)


def _blocks(p: int, block_n: int | None, block_p: int | None) -> tuple[int, int]:
    if block_n is None:
        block_n = 16 if interpreting() else 64
    if block_p is None:
        block_p = min(pow2(p, 16), 16 if interpreting() else 64)
    return block_n, block_p


def _tiles(meta: _SegMeta | None, cdt: torch.dtype, block_n: int, block_p: int) -> dict:
    """The kernels' compile-time keywords: with segments or not, the accumulation dtype, the token and feature tiles."""
    return dict(SEG=meta is not None, ACC=tl_acc_dtype(cdt), BLOCK_N=block_n, BLOCK_P=block_p)


def _seg_args(x: torch.Tensor, h: int, meta: _SegMeta | None) -> tuple:
    # the kernels' (ids, flags, H, S) arguments; without segments unused (any tensor stands for the pointers)
    if meta is None:
        return x, x, h, 1
    return meta.ids, meta.flags, h, meta.num


def _head_softmax(s: torch.Tensor, temp: torch.Tensor, block_n: int, meta: _SegMeta | None = None) -> torch.Tensor:
    b, h, n = s.shape
    pi = torch.empty_like(s)
    _head_softmax_kernel[(b, triton.cdiv(n, block_n))](
        s,
        temp.to(s.dtype).contiguous(),
        pi,
        s if meta is None else meta.ids,
        h,
        n,
        SEG=meta is not None,
        BLOCK_H=pow2(h, 1),
        BLOCK_N=block_n,
    )
    return pi


def _col_reduce(x, y=None, a=None, *, cdt, bn, bp, h, meta=None):
    """``(BH, P)`` sums over tokens, or with ``meta`` ``(BH, S, P)`` sums over each sequence's real tokens."""
    bh, n, p = x.shape
    if meta is None:
        out = torch.empty(bh, p, device=x.device, dtype=cdt)
    else:  # a row without real tokens writes no slot
        out = torch.zeros(bh, meta.num, p, device=x.device, dtype=cdt)
    _col_reduce_kernel[(bh, triton.cdiv(p, bp))](
        x,
        x if y is None else y,
        x if a is None else a,
        out,
        *_seg_args(x, h, meta),
        n,
        p,
        HAS_Y=y is not None,
        HAS_A=a is not None,
        **_tiles(meta, cdt, bn, bp),
    )
    return out


def _row_reduce(x, u, y=None, v=None, *, cdt, bn, bp, h, meta=None):
    bh, n, p = x.shape
    out = torch.empty(bh, n, device=x.device, dtype=cdt)
    _row_reduce_kernel[(bh, triton.cdiv(n, bn))](
        x,
        x if y is None else y,
        u,
        u if v is None else v,
        out,
        *_seg_args(x, h, meta),
        n,
        p,
        HAS_Y=y is not None,
        **_tiles(meta, cdt, bn, bp),
    )
    return out


def _seg_sum_tokens(x: torch.Tensor, meta: _SegMeta | None) -> torch.Tensor:
    """``(B, H, N) -> (BH, S)`` sums over each sequence's tokens (``x`` is 0 at padding); ``(BH, 1)`` without."""
    b, h, n = x.shape
    if meta is None or meta.num == 1:
        return x.sum(dim=-1).reshape(b * h, 1)
    # a packed row (B = 1, no padding): index_add by sequence id
    return x.new_zeros(b, h, meta.num).index_add_(2, meta.ids[0].long(), x).reshape(b * h, meta.num)


def _read_tokens(stat: torch.Tensor, meta: _SegMeta | None) -> torch.Tensor:
    """``(BH, S) -> (BH, N or 1)``: each token's sequence statistic."""
    if meta is None or meta.num == 1:
        return stat
    return stat.index_select(1, meta.ids[0].long().clamp_min(0))


class _TSSANonCausalTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w: torch.Tensor, temp: torch.Tensor, block_n: int, block_p: int, meta: _SegMeta | None):
        b, h, n, p = w.shape
        cdt = compute_dtype(w.dtype)
        w3 = w.contiguous().view(b * h, n, p)
        kw = dict(cdt=cdt, bn=block_n, bp=block_p, h=h, meta=meta)
        c = _col_reduce(w3, **kw)  # (BH[, S], P) squared feature norms over (each sequence's) tokens
        r = 1.0 / c.clamp_min(_NORM_EPS_SQ)
        s = _row_reduce(w3, r, **kw).view(b, h, n)  # sum_p w^2 / ||w_:,p||^2  (App. C.1 normalisation)
        pi = _head_softmax(s, temp, block_n, meta)  # 0 at padding
        den = _seg_sum_tokens(pi, meta) + _PI_SUM_EPS  # (BH, S)
        dots = _col_reduce(w3, a=pi.view(b * h, n), **kw) / den.view(*den.shape, *([1] * (c.ndim - 2)))
        g = 1.0 / (1.0 + dots)
        out = torch.empty_like(w3)
        grid = (b * h, triton.cdiv(n, block_n), triton.cdiv(p, block_p))
        _nc_out_kernel[grid](w3, pi, g, out, *_seg_args(w3, h, meta), n, p, **_tiles(meta, cdt, block_n, block_p))
        ctx.save_for_backward(w, temp, c, r, s, pi, den, dots, g)
        ctx.blocks, ctx.meta = (block_n, block_p), meta
        return out.view(b, h, n, p)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        w, temp, c, r, s, pi, den, dots, g = ctx.saved_tensors
        block_n, block_p = ctx.blocks
        meta = ctx.meta
        b, h, n, p = w.shape
        cdt = c.dtype
        kw = dict(cdt=cdt, bn=block_n, bp=block_p, h=h, meta=meta)
        w3 = w.contiguous().view(b * h, n, p)
        go3 = grad_out.contiguous().view(b * h, n, p)
        pi2 = pi.view(b * h, n)
        den_p = den if meta is None else den.unsqueeze(-1)  # broadcasts over (BH[, S], P)
        # out = -w pi g,  g = 1 / (1 + dots),  dots = (pi / den) @ w^2  (per sequence with segments)
        d_dots = _col_reduce(w3, go3, pi2, **kw) * g * g  # (BH[, S], P)
        # d_pi[n] = -sum_p go w g + sum_p w^2 d_dots / den - sum_n' d_q pi / den^2; the last sum equals
        # sum_p d_dots dots / den because dots = sum_n pi w^2 / den.
        corr = (d_dots * dots).sum(-1) / den.view(d_dots.shape[:-1])  # (BH[, S])
        if meta is not None:
            corr = _read_tokens(corr, meta)
        else:
            corr = corr.unsqueeze(-1)
        d_pi = _row_reduce(w3, (d_dots / den_p).contiguous(), go3, (-g).contiguous(), **kw) - corr
        d_pi = d_pi.view(b, h, n)
        d_a = pi * (d_pi - (pi * d_pi).sum(dim=1, keepdim=True))  # softmax over heads (0 at padding)
        d_temp = (d_a * s).sum(dim=(0, 2))
        d_s = (d_a * temp.to(cdt)[:, None]).reshape(b * h, n).contiguous()
        d_r = _col_reduce(w3, a=d_s, **kw)
        d_c = torch.where(c > _NORM_EPS_SQ, -d_r * r * r, torch.zeros_like(d_r))
        q = (pi2 / _read_tokens(den, meta)).contiguous()
        dw = torch.empty_like(w3)
        stats = (q, d_s, pi2, d_dots.contiguous(), r, d_c.contiguous(), g)
        grid = (b * h, triton.cdiv(n, block_n), triton.cdiv(p, block_p))
        _nc_dw_kernel[grid](w3, go3, *stats, dw, *_seg_args(w3, h, meta), n, p, **_tiles(meta, cdt, block_n, block_p))
        return dw.view(b, h, n, p), d_temp.to(temp.dtype), None, None, None


class _TSSACausalTriton(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, w: torch.Tensor, temp: torch.Tensor, bias: torch.Tensor, block_n: int, block_p: int, meta: _SegMeta | None
    ):
        # bias: (H, N) already sliced to the sequence length; with segments (H, N_max), read at each token's position
        b, h, n, p = w.shape
        cdt = compute_dtype(w.dtype)
        w3 = w.contiguous().view(b * h, n, p)
        npb = triton.cdiv(p, block_p)
        sa = _seg_args(w3, h, meta)
        tiles = _tiles(meta, cdt, block_n, block_p)
        spart = torch.empty(b * h, npb, n, device=w.device, dtype=cdt)
        _c_logits_kernel[(b * h, npb)](w3, spart, *sa[:3], n, p, **tiles)
        # sum_p (w^2 / cumsum(w^2) + b) = sum_p w^2 / cumsum(w^2) + P * b, as in Alg. 2
        bias_tok = bias.to(cdt) if meta is None else bias.to(cdt)[:, meta.pos].transpose(0, 1)  # (H, N) / (B, H, N)
        s = (spart.sum(dim=1).view(b, h, n) + p * bias_tok).contiguous()
        pi = _head_softmax(s, temp, block_n, meta)
        out = torch.empty_like(w3)
        den = torch.empty(b * h, n, device=w.device, dtype=cdt)
        _c_out_kernel[(b * h, npb)](w3, pi, den, out, *sa[:3], n, p, **tiles)
        ctx.save_for_backward(w, temp, s, pi, den)
        ctx.blocks, ctx.meta = (block_n, block_p), meta
        ctx.bias_dtype, ctx.bias_shape = bias.dtype, bias.shape
        return out.view(b, h, n, p)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        w, temp, s, pi, den = ctx.saved_tensors
        block_n, block_p = ctx.blocks
        meta = ctx.meta
        seg = meta is not None
        b, h, n, p = w.shape
        cdt = s.dtype
        acc = tl_acc_dtype(cdt)
        w3 = w.contiguous().view(b * h, n, p)
        go3 = grad_out.contiguous().view(b * h, n, p)
        npb, nc = triton.cdiv(p, block_p), triton.cdiv(n, block_n)
        grid = (b * h, npb)
        sa = _seg_args(w3, h, meta)[:3]
        blocks = _tiles(meta, cdt, block_n, block_p)
        a1 = torch.empty(b * h, npb, n, device=w.device, dtype=cdt)
        a2 = torch.empty_like(a1)
        a3 = torch.empty_like(a1)
        cS = torch.empty(b * h, nc, p, device=w.device, dtype=cdt)
        cN = torch.empty_like(cS)
        _c_bwd_fwd_sweep_kernel[grid](w3, go3, pi, den, a1, a2, cS, cN, *sa, n, p, nc, **blocks)
        _c_bwd_rev_sweep_kernel[grid](w3, go3, pi, den, cS, cN, den, a3, w3, *sa, n, p, nc, FINAL=False, **blocks)
        # d_dots enters dots = cumsum(w^2 pi) / cumsum(pi) through the denominator as well
        den_pos = den > 0
        d_den = torch.where(
            den_pos, -a2.sum(1) / torch.where(den_pos, den, torch.ones_like(den)), torch.zeros_like(den)
        )
        if seg:  # suffix sums over each sequence's tokens
            suf = torch.empty_like(d_den)
            _seg_rev_cumsum_kernel[(b * h,)](d_den.contiguous(), suf, *sa, n, ACC=acc, BLOCK_N=block_n)
        else:
            suf = reverse_chunked_cumsum(d_den.unsqueeze(-1)).squeeze(-1)
        d_pi = a1.sum(1) + a3.sum(1) + suf
        d_pi = d_pi.view(b, h, n)
        d_a = pi * (d_pi - (pi * d_pi).sum(dim=1, keepdim=True))  # softmax over heads (0 at padding)
        d_temp = (d_a * s).sum(dim=(0, 2))
        d_s = d_a * temp.to(cdt)[:, None]
        if seg:
            # s = ... + P * bias[h, pos]: the bias gradient gathers each token's d_s at its position
            d_bias = d_s.new_zeros(ctx.bias_shape).index_add_(
                1, meta.pos.reshape(-1), d_s.transpose(0, 1).reshape(h, -1)
            )
            d_bias = d_bias * p
        else:
            d_bias = d_s.sum(dim=0) * p
        dw = torch.empty_like(w3)
        _c_bwd_rev_sweep_kernel[grid](
            w3, go3, pi, den, cS, cN, d_s.contiguous(), a3, dw, *sa, n, p, nc, FINAL=True, **blocks
        )
        return dw.view(b, h, n, p), d_temp.to(temp.dtype), d_bias.to(ctx.bias_dtype), None, None, None


def tssa_triton(
    w: torch.Tensor,
    temp: torch.Tensor,
    *,
    causal: bool = False,
    bias: torch.Tensor | None = None,
    block_n: int | None = None,
    block_p: int | None = None,
    seg: Segments | None = None,
) -> torch.Tensor:
    """TSSA via Triton kernels ``(B, H, N, P) -> (B, H, N, P)``: Alg. 1 (eq. 11) or Alg. 2 (eq. 28).

    ``temp``: ``(H,)``; ``bias``: ``(H, N_max, 1)`` or ``None`` (causal only). Differentiable in ``w``,
    ``temp`` and ``bias`` (first order). ``block_n`` / ``block_p``: token / feature tile sizes (powers of
    two; default 64 / min(64, P) on GPU). ``seg``: padded batch or packed row (:class:`Segments`): each
    sequence's statistics over its real tokens, causal sums restarted at its first token, the bias read at the
    position within it, zeros at padding -- in the same kernels, from per-token sequence ids. Inputs are validated by
    :func:`attnzoo.ops.tssa.tssa`; this only checks that the tensors can be launched (CUDA, or CPU under
    ``TRITON_INTERPRET=1``).
    """
    check_launchable("tssa", w, temp, *(() if bias is None else (bias,)))
    for name, val in (("block_n", block_n), ("block_p", block_p)):
        if val is not None and (not isinstance(val, int) or val < 1 or val & (val - 1)):
            raise ValueError(f"{name} must be a positive power of two, got {val!r}")
    b, h, n, p = w.shape
    bn, bp = _blocks(p, block_n, block_p)
    meta = None if seg is None else _seg_meta(seg)
    if not causal:
        return _TSSANonCausalTriton.apply(w, temp, bn, bp, meta)
    if meta is not None:
        n_max = max(1, int(seg.lengths.max()))
        if bias is None:
            bias_hn = torch.zeros(h, n_max, device=w.device, dtype=compute_dtype(w.dtype))
        else:
            bias_hn = bias[:, :, 0]
    elif bias is None:
        bias_hn = torch.zeros(h, n, device=w.device, dtype=compute_dtype(w.dtype))
    else:
        bias_hn = bias[:, :n, 0]
    return _TSSACausalTriton.apply(w, temp, bias_hn, bn, bp, meta)
