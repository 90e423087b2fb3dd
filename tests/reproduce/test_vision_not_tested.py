"""Vision rows a plan marks ``not_tested``: not trained, their claims reported as not tested with the reason."""

from __future__ import annotations

import pytest

from attnzoo.reproduce.sections import vision

WHY = "the no-attention control is inside the claim's margin (pilot figures)"


def _plan(**over) -> dict:
    plan = {
        "task": "fashion_mnist",
        "task_options": {"n_train": 64, "n_val": 32},
        "models": ["vit", "tost", "crate"],
        "swaps": [],
        "arch": {"dim": 32, "depth": 1, "heads": 4, "patch_size": 4},
        "train": {"steps": 2, "batch_size": 8, "lr": 1e-3},
        "seeds": 1,
        "not_tested": {"aot": WHY, "vit+cbsa": WHY},
    }
    return plan | over


def test_a_not_tested_row_is_not_trained_and_each_of_its_claims_is_reported():
    ids = [s.id for s in vision.plan_steps(_plan(), 0)]
    assert any(i.startswith("vision/tost/") for i in ids)
    assert not any(i.startswith(("vision/aot/", "vision/vit+cbsa/")) for i in ids)
    found = vision._not_tested(_plan())
    assert [f.claim_id for f in found] == ["aot-t2-crate", "cbsa-t4-mssa"]
    assert all(f.verdict == "not tested" and f.measured == WHY for f in found)
    # a row in two claims has both reported
    both = vision._not_tested(_plan(models=["vit", "crate"], not_tested={"tost": WHY}))
    assert [f.claim_id for f in both] == ["tost-t2-vit#architecture", "tost-t2-xcit#architecture"]
    assert vision._not_tested(_plan(not_tested={})) == []


@pytest.mark.parametrize(
    ("not_tested", "swaps", "message"),
    [
        ({"aot": WHY}, [], None),
        ({"tost": WHY}, [], "'tost' is both trained"),
        ({"vit+cbsa": WHY}, ["vit+cbsa"], "'vit\\+cbsa' is both trained"),
        ({"vit+mssa": WHY}, [], "not_tested names 'vit\\+mssa', which has no claim here"),
    ],
)
def test_a_bad_not_tested_entry_is_refused_at_planning(not_tested, swaps, message):
    plan = _plan(not_tested=not_tested, swaps=swaps)
    if message is None:
        assert vision.plan_steps(plan, 0)
        return
    with pytest.raises(ValueError, match=message):
        vision.plan_steps(plan, 0)


def test_the_intro_states_which_rows_train_extra_seeds():
    plan = _plan(lr_sweep=[1e-3], extra_seeds={"rows": ["vit", "tost"], "seeds": 5})
    assert "1 seed per row (vit, tost: 5 seeds more)" in vision._intro(plan)
    assert "seeds more" not in vision._intro(_plan(lr_sweep=[1e-3]))


def test_the_intro_names_the_rows_that_change_only_the_token_mixer():
    import copy

    from attnzoo.reproduce.budgets import BUDGETS

    plan = copy.deepcopy(BUDGETS["long"]["vision"])
    intro = vision._intro(plan)
    # the ViT-skeleton rows are named (no other row is read as one), and the control's pooling is said
    assert "the controlled swaps (fastmax_vit, vit+identity) put their token mixer into the ViT skeleton" in intro
    assert intro.endswith(", vit+identity with mean pooling.")
    plan.update(swaps=["vit+tssa"], models=["vit", "tost"], compared_2x=[], plateau_baselines=[])
    intro = vision._intro(plan)
    assert "the controlled swaps (vit+tssa, vit+identity) put" in intro  # fastmax_vit is no row now
    plan["models"] = ["tost"]  # no ViT: no control, and with the swap alone no pooling to state
    assert vision._intro(plan).endswith(
        "the controlled swaps (vit+tssa) put their token mixer into the ViT skeleton "
        "(strided patches, CLS token, MLP blocks, pre-norm)."
    )
