"""Small helpers shared by the Triton kernels of ``ops/tssa/triton.py`` and ``ops/fastmax/triton.py``.

Importing this module imports ``triton``. Under ``TRITON_INTERPRET=1`` (CPU CI) every ``@triton.jit``
kernel runs in Triton's NumPy interpreter; that flag is read when a kernel is *decorated*, so it must be set
before the kernel modules are first imported (the tests do so at the top of the test module).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

__all__ = ["interpreting", "pow2", "acc_dtype", "check_launchable"]


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def pow2(n: int, minimum: int = 16) -> int:
    """Next power of two ``>= max(n, minimum)``; 16 is the smallest ``tl.dot`` operand dim on GPUs."""
    return max(minimum, triton.next_power_of_2(max(int(n), 1)))


def acc_dtype(dtype: torch.dtype):
    """Accumulator type of the kernels: float64 for float64 inputs, float32 otherwise (fp16/bf16 too)."""
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
