"""``attnzoo selftest``: every mechanism x every backend of this device against the float64 naive reference.

Run it first on a new machine (``--device cuda`` on a GPU: the Triton kernels have not been run on yours).
For each mechanism (softmax, linear, xca, mssa, tssa, fastmax p=1 and p=2, csp, cbsa, MEGA's ema and
attention) and each backend available on the device (e.g. TSSA: ``torch``, the fused ``cpu`` kernels on CPU,
``triton`` on CUDA) it checks, in float32 and float64 inputs:

- ``forward``: the output against the op's ``naive`` backend evaluated in float64 (on CPU) on the same
  inputs (float32 inputs are rounded first, so the row measures the backend's error, not the rounding);
- ``backward``: the gradients of every differentiable input (q/k/v, w, temperatures, biases, reps, eta)
  for a random cotangent, against the reference's;
- ``causal leak`` (causal ops): tokens after ``t`` (and the causal bias there) are redrawn; outputs up to
  ``t`` must not move, and the gradient of outputs up to ``t`` must not reach tokens after ``t``;
- ``decode`` (mechanisms with a recurrence): the token-by-token step (``tssa_step``, ``fastmax_step``,
  ``linear_attention_recurrent``) against the backend's parallel causal output; and, backend
  ``layer (auto)``, each causal module's ``init_state``/``step`` against its own causal forward.

The error of a row is the worst over its cases of ``max|got - ref| / max(1, max|ref|)`` (the relative error
for outputs above 1 in magnitude, the absolute one below); an exception counts as a failure and is shown.
A registered mechanism without a case here is a failing ``coverage`` row. Exit status 0 when every row passes
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
from typing import Callable, Iterable, Iterator

import torch

__all__ = ["main", "run_selftest", "Row", "SPECS", "TOLERANCES"]

Inputs = dict[str, torch.Tensor]

#: tolerance of the normalised error per (check, dtype). float64 rows fail on any algorithmic slip; float32
#: rows leave room for float32 rounding of sums over a thousand tokens (observed worst on CPU: 2e-6 forward,
#: 3e-6 backward, 0 leak), while a wrong formula, mask or index is off by 1e-3 or more.
TOLERANCES: dict[tuple[str, torch.dtype], float] = {
    ("forward", torch.float64): 1e-9,
    ("forward", torch.float32): 1e-4,
    ("backward", torch.float64): 1e-8,
    ("backward", torch.float32): 5e-4,
    # a correct causal path reads no later token at all: nothing but rounding of what it already had
    ("causal leak", torch.float64): 1e-12,
    ("causal leak", torch.float32): 1e-6,
    ("decode", torch.float64): 1e-9,
    ("decode", torch.float32): 1e-4,
}
DTYPES = (torch.float32, torch.float64)
# backends whose work is split over torch's CPU threads (the fused C++ kernels): run at the user's thread count
_THREADED_BACKENDS = ("cpu",)


# ------------------------------------------------------------------------------------------------ specs


@dataclass(frozen=True)
class Spec:
    """How to exercise one mechanism's op.

    ``make(shape, cfg, gen)`` draws float64 CPU inputs; ``call(x, cfg, backend)`` runs the public op;
    ``grads`` names the differentiable inputs; ``tokens`` maps an input to its token axis (for the leak test,
    the output's token axis is 2); ``step(x, cfg)`` returns the token-by-token causal output, or is None.
    A config's ``max_n`` skips ``(B, H, N, P)`` shapes with longer N.
    """

    name: str
    backends: Callable[[torch.device], list[tuple[str, str | None]]]  # (backend, reason it is unavailable)
    configs: Callable[[bool], list[dict]]
    shapes: Callable[[bool], list[tuple[int, ...]]]
    make: Callable[[tuple[int, ...], dict, torch.Generator], Inputs]
    call: Callable[[Inputs, dict, str], torch.Tensor]
    grads: tuple[str, ...]
    tokens: dict[str, int] = field(default_factory=dict)
    step: Callable[[Inputs, dict], torch.Tensor] | None = None


def _randn(shape, gen, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float64) * scale


# Shapes (B, H, N, P): N=1, odd N, a head dim that is not a power of two, N across the chunks of the
# PyTorch scans (32-64 tokens) and of the CPU kernels (64-token blocks, 256-token chunks), and the head dims
# the CPU kernels unroll (16, 32, 64). --quick keeps two of them.
_SHAPES_QUICK = [(2, 3, 7, 5), (1, 2, 70, 16)]
_SHAPES_FULL = [
    (1, 1, 1, 3),
    (2, 3, 7, 5),
    (1, 4, 33, 3),
    (2, 2, 300, 6),
    (1, 3, 777, 16),
    (1, 2, 130, 32),
    (1, 1, 70, 64),
    (2, 2, 1100, 8),
]


def _shapes(quick: bool) -> list[tuple[int, ...]]:
    return list(_SHAPES_QUICK if quick else _SHAPES_FULL)


def _causal_configs(quick: bool, **extra) -> list[dict]:
    return [dict(causal=c, **extra) for c in (False, True)]


def _softmax_family_backends(op: str, package: str) -> Callable[[torch.device], list[tuple[str, str | None]]]:
    def backends(device: torch.device) -> list[tuple[str, str | None]]:
        out: list[tuple[str, str | None]] = [("torch", None)]
        if device.type == "cuda":
            from attnzoo.ops._spec import Mechanism

            spec = next(v for v in vars(importlib.import_module(package)).values() if isinstance(v, Mechanism))
            if "triton" in spec.backend_names():
                out.append(("triton", None))
        return out

    return backends


def _qkv(shape, cfg, gen) -> Inputs:
    b, h, n, p = shape
    return {"q": _randn(shape, gen), "k": _randn(shape, gen), "v": _randn((b, h, n, p + 1), gen)}


# -- softmax
def _softmax_call(x, cfg, backend):
    from attnzoo.ops.softmax import softmax_attention

    return softmax_attention(x["q"], x["k"], x["v"], causal=cfg["causal"], backend=backend)


# -- linear
def _linear_call(x, cfg, backend):
    from attnzoo.ops.linear import linear_attention

    return linear_attention(
        x["q"],
        x["k"],
        x["v"],
        causal=cfg["causal"],
        feature_map=cfg["feature_map"],
        chunk_size=cfg.get("chunk_size"),
        backend=backend,
    )


def _linear_step(x, cfg):
    from attnzoo.ops.linear import linear_attention_recurrent

    state, outs = None, []
    for t in range(x["q"].shape[2]):
        o, state = linear_attention_recurrent(
            *(x[k][:, :, t : t + 1] for k in "qkv"), state, feature_map=cfg["feature_map"]
        )
        outs.append(o)
    return torch.cat(outs, dim=2)


# -- xca
def _xca_make(shape, cfg, gen):
    h = shape[1]
    return {
        "q": _randn(shape, gen),
        "k": _randn(shape, gen),
        "v": _randn(shape, gen),
        "temp": 0.5 + torch.rand(h, generator=gen, dtype=torch.float64),
    }


def _xca_call(x, cfg, backend):
    from attnzoo.ops.xca import xca

    return xca(x["q"], x["k"], x["v"], x["temp"], backend=backend)


# -- mssa
def _mssa_call(x, cfg, backend):
    from attnzoo.ops.mssa import mssa

    return mssa(x["w"], causal=cfg["causal"], normalize_query=cfg["normalize_query"], backend=backend)


# -- tssa
def _tssa_backends(device: torch.device) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = [("torch", None)]
    if device.type == "cpu":
        from attnzoo.ops._cpu_kernels import cpu_kernels, cpu_kernels_error

        out.append(("cpu", None if cpu_kernels() is not None else f"CPU kernels unavailable: {cpu_kernels_error()}"))
    elif device.type == "cuda":
        out.append(("triton", None if importlib.util.find_spec("triton") else "the triton package is not installed"))
    return out


def _tssa_make(shape, cfg, gen):
    _, h, n, p = shape
    # features of different scales and temperatures away from 1 keep Pi far from uniform (as tests/ops do)
    x = {
        "w": _randn(shape, gen) * torch.exp(_randn((1, h, 1, p), gen)),
        "temp": 0.5 + 2 * torch.rand(h, generator=gen, dtype=torch.float64),
    }
    if cfg["causal"]:
        x["bias"] = _randn((h, n + 3, 1), gen, 0.3)  # N_max > N, as a module's max_len is
    return x


def _tssa_call(x, cfg, backend):
    from attnzoo.ops.tssa import tssa

    return tssa(x["w"], x["temp"], causal=cfg["causal"], bias=x.get("bias"), backend=backend)


def _tssa_step(x, cfg):
    from attnzoo.ops.tssa import tssa_init_state, tssa_step

    w = x["w"]
    b, h, n, p = w.shape
    state = tssa_init_state(b, h, p, device=w.device, dtype=w.dtype)
    outs = []
    for t in range(n):
        o, state = tssa_step(w[:, :, t], x["temp"], state, bias=x["bias"])
        outs.append(o)
    return torch.stack(outs, dim=2)


# -- fastmax
def _fastmax_backends(device: torch.device) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = [("torch", None), ("torch_autograd", None)]
    if device.type == "cuda":
        from attnzoo.ops.fastmax import _triton_available

        out.append(("triton", None if _triton_available() else "the triton package is not installed"))
    return out


def _fastmax_scale(cfg, d: int) -> float | None:
    # p=1 with scale > 1/D can have negative weights and near-zero normalisers: ill-conditioned comparisons
    # (the op's module doc); 1/D keeps p=1 an average, as the tests do.
    return 1.0 / d if cfg["p"] == 1 else None


def _fastmax_call(x, cfg, backend):
    from attnzoo.ops.fastmax import fastmax

    d = x["q"].shape[-1]
    return fastmax(
        x["q"],
        x["k"],
        x["v"],
        p=cfg["p"],
        causal=cfg["causal"],
        scale=_fastmax_scale(cfg, d),
        chunk_size=cfg.get("chunk_size"),
        backend=backend,
    )


def _fastmax_step(x, cfg):
    from attnzoo.ops.fastmax import fastmax_init_state, fastmax_step

    q, k, v = x["q"], x["k"], x["v"]
    b, h, n, d = q.shape
    state = fastmax_init_state(b, h, d, v.shape[-1], p=cfg["p"], device=q.device, dtype=q.dtype)
    outs = []
    for t in range(n):
        sl = slice(t, t + 1)
        o, state = fastmax_step(q[:, :, sl], k[:, :, sl], v[:, :, sl], state, p=cfg["p"], scale=_fastmax_scale(cfg, d))
        outs.append(o)
    return torch.cat(outs, dim=2)


def _fastmax_configs(quick: bool, p: int) -> list[dict]:
    # chunk_size=5: many masked chunks (and ragged ones) in the causal sweeps at small N (max_n: shapes up to)
    return _causal_configs(quick, p=p) + ([] if quick else [dict(causal=True, p=p, chunk_size=5, max_n=130)])


def _fastmax_shapes(quick: bool) -> list[tuple[int, ...]]:
    # p=2 features are 1 + D + D^2 wide: D=64 alone would dominate the run
    return [s for s in _shapes(quick) if s[3] <= 32]


# -- csp: (B, N, C, groups): complete sort, pure shift, groups of 2 (min/max path), odd N, N=1
def _csp_shapes(quick: bool) -> list[tuple[int, ...]]:
    if quick:
        return [(2, 12, 5, 4), (1, 9, 4, 1)]
    return [(1, 1, 3, 1), (2, 6, 4, 1), (2, 6, 4, 3), (2, 7, 5, 7), (2, 12, 5, 6), (1, 15, 3, 3), (2, 300, 16, 10)]


def _csp_make(shape, cfg, gen):
    b, n, c, _ = shape
    # continuous random values are distinct (ties would make the permutation, hence gradients, tie-rule
    # dependent; both backends break ties alike, but float32 rounding could create ties float64 lacks)
    return {"v": _randn((b, n, c), gen)}


def _csp_call(x, cfg, backend):
    from attnzoo.ops.csp import csp, csp_shifts

    v = x["v"]
    n, c = v.shape[1], v.shape[2]
    shifts = csp_shifts(n, c) if cfg["shifts"] == "schedule" else [(3 * i * i + 1) % (2 * n + 1) - n for i in range(c)]
    groups = {"complete sort": 1, "small groups": n // _smallest_factor(n), "shift only": n}[cfg["groups"]]
    return csp(v, shifts, groups, backend=backend)


def _csp_configs(quick: bool) -> list[dict]:
    cfgs = [
        dict(causal=False, shifts="schedule", groups="small groups"),
        dict(causal=False, shifts="arbitrary", groups="complete sort"),
    ]
    return cfgs if quick else cfgs + [dict(causal=False, shifts="arbitrary", groups="shift only")]


def _smallest_factor(n: int) -> int:
    return next((f for f in range(2, n + 1) if n % f == 0), 1)


# -- cbsa: (B, H, N, P, M): M < P, M > P (the exact solve's push-through branch), M > N
_CBSA_CASES = [
    ("cbsa", "softmax"),
    ("cbsa", "exact"),
    ("agent", None),
    ("mssa", "softmax"),
    ("mssa", "exact"),
    ("linear", None),
    ("channel", None),
]


def _cbsa_shapes(quick: bool) -> list[tuple[int, ...]]:
    if quick:
        return [(2, 3, 7, 5, 3), (1, 2, 16, 8, 9)]
    return [(1, 1, 1, 4, 1), (2, 3, 7, 5, 3), (2, 2, 9, 3, 5), (1, 2, 16, 8, 4), (1, 1, 3, 2, 6), (2, 2, 200, 16, 8)]


def _cbsa_make(shape, cfg, gen):
    b, h, n, p, m = shape
    x = {"w": _randn((b, h, n, p), gen)}
    if cfg["variant"] in ("cbsa", "agent"):
        x["reps"] = _randn((b, h, m, p), gen)
        x["eta"] = _randn((h, 1, 1), gen)
    return x


def _cbsa_call(x, cfg, backend):
    from attnzoo.ops.cbsa import cbsa

    kw = dict(variant=cfg["variant"], contraction=cfg["contraction"], eps=0.7, backend=backend)
    if "eta" in x:
        kw["eta"] = x["eta"]
    return cbsa(x["w"], x.get("reps"), **kw)


# -- ema: x (B, H, N, P) is B*H sequences of P channels; h = 3 expanded dimensions; alpha, delta through a sigmoid
def _ema_make(shape, cfg, gen):
    b, hh, n, p = shape
    lead = (p, 3) if cfg["causal"] else (2, p, 3)
    return {"x": _randn(shape, gen), **{k: _randn(lead, gen) for k in ("alpha", "delta", "beta", "eta")}}


def _ema_args(x):
    return x["x"].flatten(0, 1), torch.sigmoid(x["alpha"]), torch.sigmoid(x["delta"]), x["beta"], x["eta"]


def _ema_call(x, cfg, backend):
    from attnzoo.ops.ema import ema

    return ema(*_ema_args(x), causal=cfg["causal"], backend=backend).view(x["x"].shape)


def _ema_step(x, cfg):
    from attnzoo.ops.ema import ema_step

    xs, *coeffs = _ema_args(x)
    state, outs = None, []
    for t in range(xs.shape[1]):
        y, state = ema_step(xs[:, t : t + 1], state, *coeffs)
        outs.append(y)
    return torch.cat(outs, dim=1).view(x["x"].shape)


# -- mega attention: q, k (B, H, N, P), v (B, H, N, P + 1) as B*H single-head sequences; full and chunked
def _mega_make(shape, cfg, gen):
    b, hh, n, p = shape
    qkv = {k: _randn((b, hh, n, p + (k == "v")), gen) for k in ("q", "k", "v")}
    return {**qkv, "rel_bias": _randn((2 * n - 1,), gen, 0.5)}


def _mega_call(x, cfg, backend):
    from attnzoo.ops.mega import mega_attention

    q, k, v = (x[n].flatten(0, 1) for n in ("q", "k", "v"))
    out = mega_attention(q, k, v, x["rel_bias"], fn=cfg["fn"], chunk_size=cfg["chunk_size"], backend=backend)
    return out.view(x["v"].shape)


def _only_torch(device: torch.device) -> list[tuple[str, str | None]]:
    return [("torch", None)]


SPECS: list[Spec] = [
    Spec(
        "softmax",
        _softmax_family_backends("softmax_attention", "attnzoo.ops.softmax"),
        _causal_configs,
        _shapes,
        _qkv,
        _softmax_call,
        ("q", "k", "v"),
        {"q": 2, "k": 2, "v": 2},
    ),
    Spec(
        "linear",
        _softmax_family_backends("linear_attention", "attnzoo.ops.linear"),
        lambda quick: (
            [dict(causal=c, feature_map=f) for c in (False, True) for f in (("elu",) if quick else ("elu", "relu"))]
            + ([] if quick else [dict(causal=True, feature_map="elu", chunk_size=5, max_n=130)])
        ),
        _shapes,
        _qkv,
        _linear_call,
        ("q", "k", "v"),
        {"q": 2, "k": 2, "v": 2},
        _linear_step,
    ),
    Spec(
        "xca",
        _softmax_family_backends("xca", "attnzoo.ops.xca"),
        lambda quick: [dict(causal=False)],
        _shapes,
        _xca_make,
        _xca_call,
        ("q", "k", "v", "temp"),
    ),
    Spec(
        "mssa",
        _softmax_family_backends("mssa", "attnzoo.ops.mssa"),
        lambda quick: [
            dict(causal=c, normalize_query=nq) for c in (False, True) for nq in (False, True) if not quick or c == nq
        ],
        _shapes,
        lambda shape, cfg, gen: {"w": _randn(shape, gen)},
        _mssa_call,
        ("w",),
        {"w": 2},
    ),
    Spec(
        "tssa",
        _tssa_backends,
        _causal_configs,
        _shapes,
        _tssa_make,
        _tssa_call,
        ("w", "temp", "bias"),
        {"w": 2, "bias": 1},
        _tssa_step,
    ),
    Spec(
        "fastmax p=1",
        _fastmax_backends,
        lambda quick: _fastmax_configs(quick, 1),
        _fastmax_shapes,
        _qkv,
        _fastmax_call,
        ("q", "k", "v"),
        {"q": 2, "k": 2, "v": 2},
        _fastmax_step,
    ),
    Spec(
        "fastmax p=2",
        _fastmax_backends,
        lambda quick: _fastmax_configs(quick, 2),
        _fastmax_shapes,
        _qkv,
        _fastmax_call,
        ("q", "k", "v"),
        {"q": 2, "k": 2, "v": 2},
        _fastmax_step,
    ),
    Spec("csp", _only_torch, _csp_configs, _csp_shapes, _csp_make, _csp_call, ("v",)),
    Spec(
        "ema",
        _only_torch,
        _causal_configs,
        _shapes,
        _ema_make,
        _ema_call,
        ("x", "alpha", "delta", "beta", "eta"),
        {"x": 2},
        _ema_step,
    ),
    Spec(
        "mega",
        _only_torch,
        lambda quick: [dict(causal=False, fn=f, chunk_size=c) for f in ("softmax", "laplace") for c in (None, 5)],
        _shapes,
        _mega_make,
        _mega_call,
        ("q", "k", "v", "rel_bias"),
    ),
    Spec(
        "cbsa",
        _only_torch,
        lambda quick: [dict(causal=False, variant=v, contraction=c) for v, c in _CBSA_CASES],
        _cbsa_shapes,
        _cbsa_make,
        _cbsa_call,
        ("w", "reps", "eta"),
    ),
]

#: registered module name -> the specs that test its op (every registered mechanism must appear here)
MODULE_SPECS = {
    "softmax": ["softmax"],
    "linear": ["linear"],
    "xca": ["xca"],
    "mssa": ["mssa"],
    "tssa": ["tssa"],
    "fastmax": ["fastmax p=1", "fastmax p=2"],
    "csp": ["csp"],
    "cbsa": ["cbsa"],
    "mega": ["ema", "mega"],
}


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


def _out_and_grads(spec: Spec, x: Inputs, cfg: dict, backend: str, cot: torch.Tensor | torch.Generator):
    """Output and gradients of ``sum(out * cot)``; ``cot`` (float64, CPU) is drawn from it when a generator."""
    out = spec.call(x, cfg, backend)
    if isinstance(cot, torch.Generator):
        cot = torch.randn(out.shape, generator=cot, dtype=torch.float64)
    leaves = [k for k in spec.grads if k in x]
    gs = torch.autograd.grad((out * cot.to(out.device, out.dtype)).sum(), [x[k] for k in leaves], allow_unused=True)
    return out.detach(), dict(zip(leaves, gs)), cot


class _RefCache:
    """Float64 naive outputs and gradients per (spec, config, shape, input dtype), shared by the backends."""

    def __init__(self) -> None:
        self._store: dict[tuple, tuple] = {}

    def get(self, spec: Spec, cfg: dict, shape, dtype: torch.dtype):
        key = (spec.name, _cfg_key(cfg), shape, dtype)
        if key not in self._store:
            gen = torch.Generator().manual_seed(_seed(spec.name, _cfg_key(cfg), shape))
            x64 = spec.make(shape, cfg, gen)
            # the reference sees exactly the (rounded) values the backend sees, in float64
            xr = {k: t.to(dtype).to(torch.float64) for k, t in x64.items()}
            ref_out, ref_grads, cot = _out_and_grads(
                spec, _to(xr, torch.float64, torch.device("cpu"), spec.grads), cfg, "naive", gen
            )
            self._store[key] = (xr, cot, ref_out, ref_grads)
        return self._store[key]


def _check_forward_backward(spec, cfg, shape, dtype, device, backend, refs, fwd: Row, bwd: Row) -> None:
    try:
        xr, cot, ref_out, ref_grads = refs.get(spec, cfg, shape, dtype)
        out, grads, _ = _out_and_grads(spec, _to(xr, dtype, device, spec.grads), cfg, backend, cot)
    except Exception as exc:  # noqa: BLE001 - a selftest reports every failure as a row
        fwd.fail(exc)
        bwd.fail(exc)
        return
    if out.dtype != dtype:
        fwd.fail(TypeError(f"output dtype {out.dtype} for {dtype} inputs"))
    else:
        fwd.add(_err(out, ref_out))
    bwd.add(max((_err(grads[k], ref_grads[k]) for k in ref_grads), default=0.0))


def _check_leak(spec, cfg, shape, dtype, device, backend, row: Row) -> None:
    n = shape[2]
    if n < 2:
        return
    t = n // 2
    gen = torch.Generator().manual_seed(_seed("leak", spec.name, _cfg_key(cfg), shape))
    try:
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
                fresh = _randn(xp[k].shape, gen, 3.0)
                idx = torch.arange(xp[k].shape[ax]) > t
                shape_b = [1] * xp[k].ndim
                shape_b[ax] = -1
                xp[k] = torch.where(idx.view(shape_b), fresh, xp[k])
        with torch.no_grad():
            out2 = spec.call(_to(xp, dtype, device, ()), cfg, backend)
    except Exception as exc:  # noqa: BLE001
        row.fail(exc)
        return
    err = _err(out2[:, :, : t + 1], out.detach()[:, :, : t + 1])
    for k, g in zip(leaves, gs):
        if g is None:
            continue
        later = g.narrow(spec.tokens[k], t + 1, g.shape[spec.tokens[k]] - t - 1)
        scale = max(1.0, g.detach().abs().max().item())
        err = max(err, later.detach().abs().max().item() / scale if later.numel() else 0.0)
    row.add(err if math.isfinite(err) else math.inf)


def _check_decode(spec, cfg, shape, dtype, device, backend, row: Row) -> None:
    gen = torch.Generator().manual_seed(_seed("decode", spec.name, _cfg_key(cfg), shape))
    try:
        x = _to(spec.make(shape, cfg, gen), dtype, device, ())
        with torch.no_grad():
            par = spec.call(x, cfg, backend)
            seq = spec.step(x, cfg)
    except Exception as exc:  # noqa: BLE001
        row.fail(exc)
        return
    row.add(_err(seq, par))


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
    spec: Spec, device: torch.device, quick: bool, refs: _RefCache, emit, kernel_threads: int | None = None
) -> list[Row]:
    rows: list[Row] = []
    configs = spec.configs(quick)
    has_causal = any(c.get("causal") for c in configs)
    checks = ["forward", "backward"] + (["causal leak"] if has_causal else [])
    checks += ["decode"] if spec.step is not None and has_causal else []
    for backend, unavailable in spec.backends(device):
        group = {c: Row.for_check(spec.name, backend, c) for c in checks}
        if unavailable:
            for r in group.values():
                r.skip_reason = unavailable
            for r in group.values():
                emit(r)
                rows.append(r)
            continue
        with _num_threads(kernel_threads if backend in _THREADED_BACKENDS else None):
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
                        prm.add_(_randn(prm.shape, gen, 0.2).to(device, dtype))
                    x = _randn((2, n, 12), gen).to(device, dtype)
                    par = m(x)
                    state = m.init_state(2, device=device, dtype=dtype)
                    outs = []
                    for t in range(n):
                        y, state = m.step(x[:, t : t + 1], state)
                        outs.append(y)
                row.cell(dtype).add(_err(torch.cat(outs, dim=1), par))
            except Exception as exc:  # noqa: BLE001
                row.cell(dtype).fail(exc)
        emit(row)
        rows.append(row)
    return rows


def _coverage_rows(specs: list[Spec], emit) -> list[Row]:
    """A failing row for any registered mechanism the selftest has no case for (a new module must add one)."""
    from attnzoo.layers import list_attentions

    names = {s.name for s in specs}
    rows = []
    for mech in list_attentions():
        if mech not in MODULE_SPECS or not set(MODULE_SPECS[mech]) <= names:
            cell = Cell(0.0, math.inf, 1, "no selftest case for this registered mechanism")
            row = Row(mech, "-", "coverage", {"-": cell})
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
    line = "  ".join(f"{c:<{w}}" for c, (_, w) in zip(cells, _COLS))
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
    """Run every spec (or those named in ``only``) on ``device``; print the table to ``out`` as rows finish.

    ``kernel_threads``: torch threads while the fused CPU kernels' rows run (their work is split over threads,
    so only more than one exercises that); ``None`` keeps the current setting for every row.
    """
    out = sys.stdout if out is None else out
    specs = [s for s in SPECS if not only or s.name in only or s.name.split()[0] in only]

    def emit(row: Row) -> None:
        print(format_row(row), file=out, flush=True)

    print(_header(), file=out)
    print("-" * len(_header()), file=out, flush=True)
    refs = _RefCache()
    rows: list[Row] = []
    for spec in specs:
        rows += _run_spec(spec, device, quick, refs, emit, kernel_threads)
    if not only:
        rows += _layer_decode_rows(device, quick, emit)
        rows += _coverage_rows(specs, emit)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="attnzoo selftest",
        description="Check every mechanism x every backend of this device against the "
        "float64 naive reference: forward, gradients, causal leak, decoding.",
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
        + ", ".join(dict.fromkeys(s.name.split()[0] for s in SPECS)),
    )
    args = ap.parse_args(argv)
    valid = {s.name for s in SPECS} | {s.name.split()[0] for s in SPECS}
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
