"""Benchmark runner: time (median after warm-up; CUDA events on GPU) and peak memory per case."""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch

from attnzoo.bench.cases import Shape, decode_module, prepare
from attnzoo.bench.memory import CPU_METHOD, CUDA_METHOD, peak_memory_bytes


@dataclass
class Row:
    sweep: str
    mechanism: str
    causal: bool
    level: str
    batch: int
    heads: int
    length: int
    dim: int
    # the measurements: None where not measured (a sweep without backward, a failed or skipped shape)
    fwd_ms: float | None = None
    fwdbwd_ms: float | None = None
    fwd_peak_mb: float | None = None
    fwdbwd_peak_mb: float | None = None
    bytes_moved: int | None = None
    roofline_frac: float | None = None
    status: str = "ok"

    @classmethod
    def at(cls, sweep: str, name: str, causal: bool, level: str, shape: Shape, status: str = "ok") -> Row:
        """The row of mechanism ``name`` at ``shape``, nothing measured yet."""
        return cls(sweep, name, causal, level, shape.batch, shape.heads, shape.length, shape.dim, status=status)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# Warm-up on CPU goes on until SETTLE_QUIET calls in a row take (nearly) no fresh pages from the OS, at most
# SETTLE_CALLS extra calls or SETTLE_S seconds: see _settle_heap.
SETTLE_CALLS, SETTLE_S, SETTLE_PAGES, SETTLE_QUIET = 30, 3.0, 64, 3


def _minor_faults() -> int | None:
    try:
        import resource
    except ImportError:  # not Unix: no fault counts, warm-up is the fixed number of calls
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _settle_heap(fn: Callable[[], object]) -> None:
    """Call ``fn`` until ``SETTLE_QUIET`` calls in a row each page-fault fewer than ``SETTLE_PAGES`` pages
    (bounded by ``SETTLE_CALLS`` and ``SETTLE_S``). In a fresh process the first calls of a case page-fault their
    large outputs while glibc's heap finds its layout (12k faults, ~10 ms, per call of CSP with groups of two at
    N=16384, d=384 on a 2-core VM), sometimes with quiet calls in between; timing starts after that transient.
    A case whose heap never settles (see docs/performance.md on glibc's tcache and aligned blocks) is timed
    with its faults after ``SETTLE_CALLS`` calls or ``SETTLE_S`` seconds."""
    if _minor_faults() is None:
        return
    deadline = time.perf_counter() + SETTLE_S
    quiet = 0
    for _ in range(SETTLE_CALLS):
        before = _minor_faults()
        fn()
        quiet = quiet + 1 if _minor_faults() - before < SETTLE_PAGES else 0
        if quiet >= SETTLE_QUIET or time.perf_counter() > deadline:
            return


def time_call(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int = 1) -> float:
    """Median seconds of ``fn`` over ``repeats`` runs after ``warmup`` runs (on CPU, with ``warmup`` > 0, then
    until the heap has settled: :func:`_settle_heap`)."""
    for _ in range(warmup):
        fn()
    if warmup and device.type == "cpu":
        _settle_heap(fn)
    _sync(device)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_bandwidth(device: torch.device, mib: int = 256, repeats: int = 5) -> float:
    """Bytes/s of a large device-to-device copy (read + write), the machine's practical roofline."""
    n = mib * 2**20 // 4
    src = torch.empty(n, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    sec = time_call(lambda: dst.copy_(src), device, repeats)
    return 2 * n * 4 / sec


def machine_info(device: torch.device) -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {
        "cpu": cpu,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        # the widest vector ISA PyTorch dispatches to ("AVX512", "AVX2", ...): machines that print the same CPU
        # name differ in it, and with it in speed and in which fused kernels `auto` picks
        "cpu_isa": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(device),
        "memory_method": CUDA_METHOD if device.type == "cuda" else CPU_METHOD,
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def _one_line(err: BaseException, limit: int = 160) -> str:
    text = " ".join(str(err).split())
    text = f"{type(err).__name__}: {text}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def measure_case(
    sweep: str,
    name: str,
    shape: Shape,
    *,
    causal: bool,
    level: str,
    device: torch.device,
    dtype: torch.dtype,
    repeats: int,
    backward: bool,
    bandwidth: float,
) -> Row:
    """Forward (no grad) and forward+backward time and peak memory of one mechanism at one shape."""
    row = Row.at(sweep, name, causal, level, shape)
    try:
        prep = prepare(name, shape, causal=causal, level=level, device=device, dtype=dtype)
        row.bytes_moved = prep.bytes_moved

        fwd = prep.forward()
        # timed first: its warm-up call keeps one-off allocations (thread pools, workspaces) out of the peak
        sec = time_call(fwd, device, repeats)
        row.fwd_ms = sec * 1e3
        row.fwd_peak_mb = peak_memory_bytes(fwd, device) / 2**20
        row.roofline_frac = (prep.bytes_moved / bandwidth) / sec
        if backward:
            fwdbwd = prep.forward_backward()
            row.fwdbwd_ms = time_call(fwdbwd, device, repeats) * 1e3
            row.fwdbwd_peak_mb = peak_memory_bytes(fwdbwd, device) / 2**20
    except torch.OutOfMemoryError:
        row.status = "oom"
    except (RuntimeError, MemoryError) as err:
        if "out of memory" in str(err).lower() or isinstance(err, MemoryError):
            row.status = "oom"
        else:
            # A library or kernel failure at one shape (a CUDA launch limit, say) becomes this row's status, so a
            # long run keeps its other rows; the larger shapes of the series are skipped and main() exits 1.
            row.status = "error: " + _one_line(err)
    finally:
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def measure_series(
    sweep: str,
    name: str,
    shapes: list[Shape],
    *,
    budget_s: float,
    on_shape: Callable[[], None] | None = None,
    **case: Any,
) -> list[Row]:
    """:func:`measure_case` with its keyword options ``case`` at each shape in order; once a call fails or takes
    longer than ``budget_s`` seconds, the remaining (larger) shapes become rows with status ``"skipped (...)"`` saying
    which. ``on_shape`` runs after each shape (a progress bar)."""
    rows: list[Row] = []
    skip: str | None = None  # why the remaining shapes are not measured
    for s in shapes:
        if skip is not None:
            rows.append(Row.at(sweep, name, case["causal"], case["level"], s, status=skip))
        else:
            r = measure_case(sweep, name, s, **case)
            rows.append(r)
            slowest = max(x for x in (r.fwd_ms, r.fwdbwd_ms, 0.0) if x is not None) / 1e3
            if r.status != "ok":
                skip = f"skipped (N={s.length} gave {r.status.split(':')[0]})"
            elif slowest > budget_s:
                skip = "skipped (time budget)"
        if on_shape is not None:
            on_shape()
    return rows


def measure_decode(
    name: str, dim: int, heads: int, contexts: list[int], device, dtype, repeats: int, block: int = 8
) -> list[Row]:
    """Per-token step time and step memory at each context length (ToST Fig. 8).

    Steps are timed in blocks of ``block`` consecutive tokens starting at the context length, so the
    figure holds whether a mechanism updates its state in place (a KV cache) or returns a new one.
    """
    rows = []
    m = decode_module(name, dim, heads, max(contexts) + (repeats + 2) * block, device, dtype)
    holder = {"state": m.init_state(1, device=device, dtype=dtype), "pos": 0}
    x = torch.randn(1, 1, dim, device=device, dtype=dtype)

    def advance(n: int) -> None:
        for _ in range(n):
            _, holder["state"] = m.step(x, holder["state"])
        holder["pos"] += n

    with torch.no_grad():
        for ctx in sorted(contexts):
            advance(max(0, ctx - holder["pos"]))
            peak = peak_memory_bytes(lambda: advance(block), device)
            # The peak-memory pass just above already warmed these steps up (and moved the context along).
            sec = time_call(lambda: advance(block), device, repeats, warmup=0) / block
            row = Row.at("decode", name, True, "module", Shape(1, heads, ctx, dim))
            row.fwd_ms, row.fwd_peak_mb = sec * 1e3, peak / 2**20
            rows.append(row)
    return rows


def write_results(out_dir: str, rows: list[Row], meta: dict) -> tuple[str, str]:
    """Atomically write ``results.csv`` and ``results.json`` into ``out_dir``."""
    import csv
    import io

    from attnzoo._io import atomic_write_text

    csv_path, json_path = os.path.join(out_dir, "results.csv"), os.path.join(out_dir, "results.json")
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(Row.__dataclass_fields__))
    w.writeheader()
    for r in rows:
        w.writerow(asdict(r))
    atomic_write_text(csv_path, buf.getvalue())
    atomic_write_text(json_path, json.dumps({"machine": meta, "rows": [asdict(r) for r in rows]}, indent=1))
    return csv_path, json_path
