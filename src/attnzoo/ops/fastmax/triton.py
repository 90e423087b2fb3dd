"""Triton kernels for factorised Fastmax (FAST eqs 24-29 unmasked, 32-35 masked) with the §2.5 backward.

Public entry point :func:`fastmax_triton`, called by ``fastmax(..., backend="triton")`` (and by ``"auto"``
on CUDA) on already standardised inputs ``qs = scale * q_hat``, ``k_hat`` ``(B, H, N, D)`` and ``v (B, H,
N, Dv)``. The math is that of ``chunk.py``: with ``va = [v, 1]`` (the last column carries the
denominator of eq 29/35) the moment state is ``S = sum_n phi(k_n) va_n^T``, stored as three pieces

    s0 = sum_n va_n  (E,)        s1 = sum_n k_n va_n^T  (D, E)        s2[d] = sum_n k_nd k_n va_n^T  (D, E)

(``E = Dv + 1``; ``s2`` only for p = 2) and a query reads ``phi(q) . S = s0 + q s1 + 1/2 sum_d q_d (q s2[d])``.
Tiles are padded to powers of two >= 16 (``tl.dot``'s minimum); padding is masked to zero so it never
contributes. Every sum accumulates in float32 (float64 for float64 inputs).

Backward (FAST §2.5, as in ``chunk.py``): only ``qs, k_hat, v``, the output and the denominators
(O(N D) per head) are saved. With ``ga = [dO / G, -(dO / G) . O]`` and ``T = sum_i phi(qs_i) ga_i^T`` (the
same state with queries and keys swapped): ``dqs_i = d/dq [phi(q) . (S ga_i)]``, ``dk_n = d/dk [phi(k) .
(T va_n)]``, ``dv_n = phi(k_n) . T[:, :Dv]``; ``S`` and ``T`` are recomputed, never stored per token.

Kernels and their memory traffic (per head; ``|X|`` = N x D elements):

* unmasked state: grid ``(B*H, splits, 1 + D [p=2])``; each program streams its token range of ``k, v``
  (``1 + D`` re-reads for p = 2, mostly from L2) and writes one ``(D, E)`` slice; splits over tokens are
  summed by PyTorch (``splits x`` the state size of extra memory, chosen to fill the GPU).
* unmasked apply / vjp: grid ``(B*H, N / BLOCK_N)``; reads ``q`` (or ``k``) and its ``va``/``ga`` rows once
  and the state once per token block, writes ``out`` (+ ``G``) or the gradient once.
* masked (causal): one program per ``(b, h)`` sweeps the token blocks carrying the prefix state (``s0, s1``
  in registers, ``s2`` in a float32 scratch of ``D * D * E`` per head, read twice and written once per
  block); inside a block the explicit ``BLOCK_N x BLOCK_N`` masked weights are used (eqs 30-31). The
  backward runs a forward sweep for ``dqs`` and a reverse (suffix-state) sweep for ``dk, dv``. Peak extra
  memory is O(N D + D^p E) per head, never the O(N D^p E) per-token prefix of eqs 34-35. A causal sweep
  is token-sequential per head, so few heads with very long sequences use few SMs (correctness first).
* padded batches and packed rows (``seg``): the same sweeps read each token's sequence id (``(B, N)`` int32,
  ``-1`` at padding; ids never decrease over a row's real tokens). The carried state belongs to one sequence
  (the last one it saw) and is dropped when the next block's tokens start another; a query reads it only if it is
  of that sequence, and inside a block the weights are masked to equal ids. Causal calls sweep once (the key
  gradients backwards); non-causal packed rows sweep both ways, the first pass storing the carried-state sums in
  the outputs and the second adding the suffix state and the in-block terms. A non-causal padded batch (one
  sequence per row) runs the unmasked kernels, which then skip padding tokens and write zeros there. No copy of
  the inputs, no loop over sequences.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from attnzoo.ops._triton_utils import check_launchable, interpreting, pow2, tl_acc_dtype
from attnzoo.ops._varlen import Segments

__all__ = ["fastmax_triton", "pipeline_stages"]


# ---------------------------------------------------------------------------------------------------
# jit helpers
# ---------------------------------------------------------------------------------------------------
@triton.jit
def _tile(ptr, bh, offs_n, N, C, BC: tl.constexpr):
    """Pointers to the rows ``offs_n`` of a contiguous ``(BH, N, C)`` tensor as a ``(BLOCK_N, BC)`` tile, and the
    mask of the entries inside it."""
    offs_c = tl.arange(0, BC)
    return ptr + bh * N * C + offs_n[:, None] * C + offs_c[None, :], (offs_n[:, None] < N) & (offs_c[None, :] < C)


@triton.jit
def _store_tile(x, ptr, bh, offs_n, N, C, BC: tl.constexpr, ADD_PREV: tl.constexpr):
    """Store the tile ``x`` ``(BLOCK_N, BC)`` into rows ``offs_n`` of ``(BH, N, C)``; ADD_PREV adds what is there."""
    ptrs, m = _tile(ptr, bh, offs_n, N, C, BC)
    if ADD_PREV:
        x += tl.load(ptrs, mask=m, other=0.0)
    tl.store(ptrs, x, mask=m)


@triton.jit
def _load_rows_m(ptr, bh, offs_n, N, rmask, C, BC: tl.constexpr, ACC: tl.constexpr):
    """Rows ``rmask`` of a contiguous ``(BH, N, C)`` tensor as a zero-padded ``(BLOCK_N, BC)`` tile."""
    ptrs, m = _tile(ptr, bh, offs_n, N, C, BC)
    return tl.load(ptrs, mask=rmask[:, None] & m, other=0.0).to(ACC)


@triton.jit
def _load_rows(ptr, bh, offs_n, N, LIM, C, BC: tl.constexpr, ACC: tl.constexpr):
    """Rows ``offs_n < LIM`` of a contiguous ``(BH, N, C)`` tensor as a zero-padded ``(BLOCK_N, BC)`` tile."""
    return _load_rows_m(ptr, bh, offs_n, N, offs_n < LIM, C, BC, ACC)


@triton.jit
def _load_vals_m(ptr, bh, offs_n, N, rmask, C, APPEND_ONE: tl.constexpr, BE: tl.constexpr, ACC: tl.constexpr):
    """Value rows ``rmask`` (zero elsewhere); with APPEND_ONE the column ``C`` is 1 there (``va = [v, 1]``)."""
    y = _load_rows_m(ptr, bh, offs_n, N, rmask, C, BE, ACC)
    if APPEND_ONE:
        offs_e = tl.arange(0, BE)
        y = tl.where((offs_e[None, :] == C) & rmask[:, None] & (offs_n[:, None] < N), 1.0, y)
    return y


@triton.jit
def _load_vals(ptr, bh, offs_n, N, LIM, C, APPEND_ONE: tl.constexpr, BE: tl.constexpr, ACC: tl.constexpr):
    """Value rows (``offs_n < LIM``); with APPEND_ONE the column ``C`` is 1 for real tokens (``va = [v, 1]``)."""
    return _load_vals_m(ptr, bh, offs_n, N, offs_n < LIM, C, APPEND_ONE, BE, ACC)


@triton.jit
def _col(x, d, BD: tl.constexpr):
    """Column ``d`` of a ``(BLOCK_N, BD)`` tile."""
    return tl.sum(tl.where(tl.arange(0, BD)[None, :] == d, x, 0.0), axis=1)


@triton.jit
def _s2_tile_ptrs(s2_base, d, BD: tl.constexpr, BE: tl.constexpr):
    offs_r = tl.arange(0, BD)
    offs_e = tl.arange(0, BE)
    return s2_base + d * BD * BE + offs_r[:, None] * BE + offs_e[None, :]


@triton.jit
def _apply_state(x, s0, s1, s2_base, D, P2: tl.constexpr, BD: tl.constexpr, BE: tl.constexpr):
    """``phi(x) . S`` for a tile ``x (BLOCK_N, BD)``: ``s0 + x s1 + 1/2 sum_d x_d (x s2[d])`` (eqs 26-27)."""
    acc = tl.dot(x, s1, input_precision="ieee") + s0[None, :]
    if P2:
        for d in range(0, D):
            s2d = tl.load(_s2_tile_ptrs(s2_base, d, BD, BE))
            acc += (0.5 * _col(x, d, BD))[:, None] * tl.dot(x, s2d, input_precision="ieee")
    return acc


@triton.jit
def _vjp_state(x, y, s1, s2_base, D, P2: tl.constexpr, BD: tl.constexpr, BE: tl.constexpr):
    """``d/dx [phi(x) . (S y)]`` with ``S y`` held fixed: ``y s1^T + sum_d e_d sum_e x_e (s2[d, e] . y)``
    (s2 is symmetric in (d, e), so the two halves of the quadratic term coincide)."""
    acc = tl.dot(y, tl.trans(s1), input_precision="ieee")
    if P2:
        offs_d = tl.arange(0, BD)
        for d in range(0, D):
            s2d = tl.load(_s2_tile_ptrs(s2_base, d, BD, BE))
            t = tl.sum(x * tl.dot(y, tl.trans(s2d), input_precision="ieee"), axis=1)
            acc += tl.where(offs_d[None, :] == d, t[:, None], 0.0)
    return acc


@triton.jit
def _update_s2(x, y, s2_base, D, keep, SEG: tl.constexpr, BD: tl.constexpr, BE: tl.constexpr):
    """``s2[d] += (x_d * x)^T y`` in global scratch, for every d (p = 2 prefix/suffix state); with SEG the old
    state is dropped first unless ``keep`` (the carried state then starts a new sequence)."""
    tl.debug_barrier()  # earlier reads of s2 in this block by other threads must finish first
    for d in range(0, D):
        ptrs = _s2_tile_ptrs(s2_base, d, BD, BE)
        xd = _col(x, d, BD)[:, None] * x
        old = tl.load(ptrs)
        if SEG:
            old = tl.where(keep, old, 0.0)
        tl.store(ptrs, old + tl.dot(tl.trans(xd), y, input_precision="ieee"))
    tl.debug_barrier()  # and the new state must be visible to all threads of the next block


@triton.jit
def _kernel(sc, P2: tl.constexpr):
    """Eq 8: ``f(s) = 1 + s (+ s^2 / 2)``."""
    if P2:
        return 1.0 + sc + 0.5 * sc * sc
    return 1.0 + sc


@triton.jit
def _kernel_grad(sc, P2: tl.constexpr):
    if P2:
        return 1.0 + sc
    return tl.full(sc.shape, 1.0, sc.dtype)


@triton.jit
def _store_out(acc, out_ptr, den_ptr, bh, offs_n, N, OUT_COLS, NORMALIZE: tl.constexpr, BE: tl.constexpr):
    """Store ``acc[:, :OUT_COLS]`` (divided by its column ``OUT_COLS``, the denominator, if NORMALIZE)."""
    if NORMALIZE:
        den = _col(acc, OUT_COLS, BE)
        acc = acc / den[:, None]
        tl.store(den_ptr + bh * N + offs_n, den, mask=offs_n < N)
    _store_tile(acc, out_ptr, bh, offs_n, N, OUT_COLS, BE, False)


# ---------------------------------------------------------------------------------------------------
# unmasked kernels
# ---------------------------------------------------------------------------------------------------
@triton.jit
def _state_kernel(
    x_ptr,
    y_ptr,
    s0_ptr,
    s1_ptr,
    s2_ptr,
    ids_ptr,
    H,
    N,
    D,
    C,
    TOK_PER_SPLIT,
    APPEND_ONE: tl.constexpr,
    SEG: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BD: tl.constexpr,
    BE: tl.constexpr,
):
    """Partial state over one token range: program r = 0 writes ``s0, s1``, r = 1 + d writes ``s2[d]``; with SEG
    (one sequence per row: a padded batch) over the real tokens only."""
    bh = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    r = tl.program_id(2)
    nsplit = tl.num_programs(1)
    slot = bh * nsplit + split
    start_tok = split * TOK_PER_SPLIT
    end_tok = tl.minimum(start_tok + TOK_PER_SPLIT, N)
    offs_r = tl.arange(0, BD)
    offs_e = tl.arange(0, BE)
    acc = tl.zeros((BD, BE), ACC)
    acc0 = tl.zeros((BE,), ACC)
    for start in range(start_tok, end_tok, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        rmask = offs_n < end_tok
        if SEG:
            rmask = rmask & (_block_ids(ids_ptr, bh, H, N, offs_n, SEG) >= 0)
        x = _load_rows_m(x_ptr, bh, offs_n, N, rmask, D, BD, ACC)
        y = _load_vals_m(y_ptr, bh, offs_n, N, rmask, C, APPEND_ONE, BE, ACC)
        if r == 0:
            acc0 += tl.sum(y, axis=0)
        else:
            x = _col(x, r - 1, BD)[:, None] * x
        acc += tl.dot(tl.trans(x), y, input_precision="ieee")
    tile = offs_r[:, None] * BE + offs_e[None, :]
    if r == 0:
        tl.store(s0_ptr + slot * BE + offs_e, acc0)
        tl.store(s1_ptr + slot * BD * BE + tile, acc)
    else:
        tl.store(s2_ptr + (slot * D + (r - 1)) * BD * BE + tile, acc)


@triton.jit
def _apply_kernel(
    x_ptr,
    s0_ptr,
    s1_ptr,
    s2_ptr,
    out_ptr,
    den_ptr,
    ids_ptr,
    H,
    N,
    D,
    OUT_COLS,
    P2: tl.constexpr,
    NORMALIZE: tl.constexpr,
    SEG: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BD: tl.constexpr,
    BE: tl.constexpr,
):
    """``phi(x_n) . S`` for one token block (forward output with its denominator, or ``dv`` from ``T``); with SEG
    padding gets 0 (and a denominator of 1)."""
    bh = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, BD)
    offs_e = tl.arange(0, BE)
    x = _load_rows(x_ptr, bh, offs_n, N, N, D, BD, ACC)
    s0 = tl.load(s0_ptr + bh * BE + offs_e)
    s1 = tl.load(s1_ptr + bh * BD * BE + offs_r[:, None] * BE + offs_e[None, :])
    acc = _apply_state(x, s0, s1, s2_ptr + bh * D * BD * BE, D, P2, BD, BE)
    if SEG:
        real = _block_ids(ids_ptr, bh, H, N, offs_n, SEG) >= 0
        acc = tl.where(real[:, None], acc, tl.where(offs_e[None, :] == OUT_COLS, 1.0, 0.0))
    _store_out(acc, out_ptr, den_ptr, bh, offs_n, N, OUT_COLS, NORMALIZE, BE)


@triton.jit
def _vjp_kernel(
    x_ptr,
    y_ptr,
    s1_ptr,
    s2_ptr,
    dx_ptr,
    ids_ptr,
    H,
    N,
    D,
    C,
    APPEND_ONE: tl.constexpr,
    P2: tl.constexpr,
    SEG: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BD: tl.constexpr,
    BE: tl.constexpr,
):
    """``d/dx_n [phi(x_n) . (S y_n)]`` for one token block (``dqs`` from ``S, ga`` or ``dk`` from ``T, va``); with
    SEG padding gets 0."""
    bh = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, BD)
    offs_e = tl.arange(0, BE)
    real = _block_ids(ids_ptr, bh, H, N, offs_n, SEG) >= 0
    x = _load_rows_m(x_ptr, bh, offs_n, N, real, D, BD, ACC)
    y = _load_vals_m(y_ptr, bh, offs_n, N, real, C, APPEND_ONE, BE, ACC)
    s1 = tl.load(s1_ptr + bh * BD * BE + offs_r[:, None] * BE + offs_e[None, :])
    dx = _vjp_state(x, y, s1, s2_ptr + bh * D * BD * BE, D, P2, BD, BE)
    if SEG:
        dx = tl.where(real[:, None], dx, 0.0)
    _store_tile(dx, dx_ptr, bh, offs_n, N, D, BD, False)


# ---------------------------------------------------------------------------------------------------
# sweeps: causal (eqs 30-35), and padded batches / packed rows (per-token sequence ids, states restarted)
# ---------------------------------------------------------------------------------------------------
@triton.jit
def _block_ids(ids_ptr, bh, H, N, offs_n, SEG: tl.constexpr):
    """Sequence id of each token of a block (``-1`` at padding and past N; 0 for every token without SEG)."""
    if SEG:
        ids = tl.load(ids_ptr + (bh // H) * N + offs_n, mask=offs_n < N, other=-1)
    else:
        ids = tl.where(offs_n < N, 0, -1)
    return ids


@triton.jit
def _pair_mask(offs_n, ids, CAUSAL: tl.constexpr, SEG: tl.constexpr):
    """``keep[i, n]``: key ``n`` of the block counts for query ``i`` (same sequence, real, ``n <= i`` if CAUSAL)."""
    if SEG:
        keep = (ids[:, None] == ids[None, :]) & (ids[None, :] >= 0)
        if CAUSAL:
            keep = keep & (offs_n[:, None] >= offs_n[None, :])
    else:
        keep = offs_n[:, None] >= offs_n[None, :]
    return keep


@triton.jit
def _next_carry(ids, carry, REVERSE: tl.constexpr):
    """The sequence the carried state holds after a block: its last real token's (first when REVERSE); a block of
    padding only leaves it unchanged. Ids never decrease over the real tokens of a row."""
    if REVERSE:
        e = tl.min(tl.where(ids >= 0, ids, 2147483647), axis=0)
        e = tl.where(e == 2147483647, carry, e)
    else:
        e = tl.max(ids, axis=0)
        e = tl.where(e < 0, carry, e)
    return e


@triton.jit
def _block_index(i, n_blocks, REVERSE: tl.constexpr):
    if REVERSE:
        return n_blocks - 1 - i
    return i


@triton.jit
def _sweep_tiles(
    q_ptr, k_ptr, v_ptr, ids_ptr, bh, i, H, N, D, DV, REVERSE: tl.constexpr, SEG: tl.constexpr, ACC: tl.constexpr,
    BLOCK_N: tl.constexpr, BD: tl.constexpr, BE: tl.constexpr,
):  # fmt: skip
    """Block ``i`` of a sweep (counted from the end when REVERSE): its token offsets, sequence ids, real-token mask
    and the tiles ``q``, ``k``, ``va = [v, 1]`` (zero at padding)."""
    offs_n = _block_index(i, tl.cdiv(N, BLOCK_N), REVERSE) * BLOCK_N + tl.arange(0, BLOCK_N)
    ids = _block_ids(ids_ptr, bh, H, N, offs_n, SEG)
    real = ids >= 0
    q = _load_rows_m(q_ptr, bh, offs_n, N, real, D, BD, ACC)
    k = _load_rows_m(k_ptr, bh, offs_n, N, real, D, BD, ACC)
    va = _load_vals_m(v_ptr, bh, offs_n, N, real, DV, True, BE, ACC)
    return offs_n, ids, real, q, k, va


@triton.jit
def _carry_state(
    x, y, ids, carry, s0, s1, s2_base, D, P2: tl.constexpr, SEG: tl.constexpr, REVERSE: tl.constexpr,
    BD: tl.constexpr, BE: tl.constexpr,
):  # fmt: skip
    """Fold a block into the carried state ``S = sum_n phi(x_n) y_n^T`` (``s0, s1`` returned, ``s2`` in its scratch;
    eqs 34-35). With SEG the state holds one sequence, the last the block reaches (``_next_carry``): it is dropped
    first when that sequence is new, and only that sequence's tokens enter. Returns ``(s0, s1, carry)``."""
    keep = True
    if SEG:
        edge = _next_carry(ids, carry, REVERSE)
        keep = edge == carry
        y = tl.where((ids == edge)[:, None], y, 0.0)
        s0 = tl.where(keep, s0, 0.0)
        s1 = tl.where(keep, s1, 0.0)
        carry = edge
    s0 += tl.sum(y, axis=0)
    s1 += tl.dot(tl.trans(x), y, input_precision="ieee")
    if P2:
        _update_s2(x, y, s2_base, D, keep, SEG, BD, BE)
    return s0, s1, carry


@triton.jit
def _sweep_fwd_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    ids_ptr,
    s2_ptr,
    out_ptr,
    den_ptr,
    H,
    N,
    D,
    DV,
    P2: tl.constexpr,
    SEG: tl.constexpr,
    CAUSAL: tl.constexpr,
    REVERSE: tl.constexpr,
    INTRA: tl.constexpr,
    ADD_PREV: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BD: tl.constexpr,
    BE: tl.constexpr,
):
    """Eqs 30-35 by blocks: the state carried from earlier blocks (later ones when REVERSE) of the query's own
    sequence, plus (INTRA) the explicit masked weights inside the block, then normalised. Without INTRA the raw
    numerators and denominators are stored for a second, INTRA + ADD_PREV pass the other way (non-causal SEG)."""
    bh = tl.program_id(0).to(tl.int64)
    s2_base = s2_ptr + bh * D * BD * BE
    s0 = tl.zeros((BE,), ACC)
    s1 = tl.zeros((BD, BE), ACC)
    carry = tl.max(tl.full((BLOCK_N,), -1, tl.int32), axis=0)
    offs_e = tl.arange(0, BE)
    for i in range(0, tl.cdiv(N, BLOCK_N)):
        offs_n, ids, real, q, k, va = _sweep_tiles(
            q_ptr, k_ptr, v_ptr, ids_ptr, bh, i, H, N, D, DV, REVERSE, SEG, ACC, BLOCK_N, BD, BE
        )
        nmask = offs_n < N
        acc = _apply_state(q, s0, s1, s2_base, D, P2, BD, BE)
        if SEG:
            acc = tl.where(((ids == carry) & real)[:, None], acc, 0.0)
        if INTRA:
            w = tl.where(
                _pair_mask(offs_n, ids, CAUSAL, SEG), _kernel(tl.dot(q, tl.trans(k), input_precision="ieee"), P2), 0.0
            )
            acc += tl.dot(w, va, input_precision="ieee")
        if ADD_PREV:
            ptrs, pm = _tile(out_ptr, bh, offs_n, N, DV, BE)
            acc += tl.load(ptrs, mask=pm, other=0.0)
            prev_den = tl.load(den_ptr + bh * N + offs_n, mask=nmask, other=0.0)
            acc += tl.where(offs_e[None, :] == DV, prev_den[:, None], 0.0)
        den = _col(acc, DV, BE)
        res = acc
        if INTRA:
            # padding queries: no keys, zero output and a denominator of 1 (not 0/0)
            den = tl.where(real, den, 1.0)
            res = tl.where(real[:, None], acc / den[:, None], 0.0)
        tl.store(den_ptr + bh * N + offs_n, den, mask=nmask)
        _store_tile(res, out_ptr, bh, offs_n, N, DV, BE, False)
        s0, s1, carry = _carry_state(k, va, ids, carry, s0, s1, s2_base, D, P2, SEG, REVERSE, BD, BE)


@triton.jit
def _sweep_dq_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    ga_ptr,
    ids_ptr,
    s2_ptr,
    dq_ptr,
    H,
    N,
    D,
    DV,
    P2: tl.constexpr,
    SEG: tl.constexpr,
    CAUSAL: tl.constexpr,
    REVERSE: tl.constexpr,
    INTRA: tl.constexpr,
    ADD_PREV: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BD: tl.constexpr,
    BE: tl.constexpr,
):
    """``dqs`` from the carried key state ``S`` of the query's sequence plus (INTRA) the in-block masked terms;
    ADD_PREV adds what an earlier pass the other way stored in ``dq``."""
    bh = tl.program_id(0).to(tl.int64)
    s2_base = s2_ptr + bh * D * BD * BE
    s0 = tl.zeros((BE,), ACC)  # carried along with s1; the gradient reads s1 and s2 only
    s1 = tl.zeros((BD, BE), ACC)
    carry = tl.max(tl.full((BLOCK_N,), -1, tl.int32), axis=0)
    for i in range(0, tl.cdiv(N, BLOCK_N)):
        offs_n, ids, real, q, k, va = _sweep_tiles(
            q_ptr, k_ptr, v_ptr, ids_ptr, bh, i, H, N, D, DV, REVERSE, SEG, ACC, BLOCK_N, BD, BE
        )
        ga = _load_vals_m(ga_ptr, bh, offs_n, N, real, DV + 1, False, BE, ACC)
        dq = _vjp_state(q, ga, s1, s2_base, D, P2, BD, BE)
        if SEG:
            dq = tl.where(((ids == carry) & real)[:, None], dq, 0.0)
        if INTRA:
            fprime = _kernel_grad(tl.dot(q, tl.trans(k), input_precision="ieee"), P2)
            ds = tl.where(
                _pair_mask(offs_n, ids, CAUSAL, SEG), fprime * tl.dot(ga, tl.trans(va), input_precision="ieee"), 0.0
            )
            dq += tl.dot(ds, k, input_precision="ieee")
        _store_tile(dq, dq_ptr, bh, offs_n, N, D, BD, ADD_PREV)
        s0, s1, carry = _carry_state(k, va, ids, carry, s0, s1, s2_base, D, P2, SEG, REVERSE, BD, BE)


@triton.jit
def _sweep_dkv_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    ga_ptr,
    ids_ptr,
    t2_ptr,
    dk_ptr,
    dv_ptr,
    H,
    N,
    D,
    DV,
    P2: tl.constexpr,
    SEG: tl.constexpr,
    CAUSAL: tl.constexpr,
    REVERSE: tl.constexpr,
    INTRA: tl.constexpr,
    ADD_PREV: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BD: tl.constexpr,
    BE: tl.constexpr,
):
    """``dk, dv`` from the carried query state ``T = sum_i phi(q_i) ga_i^T`` of the key's sequence (the suffix
    state when REVERSE) plus (INTRA) the in-block masked terms; ADD_PREV as in :func:`_sweep_dq_kernel`."""
    bh = tl.program_id(0).to(tl.int64)
    t2_base = t2_ptr + bh * D * BD * BE
    t0 = tl.zeros((BE,), ACC)
    t1 = tl.zeros((BD, BE), ACC)
    carry = tl.max(tl.full((BLOCK_N,), -1, tl.int32), axis=0)
    for i in range(0, tl.cdiv(N, BLOCK_N)):
        offs_n, ids, real, q, k, va = _sweep_tiles(
            q_ptr, k_ptr, v_ptr, ids_ptr, bh, i, H, N, D, DV, REVERSE, SEG, ACC, BLOCK_N, BD, BE
        )
        ga = _load_vals_m(ga_ptr, bh, offs_n, N, real, DV + 1, False, BE, ACC)
        dk = _vjp_state(k, va, t1, t2_base, D, P2, BD, BE)
        dva = _apply_state(k, t0, t1, t2_base, D, P2, BD, BE)
        if SEG:
            reads = ((ids == carry) & real)[:, None]
            dk = tl.where(reads, dk, 0.0)
            dva = tl.where(reads, dva, 0.0)
        if INTRA:
            keep = _pair_mask(offs_n, ids, CAUSAL, SEG)
            sc = tl.dot(q, tl.trans(k), input_precision="ieee")
            ds = tl.where(keep, _kernel_grad(sc, P2) * tl.dot(ga, tl.trans(va), input_precision="ieee"), 0.0)
            w = tl.where(keep, _kernel(sc, P2), 0.0)
            dk += tl.dot(tl.trans(ds), q, input_precision="ieee")
            dva += tl.dot(tl.trans(w), ga, input_precision="ieee")
        _store_tile(dk, dk_ptr, bh, offs_n, N, D, BD, ADD_PREV)
        _store_tile(dva, dv_ptr, bh, offs_n, N, DV, BE, ADD_PREV)
        t0, t1, carry = _carry_state(q, ga, ids, carry, t0, t1, t2_base, D, P2, SEG, REVERSE, BD, BE)


# ---------------------------------------------------------------------------------------------------
# host side
# ---------------------------------------------------------------------------------------------------
#: bytes of shared memory the software-pipelined loads of one kernel may buffer (an H100/H200 block has 227 KiB)
_SMEM_BUDGET = 160 * 1024


def _stages(tile_elems: int, elem_size: int) -> int:
    """Pipelining depth (Triton's ``num_stages``, default 3) whose buffered tiles fit :data:`_SMEM_BUDGET`.

    Three stages of the state kernel's ``k, va`` tiles at D = Dv = 128 need 288 KiB and fail to launch on an
    H200 (out of shared memory); fewer stages run the same arithmetic.
    """
    return max(1, min(3, _SMEM_BUDGET // (tile_elems * elem_size)))


class _Cfg:
    def __init__(self, n: int, d: int, dv: int, p: int, block_n: int, num_splits: int | None, dtype, device):
        self.n, self.d, self.dv, self.p2 = n, d, dv, p == 2
        self.heads, self.bh = 1, 0  # set per call (the kernels read a row's sequence ids at bh // heads)
        self.bn, self.bd, self.be = block_n, pow2(d), pow2(dv + 1)
        esize = torch.empty((), dtype=dtype).element_size()
        # per loop iteration: the state sweep loads a token tile of k and va; the p = 2 reads of s2 a (D, E) tile
        self.stages = _stages(max(self.bn * (self.bd + self.be), self.bd * self.be if p == 2 else 0), esize)
        # The causal sweeps (state + four operand tiles + a BLOCK_N^2 weight tile) and the p = 2 vjp keep
        # their tiles in registers with blocks of 32 tokens and 8 warps: at D = 64, Dv + 1 <= 128 ptxas
        # reports ~100-200 spill stores instead of ~10^4 with 64 tokens and 4 warps (checked by compiling
        # for sm_90; no GPU run).
        self.bn_small = min(block_n, 32)
        self.warps = 8
        # the causal sweeps load q, k, va and ga token tiles per block, and (p = 2) (D, E) tiles of the scratch
        self.causal_stages = _stages(max(self.bn_small * 2 * (self.bd + self.be), self.bd * self.be), esize)
        self.d2 = d if p == 2 else 1  # s2 buffers keep one dummy slice for p = 1
        self.acc = tl_acc_dtype(dtype)
        self.dtype, self.device = dtype, device
        self.num_splits = num_splits

    def causal_meta(self) -> dict:
        return dict(
            P2=self.p2,
            ACC=self.acc,
            BLOCK_N=self.bn_small,
            BD=self.bd,
            BE=self.be,
            num_warps=self.warps,
            num_stages=self.causal_stages,
        )

    def zeros(self, *shape):
        return torch.zeros(*shape, device=self.device, dtype=self.dtype)


def pipeline_stages(d: int, dv: int, p: int, chunk_size: int | None, dtype: torch.dtype, causal: bool) -> int:
    """The pipeline depth the kernels run with at head dims ``d``, ``dv`` (what ``"auto"`` asks: one stage is slow)."""
    block_n = min(pow2(64 if chunk_size is None else chunk_size), 128)
    cfg = _Cfg(0, d, dv, p, block_n, None, dtype, None)
    return cfg.causal_stages if causal else cfg.stages


def _state(x3: torch.Tensor, y3: torch.Tensor, append_one: bool, cfg: _Cfg, ids: torch.Tensor | None = None):
    """Unmasked ``S = sum_n phi(x_n) y_n^T`` as padded ``(s0 (BH, BE), s1 (BH, BD, BE), s2 (BH, D2, BD, BE))``."""
    bh, n, _ = x3.shape
    n_blocks = triton.cdiv(n, cfg.bn)
    rows = 1 + (cfg.d if cfg.p2 else 0)
    splits = cfg.num_splits
    if splits is None:
        # enough programs to fill a large GPU; 1 under the interpreter (CPU runs programs one by one)
        splits = 1 if interpreting() else max(1, min(n_blocks, triton.cdiv(512, bh * rows)))
    splits = min(splits, n_blocks)
    tok = triton.cdiv(n_blocks, splits) * cfg.bn
    splits = triton.cdiv(n, tok)
    s0 = torch.empty(bh, splits, cfg.be, device=x3.device, dtype=cfg.dtype)
    s1 = torch.empty(bh, splits, cfg.bd, cfg.be, device=x3.device, dtype=cfg.dtype)
    s2 = torch.empty(bh, splits, cfg.d2, cfg.bd, cfg.be, device=x3.device, dtype=cfg.dtype)
    _state_kernel[(bh, splits, rows)](
        x3,
        y3,
        s0,
        s1,
        s2,
        x3 if ids is None else ids,
        cfg.heads,
        n,
        cfg.d,
        y3.shape[-1],
        tok,
        APPEND_ONE=append_one,
        SEG=ids is not None,
        ACC=cfg.acc,
        BLOCK_N=cfg.bn,
        BD=cfg.bd,
        BE=cfg.be,
        num_warps=cfg.warps,
        num_stages=cfg.stages,
    )
    if not cfg.p2:
        s2 = s2[:, :1]  # never read; keeps shapes uniform
    if splits == 1:
        return s0[:, 0], s1[:, 0], s2[:, 0]
    return s0.sum(1), s1.sum(1), s2.sum(1)


def _apply(x3, s0, s1, s2, out_cols: int, normalize: bool, cfg: _Cfg, ids: torch.Tensor | None = None):
    bh, n, _ = x3.shape
    out = torch.empty(bh, n, out_cols, device=x3.device, dtype=cfg.dtype)
    den = torch.empty(bh, n, device=x3.device, dtype=cfg.dtype) if normalize else out
    _apply_kernel[(bh, triton.cdiv(n, cfg.bn))](
        x3,
        s0.contiguous(),
        s1.contiguous(),
        s2.contiguous(),
        out,
        den,
        x3 if ids is None else ids,
        cfg.heads,
        n,
        cfg.d,
        out_cols,
        P2=cfg.p2,
        NORMALIZE=normalize,
        SEG=ids is not None,
        ACC=cfg.acc,
        BLOCK_N=cfg.bn,
        BD=cfg.bd,
        BE=cfg.be,
        num_warps=cfg.warps,
        num_stages=cfg.stages,
    )
    return out, den


def _vjp(x3, y3, append_one: bool, s1, s2, cfg: _Cfg, ids: torch.Tensor | None = None):
    bh, n, d = x3.shape
    dx = torch.empty(bh, n, d, device=x3.device, dtype=cfg.dtype)
    _vjp_kernel[(bh, triton.cdiv(n, cfg.bn_small))](
        x3,
        y3,
        s1.contiguous(),
        s2.contiguous(),
        dx,
        x3 if ids is None else ids,
        cfg.heads,
        n,
        d,
        y3.shape[-1],
        APPEND_ONE=append_one,
        P2=cfg.p2,
        SEG=ids is not None,
        ACC=cfg.acc,
        BLOCK_N=cfg.bn_small,
        BD=cfg.bd,
        BE=cfg.be,
        num_warps=cfg.warps,
        num_stages=cfg.stages,
    )
    return dx


def _sweeps(kernel, args: tuple, causal: bool, seg: bool, reverse: bool, scratch: torch.Tensor, cfg: _Cfg) -> None:
    """One sweep kernel over every ``(b, h)``: causal in its direction (``reverse`` for the key gradients); a
    non-causal SEG call runs the other direction first (carried states only) and then this one (plus the in-block
    terms and the first pass's partial sums)."""
    meta = dict(cfg.causal_meta(), SEG=seg, CAUSAL=causal)
    grid = (cfg.bh,)
    if not causal:
        kernel[grid](*args, REVERSE=not reverse, INTRA=False, ADD_PREV=False, **meta)
        scratch.zero_()
    kernel[grid](*args, REVERSE=reverse, INTRA=True, ADD_PREV=not causal, **meta)


def _forward(q3, k3, v3, causal: bool, cfg: _Cfg, ids: torch.Tensor | None, single: bool):
    bh, n, _ = q3.shape
    if not causal and (ids is None or single):
        # unmasked, or one sequence per row: every query reads its row's total moments (over its real keys)
        s0, s1, s2 = _state(k3, v3, True, cfg, ids)
        return _apply(q3, s0, s1, s2, cfg.dv, True, cfg, ids)
    out = torch.empty(bh, n, cfg.dv, device=q3.device, dtype=cfg.dtype)
    den = torch.empty(bh, n, device=q3.device, dtype=cfg.dtype)
    scratch = cfg.zeros(bh, cfg.d2, cfg.bd, cfg.be)
    seg_ids = q3 if ids is None else ids
    args = (q3, k3, v3, seg_ids, scratch, out, den, cfg.heads, n, cfg.d, cfg.dv)
    _sweeps(_sweep_fwd_kernel, args, causal, ids is not None, False, scratch, cfg)
    return out, den


class FastmaxTritonFunction(torch.autograd.Function):
    """Triton Fastmax on standardised inputs; saves ``qs, k_hat, v, out, G`` only (FAST §2.5)."""

    @staticmethod
    def forward(ctx, qs, k, v, p: int, causal: bool, block_n: int, num_splits, ids, single: bool):
        b, h, n, d = qs.shape
        dv = v.shape[-1]
        cfg = _Cfg(n, d, dv, p, block_n, num_splits, qs.dtype, qs.device)
        cfg.heads, cfg.bh = h, b * h
        q3, k3, v3 = (t.contiguous().view(b * h, n, -1) for t in (qs, k, v))
        out, den = _forward(q3, k3, v3, causal, cfg, ids, single)
        ctx.save_for_backward(q3, k3, v3, out, den, *(() if ids is None else (ids,)))
        ctx.cfg, ctx.causal, ctx.shape, ctx.single = cfg, causal, (b, h), single
        return out.view(b, h, n, dv)

    @staticmethod
    def backward(ctx, dout):
        q3, k3, v3, out, den, *maybe_ids = ctx.saved_tensors
        ids = maybe_ids[0] if maybe_ids else None
        cfg, (b, h) = ctx.cfg, ctx.shape
        bh, n, d = q3.shape
        g = dout.reshape(bh, n, cfg.dv).to(cfg.dtype) / den.unsqueeze(-1)
        if ids is not None:  # padding queries enter no sum (and their output gradient may be anything)
            g = torch.where((ids >= 0).unsqueeze(1).expand(b, h, n).reshape(bh, n, 1), g, 0.0)
        # ga = [g, -g.o]: the weight gradient g_i . v_n - g_i . o_i as one inner product with va = [v, 1]
        ga = torch.cat([g, -(g * out).sum(dim=-1, keepdim=True)], dim=-1).contiguous()
        if not ctx.causal and (ids is None or ctx.single):
            s0, s1, s2 = _state(k3, v3, True, cfg, ids)
            dq = _vjp(q3, ga, False, s1, s2, cfg, ids)
            del s0, s1, s2
            t0, t1, t2 = _state(q3, ga, False, cfg, ids)
            dk = _vjp(k3, v3, True, t1, t2, cfg, ids)
            dv, _ = _apply(k3, t0, t1, t2, cfg.dv, False, cfg, ids)
        else:
            dq = torch.empty_like(q3)
            dk = torch.empty_like(k3)
            dv = torch.empty_like(v3)
            seg_ids = q3 if ids is None else ids
            scratch = cfg.zeros(bh, cfg.d2, cfg.bd, cfg.be)
            args = (q3, k3, v3, ga, seg_ids, scratch, dq, h, n, d, cfg.dv)
            _sweeps(_sweep_dq_kernel, args, ctx.causal, ids is not None, False, scratch, cfg)
            scratch.zero_()
            args = (q3, k3, v3, ga, seg_ids, scratch, dk, dv, h, n, d, cfg.dv)
            _sweeps(_sweep_dkv_kernel, args, ctx.causal, ids is not None, True, scratch, cfg)
        shape = (b, h, n)
        return dq.view(*shape, d), dk.view(*shape, d), dv.view(*shape, cfg.dv), None, None, None, None, None, None


def fastmax_triton(
    qs: torch.Tensor,
    k_hat: torch.Tensor,
    v: torch.Tensor,
    *,
    p: int = 2,
    causal: bool = False,
    chunk_size: int = 64,
    num_splits: int | None = None,
    seg: Segments | None = None,
) -> torch.Tensor:
    """Factorised Fastmax by Triton kernels: ``qs, k_hat (B, H, N, D)``, ``v (B, H, N, Dv)`` -> ``(B, H, N, Dv)``.

    Inputs are standardised (and ``qs`` scaled) by :func:`attnzoo.ops.fastmax.fastmax`, in float32 or float64;
    the result has that dtype. Differentiable in ``qs, k_hat, v`` (FAST §2.5 backward). ``chunk_size``: token
    block of the kernels, rounded up to a power of two in [16, 128] (``tl.dot`` needs >= 16; the causal sweeps
    cap it at 32 to stay in registers). ``num_splits``:
    token splits of the unmasked state reduction (``None``: chosen to fill the GPU). ``seg``: a padded batch or
    packed row (:class:`~attnzoo.ops._varlen.Segments`): the sweeps read each token's sequence id, so each query's
    sums run over its own sequence's real keys (causal states restart at each sequence start), padding outputs 0.
    """
    check_launchable("fastmax", qs, k_hat, v)
    if p not in (1, 2):
        raise ValueError(f"p={p!r} is not supported; Fastmax's Taylor order p must be one of [1, 2]")
    if qs.dtype not in (torch.float32, torch.float64) or not (qs.dtype == k_hat.dtype == v.dtype):
        raise TypeError(
            f"fastmax_triton expects float32/float64 inputs of one dtype (fastmax() upcasts), "
            f"got {qs.dtype}, {k_hat.dtype}, {v.dtype}"
        )
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    if num_splits is not None and (not isinstance(num_splits, int) or num_splits < 1):
        raise ValueError(f"num_splits must be a positive integer or None, got {num_splits!r}")
    block_n = min(pow2(chunk_size), 128)
    ids = None if seg is None else seg.ids.to(device=qs.device, dtype=torch.int32).contiguous()
    single = seg is not None and seg.num == 1  # a padded batch: one sequence per row
    return FastmaxTritonFunction.apply(qs, k_hat, v, p, causal, block_n, num_splits, ids, single)
