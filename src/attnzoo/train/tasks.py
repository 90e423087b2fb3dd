"""Glue between tasks and models: the model overrides a task implies, the loss and the metrics per task kind."""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attnzoo.data.tasks import Task

__all__ = ["ARCH_FOR_KIND", "task_model_overrides", "compute_loss", "MetricAccumulator", "metric_names"]


#: the model architecture (``attnzoo.models`` config ``arch``) each task kind needs
ARCH_FOR_KIND = {
    "image_classification": "vision",
    "sequence_classification": "sequence_classifier",
    "pair_classification": "sequence_classifier",
    "causal_lm": "causal_lm",
    "icl_regression": "icl_regressor",
}


def task_model_overrides(task: Task) -> dict[str, Any]:
    """The model-config fields a task fixes (sizes, classes, vocabulary), by task kind."""
    i = task.info
    if task.kind == "image_classification":
        return {"num_classes": i["num_classes"], "image_size": i["img_size"], "in_chans": i["in_chans"]}
    if task.kind in ("sequence_classification", "pair_classification"):
        return {"num_classes": i["num_classes"], "vocab_size": i["vocab_size"], "max_len": i["seq_len"],
                "dual": task.kind == "pair_classification"}
    if task.kind == "causal_lm":
        return {"vocab_size": i["vocab_size"], "block_size": i["seq_len"]}
    if task.kind == "icl_regression":
        return {"n_dims": i["dim"], "max_points": i["n_points"]}
    raise ValueError(f"unknown task kind {task.kind!r}")


def _outputs(out: Any) -> torch.Tensor:
    # models may return a tensor, or a tuple / dict whose first entry (or "logits") is the prediction
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        return out["logits"] if "logits" in out else next(iter(out.values()))
    if isinstance(out, (tuple, list)):
        return out[0]
    raise TypeError(f"model returned {type(out).__name__}; expected a tensor")


def compute_loss(kind: str, out: Any, target: torch.Tensor, label_smoothing: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mean loss, predictions)`` for a batch; predictions are logits or regression outputs."""
    pred = _outputs(out)
    if kind in ("image_classification", "sequence_classification", "pair_classification"):
        if pred.ndim != 2 or pred.shape[0] != target.shape[0]:
            raise ValueError(f"a classifier must return logits (B, num_classes); got {tuple(pred.shape)}")
        return F.cross_entropy(pred.float(), target, label_smoothing=label_smoothing), pred
    if kind == "causal_lm":
        if pred.ndim != 3 or pred.shape[:2] != target.shape:
            raise ValueError(f"a language model must return logits (B, N, V); got {tuple(pred.shape)}")
        return F.cross_entropy(pred.float().flatten(0, 1), target.flatten()), pred
    if kind == "icl_regression":
        if pred.ndim == 3 and pred.shape[-1] == 1:
            pred = pred[..., 0]
        if pred.shape != target.shape:
            raise ValueError(f"an ICL regressor must return predictions (B, n); got {tuple(pred.shape)}")
        return F.mse_loss(pred.float(), target.float()), pred
    raise ValueError(f"unknown task kind {kind!r}")


def metric_names(kind: str) -> list[str]:
    if kind == "causal_lm":
        return ["loss", "bits_per_token", "perplexity"]
    if kind == "icl_regression":
        return ["loss", "normalized_error"]
    return ["loss", "accuracy"]


class MetricAccumulator:
    """Sums over evaluation batches (reducible across processes), then the task's metrics."""

    def __init__(self, kind: str, info: dict[str, Any]) -> None:
        self.kind, self.info = kind, info
        self.loss_sum = 0.0
        self.count = 0.0
        self.correct = 0.0
        self.pos_err: torch.Tensor | None = None  # ICL: summed squared error per position

    @torch.no_grad()
    def update(self, loss: torch.Tensor, pred: torch.Tensor, target: torch.Tensor) -> None:
        n = target.shape[0]
        if self.kind == "causal_lm":
            tokens = target.numel()
            self.loss_sum += float(loss) * tokens
            self.count += tokens
            return
        self.loss_sum += float(loss) * n
        self.count += n
        if self.kind == "icl_regression":
            err = ((pred.float() - target.float()) ** 2).sum(0).double().cpu()
            self.pos_err = err if self.pos_err is None else self.pos_err + err
        else:
            self.correct += float((pred.argmax(-1) == target).sum())

    def state(self) -> torch.Tensor:
        base = torch.tensor([self.loss_sum, self.count, self.correct], dtype=torch.float64)
        return base if self.pos_err is None else torch.cat([base, self.pos_err])

    def load_state(self, t: torch.Tensor) -> None:
        self.loss_sum, self.count, self.correct = (float(x) for x in t[:3])
        if t.numel() > 3:
            self.pos_err = t[3:].clone()

    def compute(self) -> dict[str, Any]:
        if self.count == 0:
            raise ValueError("no evaluation samples")
        loss = self.loss_sum / self.count
        if self.kind == "causal_lm":
            return {"loss": loss, "bits_per_token": loss / math.log(2), "perplexity": math.exp(min(loss, 50.0))}
        if self.kind == "icl_regression":
            per_pos = (self.pos_err / self.count / self.info["dim"]).tolist()
            return {"loss": loss, "normalized_error": float(sum(per_pos) / len(per_pos)),
                    "normalized_error_per_position": per_pos}
        return {"loss": loss, "accuracy": self.correct / self.count}


def call_model(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> Any:
    return model(*inputs)
