"""Learning-rate schedules as pure functions of the step (so a resumed run needs no scheduler state)."""

from __future__ import annotations

import math

__all__ = ["SCHEDULES", "lr_at"]

SCHEDULES = ("cosine", "linear", "inverse_sqrt", "constant")


def lr_at(
    step: int, *, lr: float, steps: int, schedule: str = "cosine", warmup_steps: int = 0, min_lr_ratio: float = 0.0
) -> float:
    """Learning rate for optimizer step ``step`` (0-based) of ``steps``.

    Linear warm-up from ``lr / warmup_steps`` to ``lr`` over ``warmup_steps`` steps, then
    ``cosine`` (to ``min_lr_ratio * lr`` at the last step), ``linear`` (likewise), ``inverse_sqrt``
    (``lr * sqrt(warmup / step)``, as in the Transformer paper) or ``constant``.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r} is not supported; valid choices: {list(SCHEDULES)}")
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    floor = lr * min_lr_ratio
    if schedule == "constant":
        return lr
    if schedule == "inverse_sqrt":
        return lr * math.sqrt(max(warmup_steps, 1) / (step + 1))
    span = max(steps - warmup_steps, 1)
    frac = min(max((step - warmup_steps) / span, 0.0), 1.0)
    if schedule == "linear":
        return floor + (lr - floor) * (1.0 - frac)
    return floor + (lr - floor) * 0.5 * (1.0 + math.cos(math.pi * frac))
