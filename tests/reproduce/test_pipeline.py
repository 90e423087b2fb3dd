"""The one pipeline every comparison goes through: each stage of the chain applied to every finding, in the chain's
order, and ``attnzoo compare`` judged by the same function as the report."""

from __future__ import annotations

import pytest

from attnzoo.compare import pipeline
from attnzoo.compare.claims import GATES, compare, stat
from attnzoo.compare.pipeline import CHAIN, Control, Evidence, Longer, Plateau, Tuning, judge


def _comparable(a_name: str = "a", b_name: str = "b"):
    """A non-inferiority finding that agrees on the numbers (a tie inside a 2-point margin)."""
    return compare(
        [80.0, 80.2, 79.9],
        [80.1, 80.0, 80.2],
        claim_type="non-inferiority",
        unit="pts",
        paper="P",
        claim="a is comparable to b",
        paper_value="v",
        a_name=a_name,
        b_name=b_name,
        margin=2.0,
        margin_source="P Table 1",
    )


def _every_stage(f) -> Evidence:
    """Evidence on which each stage of the chain holds ``f`` back for its own reason."""
    f.params_a, f.params_b = 300, 100
    return Evidence(
        unlearned={"a": "a's seeds stayed at chance"},
        sizes={("a", "b"): (1.0, "P Table 1")},
        controls=[Control("no attention", stat([80.0, 80.1, 79.9]), lambda g: True)],
        plateaus=[Plateau("b", "b", stat([80.1, 80.0, 80.2]), None, "pts")],
        tuning=[Tuning({"b": "b's best rate is at the end of its grid"})],
    )


def test_the_chain_places_every_gate_reason():
    assert set(CHAIN) == set(GATES) and len(CHAIN) == len(GATES)


def test_every_stage_runs_on_every_finding_in_the_chains_order():
    fs = [_comparable(), _comparable()]
    ev = _every_stage(fs[0])
    _every_stage(fs[1])
    judge(fs, ev)
    for f in fs:
        assert f.verdict == "inconclusive" and f.ungated_verdict == "agrees"
        assert f.gate_reasons == sorted(GATES)
        # each stage's words, in the chain's order
        at = [
            f.gate.index(w)
            for w in ("stayed at chance", "parameters 3.00x", "(no token mixer in its blocks)", "plateau")
        ]
        assert at == sorted(at) and f.gate.index("not tuned:") > at[-1]


@pytest.mark.parametrize("reason", CHAIN)
def test_a_stage_left_out_is_missed(reason, monkeypatch):
    """The planted bug: a chain without one stage leaves that stage's reason out of the finding."""
    monkeypatch.setitem(pipeline._STAGES, reason, lambda findings, ev: None)
    f = _comparable()
    judge([f], _every_stage(f))
    assert reason not in f.gate_reasons and set(f.gate_reasons) == set(GATES) - {reason}


def test_a_sections_own_gate_runs_at_its_reasons_place():
    f = _comparable()
    ev = Evidence(gates=[(f, "conditions", "sizes not the paper's")], unlearned={"b": "b did not learn"})
    ev.tuning.append(Tuning({"a": "a is not tuned"}))
    judge([f], ev)
    assert f.gate == "b did not learn; sizes not the paper's; not tuned: a is not tuned"


def test_a_replicated_comparison_is_judged_at_twice_the_steps_not_on_the_drift():
    f = compare(
        [84.0, 84.5, 85.0],
        [80.0, 80.5, 81.0],
        claim_type="superiority",
        unit="pts",
        paper="P",
        claim="a beats b",
        paper_value="v",
        a_name="a",
        b_name="b",
    )
    rows = {"a": Longer("a", stat([84.0, 84.5, 85.0]), stat([87.0, 87.5, 88.0]))}
    # b drifts by 3.5 (more than the interval clears 0 by): the drift alone would gate it
    p = Plateau("b", "b", stat([80.0, 80.5, 81.0]), stat([83.5, 84.0, 84.5]), "pts", rows=rows)
    out = judge([f], Evidence(plateaus=[p]))
    assert f.replicated_2x is not None and f.verdict == "agrees" and out[""]["gated"] == 0


def test_compare_judges_with_the_reports_pipeline(monkeypatch):
    """``attnzoo compare`` has no gates of its own: its summary goes through :func:`pipeline.judge`."""
    from attnzoo.compare import summary

    calls = []
    real = pipeline.judge

    def spy(findings, ev):
        calls.append([f.a_name for f in findings])
        return real(findings, ev)

    monkeypatch.setattr(summary, "judge", spy)

    class Spec:
        mechanisms = ("softmax", "tssa")
        baseline = "softmax"
        seed_list = (0, 1, 2)
        metric = "accuracy"
        higher_is_better = True
        lrs = ()
        margin = None
        replicate_baseline = False
        steps = 4

    def rec(v):
        return {"result": {"accuracy": v, "lr": 1e-3, "params": 10, "step_ms": 1.0}}

    records = {
        f"compare/{m}/seed{s}": rec(v)
        for m, vs in (("softmax", [0.5, 0.51, 0.52]), ("tssa", [0.6, 0.61, 0.62]))
        for s, v in enumerate(vs)
    }
    out = summary.summarise(Spec(), records)
    assert calls == [["tssa"]] and out["findings"]["tssa"].verdict == "agrees"


def test_two_rows_untuned_for_the_same_reason_are_named_in_one_sentence():
    f, g = _comparable(), _comparable()
    same = {
        "a": "a's best rate 0.1 is the lowest of the grid (0.1, 0.2)",
        "b": "b's best rate 0.1 is the lowest of the grid (0.1, 0.2)",
    }
    judge([f], Evidence(tuning=[Tuning(same)]))
    assert f.gate == "not tuned: a's and b's best rate 0.1 is the lowest of the grid (0.1, 0.2)"
    judge([g], Evidence(tuning=[Tuning({**same, "b": "b's best rate 0.2 is the highest of the grid (0.1, 0.2)"})]))
    assert g.gate.count("; ") == 1 and "a's best rate 0.1" in g.gate and "b's best rate 0.2" in g.gate
