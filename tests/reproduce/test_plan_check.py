"""The plan's parameter ratios, computed before training, against the papers'."""

from __future__ import annotations

import pytest

from attnzoo.reproduce import plan_check
from attnzoo.reproduce.plan_check import RATIO_TOLERANCE, RatioCheck


def _check(pa, pb, paper=1.0):
    return RatioCheck("x", "a", "b", pa, pb, paper, "src")


@pytest.mark.parametrize(
    ("pa", "holds"),
    [(100, True), (109, True), (111, False), (91, True), (90, False), (None, False)],
)
def test_ratio_holds_within_the_tolerance_either_way(pa, holds):
    assert RATIO_TOLERANCE == 0.10
    c = _check(pa, 100)
    assert c.holds is holds
    assert c.planned is (pa is not None)


def test_ratio_is_read_against_the_papers_own_ratio():
    assert _check(200, 100, paper=2.0).holds
    assert not _check(100, 100, paper=2.0).holds


def test_train_params_counts_the_model_the_trainer_builds():
    from attnzoo.data.tasks import build_task
    from attnzoo.train.config import from_dict
    from attnzoo.train.objectives import build_task_model

    train = {
        "task": "digits",
        "model": "vit_s",
        "model_options": {"dim": 32, "depth": 1, "heads": 2, "patch_size": 4},
        "lr": "tuned",
    }
    cfg = from_dict({k: v for k, v in train.items() if k != "lr"})
    model = build_task_model(cfg, build_task("digits"))
    assert plan_check.train_params(train) == sum(p.numel() for p in model.parameters())


def test_smoke_plan_reports_its_pairs_and_the_cli_exits_on_a_pair_off_the_ratio(capsys):
    from attnzoo.reproduce.cli import main
    from attnzoo.reproduce.runner import plan

    _, steps = plan("smoke", 0)
    checks = plan_check.size_checks(steps)
    planned = [c for c in checks if c.planned]
    assert planned, "the smoke plan trains at least one compared pair with a paper ratio"
    expected = 1 if any(not c.holds for c in planned) else 0
    assert main(["--budget", "smoke", "--check-plan"]) == expected
    out = capsys.readouterr().out
    for c in planned:
        assert f"`{c.claim_id}`" in out and f"{c.ratio:.2f}x" in out


def test_the_long_plan_trains_every_compared_pair_at_the_papers_parameter_ratio():
    # by construction, before any seed is trained: a pair off the paper's ratio is a claim the run cannot test
    from attnzoo.reproduce.runner import plan

    _, steps = plan("long", 0)
    checks = [c for c in plan_check.size_checks(steps) if c.planned]
    assert len(checks) >= 6
    off = [(c.claim_id, round(c.ratio, 3), round(c.paper_ratio, 3)) for c in checks if not c.holds]
    assert not off, off


@pytest.mark.parametrize("section", ["vision", "language"])
def test_row_arch_sets_a_rows_own_options_and_refuses_a_row_the_plan_lacks(section):
    from importlib import import_module

    from attnzoo.reproduce.runner import plan

    mod = import_module(f"attnzoo.reproduce.sections.{section}")
    b, _ = plan("long", 0)
    p = b[section]
    row = next(iter(p["row_arch"]))
    opts = {**p["row_arch"][row], "dim": 40}
    steps = {s.id: s for s in mod.plan_steps({**p, "row_arch": {row: opts}}, 0)}
    assert steps[f"{section}/{row}/seed0"].config["train"]["model_options"]["dim"] == 40
    other = next(r for r in p["models"] if r != row)
    assert steps[f"{section}/{other}/seed0"].config["train"]["model_options"]["dim"] == p["arch"]["dim"]
    with pytest.raises(ValueError, match=r"row_arch names rows \['nope'\]"):
        mod.plan_steps({**p, "row_arch": {"nope": {"dim": 8}}}, 0)


def test_language_rows_are_scored_at_their_best_checkpoint_where_the_plan_selects():
    from attnzoo.reproduce.runner import plan

    b, steps = plan("long", 0)
    train = next(s for s in steps if s.id == "language/gpt/seed0").config["train"]
    assert train["select_every"] == b["language"]["select_every"] > 0
    assert train["task_options"]["select_chars"] > 0


def test_icl_marks_aots_claims_not_tested_with_the_plans_reason_when_aot_is_not_trained():
    from attnzoo.reproduce.sections import icl

    plan = {"aot_not_tested": "pilots: tied AoT needs more steps"}
    fs = icl._aot_not_tested("linear", plan, {"gpt": [0.1, 0.1]})
    assert [f.claim_id for f in fs] == ["aot-f6-icl-learns#linear", "aot-f6-icl-close#linear"]
    assert all(f.verdict == "not tested" and "tied AoT" in f.measured for f in fs)
    assert icl._aot_not_tested("linear", plan, {"gpt": [0.1], "aot": [0.2]}) == []
    assert icl._aot_not_tested("linear", {}, {"gpt": [0.1]}) == []
