"""Atomic, pickle-free training checkpoints.

A checkpoint is a directory ``checkpoints/step_00000100/`` holding

- ``model.safetensors``: the weights (``safetensors.torch.save_model``, so tied weights are fine);
- ``optimizer.safetensors``: every tensor of the optimizer state, keyed ``"<param index>.<name>"``;
- ``rng_rank<r>.safetensors``: each process's torch RNG states (CPU and CUDA);
- ``state.json``: step, optimizer hyper-parameters and non-tensor state, loss-scaler state, run info.

It is written into a hidden temporary directory and renamed into place, then ``checkpoints/latest``
is replaced atomically; so an interrupted write never leaves a half checkpoint that looks valid.
Nothing is ever unpickled.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from attnzoo._io import atomic_write_text
from attnzoo.train.distributed import DistInfo, barrier

__all__ = ["save_checkpoint", "load_checkpoint", "latest_checkpoint", "list_checkpoints", "CheckpointError",
           "unwrap_model", "atomic_write_text"]

FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or does not match the model/optimizer."""


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain module inside DDP and/or ``torch.compile`` wrappers."""
    while True:
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def _fsync_dir(path: Path) -> None:
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


def _jsonable(v: Any) -> Any:
    if isinstance(v, tuple):
        return list(v)
    if isinstance(v, torch.Tensor):
        raise TypeError("tensors go to safetensors, not JSON")
    return v


def _split_optimizer_state(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    sd = opt.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, st in sd["state"].items():
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                tensors[f"{idx}.{k}"] = v.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(idx), {})[k] = _jsonable(v)
    groups = [{k: _jsonable(v) for k, v in g.items()} for g in sd["param_groups"]]
    return tensors, {"param_groups": groups, "scalars": scalars}


def _merge_optimizer_state(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for key, t in tensors.items():
        idx, _, name = key.partition(".")
        state.setdefault(int(idx), {})[name] = t
    for idx, d in meta["scalars"].items():
        state.setdefault(int(idx), {}).update(d)
    groups = []
    for g in meta["param_groups"]:
        g = dict(g)
        if "betas" in g and isinstance(g["betas"], list):
            g["betas"] = tuple(g["betas"])
        groups.append(g)
    return {"state": state, "param_groups": groups}


def _rng_tensors() -> dict[str, torch.Tensor]:
    out = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            out[f"cuda{i}"] = s
    return out


def _step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_") and (p / "state.json").is_file())


def latest_checkpoint(root: Path) -> Path | None:
    """The checkpoint ``root/latest`` names (or the newest complete one), or ``None``."""
    root = Path(root)
    pointer = root / "latest"
    if pointer.is_file():
        p = root / pointer.read_text().strip()
        if (p / "state.json").is_file():
            return p
    ckpts = list_checkpoints(root)
    return ckpts[-1] if ckpts else None


def save_checkpoint(root: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                    extra: dict[str, Any], info: DistInfo = DistInfo(), keep: int = 2,
                    scaler: torch.amp.GradScaler | None = None) -> Path:
    """Write the checkpoint of ``step`` atomically (collective: every process must call it)."""
    root = Path(root)
    final = _step_dir(root, step)
    tmp = root / f".tmp_step_{step:08d}"
    if info.is_main:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    barrier(info)
    save_file(_rng_tensors(), str(tmp / f"rng_rank{info.rank}.safetensors"))
    barrier(info)
    if info.is_main:
        save_model(unwrap_model(model), str(tmp / "model.safetensors"))
        opt_tensors, opt_meta = _split_optimizer_state(optimizer)
        save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
        state = {
            "format": FORMAT_VERSION,
            "step": step,
            "world_size": info.world_size,
            "optimizer": opt_meta,
            "scaler": {k: _jsonable(v) for k, v in scaler.state_dict().items()} if scaler is not None else None,
            **extra,
        }
        atomic_write_text(tmp / "state.json", json.dumps(state, indent=1))
        _fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
        atomic_write_text(root / "latest", final.name + "\n")
        for old in list_checkpoints(root)[:-keep] if keep > 0 else []:
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
    barrier(info)
    return final


def load_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    info: DistInfo = DistInfo(), scaler: torch.amp.GradScaler | None = None,
                    restore_rng: bool = True) -> dict[str, Any]:
    """Restore weights (and optimizer, loss scaler, this process's RNG) from ``path``; returns ``state.json``."""
    path = Path(path)
    state_file = path / "state.json"
    if not state_file.is_file():
        raise CheckpointError(f"{path} is not a complete checkpoint (no state.json)")
    state = json.loads(state_file.read_text())
    if state.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format {state.get('format')!r}, this attnzoo reads {FORMAT_VERSION}")
    try:
        missing, unexpected = load_model(unwrap_model(model), str(path / "model.safetensors"), strict=False)
    except Exception as e:  # shape mismatch etc.
        raise CheckpointError(f"{path}/model.safetensors does not fit the model: {e}") from e
    if missing or unexpected:
        raise CheckpointError(f"{path}/model.safetensors does not fit the model: missing {sorted(missing)[:8]}, "
                              f"unexpected {sorted(unexpected)[:8]}")
    if optimizer is not None:
        tensors = load_file(str(path / "optimizer.safetensors"))
        sd = _merge_optimizer_state(tensors, state["optimizer"])
        try:
            optimizer.load_state_dict(sd)
        except (ValueError, KeyError) as e:
            raise CheckpointError(f"{path}: optimizer state does not fit: {e}") from e
    if scaler is not None and state.get("scaler"):
        scaler.load_state_dict(state["scaler"])
    if restore_rng:
        rng_file = path / f"rng_rank{info.rank}.safetensors"
        if rng_file.is_file():
            rng = load_file(str(rng_file))
            torch.set_rng_state(rng["cpu"])
            cuda = [rng[k] for k in sorted(rng) if k.startswith("cuda")]
            if cuda and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(cuda[: torch.cuda.device_count()])
    return state
