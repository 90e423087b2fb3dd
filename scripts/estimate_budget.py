"""Estimate a reproduce budget's training compute before running it: one-thread seconds per step of every distinct
training configuration (model, options, task, batch), timed over a few optimiser steps, times the steps planned.

    python scripts/estimate_budget.py long [--sections vision,language]

Evaluation, checkpoints, the efficiency benchmarks and the probes' measurements are not counted; run it on a quiet
machine (its figures are for sizing a budget, not for the report).
"""

from __future__ import annotations

import argparse
import collections
import json
import time

import numpy as np
import torch

from attnzoo.compare.common import train_defaults
from attnzoo.data import build_task
from attnzoo.reproduce.runner import plan
from attnzoo.train.config import from_dict
from attnzoo.train.objectives import build_task_model, compute_loss

KEYS = ("task", "task_options", "model", "model_options", "batch_size")


def _groups(budget: str, sections: list[str] | None) -> dict[str, list[tuple[str, int]]]:
    groups = collections.defaultdict(list)
    for s in plan(budget, 0)[1]:
        t = s.config.get("train")
        if not t or "model" not in t or (sections and s.section not in sections):
            continue
        groups[json.dumps({k: t[k] for k in KEYS if k in t}, sort_keys=True)].append((s.id, t["steps"]))
    return groups


def _seconds_per_step(g: dict, tasks: dict, min_s: float) -> float:
    key = json.dumps([g["task"], g["task_options"]], sort_keys=True)
    if key not in tasks:
        tasks[key] = build_task(g["task"], **g["task_options"])
    task = tasks[key]
    cfg = from_dict({**train_defaults(), **{k: g[k] for k in KEYS if k in g}, "steps": 1})
    model = build_task_model(cfg, task)
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    bs, rng = min(g["batch_size"], len(task.train)), np.random.default_rng(0)

    def one():
        inputs, target = task.train.get_batch(rng.integers(0, len(task.train), bs))
        args, kwargs = task.model_args(inputs)  # masks and offsets, as the trainer passes them
        loss, _ = compute_loss(task.kind, model(*args, **kwargs), target)
        opt.zero_grad()
        loss.backward()
        opt.step()

    one()
    one()
    n, t0 = 0, time.perf_counter()
    while n < 3 or time.perf_counter() - t0 < min_s:
        one()
        n += 1
    return (time.perf_counter() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("budget")
    ap.add_argument("--sections", default=None, help="comma list of sections (default: all)")
    ap.add_argument("--min-seconds", type=float, default=1.5, help="time each configuration at least this long")
    args = ap.parse_args()
    torch.set_num_threads(1)
    sections = args.sections.split(",") if args.sections else None
    total, tasks = collections.Counter(), {}
    for key, runs in _groups(args.budget, sections).items():
        g = json.loads(key)
        sps = _seconds_per_step(g, tasks, args.min_seconds)
        steps = sum(n for _, n in runs)
        section = runs[0][0].split("/")[0]
        total[section] += sps * steps
        opts = json.dumps(g.get("model_options", {}))[:50]
        print(
            f"{section:12s} {g['task']:16s} {g['model']:24s} {opts:50s} {1e3 * sps:7.1f} ms x {steps:6d} "
            f"= {sps * steps / 60:5.1f} min ({len(runs)} runs)",
            flush=True,
        )
    for section, s in total.most_common():
        print(f"{section:12s} {s / 60:6.1f} min")
    print(f"{'total':12s} {sum(total.values()) / 60:6.1f} min of one thread")


if __name__ == "__main__":
    main()
