"""Softmax attention (Vaswani et al., 2017) on ``(B, H, N, P)`` tensors: ``softmax(Q K^T * scale [masked]) V``.

Backends (:data:`SOFTMAX`): ``"naive"`` (explicit attention matrix, :mod:`.naive`), ``"torch"``
(``F.scaled_dot_product_attention``, :mod:`.sdpa`); ``"auto"`` follows :mod:`attnzoo.ops._dispatch`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnzoo._checks import (
    check_bool,
    check_dropout,
    check_optional_scale,
    check_overflow,
    check_probability,
    check_scale,
)
from attnzoo.ops._dispatch import call_backend
from attnzoo.ops._spec import BenchCase, Card, Mechanism, ProjectionOptions, Projections, op_backends, option
from attnzoo.ops._tensor_validation import check_qkv
from attnzoo.ops.softmax.naive import softmax_attention_naive, softmax_attention_weights  # noqa: F401
from attnzoo.ops.softmax.parallel import softmax_attention_sdpa  # noqa: F401  (the spec's backends look it up here)

__all__ = ["softmax_attention", "softmax_attention_weights", "SoftmaxOptions", "SOFTMAX"]


@dataclass(frozen=True)
class SoftmaxOptions(ProjectionOptions):
    """Options of softmax attention (ViT / DeiT / nanoGPT layout)."""

    attn_dropout: float = option(0.0, check_probability, "dropout on the attention weights (training only)")
    scale: float | None = option(None, check_optional_scale, "score scale; None -> head_dim ** -0.5")


# The backends are looked up in this package at call time (so ``softmax_attention_sdpa`` may be replaced here).
SOFTMAX = Mechanism(
    op="softmax_attention",
    options=SoftmaxOptions,
    backends=op_backends(softmax_attention_naive, softmax_attention_sdpa),
    causal=True,
    state=dict,  # the KV cache {"k", "v"}
    checks="attnzoo.ops.softmax.selftest_cases",
    projections=Projections(
        qkv="qkv", out="proj", follows=("qkv_bias", "proj_bias", "scale", "attn_dropout", "proj_dropout")
    ),
    bench=(
        BenchCase("softmax", "attnzoo.ops.softmax.bench:softmax", causal=True, module={}, decode=True, speed_unit=True),
        BenchCase("softmax_explicit", "attnzoo.ops.softmax.bench:softmax_explicit", default=False, causal=True),
    ),
    card=Card("Vaswani et al. 2017 (baseline; SDPA fast path)", "O(N²)", "O(N) with SDPA", causal="KV-cache decoding"),
    order=0,
)


def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    backend: str = "auto",
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention ``softmax(Q K^T * scale) V`` (Vaswani et al. 2017, eq. 1).

    Shapes: ``q (B, H, Nq, P)``, ``k (B, H, Nk, P)``, ``v (B, H, Nk, Pv)`` -> ``(B, H, Nq, Pv)``.
    ``causal`` masks key ``j > i`` for query ``i`` and needs ``Nq == Nk``. ``scale`` defaults to ``P ** -0.5``.
    ``dropout_p`` drops attention weights (pass 0 at eval time; the op does not look at a module's mode).
    ``attention_mask`` ``(B, N)`` (True/1 = real token) or ``cu_seqlens`` (offsets of sequences packed in one row,
    ``B = 1``), self-attention only (``Nq == Nk``): query ``i`` of sequence ``s(i)`` attends to the real keys of
    its own sequence, ``out_i = sum_{j: s(j) = s(i)} softmax_j(q_i k_j^T * scale [j <= i]) v_j``, i.e. each
    sequence as if alone; padding positions give 0.
    """
    absmax = check_qkv(q, k, v, op="softmax_attention", same_n=False)
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"causal softmax attention needs as many queries as keys, got Nq={q.shape[-2]} and Nk={k.shape[-2]}"
        )
    scale = check_scale(scale, q.shape[-1])
    check_bool("causal", causal)
    if absmax:
        # a score q.k * scale beyond float32's range is inf, and softmax turns inf - inf into NaN
        check_overflow(
            "softmax_attention",
            "q",
            absmax,
            absmax["q"] * absmax["k"] * q.shape[-1] * scale,
            q.dtype,
            "a score q.k * scale",
        )
    dropout_p = check_dropout("dropout_p", dropout_p)
    if (attention_mask is not None or cu_seqlens is not None) and q.shape[-2] != k.shape[-2]:
        raise ValueError(
            "attention_mask/cu_seqlens describe the tokens of self-attention and need as many queries as keys, "
            f"got Nq={q.shape[-2]} and Nk={k.shape[-2]}"
        )
    return call_backend(
        SOFTMAX,
        backend,
        (q, k, v),
        name="q",
        causal=causal,
        scale=scale,
        dropout_p=dropout_p,
        attention_mask=attention_mask,
        cu_seqlens=cu_seqlens,
    )
