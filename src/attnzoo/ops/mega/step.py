"""One query of MEGA's causal attention against a key/value cache (MEGA §3.2-3.3, §3.5): the decoding step.

The query at position ``p`` (counted from its sequence's start) reads the cached keys at positions ``p_j <= p`` of
its own chunk, ``p_j // r == p // r`` (MEGA-chunk's decoder drops its cache at each chunk boundary), with the
relative bias ``b[p_j - p]``: the last row of the causal forward's score matrix, as MEGA's code takes ``bias[-1:]``
when it decodes. Softmax scales ``q`` by ``Z^-1/2``; the Laplace function divides by the number of keys it reads.
"""

from __future__ import annotations

import torch

from attnzoo.ops._dtypes import acc_dtype
from attnzoo.ops.mega.naive import laplace

__all__ = ["mega_attention_step"]


def mega_attention_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rel_bias: torch.Tensor,
    key_pos: torch.Tensor,
    pos: torch.Tensor,
    *,
    fn: str,
    chunk: int | None,
) -> torch.Tensor:
    """``q (B, 1, Z)`` against the cache ``k (B, T, Z)``, ``v (B, T, E)`` -> ``(B, 1, E)``.

    ``key_pos (B, T)`` long: each cached key's position in its sequence (``-1``: no key, a padded slot);
    ``pos (B,)`` long: the query's position; ``chunk``: MEGA-chunk's ``r`` (``None``: one chunk)."""
    acc = acc_dtype(q.dtype)
    qa, ka, va = (t.to(acc) for t in (q, k, v))
    start = torch.zeros_like(pos) if chunk is None else pos - pos % chunk  # the first position of the query's chunk
    seen = (key_pos >= start[:, None]) & (key_pos <= pos[:, None]) & (key_pos >= 0)  # (B, T)
    R = (rel_bias.shape[0] + 1) // 2
    rel = (R - 1 + key_pos - pos[:, None]).clamp(0, 2 * R - 2)
    bias = rel_bias.to(acc)[rel]  # (B, T): b[p_j - p]; keys not seen are masked below
    s = (qa @ ka.transpose(1, 2))[:, 0]  # (B, T)
    if fn == "softmax":
        # a finite fill: a padding token's query sees no key at all, and its weights must be zeros, not NaN
        s = (s * q.shape[2] ** -0.5 + bias).masked_fill(~seen, torch.finfo(acc).min)
        w = torch.softmax(s, dim=-1) * seen
    else:
        count = seen.sum(-1, keepdim=True).clamp_min(1).to(acc)
        w = laplace(s / count + bias) * seen
    return (w[:, None] @ va).to(v.dtype)
