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


def _records(plan: dict, acc: dict[str, float], sweep_best: dict[str, float]) -> dict:
    """A stored record for every planned step: each row's seeds at ``acc[row]`` (+0.2 a seed), each sweep peaking at
    ``sweep_best[row]`` (default the grid's middle)."""
    grid = sorted(plan["lr_sweep"])
    recs = {}
    for step in vision.plan_steps(plan, 0):
        row, rest = step.id.split("/")[1], step.id.split("/")[-1]
        if "/lr-sweep/" in step.id:
            lr = float(rest.removeprefix("lr"))
            best = sweep_best.get(row, grid[len(grid) // 2])
            result = {"accuracy": 0.5 - abs(grid.index(lr) - grid.index(best)) * 0.05, "lr": lr}
        else:
            seed = int(rest.removeprefix("seed").removeprefix("extra-seed"))
            a = acc[row.removesuffix("@2x-steps")] + 0.2 * seed
            result = {"accuracy": a / 100, "params": 100_000, "samples_per_s": 1.0, "peak_train_mb": 1.0}
        recs[step.id] = {"result": result | {"val_curve": [], "tokens": 36}}
    return recs


@pytest.mark.parametrize("control_best, gated", [(2e-3, False), (4e-3, True)])
def test_the_skeleton_control_off_its_best_rate_holds_back_the_claims_it_judges(tmp_path, control_best, gated):
    """A control at the end of its sweep might be stronger at another rate: a margin test it lost does not count."""
    plan = _plan(models=["vit", "tost", "xcit"], not_tested={}, seeds=3, lr_sweep=[1e-3, 2e-3, 4e-3])
    acc = {"vit": 70.0, "vit+identity": 40.0, "tost": 75.0, "xcit": 75.0, "xcit+identity": 50.0}
    acc |= {"tost@matched-params": 75.0}
    recs = _records(plan, acc, {"xcit+identity": control_best})
    sec = vision.summarize(recs, plan, tmp_path, str)
    f = next(f for f in sec.findings if f.claim_id == "tost-t2-xcit#architecture")
    assert f.control_effect == pytest.approx(-25.0)  # far outside the 2.6-point margin
    if gated:
        assert f.verdict == "inconclusive" and "control is not tuned" in f.gate and "xcit+identity" in f.gate
    else:
        assert "control" not in (f.gate_reasons or [])


def test_extra_seeds_per_row_give_a_row_its_own_count():
    from attnzoo.compare.common import extra_seed_counts, extra_seeds_text

    extra = {"rows": ["vit", "tost"], "seeds": 5, "per_row": {"vit+identity": 22}}
    plan = _plan(lr_sweep=[1e-3], extra_seeds=extra)
    assert extra_seed_counts(plan) == {"vit": 5, "tost": 5, "vit+identity": 22}
    assert extra_seeds_text(plan) == "vit, tost: 5 seeds more; vit+identity: 22 seeds more"
    ids = {s.id for s in vision.plan_steps(plan, 0)}
    assert {f"vision/vit+identity/extra-seed{s}" for s in range(1, 23)} <= ids
    assert "vision/vit+identity/extra-seed23" not in ids and "vision/tost/extra-seed6" not in ids
    for bad, message in (({"per_row": {"vit": 0}}, "positive ints"), ({"per_rows": {"vit": 2}}, "unknown keys")):
        with pytest.raises(ValueError, match=message):
            vision.plan_steps(_plan(extra_seeds=bad), 0)
