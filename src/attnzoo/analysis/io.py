"""Output handling for experiments: refuse to clobber; strict JSON (no NaN/Infinity literals) with non-finite
floats as the strings ``"nan"``/``"inf"``/``"-inf"``, written through the shared :mod:`attnzoo._io` helpers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from attnzoo import _io

__all__ = ["prepare_out_dir", "write_json", "to_jsonable"]


def prepare_out_dir(out: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Create ``out`` if needed; refuse a non-empty directory unless ``overwrite`` (then files are replaced)."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {str(path)!r} exists and is not a directory; pass a directory path")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise FileExistsError(
            f"output directory {str(path)!r} is not empty; pass --overwrite to replace its files, or pick a new --out"
        )
    path.mkdir(parents=True, exist_ok=True)
    return path


def to_jsonable(value: Any) -> Any:
    """Tensors/arrays to lists, numpy scalars to Python; non-finite floats to the strings "inf"/"-inf"/"nan"."""
    return _io.to_jsonable(value, nonfinite="string")


def write_json(path: str | os.PathLike, payload: dict) -> Path:
    # compact: indentation would put every number of the long per-layer/per-point lists on its own line
    return _io.write_json(path, payload, indent=None, nonfinite="string")
