"""CSP, channel-wise sample permutation (CSP eq 4): circular shift per channel, then group sort.

Public API: :func:`csp`, :func:`csp_shifts`, :func:`csp_permutations`, :func:`csp_source_index`.

Tie-breaking (the permutation is only unique for distinct values, App. B): both the reference
channel's ranks and each channel's sorted order break ties by token position (stable sort), in the
naive and the fast backend alike. Output values never depend on the tie rule; the implied P_c and
hence which input a gradient reaches do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from attnzoo._checks import check_bool, check_choice, check_ndim, check_positive_int, check_probability, finite_absmax
from attnzoo.ops import _cpu_kernels
from attnzoo.ops._dispatch import call_backend, runs_reference
from attnzoo.ops._spec import Backend, BenchCase, Card, Mechanism, Options, Projections, op_backends, option
from attnzoo.ops._varlen import Segments, segments
from attnzoo.ops.csp.naive import csp_naive, csp_permutations_naive
from attnzoo.ops.csp.parallel import csp_gather
from attnzoo.ops.csp.parallel import csp_source_index as _source_index
from attnzoo.ops.csp.shifts import SHIFT_SCHEDULES, csp_shifts
from attnzoo.ops.csp.varlen import csp_varlen, csp_varlen_kernel

__all__ = [
    "csp",
    "csp_shifts",
    "csp_permutations",
    "csp_source_index",
    "SHIFT_SCHEDULES",
    "BACKENDS",
    "CSPOptions",
    "CSP",
]


def _check_schedule(name: str, value) -> str:
    check_choice(name, value, SHIFT_SCHEDULES)
    return value


@dataclass(frozen=True)
class CSPOptions(Options):
    """Options of the CSP layer (value projection, permutation, output projection)."""

    groups: int = option(1, check_positive_int, "K of eq 4: N must be divisible by it")
    shift_schedule: str = option("linear", _check_schedule, "'linear', 'power' or 'none' (csp_shifts)")
    layer_index: int = option(0, doc="this layer's place in the power-law schedule, in [0, num_layers)")
    num_layers: int = option(1, check_positive_int, "layers of the schedule")
    v_bias: bool = option(False, check_bool, "bias of the value projection")
    proj_bias: bool = option(True, check_bool, "bias of the output projection")
    proj_dropout: float = option(0.0, check_probability, "dropout after the output projection")

    def validate(self) -> None:
        i = self.layer_index
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < self.num_layers:
            raise ValueError(f"layer_index must be an integer in [0, num_layers={self.num_layers}), got {i!r}")


def _csp_naive(v: torch.Tensor, shifts: torch.Tensor, *, groups: int | None, toks: Segments | None = None):
    _check_values(v)
    if toks is None:
        return csp_naive(v, shifts.tolist(), groups)
    out = torch.zeros_like(v)
    for row, idx in toks.sequences():  # the definition: every sequence alone
        steps = shifts if shifts.ndim == 1 else shifts[row, int(toks.ids[row, idx[0]])]
        k = idx.numel() if groups is None else groups  # None: groups of one token, shifting only
        out[row, idx] = csp_naive(v[row : row + 1, idx], steps.tolist(), k)[0]
    return out


def _csp_torch(v: torch.Tensor, shifts: torch.Tensor, *, groups: int | None, toks: Segments | None = None):
    _check_values(v)
    if toks is not None:
        return csp_varlen(v, shifts, toks, groups)
    return csp_gather(v, shifts, groups)


def _csp_cpu(v: torch.Tensor, shifts: torch.Tensor, *, groups: int | None, toks: Segments | None = None):
    if toks is not None:
        return _csp_cpu_segments(v, shifts, groups, toks)
    # groups of two tokens in the fused C++ kernel (cpu.cpp), which finds NaN/Inf while it moves the values (no
    # extra pass over v); other group sizes are the PyTorch path's
    if torch.compiler.is_compiling():  # the kernel is opaque to torch.compile: the PyTorch path stands in
        return _csp_torch(v, shifts, groups=groups)
    kernels = _cpu_kernels.required_cpu_kernels()
    if v.shape[1] == 2 * groups:
        from attnzoo.ops.csp.small import csp_small_groups

        out, poison = csp_small_groups(v, shifts, 2, kernels=kernels, with_poison=True)
        if math.isnan(poison.sum().item()):
            _check_values(v)  # raises, naming what v holds
        return out
    return _csp_torch(v, shifts, groups=groups)


def _csp_cpu_segments(v: torch.Tensor, shifts: torch.Tensor, groups: int | None, toks: Segments) -> torch.Tensor:
    # every group size (and groups=None) and masks with holes in the fused kernel (cpu.cpp csp_varlen), which reads
    # each sequence's tokens in place; unlike the unmasked path (groups of two only), no group size is left out
    if torch.compiler.is_compiling():  # the kernel is opaque to torch.compile: the PyTorch path stands in
        return _csp_torch(v, shifts, groups=groups, toks=toks)
    kernels = _cpu_kernels.required_cpu_kernels()
    _check_values(v)
    return csp_varlen_kernel(v, shifts, toks, groups, kernels)


def _check_values(v: torch.Tensor) -> None:
    # sorting puts NaN last and moves Inf like any value: the permutations would be silently meaningless
    finite_absmax({"v": v}, op="csp")


CSP = Mechanism(
    op="csp",
    options=CSPOptions,
    backends=op_backends(_csp_naive, _csp_torch, cpu=Backend(_csp_cpu, kind="cpu")),
    mask_options=("toks",),
    causal=False,  # group sorting reads every token of a group
    examples=({"groups": 3, "shift_schedule": "power", "layer_index": 1, "num_layers": 2},),
    checks="attnzoo.ops.csp.selftest_cases",
    projections=Projections(v="v_proj", out="proj", follows=("v_bias", "proj_bias", "attn_dropout", "proj_dropout")),
    bench=(
        BenchCase("csp", "attnzoo.ops.csp.bench:csp", module={}),
        BenchCase("csp_pairs", "attnzoo.ops.csp.bench:csp_pairs", default=False),
        BenchCase("csp_pairs_torch", "attnzoo.ops.csp.bench:csp_pairs_torch", default=False),
        BenchCase("csp_pairs_general", "attnzoo.ops.csp.bench:csp_pairs_general", default=False),
    ),
    card=Card("CSP, Channel-wise Sample Permutation (eq 4)", "O(N log N) (sort)", "O(N)"),
    order=6,
)
BACKENDS = tuple(CSP.backend_names())


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _check_lengths(toks: Segments, groups: int) -> None:
    """Every sequence splits into ``groups`` equal groups, as it must when run alone."""
    bad = toks.lengths[(toks.lengths > 0) & (toks.lengths % groups != 0)]
    if bad.numel():
        raise ValueError(
            f"every sequence must split into groups={groups} equal groups (as when run alone), "
            f"got sequence lengths such as {bad[:4].tolist()}; use groups dividing every length (groups=1 always does)"
        )


def _check_args(v: torch.Tensor, shifts, groups: int | None, toks: Segments | None = None) -> torch.Tensor:
    """Validate the shapes and ``shifts`` (the values of v are the backends'); return ``shifts`` as a LongTensor
    ``(C,)`` (or ``(B, S, C)`` with segments) on ``v.device``."""
    check_ndim("v", v, 3, "(B, N, C)")
    B, N, C = v.shape
    if N < 1 or C < 1:
        raise ValueError(f"v must have N >= 1 tokens and C >= 1 channels, got shape {tuple(v.shape)}")
    if groups is not None or toks is None:
        check_positive_int("groups", groups)
    if toks is not None:
        if groups is not None:
            _check_lengths(toks, groups)
        if isinstance(shifts, torch.Tensor) and shifts.ndim == 3:
            if tuple(shifts.shape) != (B, toks.num, C) or shifts.is_floating_point() or shifts.dtype == torch.bool:
                raise ValueError(
                    f"per-sequence shifts must be an integer tensor (B, S, C) = ({B}, {toks.num}, {C}), "
                    f"got {tuple(shifts.shape)} of dtype {shifts.dtype}"
                )
            return shifts.to(device=v.device, dtype=torch.long)
    elif N % groups != 0:
        raise ValueError(
            f"N={N} tokens cannot be split into groups={groups} equal groups; valid groups divide N: {_divisors(N)}"
        )
    if isinstance(shifts, torch.Tensor):
        if shifts.dtype == torch.bool or shifts.is_floating_point() or shifts.is_complex():
            raise TypeError(f"shifts must hold integers, got a tensor of dtype {shifts.dtype}")
        if shifts.ndim != 1 or shifts.shape[0] != C:
            raise ValueError(f"shifts must have shape (C,) = ({C},), got shape {tuple(shifts.shape)}")
        return shifts.to(device=v.device, dtype=torch.long)
    if not isinstance(shifts, Sequence) or isinstance(shifts, str):
        raise TypeError(f"shifts must be a length-C sequence of ints or an integer tensor, got {type(shifts).__name__}")
    if len(shifts) != C:
        raise ValueError(f"shifts must hold C={C} steps (one per channel), got {len(shifts)}")
    bad = [s for s in shifts if not isinstance(s, int) or isinstance(s, bool)]
    if bad:
        raise TypeError(f"shifts must hold integers, got {bad[:3]!r}")
    return torch.tensor(list(shifts), dtype=torch.long, device=v.device)


def csp(
    v: torch.Tensor,
    shifts: Sequence[int] | torch.Tensor,
    groups: int | None,
    *,
    backend: str = "auto",
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """CSP eq 4: ``v`` ``(B, N, C)`` -> ``(B, N, C)``, channel c shifted by ``shifts[c]`` (mod N), then sorted.

    Inside each of ``groups`` contiguous token groups, channel c's sorted values are placed at the positions
    ranked by the (shifted) reference channel 0, the optimal transport of App. B; channel 0 is only shifted.
    ``groups=1`` is complete sorting, ``groups=N`` pure shifting. Gradients flow to ``v`` through the
    (piecewise constant) permutations. ``backend``: ``"auto"`` (``"cpu"`` for CPU tensors when the fused
    kernels build, else ``"torch"``), ``"torch"`` (gather/sort; compare-and-swap or sorting networks for groups
    of 1-8 tokens), ``"cpu"`` (groups of two in one fused C++ pass, the rest as ``"torch"``; with masks every
    group size in the fused kernel), ``"naive"`` (explicit N x N permutation matrices).

    ``attention_mask`` ``(B, N)`` (True at real tokens) or ``cu_seqlens`` ``(S + 1,)`` (sequences packed in one
    row): every sequence is CSP alone on its real tokens, shifts taken modulo its own length ``L_s`` and
    ``groups`` groups of ``L_s / groups`` tokens (``L_s`` must be divisible by ``groups``; ``groups=None``: groups
    of one token, i.e. ``groups = L_s``, shifting only); ``shifts`` may then
    also be ``(B, S, C)``, one schedule per sequence. Padding gives zeros. Every backend takes masks
    (see :mod:`attnzoo.ops.csp.varlen`; "cpu": the fused kernel for every group size, holed masks too).
    """
    toks = segments(v.shape[0], v.shape[1], attention_mask=attention_mask, cu_seqlens=cu_seqlens, device=v.device)
    if groups is None and toks is None and v.ndim == 3:
        groups = v.shape[1]  # groups of one token: shifting only
    s = _check_args(v, shifts, groups, toks)
    if toks is not None:
        return call_backend(CSP, backend, (v, s), name="v", groups=groups, toks=toks)
    return call_backend(CSP, backend, (v, s), name="v", groups=groups)


def csp_source_index(v: torch.Tensor, shifts: Sequence[int] | torch.Tensor, groups: int) -> torch.Tensor:
    """LongTensor ``(B, N, C)``: ``csp(v)[b, i, c] == v[b, idx[b, i, c], c]`` (row i of ``P_c`` has its 1 at idx)."""
    s = _check_args(v, shifts, groups)
    _check_values(v)
    return _source_index(v, s, groups)


def csp_permutations(
    v: torch.Tensor, shifts: Sequence[int] | torch.Tensor, groups: int, *, backend: str = "auto"
) -> torch.Tensor:
    """The implicit attention maps ``P_c = T_c S_{J_c}`` of CSP eq 5 as 0/1 matrices ``(B, C, N, N)``, dtype of v.

    For analysis only: O(B·C·N²) memory. ``csp(v) == einsum("bcij,bjc->bic", P, v)``.
    """
    check_ndim("v", v, 3, "(B, N, C)")
    reference = runs_reference(CSP, backend, v, name="v")
    s = _check_args(v, shifts, groups)
    _check_values(v)
    if reference:
        return csp_permutations_naive(v, s.tolist(), groups)
    idx = _source_index(v, s, groups)  # (B, N, C)
    N = v.shape[1]
    return torch.nn.functional.one_hot(idx.transpose(1, 2), N).to(v.dtype)
