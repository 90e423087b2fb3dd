"""Fastmax token mixer (FAST, Gerami et al.): ``proj(fastmax(qkv(x)))`` in O(N D^(p+1)) time."""

from __future__ import annotations

import torch

from attnzoo._checks import check_finite, check_positive_int
from attnzoo.layers.base import Attention, Masks, QKVProjection, RecurrentMixin, register_attention
from attnzoo.ops._segment_ops import zero_padding_tokens
from attnzoo.ops.fastmax import (
    FASTMAX,
    FastmaxOptions,
    FastmaxState,
    explicit_attention,
    fastmax,
    fastmax_dropout,
    fastmax_init_state,
    fastmax_prompt_state,
    fastmax_step,
)
from attnzoo.ops.fastmax.common import resolve_scale, standardize

__all__ = ["FastmaxAttention", "MAX_CAPTURE_TOKENS"]

#: the explicit (B, H, N, N) map is recorded only up to this length (it is O(N^2), the op is not)
MAX_CAPTURE_TOKENS = 2048


@register_attention("fastmax")
class FastmaxAttention(QKVProjection, Attention, RecurrentMixin):
    """Fastmax attention (FAST eqs 5-12, causal 30-35) with ``qkv``/``proj`` linear projections.

    Options: ``p`` (Taylor order of f, 1 or 2), ``scale`` (score scale, default ``head_dim**-0.5``; p=1 weights
    are guaranteed non-negative only for ``scale <= 1/head_dim``, see :mod:`attnzoo.ops.fastmax`),
    ``qkv_bias``/``proj_bias``, ``attn_dropout`` with ``dropout_placement`` one of ``"none"``,
    ``"standard"``, ``"1d"``, ``"quadratic"`` (FAST §2.4 / Fig. 2, active in training only; see
    :mod:`attnzoo.ops.fastmax.dropout`), ``proj_dropout`` (after ``proj``), ``backend`` of the op
    (``"auto"``, ``"naive"``, ``"torch"``, ``"torch_autograd"``, ``"triton"``).

    ``forward(x, attention_mask=, cu_seqlens=)``: padded batches and packed rows, each sequence as if alone (moments
    over its own real tokens, see :func:`~attnzoo.ops.fastmax.fastmax`); zero output at padding. Not with
    ``attn_dropout`` in training (a clear error), nor ``backend="triton"`` (names the backends that take them).

    Internals recorded under :func:`~attnzoo.layers.base.capture_internals`: ``q_hat``, ``k_hat``
    ``(B, H, N, head_dim)``, the standardised (unscaled) queries and keys of eqs 5-6, and ``attn``
    ``(B, H, N, N)``, the explicit row-normalised weights of eq 7 (without dropout), recorded only when
    ``N <= MAX_CAPTURE_TOKENS`` (2048) because it is quadratic in N; longer inputs, and padded or packed ones,
    record no ``attn``.
    """

    mechanism = FASTMAX
    supports_masks = True

    def build(self, o: FastmaxOptions) -> None:
        """The projections and parameters of the options ``o``."""
        self.scale = resolve_scale(o.scale, self.head_dim)
        self.p, self.attn_dropout, self.dropout_placement = o.p, o.attn_dropout, o.dropout_placement
        self.backend = o.backend
        self._init_projections(o)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masks: Masks) -> torch.Tensor:
        """Eqs 5-12 (causal 30-35) on the heads ``(B, H, N, P)``, moments over each sequence's real tokens; the
        standardised queries and keys and the explicit weights while capturing."""
        order = dict(p=self.p, causal=self.causal, scale=self.scale)
        if self.training and self.attn_dropout > 0:
            drop = dict(rate=self.attn_dropout, placement=self.dropout_placement)
            out = fastmax_dropout(q, k, v, backend=self.backend, **drop, **order, **masks)
        else:
            out = fastmax(q, k, v, backend=self.backend, **order, **masks)
        if self.capturing:
            with torch.no_grad():
                self.record(q_hat=standardize(q), k_hat=standardize(k))
                # the explicit map is of one unmasked sequence: not recorded for padded or packed inputs
                if q.shape[2] <= MAX_CAPTURE_TOKENS and not any(m is not None for m in masks.values()):
                    self.record(attn=explicit_attention(q, k, **order))
        return out

    # ---- recurrent decoding (causal only) -----------------------------------------------------
    def init_state(self, batch_size: int, *, device=None, dtype=None) -> FastmaxState:
        """Empty running moment sums (eqs 34-35) of every head, float32 or better."""
        self._require_causal()
        check_positive_int("batch_size", batch_size)
        device = self.qkv.weight.device if device is None else device
        dtype = self.qkv.weight.dtype if dtype is None else dtype
        return fastmax_init_state(batch_size, self.kv_heads, self.head_dim, p=self.p, device=device, dtype=dtype)

    def step(
        self, x: torch.Tensor, state: FastmaxState, *, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, FastmaxState]:
        """Decode one token ``x (B, 1, dim)``; equals the causal forward at that position (no dropout).

        ``attention_mask``: ``(B, t + 1)``, the mask of every token fed so far with this one last (the models'
        convention), or ``(B, 1)``; a padding token leaves its row's state unchanged and gets zero output."""
        self._require_causal()
        self.check_input(x)
        check_finite("x", x)
        if x.shape[1] != 1:
            raise ValueError(f"step takes one token x of shape (B, 1, dim), got shape {tuple(x.shape)}")
        if attention_mask is not None:
            attention_mask = attention_mask[:, -1:]  # this token's column: the state already holds the earlier ones
        with self.naming_input(x):
            q, k, v = self._qkv_grouped(x)  # the sums are kept per key/value head
            out, state = fastmax_step(q, k, v, state, p=self.p, scale=self.scale, attention_mask=attention_mask)
            return zero_padding_tokens(self._out(out), attention_mask), state

    def prefill(
        self, x: torch.Tensor, *, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, FastmaxState]:
        """``(out (B, N, dim), state)``: the causal forward of the prompt ``x`` and the running moment sums after it
        (eqs 34-35: ``sum_n phi(k_hat_n) v_n^T`` and ``sum_n phi(k_hat_n)`` over each row's real tokens), in one
        pass instead of ``N`` steps. ``attention_mask`` ``(B, N)`` marks the real tokens."""
        self._require_causal()
        self.check_input(x)
        with self.naming_input(x):
            q, k, v = self._qkv_grouped(x)
            out = fastmax(
                q,
                *self._repeat_kv(k, v),
                p=self.p,
                causal=True,
                scale=self.scale,
                backend=self.backend,
                attention_mask=attention_mask,
            )
            y = zero_padding_tokens(self._out(out), attention_mask)
        real = None if attention_mask is None else (attention_mask != 0).to(x.device)
        return y, fastmax_prompt_state(k, v, p=self.p, real=real)

    def _require_causal(self) -> None:
        if not self.causal:
            raise ValueError("token-by-token decoding needs a causal Fastmax; build it with causal=True")

    def extra_repr(self) -> str:
        extra = f", p={self.p}, scale={self.scale:.4g}"
        if self.attn_dropout > 0:
            extra += f", attn_dropout={self.attn_dropout}, dropout_placement={self.dropout_placement!r}"
        return super().extra_repr() + extra
