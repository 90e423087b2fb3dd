"""Run a comparison into its directory: one writer (the directory's lock), resumable steps, outputs all or nothing.

The directory holds :data:`MARKER` (what kind of run owns it), ``steps/<id>.json`` (each finished run's record,
with the hash of its config: a rerun skips it), ``runs/<id>/`` (each run's training directory, resumed from its
checkpoint when a run was stopped midway) and the outputs (:data:`~attnzoo.compare.render.OUTPUT_FILES`).
"""

from __future__ import annotations

import re
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from attnzoo._io import ReadError, all_or_nothing, read_json, write_json
from attnzoo._lock import LOCK_NAME, DirLock
from attnzoo.compare.common import Context
from attnzoo.compare.plan import CompareError, CompareSpec, plan_steps
from attnzoo.compare.render import OUTPUT_FILES, write_outputs
from attnzoo.compare.runner import execute_steps
from attnzoo.compare.store import StepStore
from attnzoo.compare.summary import summarise

__all__ = ["MARKER", "CompareOutcome", "run"]

#: identifies a compare directory (written when it is created)
MARKER = "compare_run.json"
#: the marker files of the other kinds of attnzoo directories, and what they are
_OTHER_KINDS = {"run.json": "an attnzoo reproduce run", ".attnzoo-run": "an attnzoo train run"}


@dataclass
class CompareOutcome:
    out: Path
    report: Path
    summary: dict = field(default_factory=dict)
    computed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    wall_s: float = 0.0


def refuse_foreign_out(out: Path) -> None:
    """Refuse a file, a directory of another kind of run, or a non-empty directory that is no compare run."""
    if out.exists() and not out.is_dir():
        raise CompareError(f"--out {out} exists and is not a directory; choose another --out")
    if not out.is_dir() or (out / MARKER).is_file():
        return
    for name, what in _OTHER_KINDS.items():
        if (out / name).is_file():
            raise CompareError(f"--out {out} holds {what}, not an attnzoo compare run; choose another --out")
    if any(p.name != LOCK_NAME for p in out.iterdir()):
        raise CompareError(f"--out {out} is a non-empty directory that is not an attnzoo compare run; choose another")


def _mark(out: Path) -> None:
    marker = out / MARKER
    if marker.is_file():
        try:
            meta = read_json(marker, "what kind of run owns the directory")
        except ReadError as e:
            raise CompareError(f"{e}; restore it, or choose another --out") from None
        if not isinstance(meta, dict) or meta.get("kind") != "attnzoo compare":
            raise CompareError(f"{marker} is not an attnzoo compare marker; choose another --out")
        return
    write_json(marker, {"kind": "attnzoo compare", "created": time.strftime("%Y-%m-%dT%H:%M:%S")})


def _clean_outputs_leftovers(out: Path) -> None:
    """Delete the temporaries a killed write of an output left (``.compare.md.<random>.tmp``)."""
    names = "|".join(re.escape(n) for n in OUTPUT_FILES)
    for p in out.iterdir():
        if p.is_file() and re.fullmatch(rf"\.({names})\.[^.]+\.tmp", p.name):
            p.unlink(missing_ok=True)


def run(
    spec: CompareSpec,
    out: str | Path,
    *,
    jobs: int = 1,
    threads: int | None = None,
    device: str = "cpu",
    progress: bool = True,
    command: str = "",
) -> CompareOutcome:
    """Train what ``out`` lacks of ``spec``'s plan and write ``compare.md``, ``compare.json`` and the plots.

    Holds ``out``'s lock throughout (a second writer fails at once naming the first); an interruption propagates
    with every finished step stored, and the same call continues from there."""
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise CompareError(f"--jobs must be a positive integer, got {jobs!r}")
    out = Path(out)
    t0 = time.perf_counter()
    refuse_foreign_out(out)
    with DirLock(out, what="compare directory"):
        _mark(out)
        store = StepStore(out)
        store.clean_leftovers()
        _clean_outputs_leftovers(out)
        ctx = Context(out=out, store=store, seed=spec.seed, device=device, progress=False)
        done = execute_steps(plan_steps(spec), ctx, jobs=jobs, threads=threads, progress=progress, name="compare")
        summary = summarise(spec, done.records)
        meta = {
            "kind": "attnzoo compare",
            "command": command,
            "jobs": jobs,
            "machine": _machine(device),
            "failed": done.failed,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        with all_or_nothing([out / name for name in OUTPUT_FILES]):
            write_outputs(out, spec, summary, meta, done.records)
    return CompareOutcome(
        out, out / "compare.md", summary, done.computed, done.skipped, done.failed, time.perf_counter() - t0
    )


def _machine(device: str) -> dict:
    import torch

    from attnzoo.bench.runner import machine_info

    return machine_info(torch.device(device))


def resume_command(argv: list[str]) -> str:
    """The command line that continues a stopped comparison (the same one: finished steps are skipped)."""
    return shlex.join(["attnzoo", "compare", *argv])


def print_failures(failed: dict[str, str]) -> None:
    for sid, why in failed.items():
        print(f"  failed: {sid}: {why}", file=sys.stderr)
