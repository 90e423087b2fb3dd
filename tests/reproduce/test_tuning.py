"""Every seed run of a swept row trains at its row's best swept rate, chosen when it runs (the report's "Tuned")."""

from __future__ import annotations

import pytest

from attnzoo.compare.common import Context, best_swept_lr, sweep_deps, sweep_id, sweep_table, tuned
from attnzoo.compare.store import Step, StepStore
from attnzoo.reproduce.runner import plan

LRS = [1e-3, 3e-3, 1e-2]


def _store(tmp_path, values: dict[float, float | None], metric: str = "accuracy") -> Context:
    store = StepStore(tmp_path)
    for lr, v in values.items():
        sid = sweep_id("sec/row", lr)
        store.save(Step(sid, "sec", {"lr": lr}, lambda *_: {}), {metric: v}, wall_s=0.0, started=0.0)
    return Context(out=tmp_path, store=store, seed=0)


def test_tuned_config_reads_its_rows_sweep():
    cfg = {"train": {"lr": 5e-4, "steps": 3}, "mechanism": "m"}
    out = tuned(cfg, "sec", "row", LRS, "accuracy", True)
    assert cfg["train"]["lr"] == 5e-4  # the argument is left alone
    assert out["train"]["lr"] == "tuned" and out["mechanism"] == "m"
    assert set(sweep_deps(out)) == {sweep_id("sec/row", lr) for lr in LRS}
    assert tuned(cfg, "sec", "row", [], "accuracy", True) is cfg and sweep_deps(cfg) == ()


@pytest.mark.parametrize(
    ("values", "higher", "best"),
    [
        ({1e-3: 0.5, 3e-3: 0.7, 1e-2: 0.6}, True, 3e-3),
        ({1e-3: 0.5, 3e-3: 0.7, 1e-2: 0.6}, False, 1e-3),  # a loss: lowest wins
        ({1e-3: 0.7, 3e-3: 0.7, 1e-2: 0.6}, True, 1e-3),  # a tie: the lowest rate
    ],
)
def test_best_swept_lr(tmp_path, values, higher, best):
    ctx = _store(tmp_path, values)
    sweep = tuned({"train": {"lr": 0.0}}, "sec", "row", LRS, "accuracy", higher)["sweep"]
    assert best_swept_lr(ctx, sweep) == best


def test_best_swept_lr_refuses_a_missing_or_broken_run(tmp_path):
    sweep = tuned({"train": {"lr": 0.0}}, "sec", "row", LRS, "accuracy", True)["sweep"]
    with pytest.raises(ValueError, match="has no finite 'accuracy'"):
        best_swept_lr(_store(tmp_path / "a", {1e-3: 0.5, 3e-3: 0.6}), sweep)
    with pytest.raises(ValueError, match="lr0.01 has no finite"):
        best_swept_lr(_store(tmp_path / "b", {1e-3: 0.5, 3e-3: 0.6, 1e-2: float("nan")}), sweep)


def test_sweep_table_of_tuned_rows_marks_the_best_and_the_grid_edges():
    rec = {sweep_id("sec/a", lr): {"result": {"accuracy": v}} for lr, v in zip(LRS, [0.5, 0.7, 0.6], strict=True)} | {
        sweep_id("sec/b", lr): {"result": {"accuracy": v}} for lr, v in zip(LRS, [0.5, 0.6, 0.7], strict=True)
    }
    table, untuned = sweep_table(rec, ["a", "b"], "sec", LRS, "accuracy", True, 100.0)
    # b's best rate is the grid's highest: its optimum may lie beyond, so it is not shown tuned
    assert set(untuned) == {"b"} and "0.01 is the highest of the grid" in untuned["b"]
    assert table.rows[0] == ["a", "50", "**70**", "60"] and table.rows[1] == ["b †", "50", "60", "**70**"]
    assert "†: best at an end of the grid" in table.caption and "1 of 2 rows" in table.caption
    # a loss: the lowest value wins, and a best at the lowest rate is an edge as well
    _, untuned = sweep_table(rec, ["a", "b"], "sec", LRS, "accuracy", False, 100.0)
    assert set(untuned) == {"a", "b"} and "0.001 is the lowest" in untuned["a"]
    assert sweep_table(rec, ["a"], "sec", [], "accuracy", True) == (None, {})


@pytest.mark.parametrize("budget", ["default", "long"])
def test_every_seed_of_a_swept_row_and_its_ablations_is_tuned(budget):
    b, steps = plan(budget, 0)
    for s in steps:
        if s.section not in ("vision", "language", "long-range", "icl") or "train" not in s.config:
            continue
        if "/lr-sweep/" in s.id:
            assert isinstance(s.config["train"]["lr"], float)
        elif b[s.section].get("lr_sweep") and s.section != "long-range":
            assert s.config["train"]["lr"] == "tuned", s.id
    ablations = [s for s in steps if s.id.startswith("vision/aot+ista/seed")]
    assert all("vision/aot/lr-sweep" in d for s in ablations for d in s.deps)


def test_a_row_can_sweep_rates_beyond_the_common_grid():
    from attnzoo.compare.common import check_sweep_extra, row_lrs

    plan = {"lr_sweep": LRS, "lr_sweep_extra": {"b": [3e-2]}}
    assert row_lrs(plan, "a") == LRS and row_lrs(plan, "b") == LRS + [3e-2]
    assert row_lrs({}, "a") == []
    with pytest.raises(ValueError, match="no lr_sweep"):
        row_lrs({"lr_sweep_extra": {"a": [1e-3]}}, "a")
    check_sweep_extra(plan, ["a", "b"])
    with pytest.raises(ValueError, match=r"lr_sweep_extra names rows \['b'\] that are not swept here; valid: \['a'\]"):
        check_sweep_extra(plan, ["a"])
    # b peaked at the common grid's top; with its extra rate the best is inside its own grid, and a's table cell
    # for the rate it did not run is a dash
    vals = {"a": [0.5, 0.7, 0.6], "b": [0.5, 0.6, 0.7, 0.65]}
    grid_values = {r: zip(row_lrs(plan, r), vals[r], strict=True) for r in vals}
    rec = {sweep_id(f"sec/{r}", lr): {"result": {"accuracy": v}} for r, pairs in grid_values.items() for lr, v in pairs}
    grids = {r: row_lrs(plan, r) for r in vals}
    table, untuned = sweep_table(rec, ["a", "b"], "sec", grids, "accuracy", True, 100.0)
    assert untuned == {}
    assert table.headers == ["row", "lr 0.001", "lr 0.003", "lr 0.01", "lr 0.03"]
    assert table.rows == [["a", "50", "**70**", "60", "–"], ["b", "50", "60", "**70**", "65"]]
    assert "–: a rate outside that row's grid" in table.caption


def test_extra_rates_are_planned_and_read_by_the_tuned_seeds():
    from attnzoo.reproduce.budgets import budget
    from attnzoo.reproduce.sections import language

    p = budget("smoke")["language"]
    p["lr_sweep_extra"] = {"tost": [3e-2]}
    steps = language.plan_steps(p, 0)
    ids = {s.id for s in steps}
    assert sweep_id("language/tost", 3e-2) in ids and sweep_id("language/gpt", 3e-2) not in ids
    tost = next(s for s in steps if s.id == "language/tost/seed0")
    assert sweep_id("language/tost", 3e-2) in tost.deps
    p["lr_sweep_extra"] = {"bert": [3e-2]}
    with pytest.raises(ValueError, match="lr_sweep_extra names rows \\['bert'\\]"):
        language.plan_steps(p, 0)


def test_a_flat_top_on_a_grid_end_is_not_gated():
    # b's best (0.01) beats its neighbour by 0.5 points; with a seed spread of 1 point that is a flat top
    rec = {sweep_id("sec/b", lr): {"result": {"accuracy": v}} for lr, v in zip(LRS, [0.5, 0.695, 0.70], strict=True)}
    table, untuned = sweep_table(rec, ["b"], "sec", LRS, "accuracy", True, 100.0, noise={"b": 1.0})
    assert untuned == {} and table.rows == [["b ‡", "50", "69.5", "**70**"]]
    assert "‡: best at an end, within one seed std" in table.caption
    assert "Every best rate lies inside the grid" not in table.caption  # b's is on its end
    # a spread of 0.4 points: the rise to the end is real, the optimum may lie beyond
    _, untuned = sweep_table(rec, ["b"], "sec", LRS, "accuracy", True, 100.0, noise={"b": 0.4})
    assert set(untuned) == {"b"}


def test_a_sweep_that_learned_at_no_rate_is_not_tuned_even_on_a_flat_top():
    """A sweep whose every rate stays under the task's floor found no optimum, even on a flat top (TSSA's ListOps
    sweep on 2026-11-27: 13.9-17.2% against an 18.8% majority)."""
    rec = {sweep_id("sec/b", lr): {"result": {"accuracy": v}} for lr, v in zip(LRS, [0.14, 0.145, 0.15], strict=True)}
    table, untuned = sweep_table(rec, ["b"], "sec", LRS, "accuracy", True, 100.0, noise={"b": 1.0}, floor=18.8)
    assert untuned == {"b": "no swept learning rate of b beats 18.8 (best 15): it learned at none"}
    assert table.rows == [["b §", "14", "14.5", "**15**"]]
    assert "§: no swept rate beats 18.8 (1 row)" in table.caption and "‡" not in table.caption
    assert "†" not in table.caption and "inside the grid" not in table.caption  # once, under its own mark
    # a best above the floor: the flat-top rule as before
    table, untuned = sweep_table(rec, ["b"], "sec", LRS, "accuracy", True, 100.0, noise={"b": 1.0}, floor=10.0)
    assert untuned == {} and table.rows[0][0] == "b ‡"


@pytest.mark.parametrize(
    ("section", "rows"),
    # long trains no ListOps or in-context row: those sections' sweeps are read with rows put back
    [
        ("vision", {}),
        ("long-range", {"mechanisms": ["softmax", "identity"]}),
        ("language", {}),
        ("icl", {"models": ["gpt"]}),
    ],
)
def test_sweep_runs_train_the_plans_fraction_of_the_reported_steps(section, rows):
    from attnzoo.reproduce.budgets import BUDGETS
    from attnzoo.reproduce.sections import SECTION_MODULES

    block = dict(BUDGETS["long"][section], **rows)
    frac = block["sweep_fraction"]
    by_id = {s.id: s for s in SECTION_MODULES[section].plan_steps(block, 0)}
    sweeps = [s for s in by_id.values() if "/lr-sweep/" in s.id]
    assert sweeps
    for s in sweeps:
        # the reported seed 0 of the same row trains the full steps; the sweep run trains `frac` of them
        row = s.id.split("/lr-sweep/")[0]
        seed_run = by_id.get(f"{row}/seed0")
        if seed_run is None:
            continue
        full = seed_run.config["train"]["steps"]
        assert s.config["train"]["steps"] == max(1, round(full * frac)), s.id
        assert (s.config["train"]["steps"] < full) == (frac < 1)


def test_swept_ablations_train_at_their_own_rate_and_must_be_ablations():
    from attnzoo.reproduce.sections import vision
    from attnzoo.reproduce.sections.vision import sweep_rows

    b, _ = plan("long", 0)
    swept = ["vit-meanpool", "vit+tssa-meanpool", "csp_vit_skeleton+softmax"]
    v = {**b["vision"], "models": [*b["vision"]["models"], "csp_vit"], "ablations": [*swept, "aot+ista"]}
    by_id = {s.id: s for s in vision.plan_steps({**v, "swept_ablations": swept}, 0)}
    for row in swept:
        deps = by_id[f"vision/{row}/seed0"].deps
        assert deps and all(d.startswith(f"vision/{row}/lr-sweep/") for d in deps), (row, deps)
    # an ablation not in the list keeps the rate of the row it ablates
    assert all(d.startswith("vision/aot/lr-sweep/") for d in by_id["vision/aot+ista/seed0"].deps)
    with pytest.raises(ValueError, match=r"swept_ablations \['nope'\] are not ablations of this plan"):
        sweep_rows({"models": ["vit"], "ablations": ["aot+ista"], "swept_ablations": ["nope"]})
