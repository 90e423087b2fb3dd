"""Fast linear attention (Katharopoulos et al., 2020): the ``phi(K)^T V`` factorisation (eq. 5) for the bidirectional
case, and a chunked prefix-state form of the causal case (eqs. 8-10) that never materialises ``O(N P^2)`` states.

Causal: tokens are cut into chunks of ``C``; inside a chunk the masked ``(C, C)`` kernel is explicit, across chunks
each query reads the exclusive prefix state ``S = sum phi(k) v^T`` / ``z = sum phi(k)`` of the previous chunks.
Memory is ``O(N C + (N / C) P Pv)``; states and sums are kept in float32 (or float64) whatever the input dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange

from attnzoo.ops._dtypes import acc_dtype
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
) -> torch.Tensor:
    """``(B, H, N, P), (B, H, N, P), (B, H, N, Pv) -> (B, H, N, Pv)`` in ``O(N)`` time."""
    phi = feature_map_fn(feature_map)
    acc = acc_dtype(q.dtype)
    fq, fk, va = phi(q.to(acc)), phi(k.to(acc)), v.to(acc)
    if not causal:
        kv = torch.einsum("bhnp,bhnv->bhpv", fk, va)
        z = fk.sum(dim=-2)
        num = torch.matmul(fq, kv)
        den = torch.einsum("bhnp,bhp->bhn", fq, z).unsqueeze(-1)
        return (num / (den + eps)).to(v.dtype)

    n = q.shape[-2]
    c = min(n, chunk_size or DEFAULT_CHUNK_SIZE)
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
    out = num / (den + eps).unsqueeze(-1)
    out = rearrange(out, "b h m c v -> b h (m c) v")
    return out[:, :, :n].to(v.dtype)
