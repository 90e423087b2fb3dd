"""Validation and backend dispatch shared by the softmax-family ops (softmax, linear, xca, mssa)."""
from __future__ import annotations

import importlib
from typing import Callable, Sequence

import torch

from attnzoo._checks import check_dropout, check_ndim, check_scale, finite_absmax
from attnzoo.ops._triton_utils import auto_uses_triton, run_auto_triton

__all__ = ["resolve_backend", "check_tensors", "check_scale", "check_dropout", "valid_backends"]

_LAYOUT = "(B, H, N, P)"
_TRITON_CACHE: dict[str, Callable | None] = {}
# Each op's PyTorch path, called with the same arguments as its ``<op>_triton``: what "auto" falls back to.
_TORCH_PATHS = {
    "softmax_attention": ("attnzoo.ops.softmax.sdpa", "softmax_attention_sdpa"),
    "linear_attention": ("attnzoo.ops.linear.chunk", "linear_attention_chunk"),
    "xca": ("attnzoo.ops.xca.fused", "xca_fused"),
    "mssa": ("attnzoo.ops.mssa.sdpa", "mssa_sdpa"),
}


def _triton_kernel(module: str, fn: str) -> Callable | None:
    # A Triton kernel is optional: it lives in ``<op folder>/triton.py`` exporting ``<op>_triton`` (the public
    # op's arguments and keywords, minus ``backend``). Missing file or missing ``triton`` package -> None.
    key = f"{module}:{fn}"
    if key not in _TRITON_CACHE:
        try:
            _TRITON_CACHE[key] = getattr(importlib.import_module(module), f"{fn}_triton", None)
        except ImportError:
            _TRITON_CACHE[key] = None
    return _TRITON_CACHE[key]


def _auto_fallback(op: str, fn: Callable) -> Callable:
    """``fn`` for ``"auto"``: a kernel that fails to compile/launch warns once, then the PyTorch path serves."""
    module, name = _TORCH_PATHS[op]
    torch_fn = getattr(importlib.import_module(module), name)

    def call(*args, **kwargs):
        slots = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        names = [k for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
        tensors = [args[i] for i in slots] + [kwargs[k] for k in names]

        def with_inputs(f: Callable) -> Callable:
            def run(*ts):
                a, kw = list(args), dict(kwargs)
                for i, t in zip(slots, ts):
                    a[i] = t
                kw.update(zip(names, ts[len(slots):]))
                return f(*a, **kw)

            return run

        # what selects different kernels: dtypes and the flag/mode arguments (causal, feature_map, ...)
        key = (tuple(t.dtype for t in tensors), tuple(sorted((k, v) for k, v in kwargs.items()
                                                             if isinstance(v, (bool, str)))))
        return run_auto_triton(op, with_inputs(fn), with_inputs(torch_fn), tensors, key=key)

    return call


def valid_backends(op: str, package: str) -> list[str]:
    names = ["auto", "naive", "torch"]
    if _triton_kernel(f"{package}.triton", op) is not None:
        names.append("triton")
    return names


def resolve_backend(op: str, package: str, backend, x: torch.Tensor) -> tuple[str, Callable | None]:
    """Map ``backend`` to ``"naive" | "torch" | "triton"`` (+ the Triton callable); ``auto`` = Triton on CUDA only
    (its callable then falls back to the PyTorch path, warning once, if the kernel fails to compile or launch)."""
    if not isinstance(backend, str) or backend not in ("auto", "naive", "torch", "triton"):
        raise ValueError(f"backend={backend!r} is not supported by {op}; valid backends: {valid_backends(op, package)}")
    if backend in ("naive", "torch"):
        return backend, None
    if backend == "auto" and not auto_uses_triton(op, x):
        return "torch", None
    fn = _triton_kernel(f"{package}.triton", op)
    if fn is not None:
        return "triton", (_auto_fallback(op, fn) if backend == "auto" else fn)
    if backend == "triton":
        raise ValueError(
            f"backend='triton' is not available for {op} (no importable Triton kernel); "
            f"valid backends: {valid_backends(op, package)}"
        )
    return "torch", None


def check_tensors(names: Sequence[str], tensors: Sequence[torch.Tensor], op: str = "") -> dict[str, float]:
    """Each tensor is a floating ``(B, H, N, P)`` tensor; all share dtype, device, ``B`` and ``H``; all finite.

    Returns ``{name: max |tensor|}`` (one host sync for all of them; empty while tracing) for overflow bounds.
    """
    for n, t in zip(names, tensors):
        check_ndim(n, t, 4, _LAYOUT)
    ref_name, ref = names[0], tensors[0]
    for n, t in zip(names[1:], tensors[1:]):
        if t.dtype != ref.dtype:
            raise TypeError(f"{ref_name} and {n} must share a dtype, got {ref.dtype} and {t.dtype}")
        if t.device != ref.device:
            raise ValueError(f"{ref_name} and {n} must be on one device, got {ref.device} and {t.device}")
        if t.shape[:2] != ref.shape[:2]:
            raise ValueError(
                f"{ref_name} and {n} must agree on (B, H): got {tuple(ref.shape)} and {tuple(t.shape)}"
            )
    for n, t in zip(names, tensors):
        if t.shape[-2] < 1 or t.shape[-1] < 1:
            raise ValueError(f"{n} must hold at least one token and one channel, got shape {tuple(t.shape)}")
    return finite_absmax(dict(zip(names, tensors)), op=op)
