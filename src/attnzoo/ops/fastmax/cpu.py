"""The fused CPU kernel of the p=1 Fastmax (``cpu.cpp``), unmasked or over padded batches / packed rows, as an
autograd op.

The kernel standardises q and k (eqs 5-6), sums the moments of eqs 28-29 and writes the output of eqs 11-12 in
two reads of the inputs. For training it also hands back what the backward reads: the standardised ``qs``,
``k_hat``, their per-token mean and rstd, and each sequence's moments ``M``. The backward (also C++) is FAST
§2.5's in moment form (as :func:`~attnzoo.ops.fastmax.chunk.unmasked_backward`, reusing ``M``) fused with the
layer norms' backward for the standardisation, and writes zero gradients at padding.
"""

from __future__ import annotations

import torch

from attnzoo.ops import _cpu_kernels
from attnzoo.ops.fastmax.common import EPS

__all__ = ["fastmax_p1_cpu", "fastmax_p1_segments_cpu", "simd_kernel"]


def simd_kernel() -> bool:
    """Whether the loaded kernel is the vector (AVX-512) build; the portable build is slower than PyTorch."""
    kernels = _cpu_kernels.cpu_kernels()
    return kernels is not None and bool(kernels.fastmax_p1_simd())


class _FastmaxP1CPU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, ids, num: int):
        kernels = _cpu_kernels.required_cpu_kernels()
        save = any(ctx.needs_input_grad[:3])
        if ids is None:
            res = kernels.fastmax_p1_unmasked(q, k, v, scale, EPS, save)
        else:
            res = kernels.fastmax_p1_segments(q, k, v, ids, num, scale, EPS, save)
        out, den, seen = res[:3]
        if save:
            ctx.save_for_backward(v, out, den, ids, *res[3:])
            ctx.scale, ctx.num = scale, num
        ctx.mark_non_differentiable(seen)
        return out, seen

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout: torch.Tensor, _dseen):
        v, out, den, ids, qs, kh, moments, m = ctx.saved_tensors
        if dout.shape[-1] != 1 and dout.stride(-1) != 1:
            dout = dout.contiguous()
        grads = _cpu_kernels.required_cpu_kernels().fastmax_p1_backward(
            qs, kh, moments, m, v, out, den, dout, ids, ctx.num, ctx.scale
        )
        return *(g if need else None for g, need in zip(grads, ctx.needs_input_grad[:3], strict=True)), None, None, None


def _run(q, k, v, scale: float, ids, num: int) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, v = (_cpu_kernels.unit_stride(t) for t in (q, k, v))
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _FastmaxP1CPU.apply(q, k, v, scale, ids, num)
    kernels = _cpu_kernels.required_cpu_kernels()
    if ids is None:
        out, _, seen = kernels.fastmax_p1_unmasked(q, k, v, scale, EPS, False)
    else:
        out, _, seen = kernels.fastmax_p1_segments(q, k, v, ids, num, scale, EPS, False)
    return out, seen


def fastmax_p1_cpu(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unmasked p=1 Fastmax on CPU: ``q, k (B, H, N, D)``, ``v (B, H, N, Dv)`` (float32/float64, raw, not yet
    standardised) -> ``out (B, H, N, Dv)`` and ``seen (B*H, 8)``: per (b, h) max |x| and a value that is NaN
    exactly when NaN/Inf was read, for q, k, v and out in turn (the caller raises; see :func:`attnzoo.ops.fastmax`)."""
    return _run(q, k, v, scale, None, 1)


def fastmax_p1_segments_cpu(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, ids: torch.Tensor, num: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`fastmax_p1_cpu` over padded batches / packed rows: ``ids (B, N)`` int64, each token's sequence within
    its row (``-1`` at padding, :class:`~attnzoo.ops._varlen.Segments`), ``num`` sequences per row at most; each
    query's moments run over its own sequence's real keys, padding outputs (and gradients) zero."""
    return _run(q, k, v, scale, ids.contiguous(), num)
