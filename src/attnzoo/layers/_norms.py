"""The normalisations MEGA chooses between (its ``--norm-type``): LayerNorm, ScaleNorm, BatchNorm over tokens."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["ScaleNorm", "TokenBatchNorm", "build_norm", "NORM_LAYERS"]

NORM_LAYERS = ("layernorm", "scalenorm", "batchnorm")


class ScaleNorm(nn.Module):
    """``g x / sqrt(mean(x^2) + eps)`` over the features with one learned scalar ``g`` (Nguyen & Salazar 2019)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.dim = dim
        self.eps = float(eps)
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, eps={self.eps}"


class TokenBatchNorm(nn.BatchNorm1d):
    """BatchNorm of ``(B, N, dim)`` over the batch and the tokens, per feature (MEGA's ``batchnorm``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.transpose(1, 2)).transpose(1, 2)


def build_norm(kind: str, dim: int) -> nn.Module:
    """A normalisation of ``(B, N, dim)`` tensors: ``"layernorm"``, ``"scalenorm"`` or ``"batchnorm"``."""
    if kind == "layernorm":
        return nn.LayerNorm(dim)
    if kind == "scalenorm":
        return ScaleNorm(dim)
    if kind == "batchnorm":
        return TokenBatchNorm(dim)
    raise ValueError(f"norm layer {kind!r} is not supported; valid choices: {list(NORM_LAYERS)}")
