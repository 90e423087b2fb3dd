"""Best-checkpoint selection: the weights of the step whose score on a held-out selection split was best.

A run with ``select_every = k`` scores the task's selection split (``Task.select``, apart from the reported
``val``) every ``k`` steps and at the last, and keeps a copy of the weights whenever the score improves strictly
(ties keep the earlier step). The record and the weights go into every checkpoint, so a resumed run makes the same
choices as an uninterrupted one; at the end they are written as ``best_model/`` and ``final.json``'s ``best``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

from attnzoo.models.checkpoint import CheckpointError
from attnzoo.train.config import ConfigError

__all__ = ["BestCheckpoint", "BEST_TENSORS"]

#: the checkpoint file (``<name>.safetensors``) that holds the best weights
BEST_TENSORS = "best_model"


@dataclass
class BestCheckpoint:
    """The best selection score so far (``metric`` minimised or maximised per ``mode``) and its weights."""

    metric: str
    mode: str = "min"
    step: int | None = None
    scores: dict[str, Any] = field(default_factory=dict)
    weights: dict[str, torch.Tensor] | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("min", "max"):
            raise ConfigError(f"select_mode={self.mode!r} is not supported; valid choices: ['min', 'max']")

    def improves(self, scores: dict[str, Any]) -> bool:
        """Whether ``scores`` beat the best so far strictly (the first score always does; NaN never does)."""
        if self.metric not in scores or not isinstance(scores[self.metric], (int, float)):
            numeric = sorted(k for k, v in scores.items() if isinstance(v, (int, float)))
            raise ConfigError(
                f"select_metric={self.metric!r} is not a metric of this task's evaluation; valid: {numeric}"
            )
        new = float(scores[self.metric])
        if math.isnan(new):
            return False
        if self.step is None:
            return True
        old = float(self.scores[self.metric])
        return new < old if self.mode == "min" else new > old

    def consider(self, step: int, scores: dict[str, Any], model: nn.Module) -> bool:
        """Keep ``model``'s weights (a CPU copy) as the best when ``scores`` improve on the best; True if kept."""
        if not self.improves(scores):
            return False
        self.step, self.scores = step, dict(scores)
        self.weights = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        return True

    def record(self) -> dict[str, Any] | None:
        """What a checkpoint's ``state.json`` keeps (None before the first score)."""
        return None if self.step is None else {"step": self.step, "select": self.scores}

    def tensors(self) -> dict[str, dict[str, torch.Tensor]]:
        """The checkpoint's extra tensor files: the best weights, once there are any."""
        return {} if self.weights is None else {BEST_TENSORS: self.weights}

    def restore(self, state: dict[str, Any], ckpt: Path) -> None:
        """Take the record and weights of checkpoint ``ckpt`` (whose ``state.json`` is ``state``), if it has them."""
        rec = state.get("best")
        if rec is None:
            return
        f = Path(ckpt) / f"{BEST_TENSORS}.safetensors"
        try:
            self.step, self.scores = int(rec["step"]), dict(rec["select"])
            self.weights = load_file(str(f))
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{Path(ckpt) / 'state.json'}: corrupt best-checkpoint record ({e})") from None
        except Exception as e:  # noqa: BLE001 - safetensors raises its own types for missing or damaged files
            raise CheckpointError(f"{f}: missing or corrupt ({type(e).__name__}: {e})") from None
