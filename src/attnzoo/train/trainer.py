"""The training loop, nanoGPT-style: :func:`_loop` reads top to bottom; each part of a step is a named helper.

``train(cfg, out_dir)`` builds the task and model, then for each step: learning rate from the schedule, this
process's shard of the step's global batch, forward under autocast, backward (DDP averages gradients), clipping,
optimizer step. It logs to a progress bar, ``metrics.csv`` and TensorBoard (when installed), evaluates every
``eval_every`` steps, checkpoints every ``ckpt_every`` steps and when SIGINT/SIGTERM arrives, and resumes
bit-exactly from a checkpoint.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
from safetensors import SafetensorError
from torch import nn

from attnzoo._io import write_error, write_json
from attnzoo._lock import DirectoryLocked, DirLock, refuse_if_locked
from attnzoo.data.datasets import Batch
from attnzoo.data.tasks import Task, build_task, pack_task
from attnzoo.train.batches import train_batches
from attnzoo.train.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
    unwrap_model,
)
from attnzoo.train.config import ConfigError, TrainConfig
from attnzoo.train.device import amp_dtype, autocast, resolve_device
from attnzoo.train.distributed import (
    SINGLE_PROCESS,
    BatchSchedule,
    DistInfo,
    all_gather_floats,
    all_reduce_max,
    all_reduce_sum,
    barrier,
    init_distributed,
    shutdown_distributed,
)
from attnzoo.train.metrics_log import MetricsLog
from attnzoo.train.objectives import MetricAccumulator, build_task_model, check_model_choice, compute_loss
from attnzoo.train.optim import build_optimizer
from attnzoo.train.run_dir import (
    RUN_MARKER,
    RunMode,
    check_resume_config,
    clean_leftovers,
    foreign_run_files,
    load_run,
    run_dir_mode,
    write_run_files,
)
from attnzoo.train.schedules import lr_at
from attnzoo.train.selection import BestCheckpoint

__all__ = [
    "train",
    "TrainResult",
    "build_task_model",
    "check_model_choice",
    "evaluate",
    "run_dir_mode",
    "resolve_device",
    "RUN_MARKER",
    "load_run",
    "foreign_run_files",
    "ModelFactory",
    "build_run_task",
]

ModelFactory = Callable[[TrainConfig, Task], nn.Module]


@dataclass
class TrainResult:
    out_dir: Path
    step: int
    interrupted: bool = False
    signal: int | None = None
    final_metrics: dict[str, Any] = field(default_factory=dict)
    train_losses: list[tuple[int, float]] = field(default_factory=list)


def train(
    cfg: TrainConfig | None,
    out_dir: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    model_factory: ModelFactory | None = None,
    callback: Callable[[int, float], None] | None = None,
) -> TrainResult:
    """Train according to ``cfg`` into ``out_dir`` (see :func:`run_dir_mode` for the directory rules).

    With ``resume=True`` and ``cfg=None`` the run's saved config is used. ``model_factory(cfg, task)``
    replaces ``attnzoo.create_model`` (for custom models). ``callback(step, loss)`` runs after each step.
    """
    out = Path(out_dir)
    # checked before anything is written (a foreign directory, a bad config: nothing touched), then again under
    # the run's lock, which a concurrent process may have changed the directory before
    try:
        mode, cfg = _mode_and_config(out, cfg, resume, overwrite, model_factory)
    except ConfigError:
        refuse_if_locked(out, "run directory")  # a run another process is writing: name that process instead
        raise
    device = resolve_device(cfg.device)
    info = init_distributed(device.type)
    lock = None
    try:
        lock = _lock_run(out, info)
        mode, cfg = _mode_and_config(out, cfg, resume, overwrite, model_factory)
        if info.is_main:
            _warn_about_schedule(cfg)
        device = resolve_device(cfg.device, info)
        run, start_step, window = _start(
            cfg, out, mode=mode, info=info, device=device, progress=progress, model_factory=model_factory
        )
        result = _loop(run, start_step, window, callback)
        _finish(run, result)
        return result
    finally:
        if lock is not None:
            lock.release()
        shutdown_distributed()


def _mode_and_config(
    out: Path, cfg: TrainConfig | None, resume: bool, overwrite: bool, model_factory: ModelFactory | None
) -> tuple[RunMode, TrainConfig]:
    """What ``train`` does with ``out`` and the validated config it runs (the saved one, checked, on resume)."""
    mode = run_dir_mode(out, resume, overwrite)
    if mode == "resume":
        cfg = check_resume_config(load_run(out), cfg)
    if cfg is None:
        raise ConfigError(f"no config given and nothing to resume in {out}")
    # a custom model factory needs no registered model name
    if model_factory is not None:
        TrainConfig(**{**cfg.to_dict(), "model": cfg.model or "<custom>"}).validate()
    else:
        cfg.validate()
        check_model_choice(cfg)
    return mode, cfg


def _warn_about_schedule(cfg: TrainConfig) -> None:
    """A warm-up as long as the run never reaches the learning rate asked for (e.g. an ImageNet preset's
    ``warmup_steps`` with a short ``--steps``): say so, with the peak it does reach."""
    if cfg.warmup_steps >= cfg.steps > 0:
        peak = lr_at(cfg.steps - 1, lr=cfg.lr, steps=cfg.steps, schedule=cfg.schedule, warmup_steps=cfg.warmup_steps)
        print(
            f"attnzoo train: warning: warmup_steps={cfg.warmup_steps} is not shorter than steps={cfg.steps}: the "
            f"learning rate only rises to {peak:.3g} of lr={cfg.lr:g} and the {cfg.schedule} schedule never starts; "
            f"pass e.g. --warmup_steps={max(cfg.steps // 10, 0)}",
            file=sys.stderr,
        )


def _lock_run(out: Path, info: DistInfo) -> DirLock | None:
    """The main process locks ``out`` (one writer per run directory); every process learns whether it could."""
    lock, err = None, None
    if info.is_main:
        try:
            lock = DirLock(out, what="run directory").acquire()
        except DirectoryLocked as e:
            err = e
    if all_reduce_max(int(err is not None), info):
        if err is not None:
            raise err
        raise DirectoryLocked(f"run directory {out} is in use by another process (the main process reported it)")
    return lock


# ---- the loop ----------------------------------------------------------------------------------------
def _loop(
    run: _Run, start_step: int, window: _LossWindow, callback: Callable[[int, float], None] | None
) -> TrainResult:
    """Steps ``start_step + 1 .. cfg.steps``: train, then log, evaluate and checkpoint when they are due."""
    cfg = run.cfg
    result = TrainResult(run.out, start_step)
    step = start_step
    run.model.train()
    batches = train_batches(run.task.train, run.schedule, start_step, cfg.steps, pin_memory=run.device.type == "cuda")
    with _StopFlag() as stop:
        while step < cfg.steps:
            lr = lr_at(
                step,
                lr=cfg.lr,
                steps=cfg.steps,
                schedule=cfg.schedule,
                warmup_steps=cfg.warmup_steps,
                min_lr_ratio=cfg.min_lr_ratio,
            )
            for g in run.optimizer.param_groups:
                g["lr"] = lr
            loss = _train_step(run, next(batches), step)
            step += 1
            window.add(loss, cfg.batch_size)
            if callback is not None:
                callback(step, loss)
            last = step == cfg.steps
            if step % cfg.log_every == 0 or last:
                _log_train(run, step, lr, window, result)
            if run.bar is not None:
                run.bar.update(1)
            if step % cfg.eval_every == 0 or last:
                _log_eval(run, step, lr, result, last=last)
            if run.best is not None and (step % cfg.select_every == 0 or last):
                _select(run, step, lr)
            # any process's signal stops every process, after a checkpoint of this step
            signum = all_reduce_max(stop.signum or 0, run.info)
            if step % cfg.ckpt_every == 0 or last or signum:
                _save(run, step, window)
            if signum:
                _stopped(run, step, signum, result)
                break
    result.step = step
    return result


# ---- what the loop works on ----------------------------------------------------------------------------
@dataclass
class _Run:
    """Everything a run's steps use, built once by :func:`_start`."""

    cfg: TrainConfig
    out: Path
    info: DistInfo
    device: torch.device
    amp_dtype: torch.dtype | None
    task: Task
    model: nn.Module  # the plain model: checkpoints, clipping and evaluation use it
    train_model: nn.Module  # ``model`` compiled and/or DDP-wrapped: the forward of a training step
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None  # fp16 only
    schedule: BatchSchedule
    log: MetricsLog
    bar: Any  # tqdm progress bar (main process, progress=True) or None
    best: BestCheckpoint | None = None  # the best-checkpoint selection (``select_every``), else None
    t0: float = field(default_factory=time.perf_counter)

    @property
    def ckpt_root(self) -> Path:
        return self.out / "checkpoints"

    def elapsed(self) -> float:
        return round(time.perf_counter() - self.t0, 2)


@dataclass
class _LossWindow:
    """This process's train losses and samples since the last logged row (checkpointed: see :func:`_save`)."""

    loss_sum: float = 0.0
    count: int = 0
    samples: int = 0
    t_start: float = field(default_factory=time.perf_counter)

    def add(self, loss: float, samples: int) -> None:
        self.loss_sum += loss
        self.count += 1
        self.samples += samples

    def sums(self) -> list:
        """``[loss sum, count]``: what a checkpoint keeps."""
        return [self.loss_sum, self.count]


# ---- set-up ---------------------------------------------------------------------------------------------
def _start(
    cfg: TrainConfig,
    out: Path,
    *,
    mode: RunMode,
    info: DistInfo,
    device: torch.device,
    progress: bool,
    model_factory: ModelFactory | None,
) -> tuple[_Run, int, _LossWindow]:
    """Build task, model and optimizer, write the run directory, restore the checkpoint when resuming.

    Returns the run, the step to continue from and the restored loss window. The order of the random draws
    (model init from the shared seed, then a per-process stream) is part of bit-exact resume: keep it.
    """
    amp = amp_dtype(cfg.amp, device)
    task = build_run_task(cfg)
    if cfg.select_every and task.select is None:
        raise ConfigError(
            f"select_every={cfg.select_every} scores a held-out selection split, which task {cfg.task!r} with these "
            "options does not have (shakespeare_char: set task_options.select_chars); or set select_every=0"
        )
    best = BestCheckpoint(cfg.select_metric, cfg.select_mode) if cfg.select_every else None
    torch.manual_seed(cfg.seed)
    model = (model_factory or build_task_model)(cfg, task).to(device)
    schedule = BatchSchedule(
        len(task.train), cfg.batch_size, cfg.seed, info, shuffle=getattr(task.train, "shuffle", True)
    )
    optimizer = build_optimizer(
        model, cfg.optimizer, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(cfg.beta1, cfg.beta2)
    )
    scaler = torch.amp.GradScaler("cuda") if amp == torch.float16 else None
    # dropout etc. draw from a per-process stream (the model init above used the shared seed)
    torch.manual_seed(cfg.seed + 1 + info.rank)

    # everything is validated and built: now the output directory may be touched
    ckpt = latest_checkpoint(out / "checkpoints") if mode == "resume" else None
    barrier(info)  # every process has inspected the directory before the main one changes it
    if info.is_main:
        if mode == "resume":
            removed = clean_leftovers(out)
            if removed:
                shown = ", ".join(removed[:8]) + (f" ... ({len(removed)} in all)" if len(removed) > 8 else "")
                print(f"attnzoo train: removed what an earlier fault left in {out}: {shown}", file=sys.stderr)
        try:
            write_run_files(out, cfg, task, overwrite=mode == "overwrite")
        except OSError as e:
            raise write_error("the run's config files", e.filename or out, e) from None
    barrier(info)
    start_step, window = 0, _LossWindow()
    if ckpt is not None:
        start_step, window = _resume(ckpt, model, optimizer, scaler, info, best)
    elif mode == "resume" and info.is_main:
        print(f"attnzoo train: no checkpoint in {out}; starting from step 0", file=sys.stderr)

    log = MetricsLog(out, task.kind, enabled=info.is_main, resume_step=start_step if mode == "resume" else None)
    run = _Run(
        cfg=cfg,
        out=out,
        info=info,
        device=device,
        amp_dtype=amp,
        task=task,
        model=model,
        train_model=_wrap_for_training(model, cfg, info, device),
        optimizer=optimizer,
        scaler=scaler,
        schedule=schedule,
        log=log,
        bar=_progress_bar(cfg, start_step) if progress and info.is_main else None,
        best=best,
    )
    window.t_start = run.t0
    return run, start_step, window


def build_run_task(cfg: TrainConfig) -> Task:
    """The task a run of ``cfg`` trains on: ``cfg.task`` with its options, packed by document with ``cfg.pack``."""
    task = build_task(cfg.task, **cfg.task_options)
    return pack_task(task) if cfg.pack else task


def _resume(
    ckpt: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    info: DistInfo,
    best: BestCheckpoint | None = None,
) -> tuple[int, _LossWindow]:
    """Load ``ckpt`` (weights, optimizer, scaler, this process's RNG, the best-checkpoint record and weights); the
    step and loss window to continue from."""
    try:
        state = load_checkpoint(ckpt, model, optimizer, info, scaler)
    except CheckpointError as e:
        earlier = [p.name for p in list_checkpoints(ckpt.parent) if p.name != ckpt.name]
        if not earlier:
            raise
        raise CheckpointError(
            f"{e}. Other checkpoints of this run: {', '.join(earlier)}; to resume from one, "
            f"write its name into {ckpt.parent / 'latest'}"
        ) from None
    if state["world_size"] != info.world_size and info.is_main:
        print(
            f"attnzoo train: resuming a {state['world_size']}-process run on {info.world_size} processes; "
            "the data order is the same, dropout streams differ",
            file=sys.stderr,
        )
    if best is not None:
        best.restore(state, ckpt)
    loss_sum, count = _restored_window(state, info)
    if info.is_main:
        print(f"attnzoo train: resumed from {ckpt} (step {state['step']})", file=sys.stderr)
    return state["step"], _LossWindow(loss_sum, count)


def _restored_window(state: dict[str, Any], info: DistInfo) -> list:
    """This process's unlogged ``[loss sum, count]`` at the checkpoint.

    Every process's window is saved, so the first train loss logged after a resume averages the same losses,
    summed in the same order, as an uninterrupted run. On another number of processes (or from a checkpoint
    that kept only rank 0's window) the main process carries the whole sum.
    """
    try:
        if "loss_windows" in state:
            windows = [[float(s), int(c)] for s, c in state["loss_windows"]]
            if len(windows) == info.world_size:
                return windows[info.rank]
            total = [sum(w[0] for w in windows), sum(w[1] for w in windows)]
        else:
            s, c = state.get("loss_window", [0.0, 0])
            total = [float(s), int(c)]
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"state.json: corrupt loss window ({e})") from None
    return total if info.is_main else [0.0, 0]


def _wrap_for_training(model: nn.Module, cfg: TrainConfig, info: DistInfo, device: torch.device) -> nn.Module:
    """``torch.compile`` (``cfg.compile``), then DDP when several processes train."""
    train_model = torch.compile(model) if cfg.compile else model
    if info.enabled:
        ddp_kw = {"device_ids": [device.index]} if device.type == "cuda" else {}
        train_model = torch.nn.parallel.DistributedDataParallel(train_model, **ddp_kw)
    return train_model


def _progress_bar(cfg: TrainConfig, start_step: int):
    from tqdm.auto import tqdm

    return tqdm(total=cfg.steps, initial=start_step, desc=f"{cfg.task}/{cfg.model or 'model'}", dynamic_ncols=True)


# ---- one step and what follows it ----------------------------------------------------------------------------
def _train_step(run: _Run, batch: Batch, step: int) -> float:
    """Forward, backward, clip, optimizer step on this process's ``batch`` of ``step``; returns its loss."""
    inputs, target = batch
    inputs = tuple(x.to(run.device, non_blocking=True) for x in inputs)
    target = target.to(run.device, non_blocking=True)
    args, keywords = run.task.model_args(inputs)
    with autocast(run.device, run.amp_dtype):
        out = run.train_model(*args, **keywords)
    loss, _ = compute_loss(run.task.kind, out, target, run.cfg.label_smoothing)
    if not torch.isfinite(loss):
        raise FloatingPointError(f"loss is {float(loss)} at step {step}; lower lr or enable grad_clip")
    optimizer, scaler = run.optimizer, run.scaler
    if scaler is not None:  # fp16: scale the loss so small gradients survive, unscale before clipping
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
    else:
        loss.backward()
    if run.cfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), run.cfg.grad_clip)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def _log_train(run: _Run, step: int, lr: float, window: _LossWindow, result: TrainResult) -> None:
    """Log the mean train loss over every process's window (then empty it) and the throughput."""
    avg = all_reduce_sum(torch.tensor([window.loss_sum, float(window.count)], dtype=torch.float64), run.info)
    train_loss = float(avg[0] / avg[1])
    rate = window.samples / max(time.perf_counter() - window.t_start, 1e-9)
    # sequence tasks only: an image's token count depends on the model's patch size, so it is left empty
    tokens_per_sample = run.task.info.get("seq_len")
    run.log.log(
        step,
        "train",
        {
            "lr": lr,
            "loss": train_loss,
            "samples_per_s": round(rate, 2),
            "tokens_per_s": round(rate * tokens_per_sample, 1) if tokens_per_sample else "",
            "elapsed_s": run.elapsed(),
        },
    )
    result.train_losses.append((step, train_loss))
    if run.bar is not None:
        run.bar.set_postfix(loss=f"{train_loss:.4f}", lr=f"{lr:.2e}", samples_s=f"{rate:.0f}")
    window.loss_sum, window.count, window.samples, window.t_start = 0.0, 0, 0, time.perf_counter()


def _select(run: _Run, step: int, lr: float) -> None:
    """Score the selection split (logged as ``select`` rows) and keep the weights if the score is the best yet."""
    cfg = run.cfg
    scores = evaluate(
        run.model,
        run.task,
        cfg.eval_batch_size or cfg.batch_size,
        run.device,
        run.info,
        cfg.select_batches,
        run.amp_dtype,
        split="select",
    )
    run.log.log(step, "select", {**scores, "lr": lr, "elapsed_s": run.elapsed()})
    run.best.consider(step, scores, unwrap_model(run.model))


def _evaluate_run(run: _Run, last: bool = True) -> dict[str, Any]:
    cfg = run.cfg
    batches = cfg.eval_batches
    if not last and cfg.curve_eval_batches and (not batches or cfg.curve_eval_batches < batches):
        batches = cfg.curve_eval_batches  # an intermediate point of the learning curve: fewer batches
    return evaluate(
        run.model,
        run.task,
        cfg.eval_batch_size or cfg.batch_size,
        run.device,
        run.info,
        batches,
        run.amp_dtype,
    )


def _log_eval(run: _Run, step: int, lr: float, result: TrainResult, last: bool = True) -> None:
    metrics = _evaluate_run(run, last)
    run.log.log(step, "val", {**metrics, "lr": lr, "elapsed_s": run.elapsed()})
    result.final_metrics = metrics
    if run.bar is not None:
        run.bar.write(
            f"step {step}: " + ", ".join(f"val_{k}={v:.4f}" for k, v in metrics.items() if isinstance(v, float))
        )


def _save(run: _Run, step: int, window: _LossWindow) -> None:
    """Checkpoint ``step`` (collective) with every process's unlogged losses, so that the first train loss logged
    after a resume matches an uninterrupted run."""
    windows = [[s, int(c)] for s, c in all_gather_floats(window.sums(), run.info)]
    save_checkpoint(
        run.ckpt_root,
        step,
        run.model,
        run.optimizer,
        {
            "loss_window": window.sums(),
            "loss_windows": windows,
            "config": run.cfg.to_dict(),
            **({"best": run.best.record()} if run.best is not None else {}),
        },
        run.info,
        run.cfg.keep_checkpoints,
        run.scaler,
        tensors=run.best.tensors() if run.best is not None else None,
    )


def _stopped(run: _Run, step: int, signum: int, result: TrainResult) -> None:
    result.interrupted = True
    result.signal = signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM
    if run.info.is_main:
        print(
            f"\nattnzoo train: stopped by signal at step {step}; checkpoint saved. "
            f"Continue with: attnzoo train --resume --out {run.out}",
            file=sys.stderr,
        )


def _finish(run: _Run, result: TrainResult) -> None:
    """Close the logs; unless interrupted, write ``final.json`` and the model in ``save_pretrained`` form (and, with
    ``select_every``, the best-selected model and its scores)."""
    if run.bar is not None:
        run.bar.close()
    run.log.close()
    if not result.interrupted and not result.final_metrics and result.step > 0:
        # Resumed from the last checkpoint of a finished run: nothing ran, so evaluate the restored weights
        # rather than overwrite final.json with empty metrics.
        result.final_metrics = _evaluate_run(run)
    if result.interrupted:
        barrier(run.info)
        return
    if run.info.is_main:
        _save_model(run, "model")
    best = _best_summary(run)  # collective: every process evaluates the best weights
    if run.info.is_main:
        if best is not None:
            _save_model(run, "best_model")
        # last: a run with final.json is finished (the reproduce runner relies on it), so it follows the models
        final = {"step": result.step, "val": result.final_metrics, **({"best": best} if best is not None else {})}
        try:
            write_json(run.out / "final.json", final, nonfinite="keep", newline=False)
        except OSError as e:
            raise write_error("final.json", run.out / "final.json", e) from None
    barrier(run.info)


def _save_model(run: _Run, name: str) -> None:
    """The model's current weights in ``save_pretrained`` form under ``run.out / name`` (when it has that form)."""
    base = unwrap_model(run.model)
    if hasattr(base, "save_pretrained"):
        try:
            base.save_pretrained(str(run.out / name))
        except (OSError, SafetensorError) as e:  # safetensors reports a full disk as its own "I/O error"
            where = getattr(e, "filename", None) or run.out / name
            raise write_error(f"the {name.replace('_', ' ')}", where, e) from None


def _best_summary(run: _Run) -> dict[str, Any] | None:
    """Load the best-selected weights into the model and score them on ``val``: ``{step, select, val}``, or None
    without selection. The model keeps the best weights afterwards (the final ones are saved before)."""
    if run.best is None or run.best.weights is None:
        return None
    unwrap_model(run.model).load_state_dict(run.best.weights)
    return {**run.best.record(), "val": _evaluate_run(run)}


class _StopFlag:
    """Records SIGINT/SIGTERM so the loop can checkpoint at the next step boundary and exit."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _StopFlag:
        if threading.current_thread() is threading.main_thread():  # signal handlers: main thread only
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, _frame) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C aborts without waiting for the checkpoint
        self.signum = signum

    def __exit__(self, *exc) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


# ---- evaluation --------------------------------------------------------------------------------------
def _val_batches(data, batch_size: int, info: DistInfo, max_batches: int) -> Iterator[Batch]:
    """This process's share of the batches of evaluation split ``data`` (its first ``max_batches`` if > 0),
    round-robin."""
    n = len(data)
    starts = list(range(0, n, batch_size))
    if max_batches:
        starts = starts[:max_batches]
    for b, s in enumerate(starts):
        if b % info.world_size == info.rank:
            yield data.get_batch(np.arange(s, min(s + batch_size, n)))


@torch.no_grad()
def evaluate(
    model: nn.Module,
    task: Task,
    batch_size: int,
    device: torch.device,
    info: DistInfo = SINGLE_PROCESS,
    max_batches: int = 0,
    amp_dtype: torch.dtype | None = None,
    split: str = "val",
) -> dict[str, Any]:
    """Metrics on the task's ``split`` (``val``, or ``select``: the selection split; its first ``max_batches``
    batches if > 0), batches split over processes."""
    data = getattr(task, split, None) if split in ("val", "select") else None
    if data is None:
        raise ValueError(f"split={split!r}: task {task.name!r} has no such evaluation split; valid: val, select")
    was_training = model.training
    model.eval()
    acc = MetricAccumulator(task.kind, task.info)
    for inputs, target in _val_batches(data, batch_size, info, max_batches):
        inputs = tuple(x.to(device) for x in inputs)
        target = target.to(device)
        args, keywords = task.model_args(inputs)
        with autocast(device, amp_dtype):
            out = model(*args, **keywords)
        loss, pred = compute_loss(task.kind, out, target)
        acc.update(loss, pred, target)
    acc.load_state(all_reduce_sum(acc.state().to(device), info).cpu())
    model.train(was_training)
    return acc.compute()
