"""``attnzoo reproduce --estimate``: step times from stored runs, and the runner's schedule replayed."""

from __future__ import annotations

import json

import pytest

from attnzoo.compare.store import Step
from attnzoo.reproduce.cli import main
from attnzoo.reproduce.estimate import estimate, examples, shape
from attnzoo.reproduce.runner import ReproduceError, plan


def _step(sid: str, steps: int | None = 100, deps: tuple = (), timed: bool = False, lr: float = 1e-3) -> Step:
    config = {"train": {"steps": steps, "batch_size": 8, "lr": lr}} if steps else {"kind": "op"}
    return Step(sid, sid.split("/")[0], config, fn=lambda ctx, step: {}, deps=deps, timed=timed)


def _record(step: Step, wall_s: float) -> dict:
    return {"section": step.section, "config": step.config, "wall_s": wall_s, "result": {}}


def test_shape_puts_a_rows_seeds_rates_and_longer_runs_together():
    assert shape("vision/vit/seed2") == shape("vision/vit/lr-sweep/lr0.002") == "vision/vit/*"
    assert shape("vision/vit@2x-steps/seed0") == "vision/vit/*"
    assert shape("long-range/listops/identity/extra-seed3") == "long-range/listops/identity/*"
    assert shape("vision/vit+identity/seed0") != shape("vision/vit/seed0")
    assert shape("vision/seed2net/seed1") == "vision/seed2net/*"  # only the last part is a seed


def test_a_step_is_timed_at_its_rows_fastest_rate_scaled_by_the_examples_it_trains():
    old = [_step("vision/vit/seed0"), _step("vision/vit/seed1"), _step("vision/vit/lr-sweep/lr0.002", steps=50)]
    # seed1 ran beside other work; the sweep's rate (0.08 s a step) is the fastest
    records = {s.id: _record(s, t) for s, t in zip(old, (10.0, 30.0, 4.0), strict=True)}
    plan = [_step("vision/vit/seed0"), _step("vision/vit/seed3", steps=400), _step("vision/cbt/seed0")]
    est = estimate(plan, records)
    got = {s.id: s for s in est.steps}
    assert got["vision/vit/seed0"].source == "same config"
    assert got["vision/vit/seed0"].seconds == pytest.approx(8.0)
    assert got["vision/vit/seed3"].source == "same shape"
    assert got["vision/vit/seed3"].seconds == pytest.approx(32.0)
    assert got["vision/cbt/seed0"].seconds is None and est.unknown == ["vision/cbt/seed0"]
    assert est.thread_s == pytest.approx(40.0)


def test_a_measurement_takes_its_shapes_shortest_time():
    old = [_step("efficiency/n/softmax", steps=None)]
    est = estimate([_step("efficiency/n/softmax", steps=None)], {old[0].id: _record(old[0], 7.5)})
    assert est.steps[0].seconds == 7.5 and est.steps[0].source == "same config"


def test_the_replay_runs_jobs_in_parallel_waits_for_dependencies_and_runs_timed_steps_alone():
    a, b, c = _step("s/a/seed0"), _step("s/b/seed0"), _step("s/c/seed0")
    records = {s.id: _record(s, 10.0) for s in (a, b, c)}
    assert estimate([a, b, c], records, jobs=1).wall_s == pytest.approx(30.0)
    assert estimate([a, b, c], records, jobs=2).wall_s == pytest.approx(20.0)
    assert estimate([a, b, c], records, jobs=3).wall_s == pytest.approx(10.0)
    dep = _step("s/c/seed0", deps=("s/a/seed0",))
    assert estimate([a, dep], records, jobs=2).wall_s == pytest.approx(20.0)
    timed = _step("s/c/seed0", timed=True)
    assert estimate([a, b, timed], records, jobs=3).wall_s == pytest.approx(20.0)
    with pytest.raises(ReproduceError, match="--jobs must be a positive integer, got 0"):
        estimate([a], records, jobs=0)


def test_the_cli_needs_a_source_and_prints_the_plans_estimate(tmp_path, capsys):
    assert main(["--budget", "smoke", "--estimate"]) == 2
    assert "--reuse" in capsys.readouterr().err
    steps = plan("smoke", 0)[1]
    # every stored step costs 1 ms an example (2 s a measurement): the estimate is then exactly their sum
    seconds = {s.id: 1e-3 * examples(s.config) if examples(s.config) else 2.0 for s in steps}
    stored = {"steps": {s.id: _record(s, seconds[s.id]) for s in steps}}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(stored))
    assert main(["--budget", "smoke", "--estimate", "--jobs", "2", "--reuse", str(path)]) == 0
    out = capsys.readouterr().out
    n = len(steps)
    assert f"| total | {n} | {n} | 0 | 0 | {sum(seconds.values()) / 60:,.1f} |" in out
    assert "Predicted wall clock with --jobs 2:" in out
