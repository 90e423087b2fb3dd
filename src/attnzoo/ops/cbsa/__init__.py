"""CBSA op: Contract-and-Broadcast Self-Attention on already-projected per-head tensors.

Paper notation -> tensors (per head k, tokens as rows here, as columns in the paper):
``w = (U_k^T Z)^T`` ``(B, H, N, P)``; representatives ``reps = (U_k^T Q_ini)^T`` ``(B, H, M, P)``
(e.g. from :func:`pool_reps`). The op computes ``CBSA(Z | U)`` of eq 7/8 per head, *without* the
step size kappa of eq 6 or the projections (those live in :class:`attnzoo.layers.cbsa.CBSAAttention`):

1. extraction (eq 5): ``A^T = softmax_N(reps w^T * scale)`` ``(B, H, M, N)``;
   ``R = reps + eta * A^T w`` ``(B, H, M, P)``;
2. contraction: ``C = softmax_M(R R^T * scale) R`` (eq 8, "softmax") or
   ``C = (I_M + p/(M eps^2) R R^T)^{-1} R`` (eq 7, "exact");
3. broadcast: ``out = A C`` ``(B, H, N, P)``.

Variants (§3.3, Table 4, Fig. 9): "cbsa" (above), "mssa" (tokens are their own representatives, A = I,
so ``out = softmax(w w^T * scale) w`` (eq 9), or ``(I_N + p/(N eps^2) w w^T)^{-1} w`` exactly),
"linear" (eq 12: ``w (I_P + w^T w / eps^2)^{-1}``), "channel" (eq 13: channel j scaled by
``eps^2 / (eps^2 + sum_n w[n, j]^2)``), "agent" (eq 5 then broadcast, no contraction: ``out = A R``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attnzoo._checks import (
    check_bool,
    check_choice,
    check_ndim,
    check_nonneg_int,
    check_optional_positive_int,
    check_overflow,
    check_positive_finite,
    check_scale,
    finite_absmax,
)
from attnzoo.ops._dispatch import call_backend
from attnzoo.ops._spec import BenchCase, Card, Mechanism, Options, Projections, op_backends, option
from attnzoo.ops._varlen import Segments, segments
from attnzoo.ops.cbsa.naive import cbsa_naive
from attnzoo.ops.cbsa.parallel import cbsa_fast  # noqa: F401  (the spec's backends look it up here)
from attnzoo.ops.cbsa.pooling import (
    DEFAULT_NUM_REPS,
    DEFAULT_REP_GRID,
    _check_grid,
    pool_reps,
    pool_reps_1d,
    pool_reps_2d,
    pool_reps_varlen,
)

__all__ = [
    "cbsa",
    "pool_reps",
    "pool_reps_1d",
    "pool_reps_2d",
    "pool_reps_varlen",
    "resolve_contraction",
    "extracts_reps",
    "VARIANTS",
    "CONTRACTIONS",
    "BACKENDS",
    "DEFAULT_NUM_REPS",
    "DEFAULT_REP_GRID",
    "CBSAOptions",
    "CBSA",
]

VARIANTS = ("cbsa", "mssa", "linear", "channel", "agent")
CONTRACTIONS = ("softmax", "exact")
# Variants that extract representatives from ``reps`` (eq 5) and so need them.
_NEEDS_REPS = ("cbsa", "agent")
# Variants with a selectable contraction; the others fix it (eq 12/13 are the exact contraction in
# closed form, "agent" has none).
_SELECTABLE = ("cbsa", "mssa")


def extracts_reps(variant: str) -> bool:
    """Whether ``variant`` extracts representatives from ``reps`` (eq 5), and so needs them and their ``eta``."""
    return variant in _NEEDS_REPS


def resolve_contraction(variant: str, contraction: str | None) -> str | None:
    """Validate ``(variant, contraction)``; ``None`` means the variant's default ("softmax" where selectable)."""
    check_choice("variant", variant, VARIANTS)
    if variant in _SELECTABLE:
        if contraction is None:
            return "softmax"
        check_choice("contraction", contraction, CONTRACTIONS)
        return contraction
    if contraction is not None:
        fixed = "none (no contraction step)" if variant == "agent" else "the exact one in closed form"
        raise ValueError(
            f"contraction={contraction!r} cannot be chosen for variant={variant!r}, whose contraction is {fixed}; "
            f"leave contraction=None (it is selectable only for variants {list(_SELECTABLE)})"
        )
    return None


def _check_eta(eta, w: torch.Tensor):
    target = (w.shape[0], w.shape[1], 1, 1)
    if isinstance(eta, torch.Tensor):
        try:
            ok = torch.broadcast_shapes(eta.shape, target) == torch.Size(target)
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(
                f"eta must be a float or a tensor broadcastable to (B, H, 1, 1) = {target} (e.g. shape (H, 1, 1)), "
                f"got shape {tuple(eta.shape)}"
            )
        return eta
    if isinstance(eta, bool) or not isinstance(eta, (int, float)) or not math.isfinite(eta):
        raise ValueError(f"eta must be a finite float or a tensor broadcastable to (B, H, 1, 1), got {eta!r}")
    return float(eta)


def _check_reps(w: torch.Tensor, reps: torch.Tensor | None, variant: str) -> None:
    b, h, _, p = w.shape
    if extracts_reps(variant):
        if reps is None:
            raise ValueError(f"variant={variant!r} needs reps of shape (B, H, M, P) (e.g. from pool_reps(w)), got None")
        check_ndim("reps", reps, 4, "(B, H, M, P)")
        if reps.shape[0] != b or reps.shape[1] != h or reps.shape[3] != p or reps.shape[2] < 1:
            raise ValueError(
                f"reps must have shape (B, H, M, P) = ({b}, {h}, M >= 1, {p}) to match w {tuple(w.shape)}, "
                f"got {tuple(reps.shape)}"
            )
        if reps.dtype != w.dtype:
            raise TypeError(f"reps dtype {reps.dtype} differs from w dtype {w.dtype}")
    elif reps is not None:
        raise ValueError(
            f"variant={variant!r} determines its own representatives (tokens / principal directions / basis); "
            f"pass reps=None, got a tensor of shape {tuple(reps.shape)}"
        )


def _check_magnitudes(w, reps, eta, variant: str, contraction: str | None, eps: float, scale: float) -> None:
    """NaN/Inf in w, reps, eta, or magnitudes whose scores / Gram matrices would overflow (one host sync)."""
    absmax = finite_absmax({"w": w, "reps": reps, "eta": eta if isinstance(eta, torch.Tensor) else None}, op="cbsa")
    if not absmax:
        return
    n, p = w.shape[2], w.shape[3]
    # scores reps . w * scale and the Gram matrices R R^T sum P products of |R| <= |reps| + |eta| |w|;
    # the closed forms ("linear", "channel") sum w^2 over the N tokens
    eta_max = absmax.get("eta", abs(eta) if not isinstance(eta, torch.Tensor) else 0.0)
    r = absmax.get("reps", 0.0) + eta_max * absmax["w"] + absmax["w"]
    check_overflow(
        "cbsa",
        "w",
        absmax,
        r * r * p * max(scale, 1.0) * max(n, 1) / max(eps, 1e-30) ** 2
        if variant in ("linear", "channel") or contraction == "exact"
        else r * r * p * max(scale, 1.0),
        w.dtype,
        "the scores / Gram matrices of the representatives",
    )


def cbsa(
    w: torch.Tensor,
    reps: torch.Tensor | None = None,
    *,
    variant: str = "cbsa",
    contraction: str | None = None,
    eps: float = 1.0,
    scale: float | None = None,
    eta: float | torch.Tensor = 1.0,
    return_internals: bool = False,
    backend: str = "auto",
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    reps_attention_mask: torch.Tensor | None = None,
    reps_cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Contract-and-Broadcast Self-Attention (eqs 5, 7, 8) and its §3.3 variants, per head.

    Args:
        w: projected tokens ``U_k^T Z``, ``(B, H, N, P)``, N >= 1.
        reps: initial representatives ``U_k^T Q_ini``, ``(B, H, M, P)``, M >= 1; required for variants
            "cbsa"/"agent", must be ``None`` for "mssa"/"linear"/"channel" (they fix their own).
        variant: one of ``VARIANTS``.
        contraction: "softmax" (eq 8) or "exact" (eq 7) for "cbsa"/"mssa" (``None`` -> "softmax");
            must be ``None`` for the other variants.
        eps: coding precision epsilon > 0 (exact contraction, "linear", "channel").
        scale: softmax temperature (extraction and softmax contraction); default ``P ** -0.5`` as in Algorithm 1.
        eta: extraction step size of eq 5, float or tensor broadcastable to ``(B, H, 1, 1)``.
        return_internals: also return a dict: "attn_extract" ``(B, H, M, N)`` (= A_k^T), "reps" (extracted
            R, ``(B, H, M, P)``), "attn_contract" (``(B, H, M, M)``, row i = weights of rep i's contraction
            over reps; ``(B, H, N, N)`` for "mssa"), "contracted" (C), "filter" (``(B, H, P, P)``, "linear"
            and "channel": ``out = w @ filter``). Only the keys the variant has are present.
        backend: "auto" | "naive" | "torch" (both take masks).
        attention_mask / cu_seqlens: ``(B, N)`` padding mask (True = real) / ``(S + 1,)`` packed offsets (B = 1).
        reps_attention_mask / reps_cu_seqlens: the reps' sequences (:func:`pool_reps_varlen`; default: a row's, or
            split evenly in a packed row). Each sequence is CBSA alone (:mod:`attnzoo.ops.cbsa.varlen`), padding 0.

    Returns ``out`` ``(B, H, N, P)`` (same dtype as ``w``), or ``(out, internals)``. fp16/bf16 inputs are
    computed in float32.
    """
    check_ndim("w", w, 4, "(B, H, N, P)")
    contraction = resolve_contraction(variant, contraction)
    if w.shape[2] < 1 or w.shape[3] < 1:
        raise ValueError(f"w must hold at least one token and one channel, got shape {tuple(w.shape)}")
    _check_reps(w, reps, variant)
    eps = CBSAOptions.check("eps", eps)
    scale = check_scale(scale, w.shape[3])
    eta = _check_eta(eta, w)
    masks = (attention_mask, cu_seqlens, reps_attention_mask, reps_cu_seqlens)
    w, toks, reps_seg = _with_segments(w, reps, masks, return_internals)
    _check_magnitudes(w, reps, eta, variant, contraction, eps, scale)

    in_dtype = w.dtype
    if in_dtype in (torch.float16, torch.bfloat16):
        # softmax sums, Gram matrices and Cholesky factors need float32 accumulation
        w = w.float()
        reps = reps.float() if reps is not None else None
        eta = eta.float() if isinstance(eta, torch.Tensor) else eta
    elif isinstance(eta, torch.Tensor) and eta.dtype != w.dtype:
        eta = eta.to(w.dtype)

    out, internals = call_backend(
        CBSA,
        backend,
        (w, reps),
        name="w",
        variant=variant,
        contraction=contraction,
        eps=float(eps),
        scale=float(scale),
        eta=eta,
        need_internals=return_internals,
        toks=toks,
        reps_seg=reps_seg,
    )
    out = out.to(in_dtype)
    if not return_internals:
        return out
    return out, {k: v.to(in_dtype) for k, v in internals.items()}


def _with_segments(w, reps, keywords, return_internals: bool):
    """``w`` zeroed at padding, and the tokens' and representatives' :class:`Segments` (``None`` without masks)."""
    toks, reps_seg = _segments(w, reps, *keywords)
    if toks is not None:
        if return_internals:
            raise ValueError("return_internals is not available with attention_mask / cu_seqlens; run without them")
        w = w.masked_fill(~toks.real[:, None, :, None], 0)  # padding never enters a sum (nor the magnitude check)
    return w, toks, reps_seg


def _segments(w, reps, attention_mask, cu_seqlens, reps_attention_mask, reps_cu_seqlens):
    """The tokens' and the representatives' :class:`Segments` (``(None, None)`` without masks)."""
    b, n = w.shape[0], w.shape[2]
    toks = segments(b, n, attention_mask=attention_mask, cu_seqlens=cu_seqlens, device=w.device)
    given = reps_attention_mask is not None or reps_cu_seqlens is not None
    if toks is None:
        if given:
            raise ValueError("reps_attention_mask / reps_cu_seqlens need attention_mask or cu_seqlens for the tokens")
        return None, None
    if reps is None:
        if given:
            raise ValueError("reps_attention_mask / reps_cu_seqlens need reps (variants 'cbsa' and 'agent')")
        return toks, None
    m = reps.shape[2]
    if given:
        rseg = segments(b, m, attention_mask=reps_attention_mask, cu_seqlens=reps_cu_seqlens, device=w.device)
    elif cu_seqlens is not None:
        if m % toks.num:
            raise ValueError(
                f"reps hold M={m} representatives for {toks.num} packed sequences: pass reps_cu_seqlens "
                "(e.g. from pool_reps_varlen) unless M splits evenly"
            )
        rseg = segments(b, m, cu_seqlens=torch.arange(0, m + 1, m // toks.num, device=w.device))
    else:
        rseg = segments(b, m, attention_mask=torch.ones(b, m, dtype=torch.bool, device=w.device))
    crossed = (cu_seqlens is None and reps_cu_seqlens is not None) or (
        cu_seqlens is not None and given and not reps_cu_seqlens is not None
    )
    if crossed or rseg.num != toks.num:
        raise ValueError(
            f"the representatives describe {rseg.num} sequences per row but the tokens {toks.num}: pair "
            "attention_mask with reps_attention_mask and cu_seqlens with reps_cu_seqlens"
        )
    return toks, rseg


def _cbsa_naive(w, reps, *, need_internals: bool, toks: Segments | None = None, reps_seg=None, **kwargs):
    # the reference always builds its internals; like the fast path it hands them back only when asked
    if toks is not None:
        return _cbsa_naive_varlen(w, reps, toks, reps_seg, **kwargs), {}
    out, internals = cbsa_naive(w, reps, **kwargs)
    return out, internals if need_internals else {}


def _cbsa_naive_varlen(w, reps, toks: Segments, reps_seg: Segments | None, *, eta, **kwargs) -> torch.Tensor:
    """The definition with masks: every sequence run alone through :func:`cbsa_naive`, padding zero."""
    out = torch.zeros_like(w)
    for row, idx in toks.sequences():
        s = int(toks.ids[row, idx[0]])
        eta_b = eta[row : row + 1] if isinstance(eta, torch.Tensor) and eta.ndim == 4 and eta.shape[0] > 1 else eta
        reps_s = None
        if reps is not None:
            ridx = (reps_seg.ids[row] == s).nonzero().flatten()
            if not ridx.numel():
                raise ValueError(f"sequence {s} of row {row} has no representatives (check reps_attention_mask)")
            reps_s = reps[row : row + 1, :, ridx]
        o, _ = cbsa_naive(w[row : row + 1, :, idx], reps_s, eta=eta_b, **kwargs)
        out[row, :, idx] = o[0]
    return out


def _check_variant(name: str, value) -> str:
    check_choice(name, value, VARIANTS)
    return value


@dataclass(frozen=True)
class CBSAOptions(Options):
    """Options of the CBSA layer (Algorithm 1); see :class:`attnzoo.layers.cbsa.CBSAAttention`."""

    num_reps: int | None = option(None, check_optional_positive_int, "1-D pooling: M; None -> 64")
    grid: tuple[int, int] | None = option(None, doc="(Hg, Wg) token grid for 2-D pooling")
    rep_grid: tuple[int, int] | None = option(None, doc="pooled grid; None -> (min(8, Hg), min(8, Wg))")
    num_prefix_tokens: int = option(0, check_nonneg_int, "leading tokens (CLS, registers) not pooled")
    contraction: str | None = option(None, doc="'softmax' (eq 8) or 'exact' (eq 7); None -> the variant's")
    variant: str = option("cbsa", _check_variant, "'cbsa', 'mssa', 'linear', 'channel' or 'agent' (§3.3)")
    eps: float = option(1.0, check_positive_finite, "coding precision of the exact contraction / 'linear' / 'channel'")
    qkv_bias: bool = option(False, check_bool, "bias of the shared subspace projection")
    detach_init: bool = option(False, check_bool, "stop-gradient on the pooled initial representatives (sg of eq 5)")

    def validate(self) -> None:
        object.__setattr__(self, "contraction", resolve_contraction(self.variant, self.contraction))
        num_reps, grid, rep_grid = self.num_reps, self.grid, self.rep_grid
        if grid is None and rep_grid is not None:
            raise ValueError(f"rep_grid={rep_grid!r} needs a token grid; pass grid=(Hg, Wg) too, or use num_reps")
        if grid is not None and num_reps is not None:
            raise ValueError(
                f"num_reps={num_reps!r} applies to 1-D pooling only; with grid={grid!r} use rep_grid=(Mh, Mw)"
            )
        if not extracts_reps(self.variant) and (num_reps is not None or grid is not None or rep_grid is not None):
            raise ValueError(
                f"variant={self.variant!r} pools no representatives; num_reps/grid/rep_grid apply to 'cbsa' and "
                f"'agent' (got num_reps={num_reps!r}, grid={grid!r}, rep_grid={rep_grid!r})"
            )
        # the grids are checked now rather than at the first forward
        for name in ("grid", "rep_grid"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, _check_grid(name, getattr(self, name)))


CBSA = Mechanism(
    op="cbsa",
    options=CBSAOptions,
    backends=op_backends(_cbsa_naive, cbsa_fast),
    mask_options=("toks", "reps_seg"),
    causal=False,  # the representatives summarise every token
    examples=(
        {"num_reps": 4, "contraction": "exact"},
        {"variant": "agent", "num_reps": 3},
        {"variant": "linear"},
        {"variant": "channel"},
        {"variant": "mssa", "contraction": "exact"},
    ),
    checks="attnzoo.ops.cbsa.selftest_cases",
    projections=Projections(shared="proj", out="to_out"),
    bench=(BenchCase("cbsa", "attnzoo.ops.cbsa.bench:cbsa", module={}),),
    card=Card("CBSA, Contract-and-Broadcast Self-Attention (eqs 5, 7, 8)", "O(N·m)", "O(N·m)"),
    order=7,
)
BACKENDS = tuple(CBSA.backend_names())
