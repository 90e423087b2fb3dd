"""The report's workers row: run.json records the processes and torch threads that computed the steps (``--jobs``
workers run ``--threads`` threads each, 1 unless given), not the threads of the process that renders the report."""

from __future__ import annotations

import json

import torch

from attnzoo.compare.common import Context
from attnzoo.compare.runner import RunOutcome
from attnzoo.compare.store import StepStore
from attnzoo.reproduce import plan
from attnzoo.reproduce.report import _workers_cell
from attnzoo.reproduce.runner import RUN_FILE, _execute, _prepare_out, recorded_workers


def _cheap_steps():
    by_id = {s.id: s for s in plan("smoke", 0)[1]}
    return [by_id["language/ngram-baselines"], by_id["icl/linear/baselines"], by_id["icl/sparse/baselines"]]


def _execute_into(out, todo, jobs, threads, report_only=False) -> RunOutcome:
    ctx = Context(out=out, store=StepStore(out), seed=0, progress=False)
    outcome = RunOutcome(out, out / "r.md", out / "r.json")
    _execute(todo, ctx, outcome, False, jobs, threads, report_only)
    return outcome


def test_run_json_records_the_workers_of_each_setting_that_computed_steps(tmp_path):
    out = tmp_path / "rep"
    _prepare_out(out, "smoke", 0)
    cheap = _cheap_steps()
    before = torch.get_num_threads()
    try:
        # this process runs 3 threads; the 2 workers run --threads 1 each, and that is what is recorded
        torch.set_num_threads(3)
        assert _execute_into(out, cheap[:2], jobs=2, threads=1).computed
        assert recorded_workers(out) == [{"jobs": 2, "threads": 1, "steps": 2}]
        # a --jobs 1 invocation computes in this process, with its threads; only the step it computed counts
        assert _execute_into(out, cheap, jobs=1, threads=None).computed == [cheap[2].id]
        # nothing left to compute, or a report rendered from stored steps: the record is unchanged
        assert _execute_into(out, cheap, jobs=4, threads=2).computed == []
        assert _execute_into(out, cheap, jobs=1, threads=None, report_only=True).computed == []
    finally:
        torch.set_num_threads(before)
    expected = [{"jobs": 2, "threads": 1, "steps": 2}, {"jobs": 1, "threads": 3, "steps": 1}]
    assert recorded_workers(out) == expected
    meta = json.loads((out / RUN_FILE).read_text())
    assert meta["budget"] == "smoke" and meta["seed"] == 0 and meta["workers"] == expected
    assert _workers_cell(expected) == "2 jobs x 1 thread (2 steps); 1 job x 3 threads (1 step)"


def test_the_workers_cell_says_jobs_and_threads_or_that_none_were_recorded(tmp_path):
    assert _workers_cell([{"jobs": 4, "threads": 1, "steps": 90}]) == "4 jobs x 1 thread"
    assert _workers_cell([{"jobs": 1, "threads": 2, "steps": 9}]) == "1 job x 2 threads"
    assert _workers_cell([]).startswith("not recorded")
    # a run directory whose run.json has no workers (its steps reused, or written without the record)
    _prepare_out(tmp_path / "old", "smoke", 0)
    assert recorded_workers(tmp_path / "old") == []
