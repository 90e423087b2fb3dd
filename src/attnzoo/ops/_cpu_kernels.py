"""Fused C++ CPU kernels (``ops/*/cpu.cpp``), compiled on first use with ``torch.utils.cpp_extension``.

The build takes ~30 s (2 cores) once per machine, torch version and source; later processes load the cached
library. It is keyed by the CPU's instruction-set flags because it is compiled with ``-march=native`` (a
home directory shared by different machines gets one build per CPU kind). Where the build fails (no C++
compiler, say), :func:`cpu_kernels` warns once and returns ``None`` and the ops use their PyTorch path.

Environment: ``ATTNZOO_CPU_KERNELS=0`` skips the kernels (PyTorch path everywhere);
``ATTNZOO_CPU_KERNELS_DIR`` sets the build cache (default ``~/.cache/attnzoo/cpu_kernels``).
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import threading
import warnings
from pathlib import Path
from typing import Iterator

import torch

__all__ = ["cpu_kernels", "cpu_kernels_error", "CPU_KERNEL_SOURCES"]

log = logging.getLogger(__name__)

_HERE = Path(__file__).resolve().parent
#: the C++ sources compiled into the one library (namespace ``torch.ops.attnzoo_cpu``)
CPU_KERNEL_SOURCES = [_HERE / "tssa" / "cpu.cpp"]

_lock = threading.Lock()
_loaded = False
_error: str | None = None


def _enabled() -> bool:
    return os.environ.get("ATTNZOO_CPU_KERNELS", "1").strip().lower() not in ("0", "false", "no", "off")


def _cpu_signature() -> str:
    """What ``-march=native`` depends on: the architecture and the CPU's feature flags."""
    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags = line.split(":", 1)[1].strip()
                    break
    except OSError:
        flags = platform.processor()
    return hashlib.sha256(f"{platform.machine()} {flags}".encode()).hexdigest()[:12]


def _build_dir() -> Path:
    root = os.environ.get("ATTNZOO_CPU_KERNELS_DIR") or Path.home() / ".cache" / "attnzoo" / "cpu_kernels"
    torch_tag = torch.__version__.replace("+", "_")
    d = Path(root) / f"torch{torch_tag}-{_cpu_signature()}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _cflags() -> list[str]:
    flags = ["-O3"]  # torch adds the -std its headers need
    if platform.machine() in ("x86_64", "AMD64"):
        flags.append("-march=native")
    # at::parallel_for is inline OpenMP code when torch is built with OpenMP: without -fopenmp it runs serially
    # (the extension then links torch's own libgomp, already loaded in the process).
    if torch.backends.openmp.is_available():
        flags.append("-fopenmp")
    return flags


def _build() -> None:
    from torch.utils.cpp_extension import load

    build_dir = _build_dir()
    if not (build_dir / "attnzoo_cpu.so").exists():
        # a pause of half a minute deserves a word (logging's last-resort handler shows warnings on stderr)
        log.warning("attnzoo: compiling the fused CPU kernels into %s (once per machine and torch version, "
                    "~30 s on 2 cores)", build_dir)
    with _build_lock(build_dir):
        load(
            name="attnzoo_cpu",
            sources=[str(s) for s in CPU_KERNEL_SOURCES],
            extra_cflags=_cflags(),
            extra_ldflags=["-fopenmp"] if torch.backends.openmp.is_available() else [],
            build_directory=str(build_dir),
            is_python_module=False,
            verbose=False,
        )


@contextlib.contextmanager
def _build_lock(build_dir: Path) -> Iterator[None]:
    """Serialise builds with an OS lock, which dies with its process.

    torch's own lock is a file that a killed build (SIGKILL, OOM, a CI timeout) leaves behind, after which
    every later ``load`` waits on it forever. Whoever holds this lock is the only process that can be inside
    ``load`` for this directory, so a torch lock file it finds is stale and goes.
    """
    try:
        import fcntl
    except ImportError:  # not POSIX: torch's lock alone
        yield
        return
    with open(build_dir / "attnzoo.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            (build_dir / "lock").unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def cpu_kernels():
    """``torch.ops.attnzoo_cpu`` once the kernels are built and loaded, or ``None`` (disabled or failed)."""
    global _loaded, _error
    if _loaded:
        return torch.ops.attnzoo_cpu
    if _error is not None or not _enabled():
        return None
    with _lock:
        if not _loaded and _error is None:
            try:
                _build()
                _loaded = True
            except Exception as e:  # noqa: BLE001 - any build failure means: use the PyTorch path
                _error = f"{type(e).__name__}: {e}".strip()
                warnings.warn(
                    f"attnzoo: the fused CPU kernels could not be built ({_error.splitlines()[0]}); "
                    "using the PyTorch path (slower). Set ATTNZOO_CPU_KERNELS=0 to skip the build.",
                    RuntimeWarning,
                    stacklevel=2,
                )
    return torch.ops.attnzoo_cpu if _loaded else None


def cpu_kernels_error() -> str:
    """Why :func:`cpu_kernels` returns ``None`` (for error messages)."""
    if _loaded:
        return ""
    if not _enabled():
        return "they are disabled by ATTNZOO_CPU_KERNELS=" + os.environ.get("ATTNZOO_CPU_KERNELS", "")
    return _error or "they are not loaded"
