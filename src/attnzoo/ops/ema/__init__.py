"""MEGA's multi-dimensional damped exponential moving average (Ma et al. 2022, §3.1).

Per channel ``j`` of ``x (B, N, D)`` and each of its ``h`` expanded dimensions:
``u_t = beta x_t``, ``h_t = alpha * u_t + (1 - alpha * delta) * h_{t-1}``, ``y_t = eta^T h_t``, with the weight
``alpha`` and the damping factor ``delta`` in [0, 1] (the layer passes sigmoids of its parameters).
``causal=True`` is that recurrence (MEGA's decoders); ``causal=False`` adds a second EMA with its own coefficients
run backwards (MEGA's bidirectional encoders), so coefficients are ``(D, h)`` causal and ``(2, D, h)`` bidirectional.

Backends: ``"naive"`` (the recurrence token by token, :mod:`.naive`) and ``"torch"`` (FFT convolution with the
EMA kernel, O(N log N), :mod:`.parallel`; the causal form by blocks, :mod:`.scan`, which no later token moves by
even one bit). :func:`ema_step` is the recurrent form for decoding, state ``(B, D, h)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnzoo._checks import check_bool, check_ndim, finite_absmax
from attnzoo.ops._dispatch import call_backend
from attnzoo.ops._dtypes import acc_dtype
from attnzoo.ops._spec import Mechanism, Options, op_backends, option
from attnzoo.ops._varlen import segments
from attnzoo.ops.ema.naive import ema_naive, ema_recurrence
from attnzoo.ops.ema.parallel import ema_fft, ema_kernel

__all__ = ["ema", "ema_step", "ema_kernel", "init_ema_state", "EMAOptions", "EMA"]


@dataclass(frozen=True)
class EMAOptions(Options):
    """Options of the EMA op (it has no layer of its own: MEGA's layer carries the EMA's parameters)."""

    causal: bool = option(False, check_bool, "one direction (decoders) or two (MEGA's encoders)")


EMA = Mechanism(
    op="ema",
    options=EMAOptions,
    backends=op_backends(ema_naive, ema_fft),
    mask_options=("toks",),
    causal=True,
    state=torch.Tensor,  # h (B, D, ndim)
    checks="attnzoo.ops.ema.selftest_cases",
)


def _check(x: torch.Tensor, coeffs: dict[str, torch.Tensor], causal: bool, op: str) -> None:
    check_ndim("x", x, 3, "(B, N, D)")
    D = x.shape[2]
    layout = "(D, h)" if causal else "(2, D, h)"
    want = 2 if causal else 3
    shape = None
    for name, t in coeffs.items():
        check_ndim(name, t, want, layout)
        if t.dtype != x.dtype or t.device != x.device:
            raise TypeError(
                f"{op}: {name} must share x's dtype and device ({x.dtype}, {x.device}), got {t.dtype}, {t.device}"
            )
        if t.shape[-2] != D or (not causal and t.shape[0] != 2):
            raise ValueError(f"{op}: {name} must have shape {layout} with D={D}, got {tuple(t.shape)}")
        if shape is not None and t.shape != shape:
            raise ValueError(
                f"{op}: alpha, delta, beta and eta must share one shape, got {tuple(shape)} and {tuple(t.shape)}"
            )
        shape = t.shape
    finite_absmax({"x": x, **coeffs}, op=op)


def _check_rates(alpha: torch.Tensor, delta: torch.Tensor, op: str) -> None:
    # outside [0, 1] the damped recurrence grows without bound (|1 - alpha delta| > 1) or flips sign each step;
    # 0 and 1 are allowed: a float32 sigmoid saturates to them, and q = 1 - alpha delta stays in [0, 1]
    if torch.compiler.is_compiling() or alpha.device.type == "meta":
        return
    a, d = alpha.detach(), delta.detach()
    lo_a, hi_a, lo_d, hi_d = torch.stack([a.min(), a.max(), d.min(), d.max()]).tolist()  # one sync
    for name, lo, hi in (("alpha", lo_a, hi_a), ("delta", lo_d, hi_d)):
        if not (lo >= 0 and hi <= 1):
            raise ValueError(
                f"{op}: {name} must lie in [0, 1] (a sigmoid of a parameter), got values in [{lo:.3g}, {hi:.3g}]"
            )


def ema(
    x: torch.Tensor,
    alpha: torch.Tensor,
    delta: torch.Tensor,
    beta: torch.Tensor,
    eta: torch.Tensor,
    *,
    causal: bool = False,
    backend: str = "auto",
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """MEGA's damped EMA (§3.1): ``x (B, N, D)`` -> ``(B, N, D)``.

    ``attention_mask`` ``(B, N)`` (True at real tokens) or ``cu_seqlens`` ``(S + 1,)`` (sequences packed in one
    row): the recurrence restarts at each sequence's first token (``h = 0`` before it), the backward EMA at its
    last; padding gives zeros. Both backends take them ("torch": left/right padding and packed rows, not holes).

    Coefficients ``alpha, delta, beta, eta``: ``(D, h)`` when ``causal`` (``y_t`` reads ``x_{<=t}``), else
    ``(2, D, h)``: the forward EMA plus a backward EMA with its own coefficients (``y_t`` reads every token).
    ``alpha`` and ``delta`` must lie in [0, 1]. ``backend``: ``"auto"``/``"torch"`` (FFT, O(N log N); causal: by
    blocks of 64 tokens, exactly causal) or ``"naive"`` (the recurrence). Sums run in float32 (float64 for float64
    inputs).
    """
    causal = EMAOptions.check("causal", causal)
    coeffs = {"alpha": alpha, "delta": delta, "beta": beta, "eta": eta}
    _check(x, coeffs, causal, "ema")
    _check_rates(alpha, delta, "ema")
    toks = segments(x.shape[0], x.shape[1], attention_mask=attention_mask, cu_seqlens=cu_seqlens, device=x.device)
    if toks is None:
        return call_backend(EMA, backend, (x, alpha, delta, beta, eta), name="x", causal=causal)
    return call_backend(EMA, backend, (x, alpha, delta, beta, eta), name="x", causal=causal, toks=toks)


def init_ema_state(
    batch_size: int, dim: int, ndim: int, *, device=None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The state before the first token: zeros ``(B, D, h)`` in the accumulation dtype of ``dtype``."""
    return torch.zeros(batch_size, dim, ndim, device=device, dtype=acc_dtype(dtype))


def ema_step(
    x: torch.Tensor,
    state: torch.Tensor | None,
    alpha: torch.Tensor,
    delta: torch.Tensor,
    beta: torch.Tensor,
    eta: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The causal EMA continued from ``state`` over the tokens of ``x (B, T, D)`` (T = 1 when decoding).

    Coefficients ``(D, h)``; ``state (B, D, h)`` or ``None`` (empty). Returns ``(y (B, T, D), new state)``; running
    it over a sequence in pieces equals ``ema(..., causal=True)`` on the whole. Pure: ``state`` is not modified.
    """
    coeffs = {"alpha": alpha, "delta": delta, "beta": beta, "eta": eta}
    _check(x, coeffs, True, "ema_step")
    _check_rates(alpha, delta, "ema_step")
    B, _, D = x.shape
    h = alpha.shape[1]
    if state is None:
        state = init_ema_state(B, D, h, device=x.device, dtype=x.dtype)
    if not isinstance(state, torch.Tensor) or tuple(state.shape) != (B, D, h):
        got = tuple(state.shape) if isinstance(state, torch.Tensor) else type(state).__name__
        raise ValueError(f"ema_step: state must be a tensor of shape (B, D, h) = {(B, D, h)}, got {got}")
    y, new = ema_recurrence(x, alpha, delta, beta, eta, state)
    return y.to(x.dtype), new
