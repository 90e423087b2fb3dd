"""``attnzoo reproduce --estimate --reuse RESULTS``: a plan's thread time and wall clock predicted, before anything
trains, from the steps of runs already made.

Each planned step is timed by the stored steps of its shape (its id with seed numbers and rates wildcarded: one
row's runs): the examples it trains (steps x batch) at the fastest of their seconds per example. Runs of one shape
differ only in seed, rate or length, so the spread of their rates is other work on the machine (it slows a run, never
speeds one); the fixed cost of building and evaluating a model is left out, so short runs come out a little low. A
measurement (no training) takes its shape's shortest time; a step of a shape nothing stored has is
unknown. The wall clock replays the runner's schedule: ``jobs`` workers take steps in plan order once their
dependencies are done, and a timed measurement runs alone.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from attnzoo.compare.common import md_table
from attnzoo.compare.runner import startable
from attnzoo.compare.store import Step, config_hash
from attnzoo.reproduce.runner import check_jobs

__all__ = ["StepEstimate", "Estimate", "estimate", "examples", "render_estimate", "shape"]

_SHAPE = re.compile(r"(?<=/)(seed|extra-seed|lr)[0-9][0-9.e+-]*$")


@dataclass(frozen=True)
class StepEstimate:
    """One planned step's predicted thread seconds (None: nothing stored resembles it) and where they come from."""

    id: str
    section: str
    seconds: float | None
    source: str  # "same config" (its own config is stored), "same shape" or "unknown"


@dataclass(frozen=True)
class Estimate:
    steps: list[StepEstimate]
    jobs: int
    wall_s: float  # the replayed schedule's length; unknown steps count as 0 s

    @property
    def thread_s(self) -> float:
        return sum(s.seconds or 0.0 for s in self.steps)

    @property
    def unknown(self) -> list[str]:
        return [s.id for s in self.steps if s.seconds is None]


def examples(config: dict) -> float | None:
    """Examples a step trains (``steps x batch_size`` of its ``train`` or ``finetune`` block), None for a
    measurement."""
    for key in ("finetune", "train"):
        block = config.get(key)
        if isinstance(block, dict) and isinstance(block.get("steps"), int) and block.get("batch_size"):
            return float(block["steps"] * block["batch_size"])
    return None


def shape(step_id: str) -> str:
    """``vision/vit/seed2``, ``vision/vit/lr-sweep/lr0.002`` and ``vision/vit@2x-steps/seed0`` -> ``vision/vit/*``:
    runs of one row, which differ only in seed, rate or length, cost the same per example."""
    return _SHAPE.sub("*", step_id).replace("/lr-sweep/*", "/*").replace("@2x-steps/", "/")


def _time_one(step: Step, records: dict, by_shape: dict[str, list[str]]) -> StepEstimate:
    like = by_shape.get(shape(step.id), [])
    if not like:
        return StepEstimate(step.id, step.section, None, "unknown")
    rec = records.get(step.id)
    source = "same config" if rec is not None and config_hash(rec.get("config", {})) == step.hash else "same shape"
    work = examples(step.config)
    points = [(w, records[i]["wall_s"]) for i in like if (w := examples(records[i].get("config", {})))]
    # the spread at one cost is other work slowing some runs, never speeding one: the fastest rate is the row's
    seconds = work * min(t / w for w, t in points) if work and points else min(records[i]["wall_s"] for i in like)
    return StepEstimate(step.id, step.section, seconds, source)


def _replay(steps: list[Step], seconds: dict[str, float], jobs: int) -> float:
    """The runner's schedule (:func:`attnzoo.reproduce.runner.startable`, in plan order once a step's dependencies
    are done) with the predicted durations: its end time."""
    pending, running, done, now = list(steps), {}, set(), 0.0  # running: id -> (step, end time)
    planned = {s.id for s in steps}
    while pending or running:
        for step in list(pending):
            free = startable(step, [s for s, _ in running.values()], jobs)
            if free is None:
                break
            if free and all(d in done or d not in planned for d in step.deps):
                pending.remove(step)
                running[step.id] = (step, now + seconds[step.id])
        if not running:
            raise ValueError(f"steps wait on dependencies that never finish: {[s.id for s in pending][:5]}")
        first = min(running, key=lambda i: running[i][1])
        now = running.pop(first)[1]
        done.add(first)
    return now


def estimate(steps: list[Step], records: dict[str, dict], jobs: int = 1) -> Estimate:
    """Predicted seconds of every step of ``steps`` from stored step ``records`` (id -> record with ``config`` and
    ``wall_s``, as in a results.json's ``steps``), and the wall clock of running them with ``jobs`` workers."""
    check_jobs(jobs)
    timed_records = {k: r for k, r in records.items() if isinstance(r.get("wall_s"), (int, float))}
    by_shape: dict[str, list[str]] = {}
    for rid in timed_records:
        by_shape.setdefault(shape(rid), []).append(rid)
    ests = [_time_one(s, timed_records, by_shape) for s in steps]
    wall = _replay(steps, {e.id: e.seconds or 0.0 for e in ests}, jobs)
    return Estimate(ests, jobs, wall)


def _minutes(s: float) -> str:
    return f"{s / 60:,.1f}"


def render_estimate(est: Estimate, sources: list[str | Path]) -> str:
    """Per section: steps, how each was timed, predicted thread-minutes; then the total and the wall clock."""
    rows, sections = [], dict.fromkeys(s.section for s in est.steps)
    for sec in sections:
        mine = [s for s in est.steps if s.section == sec]
        n = Counter(s.source for s in mine)
        minutes = _minutes(sum(s.seconds or 0.0 for s in mine))
        rows.append([sec, len(mine), n["same config"], n["same shape"], n["unknown"], minutes])
    total = ["total", len(est.steps), *(sum(r[i] for r in rows) for i in (2, 3, 4)), _minutes(est.thread_s)]
    table = md_table(["section", "steps", "same config", "other config", "unknown", "thread-min"], [*rows, total])
    lines = [
        f"Timed from: {', '.join(str(s) for s in sources)}",
        "",
        table,
        "",
        f"Predicted wall clock with --jobs {est.jobs}: {_minutes(est.wall_s)} min "
        f"({_minutes(est.thread_s)} thread-minutes of steps; a report and start-up add a little).",
    ]
    if est.unknown:
        shown = ", ".join(est.unknown[:8]) + (f" and {len(est.unknown) - 8} more" if len(est.unknown) > 8 else "")
        lines.append(f"Not timed (nothing stored of their shape; counted as 0 s): {shown}.")
    return "\n".join(lines) + "\n"
