"""Factorised Fastmax (FAST eqs 24-29 unmasked, 32-35 masked) with the memory-lean custom backward of FAST §2.5.

All functions take already standardised inputs: ``qs = scale * q_hat`` and ``k_hat`` ``(B, H, N, D)``,
``v (B, H, N, Dv)``. With ``phi`` the feature map of :mod:`common` (``phi(q) . phi(k) = f(q . k)``) and
``va = [v, 1]`` (the trailing 1 makes the denominators of eq 29/35 ride along as a last value column), the
state ``S = sum_n phi(k_n) va_n^T`` of shape ``(P, Dv + 1)`` holds every moment sum x, y of eqs 28-29.

* unmasked: ``S`` over all tokens, then ``out_aug_i = phi(qs_i) S`` (eqs 26-27), O(N D^(p+1)) time.
* masked (causal): the sequence is cut into chunks of C tokens; a chunk's queries read the prefix state of all
  earlier chunks through the factorisation and the tokens of their own chunk through the explicit C x C
  masked weights ``f(qs_i . k_n), n <= i``; the prefix state is then advanced by the chunk. Only one
  ``(P, Dv + 1)`` state per head is alive at a time, never the O(N D^(p+1)) per-token prefix tensor of
  eq 34-35. Cost O(N D^(p+1) + N C D).

Every sum runs in the dtype of its inputs, which :func:`attnzoo.ops.fastmax.fastmax` makes float32 (float64
for float64 inputs), so prefix states accumulate in float32 even for fp16/bf16 inputs.

Backward (:class:`FastmaxFunction`, FAST §2.5, eqs 36-37). With ``g_i = dO_i / G_i`` and
``c_i = g_i . o_i``, the weight gradient is ``dw_in = g_i . v_n - c_i = ga_i . va_n`` with ``ga = [g, -c]``;
hence, with ``T = sum_i phi(qs_i) ga_i^T`` (the same factorisation with queries and keys swapped),

    dqs_i = d/dqs_i [phi(qs_i) . (S ga_i)]     (S ga_i fixed)
    dk_n  = d/dk_n  [phi(k_n)  . (T va_n)]     (T va_n fixed)
    dv_n  = phi(k_n) . T[:, :Dv]

Only ``qs, k_hat, v``, the outputs and the denominators ``G`` (O(N D) per head) are saved; S and T are
recomputed. For the masked case S is a prefix state (a forward chunk sweep for dqs) and T a suffix state
(a reverse chunk sweep for dk, dv), with the explicit C x C terms inside each chunk.
"""

from __future__ import annotations

import contextlib

import torch

from attnzoo.ops.fastmax.common import feature_dim, features, features_vjp, kernel, kernel_grad

__all__ = ["factorized_forward", "factorized_backward", "FastmaxFunction", "fastmax_factorized"]


def _spans(n: int, chunk: int) -> list[tuple[int, int]]:
    return [(s, min(s + chunk, n)) for s in range(0, n, chunk)]


# Unmasked sums need no C x C intra-chunk terms, so their chunks only bound the (C, feature_dim) feature
# temporaries: as many tokens as give this many feature elements per head, and at least the requested
# chunk. (The masked chunk trades the C^2 terms against the per-chunk overhead; at the default C = 64 the
# unmasked sweep at N = 16k, p = 1 was dominated by the Python overhead of its 256 chunks.)
_UNMASKED_FEATURES = 1 << 18


def _unmasked_spans(n: int, d: int, p: int, chunk: int) -> list[tuple[int, int]]:
    return _spans(n, max(chunk, _UNMASKED_FEATURES // feature_dim(d, p)))


def _append_one(v: torch.Tensor) -> torch.Tensor:
    return torch.cat([v, v.new_ones(v.shape[:-1] + (1,))], dim=-1)


def _tril(n: int, device) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def _masked(w: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return torch.where(keep, w, torch.zeros((), dtype=w.dtype, device=w.device))


def _tri_width(d: int) -> int:
    return d * (d + 1) // 2


def _tri_features(xt: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Upper triangle of ``x x^T`` per token, row by row, feature-major: ``xt (..., D, C)`` (tokens along the last
    dimension) -> ``out (..., D(D+1)/2, C)``.

    The symmetric half of the p=2 feature ``vec(x x^T)``: ``(q . k)^2 = sum_{d<=e} w_de (q_d q_e)(k_d k_e)``
    with ``w = 1`` on the diagonal and 2 above it, so half the elements and half the matmul flops. Feature-major
    so that each of the D products runs over contiguous token rows: token-major, each row is at most D wide,
    and the same products took 2.5-5x as long on CPU (D = 8-64).
    """
    d = xt.shape[-2]
    if torch.compiler.is_compiling():  # dynamo cannot trace out= into a strided slice; the functional form compiles
        return torch.cat([xt[..., i : i + 1, :] * xt[..., i:, :] for i in range(d)], dim=-2)
    off = 0
    for i in range(d):
        torch.mul(xt[..., i : i + 1, :], xt[..., i:, :], out=out[..., off : off + d - i, :])
        off += d - i
    return out


def _tri_weights(d: int, dtype, device) -> torch.Tensor:
    """``(D(D+1)/2,)``: the 1/2! of f times ``w_de`` above: 1/2 on the diagonal, 1 off it."""
    w = torch.ones(_tri_width(d), dtype=dtype, device=device)
    w[torch.tensor([i * d - i * (i - 1) // 2 for i in range(d)], device=device)] = 0.5
    return w


def _tokens_last(x: torch.Tensor) -> torch.Tensor:
    """``(BH, N, D) -> (BH, D, N)`` contiguous, the layout :func:`_tri_features` reads."""
    return x.transpose(-1, -2).contiguous()


def _bh(x: torch.Tensor) -> torch.Tensor:
    """``(B, H, N, X) -> (B*H, N, X)`` (a view when possible) so the in-place batched matmuls apply."""
    return x.reshape(-1, x.shape[-2], x.shape[-1])


def unmasked_forward(
    qs: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: int, count: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eqs 11-12 with the moment sums contracted directly: ``out (B, H, N, Dv)``, ``G (B, H, N)``.

    With ``s = qs . k`` and ``f(s) = 1 + s (+ s^2 / 2)``, the numerator and denominator of row i are

        num_i = sum_n v_n + qs_i^T (K^T V) [+ sum_{d<=e} w_de qs_id qs_ie M_de]    (eq 28)
        G_i   = N + qs_i . sum_n k_n      [+ sum_{d<=e} w_de qs_id qs_ie m_de]    (eq 29)

    with ``M_de = sum_n k_nd k_ne v_n``, ``m_de = sum_n k_nd k_ne`` and ``w_de`` of :func:`_tri_weights`.
    ``count (B,)``, when given, replaces N (the zeroth-order term f(0) = 1 of every key): the padded batches of
    :mod:`attnzoo.ops.fastmax.varlen` zero the padding keys and values, which then add only that term.
    p=1 is one ``(N, D) x (D, Dv)`` product and one multiply-and-sum for ``G``, with no feature tensor at all.
    For p=2 ``G`` rides along as one extra column of the small ``(D, Dv + 1)`` moment matrices, which adds only
    the symmetric half
    of ``k k^T`` / ``qs qs^T`` per token, built chunk by chunk (about ``_UNMASKED_FEATURES`` elements per
    head) into one reused buffer: never the concatenated ``phi`` nor ``[v, 1]``.
    """
    b, h, n, d = qs.shape
    dv = v.shape[-1]
    q3, k3, v3 = _bh(qs), _bh(k), _bh(v)
    if p == 1:
        # numerator and denominator apart: a contiguous division, where the extra-column form below divides a
        # strided (N, Dv + 1) slice; the denominator as one multiply-and-sum (faster here than a matrix-vector bmm)
        num = torch.baddbmm(v3.sum(dim=-2, keepdim=True), q3, torch.bmm(k3.transpose(-1, -2), v3))
        den = (q3 * k3.sum(dim=-2).unsqueeze(-2)).sum(dim=-1)  # (BH, N): saved for the backward
        den = den.add_(float(n)) if count is None else den.add_(count.to(den.dtype).repeat_interleave(h)[:, None])
        return num.div_(den.unsqueeze(-1)).view(b, h, n, dv), den.view(b, h, n)
    # first order: [K^T V | K^T 1] and the zeroth order [sum_n v_n | N] (eqs 28-29, l = 0, 1)
    m1 = torch.cat([torch.bmm(k3.transpose(-1, -2), v3), k3.sum(dim=-2).unsqueeze(-1)], dim=-1)
    n0 = v3.new_full((v3.shape[0], 1), float(n)) if count is None else count.to(v3.dtype).repeat_interleave(h)[:, None]
    m0 = torch.cat([v3.sum(dim=-2), n0], dim=-1).unsqueeze(-2)
    num = torch.baddbmm(m0, q3, m1)  # (BH, N, Dv + 1)
    if p == 2:
        t = _tri_width(d)
        c = max(1, min(n, _UNMASKED_FEATURES // t))
        kt, qt = _tokens_last(k3), _tokens_last(q3)
        buf = qs.new_empty(b * h, t, c)
        m2 = _tri_moments(kt, v3, buf, c).mul_(_tri_weights(d, qs.dtype, qs.device).unsqueeze(-1))
        for s, e in _spans(n, c):
            num[:, s:e].baddbmm_(_tri_features(qt[..., s:e], buf[..., : e - s]).transpose(-1, -2), m2)
    den = num[..., dv].contiguous()  # saved for the backward: not a view that keeps num alive
    out = num[..., :dv] / den.unsqueeze(-1)
    return out.view(b, h, n, dv), den.reshape(b, h, n)


def _tri_moments(kt: torch.Tensor, v: torch.Tensor, buf: torch.Tensor, c: int) -> torch.Tensor:
    """``sum_n tri(k_n) [v_n, 1]^T``, ``(BH, D(D+1)/2, Dv + 1)``, from ``kt (BH, D, N)`` and ``v (BH, N, Dv)`` in
    chunks of ``c`` tokens through ``buf (BH, D(D+1)/2, >= c)``. The two parts accumulate apart and meet once:
    a batched matmul into the strided ``[..., :Dv]`` slice falls back to one small matmul per (batch, head)."""
    n = kt.shape[-1]
    mv = v.new_zeros(kt.shape[0], buf.shape[1], v.shape[-1])
    m1 = v.new_zeros(kt.shape[0], buf.shape[1])
    for s, e in _spans(n, c):
        fk = _tri_features(kt[..., s:e], buf[..., : e - s])  # (BH, t, C)
        mv.baddbmm_(fk, v[:, s:e])
        m1 += fk.sum(dim=-1)
    return torch.cat([mv, m1.unsqueeze(-1)], dim=-1)


def _sym_from_tri(m: torch.Tensor, d: int) -> torch.Tensor:
    """``(BH, D(D+1)/2, X)`` upper-triangle rows -> the full symmetric ``(BH, D, D * X)`` (row d, columns (e, x))."""
    i = torch.arange(d, device=m.device)
    lo, hi = torch.minimum(i[:, None], i[None, :]), torch.maximum(i[:, None], i[None, :])
    row = lo * d - lo * (lo - 1) // 2 + (hi - lo)  # position of (min, max) in the row-by-row triangle
    return m.index_select(1, row.flatten()).view(m.shape[0], d, d * m.shape[-1])


def unmasked_backward(
    qs: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    den: torch.Tensor,
    dout: torch.Tensor,
    p: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FAST §2.5 backward of :func:`unmasked_forward` in moment form: returns ``(dqs, dk, dv)`` (the fused CPU
    kernel's backward, ``cpu.cpp``, is the same for p=1).

    With ``ga_i = [g_i, -c_i]`` (``g = dO / G``, ``c_i = g_i . o_i``), ``va_n = [v_n, 1]`` and
    ``ds_in = (ga_i . va_n) f'(s_in)`` (eq 36):

        dqs_i = sum_n ds_in k_n   = M1 ga_i          [+ sum_{e,x} M3[d, e, x] qs_ie ga_ix]
        dk_n  = sum_i ds_in qs_i  = Q1 va_n          [+ sum_{e,x} Q3[d, e, x] k_ne va_nx]
        dv_n  = sum_i f(s_in) g_i = sum g + k_n^T Q1 [+ sum_{d<=e} w_de k_nd k_ne Q2_de]

    with ``M1 = K^T [V, 1]``, ``Q1 = Qs^T [G, -c]`` and their second-order analogues ``M3 = sum_n k k^T va^T``,
    ``Q3 = sum_i qs qs^T ga^T`` (built from the symmetric half, as in the forward). Only O(N D) inputs are
    read; the second-order terms stream token chunks through one reused buffer.
    """
    b, h, n, d = qs.shape
    dv_dim = v.shape[-1]
    q3, k3, v3 = _bh(qs), _bh(k), _bh(v)
    if torch.compiler.is_compiling():  # dynamo cannot trace out= into strided slices; same values, functional
        g = _bh(dout) / den.reshape(b * h, n, 1)
        ga = torch.cat([g, -(g * _bh(out)).sum(dim=-1, keepdim=True)], dim=-1)
    else:
        ga = qs.new_empty(b * h, n, dv_dim + 1)
        g = torch.div(_bh(dout), den.reshape(b * h, n, 1), out=ga[..., :dv_dim])
        torch.sum(g * _bh(out), dim=-1, out=ga[..., dv_dim]).neg_()
    m1 = torch.cat([torch.bmm(k3.transpose(-1, -2), v3), k3.sum(dim=-2).unsqueeze(-1)], dim=-1)  # (BH, D, Dv+1)
    q1 = torch.bmm(q3.transpose(-1, -2), ga)  # (BH, D, Dv+1)
    dq = torch.bmm(ga, m1.transpose(-1, -2))
    dk = torch.baddbmm(q1[..., dv_dim].unsqueeze(-2), v3, q1[..., :dv_dim].transpose(-1, -2))
    dvv = torch.baddbmm(g.sum(dim=-2, keepdim=True), k3, q1[..., :dv_dim])
    if p == 2:
        t = _tri_width(d)
        xw = d * (dv_dim + 1)
        c = max(1, min(n, _UNMASKED_FEATURES // max(t, xw)))
        # feature-major (tokens last) copies, so every elementwise product below runs over contiguous token rows
        kt, qt, vt, gat = _tokens_last(k3), _tokens_last(q3), _tokens_last(v3), _tokens_last(ga)
        tri_buf = qs.new_empty(b * h, t, c)
        outer_buf = qs.new_empty(b * h, d, dv_dim + 1, c)
        m2 = _tri_moments(kt, v3, tri_buf, c)  # sum_n tri(k_n) va_n^T
        q2 = qs.new_zeros(b * h, t, dv_dim + 1)  # sum_i tri(qs_i) ga_i^T
        spans = _spans(n, c)
        for s, e in spans:
            q2.baddbmm_(_tri_features(qt[..., s:e], tri_buf[..., : e - s]), ga[:, s:e])
        m3, q3m = _sym_from_tri(m2, d), _sym_from_tri(q2, d)  # (BH, D, D (Dv+1))
        q2w = q2[..., :dv_dim] * _tri_weights(d, qs.dtype, qs.device).unsqueeze(-1)
        for s, e in spans:
            ob = outer_buf[..., : e - s]  # (BH, D, Dv + 1, C): row (e, x) of the (D (Dv + 1), C) view
            torch.mul(qt[:, :, None, s:e], gat[:, None, :, s:e], out=ob)  # qs_ie ga_ix
            dq[:, s:e].baddbmm_(ob.view(b * h, xw, e - s).transpose(-1, -2), m3.transpose(-1, -2))
            torch.mul(kt[:, :, None, s:e], vt[:, None, :, s:e], out=ob[:, :, :dv_dim])  # k_ne va_nx
            ob[:, :, dv_dim] = kt[..., s:e]
            dk[:, s:e].baddbmm_(ob.view(b * h, xw, e - s).transpose(-1, -2), q3m.transpose(-1, -2))
            dvv[:, s:e].baddbmm_(_tri_features(kt[..., s:e], tri_buf[..., : e - s]).transpose(-1, -2), q2w)
    return dq.view(b, h, n, d), dk.view(b, h, n, d), dvv.view(b, h, n, dv_dim)


def factorized_forward(
    qs: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    p: int,
    causal: bool,
    chunk: int,
    feat_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eqs 24-29 / 32-35 chunked: returns ``out (B, H, N, Dv)`` and denominators ``G (B, H, N)``.

    ``feat_mask (B, H, P)`` optionally multiplies the query features (feature-dropout of the factorised
    terms, used by :mod:`attnzoo.ops.fastmax.dropout`); the intra-chunk weights then use the feature form.
    """
    b, h, n, d = qs.shape
    dv = v.shape[-1]
    state = qs.new_zeros(b, h, feature_dim(d, p), dv + 1)
    spans = _spans(n, chunk)
    # One (B, H, N, Dv + 1) result written chunk by chunk; [v, 1] is built per chunk, never for all N.
    out_aug = qs.new_empty(b, h, n, dv + 1)

    def query_features(s: int, e: int) -> torch.Tensor:
        fq = features(qs[..., s:e, :], p)
        return fq if feat_mask is None else fq * feat_mask.unsqueeze(-2)

    if not causal and feat_mask is None and not torch.is_grad_enabled():
        return unmasked_forward(qs, k, v, p)
    if not causal:
        spans = _unmasked_spans(n, d, p, chunk)
        for s, e in spans:
            state = state + features(k[..., s:e, :], p).transpose(-1, -2) @ _append_one(v[..., s:e, :])
        for s, e in spans:
            out_aug[..., s:e, :] = query_features(s, e) @ state
    else:
        keep = _tril(min(chunk, n), qs.device)
        for s, e in spans:
            fq = query_features(s, e)
            fk = features(k[..., s:e, :], p)
            vac = _append_one(v[..., s:e, :])
            if feat_mask is None:
                w = kernel(qs[..., s:e, :] @ k[..., s:e, :].transpose(-1, -2), p)
            else:
                w = fq @ fk.transpose(-1, -2)
            out_aug[..., s:e, :] = fq @ state + _masked(w, keep[: e - s, : e - s]) @ vac
            state = state + fk.transpose(-1, -2) @ vac
    den = out_aug[..., dv]
    return out_aug[..., :dv] / den.unsqueeze(-1), den


def factorized_backward(
    qs: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    den: torch.Tensor,
    dout: torch.Tensor,
    p: int,
    causal: bool,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FAST §2.5 backward from the O(N D) saved tensors: returns ``(dqs, dk, dv)``."""
    if not causal:
        return unmasked_backward(qs, k, v, out, den, dout, p)
    b, h, n, d = qs.shape
    dv_dim = v.shape[-1]
    p_dim = feature_dim(d, p)
    spans = _spans(n, chunk)
    # Written chunk by chunk into preallocated gradients; g = dout / G and the augmented [g, -g.out] and
    # [v, 1] are rebuilt per chunk (O(C D)) so that no extra (N, D)-sized copy is alive at the peak.
    dq, dk, dv = torch.empty_like(qs), torch.empty_like(k), torch.empty_like(v)

    def g_at(s: int, e: int) -> torch.Tensor:
        return dout[..., s:e, :] / den[..., s:e].unsqueeze(-1)

    def ga_at(s: int, e: int, g: torch.Tensor | None = None) -> torch.Tensor:
        g = g_at(s, e) if g is None else g
        return torch.cat([g, -(g * out[..., s:e, :]).sum(dim=-1, keepdim=True)], dim=-1)

    def va_at(s: int, e: int) -> torch.Tensor:
        return _append_one(v[..., s:e, :])

    keep = _tril(min(chunk, n), qs.device)
    # forward sweep: the prefix-state part of dqs
    s_state = qs.new_zeros(b, h, p_dim, dv_dim + 1)
    for s, e in spans:
        dq[..., s:e, :] = features_vjp(qs[..., s:e, :], ga_at(s, e) @ s_state.transpose(-1, -2), p)
        s_state = s_state + features(k[..., s:e, :], p).transpose(-1, -2) @ va_at(s, e)
    del s_state
    # reverse sweep: suffix state T for dk, dv, plus every intra-chunk term
    t_state = qs.new_zeros(b, h, p_dim, dv_dim + 1)
    for idx in range(len(spans) - 1, -1, -1):
        s, e = spans[idx]
        qc, kc = qs[..., s:e, :], k[..., s:e, :]
        gc = g_at(s, e)
        vac, gac = va_at(s, e), ga_at(s, e, gc)
        m = keep[: e - s, : e - s]
        sc = qc @ kc.transpose(-1, -2)
        w = _masked(kernel(sc, p), m)
        ds = _masked(kernel_grad(sc, p), m) * (gac @ vac.transpose(-1, -2))
        dq[..., s:e, :] += ds @ kc
        dk[..., s:e, :] = features_vjp(kc, vac @ t_state.transpose(-1, -2), p) + ds.transpose(-1, -2) @ qc
        dv[..., s:e, :] = features(kc, p) @ t_state[..., :dv_dim] + w.transpose(-1, -2) @ gc
        t_state = t_state + features(qc, p).transpose(-1, -2) @ gac
    return dq, dk, dv


class FastmaxFunction(torch.autograd.Function):
    """Factorised Fastmax with the FAST §2.5 backward; saves only ``qs, k_hat, v, out, G`` (O(N D) per head)."""

    @staticmethod
    def forward(ctx, qs: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: int, causal: bool, chunk: int):
        out, den = factorized_forward(qs, k, v, p, causal, chunk)
        ctx.save_for_backward(qs, k, v, out, den)
        ctx.p, ctx.causal, ctx.chunk = p, causal, chunk
        return out

    @staticmethod
    def backward(ctx, dout: torch.Tensor):
        qs, k, v, out, den = ctx.saved_tensors
        dq, dk, dv = factorized_backward(qs, k, v, out, den, dout, ctx.p, ctx.causal, ctx.chunk)
        return dq, dk, dv, None, None, None


def fastmax_factorized(
    qs: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, p: int, causal: bool, chunk: int, custom_grad: bool = True
) -> torch.Tensor:
    """Eqs 24-35 on standardised inputs; ``custom_grad=False`` differentiates through the factorisation.

    The autograd variant (``backend="torch_autograd"``) keeps, per head, every chunk's features
    ``phi(k)``/``phi(qs)`` (O(N D^p)) and, when causal, every chunk's prefix state (O(N/C * D^p * Dv)),
    versus O(N D) for :class:`FastmaxFunction`: it exists to benchmark that memory difference.
    """
    if custom_grad and torch.is_grad_enabled() and (qs.requires_grad or k.requires_grad or v.requires_grad):
        return FastmaxFunction.apply(qs, k, v, p, causal, chunk)
    # nothing to differentiate (inference): the same forward without the autograd.Function's overhead
    with torch.no_grad() if custom_grad else contextlib.nullcontext():
        return factorized_forward(qs, k, v, p, causal, chunk)[0]
