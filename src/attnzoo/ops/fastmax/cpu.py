"""The fused CPU kernel of the unmasked p=1 Fastmax forward (``cpu.cpp``) as an autograd op.

The kernel standardises q and k (eqs 5-6), sums the moments of eqs 28-29 and writes the output of eqs 11-12 in
two reads of the inputs. For training it also hands back what the backward reads: the standardised ``qs``,
``k_hat``, their per-token mean and rstd, and the moments ``M``. The backward is FAST §2.5's (the PyTorch
:func:`~attnzoo.ops.fastmax.chunk.unmasked_backward`, which reuses ``M``) followed by the layer norm's
backward for the standardisation.
"""

from __future__ import annotations

import torch

from attnzoo.ops import _cpu_kernels
from attnzoo.ops.fastmax.chunk import unmasked_backward
from attnzoo.ops.fastmax.common import EPS

__all__ = ["fastmax_p1_cpu", "fastmax_p1_segments_cpu", "simd_kernel"]


def simd_kernel() -> bool:
    """Whether the loaded kernel is the vector (AVX-512) build; the portable build is slower than PyTorch."""
    kernels = _cpu_kernels.cpu_kernels()
    return kernels is not None and bool(kernels.fastmax_p1_simd())


class _FastmaxP1CPU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float):
        kernels = _cpu_kernels.required_cpu_kernels()
        save = any(ctx.needs_input_grad[:3])
        res = kernels.fastmax_p1_unmasked(q, k, v, scale, EPS, save)
        out, den, seen = res[:3]
        if save:
            qs, kh, moments, m = res[3:]
            ctx.save_for_backward(q, k, v, qs, kh, moments, m, out, den)
            ctx.scale = scale
        ctx.mark_non_differentiable(seen)
        return out, seen

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout: torch.Tensor, _dseen):
        q, k, v, qs, kh, mo, m, out, den = ctx.saved_tensors
        d = q.shape[-1]
        m1 = m[..., :d, :].reshape(-1, d, m.shape[-1])  # [K^T V | sum_n k_hat_n] (BH, D, Dv + 1)
        dqs, dkh, dv = unmasked_backward(qs, kh, v, out, den, dout.contiguous(), 1, m1=m1)
        mask = [True, False, False]
        dq = dk = None
        if ctx.needs_input_grad[0]:
            w = q.new_full((d,), ctx.scale)
            dq = torch.ops.aten.native_layer_norm_backward(dqs, q.contiguous(), [d], mo[0], mo[1], w, None, mask)[0]
        if ctx.needs_input_grad[1]:
            dk = torch.ops.aten.native_layer_norm_backward(dkh, k.contiguous(), [d], mo[2], mo[3], None, None, mask)[0]
        return dq, dk, dv if ctx.needs_input_grad[2] else None, None


def fastmax_p1_cpu(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unmasked p=1 Fastmax on CPU: ``q, k (B, H, N, D)``, ``v (B, H, N, Dv)`` (float32/float64, raw, not yet
    standardised) -> ``out (B, H, N, Dv)`` and ``seen (B*H, 8)``: per (b, h) max |x| and a value that is NaN
    exactly when NaN/Inf was read, for q, k, v and out in turn (the caller raises; see :func:`attnzoo.ops.fastmax`)."""
    q, k, v = (t if t.shape[-1] == 1 or t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _FastmaxP1CPU.apply(q, k, v, scale)
    out, _, seen = _cpu_kernels.required_cpu_kernels().fastmax_p1_unmasked(q, k, v, scale, EPS, False)
    return out, seen


def fastmax_p1_segments_cpu(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, ids: torch.Tensor, num: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`fastmax_p1_cpu` (inference only) over padded batches / packed rows: ``ids (B, N)`` int64, each token's
    sequence within its row (``-1`` at padding, :class:`~attnzoo.ops._varlen.Segments`), ``num`` sequences per row
    at most; each query's moments run over its own sequence's real keys, padding outputs zero."""
    q, k, v = (t if t.shape[-1] == 1 or t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    kernels = _cpu_kernels.required_cpu_kernels()
    out, seen = kernels.fastmax_p1_segments(q, k, v, ids.contiguous(), num, scale, EPS)
    return out, seen
