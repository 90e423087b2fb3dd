"""Fast linear attention (Katharopoulos et al., 2020): the ``phi(K)^T V`` factorisation (eq. 5) for the bidirectional
case, and a chunked prefix-state form of the causal case (eqs. 8-10) that never materialises ``O(N P^2)`` states.

Causal: tokens are cut into chunks of ``C``; inside a chunk the masked ``(C, C)`` kernel is explicit, across chunks
each query reads the exclusive prefix state ``S = sum phi(k) v^T`` / ``z = sum phi(k)`` of the previous chunks.
Memory is ``O(N C + (N / C) P Pv)``; states and sums are kept in float32 (or float64) whatever the input dtype.
Padded batches and packed rows run vectorised, without a loop over sequences: one-hot segment sums (non-causal) and a
segmented scan over chunks (causal). The CPU's ``"auto"`` takes the fused kernel (:mod:`.cpu`) instead; this path
serves GPUs, half precision and torch.compile.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange

from attnzoo.ops._dtypes import acc_dtype
from attnzoo.ops._segment_ops import apply_per_segment, real_4d, segment_onehot, zero_padding
from attnzoo.ops._varlen import Segments, segments
from attnzoo.ops.linear.naive import feature_map_fn

__all__ = ["linear_attention_chunk", "DEFAULT_CHUNK_SIZE"]

DEFAULT_CHUNK_SIZE = 64


def _exclusive_cumsum(x: torch.Tensor, dim: int) -> torch.Tensor:
    # Shift then sum (rather than cumsum(x) - x) so each prefix is an exact sum of earlier terms only.
    zero = torch.zeros_like(x.narrow(dim, 0, 1))
    return torch.cat([zero, x.narrow(dim, 0, x.shape[dim] - 1)], dim=dim).cumsum(dim=dim)


def linear_attention_chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    feature_map: str = "elu",
    eps: float = 1e-6,
    chunk_size: int | None = None,
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(B, H, N, P), (B, H, N, P), (B, H, N, Pv) -> (B, H, N, Pv)`` in ``O(N)`` time.

    With ``attention_mask``/``cu_seqlens`` see :func:`_segment_noncausal` and :func:`_segment_causal`."""
    phi = feature_map_fn(feature_map)
    acc = acc_dtype(q.dtype)
    seg = segments(q.shape[0], q.shape[2], attention_mask=attention_mask, cu_seqlens=cu_seqlens, device=q.device)
    c = min(q.shape[-2], chunk_size or DEFAULT_CHUNK_SIZE)
    fq, fk, va = phi(q.to(acc)), phi(k.to(acc)), v.to(acc)
    if seg is not None:
        if attention_mask is None:  # a packed row: no padding to zero (three passes fewer)
            num, den = _segment_causal(fq, fk, va, seg, c) if causal else _segment_noncausal(fq, fk, va, seg)
            return (num / (den + eps).unsqueeze(-1)).to(v.dtype)
        real = real_4d(seg)
        zero = torch.zeros((), dtype=acc, device=q.device)
        # padding zeroed before any sum: its (loud) values never meet the arithmetic, and it gets zero gradient
        fq, fk, va = (torch.where(real, t, zero) for t in (fq, fk, va))
        num, den = _segment_causal(fq, fk, va, seg, c) if causal else _segment_noncausal(fq, fk, va, seg)
        den = torch.where(seg.real[:, None, :], den + eps, 1.0)  # padding rows: never 0 / 0, even with eps = 0
        return zero_padding(num / den.unsqueeze(-1), seg).to(v.dtype)
    return _unmasked(fq, fk, va, causal, c, eps).to(v.dtype)


def _unmasked(fq: torch.Tensor, fk: torch.Tensor, va: torch.Tensor, causal: bool, c: int, eps: float) -> torch.Tensor:
    """Eqs. 5-6 (causal 8-10) on features ``phi(q), phi(k)`` and values: ``(B, H, N, Pv)``."""
    if not causal:
        kv = torch.einsum("bhnp,bhnv->bhpv", fk, va)
        z = fk.sum(dim=-2)
        num = torch.matmul(fq, kv)
        den = torch.einsum("bhnp,bhp->bhn", fq, z).unsqueeze(-1)
        return num / (den + eps)
    num, den = _causal_moments(fq, fk, va, min(fq.shape[-2], c))
    return num / (den + eps).unsqueeze(-1)


def _causal_moments(fq: torch.Tensor, fk: torch.Tensor, va: torch.Tensor, c: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal numerator ``phi(q_i)^T sum_{j <= i} phi(k_j) v_j^T`` ``(B, H, N, Pv)`` and denominator ``phi(q_i)^T
    sum_{j <= i} phi(k_j)`` ``(B, H, N)``: explicit masked kernel inside chunks of ``c``, prefix states across."""
    n = fq.shape[-2]
    pad = (-n) % c
    if pad:
        # Zero features at the end: padded keys/values add nothing, padded queries are sliced off below.
        fq, fk, va = (F.pad(t, (0, 0, 0, pad)) for t in (fq, fk, va))
    fq, fk, va = (rearrange(t, "b h (m c) p -> b h m c p", c=c) for t in (fq, fk, va))

    s = _exclusive_cumsum(torch.einsum("bhmcp,bhmcv->bhmpv", fk, va), dim=2)  # (B, H, M, P, Pv)
    z = _exclusive_cumsum(fk.sum(dim=-2), dim=2)  # (B, H, M, P)
    intra = torch.tril(torch.matmul(fq, fk.transpose(-1, -2)))  # (B, H, M, C, C)
    num = torch.matmul(fq, s) + torch.matmul(intra, va)
    den = torch.einsum("bhmcp,bhmp->bhmc", fq, z) + intra.sum(dim=-1)
    return rearrange(num, "b h m c v -> b h (m c) v")[:, :, :n], rearrange(den, "b h m c -> b h (m c)")[:, :, :n]


def _segment_noncausal(
    fq: torch.Tensor, fk: torch.Tensor, va: torch.Tensor, seg: Segments
) -> tuple[torch.Tensor, torch.Tensor]:
    """Numerator ``phi(q_i)^T sum_{j: s(j) = s(i)} phi(k_j) v_j^T`` ``(B, H, N, Pv)`` and denominator
    ``phi(q_i)^T sum_{j: s(j) = s(i)} phi(k_j)`` ``(B, H, N)``, by one-hot segment sums."""
    if seg.num == 1:
        kv = torch.matmul(fk.transpose(-1, -2), va)  # (B, H, P, Pv)
        z = fk.sum(dim=-2)
        return torch.matmul(fq, kv), torch.einsum("bhnp,bhp->bhn", fq, z)
    onehot = segment_onehot(seg, fk.dtype)  # (B, N, S)
    kv = torch.einsum("bns,bhnp,bhnv->bhspv", onehot, fk, va)  # (B, H, S, P, Pv)
    z = torch.einsum("bns,bhnp->bhsp", onehot, fk)
    b, h, n, p = fq.shape
    z_tok = z.gather(2, seg.ids.clamp_min(0)[:, None, :, None].expand(b, h, n, p))  # each token's own sequence
    return apply_per_segment(fq, kv, seg), (fq * z_tok).sum(dim=-1)


def _segmented_cumsum(x: torch.Tensor, reset: torch.Tensor) -> torch.Tensor:
    """Inclusive scan ``h_m = x_m + (0 if reset_m else h_{m-1})`` along axis 2 of ``x (B, H, M, ...)``, ``reset (B,
    M)`` bool; Hillis-Steele in ``log2 M`` vectorised steps, sums of the terms themselves (no differences of long
    prefix sums, which would cancel)."""
    m = x.shape[2]
    extra = (1,) * (x.ndim - 3)
    x = x.clone()  # updated in place below: one pass per step fewer than rebuilding it
    d = 1
    while d < m:
        keep = (~reset[:, d:]).to(x.dtype).reshape(reset.shape[0], 1, m - d, *extra)
        x[:, :, d:] += x[:, :, :-d] * keep  # the product is a new tensor: it reads the previous step's values
        reset = torch.cat([reset[:, :d], reset[:, d:] | reset[:, :-d]], dim=1)
        d *= 2
    return x


def _segment_causal(
    fq: torch.Tensor, fk: torch.Tensor, va: torch.Tensor, seg: Segments, c: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal numerator ``phi(q_i)^T sum_{j <= i, s(j) = s(i)} phi(k_j) v_j^T`` ``(B, H, N, Pv)`` and denominator
    (the same sum of ``phi(k_j)``) ``(B, H, N)``, in chunks of ``c`` tokens.

    Inside a chunk the ``(c, c)`` kernel is masked to ``j <= i`` of the same sequence. Across chunks a token only
    needs the state of its own sequence from earlier chunks, and only the sequence open at a chunk's end continues
    into the next: ``h_m`` = that sequence's state up to the end of chunk ``m``, restarted in every chunk where a
    sequence starts (segmented scan); a token reads ``h_{m-1}`` when its sequence started before its chunk.
    Padding features are zero, so padding adds nothing to any sum.
    """
    if seg.num == 1:
        # one sequence per row (a padded batch): with zero padding features the plain prefix states are its own
        return _causal_moments(fq, fk, va, c)
    b, n = seg.ids.shape
    tok = torch.arange(n, device=seg.ids.device)
    # the index of the first token of each token's sequence (-1 before a row's first real token)
    start = torch.where(seg.real & (seg.pos == 0), tok, -1).cummax(dim=1).values
    pad = (-n) % c
    if pad:
        fq, fk, va = (F.pad(t, (0, 0, 0, pad)) for t in (fq, fk, va))
        start = F.pad(start, (0, pad), value=-2)  # a sequence of its own: reads nothing, adds nothing (zero features)
    fq, fk, va = (rearrange(t, "b h (m c) p -> b h m c p", c=c) for t in (fq, fk, va))
    start = start.view(b, -1, c)  # (B, M, C)
    first = torch.arange(start.shape[1], device=start.device)[None, :, None] * c  # each chunk's first token

    same = (start[..., :, None] == start[..., None, :]) & torch.ones(c, c, dtype=torch.bool, device=start.device).tril()
    intra = torch.matmul(fq, fk.transpose(-1, -2)).masked_fill(~same[:, None], 0.0)  # (B, H, M, C, C)

    last = start[..., -1:]  # the sequence open at the chunk's end
    fk_tail = fk * (start == last)[:, None, ..., None].to(fk.dtype)
    reset = (last >= first)[..., 0]
    h_s = _segmented_cumsum(torch.einsum("bhmcp,bhmcv->bhmpv", fk_tail, va), reset)  # (B, H, M, P, Pv)
    h_z = _segmented_cumsum(fk_tail.sum(dim=-2), reset)  # (B, H, M, P)
    carry_s = torch.cat([torch.zeros_like(h_s[:, :, :1]), h_s[:, :, :-1]], dim=2)
    carry_z = torch.cat([torch.zeros_like(h_z[:, :, :1]), h_z[:, :, :-1]], dim=2)
    fq_read = fq * (start < first)[:, None, ..., None].to(fq.dtype)  # its sequence began in an earlier chunk
    num = torch.matmul(intra, va) + torch.matmul(fq_read, carry_s)
    den = intra.sum(dim=-1) + torch.einsum("bhmcp,bhmp->bhmc", fq_read, carry_z)
    return rearrange(num, "b h m c v -> b h (m c) v")[:, :, :n], rearrange(den, "b h m c -> b h (m c)")[:, :, :n]
