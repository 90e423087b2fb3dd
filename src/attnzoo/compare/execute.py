"""Run a comparison's steps: each finished step is loaded from the store, each missing one computed and stored.

A failed step (and every step that depends on it) is recorded and the others go on; an interruption (Ctrl-C,
SIGTERM) propagates once the progress bar is closed, with every finished step stored. ``jobs > 1`` computes
independent steps in that many processes; only this process writes to the store.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import torch

from attnzoo.reproduce.common import Context
from attnzoo.reproduce.store import Interrupted, Step

__all__ = ["Outcome", "execute"]


@dataclass
class Outcome:
    """What a run did: the records of the plan's steps and which were computed, reused or failed."""

    records: dict[str, dict] = field(default_factory=dict)
    computed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def execute(
    steps: list[Step], ctx: Context, *, jobs: int = 1, threads: int | None = None, progress: bool = True
) -> Outcome:
    """Load or compute every step of ``steps`` (dependencies first) under a tqdm bar (``progress``)."""
    out = Outcome()
    pending = []
    for step in steps:
        rec = ctx.store.load(step)
        if rec is not None:
            out.records[step.id] = rec
            out.skipped.append(step.id)
        else:
            pending.append(step)
    if jobs > 1 and len(pending) > 1:
        _parallel(pending, ctx, out, jobs, threads, progress)
    else:
        _sequential(pending, ctx, out, progress)
    return out


def _bar(total: int, progress: bool, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="step", disable=not progress, file=sys.stderr, dynamic_ncols=True)


def _compute(ctx: Context, step: Step) -> tuple[dict, float, float]:
    """One step's ``(result, wall_s, started)``; runs in this process or in a worker."""
    started = time.time()
    t0 = time.perf_counter()
    result = step.fn(ctx, step)
    return result, time.perf_counter() - t0, started


def _blocked(step: Step, out: Outcome) -> bool:
    """Record ``step`` as failed when a step it depends on failed."""
    bad = [d for d in step.deps if d in out.failed]
    if bad:
        out.failed[step.id] = f"skipped: depends on failed step(s) {bad}"
    return bool(bad)


def _failed(step: Step, e: BaseException, out: Outcome, bar) -> None:
    out.failed[step.id] = f"{type(e).__name__}: {' '.join(str(e).split())}"
    bar.write(f"attnzoo compare: step {step.id} failed: {out.failed[step.id]}", file=sys.stderr)


def _sequential(pending: list[Step], ctx: Context, out: Outcome, progress: bool) -> None:
    with _bar(len(pending), progress, "compare") as bar:
        for step in pending:
            bar.set_postfix_str(step.id)
            if not _blocked(step, out):
                try:
                    result, wall_s, started = _compute(ctx, step)
                except (Interrupted, KeyboardInterrupt):
                    raise
                except Exception as e:  # noqa: BLE001 - one failed run must not lose the others; it is reported
                    _failed(step, e, out, bar)
                else:
                    out.records[step.id] = ctx.store.save(step, result, wall_s, started)
                    out.computed.append(step.id)
            bar.update(1)


def _init_worker(threads: int) -> None:
    torch.set_num_threads(threads)


def _parallel(pending: list[Step], ctx: Context, out: Outcome, jobs: int, threads: int | None, progress: bool) -> None:
    """:func:`_sequential` over ``jobs`` worker processes: a step starts once the steps it depends on are stored.
    Each run is seeded by its own config, so its numbers do not depend on the worker that ran it."""
    import concurrent.futures as cf
    import multiprocessing as mp

    wctx = Context(out=ctx.out, store=ctx.store, seed=ctx.seed, device=ctx.device, progress=False)
    ids = {s.id for s in pending}
    ctx_mp = mp.get_context("spawn")
    pool = cf.ProcessPoolExecutor(jobs, mp_context=ctx_mp, initializer=_init_worker, initargs=(threads or 1,))
    running: dict = {}
    bar = _bar(len(pending), progress, f"compare ({jobs} jobs)")
    try:
        while pending or running:
            for step in list(pending):
                if len(running) >= jobs:
                    break
                if _blocked(step, out):
                    pending.remove(step)
                    bar.update(1)
                elif all(d in out.records or d not in ids for d in step.deps):
                    pending.remove(step)
                    running[pool.submit(_compute, wctx, step)] = step
            if not running:  # what is left waits on a step that never finished
                for step in pending:
                    out.failed[step.id] = "skipped: its dependencies did not complete"
                break
            done, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
            for fut in done:
                step = running.pop(fut)
                bar.update(1)
                try:
                    result, wall_s, started = fut.result()
                except Interrupted:
                    raise
                except Exception as e:  # noqa: BLE001 - one failed run must not lose the others; it is reported
                    _failed(step, e, out, bar)
                    continue
                out.records[step.id] = ctx.store.save(step, result, wall_s, started)
                out.computed.append(step.id)
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        bar.close()
    pool.shutdown(wait=True)
