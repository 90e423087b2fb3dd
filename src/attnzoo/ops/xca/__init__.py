"""Cross-covariance attention (XCiT, El-Nouby et al., 2021) on ``(B, H, N, P)`` tensors: attention across the
``P`` channels of each head (a ``(P, P)`` map per head), linear in ``N``. Bidirectional only: the map sums over
every token, so there is no causal form (the op has no ``causal`` argument).

Backends: ``"naive"`` (:mod:`.naive`), ``"torch"`` (normalisation folded into the Gram matrix, :mod:`.fused`);
``"auto"`` follows :mod:`attnzoo.ops._dispatch` (:data:`XCA` declares the mechanism).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attnzoo._checks import check_dropout, check_finite, check_overflow, check_probability
from attnzoo.ops._dispatch import call_backend
from attnzoo.ops._spec import BenchCase, Card, Mechanism, ProjectionOptions, Projections, op_backends, option
from attnzoo.ops._tensor_validation import check_tensors
from attnzoo.ops.xca.naive import xca_naive, xca_weights  # noqa: F401  (the spec's backends look it up here)
from attnzoo.ops.xca.parallel import xca_fused  # noqa: F401  (the spec's backends look it up here)

__all__ = ["xca", "xca_weights", "as_temperature", "XCAOptions", "XCA"]


@dataclass(frozen=True)
class XCAOptions(ProjectionOptions):
    """Options of cross-covariance attention (XCiT layout)."""

    attn_dropout: float = option(0.0, check_probability, "dropout on the (P, P) channel attention (training only)")


XCA = Mechanism(
    op="xca",
    options=XCAOptions,
    backends=op_backends(xca_naive, xca_fused),
    causal=False,  # the (P, P) map sums over every token
    checks="attnzoo.ops.xca.selftest_cases",
    projections=Projections(qkv="qkv", out="proj", follows=("qkv_bias", "proj_bias", "attn_dropout", "proj_dropout")),
    bench=(BenchCase("xca", "attnzoo.ops.xca.bench:xca", module={}),),
    card=Card("XCiT, El-Nouby et al. 2021", "O(N)", "O(N)"),
    order=2,
)


def as_temperature(temp, heads: int, like: torch.Tensor) -> torch.Tensor:
    """Validate ``temp`` (a number, or a tensor of shape ``(H,)`` / ``(H, 1, 1)``) and return it as ``(H, 1, 1)``."""
    if isinstance(temp, (int, float)) and not isinstance(temp, bool):
        if not math.isfinite(temp):
            raise ValueError(f"temp={temp!r} must be a finite number (or a finite tensor of shape (H,) or (H, 1, 1))")
        return torch.full((heads, 1, 1), float(temp), dtype=like.dtype, device=like.device)
    if not isinstance(temp, torch.Tensor):
        raise TypeError(f"temp must be a number or a tensor of shape (H,) or (H, 1, 1), got {type(temp).__name__}")
    if tuple(temp.shape) not in ((heads,), (heads, 1, 1)):
        raise ValueError(f"temp must have shape ({heads},) or ({heads}, 1, 1) for H={heads}, got {tuple(temp.shape)}")
    if not temp.is_floating_point():
        raise TypeError(f"temp must be a floating-point tensor, got dtype {temp.dtype}")
    check_finite("temp", temp)
    return temp.reshape(heads, 1, 1)


def xca(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    temp,
    *,
    dropout_p: float = 0.0,
    backend: str = "auto",
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """XCA (XCiT eq. 2): ``out = V softmax(q_hat^T k_hat * temp)^T`` with ``q_hat, k_hat`` unit-norm per channel.

    Shapes: ``q, k, v (B, H, N, P)``, ``temp (H,)`` or ``(H, 1, 1)`` (or a number) -> ``(B, H, N, P)``.
    ``attention_mask`` ``(B, N)`` (True/1 = real token) or ``cu_seqlens`` (sequences packed in one row, ``B = 1``):
    the channel norms and covariance sum over the real tokens of each sequence ``s`` alone,
    ``A_s = softmax(q_hat_s^T k_hat_s * temp)`` with ``q_hat_s = q / sqrt(sum_{n in s} q_n^2)``, and
    ``out_n = v_n A_{s(n)}^T``; padding positions give 0.
    """
    absmax = check_tensors(("q", "k", "v"), (q, k, v), op="xca")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(
            f"q, k and v must have one shape (B, H, N, P): got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    temp = as_temperature(temp, q.shape[1], q)
    if absmax:
        # q_hat, k_hat divide by per-channel norms over the N tokens: sum_n q^2 overflows first
        for name in ("q", "k"):
            check_overflow(
                "xca",
                name,
                absmax,
                absmax[name] ** 2 * q.shape[-2],
                q.dtype,
                f"the per-channel sum of {name}^2 over N tokens",
            )
    dropout_p = check_dropout("dropout_p", dropout_p)
    return call_backend(
        XCA,
        backend,
        (q, k, v, temp),
        name="q",
        dropout_p=dropout_p,
        attention_mask=attention_mask,
        cu_seqlens=cu_seqlens,
    )
