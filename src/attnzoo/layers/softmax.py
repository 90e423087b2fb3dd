"""Multi-head softmax self-attention (Vaswani et al., 2017) with the ViT / DeiT / nanoGPT parameter layout."""

from __future__ import annotations

import functools
from typing import Callable

import torch
import torch.nn.functional as F

from attnzoo._checks import check_scale
from attnzoo.layers.base import (  # noqa: F401  (check_step_input, check_kv_cache: re-exported, their first home)
    Attention,
    Masks,
    QKVProjection,
    RecurrentMixin,
    check_kv_cache,
    check_step_input,
    register_attention,
)
from attnzoo.ops._segment_ops import attention_allowed, zero_padding_tokens
from attnzoo.ops._varlen import check_attention_mask, segments
from attnzoo.ops.softmax import SOFTMAX, SoftmaxOptions, softmax_attention, softmax_attention_weights

__all__ = ["SoftmaxAttention", "attend_cache", "attend_recorded", "cache_mask", "check_prefill"]


@register_attention("softmax")
class SoftmaxAttention(QKVProjection, Attention, RecurrentMixin):
    """Softmax attention ``proj(concat_h softmax(q_h k_h^T * scale [masked]) v_h)`` (Vaswani et al. 2017, eq. 1).

    Layout: ``qkv = Linear(dim, 3 dim)`` split as ``(q | k | v)``, each ``(heads x head_dim)``; ``proj = Linear(dim,
    dim)`` -- the same parameters (names aside) as ViT/DeiT ``Attention`` and nanoGPT ``CausalSelfAttention``.
    Decoding: ``init_state``/``step`` keep a KV cache ``{"k", "v"}`` of shape ``(B, H, t, head_dim)``; ``prefill``
    gives it from one causal pass over a prompt; ``step(attention_mask=...)`` skips the padding in it.

    ``forward(x, attention_mask=..., cu_seqlens=...)``: each sequence attends within its own real tokens (see
    :func:`~attnzoo.ops.softmax.softmax_attention`); padding tokens give 0.

    Internals recorded under :func:`~attnzoo.layers.base.capture_internals` (forward only):
    ``attn`` ``(B, H, N, N)``, the attention probabilities (before attention dropout), computed explicitly then
    (with a mask: 0 outside each query's sequence, padding rows 0).
    """

    mechanism = SOFTMAX
    supports_masks = True

    def build(self, o: SoftmaxOptions) -> None:
        """The projections and parameters of the options ``o``."""
        self.attn_dropout = o.attn_dropout
        self.scale = check_scale(o.scale, self.head_dim)
        self._init_projections(o)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masks: Masks) -> torch.Tensor:
        """Eq. 1 on the heads ``(B, H, N, P)``; the explicit weights while capturing."""
        p = self.attn_dropout if self.training else 0.0
        if self.capturing:
            weights = functools.partial(softmax_attention_weights, q, k, causal=self.causal, scale=self.scale)
            return attend_recorded(self, weights, v, p, **masks)
        return softmax_attention(q, k, v, causal=self.causal, scale=self.scale, dropout_p=p, **masks)

    # ---- decoding ---------------------------------------------------------------------------
    def init_state(self, batch_size: int, *, device=None, dtype=None) -> dict[str, torch.Tensor]:
        """Empty KV cache ``{"k", "v"}`` of shape ``(batch_size, H, 0, head_dim)``."""
        w = self.qkv.weight
        empty = torch.zeros(batch_size, self.heads, 0, self.head_dim, device=device or w.device, dtype=dtype or w.dtype)
        return {"k": empty, "v": empty.clone()}

    def step(
        self, x: torch.Tensor, state: dict[str, torch.Tensor], *, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One token ``(B, 1, dim)``: append its key/value to the cache and attend over the whole cache
        (``attention_mask``: as :func:`attend_step`)."""
        check_step_input(self, x)
        check_kv_cache(state, x.shape[0], ("k", "v"))
        with self.naming_input(x):
            q, k, v = self._qkv(x)
            k = torch.cat([state["k"], k], dim=2)
            v = torch.cat([state["v"], v], dim=2)
            return attend_step(self, q, k, v, attention_mask), {"k": k, "v": v}

    def prefill(
        self, x: torch.Tensor, *, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(out (B, N, dim), {"k", "v"})``: the causal forward of the prompt ``x`` and its key/value cache (eq. 1's
        ``K, V`` of every token, padding slots included: :meth:`step` skips them by its mask), from one pass.

        ``attention_mask`` ``(B, N)`` marks the real tokens; the steps that follow take it extended by one column
        per token."""
        check_prefill(self, x)
        with self.naming_input(x):
            q, k, v = self._qkv(x)
            p = self.attn_dropout if self.training else 0.0
            o = softmax_attention(q, k, v, causal=True, scale=self.scale, dropout_p=p, attention_mask=attention_mask)
            return zero_padding_tokens(self._out(o), attention_mask), {"k": k, "v": v}

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, scale={self.scale:.4g}"


def attend_recorded(
    module: Attention,
    weights: Callable[..., torch.Tensor],
    v: torch.Tensor,
    dropout_p: float,
    *,
    attention_mask: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
) -> torch.Tensor:
    """``dropout(A) V`` (eq. 1) from the explicit probabilities ``A = weights(allowed=...)`` ``(B, H, N, N)``, which
    are recorded as ``attn`` (0 outside each query's sequence, padding rows 0): the forward of a capture.
    ``v`` ``(B, H, N, Pv)``."""
    b, _, n, _ = v.shape
    seg = segments(b, n, attention_mask=attention_mask, cu_seqlens=cu_seqlens, device=v.device)
    attn = weights(allowed=None if seg is None else attention_allowed(seg, module.causal))
    if seg is not None:
        attn = attn * seg.real[:, None, :, None]  # padding queries attend to nothing
    module.record(attn=attn)
    return torch.matmul(F.dropout(attn, p=dropout_p, training=dropout_p > 0), v.to(attn.dtype)).to(v.dtype)


def check_prefill(module: Attention, x: torch.Tensor) -> None:
    """``prefill`` takes a prompt ``(B, N, dim)`` of a causal module."""
    if not module.causal:
        raise ValueError(f"{type(module).__name__}.prefill fills a decoding state; build the module with causal=True")
    module.check_input(x)


def cache_mask(attention_mask: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The ``(B, t + 1)`` bool mask of a cache ``k (B, H, t + 1, P)`` (this token last); a clear error otherwise."""
    b, _, n, _ = k.shape
    name = "attention_mask (the mask of every token fed so far, this one last)"
    return check_attention_mask(attention_mask, b, n, name=name).to(k.device)


def attend_step(
    module: Attention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attention_mask: torch.Tensor | None
) -> torch.Tensor:
    """The output ``(B, 1, dim)`` of a decoding step: eq. 1 from the newest token's query ``q (B, H, 1, P)`` over the
    cache ``k (B, H, t + 1, P)``, ``v (B, H, t + 1, Pv)`` that already holds it, through ``module``'s output.

    ``attention_mask`` ``(B, t + 1)``: the mask of every token fed so far, this one last (the models'
    convention). The cache keeps a slot for every token, padding included; the padding keys are skipped, and
    a padding token gets a zero output (decoding a padded batch equals decoding each row alone)."""
    p = module.attn_dropout if module.training else 0.0
    if attention_mask is None:
        # The newest token is the last query: every cached key is in its past, so no mask is needed.
        return module._out(softmax_attention(q, k, v, causal=False, scale=module.scale, dropout_p=p))
    keep = cache_mask(attention_mask, k)
    o = attend_cache(q, k, v, keep, scale=module.scale, dropout_p=p)
    return zero_padding_tokens(module._out(o), keep[:, -1:])


def attend_cache(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor, *, scale: float, dropout_p: float
) -> torch.Tensor:
    """``softmax(q K^T * scale) V`` of one query per row ``q (B, H, 1, P)`` over the real keys of a cache
    ``k (B, H, t + 1, P)``, ``v (B, H, t + 1, Pv)``; ``keep (B, t + 1)`` bool marks them (eq. 1 over each row's real
    tokens)."""
    # a row with no real token yet reads every key (an all-masked softmax row is NaN); the caller zeroes its output
    allow = keep | ~keep.any(dim=1, keepdim=True)
    return F.scaled_dot_product_attention(
        q, k.to(q.dtype), v.to(q.dtype), attn_mask=allow[:, None, None, :], dropout_p=dropout_p, scale=scale
    )
