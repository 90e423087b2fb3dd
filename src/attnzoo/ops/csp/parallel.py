"""Fast CSP (CSP eq 4): one source index per output entry from shift + group sort, then one gather.

Cost is O(B·N·C·log(N/K)) time and O(B·N·C) memory (no N x N maps); groups of size 2 use a
comparison ("min-max", §3.2.1) instead of a sort and groups of size 1 are a pure circular shift.
"""

from __future__ import annotations

import torch

__all__ = ["csp_gather", "csp_general", "csp_source_index"]


def csp_source_index(v: torch.Tensor, shifts: torch.Tensor, groups: int) -> torch.Tensor:
    """Index ``(B, N, C)`` with ``csp(v)[b, i, c] = v[b, idx[b, i, c], c]``, i.e. ``P_c[i, idx] = 1`` (eq 5).

    ``v`` ``(B, N, C)``; ``shifts`` LongTensor ``(C,)`` on ``v.device``; ``N % groups == 0``. Ties are
    broken by token position (stable sort), as in the naive reference.
    """
    B, N, C = v.shape
    K = groups
    G = N // K
    with torch.no_grad():
        pos = torch.arange(N, device=v.device)
        # (S_J v)[m] = v[(m - J) mod N]  (eq 3)
        shift_src = torch.remainder(pos[:, None] - shifts[None, :], N).expand(B, N, C)
        if G == 1:
            return shift_src.contiguous()
        u = v.detach().gather(1, shift_src).view(B, K, G, C)
        if G == 2:
            # Output slot 0 takes the smaller value unless the reference is descending in this pair;
            # strict ">" reproduces the stable-sort tie rule (equal values keep their order).
            ref_desc = u[:, :, 0, :1] > u[:, :, 1, :1]  # (B, K, 1)
            chan_desc = u[:, :, 0, :] > u[:, :, 1, :]  # (B, K, C)
            first = (chan_desc ^ ref_desc).long()
            local = torch.stack((first, 1 - first), dim=2)  # (B, K, 2, C)
        else:
            order = torch.argsort(u, dim=2, stable=True)  # (B, K, G, C): r-th smallest per channel
            order_ref = order[..., 0]  # (B, K, G)
            rank_ref = torch.empty_like(order_ref).scatter_(
                2, order_ref, torch.arange(G, device=v.device).expand(B, K, G)
            )
            # slot i of channel c receives the rank_ref[i]-th smallest of that channel
            local = order.gather(2, rank_ref[..., None].expand(B, K, G, C))
        within = (local + (torch.arange(K, device=v.device) * G)[None, :, None, None]).view(B, N, C)
        return shift_src.gather(1, within)


class _TokenPermute(torch.autograd.Function):
    """``y = v.gather(1, idx)`` for a per-(b, c) permutation ``idx``; backward gathers with the inverse."""

    @staticmethod
    def forward(ctx, v: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(idx)
        return v.gather(1, idx)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (idx,) = ctx.saved_tensors
        N = idx.shape[1]
        # A permutation's adjoint is its inverse: a gather, so no (nondeterministic) scatter-add is needed.
        inv = torch.empty_like(idx).scatter_(1, idx, torch.arange(N, device=idx.device)[None, :, None].expand_as(idx))
        return _TokenPermute.apply(grad, inv), None


def csp_gather(v: torch.Tensor, shifts: torch.Tensor, groups: int) -> torch.Tensor:
    """CSP eq 4 ``||_c GSort_K(S_{J_c} v_c)`` for ``v`` ``(B, N, C)`` -> ``(B, N, C)``, vectorised over b, c, k.

    Groups of 1, 2, 3, 4 or 8 tokens take the compare-and-swap / sorting-network path of
    :mod:`attnzoo.ops.csp.small` (same values, gradients and tie rule, no int64 index tensor).
    """
    from attnzoo.ops.csp.small import SMALL_GROUP_SIZES, csp_small_groups

    group_size = v.shape[1] // groups
    # the small-group path writes into strided slices (out=), which torch.compile cannot trace: compiled graphs
    # take the general gather, which computes the same values
    if group_size in SMALL_GROUP_SIZES and not torch.compiler.is_compiling():
        return csp_small_groups(v, shifts, group_size)
    return csp_general(v, shifts, groups)


def csp_general(v: torch.Tensor, shifts: torch.Tensor, groups: int) -> torch.Tensor:
    """CSP eq 4 for any group size: an int64 source index ``(B, N, C)`` (:func:`csp_source_index`), then one
    gather; the path every group size took before the small-group and fused paths (``attnzoo bench`` times
    them against it)."""
    return _TokenPermute.apply(v, csp_source_index(v, shifts, groups))
