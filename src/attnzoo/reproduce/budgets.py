"""What each ``--budget`` runs: ``budgets/<name>.yaml``, every section spelled out with a one-line reason per choice
(the measurements behind them: docs/results_history.md). Within a section only the mechanism (and the architecture
the paper pairs it with) changes between models."""

from __future__ import annotations

import copy
from importlib import resources
from typing import Any, Iterable

from attnzoo.train.config import read_yaml

__all__ = ["BUDGETS", "SECTIONS", "budget", "left_out", "load_budget", "with_settings"]

SECTIONS = ("vision", "adapt-vision", "long-range", "language", "icl", "efficiency", "probes", "segmentation")
BUDGET_NAMES = ("smoke", "default", "long", "full")


def load_budget(name: str, source: Any = None) -> dict:
    """Budget ``name`` read from ``source`` (a path; default its packaged file), its top-level keys checked."""
    path = resources.files(__package__).joinpath("budgets", f"{name}.yaml") if source is None else source
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ValueError(f"budget file {path} must hold a mapping of sections, got {type(data).__name__}")
    if unknown := [k for k in data if k != "description" and k not in SECTIONS]:
        raise ValueError(
            f"budget file {path} names unknown sections {unknown}; valid keys: description, {', '.join(SECTIONS)}"
        )
    if missing := [k for k in ("description", *SECTIONS) if k not in data]:
        raise ValueError(f"budget file {path} lacks {missing}; every budget spells out every section")
    return data


BUDGETS: dict[str, dict] = {name: load_budget(name) for name in BUDGET_NAMES}
#: LRA-style tasks the 2-core budgets leave out, each with the dated pilot that says why (the report cites these)
LRA_LEFT_OUT: dict[str, str] = BUDGETS["default"]["long-range"]["left_out"]


def budget(name: str) -> dict:
    if name not in BUDGETS:
        raise ValueError(f"unknown budget {name!r}; valid budgets: {sorted(BUDGETS)}")
    return copy.deepcopy(BUDGETS[name])


def with_settings(plan: dict, settings: list[str] | tuple[str, ...] = ()) -> dict:
    """``plan`` with each ``section.key[.key...]=VALUE`` of ``settings`` applied (VALUE read as YAML); only a setting
    the plan already has can change, so a misspelt key is an error rather than an unread one."""
    import yaml

    for item in settings:
        path, sep, text = item.partition("=")
        keys = path.split(".")
        if not sep or len(keys) < 2 or not all(keys):
            raise ValueError(f"--set {item!r}: write section.key[.key...]=VALUE, e.g. language.train.steps=3200")
        node: Any = plan
        for depth, key in enumerate(keys):
            where = ".".join(keys[:depth]) or "the plan"
            if not isinstance(node, dict) or key not in node:
                valid = sorted(node) if isinstance(node, dict) else []
                raise ValueError(f"--set {item!r}: {where} has no setting {key!r}; valid: {valid}")
            parent, node = node, node[key]
        parent[keys[-1]] = yaml.safe_load(text)
    return plan


def left_out(plan: dict, section: str, claimed: Iterable[str], trained: Iterable[str], what: str) -> dict[str, str]:
    """The rows the plan leaves out for a reason its pilots measured (``not_tested``: row -> why), checked: each has
    a claim in the section (``claimed``) and is not also trained (``trained``, named ``what`` in the error)."""
    out, claimed, trained = dict(plan.get("not_tested", {})), set(claimed), set(trained)
    for row in out:
        if row not in claimed:
            raise ValueError(f"{section}: not_tested names {row!r}, which has no claim here (valid: {sorted(claimed)})")
        if row in trained:
            raise ValueError(f"{section}: {row!r} is both trained ({what}) and marked not_tested; keep one")
    return {row: " ".join(why.split()) for row, why in out.items()}
