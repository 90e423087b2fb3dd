"""Peak-memory measurement: CUDA allocator statistics, or on CPU the peak resident-set growth.

CPU method (stated in every report): before the measured call the kernel's peak-RSS counter (VmHWM) is
reset through ``/proc/self/clear_refs``; the figure is ``VmHWM - VmRSS_before``, i.e. the new memory
the call touched at its peak. For this to see tensors that an earlier call freed, glibc must return
large blocks to the OS: :func:`ensure_malloc_env` re-executes the process with a fixed mmap threshold
(``MALLOC_MMAP_THRESHOLD_``) so that freed tensors are unmapped instead of kept in the heap.
"""
from __future__ import annotations

import gc
import os
import sys
from typing import Callable

import torch

CPU_METHOD = "peak RSS growth (VmHWM after reset via /proc/self/clear_refs; glibc mmap threshold 64 KiB)"
CUDA_METHOD = "torch.cuda.max_memory_allocated growth"
_THRESHOLD = "65536"


def ensure_malloc_env(argv: list[str]) -> None:
    """Re-exec the current Python process with a fixed glibc mmap threshold (CPU memory figures)."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") == _THRESHOLD or not sys.platform.startswith("linux"):
        return
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=_THRESHOLD)
    os.execve(sys.executable, [sys.executable, "-m", "attnzoo.bench", *argv], env)


def _read_status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not found in /proc/self/status")


def cpu_peak_supported() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        _read_status_kib("VmHWM")
        return True
    except OSError:
        return False


def peak_memory_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Run ``fn`` once and return the extra memory it held at its peak, in bytes."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        out = fn()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
        del out
        return max(0, peak - before)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _read_status_kib("VmRSS")
    out = fn()
    peak = _read_status_kib("VmHWM")
    del out
    return max(0, peak - before) * 1024
