"""What ``attnzoo compare`` trains: the settings of a comparison and its steps (sweeps, seeds, the longer baseline).

Each mechanism ("row") is swept over the learning-rate grid on one seed apart from the reported ones (base seed +
:data:`~attnzoo.compare.common.SWEEP_SEED_OFFSET`); its reported seeds then train at the rate its sweep found best
(read from the stored sweep records when the seed's step runs). Every run goes through ``attnzoo.train`` via
:func:`attnzoo.compare.common.train_run`, the adapter the report's trained sections use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnzoo.compare.common import CURVE_POINTS, SWEEP_SEED_OFFSET, seeded_id, sweep_id, train_run, tuned
from attnzoo.compare.store import Step

__all__ = ["CompareError", "CompareSpec", "PREFIX", "plan_steps", "default_metric", "row_ids"]

#: the step ids' first part (``compare/<mechanism>/seed<s>``, ``compare/<mechanism>/lr-sweep/lr<rate>``)
PREFIX = "compare"
#: the section name stored with every step record
SECTION = "compare"


class CompareError(ValueError):
    """A bad argument of ``attnzoo compare`` or an output directory it cannot use."""


@dataclass(frozen=True)
class CompareSpec:
    """A comparison: the base training config (a ``TrainConfig`` dict), the rows and how they are judged.

    ``margin``: ``None`` for a superiority reading, ``> 0`` (in the metric's units) for non-inferiority.
    """

    source: str
    base: dict
    mechanisms: tuple[str, ...]
    baseline: str
    seeds: int
    lrs: tuple[float, ...]
    metric: str
    higher_is_better: bool
    margin: float | None = None
    seed: int = 0
    replicate_baseline: bool = False

    @property
    def seed_list(self) -> list[int]:
        return [self.seed + i for i in range(self.seeds)]

    @property
    def steps(self) -> int:
        return int(self.base["steps"])


def default_metric(kind: str) -> tuple[str, bool]:
    """``(metric, higher_is_better)`` read by default for a task kind: accuracy for classifiers, mIoU for
    segmentation, else the loss."""
    if kind in ("image_classification", "sequence_classification", "pair_classification"):
        return "accuracy", True
    if kind == "semantic_segmentation":
        return "miou", True
    return "loss", False


def metric_direction(metric: str) -> bool:
    """Whether a larger value of ``metric`` is better (accuracy, mIoU) or worse (loss, perplexity, error)."""
    return metric in ("accuracy", "pixel_accuracy", "miou")


def run_config(spec: CompareSpec, mechanism: str, *, lr: float | str, seed: int, steps: int) -> dict:
    """The training config of one run of ``mechanism``: the base config with its attention, rate, seed and steps;
    validation at :data:`CURVE_POINTS` evenly spaced steps (the learning curves)."""
    every = max(1, math.ceil(steps / CURVE_POINTS))  # the last point falls on the final step
    return dict(
        spec.base,
        attention=mechanism,
        lr=lr,
        seed=seed,
        steps=steps,
        eval_every=every,
        ckpt_every=every,
        keep_checkpoints=1,
    )


def row_ids(mechanism: str) -> str:
    """The id prefix of a row's steps (``compare/<mechanism>``)."""
    return f"{PREFIX}/{mechanism}"


def longer_id(mechanism: str, seed: int) -> str:
    """Step id of a row's run at twice the steps (plateau evidence)."""
    return seeded_id(f"{row_ids(mechanism)}/2x", seed)


def plan_steps(spec: CompareSpec) -> list[Step]:
    """Every step of ``spec``, dependencies (the sweeps) before the seeds that read them."""
    steps: list[Step] = []
    sweep_seed = spec.seed + SWEEP_SEED_OFFSET
    for mech in spec.mechanisms:
        for lr in spec.lrs:
            cfg = {"train": run_config(spec, mech, lr=lr, seed=sweep_seed, steps=spec.steps)}
            steps.append(Step(sweep_id(row_ids(mech), lr), SECTION, cfg, train_step, label=f"{mech} lr {lr:g}"))
    for mech in spec.mechanisms:
        runs = [(seeded_id(row_ids(mech), s), s, spec.steps) for s in spec.seed_list]
        if spec.replicate_baseline and mech == spec.baseline:
            runs += [(longer_id(mech, s), s, 2 * spec.steps) for s in spec.seed_list]
        for sid, seed, n in runs:
            cfg = {"train": run_config(spec, mech, lr=spec.lrs[0], seed=seed, steps=n)}
            cfg = tuned(cfg, PREFIX, mech, spec.lrs, spec.metric, spec.higher_is_better)
            deps = tuple(cfg["sweep"]["ids"].values())
            steps.append(Step(sid, SECTION, cfg, train_step, deps=deps, label=f"{mech} seed {seed} ({n} steps)"))
    return steps


def train_step(ctx, step: Step) -> dict:
    """Train one run (resuming its checkpoint): its validation metrics, learning curves and rate, plus the parameter
    count and the median time of a training step in milliseconds (the trainer's throughput, evaluation excluded)."""
    from attnzoo.compare.common import load_trained, num_params

    cfg = dict(step.config["train"])
    rec = train_run(ctx, step.id, cfg, sweep=step.config.get("sweep"))
    rec["params"] = num_params(load_trained(rec["run_dir"]))
    rate = rec.get("samples_per_s")
    rec["step_ms"] = 1000.0 * cfg["batch_size"] / rate if rate and math.isfinite(rate) and rate > 0 else None
    rec["run_dir"] = step.id  # relative to the compare directory's runs/: the record does not depend on --out
    # the metrics at the top level too: the sweep's best rate and the sweep table read them there
    return {**rec["val"], **rec}
