"""``attnzoo eval RUN_DIR``: evaluate a run's checkpoint on its task's validation split.

For in-context learning it prints the normalised squared error against the number of in-context
examples, beside the least-squares baseline (AoT Fig. 6), and can plot it (``--plot FILE.png``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="attnzoo eval", description="evaluate a trained run on its validation split")
    p.add_argument("run", help="run directory written by attnzoo train")
    p.add_argument("--checkpoint", default="latest", help="checkpoint directory, or 'latest' (default)")
    p.add_argument("--batch-size", type=int, default=None, help="evaluation batch size (default: the run's)")
    p.add_argument("--max-batches", type=int, default=0, help="evaluate only this many batches (0 = all)")
    p.add_argument("--device", default="auto")
    p.add_argument("--json", default=None, help="also write the metrics to this JSON file")
    p.add_argument("--plot", default=None, help="ICL tasks: plot error vs in-context examples to this PNG")
    a = p.parse_args(argv)
    if a.batch_size is not None and a.batch_size < 1:  # 0 used to fall back silently to the run's batch size
        p.error(f"--batch-size must be a positive integer, got {a.batch_size}")
    if a.max_batches < 0:
        p.error(f"--max-batches must be >= 0 (0 = all), got {a.max_batches}")
    return a


def _evaluate_checkpoint(a: argparse.Namespace) -> tuple[Any, Path, Any, dict[str, Any], dict[str, Any]]:
    """``(config, checkpoint, task, state.json, metrics)`` of the run and checkpoint named on the command line."""
    import torch

    from attnzoo.train.checkpoint import CheckpointError, latest_checkpoint, list_checkpoints, load_checkpoint
    from attnzoo.train.device import amp_dtype, resolve_device
    from attnzoo.train.objectives import build_task_model
    from attnzoo.train.run_dir import load_run
    from attnzoo.train.trainer import build_run_task, evaluate

    run = Path(a.run)
    cfg = load_run(run)
    ckpt = latest_checkpoint(run / "checkpoints") if a.checkpoint == "latest" else Path(a.checkpoint)
    if ckpt is None:
        raise CheckpointError(f"{run} has no checkpoint yet")
    device = resolve_device(a.device)
    task = build_run_task(cfg)
    torch.manual_seed(cfg.seed)
    model = build_task_model(cfg, task).to(device)
    try:  # the files are verified against the checkpoint's manifest.json first
        state = load_checkpoint(ckpt, model, restore_rng=False)
    except CheckpointError as e:
        earlier = [p for p in list_checkpoints(run / "checkpoints") if p.name != ckpt.name]
        if not earlier:
            raise
        raise CheckpointError(
            f"{e}. Evaluate another checkpoint with --checkpoint, e.g. --checkpoint {earlier[-1]}"
        ) from None
    metrics = evaluate(
        model,
        task,
        a.batch_size or cfg.eval_batch_size or cfg.batch_size,
        device,
        max_batches=a.max_batches,
        amp_dtype=amp_dtype(cfg.amp, device),
    )
    return cfg, ckpt, task, state, metrics


def _icl_curve(task, metrics: dict[str, Any], cfg, plot: str | None) -> list[float]:
    """Print (and with ``plot`` draw) the error per number of in-context examples beside least squares (AoT Fig. 6);
    returns the least-squares curve."""
    import numpy as np

    from attnzoo.data.icl import least_squares_baseline

    n = min(len(task.val), 256)
    (xs, ys), _ = task.val.get_batch(np.arange(n))
    ls_curve = (least_squares_baseline(xs.numpy(), ys.numpy()) / task.info["dim"]).tolist()
    model_curve = metrics["normalized_error_per_position"]
    print("in-context examples | model error | least squares (normalised squared error)")
    for i, (m, ls) in enumerate(zip(model_curve, ls_curve, strict=True)):
        print(f"{i:19d} | {m:11.4f} | {ls:.4f}")
    if plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.plot(model_curve, label=cfg.model)
        ax.plot(ls_curve, "--", label="least squares")
        ax.set_xlabel("in-context examples")
        ax.set_ylabel("normalised squared error")
        ax.set_title(cfg.task)
        ax.legend()
        fig.tight_layout()
        fig.savefig(plot, dpi=120)
        print(f"plot: {plot}")
    return ls_curve


def main(argv: list[str] | None = None) -> int:
    a = _parse_args(argv)
    from attnzoo._io import write_json
    from attnzoo._lock import DirectoryLocked, DirLock
    from attnzoo.data.paths import DatasetNotFoundError
    from attnzoo.train.checkpoint import CheckpointError
    from attnzoo.train.config import ConfigError
    from attnzoo.train.run_dir import RUN_MARKER

    try:
        # shared: evaluations may run side by side, but not while attnzoo train writes (and rotates) checkpoints
        with DirLock(a.run, mode="shared", what="run directory", create=(Path(a.run) / RUN_MARKER).is_file()):
            cfg, ckpt, task, state, metrics = _evaluate_checkpoint(a)
    except (ConfigError, CheckpointError, DatasetNotFoundError, DirectoryLocked) as e:
        print(f"attnzoo eval: error: {e}", file=sys.stderr)
        return 2
    report = {
        "run": str(Path(a.run)),
        "checkpoint": str(ckpt),
        "step": state["step"],
        "task": cfg.task,
        "model": cfg.model,
        "metrics": metrics,
    }
    if task.kind == "icl_regression":
        report["least_squares_per_position"] = _icl_curve(task, metrics, cfg, a.plot)
    shown = {k: v for k, v in metrics.items() if isinstance(v, float)}
    print(f"{cfg.task} / {cfg.model} @ step {state['step']}: " + ", ".join(f"{k}={v:.4f}" for k, v in shown.items()))
    if a.json:
        try:
            write_json(a.json, report, nonfinite="keep", newline=False)
        except OSError as e:
            print(f"attnzoo eval: error: could not write the metrics to --json {a.json}: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
