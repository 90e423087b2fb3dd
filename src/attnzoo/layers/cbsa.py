"""CBSA token mixer: Contract-and-Broadcast Self-Attention (Wen, Huang & Li), parameterised as Algorithm 1."""

from __future__ import annotations

import torch
from einops import rearrange
from torch import nn

from attnzoo.layers.base import Attention, register_attention
from attnzoo.ops.cbsa import CBSA, DEFAULT_NUM_REPS, CBSAOptions, cbsa, extracts_reps, pool_reps, pool_reps_varlen
from attnzoo.ops.cbsa.pooling import refuse_masks_2d

__all__ = ["CBSAAttention"]


@register_attention("cbsa")
class CBSAAttention(Attention):
    """CBSA layer (eqs 5-8, Algorithm 1): ``to_out(kappa * CBSA(proj(x)))``, non-causal, O(N M d).

    Parameters exactly as Algorithm 1: one subspace projection ``proj`` (``U_[K]``, shared for query, key
    and value; ``dim -> dim``, bias only with ``qkv_bias``), the over-parameterised output projection
    ``to_out`` (``dim -> dim`` with bias), per-head step sizes ``kappa`` (``ss_x``, eq 6) and, for variants
    that extract representatives ("cbsa", "agent"), ``eta`` (``ss_rep``, eq 5), both ``(heads, 1, 1)``
    initialised ``randn`` as in Algorithm 1. Per-layer parameters: ``2 dim^2 + dim + 2 heads`` for "cbsa"
    (``+ dim`` with ``qkv_bias``; ``- heads`` for "mssa"/"linear"/"channel", which have no eta).
    The constant ``p/(m eps^2)`` of eq 6 and the sign of the softmax approximation are absorbed in kappa.

    Options:
        num_reps: 1-D pooling (``grid=None``): ``M = min(num_reps, N - num_prefix_tokens)``; ``None`` -> 64
            (the paper's m = p for CBT). Must stay ``None`` when ``grid`` is given.
        grid: ``(Hg, Wg)`` row-major token grid of the non-prefix tokens (``N = num_prefix_tokens + Hg*Wg``)
            for 2-D average pooling; ``rep_grid`` the pooled grid (default ``(min(8, Hg), min(8, Wg))``,
            Algorithm 1's 8x8).
        num_prefix_tokens: leading tokens (CLS, registers) excluded from pooling. They still act as keys
            and values of the extraction and receive the broadcast contraction through their column of
            A_k, exactly like every other token (as in the paper's model).
        contraction: "softmax" (eq 8) or "exact" (eq 7) for "cbsa"/"mssa"; ``None`` -> "softmax"; must be
            ``None`` for the variants that fix it.
        variant: "cbsa" | "mssa" | "linear" | "channel" | "agent" (§3.3, see :func:`attnzoo.ops.cbsa.cbsa`).
        eps: coding precision of the exact contraction / "linear" / "channel".
        qkv_bias: bias on the shared projection.
        detach_init: stop-gradient on the pooled initial representatives (``sg`` of eq 5). Default ``False``
            follows Algorithm 1, which back-propagates through the pooling.

    Recorded internals (inside :func:`attnzoo.layers.base.capture_internals`), as available per variant:
    ``attn_extract`` ``(B, H, M, N)`` (= A_k^T), ``attn_contract`` ``(B, H, M, M)`` (``(B, H, N, N)`` for
    "mssa"), ``reps_init`` and ``reps`` (pooled / extracted representatives, ``(B, H, M, P)``),
    ``filter`` ``(B, H, P, P)`` ("linear", "channel").
    """

    mechanism = CBSA
    supports_masks = True  # forward honours attention_mask / cu_seqlens

    def build(self, o: CBSAOptions) -> None:
        """The projections and parameters of the options ``o``."""
        self.contraction, self.variant = o.contraction, o.variant
        self.num_reps, self.grid, self.rep_grid = o.num_reps, o.grid, o.rep_grid
        self.num_prefix_tokens = o.num_prefix_tokens
        self.eps = o.eps
        self.detach_init = bool(o.detach_init)

        self.proj = nn.Linear(self.dim, self.dim, bias=o.qkv_bias)  # subspace bases U_[K], shared for q, k, v
        self.to_out = nn.Linear(self.dim, self.dim)  # over-parameterised U_[K] (§4 implementation detail)
        self.ss_x = nn.Parameter(torch.randn(self.heads, 1, 1))  # kappa, eq 6
        extracts = extracts_reps(o.variant)
        self.ss_rep = nn.Parameter(torch.randn(self.heads, 1, 1)) if extracts else None  # eta, eq 5

    def forward(
        self, x: torch.Tensor, *, attention_mask: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x`` ``(B, N, dim)`` -> ``(B, N, dim)``; with ``attention_mask`` ``(B, N)`` or ``cu_seqlens``
        ``(S + 1,)`` every sequence is pooled and attended alone, and padding positions give zeros."""
        self.check_input(x)
        masked = attention_mask is not None or cu_seqlens is not None
        with self.naming_input(x):
            w = rearrange(self.proj(x), "b n (h p) -> b h n p", h=self.heads)
            reps_init, reps_kw = self._pool(w, attention_mask, cu_seqlens)
            capturing = self.capturing and not masked
            res = cbsa(
                w,
                reps_init,
                variant=self.variant,
                contraction=self.contraction,
                eps=self.eps,
                eta=self.ss_rep if self.ss_rep is not None else 1.0,
                return_internals=capturing,
                attention_mask=attention_mask,
                cu_seqlens=cu_seqlens,
                **reps_kw,
            )
            if capturing:
                out, internals = res
                if reps_init is not None:
                    internals["reps_init"] = reps_init
                internals.pop("contracted", None)
                self.record(**internals)
            else:
                out = res
            out = self.to_out(rearrange(self.ss_x * out, "b h n p -> b n (h p)"))
            if attention_mask is not None:  # the output bias must not reach padding positions
                out = out * (attention_mask != 0).unsqueeze(-1).to(out.dtype)
            return out

    def _pool(self, w, attention_mask, cu_seqlens) -> tuple[torch.Tensor | None, dict]:
        """Initial representatives (eq 5's Q_ini) and, with masks, the keywords assigning them to sequences."""
        if self.ss_rep is None:
            return None, {}
        if attention_mask is None and cu_seqlens is None:
            reps, kw = (
                pool_reps(
                    w,
                    num_reps=self.num_reps,
                    grid=self.grid,
                    rep_grid=self.rep_grid,
                    num_prefix_tokens=self.num_prefix_tokens,
                ),
                {},
            )
        elif self.grid is not None:
            refuse_masks_2d(self.grid, attention_mask, cu_seqlens)
        else:
            reps, kw = pool_reps_varlen(
                w,
                DEFAULT_NUM_REPS if self.num_reps is None else self.num_reps,
                num_prefix_tokens=self.num_prefix_tokens,
                attention_mask=attention_mask,
                cu_seqlens=cu_seqlens,
            )
        return (reps.detach() if self.detach_init else reps), kw

    def extra_repr(self) -> str:
        s = f"{super().extra_repr()}, variant={self.variant!r}, contraction={self.contraction!r}"
        if self.grid is not None:
            s += f", grid={self.grid}, rep_grid={self.rep_grid}"
        else:
            s += f", num_reps={self.num_reps}"
        return s + f", num_prefix_tokens={self.num_prefix_tokens}"
