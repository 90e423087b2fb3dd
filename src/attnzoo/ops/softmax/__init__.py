"""Softmax attention (Vaswani et al., 2017) on ``(B, H, N, P)`` tensors: ``softmax(Q K^T * scale [masked]) V``.

Backends: ``"naive"`` (explicit attention matrix, :mod:`.naive`), ``"torch"`` (``F.scaled_dot_product_attention``,
:mod:`.sdpa`), ``"triton"`` once a ``triton.py`` here exports ``softmax_attention_triton``; ``"auto"`` = Triton on
CUDA when present, else ``"torch"``.
"""
from __future__ import annotations

import torch

from attnzoo._checks import check_overflow
from attnzoo.ops.softmax._common import check_dropout, check_scale, check_tensors, resolve_backend
from attnzoo.ops.softmax.naive import softmax_attention_naive, softmax_attention_weights
from attnzoo.ops.softmax.sdpa import softmax_attention_sdpa

__all__ = ["softmax_attention", "softmax_attention_weights"]


def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    backend: str = "auto",
) -> torch.Tensor:
    """Scaled dot-product attention ``softmax(Q K^T * scale) V`` (Vaswani et al. 2017, eq. 1).

    Shapes: ``q (B, H, Nq, P)``, ``k (B, H, Nk, P)``, ``v (B, H, Nk, Pv)`` -> ``(B, H, Nq, Pv)``.
    ``causal`` masks key ``j > i`` for query ``i`` and needs ``Nq == Nk``. ``scale`` defaults to ``P ** -0.5``.
    ``dropout_p`` drops attention weights (pass 0 at eval time; the op does not look at a module's mode).
    """
    absmax = check_tensors(("q", "k", "v"), (q, k, v), op="softmax_attention")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the head size P: got {tuple(q.shape)} and {tuple(k.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must hold the same number of tokens: got {tuple(k.shape)} and {tuple(v.shape)}")
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"causal softmax attention needs as many queries as keys, got Nq={q.shape[-2]} and Nk={k.shape[-2]}"
        )
    scale = check_scale(scale, q.shape[-1])
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    if absmax:
        # a score q.k * scale beyond float32's range is inf, and softmax turns inf - inf into NaN
        check_overflow("softmax_attention", "q", absmax, absmax["q"] * absmax["k"] * q.shape[-1] * scale, q.dtype,
                       "a score q.k * scale")
    dropout_p = check_dropout("dropout_p", dropout_p)
    kind, fn = resolve_backend("softmax_attention", __name__, backend, q)
    if kind == "naive":
        return softmax_attention_naive(q, k, v, causal=causal, scale=scale, dropout_p=dropout_p)
    if kind == "triton":
        return fn(q, k, v, causal=causal, scale=scale, dropout_p=dropout_p)
    return softmax_attention_sdpa(q, k, v, causal=causal, scale=scale, dropout_p=dropout_p)
