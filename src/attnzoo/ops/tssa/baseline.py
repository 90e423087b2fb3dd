"""TSSA written the straightforward way: ToST Alg. 1 and Alg. 2 (App. E) as printed (a bench baseline).

``normalize`` / softmax over heads, and for the causal variant ``cumsum`` of ``w^2``, of ``Pi w^2`` and of ``Pi``;
autograd differentiates it. ``attnzoo bench --mechanisms tssa,tssa_baseline`` times it beside the op (the mechanism's
``bench`` declares both), and ``tests/bench/test_bench.py`` checks it computes the op's numbers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from attnzoo.ops._bench import Case, Shape, nbytes, randn

__all__ = ["tssa_baseline", "TSSABaseline", "op", "module"]


def tssa_baseline(
    w: torch.Tensor, temp: torch.Tensor, *, causal: bool, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """TSSA as ToST Alg. 1 / Alg. 2 print it: ``w (B, H, N, P)``, ``temp (H,)``, ``bias (H, N_max, 1)`` -> like w.

    No guards the printed code lacks (Alg. 2 divides by ``cumsum(w**2)``, zero while a feature has only
    seen zeros; random inputs never hit that).
    """
    n = w.shape[-2]
    if not causal:
        w_normed = F.normalize(w, dim=-2)
        pi = torch.softmax(torch.sum(w_normed**2, dim=-1) * temp[:, None], dim=1)
        dots = torch.matmul((pi / (pi.sum(dim=-1, keepdim=True) + 1e-8)).unsqueeze(-2), w**2)
    else:
        w_sq = w**2
        w_sq_normed = (w_sq / torch.cumsum(w_sq, dim=-2)) + bias[:, :n, :]
        pi = torch.softmax(torch.sum(w_sq_normed, dim=-1) * temp[:, None], dim=1)
        dots = torch.cumsum(w_sq * pi.unsqueeze(-1), dim=-2) / (pi.cumsum(dim=-1)).unsqueeze(-1)
    attn = 1.0 / (1 + dots)
    return -torch.mul(w.mul(pi.unsqueeze(-1)), attn)


class TSSABaseline(nn.Module):
    """ToST Alg. 1 / Alg. 2's ``Attention`` module: ``to_out(tssa(qkv(x)))``."""

    def __init__(self, dim: int, heads: int, causal: bool, max_len: int) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(dim, dim, bias=False)
        self.temp = nn.Parameter(torch.ones(heads, 1))
        self.to_out = nn.Linear(dim, dim)
        self.bias = nn.Parameter(torch.zeros(heads, max_len, 1)) if causal else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = rearrange(self.qkv(x), "b n (h d) -> b h n d", h=self.heads)
        out = tssa_baseline(w, self.temp.view(-1), causal=self.causal, bias=self.bias)
        return self.to_out(rearrange(out, "b h n d -> b n (h d)"))


def op(s: Shape, causal: bool, device: torch.device, dtype: torch.dtype) -> Case:
    """Bench case ``tssa_baseline`` (op level)."""
    (w,) = randn((s.batch, s.heads, s.length, s.head_dim), device, dtype)
    temp = torch.ones(s.heads, device=device, dtype=dtype)
    bias = torch.zeros(s.heads, s.length, 1, device=device, dtype=dtype) if causal else None
    return [w], lambda: tssa_baseline(w, temp, causal=causal, bias=bias), 2 * nbytes(w)


def module(dim: int, heads: int, *, causal: bool, max_len: int) -> nn.Module:
    """Bench case ``tssa_baseline`` (module level)."""
    return TSSABaseline(dim, heads, causal, max_len)
