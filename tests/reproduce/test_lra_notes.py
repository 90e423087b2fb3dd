"""The long-range section's notes: the tasks a budget leaves out, named in one note; a reason resting on a pilot
(its figures and the command that re-measures them) is pointed to in the budget, a plain reason printed whole."""

from attnzoo.reproduce.budgets import BUDGETS
from attnzoo.reproduce.sections import lra


def test_left_out_tasks_share_one_note_that_points_to_their_pilots():
    plan = BUDGETS["long"]["long-range"]
    (note,) = lra._notes(plan)
    assert note.startswith(f"Not run at this budget: {', '.join(plan['left_out'])} (")
    assert "why, with pilot figures and re-measure commands: the budget's `left_out`, attnzoo/reproduce/budgets" in note
    # the pilots' figures and commands are not printed: the budget states them
    assert "attnzoo train" not in note and "`attnzoo" not in note and "pilot of" not in note


def test_a_reason_without_a_command_is_printed_whole_without_the_pilot_pointer():
    plan = {"left_out": {"text": "smoke: the pipeline, not the papers"}}
    (note,) = lra._notes(plan)
    assert note == "Not run at this budget: text — smoke: the pipeline, not the papers"
