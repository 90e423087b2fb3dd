"""Fastmax over padded batches and packed rows (issue 27): FAST eqs 24-29 / 32-35 per sequence, in one pass.

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

import torch

from attnzoo.ops._varlen import Segments
from attnzoo.ops.fastmax.common import features, kernel

__all__ = ["masked_sweeps"]


def _spans(n: int, chunk: int) -> list[tuple[int, int]]:
    return [(s, min(s + chunk, n)) for s in range(0, n, chunk)]


def _carried(
    qs: torch.Tensor, k: torch.Tensor, va: torch.Tensor, ids: torch.Tensor, p: int, chunk: int, reverse: bool
) -> list[torch.Tensor]:
    """Per chunk ``(B, H, C, Dv + 1)``: ``phi(qs_i) . S`` with ``S`` the moments (eqs 28-29) of the earlier chunks'
    keys (later ones when ``reverse``) of query i's own sequence; zero where that sequence starts in the chunk."""
    b, h, n, d = qs.shape
    state = qs.new_zeros(b, h, features(qs[..., :1, :], p).shape[-1], va.shape[-1])
    carry = torch.full((b,), -1, dtype=ids.dtype, device=ids.device)  # the sequence the state belongs to
    spans = _spans(n, chunk)
    parts: list[torch.Tensor] = [qs.new_zeros(0)] * len(spans)
    for j in reversed(range(len(spans))) if reverse else range(len(spans)):
        s, e = spans[j]
        idc = ids[:, s:e]
        reads = (idc == carry[:, None]) & (idc >= 0)
        fq = features(qs[..., s:e, :], p)
        parts[j] = torch.where(reads[:, None, :, None], fq @ state, 0.0)
        # the sequence the state holds after this chunk: the chunk's last (first when reverse) real one
        edge = torch.where(idc >= 0, idc, -1).amax(-1) if not reverse else torch.where(idc >= 0, idc, n).amin(-1)
        edge = torch.where((edge >= 0) & (edge < n), edge, carry)  # a chunk of padding only leaves it unchanged
        add = (idc == edge[:, None]) & (idc >= 0)
        fk = features(k[..., s:e, :], p)
        keep = (edge == carry)[:, None, None, None]
        vac = torch.where(add[:, None, :, None], va[..., s:e, :], 0.0)
        state = torch.where(keep, state, 0.0) + fk.transpose(-1, -2) @ vac
        carry = edge
    return parts


def masked_sweeps(
    qs: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segs: Segments, *, p: int, causal: bool, chunk: int
) -> torch.Tensor:
    """Module doc's sums on standardised ``qs = scale * q_hat``, ``k = k_hat`` ``(B, H, N, D)``, ``v (B, H, N, Dv)``
    -> ``(B, H, N, Dv)`` (zero at padding); differentiable by autograd (every sum masks by ``where``, so padding
    inputs get exactly zero gradient)."""
    n, dv = qs.shape[-2], v.shape[-1]
    ids = segs.ids.to(qs.device)
    real = ids >= 0
    va = torch.cat([v, v.new_ones(v.shape[:-1] + (1,))], dim=-1)
    va = torch.where(real[:, None, :, None], va, 0.0)
    fwd = _carried(qs, k, va, ids, p, chunk, reverse=False)
    bwd = None if causal else _carried(qs, k, va, ids, p, chunk, reverse=True)
    tril = torch.ones(min(chunk, n), min(chunk, n), dtype=torch.bool, device=qs.device).tril()
    parts = []
    for j, (s, e) in enumerate(_spans(n, chunk)):
        idc = ids[:, s:e]
        same = (idc[:, :, None] == idc[:, None, :]) & (idc[:, None, :] >= 0)  # (B, C, C): own sequence's keys
        if causal:
            same = same & tril[: e - s, : e - s]
        w = kernel(qs[..., s:e, :] @ k[..., s:e, :].transpose(-1, -2), p)
        acc = fwd[j] + torch.where(same[:, None], w, 0.0) @ va[..., s:e, :]
        parts.append(acc if bwd is None else acc + bwd[j])
    out_aug = torch.cat(parts, dim=-2)
    keep = real[:, None, :, None]
    den = torch.where(keep, out_aug[..., dv:], 1.0)  # padding queries: no keys, zero output (not 0/0)
    return torch.where(keep, out_aug[..., :dv] / den, 0.0)
