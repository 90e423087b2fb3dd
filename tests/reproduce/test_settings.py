"""``attnzoo reproduce --set section.key=VALUE``: one setting of a budget changed for a run (checked against the keys
the budget has), and a plan's ``claim_notes``: a dated pilot shown under a claim's findings."""

from __future__ import annotations

import copy

import pytest

from attnzoo.compare.claims import compare
from attnzoo.compare.common import Section
from attnzoo.reproduce import BUDGETS, main
from attnzoo.reproduce.budgets import with_settings
from attnzoo.reproduce.runner import ReproduceError, plan


def test_a_setting_changes_the_planned_steps_and_leaves_the_budget_as_it_was():
    before = copy.deepcopy(BUDGETS["smoke"])
    b, steps = plan("smoke", 0, ["language.train.steps=7"])
    runs = [s for s in steps if s.id.startswith("language/gpt/seed")]
    assert runs and all(s.config["train"]["steps"] == 7 for s in runs)
    assert b["language"]["train"]["steps"] == 7 and BUDGETS["smoke"] == before
    _, plain = plan("smoke", 0)
    assert {s.id: s.hash for s in plain} != {s.id: s.hash for s in steps}  # the step configs differ: recomputed


def test_a_setting_value_is_read_as_yaml():
    b = with_settings(copy.deepcopy(BUDGETS["long"]), ["vision.compared_2x=[tost, xcit]", "language.seeds=4"])
    assert b["vision"]["compared_2x"] == ["tost", "xcit"] and b["language"]["seeds"] == 4


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("language.train.stepz=3", r"language.train has no setting 'stepz'; valid: \['batch_size', 'lr', 'steps'"),
        ("langauge.seeds=3", r"the plan has no setting 'langauge'; valid: \['adapt-vision'"),
        ("language.train.steps.x=3", r"language.train.steps has no setting 'x'"),
        ("language.train.steps", r"write section.key\[.key...\]=VALUE"),
        ("language=3", r"write section.key\[.key...\]=VALUE"),
    ],
)
def test_a_bad_setting_is_refused_naming_it_and_the_valid_keys(setting, message):
    with pytest.raises(ReproduceError, match=message):
        plan("long", 0, [setting])


def test_the_cli_refuses_a_bad_setting_in_one_line(capsys):
    assert main(["--budget", "smoke", "--set", "vision.seedz=2", "--list"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "vision has no setting 'seedz'" in err[0]


def test_a_claim_note_is_checked_at_planning_and_shown_under_that_claims_findings_only(monkeypatch):
    import attnzoo.reproduce.runner as runner
    from attnzoo.reproduce.report import _claim_notes

    b = copy.deepcopy(BUDGETS["smoke"])
    monkeypatch.setattr(runner, "budget", lambda name: copy.deepcopy(b))
    b["language"]["claim_notes"] = {"aot-t9-lm": "a pilot"}
    with pytest.raises(ReproduceError, match="language.claim_notes: .*unknown claim id 'aot-t9-lm'"):
        runner.plan("smoke", 0)
    b["language"]["claim_notes"] = {"aot-t1-lm": "a pilot"}
    assert runner.plan("smoke", 0)[0]["language"]["claim_notes"] == {"aot-t1-lm": "a pilot"}
    kw = dict(unit="nats", paper="AoT Table 1", paper_value="v", a_name="aot", b_name="gpt", lower_is_better=True)
    kw |= dict(claim_type="non-inferiority", margin=0.05, margin_source="a 5% gap")
    aot = compare([2.0, 2.01], [1.9, 1.91], claim="aot close", claim_id="aot-t1-lm", **kw)
    hybrid = compare([2.0, 2.01], [1.9, 1.91], claim="hybrid close", claim_id="aot-t1-hybrid", **kw)
    sec = Section("language", "Language", findings=[aot, hybrid])
    _claim_notes(sec, {"aot-t1-lm": "at 4x steps -0.087 [-0.098, -0.076]; re-measure: `attnzoo reproduce ...`"})
    assert aot.explanation.startswith("dated pilot: at 4x steps -0.087")
    assert not hybrid.explanation and aot.verdict == hybrid.verdict  # a note never changes a verdict


def test_a_decided_claim_with_a_dated_pilot_says_so_on_the_first_screen():
    from attnzoo.reproduce.report import _claim_notes, _summary

    kw = dict(unit="pts", paper="X Table 1", paper_value="a > b", a_name="a", b_name="b", claim_type="superiority")
    won = compare([2.0, 2.1, 2.2], [1.0, 1.1, 1.2], claim="a beats b", claim_id="cbsa-t3-crate", **kw)
    other = compare([2.0, 2.1, 2.2], [1.0, 1.1, 1.2], claim="a beats c", claim_id="cbsa-f9-no-contraction", **kw)
    for f in (won, other):
        f.kind = "paper"
    sec = Section("k", "K: t", findings=[won, other])
    _claim_notes(sec, {"cbsa-t3-crate": "at 4x steps it moves"})
    first = "\n".join(_summary([sec], "long")).split("### The claims")[0]
    bullets = [line for line in first.splitlines() if line.startswith("- X Table 1")]
    assert [b.endswith("Dated pilot: its note in the claims table.") for b in bullets] == [True, False]


def test_an_architecture_comparison_says_what_else_differs_on_the_first_screen_and_in_its_notes():
    from attnzoo.reproduce.report import _claims_table, _paper_claims, _summary
    from attnzoo.reproduce.sections import vision

    kw = dict(
        unit="pts", paper="X Table 1", paper_value="a > b", a_name="cbt", b_name="crate", claim_type="superiority"
    )
    f = compare([2.0, 2.1, 2.2], [1.0, 1.1, 1.2], claim="cbt beats crate", claim_id="cbsa-t3-crate", **kw)
    f.kind, f.confound = "paper", vision._stem_note("cbt", "crate")
    assert f.confound == "cbt has a conv stem and a CLS token, crate a normed patch projection and a CLS token"
    sec = Section("k", "K: t", findings=[f])
    first = "\n".join(_summary([sec], "long")).split("### The claims")[0]
    (bullet,) = [line for line in first.splitlines() if line.startswith("- X Table 1")]
    assert f"An architecture comparison ({f.confound}): the attention's share is not shown." in bullet
    table, notes = _claims_table(_paper_claims([sec]))
    assert any(n.endswith(f"confound: an architecture comparison: {f.confound}") for n in notes)
    # rows in one skeleton have nothing to say
    assert vision._stem_note("tost", "xcit") is None and vision._stem_note("fastmax_vit", "vit") is None


def test_a_caveat_is_checked_at_planning_and_shown_under_its_claim_and_on_the_first_screen(monkeypatch):
    import attnzoo.reproduce.runner as runner
    from attnzoo.reproduce.report import _caveats, _summary

    b = copy.deepcopy(BUDGETS["smoke"])
    monkeypatch.setattr(runner, "budget", lambda name: copy.deepcopy(b))
    b["vision"]["caveats"] = {"fast-t9-accuracy": "a count"}
    with pytest.raises(ReproduceError, match="vision.caveats: .*unknown claim id 'fast-t9-accuracy'"):
        runner.plan("smoke", 0)
    kw = dict(unit="pts", paper="X Table 1", paper_value="v", a_name="a", b_name="b", claim_type="superiority")
    won = compare([2.0, 2.1, 2.2], [1.0, 1.1, 1.2], claim="a beats b", claim_id="cbsa-t3-crate", **kw)
    other = compare([2.0, 2.1, 2.2], [1.0, 1.1, 1.2], claim="a beats c", claim_id="cbsa-f9-no-contraction", **kw)
    for f in (won, other):
        f.kind = "paper"
    sec = Section("k", "K: t", findings=[won, other])
    _caveats(sec, {"cbsa-t3-crate": "the control's count was chosen\n  with both readings seen"})
    assert won.explanation == "caveat: the control's count was chosen with both readings seen"
    assert not other.explanation and won.verdict == other.verdict == "agrees"  # a caveat never changes a verdict
    first = "\n".join(_summary([sec], "long")).split("### The claims")[0]
    bullets = [line for line in first.splitlines() if line.startswith("- X Table 1")]
    assert ["Caveat: the control's count was chosen with both readings seen." in b for b in bullets] == [True, False]
