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
