"""Orchestration: plan the steps of a budget, run the missing ones (resumable), summarise, write the report."""

from __future__ import annotations

import json
import os
import platform
import shlex
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

from attnzoo._io import all_or_nothing, write_error, write_json
from attnzoo._lock import LOCK_NAME, DirLock
from attnzoo.compare.common import Context
from attnzoo.compare.runner import RunOutcome, reuse_stored, run_steps
from attnzoo.compare.store import Interrupted, Step, StepStore, config_hash, read_object
from attnzoo.reproduce import paper_claims, report
from attnzoo.reproduce.budgets import SECTIONS, budget, with_settings
from attnzoo.reproduce.sections import ALIASES, SECTION_MODULES

RUN_FILE = "run.json"  # marks a reproduce directory and pins its budget and seed


class ReproduceError(ValueError):
    """Bad arguments or an output directory that cannot be used."""


def check_jobs(jobs) -> None:
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise ReproduceError(f"--jobs must be a positive integer, got {jobs!r}")


def resolve_sections(only: str | list[str] | None) -> list[str]:
    """Section keys from a comma list (aliases accepted), in report order; ``None`` = all."""
    if only is None:
        return list(SECTIONS)
    keys = []
    for raw in only.split(",") if isinstance(only, str) else only:
        if k := raw.strip().lower():
            k = ALIASES.get(k, k)
            if k not in SECTION_MODULES:
                raise ReproduceError(f"unknown section {raw.strip()!r} in --only; valid sections: {list(SECTIONS)}")
            keys.append(k)
    if not keys:
        raise ReproduceError(f"--only selects no section; valid sections: {list(SECTIONS)}")
    return [k for k in SECTIONS if k in keys]


def plan(budget_name: str, seed: int, settings: list[str] | tuple[str, ...] = ()) -> tuple[dict, list[Step]]:
    """The budget's settings (with ``settings``, ``--set``'s ``section.key=VALUE``, applied) and every step of every
    section, dependencies before dependants."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ReproduceError(f"seed must be a non-negative integer, got {seed!r}")
    try:
        b = with_settings(budget(budget_name), settings)
    except ValueError as e:
        raise ReproduceError(str(e)) from None
    for key in SECTIONS:  # a dated pilot's note and a caveat name a claim the report knows
        for what in ("claim_notes", "caveats"):
            for cid in b[key].get(what, {}):
                try:
                    paper_claims.get(cid)
                except KeyError as e:
                    raise ReproduceError(f"{key}.{what}: {e.args[0]}") from None
    steps: list[Step] = []
    for key, mod in SECTION_MODULES.items():
        # the probes read the vision section's trained models
        steps += mod.plan_steps(b[key], seed, b["vision"]) if key == "probes" else mod.plan_steps(b[key], seed)
    seen: set[str] = set()
    for s in steps:
        if s.id in seen or not seen.issuperset(s.deps):
            raise AssertionError(f"step {s.id!r} repeats an id or comes before a step it depends on {s.deps}")
        seen.add(s.id)
    return b, steps


def _select(steps: list[Step], sections: list[str]) -> list[Step]:
    """Steps of the chosen sections plus, transitively, the steps they depend on (in plan order, which puts a
    step's dependencies before it, so one backward pass finds them all)."""
    need = {s.id for s in steps if s.section in sections}
    for s in reversed(steps):
        if s.id in need:
            need.update(s.deps)
    return [s for s in steps if s.id in need]


def _prepare_out(out: Path, budget_name: str, seed: int) -> None:
    """Create or reopen ``out``; a run of another budget or seed is refused."""
    marker = out / RUN_FILE
    if not marker.is_file():
        out.mkdir(parents=True, exist_ok=True)
        write_json(marker, {"budget": budget_name, "seed": seed, "created": time.strftime("%Y-%m-%dT%H:%M:%S")})
        return
    try:
        meta = read_object(marker)
    except (ValueError, OSError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ReproduceError(
            f"{marker} is corrupt ({' '.join(str(e).split())}); it should hold this run's budget and seed, e.g. "
            f'{{"budget": "default", "seed": 0}}: restore or rewrite it, or choose another --out'
        ) from e
    if meta.get("budget") != budget_name or meta.get("seed") != seed:
        raise ReproduceError(
            f"--out {out} holds a reproduce run with budget {meta.get('budget')!r} and seed {meta.get('seed')}; "
            f"rerun with --budget {meta.get('budget')} --seed {meta.get('seed')} to continue it, or choose "
            f"another --out"
        )


def machine_description(device: str) -> dict:
    """CPU model, threads, torch/python versions and the GPU if any."""
    from attnzoo.bench.runner import machine_info

    return machine_info(torch.device(device)) | {"platform": platform.platform(), "numpy": np.__version__}


def run(
    out: str | os.PathLike | None = None,
    budget_name: str = "default",
    *,
    seed: int = 0,
    only: str | list[str] | None = None,
    device: str = "auto",
    progress: bool = True,
    threads: int | None = None,
    argv: list[str] | None = None,
    reuse: str | os.PathLike | list | None = None,
    jobs: int = 1,
    report_only: bool = False,
    settings: list[str] | tuple[str, ...] = (),
) -> RunOutcome:
    """Run (or continue) ``attnzoo reproduce`` into ``out`` (``None``: a new ``results/<timestamp>``) and write
    ``report.md`` and ``results.json``, holding ``out``'s lock (a second writer fails at once, naming the first);
    ``settings``: ``--set``'s ``section.key=VALUE`` changes to the budget."""
    out = Path(out) if out is not None else Path("results") / time.strftime("%Y%m%d-%H%M%S")
    # refused before anything is written there
    if out.exists() and not out.is_dir():
        raise ReproduceError(f"--out {out} exists and is not a directory")
    if out.is_dir() and not (out / RUN_FILE).is_file() and any(p.name != LOCK_NAME for p in out.iterdir()):
        raise ReproduceError(f"--out {out} is a non-empty directory that is not a reproduce run; choose another --out")
    with DirLock(out, what="reproduce directory"):
        t_start = time.perf_counter()
        check_jobs(jobs)
        sections = resolve_sections(only)
        b, steps = plan(budget_name, seed, settings)
        device = _resolve_device(device)
        if threads is not None:
            if threads < 1:
                raise ReproduceError(f"--threads must be >= 1, got {threads}")
            torch.set_num_threads(threads)
        _prepare_out(out, budget_name, seed)
        store = StepStore(out)
        store.clean_leftovers()
        for src in [reuse] if isinstance(reuse, (str, os.PathLike)) else reuse or []:
            n = import_results(src, steps, store, slimmed=report_only)
            if progress:
                print(f"reproduce: reused {n} stored step(s) from {src}", file=sys.stderr)
        ctx = Context(out=out, store=store, seed=seed, device=device, progress=progress)
        outcome = RunOutcome(out, out / "report.md", out / "results.json")
        records = outcome.records
        again = resume_command(out, budget_name, seed, only)
        try:
            _execute(_select(steps, sections), ctx, outcome, progress, jobs, threads, report_only)
        except (Interrupted, KeyboardInterrupt) as e:
            outcome.interrupted = True
            print(
                f"\nattnzoo reproduce: interrupted ({e or 'Ctrl-C'}); completed steps are saved in {out}. "
                f"To continue, run: {again}",
                file=sys.stderr,
            )
            outcome.wall_s = time.perf_counter() - t_start
            return outcome
        except OSError as e:  # a store write (disk full, ...): every failure so far, the culprit, the way on
            raise _stopped_by(e, outcome, again) from None
        if not report_only:
            sections = _with_finished_sections(sections, steps, store, records)
        outcome.wall_s = time.perf_counter() - t_start
        argv = argv if argv is not None else sys.argv[1:]
        try:  # the reports all or none (a failed write restores the previous ones)
            with all_or_nothing([outcome.report, out / "report.html", outcome.results, out / report.CONFIGS_FILE]):
                machine, workers = machine_description(device), recorded_workers(out)
                report.write_report(out, b, budget_name, seed, sections, records, outcome, machine, argv, workers)
        except OSError as e:
            raise _stopped_by(write_error("the report", e.filename or out, e), outcome, again) from None
        return outcome


def _execute(todo, ctx, outcome, progress, jobs, threads, report_only) -> None:
    """Compute the missing steps of ``todo`` (in ``jobs`` processes), or with ``report_only`` only load them."""
    if report_only:  # nothing computed: the report says which steps of the plan it lacks
        outcome.missing += [step.id for step in todo if not reuse_stored(step, ctx.store, outcome, complete=False)]
        return
    try:
        run_steps(todo, ctx, outcome, progress, "reproduce", jobs, threads)
    finally:  # an interrupted invocation's stored steps are counted too
        if outcome.computed:
            # run.json's workers: how the steps were computed (--jobs 1 computes in this process), not the threads
            # of the process that renders the report
            per_worker = (threads or 1) if jobs > 1 else torch.get_num_threads()
            meta = read_object(ctx.out / RUN_FILE)
            workers = meta.setdefault("workers", [])
            entry = next((w for w in workers if w.get("jobs") == jobs and w.get("threads") == per_worker), None)
            if entry is None:
                entry = {"jobs": jobs, "threads": per_worker, "steps": 0}
                workers.append(entry)
            entry["steps"] = entry.get("steps", 0) + len(outcome.computed)
            write_json(ctx.out / RUN_FILE, meta)


def recorded_workers(out: Path) -> list[dict]:
    """run.json's ``workers``: ``[{"jobs", "threads", "steps"}]``, one per setting that computed steps here."""
    try:
        workers = read_object(out / RUN_FILE).get("workers", [])
    except (OSError, ValueError):
        return []
    return [w for w in workers if isinstance(w, dict)]


def stored_records(path: str | os.PathLike) -> dict:
    """The step records of another run: its directory's ``steps/`` or its results.json's ``steps``."""
    path = Path(path)
    try:
        if not path.is_dir():
            return json.loads(path.read_bytes().decode("utf-8"))["steps"]
        return {
            f.relative_to(path / "steps").with_suffix("").as_posix(): json.loads(f.read_bytes().decode("utf-8"))
            for f in sorted((path / "steps").rglob("*.json"))
        }
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ReproduceError(
            f"--reuse {path}: not a readable results.json with a 'steps' object or a reproduce directory ({e})"
        ) from e


def import_results(path: str | os.PathLike, steps: list[Step], store: StepStore, *, slimmed: bool = False) -> int:
    """Store the records of another run (results.json or directory) whose config hash equals this plan's, unless
    stored here already; returns how many. A published record without its plot arrays (``result_slimmed``) is taken
    only with ``slimmed=True`` (``--report-only``): a run that computes takes the step again instead."""
    path = Path(path)
    stored = stored_records(path)
    # the source's name only (a local path would leak into a published report); kept through re-imports
    name = (path.resolve() if path.is_dir() else path.resolve().parent).name
    n = 0
    for step in steps:
        rec = stored.get(step.id)
        if not isinstance(rec, dict) or store.load(step) is not None or "result" not in rec:
            continue
        if config_hash(rec.get("config", {})) != step.hash or (rec.get("result_slimmed") and not slimmed):
            continue
        # a step's run directory (checkpoints a later step loads, e.g. a pretrained model) comes with its record
        runs = path / "runs" / step.id
        if path.is_dir() and runs.is_dir() and not store.run_dir(step.id).exists():
            shutil.copytree(runs, store.run_dir(step.id))
        origin = rec.get("imported_from") or name
        store.save(step, rec["result"], float(rec.get("wall_s", 0.0)), time.time(), origin, rec.get("result_slimmed"))
        n += 1
    return n


def _stopped_by(e: OSError, outcome: RunOutcome, continue_cmd: str) -> ReproduceError:
    """The error that ends a run stopped by a failed write, after every failed step so far is printed."""
    for sid, why in outcome.failed.items():
        print(f"  failed: {sid}: {why}", file=sys.stderr)
    done = f"{len(outcome.computed)} step(s) computed this time and {len(outcome.skipped)} reused are stored"
    return ReproduceError(f"{e}. {done} in {outcome.out}; free space (or fix the cause), then: {continue_cmd}")


def _resolve_device(device: str) -> str:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ReproduceError(f"--device must be auto, cpu or cuda[:N], got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ReproduceError("--device cuda but CUDA is not available; use --device cpu")
    return device


def _with_finished_sections(sections: list[str], steps: list[Step], store: StepStore, records: dict) -> list[str]:
    """Sections not selected this time still appear when all their steps were computed earlier."""
    for key in [k for k in SECTIONS if k not in sections]:
        recs = {s.id: store.load(s) for s in steps if s.section == key}
        if recs and all(recs.values()):
            records.update(recs)
            sections = [*sections, key]
    return [k for k in SECTIONS if k in sections]


def resume_command(out: Path, budget_name: str, seed: int, only: str | list[str] | None) -> str:
    """The command that continues this run, naming the ``--out`` actually used (perhaps a new timestamped one)."""
    cmd = ["attnzoo", "reproduce", "--budget", budget_name, "--seed", str(seed), "--out", str(out)]
    if only:
        cmd += ["--only", only if isinstance(only, str) else ",".join(only)]
    return shlex.join(cmd)


def summary_line(o: RunOutcome) -> str:
    missing = f", {len(o.missing)} missing (--report-only)" if o.missing else ""
    return (
        f"reproduce: {len(o.computed)} step(s) computed, {len(o.skipped)} reused, {len(o.failed)} failed{missing} "
        f"in {o.wall_s:.1f} s; report: {o.report}"
    )
