"""Run a plan of steps: load each finished one from the store, compute each missing one (in this process or over
worker processes), a failed step recorded and the others going on. ``attnzoo compare`` and ``attnzoo reproduce`` both
run their plans here."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from attnzoo.compare.common import Context
from attnzoo.compare.store import Interrupted, Step, StepStore


@dataclass
class RunOutcome:
    out: Path
    report: Path
    results: Path
    records: dict[str, dict] = field(default_factory=dict)
    computed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    interrupted: bool = False
    wall_s: float = 0.0


def startable(step: Step, running: list[Step], jobs: int) -> bool | None:
    """Whether ``step`` may start beside the ``running`` steps on ``jobs`` workers: None when no step may start now
    (every worker busy, or a timed measurement running alone), False when this one waits (a timed step waits for an
    idle machine). Dependencies are the caller's to check."""
    if len(running) >= jobs or any(s.timed for s in running):
        return None
    return not (step.timed and running)


def execute_steps(
    steps: list[Step], ctx: Context, *, jobs: int = 1, threads: int | None = None, progress: bool = True, name: str
) -> RunOutcome:
    """Load each finished step and compute each missing one (in ``jobs`` processes), for other commands that run a
    plan of steps (``attnzoo compare``); ``name`` labels the progress bar and the failure lines."""
    outcome = RunOutcome(ctx.out, ctx.out, ctx.out)
    run_steps(steps, ctx, outcome, progress, name, jobs, threads)
    return outcome


def reuse_stored(step: Step, store: StepStore, outcome: RunOutcome, complete: bool = True) -> bool:
    """Take ``step``'s finished record from the store, if it has one; ``complete``: only one with its plot arrays
    (a record imported without them is computed again)."""
    rec = store.load(step)
    if rec is None or (complete and rec.get("result_slimmed")):
        return False
    outcome.records[step.id] = rec
    outcome.skipped.append(step.id)
    return True


def _compute_step(ctx: Context, step: Step) -> tuple[dict, float, float]:
    """Run one step (in this process or a worker): ``(result, wall_s, started)``."""
    started, t0 = time.time(), time.perf_counter()
    result = step.fn(ctx, step)
    return result, time.perf_counter() - t0, started


class _InProcess(cf.Executor):
    """A pool of one worker that is this process: a step runs when it is submitted (its progress bars shown)."""

    def submit(self, fn, *args):
        fut = cf.Future()
        try:
            fut.set_result(fn(*args))
        except (Interrupted, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 - one failed run must not lose the others; it is reported
            fut.set_exception(e)
        return fut


def run_steps(todo, ctx: Context, outcome: RunOutcome, progress, name="reproduce", jobs=1, threads=None):
    """Load each finished step and compute each missing one, in this process or over ``jobs`` worker processes of
    ``threads`` (default 1) torch threads each: a step starts once its dependencies are stored (each is seeded by
    its config, so any worker gives the same numbers); only this process writes to the store. A failed step (and
    what depends on it) is recorded in ``outcome.failed`` and the others go on; an interruption propagates."""
    records = outcome.records
    pending = [step for step in todo if not reuse_stored(step, ctx.store, outcome)]
    planned = {s.id for s in todo}
    desc = name if jobs == 1 else f"{name} ({jobs} jobs)"
    bar = tqdm(total=len(pending), desc=desc, unit="step", disable=not progress, file=sys.stderr)
    if jobs == 1:
        pool, wctx = _InProcess(), ctx
    else:
        wctx = Context(out=ctx.out, store=ctx.store, seed=ctx.seed, device=ctx.device, progress=False)
        spawn, init = mp.get_context("spawn"), torch.set_num_threads
        pool = cf.ProcessPoolExecutor(jobs, mp_context=spawn, initializer=init, initargs=(threads or 1,))
    running: dict = {}
    try:
        while pending or running:
            for step in list(pending):
                free = startable(step, list(running.values()), jobs)
                if free is None:
                    break
                if not free:
                    continue
                if bad := [d for d in step.deps if d in outcome.failed]:
                    pending.remove(step)
                    outcome.failed[step.id] = f"skipped: depends on failed step(s) {bad}"
                    bar.update(1)
                elif all(d in records or d not in planned for d in step.deps):
                    pending.remove(step)
                    bar.set_postfix_str(step.id)
                    running[pool.submit(_compute_step, wctx, step)] = step
            if not running:  # every remaining step waits on a failed or missing dependency
                for step in pending:
                    outcome.failed[step.id] = "skipped: its dependencies did not complete"
                break
            done, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
            for fut in done:
                step = running.pop(fut)
                bar.update(1)
                if (e := fut.exception()) is None:
                    records[step.id] = ctx.store.save(step, *fut.result())
                    outcome.computed.append(step.id)
                elif isinstance(e, Interrupted) or not isinstance(e, Exception):
                    raise e
                else:
                    outcome.failed[step.id] = f"{type(e).__name__}: {e}"
                    if progress:
                        bar.write(f"{name}: step {step.id} failed: {type(e).__name__}: {e}")
                        if jobs == 1:
                            traceback.print_exception(e, file=sys.stderr)
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        bar.close()
    pool.shutdown(wait=True)
