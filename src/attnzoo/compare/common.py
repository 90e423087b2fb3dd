"""Shared pieces of a comparison's steps and sections (``attnzoo compare`` and the reproduce report): run context, the
training adapter, learning-rate sweeps, memory, tables, plots."""

from __future__ import annotations

import csv
import math
import os
import shutil
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, NamedTuple, Sequence

import numpy as np
import torch

from attnzoo._io import ReadError, atomic_save_figure, read_json
from attnzoo.compare import claims
from attnzoo.compare.store import Interrupted, Step, StepStore


@dataclass
class Context:
    """What every step function gets: where to write, the seed, the device and whether to show progress."""

    out: Path
    store: StepStore
    seed: int
    device: str = "cpu"
    progress: bool = True


@dataclass
class Table:
    """A report table of formatted cells; an ``appendix`` table (a learning-rate sweep) goes to configs.md."""

    title: str
    headers: list[str]
    rows: list[list[Any]]
    caption: str = ""
    appendix: bool = False

    def markdown(self) -> str:
        return md_table(self.headers, self.rows)


@dataclass
class Section:
    """A summarised section: tables, PNG plots (paths relative to the output dir), findings, numbers."""

    key: str
    title: str
    intro: str = ""
    tables: list[Table] = field(default_factory=list)
    plots: list[tuple[str, str]] = field(default_factory=list)  # (relative path, caption)
    findings: list[dict] = field(default_factory=list)  # {"claim", "measured", "verdict"}
    data: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: one line for the summary: the scale of this section's runs against the papers' (empty: not a trained section)
    scale: str = ""

    def add_plot(self, fig, path: Path, rel, caption: str, dpi: int = 100) -> None:
        """Save ``fig`` as the PNG ``path`` and list it as the report links it (``rel(path)``)."""
        save_figure(fig, path, dpi=dpi)
        self.plots.append((rel(path), caption))

    def add_curves(
        self, panels: list, path: Path, rel, what: str, title: str, note: str = "seed means", points: str = ""
    ) -> None:
        """The validation curves of ``panels`` (``[(panel, {row: [[step, value], ...]})]``), where any row has one;
        the caption gives ``note`` and what the points are (``points``; by default the trainer's :data:`CURVE_NOTE`)."""
        if any(c for _, p in panels for c in p.values()):
            caption = f"Validation {what} during training ({'; '.join(filter(None, (note, points or CURVE_NOTE)))})."
            self.add_plot(plot_val_curves(panels, f"validation {what}", title), path, rel, caption)


class ModelRow(NamedTuple):
    """One trained row: the registered model, the attention it compares, how the table names it."""

    registered: str
    mechanism: str
    description: str


# ---- seeds ------------------------------------------------------------------------------------------
def seed_list(plan: dict, seed: int) -> list[int]:
    """``seed, seed+1, ...``: ``plan["seeds"]`` of them (default 1)."""
    n = plan.get("seeds", 1)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"a section's 'seeds' must be a positive int, got {n!r}")
    return [seed + i for i in range(n)]


def plateau_seed_list(plan: dict, seed: int) -> list[int]:
    """The seeds a run at twice the steps trains: the first ``plan["plateau_seeds"]`` of :func:`seed_list` (all by
    default), as such a run costs two seed runs."""
    return seed_list(plan, seed)[: plan.get("plateau_seeds")]


def seeded_id(base: str, seed: int) -> str:
    """Step id of one seed's run of ``base``: ``vision/vit/seed1``."""
    return f"{base}/seed{seed}"


def per_seed(records: dict[str, dict], base: str) -> list[dict]:
    """The results of every seed's run of ``base`` that has a record, in seed order."""
    prefix = base + "/seed"
    seeds = {sid: int(sid[len(prefix) :]) for sid in records if sid.startswith(prefix) and sid[len(prefix) :].isdigit()}
    return [records[sid]["result"] for sid in sorted(seeds, key=seeds.get)]


# ---- did a row learn ---------------------------------------------------------------------------------
#: a row has learned its task when every seed's accuracy (%) clears the majority class (or chance) by this many points
LEARNED_MARGIN = 10.0


def unlearned_seeds(accuracies: Iterable[float], bar: float, margin: float = LEARNED_MARGIN) -> list[float]:
    """The seeds' accuracies (%) that do not clear ``bar`` (the majority class or chance) by ``margin`` points."""
    return [v for v in accuracies if v < bar + margin]


def learned(accuracies: Iterable[float], bar: float, margin: float = LEARNED_MARGIN) -> bool:
    """Every seed clears ``bar`` by ``margin`` (a seed mean would hide one that did not)."""
    return not unlearned_seeds(accuracies, bar, margin)


def did_not_learn(failed: Sequence[float], n: int, row: str, rule: str, spec: str = ".1f", unit: str = "") -> str:
    """A did-not-learn gate's reason: which of ``row``'s ``n`` seeds fell short of ``rule``, with their values."""
    vals = ", ".join(format(v, spec) for v in failed)
    return f"{len(failed)} of {n} seeds of {row} did not learn ({rule}: {vals}{unit})"


def rate_text(lrs: Sequence[float], lr: float, rows: str = "each row") -> str:
    """How the rows' learning rates were chosen, for an intro (the sweeps' seed and length: configs.md)."""
    if not lrs:
        return f"lr {lr:g}, not tuned"
    return f"{rows} at the best rate of its sweep over {', '.join(f'{x:g}' for x in sorted(set(lrs)))}"


def stat_data(name: str, st: Any) -> dict:
    """A :class:`claims.Stat` as results.json stores a row's measure: ``<name>_mean``, ``_std`` and ``_per_seed``."""
    return {f"{name}_mean": st.mean, f"{name}_std": st.std, f"{name}_per_seed": list(st.values)}


def seeds_text(n: int, per: str = "row") -> str:
    """``"3 seeds per row"``."""
    return f"{n} seed{'s' if n > 1 else ''} per {per}"


def width_text(plan: dict, rows) -> str:
    """The plan's width, and the ``rows`` that ``row_arch`` sets to another: "width 64 (44: tost, xcit; 80: crate)"."""
    base, other = plan["arch"]["dim"], {}
    for name in rows:
        dim = plan.get("row_arch", {}).get(name, {}).get("dim", base)
        if dim != base:
            other.setdefault(dim, []).append(name)
    rest = "; ".join(f"{d}: {', '.join(names)}" for d, names in sorted(other.items()))
    return f"width {base}" + (f" ({rest})" if rest else "")


def extra_seed_counts(plan: dict) -> dict[str, int]:
    """Row -> how many seeds it trains beyond the plan's ``seeds``: ``extra_seeds``' ``rows`` get its ``seeds``, a row
    of its ``per_row`` (row -> count) its own count."""
    extra = plan.get("extra_seeds", {})
    if unknown := sorted(set(extra) - {"rows", "seeds", "per_row"}):
        raise ValueError(f"extra_seeds has unknown keys {unknown}; valid: rows, seeds, per_row")
    counts = {row: extra["seeds"] for row in extra.get("rows", [])} | dict(extra.get("per_row", {}))
    if bad := {r: n for r, n in counts.items() if not isinstance(n, int) or isinstance(n, bool) or n < 1}:
        raise ValueError(f"extra_seeds counts must be positive ints, got {bad}")
    return counts


def extra_seeds_text(plan: dict) -> str:
    """``"vit, tost: 5 seeds more"`` for a plan's ``extra_seeds`` (one group per count); ``""`` without them."""
    groups: dict[int, list[str]] = {}
    for row, n in extra_seed_counts(plan).items():
        groups.setdefault(n, []).append(row)
    return "; ".join(f"{', '.join(rows)}: {n} seeds more" for n, rows in groups.items())


def fold(rs: Sequence[dict], stats: dict[str, float], means: Sequence[str] = (), first: Sequence[str] = ()) -> dict:
    """A row's seeds folded: each of ``stats`` (key -> scale) as a Stat, ``means`` as seed means, ``first`` from the
    first seed; with the seed count and the mean validation curve of the first of ``stats``."""
    out = {k: claims.stat(scale * r[k] for r in rs if r.get(k) is not None) for k, scale in stats.items()}
    out |= {k: seed_mean(rs, k) for k in means} | {k: rs[0].get(k) for k in first}
    key, scale = next(iter(stats.items()))
    return out | {"seeds": len(rs), "val_curve": mean_val_curve(rs, key, scale)}


# ---- formatting -------------------------------------------------------------------------------------
def seed_mean(records: Sequence[dict], key: str) -> float | None:
    """Mean of ``key`` over the seeds' results that have it; ``None`` if none has."""
    vals = [r[key] for r in records if r.get(key) is not None]
    return float(np.mean(vals)) if vals else None


def fmt(value: Any, spec: str = ".3g") -> str:
    """A table cell: ``-`` for missing values, ``format(value, spec)`` for numbers."""
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return format(value, spec) if isinstance(value, (int, float)) else str(value)


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """GitHub-flavoured markdown table (cells are ``str()``-ed, pipes escaped)."""

    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def save_figure(fig, path: str | os.PathLike, dpi: int = 100) -> Path:
    """Save a matplotlib figure as PNG atomically and close it."""
    return atomic_save_figure(fig, path, dpi=dpi)


def num_params(model: torch.nn.Module) -> int:
    """Parameters, tied weights counted once."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


# ---- memory -------------------------------------------------------------------------------------------
def peak_train_mb(model: torch.nn.Module, inputs: tuple, target: torch.Tensor, kind: str, device: str) -> float | None:
    """Extra memory (MiB) at the peak of one training step on a batch; ``None`` where the CPU cannot measure it."""
    from attnzoo.bench.memory import cpu_peak_supported, peak_memory_bytes
    from attnzoo.train.objectives import compute_loss

    dev = torch.device(device)
    if dev.type == "cpu" and not cpu_peak_supported():
        return None
    model = model.to(dev).train()
    inputs = tuple(x.to(dev) for x in inputs)
    target = target.to(dev)
    model.zero_grad(set_to_none=True)

    def step():
        compute_loss(kind, model(*inputs), target)[0].backward()

    step()  # warm-up: first-call allocations (workspaces, lazily built buffers) are not the model's cost
    model.zero_grad(set_to_none=True)
    peak = peak_memory_bytes(step, dev)
    model.zero_grad(set_to_none=True)
    return peak / 2**20


#: a trained run validates at this many evenly spaced points (the learning curves of every trained table)
CURVE_POINTS = 4
#: validation batches of a curve's points before the last (the last point, the run's result, uses every batch)
CURVE_EVAL_BATCHES = 8
#: how a caption states what the curves' points are
CURVE_NOTE = f"last point: whole validation set; earlier: its first {CURVE_EVAL_BATCHES} batches"


# ---- training -----------------------------------------------------------------------------------------
def train_defaults(**kw) -> dict:
    """The optimisation settings every model of a section shares (not tuned per model)."""
    optim = dict(optimizer="adamw", lr=1e-3, weight_decay=0.05, schedule="cosine", warmup_steps=0, grad_clip=1.0)
    return optim | dict(amp="off", compile=False, log_every=10, keep_checkpoints=1) | kw


def _metrics_rows(run_dir: Path) -> dict[str, list[dict]]:
    """A run's metrics.csv rows by split, parsed, empty cells left out; damage is a ``ReadError`` naming it."""
    f, out = run_dir / "metrics.csv", {"train": [], "val": []}
    if not f.is_file():
        return out
    try:
        with open(f, newline="", encoding="utf-8") as fh:
            rows = [r for r in csv.DictReader(fh) if r.get("split") in out]
        for r in rows:
            out[r.pop("split")].append({k: int(v) if k == "step" else float(v) for k, v in r.items() if v})
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, csv.Error) as e:
        raise ReadError(
            f"{f} is damaged ({type(e).__name__}: {e}); delete the step's record in steps/ and its run directory "
            "to compute it again"
        ) from None
    return out


def train_run(ctx: Context, step_id: str, cfg: dict, sweep: dict | None = None) -> dict:
    """Train into ``runs/<step_id>`` (resuming its checkpoint), at ``sweep``'s best rate if given (:func:`tuned`);
    returns the final validation metrics, median throughputs, curves, run dir and learning rate."""
    from attnzoo.train.config import from_dict
    from attnzoo.train.trainer import load_run, train

    full = dict(cfg)
    if sweep is not None:
        full["lr"] = best_swept_lr(ctx, sweep)
    full.setdefault("device", ctx.device)
    full.setdefault("eval_every", max(1, full["steps"] // CURVE_POINTS))
    # the curve's earlier points on part of the validation set, so the curve costs little; the result uses it all
    full.setdefault("curve_eval_batches", CURVE_EVAL_BATCHES)
    full.setdefault("ckpt_every", max(1, full["steps"] // 4))
    tcfg = from_dict(full)
    run_dir = ctx.store.run_dir(step_id)
    resume, overwrite = True, False
    if (run_dir / "config.yaml").is_file():
        if load_run(run_dir).to_dict() != tcfg.to_dict():
            resume, overwrite = False, True  # the plan changed since that run: start it again
        else:
            final = _final_metrics(run_dir / "final.json")
            if final and (run_dir / "model").is_dir():
                return _train_record(run_dir, final, tcfg.lr)
    elif run_dir.exists() and any(run_dir.iterdir()):
        shutil.rmtree(run_dir)  # a half-created run directory (killed before the trainer wrote its marker)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    result = train(tcfg, run_dir, resume=resume, overwrite=overwrite, progress=ctx.progress)
    if not result.interrupted and not result.final_metrics:
        # the checkpoint was at the last step but the run died before writing its results: run it again
        result = train(tcfg, run_dir, overwrite=True, progress=ctx.progress)
    if result.interrupted:
        raise Interrupted(f"training of {step_id} stopped by signal at step {result.step}")
    return _train_record(run_dir, result.final_metrics, tcfg.lr)


def tuned(
    step_config: dict,
    prefix: str,
    row: str,
    lrs: Sequence[float],
    metric: str,
    higher_is_better: bool,
    settings: str = "train",
) -> dict:
    """``step_config`` with its ``settings`` at the best rate of row ``row``'s sweep, read when the step runs."""
    if not lrs:
        return step_config
    ids = {f"{lr:g}": sweep_id(f"{prefix}/{row}", lr) for lr in lrs}
    sweep = {"ids": ids, "metric": metric, "higher_is_better": higher_is_better}
    return step_config | {settings: dict(step_config[settings], lr="tuned"), "sweep": sweep}


def sweep_deps(step_config: dict) -> tuple[str, ...]:
    """The sweep steps a :func:`tuned` config reads (none for an untuned one)."""
    return tuple(step_config.get("sweep", {}).get("ids", {}).values())


def best_swept_lr(ctx: Context, sweep: dict) -> float:
    """The learning rate of ``sweep``'s best stored run by its metric (the lowest rate among equals)."""
    vals = {}
    for lr, sid in sweep["ids"].items():
        rec = ctx.store.load_by_id(sid)
        v = rec["result"].get(sweep["metric"]) if rec else None
        if v is None or not math.isfinite(v):
            raise ValueError(f"the learning-rate sweep run {sid} has no finite {sweep['metric']!r}; it must run first")
        vals[float(lr)] = v if sweep["higher_is_better"] else -v
    return max(sorted(vals), key=vals.get)


def _final_metrics(done: Path) -> dict | None:
    """A finished run's validation metrics; ``None`` when missing or damaged (deleted: the resume writes it again)."""
    if not done.is_file():
        return None
    try:
        final = read_json(done, "a training run's final metrics")
        if not isinstance(final, dict) or not isinstance(final.get("val"), dict):
            raise ReadError(f"{done} is corrupt: no 'val' metrics")
    except ReadError as e:
        print(f"attnzoo: {e}; it is computed again from the run's last checkpoint", file=sys.stderr)
        done.unlink()
        return None
    return final["val"]


def _train_record(run_dir: Path, final: dict, lr: float) -> dict:
    """A finished run's validation metrics and rate, the median throughputs of its training rows, its training-loss
    curve ``[[step, loss], ...]`` and its validation rows in step order."""
    rows = _metrics_rows(run_dir)
    rates = {k: [r[k] for r in rows["train"] if k in r] for k in ("samples_per_s", "tokens_per_s")}
    rates = {k: statistics.median(v) if v else None for k, v in rates.items()}
    val = {r["step"]: {k: v for k, v in r.items() if k not in ("lr", "elapsed_s")} for r in rows["val"]}
    curve = [[r["step"], r["loss"]] for r in rows["train"] if "loss" in r]
    val_curve = [val[k] for k in sorted(val)]
    return {"val": final, "lr": lr, **rates, "run_dir": str(run_dir), "curve": curve, "val_curve": val_curve}


#: what a step's result keeps of its training run (:func:`train_run`)
RUN_KEYS = ("curve", "val_curve", "run_dir", "lr")


def load_trained(run_dir: str | os.PathLike) -> torch.nn.Module:
    """The model a :func:`train_run` saved (eval mode)."""
    from attnzoo.models import from_pretrained

    return from_pretrained(Path(run_dir) / "model")


#: the suffix of a row trained at twice the steps (and warm-up), nothing else changed: a plateau run
LONGER = "@2x-steps"


def twice_steps(train: dict) -> dict:
    """``train`` at twice the steps and warm-up (a plateau run), nothing else changed."""
    return {**train, "steps": 2 * train["steps"], "warmup_steps": 2 * train.get("warmup_steps", 0)}


def classification_record(ctx: Context, step: Step) -> dict:
    """Train a classifier, then its parameters and the peak memory of one training step (vision, LRA)."""
    from attnzoo.data import build_task

    cfg = step.config["train"]
    rec = train_run(ctx, step.id, cfg, sweep=step.config.get("sweep"))
    model = load_trained(rec["run_dir"])
    task = build_task(cfg["task"], **cfg["task_options"])
    inputs, target = task.train.get_batch(np.arange(min(cfg["batch_size"], len(task.train))))
    val, grid = rec["val"], getattr(model, "grid", None)
    return {
        "accuracy": val.get("accuracy"),
        "val_loss": val.get("loss"),
        "params": num_params(model),
        "samples_per_s": rec["samples_per_s"],
        "steps_per_s": (rec["samples_per_s"] / cfg["batch_size"]) if rec["samples_per_s"] else None,
        "peak_train_mb": peak_train_mb(model, inputs, target, task.kind, ctx.device),
        "seq_len": task.info.get("seq_len"),
        "tokens": None if grid is None else int(grid[0] * grid[1]) + int(getattr(model, "num_prefix_tokens", 0)),
    } | {k: rec[k] for k in RUN_KEYS}


def untrained_model(train_cfg: dict):
    """The model of ``train_cfg`` as its seed initialises it (eval mode), and its task: an untrained control."""
    from attnzoo.data import build_task
    from attnzoo.train.config import from_dict
    from attnzoo.train.objectives import build_task_model

    tcfg = from_dict({**train_cfg, "eval_every": 1})
    task = build_task(tcfg.task, **tcfg.task_options)
    torch.manual_seed(tcfg.seed)
    return build_task_model(tcfg, task).eval(), task


# ---- learning-rate sweeps --------------------------------------------------------------------------------
#: the sweep trains on its own seed, apart from the reported seeds (base seed + this offset)
SWEEP_SEED_OFFSET = 100


def sweep_train(train: dict, plan: dict) -> dict:
    """A sweep run's settings: ``train`` at the plan's ``sweep_fraction`` (default 1) of its steps and warm-up."""
    frac = plan.get("sweep_fraction", 1.0)
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 < frac <= 1:
        raise ValueError(f"a section's 'sweep_fraction' must be in (0, 1], got {frac!r}")
    out = dict(train, steps=max(1, round(train["steps"] * frac)))
    if "warmup_steps" in train:
        out["warmup_steps"] = round(train["warmup_steps"] * frac)
    return out


def row_lrs(plan: dict, row: str) -> list[float]:
    """Row ``row``'s learning rates, ascending: the section's ``lr_sweep`` and its ``lr_sweep_extra``."""
    common = list(plan.get("lr_sweep", []))
    extra = list(plan.get("lr_sweep_extra", {}).get(row, []))
    if extra and not common:
        raise ValueError(f"lr_sweep_extra gives row {row!r} rates {extra} but the section has no lr_sweep")
    return sorted(set(common) | set(extra))


def check_sweep_extra(plan: dict, rows: Sequence[str]) -> None:
    """An ``lr_sweep_extra`` entry must name a swept row of the section."""
    unknown = sorted(set(plan.get("lr_sweep_extra", {})) - set(rows))
    if unknown:
        raise ValueError(f"lr_sweep_extra names rows {unknown} that are not swept here; valid: {sorted(rows)}")


def check_row_arch(plan: dict, rows: Sequence[str]) -> None:
    """A ``row_arch`` entry must name a row of the section's plan."""
    if unknown := sorted(set(plan.get("row_arch", {})) - set(rows)):
        raise ValueError(f"row_arch names rows {unknown} that are not rows of this plan; rows: {list(rows)}")


def check_known(names: Iterable[str], valid: Iterable[str], what: str) -> None:
    for n in names:
        if n not in valid:
            raise ValueError(f"unknown {what} {n!r}; valid: {sorted(valid)}")


def sweep_id(base: str, lr: float) -> str:
    """Step id of one rate of row ``base``'s sweep: ``vision/vit/lr-sweep/lr0.002``."""
    return f"{base}/lr-sweep/lr{lr:g}"


def sweep_runs(base: str, lrs: Iterable[float], seed: int) -> list[tuple[str, int, float]]:
    """Row ``base``'s sweep: ``(step id, seed, rate)`` per rate, all on the sweep's seed."""
    return [(sweep_id(base, lr), seed + SWEEP_SEED_OFFSET, lr) for lr in lrs]


def seed_runs(base: str, seeds: Iterable[int]) -> list[tuple[str, int]]:
    return [(seeded_id(base, s), s) for s in seeds]


def section_step(key: str, sid: str, cfg: dict, fn, deps: tuple[str, ...] = ()) -> Step:
    """Step ``sid``: ``fn`` on ``cfg`` after ``deps`` and the sweep runs a tuned ``cfg`` reads."""
    return Step(sid, key, cfg, fn, deps=(*deps, *sweep_deps(cfg)), label=sid.split("/", 1)[1])


def sweep_table(
    records: dict,
    rows: Sequence[str],
    prefix: str,
    lrs: Sequence[float] | dict[str, Sequence[float]],
    metric: str,
    higher_is_better: bool,
    scale: float = 1.0,
    label: str = "",
    fraction: float = 1.0,
    noise: dict[str, float] | None = None,
    floor: float | None = None,
) -> tuple[Table | None, dict[str, str]]:
    """The sweep as a table (best rate in bold) and ``{row: why}`` for each row not tuned: an incomplete sweep, a best
    at an end of the grid (†) unless within the row's seed ``noise`` of its neighbour (‡, a flat top), a best not
    above ``floor`` (§, learned at no rate)."""
    grids = {row: sorted(lrs.get(row, []) if isinstance(lrs, dict) else lrs) for row in rows}
    columns = sorted(set().union(*grids.values()))
    if not columns:
        return None, {}
    table_rows, untuned, marks = [], {}, []
    for row, grid in grids.items():
        recs = {lr: records.get(sweep_id(f"{prefix}/{row}", lr)) for lr in grid}
        vals = {lr: scale * v for lr, rec in recs.items() if rec and (v := rec["result"].get(metric)) is not None}
        if len(vals) < len(grid):
            if vals:
                untuned[row] = f"{row}'s learning-rate sweep is incomplete"
            continue
        best = (max if higher_is_better else min)(sorted(vals), key=vals.get)
        at_edge = len(grid) > 1 and best in (grid[0], grid[-1])
        near = vals[grid[1 if best == grid[0] else -2]] if at_edge else None
        mark = ""
        if floor is not None and higher_is_better and vals[best] <= floor:
            mark = " §"
            untuned[row] = (
                f"no swept learning rate of {row} beats {floor:.3g} (best {vals[best]:.3g}): it learned at none"
            )
        elif at_edge and noise and noise.get(row) is not None and abs(vals[best] - near) <= noise[row]:
            mark = " ‡"
        elif at_edge:
            mark = " †"
            end, text = "lowest" if best == grid[0] else "highest", ", ".join(f"{x:g}" for x in grid)
            untuned[row] = f"{row}'s best swept learning rate {best:g} is the {end} of the grid ({text})"
        marks.append(mark)
        cells = [f"**{vals[lr]:.3g}**" if lr == best else f"{vals[lr]:.3g}" if lr in vals else "–" for lr in columns]
        table_rows.append([row + mark, *cells])
    if not table_rows:
        return None, untuned
    title = "Learning-rate sweep" + (f" ({label})" if label else "")
    caption = _sweep_caption(metric, fraction, marks, any(g != columns for g in grids.values()), floor)
    return Table(title, ["row"] + [f"lr {lr:g}" for lr in columns], table_rows, caption, appendix=True), untuned


def tune_rows(
    sec: Section,
    records: dict,
    plan: dict,
    rows: Sequence[str],
    prefix: str,
    metric: str,
    higher_is_better: bool,
    scale: float = 1.0,
    label: str = "",
    *,
    grid: Sequence[float] | None = None,
    noise: dict[str, float] | None = None,
    floor: float | None = None,
    unswept: str = "no learning-rate sweep at this budget ({row})",
) -> dict[str, str]:
    """Each row's sweep (:func:`row_lrs`, or ``grid``) as a table in ``sec``; ``{row: why}`` of the rows not tuned."""
    grids = {r: row_lrs(plan, r) for r in rows} if grid is None else list(grid)
    fraction = plan.get("sweep_fraction", 1.0)
    table, untuned = sweep_table(
        records, rows, prefix, grids, metric, higher_is_better, scale, label, fraction, noise, floor
    )
    sec.tables += [table] if table else []
    if not (plan.get("lr_sweep") if grid is None else grid):
        return {r: unswept.format(row=r) for r in rows}
    return untuned


def _sweep_caption(metric: str, fraction: float, marks: list[str], uneven: bool, floor: float | None) -> str:
    """The sweep table's caption: what was swept, on which seed and length, and what the marks mean."""
    edge, flat, unlearned = (marks.count(m) for m in (" †", " ‡", " §"))
    caption = f"{metric} on the sweep seed (base + {SWEEP_SEED_OFFSET})"
    caption += (f", {fraction:.0%} of the reported steps" if fraction < 1 else "") + "; best in bold."
    if edge:
        caption += f" †: best at an end of the grid ({edge} of {len(marks)} rows): not tuned."
    elif not (flat or unlearned):
        caption += " Every best rate lies inside the grid."
    if flat:
        caption += f" ‡: best at an end, within one seed std of its neighbour ({flat} rows): a flat top, tuned."
    if unlearned:
        caption += f" §: no swept rate beats {floor:.3g} ({unlearned} row{'s' if unlearned > 1 else ''}): not tuned."
    if uneven:
        caption += " –: a rate outside that row's grid."
    return caption


# ---- learning curves ------------------------------------------------------------------------------------------
def mean_val_curve(results: Sequence[dict], metric: str, scale: float = 1.0) -> list[list[float]]:
    """``[[step, seed mean of scale * metric], ...]`` over the steps every seed logged."""
    curves = [{p["step"]: p[metric] for p in r.get("val_curve") or [] if p.get(metric) is not None} for r in results]
    if not curves or not all(curves):
        return []
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    return [[s, scale * float(np.mean([c[s] for c in curves]))] for s in steps]


def curve_text(curve: Sequence[Sequence[float]], spec: str = ".3g") -> str:
    """``step 50: 41.2, step 100: 55.0, ...``."""
    if not curve:
        return "no validation curve"
    return ", ".join(f"step {int(s)}: {format(v, spec)}" for s, v in curve)


def pyplot():
    """pyplot on the Agg backend: the report only writes PNG files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_val_curves(panels: Sequence[tuple[str, dict[str, list]]], ylabel: str, title: str):
    """One panel per table: every row's mean validation curve against steps."""
    panels = [(t, c) for t, c in panels if any(c.values())]
    n = max(1, len(panels))
    fig, axes = pyplot().subplots(1, n, figsize=(5.2 * n, 3.8), squeeze=False)
    for ax, (name, curves) in zip(axes[0], panels, strict=True):
        for i, (row, pts) in enumerate(curves.items()):
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, color=f"C{i % 10}", label=row)
        ax.set_title(name, fontsize=9)
        ax.set(xlabel="training step", ylabel=ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig
