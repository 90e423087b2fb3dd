"""Peak-memory measurement: CUDA allocator statistics, or on CPU the peak of live PyTorch allocations.

CPU method (stated in every report): the call runs under ``torch.profiler`` with ``profile_memory=True``;
every allocation and free of PyTorch's CPU allocator is an event with a signed size, and the figure is the
largest running sum over the call, i.e. the most tensor memory the call held at once. It is exact and
deterministic, unlike resident-set measures, which glibc's reuse of freed pages pushes up or down by whole
tensors; it does not see memory that libraries allocate outside PyTorch (BLAS or OpenMP workspaces).

Timings run under :func:`timing_allocator`, glibc's steady state in a long-running process (its dynamic
mmap threshold grown to the 32 MiB cap, trim threshold twice that): otherwise large temporaries alternate
between fresh ``mmap``s that page-fault on first touch and reused heap blocks, which moves the time of the
linear-time operators by up to 3x at N=16k on CPU, depending only on what ran before.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import os
import sys
from typing import Callable, Iterator

import torch

CPU_METHOD = "peak of live PyTorch CPU allocations during the call (torch.profiler allocation events)"
CUDA_METHOD = "torch.cuda.max_memory_allocated growth"

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_TIMING = (32 * 2**20, 64 * 2**20)  # glibc's dynamic thresholds at their cap (DEFAULT_MMAP_THRESHOLD_MAX)
_libc = None


def _glibc():
    global _libc
    if _libc is None:
        _libc = False
        if sys.platform.startswith("linux"):
            try:
                lib = ctypes.CDLL("libc.so.6")
                lib.mallopt  # noqa: B018 - must exist (glibc, not musl)
                _libc = lib
            except (OSError, AttributeError):
                pass
    return _libc


def timing_allocator() -> None:
    """Put glibc in its long-running steady state (see the module docstring); call before timing."""
    lib = _glibc()
    if lib:
        lib.mallopt(_M_MMAP_THRESHOLD, _TIMING[0])
        lib.mallopt(_M_TRIM_THRESHOLD, _TIMING[1])


def _cpu_allocation_events(prof) -> list[tuple[int, int]]:
    """``(time_ns, signed bytes)`` of every PyTorch CPU allocation (+) and free (-) the profiler recorded."""
    results = getattr(prof.profiler, "kineto_results", None)
    if results is None:
        raise RuntimeError("this torch.profiler build exposes no allocation events; CPU peak memory is unavailable")
    cpu = torch.autograd.DeviceType.CPU
    return sorted(
        (e.start_ns(), e.nbytes()) for e in results.events() if e.name() == "[memory]" and e.device_type() == cpu
    )


@contextlib.contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null: some torch builds print a line from C++ at every profiler
    start and stop (``USDT: ... profiler_start``), which would flood the progress output."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no usable fd 2: nothing to silence
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _tracked_cpu_peak(fn: Callable[[], object]) -> int:
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _native_stderr_silenced():  # only around start and stop: fn's own errors and warnings stay visible
        prof.start()
    try:
        fn()  # its result is freed in here: only the peak matters
    finally:
        with _native_stderr_silenced():
            prof.stop()
    live = peak = 0
    for _, nbytes in _cpu_allocation_events(prof):
        live += nbytes
        peak = max(peak, live)
    return peak


@functools.cache
def cpu_peak_supported() -> bool:
    """Whether this torch's profiler reports CPU allocations (checked once on a 1 MiB tensor)."""
    try:
        return _tracked_cpu_peak(lambda: torch.empty(2**18).fill_(1.0)) >= 2**20
    except Exception:  # noqa: BLE001 - any profiler failure means the measure is unavailable
        return False


def peak_memory_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Run ``fn`` and return the most memory it held at once beyond what was allocated before, in bytes.

    Tensors ``fn`` returns count (they are alive at its end). CUDA: ``max_memory_allocated`` growth. CPU:
    the tracked-allocation peak of the module docstring, the same on every call of a deterministic ``fn``
    (warm it up first if it caches something lazily).
    """
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()  # what it returns is counted by the peak whether or not it is kept
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
        return max(0, peak - before)
    return _tracked_cpu_peak(fn)
