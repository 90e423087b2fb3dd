"""The in-context section's title names the function classes its plan runs, and no other."""

from __future__ import annotations

import pytest

from attnzoo.reproduce.budgets import BUDGETS, budget
from attnzoo.reproduce.sections import icl


@pytest.mark.parametrize("name", sorted(BUDGETS))
def test_the_summary_title_names_only_the_planned_tasks(name, tmp_path):
    plan = budget(name)["icl"]
    sec = icl.summarize({}, plan, tmp_path, str)
    title = sec.title
    # a budget that runs no task says so rather than failing
    assert bool(plan["tasks"]) or sec.intro.startswith("Not run at this budget")
    assert title.startswith("In-context learning: ")
    for task, words in icl.TASK_NAMES.items():
        # "linear" is a word of "sparse-linear": match the class as the title lists it
        listed = f" {words} " in f" {title.split(': ', 1)[1].replace(' and ', ' ').replace(',', ' ')} "
        assert listed == (task in plan["tasks"]), (name, title, list(plan["tasks"]))


@pytest.mark.parametrize(
    "tasks, expected",
    [
        (["linear"], "In-context learning: linear regression"),
        (["sparse"], "In-context learning: sparse-linear regression"),
        (["linear", "sparse"], "In-context learning: linear and sparse-linear regression"),
        ([], icl.TITLE),
    ],
)
def test_title_lists_the_classes(tasks, expected):
    assert icl.title(tasks) == expected


def test_a_plan_without_models_shows_the_reference_predictors_and_aots_claims_not_tested(tmp_path):
    import copy

    from attnzoo.reproduce.budgets import BUDGETS
    from attnzoo.reproduce.sections import icl

    plan = copy.deepcopy(BUDGETS["long"]["icl"])
    assert plan["models"] == [] and plan["aot_not_tested"]
    errors = {"zero": [1.0] * 9, "least_squares": [0.8] * 4 + [0.0] * 5, "lasso": [0.9] * 4 + [0.01] * 5}
    records = {"icl/linear/baselines": {"result": {"errors": errors, "n_prompts": 256, "dim": 4}}}
    sec = icl.summarize(records, plan, tmp_path, str)
    assert sec.intro.startswith("No model trains at this budget") and not sec.scale
    assert [t.title for t in sec.tables] == ["linear: error / d by number of in-context examples k"]
    assert {f.claim_id: f.verdict for f in sec.findings} == {
        "aot-f6-icl-learns#linear": "not tested",
        "aot-f6-icl-close#linear": "not tested",
    }
    assert all(f.measured == plan["aot_not_tested"] for f in sec.findings)
