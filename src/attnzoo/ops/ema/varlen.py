"""MEGA's EMA on padded batches and packed rows: the recurrence restarts at every sequence start.

Per sequence the state before its first token is zero: ``h_t = alpha beta x_t + q h_{t-1}`` (``q = 1 - alpha
delta``) over its own tokens, and the backward EMA of the bidirectional form runs from its last token to its first.

The FFT path convolves the whole row (padding zeroed) and removes what earlier sequences leaked in. With the row's
unrestarted state ``H_k`` just before sequence ``k`` starts, a token at position ``p`` of sequence ``k`` got
``eta^T (q^{p+1} H_k)`` too much. ``H_k = sum_{j<k} q^{start_k - 1 - end_j} E_j`` from each sequence's restarted
end state ``E_j = sum_{t in j} q^{end_j - t} alpha beta x_t``: one-hot segment sums over tokens and an ``(S, S)``
product over sequences, no loop over sequences. A padded row (one sequence, zeros around it) leaks nothing.
"""

from __future__ import annotations

import torch

from attnzoo.ops._dtypes import acc_dtype
from attnzoo.ops._varlen import Segments

__all__ = ["ema_leak", "holed"]


def holed(toks: Segments) -> bool:
    """Whether a row has padding between its real tokens (the FFT path wants each sequence's tokens side by side)."""
    real = toks.real
    n = real.shape[1]
    tok = torch.arange(n, device=real.device)
    first = torch.where(real, tok, n).amin(-1)
    last = torch.where(real, tok, -1).amax(-1)
    count = real.sum(-1)
    return bool(((count > 0) & (last - first + 1 != count)).any())


def ema_leak(x: torch.Tensor, alpha, delta, beta, eta, ids, pos, lengths) -> torch.Tensor:
    """What the row's unrestarted forward EMA adds at each token from earlier sequences (module doc).

    ``x (B, N, D)`` zero at padding; coefficients ``(D, h)``; ``ids, pos (B, N)``; ``lengths (B, S)`` in row order.
    Returns ``(B, N, D)`` in the accumulation dtype."""
    acc = acc_dtype(x.dtype)
    a, d, b, e = (t.to(acc) for t in (alpha, delta, beta, eta))
    logq = torch.log((1 - a * d).clamp_min(torch.finfo(acc).tiny))  # (D, h)
    num = lengths.shape[1]
    oh = (ids.unsqueeze(-1) == torch.arange(num, device=x.device)).to(acc)  # (B, N, S)
    length = lengths.gather(1, ids.clamp_min(0)).to(acc)
    to_end = torch.exp((length - 1 - pos.to(acc))[..., None, None] * logq)  # (B, N, D, h): q^{end - t}
    ends = torch.einsum("bns,bnd,bndh->bsdh", oh, x.to(acc), to_end) * (a * b)  # E_j
    cu = torch.cat([lengths.new_zeros(lengths.shape[0], 1), lengths.cumsum(-1)], dim=-1)
    gap = (cu[:, :-1, None] - cu[:, None, 1:]).to(acc)  # (B, S_k, S_j): start_k - 1 - end_j
    before = torch.ones(num, num, device=x.device).tril(-1).bool()  # j < k
    carry = torch.exp(gap.clamp_min(0)[..., None, None] * logq) * before[..., None, None]
    starts = torch.einsum("bkjdh,bjdh->bkdh", carry, ends)  # H_k
    from_start = torch.exp((pos.to(acc) + 1)[..., None, None] * logq)  # q^{p + 1}
    return torch.einsum("bns,bsdh,bndh,dh->bnd", oh, starts, from_start, e)
