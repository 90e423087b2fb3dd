"""Class-attention layers (CaiT, Touvron et al. 2021; used by XCiT and ToST App. C.2).

Only the [CLS] token queries; keys and values come from [CLS] and all patch tokens, so a layer costs
O(N). The patch tokens pass through unchanged, as in CaiT. (XCiT's reference code also adds ``γ1·LN(x)``
to the patch tokens inside these layers, which changes what the second layer sees; the papers do not
describe it, so we do not replicate it.)
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import nn

from attnzoo.layers.base import Attention
from attnzoo.models.blocks import LayerScale, Mlp

__all__ = ["ClassAttention", "ClassAttentionBlock"]


class ClassAttention(Attention):
    """Softmax attention of the CLS query over all tokens: ``(B, 1+N, dim) -> (B, 1, dim)``.

    Not a registered token mixer (its output is the CLS token only); it subclasses :class:`Attention`
    so that :func:`attnzoo.capture_internals` records its ``attn`` map ``(B, H, 1, 1+N)`` (the [CLS]
    attention maps of ToST Fig. 5). Parameters as XCiT's: ``qkv = Linear(dim, 3 dim)`` (only the CLS
    row of the query part is used) and ``proj = Linear(dim, dim)``.
    """

    def __init__(self, dim: int, heads: int, *, qkv_bias: bool = True) -> None:
        super().__init__(dim, heads)
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        for lin in (self.qkv, self.proj):  # XCiT's init (the models' init_weights skips Attention modules)
            nn.init.trunc_normal_(lin.weight, std=0.02)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        q, k, v = rearrange(self.qkv(x), "b n (t h p) -> t b h n p", t=3, h=self.heads)
        q = q[:, :, :1]  # the CLS query only
        scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5  # (B, H, 1, 1+N)
        attn = scores.softmax(dim=-1)
        self.record(attn=attn)
        out = rearrange(attn @ v, "b h n p -> b n (h p)")
        return self.proj(out)


class ClassAttentionBlock(nn.Module):
    """``cls += γ1·CA(LN([cls, x]))``; ``cls += γ2·MLP(LN(cls))``; patch tokens unchanged."""

    def __init__(
        self,
        dim: int,
        heads: int,
        *,
        mlp_hidden: int,
        act: str = "gelu",
        layerscale: float | None = None,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = ClassAttention(dim, heads)
        self.ls1 = LayerScale(dim, layerscale) if layerscale is not None else nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, mlp_hidden, act=act, dropout=dropout)
        self.ls2 = LayerScale(dim, layerscale) if layerscale is not None else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``(B, 1+N, dim)`` with the CLS token first; returns the same shape."""
        cls = x[:, :1] + self.ls1(self.attn(self.norm1(x)))
        cls = cls + self.ls2(self.mlp(self.norm2(cls)))
        return torch.cat([cls, x[:, 1:]], dim=1)
