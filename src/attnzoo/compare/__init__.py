"""``attnzoo compare``: which attention mechanism is better on your own task, with what confidence.

Takes any task ``attnzoo train`` takes (a preset or a config YAML), sweeps each mechanism's learning rate, trains
several seeds of each at its best rate and writes ``DIR/compare.md``, ``DIR/compare.json`` and plots: per mechanism
the validation metric (mean ± std), parameters, step time, tuned rate, and its effect against a baseline with the
95% Welch interval and verdict of :func:`attnzoo.compare.claims.compare` (the report's rule). Resumable and
locked like ``attnzoo reproduce``: steps are stored in ``DIR/steps``, a rerun continues where a run stopped.

Python API: :func:`attnzoo.compare.engine.run` with a :class:`~attnzoo.compare.plan.CompareSpec`.
"""

from __future__ import annotations

from attnzoo.compare.cli import main
from attnzoo.compare.plan import CompareError, CompareSpec

__all__ = ["main", "CompareError", "CompareSpec"]
