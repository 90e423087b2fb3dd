"""CSP on padded batches and packed rows (issue 27): shifts and group sorts within each sequence's real tokens.

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
from attnzoo.ops.csp.gather import _TokenPermute

__all__ = ["csp_varlen", "csp_varlen_source_index", "token_shifts"]


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
        start = (tok - pos).unsqueeze(-1)
        src = start + torch.remainder(pos.unsqueeze(-1) - token_shifts(shifts, toks), length.unsqueeze(-1))
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
    permutation (:class:`~attnzoo.ops.csp.gather._TokenPermute`)."""
    out = _TokenPermute.apply(v, csp_varlen_source_index(v, shifts, toks, groups))
    return out * toks.real.unsqueeze(-1).to(v.dtype)
