"""The report's first screen: each claim counted once, decided trained claims in words, the undecided ones by one
cause each (counts that add up), and the legend of the rule and its gates stated once."""

from __future__ import annotations

import dataclasses

import pytest

from attnzoo.compare import claims
from attnzoo.compare.claims import GATES, compare, gate
from attnzoo.compare.common import Section
from attnzoo.reproduce.report import _summary
from attnzoo.reproduce.tally import CAUSES, cause_of, combine, tally


def _f(a, b, claim_id="", claim="a beats b", **kw):
    f = compare(
        a,
        b,
        claim_type="superiority",
        unit="pts",
        paper="X Table 1",
        claim=claim,
        paper_value="a > b",
        a_name="a",
        b_name="b",
        claim_id=claim_id,
        **kw,
    )
    f.kind = "paper"
    return f


WIN, LOSS, TIE = (
    ([2.0, 2.1, 2.2], [1.0, 1.1, 1.2]),
    ([1.0, 1.1, 1.2], [2.0, 2.1, 2.2]),
    ([1.0, 1.5, 1.2], [1.1, 1.4, 1.2]),
)


@pytest.mark.parametrize(
    "verdicts, every, want",
    [
        (["agrees", "inconclusive"], False, "agrees"),
        (["agrees", "disagrees"], False, "disagrees"),
        (["inconclusive", "not tested"], False, "inconclusive"),
        (["not tested", "not tested"], False, "not tested"),
        (["agrees", "agrees"], False, "agrees"),
        # a conjunction (a ranking): its tests agree only together
        (["agrees", "inconclusive"], True, "inconclusive"),
        (["agrees", "not tested"], True, "inconclusive"),
        (["agrees", "agrees"], True, "agrees"),
        (["agrees", "disagrees"], True, "disagrees"),
        (["not tested", "not tested"], True, "not tested"),
    ],
)
def test_the_tests_of_a_claim_combine_by_its_rule(verdicts, every, want):
    assert combine(verdicts, every=every) == want


def test_a_ranking_is_a_conjunction_of_its_pairs():
    from attnzoo.reproduce import paper_claims

    assert paper_claims.conjunction("cbsa-t5-ranking#crate-vs-cbt") and not paper_claims.conjunction("tost-t3-lra")
    pairs = [_f(*WIN, claim_id="cbsa-t5-ranking#crate_cbt-vs-crate"), _f(*TIE, claim_id="cbsa-t5-ranking#crate-vs-cbt")]
    (ranking,) = tally([("S", f) for f in pairs])
    assert ranking.verdict == "inconclusive"  # one pair undecided: the ranking is not shown
    lra = [_f(*WIN, claim_id="tost-t3-lra#listops"), _f(*TIE, claim_id="tost-t3-lra#average")]
    assert tally([("S", f) for f in lra])[0].verdict == "agrees"  # several ways of testing one claim: any


def test_a_claim_tested_several_ways_is_counted_once():
    fs = [_f(*WIN, claim_id="tost-t3-lra#listops"), _f(*TIE, claim_id="tost-t3-lra#average"), _f(*LOSS)]
    claims_ = tally([("S", f) for f in fs])
    assert [c.id for c in claims_] == ["tost-t3-lra", "X Table 1: a beats b"]
    assert [c.verdict for c in claims_] == ["agrees", "disagrees"]
    text = "\n".join(_summary([Section("k", "K: t", findings=fs)], "long"))
    assert "**2 claims of the five papers, each counted once**: 1 agrees, 1 disagrees, 0 inconclusive" in text
    assert "On trained models over seeds: 2 (1 agree, 1 disagree, 0 undecided)" in text


def test_an_undecided_claim_is_filed_under_its_first_cause_and_the_counts_add_up():
    fs = [_f(*WIN, claim=f"c{i}") for i in range(5)] + [_f(*TIE, claim="wide")]
    # the gate's words mention a plateau, but its reason is "not tuned": the cause follows the reason
    gate(fs[0], "the plateau of the sweep is flat", "not tuned")
    gate(fs[1], "lowest seed at the majority", "did not learn")
    gate(fs[1], "no run at twice the steps", "plateau")
    gate(fs[2], "sizes unlike the paper's", "conditions")
    gate(fs[2], "not tuned either", "not tuned")
    assert cause_of([fs[1]]) == "did not learn" and cause_of([fs[2]]) == "conditions"
    assert cause_of([fs[5]]) == "wide"
    text = "\n".join(_summary([Section("k", "K: t", findings=fs)], "long"))
    assert "**Why the other 4 claims are undecided**" in text
    lines = [ln for ln in text.splitlines() if ln.startswith("- ") and ln.rstrip(")").split("(")[0]]
    counted = {c: next((ln for ln in lines if ln.startswith(f"- {t}: ")), None) for c, t in CAUSES.items()}
    assert counted["conditions"].startswith(f"- {CAUSES['conditions']}: 1 (")
    assert counted["not tuned"].startswith(f"- {CAUSES['not tuned']}: 1 (")
    assert counted["did not learn"].startswith(f"- {CAUSES['did not learn']}: 1 (")
    assert counted["wide"].startswith(f"- {CAUSES['wide']}: 1 (")
    assert counted["plateau"] is None  # filed under its first cause only
    total = sum(int(ln.split(": ")[1].split(" ")[0]) for ln in counted.values() if ln)
    assert total == 4
    # the two claims left decided are named with their effect in words
    assert "**Decided trained claims** (0 of 2 robust:" in text and "X Table 1, c3: a is ahead of b by 1 pts" in text


def test_an_ungated_undecided_claim_is_filed_by_what_would_decide_it():
    wide, longer = _f(*TIE, claim="wide"), _f(*TIE, claim="longer")
    longer["at_2x"] = {"effect": 1.0, "ci95": [0.5, 1.5], "margin": 0.0, "verdict": "agrees"}
    measured = {"verdict": "inconclusive", "claim": "exponent 1.26 against 1.25", "paper": "P"}
    assert cause_of([wide]) == "wide"
    assert cause_of([longer]) == "steps"  # decided at twice the steps: more seeds would not settle it
    assert cause_of([measured]) == "threshold"  # no seeds, no interval
    undecided_2x = _f(*TIE, claim="still wide")
    undecided_2x["at_2x"] = {"effect": 0.0, "ci95": [-1.0, 1.0], "margin": 0.0, "verdict": "inconclusive"}
    assert cause_of([undecided_2x]) == "wide"
    gate(longer, "sizes unlike the paper's", "conditions")  # a gate comes first
    assert cause_of([longer]) == "conditions"


def test_a_refuted_superiority_names_the_bar_its_interval_lies_below():
    f = _f([1.0, 1.1, 1.2], [1.0, 1.05, 1.1], paper_effect=2.0)
    assert f["verdict"] == "disagrees" and f["ci95"][0] < 0 < f["ci95"][1]
    text = "\n".join(_summary([Section("k", "K: t", findings=[f])], "long"))
    assert (
        "no direction shown" in text
        and ", wholly below +1 (0.5 of the paper's +2): **disagrees**, not robust (no run at twice the steps)." in text
    )


def test_a_decided_claim_shows_its_clearance_at_twice_the_steps_as_a_multiple_of_the_move():
    from attnzoo.compare.claims import plateau_gate, stat, trend_gate

    f = _f(*WIN)  # +1 [+0.773, +1.23]: clears 0 by 0.773
    trend_gate(f, 0.8, (0.6, 1.0), 0.0, "2x steps")  # moved -0.2, clears by 0.6 there: 3x
    text = "\n".join(_summary([Section("k", "K: t", findings=[f])], "long"))
    assert "**agrees** (at 2x steps its interval clears the boundary by 0.6, 3.0x the -0.2 the effect moved)." in text
    g = _f(*WIN)  # only the baseline ran longer: its move, against the clearance at the reported steps
    plateau_gate([g], "b", stat([1.0, 1.1, 1.2]), stat([1.5, 1.6, 1.7]), "pts")
    text = "\n".join(_summary([Section("k", "K: t", findings=[g])], "long"))
    assert (
        g["verdict"] == "agrees"
        and "**agrees**, not robust (its interval clears the boundary by 0.773, 1.5x the +0.5 b moved at 2x steps)."
        in text
    )
    h = _f(*WIN)  # no run at twice the steps: not robust, for want of one
    text = "\n".join(_summary([Section("k", "K: t", findings=[h])], "long"))
    assert "**agrees**, not robust (no run at twice the steps)." in text


def test_the_decided_claims_count_those_robust_to_one_more_doubling():
    from attnzoo.compare.claims import plateau_gate, stat, trend_gate

    robust, fragile, unreplicated = (_f(*WIN, claim=c) for c in ("a beats b", "a beats c", "a beats d"))
    trend_gate(robust, 0.8, (0.6, 1.0), 0.0, "2x steps")  # clears by 0.6, moved 0.2: 3x
    plateau_gate([fragile], "b", stat([1.0, 1.1, 1.2]), stat([1.5, 1.6, 1.7]), "pts")  # 0.773 vs 0.5: 1.5x
    text = "\n".join(_summary([Section("k", "K: t", findings=[robust, fragile, unreplicated])], "long"))
    assert "**Decided trained claims** (1 of 3 robust:" in text
    trend_gate(fragile, 0.9, (0.7, 1.1), 0.0, "2x steps")  # its own comparison now: 0.7 vs 0.1, 7x
    text = "\n".join(_summary([Section("k", "K: t", findings=[robust, fragile, unreplicated])], "long"))
    assert "**Decided trained claims** (2 of 3 robust:" in text


def test_the_decided_claims_are_counted_again_with_99_percent_intervals():
    a = [1.0, 1.1, 1.2, 1.3, 1.4]
    narrow = _f(a, [x - 0.25 for x in a], claim="a beats c")  # 95%: [+0.02, +0.48]; 99%: [-0.09, +0.59]
    assert narrow.verdict == "agrees" and narrow.ci95[0] > 0
    text = "\n".join(_summary([Section("k", "K: t", findings=[_f(*WIN), narrow])], "long"))
    assert STRICT.format(1, 2) in text
    # the one that does not hold at 99% is named, the one that does is not
    names = text.split("not at 99%: ")[1].split("):")[0]
    assert names == f"`{narrow['paper']}: {narrow['claim']}`" and _f(*WIN)["claim"] != narrow["claim"]
    wide = _f(a, [x - 0.5 for x in a], claim="a beats c")  # 99%: [+0.16, +0.84]
    text = "\n".join(_summary([Section("k", "K: t", findings=[_f(*WIN), wide])], "long"))
    assert STRICT.format(2, 2) in text
    # a refuted superiority is checked against the bar it misses, at the stricter level too
    lost = _f([x - 0.5 for x in a], a, claim="a beats c")
    assert lost.verdict == "disagrees"
    text = "\n".join(_summary([Section("k", "K: t", findings=[lost])], "long"))
    assert STRICT.format(1, 1) in text


def test_the_99_percent_count_applies_the_control_gate_at_99_percent_too():
    from attnzoo.compare.claims import margin_control_gate

    kw = dict(claim_type="non-inferiority", margin=0.5, margin_source="x", unit="pts", paper="X Table 1")
    kw |= dict(claim="a keeps b", paper_value="v", a_name="a", b_name="b")
    f = compare([1.0, 1.1, 1.2], [1.0, 1.1, 1.2], **kw)
    f.kind = "paper"
    # the control 0.8 below b: at 95% [-1.03, -0.57], outside the 0.5 margin; at 99% [-1.18, -0.42], inside it
    margin_control_gate(f, [0.2, 0.3, 0.4], "ctl")
    assert f.verdict == "agrees" and f.control_ci95[1] < -0.5 < f.control_ci99[1]
    text = "\n".join(_summary([Section("k", "K: t", findings=[f])], "long"))
    assert STRICT.format(0, 1) in text
    margin_control_gate(f, [0.0, 0.1, 0.2], "ctl")  # 1.0 below: outside at 99% too
    text = "\n".join(_summary([Section("k", "K: t", findings=[f])], "long"))
    assert STRICT.format(1, 1) in text


STRICT = "; {} of {} decided with 99% intervals too, their controls' included"


def test_the_legend_states_every_gate_once_with_its_direction():
    fs = [_f(*WIN)]
    text = "\n".join(_summary([Section("k", "K: t", findings=fs)], "long"))
    for reason, rule in GATES.items():
        line = f"  - *{reason}* ({', '.join(rule.holds_back)}): {rule.why}."
        assert text.count(line) == 1, reason
    assert text.count("**How a verdict is reached**") == 1
    # the first screen (up to the claims table) fits in 60 lines
    first = text.split("### The claims")[0]
    assert len(first.splitlines()) <= 60


def test_a_findings_note_gives_only_its_own_margin_not_the_whole_rule():
    from attnzoo.reproduce.report import _findings_md

    f = compare(
        [1.0, 1.1, 1.2],
        [1.05, 1.1, 1.15],
        claim_type="non-inferiority",
        margin=0.5,
        margin_source="Table 9: 0.5 pts called comparable",
        unit="pts",
        paper="X",
        claim="a keeps b",
        paper_value="v",
        a_name="a",
        b_name="b",
    )
    _, notes = _findings_md([f, _f(*WIN)])
    assert notes == ["[1] rule: margin 0.5 pts: Table 9: 0.5 pts called comparable"]


def test_a_finding_serialises_through_its_fixed_schema_and_refuses_an_unknown_field():
    from attnzoo.compare.claims import Finding

    f = _f(*WIN, claim_id="tost-t3-lra#listops")
    gate(f, "sizes", "conditions")
    assert isinstance(f, Finding) and Finding.from_dict(f.to_dict()) == f
    assert Finding.checked(f) == f.to_dict() and "ci95" in f.to_dict() and "ungated_verdict" in f
    with pytest.raises(ValueError, match=r"fields \['gate_reason'\] that Finding does not declare"):
        Finding.from_dict({**f.to_dict(), "gate_reason": "typo"})
    # the mapping view reads and writes declared fields only
    with pytest.raises(KeyError, match="gate_reason"):
        f["gate_reason"] = "typo"
    with pytest.raises(KeyError, match="gate_reason"):
        f["gate_reason"]


def test_results_json_lists_every_claim_once_with_its_tests(tmp_path):
    from attnzoo.reproduce.report import _results_payload

    fs = [_f(*WIN, claim_id="tost-t3-lra#listops"), _f(*TIE, claim_id="tost-t3-lra#average"), _f(*LOSS)]
    payload = _results_payload({}, [Section("k", "K: t", findings=fs)], {}, {})
    ids = [c["id"] for c in payload["claims"]]
    assert ids == ["tost-t3-lra", "X Table 1: a beats b"]
    assert payload["claims"][0]["tests"] == ["tost-t3-lra#listops", "tost-t3-lra#average"]
    assert payload["claims"][0]["verdict"] == "agrees" and payload["meta"]["finding_schema"] == 2
    # a section is named as the claims table cites it: no subtitle, no parenthesis
    payload = _results_payload({}, [Section("k", "Adapting a ViT (CBSA Fig. 9)", findings=fs[:1])], {}, {})
    assert payload["claims"][0]["sections"] == "Adapting a ViT"


def test_a_note_shared_by_several_findings_is_printed_once_and_referenced_by_each():
    from attnzoo.reproduce.report import _findings_md

    fs = [_f(*WIN, claim=f"c{i}") for i in range(3)]
    for f in fs[:2]:
        gate(f, "sizes unlike the paper's (2.00x against 1.02x)", "conditions")
    gate(fs[2], "another reason", "conditions")
    table, notes = _findings_md(fs)
    assert notes == ["[1] gated: sizes unlike the paper's (2.00x against 1.02x)", "[2] gated: another reason"]
    assert table.count(" [1] |") == 2 and table.count(" [2] |") == 1


def test_a_checks_row_names_its_check_and_leaves_a_repeated_expected_figure_blank():
    from attnzoo.reproduce.report import _findings_md

    fs = [
        dataclasses.replace(_f(*WIN, claim="c1"), kind="check"),
        dataclasses.replace(_f(*WIN, claim="c2"), kind="check"),
        dataclasses.replace(_f(*WIN, claim="c3"), kind="check", paper_value="a >> b"),
    ]
    table, _ = _findings_md(fs)
    rows = table.splitlines()[2:]
    assert rows[0].startswith("| c1 | a > b | a 2.1")
    assert rows[1].startswith("| c2 |  | a 2.1")  # the same expected figure: left blank
    assert rows[2].startswith("| c3 | a >> b |")


def test_the_claims_table_names_a_reference_and_a_section_once_per_run_of_rows():
    from attnzoo.reproduce.report import _claims_table

    pairs = [
        ("S1", _f(*WIN, claim="c1")),
        ("S1", _f(*WIN, claim="c2")),
        ("S2", dataclasses.replace(_f(*WIN, claim="c3"), paper="Y")),
    ]
    gate(pairs[0][1], "sizes unlike the paper's", "conditions")
    table, notes = _claims_table(tally(pairs))
    rows = [[c.strip() for c in r.split("|")[1:-1]] for r in table.splitlines()[2:]]
    assert [r[-1] for r in rows] == ["S1", "", "S2"]
    assert [r[0] for r in rows] == ["X Table 1", "", "Y"] and [r[1] for r in rows] == ["c1", "c2", "c3"]
    # the paper's figure is printed once per run of equal rows; a claim's own notes are footnotes under the table
    assert [r[2] for r in rows] == ["a > b", "", ""] and rows[0][3].startswith("+1 pts [")
    # the notes follow the verdict they explain
    assert [r[-2] for r in rows] == ["inconclusive (agrees ungated) [1]", "agrees", "agrees"]
    assert notes == ["[1] gated: sizes unlike the paper's"]


def test_the_claims_table_gives_no_margin_note_where_the_margin_is_the_figures_own_gap():
    from attnzoo.reproduce import paper_claims
    from attnzoo.reproduce.report import _claims_table

    kw = paper_claims.compare_kw("tost-t2-vit#architecture")
    own = compare([78.0, 79.0, 80.0], [79.0, 80.0, 81.0], unit="pts", a_name="tost", b_name="vit", **kw)
    kw = paper_claims.compare_kw("tost-t3-lra#listops")
    other = compare([37.0, 38.0, 39.0], [37.0, 38.0, 39.5], unit="pts", a_name="tssa", b_name="softmax", **kw)
    table, notes = _claims_table(tally([("S", own), ("S", other)]))
    # tost-t2-vit's margin 1.9 is ToST Table 2's own gap, which its figure shows; tost-t3-lra's comes from elsewhere
    assert "(-1.9 pts)" in table and "(margin 1.9)" in table
    assert notes == [f"[1] rule: {other['margin_source']}"]


def test_the_claims_table_prints_a_long_not_tested_reason_once_and_points_back_to_it():
    from attnzoo.reproduce.paper_claims import measured_finding
    from attnzoo.reproduce.report import _claims_table

    long_reason = "the row needs more than twice the baseline's steps here, " * 3
    found = [
        measured_finding("aot-f6-icl-learns", long_reason, "not tested", "-", kind="paper"),
        measured_finding("aot-f6-icl-close", long_reason, "not tested", "-", kind="paper"),
        measured_finding("tost-f5-segments", "no measurement for tost", "not tested", "-", kind="paper"),
        measured_finding("cbsa-f8-flops", "no measurement for tost", "not tested", "-", kind="paper"),
        # two tests of one claim with the same long reason: the second points up
        measured_finding("cbsa-t5-ranking#crate_cbt-vs-crate", long_reason[1:], "not tested", "-", kind="paper"),
        measured_finding("cbsa-t5-ranking#crate-vs-cbt", long_reason[1:], "not tested", "-", kind="paper"),
    ]
    table, _ = _claims_table(tally([("S", f) for f in found]))
    cells = [[c.strip() for c in r.split("|")[1:-1]][3] for r in table.splitlines()[2:]]
    assert cells[0] == long_reason.strip() and cells[1] == "as for `aot-f6-icl-learns`"
    assert cells[2] == cells[3] == "no measurement for tost"  # a short text is printed again
    assert cells[4:] == [f"crate_cbt-vs-crate: {long_reason[1:].strip()}", "crate-vs-cbt: as above"]


def test_a_paper_claim_is_reported_in_the_claims_table_and_not_again_in_its_section():
    from attnzoo.reproduce.report import _section_md

    fs = [_f(*WIN, claim_id="tost-t3-lra#listops", claim="c1"), dataclasses.replace(_f(*TIE, claim="c4"), kind="check")]
    sec = Section("k", "K: t", findings=fs)
    summary = "\n".join(_summary([sec], "long"))
    assert "| `tost-t3-lra` (X Table 1) | c1 | a > b | listops: +1 pts [" in summary
    body = "\n".join(_section_md(sec))
    assert "tost-t3-lra" not in body and "| c4 | a > b |" in body


def test_the_compute_table_lists_each_sections_decided_trained_claims():
    from attnzoo.reproduce.report import _compute_md

    vis = Section(
        "vision", "Vision: v", findings=[_f(*WIN, claim_id="cbsa-t3-crate"), _f(*TIE, claim_id="tost-t3-lra#listops")]
    )
    lra = Section("long-range", "Long-range: l", findings=[_f(*LOSS, claim_id="csp-t3-vit#architecture")])
    records = {
        "vision/cbt/seed0": {"section": "vision", "wall_s": 120.0},
        "long-range/softmax/lr-sweep/lr0.001": {"section": "long-range", "wall_s": 60.0},
    }
    rows = {
        line.split("|")[1].strip(): line
        for line in "\n".join(_compute_md([vis, lra], records)).splitlines()
        if line.startswith("| ")
    }
    assert rows["Vision"].rstrip(" |").endswith("1: `cbsa-t3-crate`")  # the tie is undecided: not listed
    assert rows["Long-range"].rstrip(" |").endswith("1: `csp-t3-vit`")  # a disagreement is decided too
    assert "| 2.0 |" in rows["Vision"] and "| 1.0 |" in rows["Long-range"]  # thread-minutes
    # a claim decided in one section and not tested in another is listed only where it was decided
    untested = claims.not_tested("X", "c", "v", "the control is inside the margin", claim_id="cbsa-t3-crate#listops")
    lra.findings.append(untested)
    rows = {
        line.split("|")[1].strip(): line
        for line in "\n".join(_compute_md([vis, lra], records)).splitlines()
        if line.startswith("| ")
    }
    assert rows["Vision"].rstrip(" |").endswith("1: `cbsa-t3-crate`")
    assert rows["Long-range"].rstrip(" |").endswith("1: `csp-t3-vit`")


def test_the_claims_table_states_a_combined_verdict_only_for_a_claim_tested_several_ways():
    from attnzoo.reproduce.report import _claims_table

    fs = [_f(*WIN, claim_id="tost-t3-lra#listops"), _f(*LOSS, claim_id="tost-t3-lra#average"), _f(*WIN, claim="c2")]
    table, _ = _claims_table(tally([("S", f) for f in fs]))
    rows = [[c.strip() for c in r.split("|")[1:-1]] for r in table.splitlines()[2:]]
    # the combined verdict of the two tests (one disagrees) follows the statement; each test keeps its own
    assert rows[0][1] == "a beats b (claim: **disagrees**)" and rows[1][1] == ""
    assert [r[4].split(" [")[0] for r in rows] == ["agrees", "**disagrees**", "agrees"]  # before its notes
    assert rows[0][3].startswith("listops: ") and rows[2][3].startswith("+1 pts")  # the test names its effect
    assert rows[0][0] == "`tost-t3-lra` (X Table 1)" and rows[2][0] == ""  # no record, the paper above: blank
    assert rows[2][1] == "c2"  # tested once: its test's verdict is the claim's


def test_a_superiority_claims_refuting_bar_is_in_its_effect_cell_not_a_note():
    from attnzoo.reproduce.report import _claims_table

    f = _f(*WIN, paper_effect=2.0)
    table, notes = _claims_table(tally([("S", f)]))
    row = [c.strip() for c in table.splitlines()[2].split("|")[1:-1]]
    assert row[3].startswith("+1 pts [") and row[3].endswith("] (refuted below +1)")
    assert row[4] == "agrees" and notes == []


def test_a_per_item_check_is_one_row_with_each_items_figure_and_verdict():
    from attnzoo.reproduce.paper_claims import measured_finding
    from attnzoo.reproduce.report import _findings_md

    def mem(mech, ratio, ok=True):
        measured = f"{4 * ratio:.1f} / 4.0 MiB = {ratio:.2f} (N=2048->8192)"
        return measured_finding(f"memory-linear-in-n#{mech}", measured, ok, "agrees if ≤ 4.5", mechanism=mech)

    table, notes = _findings_md([mem("csp", 4.0), mem("tssa", 3.8)])
    rows = [[c.strip() for c in r.split("|")[1:-1]] for r in table.splitlines()[2:]]
    assert rows == [
        [
            "each mechanism: memory linear in N",
            "ratio of peak memory at 4N vs N ≤ 4.5",
            "csp 16.0 / 4.0 MiB = 4.00, tssa 15.2 / 4.0 MiB = 3.80 (N=2048->8192)",
            "agrees (all 2) [1]",
        ]
    ]
    assert notes == ["[1] rule: agrees if ≤ 4.5"]
    # a verdict that differs is named per item; another check, or one with a note of its own, keeps its own row
    table, _ = _findings_md([mem("csp", 4.0), mem("xca", 5.0, ok=False)])
    assert "| csp: agrees; xca: **disagrees** [1] |" in table
    lone = mem("linear", 4.0)
    lone["explanation"] = "a note of its own"
    table, _ = _findings_md([mem("csp", 4.0), lone])
    assert len(table.splitlines()) == 4 and "| linear: memory linear in N |" in table


def test_a_decided_claim_tested_several_ways_names_the_test_that_decided_it():
    fs = [_f(*WIN, claim_id="tost-t3-lra#listops"), _f(*TIE, claim_id="tost-t3-lra#average"), _f(*LOSS)]
    text = "\n".join(_summary([Section("k", "K: t", findings=fs)], "long"))
    bullets = [line for line in text.splitlines() if line.startswith("- X Table 1, ")]
    assert len(bullets) == 2  # the undecided "average" test gets no bullet
    assert bullets[0].startswith("- X Table 1, a beats b (test: listops): ")
    assert bullets[1].startswith("- X Table 1, a beats b: ")  # tested once: nothing to name


def test_the_width_names_the_rows_a_plan_sizes_otherwise():
    from attnzoo.compare.common import width_text

    plan = {"arch": {"dim": 64}, "row_arch": {"tost": {"dim": 44}, "xcit": {"dim": 44}, "crate": {"heads": 5}}}
    assert width_text(plan, ["vit", "tost", "xcit", "crate"]) == "width 64 (44: tost, xcit)"
    assert width_text(plan, ["vit", "crate"]) == "width 64"  # crate keeps the plan's width
    assert width_text({**plan, "row_arch": {"cbt": {"dim": 80}}}, ["vit", "cbt"]) == "width 64 (80: cbt)"


def test_the_scale_comes_before_the_rules_on_the_first_screen():
    sec = Section("k", "K: t", findings=[_f(*WIN)])
    sec.scale = "here 36 tokens; the papers: 196"
    text = "\n".join(_summary([sec], "long"))
    assert "- K: here 36 tokens; the papers: 196" in text
    assert (
        text.index("**Decided trained claims**") < text.index("**Scale**") < text.index("**How a verdict is reached**")
    )


def test_a_curve_caption_says_what_its_points_are_the_trainers_unless_the_section_says_otherwise(tmp_path):
    from attnzoo.compare.common import CURVE_NOTE, Section

    panels = [("p", {"a": [[1, 0.5], [2, 0.6]]})]
    sec = Section("k", "T")
    sec.add_curves(panels, tmp_path / "a.png", lambda p: p.name, "loss", "t")
    sec.add_curves(panels, tmp_path / "b.png", lambda p: p.name, "loss", "t", points="one batch each")
    captions = [caption for _, caption in sec.plots]
    assert captions == [
        f"Validation loss during training (seed means; {CURVE_NOTE}).",
        "Validation loss during training (seed means; one batch each).",
    ]
