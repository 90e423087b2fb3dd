"""Long-range rows a plan marks ``not_tested``: not trained, their claims reported as not tested with the reason."""

from __future__ import annotations

import pytest

from attnzoo.reproduce.sections import lra

WHY = "the no-attention control is inside the margin (pilot figures)"


def _plan(**over) -> dict:
    plan = {
        "tasks": {"listops": {"n_train": 32, "n_val": 16, "min_len": 8, "max_len": 16, "max_depth": 2}},
        "mechanisms": ["softmax", "csp"],
        "arch": {"dim": 32, "depth": 2, "heads": 4, "mlp_dim": 64},
        "train": {"steps": 2, "batch_size": 4, "lr": 1e-3},
        "not_tested": {"tssa": WHY},
    }
    return plan | over


def test_a_not_tested_row_is_not_trained():
    ids = [s.id for s in lra.plan_steps(_plan(), 0)]
    assert any("/csp/" in i for i in ids)
    assert not any("tssa" in i for i in ids)


@pytest.mark.parametrize(
    ("not_tested", "mechanisms", "message"),
    [
        ({"tssa": WHY}, ["softmax", "tssa"], "'tssa' is both trained \\(mechanisms\\) and marked not_tested"),
        ({"mega": WHY}, ["softmax"], "not_tested names 'mega', which has no claim here"),
    ],
)
def test_a_bad_not_tested_entry_is_refused_at_planning(not_tested, mechanisms, message):
    with pytest.raises(ValueError, match=message):
        lra.plan_steps(_plan(not_tested=not_tested, mechanisms=mechanisms), 0)


def test_every_claim_of_a_not_tested_row_is_reported_with_its_reason():
    found = lra._not_tested(_plan(), ["listops"], {"listops": 128})
    assert [f.claim_id for f in found] == ["tost-t3-lra#listops", "tost-t4-speed"]
    assert all(f.verdict == "not tested" for f in found)
    accuracy, speed = found
    assert accuracy.measured == WHY and accuracy.claim.endswith(" on listops")
    # the speed claim is not tested for its own reason too: N below the claim's smallest
    assert (
        speed.measured
        == "tssa is not trained here (its accuracy claim is not tested); longest task N=128 < 1024 in any case"
    )
    assert lra._not_tested(_plan(not_tested={}), ["listops"], {"listops": 128}) == []
    # where no row trained on the task its length is unknown, and the reason names none (no "N=0")
    _, speed = lra._not_tested(_plan(), ["listops"], {"listops": None})
    assert speed.measured == "tssa is not trained here (its accuracy claim is not tested)"


def test_csp_and_mega_csp_not_tested_report_every_claim_they_would_have_measured():
    plan = _plan(mechanisms=["softmax", "identity"], not_tested={"csp": WHY, "mega_csp": WHY})
    ids = [s.id for s in lra.plan_steps(plan, 0)]
    assert not any("/csp/" in i or "mega" in i for i in ids)
    found = lra._not_tested(plan, ["listops"], {"listops": 128})
    assert [f.claim_id for f in found] == [
        "csp-t4-lra#listops",
        "csp-f4-faster",
        "csp-f4-fastest",
        "csp-t4-mega#listops",
    ]
    assert all(f.verdict == "not tested" for f in found)
    assert found[0].measured == WHY and found[3].measured == WHY
    assert found[2].measured == "as for `csp-f4-faster`"


def test_a_plan_that_trains_no_encoder_reports_each_claim_not_tested_with_its_reason_and_no_empty_table(tmp_path):
    import copy

    from attnzoo.reproduce.budgets import BUDGETS
    from attnzoo.reproduce.sections import lra

    plan = copy.deepcopy(BUDGETS["long"]["long-range"])
    assert plan["mechanisms"] == []
    sec = lra.summarize({}, plan, tmp_path, str)
    assert sec.tables == [] and sec.intro.startswith("No encoder trains at this budget on listops")
    by_id = {f.claim_id: f for f in sec.findings}
    assert {f.verdict for f in sec.findings} == {"not tested"}
    assert "ListOps at N=128 barely needs attention" in by_id["tost-t3-lra#listops"].measured
    # with rows back, the accuracy table returns
    plan["mechanisms"] = ["softmax"]
    assert lra.summarize({}, plan, tmp_path, str).tables
