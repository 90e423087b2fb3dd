"""MEGA attention on padded batches and packed rows: each sequence attends within itself.

Query ``i`` and key ``j`` of one sequence (positions ``p_i, p_j`` counted from its first real token) interact iff they
share a chunk of that sequence, ``p_i // r == p_j // r`` (chunks counted from the sequence's start; ``r`` the sequence's
length without chunking), with the relative bias read at ``b[p_j - p_i]``; the Laplace scale counts the keys of that
chunk (``causal``: only ``p_j <= p_i``, and the scale counts those). Any key of query ``i``'s chunk lies within
``r - 1`` tokens of it in the row, so the row is cut in blocks of ``r`` tokens and block ``c`` scores against blocks
``c - 1, c, c + 1`` under a segment mask: ``(B, C, r, 3r)`` scores, O(N r), no loop over sequences; when every sequence
starts on the block grid (right padding, or one unchunked sequence per row) block ``c`` scores against itself only.
Padding queries give zeros.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnzoo.ops._dtypes import acc_dtype
from attnzoo.ops._varlen import Segments
from attnzoo.ops.mega.naive import laplace

__all__ = ["mega_attention_varlen"]


def _windows(x: torch.Tensor, r: int, blocks: int, wide: bool, value: int = 0) -> torch.Tensor:
    """``x (B, N, ...)`` -> ``(B, C, w, ...)``: block ``c``'s keys, blocks ``c - 1 .. c + 1`` when ``wide``."""
    n = x.shape[1]
    tail = [0, 0] * (x.ndim - 2)
    if not wide:
        return F.pad(x, tail + [0, blocks * r - n], value=value).unflatten(1, (blocks, r))
    padded = F.pad(x, tail + [r, (blocks + 1) * r - n], value=value)  # one empty block before, the rest after
    return padded.unfold(1, 3 * r, r).movedim(-1, 2)


def _contiguous(toks: Segments) -> bool:
    """Whether every sequence's real tokens are adjacent in its row (each token's row neighbour on the left is its
    predecessor in the sequence)."""
    pos, ids, real = toks.pos, toks.ids, toks.real
    follows = (ids[:, 1:] == ids[:, :-1]) & (pos[:, 1:] == pos[:, :-1] + 1) & real[:, :-1]
    later = real[:, 1:] & (pos[:, 1:] > 0)
    return bool((follows | ~later).all()) and bool((pos[:, 0][real[:, 0]] == 0).all())


def mega_attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rel_bias: torch.Tensor,
    toks: Segments,
    *,
    fn: str,
    chunk_size: int | None,
    causal: bool = False,
) -> torch.Tensor:
    """``q, k (B, N, Z)``, ``v (B, N, E)``, ``rel_bias (2R - 1,)`` -> ``(B, N, E)`` per sequence (module doc)."""
    acc = acc_dtype(q.dtype)
    b, n, z = q.shape
    longest = int(toks.lengths.max())
    r = max(1, longest if chunk_size is None else min(chunk_size, longest))
    if chunk_size is None and toks.num == 1:
        r = n  # one sequence per row and no chunks: one block, the key padding masked
    r = min(r, n)
    row = torch.arange(n, device=q.device)
    contiguous = _contiguous(toks)
    # neighbouring blocks are needed only when some sequence's chunk straddles a block edge, i.e. a contiguous
    # sequence starts off the block grid (packed rows, left padding): right-padded batches score (B, C, r, r)
    starts = row[None, :].expand(b, n)[(toks.pos == 0) & toks.real]
    wide = r < n and (not contiguous or bool((starts % r).any()))
    blocks = -(-n // r)
    ids = torch.where(toks.real, toks.ids, -1)
    chunk = torch.where(toks.real, toks.pos // r, -1)
    # per sequence its chunk is min(chunk_size, L_s) = chunk_size or L_s: both are what pos // r gives
    qa = F.pad(q.to(acc), (0, 0, 0, blocks * r - n)).unflatten(1, (blocks, r))  # (B, C, r, Z)
    ka, va = (_windows(t.to(acc), r, blocks, wide) for t in (k, v))  # (B, C, w, .)
    kid = _windows(ids, r, blocks, wide, value=-1)  # window padding is no token
    kch = _windows(chunk, r, blocks, wide)
    qid, qch = (F.pad(t, (0, blocks * r - n), value=-1).unflatten(1, (blocks, r)) for t in (ids, chunk))
    allowed = (qid[..., None] == kid[..., None, :]) & (qch[..., None] == kch[..., None, :]) & (qid[..., None] >= 0)
    if contiguous:
        # an allowed pair lies in one contiguous sequence, so p_j - p_i is the distance of its row indices: the
        # causal test and the bias need only (r, w) indices shared by every block and row (the (B, C, r, w) gather
        # below costs, in its backward's scatter, 4x the whole training step)
        qpos = torch.arange(r, device=q.device)[:, None]
        kpos = (torch.arange(3 * r if wide else r, device=q.device) - (r if wide else 0))[None, :]
    else:  # a sequence with holes (a CLS token before left padding): positions within the sequence
        kpos = _windows(toks.pos, r, blocks, wide)[..., None, :]
        qpos = F.pad(toks.pos, (0, blocks * r - n)).unflatten(1, (blocks, r))[..., None]
    if causal:
        allowed = allowed & (kpos <= qpos)
    R = (rel_bias.shape[0] + 1) // 2
    rel = (R - 1 + kpos - qpos).clamp(0, 2 * R - 2)
    bias = rel_bias.to(acc)[rel]  # b[p_j - p_i]; pairs not allowed are masked below
    s = qa @ ka.transpose(-1, -2)
    if fn == "softmax":
        s = (s * z**-0.5 + bias).masked_fill(~allowed, torch.finfo(acc).min)
        w = torch.softmax(s, dim=-1) * allowed
    else:
        count = allowed.sum(-1, keepdim=True).clamp_min(1).to(acc)  # keys in the query's chunk
        w = laplace(s / count + bias) * allowed
    out = (w @ va).flatten(1, 2)[:, :n]
    return (out * toks.real.unsqueeze(-1)).to(v.dtype)
