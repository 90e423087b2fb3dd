"""Semantic segmentation heads on a ViT encoder (CBSA Fig. 8): a Segmenter-style softmax mask transformer
(Strudel et al. 2021) and a CBT decoder of stacked CBSA layers without feed-forward (DEPICT's design, CBSA §4.2).

Both decoders share one layout: ``K`` learned class embeddings join the encoder's patch tokens as leading tokens,
pass ``depth`` blocks, and the masks are the scalar products of the L2-normalised patch outputs with the
L2-normalised class outputs, ``(B, K, Hg, Wg)``, upsampled bilinearly to pixels. The two differ in the blocks only:
softmax attention + MLP (Segmenter) or CBSA alone (``x += CBSA(LN(x))``, no feed-forward).

:class:`SegmentationModel` is a registered architecture (``arch="segmenter"``): its :class:`SegmenterConfig` is a
:class:`~attnzoo.models.config.VisionConfig` (the encoder's fields; ``num_classes`` counts the per-pixel classes,
background included) plus the decoder's, so ``create_model``, ``attnzoo train`` and ``save_pretrained`` handle it as
any other model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from attnzoo._checks import check_choice, check_positive_int
from attnzoo.models._registry import register_architecture
from attnzoo.models.blocks import Block, build_mixer, init_weights
from attnzoo.models.checkpoint import PretrainedModel
from attnzoo.models.config import VisionConfig, _jsonable
from attnzoo.models.vision import VisionTransformer

__all__ = ["DECODERS", "MaskDecoder", "SegmenterConfig", "SegmentationModel"]

#: decoder name -> (mechanism, feed-forward part)
DECODERS = {"mask_transformer": ("softmax", "mlp"), "cbsa": ("cbsa", "none")}


class MaskDecoder(nn.Module):
    """Class embeddings + ``depth`` blocks over ``[classes; patches]`` -> masks ``(B, K, Hg, Wg)`` (module doc)."""

    def __init__(
        self,
        dim: int,
        num_classes: int,
        grid: tuple[int, int],
        *,
        kind: str = "mask_transformer",
        depth: int = 2,
        heads: int = 4,
        attention_options: dict | None = None,
    ) -> None:
        super().__init__()
        if kind not in DECODERS:
            raise ValueError(f"decoder kind={kind!r} is not supported; valid kinds: {sorted(DECODERS)}")
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"decoder depth={depth!r} must be a positive int")
        if not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"num_classes={num_classes!r} must be an int >= 2 (background included)")
        mechanism, ffn = DECODERS[kind]
        self.kind, self.grid, self.num_classes = kind, tuple(grid), num_classes
        context = {"grid": self.grid, "num_prefix_tokens": num_classes}
        self.class_embed = nn.Parameter(torch.zeros(1, num_classes, dim))
        self.blocks = nn.ModuleList(
            Block(
                dim,
                build_mixer(
                    mechanism, dim, heads, causal=False, options=dict(attention_options or {}), context=context
                ),
                ffn=ffn,
                norm="pre",
            )
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(dim)
        self.patch_proj = nn.Linear(dim, dim, bias=False)
        self.class_proj = nn.Linear(dim, dim, bias=False)
        self.mask_norm = nn.LayerNorm(num_classes)
        init_weights(self)
        nn.init.trunc_normal_(self.class_embed, std=0.02)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """Patch tokens ``(B, N, dim)`` (``N = Hg * Wg``, row-major) -> mask logits ``(B, K, Hg, Wg)``."""
        b, n, _ = patches.shape
        hg, wg = self.grid
        if n != hg * wg:
            raise ValueError(f"the decoder expects {hg}x{wg} = {hg * wg} patch tokens, got {n}")
        x = torch.cat([self.class_embed.expand(b, -1, -1), patches], dim=1)
        for blk in self.blocks:
            x = blk(x)
        x = self.norm(x)
        classes = F.normalize(self.class_proj(x[:, : self.num_classes]), dim=-1)
        pixels = F.normalize(self.patch_proj(x[:, self.num_classes :]), dim=-1)
        masks = self.mask_norm(pixels @ classes.transpose(1, 2))  # (B, N, K)
        return masks.transpose(1, 2).reshape(b, self.num_classes, hg, wg)


#: the fields :class:`SegmenterConfig` adds to the encoder's :class:`VisionConfig`
DECODER_FIELDS = ("decoder", "decoder_depth", "decoder_heads", "decoder_attention_options")


@dataclass
class SegmenterConfig(VisionConfig):
    """A ViT encoder (every :class:`VisionConfig` field; its classifier head is left out) under a
    :class:`MaskDecoder`: images ``(B, in_chans, H, W)`` -> per-pixel logits ``(B, num_classes, H, W)``.

    ``num_classes``: the per-pixel classes, background included (>= 2). ``decoder``: ``"mask_transformer"``
    (Segmenter) or ``"cbsa"`` (CBSA layers without feed-forward); ``decoder_heads``: the encoder's ``heads``
    when ``None``; ``decoder_attention_options``: the decoder mechanism's options (e.g. CBSA's ``rep_grid``).
    """

    arch: ClassVar[str] = "segmenter"

    num_classes: int = 150
    decoder: str = "mask_transformer"
    decoder_depth: int = 2
    decoder_heads: int | None = None
    decoder_attention_options: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.num_classes, int) or isinstance(self.num_classes, bool) or self.num_classes < 2:
            raise ValueError(
                f"num_classes={self.num_classes!r} must be an int >= 2 (per-pixel classes, background included)"
            )
        check_choice("decoder", self.decoder, DECODERS)
        check_positive_int("decoder_depth", self.decoder_depth)
        if self.decoder_heads is not None:
            check_positive_int("decoder_heads", self.decoder_heads)
            if self.dim % self.decoder_heads:
                raise ValueError(f"dim={self.dim} must be divisible by decoder_heads={self.decoder_heads}")
        if not isinstance(self.decoder_attention_options, dict):
            raise TypeError(
                f"decoder_attention_options must be a dict of keyword options, got "
                f"{type(self.decoder_attention_options).__name__}"
            )
        self.decoder_attention_options = _jsonable(self.decoder_attention_options, "decoder_attention_options")

    def encoder_config(self) -> VisionConfig:
        """The encoder's own config: these fields without the decoder's, no classifier head (``num_classes=0``)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(VisionConfig)}
        return VisionConfig(**{**fields, "num_classes": 0})


@register_architecture
class SegmentationModel(PretrainedModel):
    """ViT encoder + :class:`MaskDecoder`: images ``(B, C, H, W)`` -> per-pixel class logits ``(B, K, H, W)``."""

    config_class = SegmenterConfig

    def __init__(self, config: SegmenterConfig) -> None:
        super().__init__()
        if not isinstance(config, SegmenterConfig):
            raise TypeError(f"SegmentationModel needs a SegmenterConfig, got {type(config).__name__}")
        self.config = cfg = config
        self.encoder = VisionTransformer(cfg.encoder_config())
        self.decoder = MaskDecoder(
            cfg.dim,
            cfg.num_classes,
            tuple(cfg.grid),
            kind=cfg.decoder,
            depth=cfg.decoder_depth,
            heads=cfg.decoder_heads or cfg.heads,
            attention_options=cfg.decoder_attention_options,
        )

    def patch_tokens(self, images: torch.Tensor) -> torch.Tensor:
        """The encoder's final patch tokens ``(B, N, dim)``, without its [CLS] token wherever the pooling put it."""
        tokens = self.encoder.forward_tokens(images)
        n = self.decoder.grid[0] * self.decoder.grid[1]
        return tokens[:, tokens.shape[1] - n :]  # class attention appends [CLS] first, after the blocks

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        masks = self.decoder(self.patch_tokens(images))
        return F.interpolate(masks, size=images.shape[-2:], mode="bilinear", align_corners=False)
