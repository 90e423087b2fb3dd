"""Optimisers: AdamW (PyTorch's) and Lion (Chen et al., 2023, "Symbolic Discovery of Optimization Algorithms")."""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

__all__ = ["Lion", "OPTIMIZERS", "build_optimizer"]

OPTIMIZERS = ("adamw", "lion")


class Lion(torch.optim.Optimizer):
    """Lion: ``u = sign(b1 m + (1 - b1) g)``; ``p -= lr (u + wd p)``; ``m = b2 m + (1 - b2) g``."""

    def __init__(
        self, params: Iterable, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99), weight_decay: float = 0.0
    ) -> None:
        if lr <= 0:
            raise ValueError(f"Lion lr must be > 0, got {lr}")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"Lion betas must lie in [0, 1), got {betas}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                m = state["exp_avg"]
                # decoupled weight decay, as in AdamW
                p.mul_(1.0 - group["lr"] * group["weight_decay"])
                update = m.mul(b1).add_(p.grad, alpha=1.0 - b1).sign_()
                p.add_(update, alpha=-group["lr"])
                m.mul_(b2).add_(p.grad, alpha=1.0 - b2)
        return loss


def build_optimizer(
    model: nn.Module, name: str, *, lr: float, weight_decay: float, betas: tuple[float, float]
) -> torch.optim.Optimizer:
    """AdamW or Lion with weight decay on matrices only (not on biases, norms, embeddings' 1-D params)."""
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer={name!r} is not supported; valid choices: {list(OPTIMIZERS)}")
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if name == "lion":
        return Lion(groups, lr=lr, betas=betas)
    return torch.optim.AdamW(groups, lr=lr, betas=betas)
