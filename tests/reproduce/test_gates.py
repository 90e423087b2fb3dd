"""Each gate of the verdict rule, fed fixtures on both sides of its condition and the mirrored fixture (A and B
swapped, the claim flipped): the verdicts held back are exactly those :data:`claims.GATES` declares."""

from __future__ import annotations

import pytest

from attnzoo.compare import claims
from attnzoo.compare.claims import GATES, compare, gate, stat

HIGH, LOW = [80.0, 80.5, 80.2], [70.0, 70.4, 70.1]


def _sup(a, b, **kw):
    """'a beats b' on made-up accuracies (points)."""
    return compare(
        a, b, claim_type="superiority", unit="pts", paper="p", claim="c", paper_value="v", a_name="a", b_name="b", **kw
    )


def _noninf(a, b, margin, **kw):
    """'a is comparable to b' within ``margin`` points."""
    return compare(
        a,
        b,
        claim_type="non-inferiority",
        margin=margin,
        margin_source="paper",
        unit="pts",
        paper="p",
        claim="c",
        paper_value="v",
        a_name="a",
        b_name="b",
        **kw,
    )


def test_every_gate_states_its_direction_and_argument():
    assert set(GATES) == set(claims.GATE_REASONS)
    for reason, rule in GATES.items():
        assert rule.holds_back and set(rule.holds_back) <= {"agrees", "disagrees"}, reason
        assert len(rule.why) > 40, reason
        if len(rule.holds_back) == 1:  # a one-sided gate argues why the other side needs none
            other = ({"agrees", "disagrees"} - set(rule.holds_back)).pop()
            assert other[:-1] in rule.why, (reason, other)


@pytest.mark.parametrize("reason", sorted(GATES))
def test_a_gate_holds_back_exactly_the_verdicts_it_declares(reason):
    agree, disagree = _sup(HIGH, LOW), _sup(LOW, HIGH)  # the mirrored fixture: A and B swapped
    assert (agree["verdict"], disagree["verdict"]) == ("agrees", "disagrees")
    for f in (agree, disagree):
        verdict = f["verdict"]
        gate(f, "a precondition fails", reason)
        if verdict in GATES[reason].holds_back:
            assert f["verdict"] == "inconclusive" and f["ungated_verdict"] == verdict
            assert f["gate_reasons"] == [reason] and "a precondition fails" in f["gate"]
        else:
            assert f["verdict"] == verdict and "gate" not in f and "gate_reasons" not in f
            assert "a precondition fails" in f["explanation"] and "does not hold back" in f["explanation"]


def test_an_undecided_verdict_records_the_gate_and_stays_inconclusive():
    f = _sup([70.0, 75.0, 72.0], [71.0, 74.0, 73.0])
    assert f["verdict"] == "inconclusive"
    gate(f, "not tuned here", "not tuned")
    assert f["verdict"] == "inconclusive" and "ungated_verdict" not in f and f["gate_reasons"] == ["not tuned"]


def test_an_unknown_gate_reason_is_refused_with_the_valid_ones():
    with pytest.raises(ValueError, match="unknown gate reason 'weather'.*plateau"):
        gate(_sup(HIGH, LOW), "x", "weather")


# ---- a superiority claim can be refuted ---------------------------------------------------------------------------
def test_a_superiority_claim_disagrees_below_a_fraction_of_the_papers_own_effect():
    # the interval [-1.1, +0.2]-ish of a tie, against a paper that reports +2.9: excludes half of it, so disagrees
    tie_a, tie_b = [80.0, 80.6, 79.6], [80.3, 80.1, 80.4]
    f = _sup(tie_a, tie_b, paper_effect=2.9)
    lo, hi = f["ci95"]
    assert lo < 0 < hi < claims.REFUTE_FRACTION * 2.9
    assert f["verdict"] == "disagrees" and f["refute_below"] == pytest.approx(1.45)
    assert "disagrees if it lies below 0.5x the paper's effect +2.9 = +1.45" in f["rule"]
    # without the paper's effect a tie stays inconclusive (only an interval below zero refutes)
    assert _sup(tie_a, tie_b)["verdict"] == "inconclusive"
    # an interval reaching above the refuting bar stays inconclusive: a gain half the paper's is not excluded
    assert _sup(tie_a, tie_b, paper_effect=hi / claims.REFUTE_FRACTION - 0.01)["verdict"] == "inconclusive"
    assert _sup(tie_a, tie_b, paper_effect=hi / claims.REFUTE_FRACTION + 0.01)["verdict"] == "disagrees"
    # a clear win agrees whatever the paper's effect; the mirrored win (B beats A) disagrees
    assert _sup(HIGH, LOW, paper_effect=30.0)["verdict"] == "agrees"
    assert _sup(LOW, HIGH, paper_effect=2.9)["verdict"] == "disagrees"


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_a_paper_effect_must_be_positive_and_finite(bad):
    with pytest.raises(ValueError, match="paper_effect must be finite and > 0"):
        _sup(HIGH, LOW, paper_effect=bad)


def test_a_non_inferiority_claim_ignores_the_paper_effect_and_keeps_the_symmetric_rule():
    f = _noninf(LOW, HIGH, 2.0, paper_effect=5.0)
    assert f["verdict"] == "disagrees" and "refute_below" not in f


# ---- the trend gate reads the effect ------------------------------------------------------------------------------
def _trend(a1, b1, a2, b2, *, flip=False):
    """A superiority comparison and its replication at twice the steps; ``flip`` mirrors it (B beats A)."""
    if flip:
        a1, b1, a2, b2 = b1, a1, b2, a2
    f = _sup(a1, b1)
    return claims.replicated_gate(f, stat(a2), stat(b2), row="a", baseline="b")


@pytest.mark.parametrize("flip", [False, True])
def test_the_trend_gate_holds_back_a_verdict_whose_effect_moves_as_far_as_its_interval_clears(flip):
    a1, b1 = [80.0, 80.5, 80.2], [72.0, 72.4, 72.1]  # effect ~ +8.1, clearing 0 by ~7.4
    # the effect shrinks 70% (8.1 -> 2.4) while the interval narrows: same verdict, but moved more than it clears
    shrink = _trend(a1, b1, [80.0, 80.05, 80.02], [77.6, 77.64, 77.62], flip=flip)
    want = "disagrees" if flip else "agrees"
    assert shrink["replicated_2x"]["verdict"] == want
    assert abs(shrink["replicated_2x"]["move"]) >= shrink["replicated_2x"]["clearance"]
    assert shrink["verdict"] == "inconclusive" and shrink["ungated_verdict"] == want
    assert shrink["gate_reasons"] == ["plateau"]
    # a small move of the effect (8.1 -> 7.6) leaves the verdict standing, on either side
    steady = _trend(a1, b1, [80.5, 81.0, 80.7], [73.0, 73.4, 73.1], flip=flip)
    assert steady["verdict"] == want and "gate" not in steady
    assert abs(steady["replicated_2x"]["move"]) < steady["replicated_2x"]["clearance"]
    # another verdict at twice the steps is gated whatever the move
    gone = _trend(a1, b1, [75.0, 76.0, 74.0], [75.2, 74.8, 75.9], flip=flip)
    assert gone["verdict"] == "inconclusive" and "not the reported steps' verdict" in gone["gate"]


@pytest.mark.parametrize("flip", [False, True])
def test_a_compared_rows_own_move_goes_through_the_same_trend_rule(flip):
    a1, b1 = [80.0, 80.5, 80.2], [72.0, 72.4, 72.1]
    row1 = b1 if flip else a1
    f = _sup(b1, a1) if flip else _sup(a1, b1)
    # the compared row (side a) moves towards the other side by 5 of its ~7.4 clearance: at that pace the next
    # doubling crosses, so it is gated although the move alone is less than the clearance at the reported steps
    towards = [v + (5.0 if flip else -5.0) for v in row1]
    claims.compared_row_gate(f, "a", stat(row1), stat(towards), "pts")
    assert f["verdict"] == "inconclusive" and f["gate_reasons"] == ["plateau"]
    assert f["trend_2x"]["clearance"] <= abs(f["trend_2x"]["move"])
    # a move away from the boundary never gates
    g = _sup(b1, a1) if flip else _sup(a1, b1)
    away = [v + (-5.0 if flip else 5.0) for v in row1]
    claims.compared_row_gate(g, "a", stat(row1), stat(away), "pts")
    assert g["verdict"] == ("disagrees" if flip else "agrees") and "gate" not in g


# ---- the control gate holds back agreements only -----------------------------------------------------------------
@pytest.mark.parametrize("control_at", ["inside", "outside"])
def test_the_margin_control_gate_holds_back_an_agreement_its_control_would_also_reach(control_at):
    base = [80.0, 80.4, 80.2]
    comparable = _noninf([79.8, 80.1, 80.0], base, 2.0)
    worse = _noninf([70.0, 70.3, 70.1], base, 2.0)  # the mirrored outcome: shown worse than the margin
    assert (comparable["verdict"], worse["verdict"]) == ("agrees", "disagrees")
    control = [79.0, 79.3, 79.1] if control_at == "inside" else [60.0, 60.3, 60.1]
    claims.margin_control_gate(comparable, control, "no attention")
    claims.margin_control_gate(worse, control, "no attention")
    if control_at == "inside":
        assert comparable["verdict"] == "inconclusive" and comparable["gate_reasons"] == ["control"]
    else:
        assert comparable["verdict"] == "agrees" and "gate" not in comparable
    assert worse["verdict"] == "disagrees" and "gate" not in worse  # never held back by a control


@pytest.mark.parametrize("flip", [False, True])
def test_the_emerged_gate_holds_back_a_persistence_verdict_only_where_no_layer_beat_its_untrained_copy(flip):
    from attnzoo.reproduce.sections import segmentation as seg

    def res(best):
        # the later half clearly above the untrained copy's, so only the best layer can hold a verdict back
        rows = {
            "crate_cbt": (best, [0.60, 0.70, 0.65]),
            "crate_cbt" + seg.INIT: ([0.12, 0.18, 0.20], [0.10, 0.12, 0.11]),
        }
        return {n: {"best": {"foreground": stat(b)}, "later_half": stat(half)} for n, (b, half) in rows.items()}

    learned, unlearned = res([0.35, 0.44, 0.38]), res([0.13, 0.17, 0.21])
    for stats, held in ((learned, False), (unlearned, True)):
        # the same comparison decided either way (A and B swapped): the gate reads the maps, not the verdict
        f = _sup(LOW, HIGH) if flip else _sup(HIGH, LOW)
        verdict = f["verdict"]
        gates = seg._untrained_gates(f, stats, "crate_cbt")
        for g, reason, why in gates:
            gate(g, why, reason)
        if held:
            assert f["verdict"] == "inconclusive" and f["ungated_verdict"] == verdict
            assert f["gate_reasons"] == ["did not learn"] and "never emerged" in f["gate"]
        else:
            assert f["verdict"] == verdict and "gate" not in f and "emerged" in f["explanation"]


@pytest.mark.parametrize("seeds", [-1, 1.5, "3"])
def test_a_finding_refuses_a_seed_count_that_is_not_a_non_negative_int(seeds):
    from attnzoo.compare.claims import finding

    with pytest.raises(ValueError, match="seeds must be a non-negative int"):
        finding("P", "c", "v", "m", "agrees", "r", kind="paper", seeds=seeds)
