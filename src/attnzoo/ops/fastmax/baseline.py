"""Fastmax written the straightforward way: what a user would write without attnzoo (a bench baseline).

FAST eqs 5-12 (causal 30-35) transcribed plainly: standardise q and k (eqs 5-6, ``F.layer_norm``), then the moment
sums of eqs 28-29 by ``einsum``; causal rows read prefix sums of the same moments (``cumsum`` over tokens, so
O(N D^p Dv) memory per head). No chunking, no custom backward: autograd differentiates it. ``attnzoo bench
--mechanisms fastmax_p1,fastmax_p1_baseline`` times it beside the op (the mechanism's ``bench`` declares both), and
``tests/bench/test_bench.py`` checks it computes the op's numbers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from attnzoo.ops._bench import Case, Shape, nbytes, randn
from attnzoo.ops.fastmax.common import EPS

__all__ = ["MAX_BASELINE_BYTES", "fastmax_baseline", "FastmaxBaseline", "p1", "p2", "p1_module", "p2_module"]

#: the causal Fastmax prefix moments are O(N D^p Dv) per head; above this many bytes the baseline refuses
#: (``MemoryError``, recorded by the bench as ``oom``) instead of exhausting a shared machine's memory
MAX_BASELINE_BYTES = 2 << 30


def _standardize(x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), eps=EPS)


def fastmax_baseline(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, p: int, causal: bool, scale: float | None = None
) -> torch.Tensor:
    """Fastmax by the einsum factorisation of FAST eqs 11-12 / 30-35: ``q, k (B, H, N, D)``, ``v (B, H, N, Dv)``.

    ``f(s) = 1 + s (+ s^2 / 2)`` with ``s = scale * q_hat . k_hat`` (default ``scale = D**-0.5``, as
    :func:`attnzoo.ops.fastmax`). Inputs are used in their own dtype.
    """
    if p not in (1, 2):
        raise ValueError(f"p={p!r}; the Fastmax baseline supports p in [1, 2]")
    b, h, n, d = q.shape
    dv = v.shape[-1]
    qs = _standardize(q) * (d**-0.5 if scale is None else scale)
    kh = _standardize(k)
    if not causal:
        # eq 28 (numerator moments) and eq 29 (denominator moments), summed over all tokens
        num = v.sum(2).unsqueeze(2) + torch.einsum("bhnd,bhde->bhne", qs, torch.einsum("bhnd,bhne->bhde", kh, v))
        den = n + torch.einsum("bhnd,bhd->bhn", qs, kh.sum(2))
        if p == 2:
            kkv = torch.einsum("bhnd,bhne,bhnf->bhdef", kh, kh, v)
            num = num + 0.5 * torch.einsum("bhnd,bhne,bhdef->bhnf", qs, qs, kkv)
            den = den + 0.5 * torch.einsum("bhnd,bhne,bhde->bhn", qs, qs, torch.einsum("bhnd,bhne->bhde", kh, kh))
        return num / den.unsqueeze(-1)
    # eqs 32-35: the same moments as prefix sums over the tokens
    need = b * h * n * d**p * (dv + 1) * q.element_size()
    if need > MAX_BASELINE_BYTES:
        raise MemoryError(
            f"the causal Fastmax baseline would hold {need / 2**30:.1f} GiB of prefix moments "
            f"(B*H*N*D^p*(Dv+1) at B={b}, H={h}, N={n}, D={d}, p={p}); limit {MAX_BASELINE_BYTES / 2**30:.0f} GiB"
        )
    pos = torch.arange(1, n + 1, dtype=q.dtype, device=q.device)
    num = v.cumsum(2) + torch.einsum("bhnd,bhnde->bhne", qs, torch.einsum("bhnd,bhne->bhnde", kh, v).cumsum(2))
    den = pos + torch.einsum("bhnd,bhnd->bhn", qs, kh.cumsum(2))
    if p == 2:
        kkv = torch.einsum("bhnd,bhne,bhnf->bhndef", kh, kh, v).cumsum(2)
        kk = torch.einsum("bhnd,bhne->bhnde", kh, kh).cumsum(2)
        num = num + 0.5 * torch.einsum("bhnd,bhne,bhndef->bhnf", qs, qs, kkv)
        den = den + 0.5 * torch.einsum("bhnd,bhne,bhnde->bhn", qs, qs, kk)
    return num / den.unsqueeze(-1)


class FastmaxBaseline(nn.Module):
    """``proj(fastmax_baseline(qkv(x)))`` with the parameter shapes of attnzoo's Fastmax layer."""

    def __init__(self, dim: int, heads: int, p: int, causal: bool) -> None:
        super().__init__()
        self.heads, self.p, self.causal = heads, p, causal
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = rearrange(self.qkv(x), "b n (three h p) -> three b h n p", three=3, h=self.heads)
        out = fastmax_baseline(q, k, v, p=self.p, causal=self.causal)
        return self.proj(rearrange(out, "b h n p -> b n (h p)"))


def _case(s: Shape, causal: bool, device: torch.device, dtype: torch.dtype, p: int) -> Case:
    q, k, v = randn((s.batch, s.heads, s.length, s.head_dim), device, dtype, 3)
    return [q, k, v], lambda: fastmax_baseline(q, k, v, p=p, causal=causal), 4 * nbytes(q)


def p1(s: Shape, causal: bool, device: torch.device, dtype: torch.dtype) -> Case:
    """Bench case ``fastmax_p1_baseline`` (op level)."""
    return _case(s, causal, device, dtype, 1)


def p2(s: Shape, causal: bool, device: torch.device, dtype: torch.dtype) -> Case:
    """Bench case ``fastmax_p2_baseline`` (op level)."""
    return _case(s, causal, device, dtype, 2)


def p1_module(dim: int, heads: int, *, causal: bool, max_len: int) -> nn.Module:  # noqa: ARG001
    """Bench case ``fastmax_p1_baseline`` (module level)."""
    return FastmaxBaseline(dim, heads, 1, causal)


def p2_module(dim: int, heads: int, *, causal: bool, max_len: int) -> nn.Module:  # noqa: ARG001
    """Bench case ``fastmax_p2_baseline`` (module level)."""
    return FastmaxBaseline(dim, heads, 2, causal)
