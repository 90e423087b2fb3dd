"""The claim table (``attnzoo.reproduce.paper_claims``): one well-formed record per claim, margins and size ratios as
the sections compare with, and every finding of a smoke run tied to one record by its ``claim_id``."""

from __future__ import annotations

import json
import math
import re
from collections import Counter

import pytest

from attnzoo.reproduce import paper_claims
from attnzoo.reproduce.paper_claims import CHECKS, CLAIMS, PAPERS, Check, PaperClaim

RECORDS = (*CLAIMS, *CHECKS)
#: the ``{field}`` names a section fills into a statement or paper value
FIELDS = {"name", "task", "mechanism", "theory", "eta"}


def test_ids_are_unique_short_and_stable_words():
    ids = [r.id for r in RECORDS]
    assert [i for i, n in Counter(ids).items() if n > 1] == []
    for i in ids:
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", i) and len(i) <= 32, i


@pytest.mark.parametrize("rec", CLAIMS, ids=lambda r: r.id)
def test_every_claim_is_well_formed(rec: PaperClaim):
    paper, where = rec.ref.split(" ", 1)
    assert paper in PAPERS and where.strip() and rec.statement.strip() and rec.paper_value.strip()
    assert rec.kind in paper_claims.CLAIM_KINDS and rec.metric and rec.task and isinstance(rec.higher_is_better, bool)
    assert rec.reference == rec.ref
    if rec.kind == "non-inferiority":
        assert rec.margin > 0 and rec.margin_source.strip(), "a non-inferiority claim needs a margin and its source"
    else:
        assert rec.margin == 0 and not rec.margin_source and not rec.margin_relative_to
    if rec.kind in ("superiority", "non-inferiority"):
        assert len(rec.rows) == 2 and rec.claim_type == rec.kind
    else:
        with pytest.raises(ValueError, match="not a trained comparison"):
            rec.claim_type  # noqa: B018
    if rec.paper_effect is not None:
        assert math.isfinite(rec.paper_effect) and rec.paper_effect_source.strip()
        if rec.margin and abs(rec.paper_effect) == rec.margin:  # no claims-table margin note: the figure shows it
            assert f"({rec.paper_effect:+g} pts" in rec.paper_value, rec.paper_value
    c = rec.conditions
    if c.param_ratio is not None:
        assert c.param_ratio > 0 and c.param_ratio_source.strip() and len(rec.rows) == 2
    assert len(set(rec.tests)) == len(rec.tests) and all(t and "#" not in t for t in rec.tests)
    for text in (rec.statement, rec.paper_value):
        assert {m for m in re.findall(r"{(\w+)", text)} <= FIELDS, text


@pytest.mark.parametrize("rec", CHECKS, ids=lambda r: r.id)
def test_every_check_is_well_formed(rec: Check):
    assert rec.reference.strip() and rec.statement.strip() and rec.paper_value.strip()
    assert not (rec.tests and rec.per), "a check is tested per item or by named tests, not both"
    for text in (rec.statement, rec.paper_value):
        assert {m for m in re.findall(r"{(\w+)", text)} <= FIELDS, text


def test_superiority_effects_favour_the_claim_and_absolute_margins_admit_the_papers_own_gap():
    for rec in CLAIMS:
        if rec.kind == "superiority" and rec.paper_effect is not None:
            assert rec.paper_effect > 0, rec.id  # oriented: positive favours row a
        if rec.kind == "non-inferiority" and rec.paper_effect is not None and not rec.margin_relative_to:
            assert rec.paper_effect >= -rec.margin - 1e-9, rec.id  # the margin is the largest gap called comparable


def test_margins_are_the_ones_the_sections_compared_with():
    """The margins moved here from the sections, number for number (a refactor must not move a verdict)."""
    margins = {r.id: r.margin for r in CLAIMS if r.kind == "non-inferiority"}
    assert margins == {
        "tost-t2-vit": 1.9,
        "tost-t2-xcit": 2.6,
        "cbsa-t4-mssa": 1.5,
        "aot-t2-crate": 11.0,
        "fast-t1-accuracy": 2.6,
        "cbsa-f9-linear": 1.5,
        "tost-t3-lra": 2.42,
        "aot-f6-icl-close": 0.1,
        "tost-t4-lm": 0.155,
        "aot-t1-lm": 0.035,
        "fast-f6-lm": 0.05,
        "aot-t1-hybrid": 0.03,
    }


def test_size_gates_read_the_papers_ratios_from_the_table():
    from attnzoo.reproduce.sections import language, vision

    assert vision.PAPER_SIZE_RATIO == {
        ("tost", "vit"): (22.6 / 22.1, "ToST Table 5: ToST-S 22.6M vs ViT-S 22.1M"),
        ("tost", "xcit"): (22.6 / 24.9, "ToST Table 5: ToST-S 22.6M vs XCiT-S 24.9M"),
        ("cbt", "crate"): (25.7 / 22.8, "CBSA Table 3: CBT-B 25.7M vs CRATE-B 22.8M"),
        ("csp_vit", "vit"): (6.38 / 9.52, "CSP Table 3: ViT with CSP 6.38M vs MHA 9.52M"),
        ("csp_vit", "csp_vit_skeleton+softmax"): (6.38 / 9.52, "CSP Table 3: ViT with CSP 6.38M vs MHA 9.52M"),
    }
    assert {k: v[0] for k, v in language.PAPER_SIZE_RATIO.items()} == {
        ("tost", "gpt"): 110 / 124,
        ("aot", "gpt"): 182 / 124,
        ("aot", "aot_hybrid"): 102 / 81,
        ("fastmax", "gpt"): 1.0,
    }


def test_lookups_name_what_is_wrong():
    assert paper_claims.base_id("tost-t3-lra#listops") == "tost-t3-lra"
    assert paper_claims.test_of("tost-t3-lra#listops") == "listops" and paper_claims.test_of("tost-t3-lra") == ""
    assert paper_claims.get("tost-t3-lra#listops").id == "tost-t3-lra"
    with pytest.raises(KeyError, match="unknown claim id 'tost-t9'.*valid ids"):
        paper_claims.get("tost-t9")
    with pytest.raises(KeyError, match="has no test 'path-x'; its tests: .*'pathfinder'"):
        paper_claims.get("tost-t3-lra#path-x")
    with pytest.raises(KeyError, match="has no test 'lra'; its tests: none"):
        paper_claims.get("aot-t2-crate#lra")
    # a check run per mechanism takes any mechanism as its test
    assert paper_claims.get("memory-linear-in-n#tssa").per == "mechanism"
    kw = paper_claims.compare_kw("tost-t2-vit#controlled-swap")
    assert kw["claim_id"] == "tost-t2-vit#controlled-swap" and (kw["claim_type"], kw["margin"]) == (
        "non-inferiority",
        1.9,
    )
    assert paper_claims.finding_kw("lra-attention-helps#text", task="text")["claim"].endswith(" on text")


@pytest.mark.slow
def test_every_smoke_finding_carries_a_known_claim_id_and_a_claim_appears_once(smoke):
    findings = [f for s in json.loads((smoke / "results.json").read_text())["sections"].values() for f in s["findings"]]
    assert findings
    for f in findings:
        cid = f["claim_id"]
        assert cid, f"a finding without a claim id: {f['paper']}: {f['claim']}"
        rec = paper_claims.get(cid)  # a known id, and a test the record names
        assert f["kind"] == ("paper" if isinstance(rec, PaperClaim) else "check"), cid
        assert f["paper"] == rec.reference, cid
        several = bool(rec.tests or getattr(rec, "per", ""))
        assert bool(paper_claims.test_of(cid)) == several, f"{cid}: a test part exactly where the claim has tests"
    full = Counter(f["claim_id"] for f in findings)
    assert [c for c, n in full.items() if n > 1] == [], "each test of a claim is one finding"
    base = Counter(paper_claims.base_id(f["claim_id"]) for f in findings)
    for cid, n in base.items():
        rec = paper_claims.get(cid)
        assert n == 1 or rec.tests or getattr(rec, "per", ""), f"{cid} appears {n} times without tests"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c.pop("metric"), r"claim 'tost-t2-vit': missing field\(s\) \['metric'\]"),
        (lambda c: c.update(margn=1.0), r"claim 'tost-t2-vit': unknown field\(s\) \['margn'\]"),
        (lambda c: c.update(margin="1.9"), r"claim 'tost-t2-vit': field 'margin' must be float"),
        (lambda c: c["conditions"].update(min_n=1.5), r"claim 'tost-t2-vit', field 'conditions': field 'min_n'"),
        (lambda c: c.update(kind="better"), r"claim 'tost-t2-vit': field 'kind' must be one of"),
        (lambda c: c.update(combine="some"), r"claim 'tost-t2-vit': field 'combine' must be one of \['all', 'any'\]"),
    ],
)
def test_a_bad_record_in_the_data_file_is_named_by_its_id_and_field(tmp_path, edit, message):
    import yaml

    data = yaml.safe_load(paper_claims.CLAIMS_FILE.read_text(encoding="utf-8"))
    edit(data["claims"][0])
    bad = tmp_path / "claims.yaml"
    bad.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        paper_claims.load(bad)
    assert paper_claims.load() == (CLAIMS, CHECKS)
