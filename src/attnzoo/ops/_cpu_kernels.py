"""Fused C++ CPU kernels (``ops/*/*.cpp``), compiled on first use with ``torch.utils.cpp_extension``.

The sources are found by convention, not listed: every ``*.cpp`` directly inside a folder of ``ops`` (each op's own
kernels in ``ops/<op>/``, the kernels several ops share in ``ops/_kernels/``) is compiled into the one library,
namespace ``torch.ops.attnzoo_cpu`` (one file declares it with ``TORCH_LIBRARY``, the others add to it with
``TORCH_LIBRARY_FRAGMENT``). A new mechanism with a C++ kernel needs no edit outside its folder.

The build takes ~30 s (2 cores) once; later processes load the cached library. Each build has its own cache
directory, keyed by everything the compiled library depends on: the CPU's instruction-set flags (it is
compiled with ``-march=native``, so a home directory shared by different machines gets one build per CPU
kind), the Python environment (``sys.executable``, ``sys.prefix``: two virtual environments with the same
torch would otherwise overwrite each other's build, and rebuild on every switch), the torch build, the
compiler flags and the sources. Where the build fails (no C++ compiler, say), :func:`cpu_kernels` warns once
and returns ``None`` and the ops use their PyTorch path.

Builds into one directory are serialised by a lock. A process that finds another one building says so once
on stderr (with that process's id) and waits at most ``ATTNZOO_CPU_KERNELS_WAIT`` seconds; then it warns
and uses the PyTorch path for the rest of its life (one implementation per process, so its results do not
change midway).

Environment: ``ATTNZOO_CPU_KERNELS=0`` skips the kernels (PyTorch path everywhere);
``ATTNZOO_CPU_KERNELS_DIR`` sets the build cache (default ``~/.cache/attnzoo/cpu_kernels``);
``ATTNZOO_CPU_KERNELS_WAIT`` bounds the wait for another process's build (seconds, default 300).

Every change of the key leaves a build directory behind: after each load the least recently used beyond
:data:`KEEP_BUILDS` are removed (:func:`clean_builds`, also ``attnzoo kernels --clean``).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import re
import shutil
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Iterator

import torch

__all__ = [
    "cpu_kernels",
    "cpu_kernels_error",
    "required_cpu_kernels",
    "KERNEL_ROOTS",
    "kernel_sources",
    "BuildWaitTimeout",
    "DEFAULT_WAIT_S",
    "KEEP_BUILDS",
    "builds",
    "cache_root",
    "clean_builds",
    "current_build_dir",
    "last_used",
    "unit_stride",
]

log = logging.getLogger(__name__)

#: where :func:`kernel_sources` looks: ``ops`` itself (a test adds a folder of its own)
KERNEL_ROOTS: list[Path] = [Path(__file__).resolve().parent]


def kernel_sources() -> list[Path]:
    """The C++ sources compiled into the one library: ``ROOT/<folder>/*.cpp`` for each of :data:`KERNEL_ROOTS`, in
    a fixed order (the build key and the link order must not depend on the file system's listing order)."""
    return [src for root in KERNEL_ROOTS for src in sorted(root.glob("*/*.cpp"), key=lambda p: p.relative_to(root))]


_lock = threading.Lock()
_loaded = False
_error: str | None = None
_announced = False

DEFAULT_WAIT_S = 300.0
#: a process that only loads an up-to-date library holds the lock briefly: say nothing for waits this short
_ANNOUNCE_AFTER_S = 1.0
_LOCK_NAME = "attnzoo.lock"
#: touched at every load: the least recently used builds are the ones removed
_USED_NAME = "last_used"
#: build directories kept in the cache (the current one included); older ones are removed after a load
KEEP_BUILDS = 3


def unit_stride(t: torch.Tensor) -> torch.Tensor:
    """``t`` if its last dim has unit stride (or size 1), else a contiguous copy: the kernels take any strides over
    the leading dims (e.g. the layers' ``"b n (h p) -> b h n p"`` views, read uncopied) but walk the last one."""
    return t if t.shape[-1] == 1 or t.stride(-1) == 1 else t.contiguous()


class BuildWaitTimeout(RuntimeError):
    """Another process held the build lock longer than ``ATTNZOO_CPU_KERNELS_WAIT`` seconds."""


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


def _wait_seconds() -> float:
    """``ATTNZOO_CPU_KERNELS_WAIT`` (seconds >= 0), default :data:`DEFAULT_WAIT_S`."""
    raw = os.environ.get("ATTNZOO_CPU_KERNELS_WAIT", "").strip()
    if not raw:
        return DEFAULT_WAIT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value >= 0 or value == float("inf"):
        raise ValueError(
            f"ATTNZOO_CPU_KERNELS_WAIT={raw!r}: expected a finite number of seconds >= 0 (how long to "
            f"wait for another process's build of the CPU kernels; default {DEFAULT_WAIT_S:g})"
        )
    return value


def _sources_digest() -> str:
    h = hashlib.sha256()
    for src in kernel_sources():
        h.update(f"{src.parent.name}/{src.name}".encode())  # a moved source is staged under another name
        h.update(src.read_bytes())
    return h.hexdigest()


def _build_key() -> str:
    """Hash of what the compiled library depends on besides the CPU (see the module docstring)."""
    parts = [
        sys.executable,
        sys.prefix,
        sys.version,
        torch.__version__,
        str(getattr(torch.version, "git_version", "")),
        str(Path(torch.__file__).parent),
        os.environ.get("CXX", ""),
        " ".join(_cflags()),
        " ".join(_ldflags()),
        _sources_digest(),
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


def cache_root() -> Path:
    """The directory holding one build directory per key (``ATTNZOO_CPU_KERNELS_DIR``)."""
    return Path(os.environ.get("ATTNZOO_CPU_KERNELS_DIR") or Path.home() / ".cache" / "attnzoo" / "cpu_kernels")


def current_build_dir() -> Path:
    """The build directory this process's torch, CPU, Python environment and sources select (maybe not built)."""
    torch_tag = torch.__version__.replace("+", "_")
    return cache_root() / f"torch{torch_tag}-{_cpu_signature()}-{_build_key()}"


def _build_dir() -> Path:
    d = current_build_dir()
    d.mkdir(parents=True, exist_ok=True)
    return d


def _is_build(d: Path) -> bool:
    # only what this module names (torch<version>-<cpu>-<key>) is ever removed, whatever else shares the root
    return d.is_dir() and re.fullmatch(r"torch.+-[0-9a-f]{12}-[0-9a-f]{12}", d.name) is not None


def last_used(d: Path) -> float:
    """When the build in ``d`` was last loaded (a time stamp; the directory's own for builds before that record)."""
    for p in (d / _USED_NAME, d):
        with contextlib.suppress(OSError):
            return p.stat().st_mtime
    return 0.0


def builds() -> list[Path]:
    """The build directories under :func:`cache_root`, most recently used first."""
    root = cache_root()
    found = [d for d in root.iterdir() if _is_build(d)] if root.is_dir() else []
    return sorted(found, key=last_used, reverse=True)


def clean_builds(keep: int = KEEP_BUILDS) -> list[Path]:
    """Remove the build directories beyond the ``keep`` most recently used; the one this environment uses stays
    (it counts towards ``keep``), and so does any that another process is building or loading right now. Returns the
    removed directories."""
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 0:
        raise ValueError(f"keep must be an integer >= 0 (build directories to keep), got {keep!r}")
    current = current_build_dir()
    old = [d for d in builds() if d != current]
    removed = []
    for d in old[max(keep - 1, 0) :]:
        with _unused(d) as free:
            if free:
                shutil.rmtree(d, ignore_errors=True)
                removed.append(d)
    return removed


@contextlib.contextmanager
def _unused(d: Path) -> Iterator[bool]:
    """Whether no process holds ``d``'s build lock; held for the block so that none starts meanwhile."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no way to tell, so leave it
        yield False
        return
    try:
        fd = os.open(d / _LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _ldflags() -> list[str]:
    return ["-fopenmp"] if torch.backends.openmp.is_available() else []


def _cflags() -> list[str]:
    flags = ["-O3"]  # torch adds the -std its headers need
    if platform.machine() in ("x86_64", "AMD64"):
        flags.append("-march=native")
    # at::parallel_for is inline OpenMP code when torch is built with OpenMP: without -fopenmp it runs serially
    # (the extension then links torch's own libgomp, already loaded in the process).
    if torch.backends.openmp.is_available():
        flags.append("-fopenmp")
    return flags


def _staged_sources(build_dir: Path) -> list[Path]:
    """The sources copied into ``build_dir`` as ``<folder>_<file>.cpp``: several folders have a ``cpu.cpp``, and
    ninja names each object after its source's file name. A copy is written only when missing (the build key covers the
    sources' contents), so its time stamp does not make ninja rebuild on every load."""
    staged = []
    for src in kernel_sources():
        dst = build_dir / f"{src.parent.name}_{src.name}"
        if not dst.exists() or dst.read_bytes() != src.read_bytes():
            tmp = dst.with_suffix(".tmp")
            tmp.write_bytes(src.read_bytes())
            os.replace(tmp, dst)
        staged.append(dst)
    return staged


def _build(wait_s: float = DEFAULT_WAIT_S) -> None:
    from torch.utils.cpp_extension import load

    build_dir = _build_dir()
    with _build_lock(build_dir, wait_s):
        if not (build_dir / "attnzoo_cpu.so").exists():
            # a pause of half a minute deserves a word (logging's last-resort handler shows warnings on stderr)
            log.warning(
                "attnzoo: compiling the fused CPU kernels into %s (once per machine and Python "
                "environment, ~30 s on 2 cores)",
                build_dir,
            )
        load(
            name="attnzoo_cpu",
            sources=[str(s) for s in _staged_sources(build_dir)],
            extra_cflags=_cflags(),
            extra_ldflags=_ldflags(),
            build_directory=str(build_dir),
            is_python_module=False,
            verbose=False,
        )
        (build_dir / _USED_NAME).touch()
    # every source edit, torch upgrade or environment leaves a build behind: the least recently used go
    try:
        clean_builds(KEEP_BUILDS)
    except OSError as e:  # a cache that cannot be tidied must not cost the kernels
        log.debug("attnzoo: could not remove old CPU kernel builds: %s", e)


def _holder(build_dir: Path) -> str:
    """``"process <pid>"`` of the lock's holder (it writes its pid into the lock file), if known."""
    try:
        pid = int((build_dir / _LOCK_NAME).read_text().strip())
    except (OSError, ValueError):
        return "another process"
    return f"process {pid}"


@contextlib.contextmanager
def _build_lock(build_dir: Path, wait_s: float = DEFAULT_WAIT_S) -> Iterator[None]:
    """Serialise builds with an OS lock, which dies with its process; wait at most ``wait_s`` seconds for it.

    torch's own lock is a file that a killed build (SIGKILL, OOM, a CI timeout) leaves behind, after which
    every later ``load`` waits on it forever. Whoever holds this lock is the only process that can be inside
    ``load`` for this directory, so a torch lock file it finds is stale and goes. The holder writes its pid
    into the lock file so that waiting processes can say whom they wait for. Raises
    :class:`BuildWaitTimeout` when the wait runs out.
    """
    global _announced
    try:
        import fcntl
    except ImportError:  # not POSIX: torch's lock alone
        yield
        return
    path = build_dir / _LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        start = time.monotonic()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                pass
            waited = time.monotonic() - start
            if not _announced and (waited >= min(_ANNOUNCE_AFTER_S, wait_s)):
                _announced = True  # once per process
                print(
                    f"attnzoo: waiting for {_holder(build_dir)}, which is building the fused CPU kernels in "
                    f"{build_dir} (at most {wait_s:g} s, set by ATTNZOO_CPU_KERNELS_WAIT; then the PyTorch "
                    "path is used)",
                    file=sys.stderr,
                    flush=True,
                )
            if waited >= wait_s:
                raise BuildWaitTimeout(
                    f"{_holder(build_dir)} held the build lock {path} for more than "
                    f"{wait_s:g} s (ATTNZOO_CPU_KERNELS_WAIT)"
                )
            time.sleep(min(0.1, max(wait_s - waited, 0.0)))
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            (build_dir / "lock").unlink(missing_ok=True)
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def required_cpu_kernels():
    """``torch.ops.attnzoo_cpu`` for an op's explicit ``backend="cpu"``; raises naming why they are missing."""
    kernels = cpu_kernels()
    if kernels is None:
        raise RuntimeError(
            f"backend='cpu' needs attnzoo's CPU kernels: {cpu_kernels_error()}; "
            "use backend='torch' (or 'auto', which falls back to it)"
        )
    return kernels


def cpu_kernels():
    """``torch.ops.attnzoo_cpu`` once the kernels are built and loaded, or ``None`` (disabled or failed)."""
    global _loaded, _error
    if _loaded:
        return torch.ops.attnzoo_cpu
    if _error is not None or not _enabled():
        return None
    wait_s = _wait_seconds()
    with _lock:
        if not _loaded and _error is None:
            try:
                _build(wait_s)
                _loaded = True
            except BuildWaitTimeout as e:
                _error = str(e)
                warnings.warn(
                    f"attnzoo: gave up waiting for the fused CPU kernels: {e}; this process uses the "
                    "PyTorch path (slower). Later processes load the finished build.",
                    RuntimeWarning,
                    stacklevel=2,
                )
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
