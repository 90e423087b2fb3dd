"""What the contract tests run, read from the registry: no mechanism or backend is named here.

Every registered mechanism (``list_attentions()``) declares its op's backends (``Mechanism.backends``) and the cases
that exercise them (``Mechanism.checks``: :class:`~attnzoo.ops._spec.CheckCase`, the ones ``attnzoo selftest``
runs). The comparisons themselves are the selftest's (:func:`attnzoo.selftest.forward_backward_errors`,
:func:`~attnzoo.selftest.leak_error`, :func:`~attnzoo.selftest.decode_error`, :func:`~attnzoo.selftest.mask_error`,
:func:`~attnzoo.selftest.layer_decode_error`), so the command and the suite check one thing one way; the tolerances
are its :data:`~attnzoo.selftest.TOLERANCES`.

Backends run on CPU tensors, Triton kernels too: ``tests/conftest.py`` turns Triton's interpreter on where there is
no GPU (``TRITON_INTERPRET=1``); with a GPU and the interpreter off they run on CUDA tensors.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from attnzoo import selftest
from attnzoo.layers import attention_info, build_attention, list_attentions
from attnzoo.ops._selftest_inputs import randn
from attnzoo.ops._spec import Backend, CheckCase, Mechanism

INTERPRET = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
#: shapes of a case's full list up to this many elements run besides its quick ones (N = 1, odd N, ...): what
#: the Python references loop over stays small; Triton's interpreter gets the smallest two only
MAX_ELEMENTS = 4096
TRITON_SHAPES = 2
DIM, HEADS = 12, 3


def device_of(b: Backend) -> torch.device:
    """Where ``b`` runs in the tests: Triton kernels on CUDA unless the interpreter is on, the others on CPU."""
    return torch.device("cuda") if b.kind == "triton" and not INTERPRET else torch.device("cpu")


def runs_here(b: Backend) -> bool:
    """Whether the tests run ``b``: backends for CPU tensors (or any device), Triton ones under the interpreter or
    on a GPU. An unavailable backend that runs here fails its tests (the kernels build, triton is installed)."""
    if b.kind == "triton":
        return INTERPRET or torch.cuda.is_available()
    return "any" in b.devices or "cpu" in b.devices


def backends(mech: Mechanism, *, masks: bool = False) -> list[str]:
    """The backends of ``mech`` but its reference that run here (``masks``: those that take masks)."""
    return [n for n, b in mech.backends.items() if n != mech.reference and runs_here(b) and (b.masks or not masks)]


def op_cases() -> list:
    """``(case, backend)`` for every selftest case of every registered mechanism and every backend it runs here."""
    return [
        pytest.param(case, name, id=f"{case.name.replace(' ', '')}-{name}")
        for case in selftest.specs()
        for name in backends(case.mechanism)
    ]


def shapes(case: CheckCase, backend: str) -> list[tuple[int, ...]]:
    """The case's quick shapes and its small full ones (the interpreter: the smallest few)."""
    small = [s for s in case.shapes(False) if math.prod(s) <= MAX_ELEMENTS]
    out = list(dict.fromkeys(small + case.shapes(True)))
    if case.mechanism.backends[backend].kind == "triton":
        out = sorted(out, key=math.prod)[:TRITON_SHAPES]
    return out


def configs(case: CheckCase, shape: tuple[int, ...], *, causal: bool | None = None) -> list[dict]:
    """The case's full configs that take ``shape`` (``max_n``) and, when given, have that ``causal``."""
    return [
        c
        for c in case.configs(False)
        if (len(shape) != 4 or shape[2] <= c.get("max_n", shape[2]))
        and (causal is None or bool(c.get("causal")) == causal)
    ]


def tolerance(check: str, dtype: torch.dtype) -> float:
    return selftest.TOLERANCES[(check, dtype)]


def backend_errors(case: CheckCase, backend: str, dtype: torch.dtype) -> list[tuple[str, float, str]]:
    """``(check, error, where)`` of every forward and backward comparison of ``backend`` with the reference."""
    device = device_of(case.mechanism.backends[backend])
    out = []
    for shape in shapes(case, backend):
        for cfg in configs(case, shape):
            fwd, bwd = selftest.forward_backward_errors(case, cfg, shape, dtype, device, backend)
            out += [("forward", fwd, f"{cfg} {shape}"), ("backward", bwd, f"{cfg} {shape}")]
    return out


def leak_errors(case: CheckCase, backend: str, dtype: torch.dtype) -> list[tuple[str, float, str]]:
    """``("causal leak", error, where)`` of every causal config and shape of at least two tokens."""
    device = device_of(case.mechanism.backends[backend])
    return [
        ("causal leak", selftest.leak_error(case, cfg, shape, dtype, device, backend), f"{cfg} {shape}")
        for shape in shapes(case, backend)
        for cfg in configs(case, shape, causal=True)
        if len(shape) == 4 and shape[2] >= 2
    ]


def decode_errors(case: CheckCase, backend: str, dtype: torch.dtype) -> list[tuple[str, float, str]]:
    """``("decode", error, where)``: the case's step function against ``backend``'s causal forward."""
    device = device_of(case.mechanism.backends[backend])
    return [
        ("decode", selftest.decode_error(case, cfg, shape, dtype, device, backend), f"{cfg} {shape}")
        for shape in shapes(case, backend)
        for cfg in configs(case, shape, causal=True)
    ]


def failures(errors: list[tuple[str, float, str]], dtype: torch.dtype) -> list[str]:
    """The comparisons above their tolerance (a NaN error is one)."""
    return [
        f"{check} {where}: {err:.3g} > {tolerance(check, dtype):.0e}"
        for check, err, where in errors
        if not err <= tolerance(check, dtype)
    ]


# ------------------------------------------------------------------------------------------------ layers


def option_sets(causal: bool | None = None) -> list:
    """``(name, options)``: every registered layer with its defaults and its spec's ``examples`` (those with a
    causal form when ``causal``)."""
    out = []
    for name in list_attentions(causal=causal):
        spec = attention_info(name).mechanism
        for i, opts in enumerate(({},) + tuple(spec.examples)):
            if causal and spec.options.build(name, **opts).causal_error() is not None:
                continue  # no causal form with these options
            out.append(pytest.param(name, opts, id=f"{name}-{i}"))
    return out


def modes(name: str, opts: dict | None = None) -> list[bool]:
    """The forms (``causal``) the layer ``name`` has with ``opts`` (an option set may lack the causal one)."""
    spec = attention_info(name).mechanism
    causal = spec.causal and spec.options.build(name, **(opts or {})).causal_error() is None
    return [c for c, ok in ((False, spec.noncausal), (True, causal)) if ok]


def build(name: str, opts: dict, *, causal: bool, dtype=torch.float64, seed: int = 0):
    """The layer in eval mode with its parameters moved away from the init (zero biases and unit temperatures can
    hide a wrong term)."""
    torch.manual_seed(seed)
    m = build_attention(name, DIM, HEADS, causal=causal, **opts).to(dtype).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(randn(p.shape, gen, 0.2).to(dtype))
    return m


def tokens(n: int, dtype=torch.float64, seed: int = 1, batch: int = 2) -> torch.Tensor:
    """``(batch, n, DIM)`` standard normal inputs."""
    return torch.randn(batch, n, DIM, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def layer_outputs_and_grads(m, backend: str, n: int = 9) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The layer's output on :func:`tokens` and the gradients of its squared sum for the input and every parameter
    (in ``named_parameters`` order), with ``"auto"`` forced to ``backend``."""
    from attnzoo.ops._dispatch import force_backend

    device = device_of(m.mechanism.backends[backend])
    m = m.to(device)
    x = tokens(n).to(device).requires_grad_()
    with force_backend(backend):
        y = m(x)
        grads = torch.autograd.grad(y.square().sum(), [x, *m.parameters()])
    return y.cpu(), tuple(g.cpu() for g in grads)


def assert_layer_matches_reference(m, backend: str) -> None:
    """Output and gradients under ``backend`` equal those under the reference; each gradient is finite and non-zero
    (a term that is dropped shows as a zero gradient)."""
    labels = ["x", *dict(m.named_parameters())]
    y, grads = layer_outputs_and_grads(m, backend)
    y_ref, grads_ref = layer_outputs_and_grads(m, m.mechanism.reference)
    torch.testing.assert_close(y, y_ref, rtol=1e-9, atol=1e-10)
    for label, g, r in zip(labels, grads, grads_ref, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-8, atol=1e-10, msg=lambda s, label=label: f"{label}: {s}")
        assert torch.isfinite(g).all() and g.abs().sum() > 0, f"{label}: zero or non-finite gradient"


# ------------------------------------------------------------------------------------------------ long masks

#: a padded batch and a packed row of sequences past 256 tokens: the PyTorch paths' scan chunks and the CPU kernels'
#: blocks change size past 256 tokens, so masking there runs code of its own (one head group of DIM = 12: small)
LONG_MASK_LENGTHS = [300, 77]


def long_mask_backends() -> list:
    """``(name, backend)``: each layer that takes masks, with its defaults, under its op's reference and each backend
    that takes masks, except Triton under the interpreter (it runs every program in Python; on a GPU it is here)."""
    out = []
    for name in list_attentions():
        info = attention_info(name)
        if not getattr(info, "supports_masks", False):
            continue
        mech = info.mechanism
        for b in [mech.reference] + backends(mech, masks=True):
            if mech.backends[b].kind != "triton" or not INTERPRET:
                out.append(pytest.param(name, b, id=f"{name}-{b}"))
    return out


def long_mask_error(m, backend: str, mode: str, gen: torch.Generator) -> float:
    """:func:`attnzoo.selftest.mask_error` of layer ``m`` under ``backend`` on sequences of
    :data:`LONG_MASK_LENGTHS` tokens."""
    from attnzoo.ops._dispatch import force_backend

    device = device_of(m.mechanism.backends[backend])
    xs = [tokens(n, seed=3 + n, batch=1).to(device) for n in LONG_MASK_LENGTHS]
    with force_backend(backend):
        return selftest.mask_error(m.to(device), xs, mode, gen)
