"""Linear attention (Katharopoulos et al., 2020) on ``(B, H, N, P)`` tensors with ``phi(x) = elu(x) + 1``.

``out_i = phi(q_i)^T sum_j phi(k_j) v_j^T / (phi(q_i)^T sum_j phi(k_j) + eps)`` with ``j`` over all tokens, or
``j <= i`` when causal. Backends: ``"naive"`` (explicit ``(N, N)`` matrix, :mod:`.naive`), ``"torch"``
(``phi(K)^T V`` factorisation / chunked causal prefix states, :mod:`.chunk`); ``"auto"`` follows
:mod:`attnzoo.ops._dispatch` (:data:`LINEAR` declares the mechanism).
:func:`linear_attention_recurrent` is the token-by-token form (:mod:`.recurrent`) used for decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnzoo._checks import check_bool, check_ndim, check_nonneg_finite, check_optional_positive_int, check_overflow
from attnzoo.ops import _cpu_kernels
from attnzoo.ops._dispatch import call_backend
from attnzoo.ops._kernels.feature_attention import feature_attention_cpu, kernel_covers
from attnzoo.ops._spec import (
    Backend,
    BenchCase,
    Card,
    GroupedProjectionOptions,
    Mechanism,
    Projections,
    op_backends,
    option,
)
from attnzoo.ops._tensor_validation import check_qkv
from attnzoo.ops._varlen import segments
from attnzoo.ops.linear.chunk import linear_attention_chunk  # noqa: F401  (the spec's backends look it up here)
from attnzoo.ops.linear.naive import FEATURE_MAPS, feature_map_fn, linear_attention_naive, linear_attention_weights  # noqa: F401
from attnzoo.ops.linear.recurrent import (
    LinearState,
    init_linear_state,
    linear_attention_recurrent_loop,
    linear_prompt_state,
)

__all__ = [
    "linear_attention",
    "linear_attention_recurrent",
    "linear_attention_weights",
    "init_linear_state",
    "linear_prompt_state",
    "FEATURE_MAPS",
    "LinearOptions",
    "LINEAR",
]


def check_feature_map(_name: str, value) -> str:
    feature_map_fn(value)
    return value


@dataclass(frozen=True)
class LinearOptions(GroupedProjectionOptions):
    """Options of linear attention (ViT / nanoGPT projection layout)."""

    feature_map: str = option("elu", check_feature_map, "phi: 'elu' (elu + 1, the paper's) or 'relu'")
    eps: float = option(1e-6, check_nonneg_finite, "added to the normaliser")
    chunk_size: int | None = option(None, check_optional_positive_int, "token chunk of the causal 'torch' path")


def _linear_naive(
    q, k, v, *, causal: bool, feature_map: str, eps: float, chunk_size: int | None, attention_mask=None, cu_seqlens=None
) -> torch.Tensor:
    del chunk_size  # the explicit (N, N) matrix has no chunks
    return linear_attention_naive(
        q, k, v, causal=causal, feature_map=feature_map, eps=eps, attention_mask=attention_mask, cu_seqlens=cu_seqlens
    )


def _linear_cpu(
    q, k, v, *, causal: bool, feature_map: str, eps: float, chunk_size: int | None, attention_mask=None, cu_seqlens=None
) -> torch.Tensor:
    # what the kernel does not cover (half inputs, torch.compile) runs on the PyTorch path; named explicitly, "cpu"
    # still needs the kernels built
    if not kernel_covers(q):
        if not torch.compiler.is_compiling():
            _cpu_kernels.required_cpu_kernels()
        return linear_attention_chunk(
            q, k, v, causal=causal, feature_map=feature_map, eps=eps, chunk_size=chunk_size,
            attention_mask=attention_mask, cu_seqlens=cu_seqlens,
        )  # fmt: skip
    seg = segments(q.shape[0], q.shape[2], attention_mask=attention_mask, cu_seqlens=cu_seqlens, device=q.device)
    ids = None if seg is None else seg.ids
    return feature_attention_cpu(q, k, v, causal=causal, feature_map=feature_map, eps=eps, ids=ids)


def _auto_takes_kernel(inputs: tuple, _options) -> bool:
    # faster than the PyTorch path at every size measured (docs/performance.md, 2026-11-27 16:11 UTC), masked or not
    return kernel_covers(inputs[0])


LINEAR = Mechanism(
    op="linear_attention",
    options=LinearOptions,
    backends=op_backends(
        _linear_naive, linear_attention_chunk, cpu=Backend(_linear_cpu, kind="cpu", auto_if=_auto_takes_kernel)
    ),
    causal=True,
    state=dict,
    examples=({"chunk_size": 3}, {"feature_map": "relu"}),  # {"s": (B, H, P, P), "z": (B, H, P)}
    checks="attnzoo.ops.linear.selftest_cases",
    projections=Projections(qkv="qkv", out="proj", follows=("qkv_bias", "proj_bias", "attn_dropout", "proj_dropout")),
    bench=(BenchCase("linear", "attnzoo.ops.linear.bench:linear", causal=True, module={}, decode=True, varlen=True),),
    card=Card("Katharopoulos et al. 2020", "O(N)", "O(N)", causal="recurrent"),
    order=1,
)


def _check_eps(eps) -> float:
    return LinearOptions.check("eps", eps)


def _check_qkv(q, k, v, op: str) -> None:
    absmax = check_qkv(q, k, v, op=op, same_n=True)
    if absmax:
        # phi(x) <= 1 + |x| for elu + 1 and relu; the numerator phi(q) . sum_j phi(k_j) v_j sums N * P such
        # products and the denominator N * P of them without v: beyond the dtype's range they give inf / inf = NaN
        n, p = q.shape[-2], q.shape[-1]
        bound = (1 + absmax["q"]) * (1 + absmax["k"]) * max(absmax["v"], 1.0) * n * p
        worst = max(absmax, key=lambda k: absmax[k])
        check_overflow(op, worst, absmax, bound, q.dtype, "the numerator phi(q) . sum_j phi(k_j) v_j^T")


def linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    feature_map: str = "elu",
    eps: float = 1e-6,
    backend: str = "auto",
    chunk_size: int | None = None,
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Linear attention (Katharopoulos et al. 2020, eqs. 5-6; causal eqs. 8-10).

    Shapes: ``q, k (B, H, N, P)``, ``v (B, H, N, Pv)`` -> ``(B, H, N, Pv)``. ``feature_map``: ``"elu"``
    (``elu + 1``, the paper's) or ``"relu"``. ``backend``: ``"auto"``, ``"naive"``, ``"torch"`` or ``"cpu"`` (module
    doc). ``chunk_size`` (causal ``"torch"`` path only) defaults to 64.
    ``eps = 0`` is allowed, but with ``"relu"`` a query whose features are all zero then divides 0 by 0 and its
    output row is NaN (not checked, to keep the call free of a device sync): keep ``eps > 0`` with ``"relu"``.
    ``attention_mask`` ``(B, N)`` (True/1 = real token) or ``cu_seqlens`` (sequences packed in one row, ``B = 1``):
    the moment sums run over the real tokens of the query's own sequence ``s(i)`` only,
    ``out_i = phi(q_i)^T S_i / (phi(q_i)^T z_i + eps)`` with ``S_i = sum_{j: s(j) = s(i) [, j <= i]} phi(k_j) v_j^T``
    and ``z_i`` the same sum of ``phi(k_j)`` (the causal state restarts at each sequence's first token); padding
    positions give 0. Decoding (:func:`linear_attention_recurrent`) starts each row from an empty state.
    """
    _check_qkv(q, k, v, "linear_attention")
    check_bool("causal", causal)
    feature_map_fn(feature_map)
    eps = _check_eps(eps)
    chunk_size = LinearOptions.check("chunk_size", chunk_size)
    return call_backend(
        LINEAR,
        backend,
        (q, k, v),
        name="q",
        causal=causal,
        feature_map=feature_map,
        eps=eps,
        chunk_size=chunk_size,
        attention_mask=attention_mask,
        cu_seqlens=cu_seqlens,
    )


def linear_attention_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state: LinearState | None = None,
    *,
    feature_map: str = "elu",
    eps: float = 1e-6,
) -> tuple[torch.Tensor, LinearState]:
    """Causal linear attention as an RNN (Katharopoulos et al. 2020, eqs. 18-20), continuing from ``state``.

    ``q (B, H, T, P)``, ``k (B, G, T, P)``, ``v (B, G, T, Pv)``, ``state = (S (B, G, P, Pv), z (B, G, P))`` or
    ``None`` (empty) -> ``(out (B, H, T, Pv), new_state)``. ``G`` key/value heads divide the ``H`` query heads, each
    shared by ``H / G`` consecutive query heads (grouped-query attention; ``G = H`` is plain multi-head). Pure:
    ``state`` is not modified. States are float32 (float64 for float64 inputs). Running it over a whole sequence
    equals ``linear_attention(..., causal=True)`` with ``k, v`` repeated per query head.
    """
    for name, t in (("k", k), ("v", v)):
        check_ndim(name, t, 4, "(B, G, T, P)")
    b, h, _, p = q.shape
    g, pv = k.shape[1], v.shape[-1]
    if k.shape[:2] != v.shape[:2] or k.shape[0] != b or h % g:
        raise ValueError(
            f"k and v need the batch of q and one number of key/value heads dividing q's {h} heads: got q "
            f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    rep = h // g  # the checks see each key/value head once per query head it serves, as the parallel op does
    _check_qkv(
        q,
        k.repeat_interleave(rep, 1) if rep > 1 else k,
        v.repeat_interleave(rep, 1) if rep > 1 else v,
        "linear_attention_recurrent",
    )
    feature_map_fn(feature_map)
    eps = _check_eps(eps)
    if state is None:
        state = init_linear_state(b, g, p, pv, device=q.device, dtype=q.dtype)
    if not (isinstance(state, (tuple, list)) and len(state) == 2 and all(isinstance(t, torch.Tensor) for t in state)):
        raise TypeError("state must be None or a pair of tensors (S (B, G, P, Pv), z (B, G, P))")
    s, z = state
    if tuple(s.shape) != (b, g, p, pv) or tuple(z.shape) != (b, g, p):
        raise ValueError(
            f"state shapes {tuple(s.shape)}, {tuple(z.shape)} do not match k/v: expected {(b, g, p, pv)}, {(b, g, p)}"
        )
    if s.dtype != z.dtype or not s.is_floating_point():
        raise TypeError(f"state tensors must share one floating dtype, got {s.dtype} and {z.dtype}")
    return linear_attention_recurrent_loop(q, k, v, (s, z), feature_map=feature_map, eps=eps)
