"""Straightforward formulations of the linear-time mechanisms: what a user would write without attnzoo.

``attnzoo bench --mechanisms fastmax_p1,fastmax_p1_baseline,...`` times each attnzoo op beside the plain
PyTorch code of the same math, so "attnzoo vs straightforward" is one command. These are our own plain
transcriptions of the papers (no chunking, no custom backward, autograd differentiates them):

* Fastmax (FAST eqs 5-12, causal 30-35): standardise q and k (eqs 5-6, ``F.layer_norm``), then the moment
  sums of eqs 28-29 by ``einsum``; causal rows read prefix sums of the same moments (``cumsum`` over tokens,
  so O(N D^p Dv) memory per head).
* TSSA (ToST Alg. 1 and Alg. 2, App. E) as printed: ``normalize`` / softmax over heads, and for the causal
  variant ``cumsum`` of ``w^2``, of ``Pi w^2`` and of ``Pi``.

They are also references: ``tests/bench/test_bench.py`` checks they compute the attnzoo ops' numbers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from attnzoo.ops.fastmax.common import EPS

__all__ = ["BASELINE_CASES", "MAX_BASELINE_BYTES", "fastmax_baseline", "tssa_baseline", "build_baseline_module"]

#: bench case name -> (mechanism, options)
BASELINE_CASES = {
    "fastmax_p1_baseline": ("fastmax", {"p": 1}),
    "fastmax_p2_baseline": ("fastmax", {"p": 2}),
    "tssa_baseline": ("tssa", {}),
}

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


class _FastmaxBaseline(nn.Module):
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


class _TSSABaseline(nn.Module):
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


def build_baseline_module(name: str, dim: int, heads: int, *, causal: bool, max_len: int = 1024) -> nn.Module:
    """The module-level baseline of bench case ``name`` (one of :data:`BASELINE_CASES`)."""
    if name not in BASELINE_CASES:
        raise ValueError(f"no baseline named {name!r}; valid: {list(BASELINE_CASES)}")
    mech, opts = BASELINE_CASES[name]
    if mech == "fastmax":
        return _FastmaxBaseline(dim, heads, opts["p"], causal)
    return _TSSABaseline(dim, heads, causal, max_len)
