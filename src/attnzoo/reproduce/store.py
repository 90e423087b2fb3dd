"""Resumable units of work: each :class:`Step` stores its result atomically as ``DIR/steps/<id>.json``.

A step is skipped when its JSON exists and was computed from the same config (a hash of the config
is stored beside the result); an interrupted run therefore continues with the first unfinished step.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from attnzoo._io import to_jsonable, write_json

__all__ = ["Step", "StepStore", "config_hash", "Interrupted"]


class Interrupted(Exception):
    """A step was stopped by SIGINT/SIGTERM (its partial state is checkpointed where the step supports it)."""


def config_hash(config: dict) -> str:
    """Stable short hash of a JSON-able config."""
    text = json.dumps(to_jsonable(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class Step:
    """One training run or one measurement.

    ``fn(ctx, config) -> dict`` computes the result; ``config`` (JSON-able) fully defines it, so its
    hash decides whether a stored result can be reused. ``deps`` are ids of steps whose outputs
    (e.g. trained checkpoints) this step reads; they run first.
    """

    id: str
    section: str
    config: dict
    fn: Callable[[Any, dict], dict]
    deps: tuple[str, ...] = field(default_factory=tuple)
    label: str = ""

    @property
    def hash(self) -> str:
        return config_hash(self.config)


class StepStore:
    """Results of steps under ``root/steps``; ``root/runs/<id>`` is each step's scratch directory."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)

    def path(self, step_id: str) -> Path:
        return self.root / "steps" / f"{step_id}.json"

    def run_dir(self, step_id: str) -> Path:
        return self.root / "runs" / step_id

    def load(self, step: Step) -> dict | None:
        """The stored record of ``step`` if it was computed from the same config, else ``None``."""
        p = self.path(step.id)
        if not p.is_file():
            return None
        try:
            rec = json.loads(p.read_bytes().decode("utf-8"))
        except (OSError, ValueError):
            return None  # a torn file cannot happen with atomic writes, but never trust it
        if rec.get("config_hash") != step.hash:
            return None
        return rec

    def load_by_id(self, step_id: str) -> dict | None:
        """The stored record of step ``step_id`` whatever its config (for steps that read a dependency)."""
        p = self.path(step_id)
        if not p.is_file():
            return None
        try:
            return json.loads(p.read_bytes().decode("utf-8"))
        except ValueError as e:  # JSONDecodeError / UnicodeDecodeError
            raise ValueError(
                f"stored step result {p} is corrupt ({' '.join(str(e).split())}); delete it so that "
                f"step {step_id!r} is computed again"
            ) from e

    def save(self, step: Step, result: dict, wall_s: float, started: float) -> dict:
        rec = {
            "id": step.id,
            "section": step.section,
            "label": step.label,
            "config": to_jsonable(step.config),
            "config_hash": step.hash,
            "result": to_jsonable(result),
            "wall_s": round(wall_s, 3),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        write_json(self.path(step.id), rec)
        return rec
