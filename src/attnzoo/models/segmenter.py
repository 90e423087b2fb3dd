"""Semantic segmentation heads on a ViT encoder (CBSA Fig. 8): a Segmenter-style softmax mask transformer
(Strudel et al. 2021) and a CBT decoder of stacked CBSA layers without feed-forward (DEPICT's design, CBSA §4.2).

Both decoders share one layout: ``K`` learned class embeddings join the encoder's patch tokens as leading tokens,
pass ``depth`` blocks, and the masks are the scalar products of the L2-normalised patch outputs with the
L2-normalised class outputs, ``(B, K, Hg, Wg)``, upsampled bilinearly to pixels. The two differ in the blocks only:
softmax attention + MLP (Segmenter) or CBSA alone (``x += CBSA(LN(x))``, no feed-forward).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnzoo.models.blocks import Block, build_mixer, init_weights
from attnzoo.models.vision import VisionTransformer

__all__ = ["DECODERS", "MaskDecoder", "SegmentationModel"]

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


class SegmentationModel(nn.Module):
    """ViT encoder + :class:`MaskDecoder`: images ``(B, C, H, W)`` -> per-pixel class logits ``(B, K, H, W)``."""

    def __init__(self, encoder: VisionTransformer, decoder: MaskDecoder) -> None:
        super().__init__()
        if tuple(encoder.grid) != decoder.grid:
            raise ValueError(f"encoder grid {tuple(encoder.grid)} and decoder grid {decoder.grid} differ")
        self.encoder, self.decoder = encoder, decoder

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        tokens = self.encoder.forward_tokens(images)
        patches = tokens[:, self.encoder.num_prefix_tokens :]
        masks = self.decoder(patches)
        return F.interpolate(masks, size=images.shape[-2:], mode="bilinear", align_corners=False)
