"""The training loop: one readable function, nanoGPT-style.

``train(cfg, out_dir)`` builds the task and model, then for each step: learning rate from the
schedule, this process's shard of the step's global batch, forward under autocast, backward (DDP
averages gradients), clipping, optimizer step. It logs to a progress bar, ``metrics.csv`` and
TensorBoard (when installed), evaluates every ``eval_every`` steps, checkpoints every
``ckpt_every`` steps and when SIGINT/SIGTERM arrives, and resumes bit-exactly from a checkpoint.
"""
from __future__ import annotations

import contextlib
import csv
import json
import math
import re
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import yaml
from torch import nn

from attnzoo._io import atomic_write_text
from attnzoo.data.tasks import Task, build_task
from attnzoo.train.checkpoint import (CheckpointError, latest_checkpoint, list_checkpoints, load_checkpoint,
                                      save_checkpoint, unwrap_model)
from attnzoo.train.config import RESUME_MUTABLE_KEYS, ConfigError, TrainConfig, from_dict
from attnzoo.train.distributed import (BatchSchedule, DistInfo, all_gather_floats, all_reduce_max, all_reduce_sum,
                                       barrier, init_distributed, shutdown_distributed)
from attnzoo.train.optim import build_optimizer
from attnzoo.train.schedules import lr_at
from attnzoo.train.batches import train_batches
from attnzoo.train.tasks import ARCH_FOR_KIND, MetricAccumulator, compute_loss, metric_names, task_model_overrides

__all__ = ["train", "TrainResult", "build_model", "check_model_choice", "evaluate", "prepare_out_dir", "resolve_device", "RUN_MARKER",
           "load_run", "ModelFactory"]

#: file that marks a directory as an attnzoo run (only such directories may be resumed or overwritten)
RUN_MARKER = ".attnzoo-run"

ModelFactory = Callable[[TrainConfig, Task], nn.Module]


@dataclass
class TrainResult:
    out_dir: Path
    step: int
    interrupted: bool = False
    signal: int | None = None
    final_metrics: dict[str, Any] = field(default_factory=dict)
    train_losses: list[tuple[int, float]] = field(default_factory=list)


# ---- set-up helpers -----------------------------------------------------------------------------------
def resolve_device(name: str, info: DistInfo | None = None) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(name)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("device='cuda' but CUDA is not available; valid: 'cpu' or 'auto'")
        if info is not None and info.enabled:
            dev = torch.device("cuda", info.local_rank)
    return dev


def _amp_dtype(amp: str, device: torch.device) -> torch.dtype | None:
    if amp == "off" or (amp == "auto" and device.type != "cuda"):
        return None
    if amp == "auto":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if amp == "fp16" and device.type != "cuda":
        raise ConfigError("amp='fp16' needs CUDA; on CPU use amp='bf16' or 'off'")
    return torch.bfloat16 if amp == "bf16" else torch.float16


def check_model_choice(cfg: TrainConfig) -> None:
    """Fail early (before any data is loaded) on an unknown model/attention or a model that doesn't fit the task."""
    import attnzoo
    from attnzoo.data.tasks import task_kind
    from attnzoo.models import get_config

    names = attnzoo.list_models()
    if cfg.model not in names:
        raise ConfigError(f"unknown model {cfg.model!r}; valid models: {sorted(names)}")
    kind = task_kind(cfg.task)
    arch = ARCH_FOR_KIND[kind]
    if get_config(cfg.model).arch != arch:
        fitting = [n for n in names if get_config(n).arch == arch]
        raise ConfigError(f"model {cfg.model!r} is a {get_config(cfg.model).arch!r} model but task {cfg.task!r} "
                          f"({kind}) needs a {arch!r} model; valid models for it: {fitting}")
    opts = cfg.resolved_model_options()
    if "attention" in opts:
        valid = attnzoo.list_attentions()
        if opts["attention"] not in valid:
            raise ConfigError(f"unknown attention {opts['attention']!r}; valid attentions: {valid}")
    try:  # option names and values, validated on the config alone (no allocation)
        get_config(cfg.model, **opts)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"model {cfg.model!r}: {e}") from e


def build_model(cfg: TrainConfig, task: Task) -> nn.Module:
    """``attnzoo.create_model(cfg.model, **task-implied sizes, **cfg.model_options)``; bad names fail listing choices."""
    import attnzoo

    check_model_choice(cfg)
    overrides = {**task_model_overrides(task), **cfg.resolved_model_options()}
    try:
        return attnzoo.create_model(cfg.model, **overrides)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"model {cfg.model!r} with options {overrides}: {e}") from e


def prepare_out_dir(out: Path, resume: bool, overwrite: bool) -> str:
    """Decide what to do with ``out``: ``"fresh"`` or ``"resume"``; refuses to clobber anything silently.

    - missing or empty: a fresh run (``--resume`` too, so one command serves first launch and restarts);
    - an attnzoo run directory: needs ``--resume`` (continue) or ``--overwrite`` (delete the run's own files
      and start again; refused, with the list, when the directory also holds files attnzoo did not write);
    - any other non-empty directory: an error, whatever the flags (attnzoo never deletes foreign files).
    """
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite contradict each other; pass one")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} exists and is not a directory")
    if not out.exists() or not any(out.iterdir()):
        return "fresh"
    is_run = (out / RUN_MARKER).is_file()
    if not is_run:
        raise ConfigError(f"--out {out} is a non-empty directory that is not an attnzoo run; refusing to write "
                          f"into it. Choose another --out.")
    if resume:
        if not (out / "config.yaml").is_file():
            raise ConfigError(f"{out} has no config.yaml to resume from")
        return "resume"
    if overwrite:
        foreign = foreign_run_files(out)
        if foreign:
            shown = ", ".join(foreign[:20]) + (f" ... ({len(foreign)} in all)" if len(foreign) > 20 else "")
            raise ConfigError(f"--out {out} also holds files attnzoo did not write: {shown}. --overwrite deletes only "
                              f"a run's own files: move or delete these first, or choose another --out")
        return "overwrite"
    raise ConfigError(f"--out {out} already holds a run; pass --resume to continue it or --overwrite to delete it "
                      f"and start again")


# What ``train`` writes into a run directory; everything else there is the user's and is never deleted.
_RUN_FILES = {RUN_MARKER, "config.yaml", "task.json", "vocab.json", "metrics.csv", "metrics.csv.tmp", "final.json"}
_CKPT_FILES = re.compile(r"(model|optimizer|rng_rank[0-9]+)\.safetensors|state\.json|manifest\.json")
_STEP_DIR = re.compile(r"(\.tmp_)?step_[0-9]{8,}")
_MODEL_FILES = {"config.json", "model.safetensors"}


def _is_temp_of(name: str, names) -> bool:
    """``.<name>.<random>.tmp`` / ``.bak``: the temporaries of atomic writes (left behind by a kill)."""
    m = re.fullmatch(r"\.(.+)\.[^.]+\.(tmp|bak)", name)
    if m is None:
        return False
    return m.group(1) in names if isinstance(names, set) else bool(names.fullmatch(m.group(1)))


def foreign_run_files(out: Path) -> list[str]:
    """Paths (relative to ``out``) in a run directory that ``attnzoo train`` did not write (links included)."""
    out = Path(out)
    foreign: list[str] = []

    def scan(d: Path, ok: Callable[[Path], bool]) -> None:
        for p in sorted(d.iterdir()):
            if p.is_symlink() or not ok(p):
                foreign.append(str(p.relative_to(out)))

    def step_dir(p: Path) -> bool:
        if not p.is_dir():
            return False
        scan(p, lambda f: f.is_file() and (_CKPT_FILES.fullmatch(f.name) is not None or _is_temp_of(f.name, _CKPT_FILES)))
        return True

    def top(p: Path) -> bool:
        if p.name in _RUN_FILES or _is_temp_of(p.name, _RUN_FILES):
            return p.is_file()
        if not p.is_dir() or p.is_symlink():
            return False
        if p.name == "checkpoints":
            scan(p, lambda c: (c.name == "latest" and c.is_file()) or _is_temp_of(c.name, {"latest"})
                 or (_STEP_DIR.fullmatch(c.name) is not None and step_dir(c)))
        elif p.name == "model":
            scan(p, lambda f: f.is_file() and (f.name in _MODEL_FILES or _is_temp_of(f.name, _MODEL_FILES)))
        elif p.name == "tb":  # TensorBoard's event files
            scan(p, lambda f: f.is_file() and f.name.startswith("events.out.tfevents."))
        else:
            return False
        return True

    scan(out, top)
    return foreign


def _remove_run_files(out: Path) -> None:
    """Delete what a previous run wrote into ``out`` (checked by :func:`foreign_run_files` beforehand)."""
    foreign = set(foreign_run_files(out))
    if foreign:  # appeared since the check: still never delete them
        raise ConfigError(f"--out {out}: files attnzoo did not write appeared: {sorted(foreign)[:20]}; not overwriting")
    for p in out.iterdir():
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


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


def load_run(out: Path) -> TrainConfig:
    """The config saved in a run directory."""
    f = Path(out) / "config.yaml"
    if not f.is_file():
        raise ConfigError(f"{out} is not an attnzoo run directory (no config.yaml)")
    from attnzoo.train.config import read_yaml  # UTF-8, no duplicated keys, errors name the file

    return from_dict(read_yaml(f) or {})


def _check_resume_config(saved: TrainConfig, given: TrainConfig | None) -> TrainConfig:
    if given is None:
        return saved
    a, b = saved.to_dict(), given.to_dict()
    diff = [k for k in a if a[k] != b[k] and k not in RESUME_MUTABLE_KEYS]
    if diff:
        raise ConfigError(
            f"resuming with a different config would not continue the same run: {', '.join(f'{k}: {a[k]!r} -> {b[k]!r}' for k in diff)}. "
            f"Only {list(RESUME_MUTABLE_KEYS)} may change on resume (or give no config: the saved one is used)."
        )
    return given


# ---- evaluation --------------------------------------------------------------------------------------
@torch.no_grad()
def evaluate(model: nn.Module, task: Task, batch_size: int, device: torch.device, info: DistInfo = DistInfo(),
             max_batches: int = 0, amp_dtype: torch.dtype | None = None) -> dict[str, Any]:
    """Metrics on the validation set (its first ``max_batches`` batches if > 0), batches split over processes."""
    was_training = model.training
    model.eval()
    n = len(task.val)
    starts = list(range(0, n, batch_size))
    if max_batches:
        starts = starts[:max_batches]
    acc = MetricAccumulator(task.kind, task.info)
    if task.kind == "icl_regression":
        acc.pos_err = torch.zeros(task.info["n_points"], dtype=torch.float64)
    for b, s in enumerate(starts):
        if b % info.world_size != info.rank:
            continue
        inputs, target = task.val.get_batch(np.arange(s, min(s + batch_size, n)))
        inputs = tuple(x.to(device) for x in inputs)
        target = target.to(device)
        with _autocast(device, amp_dtype):
            out = model(*inputs)
        loss, pred = compute_loss(task.kind, out, target)
        acc.update(loss, pred, target)
    acc.load_state(all_reduce_sum(acc.state().to(device), info).cpu())
    model.train(was_training)
    return acc.compute()


def _autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


# ---- logging -----------------------------------------------------------------------------------------
_TB_NOTICE_SHOWN = False


class _Logger:
    def __init__(self, out: Path, kind: str, enabled: bool, resume_step: int | None) -> None:
        self.enabled = enabled
        self.fields = ["step", "split", "lr", *metric_names(kind), "samples_per_s", "tokens_per_s", "elapsed_s"]
        self.path = out / "metrics.csv"
        self.tb = None
        if not enabled:
            return
        if resume_step is not None and self.path.is_file():
            # drop rows logged after the checkpoint (a hard kill can leave some)
            with open(self.path, newline="") as f:
                rows = [r for r in csv.DictReader(f) if int(r["step"]) <= resume_step]
            self._rewrite(rows)
        elif not self.path.is_file():
            self._rewrite([])
        try:
            from torch.utils.tensorboard import SummaryWriter  # needs the optional `tensorboard` package

            self.tb = SummaryWriter(str(out / "tb"))
        except ImportError:
            global _TB_NOTICE_SHOWN
            if not _TB_NOTICE_SHOWN:  # once per process: sweeps and the reproduce runner train many models
                _TB_NOTICE_SHOWN = True
                print("attnzoo train: tensorboard is not installed; logging to metrics.csv only "
                      "(pip install 'attnzoo[tensorboard]' to get TensorBoard logs)", file=sys.stderr)

    def _rewrite(self, rows: list[dict]) -> None:
        tmp = self.path.with_suffix(".csv.tmp")
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=self.fields)
            w.writeheader()
            w.writerows(rows)
        tmp.replace(self.path)

    def log(self, step: int, split: str, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        row = {"step": step, "split": split}
        row.update({k: (repr(float(v)) if isinstance(v, float) else v) for k, v in values.items() if k in self.fields})
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=self.fields).writerow(row)
        if self.tb is not None:
            for k, v in values.items():
                if isinstance(v, (int, float)) and math.isfinite(float(v)):
                    self.tb.add_scalar(f"{split}/{k}", float(v), step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


class _StopFlag:
    """Records SIGINT/SIGTERM so the loop can checkpoint at the next step boundary and exit."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self):
        import threading

        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C aborts without waiting for the checkpoint
        self.signum = signum

    def __exit__(self, *exc) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


# ---- the loop ----------------------------------------------------------------------------------------
def train(cfg: TrainConfig | None, out_dir: str | Path, *, resume: bool = False, overwrite: bool = False,
          progress: bool = True, model_factory: ModelFactory | None = None,
          callback: Callable[[int, float], None] | None = None) -> TrainResult:
    """Train according to ``cfg`` into ``out_dir`` (see :func:`prepare_out_dir` for the directory rules).

    With ``resume=True`` and ``cfg=None`` the run's saved config is used. ``model_factory(cfg, task)``
    replaces ``attnzoo.create_model`` (for custom models). ``callback(step, loss)`` runs after each step.
    """
    out = Path(out_dir)
    mode = prepare_out_dir(out, resume, overwrite)
    if mode == "resume":
        cfg = _check_resume_config(load_run(out), cfg)
    if cfg is None:
        raise ConfigError(f"no config given and nothing to resume in {out}")
    # a custom model factory needs no registered model name
    if model_factory is not None:
        TrainConfig(**{**cfg.to_dict(), "model": cfg.model or "<custom>"}).validate()
    else:
        cfg.validate()
        check_model_choice(cfg)

    device = resolve_device(cfg.device)
    info = init_distributed(device.type)
    try:
        device = resolve_device(cfg.device, info)
        return _train(cfg, out, mode, info, device, progress, model_factory, callback)
    finally:
        shutdown_distributed()


def _train(cfg, out, mode, info, device, progress, model_factory, callback) -> TrainResult:
    amp_dtype = _amp_dtype(cfg.amp, device)
    task = build_task(cfg.task, **cfg.task_options)
    torch.manual_seed(cfg.seed)
    model = (model_factory or build_model)(cfg, task).to(device)
    schedule = BatchSchedule(len(task.train), cfg.batch_size, cfg.seed, info,
                             shuffle=getattr(task.train, "shuffle", True))
    optimizer = build_optimizer(model, cfg.optimizer, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                betas=(cfg.beta1, cfg.beta2))
    scaler = torch.amp.GradScaler("cuda") if amp_dtype == torch.float16 else None
    # dropout etc. draw from a per-process stream (the model init above used the shared seed)
    torch.manual_seed(cfg.seed + 1 + info.rank)

    # everything is validated and built: now the output directory may be touched
    start_step, window = 0, [0.0, 0]
    ckpt_root = out / "checkpoints"
    ckpt = latest_checkpoint(ckpt_root) if mode == "resume" else None
    barrier(info)  # every process has inspected the directory before the main one changes it
    if info.is_main:
        if mode == "overwrite":
            _remove_run_files(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / RUN_MARKER).write_text("attnzoo training run\n")
        (out / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        info_json = {"task": task.name, "kind": task.kind, "info": task.info, "options": task.options}
        (out / "task.json").write_text(json.dumps(info_json, indent=1, default=str))
        if task.vocab is not None:
            (out / "vocab.json").write_text(task.vocab.to_json())
    barrier(info)
    if ckpt is not None:
        try:
            state = load_checkpoint(ckpt, model, optimizer, info, scaler)
        except CheckpointError as e:
            earlier = [p.name for p in list_checkpoints(ckpt_root) if p.name != ckpt.name]
            if not earlier:
                raise
            raise CheckpointError(f"{e}. Other checkpoints of this run: {', '.join(earlier)}; to resume from one, "
                                  f"write its name into {ckpt_root / 'latest'}") from None
        if state["world_size"] != info.world_size and info.is_main:
            print(f"attnzoo train: resuming a {state['world_size']}-process run on {info.world_size} processes; "
                  "the data order is the same, dropout streams differ", file=sys.stderr)
        start_step, window = state["step"], _restored_window(state, info)
        if info.is_main:
            print(f"attnzoo train: resumed from {ckpt} (step {start_step})", file=sys.stderr)
    elif mode == "resume" and info.is_main:
        print(f"attnzoo train: no checkpoint in {out}; starting from step 0", file=sys.stderr)

    logger = _Logger(out, task.kind, info.is_main, start_step if mode == "resume" else None)
    train_model = torch.compile(model) if cfg.compile else model
    if info.enabled:
        ddp_kw = {"device_ids": [device.index]} if device.type == "cuda" else {}
        train_model = torch.nn.parallel.DistributedDataParallel(train_model, **ddp_kw)
    ebs = cfg.eval_batch_size or cfg.batch_size
    tokens_per_sample = task.info.get("seq_len", 1)

    result = TrainResult(out, start_step)
    bar = None
    if progress and info.is_main:
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.steps, initial=start_step, desc=f"{cfg.task}/{cfg.model or 'model'}", dynamic_ncols=True)
    t0 = t_window = time.perf_counter()
    samples_window = 0
    model.train()
    step = start_step
    batches = train_batches(task.train, schedule, start_step, cfg.steps, pin_memory=device.type == "cuda")
    with _StopFlag() as stop:
        while step < cfg.steps:
            lr = lr_at(step, lr=cfg.lr, steps=cfg.steps, schedule=cfg.schedule, warmup_steps=cfg.warmup_steps,
                       min_lr_ratio=cfg.min_lr_ratio)
            for g in optimizer.param_groups:
                g["lr"] = lr
            inputs, target = next(batches)
            inputs = tuple(x.to(device, non_blocking=True) for x in inputs)
            target = target.to(device, non_blocking=True)
            with _autocast(device, amp_dtype):
                out_ = train_model(*inputs)
            loss, _ = compute_loss(task.kind, out_, target, cfg.label_smoothing)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"loss is {float(loss)} at step {step}; lower lr or enable grad_clip")
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
            else:
                loss.backward()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            loss_value = float(loss.detach())
            window[0] += loss_value
            window[1] += 1
            samples_window += cfg.batch_size
            if callback is not None:
                callback(step, loss_value)

            if step % cfg.log_every == 0 or step == cfg.steps:
                avg = all_reduce_sum(torch.tensor([window[0], float(window[1])], dtype=torch.float64), info)
                train_loss = float(avg[0] / avg[1])
                dt = max(time.perf_counter() - t_window, 1e-9)
                rate = samples_window / dt
                logger.log(step, "train", {"lr": lr, "loss": train_loss, "samples_per_s": round(rate, 2),
                                           "tokens_per_s": round(rate * tokens_per_sample, 1),
                                           "elapsed_s": round(time.perf_counter() - t0, 2)})
                result.train_losses.append((step, train_loss))
                if bar is not None:
                    bar.set_postfix(loss=f"{train_loss:.4f}", lr=f"{lr:.2e}", samples_s=f"{rate:.0f}")
                window, samples_window, t_window = [0.0, 0], 0, time.perf_counter()
            if bar is not None:
                bar.update(1)
            if step % cfg.eval_every == 0 or step == cfg.steps:
                metrics = evaluate(model, task, ebs, device, info, cfg.eval_batches, amp_dtype)
                logger.log(step, "val", {**metrics, "lr": lr, "elapsed_s": round(time.perf_counter() - t0, 2)})
                result.final_metrics = metrics
                if bar is not None:
                    bar.write(f"step {step}: " + ", ".join(f"val_{k}={v:.4f}" for k, v in metrics.items()
                                                            if isinstance(v, float)))
            signum = all_reduce_max(stop.signum or 0, info)
            if step % cfg.ckpt_every == 0 or step == cfg.steps or signum:
                # every process's unlogged losses, so that the log after a resume matches an uninterrupted run
                windows = [[s, int(c)] for s, c in all_gather_floats(window, info)]
                save_checkpoint(ckpt_root, step, model, optimizer,
                                {"loss_window": window, "loss_windows": windows, "config": cfg.to_dict()},
                                info, cfg.keep_checkpoints, scaler)
            if signum:
                result.interrupted = True
                result.signal = signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM
                if info.is_main:
                    print(f"\nattnzoo train: stopped by signal at step {step}; checkpoint saved. "
                          f"Continue with: attnzoo train --resume --out {out}", file=sys.stderr)
                break
    if bar is not None:
        bar.close()
    logger.close()
    result.step = step
    if not result.interrupted and not result.final_metrics and step > 0:
        # Resumed from the last checkpoint of a finished run: nothing ran, so evaluate the restored weights
        # rather than overwrite final.json with empty metrics.
        result.final_metrics = evaluate(model, task, ebs, device, info, cfg.eval_batches, amp_dtype)
    if not result.interrupted and info.is_main:
        atomic_write_text(out / "final.json", json.dumps({"step": step, "val": result.final_metrics}, indent=1))
        base = unwrap_model(model)
        if hasattr(base, "save_pretrained"):
            base.save_pretrained(str(out / "model"))
    barrier(info)
    return result
