"""Pilot runs of vision-section rows: each row trained exactly as ``attnzoo reproduce`` configures it
(:func:`attnzoo.reproduce.sections.vision.row_config`) under a plan given on the command line, one CPU thread.

    python scripts/pilot_vision.py vit-meanpool,vit+identity --img 48 --placement random --patch 8 --steps 600

Prints one JSON line per run: final validation accuracy (%), wall seconds and CPU seconds per 1,000 steps (the CPU
figure includes start-up and the two evaluations; under load the wall figure is not a cost). ``--row-options``
gives per-row model options applied last (the widths a budget's ``row_arch`` sets), as JSON:
``'{"crate": {"dim": 80, "heads": 5}}'``.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch


def _plan(a: argparse.Namespace) -> dict:
    """A vision section plan with one training setting, as the budgets' ``vision`` blocks give it."""
    opts = dict(img_size=a.img, n_train=a.n_train, n_val=a.n_val)
    if a.placement != "center":
        opts["placement"] = a.placement
    warmup = a.warmup if a.warmup is not None else a.steps // 10
    return dict(
        task=a.task,
        task_options=opts,
        arch=dict(depth=a.depth, dim=a.dim, heads=a.heads, patch_size=a.patch),
        train=dict(batch_size=a.batch_size, lr=a.lrs[0], steps=a.steps, warmup_steps=warmup),
        models=["vit", "tost"],
        seeds=1,
    )


def _run(plan: dict, row: str, lr: float, seed: int, row_options: dict, out: Path) -> dict:
    """Train row ``row`` at rate ``lr`` and seed ``seed`` into ``out``; its accuracy and costs."""
    from attnzoo.reproduce.sections import vision
    from attnzoo.train.config import from_dict
    from attnzoo.train.trainer import train

    cfg = copy.deepcopy(vision.row_config(plan, row, seed)["train"])
    cfg["model_options"].update(row_options.get(row.split("@")[0], {}))
    steps = cfg["steps"]
    cfg.update(lr=lr, eval_every=max(1, steps // 2), ckpt_every=steps, log_every=50, device="cpu")
    wall, cpu = time.time(), time.process_time()
    result = train(from_dict(cfg), out, overwrite=True, progress=False)
    wall, cpu = time.time() - wall, time.process_time() - cpu
    return dict(
        row=row,
        lr=lr,
        seed=seed,
        steps=steps,
        dim=cfg["model_options"].get("dim"),
        acc=round(100 * result.final_metrics["accuracy"], 2),
        wall_s=round(wall, 1),
        cpu_s_per_kstep=round(1000 * cpu / steps, 1),
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("rows", help="comma-separated vision rows (attnzoo.reproduce.sections.vision)")
    p.add_argument("--lrs", type=lambda s: [float(x) for x in s.split(",")], default=[6e-3])
    p.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps (default a tenth of the steps)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--task", default="fashion_mnist")
    p.add_argument("--img", type=int, default=32, help="canvas side (task option img_size)")
    p.add_argument("--placement", default="center", choices=["center", "random"])
    p.add_argument("--n-train", type=int, default=10000)
    p.add_argument("--n-val", type=int, default=2000)
    p.add_argument("--patch", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--row-options", type=json.loads, default={}, help="JSON: row -> model options applied last")
    p.add_argument("--out", type=Path, default=Path("runs/pilot_vision"))
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    plan = _plan(a)
    for row in a.rows.split(","):
        for lr in a.lrs:
            for seed in a.seeds:
                rec = _run(plan, row, lr, seed, a.row_options, a.out / f"{row}-lr{lr:g}-s{seed}")
                print(json.dumps({"img": a.img, "placement": a.placement, "patch": a.patch, **rec}), flush=True)


if __name__ == "__main__":
    main()
