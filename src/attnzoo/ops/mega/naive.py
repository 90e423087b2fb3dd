"""Reference MEGA attention (MEGA §3.2-3.3): the full score matrix, a chunk mask, the function.

Scores ``s_ij = q_i . k_j / c + b[j - i]`` for query i and key j in the same chunk of ``chunk`` tokens (§3.5,
"Mega-chunk"; one chunk when there is no chunking) and, when ``causal``, ``j <= i`` (MEGA's decoders), with
``c = sqrt(Z)`` for softmax (q scaled, as MEGA's code does) and ``c = n`` for the Laplace function: the number of
keys query i sees (its chunk; the keys up to i when causal, as MEGA's code divides by its mask's row sums).
Weights are ``softmax_j(s)`` or ``laplace(s) = (1 + erf((s - mu) / (sigma sqrt 2))) / 2`` with ``mu = sqrt(1/2)``,
``sigma = sqrt(1 / (4 pi))`` (MEGA §3.3, Laplace attention); the output is ``sum_j w_ij v_j``.
"""

from __future__ import annotations

import math

import torch

from attnzoo.ops._dtypes import acc_dtype

__all__ = ["mega_attention_naive", "laplace", "LAPLACE_MU", "LAPLACE_SIGMA"]

LAPLACE_MU = math.sqrt(0.5)
LAPLACE_SIGMA = math.sqrt(1.0 / (4.0 * math.pi))


def laplace(s: torch.Tensor) -> torch.Tensor:
    """MEGA's Laplace attention function (§3.3): the normal CDF of mean ``sqrt(1/2)``, std ``1/sqrt(4 pi)``."""
    return 0.5 * (1.0 + torch.erf((s - LAPLACE_MU) / (LAPLACE_SIGMA * math.sqrt(2.0))))


def mega_attention_naive(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rel_bias: torch.Tensor,
    *,
    fn: str,
    chunk: int,
    toks=None,
    chunk_size: int | None = None,
    causal: bool = False,
) -> torch.Tensor:
    """``q, k (B, N, Z)``, ``v (B, N, E)``, ``rel_bias (2R - 1,)`` -> ``(B, N, E)`` with an explicit ``(N, N)`` map.

    ``toks`` (:class:`~attnzoo.ops._varlen.Segments`): every sequence alone (chunks of ``min(chunk_size, L_s)``),
    padding zero."""
    if toks is not None:
        out = torch.zeros_like(v)
        for row, idx in toks.sequences():
            L = idx.numel()
            span = L if chunk_size is None else min(chunk_size, L)
            sub = (t[row : row + 1, idx] for t in (q, k, v))
            out[row, idx] = mega_attention_naive(*sub, rel_bias, fn=fn, chunk=span, causal=causal)[0]
        return out
    acc = acc_dtype(q.dtype)
    qa, ka, va, ba = (t.to(acc) for t in (q, k, v, rel_bias))
    N, Z = q.shape[1], q.shape[2]
    R = (rel_bias.shape[0] + 1) // 2
    i = torch.arange(N, device=q.device)
    block = i // chunk
    same = block[:, None] == block[None, :]  # (N, N): query i and key j share a chunk
    if causal:
        same = same & (i[None, :] <= i[:, None])
    # b[j - i]; pairs in different chunks may lie beyond the bias (R covers a chunk) and are masked below
    bias = ba[(R - 1 + i[None, :] - i[:, None]).clamp(0, 2 * R - 2)]
    if fn == "softmax":
        s = (qa * Z**-0.5) @ ka.transpose(1, 2) + bias
        w = torch.softmax(s.masked_fill(~same, float("-inf")), dim=-1)
    else:
        n = same.sum(-1, keepdim=True).to(acc)  # keys query i sees
        s = qa @ ka.transpose(1, 2) / n + bias
        w = laplace(s) * same
    return (w @ va).to(v.dtype)
