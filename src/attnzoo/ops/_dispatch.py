"""The one backend dispatcher of attnzoo's ops: the same rules and messages for every mechanism.

``backend="auto"`` picks, in order: the op's Triton kernel for CUDA tensors (unless it failed before in this process,
see :mod:`attnzoo.ops._triton_utils`); its fused CPU kernels for CPU tensors when they build, except while
``torch.compile`` traces (the kernels are opaque to it); else the op's PyTorch path (:attr:`Mechanism.default`).
A Triton kernel that fails to compile or launch under ``"auto"`` warns once and the PyTorch path serves from then on;
a backend named explicitly never falls back. Unknown names, backends that cannot run in this process and backends
asked for on a device they do not run on raise ``ValueError`` naming the op, the value and the valid names.

:func:`force_backend` makes ``"auto"`` resolve to a named backend within a block: how the contract tests run every
layer on its op's reference without knowing the layer.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator, Sequence

import torch

from attnzoo.ops import _cpu_kernels, _triton_utils
from attnzoo.ops._spec import Mechanism

__all__ = ["resolve_backend", "run_backend", "force_backend"]

_FORCED = threading.local()


@contextlib.contextmanager
def force_backend(name: str) -> Iterator[None]:
    """Within the block, ``"auto"`` means ``name`` for every op that has it (the others keep their rule)."""
    prev = getattr(_FORCED, "name", None)
    _FORCED.name = name
    try:
        yield
    finally:
        _FORCED.name = prev


def _cpu_kernels_ready() -> bool:
    # looked up through the module: tests hide the kernels by replacing ``_cpu_kernels.cpu_kernels``
    return _cpu_kernels.cpu_kernels() is not None


def _auto(mech: Mechanism, x: torch.Tensor) -> str:
    forced = getattr(_FORCED, "name", None)
    if forced is not None and forced in mech.backends and mech.backends[forced].is_available():
        return forced
    dev = x.device.type
    for name, b in mech.backends.items():
        if b.kind == "triton" and _triton_utils.auto_uses_triton(mech.op, x) and b.is_available():
            return name
    if dev == "cpu" and not torch.compiler.is_compiling():
        for name, b in mech.backends.items():
            if b.kind == "cpu" and _cpu_kernels_ready():
                return name
    return mech.default


def resolve_backend(mech: Mechanism, backend, x: torch.Tensor, *, name: str = "x") -> str:
    """The backend ``mech``'s op runs for ``backend`` on ``x`` (named ``name`` in messages)."""
    if backend == "auto":
        return _auto(mech, x)
    b = mech.backends.get(backend) if isinstance(backend, str) else None
    if b is None:
        raise ValueError(f"backend={backend!r} is not supported by {mech.op}; valid backends: {mech.backend_names()}")
    if not b.is_available():
        need = "the triton package and " + b.module if b.kind == "triton" else b.module
        raise ValueError(
            f"backend={backend!r} is not available for {mech.op} (needs {need}); valid backends: {mech.backend_names()}"
        )
    # Triton kernels check their own device (CUDA, or CPU under TRITON_INTERPRET=1) with a message saying how
    if b.kind == "cpu" and x.device.type != "cpu":
        raise ValueError(f"backend={backend!r} runs on CPU tensors, but {name} is on {x.device}; use backend='auto'")
    return backend


def _kernel_key(tensors: Sequence, options: dict) -> tuple:
    # what selects different kernels: dtypes, which optional inputs are present, and the flag/mode options
    return (
        tuple(t.dtype if isinstance(t, torch.Tensor) else None for t in tensors),
        tuple(sorted((k, v) for k, v in options.items() if isinstance(v, (bool, str, int)))),
    )


def run_backend(
    mech: Mechanism, name: str, tensors: Sequence, *, auto: bool, tensor_options: dict | None = None, **options
) -> torch.Tensor:
    """``backend(*tensors, **tensor_options, **options)``.

    A Triton backend chosen by ``"auto"`` runs behind the fallback guard, with the PyTorch path
    (:attr:`Mechanism.default`, called the same way) as the fallback; the guard differentiates with respect to
    ``tensors`` and the (tensor or ``None``) values of ``tensor_options``.
    """
    b = mech.backends[name]
    fn = b.load()
    tensor_options = tensor_options or {}
    if not (auto and b.kind == "triton"):
        return fn(*tensors, **tensor_options, **options)
    torch_fn: Callable = mech.backends[mech.default].load()
    n, keys = len(tensors), list(tensor_options)

    def bind(f: Callable) -> Callable:
        return lambda *ts: f(*ts[:n], **dict(zip(keys, ts[n:])), **options)

    inputs = (*tensors, *tensor_options.values())
    return _triton_utils.run_auto_triton(mech.op, bind(fn), bind(torch_fn), inputs, key=_kernel_key(inputs, options))
