"""``attnzoo compare <preset|config.yaml> --mechanisms a,b,... --baseline a --out DIR [--key=value ...]``.

Exit status: 0 done, 1 a step failed or the directory is locked, 2 a bad argument, 130 interrupted (rerun the same
command to continue).
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys

from attnzoo.compare.plan import CompareError, CompareSpec, default_metric, metric_direction

__all__ = ["main", "build_parser", "build_spec"]

PROG = "attnzoo compare"


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line ``attnzoo compare: error: ...`` (exit 2)."""

    def error(self, message: str):
        raise CompareError(message)


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog=PROG,
        allow_abbrev=False,
        description="Which attention mechanism is better on your task, with what confidence: sweeps each "
        "mechanism's learning rate, trains --seeds seeds of each at its best rate and writes DIR/compare.md, "
        "DIR/compare.json and plots, with each effect against the baseline, its 95%% Welch interval and a verdict. "
        "Resumable: rerun with the same --out to continue. Extra --key=value arguments override the training "
        "config as in attnzoo train (e.g. --model_options.depth=2).",
    )
    ap.add_argument("config", help="a training preset (attnzoo presets) or a config YAML, as attnzoo train takes")
    ap.add_argument("--mechanisms", required=True, help="comma list of registered attention mechanisms")
    ap.add_argument("--baseline", default="softmax", help="the mechanism the others are compared with")
    ap.add_argument("--seeds", type=int, default=3, help="reported seeds per mechanism (default 3)")
    ap.add_argument("--lr-grid", default="1e-3,3e-3,1e-2", help="comma list of learning rates swept per mechanism")
    ap.add_argument(
        "--margin",
        type=float,
        default=None,
        help="non-inferiority margin in the metric's units (e.g. 0.01 accuracy); omitted: a superiority reading",
    )
    ap.add_argument("--steps", type=int, default=None, help="training steps per run (default: the config's)")
    ap.add_argument("--metric", default=None, help="validation metric (default: accuracy for classifiers, else loss)")
    ap.add_argument("--out", required=True, help="output directory; rerun with the same one to continue")
    ap.add_argument("--jobs", type=int, default=1, help="run independent steps in N processes")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (per job with --jobs; default 1 then)")
    ap.add_argument("--seed", type=int, default=0, help="first reported seed (the sweep uses seed + 100)")
    ap.add_argument("--device", default="auto", help="auto (CUDA if available), cpu or cuda")
    ap.add_argument(
        "--replicate-baseline",
        action="store_true",
        help="also train the baseline at twice the steps (every seed): a verdict stands only if it clears its "
        "boundary by more than the baseline moves",
    )
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    return ap


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise CompareError(f"--mechanisms lists no mechanism (got {text!r}); give a comma list such as softmax,tssa")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise CompareError(f"--mechanisms lists {dup} more than once")
    return names


def _lr_grid(text: str) -> tuple[float, ...]:
    try:
        lrs = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CompareError(f"--lr-grid must be a comma list of numbers, got {text!r}") from None
    if not lrs:
        raise CompareError(f"--lr-grid is empty (got {text!r}); give positive rates such as 1e-3,3e-3,1e-2")
    bad = [x for x in lrs if not (math.isfinite(x) and x > 0)]
    if bad:
        raise CompareError(f"--lr-grid rates must be finite and > 0, got {bad}")
    if len(set(lrs)) < len(lrs):
        raise CompareError(f"--lr-grid lists a rate more than once: {text!r}")
    return tuple(sorted(lrs))


def _check_numbers(args: argparse.Namespace) -> None:
    if args.seeds < 1:
        raise CompareError(f"--seeds must be >= 1, got {args.seeds}")
    if args.margin is not None:
        if not (math.isfinite(args.margin) and args.margin > 0):
            raise CompareError(f"--margin must be > 0 (omit it for a superiority reading), got {args.margin}")
        if args.seeds < 2:
            raise CompareError(
                f"--margin needs --seeds >= 2 (a 95% interval needs two seeds a side), got --seeds {args.seeds}"
            )
    for name in ("steps", "jobs", "threads"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise CompareError(f"--{name} must be >= 1, got {v}")
    if args.seed < 0:
        raise CompareError(f"--seed must be >= 0, got {args.seed}")


def _device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise CompareError(f"--device must be auto, cpu or cuda[:N], got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise CompareError("--device cuda but CUDA is not available; use --device cpu")
    return device


def _base_config(args: argparse.Namespace, overrides: list[str], device: str):
    """The training config every run starts from: the preset or YAML, the --key=value overrides, then --steps (the
    config's warm-up scaled to keep its share of the run, unless --warmup_steps is given)."""
    from attnzoo.train.config import load_config, parse_overrides

    try:
        over = parse_overrides(overrides)
    except ValueError as e:
        raise CompareError(f"{' '.join(str(e).split())} (the training config's overrides)") from None
    owned = {"lr": "--lr-grid", "attention": "--mechanisms", "model_options.attention": "--mechanisms"}
    for key in over:
        if key in owned:
            raise CompareError(f"--{key} is set per run by {owned[key]}; give it there instead")
    try:
        cfg = load_config(args.config, {**over, "device": device})
        if args.steps is not None and args.steps != cfg.steps:
            # the warm-up keeps its share of the run unless given explicitly
            warmup = over.get("warmup_steps", round(cfg.warmup_steps * args.steps / cfg.steps))
            cfg = load_config(cfg.to_dict(), {"steps": args.steps, "warmup_steps": warmup})
    except ValueError as e:  # ConfigError: an unreadable or invalid config, a bad override
        raise CompareError(f"config {args.config!r}: {' '.join(str(e).split())}") from None
    return cfg


def _check_mechanisms(cfg, mechanisms: list[str], baseline: str) -> None:
    import dataclasses

    import attnzoo
    from attnzoo.train.objectives import check_model_choice

    valid = attnzoo.list_attentions()
    unknown = [m for m in mechanisms if m not in valid]
    if unknown:
        raise CompareError(f"unknown mechanism(s) {unknown} in --mechanisms; valid mechanisms: {valid}")
    if baseline not in mechanisms:
        raise CompareError(f"--baseline {baseline!r} is not in --mechanisms {mechanisms}; add it or choose one of them")
    for m in mechanisms:
        try:
            check_model_choice(dataclasses.replace(cfg, attention=m).validate())
        except ValueError as e:
            raise CompareError(f"mechanism {m!r} with model {cfg.model!r}: {' '.join(str(e).split())}") from None


def build_spec(args: argparse.Namespace, overrides: list[str]) -> tuple[CompareSpec, str]:
    """The checked comparison and the device it runs on; every bad argument is a :class:`CompareError`."""
    from attnzoo.data.tasks import task_kind
    from attnzoo.train.objectives import metric_names

    _check_numbers(args)
    mechanisms, lrs = _names(args.mechanisms), _lr_grid(args.lr_grid)
    device = _device(args.device)
    cfg = _base_config(args, overrides, device)
    _check_mechanisms(cfg, mechanisms, args.baseline)
    kind = task_kind(cfg.task)
    metric, higher = default_metric(kind)
    if args.metric is not None:
        if args.metric not in metric_names(kind):
            valid = metric_names(kind)
            raise CompareError(f"--metric {args.metric!r} is not measured on a {kind} task; valid: {valid}")
        metric, higher = args.metric, metric_direction(args.metric)
    spec = CompareSpec(
        source=args.config,
        base=cfg.to_dict(),
        mechanisms=tuple(mechanisms),
        baseline=args.baseline,
        seeds=args.seeds,
        lrs=lrs,
        metric=metric,
        higher_is_better=higher,
        margin=args.margin,
        seed=args.seed,
        replicate_baseline=args.replicate_baseline,
    )
    return spec, device


def main(argv: list[str] | None = None) -> int:
    from attnzoo._lock import DirectoryLocked
    from attnzoo.cli import debug_enabled
    from attnzoo.compare.engine import print_failures, resume_command, run
    from attnzoo.compare.store import Interrupted

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args, rest = build_parser().parse_known_args(argv)
        spec, device = build_spec(args, rest)
        if args.threads is not None and args.jobs == 1:
            import torch

            torch.set_num_threads(args.threads)
        outcome = run(
            spec,
            args.out,
            jobs=args.jobs,
            threads=args.threads,
            device=device,
            progress=not args.no_progress,
            command=shlex.join(["attnzoo", "compare", *argv]),
        )
    except (CompareError, DirectoryLocked) as e:
        if debug_enabled():
            raise
        print(f"{PROG}: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1 if isinstance(e, DirectoryLocked) else 2
    except (Interrupted, KeyboardInterrupt) as e:
        why = e or "Ctrl-C"
        again = resume_command(argv)
        print(f"\n{PROG}: interrupted ({why}); finished steps are stored. To continue: {again}", file=sys.stderr)
        return 130
    print(
        f"{PROG}: {len(outcome.computed)} step(s) computed, {len(outcome.skipped)} reused, {len(outcome.failed)} "
        f"failed in {outcome.wall_s:.1f} s; report: {outcome.report}"
    )
    if outcome.failed:
        print_failures(outcome.failed)
        return 1
    return 0
