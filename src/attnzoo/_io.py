"""Atomic file writes and JSON conversion shared by checkpoints, results, reports and plots.

Writes never leave a torn file: the data go to a uniquely named temporary file in the target's directory (same
filesystem, so the rename is atomic), are fsync-ed, and the file is renamed over the target; on any error the
temporary is removed and the target is left as it was.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator, Literal

__all__ = [
    "WriteError",
    "ReadError",
    "read_json",
    "all_or_nothing",
    "atomic_write_bytes",
    "atomic_write_text",
    "atomic_save_figure",
    "fsync_dir",
    "to_jsonable",
    "write_json",
]

#: what :func:`to_jsonable` makes of NaN and infinities: JSON ``null``, the strings ``"nan"``/``"inf"``/``"-inf"``,
#: or the float left as it is (``json`` then writes the non-standard ``NaN``/``Infinity``)
NonFinite = Literal["null", "string", "keep"]


class WriteError(OSError):
    """A failed write (disk full, permissions, ...), naming the file and what was being written.

    What the file held before is kept (writes are atomic); ``errno`` and ``filename`` are the cause's.
    """

    def __init__(self, what: str, path: str | os.PathLike, cause: BaseException) -> None:
        errno_ = getattr(cause, "errno", None)
        reason = getattr(cause, "strerror", None) or str(cause) or type(cause).__name__
        super().__init__(errno_, reason, str(path))
        self.what = what

    def __str__(self) -> str:
        return f"could not write {self.what} ({self.filename}): {self.strerror}"


class ReadError(ValueError):
    """A file attnzoo wrote that cannot be read back (damaged, truncated, not what it should be); names the file."""


def write_error(what: str, path: str | os.PathLike, e: OSError) -> WriteError:
    """``e`` as a :class:`WriteError` naming ``what`` (e.g. ``"checkpoint step 20"``) and ``path``; an error that
    already names what was written is kept as it is."""
    return e if isinstance(e, WriteError) else WriteError(what, path, e)


def read_json(path: str | os.PathLike, what: str = "") -> Any:
    """The JSON in ``path``; a damaged file is a :class:`ReadError` naming it (and ``what`` it holds)."""
    path = Path(path)
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        label = f" ({what})" if what else ""
        raise ReadError(f"{path}{label} is corrupt: {' '.join(str(e).split())}") from None


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (parent directories are created); returns the path.

    An ``OSError`` (e.g. a full disk) leaves the target as it was and names the file (its ``filename``).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise _named(e, path) from None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file ordinary permissions
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise _named(e, path) from None
        raise
    return path


def _named(e: OSError, path: Path) -> OSError:
    """``e`` with ``filename`` set to the target (not the temporary, which no longer exists)."""
    if isinstance(e, WriteError) or e.errno is None:
        return e
    return OSError(e.errno, e.strerror, str(path))  # OSError(errno, ...) picks the subclass (FileNotFoundError, ...)


@contextlib.contextmanager
def all_or_nothing(paths: list[str | os.PathLike]) -> Iterator[None]:
    """Files written together (e.g. ``report.md`` and ``results.json``): if the block raises, each of ``paths`` is
    restored to what it was before (or removed, if it did not exist), so no half of the set is left newer.

    The old files are kept as hard links (no copy, no extra space), then put back with an atomic rename.
    """
    saved: dict[Path, Path | None] = {}
    try:
        for p in map(Path, paths):
            keep = p.with_name(f".{p.name}.keep.tmp")
            keep.unlink(missing_ok=True)
            if p.is_file():
                try:
                    os.link(p, keep)
                except OSError:  # a filesystem without hard links
                    shutil.copy2(p, keep)
                saved[p] = keep
            else:
                saved[p] = None
        yield
    except BaseException:
        for p, keep in saved.items():
            if keep is not None:
                if p.exists() and os.path.samefile(keep, p):  # unchanged (rename between links does nothing)
                    keep.unlink()
                else:
                    os.replace(keep, p)
            else:
                p.unlink(missing_ok=True)
        raise
    else:
        for keep in saved.values():
            if keep is not None:
                keep.unlink(missing_ok=True)


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush ``path``'s directory entries (a rename into it) to disk, where the platform allows (best effort)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; returns the path."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_save_figure(fig, path: str | os.PathLike, dpi: int = 110) -> Path:
    """Render a matplotlib figure to PNG in memory, write it atomically and close the figure."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    finally:
        plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())


def to_jsonable(value: Any, *, nonfinite: NonFinite = "null") -> Any:
    """Deep-convert ``value`` to JSON types.

    Dict keys become strings, tuples lists, paths strings; numpy/torch scalars become Python numbers and
    arrays/tensors nested lists (via ``.item()`` / ``.tolist()``, so no numpy or torch import is needed here).
    Non-finite floats follow ``nonfinite``.
    """
    if isinstance(value, dict):
        return {str(k): to_jsonable(v, nonfinite=nonfinite) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v, nonfinite=nonfinite) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return to_jsonable(value.tolist(), nonfinite=nonfinite)
    if isinstance(value, float) and not math.isfinite(value) and nonfinite != "keep":
        if nonfinite == "null":
            return None
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def write_json(
    path: str | os.PathLike,
    payload: Any,
    *,
    indent: int | None = 1,
    nonfinite: NonFinite = "null",
    newline: bool = True,
) -> Path:
    """Write ``to_jsonable(payload)`` to ``path`` atomically; returns the path.

    ``indent=None`` writes compactly (no spaces: long number lists stay on one line); ``newline`` ends the file
    with one. Only ``nonfinite="keep"`` lets ``NaN``/``Infinity`` through (valid for Python's ``json``, not for
    strict JSON readers).
    """
    separators = (",", ":") if indent is None else None
    text = json.dumps(
        to_jsonable(payload, nonfinite=nonfinite), indent=indent, separators=separators, allow_nan=nonfinite == "keep"
    )
    return atomic_write_text(path, text + "\n" if newline else text)
