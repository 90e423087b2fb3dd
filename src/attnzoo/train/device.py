"""The device a run trains on and its mixed-precision setting."""

from __future__ import annotations

import contextlib

import torch

from attnzoo.train.config import ConfigError
from attnzoo.train.distributed import DistInfo

__all__ = ["resolve_device", "amp_dtype", "autocast"]


def resolve_device(name: str, info: DistInfo | None = None) -> torch.device:
    """``"auto"`` -> CUDA when available, else CPU; under DDP each process gets its local rank's GPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(name)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("device='cuda' but CUDA is not available; valid: 'cpu' or 'auto'")
        if info is not None and info.enabled:
            dev = torch.device("cuda", info.local_rank)
    return dev


def amp_dtype(amp: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of the config's ``amp`` setting on ``device`` (``None``: full precision)."""
    if amp == "off" or (amp == "auto" and device.type != "cuda"):
        return None
    if amp == "auto":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if amp == "fp16" and device.type != "cuda":
        raise ConfigError("amp='fp16' needs CUDA; on CPU use amp='bf16' or 'off'")
    return torch.bfloat16 if amp == "bf16" else torch.float16


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """``torch.autocast`` to ``dtype``, or nothing when ``dtype`` is ``None``."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
