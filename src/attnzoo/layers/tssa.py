"""TSSA token mixer of ToST (Wu et al. 2025): Alg. 1 (eq. 11) and its causal variant Alg. 2 (eq. 28).

Parameters are exactly those of the paper's pseudocode, so parameter counts match the ToST tables:
``qkv`` (one ``dim x dim`` projection; its name is the paper's), per-head ``temp`` ``(heads, 1)``,
``to_out``, and in causal mode the positional ``bias`` ``(heads, max_len, 1)`` of eq. 39.
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import nn

from attnzoo._checks import check_positive_int
from attnzoo.layers.base import Attention, RecurrentMixin, register_attention
from attnzoo.ops._segment_ops import zero_padding_tokens
from attnzoo.ops.tssa import TSSA, TSSAOptions, TSSAState, tssa, tssa_init_state, tssa_pi, tssa_step

__all__ = ["TSSAAttention"]


@register_attention("tssa")
class TSSAAttention(Attention, RecurrentMixin):
    """Token Statistics Self-Attention: ``to_out(tssa(qkv(x)))``, linear time and O(P) state per head.

    Options: ``qkv_bias`` (bias of the input projection, Alg. 1 default off), ``max_len`` (length of the
    causal bias, hence the longest causal sequence; ToST/GPT-2 use 1024), ``proj_bias`` (bias of ``to_out``).

    Internals recorded under :func:`~attnzoo.layers.base.capture_internals`: ``pi`` ``(B, H, N)``, the
    membership of each token in each head's subspace (eq. 10 / 39), and ``w`` ``(B, H, N, P)``, the
    projected tokens ``U_k^T z_j``.
    """

    mechanism = TSSA
    supports_masks = True

    def build(self, o: TSSAOptions) -> None:
        """The projections and parameters of the options ``o``."""
        self.max_len = o.max_len
        self.qkv = nn.Linear(self.dim, self.dim, bias=o.qkv_bias)
        self.temp = nn.Parameter(torch.ones(self.heads, 1))
        self.to_out = nn.Linear(self.dim, self.dim, bias=o.proj_bias)
        if self.causal:
            self.bias = nn.Parameter(torch.zeros(self.heads, o.max_len, 1))
        else:
            self.register_parameter("bias", None)

    def _check_len(self, n: int, packed: bool = False) -> None:
        # a packed row is checked per sequence by the op (the bias is read at the position within each sequence)
        if self.causal and n > self.max_len and not packed:
            raise ValueError(
                f"sequence length N={n} exceeds max_len={self.max_len} of this causal TSSA "
                f"(its positional bias has max_len entries); build it with max_len >= {n}"
            )

    def forward(
        self, x: torch.Tensor, *, attention_mask: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x`` ``(B, N, dim) -> (B, N, dim)``; ``attention_mask`` ``(B, N)`` or ``cu_seqlens`` as in
        :func:`~attnzoo.ops.tssa.tssa` (each sequence alone; padding positions give zeros)."""
        return self._attend(x, attention_mask, cu_seqlens)[0]

    def _attend(
        self, x: torch.Tensor, attention_mask: torch.Tensor | None, cu_seqlens: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The forward's output ``(B, N, dim)`` and the projected tokens ``w (B, H, N, P)`` it read (eq. 28)."""
        self.check_input(x)
        self._check_len(x.shape[1], packed=attention_mask is not None or cu_seqlens is not None)
        masks = {"attention_mask": attention_mask, "cu_seqlens": cu_seqlens}
        with self.naming_input(x):
            w = rearrange(self.qkv(x), "b n (h p) -> b h n p", h=self.heads)
            temp = self.temp.view(-1)
            out = tssa(w, temp, causal=self.causal, bias=self.bias, **masks)
            if self.capturing:
                with torch.no_grad():
                    self.record(pi=tssa_pi(w, temp, causal=self.causal, bias=self.bias, **masks), w=w)
            return zero_padding_tokens(self.to_out(rearrange(out, "b h n p -> b n (h p)")), attention_mask), w

    # ---- recurrent decoding (causal only) -----------------------------------------------------
    def init_state(self, batch_size: int, *, device=None, dtype=None) -> TSSAState:
        """Empty decoding state: running sums of w^2, Pi * w^2 and Pi (float32 or better)."""
        self._require_causal()
        check_positive_int("batch_size", batch_size)
        device = self.temp.device if device is None else device
        dtype = self.temp.dtype if dtype is None else dtype
        return tssa_init_state(batch_size, self.heads, self.head_dim, device=device, dtype=dtype)

    def step(
        self, x: torch.Tensor, state: TSSAState, *, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, TSSAState]:
        """Decode one token ``x`` ``(B, 1, dim)``; equals the causal forward at position ``state.pos``.

        ``attention_mask`` ``(B, t + 1)`` (the mask of every token fed so far, this one last, as models pass it) or
        ``(B,)``: a padding token leaves its row's state unchanged and gives zeros (decoding a padded prompt equals
        decoding each prompt alone)."""
        self._require_causal()
        self.check_input(x)
        if x.shape[1] != 1:
            raise ValueError(f"step takes one token x of shape (B, 1, dim), got shape {tuple(x.shape)}")
        if not isinstance(state, TSSAState):
            raise TypeError(f"state must be a TSSAState from init_state, got {type(state).__name__}")
        if isinstance(state.pos, int) and state.pos >= self.max_len:
            raise ValueError(
                f"cannot decode position {state.pos}: this causal TSSA supports positions < max_len={self.max_len}"
            )
        with self.naming_input(x):
            w_t = rearrange(self.qkv(x), "b 1 (h p) -> b h p", h=self.heads)
            real = None if attention_mask is None else _this_token(attention_mask)
            out, state = tssa_step(w_t, self.temp.view(-1), state, bias=self.bias, attention_mask=real)
            y = self.to_out(rearrange(out, "b h p -> b 1 (h p)"))
            if real is not None:  # to_out's bias must not reach padding
                y = torch.where((real.reshape(-1, 1, 1) != 0), y, 0.0)
            return y, state

    def prefill(self, x: torch.Tensor, *, attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, TSSAState]:
        """``(out (B, N, dim), state)``: the causal forward of the prompt ``x`` and the decoding state after it
        (Alg. 2's running sums of ``w^2``, ``Pi w^2`` and ``Pi`` over each row's real tokens), in one parallel pass
        instead of ``N`` steps. ``attention_mask`` ``(B, N)``: positions become per row (``state.pos`` ``(B,)``)."""
        self._require_causal()
        out, w = self._attend(x, attention_mask, None)  # the prompt projected once for the output and the sums
        pi = tssa_pi(w, self.temp.view(-1), causal=True, bias=self.bias, attention_mask=attention_mask)
        cdt = torch.promote_types(self.temp.dtype, torch.float32)
        x2 = w.to(cdt) ** 2
        if attention_mask is not None:
            real = (attention_mask != 0).to(x.device)
            x2 = torch.where(real[:, None, :, None], x2, 0.0)
        pos = x.shape[1] if attention_mask is None else real.sum(dim=-1)
        state = TSSAState(x2.sum(dim=2), (x2 * pi.to(cdt).unsqueeze(-1)).sum(dim=2), pi.to(cdt).sum(dim=2), pos)
        return out, state

    def _require_causal(self) -> None:
        if not self.causal:
            raise ValueError("token-by-token decoding needs a causal TSSA; build it with causal=True")

    def extra_repr(self) -> str:
        extra = f", max_len={self.max_len}" if self.causal else ""
        return super().extra_repr() + extra


def _this_token(mask: torch.Tensor) -> torch.Tensor:
    # (B, t + 1): the mask of every token fed so far, this one last (the models' convention); (B,) or (B, 1) as is
    return mask[:, -1] if mask.ndim == 2 else mask
