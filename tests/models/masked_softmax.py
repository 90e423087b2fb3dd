"""A test-local softmax layer that honours ``attention_mask`` / ``cu_seqlens`` (an explicit SDPA mask), so the model
and ``transformers`` plumbing is exercised whatever the real layers support.

(A uniquely named helper module, imported as ``from masked_softmax import ...`` by tests/models and tests/hf.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnzoo.layers.softmax import SoftmaxAttention
from attnzoo.ops._varlen import segments


class MaskedSoftmax(SoftmaxAttention):
    """Softmax attention over the real tokens of each token's own sequence; zero output at padding."""

    supports_masks = True

    def forward(self, x: torch.Tensor, *, attention_mask=None, cu_seqlens=None) -> torch.Tensor:
        seg = segments(*x.shape[:2], attention_mask=attention_mask, cu_seqlens=cu_seqlens, device=x.device)
        if seg is None:
            return super().forward(x)
        q, k, v = self._qkv(x)
        ids = seg.ids
        allow = (ids[:, :, None] == ids[:, None, :]) & (ids[:, None, :] >= 0)
        if self.causal:
            allow &= torch.ones_like(allow[0]).tril()
        allow |= ~seg.real[:, :, None]  # a padding query attends anywhere: its output is zeroed below
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=allow[:, None], scale=self.scale)
        return self._out(o) * seg.real[..., None].to(x.dtype)

    def step(self, x: torch.Tensor, state: dict, *, attention_mask=None):
        if attention_mask is None:
            return super().step(x, state)
        q, k, v = self._qkv(x)
        k, v = torch.cat([state["k"], k], dim=2), torch.cat([state["v"], v], dim=2)
        real = attention_mask.bool()
        allow = real | ~real[:, -1:]  # (B, t + 1): cached real keys; a padding row's output is zeroed
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=allow[:, None, None], scale=self.scale)
        return self._out(o) * real[:, -1, None, None].to(x.dtype), {"k": k, "v": v}


def use_masked_softmax(model: nn.Module) -> nn.Module:
    """Turn every ``SoftmaxAttention`` of ``model`` into a :class:`MaskedSoftmax` (same parameters), in place."""
    n = 0
    for m in model.modules():
        if type(m) is SoftmaxAttention:
            m.__class__ = MaskedSoftmax
            n += 1
    assert n, "no softmax layer to mask"
    return model
