"""What the benchmark runs: each mechanism as a pure op on per-head tensors, or as its full module.

The cases are declared by the mechanisms themselves (``Mechanism.bench`` in ``ops/<op>/__init__.py``, their code in
``ops/<op>/bench.py``) and read from the attention registry here, so a mechanism registered at runtime is measured
like the built-in ones. Their straightforward PyTorch baselines (``BenchCase(baseline=True)``, e.g.
``ops/<op>/baseline.py``) are declared the same way, with their own module (``BenchCase.builder``). An op case
returns the inputs it needs and the bytes an ideal implementation must move (read every input once, write the output
once); that byte count is the roofline reference.

The case lists (``OP_CASES`` the default sweep, ``EXTRA_OP_CASES`` only on request, ``CAUSAL_OP_CASES``,
``DECODE_CASES`` ...) are computed from the registry each time they are read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from attnzoo.layers import attention_info, build_attention, list_attentions
from attnzoo.ops._spec import BenchCase, Shape

__all__ = [
    "Shape",
    "Prepared",
    "prepare",
    "registered_cases",
    "decode_module",
]  # and the case lists, read through the module's __getattr__


@dataclass
class Prepared:
    inputs: list[torch.Tensor]  # tensors that receive gradients in the fwd+bwd measurement
    run: Callable[[], torch.Tensor]
    bytes_moved: int

    def forward(self) -> Callable[[], torch.Tensor]:
        """The timed forward call: no autograd graph, as in inference."""

        def fwd() -> torch.Tensor:
            with torch.no_grad():
                return self.run()

        return fwd

    def forward_backward(self) -> Callable[[], tuple[torch.Tensor, ...]]:
        """The timed forward and backward call, returning the inputs' gradients (the inputs now require them)."""
        for t in self.inputs:
            t.requires_grad_(True)
        # The upstream gradient is made once, outside the timed calls, as the next layer would hand it over:
        # filling a fresh output-sized tensor per call is the harness's cost, not the op's, and its page
        # faults (glibc returns freed blocks over its trim threshold to the OS) would land on every row.
        with torch.no_grad():
            grad_out = torch.ones_like(self.run())

        def fwdbwd() -> tuple[torch.Tensor, ...]:
            return torch.autograd.grad(self.run(), self.inputs, grad_out)

        return fwdbwd


def registered_cases() -> dict[str, tuple[str, BenchCase]]:
    """Case name -> (registered mechanism, its case), in listing order (``Mechanism.order``, then name)."""
    mechs = [(n, attention_info(n).mechanism) for n in list_attentions()]
    mechs = sorted((m for m in mechs if m[1] is not None), key=lambda m: (m[1].order, m[0]))
    out: dict[str, tuple[str, BenchCase]] = {}
    for name, mech in mechs:
        for case in mech.bench:
            if case.name in out:
                raise ValueError(f"bench case {case.name!r} of {name!r} is already declared by {out[case.name][0]!r}")
            out[case.name] = (name, case)
    return out


def _lists() -> dict[str, list[str]]:
    cases = registered_cases()
    baseline = [n for n, (_, c) in cases.items() if c.baseline]
    op = [n for n, (_, c) in cases.items() if c.default]
    # the baselines last: each beside the attnzoo case it transcribes when named together
    extra = [n for n, (_, c) in cases.items() if not c.default and not c.baseline] + baseline
    return {
        "OP_CASES": op,
        "EXTRA_OP_CASES": extra,
        "ALL_OP_CASES": op + extra,
        # the baselines have the causal forms of the ops they transcribe
        "CAUSAL_OP_CASES": [n for n, (_, c) in cases.items() if c.causal and not c.baseline] + baseline,
        "BASELINE_CASES": baseline,
        "DECODE_CASES": [n for n, (_, c) in cases.items() if c.decode],
        # the cases the table's speed column divides by
        "SPEED_UNIT_CASES": [n for n, (_, c) in cases.items() if c.speed_unit],
    }


def __getattr__(name: str) -> list[str]:
    # computed on each read: a mechanism registered after this module was imported is listed too
    lists = _lists()
    if name in lists:
        return lists[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _randn(shape, device, dtype, n=1):
    return [torch.randn(*shape, device=device, dtype=dtype) for _ in range(n)]


def _nbytes(*ts: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def _case(name: str) -> tuple[str, BenchCase]:
    cases = registered_cases()
    if name not in cases:
        raise ValueError(f"no benchmark case {name!r}; valid: {_lists()['ALL_OP_CASES']}")
    return cases[name]


def _op_case(name: str, s: Shape, causal: bool, device, dtype) -> Prepared:
    _, case = _case(name)
    return Prepared(*case.prepare(s, causal, device, dtype))


def _module(name: str, length: int, dim: int, causal: bool) -> tuple[str, dict]:
    """The registered layer of case ``name`` and its options for ``length`` tokens of width ``dim``."""
    mech, case = _case(name)
    if case.module is None:
        raise ValueError(f"{name!r} is an op-level case only (use --level op)")
    return mech, case.module_options(length, dim, causal)


def _module_case(name: str, s: Shape, causal: bool, device, dtype) -> Prepared:
    _, case = _case(name)
    if case.builder is not None:
        m = case.build_module(s.dim, s.heads, causal=causal, max_len=max(1024, s.length))
    else:
        mech, opts = _module(name, s.length, s.dim, causal)
        m = build_attention(mech, s.dim, s.heads, causal=causal, **opts)
    m = m.to(device=device, dtype=dtype)
    (x,) = _randn((s.batch, s.length, s.dim), device, dtype)
    params = sum(p.numel() * p.element_size() for p in m.parameters())
    return Prepared([x], lambda: m(x), 2 * _nbytes(x) + params)


def prepare(name: str, s: Shape, *, causal: bool, level: str, device, dtype) -> Prepared:
    if level == "op":
        return _op_case(name, s, causal, device, dtype)
    if level == "module":
        return _module_case(name, s, causal, device, dtype)
    raise ValueError(f"level={level!r}; valid: ['op', 'module']")


def decode_module(name: str, dim: int, heads: int, max_context: int, device, dtype) -> torch.nn.Module:
    """The causal layer of decode case ``name``, sized for ``max_context`` tokens, in eval mode."""
    mech, opts = _module(name, max_context + 1, dim, True)
    return build_attention(mech, dim, heads, causal=True, **opts).to(device=device, dtype=dtype).eval()
