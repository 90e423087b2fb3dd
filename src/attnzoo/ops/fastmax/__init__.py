"""Fastmax (FAST, Gerami et al.): polynomial-kernel attention on standardised q, k in O(N D^(p+1)).

Public op :func:`fastmax`; helpers :func:`explicit_attention` (the N x N weights, for analysis),
:func:`fastmax_init_state` / :func:`fastmax_step` / :func:`fastmax_prompt_state` (recurrent causal decoding) and
:func:`fastmax_dropout` (FAST §2.4 dropout placements).

Non-negativity of the weights (eq 10). Rows always sum to 1 by construction. For p=2,
``f(s) = 1 + s + s^2/2 = ((1 + s)^2 + 1) / 2 >= 1/2``, so weights are positive for every input and scale.
For p=1, ``f(s) = 1 + s`` is negative for ``s < -1``. Standardisation bounds the score: q_hat, k_hat have
``||x_hat||^2 = D var / (var + eps) < D``, so by Cauchy-Schwarz ``|s| = scale |q_hat . k_hat| < scale * D``.
Hence p=1 weights are non-negative for *every* input iff ``scale <= 1/D`` (the bound is attained in the
limit ``k = -q``); with the default ``scale = D**-0.5`` (or the paper's literal ``scale = 1``) and D >= 2 they
can be negative (and causal denominators can approach 0). Pass ``scale=1/D`` for a guaranteed p=1 average.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from attnzoo._checks import (
    NonFiniteError,
    check_bool,
    check_overflow,
    check_probability,
    finite_absmax,
)
from attnzoo.ops import _cpu_kernels
from attnzoo.ops._dispatch import call_backend, check_backend, resolve_backend, traced_by_forward_ad
from attnzoo.ops._kernels.feature_attention import feature_attention_cpu
from attnzoo.ops._kernels.feature_attention import (
    kernel_covers as feature_kernel_covers,  # every p and causal mode, masks native
)
from attnzoo.ops._spec import (
    Backend,
    BenchCase,
    Card,
    GroupedProjectionOptions,
    Mechanism,
    Projections,
    op_backends,
    option,
    triton_available,
)
from attnzoo.ops._varlen import Segments, segments
from attnzoo.ops.fastmax import cpu as fastmax_cpu
from attnzoo.ops.fastmax.chunk import FastmaxFunction, fastmax_factorized
from attnzoo.ops.fastmax.common import (
    EPS,
    check_p,
    compute_dtype,
    resolve_scale,
    standardize,
    validate_options,
    validate_qkv,
)
from attnzoo.ops.fastmax.dropout import (
    DROPOUT_PLACEMENTS,
    check_dropout_placement,
    masked_fastmax,
    sample_dropout_masks,
)
from attnzoo.ops.fastmax.naive import explicit_attention, fastmax_naive, naive_from_hat
from attnzoo.ops.fastmax.recurrent import FastmaxState, fastmax_init_state, fastmax_prompt_state, fastmax_step
from attnzoo.ops.fastmax.varlen import masked_sweeps

__all__ = [
    "fastmax",
    "fastmax_naive",
    "explicit_attention",
    "fastmax_init_state",
    "fastmax_prompt_state",
    "fastmax_step",
    "FastmaxState",
    "fastmax_dropout",
    "sample_dropout_masks",
    "FastmaxFunction",
    "DROPOUT_PLACEMENTS",
    "BACKENDS",
    "EPS",
    "FastmaxOptions",
    "FASTMAX",
    "MASK_BACKENDS",
]


def _triton_available() -> bool:
    return triton_available("attnzoo.ops.fastmax.triton")


def _check_p(_name: str, p) -> int:
    check_p(p)
    return p


def _check_scale(_name: str, scale) -> float | None:
    return None if scale is None else resolve_scale(scale, 1)


def _check_backend(name: str, backend) -> str:
    # at construction, with the dispatcher's one check of a backend name
    return check_backend(FASTMAX, backend, name=name)


@dataclass(frozen=True)
class FastmaxOptions(GroupedProjectionOptions):
    """Options of the Fastmax layer (FAST; ``qkv``/``proj`` projections)."""

    p: int = option(2, _check_p, "Taylor order of f (1 or 2)")
    scale: float | None = option(None, _check_scale, "score scale; None -> head_dim ** -0.5")
    attn_dropout: float = option(0.0, check_probability, "dropout rate of the factorised terms (training only)")
    dropout_placement: str = option("none", doc="'none', 'standard', '1d' or 'quadratic' (FAST §2.4)")
    backend: str = option("auto", _check_backend, "backend of the op")

    def validate(self) -> None:
        check_dropout_placement(self.attn_dropout, self.dropout_placement, self.p)


def _prepared(q, k, v, *, p: int, scale: float, sweeps: Callable) -> torch.Tensor:
    """The PyTorch, Triton and CPU backends' common frame: the value checks, the standardisation (eqs 5-6) in the
    compute dtype, ``sweeps(qs, k_hat, v)``, and p=1's check that no normaliser crossed zero. Padding is standardised
    with the rest (per token: it changes no real token) and never read by the masked sweeps, so its inputs get zero
    gradient."""
    _check_values(q, k, v, p)
    cd = compute_dtype(q.dtype)
    out = sweeps(standardize(q.to(cd), scale=scale), standardize(k.to(cd)), v.to(cd)).to(v.dtype)
    if p == 1 and scale * q.shape[-1] > 1.0:
        _check_p1_output(out, scale, q.shape[-1])
    return out


def _fastmax_naive(q, k, v, *, p: int, causal: bool, scale: float, chunk_size: int, segs=None) -> torch.Tensor:
    del chunk_size  # the explicit N x N weights have no chunks
    _check_values(q, k, v, p)
    return fastmax_naive(q, k, v, p=p, causal=causal, scale=scale, segs=segs)


def _chunked(
    q, k, v, segs: Segments | None, *, p: int, causal: bool, scale: float, chunk_size: int, custom: bool
) -> torch.Tensor:
    """The chunked factorised form (eqs 24-29, causal 32-35), of padded batches and packed rows too
    (:mod:`attnzoo.ops.fastmax.varlen`); ``custom``: with FAST §2.5's backward, else autograd through the chunks."""

    def sweeps(qs, kh, vv):
        if segs is not None:
            return masked_sweeps(qs, kh, vv, segs, p=p, causal=causal, chunk=chunk_size, custom_grad=custom)
        return fastmax_factorized(qs, kh, vv, p=p, causal=causal, chunk=chunk_size, custom_grad=custom)

    return _prepared(q, k, v, p=p, scale=scale, sweeps=sweeps)


def _fastmax_torch(q, k, v, *, p: int, causal: bool, scale: float, chunk_size: int, segs=None) -> torch.Tensor:
    # the §2.5 backward writes into strided slices (out=), which torch.compile cannot trace, and defines no jvp:
    # compiled graphs, forward-mode AD and torch.func differentiate the chunked forward instead (same values, more
    # memory)
    custom = not torch.compiler.is_compiling() and not traced_by_forward_ad((q, k, v))
    return _chunked(q, k, v, segs, p=p, causal=causal, scale=scale, chunk_size=chunk_size, custom=custom)


def _fastmax_torch_autograd(q, k, v, *, p: int, causal: bool, scale: float, chunk_size: int, segs=None) -> torch.Tensor:
    return _chunked(q, k, v, segs, p=p, causal=causal, scale=scale, chunk_size=chunk_size, custom=False)


def _fastmax_triton(q, k, v, *, p: int, causal: bool, scale: float, chunk_size: int, segs=None) -> torch.Tensor:
    from attnzoo.ops.fastmax.triton import fastmax_triton  # optional: imported only when it runs

    def sweeps(qs, kh, vv):
        return fastmax_triton(qs, kh, vv, p=p, causal=causal, chunk_size=chunk_size, seg=segs)

    return _prepared(q, k, v, p=p, scale=scale, sweeps=sweeps)


def _auto_takes_triton(inputs: tuple, options: Mapping[str, Any]) -> bool:
    # At head dim 128 only one pipeline stage fits an H200's shared memory, and one stage ran 12x slower than the
    # PyTorch path (docs/performance.md, 2026-11-26): "auto" takes the kernels where two or more stages fit.
    from attnzoo.ops.fastmax.triton import pipeline_stages

    q, v = inputs[0], inputs[2]
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32  # what the kernels compute in
    p, causal, chunk = options.get("p", 2), bool(options.get("causal")), options.get("chunk_size")
    sweeps = causal
    return pipeline_stages(q.shape[-1], v.shape[-1], p, chunk, dtype, sweeps) >= 2


def _kernel_covers(inputs: tuple, p, causal) -> bool:
    """What the fused kernel (``cpu.cpp``) computes: the non-causal p=1 op on float32/float64 tensors, unmasked or
    over padded batches / packed rows, forward and backward; it is opaque to torch.compile."""
    q = inputs[0]
    return p == 1 and not causal and q.dtype in (torch.float32, torch.float64) and not torch.compiler.is_compiling()


def _auto_takes_kernel(inputs: tuple, options: Mapping[str, Any]) -> bool:
    # p=1 non-causal: the fused kernel, but only its vector (AVX-512) build, which beats PyTorch. Otherwise the
    # feature-map kernel: for every masked call (no Python loop over sequences) and for causal calls (0.35-0.6x the
    # PyTorch path's time, docs/performance.md, 2026-11-27 16:11 UTC) unless the explicit N x N form takes them;
    # unmasked non-causal p=2 stays on PyTorch's GEMMs (the kernel measured 1.04-1.24x their time)
    p, causal, masked = options.get("p"), bool(options.get("causal")), options.get("segs") is not None
    if _kernel_covers(inputs, p, causal) and fastmax_cpu.simd_kernel():
        return True
    if not feature_kernel_covers(inputs[0]):
        return False
    if masked:
        return True
    return causal and not _auto_takes_explicit(inputs, options)


def _fastmax_features_cpu(q, k, v, *, p: int, causal: bool, scale: float, segs=None) -> torch.Tensor:
    ids = None if segs is None else segs.ids

    def sweeps(qs, kh, vv):
        return feature_attention_cpu(qs, kh, vv, causal=causal, feature_map=f"fastmax{p}", eps=0.0, ids=ids)

    return _prepared(q, k, v, p=p, scale=scale, sweeps=sweeps)


def _fastmax_cpu(q, k, v, *, p: int, causal: bool, scale: float, chunk_size: int, segs=None) -> torch.Tensor:
    # p=1 non-causal: the fused kernel; every other float32/float64 call: the feature-map kernel; half inputs and
    # torch.compile run the PyTorch path. Named explicitly, "cpu" still needs the kernels built
    if _kernel_covers((q, k, v), p, causal) and (segs is None or fastmax_cpu.simd_kernel()):
        return _fastmax_p1_fused(q, k, v, scale, segs)
    if feature_kernel_covers(q):
        return _fastmax_features_cpu(q, k, v, p=p, causal=causal, scale=scale, segs=segs)
    if not torch.compiler.is_compiling():
        _cpu_kernels.required_cpu_kernels()
    return _fastmax_torch(q, k, v, p=p, causal=causal, scale=scale, chunk_size=chunk_size, segs=segs)


#: the longest sequence the explicit N x N form takes under "auto" under autograd (its B*H*N^2 weights are kept
#: for the backward)
EXPLICIT_MAX_N = 256
#: without autograd the weights live for one call: "auto" takes the explicit form beyond EXPLICIT_MAX_N while
#: B*H*N^2 stays within this and N within D^p / 4 (causal) or D^p / 8 (the factorised non-causal form is cheaper)
EXPLICIT_MAX_WEIGHTS = 1 << 23


def _auto_takes_explicit(inputs: tuple, options: Mapping[str, Any]) -> bool:
    # the explicit form costs ~N^2 D a head and the factorised one ~N D^p Dv: for N <= D^p / 2 (and short enough
    # for the N x N weights) the explicit one is the faster (docs/performance.md, 2026-11-26 08:16 UTC: 8.4x
    # fwd+bwd at N=17, 7.1x at causal N=64, D=16, p=2). Forward only, at D=64 (2026-11-27 05:39 UTC): explicit /
    # factorised 0.21 at causal N=768 (12 heads), 0.54 at 1024, 1.05 at 1536, 1.34 at 2048; non-causal 0.25 at 512,
    # 1.28 at 1024
    q = inputs[0]
    b, h, n, d = q.shape
    p, causal = options["p"], bool(options.get("causal"))
    if options.get("segs") is not None or n > d**p // 2:
        return False
    if n <= EXPLICIT_MAX_N:
        return True
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in inputs[:3])
    return not grad and n <= d**p // (4 if causal else 8) and b * h * n * n <= EXPLICIT_MAX_WEIGHTS


def _fastmax_explicit(q, k, v, *, p: int, causal: bool, scale: float, chunk_size: int, segs=None) -> torch.Tensor:
    del chunk_size, segs  # no chunks; masked calls never reach it (masks=False)

    def weights(qs, kh, vv):  # the reference's explicit N x N weights, autograd through them
        return naive_from_hat(qs, kh, vv, p=p, causal=causal)

    return _prepared(q, k, v, p=p, scale=scale, sweeps=weights)


# Every backend takes the op's raw q, k, v and its checked options, and prepares them itself.
FASTMAX = Mechanism(
    op="fastmax",
    options=FastmaxOptions,
    backends=op_backends(
        _fastmax_naive,
        _fastmax_torch,
        torch_autograd=Backend(_fastmax_torch_autograd),
        # "auto" takes it for short sequences (N <= min(256, D^p / 2)) on every device where no kernel took the call
        explicit=Backend(_fastmax_explicit, masks=False, auto_if=_auto_takes_explicit),
        cpu=Backend(_fastmax_cpu, kind="cpu", auto_if=_auto_takes_kernel),
        triton=Backend(
            _fastmax_triton,
            kind="triton",
            needs="attnzoo.ops.fastmax.triton",
            available=lambda: _triton_available(),
            auto_if=_auto_takes_triton,
            # the masked kernels pass tests/ops/test_triton_varlen.py compiled on an H200 (2026-11-27); their speed
            # against the PyTorch masked path there is not yet measured (docs/performance.md): until it is, "auto"
            # keeps the PyTorch path for masked calls; backend="triton" runs them
            auto_masks=False,
        ),
    ),
    mask_options=("segs",),
    causal=True,
    state=FastmaxState,
    # p=1 weights are an average only for scale <= 1/D (module doc): 0.25 for the tests' D=4
    examples=({"p": 1, "scale": 0.25},),
    checks="attnzoo.ops.fastmax.selftest_cases",
    projections=Projections(qkv="qkv", out="proj", follows=("qkv_bias", "proj_bias", "proj_dropout")),
    bench=(
        BenchCase(
            "fastmax_p1", "attnzoo.ops.fastmax.bench:fastmax_p1", causal=True, module={"p": 1}, decode=True, varlen=True
        ),
        BenchCase(
            "fastmax_p2", "attnzoo.ops.fastmax.bench:fastmax_p2", causal=True, module={"p": 2}, decode=True, varlen=True
        ),
        BenchCase("fastmax_p1_autograd", "attnzoo.ops.fastmax.bench:fastmax_p1_autograd", default=False, causal=True),
        BenchCase("fastmax_p2_autograd", "attnzoo.ops.fastmax.bench:fastmax_p2_autograd", default=False, causal=True),
        *(
            BenchCase(
                f"fastmax_p{p}_baseline",
                f"attnzoo.ops.fastmax.baseline:p{p}",
                default=False,
                causal=True,
                baseline=True,
                builder=f"attnzoo.ops.fastmax.baseline:p{p}_module",
            )
            for p in (1, 2)
        ),
    ),
    card=Card(
        "FAST, Factorizable Attention (p = 1, 2)",
        "O(N·D^(p+1))",
        "O(N·D) with the §2.5 custom backward",
        causal="chunked prefix state; recurrent",
    ),
    order=5,
)
BACKENDS = tuple(FASTMAX.backend_names())
#: the masked kernel's form where it is not the factorised sweeps with FAST's backward (the kernels have no masked
#: form: every other backend runs those sweeps)
#: the backends that take attention_mask / cu_seqlens ("cpu": the fused p=1 kernel for non-causal calls, the
#: feature-map kernel for the rest)
MASK_BACKENDS = tuple(FASTMAX.mask_backends())
_MASKED_FORMS = {FASTMAX.reference: "explicit", "torch_autograd": "autograd"}


def fastmax(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    p: int = 2,
    causal: bool = False,
    scale: float | None = None,
    backend: str = "auto",
    chunk_size: int | None = None,
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Fastmax (FAST eqs 5-12, causal 30-35): ``q, k (B, H, N, D)``, ``v (B, H, N, Dv)`` -> ``(B, H, N, Dv)``.

    q and k are standardised per token (eqs 5-6, eps :data:`EPS`), scored ``s = scale * q_hat . k_hat``
    (``scale`` defaults to ``D**-0.5``; ``1.0`` is the paper's literal form), weighted by
    ``f(s) = sum_{l<=p} s^l / l!`` and normalised per row. ``backend``: ``"naive"`` (explicit N x N),
    ``"torch"`` (factorised, FAST §2.5 custom backward, O(N D) saved per head), ``"torch_autograd"``
    (factorised, autograd through it; for memory benchmarks), ``"explicit"`` (the N x N weights with autograd:
    faster for short sequences, N <= min(256, D^p / 2), where ``"auto"`` takes it), ``"cpu"`` (C++ kernels for
    float32/float64: the non-causal p=1 op in one fused kernel, ``cpu.cpp``; causal and p=2 in the feature-map
    kernel of :mod:`attnzoo.ops._kernels.feature_attention` with Fastmax's features (FAST eqs 24-27); forward and
    backward, masks included), ``"triton"`` (only if ``attnzoo.ops.fastmax.triton`` exists), ``"auto"`` (triton for
    unmasked CUDA tensors when importable; on CPU the fused kernel where it is the AVX-512 build, the feature-map
    kernel for masked and causal calls; else torch or, for short sequences, explicit; a Triton kernel that fails to
    compile or launch warns once and leaves ``"auto"`` on torch for the process).
    ``chunk_size`` (default 64) is the token chunk of the sweeps. fp16/bf16 inputs are computed in float32.

    ``attention_mask (B, N)`` (True/1 = a real token) or ``cu_seqlens (S + 1,)`` (sequences packed in one row,
    B = 1): q, k are standardised per token as always, and the moment sums of eqs 28-29 / 34-35 run over the real
    keys of the query's own sequence only (causal prefixes restart at each sequence's first token), so every
    sequence gets what it gets alone; padding outputs zero. Backends :data:`MASK_BACKENDS` take them
    (:mod:`attnzoo.ops.fastmax.varlen`; ``"cpu"``: its kernels, reading each token's sequence id; ``"triton"``: its
    sweep kernels, likewise).

    NaN/Inf in q, k, v, and magnitudes that would overflow the compute dtype, raise
    :class:`~attnzoo._checks.NonFiniteError` before any work (one host sync); the fused CPU kernel finds them
    while it reads the inputs and raises the same error before returning. p=1 with ``scale > 1/D`` (the
    default scale for D >= 2) can also produce NaN/Inf from finite inputs (a normaliser crossing zero, see the
    module doc); that case reads its output back once more and raises naming the cause.
    """
    validate_qkv(q, k, v)
    scale, chunk = validate_options(p, scale, chunk_size, q.shape[-1])
    check_bool("causal", causal)
    segs = segments(q.shape[0], q.shape[2], attention_mask=attention_mask, cu_seqlens=cu_seqlens, device=q.device)
    return call_backend(
        FASTMAX, backend, (q, k, v), name="q", p=p, causal=causal, scale=scale, chunk_size=chunk, segs=segs
    )


def fastmax_dropout(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    rate: float,
    placement: str,
    p: int = 2,
    causal: bool = False,
    scale: float | None = None,
    backend: str = "auto",
    chunk_size: int | None = None,
    masks: dict[str, torch.Tensor] | None = None,
    generator: torch.Generator | None = None,
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Fastmax (eqs 5-12 / 30-35) with FAST §2.4 dropout on the factorised terms; ``(B, H, N, Dv)``.

    ``masks`` (from :func:`sample_dropout_masks`) are drawn when not given. ``backend="naive"`` evaluates the
    same masked kernel with an explicit N x N matrix (a reference for tests), ``"torch_autograd"`` differentiates
    the sweeps by autograd, every other backend runs the sweeps with FAST's backward.
    """
    validate_qkv(q, k, v)
    if attention_mask is not None or cu_seqlens is not None:
        raise ValueError(
            "fastmax_dropout: FAST §2.4 dropout does not take attention_mask/cu_seqlens yet; train with "
            "attn_dropout=0 (or dropout_placement='none') for padded or packed inputs, or use fastmax(...)"
        )
    scale, chunk = validate_options(p, scale, chunk_size, q.shape[-1])
    check_dropout_placement(rate, placement, p, name="rate")
    form = _MASKED_FORMS.get(resolve_backend(FASTMAX, backend, q, name="q"), "custom_grad")
    return masked_fastmax(
        q,
        k,
        v,
        rate=rate,
        placement=placement,
        p=p,
        causal=causal,
        scale=scale,
        chunk=chunk,
        form=form,
        masks=masks,
        generator=generator,
    )


def _fastmax_p1_fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, segs=None) -> torch.Tensor:
    """The fused kernel reads every input once and reports max |x| and NaN/Inf of q, k, v and the output, so the
    errors are :func:`_check_values`' and :func:`_check_p1_output`'s without another pass (raised before the output
    is returned rather than before the work)."""
    if segs is None:
        out, seen = fastmax_cpu.fastmax_p1_cpu(q, k, v, scale)
    else:
        out, seen = fastmax_cpu.fastmax_p1_segments_cpu(q, k, v, scale, segs.ids, segs.num)
    _check_seen(seen, q, k, v, out, scale)
    return out


def _check_seen(seen: torch.Tensor, q, k, v, out: torch.Tensor, scale: float) -> None:
    """Raise what the kernel's report ``seen`` (per task: max |x| and a NaN flag of q, k, v, out) shows."""
    # per tensor (q, k, v, out): max |x| over the (b, h) tasks, and NaN exactly when some x was NaN or +-Inf
    vals = seen.amax(dim=0).tolist()
    if any(math.isnan(x) for x in vals[1:6:2]):
        finite_absmax({"q": q, "k": k, "v": v}, op="fastmax")  # raises, naming the input and what it holds
    _check_bounds(dict(zip("qkv", vals[0:6:2], strict=True)), q, p=1)
    if math.isnan(vals[7]) and scale * q.shape[-1] > 1.0:
        _check_p1_output(out, scale, q.shape[-1])  # finite inputs: a normaliser crossed zero


def _check_values(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: int) -> None:
    """NaN/Inf in q, k, v, or magnitudes that overflow the compute dtype (one host sync for all three)."""
    absmax = finite_absmax({"q": q, "k": k, "v": v}, op="fastmax")
    if absmax:
        _check_bounds(absmax, q, p)


def _check_bounds(absmax: dict[str, float], q: torch.Tensor, p: int) -> None:
    """Overflow bounds from max |q|, |k|, |v| (the standardisation's variance and the moment sums)."""
    n, d = q.shape[-2], q.shape[-1]
    for name in ("q", "k"):
        # the standardisation (eqs 5-6) squares x - mean(x): D * |x|^2 must stay in range
        check_overflow(
            "fastmax",
            name,
            absmax,
            4.0 * absmax[name] ** 2 * d,
            q.dtype,
            f"the variance of {name} in the standardisation (eq 6)",
        )
    # the moment sums (eqs 28-29) add N products phi(k_hat) v_j with |phi| <= (1 + D)^p (|k_hat|^2 < D)
    check_overflow(
        "fastmax",
        "v",
        absmax,
        absmax["v"] * n * (1.0 + d) ** p,
        q.dtype,
        "the moment sums sum_j phi(k_j) v_j (eqs 28-29)",
    )


def _check_p1_output(out: torch.Tensor, scale: float, d: int) -> None:
    """p=1 with ``scale > 1/D``: f(s) = 1 + s can be negative, so a row's normaliser sum_j (1 + s_ij) can cross
    zero for finite inputs; say so instead of returning NaN/Inf (p=2, or ``scale <= 1/D``, cannot: module doc)."""
    if _finite(out):
        return
    raise NonFiniteError(
        f"fastmax: p=1 output is not finite although q, k, v are: with scale={scale:.4g} > 1/D={1.0 / d:.4g} the "
        f"weights f(s) = 1 + s can be negative and a row's normaliser sum_j (1 + s_ij) crossed zero; pass "
        f"scale=1/D ({1.0 / d:.4g}), for which p=1 weights are non-negative, or use p=2 (always positive)",
        names=("scale",),
        kind="overflow",
    )


def _finite(t: torch.Tensor) -> bool:
    try:
        finite_absmax({"out": t})
    except NonFiniteError:
        return False
    return True
