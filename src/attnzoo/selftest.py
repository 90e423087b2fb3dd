"""``attnzoo selftest``: every mechanism x every backend of this device against the float64 naive reference.

Run it first on a new machine (``--device cuda`` on a GPU: the Triton kernels have not been run on yours).
Everything comes from the registry: for each registered mechanism, the cases its folder declares
(``Mechanism.checks``, ``ops/<op>/selftest_cases.py``: softmax, linear, xca, mssa, tssa, fastmax p=1 and p=2, csp, cbsa,
MEGA's ema and attention), and for each case every backend of its op but the reference that declares the device
(``Backend.devices``; e.g. TSSA: ``torch``, the fused ``cpu`` kernels on CPU, ``triton`` on CUDA), it checks, in
float32 and float64 inputs:

- ``forward``: the output against the op's reference backend evaluated in float64 (on CPU) on the same
  inputs (float32 inputs are rounded first, so the row measures the backend's error, not the rounding);
- ``backward``: the gradients of every differentiable input (q/k/v, w, temperatures, biases, reps, eta)
  for a random cotangent, against the reference's;
- ``causal leak`` (causal ops): tokens after ``t`` (and the causal bias there) are redrawn; outputs up to
  ``t`` must not move, and the gradient of outputs up to ``t`` must not reach tokens after ``t``;
- ``decode`` (mechanisms with a recurrence): the token-by-token step (``tssa_step``, ``fastmax_step``,
  ``linear_attention_recurrent``) against the backend's parallel causal output; and, backend
  ``layer (auto)``, each causal module's ``init_state``/``step`` against its own causal forward;
- ``mask`` and ``varlen`` (every layer honouring ``attention_mask``/``cu_seqlens``, per backend that takes them,
  bidirectional and causal forms): a padded batch (left- and right-padded rows) and a packed row of a few
  sequences of odd lengths against each sequence run alone through the same layer and backend, outputs and input
  gradients; padding must get zero output and zero gradient. A backend declared ``masks=False`` is a skipped row.

The error of a row is the worst over its cases of ``max|got - ref| / max(1, max|ref|)`` (the relative error
for outputs above 1 in magnitude, the absolute one below); an exception counts as a failure and is shown.
A registered mechanism without cases is a failing ``coverage`` row. Exit status 0 when every row passes
(rows of backends this machine lacks are skipped, with the reason), 1 otherwise, 2 for unusable arguments
(e.g. ``--device cuda`` without CUDA).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import math
import platform
import sys
import time
import zlib
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import torch

from attnzoo.ops._selftest_inputs import randn
from attnzoo.ops._spec import Backend, CheckCase, Mechanism

__all__ = [
    "main",
    "plan",
    "run_selftest",
    "Row",
    "specs",
    "TOLERANCES",
    "forward_backward_errors",
    "leak_error",
    "decode_error",
    "layer_decode_error",
    "mask_error",
]

Inputs = dict[str, torch.Tensor]

#: tolerance of the normalised error per check, ``(float64, float32)``. float64 fails on any algorithmic slip;
#: float32 leaves room for float32 rounding of sums over a thousand tokens (observed worst on CPU: 2e-6 forward,
#: 3e-6 backward, 0 leak), while a wrong formula, mask or index is off by 1e-3 or more.
_TOLERANCE_PER_CHECK: dict[str, tuple[float, float]] = {
    "forward": (1e-9, 1e-4),
    "backward": (1e-8, 5e-4),
    # a correct causal path reads no later token at all: nothing but rounding of what it already had
    "causal leak": (1e-12, 1e-6),
    "decode": (1e-9, 1e-4),
    # outputs and input gradients of a layer (projections included) against the same layer on each sequence alone
    "mask": (1e-8, 5e-4),
    "varlen": (1e-8, 5e-4),
}
#: tolerance of the normalised error per (check, dtype)
TOLERANCES: dict[tuple[str, torch.dtype], float] = {
    (check, dtype): tol
    for check, tols in _TOLERANCE_PER_CHECK.items()
    for dtype, tol in zip((torch.float64, torch.float32), tols, strict=True)
}
DTYPES = (torch.float32, torch.float64)


# ------------------------------------------------------------------------------------------------ specs


def specs() -> list[CheckCase]:
    """The selftest cases of every registered mechanism, each once, in the order of ``list_attentions()``."""
    from attnzoo.layers import attention_info, list_attentions

    out: dict[str, CheckCase] = {}
    for name in list_attentions():
        for case in attention_info(name).mechanism.check_cases():
            out.setdefault(case.name, case)  # layers sharing a mechanism share its cases
    return list(out.values())


def plan(mech: Mechanism, device: torch.device) -> list[tuple[str, str | None]]:
    """The backends of ``mech`` but its reference that declare ``device``: (name, why it cannot run here or None)."""
    return [
        (name, _unavailable(b))
        for name, b in mech.backends.items()
        if name != mech.reference and ("any" in b.devices or device.type in b.devices)
    ]


def _unavailable(b: Backend) -> str | None:
    if not b.is_available():
        if b.kind == "triton" and importlib.util.find_spec("triton") is None:
            return "the triton package is not installed"
        return f"{b.module}.{b.attr} cannot run in this process"
    if b.kind == "cpu":
        from attnzoo.ops._cpu_kernels import cpu_kernels, cpu_kernels_error

        if cpu_kernels() is None:
            return f"CPU kernels unavailable: {cpu_kernels_error()}"
    return None


# ------------------------------------------------------------------------------------------------ rows


@dataclass
class Cell:
    """The worst normalised error of one check in one dtype, over its cases."""

    tol: float
    err: float = 0.0
    cases: int = 0
    note: str = ""  # the first exception

    @property
    def ok(self) -> bool:
        return not self.note and self.cases > 0 and self.err <= self.tol

    def add(self, err: float) -> None:
        self.cases += 1
        self.err = max(self.err, err) if math.isfinite(err) else math.inf

    def fail(self, exc: BaseException) -> None:
        self.cases += 1
        self.err = math.inf
        if not self.note:
            self.note = f"{type(exc).__name__}: {exc}".splitlines()[0][:160]


@dataclass
class Row:
    """One line of the table: one check of one mechanism's backend, a :class:`Cell` per input dtype."""

    mechanism: str
    backend: str
    check: str
    cells: dict[str, Cell] = field(default_factory=dict)  # "float32" / "float64" -> cell
    skip_reason: str = ""  # the backend is not available here (not a failure)

    @classmethod
    def for_check(cls, mechanism: str, backend: str, check: str) -> "Row":
        return cls(mechanism, backend, check, {_dname(d): Cell(TOLERANCES[(check, d)]) for d in DTYPES})

    def cell(self, dtype: torch.dtype) -> Cell:
        return self.cells[_dname(dtype)]

    @property
    def skipped(self) -> bool:
        return bool(self.skip_reason)

    @property
    def ok(self) -> bool:
        return self.skipped or (bool(self.cells) and all(c.ok for c in self.cells.values()))

    @property
    def status(self) -> str:
        return "skip" if self.skipped else ("ok" if self.ok else "FAIL")

    @property
    def note(self) -> str:
        return self.skip_reason or next((f"{d}: {c.note}" for d, c in self.cells.items() if c.note), "")


def _dname(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _err(got: torch.Tensor | None, ref: torch.Tensor | None) -> float:
    """``max|got - ref| / max(1, max|ref|)`` in float64 on CPU; inf for a shape mismatch or non-finite values."""
    if ref is None and got is None:
        return 0.0
    if ref is None:
        ref = torch.zeros_like(got)
    if got is None:
        got = torch.zeros_like(ref)
    got = got.detach().to("cpu", torch.float64)
    ref = ref.detach().to("cpu", torch.float64)
    if got.shape != ref.shape:
        return math.inf
    if got.numel() == 0:
        return 0.0
    diff = (got - ref).abs().max().item()
    if not math.isfinite(diff):
        return math.inf
    return diff / max(1.0, ref.abs().max().item())


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def _cfg_key(cfg: dict) -> tuple:
    return tuple(sorted(cfg.items()))  # configs hold plain values only, so this identifies them


def _to(x: Inputs, dtype: torch.dtype, device: torch.device, grads: Iterable[str]) -> Inputs:
    """Copies of ``x`` cast to ``dtype`` on ``device``; the ``grads`` inputs as fresh leaves."""
    out = {}
    for k, t in x.items():
        c = t.to(device=device, dtype=dtype).detach().clone()
        out[k] = c.requires_grad_(k in grads)
    return out


def _out_and_grads(spec: CheckCase, x: Inputs, cfg: dict, backend: str, cot: torch.Tensor | torch.Generator):
    """Output and gradients of ``sum(out * cot)``; ``cot`` (float64, CPU) is drawn from it when a generator."""
    out = spec.call(x, cfg, backend)
    if isinstance(cot, torch.Generator):
        cot = torch.randn(out.shape, generator=cot, dtype=torch.float64)
    leaves = [k for k in spec.grads if k in x]
    gs = torch.autograd.grad((out * cot.to(out.device, out.dtype)).sum(), [x[k] for k in leaves], allow_unused=True)
    return out.detach(), dict(zip(leaves, gs, strict=True)), cot


class _RefCache:
    """Float64 reference outputs and gradients per (case, config, shape, input dtype), shared by the backends."""

    def __init__(self) -> None:
        self._store: dict[tuple, tuple] = {}

    def get(self, spec: CheckCase, cfg: dict, shape, dtype: torch.dtype):
        key = (spec.name, _cfg_key(cfg), shape, dtype)
        if key not in self._store:
            gen = torch.Generator().manual_seed(_seed(spec.name, _cfg_key(cfg), shape))
            x64 = spec.make(shape, cfg, gen)
            # the reference sees exactly the (rounded) values the backend sees, in float64
            xr = {k: t.to(dtype).to(torch.float64) for k, t in x64.items()}
            ref_out, ref_grads, cot = _out_and_grads(
                spec, _to(xr, torch.float64, torch.device("cpu"), spec.grads), cfg, spec.mechanism.reference, gen
            )
            self._store[key] = (xr, cot, ref_out, ref_grads)
        return self._store[key]


def forward_backward_errors(
    spec: CheckCase,
    cfg: dict,
    shape,
    dtype: torch.dtype,
    device: torch.device,
    backend: str,
    refs: "_RefCache | None" = None,
) -> tuple[float, float]:
    """Normalised errors of ``backend``'s output and input gradients against the float64 reference (raises what the
    backend raises; an output of another dtype than its inputs is a ``TypeError``). ``refs`` keeps the reference's
    results for the next backend."""
    xr, cot, ref_out, ref_grads = (refs or _RefCache()).get(spec, cfg, shape, dtype)
    out, grads, _ = _out_and_grads(spec, _to(xr, dtype, device, spec.grads), cfg, backend, cot)
    if out.dtype != dtype:
        raise TypeError(f"output dtype {out.dtype} for {dtype} inputs")
    return _err(out, ref_out), max((_err(grads[k], ref_grads[k]) for k in ref_grads), default=0.0)


def _check_forward_backward(spec, cfg, shape, dtype, device, backend, refs, fwd: Row, bwd: Row) -> None:
    try:
        errors = forward_backward_errors(spec, cfg, shape, dtype, device, backend, refs)
    except Exception as exc:  # noqa: BLE001 - a selftest reports every failure as a row
        fwd.fail(exc)
        bwd.fail(exc)
        return
    fwd.add(errors[0])
    bwd.add(errors[1])


def leak_error(spec: CheckCase, cfg: dict, shape, dtype: torch.dtype, device: torch.device, backend: str) -> float:
    """How far outputs up to the middle token move when later tokens are redrawn, and how much gradient of those
    outputs reaches later tokens (normalised; 0 for a causal path that reads no later token)."""
    n = shape[2]
    if n < 2:
        return 0.0
    t = n // 2
    gen = torch.Generator().manual_seed(_seed("leak", spec.name, _cfg_key(cfg), shape))
    x64 = spec.make(shape, cfg, gen)
    x = _to(x64, dtype, device, spec.grads)
    out = spec.call(x, cfg, backend)
    cot = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(device, out.dtype)
    cot[:, :, t + 1 :] = 0  # the loss reads outputs up to t only
    leaves = [k for k in spec.tokens if k in x and k in spec.grads]
    gs = torch.autograd.grad((out * cot).sum(), [x[k] for k in leaves], allow_unused=True)
    # later tokens (and causal bias entries) redrawn: outputs up to t must not move
    xp = dict(x64)
    for k, ax in spec.tokens.items():
        if k in xp:
            fresh = randn(xp[k].shape, gen, 3.0)
            idx = torch.arange(xp[k].shape[ax]) > t
            shape_b = [1] * xp[k].ndim
            shape_b[ax] = -1
            xp[k] = torch.where(idx.view(shape_b), fresh, xp[k])
    with torch.no_grad():
        out2 = spec.call(_to(xp, dtype, device, ()), cfg, backend)
    err = _err(out2[:, :, : t + 1], out.detach()[:, :, : t + 1])
    for k, g in zip(leaves, gs, strict=True):
        if g is None:
            continue
        later = g.narrow(spec.tokens[k], t + 1, g.shape[spec.tokens[k]] - t - 1)
        scale = max(1.0, g.detach().abs().max().item())
        err = max(err, later.detach().abs().max().item() / scale if later.numel() else 0.0)
    return err if math.isfinite(err) else math.inf


def _check_leak(spec, cfg, shape, dtype, device, backend, row: Row) -> None:
    if shape[2] < 2:
        return
    try:
        row.add(leak_error(spec, cfg, shape, dtype, device, backend))
    except Exception as exc:  # noqa: BLE001
        row.fail(exc)


def decode_error(spec: CheckCase, cfg: dict, shape, dtype: torch.dtype, device: torch.device, backend: str) -> float:
    """Normalised error of the token-by-token step (``spec.step``) against ``backend``'s parallel causal output."""
    gen = torch.Generator().manual_seed(_seed("decode", spec.name, _cfg_key(cfg), shape))
    x = _to(spec.make(shape, cfg, gen), dtype, device, ())
    with torch.no_grad():
        par = spec.call(x, cfg, backend)
        seq = spec.step(x, cfg)
    return _err(seq, par)


def _check_decode(spec, cfg, shape, dtype, device, backend, row: Row) -> None:
    try:
        row.add(decode_error(spec, cfg, shape, dtype, device, backend))
    except Exception as exc:  # noqa: BLE001
        row.fail(exc)


def _decode_shapes(quick: bool) -> list[tuple[int, ...]]:
    # token-by-token loops in Python: a few dozen tokens are enough to cross chunk boundaries of the states
    return [(2, 3, 7, 5)] if quick else [(2, 3, 7, 5), (1, 2, 70, 16)]


@contextlib.contextmanager
def _num_threads(n: int | None) -> Iterator[None]:
    prev = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


def _run_spec(
    spec: CheckCase, device: torch.device, quick: bool, refs: _RefCache, emit, kernel_threads: int | None = None
) -> list[Row]:
    rows: list[Row] = []
    configs = spec.configs(quick)
    has_causal = any(c.get("causal") for c in configs)
    checks = ["forward", "backward"] + (["causal leak"] if has_causal else [])
    checks += ["decode"] if spec.step is not None and has_causal else []
    for backend, unavailable in plan(spec.mechanism, device):
        group = {c: Row.for_check(spec.name, backend, c) for c in checks}
        if unavailable:
            for r in group.values():
                r.skip_reason = unavailable
            for r in group.values():
                emit(r)
                rows.append(r)
            continue
        # the fused CPU kernels split their work over torch's threads: they run at the user's thread count
        threaded = spec.mechanism.backends[backend].kind == "cpu"
        with _num_threads(kernel_threads if threaded else None):
            for dtype in DTYPES:
                for cfg in configs:
                    for shape in spec.shapes(quick):
                        if len(shape) == 4 and shape[2] > cfg.get("max_n", shape[2]):
                            continue
                        _check_forward_backward(
                            spec,
                            cfg,
                            shape,
                            dtype,
                            device,
                            backend,
                            refs,
                            group["forward"].cell(dtype),
                            group["backward"].cell(dtype),
                        )
                        if cfg.get("causal"):
                            _check_leak(spec, cfg, shape, dtype, device, backend, group["causal leak"].cell(dtype))
                    if cfg.get("causal") and spec.step is not None:
                        for shape in _decode_shapes(quick):
                            _check_decode(spec, cfg, shape, dtype, device, backend, group["decode"].cell(dtype))
        for r in group.values():
            emit(r)
            rows.append(r)
    return rows


# -- module-level decoding: init_state/step against the causal forward (the layers' own recurrences)


def layer_decode_error(layer, x: torch.Tensor) -> float:
    """Normalised error of a causal layer's ``init_state``/``step`` token by token against its forward on ``x``
    ``(B, N, dim)``."""
    with torch.no_grad():
        par = layer(x)
        state = layer.init_state(x.shape[0], device=x.device, dtype=x.dtype)
        outs = []
        for t in range(x.shape[1]):
            y, state = layer.step(x[:, t : t + 1], state)
            outs.append(y)
    return _err(torch.cat(outs, dim=1), par)


def _layer_decode_rows(device: torch.device, quick: bool, emit) -> list[Row]:
    from attnzoo.layers import attention_info, build_attention, list_attentions

    rows = []
    n = 9 if quick else 40
    for name in list_attentions(causal=True):
        if not getattr(attention_info(name), "supports_step", False):
            continue
        row = Row.for_check(name, "layer (auto)", "decode")
        for dtype in DTYPES:
            gen = torch.Generator().manual_seed(_seed("layer", name))
            try:
                m = build_attention(name, 12, 3, causal=True).to(device=device, dtype=dtype).eval()
                with torch.no_grad():
                    for prm in m.parameters():  # away from the init (zero biases, unit temperatures)
                        prm.add_(randn(prm.shape, gen, 0.2).to(device, dtype))
                row.cell(dtype).add(layer_decode_error(m, randn((2, n, 12), gen).to(device, dtype)))
            except Exception as exc:  # noqa: BLE001
                row.cell(dtype).fail(exc)
        emit(row)
        rows.append(row)
    return rows


# -- padding masks and packed rows: each sequence as if alone


def _mask_lengths(quick: bool) -> list[int]:
    # odd lengths, one of a single token; long enough to cross a chunk of the chunked causal forms when not quick
    return [7, 4, 1] if quick else [13, 5, 9, 1, 20]


def mask_error(layer, xs: list[torch.Tensor], mode: str, gen: torch.Generator) -> float:
    """Worst normalised error of ``layer`` on ``xs`` (each ``(1, n_i, dim)``) padded (``"mask"``: even rows
    right-padded, odd rows left-padded) or packed (``"varlen"``) against each alone, outputs and input gradients;
    padding's output and gradient count against zero."""
    lengths = [x.shape[1] for x in xs]
    alone = [x.detach().clone().requires_grad_(True) for x in xs]
    outs = [layer(x) for x in alone]
    cots = [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.device, o.dtype) for o in outs]
    grads = torch.autograd.grad(sum((o * c).sum() for o, c in zip(outs, cots, strict=True)), alone)
    dim = xs[0].shape[-1]
    if mode == "varlen":
        slots = [(0, slice(sum(lengths[:i]), sum(lengths[: i + 1]))) for i in range(len(xs))]
        shape = (1, sum(lengths), dim)
    else:
        width = max(lengths)
        slots = [(i, slice(0, n) if i % 2 == 0 else slice(width - n, width)) for i, n in enumerate(lengths)]
        shape = (len(xs), width, dim)
    ref = xs[0]
    x = (1e3 * torch.randn(shape, generator=gen, dtype=torch.float64)).to(ref.device, ref.dtype)  # loud padding
    real = torch.zeros(shape[:2], dtype=torch.bool, device=ref.device)
    cot = torch.zeros(shape, dtype=ref.dtype, device=ref.device)
    for (row, sl), xi, ci in zip(slots, xs, cots, strict=True):
        x[row, sl] = xi[0].detach()
        real[row, sl] = True
        cot[row, sl] = ci[0]
    x.requires_grad_(True)
    if mode == "varlen":
        cu = torch.tensor([0] + [sum(lengths[: i + 1]) for i in range(len(xs))], dtype=torch.int32, device=ref.device)
        out = layer(x, cu_seqlens=cu)
    else:
        out = layer(x, attention_mask=real)
    (g,) = torch.autograd.grad((out * cot).sum(), [x])
    err = 0.0
    for (row, sl), o, gi in zip(slots, outs, grads, strict=True):
        err = max(err, _err(out[row, sl], o[0]), _err(g[row, sl], gi[0]))
    pad = ~real
    if bool(pad.any()):
        err = max(err, _err(out[pad], torch.zeros_like(out[pad])), _err(g[pad], torch.zeros_like(g[pad])))
    return err


def _mask_rows(device: torch.device, quick: bool, emit, only: list[str] | None = None) -> list[Row]:
    """``mask`` and ``varlen`` rows: each masked layer, per backend of its op this device runs (``force_backend``)."""
    from attnzoo.layers import attention_info, build_attention, list_attentions
    from attnzoo.ops._dispatch import force_backend

    rows = []
    for name in list_attentions():
        info = attention_info(name)
        mech = info.mechanism
        if mech is None or not getattr(info, "supports_masks", False) or (only and name not in only):
            continue
        forms = [c for c in (False, True) if (mech.causal if c else mech.noncausal)]
        for backend, unavailable in plan(mech, device):
            group = {c: Row.for_check(name, backend, c) for c in ("mask", "varlen")}
            if unavailable or not mech.backends[backend].masks:
                for r in group.values():
                    r.skip_reason = unavailable or "this backend does not take masks (Backend(masks=False))"
            else:
                for dtype in DTYPES:
                    for check, r in group.items():
                        gen = torch.Generator().manual_seed(_seed("mask", name, backend, check))
                        try:
                            with force_backend(backend):
                                for causal in forms:
                                    layer = build_attention(name, 12, 3, causal=causal).to(device, dtype).eval()
                                    with torch.no_grad():  # away from the init (zero biases, unit temperatures)
                                        for prm in layer.parameters():
                                            prm.add_(randn(prm.shape, gen, 0.2).to(device, dtype))
                                    xs = [randn((1, n, 12), gen).to(device, dtype) for n in _mask_lengths(quick)]
                                    r.cell(dtype).add(mask_error(layer, xs, check, gen))
                        except Exception as exc:  # noqa: BLE001 - a selftest reports every failure as a row
                            r.cell(dtype).fail(exc)
            for r in group.values():
                emit(r)
                rows.append(r)
    return rows


def _coverage_rows(cases: list[CheckCase], emit) -> list[Row]:
    """A failing row for any registered mechanism whose cases did not all run (none declared: a new one must)."""
    from attnzoo.layers import attention_info, list_attentions

    names = {s.name for s in cases}
    rows = []
    for name in list_attentions():
        own = {c.name for c in attention_info(name).mechanism.check_cases()}
        if not own or not own <= names:
            cell = Cell(0.0, math.inf, 1, "no selftest case for this registered mechanism")
            row = Row(name, "-", "coverage", {"-": cell})
            emit(row)
            rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------------ driver


_COLS = [
    ("mechanism", 12),
    ("backend", 15),
    ("check", 12),
    ("cases", 5),
    ("float32 err", 11),
    ("tol", 6),
    ("float64 err", 11),
    ("tol", 6),
    ("result", 6),
]


def _header() -> str:
    return "  ".join(f"{n:<{w}}" for n, w in _COLS).rstrip()


def _fmt_cell(c: Cell | None, skipped: bool) -> tuple[str, str]:
    if c is None or skipped:
        return "-", "-" if c is None else f"{c.tol:.0e}"
    if c.note:
        return "error", f"{c.tol:.0e}"
    return ("inf" if math.isinf(c.err) else f"{c.err:.2e}"), f"{c.tol:.0e}"


def format_row(r: Row) -> str:
    """The table line of ``r``: worst error and tolerance per dtype, the result and the first error message."""
    f32 = _fmt_cell(r.cells.get("float32"), r.skipped)
    f64 = _fmt_cell(r.cells.get("float64"), r.skipped)
    cases = max((c.cases for c in r.cells.values()), default=0)
    cells = [r.mechanism, r.backend, r.check, str(cases), *f32, *f64, r.status]
    line = "  ".join(f"{c:<{w}}" for c, (_, w) in zip(cells, _COLS, strict=True))
    return (line + (f"  {r.note}" if r.note else "")).rstrip()


def resolve_device(name: str) -> torch.device:
    """``"cpu"`` or ``"cuda"`` as a usable device; ``ValueError`` saying why CUDA cannot be used."""
    if name == "cpu":
        return torch.device("cpu")
    if name != "cuda":
        raise ValueError(f"--device must be 'cpu' or 'cuda', got {name!r}")
    if not torch.cuda.is_available():
        why = (
            "this torch build has no CUDA support (torch.version.cuda is None; install a CUDA build of torch)"
            if torch.version.cuda is None
            else "no CUDA GPU is visible (check the driver and CUDA_VISIBLE_DEVICES)"
        )
        raise ValueError(f"--device cuda: CUDA is not available: {why}; run `attnzoo selftest --device cpu` instead")
    return torch.device("cuda", torch.cuda.current_device())


def run_selftest(
    device: torch.device,
    *,
    quick: bool = False,
    only: list[str] | None = None,
    out=None,
    kernel_threads: int | None = None,
) -> list[Row]:
    """Run every case (or those named in ``only``) on ``device``; print the table to ``out`` as rows finish.

    ``kernel_threads``: torch threads while the fused CPU kernels' rows run (their work is split over threads,
    so only more than one exercises that); ``None`` keeps the current setting for every row.
    """
    out = sys.stdout if out is None else out
    cases = [s for s in specs() if not only or s.name in only or s.name.split()[0] in only]

    def emit(row: Row) -> None:
        print(format_row(row), file=out, flush=True)

    print(_header(), file=out)
    print("-" * len(_header()), file=out, flush=True)
    refs = _RefCache()
    rows: list[Row] = []
    for spec in cases:
        rows += _run_spec(spec, device, quick, refs, emit, kernel_threads)
    rows += _mask_rows(device, quick, emit, [o.split()[0] for o in only] if only else None)
    if not only:
        rows += _layer_decode_rows(device, quick, emit)
        rows += _coverage_rows(cases, emit)
    return rows


def main(argv: list[str] | None = None) -> int:
    cases = specs()
    ap = argparse.ArgumentParser(
        prog="attnzoo selftest",
        description="Check every mechanism x every backend of this device against the "
        "float64 naive reference: forward, gradients, causal leak, decoding; and padded batches and packed rows "
        "against each sequence alone.",
    )
    ap.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default=None,
        help="where to run the backends (default: cuda if available, else cpu)",
    )
    ap.add_argument("--quick", action="store_true", help="fewer shapes and options (a few seconds)")
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="torch CPU threads for every row (default: 1, the fastest for the small tensors of the "
        "checks, and torch's default for the fused CPU kernels' rows so their parallel split runs)",
    )
    ap.add_argument(
        "--only",
        nargs="+",
        metavar="MECHANISM",
        default=None,
        help="only these mechanisms (fastmax: both p; 'fastmax p=1' one of them): "
        + ", ".join(dict.fromkeys(s.name.split()[0] for s in cases)),
    )
    args = ap.parse_args(argv)
    valid = {s.name for s in cases} | {s.name.split()[0] for s in cases}
    if args.only:
        bad = [m for m in args.only if m not in valid]
        if bad:
            print(f"attnzoo selftest: --only {bad} unknown; valid: {sorted(valid)}", file=sys.stderr)
            return 2
    if args.threads is not None and args.threads < 1:
        print(f"attnzoo selftest: --threads must be a positive integer, got {args.threads}", file=sys.stderr)
        return 2
    kernel_threads = args.threads or torch.get_num_threads()
    with _num_threads(args.threads or 1):  # restored afterwards: main() may run inside a larger program
        return _run_main(args, kernel_threads)


def _run_main(args: argparse.Namespace, kernel_threads: int) -> int:
    name = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = resolve_device(name)
    except ValueError as err:
        print(f"attnzoo selftest: {err}", file=sys.stderr)
        return 2
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    print(
        f"attnzoo selftest: device {device} ({where}), torch {torch.__version__}, "
        f"{'quick' if args.quick else 'full'} run, {torch.get_num_threads()} CPU thread(s)"
        + (f" ({kernel_threads} for the fused CPU kernels)" if device.type == "cpu" else "")
    )
    t0 = time.perf_counter()
    rows = run_selftest(device, quick=args.quick, only=args.only, kernel_threads=kernel_threads)
    failed = [r for r in rows if not r.ok]
    skipped = [r for r in rows if r.skipped]
    from attnzoo.ops._triton_utils import triton_failures

    for op, err in triton_failures().items():  # the layer rows run backend="auto"
        print(f"note: backend='auto' fell back to PyTorch for {op}: its Triton kernel failed ({err})")
    print(f"selftest: {len(rows)} rows, {len(failed)} failed, {len(skipped)} skipped, {time.perf_counter() - t0:.1f} s")
    if failed:
        print("FAILED: " + "; ".join(f"{r.mechanism} / {r.backend} / {r.check}" for r in failed))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
