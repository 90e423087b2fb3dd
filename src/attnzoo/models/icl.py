"""In-context regression model (Garg et al. 2022; AoT §4.1.2): linear read-in, causal backbone, read-out."""

from __future__ import annotations

import torch
from torch import nn

from attnzoo.models._registry import register_architecture
from attnzoo.models.blocks import build_blocks, init_weights, set_norm_eps
from attnzoo.models.checkpoint import PretrainedModel
from attnzoo.models.config import ICLConfig
from attnzoo.models.embeddings import sinusoidal_positions

__all__ = ["ICLRegressor", "interleave"]


def interleave(xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """The prompt ``(x_1, y_1, ..., x_N, y_N)`` as ``(B, 2N, d)``; ``y_i`` is ``(y_i, 0, ..., 0)``."""
    b, n, d = xs.shape
    ys_wide = torch.cat([ys[..., None].to(xs.dtype), xs.new_zeros(b, n, d - 1)], dim=-1)
    return torch.stack([xs, ys_wide], dim=2).reshape(b, 2 * n, d)


@register_architecture
class ICLRegressor(PretrainedModel):
    """``xs (B, N, n_dims)``, ``ys (B, N)`` -> predictions ``(B, N)`` of ``y_i`` from ``(x_1, y_1, ..., x_i)``.

    The causal backbone (GPT or AoT blocks) runs over the interleaved ``2N`` tokens; the read-out at
    token ``x_i`` is the prediction for ``y_i``, so it never sees ``y_i`` or anything later.
    """

    config_class = ICLConfig

    def __init__(self, config: ICLConfig) -> None:
        super().__init__(config)
        cfg = config
        self.read_in = nn.Linear(cfg.n_dims, cfg.dim)
        n_pos = 2 * cfg.max_points
        self.wpe = nn.Embedding(n_pos, cfg.dim) if cfg.pos_embed == "learned" else None
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = build_blocks(cfg, causal=True, context={"max_len": n_pos})
        self.ln_f = nn.LayerNorm(cfg.dim) if cfg.final_norm else nn.Identity()
        self.read_out = nn.Linear(cfg.dim, 1)
        init_weights(self)
        set_norm_eps(self, cfg.norm_eps)

    def forward(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        if not isinstance(xs, torch.Tensor) or xs.ndim != 3 or xs.shape[-1] != cfg.n_dims:
            raise ValueError(
                f"xs must have shape (B, N, n_dims={cfg.n_dims}), got "
                f"{tuple(xs.shape) if isinstance(xs, torch.Tensor) else type(xs).__name__}"
            )
        if not xs.is_floating_point():
            raise TypeError(f"xs must be a floating-point tensor, got {xs.dtype}")
        if not isinstance(ys, torch.Tensor) or tuple(ys.shape) != tuple(xs.shape[:2]):
            raise ValueError(
                f"ys must have shape (B, N) = {tuple(xs.shape[:2])}, got "
                f"{tuple(ys.shape) if isinstance(ys, torch.Tensor) else type(ys).__name__}"
            )
        if xs.shape[1] < 1 or xs.shape[1] > cfg.max_points:
            raise ValueError(f"N={xs.shape[1]} points given; this model takes 1..max_points={cfg.max_points}")
        z = interleave(xs, ys)
        h = self.read_in(z)
        t = h.shape[1]
        if self.wpe is not None:
            h = h + self.wpe(torch.arange(t, device=h.device))
        elif cfg.pos_embed == "sinusoidal":
            h = h + sinusoidal_positions(t, cfg.dim, device=h.device, dtype=h.dtype)
        h = self.drop(h)
        for blk in self.blocks:
            h = blk(h)
        return self.read_out(self.ln_f(h))[:, ::2, 0]
