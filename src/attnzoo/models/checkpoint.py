"""Checkpoints: ``config.json`` + ``model.safetensors`` (no pickle), written atomically.

Writes go to temporary files in the target directory and are moved into place with ``os.replace`` only
after both were written and flushed (a failed rename restores the files already replaced), so a failed
save never leaves a half-written, mixed or overwritten checkpoint. Loads check the JSON, the config keys,
the safetensors header, a SHA-256 of the tensor bytes, and the exact set of tensor names / shapes /
dtypes, and name the file and the problem on error.

The SHA-256 is stored twice: in the safetensors metadata and as ``weights_sha256`` in ``config.json``, so
editing the tensors and stripping the metadata is still detected. A checkpoint carrying neither (written
by other tools or by hand) loads with a one-time warning that its weights are unverified.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnzoo.models._registry import config_class_for, model_class_for

__all__ = ["PretrainedModel", "save_pretrained", "from_pretrained", "CheckpointError", "CONFIG_NAME", "WEIGHTS_NAME"]

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
FORMAT_VERSION = "1"
#: ``config.json`` key holding the SHA-256 of the weights (see :func:`_digest`); not a model config field
CHECKSUM_KEY = "weights_sha256"
_warned_unverified: set[str] = set()


class CheckpointError(ValueError, RuntimeError):
    """A checkpoint (pretrained weights or a training run's step) is missing, corrupt, incomplete or does not match
    the model/optimizer it is loaded into. One class for both kinds; a ``ValueError`` and a ``RuntimeError``, as each
    kind was before they were merged, so existing ``except`` clauses keep catching it."""


def _tensor_bytes(t: torch.Tensor):
    """The raw bytes of ``t`` as a buffer (no copy for contiguous CPU tensors; works for bf16 too)."""
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()


def _digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(_tensor_bytes(t))
    return h.hexdigest()


def _unique_state(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """State dict without tied duplicates: ``(tensors, aliases)`` with ``aliases[dup] = kept_name``."""
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for name, t in model.state_dict(keep_vars=False).items():
        if t.device.type == "meta":
            raise CheckpointError(f"cannot save parameter {name!r}: it lives on the meta device (no data)")
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if t.numel() > 0 and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        tensors[name] = t.detach().cpu().contiguous().clone()
    return tensors, aliases


def _backup(path: Path) -> str:
    """A hard link (or copy) of ``path`` beside it, to restore it if a later step of a save fails."""
    fd, bak = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".bak", dir=path.parent)
    os.close(fd)
    os.remove(bak)
    try:
        os.link(path, bak)
    except OSError:
        shutil.copy2(path, bak)
    return bak


def _write_atomic(directory: Path, files: dict[str, callable]) -> None:
    """Write every ``name -> writer(path)`` into temp files in ``directory``, then move all into place.

    Each file is written and flushed to a temp file first; the renames happen only after every writer
    succeeded, and if one rename fails the files already replaced are restored from backups, so the
    directory holds either the complete old checkpoint or the complete new one.
    """
    temps: dict[str, str] = {}
    backups: dict[str, str] = {}
    try:
        for name, writer in files.items():
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
            os.close(fd)
            temps[name] = tmp
            writer(tmp)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        for name in temps:
            if (directory / name).exists():
                backups[name] = _backup(directory / name)
        done: list[str] = []
        try:
            for name, tmp in temps.items():
                os.replace(tmp, directory / name)
                done.append(name)
        except BaseException:
            for name in reversed(done):
                if name in backups:
                    os.replace(backups.pop(name), directory / name)
                else:
                    os.remove(directory / name)
            raise
    finally:
        for tmp in list(temps.values()) + list(backups.values()):
            if os.path.exists(tmp):
                os.remove(tmp)


def save_pretrained(model: nn.Module, directory: str | os.PathLike) -> Path:
    """Write ``model.config`` and weights to ``directory`` (created if needed); returns the directory."""
    from safetensors.torch import save_file

    import attnzoo

    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        raise TypeError(f"{type(model).__name__} has no attnzoo config; only attnzoo models can be saved")
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"{directory} exists and is not a directory")
    directory.mkdir(parents=True, exist_ok=True)
    tensors, aliases = _unique_state(model)
    meta = {
        "format": "pt",
        "attnzoo_format": FORMAT_VERSION,
        "attnzoo_version": attnzoo.__version__,
        "arch": config.arch,
        "aliases": json.dumps(aliases, sort_keys=True),
        "sha256": _digest(tensors),
    }
    config_text = json.dumps({**config.to_dict(), CHECKSUM_KEY: meta["sha256"]}, indent=2, sort_keys=True) + "\n"

    def write_config(path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(config_text)

    _write_atomic(
        directory,
        {WEIGHTS_NAME: lambda path: save_file(tensors, path, metadata=meta), CONFIG_NAME: write_config},
    )
    return directory


def _read_config(directory: str | os.PathLike):
    """``(config, weights checksum or None)`` from ``directory/config.json``."""
    path = Path(directory) / CONFIG_NAME
    if not path.is_file():
        raise CheckpointError(f"{path}: missing (not an attnzoo checkpoint directory?)")
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or "arch" not in data:
        raise CheckpointError(f"{path}: expected a JSON object with an 'arch' key")
    checksum = data.pop(CHECKSUM_KEY, None)
    if checksum is not None and not (
        isinstance(checksum, str) and len(checksum) == 64 and all(c in "0123456789abcdef" for c in checksum)
    ):
        raise CheckpointError(
            f"{path}: {CHECKSUM_KEY} must be a SHA-256 hex digest (64 lowercase hex digits), got {checksum!r}"
        )
    try:
        cls = config_class_for(data["arch"])
        return cls.from_dict(data, source=str(path)), checksum
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: invalid config: {e}") from None


def load_weights(model: nn.Module, path: str | os.PathLike, expected_sha256: str | None = None) -> None:
    """Load ``path`` (safetensors) into ``model`` exactly: same names, shapes, dtypes, and checksum.

    The checksum is ``expected_sha256`` (from ``config.json``) and/or the file's ``sha256`` metadata; both
    must match when present. With neither, the weights load with a one-time warning that they are unverified.
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: missing")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors raises its own error types for bad headers / truncation
        raise CheckpointError(f"{path}: corrupt or not a safetensors file ({type(e).__name__}: {e})") from None
    try:
        aliases = json.loads(meta.get("aliases", "{}"))
    except json.JSONDecodeError:
        raise CheckpointError(f"{path}: corrupt metadata (aliases is not JSON)") from None
    # a model saved after .to(dtype) is rebuilt in float32 from its config: follow the file's dtype
    file_dtypes = {t.dtype for t in tensors.values() if t.is_floating_point()}
    own_dtypes = {t.dtype for t in model.state_dict().values() if t.is_floating_point()}
    if len(file_dtypes) == 1 and len(own_dtypes) == 1 and file_dtypes != own_dtypes:
        model.to(next(iter(file_dtypes)))
    own = model.state_dict()
    expected = set(own) - set(aliases)
    missing = sorted(expected - set(tensors))
    unexpected = sorted(set(tensors) - set(own))
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: does not match the model built from its config: missing tensors {missing[:10]}"
            f"{' ...' if len(missing) > 10 else ''}, unexpected tensors {unexpected[:10]}"
            f"{' ...' if len(unexpected) > 10 else ''}"
        )
    for name in sorted(expected):
        t, target = tensors[name], own[name]
        if tuple(t.shape) != tuple(target.shape) or t.dtype != target.dtype:
            raise CheckpointError(
                f"{path}: tensor {name!r} has shape {tuple(t.shape)} / {t.dtype}, the model expects "
                f"{tuple(target.shape)} / {target.dtype}"
            )
    # after the structural checks: a config that no longer fits is reported as such, not as corruption
    wanted = {c for c in (expected_sha256, meta.get("sha256")) if c is not None}
    if wanted:
        digest = _digest(tensors)
        if expected_sha256 is not None and digest != expected_sha256:
            raise CheckpointError(
                f"{path}: checksum mismatch with {CHECKSUM_KEY} in {path.parent / CONFIG_NAME}; "
                "the tensor data is corrupt or was edited"
            )
        if digest not in wanted or len(wanted) > 1:
            raise CheckpointError(f"{path}: checksum mismatch with its sha256 metadata; the tensor data is corrupt")
    else:
        key = str(path.resolve())
        if key not in _warned_unverified:
            _warned_unverified.add(key)
            warnings.warn(
                f"{path}: unverified weights: neither {path.parent / CONFIG_NAME} ({CHECKSUM_KEY}) nor the "
                "file's metadata holds a checksum, so corruption or edits cannot be detected. Re-save "
                "with save_pretrained to add one.",
                RuntimeWarning,
                stacklevel=3,
            )
    with torch.no_grad():
        for name in sorted(expected):
            own[name].copy_(tensors[name])


class PretrainedModel(nn.Module):
    """Base of attnzoo models: a ``config`` attribute plus checkpoint save/load."""

    config_class: type = None  # set by subclasses

    def __init__(self, config: Any = None) -> None:
        """``config``: an instance of the subclass's ``config_class``, kept as ``self.config`` (a subclass may pass
        none and set it itself)."""
        super().__init__()
        if config is not None:
            if not isinstance(config, self.config_class):
                raise TypeError(
                    f"{type(self).__name__} needs a config of type {self.config_class.__name__}, got "
                    f"{type(config).__name__}"
                )
            self.config = config

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write ``config.json`` + ``model.safetensors`` to ``directory`` atomically."""
        return save_pretrained(self, directory)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, *, device: str | torch.device | None = None):
        model = from_pretrained(directory, device=device)
        if not isinstance(model, cls):
            raise CheckpointError(
                f"{Path(directory) / CONFIG_NAME}: holds a {type(model).__name__}, not a {cls.__name__}"
            )
        return model

    def num_parameters(self, *, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)


def from_pretrained(directory: str | os.PathLike, *, device: str | torch.device | None = None) -> nn.Module:
    """Rebuild a model saved with ``save_pretrained`` (weights loaded bit-exactly, eval mode)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a directory")
    config, checksum = _read_config(directory)
    model = model_class_for(config.arch)(config)
    load_weights(model, directory / WEIGHTS_NAME, checksum)
    if device is not None:
        model = model.to(device)
    return model.eval()
