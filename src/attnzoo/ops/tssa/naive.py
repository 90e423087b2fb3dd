"""Reference TSSA: a literal transcription of ToST Algorithms 1 and 2 (App. E), eqs. 10-11 and 28.

Differentiated by autograd, no memory tricks: this is the ground truth the fast path is tested against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnzoo.ops._dtypes import acc_dtype
from attnzoo.ops._varlen import Segments

__all__ = [
    "tssa_naive",
    "tssa_pi_naive",
    "tssa_naive_varlen",
    "tssa_pi_naive_varlen",
    "safe_denominator",
    "compute_dtype",
]


#: internal precision: float32 or better, so fp16/bf16 inputs reduce over tokens in float32
compute_dtype = acc_dtype


def safe_denominator(den: torch.Tensor) -> torch.Tensor:
    """Replace exact zeros of a non-negative prefix sum by 1 (its numerator is then 0 too, so 0/0 := 0).

    Alg. 2 divides by ``cumsum(w**2)`` and ``cumsum(Pi)``, which are 0 while every token so far is 0 in
    that feature (or while Pi underflowed). A ``where`` changes nothing where the sum is positive (unlike an
    additive eps it is scale-free) and its gradient stays finite.
    """
    return torch.where(den > 0, den, torch.ones_like(den))


def _pi_noncausal(w: torch.Tensor, temp: torch.Tensor) -> torch.Tensor:
    # Alg. 1: l2-normalise each feature over the tokens (App. C.1, eq. 32), then softmax over heads (eq. 34).
    w_normed = F.normalize(w, dim=-2)
    return torch.softmax(torch.sum(w_normed**2, dim=-1) * temp[:, None], dim=1)


def _pi_causal(w: torch.Tensor, temp: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    # Alg. 2: causal normalisation by the running sum of squares plus a learned bias (eq. 39).
    n = w.shape[-2]
    w_sq = w**2
    w_sq_normed = w_sq / safe_denominator(torch.cumsum(w_sq, dim=-2)) + bias[:, :n, :]
    return torch.softmax(torch.sum(w_sq_normed, dim=-1) * temp[:, None], dim=1)


def tssa_pi_naive(
    w: torch.Tensor, temp: torch.Tensor, *, causal: bool = False, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Membership Pi ``(B, H, N)`` of eq. 10 / 39 as computed in Alg. 1 / 2 (float32 or better)."""
    cdt = compute_dtype(w.dtype)
    w, temp = w.to(cdt), temp.to(cdt)
    if causal:
        return _pi_causal(w, temp, bias.to(cdt))
    return _pi_noncausal(w, temp)


def tssa_naive(
    w: torch.Tensor, temp: torch.Tensor, *, causal: bool = False, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """TSSA head outputs ``(B, H, N, P)`` before ``to_out``: Alg. 1 (eq. 11) or Alg. 2 (eq. 28).

    ``w``: ``(B, H, N, P)``; ``temp``: ``(H,)``; ``bias``: ``(H, N_max, 1)`` (causal only).
    Inputs are assumed validated (see :func:`attnzoo.ops.tssa.tssa`).
    """
    out_dtype = w.dtype
    cdt = compute_dtype(w.dtype)
    w, temp = w.to(cdt), temp.to(cdt)
    if not causal:
        pi = _pi_noncausal(w, temp)
        # second moment of each feature under the distribution pi_k / <pi_k, 1> (eq. 6)
        dots = torch.matmul((pi / (pi.sum(dim=-1, keepdim=True) + 1e-8)).unsqueeze(-2), w**2)
    else:
        bias = bias.to(cdt)
        pi = _pi_causal(w, temp, bias)
        w_sq = w**2
        dots = torch.cumsum(w_sq * pi.unsqueeze(-1), dim=-2) / safe_denominator(pi.cumsum(dim=-1)).unsqueeze(-1)
    attn = 1.0 / (1 + dots)
    out = -torch.mul(w.mul(pi.unsqueeze(-1)), attn)
    return out.to(out_dtype)


def _each_alone(fn, w: torch.Tensor, seg: Segments, shape: tuple, out_dtype: torch.dtype, **kw) -> torch.Tensor:
    # the definition of masked/packed TSSA: each sequence's real tokens run alone, padding stays zero
    out = torch.zeros(shape, device=w.device, dtype=out_dtype)
    for row, idx in seg.sequences():
        out[row, :, idx] = fn(w[row : row + 1, :, idx], **kw)[0].to(out_dtype)
    return out


def tssa_naive_varlen(
    w: torch.Tensor, temp: torch.Tensor, seg: Segments, *, causal: bool = False, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Eq. 11 / 28 over each sequence of ``seg`` alone (its statistics over its real tokens only, the causal bias
    read at the position within the sequence), ``(B, H, N, P)`` with zeros at padding."""
    return _each_alone(tssa_naive, w, seg, w.shape, w.dtype, temp=temp, causal=causal, bias=bias)


def tssa_pi_naive_varlen(
    w: torch.Tensor, temp: torch.Tensor, seg: Segments, *, causal: bool = False, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Membership Pi ``(B, H, N)`` of eq. 10 / 39 over each sequence of ``seg`` alone, zeros at padding."""
    return _each_alone(tssa_pi_naive, w, seg, w.shape[:3], compute_dtype(w.dtype), temp=temp, causal=causal, bias=bias)
