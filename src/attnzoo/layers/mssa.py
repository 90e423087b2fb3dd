"""Multi-head subspace self-attention (MSSA): CRATE's (Yu et al., 2023) and AoT's (Wang et al.) token mixer."""

from __future__ import annotations

import functools

import torch
from einops import rearrange
from torch import nn

from attnzoo._checks import check_scale
from attnzoo.layers.base import Attention, RecurrentMixin, check_kv_cache, check_step_input, register_attention
from attnzoo.layers.softmax import attend_recorded, attend_step, check_prefill
from attnzoo.ops._segment_ops import zero_padding_tokens
from attnzoo.ops.mssa import MSSA, MSSAOptions, mssa, mssa_query, mssa_weights
from attnzoo.ops.softmax import softmax_attention

__all__ = ["MSSAAttention"]


@register_attention("mssa")
class MSSAAttention(Attention, RecurrentMixin):
    """MSSA (AoT eqs. 3/5 with ``phi = softmax``; CBSA eq. 9): ``sum_k U_k w_k softmax(q_k w_k^T * scale)`` with
    ``w_k = U_k^T z`` shared as query, key and value.

    Layout (CRATE): ``qkv = Linear(dim, dim, bias=False)`` holds ``U = [U_1 ... U_K]^T`` (``K = heads`` subspaces of
    ``dim // heads``); ``to_out = Linear(dim, dim, bias=True)`` is CRATE's learned lift back to the ambient space
    (the over-parameterised ``U_k``, CBSA §3 "Implementation detail"; AoT's vision models' parameter counts
    match it). ``out_proj=False`` gives the literal eq. (3): the lift is the transposed ``U`` itself,
    ``y = o @ qkv.weight``, with no extra parameters or bias.

    Options: ``causal`` (AoT §4.1's masked MSSA), ``normalize_query`` (AoT §4.1: the query side ``P(U_k^T Z)``
    has unit-norm tokens; keys/values do not), ``tied`` (default True; False is an ablation that gives query, key and
    value their own projections ``qkv = Linear(dim, 3 * inner)``, the query still normalised by ``normalize_query``:
    with ``normalize_query=False`` it is softmax attention; it needs ``out_proj`` and has no decoding),
    ``head_dim`` (subspace dimension ``p``; default ``dim // heads``,
    CRATE's ``dim_head`` may differ, e.g. 64 at width 1280 for AoT-Huge), ``scale`` (default ``head_dim ** -0.5`` as
    in CRATE; the eqs.
    have none -- it is absorbed in ``U``). The step size ``eta`` of eq. (3) belongs to the residual block.
    Decoding: ``init_state``/``step`` keep a cache ``{"w"}`` of projections ``(B, H, t, head_dim)``; ``prefill``
    gives it from one causal pass over a prompt; ``step(attention_mask=...)`` skips the padding in it.

    ``forward(x, attention_mask=..., cu_seqlens=...)``: each sequence attends within its own real tokens (see
    :func:`~attnzoo.ops.mssa.mssa`); padding tokens give 0.

    Internals recorded under :func:`~attnzoo.layers.base.capture_internals` (forward only):
    ``attn`` ``(B, H, N, N)`` (before attention dropout), computed explicitly then (with a mask: 0 outside each
    query's sequence, padding rows 0).
    """

    mechanism = MSSA
    supports_masks = True

    def build(self, o: MSSAOptions) -> None:
        """The projections and parameters of the options ``o``."""
        if not o.tied and not o.out_proj:
            raise ValueError(
                "MSSA with tied=False needs out_proj=True: the eq. (3) lift is the transposed shared projection, "
                "which an untied layer does not have; got out_proj=False"
            )
        self.tied = o.tied
        if o.head_dim is not None:
            self.head_dim = o.head_dim
        self.attn_dropout = o.attn_dropout
        self.scale = check_scale(o.scale, self.head_dim)
        self.normalize_query = o.normalize_query
        inner = self.heads * self.head_dim  # K subspaces of dimension p; CRATE's default p = dim // heads
        self.qkv = nn.Linear(self.dim, inner if o.tied else 3 * inner, bias=False)
        self.to_out = nn.Linear(inner, self.dim, bias=True) if o.out_proj else None
        self.proj_drop = nn.Dropout(o.proj_dropout)

    def _w(self, x: torch.Tensor) -> torch.Tensor:
        return rearrange(self.qkv(x), "b n (h p) -> b h n p", h=self.heads)

    def _untied(self, x: torch.Tensor, attention_mask, cu_seqlens) -> torch.Tensor:
        """The ablation ``tied=False``: ``softmax(P(q) k^T * scale) v`` with three projections, per head."""
        q, k, v = rearrange(self.qkv(x), "b n (t h p) -> t b h n p", t=3, h=self.heads)
        p = self.attn_dropout if self.training else 0.0
        q = mssa_query(q, self.normalize_query)
        kw = dict(causal=self.causal, scale=self.scale, dropout_p=p)
        o = softmax_attention(q, k, v, attention_mask=attention_mask, cu_seqlens=cu_seqlens, **kw)
        return zero_padding_tokens(self._out(o), attention_mask)

    def _tied_only(self, what: str) -> None:
        if not self.tied:
            raise ValueError(f"MSSA with tied=False (an ablation) has no {what}; use tied=True to decode")

    def _out(self, o: torch.Tensor) -> torch.Tensor:
        o = rearrange(o, "b h n p -> b n (h p)")
        # Without a learned lift, sum_k U_k o_k = o @ W where U^T = W is the qkv weight (AoT eq. 3).
        y = self.to_out(o) if self.to_out is not None else torch.matmul(o, self.qkv.weight)
        return self.proj_drop(y)

    def forward(
        self, x: torch.Tensor, *, attention_mask: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x (B, N, dim) -> (B, N, dim)``; ``attention_mask (B, N)`` or ``cu_seqlens`` as in the op."""
        self.check_input(x)
        if not self.tied:
            if self.capturing:
                raise ValueError("MSSA with tied=False (an ablation) records no internals; use tied=True")
            return self._untied(x, attention_mask, cu_seqlens)
        with self.naming_input(x):
            w = self._w(x)
            p = self.attn_dropout if self.training else 0.0
            if self.capturing:
                weights = functools.partial(
                    mssa_weights, w, causal=self.causal, scale=self.scale, normalize_query=self.normalize_query
                )
                o = attend_recorded(self, weights, w, p, attention_mask=attention_mask, cu_seqlens=cu_seqlens)
            else:
                o = mssa(
                    w,
                    causal=self.causal,
                    scale=self.scale,
                    normalize_query=self.normalize_query,
                    dropout_p=p,
                    attention_mask=attention_mask,
                    cu_seqlens=cu_seqlens,
                )
            return zero_padding_tokens(self._out(o), attention_mask)

    # ---- decoding ---------------------------------------------------------------------------
    def init_state(self, batch_size: int, *, device=None, dtype=None) -> dict[str, torch.Tensor]:
        """Empty cache ``{"w"}`` of shape ``(batch_size, H, 0, head_dim)`` (keys and values are the same ``w``)."""
        self._tied_only("recurrent state")
        wt = self.qkv.weight
        empty = torch.zeros(
            batch_size, self.heads, 0, self.head_dim, device=device or wt.device, dtype=dtype or wt.dtype
        )
        return {"w": empty}

    def step(
        self, x: torch.Tensor, state: dict[str, torch.Tensor], *, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One token ``(B, 1, dim)``: append its projection to the cache, attend from it over the cache (keys and
        values are the cached ``w``; ``attention_mask``: as :func:`~attnzoo.layers.softmax.attend_step`)."""
        check_step_input(self, x)
        self._tied_only("recurrent step")
        check_kv_cache(state, x.shape[0], ("w",))
        with self.naming_input(x):
            w_t = self._w(x)
            w = torch.cat([state["w"], w_t], dim=2)
            q = mssa_query(w_t, self.normalize_query)
            return attend_step(self, q, w, w, attention_mask), {"w": w}

    def prefill(
        self, x: torch.Tensor, *, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(out (B, N, dim), {"w"})``: the causal forward of the prompt ``x`` (AoT §4.1's masked MSSA) and its cache
        of projections ``U_k^T z`` (padding slots included: :meth:`step` skips them by its mask), from one pass.

        ``attention_mask`` ``(B, N)`` marks the real tokens; the steps that follow take it extended by one column
        per token."""
        check_prefill(self, x)
        self._tied_only("prefill")
        with self.naming_input(x):
            w = self._w(x)
            p = self.attn_dropout if self.training else 0.0
            o = mssa(
                w,
                causal=True,
                scale=self.scale,
                normalize_query=self.normalize_query,
                dropout_p=p,
                attention_mask=attention_mask,
            )
            return zero_padding_tokens(self._out(o), attention_mask), {"w": w}

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, head_dim={self.head_dim}, scale={self.scale:.4g}, "
            f"normalize_query={self.normalize_query}, "
            f"out_proj={self.to_out is not None}" + ("" if self.tied else ", tied=False")
        )
