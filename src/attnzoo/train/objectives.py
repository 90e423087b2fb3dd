"""What each task kind trains and measures: the model it needs, the loss, and the validation metrics.

(``attnzoo.data.tasks`` builds the tasks themselves; this module is the glue between a task and a model.)
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attnzoo.data.datasets import IGNORE_INDEX
from attnzoo.data.tasks import Task, task_kind
from attnzoo.train.config import ConfigError, TrainConfig

__all__ = [
    "ARCH_FOR_KIND",
    "task_model_overrides",
    "check_model_choice",
    "build_task_model",
    "compute_loss",
    "MetricAccumulator",
    "metric_names",
    "confusion_matrix",
    "mean_iou",
]


#: the model architecture (``attnzoo.models`` config ``arch``) each task kind needs
ARCH_FOR_KIND = {
    "image_classification": "vision",
    "sequence_classification": "sequence_classifier",
    "pair_classification": "sequence_classifier",
    "causal_lm": "causal_lm",
    "icl_regression": "icl_regressor",
    "semantic_segmentation": "segmenter",
}


def task_model_overrides(task: Task) -> dict[str, Any]:
    """The model-config fields a task fixes (sizes, classes, vocabulary), by task kind."""
    i = task.info
    if task.kind in ("image_classification", "semantic_segmentation"):
        return {"num_classes": i["num_classes"], "image_size": i["img_size"], "in_chans": i["in_chans"]}
    if task.kind in ("sequence_classification", "pair_classification"):
        return {
            "num_classes": i["num_classes"],
            "vocab_size": i["vocab_size"],
            "max_len": i["seq_len"],
            "dual": task.kind == "pair_classification",
        }
    if task.kind == "causal_lm":
        return {"vocab_size": i["vocab_size"], "block_size": i["seq_len"]}
    if task.kind == "icl_regression":
        return {"n_dims": i["dim"], "max_points": i["n_points"]}
    raise ValueError(f"unknown task kind {task.kind!r}")


def check_model_choice(cfg: TrainConfig) -> None:
    """Fail early (before any data is loaded) on an unknown model/attention or a model that doesn't fit the task."""
    import attnzoo  # the public API (lazy: importing attnzoo.train does not import every model)
    from attnzoo.models import get_config

    names = attnzoo.list_models()
    if cfg.model not in names:
        raise ConfigError(f"unknown model {cfg.model!r}; valid models: {sorted(names)}")
    kind = task_kind(cfg.task)
    arch = ARCH_FOR_KIND[kind]
    if get_config(cfg.model).arch != arch:
        fitting = [n for n in names if get_config(n).arch == arch]
        raise ConfigError(
            f"model {cfg.model!r} is a {get_config(cfg.model).arch!r} model but task {cfg.task!r} "
            f"({kind}) needs a {arch!r} model; valid models for it: {fitting}"
        )
    opts = cfg.resolved_model_options()
    if "attention" in opts:
        from attnzoo.models.blocks import IDENTITY_MIXER

        valid = attnzoo.list_attentions() + [IDENTITY_MIXER]  # and the no-attention control
        if opts["attention"] not in valid:
            raise ConfigError(f"unknown attention {opts['attention']!r}; valid attentions: {valid}")
    try:  # option names and values, validated on the config alone (no allocation)
        get_config(cfg.model, **opts)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"model {cfg.model!r}: {e}") from e


def build_task_model(cfg: TrainConfig, task: Task) -> nn.Module:
    """The registered model ``cfg.model`` sized for ``task``: ``create_model(cfg.model, **task sizes,
    **cfg.model_options)``; bad names fail listing the choices. (``attnzoo.models.build_model`` is another thing:
    it builds a model from a ``ModelConfig``.)"""
    import attnzoo

    check_model_choice(cfg)
    overrides = {**task_model_overrides(task), **cfg.resolved_model_options()}
    try:
        return attnzoo.create_model(cfg.model, **overrides)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"model {cfg.model!r} with options {overrides}: {e}") from e


def _outputs(out: Any) -> torch.Tensor:
    # models may return a tensor, or a tuple / dict whose first entry (or "logits") is the prediction
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        return out["logits"] if "logits" in out else next(iter(out.values()))
    if isinstance(out, (tuple, list)):
        return out[0]
    raise TypeError(f"model returned {type(out).__name__}; expected a tensor")


def compute_loss(
    kind: str, out: Any, target: torch.Tensor, label_smoothing: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mean loss, predictions)`` for a batch; predictions are logits or regression outputs."""
    pred = _outputs(out)
    if kind in ("image_classification", "sequence_classification", "pair_classification"):
        if pred.ndim != 2 or pred.shape[0] != target.shape[0]:
            raise ValueError(f"a classifier must return logits (B, num_classes); got {tuple(pred.shape)}")
        return F.cross_entropy(pred.float(), target, label_smoothing=label_smoothing), pred
    if kind == "causal_lm":
        if pred.ndim != 3 or pred.shape[:2] != target.shape:
            raise ValueError(f"a language model must return logits (B, N, V); got {tuple(pred.shape)}")
        return F.cross_entropy(pred.float().flatten(0, 1), target.flatten(), ignore_index=IGNORE_INDEX), pred
    if kind == "icl_regression":
        if pred.ndim == 3 and pred.shape[-1] == 1:
            pred = pred[..., 0]
        if pred.shape != target.shape:
            raise ValueError(f"an ICL regressor must return predictions (B, n); got {tuple(pred.shape)}")
        return F.mse_loss(pred.float(), target.float()), pred
    if kind == "semantic_segmentation":
        if pred.ndim != 4 or pred.shape[0] != target.shape[0] or pred.shape[2:] != target.shape[1:]:
            raise ValueError(
                f"a segmenter must return per-pixel logits (B, K, H, W) for targets {tuple(target.shape)} (B, H, W); "
                f"got {tuple(pred.shape)}"
            )
        return F.cross_entropy(pred.float(), target, label_smoothing=label_smoothing), pred
    raise ValueError(f"unknown task kind {kind!r}")


def confusion_matrix(pred: torch.Tensor, target: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``(K, K)`` counts, rows = target class, columns = predicted class, of integer maps of one shape."""
    if pred.shape != target.shape:
        raise ValueError(f"pred {tuple(pred.shape)} and target {tuple(target.shape)} must have one shape")
    idx = target.reshape(-1).long() * num_classes + pred.reshape(-1).long()
    return torch.bincount(idx, minlength=num_classes * num_classes).reshape(num_classes, num_classes)


def mean_iou(confusion: torch.Tensor) -> float:
    """Mean over the classes that occur (in the target or the prediction) of ``TP / (TP + FP + FN)``."""
    conf = confusion.double()
    tp = conf.diagonal()
    union = conf.sum(0) + conf.sum(1) - tp
    present = union > 0
    return float((tp[present] / union[present]).mean()) if present.any() else 1.0


def metric_names(kind: str) -> list[str]:
    if kind == "causal_lm":
        return ["loss", "bits_per_token", "perplexity"]
    if kind == "icl_regression":
        return ["loss", "normalized_error"]
    if kind == "semantic_segmentation":
        return ["loss", "pixel_accuracy", "miou"]
    return ["loss", "accuracy"]


class MetricAccumulator:
    """Sums over evaluation batches, then the task's metrics.

    ``state()`` is one float64 vector of every sum, the same length on every process (even one that saw no
    batch), so processes combine their sums with one all-reduce and ``load_state``. A segmentation task sums a
    ``(K, K)`` confusion matrix over every pixel, so its mIoU is that of the whole set, not a mean over batches.
    """

    def __init__(self, kind: str, info: dict[str, Any]) -> None:
        self.kind, self.info = kind, info
        self.loss_sum = 0.0
        self.count = 0.0
        self.correct = 0.0
        # ICL: summed squared error per position (n_points,); allocated up front for the state's fixed length
        self.pos_err: torch.Tensor | None = None
        if kind == "icl_regression":
            self.pos_err = torch.zeros(info["n_points"], dtype=torch.float64)
        # segmentation: the confusion matrix of every pixel, flattened (K * K,)
        self.confusion: torch.Tensor | None = None
        if kind == "semantic_segmentation":
            self.confusion = torch.zeros(info["num_classes"] ** 2, dtype=torch.float64)

    @torch.no_grad()
    def update(self, loss: torch.Tensor, pred: torch.Tensor, target: torch.Tensor) -> None:
        n = target.shape[0]
        if self.kind == "causal_lm":
            tokens = int((target != IGNORE_INDEX).sum())  # a packed batch has no targets across documents
            self.loss_sum += float(loss) * tokens
            self.count += tokens
            return
        self.loss_sum += float(loss) * n
        self.count += n
        if self.kind == "icl_regression":
            err = ((pred.float() - target.float()) ** 2).sum(0).double().cpu()
            self.pos_err = err if self.pos_err is None else self.pos_err + err
        elif self.kind == "semantic_segmentation":
            k = self.info["num_classes"]
            self.confusion += confusion_matrix(pred.argmax(1), target, k).reshape(-1).double().cpu()
        else:
            self.correct += float((pred.argmax(-1) == target).sum())

    def state(self) -> torch.Tensor:
        base = torch.tensor([self.loss_sum, self.count, self.correct], dtype=torch.float64)
        extra = self.pos_err if self.pos_err is not None else self.confusion
        return base if extra is None else torch.cat([base, extra])

    def load_state(self, t: torch.Tensor) -> None:
        self.loss_sum, self.count, self.correct = (float(x) for x in t[:3])
        if t.numel() > 3 and self.kind == "semantic_segmentation":
            self.confusion = t[3:].clone()
        elif t.numel() > 3:
            self.pos_err = t[3:].clone()

    def compute(self) -> dict[str, Any]:
        if self.count == 0:
            raise ValueError("no evaluation samples")
        loss = self.loss_sum / self.count
        if self.kind == "causal_lm":
            return {"loss": loss, "bits_per_token": loss / math.log(2), "perplexity": math.exp(min(loss, 50.0))}
        if self.kind == "icl_regression":
            per_pos = (self.pos_err / self.count / self.info["dim"]).tolist()
            return {
                "loss": loss,
                "normalized_error": float(sum(per_pos) / len(per_pos)),
                "normalized_error_per_position": per_pos,
            }
        if self.kind == "semantic_segmentation":
            k = self.info["num_classes"]
            conf = self.confusion.reshape(k, k)
            return {"loss": loss, "pixel_accuracy": float(conf.trace() / conf.sum()), "miou": mean_iou(conf)}
        return {"loss": loss, "accuracy": self.correct / self.count}
