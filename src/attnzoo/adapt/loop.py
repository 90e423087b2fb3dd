"""Adaptation of a pretrained model into a mechanism: attention transfer, then fine-tuning (Hedgehog/LoLCATs style).

Stage 1, *attention transfer* (steps ``1..transfer_steps``): the pretrained model is a frozen teacher. One forward
of the teacher per step, with a hook on each of its attention modules, runs the student's swapped attention on that
module's own inputs and takes ``mse(student(x_l), teacher(x_l))`` (``x_l`` the teacher's input to layer ``l``);
each layer's loss is back-propagated at once (its graph is freed before the next layer runs), so every layer
trains in the one pass and only the student's attention runs besides the teacher. Only what the mechanism adds is
trained (optionally its inherited projections too).

Stage 2, *fine-tuning* (the next ``finetune_steps`` steps): the student alone, on the task / language-model loss
(``model(**batch).loss`` for ``transformers`` models), every weight or LoRA adapters (``peft``) plus the
mechanism's new parameters.

A run directory holds ``adapt.json`` (the configuration), ``metrics.csv`` (one row per step: stage, learning rate,
loss and each layer's transfer loss; one row per evaluation), ``transfer_loss.png``, ``results.json`` (the
evaluations: teacher, swapped, after transfer, after fine-tuning) and ``checkpoints/`` (attnzoo's atomic
safetensors checkpoints). A batch is a pure function of its step and the RNG state is checkpointed, so a resumed run
repeats the uninterrupted one exactly.
"""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from attnzoo._io import atomic_save_figure, atomic_write_text, to_jsonable, write_json
from attnzoo.adapt.student import Student, make_student
from attnzoo.adapt.text import TEXT_SOURCES
from attnzoo.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from attnzoo.train.schedules import lr_at

__all__ = [
    "AdaptConfig",
    "AdaptResult",
    "adapt",
    "AdaptError",
    "transfer_losses",
    "plot_transfer",
    "default_loss",
    "load_student",
]

Batch = Mapping[str, Any] | Sequence[Any]
_MARKER = ".attnzoo-adapt"
_OWN_FILES = {_MARKER, "adapt.json", "metrics.csv", "results.json", "transfer_loss.png", "report.txt"}
#: directories adapt writes: checkpoints, and the control run of ``attnzoo adapt --control`` (itself an adapt run)
_OWN_DIRS = ("checkpoints", "control")


class AdaptError(ValueError):
    """A bad adaptation setting or run directory."""


@dataclass
class AdaptConfig:
    """Settings of :func:`adapt`; ``lora_rank=0`` fine-tunes every weight, ``> 0`` trains LoRA adapters of that
    rank (on every linear layer but the output head) plus the mechanism's new parameters.
    ``train_projections``: in the transfer stage also train the inherited q/k/v/o projections (``None``: only if
    the mechanism adds no parameters of its own, e.g. linear attention)."""

    mechanism: str
    options: dict = field(default_factory=dict)
    transfer_steps: int = 100
    finetune_steps: int = 0
    transfer_lr: float = 1e-3
    finetune_lr: float = 1e-4
    warmup_steps: int = 0
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    train_projections: bool | None = None
    lora_rank: int = 0
    lora_alpha: float = 16.0
    checkpoint_every: int = 50
    keep_checkpoints: int = 2
    seed: int = 0
    #: also evaluate every this many steps (0: only before, between and after the stages), as ``"<stage>@<step>"``:
    #: the curve of held-out metrics against adaptation tokens and CPU time
    eval_every: int = 0
    #: what the caller's batches and evaluations are drawn from (``attnzoo adapt``: the mixture, block and batch
    #: size, held-out corpora), recorded so a resume with other data is refused; ``None``: not recorded
    data: dict | None = None

    def validate(self) -> None:
        for name in ("transfer_steps", "finetune_steps", "warmup_steps", "lora_rank", "seed", "eval_every"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise AdaptError(f"{name} must be an integer >= 0, got {v!r}")
        for name in ("checkpoint_every", "keep_checkpoints"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise AdaptError(f"{name} must be an integer >= 1, got {v!r}")
        if self.transfer_steps + self.finetune_steps == 0:
            raise AdaptError("transfer_steps and finetune_steps are both 0: nothing to do")
        for name in ("transfer_lr", "finetune_lr", "lora_alpha"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise AdaptError(f"{name} must be a finite number > 0, got {v!r}")
        for name in ("weight_decay", "grad_clip"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise AdaptError(f"{name} must be a finite number >= 0, got {v!r}")
        if not isinstance(self.options, dict):
            raise AdaptError(f"options must be a dict of the mechanism's options, got {type(self.options).__name__}")
        if self.data is not None and not isinstance(self.data, dict):
            raise AdaptError(f"data must be a dict describing the batches or None, got {type(self.data).__name__}")

    @property
    def total_steps(self) -> int:
        return self.transfer_steps + self.finetune_steps

    def stage(self, step: int) -> str:
        """The stage of (1-based) step ``step``."""
        return "transfer" if step <= self.transfer_steps else "finetune"


@dataclass
class AdaptResult:
    """The adapted ``student`` (a :class:`~attnzoo.adapt.student.Student`), the last step done, the evaluations
    (``{"teacher": {...}, "swapped": {...}, "transfer": {...}, "finetune": {...}}``, those that ran) and the
    transfer loss per layer at the last transfer step."""

    student: Student
    step: int
    evaluations: dict[str, dict[str, float]]
    layer_losses: list[float]


# ---- run directory ------------------------------------------------------------------------------------------


def _prepare_dir(out: Path, cfg: AdaptConfig, resume: bool, overwrite: bool) -> bool:
    """Create / check ``out``; returns whether a checkpoint may be resumed."""
    if resume and overwrite:
        raise AdaptError("resume and overwrite contradict each other; pass one")
    if out.exists() and not out.is_dir():
        raise AdaptError(f"out {out} exists and is not a directory")
    if out.exists() and any(out.iterdir()):
        if not (out / _MARKER).is_file():
            raise AdaptError(f"out {out} is a non-empty directory that is not an attnzoo adapt run; choose another")
        if overwrite:
            foreign = sorted(p.name for p in out.iterdir() if p.name not in _OWN_FILES and p.name not in _OWN_DIRS)
            if foreign:
                raise AdaptError(f"out {out} also holds files adapt did not write: {foreign}; move them first")
            for name in _OWN_DIRS:
                shutil.rmtree(out / name, ignore_errors=True)
            for name in _OWN_FILES:
                (out / name).unlink(missing_ok=True)
        elif resume:
            # a setting added after the run was started reads as its default (the run ran with that behaviour)
            saved = {**asdict(AdaptConfig(cfg.mechanism)), **json.loads((out / "adapt.json").read_text())}
            given = asdict(cfg)
            differ = sorted(k for k in set(saved) | set(given) if saved.get(k) != _jsonish(given.get(k)))
            if saved.get("data") is None:  # a run that did not record its data cannot be checked against it
                differ = [k for k in differ if k != "data"]
            if differ:
                raise AdaptError(
                    f"{out} was started with other settings ({', '.join(f'{k}: {saved.get(k)!r}' for k in differ)}); "
                    f"resume with the same settings or choose another output directory"
                )
            return True
        else:
            raise AdaptError(
                f"out {out} already holds an adapt run; pass resume=True (--resume) to continue it or "
                f"overwrite=True (--overwrite) to start again"
            )
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / _MARKER, "attnzoo adapt run\n")
    write_json(out / "adapt.json", asdict(cfg))
    return False


def _jsonish(v: Any) -> Any:
    """``v`` as it reads back from ``adapt.json`` (tuples as lists, ...)."""
    return json.loads(json.dumps(to_jsonable(v)))


class _Csv:
    """``metrics.csv``: appended row by row; on resume, rows after the checkpoint's step are dropped first."""

    def __init__(self, path: Path, n_layers: int, resume_step: int | None, metrics: Sequence[str] = ()) -> None:
        self.path = path
        self.fields = ["step", "stage", "split", "lr", "loss", "perplexity", "accuracy", "tokens", "elapsed_s"]
        # other held-out corpora's metrics (``attnzoo adapt --data`` mixtures, ``--also-eval``) carry their name
        names = [f"{s}_{m}" for s in TEXT_SOURCES for m in ("loss", "perplexity")] + list(metrics)
        self.fields += [n for n in dict.fromkeys(names) if n not in self.fields]
        self.fields += [f"transfer_{i}" for i in range(n_layers)]
        rows: list[dict] = []
        if resume_step is not None and path.is_file():
            with open(path, newline="") as f:
                rows = [r for r in csv.DictReader(f) if int(r["step"]) <= resume_step]
            # a stage's evaluation logged at the checkpoint's own step belongs after it (it follows the save; an
            # ``eval_every`` evaluation, named "<stage>@<step>", precedes it and is in the checkpoint)
            rows = [
                r
                for r in rows
                if not (int(r["step"]) == resume_step and r["split"] == "eval" and "@" not in r["stage"])
            ]
        buf = io.StringIO(newline="")
        w = csv.DictWriter(buf, fieldnames=self.fields)
        w.writeheader()
        w.writerows(rows)
        atomic_write_text(path, buf.getvalue())

    def log(self, row: dict[str, Any]) -> None:
        row = {k: (repr(float(v)) if isinstance(v, float) else v) for k, v in row.items() if k in self.fields}
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=self.fields).writerow(row)


def plot_transfer(csv_path: Path, png: Path) -> Path | None:
    """Per-layer transfer loss against step (log scale) from ``metrics.csv``; ``None`` when there is none."""
    with open(csv_path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["stage"] == "transfer" and r["split"] == "train"]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    cols = [c for c in rows[0] if c.startswith("transfer_")]
    steps = [int(r["step"]) for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    cmap = plt.get_cmap("viridis")
    for i, c in enumerate(cols):
        ax.plot(steps, [float(r[c]) for r in rows], color=cmap(i / max(len(cols) - 1, 1)), lw=1, label=f"layer {i}")
    ax.set_yscale("log")
    ax.set_xlabel("transfer step")
    ax.set_ylabel("MSE(student attention, teacher attention)")
    ax.set_title("attention transfer: per-layer loss (dark = first layer)")
    if len(cols) <= 12:
        ax.legend(fontsize=7, ncol=2)
    return atomic_save_figure(fig, png)


# ---- the stages ---------------------------------------------------------------------------------------------


def _is_pair(batch: Batch) -> bool:
    """attnzoo's dataset batches: ``(inputs tuple, target)``."""
    return isinstance(batch, tuple) and len(batch) == 2 and isinstance(batch[0], tuple)


def _call(model: nn.Module, batch: Batch, drop: tuple[str, ...] = (), extra: dict | None = None):
    if isinstance(batch, Mapping):
        kw = {k: v for k, v in batch.items() if k not in drop}
        kw.update(extra or {})
        return model(**kw)
    return model(*batch[0]) if _is_pair(batch) else model(*batch)


def _to(batch: Any, device: torch.device) -> Any:
    """``batch`` with its tensors on ``device`` (the teacher's)."""
    if isinstance(batch, Mapping):
        return {k: _to(v, device) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to(v, device) for v in batch)
    return batch.to(device) if isinstance(batch, torch.Tensor) else batch


def _tokens(batch: Batch) -> int:
    if isinstance(batch, Mapping):
        x = batch.get("input_ids", batch.get("pixel_values"))
    else:
        inputs = batch[0] if _is_pair(batch) else batch
        x = inputs[0] if len(inputs) else None
    if not isinstance(x, torch.Tensor):
        return 0
    return int(x.numel()) if x.dtype in (torch.int64, torch.int32) else int(x.shape[0])


def default_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """``model(**batch).loss`` (``transformers`` models given ``labels``)."""
    out = _call(model, batch)
    loss = getattr(out, "loss", None)
    if not isinstance(loss, torch.Tensor):
        raise AdaptError(
            "fine-tuning needs a loss: give batches with labels to a transformers model (out.loss), or pass loss_fn"
        )
    return loss


class _Transfer:
    """Hooks on the teacher's attention modules that train the student's on the same inputs (module docstring)."""

    _CACHE_KEYS = ("past_key_values", "past_key_value", "cache", "use_cache")

    def __init__(self, teacher: nn.Module, student: Student) -> None:
        self.names = [layer.name for layer in student.layers]
        self.pairs = [(teacher.get_submodule(n), student.model.get_submodule(n)) for n in self.names]
        self.losses: list[float] = [math.nan] * len(self.pairs)

    def _hook(self, i: int, backward: bool):
        student_module = self.pairs[i][1]

        def hook(_module, args, kwargs, output):
            kw = {k: v for k, v in kwargs.items() if k not in self._CACHE_KEYS}
            with torch.set_grad_enabled(backward):
                got = student_module(*args, **kw)
                got = got[0] if isinstance(got, tuple) else got
                want = output[0] if isinstance(output, tuple) else output
                loss = F.mse_loss(got.float(), want.detach().float())
                if backward:
                    # backward now: this layer's graph is freed before the teacher's next layer runs
                    loss.backward()
            self.losses[i] = float(loss.detach())

        return hook

    def run(self, teacher: nn.Module, batch: Batch, causal_hf: bool, backward: bool = True) -> list[float]:
        """Each layer's transfer loss on ``batch`` (accumulating its gradients when ``backward``)."""
        handles = [
            t.register_forward_hook(self._hook(i, backward), with_kwargs=True) for i, (t, _) in enumerate(self.pairs)
        ]
        try:
            with torch.no_grad():
                _call(teacher, batch, drop=("labels",), extra={"use_cache": False} if causal_hf else None)
        finally:
            for h in handles:
                h.remove()
        return list(self.losses)


def transfer_losses(teacher: nn.Module, student: Student, batch: Batch) -> list[float]:
    """Each swapped layer's ``mse(student attention, teacher attention)`` on the teacher's inputs for ``batch``."""
    was = student.model.training
    student.model.eval()
    try:
        causal_hf = student.causal and student.family in ("gpt2", "llama")
        device = next(teacher.parameters()).device
        return _Transfer(teacher, student).run(teacher, _to(batch, device), causal_hf, backward=False)
    finally:
        student.model.train(was)


def _params_by_name(model: nn.Module, names: Sequence[str]) -> list[nn.Parameter]:
    own = dict(model.named_parameters())
    return [own[n] for n in names]


def _lora_targets(model: nn.Module) -> list[str]:
    heads = ("lm_head", "classifier", "score", "head")
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n.rpartition(".")[2] not in heads]


def _inject_lora(model: nn.Module, cfg: AdaptConfig) -> list[nn.Parameter]:
    try:
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError as e:
        raise ImportError('LoRA fine-tuning needs peft: pip install "attnzoo[adapt]" (or pip install peft)') from e
    targets = _lora_targets(model)
    if not targets:
        raise AdaptError("lora_rank > 0 but the model has no linear layer to put LoRA adapters on")
    lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, target_modules=targets, lora_dropout=0.0)
    inject_adapter_in_model(lora, model)
    return [p for n, p in model.named_parameters() if "lora_" in n]


class _Run:
    """The state of one adaptation: student, parameter groups, optimizer, counters, log (see :func:`adapt`)."""

    def __init__(self, teacher: nn.Module, cfg: AdaptConfig, out: Path | None, eval_fn) -> None:
        torch.manual_seed(cfg.seed)  # the mechanism's new parameters start from the seed's draw
        self.cfg, self.teacher, self.out, self.eval_fn = cfg, teacher, out, eval_fn
        self.student = make_student(teacher, cfg.mechanism, cfg.options)
        teacher.eval()
        for p in teacher.parameters():
            p.requires_grad_(False)
        self.model = model = self.student.model
        self.new = [p for layer in self.student.layers for p in _params_by_name(model, layer.new)]
        inherited = [p for layer in self.student.layers for p in _params_by_name(model, layer.inherited)]
        train_proj = cfg.train_projections if cfg.train_projections is not None else not self.new
        self.transfer_params = self.new + (inherited if train_proj else [])
        if cfg.transfer_steps and not self.transfer_params:
            raise AdaptError(
                f"{cfg.mechanism} adds no parameters to the pretrained projections and train_projections=False: the "
                f"transfer stage would train nothing; set train_projections=True (or None)"
            )
        self.lora_params = _inject_lora(model, cfg) if cfg.lora_rank > 0 else []
        self.transfer = _Transfer(teacher, self.student)
        self.causal_hf = self.student.causal and self.student.family in ("gpt2", "llama")
        self.device = next(teacher.parameters()).device  # batches go where the teacher is
        self.opt: torch.optim.Optimizer | None = None
        self.opt_stage: str | None = None
        self.start, self.elapsed, self.tokens = 0, 0.0, 0
        self.evaluations: dict[str, dict[str, float]] = {}
        self.layer_losses: list[float] = []
        self.log: _Csv | None = None

    def use_optimizer(self, stage: str) -> None:
        """The optimizer of ``stage`` (a new one when the stage changes), gradients for its parameters only."""
        if self.opt_stage == stage:
            return
        cfg, model = self.cfg, self.model
        if stage == "transfer":
            params = self.transfer_params
        elif cfg.lora_rank > 0:
            params = self.lora_params + [p for p in self.new if all(p is not q for q in self.lora_params)]
        else:
            params = list(model.parameters())
        self.opt = torch.optim.AdamW(params, lr=_lr(cfg, stage), weight_decay=cfg.weight_decay)
        self.opt_stage = stage
        ids = {id(p) for p in params}
        for p in model.parameters():
            p.requires_grad_(id(p) in ids)

    def restore(self, ckpt: Path) -> None:
        """Continue from ``ckpt``; its optimizer is restored only if training continues in the checkpoint's stage."""
        saved = json.loads((ckpt / "state.json").read_text())
        step = int(saved["step"])
        if step < self.cfg.total_steps and self.cfg.stage(step + 1) == saved.get("stage"):
            self.use_optimizer(saved["stage"])
        state = load_checkpoint(ckpt, self.model, self.opt)
        self.start = int(state["step"])
        self.evaluations, self.elapsed, self.tokens = state.get("evaluations", {}), state["elapsed_s"], state["tokens"]

    def evaluate(self, name: str, m: nn.Module, step: int) -> None:
        if self.eval_fn is None or name in self.evaluations:
            return
        was = m.training
        m.eval()
        with torch.no_grad():
            self.evaluations[name] = {k: float(v) for k, v in self.eval_fn(m).items()}
        m.train(was)
        if self.log:
            self.log.log(
                {
                    "step": step,
                    "stage": name,
                    "split": "eval",
                    "tokens": self.tokens,
                    "elapsed_s": self.elapsed,
                    **self.evaluations[name],
                }
            )
        if self.out:
            write_json(self.out / "results.json", {"evaluations": self.evaluations, "report": self.student.report})

    def step(self, step: int, batch: Batch, loss_fn) -> dict[str, Any]:
        """One optimizer step; returns its ``metrics.csv`` row."""
        cfg, stage = self.cfg, self.cfg.stage(step)
        self.use_optimizer(stage)
        first, n = (1, cfg.transfer_steps) if stage == "transfer" else (cfg.transfer_steps + 1, cfg.finetune_steps)
        lr = lr_at(step - first, lr=_lr(cfg, stage), steps=n, warmup_steps=min(cfg.warmup_steps, n), min_lr_ratio=0.1)
        for g in self.opt.param_groups:
            g["lr"] = lr
        t0 = time.perf_counter()
        batch = _to(batch, self.device)
        self.opt.zero_grad(set_to_none=True)
        row: dict[str, Any] = {"step": step, "stage": stage, "split": "train", "lr": lr}
        if stage == "transfer":
            self.model.eval()  # the student's dropout stays off: its layers must match a deterministic teacher
            self.layer_losses = self.transfer.run(self.teacher, batch, self.causal_hf)
            loss = sum(self.layer_losses) / len(self.layer_losses)
            row.update({f"transfer_{i}": v for i, v in enumerate(self.layer_losses)})
        else:
            self.model.train()
            loss_t = loss_fn(self.model, batch)
            loss_t.backward()
            loss = float(loss_t.detach())
        if not math.isfinite(loss):
            raise FloatingPointError(f"adapt: {stage} loss is {loss} at step {step}; lower the learning rate")
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_([p for g in self.opt.param_groups for p in g["params"]], cfg.grad_clip)
        self.opt.step()
        self.elapsed += time.perf_counter() - t0
        self.tokens += _tokens(batch)
        row.update({"loss": loss, "tokens": self.tokens, "elapsed_s": self.elapsed})
        return row

    def save(self, step: int) -> None:
        extra = {
            "stage": self.cfg.stage(step),
            "evaluations": self.evaluations,
            "elapsed_s": self.elapsed,
            "tokens": self.tokens,
        }
        save_checkpoint(self.out / "checkpoints", step, self.model, self.opt, extra, keep=self.cfg.keep_checkpoints)

    def finish(self, step: int) -> None:
        if plot_transfer(self.out / "metrics.csv", self.out / "transfer_loss.png") is None:
            (self.out / "transfer_loss.png").unlink(missing_ok=True)
        atomic_write_text(self.out / "report.txt", self.student.report + "\n")
        payload = {"evaluations": self.evaluations, "report": self.student.report, "step": step}
        write_json(self.out / "results.json", payload)


def adapt(
    teacher: nn.Module,
    batches: Callable[[int], Batch],
    cfg: AdaptConfig,
    out: str | Path | None = None,
    *,
    loss_fn: Callable[[nn.Module, Batch], torch.Tensor] | None = None,
    eval_fn: Callable[[nn.Module], dict[str, float]] | None = None,
    resume: bool = False,
    overwrite: bool = False,
    stop_after: int | None = None,
    progress: bool = True,
    eval_metrics: Sequence[str] = (),
) -> AdaptResult:
    """Adapt ``teacher`` into ``cfg.mechanism``: attention transfer then fine-tuning (module docstring).

    ``batches(step)`` gives the batch of 1-based ``step`` (a dict of the model's keyword inputs, with ``labels`` for
    fine-tuning ``transformers`` models; a tuple of positional inputs; or attnzoo's ``(inputs tuple, target)``,
    with ``loss_fn`` for fine-tuning) and must depend on ``step`` only.
    ``eval_fn(model)`` (e.g. perplexity on held-out text) runs on the teacher and on the student before, between
    and after the stages. ``out``: the run directory (``None``: no checkpoints or logs); ``resume`` continues the
    run in ``out`` from its last checkpoint; ``stop_after``: stop (with a checkpoint) after that step.
    ``eval_metrics``: names of ``eval_fn``'s metrics that ``metrics.csv`` also needs a column for (e.g. one per
    held-out corpus).
    """
    cfg.validate()
    if not callable(batches):
        raise AdaptError("batches must be a function step -> batch")
    if stop_after is not None and (not isinstance(stop_after, int) or stop_after < 1):
        raise AdaptError(f"stop_after must be an integer >= 1 or None, got {stop_after!r}")
    out = Path(out) if out is not None else None
    run = _Run(teacher, cfg, out, eval_fn)
    may_resume = _prepare_dir(out, cfg, resume, overwrite) if out is not None else False
    ckpt = latest_checkpoint(out / "checkpoints") if may_resume else None
    if ckpt is not None:
        run.restore(ckpt)
    if out is not None:
        resume_step = run.start if ckpt is not None else None
        run.log = _Csv(out / "metrics.csv", len(run.student.layers), resume_step, eval_metrics)
    if run.start == 0:
        run.evaluate("teacher", teacher, 0)
        run.evaluate("swapped", run.model, 0)
    # an evaluation interrupted after its stage's last checkpoint runs now, on that checkpoint
    if run.start == cfg.transfer_steps > 0:
        run.evaluate("transfer", run.model, run.start)
    if run.start == cfg.total_steps and cfg.finetune_steps:
        run.evaluate("finetune", run.model, run.start)
    stop = min(cfg.total_steps, stop_after) if stop_after is not None else cfg.total_steps
    bar = _progress(cfg, run.start, progress)
    step = run.start
    try:
        for step in range(run.start + 1, stop + 1):
            row = run.step(step, batches(step), loss_fn or default_loss)
            if run.log:
                run.log.log(row)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(stage=row["stage"], loss=f"{row['loss']:.4g}")
            end_of_stage = step in (cfg.transfer_steps, cfg.total_steps)
            if cfg.eval_every and step % cfg.eval_every == 0 and not end_of_stage:
                # before the checkpoint, so a run resumed from it holds this evaluation (one resumed from an earlier
                # checkpoint replays the steps and evaluates here again, on the same weights)
                run.evaluate(f"{row['stage']}@{step}", run.model, step)
            if out and (step % cfg.checkpoint_every == 0 or step == stop or end_of_stage):
                run.save(step)
            if step == cfg.transfer_steps:
                run.evaluate("transfer", run.model, step)
            if step == cfg.total_steps and cfg.finetune_steps:
                run.evaluate("finetune", run.model, step)
    finally:
        if bar is not None:
            bar.close()
    if out:
        run.finish(step)
    return AdaptResult(student=run.student, step=step, evaluations=run.evaluations, layer_losses=run.layer_losses)


def load_student(teacher: nn.Module, run: str | Path) -> nn.Module:
    """The student of the adapt run in ``run`` at its latest checkpoint, rebuilt from ``teacher`` (the model the run
    adapted) and its ``adapt.json`` (mechanism, options, LoRA adapters), in eval mode."""
    run = Path(run)
    if not (run / _MARKER).is_file() or not (run / "adapt.json").is_file():
        raise AdaptError(f"{run} is not an attnzoo adapt run directory (no {_MARKER} / adapt.json)")
    saved = json.loads((run / "adapt.json").read_text())
    known = set(asdict(AdaptConfig(saved.get("mechanism", ""))))
    cfg = AdaptConfig(**{k: v for k, v in saved.items() if k in known})
    ckpt = latest_checkpoint(run / "checkpoints")
    if ckpt is None:
        raise AdaptError(f"{run} has no checkpoint yet: nothing to load")
    model = _Run(teacher, cfg, None, None).model
    load_checkpoint(ckpt, model, restore_rng=False)
    return model.eval()


def _lr(cfg: AdaptConfig, stage: str) -> float:
    return cfg.transfer_lr if stage == "transfer" else cfg.finetune_lr


def _progress(cfg: AdaptConfig, start: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=cfg.total_steps, initial=start, desc=f"adapt {cfg.mechanism}", dynamic_ncols=True)
