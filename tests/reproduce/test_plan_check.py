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
