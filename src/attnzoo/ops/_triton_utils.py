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
the PyTorch path's result; :func:`auto_uses_triton` then keeps ``"auto"`` off Triton for that op. The
backward kernels, compiled at the first ``.backward()``, are guarded the same way until one has run.
``backend="triton"`` named explicitly never falls back: the error reaches the caller.
"""

from __future__ import annotations

import os
import threading
import warnings
from typing import Callable, Sequence

import torch

from attnzoo._checks import NonFiniteError
from attnzoo.ops._dtypes import acc_dtype

__all__ = [
    "interpreting",
    "pow2",
    "tl_acc_dtype",
    "check_launchable",
    "TritonFallbackWarning",
    "auto_uses_triton",
    "run_auto_triton",
    "triton_failures",
]


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def pow2(n: int, minimum: int = 16) -> int:
    """Next power of two ``>= max(n, minimum)``; 16 is the smallest ``tl.dot`` operand dim on GPUs."""
    import triton

    return max(minimum, triton.next_power_of_2(max(int(n), 1)))


def tl_acc_dtype(dtype: torch.dtype):
    """Accumulator type of the kernels: :func:`attnzoo.ops._dtypes.acc_dtype` as a Triton type."""
    import triton.language as tl

    return tl.float64 if acc_dtype(dtype) == torch.float64 else tl.float32


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


def _record_failure(op: str, err: BaseException) -> None:
    """Disable ``op``'s kernel for the process; the first failure warns (naming the op and the error)."""
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
        warnings.warn(msg, TritonFallbackWarning, stacklevel=4)


# (op, key) whose backward kernels have run once under "auto": later calls are not guarded any more
_BACKWARD_OK: set[tuple] = set()


class _Plan:
    """What the guard needs besides the inputs: the op, its kernel key and the two paths."""

    def __init__(self, op: str, key: tuple, triton_call: Callable, torch_call: Callable) -> None:
        self.op, self.key, self.triton_call, self.torch_call = op, key, triton_call, torch_call


def _private_leaves(inputs: tuple) -> list:
    # detached leaves: the guard differentiates the op with respect to its direct inputs only (an input that
    # is computed from another input, say k_hat from v, is chained by the outer graph, not counted twice)
    return [t.detach().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t for t in inputs]


class _GuardedBackward(torch.autograd.Function):
    """Runs the kernel; its backward runs the kernel's backward, or, if that fails to compile or launch,
    differentiates the PyTorch path (recomputed from the same inputs) and disables the kernel."""

    @staticmethod
    def forward(ctx, plan: _Plan, *inputs):
        leaves = _private_leaves(inputs)
        with torch.enable_grad():
            out = plan.triton_call(*leaves)
        ctx.plan, ctx.leaves, ctx.out = plan, leaves, out
        return out.detach()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        plan, leaves = ctx.plan, ctx.leaves
        wanted = [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]
        with torch.enable_grad():
            try:
                # retain_graph: a caller's backward(retain_graph=True) may come through this node again
                grads = torch.autograd.grad(ctx.out, wanted, grad, retain_graph=True, allow_unused=True)
                _BACKWARD_OK.add((plan.op, plan.key))
            except torch.OutOfMemoryError:
                raise
            except Exception as err:  # noqa: BLE001 - see run_auto_triton
                _record_failure(plan.op, err)
                grads = torch.autograd.grad(plan.torch_call(*leaves), wanted, grad, allow_unused=True)
        it = iter(grads)
        return (None, *(next(it) if isinstance(t, torch.Tensor) and t.requires_grad else None for t in leaves))


def run_auto_triton(
    op: str,
    triton_call: Callable[..., torch.Tensor],
    torch_call: Callable[..., torch.Tensor],
    inputs: Sequence[torch.Tensor | None],
    *,
    key: tuple = (),
) -> torch.Tensor:
    """``triton_call(*inputs)``, or, if it raises, one :class:`TritonFallbackWarning` and ``torch_call(*inputs)``.

    For the ``"auto"`` backend only. Both callables compute the same op from the same (already validated)
    ``inputs`` (tensors, or ``None`` for an absent optional one). The backward kernels compile on the first
    ``.backward()``: until one backward of ``(op, key)`` (``key``: what selects different kernels, e.g. causal
    and dtype) has succeeded, the kernel runs behind a guard whose backward falls back the same way, to the
    gradients of the PyTorch path recomputed from ``inputs``. Out-of-memory errors are re-raised, not treated
    as a kernel failure: the PyTorch path would need the memory too, and a transient shortage must not disable
    the kernel for the whole process. Failures CUDA reports asynchronously (after the launch returned)
    surface at a later synchronisation and are not caught.
    """
    inputs = tuple(inputs)
    if op in _FAILED:
        return torch_call(*inputs)
    guard = (
        (op, key) not in _BACKWARD_OK
        and torch.is_grad_enabled()
        and not torch.compiler.is_compiling()
        and any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs)
    )
    try:
        if guard:
            return _GuardedBackward.apply(_Plan(op, key, triton_call, torch_call), *inputs)
        return triton_call(*inputs)
    except (torch.OutOfMemoryError, NonFiniteError):
        # a backend checks the values of its inputs itself: NaN/Inf there is the caller's error, not the kernel's
        raise
    except Exception as err:  # noqa: BLE001 - compile errors come as many types (CompilationError, OutOfResources, ...)
        _record_failure(op, err)
        return torch_call(*inputs)
