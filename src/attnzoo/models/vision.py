"""Vision classifier on the shared skeleton: ViT/DeiT, XCiT (no LPI), ToST, CRATE, CBT, AoT, CSP-ViT."""

from __future__ import annotations

import torch
from torch import nn

from attnzoo._checks import check_module_input, finite_absmax
from attnzoo.models._registry import register_architecture
from attnzoo.models.blocks import build_blocks, init_weights, set_norm_eps
from attnzoo.models.checkpoint import PretrainedModel
from attnzoo.models.class_attention import ClassAttentionBlock
from attnzoo.models.config import VisionConfig
from attnzoo.models.embeddings import ConvStem, FourierPositionalEncoding, LinearLNPatchEmbed, PatchEmbed

__all__ = ["VisionTransformer"]


@register_architecture
class VisionTransformer(PretrainedModel):
    """``(B, in_chans, image_size, image_size)`` images -> ``(B, num_classes)`` logits.

    Token layout through the blocks: ``pool="cls"`` prepends a CLS token (``1 + N`` tokens, the
    mechanisms are told ``num_prefix_tokens=1``); ``"mean"`` and ``"class_attention"`` run on the ``N``
    patch tokens only (XCiT appends its CLS token after the blocks, for the class-attention layers).
    """

    config_class = VisionConfig

    def __init__(self, config: VisionConfig) -> None:
        super().__init__(config)
        cfg = config
        embed = {"linear": PatchEmbed, "linear_ln": LinearLNPatchEmbed, "conv": ConvStem}[cfg.patch_embed]
        self.patch_embed = embed(cfg.patch_size, cfg.in_chans, cfg.dim)
        self.grid = cfg.grid
        n_patches = self.grid[0] * self.grid[1]
        self.num_prefix_tokens = 1 if cfg.pool == "cls" else 0
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.dim)) if cfg.pool in ("cls", "class_attention") else None
        self.pos_embed = self.pos_fourier = None
        if cfg.pos_embed == "learned":
            self.pos_embed = nn.Parameter(torch.zeros(1, n_patches + self.num_prefix_tokens, cfg.dim))
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        elif cfg.pos_embed == "fourier":
            self.pos_fourier = FourierPositionalEncoding(cfg.dim)
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=0.02)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = build_blocks(
            cfg, causal=False, context={"grid": self.grid, "num_prefix_tokens": self.num_prefix_tokens}
        )
        self.cls_blocks = None
        if cfg.pool == "class_attention":
            self.cls_blocks = nn.ModuleList(
                ClassAttentionBlock(
                    cfg.dim,
                    cfg.heads,
                    mlp_hidden=cfg.hidden_dim,
                    act=cfg.act,
                    layerscale=cfg.layerscale,
                    dropout=cfg.dropout,
                )
                for _ in range(cfg.class_attention_layers)
            )
        self.norm = nn.LayerNorm(cfg.dim) if cfg.final_norm else nn.Identity()
        self.head = nn.Linear(cfg.dim, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
        init_weights(self)
        set_norm_eps(self, cfg.norm_eps)

    def _check_images(self, x: torch.Tensor) -> None:
        cfg = self.config
        if not isinstance(x, torch.Tensor) or x.ndim != 4:
            raise ValueError(
                f"images must be a tensor of shape (B, {cfg.in_chans}, {cfg.image_size}, {cfg.image_size}), "
                f"got {tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}"
            )
        if tuple(x.shape[1:]) != (cfg.in_chans, cfg.image_size, cfg.image_size):
            raise ValueError(
                f"images must have shape (B, {cfg.in_chans}, {cfg.image_size}, {cfg.image_size}) for this model, "
                f"got {tuple(x.shape)}"
            )
        if not x.is_floating_point():
            raise TypeError(
                f"images must be a floating-point tensor (normalised pixels), got dtype {x.dtype}; "
                f"convert with images.float() and normalise"
            )
        check_module_input(self, "images", x)
        finite_absmax({"images": x}, op=type(self).__name__)

    def forward_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """Final normalised tokens ``(B, T, dim)``: T = 1+N (cls / class_attention) or N (mean)."""
        self._check_images(x)
        x = self.patch_embed(x)
        b = x.shape[0]
        if self.pos_fourier is not None:
            x = x + self.pos_fourier(self.grid)
        if self.config.pool == "cls":
            x = torch.cat([self.cls_token.expand(b, -1, -1), x], dim=1)
        if self.pos_embed is not None:
            x = x + self.pos_embed
        x = self.drop(x)
        for blk in self.blocks:
            x = blk(x)
        if self.cls_blocks is not None:
            x = torch.cat([self.cls_token.expand(b, -1, -1), x], dim=1)
            for blk in self.cls_blocks:
                x = blk(x)
        return self.norm(x)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled features ``(B, dim)``."""
        x = self.forward_tokens(x)
        return x.mean(dim=1) if self.config.pool == "mean" else x[:, 0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x))
