"""Atomic, pickle-free training checkpoints.

A checkpoint is a directory ``checkpoints/step_00000100/`` holding

- ``model.safetensors``: the weights (``safetensors.torch.save_model``, so tied weights are fine);
- ``optimizer.safetensors``: every tensor of the optimizer state, keyed ``"<param index>.<name>"``;
- ``rng_rank<r>.safetensors``: each process's torch RNG states (CPU and CUDA);
- ``state.json``: step, optimizer hyper-parameters and non-tensor state, loss-scaler state, run info;
- ``manifest.json``: size and SHA-256 of every other file, written last.

It is written into a hidden temporary directory and renamed into place, then ``checkpoints/latest``
is replaced atomically; so an interrupted write never leaves a half checkpoint that looks valid.
Loads check the manifest first, so a flipped byte or a truncated file is reported by name instead of
training (or evaluating) on damaged numbers. ``latest`` may only name a ``step_*`` directory inside the
run's ``checkpoints`` directory. Nothing is ever unpickled.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from attnzoo._io import atomic_write_text, fsync_dir, to_jsonable, write_error, write_json
from attnzoo.models.checkpoint import CheckpointError
from attnzoo.train.distributed import SINGLE_PROCESS, DistInfo, barrier

__all__ = [
    "save_checkpoint",
    "load_checkpoint",
    "latest_checkpoint",
    "list_checkpoints",
    "verify_checkpoint",
    "CheckpointError",
    "unwrap_model",
    "atomic_write_text",
    "MANIFEST_NAME",
]

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
#: the only names ``checkpoints/latest`` may hold (what :func:`save_checkpoint` writes)
_STEP_NAME = re.compile(r"step_[0-9]{8,}")
_warned_unverified: set[str] = set()


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain module inside DDP and/or ``torch.compile`` wrappers."""
    while True:
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def _json_value(v: Any) -> Any:
    """A non-tensor optimizer or loss-scaler state value for ``state.json`` (e.g. ``betas``: tuple -> list)."""
    if isinstance(v, torch.Tensor):
        raise TypeError("tensors go to safetensors, not JSON")
    return to_jsonable(v, nonfinite="keep")


def _split_optimizer_state(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    sd = opt.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, st in sd["state"].items():
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                tensors[f"{idx}.{k}"] = v.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(idx), {})[k] = _json_value(v)
    groups = [{k: _json_value(v) for k, v in g.items()} for g in sd["param_groups"]]
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


def _inside(root: Path, p: Path) -> bool:
    """Whether ``p`` (symlinks followed) is a direct child of ``root``: no escape through ``..`` or links."""
    try:
        return p.resolve().parent == root.resolve()
    except OSError:
        return False


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first (links that lead out of ``root`` are ignored)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(
        p
        for p in root.iterdir()
        if _STEP_NAME.fullmatch(p.name) and p.is_dir() and _inside(root, p) and (p / "state.json").is_file()
    )


def latest_checkpoint(root: Path) -> Path | None:
    """The checkpoint ``root/latest`` names (or the newest complete one), or ``None``.

    ``latest`` must hold the name of a ``step_*`` directory of ``root`` itself; anything else (a path, ``..``,
    a link leading elsewhere) is refused with :class:`CheckpointError`, so a run never loads another run's or
    an arbitrary directory's files.
    """
    root = Path(root)
    pointer = root / "latest"
    if pointer.is_file():
        try:
            name = pointer.read_bytes().decode("utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{pointer}: unreadable ({e}); delete it to use the newest checkpoint") from None
        if not _STEP_NAME.fullmatch(name):
            raise CheckpointError(
                f"{pointer} names {name[:200]!r}, which is not a checkpoint of this run: it may only hold the name "
                f"of a step_NNNNNNNN directory inside {root}. Fix or delete {pointer} (then the newest checkpoint "
                "is used)"
            )
        p = root / name
        if p.exists() and not _inside(root, p):
            raise CheckpointError(
                f"{p} leads outside {root} (a symbolic link to {p.resolve()}); refusing to load a checkpoint "
                "from outside the run"
            )
        if (p / "state.json").is_file():
            return p
    elif pointer.is_symlink() or pointer.exists():
        raise CheckpointError(f"{pointer} is not a regular file; delete it to use the newest checkpoint")
    ckpts = list_checkpoints(root)
    return ckpts[-1] if ckpts else None


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _write_manifest(directory: Path) -> None:
    files = {
        p.name: {"size": p.stat().st_size, "sha256": _sha256_file(p)}
        for p in sorted(directory.iterdir())
        if p.is_file() and p.name != MANIFEST_NAME
    }
    write_json(
        directory / MANIFEST_NAME, {"format": FORMAT_VERSION, "algorithm": "sha256", "files": files}, newline=False
    )


def verify_checkpoint(path: Path) -> bool:
    """Check every file of checkpoint ``path`` against its ``manifest.json``.

    Returns ``True`` when all files match, ``False`` (after warning once) for a checkpoint written before
    manifests existed; raises :class:`CheckpointError` naming the first missing, truncated or altered file.
    """
    path = Path(path)
    mpath = path / MANIFEST_NAME
    if not mpath.is_file():
        key = str(path.resolve())
        if key not in _warned_unverified:
            _warned_unverified.add(key)
            warnings.warn(
                f"{path} has no {MANIFEST_NAME} (written by an older attnzoo): its files cannot be "
                "verified against checksums; loading them unverified",
                RuntimeWarning,
                stacklevel=3,
            )
        return False
    try:
        manifest = json.loads(mpath.read_bytes().decode("utf-8"))
        files = manifest["files"]
        entries = [(str(n), int(e["size"]), str(e["sha256"])) for n, e in files.items()]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(
            f"{mpath}: corrupt manifest ({type(e).__name__}: {e}); the checkpoint cannot be verified"
        ) from None
    for name, size, digest in entries:
        f = path / name
        if "/" in name or "\\" in name or name in ("", ".", ".."):
            raise CheckpointError(f"{mpath}: corrupt manifest (file name {name!r})")
        if not f.is_file():
            raise CheckpointError(f"{f}: missing (listed in {MANIFEST_NAME}); the checkpoint is incomplete")
        actual = f.stat().st_size
        if actual != size:
            raise CheckpointError(
                f"{f}: corrupt ({'truncated' if actual < size else 'grown'} to {actual} bytes, "
                f"written as {size}); use another checkpoint"
            )
        if _sha256_file(f) != digest:
            raise CheckpointError(
                f"{f}: corrupt (SHA-256 differs from {MANIFEST_NAME}: the file changed after it "
                "was written); use another checkpoint"
            )
    return True


def save_checkpoint(
    root: Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    extra: dict[str, Any],
    info: DistInfo = SINGLE_PROCESS,
    keep: int = 2,
    scaler: torch.amp.GradScaler | None = None,
    tensors: dict[str, dict[str, torch.Tensor]] | None = None,
) -> Path:
    """Write the checkpoint of ``step`` atomically (collective: every process must call it).

    ``tensors``: further tensor files of the main process, ``{name: state}`` -> ``<name>.safetensors`` (e.g. the
    best-selected weights, ``best_model``), covered by the manifest like the rest.

    A failed write (e.g. a full disk) raises a :class:`~attnzoo._io.WriteError` naming the step and the file; the
    previous checkpoints and ``latest`` stay as they were, and the half-written ``.tmp_step_N`` is removed.
    """
    try:
        return _save_checkpoint(root, step, model, optimizer, extra, info, keep, scaler, tensors or {})
    except (OSError, SafetensorError) as e:  # safetensors reports a full disk as its own "I/O error"
        tmp = Path(root) / f".tmp_step_{step:08d}"
        if info.is_main and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        path = getattr(e, "filename", None) or _step_dir(Path(root), step)
        raise write_error(f"checkpoint step {step}", path, e) from None


def _save_checkpoint(
    root: Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    extra: dict[str, Any],
    info: DistInfo,
    keep: int,
    scaler: torch.amp.GradScaler | None,
    tensors: dict[str, dict[str, torch.Tensor]],
) -> Path:
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
        for name, state_tensors in tensors.items():
            save_file(state_tensors, str(tmp / f"{name}.safetensors"))
        state = {
            "format": FORMAT_VERSION,
            "step": step,
            "world_size": info.world_size,
            "optimizer": opt_meta,
            "scaler": {k: _json_value(v) for k, v in scaler.state_dict().items()} if scaler is not None else None,
            **extra,
        }
        write_json(tmp / "state.json", state, nonfinite="keep", newline=False)
        _write_manifest(tmp)  # last: covers every rank's files too (they were written before the barrier)
        fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_dir(root)
        atomic_write_text(root / "latest", final.name + "\n")
        for old in list_checkpoints(root)[:-keep] if keep > 0 else []:
            if old != final:
                _delete_checkpoint(old)
    barrier(info)
    return final


def _delete_checkpoint(path: Path) -> None:
    """Rename ``step_N`` to ``.del_step_N`` (atomic), then delete it: a deletion cut short leaves no ``step_*``
    directory that looks like a checkpoint, and the next start removes the ``.del_*`` rest."""
    gone = path.with_name(f".del_{path.name}")
    try:
        os.replace(path, gone)
    except OSError:
        return  # kept; the next save tries again
    shutil.rmtree(gone, ignore_errors=True)


def _check_model_shapes(file: Path, model: nn.Module) -> None:
    """Name the first tensor whose shape differs between ``file`` and ``model`` (e.g. an edited ``dim``)."""
    try:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as e:  # noqa: BLE001 - safetensors raises its own types for bad headers / truncation
        raise CheckpointError(f"{file}: corrupt or truncated ({type(e).__name__}: {e})") from None
    own = model.state_dict()
    for k in sorted(set(shapes) & set(own)):
        if shapes[k] != tuple(own[k].shape):
            raise CheckpointError(
                f"{file}: tensor {k!r} has shape {shapes[k]} but the model built from the run's config has "
                f"{tuple(own[k].shape)}; the config (model size options) no longer matches this checkpoint"
            )


def _read_state(path: Path) -> dict[str, Any]:
    state_file = path / "state.json"
    try:
        state = json.loads(state_file.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{state_file}: corrupt ({type(e).__name__}: {e})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{state_file}: corrupt (expected a JSON object, got {type(state).__name__})")
    if state.get("format") != FORMAT_VERSION:
        raise CheckpointError(
            f"{state_file}: checkpoint format {state.get('format')!r}, this attnzoo reads {FORMAT_VERSION}"
        )
    for key, lo in (("step", 0), ("world_size", 1)):
        v = state.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise CheckpointError(f"{state_file}: corrupt ({key!r} is {v!r}, expected an integer >= {lo})")
    return state


def load_checkpoint(
    path: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    info: DistInfo = SINGLE_PROCESS,
    scaler: torch.amp.GradScaler | None = None,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Restore weights (and optimizer, loss scaler, this process's RNG) from ``path``; returns ``state.json``.

    The files are verified against ``manifest.json`` first (see :func:`verify_checkpoint`); every problem is a
    :class:`CheckpointError` naming the file.
    """
    path = Path(path)
    state_file = path / "state.json"
    if not state_file.is_file():
        raise CheckpointError(f"{path} is not a complete checkpoint (no state.json)")
    verify_checkpoint(path)
    state = _read_state(path)
    base = unwrap_model(model)
    model_file = path / "model.safetensors"
    if not model_file.is_file():
        raise CheckpointError(f"{model_file}: missing")
    _check_model_shapes(model_file, base)
    try:
        missing, unexpected = load_model(base, str(model_file), strict=False)
    except Exception as e:  # noqa: BLE001 - dtype mismatch, damaged data, ...
        raise CheckpointError(f"{model_file} does not fit the model: {e}") from e
    if missing or unexpected:
        raise CheckpointError(
            f"{model_file} does not fit the model: missing {sorted(missing)[:8]}, unexpected {sorted(unexpected)[:8]}"
        )
    if optimizer is not None:
        opt_file = path / "optimizer.safetensors"
        try:
            tensors = load_file(str(opt_file))
        except Exception as e:  # noqa: BLE001 - missing, truncated, bad header
            raise CheckpointError(f"{opt_file}: corrupt, truncated or missing ({type(e).__name__}: {e})") from None
        try:
            sd = _merge_optimizer_state(tensors, state["optimizer"])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise CheckpointError(f"{state_file}: corrupt optimizer section ({type(e).__name__}: {e})") from None
        params = [p for g in optimizer.param_groups for p in g["params"]]
        for idx, st in sd["state"].items():
            for name, t in st.items():
                if (
                    isinstance(t, torch.Tensor)
                    and t.dim() > 0
                    and 0 <= idx < len(params)
                    and t.shape != params[idx].shape
                ):
                    raise CheckpointError(
                        f"{opt_file}: {idx}.{name} has shape {tuple(t.shape)}, parameter {idx} "
                        f"has {tuple(params[idx].shape)}; the optimizer state does not fit"
                    )
        try:
            optimizer.load_state_dict(sd)
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{path}: optimizer state does not fit: {e}") from e
    if scaler is not None and state.get("scaler"):
        try:
            scaler.load_state_dict(state["scaler"])
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"{state_file}: corrupt loss-scaler section ({e})") from None
    if restore_rng:
        rng_file = path / f"rng_rank{info.rank}.safetensors"
        if rng_file.is_file():
            try:
                rng = load_file(str(rng_file))
                torch.set_rng_state(rng["cpu"])
                cuda = [rng[k] for k in sorted(rng) if k.startswith("cuda")]
                if cuda and torch.cuda.is_available():
                    torch.cuda.set_rng_state_all(cuda[: torch.cuda.device_count()])
            except Exception as e:  # noqa: BLE001 - truncated file, wrong tensor
                raise CheckpointError(f"{rng_file}: corrupt ({type(e).__name__}: {e})") from None
    return state
