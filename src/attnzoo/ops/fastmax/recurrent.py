"""Token-by-token causal Fastmax: the running moment sums of FAST eqs 34-35 as a recurrent state."""

from __future__ import annotations

from typing import NamedTuple

import torch

from attnzoo._checks import check_ndim, check_positive_int
from attnzoo.ops._varlen import check_attention_mask
from attnzoo.ops.fastmax.common import (
    DEFAULT_CHUNK,
    check_p,
    half_block,
    half_feature_dim,
    half_features,
    resolve_scale,
    standardize,
)

__all__ = ["FastmaxState", "fastmax_init_state", "fastmax_prompt_state", "fastmax_step"]


class FastmaxState(NamedTuple):
    """Running sums over the tokens seen so far, float32 (float64 for float64 decoding).

    ``num (B, H, P, Dv)``: ``sum_n phi(k_hat_n) v_n^T`` = x^(1), x^(2), x^(3)/sqrt(2) of eq 34 stacked;
    ``den (B, H, P)``: ``sum_n phi(k_hat_n)`` = y^(1), y^(2), y^(3)/sqrt(2) of eq 35 stacked. At p = 2 the
    quadratic rows are the symmetric half of x^(3), y^(3) (:func:`~attnzoo.ops.fastmax.common.half_features`,
    ``P = 1 + D + D(D+1)/2``): each token reads and writes half as many sums as with the full ``D^2`` block.
    """

    num: torch.Tensor
    den: torch.Tensor


def fastmax_init_state(
    batch_size: int,
    heads: int,
    head_dim: int,
    value_dim: int | None = None,
    *,
    p: int = 2,
    device=None,
    dtype: torch.dtype | None = None,
) -> FastmaxState:
    """Empty state (zero sums); ``dtype`` below float32 is promoted to float32 so sums never accumulate in half."""
    check_positive_int("batch_size", batch_size)
    check_positive_int("heads", heads)
    check_positive_int("head_dim", head_dim)
    value_dim = head_dim if value_dim is None else value_dim
    check_positive_int("value_dim", value_dim)
    check_p(p)
    sd = torch.promote_types(dtype or torch.float32, torch.float32)
    pd = half_feature_dim(head_dim, p)
    return FastmaxState(
        torch.zeros(batch_size, heads, pd, value_dim, device=device, dtype=sd),
        torch.zeros(batch_size, heads, pd, device=device, dtype=sd),
    )


def fastmax_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state: FastmaxState,
    *,
    p: int = 2,
    scale: float | None = None,
    attention_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, FastmaxState]:
    """One causal step (eqs 32-35): ``q (B, H, 1, D)``, ``k (B, G, 1, D)``, ``v (B, G, 1, Dv)`` -> ``(out (B, H, 1,
    Dv), new state)``; the sums are kept per key/value head (``G`` dividing ``H``, each shared by ``H / G``
    consecutive query heads; ``G = H`` is plain multi-head).

    Pure: the input state is not modified. The new token is added to the sums before they are read, so the
    output attends to tokens ``<= t`` exactly like the parallel causal op. ``attention_mask (B, 1)`` (True/1 = a
    real token): a padding token leaves its row's sums unchanged and gets zero output, so decoding a padded
    prompt equals decoding it unpadded.
    """
    check_p(p)
    check_ndim("q", q, 4, "(B, H, 1, D)")
    check_ndim("k", k, 4, "(B, G, 1, D)")
    check_ndim("v", v, 4, "(B, G, 1, Dv)")
    b, h, _, d = q.shape
    g = k.shape[1]
    if k.shape != (b, g, 1, d) or q.shape[2] != 1 or v.shape[:3] != k.shape[:3] or h % g:
        raise ValueError(
            f"fastmax_step takes one token: q (B, H, 1, D), k (B, G, 1, D) and v (B, G, 1, Dv) with G dividing H; "
            f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if not isinstance(state, FastmaxState):
        raise TypeError(f"state must be a FastmaxState (see fastmax_init_state), got {type(state).__name__}")
    pd = half_feature_dim(d, p)
    want = (b, g, pd, v.shape[-1])
    if tuple(state.num.shape) != want or tuple(state.den.shape) != want[:3]:
        raise ValueError(
            f"state shapes num {tuple(state.num.shape)}, den {tuple(state.den.shape)} do not match "
            f"num {want}, den {want[:3]} for these inputs with p={p}"
        )
    scale = resolve_scale(scale, d)
    real = None if attention_mask is None else check_attention_mask(attention_mask, b, 1).to(q.device)
    sd = state.num.dtype
    fq = half_features(standardize(q.to(sd)) * scale, p).reshape(b, g, h // g, pd)  # each key/value head's queries
    fk = half_features(standardize(k.to(sd)), p)
    if real is not None:
        fk = torch.where(real[:, :, None, None], fk, 0.0)  # padding: nothing enters the sums
    num = _add_outer(state.num, fk, v.to(sd))
    den = state.den + fk[..., 0, :]
    norm = fq @ den.unsqueeze(-1)  # eq 35's G per query head
    if real is not None:  # a row with no real token yet has G = 0: zero output, not 0/0
        keep = real[:, :, None, None]
        out = torch.where(keep, (fq @ num) / torch.where(keep, norm, 1.0), 0.0)
    else:
        out = (fq @ num) / norm
    return out.reshape(b, h, 1, -1).to(v.dtype), FastmaxState(num, den)


def _add_outer(num: torch.Tensor, fk: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``num + phi(k)^T v`` for one token: ``num (B, H, P, Dv)``, ``fk (B, H, 1, P)``, ``v (B, H, 1, Dv)``. One
    ``baddbmm`` writes the new sums without a ``(B, H, P, Dv)`` temporary for the outer product (at p = 2 and head
    dimension 64 that is 2,145 x 64 values per head, per token)."""
    b, h, p, dv = num.shape
    out = torch.baddbmm(num.reshape(b * h, p, dv), fk.reshape(b * h, 1, p).transpose(1, 2), v.reshape(b * h, 1, dv))
    return out.view(b, h, p, dv)


def fastmax_prompt_state(
    k: torch.Tensor, v: torch.Tensor, *, p: int = 2, real: torch.Tensor | None = None
) -> FastmaxState:
    """The state :func:`fastmax_step` holds after feeding the prompt's raw keys ``k (B, H, N, D)`` and values ``v
    (B, H, N, Dv)`` (eqs 34-35): ``num (B, H, P, Dv) = sum_n phi(k_hat_n) v_n^T`` and ``den
    (B, H, P) = sum_n phi(k_hat_n)`` over each row's real tokens (``real (B, N)`` bool, or all). The quadratic
    block of ``phi`` is never built: ``sum_n (k_n k_n^T) v_n`` is one product of ``K^T`` with the rows ``k_n (x) v_n``
    (a GEMM, not ``N x P`` elementwise features)."""
    sd = torch.promote_types(k.dtype, torch.float32)  # the sums' dtype of init_state / fastmax_step
    b, h, n, d = k.shape
    dv = v.shape[-1]
    ks, vs = standardize(k.to(sd)), v.to(sd)
    if real is not None:  # padding adds nothing: its rows (and its 1 in phi) are zero
        r = real[:, None, :, None].to(sd)
        ks, vs, count = ks * r, vs * r, r.sum(dim=2).expand(b, h, 1)
    else:
        count = ks.new_full((b, h, 1), float(n))
    num = [vs.sum(dim=2, keepdim=True), ks.transpose(-1, -2) @ vs]
    den = [count, ks.sum(dim=2)]
    if p == 2:
        quad = ks.new_zeros(b, h, d, d * dv)
        for i in range(0, n, DEFAULT_CHUNK):  # token chunks bound the (B, H, chunk, D * Dv) rows k_n (x) v_n
            kc, vc = ks[:, :, i : i + DEFAULT_CHUNK], vs[:, :, i : i + DEFAULT_CHUNK]
            quad += kc.transpose(-1, -2) @ (kc.unsqueeze(-1) * vc.unsqueeze(-2)).flatten(-2)
        num.append(half_block(quad.reshape(b, h, d, d, dv)))
        den.append(half_block((ks.transpose(-1, -2) @ ks).unsqueeze(-1)).squeeze(-1))
    return FastmaxState(torch.cat(num, dim=2), torch.cat(den, dim=2))
