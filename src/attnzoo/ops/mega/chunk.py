"""MEGA attention chunk by chunk: ``(B, C, r, r)`` scores instead of ``(B, N, N)``, O(N r) (MEGA §3.5).

The sequence is zero-padded to ``C = ceil(N / r)`` chunks; padded keys get zero weight (``-inf`` before the
softmax, a zero factor after the Laplace function) and the Laplace scale counts only the real keys of a chunk,
so a ragged last chunk equals the reference's. ``causal``: key ``j <= i`` within the chunk (MEGA-chunk's decoder).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnzoo.ops._dtypes import acc_dtype
from attnzoo.ops._varlen import Segments
from attnzoo.ops.mega.naive import laplace
from attnzoo.ops.mega.varlen import mega_attention_varlen

__all__ = ["mega_attention_chunked"]


def mega_attention_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rel_bias: torch.Tensor,
    *,
    fn: str,
    chunk: int,
    toks: Segments | None = None,
    chunk_size: int | None = None,
    causal: bool = False,
) -> torch.Tensor:
    """``q, k (B, N, Z)``, ``v (B, N, E)``, ``rel_bias (2R - 1,)`` -> ``(B, N, E)``; chunks of ``chunk`` tokens.

    ``toks``: sequences of a padded batch or packed row, chunks of ``chunk_size`` counted from each start."""
    if toks is not None:
        return mega_attention_varlen(q, k, v, rel_bias, toks, fn=fn, chunk_size=chunk_size, causal=causal)
    acc = acc_dtype(q.dtype)
    B, N, Z = q.shape
    E = v.shape[2]
    r = min(chunk, N)
    C = -(-N // r)
    pad = C * r - N
    qa, ka, va = (F.pad(t.to(acc), (0, 0, 0, pad)).reshape(B, C, r, -1) for t in (q, k, v))
    R = (rel_bias.shape[0] + 1) // 2
    i = torch.arange(r, device=q.device)
    bias = rel_bias.to(acc)[R - 1 + i[None, :] - i[:, None]]  # (r, r): b[j - i]
    s = qa @ ka.transpose(-1, -2)
    real = None
    if pad:
        real = (torch.arange(C * r, device=q.device) < N).reshape(C, 1, r)  # (C, 1, r): key j is a token
    if causal:
        # within a chunk key j <= query i; a padded key lies after every real query, so the triangle masks it too
        real = i[None, :] <= i[:, None]
    if fn == "softmax":
        s = s * Z**-0.5 + bias
        if real is not None:
            s = s.masked_fill(~real, float("-inf"))
        w = torch.softmax(s, dim=-1)
    else:
        n = torch.full((C, 1, 1), float(r), device=q.device, dtype=acc)
        if causal:
            n = (i + 1).to(acc)[:, None].expand(C, r, 1)  # query i of a chunk sees i + 1 keys
        elif pad:
            n[-1] = r - pad
        w = laplace(s / n + bias)
        if real is not None:
            w = w * real
    out = (w @ va).reshape(B, C * r, E)[:, :N]
    return out.to(v.dtype)
