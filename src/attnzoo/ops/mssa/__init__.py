"""Multi-head subspace self-attention (MSSA) on ``(B, H, N, P)`` projections ``w = U_k^T Z`` (CRATE, Yu et al.
2023; AoT, Wang et al., eqs. 3/5 with ``phi = softmax``, §4.1 for the causal, query-normalised LM form).

The op is the per-head attention ``softmax(q w^T * scale [masked]) w``; the lift back through ``U_k`` (or a
learned output projection) is the module's job. Backends: ``"naive"`` (:mod:`.naive`), ``"torch"`` (SDPA with
``q = k = v = w``, :mod:`.sdpa`); ``"auto"`` follows :mod:`attnzoo.ops._dispatch` (:data:`MSSA` declares the
mechanism).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnzoo._checks import (
    check_bool,
    check_dropout,
    check_optional_scale,
    check_overflow,
    check_probability,
    check_scale,
)
from attnzoo.ops._dispatch import call_backend
from attnzoo.ops._spec import BenchCase, Card, Mechanism, Options, Projections, op_backends, option
from attnzoo.ops._tensor_validation import check_tensors
from attnzoo.ops.mssa.naive import mssa_naive, mssa_query, mssa_weights  # noqa: F401
from attnzoo.ops.mssa.parallel import mssa_sdpa  # noqa: F401  (the spec's backends look it up here)

__all__ = ["mssa", "mssa_weights", "mssa_query", "MSSAOptions", "MSSA"]


def _check_head_dim(name: str, value) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(
            f"{name} must be a positive int (subspace dimension p) or None for dim // heads, got {value!r}"
        )
    return value


@dataclass(frozen=True)
class MSSAOptions(Options):
    """Options of MSSA (CRATE / AoT layout)."""

    scale: float | None = option(None, check_optional_scale, "score scale; None -> head_dim ** -0.5")
    normalize_query: bool = option(False, check_bool, "unit-norm queries (AoT §4.1)")
    out_proj: bool = option(True, check_bool, "learned output lift (CRATE); False: the transposed U (eq. 3)")
    head_dim: int | None = option(None, _check_head_dim, "subspace dimension p; None -> dim // heads")
    attn_dropout: float = option(0.0, check_probability, "dropout on the attention weights (training only)")
    proj_dropout: float = option(0.0, check_probability, "dropout after the output lift")
    tied: bool = option(True, check_bool, "one projection as query, key and value; False: three (an ablation)")


MSSA = Mechanism(
    op="mssa",
    options=MSSAOptions,
    backends=op_backends(mssa_naive, mssa_sdpa),
    causal=True,
    state=dict,
    examples=({"normalize_query": True, "out_proj": False}, {"head_dim": 5}),  # the cache {"w"}
    checks="attnzoo.ops.mssa.selftest_cases",
    projections=Projections(shared="qkv", out="to_out"),
    bench=(BenchCase("mssa", "attnzoo.ops.mssa.bench:mssa", causal=True, module={}),),
    card=Card("CRATE / AoT (multi-head subspace self-attention)", "O(N²)", "O(N)", causal="normalised queries, AoT LM"),
    order=3,
)


def mssa(
    w: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    normalize_query: bool = False,
    dropout_p: float = 0.0,
    backend: str = "auto",
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """MSSA per head (AoT eq. 3 / CRATE eq. 9 inner term): ``softmax(q w^T * scale [masked]) w``.

    ``w (B, H, N, P)`` -> ``(B, H, N, P)``. ``q = w``, or ``w / |w|`` row-wise when ``normalize_query`` (AoT §4.1,
    following Reformer's shared-QK normalisation; keys and values stay unnormalised). ``causal``: token ``i``
    attends to ``j <= i`` (AoT's ``Mask``). ``scale`` defaults to ``P ** -0.5`` (CRATE's ``dim_head ** -0.5``).
    ``attention_mask`` ``(B, N)`` (True/1 = real token) or ``cu_seqlens`` (sequences packed in one row, ``B = 1``):
    ``out_i = sum_{j: s(j) = s(i)} softmax_j(q_i w_j^T * scale [j <= i]) w_j`` over the real tokens of ``i``'s own
    sequence (each sequence as if alone; the subspace projection and query normalisation are per token); padding
    positions give 0.
    """
    absmax = check_tensors(("w",), (w,), op="mssa")
    check_bool("causal", causal)
    check_bool("normalize_query", normalize_query)
    scale = check_scale(scale, w.shape[-1])
    if absmax:
        # scores w.w * scale (and the row norms of the normalised query) overflow first: softmax then gives NaN
        check_overflow(
            "mssa", "w", absmax, absmax["w"] ** 2 * w.shape[-1] * max(scale, 1.0), w.dtype, "a score w.w * scale"
        )
    dropout_p = check_dropout("dropout_p", dropout_p)
    return call_backend(
        MSSA,
        backend,
        (w,),
        name="w",
        causal=causal,
        scale=scale,
        normalize_query=normalize_query,
        dropout_p=dropout_p,
        attention_mask=attention_mask,
        cu_seqlens=cu_seqlens,
    )
