"""Token Statistics Self-Attention (ToST, Wu et al. 2025): eq. 11 / Alg. 1 and causal eq. 28 / Alg. 2.

Public API:

- :func:`tssa` ``(w (B, H, N, P), temp (H,)) -> (B, H, N, P)``: the per-head update
  ``-Pi * (1 + second_moment)^-1 * w`` before the output projection.
- :func:`tssa_pi`: the membership ``Pi`` ``(B, H, N)`` (eq. 10 / 39), for inspection.
- :func:`tssa_init_state` / :func:`tssa_step`: O(1)-memory recurrent form of causal TSSA for decoding.

Backends: ``"naive"`` (``naive.py``, the literal pseudocode, differentiated by autograd), ``"torch"``
(``chunk.py``, memory-lean with hand-written backward), ``"cpu"`` (the same formulas, forward and backward, in fused
C++ kernels, ``cpu.cpp``, built on first use), ``"triton"`` (``triton.py``, fused kernels; needs the ``triton``
package). ``"auto"`` follows :mod:`attnzoo.ops._dispatch`: ``"triton"`` for unmasked CUDA tensors of fewer than
:data:`TRITON_AUTO_MAX_TOKENS` tokens when Triton is installed (if a kernel fails to compile or launch it warns once
and uses ``"torch"`` for the rest of the process; from that length on ``"torch"`` measured faster), ``"cpu"`` for
CPU tensors when the kernels build (and not while ``torch.compile`` traces), else ``"torch"``. :data:`TSSA`
declares the mechanism.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple

import torch

from attnzoo._checks import check_bool, check_ndim, check_overflow, check_positive_int, finite_absmax
from attnzoo.ops import _cpu_kernels
from attnzoo.ops._dispatch import call_backend, runs_reference
from attnzoo.ops._spec import Backend, BenchCase, Card, Mechanism, Options, Projections, op_backends, option
from attnzoo.ops._varlen import Segments, check_attention_mask, segments
from attnzoo.ops.tssa.chunk import tssa_cpu_varlen, tssa_pi_torch, tssa_pi_torch_varlen, tssa_torch, tssa_torch_varlen
from attnzoo.ops.tssa.naive import tssa_naive, tssa_naive_varlen, tssa_pi_naive, tssa_pi_naive_varlen

__all__ = [
    "tssa",
    "tssa_pi",
    "tssa_step",
    "tssa_init_state",
    "TSSAState",
    "TSSAOptions",
    "TSSA",
    "TRITON_AUTO_MAX_TOKENS",
]


def _check_temp(temp: torch.Tensor, heads: int) -> None:
    if not isinstance(temp, torch.Tensor):
        raise TypeError(f"temp must be a torch.Tensor of shape (H,)=({heads},), got {type(temp).__name__}")
    if not temp.is_floating_point():
        raise TypeError(f"temp must be a floating-point tensor, got dtype {temp.dtype}")
    if tuple(temp.shape) != (heads,):
        raise ValueError(f"temp must have shape (H,)=({heads},) (one temperature per head), got {tuple(temp.shape)}")


def _check_bias(bias: torch.Tensor | None, heads: int, n: int, causal: bool) -> None:
    # n: the longest sequence (the causal bias is read at the position within each sequence)
    if bias is None:
        return
    if not causal:
        raise ValueError("bias is only used by causal TSSA (Alg. 2); pass causal=True or bias=None")
    check_ndim("bias", bias, 3, "(H, N_max, 1)")
    if bias.shape[0] != heads or bias.shape[2] != 1:
        raise ValueError(f"bias must have shape (H, N_max, 1) with H={heads}, got {tuple(bias.shape)}")
    if bias.shape[1] < n:
        raise ValueError(
            f"bias covers N_max={bias.shape[1]} positions but the longest sequence has N={n} tokens; "
            "bias needs N_max >= N"
        )


def _check_shapes(w, temp, causal, bias, seg: Segments | None = None) -> None:
    check_ndim("w", w, 4, "(B, H, N, P)")
    check_bool("causal", causal)
    _, h, n, p = w.shape
    if h < 1 or n < 1 or p < 1:
        raise ValueError(f"w must have H, N, P >= 1, got shape (B, H, N, P)={tuple(w.shape)}")
    _check_temp(temp, h)
    longest = n if seg is None or bias is None else int(seg.lengths.max())
    _check_bias(bias, h, longest, causal)
    if temp.device != w.device or (bias is not None and bias.device != w.device):
        raise ValueError(
            f"temp{' and bias' if bias is not None else ''} must be on w's device {w.device}, got "
            f"temp on {temp.device}" + (f", bias on {bias.device}" if bias is not None else "")
        )


def _check_values(w, temp, bias, *, check_w: bool = True) -> None:
    # one host sync for every tensor (the fused non-causal paths find NaN/Inf in w from their sums of w^2)
    absmax = finite_absmax({"w": w if check_w else None, "temp": temp, "bias": bias}, op="tssa")
    # w^2 summed over the N tokens (the second moment of eq. 10/11) is the first intermediate to overflow
    check_overflow(
        "tssa", "w", absmax, absmax.get("w", 0.0) ** 2 * w.shape[2], w.dtype, "the per-feature sum of w^2 over N tokens"
    )


def tssa(
    w: torch.Tensor,
    temp: torch.Tensor,
    *,
    causal: bool = False,
    bias: torch.Tensor | None = None,
    backend: str = "auto",
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """TSSA update ``-Pi * w / (1 + dots)`` of eq. 11 (Alg. 1) or causal eq. 28 (Alg. 2), ``(B, H, N, P)``.

    ``w``: projected tokens ``(B, H, N, P)``; ``temp``: softmax temperature per head ``(H,)`` (eq. 10's
    ``1/(2 eta)``); ``bias``: learned causal bias ``(H, N_max, 1)`` with ``N_max >= N`` (Alg. 2; ``None``
    means zeros). Internals run in float32 or better; the result has ``w``'s dtype. Causal 0/0 (a feature
    that is exactly 0 in every token so far) is defined as 0, identically in every backend.

    ``attention_mask`` ``(B, N)`` (True/1 = a real token) or ``cu_seqlens`` ``(S + 1,)`` (sequences packed in one
    row, ``B == 1``): every sequence gets what it gets alone. Eq. 10's norms ``sum_n w_n^2``, eq. 11's
    ``<pi_k, 1>`` and second moments ``sum_n pi_kn w_n^2`` run over the real tokens of the token's own sequence;
    the causal prefix sums of eq. 28 / 39 restart at each sequence's first token and ``bias`` is read at the
    position within the sequence (``N_max`` >= the longest sequence). Padding gives zero output and gradient.
    Every backend takes them (the Triton kernels from per-token sequence ids, no copy of ``w``).
    """
    seg = segments(w.shape[0], w.shape[2], attention_mask=attention_mask, cu_seqlens=cu_seqlens, device=w.device)
    _check_shapes(w, temp, causal, bias, seg)
    # Autocast would run the token reductions (matmuls) in half precision; they must stay float32+.
    with torch.autocast(device_type=_autocast_device(w), enabled=False):
        if seg is None:
            return call_backend(TSSA, backend, (w, temp, bias), name="w", causal=causal)
        return call_backend(TSSA, backend, (w, temp, bias), name="w", causal=causal, seg=seg)


def _autocast_device(w: torch.Tensor) -> str:
    # meta tensors (shape inference) have no autocast state of their own
    return "cpu" if w.device.type == "meta" else w.device.type


def _tssa_naive(w, temp, bias, *, causal: bool, seg: Segments | None = None) -> torch.Tensor:
    _check_values(w, temp, bias)
    if causal and bias is None:
        bias = torch.zeros(w.shape[1], w.shape[2], 1, device=w.device, dtype=w.dtype)
    if seg is not None:
        return tssa_naive_varlen(w, temp, seg, causal=causal, bias=bias)
    return tssa_naive(w, temp, causal=causal, bias=bias)


def _tssa_torch(w, temp, bias, *, causal: bool, kernels=None, seg: Segments | None = None) -> torch.Tensor:
    if w.device.type == "meta":
        return torch.empty_like(w) if seg is not None else _tssa_naive(w, temp, bias, causal=causal)
    if seg is not None:
        _check_values(w, temp, bias)
        return tssa_torch_varlen(w, temp, seg, causal=causal, bias=bias)
    # The fused non-causal path finds NaN/Inf in w from its per-feature sums of w^2 (then runs the full
    # check for the message) instead of an extra pass over w: a pass is ~1/8 of its forward time.
    _check_values(w, temp, bias, check_w=causal)
    return tssa_torch(w, temp, causal=causal, bias=bias, kernels=kernels)


def _tssa_cpu(w, temp, bias, *, causal: bool, seg: Segments | None = None) -> torch.Tensor:
    if seg is not None:
        if torch.compiler.is_compiling():  # the kernels are opaque to torch.compile
            _check_values(w, temp, bias)
            return tssa_torch_varlen(w, temp, seg, causal=causal, bias=bias)
        # as unmasked: the non-causal kernels find NaN/Inf in w's real tokens from their sums of w^2 (and then
        # run the full check for the message); a separate pass over w was a third of the masked forward's time
        _check_values(w, temp, bias, check_w=causal)
        return tssa_cpu_varlen(w, temp, seg, _cpu_kernels.required_cpu_kernels(), causal=causal, bias=bias)
    # The kernels are opaque to torch.compile: while it traces, the PyTorch forward stands in for them.
    kernels = None if torch.compiler.is_compiling() else _cpu_kernels.required_cpu_kernels()
    return _tssa_torch(w, temp, bias, causal=causal, kernels=kernels)


#: from this many tokens on, "auto" takes TSSA's PyTorch path over the Triton kernels on CUDA
TRITON_AUTO_MAX_TOKENS = 16384


def _auto_takes_triton(inputs: tuple, _options: Mapping[str, Any]) -> bool:
    # The kernels sweep the tokens in one program per (batch, head), 8 programs on an H200's 132 SMs at K = 8: from
    # N = 16384 on, two H200 runs measured them slower than the PyTorch path (fwd+bwd at N = 65536: 9.7 / 10.1 ms
    # against 2.0 / 2.7 bidirectional, 20.2 / 22.0 against 5.5 / 5.9 causal); below, both are launch-bound and the
    # kernels hold half the memory (docs/performance.md, 2026-11-26 and 2026-11-27)
    return inputs[0].shape[-2] < TRITON_AUTO_MAX_TOKENS


def _tssa_triton(w, temp, bias, *, causal: bool, seg: Segments | None = None) -> torch.Tensor:
    from attnzoo.ops.tssa.triton import tssa_triton  # optional: imported only when it runs

    if w.device.type == "meta":
        # shape inference: the reference reads no values
        return torch.empty_like(w) if seg is not None else _tssa_naive(w, temp, bias, causal=causal)
    _check_values(w, temp, bias)
    return tssa_triton(w, temp, causal=causal, bias=bias, seg=seg)


def tssa_pi(
    w: torch.Tensor,
    temp: torch.Tensor,
    *,
    causal: bool = False,
    bias: torch.Tensor | None = None,
    backend: str = "auto",
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Group membership ``Pi`` ``(B, H, N)`` (rows sum to 1 over heads): eq. 10 with App. C.1's
    normalisation (Alg. 1), or eq. 39 (Alg. 2) when ``causal``; float32 or better. ``attention_mask`` /
    ``cu_seqlens`` as in :func:`tssa` (each sequence alone; zeros at padding)."""
    check_ndim("w", w, 4, "(B, H, N, P)")
    reference = runs_reference(TSSA, backend, w, name="w")
    seg = segments(w.shape[0], w.shape[2], attention_mask=attention_mask, cu_seqlens=cu_seqlens, device=w.device)
    _check_shapes(w, temp, causal, bias, seg)
    _check_values(w, temp, bias)
    with torch.autocast(device_type=_autocast_device(w), enabled=False):
        if reference:
            if causal and bias is None:
                bias = torch.zeros(w.shape[1], w.shape[2], 1, device=w.device, dtype=w.dtype)
            if seg is not None:
                return tssa_pi_naive_varlen(w, temp, seg, causal=causal, bias=bias)
            return tssa_pi_naive(w, temp, causal=causal, bias=bias)
        if seg is not None:
            return tssa_pi_torch_varlen(w, temp, seg, causal=causal, bias=bias)
        return tssa_pi_torch(w, temp, causal=causal, bias=bias)


class TSSAState(NamedTuple):
    """Recurrent state of causal TSSA after ``pos`` tokens (all sums over tokens so far, float32+)."""

    sq_sum: torch.Tensor  # (B, H, P) running sum of w^2 (Alg. 2's cumsum(w_sq))
    num: torch.Tensor  # (B, H, P) running sum of Pi * w^2 (numerator of dots)
    den: torch.Tensor  # (B, H) running sum of Pi (denominator of dots)
    pos: int | torch.Tensor  # index of the next token; (B,) int64 per row after a masked step (padded prompts)


def tssa_init_state(
    batch_size: int, heads: int, head_dim: int, *, device=None, dtype: torch.dtype | None = None
) -> TSSAState:
    """Empty causal-TSSA state; sums are kept in ``promote(dtype, float32)``."""
    cdt = torch.promote_types(dtype or torch.get_default_dtype(), torch.float32)
    z = torch.zeros(batch_size, heads, head_dim, device=device, dtype=cdt)
    return TSSAState(z, z.clone(), torch.zeros(batch_size, heads, device=device, dtype=cdt), 0)


def tssa_step(
    w_t: torch.Tensor,
    temp: torch.Tensor,
    state: TSSAState,
    *,
    bias: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, TSSAState]:
    """One decoding step of causal TSSA (eq. 28 / Alg. 2) for token ``state.pos``: pure, O(HP) memory.

    ``w_t``: ``(B, H, P)``; ``temp``: ``(H,)``; ``bias``: ``(H, N_max, 1)`` or ``None``. Returns
    ``(out_t (B, H, P), new_state)``; ``out_t`` equals position ``state.pos`` of
    ``tssa(w, temp, causal=True, bias=bias)``. ``attention_mask`` ``(B,)`` (True/1 = a real token): a padding
    token leaves its row's state (sums and position) unchanged and gives zeros, so decoding a padded prompt
    equals decoding each prompt alone; positions then become per row (``state.pos`` ``(B,)``).
    """
    check_ndim("w_t", w_t, 3, "(B, H, P)")
    b, h, p = w_t.shape
    _check_temp(temp, h)
    if tuple(state.sq_sum.shape) != (b, h, p):
        raise ValueError(f"state was built for (B, H, P)={tuple(state.sq_sum.shape)} but w_t has shape {(b, h, p)}")
    if attention_mask is not None or isinstance(state.pos, torch.Tensor):
        return _step_masked(w_t, temp, state, bias, attention_mask)
    pos = state.pos
    if bias is not None:
        check_ndim("bias", bias, 3, "(H, N_max, 1)")
        if bias.shape[0] != h or bias.shape[2] != 1:
            raise ValueError(f"bias must have shape (H, N_max, 1) with H={h}, got {tuple(bias.shape)}")
        if pos >= bias.shape[1]:
            raise ValueError(
                f"position {pos} is beyond the causal bias length N_max={bias.shape[1]} "
                f"(decoding supports positions 0..{bias.shape[1] - 1})"
            )
    # the bias entry this position reads, not the whole (H, N_max, 1) table: a per-token cost independent of N_max
    bias_t = None if bias is None else bias[:, pos, 0]
    finite_absmax({"w_t": w_t, "temp": temp, "bias": bias_t}, op="tssa_step")
    cdt = state.sq_sum.dtype
    wc, tc = w_t.to(cdt), temp.to(cdt)
    x = wc * wc
    sq_sum = state.sq_sum + x
    s = (x / torch.where(sq_sum > 0, sq_sum, torch.ones_like(sq_sum))).sum(dim=-1)  # (B, H)
    if bias_t is not None:
        s = s + p * bias_t.to(cdt)
    pi = torch.softmax(s * tc, dim=1)
    num = state.num + x * pi.unsqueeze(-1)
    den = state.den + pi
    dots = num / torch.where(den > 0, den, torch.ones_like(den)).unsqueeze(-1)
    out = -(wc * pi.unsqueeze(-1)) / (1.0 + dots)
    return out.to(w_t.dtype), TSSAState(sq_sum, num, den, pos + 1)


def _step_masked(w_t, temp, state: TSSAState, bias, attention_mask) -> tuple[torch.Tensor, TSSAState]:
    """:func:`tssa_step` with a per-row position ``(B,)`` and a per-row real-token flag (eq. 28 per sequence)."""
    b, h, p = w_t.shape
    real = torch.ones(b, dtype=torch.bool, device=w_t.device)
    if attention_mask is not None:
        real = _check_step_mask(attention_mask, b).to(w_t.device)
    pos = torch.as_tensor(state.pos, device=w_t.device).to(torch.int64).expand(b)
    if bias is not None:
        check_ndim("bias", bias, 3, "(H, N_max, 1)")
        if bias.shape[0] != h or bias.shape[2] != 1:
            raise ValueError(f"bias must have shape (H, N_max, 1) with H={h}, got {tuple(bias.shape)}")
        if bool((pos[real] >= bias.shape[1]).any()):
            raise ValueError(
                f"position {int(pos[real].max())} is beyond the causal bias length N_max={bias.shape[1]} "
                f"(decoding supports positions 0..{bias.shape[1] - 1})"
            )
    # each row's bias entry at its position (H, B), not the whole table
    bias_t = None if bias is None else bias[:, :, 0][:, pos.clamp_max(bias.shape[1] - 1)]
    finite_absmax({"w_t": w_t, "temp": temp, "bias": bias_t}, op="tssa_step")
    cdt = state.sq_sum.dtype
    r3 = real.view(b, 1, 1)
    wc, tc = torch.where(r3, w_t.to(cdt), 0.0), temp.to(cdt)
    x = wc * wc
    sq_sum = state.sq_sum + x
    s = (x / torch.where(sq_sum > 0, sq_sum, torch.ones_like(sq_sum))).sum(dim=-1)  # (B, H)
    if bias_t is not None:
        s = s + p * bias_t.to(cdt).transpose(0, 1)
    pi = torch.softmax(s * tc, dim=1) * real.view(b, 1)
    num = state.num + x * pi.unsqueeze(-1)
    den = state.den + pi
    dots = num / torch.where(den > 0, den, torch.ones_like(den)).unsqueeze(-1)
    out = -(wc * pi.unsqueeze(-1)) / (1.0 + dots)
    return out.to(w_t.dtype), TSSAState(sq_sum, num, den, pos + real.long())


def _check_step_mask(mask, batch: int) -> torch.Tensor:
    # one token per row: (B,) or the (B, 1) slice of a (B, N) mask
    if isinstance(mask, torch.Tensor) and mask.ndim == 2 and mask.shape[1] == 1:
        mask = mask[:, 0]
    if not isinstance(mask, torch.Tensor) or mask.ndim != 1:
        raise ValueError(f"attention_mask of one decoding step must have shape (B,) = ({batch},) or (B, 1)")
    return check_attention_mask(mask.unsqueeze(-1), batch, 1).squeeze(-1)


@dataclass(frozen=True)
class TSSAOptions(Options):
    """Options of the TSSA layer (ToST Alg. 1 / 2 parameters)."""

    qkv_bias: bool = option(False, check_bool, "bias of the input projection (Alg. 1: off)")
    max_len: int = option(1024, check_positive_int, "length of the causal positional bias (eq. 39)")
    proj_bias: bool = option(True, check_bool, "bias of the output projection")


TSSA = Mechanism(
    op="tssa",
    options=TSSAOptions,
    backends=op_backends(
        _tssa_naive,
        _tssa_torch,
        cpu=Backend(_tssa_cpu, kind="cpu"),
        triton=Backend(
            _tssa_triton,
            kind="triton",
            needs="attnzoo.ops.tssa.triton",
            auto_if=_auto_takes_triton,
            # the masked kernels pass tests/ops/test_triton_varlen.py compiled on an H200 (2026-11-27); their speed
            # against the PyTorch masked path there is not yet measured (docs/performance.md): until it is, "auto"
            # keeps the PyTorch path for masked calls; backend="triton" runs them
            auto_masks=False,
        ),
    ),
    mask_options=("seg",),
    causal=True,
    state=TSSAState,
    examples=({"qkv_bias": True, "max_len": 10},),
    checks="attnzoo.ops.tssa.selftest_cases",
    projections=Projections(shared="qkv", out="to_out"),
    bench=(
        BenchCase(
            "tssa",
            "attnzoo.ops.tssa.bench:tssa",
            causal=True,
            module={},
            sized="attnzoo.ops.tssa.bench:sized",
            decode=True,
            varlen=True,
        ),
        BenchCase("tssa_torch", "attnzoo.ops.tssa.bench:tssa_torch", default=False, causal=True),
        BenchCase(
            "tssa_baseline",
            "attnzoo.ops.tssa.baseline:op",
            default=False,
            causal=True,
            baseline=True,
            builder="attnzoo.ops.tssa.baseline:module",
        ),
    ),
    card=Card(
        "ToST, Token Statistics Self-Attention (Alg. 1, 2)",
        "O(N)",
        "O(N)",
        causal="learned position bias, `max_len`; recurrent",
    ),
    order=4,
)
