"""Fastmax with dropout on the factorised terms, the three placements of FAST §2.4 / Fig. 2.

Fastmax never builds the attention matrix, so dropout acts on the factorisation instead. Masks are drawn
per (batch, head) and shared by all positions (they act on the moment sums, which every query reads):

* ``"standard"``: uniform dropout over the feature dimensions of the factorised terms of order >= 1 (the
  rows of x^(2), x^(3) and y^(2), y^(3) of eqs 28-29 / 34-35). The same mask is applied to numerator and
  denominator terms so every row of the implied weights still sums to 1; the order-0 terms x^(1), y^(1)
  are kept so the denominator keeps its ``sum_n 1`` part.
* ``"quadratic"``: the same, restricted to the quadratic terms x^(3), y^(3) (p=2 only), the paper's best.
* ``"1d"``: whole-token dropout: all dimensions of a token's ``q_hat_i`` or ``k_hat_j`` are zeroed
  (independent masks for q and k) before the factorised terms are formed; a dropped key then scores
  ``f(0) = 1`` instead of vanishing, so denominators stay positive.

Kept entries are rescaled by ``1 / (1 - rate)`` (inverted dropout). Feature dropout makes the kernel no longer
``f(q . k)``, so the weights of "standard"/"quadratic" may be negative (as with the paper's scheme);
"1d" keeps f and its non-negativity (p=2). "standard"/"quadratic" use plain autograd through the
factorisation (the §2.5 custom backward assumes the exact kernel); "1d" reuses the custom-backward op.
"""

from __future__ import annotations

import torch

from attnzoo._checks import check_choice, check_probability
from attnzoo.ops.fastmax.chunk import factorized_forward, fastmax_factorized
from attnzoo.ops.fastmax.common import (
    compute_dtype,
    feature_dim,
    features,
    standardize,
)
from attnzoo.ops.fastmax.naive import naive_from_hat, standardize_naive

__all__ = ["DROPOUT_PLACEMENTS", "check_dropout_placement", "sample_dropout_masks", "masked_fastmax"]

DROPOUT_PLACEMENTS = ("none", "standard", "1d", "quadratic")


def check_dropout_placement(rate, placement: str, p: int, name: str = "attn_dropout") -> None:
    """A ``placement`` from :data:`DROPOUT_PLACEMENTS` that order ``p`` has and that fits the probability ``rate``."""
    check_choice("dropout_placement", placement, DROPOUT_PLACEMENTS)
    check_probability(name, rate)
    if placement == "quadratic" and p != 2:
        raise ValueError(f"dropout_placement='quadratic' needs p=2 (p={p} has no quadratic terms)")
    if placement == "none" and rate > 0:
        raise ValueError(f"{name}={rate} needs a dropout_placement among {list(DROPOUT_PLACEMENTS[1:])}, got 'none'")


def sample_dropout_masks(
    placement: str,
    rate: float,
    *,
    shape: tuple[int, int, int, int],
    p: int,
    device=None,
    dtype: torch.dtype = torch.float32,
    generator: torch.Generator | None = None,
) -> dict[str, torch.Tensor]:
    """Draw the masks of ``placement`` for ``shape = (B, H, N, D)``.

    Returns ``{"feat": (B, H, P)}`` for "standard"/"quadratic", ``{"q": (B, H, N, 1), "k": (B, H, N, 1)}``
    for "1d", ``{}`` for "none" or rate 0.
    """
    if placement == "none" or rate == 0:
        return {}
    b, h, n, d = shape
    keep = 1.0 - rate

    def bern(*size: int) -> torch.Tensor:
        probs = torch.full(size, keep, device=device, dtype=dtype)
        return torch.bernoulli(probs, generator=generator) / keep

    if placement == "1d":
        return {"q": bern(b, h, n, 1), "k": bern(b, h, n, 1)}
    pd = feature_dim(d, p)
    first = 1 if placement == "standard" else 1 + d
    feat = torch.cat([torch.ones(b, h, first, device=device, dtype=dtype), bern(b, h, pd - first)], dim=-1)
    return {"feat": feat}


def masked_fastmax(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    rate: float,
    placement: str,
    p: int,
    causal: bool,
    scale: float,
    chunk: int,
    form: str,
    masks: dict[str, torch.Tensor] | None,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """The masked kernel of :func:`attnzoo.ops.fastmax.fastmax_dropout` on checked arguments: ``form`` is
    ``"explicit"`` (an N x N matrix, the reference), ``"autograd"`` (the sweeps, differentiated by autograd) or
    ``"custom_grad"`` (the sweeps with FAST's backward where the masks keep the kernel exact)."""
    cd = compute_dtype(q.dtype)
    if masks is None:
        masks = sample_dropout_masks(
            placement, rate, shape=tuple(q.shape), p=p, device=q.device, dtype=cd, generator=generator
        )
    explicit = form == "explicit"
    std = standardize_naive if explicit else standardize
    qs, kh, vv = std(q.to(cd)) * scale, std(k.to(cd)), v.to(cd)
    if "q" in masks:
        qs, kh = qs * masks["q"].to(cd), kh * masks["k"].to(cd)
    feat = masks.get("feat")
    if feat is None:
        if explicit:
            out = naive_from_hat(qs, kh, vv, p=p, causal=causal)
        else:
            out = fastmax_factorized(qs, kh, vv, p=p, causal=causal, chunk=chunk, custom_grad=form == "custom_grad")
    elif explicit:
        out = _naive_feature_masked(qs, kh, vv, feat.to(cd), p=p, causal=causal)
    else:
        out = factorized_forward(qs, kh, vv, p, causal, chunk, feat_mask=feat.to(cd))[0]
    return out.to(v.dtype)


def _naive_feature_masked(qs, kh, v, feat, *, p: int, causal: bool) -> torch.Tensor:
    """Explicit-matrix form of the feature-masked kernel ``sum_f m_f phi_f(q) phi_f(k)``."""
    w = (features(qs, p) * feat.unsqueeze(-2)) @ features(kh, p).transpose(-1, -2)
    if causal:
        n = w.shape[-1]
        keep = torch.ones(n, n, dtype=torch.bool, device=w.device).tril()
        w = torch.where(keep, w, torch.zeros((), dtype=w.dtype, device=w.device))
    return (w / w.sum(-1, keepdim=True)) @ v
