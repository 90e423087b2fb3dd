"""``attnzoo reproduce``: the papers' comparisons at laptop scale, one report.

Trains and measures the mechanisms side by side — vision, the LRA-style suite, character-level language
modelling, in-context regression, the efficiency sweep and the white-box probes — and writes
``DIR/report.md`` (+ ``report.html``) with every table, plot, configuration and a verdict per paper claim
computed from the numbers, and ``DIR/results.json`` with all numbers.

Each training run or measurement is a step stored atomically in ``DIR/steps/<id>.json``; rerunning with the
same ``DIR`` skips finished steps, and a training run stopped midway resumes from its checkpoint.

Python API: ``run(out, budget, seed=..., only=...)``, ``plan(budget, seed)``; budgets in :data:`BUDGETS`.
"""

from __future__ import annotations

from attnzoo.compare.runner import RunOutcome
from attnzoo.reproduce.budgets import BUDGETS, SECTIONS
from attnzoo.reproduce.cli import main
from attnzoo.reproduce.runner import ReproduceError, plan, run

__all__ = ["main", "run", "plan", "BUDGETS", "SECTIONS", "ReproduceError", "RunOutcome"]
