"""Input embeddings: image patch embeddings (linear / LayerNorm-linear / convolutional stem) and
positional encodings (learned, XCiT's Fourier features, 1-D sinusoidal)."""

from __future__ import annotations

import math

import torch
from einops import rearrange
from torch import nn

__all__ = ["PatchEmbed", "ConvStem", "LinearLNPatchEmbed", "FourierPositionalEncoding", "sinusoidal_positions"]


class PatchEmbed(nn.Module):
    """ViT/DeiT patch embedding: one strided ``patch x patch`` projection; ``(B, C, H, W) -> (B, N, dim)``."""

    def __init__(self, patch_size: int, in_chans: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_chans, dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rearrange(self.proj(x), "b d h w -> b (h w) d")


class LinearLNPatchEmbed(nn.Module):
    """CRATE / vit-pytorch patch embedding: flatten patches, LayerNorm -> Linear -> LayerNorm."""

    def __init__(self, patch_size: int, in_chans: int, dim: int) -> None:
        super().__init__()
        self.patch_size = patch_size
        patch_dim = in_chans * patch_size * patch_size
        if patch_dim < 2:
            # LayerNorm over a single value maps every input to 0 (x - mean(x) = 0): the model would see nothing.
            raise ValueError(
                f"patch_embed='linear_ln' needs in_chans * patch_size**2 >= 2, got {in_chans} * {patch_size}**2 = "
                f"{patch_dim}; use patch_embed='linear' (or a larger patch_size) for 1-channel pixel tokens"
            )
        self.norm_in = nn.LayerNorm(patch_dim)
        self.proj = nn.Linear(patch_dim, dim)
        self.norm_out = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.patch_size
        x = rearrange(x, "b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=p, p2=p)
        return self.norm_out(self.proj(self.norm_in(x)))


class ConvStem(nn.Module):
    """XCiT's convolutional patch embedding: ``log2(patch)`` stride-2 3x3 conv + BatchNorm stages with GELU
    between them, doubling the channels up to ``dim`` (ToST App. C.2 / CBSA Table 3 "convolutional
    embedding"); ``(B, C, H, W) -> (B, N, dim)``."""

    def __init__(self, patch_size: int, in_chans: int, dim: int) -> None:
        super().__init__()
        n = int(round(math.log2(patch_size)))
        if 2**n != patch_size or n < 1:
            raise ValueError(f"ConvStem needs a power-of-two patch_size >= 2, got {patch_size}")
        if dim % 2 ** (n - 1):
            raise ValueError(
                f"ConvStem with patch_size={patch_size} halves dim {n - 1} times, so dim must be divisible by "
                f"{2 ** (n - 1)}; got dim={dim}"
            )
        widths = [dim // 2 ** (n - 1 - i) for i in range(n)]
        layers: list[nn.Module] = []
        cin = in_chans
        for i, w in enumerate(widths):
            layers += [nn.Conv2d(cin, w, kernel_size=3, stride=2, padding=1, bias=False), nn.BatchNorm2d(w)]
            if i < n - 1:
                layers.append(nn.GELU())
            cin = w
        self.proj = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rearrange(self.proj(x), "b d h w -> b (h w) d")


class FourierPositionalEncoding(nn.Module):
    """XCiT's 2-D Fourier positional encoding: sin/cos features of the normalised (row, col) coordinate
    of each patch, projected to ``dim`` by a learned linear map (a 1x1 convolution in XCiT).

    ``forward(grid)`` returns ``(1, H*W, dim)`` for a ``(H, W)`` grid, row-major like the patch tokens.
    """

    def __init__(self, dim: int, hidden: int = 32, temperature: float = 10000.0) -> None:
        super().__init__()
        if hidden % 2:
            raise ValueError(f"hidden must be even (sin/cos pairs), got {hidden}")
        self.hidden = hidden
        self.temperature = temperature
        self.proj = nn.Linear(2 * hidden, dim)

    def features(self, grid: tuple[int, int], device=None, dtype=None) -> torch.Tensor:
        """The ``(H*W, 2*hidden)`` fixed features (before the learned projection)."""
        h, w = grid
        dtype = dtype or torch.float32
        # fixed features in float64 (tiny), then cast; coordinates in (0, 2π] as XCiT's normalisation
        f64 = torch.float64
        ys = torch.arange(1, h + 1, device=device, dtype=f64) / h * (2 * math.pi)
        xs = torch.arange(1, w + 1, device=device, dtype=f64) / w * (2 * math.pi)
        j = torch.arange(self.hidden // 2, device=device, dtype=f64)
        freq = self.temperature ** (2 * j / self.hidden)

        def enc(c: torch.Tensor) -> torch.Tensor:
            a = c[:, None] / freq  # (L, hidden/2)
            return torch.stack([a.sin(), a.cos()], dim=-1).flatten(1)  # interleaved sin, cos

        fy = enc(ys)[:, None, :].expand(h, w, self.hidden)
        fx = enc(xs)[None, :, :].expand(h, w, self.hidden)
        return torch.cat([fy, fx], dim=-1).reshape(h * w, 2 * self.hidden).to(dtype)

    def forward(self, grid: tuple[int, int]) -> torch.Tensor:
        w = self.proj.weight
        return self.proj(self.features(grid, device=w.device, dtype=w.dtype)).unsqueeze(0)


def sinusoidal_positions(n: int, dim: int, *, device=None, dtype=None) -> torch.Tensor:
    """Vaswani et al. (2017) fixed sinusoidal encodings, ``(n, dim)``."""
    pos = torch.arange(n, device=device, dtype=torch.float32)[:, None]
    i = torch.arange(0, dim, 2, device=device, dtype=torch.float32)
    angle = pos / (10000.0 ** (i / dim))
    out = torch.zeros(n, dim, device=device, dtype=torch.float32)
    out[:, 0::2] = angle.sin()
    out[:, 1::2] = angle.cos()[:, : dim // 2]
    return out.to(dtype or torch.float32)
