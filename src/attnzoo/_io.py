"""Atomic file writes and JSON conversion shared by checkpoints, results, reports and plots.

Writes never leave a torn file: the data go to a uniquely named temporary file in the target's directory (same
filesystem, so the rename is atomic), are fsync-ed, and the file is renamed over the target; on any error the
temporary is removed and the target is left as it was.
"""

from __future__ import annotations

import io
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Literal

__all__ = ["atomic_write_bytes", "atomic_write_text", "atomic_save_figure", "fsync_dir", "to_jsonable", "write_json"]

#: what :func:`to_jsonable` makes of NaN and infinities: JSON ``null``, the strings ``"nan"``/``"inf"``/``"-inf"``,
#: or the float left as it is (``json`` then writes the non-standard ``NaN``/``Infinity``)
NonFinite = Literal["null", "string", "keep"]


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (parent directories are created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file ordinary permissions
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


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
