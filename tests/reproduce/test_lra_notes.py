"""The long-range section's notes: the tasks a budget leaves out, each with its reason, in one note; the command
that re-measures a pilot is pointed to, not printed."""

from attnzoo.reproduce.budgets import BUDGETS
from attnzoo.reproduce.sections import lra


def test_left_out_tasks_share_one_note_without_their_commands():
    plan = BUDGETS["long"]["long-range"]
    (note,) = lra._notes({}, [], [], {}, None, plan)
    assert note.startswith("Not run at this budget (figures of pilots made while planning the budgets")
    assert "`left_out` in attnzoo.reproduce.budgets has the command" in note
    for task in plan["left_out"]:
        assert f"{task} — " in note
    assert "attnzoo train" not in note and "`attnzoo" not in note
    # the reason and its dated pilot stay; only the command goes
    assert "image — LRA's Image is N=1,024 (here Fashion-MNIST 28x28, N=784)" in note
    assert "(pilot of 2026-11-26); text — " in note
    assert "(pilot of 2026-11-24); the efficiency section measures the cost at that length" in note


def test_a_reason_without_a_command_is_printed_whole_without_the_pilot_pointer():
    plan = {"left_out": {"text": "smoke: the pipeline, not the papers"}}
    (note,) = lra._notes({}, [], [], {}, None, plan)
    assert note == "Not run at this budget: text — smoke: the pipeline, not the papers"
