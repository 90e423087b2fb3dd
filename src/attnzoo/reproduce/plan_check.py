"""``attnzoo reproduce --check-plan``: each compared pair's parameter ratio against the paper's, checked before any
training so that a claim is not gated "conditions" after its seeds trained."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from attnzoo.compare import claims
from attnzoo.compare.common import md_table
from attnzoo.reproduce import paper_claims

__all__ = ["SECTION_OF_TASK", "RATIO_TOLERANCE", "RatioCheck", "size_checks", "render_size_checks"]

SECTION_OF_TASK = {"image classification": "vision", "language modelling": "language"}  # trains a claim's rows
RATIO_TOLERANCE = claims.SIZE_TOLERANCE


@dataclass(frozen=True)
class RatioCheck:
    """One compared pair of a plan: its parameters and ratio here against the paper's ratio."""

    claim_id: str
    row_a: str
    row_b: str
    params_a: int | None
    params_b: int | None
    paper_ratio: float
    source: str

    @property
    def ratio(self) -> float | None:
        """``params_a / params_b`` here (None when a row is not in the plan)."""
        return self.params_a / self.params_b if self.params_a and self.params_b else None

    @property
    def planned(self) -> bool:
        return self.ratio is not None

    @property
    def holds(self) -> bool:
        return self.planned and claims.within_ratio(self.ratio, self.paper_ratio, RATIO_TOLERANCE)


@lru_cache(maxsize=None)
def _task_sizes(task: str, options: tuple) -> tuple:
    from attnzoo.data.tasks import build_task
    from attnzoo.train.objectives import task_model_overrides

    return tuple(sorted(task_model_overrides(build_task(task, **dict(options))).items()))


def _freeze(d: dict) -> tuple:
    return tuple(sorted((k, _freeze(v) if isinstance(v, dict) else v) for k, v in d.items()))


def train_params(train: dict) -> int:
    """Parameters of the model a step's train config builds (tied weights once), without training or allocating."""
    from attnzoo.models import count_parameters
    from attnzoo.train.config import from_dict

    # the rate may still be a placeholder the sweep fills in; it does not change the model
    cfg = from_dict({k: v for k, v in train.items() if k != "lr"})
    sizes = dict(_task_sizes(cfg.task, _freeze(cfg.task_options or {})))
    return count_parameters(cfg.model, **{**sizes, **cfg.resolved_model_options()})


def _row_train(steps, section: str, row: str) -> dict | None:
    # a row's first seed run: ``section/row/seedS`` (or ``section/task/row/seedS``)
    for s in steps:
        parts = s.id.split("/")
        if s.section == section and len(parts) >= 3 and parts[-2] == row and parts[-1].startswith("seed"):
            return s.config.get("train")
    return None


def size_checks(steps) -> list[RatioCheck]:
    """Every paper claim with a parameter ratio whose section the plan ``steps`` train, with the ratio here."""
    out = []
    for rec in paper_claims.CLAIMS:
        cond = rec.conditions
        section = SECTION_OF_TASK.get(rec.task)
        if cond.param_ratio is None or section is None or not any(s.section == section for s in steps):
            continue
        a, b = rec.rows[:2]
        params = [train_params(t) if t else None for t in (_row_train(steps, section, r) for r in (a, b))]
        out.append(RatioCheck(rec.id, a, b, *params, cond.param_ratio, cond.param_ratio_source))
    return out


def render_size_checks(checks: list[RatioCheck]) -> str:
    """A markdown table of the checks, one line each, and a closing line that counts the pairs off the paper's."""
    rows = []
    for c in checks:
        here = [f"{c.params_a:,} / {c.params_b:,}", f"{c.ratio:.2f}x"] if c.planned else ["-", "-"]
        condition = "holds" if c.holds else f"off by more than {RATIO_TOLERANCE:.0%}" if c.planned else "not planned"
        rows.append([f"`{c.claim_id}`", f"{c.row_a} vs {c.row_b}", *here, f"{c.paper_ratio:.2f}x", condition])
    off = sum(c.planned and not c.holds for c in checks)
    table = md_table(["claim", "pair", "parameters", "here", "paper", "condition"], rows)
    return f"{table}\n\n{off} of {sum(c.planned for c in checks)} planned pairs off the paper's parameter ratio.\n"
