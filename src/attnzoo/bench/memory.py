"""Peak-memory measurement: CUDA allocator statistics, or on CPU the peak resident-set growth.

CPU method (stated in every report): before the measured call the kernel's peak-RSS counter (VmHWM) is
reset through ``/proc/self/clear_refs``; the figure is ``VmHWM - VmRSS_before``, i.e. the new memory
the call touched at its peak. For this to see tensors that an earlier call freed, glibc must serve large
blocks from fresh ``mmap``s rather than from heap pages it kept resident, so :func:`peak_memory_bytes`
lowers glibc's mmap threshold to 64 KiB for the measured call only.

Timings run under :func:`timing_allocator`, glibc's steady state in a long-running process (its dynamic
mmap threshold grown to the 32 MiB cap, trim threshold twice that): the 64 KiB setting would make every
temporary tensor a fresh ``mmap`` that page-faults on first touch, which costs the linear-time operators
up to 3x at N=16k on CPU and is not what a user's training run sees.
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import sys
from typing import Callable, Iterator

import torch

CPU_METHOD = ("peak RSS growth (VmHWM after reset via /proc/self/clear_refs; glibc mmap threshold 64 KiB while "
              "measured; least of 2 calls)")
CUDA_METHOD = "torch.cuda.max_memory_allocated growth"

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MEASURE = (64 * 1024, 128 * 1024)  # (mmap, trim) thresholds while memory is measured
_TIMING = (32 * 2**20, 64 * 2**20)  # glibc's dynamic thresholds at their cap (DEFAULT_MMAP_THRESHOLD_MAX)
_libc = None


def _glibc():
    global _libc
    if _libc is None:
        _libc = False
        if sys.platform.startswith("linux"):
            try:
                lib = ctypes.CDLL("libc.so.6")
                lib.mallopt, lib.malloc_trim  # noqa: B018 - both must exist (glibc, not musl)
                _libc = lib
            except (OSError, AttributeError):
                pass
    return _libc


def _set_thresholds(mmap: int, trim: int) -> None:
    lib = _glibc()
    if lib:
        lib.mallopt(_M_MMAP_THRESHOLD, mmap)
        lib.mallopt(_M_TRIM_THRESHOLD, trim)


def timing_allocator() -> None:
    """Put glibc in its long-running steady state (see the module docstring); call before timing."""
    _set_thresholds(*_TIMING)


def release_free_memory() -> None:
    """Return freed heap pages to the OS (glibc ``malloc_trim``)."""
    lib = _glibc()
    if lib:
        lib.malloc_trim(0)


@contextlib.contextmanager
def measuring_allocator() -> Iterator[None]:
    """Serve every block >= 64 KiB from a fresh mmap inside the block, so peak RSS sees it; then restore."""
    _set_thresholds(*_MEASURE)
    release_free_memory()
    try:
        yield
    finally:
        _set_thresholds(*_TIMING)


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


def peak_memory_bytes(fn: Callable[[], object], device: torch.device, *, calls: int = 1) -> int:
    """Run ``fn`` and return the extra memory it held at its peak, in bytes.

    CPU: with ``calls > 1`` the least of that many measured calls. The first call after the allocator
    switch can read up to one output-sized block high (measured: 122 then 98, 98, 98 MiB), and the
    peak of a deterministic call can only be over-, never under-stated by allocator state.
    """
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
    best = None
    with measuring_allocator():
        for _ in range(max(1, calls)):
            # pages the previous call freed can stay resident in glibc's heap (not every large block is a
            # fresh mmap): hand them back, or this call reuses them unseen and reads low (0 MiB measured)
            gc.collect()
            release_free_memory()
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            before = _read_status_kib("VmRSS")
            out = fn()
            peak = _read_status_kib("VmHWM")
            del out
            grew = max(0, peak - before) * 1024
            best = grew if best is None else min(best, grew)
    return best
