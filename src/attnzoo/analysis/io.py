"""Output handling for experiments: refuse to clobber, write atomically, JSON-safe values."""
from __future__ import annotations

import io
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnzoo._io import atomic_write_bytes

__all__ = ["prepare_out_dir", "atomic_write_bytes", "write_json", "write_figure", "to_jsonable"]


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
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().to(torch.float64).numpy() if value.is_floating_point() else value.cpu().numpy()
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, np.generic):
        return to_jsonable(value.item())
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, Path):
        return str(value)
    return value


def write_json(path: str | os.PathLike, payload: dict) -> Path:
    # compact: indentation would put every number of the long per-layer/per-point lists on its own line
    text = json.dumps(to_jsonable(payload), separators=(",", ":"), allow_nan=False) + "\n"
    return atomic_write_bytes(path, text.encode())


def write_figure(path: str | os.PathLike, fig, *, dpi: int = 110) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return atomic_write_bytes(path, buf.getvalue())
