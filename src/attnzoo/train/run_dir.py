"""A training run's directory: which runs may be resumed or overwritten, what a run writes there, its saved config.

A run directory holds the marker file :data:`RUN_MARKER`, ``config.yaml``, ``task.json`` (``vocab.json`` for
character-level tasks), ``metrics.csv``, ``final.json``, ``checkpoints/``, ``model/``, ``best_model/`` and ``tb/``.
Anything else in it is the user's: attnzoo never deletes it.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Callable, Literal

import yaml

from attnzoo._io import atomic_write_text
from attnzoo._lock import LOCK_NAME
from attnzoo.data.tasks import Task
from attnzoo.train.config import RESUME_MUTABLE_KEYS, ConfigError, TrainConfig, from_dict, read_yaml

__all__ = [
    "RUN_MARKER",
    "RunMode",
    "run_dir_mode",
    "foreign_run_files",
    "remove_run_files",
    "write_run_files",
    "load_run",
    "check_resume_config",
    "clean_leftovers",
]

#: file that marks a directory as an attnzoo run (only such directories may be resumed or overwritten)
RUN_MARKER = ".attnzoo-run"

RunMode = Literal["fresh", "resume", "overwrite"]


def run_dir_mode(out: Path, resume: bool, overwrite: bool) -> RunMode:
    """Decide what ``train`` does with ``out``: start ``"fresh"``, ``"resume"`` or ``"overwrite"``; refuses to
    clobber anything silently.

    - missing or empty: a fresh run (``--resume`` too, so one command serves first launch and restarts);
    - an attnzoo run directory: needs ``--resume`` (continue) or ``--overwrite`` (delete the run's own files
      and start again; refused, with the list, when the directory also holds files attnzoo did not write);
    - any other non-empty directory: an error, whatever the flags (attnzoo never deletes foreign files).
    """
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite contradict each other; pass one")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} exists and is not a directory")
    if not out.exists() or not any(p.name != LOCK_NAME for p in out.iterdir()):
        return "fresh"
    is_run = (out / RUN_MARKER).is_file()
    if not is_run:
        raise ConfigError(
            f"--out {out} is a non-empty directory that is not an attnzoo run; refusing to write "
            f"into it. Choose another --out."
        )
    if resume:
        if not (out / "config.yaml").is_file():
            raise ConfigError(f"{out} has no config.yaml to resume from")
        return "resume"
    if overwrite:
        foreign = foreign_run_files(out)
        if foreign:
            shown = ", ".join(foreign[:20]) + (f" ... ({len(foreign)} in all)" if len(foreign) > 20 else "")
            raise ConfigError(
                f"--out {out} also holds files attnzoo did not write: {shown}. --overwrite deletes only "
                f"a run's own files: move or delete these first, or choose another --out"
            )
        return "overwrite"
    raise ConfigError(
        f"--out {out} already holds a run; pass --resume to continue it or --overwrite to delete it and start again"
    )


# What ``train`` writes into a run directory; everything else there is the user's and is never deleted.
# (``metrics.csv.tmp``: the temporary of older versions, which rewrote metrics.csv through it.)
_RUN_FILES = {
    RUN_MARKER,
    LOCK_NAME,
    "config.yaml",
    "task.json",
    "vocab.json",
    "metrics.csv",
    "metrics.csv.tmp",
    "final.json",
}
_CKPT_FILES = re.compile(r"(model|best_model|optimizer|rng_rank[0-9]+)\.safetensors|state\.json|manifest\.json")
_STEP_DIR = re.compile(r"(\.tmp_|\.del_)?step_[0-9]{8,}")
_MODEL_FILES = {"config.json", "model.safetensors"}
#: the final weights, and the best-selected ones (``select_every``)
_MODEL_DIRS = ("model", "best_model")


def _is_temp_of(name: str, names: set[str] | re.Pattern) -> bool:
    """``.<name>.<random>.tmp`` / ``.bak``: the temporaries of atomic writes (left behind by a kill)."""
    m = re.fullmatch(r"\.(.+)\.[^.]+\.(tmp|bak)", name)
    if m is None:
        return False
    return m.group(1) in names if isinstance(names, set) else bool(names.fullmatch(m.group(1)))


def foreign_run_files(out: Path) -> list[str]:
    """Paths (relative to ``out``) in a run directory that ``attnzoo train`` did not write (links included)."""
    out = Path(out)
    foreign: list[str] = []

    def scan(d: Path, ok: Callable[[Path], bool]) -> None:
        for p in sorted(d.iterdir()):
            if p.is_symlink() or not ok(p):
                foreign.append(str(p.relative_to(out)))

    def step_dir(p: Path) -> bool:
        if not p.is_dir():
            return False
        scan(
            p, lambda f: f.is_file() and (_CKPT_FILES.fullmatch(f.name) is not None or _is_temp_of(f.name, _CKPT_FILES))
        )
        return True

    def top(p: Path) -> bool:
        if p.name in _RUN_FILES or _is_temp_of(p.name, _RUN_FILES):
            return p.is_file()
        if not p.is_dir() or p.is_symlink():
            return False
        if p.name == "checkpoints":
            scan(
                p,
                lambda c: (
                    (c.name == "latest" and c.is_file())
                    or _is_temp_of(c.name, {"latest"})
                    or (_STEP_DIR.fullmatch(c.name) is not None and step_dir(c))
                ),
            )
        elif p.name in _MODEL_DIRS:
            scan(p, lambda f: f.is_file() and (f.name in _MODEL_FILES or _is_temp_of(f.name, _MODEL_FILES)))
        elif p.name == "tb":  # TensorBoard's event files
            scan(p, lambda f: f.is_file() and f.name.startswith("events.out.tfevents."))
        else:
            return False
        return True

    scan(out, top)
    return foreign


def remove_run_files(out: Path) -> None:
    """Delete what a previous run wrote into ``out`` (checked by :func:`foreign_run_files` beforehand)."""
    foreign = set(foreign_run_files(out))
    if foreign:  # appeared since the check: still never delete them
        raise ConfigError(f"--out {out}: files attnzoo did not write appeared: {sorted(foreign)[:20]}; not overwriting")
    for p in out.iterdir():
        if p.name == LOCK_NAME:  # held by this process: deleting it would let another process lock a new one
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def _is_tmp(name: str, names: set[str] | re.Pattern) -> bool:
    return name.endswith(".tmp") and _is_temp_of(name, names)


def _partial_checkpoint(d: Path) -> bool:
    """A ``step_*`` directory that is no complete checkpoint: no ``state.json``, or a file its manifest lists is
    gone (a deletion of an old checkpoint that was cut short). Files are not hashed here: loading does that."""
    if not (d / "state.json").is_file():
        return True
    try:
        listed = json.loads((d / "manifest.json").read_bytes().decode("utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return False  # no manifest (older checkpoints) or a damaged one: loading reports it by name
    return isinstance(listed, dict) and not all((d / str(n)).is_file() for n in listed)


def clean_leftovers(out: Path) -> list[str]:
    """Delete what faults and kills leave behind in run ``out`` and return the paths removed (relative to ``out``).

    Temporaries of atomic writes (``.NAME.*.tmp``), checkpoint directories being written (``.tmp_step_N``) or
    deleted (``.del_step_N``), and partial ``step_*`` directories other than the one ``checkpoints/latest`` names.
    Only files attnzoo writes are touched; the caller holds the run's lock, so none of them is in use.
    """
    out = Path(out)
    removed: list[Path] = []
    if not out.is_dir():
        return []
    removed += [p for p in out.iterdir() if p.is_file() and _is_tmp(p.name, _RUN_FILES)]
    for model in (out / name for name in _MODEL_DIRS):
        if model.is_dir() and not model.is_symlink():
            removed += [p for p in model.iterdir() if p.is_file() and _is_tmp(p.name, _MODEL_FILES)]
    ckpts = out / "checkpoints"
    if ckpts.is_dir() and not ckpts.is_symlink():
        try:
            latest = (ckpts / "latest").read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            latest = ""
        for c in sorted(ckpts.iterdir()):
            if c.is_symlink():
                continue
            if c.is_file() and _is_tmp(c.name, {"latest"}):
                removed.append(c)
            elif c.is_dir() and _STEP_DIR.fullmatch(c.name):
                if c.name.startswith((".tmp_", ".del_")) or (c.name != latest and _partial_checkpoint(c)):
                    removed.append(c)
                else:
                    removed += [f for f in c.iterdir() if f.is_file() and _is_tmp(f.name, _CKPT_FILES)]
    for p in removed:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return [str(p.relative_to(out)) for p in removed]


def write_run_files(out: Path, cfg: TrainConfig, task: Task, *, overwrite: bool) -> None:
    """Mark ``out`` as a run and save what resuming, ``attnzoo eval`` and ``attnzoo generate`` read back: the config,
    the task's description and (character-level tasks) the vocabulary. Main process only."""
    if overwrite:
        remove_run_files(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / RUN_MARKER, "attnzoo training run\n")
    atomic_write_text(out / "config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    task_json = {"task": task.name, "kind": task.kind, "info": task.info, "options": task.options}
    # default=str: a task's description is for people; an odd option value is kept as its text
    atomic_write_text(out / "task.json", json.dumps(task_json, indent=1, default=str))
    if task.vocab is not None:
        atomic_write_text(out / "vocab.json", task.vocab.to_json())


def load_run(out: Path) -> TrainConfig:
    """The config saved in a run directory."""
    f = Path(out) / "config.yaml"
    if not f.is_file():
        raise ConfigError(f"{out} is not an attnzoo run directory (no config.yaml)")
    return from_dict(read_yaml(f) or {})  # read_yaml: UTF-8, no duplicated keys, errors name the file


def check_resume_config(saved: TrainConfig, given: TrainConfig | None) -> TrainConfig:
    """The config a resumed run continues with: ``given`` if it differs from the saved one only in
    :data:`RESUME_MUTABLE_KEYS`, else a :class:`ConfigError` listing the differences."""
    if given is None:
        return saved
    a, b = saved.to_dict(), given.to_dict()
    diff = [k for k in a if a[k] != b[k] and k not in RESUME_MUTABLE_KEYS]
    if diff:
        changes = ", ".join(f"{k}: {a[k]!r} -> {b[k]!r}" for k in diff)
        raise ConfigError(
            f"resuming with a different config would not continue the same run: {changes}. "
            f"Only {list(RESUME_MUTABLE_KEYS)} may change on resume (or give no config: the saved one is used)."
        )
    return given
