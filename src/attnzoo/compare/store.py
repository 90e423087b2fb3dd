"""Resumable units of work: each :class:`Step` stores its result atomically as ``DIR/steps/<id>.json``, reused
while its config hash is unchanged; a record, or a run file it was computed from (``runs/<id>/final.json``), that
no longer matches its stored SHA-256 is computed again, with a notice, never reported."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from attnzoo._io import to_jsonable, write_error, write_json

__all__ = ["Step", "StepStore", "config_hash", "Interrupted", "read_object"]


class Interrupted(Exception):
    """A step was stopped by SIGINT/SIGTERM (its partial state is checkpointed where the step supports it)."""


def _json_hash(value: Any) -> str:
    """SHA-256 of ``value``'s canonical JSON (floats keep every digit)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _content_hash(rec: dict) -> str:
    """The SHA-256 of a record, its own ``sha256`` field left out."""
    return _json_hash({k: v for k, v in rec.items() if k != "sha256"})


def config_hash(config: dict) -> str:
    """Stable short hash of a JSON-able config."""
    return _json_hash(to_jsonable(config))[:16]


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())


def _notice(msg: str) -> None:
    print(f"attnzoo: {msg}", file=sys.stderr)


def read_object(path: Path) -> dict:
    """The JSON object in ``path`` (a ``ValueError`` when it holds something else)."""
    value = json.loads(path.read_bytes().decode("utf-8"))
    if not isinstance(value, dict):
        raise ValueError(f"a JSON object was expected, got {type(value).__name__}")
    return value


@dataclass
class Step:
    """One training run or one measurement: ``fn(ctx, step) -> dict`` computes the result that ``config`` (JSON-able)
    fully defines; ``deps``: ids of steps whose outputs it reads (they run first); ``timed``: a wall-clock
    measurement, which under ``--jobs N`` runs with no other step in flight."""

    id: str
    section: str
    config: dict
    fn: Callable[[Any, dict], dict]
    deps: tuple[str, ...] = field(default_factory=tuple)
    label: str = ""
    timed: bool = False

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
        """The stored record of ``step`` if it was computed from the same config and is intact, else ``None`` (a
        damaged one with a notice: the step is computed again)."""
        p = self.path(step.id)
        if not p.is_file():
            return None
        try:
            rec = read_object(p)
        except (OSError, ValueError) as e:
            _notice(f"{p} is unreadable ({_one_line(e)[:200]}); step {step.id} is computed again")
            return None
        if rec.get("config_hash") != step.hash:
            return None
        if why := self._damage(rec):
            _notice(f"{why}; step {step.id} is computed again instead of reported")
            return None
        return rec

    def _damage(self, rec: dict) -> str | None:
        """What in a stored record (or the run files it lists) changed since it was written, or ``None``."""
        p = self.path(str(rec.get("id")))
        if "sha256" not in rec:
            return None  # written before checksums existed: nothing to compare with
        if rec["sha256"] != _content_hash(rec):
            return f"{p} does not match its SHA-256 (it changed after it was written)"
        for rel, digest in (rec.get("files") or {}).items():
            f = self.root / rel
            if not isinstance(rel, str) or ".." in Path(rel).parts or Path(rel).is_absolute():
                return f"{p} lists a run file outside {self.root} ({rel!r})"
            try:
                same = hashlib.sha256(f.read_bytes()).hexdigest() == digest
            except OSError:
                return f"{f}, which {p} was computed from, is missing or unreadable"
            if not same:
                if f.name == "final.json":
                    f.unlink(missing_ok=True)  # the run's last checkpoint rewrites it when the step is redone
                return f"{f} does not match the SHA-256 recorded in {p} (deleted)"
        return None

    def load_by_id(self, step_id: str) -> dict | None:
        """The stored record of step ``step_id`` whatever its config (for steps that read a dependency)."""
        p = self.path(step_id)
        if not p.is_file():
            return None
        again = f"delete it so that step {step_id!r} is computed again"
        try:
            rec = read_object(p)
        except ValueError as e:  # JSONDecodeError / UnicodeDecodeError, or no JSON object
            raise ValueError(f"stored step result {p} is corrupt ({_one_line(e)}); {again}") from e
        if why := self._damage(rec):
            raise ValueError(f"stored step result {p} is damaged: {why}; {again}")
        return rec

    def save(
        self,
        step: Step,
        result: dict,
        wall_s: float,
        started: float,
        imported_from: str | None = None,
        slimmed: list[str] | None = None,
    ) -> dict:
        """Store ``result`` of ``step`` with the SHA-256 of the record and of its run's ``final.json``;
        ``imported_from``: the run it was taken from (``--reuse``); ``slimmed``: the plot arrays it lacks (a
        computing run redoes the step)."""
        final = f"runs/{step.id}/final.json"
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
            **({"imported_from": imported_from} if imported_from else {}),
            **({"result_slimmed": list(slimmed)} if slimmed else {}),
        }
        if (self.root / final).is_file():
            rec["files"] = {final: hashlib.sha256((self.root / final).read_bytes()).hexdigest()}
        # the hash of what a reader gets back: the record as JSON text, read again
        rec = json.loads(json.dumps(to_jsonable(rec)))
        rec["sha256"] = _content_hash(rec)
        try:
            write_json(self.path(step.id), rec)
        except OSError as e:
            raise write_error(f"the result of step {step.id}", self.path(step.id), e) from None
        return rec

    def clean_leftovers(self) -> list[Path]:
        """Delete what killed or failed atomic writes left (``.NAME.<random>.tmp``) under ``steps/``, ``runs/`` and
        beside the reports; the caller holds the directory's lock."""
        tmp = r"\..+\.[^.]+\.tmp"
        top = r"\.(report\.md|report\.html|results\.json|run\.json)\.[^.]+\.tmp"
        gone = [p for d in ("steps", "runs") for p in (self.root / d).rglob(".*.tmp") if re.fullmatch(tmp, p.name)]
        gone += [p for p in self.root.glob(".*.tmp") if re.fullmatch(top, p.name)]
        gone = [p for p in gone if p.is_file()]
        for p in gone:
            p.unlink(missing_ok=True)
        return gone
