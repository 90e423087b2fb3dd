"""Early, explicit input validation shared by ops, layers and models.

Every error names the offending value and what would have been valid.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

import torch

__all__ = [
    "check_ndim",
    "check_same_shape",
    "check_finite",
    "check_choice",
    "check_positive_int",
    "check_scale",
    "check_dropout",
    "NonFiniteError",
    "finite_absmax",
    "check_overflow",
    "explain_nonfinite",
    "overflow_limit",
    "check_module_input",
    "check_probability",
    "check_bool",
    "check_optional_positive_int",
    "check_nonneg_int",
    "check_nonneg_finite",
    "check_positive_finite",
    "check_optional_scale",
]


def check_ndim(name: str, t: torch.Tensor, ndim: int, layout: str) -> None:
    """Raise ``ValueError`` unless ``t`` has ``ndim`` dims (``layout`` e.g. ``"(B, H, N, P)"``)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape {layout}, got {type(t).__name__}")
    if t.ndim != ndim:
        raise ValueError(f"{name} must have shape {layout} ({ndim} dims), got shape {tuple(t.shape)}")
    if not (t.is_floating_point()):
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")


def check_same_shape(names: Sequence[str], tensors: Sequence[torch.Tensor], dims: Iterable[int] | None = None) -> None:
    """Raise ``ValueError`` unless the tensors agree on ``dims`` (all dims when ``None``)."""
    ref = tensors[0]
    idx = list(range(ref.ndim)) if dims is None else list(dims)
    for n, t in zip(names[1:], tensors[1:], strict=True):
        if t.ndim != ref.ndim or any(t.shape[i] != ref.shape[i] for i in idx):
            raise ValueError(
                f"{names[0]} and {n} must agree on dims {idx}: got {tuple(ref.shape)} and {tuple(t.shape)}"
            )


class NonFiniteError(ValueError):
    """NaN/Inf in an input (``kind="input"``), or finite inputs too large for the compute dtype (``kind="overflow"``).

    ``names`` are the offending arguments. Modules catch it from their ops and re-raise it naming their own input.
    """

    def __init__(self, message: str, *, names: tuple[str, ...] = (), kind: str = "input") -> None:
        super().__init__(message)
        self.names = names
        self.kind = kind


def _skip_value_checks(t: torch.Tensor) -> bool:
    # No values to read: meta/fake tensors (shape inference), or a tracer that cannot sync (torch.compile,
    # torch.jit.trace: a data-dependent branch would be baked into the graph or break it).
    return (
        t.numel() == 0
        or t.device.type == "meta"
        or type(t).__name__ == "FakeTensor"
        or torch.compiler.is_compiling()
        or torch.jit.is_tracing()
    )


def _prefix(op: str) -> str:
    return f"{op}: " if op else ""


def finite_absmax(tensors: Mapping[str, torch.Tensor | None], *, op: str = "") -> dict[str, float]:
    """The one finiteness check of attnzoo: raise :class:`NonFiniteError` naming each tensor holding NaN/Inf.

    Returns ``{name: max |t|}`` for the tensors whose values were read, so callers can bound overflow without a
    second pass. All tensors of one device are reduced on the device and read back together: one host sync per
    call (a CUDA sync costs ~10 us; three, one per q/k/v, showed in short-sequence timings). Tensors without
    readable values (meta, fake, empty, integer) and every tensor while torch.compile / jit tracing are skipped:
    the check would otherwise force a graph break.
    """
    groups: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
    for name, t in tensors.items():
        if t is None or not isinstance(t, torch.Tensor):
            continue
        if not (t.is_floating_point() or t.is_complex()) or _skip_value_checks(t):
            continue
        x = torch.view_as_real(t.detach()) if t.is_complex() else t.detach()
        # aminmax propagates NaN and exposes +-Inf in one read pass with no (N,)-sized bool temporary (at
        # N=16k an isfinite().all() made the check cost ~2/3 of a fused TSSA forward on CPU).
        lo, hi = torch.aminmax(x)
        groups.setdefault(t.device, []).append((name, torch.stack([lo, hi])))
    out: dict[str, float] = {}
    bad: list[str] = []
    for items in groups.values():
        # float32 holds every half/bf16/float32 value exactly; float64 inputs keep float64
        wide = torch.float64 if any(v.dtype == torch.float64 for _, v in items) else torch.float32
        vals = torch.cat([v.to(wide) for _, v in items]).tolist()  # the sync
        for i, (name, _) in enumerate(items):
            lo, hi = vals[2 * i], vals[2 * i + 1]
            if not (math.isfinite(lo) and math.isfinite(hi)):
                bad.append(name)
            else:
                out[name] = max(-lo, hi)
    if bad:
        parts = []
        for name in bad:  # error path: counting costs more syncs, which no longer matter
            t = tensors[name]
            x = torch.view_as_real(t.detach()) if t.is_complex() else t.detach()
            parts.append(
                f"{name} contains non-finite values ({int(torch.isnan(x).sum())} NaN, "
                f"{int(torch.isinf(x).sum())} Inf) among its {t.numel()} values"
            )
        raise NonFiniteError(
            f"{_prefix(op)}{'; '.join(parts)}; inputs must be finite (no NaN or Inf)", names=tuple(bad), kind="input"
        )
    return out


def check_finite(name: str, t: torch.Tensor, *, op: str = "") -> None:
    """Raise :class:`NonFiniteError` if ``t`` holds NaN or Inf (see :func:`finite_absmax`)."""
    finite_absmax({name: t}, op=op)


def overflow_limit(dtype: torch.dtype) -> float:
    """Largest finite value of the dtype a computation on ``dtype`` inputs runs in (float32 at least)."""
    return torch.finfo(torch.promote_types(dtype, torch.float32)).max


def check_overflow(op: str, name: str, absmax: dict[str, float], bound: float, dtype: torch.dtype, what: str) -> None:
    """Raise :class:`NonFiniteError` (kind "overflow") if ``bound`` (a worst-case intermediate built from the
    inputs' ``absmax``) exceeds the compute dtype's range: the op would return NaN/Inf for finite inputs.

    The bounds are loose on purpose (only magnitudes no trained network produces trip them, e.g. inputs scaled
    by 1e20 in float32), so a legitimate input is never refused.
    """
    if name not in absmax:  # values not read (compiling, meta)
        return
    limit = overflow_limit(dtype)
    if not bound <= limit:  # also catches inf/nan bounds
        cdt = str(torch.promote_types(dtype, torch.float32)).replace("torch.", "")
        raise NonFiniteError(
            f"{_prefix(op)}{name} has entries up to |{name}|={absmax[name]:.3g}: {what} would reach ~{bound:.3g}, "
            f"beyond {cdt}'s largest value {limit:.3g} (overflow: the output would be NaN/Inf); rescale {name} "
            f"(typical activations are O(1)) or compute in float64",
            names=(name,),
            kind="overflow",
        )


def explain_nonfinite(op: str, name: str, t: torch.Tensor, what: str) -> None:
    """Called where an op found a non-finite intermediate computed from ``t``: raise naming the cause.

    NaN/Inf in ``t`` itself -> the input error; otherwise a finite ``t`` overflowed in ``what``.
    """
    absmax = finite_absmax({name: t}, op=op)
    m = absmax.get(name, float("nan"))
    cdt = str(torch.promote_types(t.dtype, torch.float32)).replace("torch.", "")
    raise NonFiniteError(
        f"{_prefix(op)}{name} is finite (entries up to |{name}|={m:.3g}) but {what} overflowed {cdt} "
        f"(largest value {overflow_limit(t.dtype):.3g}), which would make the output NaN/Inf; rescale {name} "
        f"(typical activations are O(1)) or compute in float64",
        names=(name,),
        kind="overflow",
    )


def check_module_input(module: torch.nn.Module, name: str, x: torch.Tensor) -> None:
    """``x`` must match the dtype (floating inputs) and device of ``module``'s parameters.

    Without this a float64 input to a float32 module fails deep inside torch ("mat1 and mat2 must have the
    same dtype") and a meta-device input on ``.item()``.
    """
    p = next(module.parameters(), None)
    if p is None:
        return
    label = type(module).__name__
    if x.is_floating_point() and x.dtype != p.dtype:
        raise TypeError(
            f"{label}: {name} has dtype {x.dtype} but the module's parameters are {p.dtype}; pass "
            f"{name}.to({p.dtype}) or convert the module with .to({x.dtype})"
        )
    if x.device != p.device:
        raise ValueError(
            f"{label}: {name} is on device {x.device} but the module's parameters are on {p.device}; move one "
            f"of them (e.g. {name}.to({str(p.device)!r}))"
        )


def check_choice(name: str, value, choices: Iterable) -> None:
    choices = list(choices)
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not supported; valid choices: {choices}")


def check_positive_int(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def check_scale(scale, head_dim: int) -> float:
    """``None`` -> ``head_dim ** -0.5``; otherwise a positive finite real number."""
    scale = check_optional_scale("scale", scale)
    return head_dim**-0.5 if scale is None else scale


def _is_real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_probability(name: str, p) -> float:
    """A probability in ``[0, 1)`` (dropout rates): the one copy of this check in attnzoo."""
    if not _is_real(p) or not (0.0 <= p < 1.0):
        raise ValueError(f"{name} must be a probability in [0, 1), got {p!r}")
    return float(p)


#: the name dropout options are checked under (kept for callers of the earlier name)
check_dropout = check_probability


def check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


def check_optional_positive_int(name: str, value) -> int | None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"{name} must be None or a positive integer, got {value!r}")
    return value


def check_nonneg_int(name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return value


def check_nonneg_finite(name: str, value) -> float:
    if not _is_real(value) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def check_positive_finite(name: str, value) -> float:
    if not _is_real(value) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def check_optional_scale(name: str, value) -> float | None:
    """``None`` (the mechanism's default, usually ``head_dim ** -0.5``) or a positive finite number."""
    if value is None:
        return None
    if not _is_real(value) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be None or a positive finite number, got {value!r}")
    return float(value)
