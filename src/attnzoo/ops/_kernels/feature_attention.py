"""The fused CPU kernel of feature-map attention (``feature_attention.cpp``), unmasked or over padded batches /
packed rows, as an autograd op: linear attention's backend ``"cpu"``, and with Fastmax's polynomial features
(FAST eqs 24-27) Fastmax's masked calls.

One call computes ``phi`` of q and k, the moment sums and the output per (row, sequence, head) task, in one
parallel loop over all of them: no Python loop over sequences, no padding, no slices. The backward (also C++)
recomputes the moments from q, k, v (causal: a prefix sweep for dq and a suffix sweep for dk, dv) and reads the
forward's output and divisors; padding gets zero output and zero gradients.
"""

from __future__ import annotations

import torch

from attnzoo.ops import _cpu_kernels

__all__ = ["feature_attention_cpu", "kernel_covers", "MAPS"]

#: the kernel's feature maps (``Map`` in feature_attention.cpp): ``phi(q) . phi(k)`` is the attention weight
MAPS = {"elu": 0, "relu": 1, "fastmax1": 2, "fastmax2": 3}


def kernel_covers(q: torch.Tensor) -> bool:
    """Whether the kernel takes the call: float32/float64 CPU tensors, outside torch.compile (it is opaque)."""
    return q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64) and not torch.compiler.is_compiling()


class _FeatureAttentionCPU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ids, causal: bool, mode: int, eps: float):
        out, den = _cpu_kernels.required_cpu_kernels().linear_forward(q, k, v, ids, causal, mode, eps)
        ctx.save_for_backward(q, k, v, out, den, ids)
        ctx.causal, ctx.mode = causal, mode
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        q, k, v, out, den, ids = ctx.saved_tensors
        grads = _cpu_kernels.required_cpu_kernels().linear_backward(
            q, k, v, out, den, dout.contiguous(), ids, ctx.causal, ctx.mode
        )
        return *(g if need else None for g, need in zip(grads, ctx.needs_input_grad[:3], strict=True)), *[None] * 4


def feature_attention_cpu(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    feature_map: str,
    eps: float,
    ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out_i = sum_j (phi(q_i) . phi(k_j)) v_j / (sum_j phi(q_i) . phi(k_j) + eps)`` over the query's own sequence
    (``j <= i`` when causal), ``phi`` one of :data:`MAPS`: ``q, k (B, H, N, D)``, ``v (B, H, N, R)`` (float32/float64,
    one dtype; views with unit stride over the last dim are read in place) -> ``(B, H, N, R)``. ``ids (B, N)``
    int64: each token's sequence within its row, ``-1`` at padding (:class:`~attnzoo.ops._varlen.Segments`), or
    ``None`` (each row one sequence)."""
    q, k, v = (_cpu_kernels.unit_stride(t) for t in (q, k, v))
    ids = None if ids is None else ids.to(device=q.device, dtype=torch.long).contiguous()
    mode = MAPS[feature_map]
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _FeatureAttentionCPU.apply(q, k, v, ids, causal, mode, float(eps))
    return _cpu_kernels.required_cpu_kernels().linear_forward(q, k, v, ids, causal, mode, float(eps))[0]
