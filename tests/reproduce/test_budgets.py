"""The budgets are plain data: one YAML file each, every section spelled out, read by a small checked loader."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from attnzoo.reproduce import budgets
from attnzoo.reproduce.budgets import BUDGET_NAMES, BUDGETS, SECTIONS, budget, load_budget

REPORT = Path(__file__).resolve().parents[2] / "docs" / "results" / "results.json"


def _budget_dir():
    return resources.files("attnzoo.reproduce").joinpath("budgets")


def _leaves(value, where=""):
    """Every scalar in a nested budget, with its dotted key path."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, f"{where}.{k}" if where else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, f"{where}[{i}]")
    else:
        yield where, value


def test_every_packaged_budget_file_is_a_known_budget_and_loads():
    files = sorted(p.name for p in _budget_dir().iterdir() if p.name.endswith(".yaml"))
    assert files == sorted(f"{n}.yaml" for n in BUDGET_NAMES)
    assert list(BUDGETS) == list(BUDGET_NAMES)
    for name in BUDGET_NAMES:
        data = load_budget(name)
        assert set(data) == {"description", *SECTIONS}, name
        assert isinstance(data["description"], str) and data["description"]


@pytest.mark.parametrize("name", BUDGET_NAMES)
def test_no_number_was_read_as_a_string(name):
    # PyYAML reads `1e-3` (no dot) as the string "1e-3": a rate must be written 1.0e-3
    for where, value in _leaves(BUDGETS[name]):
        if isinstance(value, str):
            try:
                float(value)
            except ValueError:
                continue
            pytest.fail(f"{name}: {where} = {value!r} is a string that reads as a number")


def test_budget_refuses_an_unknown_name_with_the_valid_list():
    with pytest.raises(ValueError, match=r"unknown budget 'huge'.*\['default', 'full', 'long', 'smoke'\]"):
        budget("huge")


def test_budget_is_a_copy():
    b = budget("smoke")
    b["vision"]["models"].append("not-a-model")
    assert "not-a-model" not in BUDGETS["smoke"]["vision"]["models"]


def test_a_budget_file_with_an_unknown_section_is_refused_naming_it(tmp_path):
    data = (_budget_dir() / "smoke.yaml").read_text(encoding="utf-8")
    bad = tmp_path / "smoke.yaml"
    bad.write_text(data + "visoin: {}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"unknown sections \['visoin'\].*valid keys: description, vision"):
        load_budget("smoke", bad)


def _without_block(text: str, key: str) -> str:
    """``text`` with the top-level block ``key:`` (its line and the indented or comment lines under it) removed."""
    out, skipping = [], False
    for line in text.splitlines(keepends=True):
        if line.startswith(f"{key}:"):
            skipping = True
        elif skipping and line[:1] not in (" ", "#", "\n"):
            skipping = False
        if not skipping:
            out.append(line)
    return "".join(out)


def test_a_budget_file_missing_a_section_is_refused_naming_it(tmp_path):
    bad = tmp_path / "smoke.yaml"
    bad.write_text(_without_block((_budget_dir() / "smoke.yaml").read_text(encoding="utf-8"), "probes"), "utf-8")
    with pytest.raises(ValueError, match=r"lacks \['probes'\]"):
        load_budget("smoke", bad)


def test_a_budget_file_that_is_not_a_mapping_is_refused(tmp_path):
    bad = tmp_path / "x.yaml"
    bad.write_text("- vision\n", encoding="utf-8")
    with pytest.raises(ValueError, match="must hold a mapping of sections, got list"):
        load_budget("x", bad)


def test_left_out_tasks_cite_a_dated_pilot_and_the_command_that_re_measures_it():
    assert budgets.LRA_LEFT_OUT is BUDGETS["default"]["long-range"]["left_out"]
    for name in ("default", "long"):
        for task, why in BUDGETS[name]["long-range"]["left_out"].items():
            assert "pilot of 2026-" in why and "`attnzoo train lra_" in why, (name, task)


def test_the_committed_report_is_a_run_of_the_long_plan():
    """README: docs/results.md is a `long` run of the current plan; every step of the plan is in its results.json
    with the same configuration hash, and it holds no step the plan lacks."""
    import json

    from attnzoo.compare.store import config_hash
    from attnzoo.reproduce.runner import plan

    stored = {sid: config_hash(rec["config"]) for sid, rec in json.loads(REPORT.read_text())["steps"].items()}
    _, steps = plan("long", 0)
    planned = {s.id: s.hash for s in steps}
    assert set(stored) == set(planned)
    changed = sorted(sid for sid in planned if stored[sid] != planned[sid])
    assert not changed, f"steps whose configuration changed since the committed report: {changed[:5]}"
