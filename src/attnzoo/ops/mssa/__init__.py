"""Multi-head subspace self-attention (MSSA) on ``(B, H, N, P)`` projections ``w = U_k^T Z`` (CRATE, Yu et al.
2023; AoT, Wang et al., eqs. 3/5 with ``phi = softmax``, §4.1 for the causal, query-normalised LM form).

The op is the per-head attention ``softmax(q w^T * scale [masked]) w``; the lift back through ``U_k`` (or a
learned output projection) is the module's job. Backends: ``"naive"`` (:mod:`.naive`), ``"torch"`` (SDPA with
``q = k = v = w``, :mod:`.sdpa`), ``"triton"`` once a ``triton.py`` here exports ``mssa_triton``; ``"auto"`` =
Triton on CUDA when present, else ``"torch"``.
"""
from __future__ import annotations

import torch

from attnzoo.ops.mssa.naive import mssa_naive, mssa_query, mssa_weights
from attnzoo.ops.mssa.sdpa import mssa_sdpa
from attnzoo._checks import check_overflow
from attnzoo.ops.softmax._common import check_dropout, check_scale, check_tensors, resolve_backend

__all__ = ["mssa", "mssa_weights", "mssa_query"]


def mssa(
    w: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    normalize_query: bool = False,
    dropout_p: float = 0.0,
    backend: str = "auto",
) -> torch.Tensor:
    """MSSA per head (AoT eq. 3 / CRATE eq. 9 inner term): ``softmax(q w^T * scale [masked]) w``.

    ``w (B, H, N, P)`` -> ``(B, H, N, P)``. ``q = w``, or ``w / |w|`` row-wise when ``normalize_query`` (AoT §4.1,
    following Reformer's shared-QK normalisation; keys and values stay unnormalised). ``causal``: token ``i``
    attends to ``j <= i`` (AoT's ``Mask``). ``scale`` defaults to ``P ** -0.5`` (CRATE's ``dim_head ** -0.5``).
    """
    absmax = check_tensors(("w",), (w,), op="mssa")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    if not isinstance(normalize_query, bool):
        raise TypeError(f"normalize_query must be a bool, got {normalize_query!r}")
    scale = check_scale(scale, w.shape[-1])
    if absmax:
        # scores w.w * scale (and the row norms of the normalised query) overflow first: softmax then gives NaN
        check_overflow("mssa", "w", absmax, absmax["w"] ** 2 * w.shape[-1] * max(scale, 1.0), w.dtype,
                       "a score w.w * scale")
    dropout_p = check_dropout("dropout_p", dropout_p)
    kind, fn = resolve_backend("mssa", __name__, backend, w)
    kw = dict(causal=causal, scale=scale, normalize_query=normalize_query, dropout_p=dropout_p)
    if kind == "naive":
        return mssa_naive(w, **kw)
    if kind == "triton":
        return fn(w, **kw)
    return mssa_sdpa(w, **kw)
