"""What each ``--budget`` runs: data sizes, model sizes, steps and the mechanisms compared per section.

Each budget is one YAML file in ``budgets/`` (shipped as package data), spelled out in full with a one-line reason
per choice; the measurements behind those choices are in docs/results_history.md under their dates.

``smoke`` (~2 min on a 2-core CPU, CI): every section with tiny models, few steps, few mechanisms.
``default`` (<= 30 min on a 2-core CPU): every mechanism of every section at laptop scale, two seeds per trained
comparison, only the tasks the baselines learn (on every seed) in that time.
``long`` (<= 2 h on a 2-core CPU with ``--jobs 2``, resumable): 3 seeds for every trained comparison, each row
at the best rate of its own sweep, baselines trained towards a plateau, LRA-style ListOps.
``full`` (a GPU): the papers' sequence lengths and longer training; same code paths.

Within a section every model shares width, depth, heads, data, optimiser and steps; only the mechanism
(and the architecture the paper pairs it with) changes.
"""

from __future__ import annotations

import copy
from importlib import resources
from typing import Any

from attnzoo.train.config import read_yaml

__all__ = ["BUDGETS", "SECTIONS", "budget", "load_budget"]

#: section keys in report order
SECTIONS = ("vision", "adapt-vision", "long-range", "language", "icl", "efficiency", "probes", "segmentation")
#: budget names, smallest first; each is ``budgets/<name>.yaml``
BUDGET_NAMES = ("smoke", "default", "long", "full")


def _budget_file(name: str):
    """The packaged YAML file of budget ``name``."""
    return resources.files(__package__).joinpath("budgets", f"{name}.yaml")


def load_budget(name: str, source: Any = None) -> dict:
    """Budget ``name`` read from ``source`` (a path; default its packaged file), its top-level keys checked."""
    path = _budget_file(name) if source is None else source
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ValueError(f"budget file {path} must hold a mapping of sections, got {type(data).__name__}")
    unknown = [k for k in data if k != "description" and k not in SECTIONS]
    if unknown:
        raise ValueError(
            f"budget file {path} names unknown sections {unknown}; valid keys: description, {', '.join(SECTIONS)}"
        )
    missing = [k for k in ("description", *SECTIONS) if k not in data]
    if missing:
        raise ValueError(f"budget file {path} lacks {missing}; every budget spells out every section")
    return data


BUDGETS: dict[str, dict] = {name: load_budget(name) for name in BUDGET_NAMES}
#: LRA-style tasks the 2-core budgets leave out, each with the dated pilot that says why (the report cites these)
LRA_LEFT_OUT: dict[str, str] = BUDGETS["default"]["long-range"]["left_out"]


def budget(name: str) -> dict:
    """A deep copy of budget ``name``'s plan."""
    if name not in BUDGETS:
        raise ValueError(f"unknown budget {name!r}; valid budgets: {sorted(BUDGETS)}")
    return copy.deepcopy(BUDGETS[name])
