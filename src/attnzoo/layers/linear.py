"""Multi-head linear attention (Katharopoulos et al., 2020) with the ViT / nanoGPT projection layout."""

from __future__ import annotations

import torch

from attnzoo.layers.base import Attention, Masks, QKVProjection, RecurrentMixin, check_step_input, register_attention
from attnzoo.ops._segment_ops import zero_padding_tokens
from attnzoo.ops.linear import (
    LINEAR,
    LinearOptions,
    init_linear_state,
    linear_attention,
    linear_attention_recurrent,
    linear_attention_weights,
    linear_prompt_state,
)

__all__ = ["LinearAttention"]

#: above this many tokens the explicit (N, N) map is not recorded even while capturing
MAX_RECORDED_TOKENS = 2048


@register_attention("linear")
class LinearAttention(QKVProjection, Attention, RecurrentMixin):
    """Linear attention ``phi(q_i)^T sum_j phi(k_j) v_j^T / (phi(q_i)^T sum_j phi(k_j) + eps)`` per head
    (Katharopoulos et al. 2020, eqs. 5-6; causal eqs. 8-10), ``phi = elu + 1`` by default.

    Layout as :class:`~attnzoo.layers.softmax.SoftmaxAttention`: ``qkv = Linear(dim, 3 dim)`` (``Linear(dim, dim +
    2 G P)`` with ``kv_heads=G`` grouped key/value heads), ``proj = Linear(dim, dim)``. Causal decoding keeps an O(1)
    state per step: ``{"s": (B, G, P, P), "z": (B, G, P)}`` in float32 (float64 for float64 modules) -- eqs. 18-20.

    Internals recorded under :func:`~attnzoo.layers.base.capture_internals` (forward only):
    ``attn`` ``(B, H, N, N)``, the normalised kernel matrix, computed explicitly and only when ``N <= 2048``.

    ``forward(x, attention_mask=..., cu_seqlens=...)``: the moment sums run over each sequence's own real tokens
    (the causal state restarts at each sequence start; see :func:`~attnzoo.ops.linear.linear_attention`); padding
    tokens give 0. Decoding needs nothing more: each row's state starts empty.
    """

    mechanism = LINEAR
    supports_masks = True

    def build(self, o: LinearOptions) -> None:
        """The projections and parameters of the options ``o``."""
        self.feature_map, self.eps, self.chunk_size = o.feature_map, o.eps, o.chunk_size
        self._init_projections(o)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masks: Masks) -> torch.Tensor:
        """Eqs. 5-6 (causal 8-10) on the heads ``(B, H, N, P)``; the normalised kernel matrix while capturing."""
        features = dict(causal=self.causal, feature_map=self.feature_map, eps=self.eps)
        if self.capturing and q.shape[2] <= MAX_RECORDED_TOKENS:
            self.record(attn=linear_attention_weights(q, k, **features, **masks))
        return linear_attention(q, k, v, chunk_size=self.chunk_size, **features, **masks)

    # ---- decoding ---------------------------------------------------------------------------
    def init_state(self, batch_size: int, *, device=None, dtype=None) -> dict[str, torch.Tensor]:
        """Empty recurrent state ``{"s": (B, G, P, P), "z": (B, G, P)}`` per key/value head (``G = kv_heads``; float32,
        or float64 for float64)."""
        w = self.qkv.weight
        s, z = init_linear_state(
            batch_size, self.kv_heads, self.head_dim, self.head_dim, device=device or w.device, dtype=dtype or w.dtype
        )
        return {"s": s, "z": z}

    def step(self, x: torch.Tensor, state: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One token ``(B, 1, dim)`` in O(1): fold ``phi(k_t) v_t^T`` into the state, read it with ``phi(q_t)``."""
        check_step_input(self, x)
        if not isinstance(state, dict) or "s" not in state or "z" not in state:
            raise TypeError("state must be the dict returned by init_state/step with keys ['s', 'z']")
        with self.naming_input(x):
            q, k, v = self._qkv_grouped(x)  # the state is kept per key/value head
            o, (s, z) = linear_attention_recurrent(
                q, k, v, (state["s"], state["z"]), feature_map=self.feature_map, eps=self.eps
            )
            return self._out(o), {"s": s, "z": z}

    def prefill(
        self, x: torch.Tensor, *, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(out (B, N, dim), state)``: the causal forward of the prompt ``x`` and the state after it, ``S = sum_t
        phi(k_t) v_t^T`` and ``z = sum_t phi(k_t)`` over each row's real tokens (eqs. 18-20), from one projection
        of the prompt. ``attention_mask`` ``(B, N)`` marks the real tokens."""
        if not self.causal:
            raise ValueError("prefill fills a decoding state: build the LinearAttention with causal=True")
        self.check_input(x)
        with self.naming_input(x):
            q, k, v = self._qkv_grouped(x)
            o = linear_attention(
                q, *self._repeat_kv(k, v), causal=True, feature_map=self.feature_map, eps=self.eps,
                chunk_size=self.chunk_size, attention_mask=attention_mask,
            )  # fmt: skip
            y = zero_padding_tokens(self._out(o), attention_mask)
        real = None if attention_mask is None else attention_mask != 0
        s, z = linear_prompt_state(k, v, feature_map=self.feature_map, real=real)  # per key/value head
        return y, {"s": s, "z": z}

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, feature_map={self.feature_map!r}"
