"""CSP on padded batches and packed rows: shifts and group sorts within each sequence's real tokens.

Sequence ``s`` of ``L_s`` real tokens (positions ``p = 0 .. L_s - 1``) is CSP eq 4 run alone: channel c is
shifted by ``J_{s,c}`` modulo ``L_s`` (eq 3, ``u[p] = v[(p - J) mod L_s]``), then sorted inside each of the
``groups`` contiguous groups of ``L_s / groups`` tokens (positions ``[k G_s, (k + 1) G_s)``), channel c's r-th
smallest going to the slot of the reference channel's r-th smallest. As alone, ``L_s`` must be divisible by
``groups``. Padding tokens map to themselves and are zeroed afterwards.

The vectorised form sorts every row once by the key ``(group, value, position)`` (two stable argsorts), with a
group id unique to each (sequence, group): a channel's and the reference's sorted orders then list the same groups
in the same order with the same sizes, so slot ``j`` of one matches slot ``j`` of the other. No loop over
sequences, no padding to a common length.
"""

from __future__ import annotations

import torch

from attnzoo.ops._varlen import Segments
from attnzoo.ops.csp.parallel import _TokenPermute

__all__ = ["csp_varlen", "csp_varlen_kernel", "csp_varlen_source_index", "sequence_slots", "token_shifts"]


def token_shifts(shifts: torch.Tensor, toks: Segments) -> torch.Tensor:
    """Per-token steps ``(B, N, C)`` from ``shifts`` ``(C,)`` (every sequence alike) or ``(B, S, C)``."""
    b, n = toks.ids.shape
    if shifts.ndim == 1:
        return shifts.view(1, 1, -1).expand(b, n, -1)
    seq = toks.ids.clamp_min(0).unsqueeze(-1).expand(b, n, shifts.shape[-1])
    return shifts.gather(1, seq)


def csp_varlen_source_index(v: torch.Tensor, shifts: torch.Tensor, toks: Segments, groups: int | None) -> torch.Tensor:
    """``idx`` ``(B, N, C)`` with ``out[b, i, c] = v[b, idx[b, i, c], c]`` per sequence (module doc); ``groups=None``
    is groups of one token (``groups = L_s``: shifting only)."""
    b, n, c = v.shape
    ids, pos = toks.ids, toks.pos
    real = ids >= 0
    tok = torch.arange(n, device=v.device).expand(b, n)
    length = toks.lengths.gather(1, ids.clamp_min(0)).clamp_min(1)  # (B, N): the token's sequence length
    with torch.no_grad():
        # the row's tokens by (sequence, position): sequence s's position p is rank offset_s + p (holed masks too)
        by_seq = torch.argsort(torch.where(real, ids, toks.num) * n + tok, dim=1)
        offset = (toks.lengths.cumsum(-1) - toks.lengths).gather(1, ids.clamp_min(0))
        rank = offset.unsqueeze(-1) + torch.remainder(pos.unsqueeze(-1) - token_shifts(shifts, toks), length[..., None])
        src = by_seq.unsqueeze(-1).expand(b, n, c).gather(1, rank)
        src = torch.where(real.unsqueeze(-1), src, tok.unsqueeze(-1))  # padding stays put
        if groups is None:
            return src
        u = v.detach().gather(1, src)
        size = (length // groups).clamp_min(1)  # G_s tokens per group
        # one id per (sequence, group); each padding token its own group, after every real one
        grp = torch.where(real, ids * groups + pos // size, toks.num * groups + tok).unsqueeze(-1).expand(b, n, c)
        by_value = torch.argsort(u, dim=1, stable=True)
        order = by_value.gather(1, torch.argsort(grp.gather(1, by_value), dim=1, stable=True))
        slots = order[..., :1].expand(b, n, c)  # the reference channel's order: where rank j lands
        return torch.empty_like(src).scatter_(1, slots, src.gather(1, order))


def csp_varlen(v: torch.Tensor, shifts: torch.Tensor, toks: Segments, groups: int | None) -> torch.Tensor:
    """CSP eq 4 per sequence: ``v`` ``(B, N, C)`` -> ``(B, N, C)``, zero at padding; gradients by the inverse
    permutation (:class:`~attnzoo.ops.csp.parallel._TokenPermute`)."""
    out = _TokenPermute.apply(v, csp_varlen_source_index(v, shifts, toks, groups))
    return out * toks.real.unsqueeze(-1).to(v.dtype)


def sequence_runs(toks: Segments) -> torch.Tensor | None:
    """``(B, S, 2)`` int64: each sequence's first token in its row and its length; ``None`` if a sequence's tokens
    are not side by side (a mask with holes)."""
    b, n = toks.ids.shape
    num = toks.num
    tok = torch.arange(n, device=toks.ids.device).expand(b, n)
    key = torch.where(toks.real, toks.ids, num)  # padding goes to a spare column
    first = torch.full((b, num + 1), n, dtype=torch.long, device=tok.device).scatter_reduce(1, key, tok, "amin")
    last = torch.full((b, num + 1), -1, dtype=torch.long, device=tok.device).scatter_reduce(1, key, tok, "amax")
    first, last, length = first[:, :num], last[:, :num], toks.lengths
    if bool(((length > 0) & (last - first + 1 != length)).any()):
        return None
    return torch.stack([torch.where(length > 0, first, 0), length], dim=-1).contiguous()


def sequence_slots(toks: Segments) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the fused kernel finds each sequence's tokens: ``seg`` ``(B, S, 2)`` int64 (first slot, length) and
    ``order`` ``(B, N)`` int64, the row's tokens listed by (sequence, position), slot ``i`` of sequence ``s`` being
    ``order[b, seg[b, s, 0] + i]``; for side-by-side runs ``order`` is empty and the slots are the rows themselves
    (no list to build or read)."""
    runs = sequence_runs(toks)
    if runs is not None:
        return runs, torch.empty(0, dtype=torch.long, device=toks.ids.device)
    key = torch.where(toks.real, toks.ids, toks.num)  # padding after every sequence
    order = torch.sort(key, dim=1, stable=True).indices.contiguous()  # stable: each sequence in position order
    start = toks.lengths.cumsum(-1) - toks.lengths
    return torch.stack([start, toks.lengths], dim=-1).contiguous(), order


class _CSPVarlenKernel(torch.autograd.Function):
    """CSP eq 4 per sequence by the fused kernel (``csp_varlen`` of cpu.cpp); backward sends each gradient to the
    row its value came from (``csp_varlen_bwd``)."""

    @staticmethod
    def forward(ctx, v, seg, order, steps, groups: int, kernels) -> torch.Tensor:
        out, src = kernels.csp_varlen(v.contiguous(), seg, order, steps, groups)
        ctx.save_for_backward(src)
        ctx.kernels = kernels
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        (src,) = ctx.saved_tensors
        return ctx.kernels.csp_varlen_bwd(grad.contiguous(), src), None, None, None, None, None


def csp_varlen_kernel(v: torch.Tensor, shifts: torch.Tensor, toks: Segments, groups: int | None, kernels):
    """CSP eq 4 per sequence (module doc) in the fused kernel: ``v`` ``(B, N, C)`` -> ``(B, N, C)``, zero at padding,
    any ``groups`` dividing every length (``None``: groups of one token, shifting only), side-by-side runs and masks
    with holes alike; no loop over sequences, no copy of ``v`` (when contiguous)."""
    b, c = v.shape[0], v.shape[2]
    seg, order = sequence_slots(toks)
    per_seq = shifts.view(1, 1, c).expand(b, toks.num, c) if shifts.ndim == 1 else shifts
    steps = torch.remainder(per_seq, toks.lengths.clamp_min(1).unsqueeze(-1)).contiguous()
    return _CSPVarlenKernel.apply(v, seg, order, steps, 0 if groups is None else groups, kernels)
