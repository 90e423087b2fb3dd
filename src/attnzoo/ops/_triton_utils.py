"""Small helpers shared by the Triton kernels (``ops/tssa/triton.py``, ``ops/fastmax/triton.py``) and by the
ops' ``"auto"`` dispatch.

The kernel helpers import ``triton`` when called; the dispatch helpers (:func:`auto_uses_triton`,
:func:`run_auto_triton`) do not need it, so the ops can import this module whether or not Triton is
installed. Under ``TRITON_INTERPRET=1`` (CPU CI) every ``@triton.jit`` kernel runs in Triton's NumPy
interpreter; that flag is read when a kernel is *decorated*, so it must be set before the kernel modules are
first imported (the tests do so at the top of the test module).

Fallback of ``"auto"``: a Triton kernel that fails to compile or launch on a user's GPU (an unsupported
architecture, a Triton/driver mismatch, too little shared memory for a tile) must not take the op down when
the user did not ask for Triton by name. :func:`run_auto_triton` runs the kernel, and on failure warns once
per op (naming the op and the error), remembers the op as failed for the rest of the process and returns
the PyTorch path's result; :func:`auto_uses_triton` then keeps ``"auto"`` off Triton for that op.
``backend="triton"`` named explicitly never falls back: the error reaches the caller.
"""
from __future__ import annotations

import os
import threading
import warnings
from typing import Callable, TypeVar

import torch

__all__ = [
    "interpreting", "pow2", "acc_dtype", "check_launchable", "TritonFallbackWarning", "auto_uses_triton",
    "run_auto_triton", "triton_failures",
]

T = TypeVar("T")


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def pow2(n: int, minimum: int = 16) -> int:
    """Next power of two ``>= max(n, minimum)``; 16 is the smallest ``tl.dot`` operand dim on GPUs."""
    import triton

    return max(minimum, triton.next_power_of_2(max(int(n), 1)))


def acc_dtype(dtype: torch.dtype):
    """Accumulator type of the kernels: float64 for float64 inputs, float32 otherwise (fp16/bf16 too)."""
    import triton.language as tl

    return tl.float64 if dtype == torch.float64 else tl.float32


def check_launchable(op: str, *tensors: torch.Tensor) -> None:
    """Raise ``ValueError`` unless the tensors can be handed to a Triton kernel (CUDA, or CPU while interpreting)."""
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"{op}: all tensors must be on one device, got {sorted(str(d) for d in devices)}")
    dev = next(iter(devices))
    if dev.type != "cuda" and not interpreting():
        raise ValueError(
            f"{op} with backend='triton' needs CUDA tensors (got device {dev}); on CPU use backend='torch', "
            f"or set TRITON_INTERPRET=1 before importing triton to run the kernels in Triton's interpreter"
        )
    for t in tensors:
        if t.dtype == torch.bfloat16 and interpreting():
            raise TypeError(f"{op}: Triton's CPU interpreter does not support bfloat16; use float16/float32 or CUDA")


class TritonFallbackWarning(RuntimeWarning):
    """A Triton kernel failed under ``backend="auto"``; the op uses its PyTorch path from now on."""


# op name -> "ErrorType: message" of the failure that switched it to PyTorch (process-wide, never cleared
# by the library: a kernel that failed to compile once fails the same way on the next call)
_FAILED: dict[str, str] = {}
_FAILED_LOCK = threading.Lock()


def auto_uses_triton(op: str, x: torch.Tensor) -> bool:
    """Whether ``"auto"`` should try ``op``'s Triton kernel for ``x``: CUDA tensors, unless it failed before.

    The device test lives here (not in each op) so that one place decides, and so tests on CPU machines can
    simulate a GPU by patching ``_triton_device``.
    """
    return _triton_device(x) and op not in _FAILED


def _triton_device(x: torch.Tensor) -> bool:
    return x.is_cuda


def triton_failures() -> dict[str, str]:
    """The ops whose Triton kernel failed under ``"auto"`` in this process, with the error (a copy)."""
    with _FAILED_LOCK:
        return dict(_FAILED)


def run_auto_triton(op: str, triton_call: Callable[[], T], torch_call: Callable[[], T]) -> T:
    """``triton_call()``, or, if it raises, one :class:`TritonFallbackWarning` and ``torch_call()``.

    For the ``"auto"`` backend only. Both callables compute the same op on the same (already validated)
    inputs. Out-of-memory errors are re-raised, not treated as a kernel failure: the PyTorch path would need
    the memory too, and a transient shortage must not disable the kernel for the whole process. Failures
    CUDA reports asynchronously (after the launch returned) surface at a later synchronisation and are not
    caught here; neither are failures of backward kernels, which run during ``.backward()``.
    """
    if op in _FAILED:
        return torch_call()
    try:
        return triton_call()
    except torch.OutOfMemoryError:
        raise
    except Exception as err:  # noqa: BLE001 - compile errors come as many types (CompilationError, OutOfResources, ...)
        reason = f"{type(err).__name__}: {err}".strip()
        first_line = reason.splitlines()[0][:500] if reason else type(err).__name__
        with _FAILED_LOCK:
            first = op not in _FAILED
            _FAILED.setdefault(op, first_line)
        if first:
            msg = (
                f"attnzoo: the Triton kernel of {op} failed ({first_line}); backend='auto' uses the PyTorch "
                f"path for {op} for the rest of this process. Run `attnzoo selftest --device cuda` to check "
                f"this GPU, or pass backend='triton' to see the full error"
            )
            warnings.warn(msg, TritonFallbackWarning, stacklevel=3)
        return torch_call()
