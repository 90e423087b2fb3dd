"""The one backend dispatcher of attnzoo's ops: the same rules and messages for every mechanism.

``backend="auto"`` picks, in order: the op's Triton kernel for CUDA tensors (unless it failed before in this process,
see :mod:`attnzoo.ops._triton_utils`); its fused CPU kernels for CPU tensors when they build and the backend's
:attr:`~attnzoo.ops._spec.Backend.auto_if` takes the call, except while ``torch.compile`` traces (the kernels are
opaque to it); else the op's PyTorch path (:attr:`Mechanism.default`). Inputs carrying forward-mode AD tangents or
wrapped by ``torch.func`` transforms never reach a kernel (their autograd Functions define no ``jvp``): ``"auto"``
takes the PyTorch path, and a kernel named explicitly raises ``ValueError``.
A Triton kernel that fails to compile or launch under ``"auto"`` warns once and the PyTorch path serves from then on;
a backend named explicitly never falls back. Unknown names, backends that cannot run in this process and backends
asked for on a device they do not run on raise ``ValueError`` naming the op, the value and the valid names.

:func:`force_backend` makes ``"auto"`` resolve to a named backend within a block: how the contract tests run every
layer on its op's reference without knowing the layer.

Every op reaches its backends through :func:`call_backend`: ``backend(*inputs, **options)`` with the op's own
(checked) arguments, so each backend does its own preparation and no op looks at backend names.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
import torch.autograd.forward_ad as fwAD

from attnzoo.ops import _cpu_kernels, _triton_utils
from attnzoo.ops._spec import Backend, Mechanism

__all__ = [
    "call_backend",
    "check_backend",
    "resolve_backend",
    "runs_reference",
    "force_backend",
    "traced_by_forward_ad",
]

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


def traced_by_forward_ad(inputs: Sequence) -> bool:
    """Whether a tensor of ``inputs`` carries a forward-mode AD tangent or is wrapped by a ``torch.func`` transform:
    the kernels' autograd Functions define neither a ``jvp`` nor a ``setup_context``, so they would drop the tangent
    (forward AD) or fail (``torch.func``); the PyTorch paths differentiate either way."""
    if torch.compiler.is_compiling():
        return False  # compiled graphs take no kernel anyway, and dynamo cannot trace the functorch query
    for t in inputs:
        if isinstance(t, torch.Tensor) and (
            torch._C._functorch.is_functorch_wrapped_tensor(t) or fwAD.unpack_dual(t).tangent is not None
        ):
            return True
    return False


def _cpu_kernels_ready() -> bool:
    # looked up through the module: tests hide the kernels by replacing ``_cpu_kernels.cpu_kernels``
    return _cpu_kernels.cpu_kernels() is not None


def _auto(mech: Mechanism, inputs: Sequence, options: Mapping[str, Any] | None) -> str:
    x = inputs[0]
    masked = mech.masked(options)
    forced = getattr(_FORCED, "name", None)
    if forced is not None and forced in mech.backends and mech.backends[forced].is_available():
        if not masked or mech.backends[forced].masks:
            return forced
    for name, b in mech.backends.items():
        if masked and not (b.masks and b.auto_masks):
            continue
        if (
            b.kind == "triton"
            and _triton_utils.auto_uses_triton(mech.op, x)
            and b.is_available()
            and _auto_takes(b, inputs, options)
            and not traced_by_forward_ad(inputs)
        ):
            return name
    if x.device.type == "cpu" and not torch.compiler.is_compiling():
        for name, b in mech.backends.items():
            if (
                b.kind == "cpu"
                and (not masked or (b.masks and b.auto_masks))
                and _cpu_kernels_ready()
                and _auto_takes(b, inputs, options)
                and not traced_by_forward_ad(inputs)
            ):
                return name
    # a PyTorch form that is faster than the default on some calls (an explicit N x N form for short sequences)
    for name, b in mech.backends.items():
        if (
            b.kind == "torch"
            and b.auto_if is not None
            and (not masked or (b.masks and b.auto_masks))
            and _auto_takes(b, inputs, options)
        ):
            return name
    return mech.default


def _auto_takes(b: Backend, inputs: Sequence, options: Mapping[str, Any] | None) -> bool:
    # without the call's options (resolve_backend asked about a tensor alone) the backend's own rule cannot run
    return b.auto_if is None or (options is not None and b.auto_if(inputs, options))


def check_backend(mech: Mechanism, backend: Any, *, name: str = "backend") -> str:
    """``backend`` if it names one of ``mech``'s backends (or ``"auto"``); else ``ValueError`` listing the valid
    names. The one check of a backend name: the ops call it through :func:`call_backend`, options fields directly."""
    b = mech.backends.get(backend) if isinstance(backend, str) else None
    if b is None and backend != "auto":
        raise ValueError(f"{name}={backend!r} is not supported by {mech.op}; valid backends: {mech.backend_names()}")
    return backend


def resolve_backend(
    mech: Mechanism,
    backend: Any,
    x: torch.Tensor,
    *,
    name: str = "x",
    inputs: Sequence | None = None,
    options: Mapping[str, Any] | None = None,
) -> str:
    """The backend ``mech``'s op runs for ``backend`` on ``x`` (named ``name`` in messages).

    ``inputs`` and ``options`` (the call's) let ``"auto"`` ask a backend's :attr:`Backend.auto_if`."""
    b = mech.backends.get(backend) if isinstance(backend, str) else None
    if b is None:  # "auto", or a value check_backend refuses
        check_backend(mech, backend)
        return _auto(mech, (x,) if inputs is None else inputs, options)
    if not b.masks and mech.masked(options):
        raise ValueError(
            f"backend={backend!r} of {mech.op} does not take attention_mask / cu_seqlens yet; the backends that do: "
            f"{mech.mask_backends()} (backend='auto' picks one of them)"
        )
    if not b.is_available():
        need = b.needs or b.module
        need = "the triton package and " + need if b.kind == "triton" else need
        raise ValueError(
            f"backend={backend!r} is not available for {mech.op} (needs {need}); valid backends: {mech.backend_names()}"
        )
    if b.kind in ("cpu", "triton") and traced_by_forward_ad((x,) if inputs is None else inputs):
        raise ValueError(
            f"backend={backend!r} of {mech.op} does not propagate forward-mode AD tangents or run under torch.func "
            f"transforms (its kernels define no jvp); use backend='torch' (or 'auto', which takes it then)"
        )
    # Triton kernels check their own device (CUDA, or CPU under TRITON_INTERPRET=1) with a message saying how
    if b.kind == "cpu" and x.device.type != "cpu":
        raise ValueError(f"backend={backend!r} runs on CPU tensors, but {name} is on {x.device}; use backend='auto'")
    return backend


def runs_reference(mech: Mechanism, backend: Any, x: torch.Tensor, *, name: str = "x") -> bool:
    """Whether ``backend`` resolves to ``mech``'s reference: for the analysis helpers (``tssa_pi``,
    ``csp_permutations``) that have a literal form and one fast form instead of a backend each."""
    return resolve_backend(mech, backend, x, name=name) == mech.reference


def _kernel_key(tensors: Sequence, options: Mapping[str, Any]) -> tuple:
    # what selects different kernels: dtypes, which optional inputs are present, and the flag/mode options
    return (
        tuple(t.dtype if isinstance(t, torch.Tensor) else None for t in tensors),
        tuple(sorted((k, v) for k, v in options.items() if isinstance(v, (bool, str, int)))),
    )


def call_backend(mech: Mechanism, backend: Any, inputs: tuple, *, name: str = "x", **options: Any) -> Any:
    """The one way into an op's backends: ``fn(*inputs, **options)`` for the backend ``backend`` resolves to.

    ``inputs`` are the op's tensor arguments as the caller gave them (``None`` for an absent optional one; the
    first decides the device), ``options`` its checked keyword options; every backend of ``mech`` takes the same
    and does its own preparation. A Triton backend chosen by ``"auto"`` runs behind the fallback guard, with the
    PyTorch path (:attr:`Mechanism.default`, called the same way) as the fallback; the guard differentiates with
    respect to the tensors of ``inputs``.
    """
    resolved = resolve_backend(mech, backend, inputs[0], name=name, inputs=inputs, options=options)
    b = mech.backends[resolved]
    fn = b.load()
    if not (b.kind == "triton" and backend == "auto"):
        return fn(*inputs, **options)
    torch_fn: Callable = mech.backends[mech.default].load()

    def bind(f: Callable) -> Callable:
        return lambda *ts: f(*ts, **options)

    return _triton_utils.run_auto_triton(mech.op, bind(fn), bind(torch_fn), inputs, key=_kernel_key(inputs, options))
