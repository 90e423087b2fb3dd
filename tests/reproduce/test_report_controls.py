"""The controls of ``attnzoo reproduce``: validation curves at >= 4 points of every trained run,
the no-attention (identity mixer) control, the random-initialisation control of the layer-wise probes, the
equal-wall-clock LRA reading, the parameter-matched ToST row and FAST's speed at D = 32. Known numbers in, words
and verdicts out; the plans at smoke size."""

from __future__ import annotations

import copy

import pytest
import torch

from attnzoo.compare import claims
from attnzoo.compare.claims import compare, finding, plateau_gate, stat
from attnzoo.compare.common import CURVE_POINTS, Context, curve_text, mean_val_curve, train_run
from attnzoo.compare.pipeline import Evidence, judge, judged
from attnzoo.compare.store import StepStore
from attnzoo.reproduce import plan


# ---- the identity mixer ------------------------------------------------------------------------------------------
def test_identity_mixer_passes_tokens_through_and_mixes_none():
    from attnzoo.models import create_model
    from attnzoo.models.blocks import IdentityMixer, build_mixer

    mixer = build_mixer("identity", 8, 2, causal=True, options={}, context={"layer_index": 0})
    assert isinstance(mixer, IdentityMixer)
    x = torch.randn(2, 5, 8)
    assert torch.equal(mixer(x), x)
    with pytest.raises(ValueError, match=r"'identity' \(the no-attention control\) takes no options, got \{'p': 2\}"):
        build_mixer("identity", 8, 2, causal=False, options={"p": 2}, context={})
    # in a causal LM no token reads any other: changing token 3 leaves the logits of every other position alone
    torch.manual_seed(0)
    lm = create_model("gpt2_base", dim=16, depth=2, heads=2, attention="identity", vocab_size=11).eval()
    ids = torch.randint(0, 11, (1, 7))
    other = ids.clone()
    other[0, 3] = (ids[0, 3] + 1) % 11
    with torch.no_grad():
        a, b = lm(ids), lm(other)
    keep = [i for i in range(7) if i != 3]
    torch.testing.assert_close(a[0, keep], b[0, keep])
    assert not torch.allclose(a[0, 3], b[0, 3])


def test_training_accepts_the_identity_control():
    from attnzoo.train.config import from_dict
    from attnzoo.train.objectives import check_model_choice

    check_model_choice(
        from_dict(
            {"task": "digits", "model": "vit_s", "model_options": {"attention": "identity"}, "steps": 1, "lr": 1e-3}
        )
    )


# ---- validation curves -------------------------------------------------------------------------------------------
def test_train_run_validates_at_four_points(tmp_path):
    ctx = Context(tmp_path, StepStore(tmp_path), seed=0, progress=False)
    cfg = {
        "task": "digits",
        "task_options": {},
        "model": "vit_s",
        "model_options": {"dim": 16, "depth": 1, "heads": 2, "patch_size": 4},
        "seed": 0,
        "steps": 8,
        "batch_size": 16,
        "lr": 1e-3,
        "log_every": 4,
    }
    rec = train_run(ctx, "t/vit/seed0", cfg)
    assert [p["step"] for p in rec["val_curve"]] == [2, 4, 6, 8] and CURVE_POINTS == 4
    assert all(0.0 <= p["accuracy"] <= 1.0 for p in rec["val_curve"])
    assert rec["val_curve"][-1]["accuracy"] == pytest.approx(rec["val"]["accuracy"])


def test_curve_points_before_the_last_use_curve_eval_batches(tmp_path):
    """A curve's earlier points are evaluated on ``curve_eval_batches`` batches; the last (the run's result) on
    every batch, and training is unchanged by it."""
    from attnzoo.train.config import from_dict
    from attnzoo.train.trainer import train

    base = {
        "task": "digits",
        "model": "vit_s",
        "model_options": {"dim": 16, "depth": 1, "heads": 2, "patch_size": 4},
        "steps": 6,
        "batch_size": 16,
        "lr": 1e-2,
        "eval_every": 2,
        "log_every": 2,
        "device": "cpu",
    }
    full = train(from_dict(base), tmp_path / "full", progress=False)
    part = train(from_dict({**base, "curve_eval_batches": 2}), tmp_path / "part", progress=False)
    assert part.final_metrics == full.final_metrics
    rows = {}
    for name in ("full", "part"):
        text = (tmp_path / name / "metrics.csv").read_text().splitlines()
        head = text[0].split(",")
        rows[name] = [dict(zip(head, r.split(","), strict=True)) for r in text[1:]]
    val = {n: {int(r["step"]): float(r["accuracy"]) for r in rs if r["split"] == "val"} for n, rs in rows.items()}
    assert sorted(val["part"]) == [2, 4, 6]
    for step in (2, 4):  # 2 batches of 16 images: a multiple of 1/32
        assert val["part"][step] * 32 == pytest.approx(round(val["part"][step] * 32), abs=1e-9)
    assert val["part"][6] == val["full"][6]
    with pytest.raises(Exception, match="curve_eval_batches must be >= 0, got -1"):
        from_dict({**base, "curve_eval_batches": -1}).validate()


def test_curves_fold_over_seeds_and_reach_the_plateau_text():
    runs = [
        {"val_curve": [{"step": 5, "accuracy": 0.2}, {"step": 10, "accuracy": 0.4}]},
        {"val_curve": [{"step": 5, "accuracy": 0.4}, {"step": 10, "accuracy": 0.6}, {"step": 15, "accuracy": 0.9}]},
    ]
    # only the steps every seed logged; scaled
    assert mean_val_curve(runs, "accuracy", 100.0) == [[5, pytest.approx(30.0)], [10, pytest.approx(50.0)]]
    assert mean_val_curve(runs + [{"val_curve": []}], "accuracy") == []
    assert curve_text([[5, 30.0], [10, 50.0]], ".1f") == "step 5: 30.0, step 10: 50.0"
    gate = plateau_gate([], "vit", stat([50.0, 52.0]), stat([51.0, 52.0]), "%", ".1f", curves="vit step 5: 30.0")
    assert gate["text"].endswith("; validation curves (seed means): vit step 5: 30.0")


# ---- plans -------------------------------------------------------------------------------------------------------
def test_vision_plateau_seeds_limit_only_the_vit_runs_at_twice_the_steps():
    from attnzoo.reproduce.budgets import budget
    from attnzoo.reproduce.sections import vision

    p = budget("default")["vision"]
    k, n = p["plateau_seeds"], p["seeds"]
    assert 0 < k < n
    ids = {s.id for s in vision.plan_steps(p, 0)}
    assert {f"vision/vit@2x-steps/seed{s}" for s in range(k)} <= ids and f"vision/vit@2x-steps/seed{k}" not in ids
    assert {f"vision/vit/seed{s}" for s in range(n)} <= ids  # the reported rows keep every seed
    unset = {s.id for s in vision.plan_steps({key: v for key, v in p.items() if key != "plateau_seeds"}, 0)}
    assert {f"vision/vit@2x-steps/seed{s}" for s in range(n)} <= unset


@pytest.mark.parametrize("budget", ["smoke", "default", "long"])
def test_plans_hold_the_controls(budget):
    from attnzoo.reproduce.sections import vision

    b, steps = plan(budget, 0)
    ids = {s.id for s in steps}
    n = b["vision"].get("seeds", 1)
    matched_row = b["vision"].get("matched_params", True) and "tost" in b["vision"]["models"]
    for row in ("vit+identity", *(["tost@matched-params"] if matched_row else [])):
        assert {f"vision/{row}/seed{k}" for k in range(n)} <= ids
    assert {f"vision/vit+identity/lr-sweep/lr{lr:g}" for lr in b["vision"]["lr_sweep"]} <= ids
    # ToST's and XCiT's skeleton without a token mixer: whenever either trains, at its own swept rate
    if {"tost", "xcit"} & set(b["vision"]["models"]):
        assert {f"vision/xcit+identity/seed{k}" for k in range(n)} <= ids
        assert {f"vision/xcit+identity/lr-sweep/lr{lr:g}" for lr in b["vision"]["lr_sweep"]} <= ids
        skeleton = next(s for s in steps if s.id == "vision/xcit+identity/seed0").config["train"]
        assert skeleton["model"] == "xcit_s" and skeleton["model_options"]["attention"] == "identity"
    else:
        assert not any(i.startswith("vision/xcit+identity/") for i in ids)
    # without token mixing a CLS token never sees the image: the control pools the patches by their mean
    control = next(s for s in steps if s.id == "vision/vit+identity/seed0").config["train"]["model_options"]
    assert control["attention"] == "identity" and control["pool"] == "mean"
    if matched_row:
        # the matched ToST changes only the width: it trains at ToST's tuned rate
        matched = next(s for s in steps if s.id == "vision/tost@matched-params/seed0")
        assert matched.deps and all(d.startswith("vision/tost/lr-sweep/") for d in matched.deps)
    else:
        # no separate matched row: the tost row itself is at the paper's ratio to ViT (its own width and sweep)
        from attnzoo.reproduce.plan_check import size_checks

        assert not any("matched-params" in i for i in ids)
        check = next(c for c in size_checks(steps) if c.claim_id == "tost-t2-vit")
        # a plan without the tost row says so ("not planned") rather than checking a ratio
        assert check.holds if "tost" in b["vision"]["models"] else not check.planned
    assert "language/gpt+identity/seed0" in ids
    for name in b["probes"]["layerwise"]:
        assert f"probes/layerwise-init/{name}" in ids
    assert {"efficiency/d32/softmax", "efficiency/d32/fastmax_p2"} <= ids
    if matched_row:
        # the matched width gives ToST a parameter count within 10% of ViT's (the plan's own width does not)
        cfg = next(s for s in steps if s.id == "vision/tost@matched-params/seed0").config["train"]
        v = b["vision"]
        params_vit = vision._model_params(v, "vit_s", vision.model_options("vit", v))
        params_tost = vision._model_params(v, "tost_t", cfg["model_options"])
        assert abs(params_tost / params_vit - 1) <= vision.MATCH_TOLERANCE
        assert cfg["model_options"]["dim"] % v["arch"]["heads"] == 0
    # every trained step validates at >= 4 points: train_run's default, or its own setting at least as dense
    for s in steps:
        t = s.config.get("train", {})
        if "eval_every" in t:
            assert t["eval_every"] <= max(1, t["steps"] // 4), s.id


def test_fast_d32_lengths_follow_the_plan():
    from attnzoo.reproduce.sections.efficiency import fast_d32_lengths

    assert fast_d32_lengths({"lengths": [64, 256]}) == [256]
    assert fast_d32_lengths({"lengths": [512, 2048, 8192]}) == [1024, 2048, 4096]
    assert fast_d32_lengths({"lengths": [1024, 1536]}) == [1024]


# ---- known numbers in, verdicts and words out -----------------------------------------------------------------------
def test_vision_control_and_matched_findings():
    from attnzoo.reproduce.sections import vision

    res = {
        "vit": {"accuracy": stat([70.0, 71.0, 70.5]), "params": 100_000},
        "vit+identity": {"accuracy": stat([40.0, 41.0, 40.5]), "params": 90_000},
        "tost@matched-params": {"accuracy": stat([70.2, 70.6, 70.4]), "params": 104_000},
    }
    out = judged(*vision._findings(res))
    ctl = next(f for f in out if f["claim"].startswith("attention helps"))
    assert ctl["kind"] == "check" and ctl["verdict"] == "agrees" and ctl["effect"] == pytest.approx(30.0)
    m = next(f for f in out if "parameter-matched" in f["claim"])
    assert m["kind"] == "paper" and m["verdict"] == "agrees" and m["margin"] == pytest.approx(1.9)
    assert "parameters 104,000 vs 100,000 (1.04x)" in m["measured"]
    # the control wins: attention does not help, and counts differ beyond 10%: the "similar size" claim is gated
    res["vit+identity"]["accuracy"] = stat([80.0, 81.0, 80.5])
    res["tost@matched-params"]["params"] = 150_000
    out = judged(*vision._findings(res))
    assert next(f for f in out if f["claim"].startswith("attention helps"))["verdict"] == "disagrees"
    m = next(f for f in out if "parameter-matched" in f["claim"])
    assert m["verdict"] == "inconclusive" and "150,000 and 100,000 differ by more than 10%" in m["gate"]
    # the control beating the ViT holds back the "comparable" verdict too (the whole chain of gates runs)
    assert m["gate_reasons"] == ["conditions", "control"]


def test_vision_verdicts_are_gated_when_the_task_does_not_need_attention():
    from attnzoo.reproduce.sections import vision

    res = {
        "vit": {"accuracy": stat([70.0, 71.0, 70.5]), "params": 100_000},
        "vit+identity": {"accuracy": stat([69.0, 71.5, 70.0]), "params": 90_000},
        "tost@matched-params": {"accuracy": stat([70.2, 70.6, 70.4]), "params": 104_000},
    }
    out, ev = vision._findings(res)
    m = next(f for f in out if "parameter-matched" in f["claim"])
    assert m["verdict"] == "agrees"  # the numbers alone, before the gates
    # a superiority verdict is not gated: an interval that separates two mixers shows the task tells them apart
    sup = compare(
        [2.0, 2.1, 2.2],
        [1.0, 1.1, 1.2],
        claim_type="superiority",
        unit="pts",
        paper="P",
        claim="c",
        paper_value="v",
        a_name="cbt",
        b_name="crate",
    )
    assert all(g is not sup for g, _, _ in vision._attention_needed(out + [sup]))
    judged(out + [sup], ev)
    assert sup["verdict"] == "agrees" and "gate" not in sup
    ctl = next(f for f in out if f["claim"].startswith("attention helps"))
    assert ctl["verdict"] == "inconclusive" and "gate" not in ctl  # the check itself is not gated
    assert m["verdict"] == "inconclusive" and m["ungated_verdict"] == "agrees" and m["gate_reasons"] == ["control"]
    assert m["gate"].startswith("not shown to need attention: vit vs vit+identity +0.333 pts")
    # attention helps: nothing is gated
    res["vit+identity"]["accuracy"] = stat([40.0, 41.0, 40.5])
    out = judged(*vision._findings(res))
    assert next(f for f in out if "parameter-matched" in f["claim"])["verdict"] == "agrees"


def test_vision_swaps_read_their_mean_pooled_pair_and_csp_its_own_skeleton():
    """ToST never passes a CLS token through TSSA, and CSP at 17 tokens runs with K = 1: the
    mean-pooled pair is the controlled swap where it ran (else the CLS-token swap is gated on conditions), the
    control is judged against the mean-pooled ViT, and CSP-ViT against softmax in its own skeleton."""
    from attnzoo.reproduce.sections import vision

    def r(*v):
        return {"accuracy": stat(list(v)), "params": 100_000}

    def tost_vs_vit_swap(out):
        return next(f for f in out if f["claim"].startswith("controlled swap: ToST") and "XCiT" not in f["claim"])

    res = {
        "vit": r(84.0, 84.5, 84.2),
        "tost": r(84.1, 84.3, 84.2),
        "vit+tssa": r(79.0, 79.5, 79.2),
        "vit+csp": r(75.0, 76.0, 75.5),
        "csp_vit": r(82.0, 82.4, 82.2),
        "vit+identity": r(82.0, 82.4, 82.2),
    }
    out = judged(*vision._findings(res))
    ctl = tost_vs_vit_swap(out)
    assert (ctl["a_name"], ctl["b_name"]) == ("vit+tssa", "vit") and ctl["gate_reasons"] == ["conditions"]
    assert "never passes a CLS token through TSSA" in ctl["gate"] and ctl["ungated_verdict"] == "disagrees"
    csp = next(f for f in out if f["claim"].startswith("controlled swap: CSP-ViT"))
    assert csp["gate_reasons"] == ["conditions"] and "K = 1" in csp["gate"]
    assert next(f for f in out if f["claim"] == "CSP-ViT beats the MHA ViT")["b_name"] == "vit"

    res |= {
        "vit-meanpool": r(84.5, 84.9, 84.7),
        "vit+tssa-meanpool": r(83.9, 84.4, 84.1),
        "vit+csp-meanpool": r(83.0, 83.6, 83.3),
        "csp_vit_skeleton+softmax": r(82.1, 82.5, 82.3),
    }
    out = judged(*vision._findings(res))
    ctl = tost_vs_vit_swap(out)
    assert (ctl["a_name"], ctl["b_name"]) == ("vit+tssa-meanpool", "vit-meanpool") and "conditions" not in ctl.get(
        "gate_reasons", []
    )
    csp = next(f for f in out if f["claim"].startswith("controlled swap: CSP-ViT"))
    assert (csp["a_name"], csp["b_name"]) == ("vit+csp-meanpool", "vit-meanpool") and "conditions" not in csp.get(
        "gate_reasons", []
    )
    own = next(f for f in out if f["claim"] == "CSP-ViT beats the MHA ViT")
    # a tie against the paper's own +2.91 refutes "beats" (the interval lies below half of it)
    assert own["b_name"] == "csp_vit_skeleton+softmax" and own["ungated_verdict"] == "disagrees"
    assert own["refute_below"] == pytest.approx(0.5 * 2.91)
    # ... under the paper's conditions only: equal sizes here (1.00x) against CSP Table 3's 0.67x
    assert own["verdict"] == "inconclusive" and own["gate_reasons"] == ["conditions"] and "0.67x" in own["gate"]
    check = next(f for f in out if f["claim"].startswith("attention helps"))
    assert (check["a_name"], check["b_name"]) == ("vit-meanpool", "vit+identity")
    # against XCiT without a mean-pooled XCA row the swap keeps the CLS token: TSSA's is gated on the conditions
    res |= {"xcit": r(85.0, 85.4, 85.2), "vit+xca": r(83.0, 83.4, 83.2)}
    out = judged(*vision._findings(res))
    swap = next(f for f in out if f["claim"].startswith("controlled swap: ToST") and "XCiT" in f["claim"])
    assert (swap["a_name"], swap["b_name"]) == ("vit+tssa", "vit+xca") and swap["gate_reasons"] == ["conditions"]
    assert "same skeleton and pooling" in check["claim"]
    # with the mean-pooled XCA row, TSSA is read against XCA under one factor, not gated
    res["vit+xca-meanpool"] = r(84.0, 84.4, 84.2)
    out = judged(*vision._findings(res))
    swap = next(f for f in out if f["claim"].startswith("controlled swap: ToST") and "XCiT" in f["claim"])
    assert (swap["a_name"], swap["b_name"]) == (
        "vit+tssa-meanpool",
        "vit+xca-meanpool",
    ) and "conditions" not in swap.get("gate_reasons", [])


def test_control_margins_of_cls_token_rows_read_the_mean_pooled_twin():
    """ToST vs the CLS-token ViT: the mean-pooled control differs from the CLS-token ViT in two factors; where the
    mean-pooled ViT ran, the control is read against it too, and the reading nearer the margin is judged."""
    from attnzoo.reproduce.sections import vision

    def r(*v):
        return {"accuracy": stat(list(v)), "params": 100_000}

    # the CLS-token ViT is far ahead of the control (margin not admitted), its mean-pooled twin is not (admitted)
    res = {"vit": r(86.0, 86.2, 86.1), "tost": r(85.5, 85.7, 85.6), "vit+identity": r(82.0, 82.4, 82.2)}
    f = next(f for f in judged(*vision._findings(res)) if f["claim"].startswith("ToST is competitive with ViT"))
    assert f["verdict"] == "agrees" and "gate" not in f  # against the CLS-token ViT: 3.9 points, outside 1.9
    res["vit-meanpool"] = r(82.9, 83.3, 83.1)
    f = next(f for f in judged(*vision._findings(res)) if f["claim"].startswith("ToST is competitive with ViT"))
    assert f["verdict"] == "inconclusive" and f["gate_reasons"] == ["control"]
    assert "vit+identity (no token mixer in its blocks) is -0.9" in f["gate"] and "from vit-meanpool" in f["gate"]
    # either reading holds back: here the claim's own baseline admits the control and the twin does not
    res = {"vit": r(83.0, 83.2, 83.1), "tost": r(83.5, 83.7, 83.6), "vit+identity": r(82.0, 82.4, 82.2)}
    res["vit-meanpool"] = r(90.0, 90.2, 90.1)
    f = next(f for f in judged(*vision._findings(res)) if f["claim"].startswith("ToST is competitive with ViT"))
    assert f["verdict"] == "inconclusive" and "is -0.9" in f["gate"] and "from vit," in f["gate"]
    assert f["control_effect"] == pytest.approx(-0.9)


@pytest.mark.parametrize("control_at, gated", [(76.0, True), (55.0, False)])
def test_tosts_claims_are_judged_by_the_control_in_tosts_own_skeleton(control_at, gated):
    """ToST and XCiT share a skeleton (conv stem, class-attention pooling) that the ViT's control lacks: ToST's claims
    are held back when that skeleton without a token mixer would pass them too, whichever the baseline."""
    from attnzoo.reproduce.sections import vision

    def r(*v, params=100_000):
        return {"accuracy": stat(list(v)), "params": params}

    res = {"vit": r(70.0, 71.0, 70.5), "vit+identity": r(50.0, 51.0, 50.5), "tost": r(75.0, 75.5, 76.0)}
    # at the papers' parameter ratios (ToST/XCiT 0.908x), so that only the control can gate
    res |= {
        "xcit": r(75.0, 76.0, 75.5, params=110_000),
        "xcit+identity": r(control_at - 0.4, control_at, control_at + 0.4),
    }
    out = judged(*vision._findings(res))
    for claim_id, base in (("tost-t2-vit#architecture", "vit"), ("tost-t2-xcit#architecture", "xcit")):
        f = next(f for f in out if f.claim_id == claim_id)
        assert f.verdict == ("inconclusive" if gated else "agrees") and claims.numbers_verdict(f) == "agrees"
        # the numbers shown are the skeleton control's against the claim's own baseline, not the ViT control's
        effect = control_at - res[base]["accuracy"].mean
        assert f.control_effect == pytest.approx(effect)
        if gated:
            assert (
                f.gate_reasons == ["control"]
                and f"xcit+identity (no token mixer in its blocks) is {effect:+.3g}" in f.gate
            )
    # the ViT-skeleton rows keep the ViT's control; XCiT against its own control is a check
    check = next(f for f in out if f.claim_id == "vision-attention-helps-xcit")
    assert check.kind == "check" and check.a_name == "xcit" and check.b_name == "xcit+identity"
    assert check.verdict == ("inconclusive" if gated else "agrees")


def test_a_control_off_its_best_rate_passes_no_margin_test():
    """Outside the margin, a control at the edge of its sweep might not be (tuned, it could do better)."""
    from attnzoo.compare.pipeline import Control, Evidence, judge

    kw = dict(unit="pts", paper="P", claim="c", paper_value="v", a_name="tost", b_name="xcit")
    kw |= dict(claim_type="non-inferiority", margin=2.6, margin_source="s", claim_id="tost-t2-xcit")
    for untuned, verdict in ((None, "agrees"), ("xcit+identity's best rate is its grid's top", "inconclusive")):
        f = compare([75.0, 75.5, 76.0], [75.0, 76.0, 75.5], **kw)
        control = Control("xcit+identity", stat([55.0, 55.4, 55.8]), lambda f: True, untuned=untuned)
        judge([f], Evidence(controls=[control]))
        assert f.verdict == verdict and (untuned is None or "not tuned" in f.gate)


def test_language_control_finding():
    from attnzoo.reproduce.sections import language

    res = {
        "gpt": {"val_loss": stat([1.60, 1.62, 1.61]), "decode": []},
        "gpt+identity": {"val_loss": stat([2.40, 2.41, 2.39]), "decode": []},
    }
    f = next(f for f in judged(*language._findings(res)) if f["claim"].startswith("attention helps"))
    assert f["kind"] == "check" and f["verdict"] == "agrees" and f["effect"] == pytest.approx(0.79)
    res["gpt+identity"]["val_loss"] = stat([1.20, 1.21, 1.19])
    f = next(f for f in judged(*language._findings(res)) if f["claim"].startswith("attention helps"))
    assert f["verdict"] == "disagrees"
    assert language.rows_of({"models": ["gpt", "tost"]}) == ["gpt", "tost", "gpt+identity"]
    assert language.rows_of({"models": ["tost"]}) == ["tost"]


def _probe(vals, key="crate_compression", mech="mssa"):
    return {
        "layers": [{"name": f"blocks.{i}.attn", "mechanism": mech, key: v} for i, v in enumerate(vals)],
        "series": {key: vals},
    }


@pytest.mark.parametrize(
    "trained, init, reading",
    [
        ([5.0, 5.0, 4.0, 3.0], [5.0, 5.0, 5.1, 5.2], "training produces the trend"),
        ([5.0, 5.0, 4.0, 1.0], [5.0, 5.0, 4.8, 4.5], "training deepens the untrained model's fall"),
        ([5.0, 5.0, 4.0, 3.0], [5.0, 5.0, 4.2, 3.5], "the untrained model falls as much"),
        ([5.0, 5.0, 5.1, 5.2], [5.0, 5.0, 4.2, 3.5], "training undoes the untrained model's fall"),
        ([5.0, 5.0, 5.1, 5.2], [5.0, 5.0, 5.2, 5.3], "neither falls"),
    ],
)
def test_random_init_control_words_follow_the_numbers(trained, init, reading):
    from attnzoo.reproduce.sections import probes

    c = probes.init_control(_probe(trained), _probe(init))
    assert reading in c["text"], c["text"]
    assert c["data"]["series"] == init
    assert c["data"]["change"] == pytest.approx(trained[-1] - trained[2])
    assert c["data"]["change_init"] == pytest.approx(init[-1] - init[2])
    # a trend the untrained model shows as strongly is not credited to training: an "agrees" is gated
    f = probes.apply_init_control(finding("P", "c", "v", "m", "agrees", "r", kind="paper", explanation="e"), c)
    gated = reading == "the untrained model falls as much"
    assert (f["verdict"] == "inconclusive") == gated and f["explanation"].startswith("e; untrained control: ")
    assert f.get("gate_reasons") == (["control"] if gated else None)


def test_random_init_control_uses_the_seed_mean_of_the_trained_series():
    from attnzoo.reproduce.sections import probes

    c = probes.init_control(_probe([5.0, 5.0, 4.0, 3.0]), _probe([5.0, 5.0, 5.0, 5.0]), [_probe([5.0, 5.0, 4.0, 5.0])])
    assert c["data"]["change"] == pytest.approx(0.0) and "vs trained +0 (2 seeds)" in c["text"]


def _fold(acc_by_step: list[dict], steps_per_s: float) -> dict:
    final = [d[max(d)] for d in acc_by_step]
    return {"accuracy": stat(final), "steps_per_s": steps_per_s, "val_by_step": acc_by_step, "seeds": len(final)}


def test_equal_wall_clock_reads_the_curves():
    from attnzoo.reproduce.sections import lra

    plan_ = {"train": {"steps": 100, "batch_size": 8, "lr": 1e-3}}
    soft = _fold([{25: 20.0, 50: 30.0, 75: 40.0, 100: 50.0}, {25: 22.0, 50: 32.0, 75: 42.0, 100: 52.0}], 2.0)
    base = [{25: 10.0, 50: 20.0, 75: 30.0, 100: 35.0}, {25: 12.0, 50: 22.0, 75: 32.0, 100: 37.0}]
    longer = [{50: 15.0, 100: 25.0, 150: 40.0, 200: 45.0}, {50: 17.0, 100: 27.0, 150: 42.0, 200: 47.0}]

    def read(rate):
        res = {"softmax": {"listops": soft}, "tssa": {"listops": _fold(base, rate)}}
        abl = {
            "tssa@2x-steps": {
                "task": "listops",
                "mechanism": "tssa",
                "train": {"steps": 200},
                "result": _fold(longer, rate),
            }
        }
        table, out = lra.equal_time(res, ["softmax", "tssa"], ["listops"], abl, plan_)
        return table, out["listops"]["tssa"]

    # softmax: 100 steps at 2 steps/s = 50 s; at 4 steps/s TSSA takes 200 steps: the end of its 2x run
    table, r = read(4.0)
    assert (r["step"], r["run_steps"], r["lower_bound"]) == (200, 200, False)
    assert r["accuracy_per_seed"] == [45.0, 47.0] and r["effect"] == pytest.approx(46.0 - 51.0)
    assert (
        r["softmax_seconds"] == pytest.approx(50.0) and "Softmax trains 100 steps in 50 s on listops" in table.caption
    )
    assert table.rows[0][:4] == ["listops", "tssa", "200", "200 of 200"]
    # at 1 step/s: 50 steps; both runs logged step 50, the run that ends nearer (its own schedule) is the 100-step one
    _, r = read(1.0)
    assert (r["step"], r["run_steps"]) == (50, 100) and r["accuracy_per_seed"] == [20.0, 22.0]
    # at 1.7 steps/s: 85 steps; the latest point not beyond them is step 75 of the 100-step run
    _, r = read(1.7)
    assert (r["step"], r["run_steps"]) == (75, 100)
    # at 10 steps/s: 500 steps, more than any run took: a lower bound, said so
    table, r = read(10.0)
    assert r["lower_bound"] and r["affordable_steps"] == pytest.approx(500.0)
    assert table.rows[0][2:4] == ["500", "200 of 200 (lower bound)"]


def test_fast_d32_finding_follows_the_times():
    from attnzoo.reproduce.sections.efficiency import fast_d32

    def d32(soft, fast):
        return {
            "softmax": {"rows": [{"length": n, "fwdbwd_ms": v} for n, v in soft.items()], "heads": 2},
            "fastmax_p2": {"rows": [{"length": n, "fwdbwd_ms": v} for n, v in fast.items()], "heads": 2},
        }

    table, f = fast_d32(d32({1024: 100.0, 4096: 1600.0}, {1024: 150.0, 4096: 400.0}))
    assert f["verdict"] == "agrees" and f["kind"] == "paper" and "N=4096" in f["measured"]
    assert "(4.00x)" in f["measured"] and table.rows[-1] == ["softmax / fastmax_p2", "0.67", "4.00"]
    _, f = fast_d32(d32({1024: 100.0, 4096: 300.0}, {1024: 150.0, 4096: 400.0}))
    assert f["verdict"] == "disagrees"
    _, f = fast_d32(d32({256: 10.0}, {256: 30.0}))
    assert f["verdict"] == "not tested" and "no N ≥ 1024 measured at D = 32" in f["measured"]
    # slower at 2048, faster at 4096: not faster at every N above the paper's break-even
    soft, fast = {1024: 100.0, 2048: 300.0, 4096: 1600.0}, {1024: 150.0, 2048: 330.0, 4096: 400.0}
    _, f = fast_d32(d32(soft, fast))
    assert f["verdict"] == "inconclusive" and "N=2048: 0.91x" in f["measured"]
    # only N = 1024 measured: the break-even itself says nothing either way
    _, f = fast_d32(d32({1024: 100.0}, {1024: 150.0}))
    assert f["verdict"] == "inconclusive"


def test_unmatched_tost_row_is_gated_off_the_papers_sizes():
    from attnzoo.reproduce.sections import vision

    res = {
        "vit": {"accuracy": stat([70.0, 71.0, 70.5]), "params": 100_000},
        "tost": {"accuracy": stat([69.0, 70.0, 69.5]), "params": 200_000},
        "tost@matched-params": {"accuracy": stat([70.2, 70.6, 70.4]), "params": 98_000},
    }
    f = next(f for f in judged(*vision._findings(res)) if f["claim"] == "ToST is competitive with ViT at similar size")
    assert "parameters 2.00x" in f["measured"]
    # 2.00x against the paper's 1.02x (ToST-S vs ViT-S): not the paper's sizes, so the verdict is gated
    assert f["gate_reasons"] == ["conditions"] and "parameters 2.00x here against 1.02x in the paper" in f["gate"]
    res["tost"]["params"] = 104_000  # within 10% of the paper's ratio: no gate
    f = next(f for f in judged(*vision._findings(res)) if f["claim"] == "ToST is competitive with ViT at similar size")
    assert "gate" not in f


@pytest.mark.parametrize(
    "ablated, words",
    [
        # the means move 2.4 -> 1.0 but the change's interval holds 0: no change is shown (not "it stays")
        ([83.0, 85.5, 83.5], "gap to vit +2.4 -> +1.0 pts, but the change of abl vs row +1.4 pts, 95% CI"),
        # a clear change that leaves no gap
        ([85.0, 85.1, 84.9], "gap to vit +2.4 -> +0.0 pts: it is no longer distinguishable from zero"),
    ],
)
def test_gap_change_words_follow_the_numbers(ablated, words):
    from attnzoo.reproduce.sections.vision import gap_change

    res = {
        "vit": {"accuracy": stat([84.9, 85.0, 85.1])},
        "row": {"accuracy": stat([82.5, 82.6, 82.7])},
        "abl": {"accuracy": stat(ablated)},
    }
    text = gap_change(res, "row", "abl", "vit")
    assert text.startswith(words)
    assert ("contains 0: no change is shown" in text) == ("but the change" in words)
    assert "stays" not in text


@pytest.mark.parametrize(
    "values, gated",
    [
        (
            [15.8, 16.4, 16.1],
            "3 of 3 seeds of tssa did not learn (within 5 pts of the majority class 18.5%: 15.8, 16.4, 16.1%)",
        ),
        ([15.8, 30.0, 32.0], "1 of 3 seeds of tssa did not learn (within 5 pts of the majority class 18.5%: 15.8%)"),
        ([28.0, 30.0, 32.0], None),
    ],
)
def test_lra_unlearned_row_counts_the_seeds_that_did_not_train(values, gated):
    from attnzoo.compare.claims import finding
    from attnzoo.reproduce.sections.lra import unlearned_row

    f = finding("P", "c", "v", "m", "disagrees", "rule", kind="paper")
    judged(
        [f], Evidence(gates=[(f, "did not learn", why)] if (why := unlearned_row(stat(values), "tssa", 18.5)) else [])
    )
    assert f.get("gate") == gated and (f["verdict"] == "inconclusive") == (gated is not None)


def test_lra_seeds_that_did_not_learn_gate_the_disagreement():
    from attnzoo.reproduce.sections import lra

    base, row = [32.0, 33.0, 34.0], [15.8, 16.4, 29.1]
    res = {
        "softmax": {"listops": {"accuracy": stat(base), "per_seed": base}},
        "tssa": {"listops": {"accuracy": stat(row), "per_seed": row}},
    }
    gates = []
    found = lra._accuracy_findings(res, "tssa", "csp-t4-lra", ["listops"], majority={"listops": 18.5}, gates=gates)
    judged(found, Evidence(gates=gates))
    # one task: no separate average finding (it would count the same evidence twice)
    (per_task,) = found
    assert per_task["claim"].endswith("on listops")
    # the baseline's rule applied to the compared row: seeds that did not learn gate the verdict
    assert per_task["verdict"] == "inconclusive" and per_task["gate_reasons"] == ["did not learn"]
    assert (
        "2 of 3 seeds of tssa did not learn (within 5 pts of the majority class 18.5%: 15.8, 16.4%)"
        in (per_task["gate"])
    )


def test_paper_baselines_get_their_own_plateau_checks():
    from attnzoo.compare.claims import compare
    from attnzoo.reproduce.sections import vision

    b, steps = plan("smoke", 0)
    p = {**b["vision"], "models": ["vit", "tost", "crate"], "plateau_baselines": ["crate", "xcit"]}
    ids = {s.id for s in vision.plan_steps(p, 0)}
    # xcit is not a row of this plan: no plateau run for it; crate's runs one seed at twice the steps
    assert "vision/crate@2x-steps/seed0" in ids and "vision/crate@2x-steps/seed1" not in ids
    assert not any(i.startswith("vision/xcit@2x") for i in ids) and "vision/vit@2x-steps/seed1" in ids
    cfg = vision.row_config(p, "crate@2x-steps", 0)["train"]
    assert cfg["steps"] == 2 * p["train"]["steps"] and cfg["model"] == "crate_t"
    with pytest.raises(ValueError, match=r"plateau_baselines \['bert'\] have no plateau row"):
        vision.plan_steps({**p, "plateau_baselines": ["bert"]}, 0)

    kw = dict(claim_type="superiority", unit="pts", paper="P", claim="c", paper_value="v")
    vs_crate = compare([82.3, 83.3, 84.3], [79.0, 80.0, 81.0], a_name="cbt", b_name="crate", **kw)  # clears 0 by 1.03
    vs_vit = compare([82.3, 83.3, 84.3], [79.0, 80.0, 81.0], a_name="tost", b_name="vit", **kw)
    res = {
        "vit": {"accuracy": stat([79.0, 80.0, 81.0]), "val_curve": []},
        "vit@2x-steps": {"accuracy": stat([79.5, 80.5, 81.5]), "val_curve": []},  # +0.5: vit's findings stand
        "crate": {"accuracy": stat([79.0, 80.0, 81.0]), "val_curve": []},
        "crate@2x-steps": {"accuracy": stat([82.0]), "val_curve": []},  # +2.0 > 1.03: crate's finding is gated
    }
    out = judge(
        [vs_crate, vs_vit], Evidence(plateaus=vision._plateaus(res, {"vit": "vit@2x-steps", "crate": "crate@2x-steps"}))
    )
    assert out["vit"]["plateaued"] and not out["crate"]["plateaued"]
    assert vs_vit["verdict"] == "agrees" and vs_crate["verdict"] == "inconclusive"
    assert vs_crate["gate_reasons"] == ["plateau"]
    assert "crate moved" in vs_crate["gate"] and "at twice the steps" in vs_crate["gate"]


def test_vision_compared_rows_at_twice_the_steps_run_every_seed_and_are_judged_on_their_own_comparison():
    from attnzoo.compare.claims import compare
    from attnzoo.reproduce.sections import vision

    b, _ = plan("smoke", 0)
    p = {**b["vision"], "models": ["vit", "tost", "xcit"], "plateau_baselines": ["xcit"], "row_arch": {}}
    p["compared_2x"] = ["tost", "xcit"]
    ids = {s.id for s in vision.plan_steps(p, 0)}
    # a compared row and a baseline listed there both run at twice the steps on every seed (not one)
    assert {f"vision/{r}@2x-steps/seed{s}" for r in ("tost", "xcit") for s in range(p["seeds"])} <= ids
    steps = {s.id: s for s in vision.plan_steps(p, 0)}
    twice = steps["vision/tost@2x-steps/seed1"]
    assert twice.config["train"]["steps"] == 2 * p["train"]["steps"] and twice.config["train"]["model"] == "tost_t"
    assert twice.config["train"]["lr"] == steps["vision/tost/seed1"].config["train"]["lr"]  # tost's tuned rate
    with pytest.raises(ValueError, match=r"compared_2x rows \['bert'\] are not models or swaps"):
        vision.plan_steps({**p, "compared_2x": ["bert"]}, 0)

    kw = dict(claim_type="superiority", unit="pts", paper="P", claim="c", paper_value="v")
    vs_xcit = compare([82.3, 83.3, 84.3], [79.0, 80.0, 81.0], a_name="tost", b_name="xcit", **kw)  # clears 0 by 1.03
    res = {
        "vit": {"accuracy": stat([79.0, 80.0, 81.0])},
        "vit@2x-steps": {"accuracy": stat([79.5, 80.5, 81.5])},
        "xcit": {"accuracy": stat([79.0, 80.0, 81.0])},
        "xcit@2x-steps": {"accuracy": stat([82.0, 83.0, 84.0])},  # +3 > 1.03: the baseline's drift alone gates it
        "tost": {"accuracy": stat([82.3, 83.3, 84.3])},
        "tost@2x-steps": {"accuracy": stat([85.3, 86.3, 87.3])},  # the gap holds at twice the steps
    }
    rows, longer = {"vit": "vit@2x-steps", "xcit": "xcit@2x-steps"}, {"tost": "tost@2x-steps"}
    judge([vs_xcit], Evidence(plateaus=vision._plateaus(res, rows, longer)))
    assert vs_xcit["verdict"] == "agrees" and vs_xcit.replicated_2x["verdict"] == "agrees"
    again = compare([82.3, 83.3, 84.3], [79.0, 80.0, 81.0], a_name="tost", b_name="xcit", **kw)
    judge([again], Evidence(plateaus=vision._plateaus(res, rows)))  # no compared run: the drift gate reads it
    assert again["verdict"] == "inconclusive" and again["gate_reasons"] == ["plateau"]


@pytest.mark.parametrize(("n", "verdict"), [(128, "not tested"), (2048, "agrees")])
def test_csp_fastest_needs_the_lengths_of_its_other_speed_claim(n, verdict):
    from attnzoo.reproduce.sections import lra

    def row(sps):
        return {"listops": {"accuracy": stat([30.0, 31.0]), "per_seed": [30.0, 31.0], "seeds": 2, "steps_per_s": sps}}

    res = {"softmax": row(8.0), "csp": row(14.0), "tssa": row(12.0)}
    out = judged(*lra._findings(res, ["softmax", "csp", "tssa"], ["listops"], {"listops": n}, []))
    f = next(f for f in out if f["claim"] == "CSP has the fastest training of all models compared")
    assert f["verdict"] == verdict
    if verdict == "not tested":
        assert (
            f"longest task N={n} < 1024 (geometric-mean steps/s over listops: softmax 8.00, csp 14.00)"
            in (f["measured"])
        )


def test_language_sizes_unlike_the_papers_are_gated():
    from attnzoo.reproduce.sections import language

    loss = {"gpt": [1.80, 1.81, 1.82], "aot": [1.85, 1.86, 1.87], "aot_hybrid": [1.84, 1.85, 1.86]}
    params = {"gpt": 110_000, "aot": 161_000, "aot_hybrid": 128_000}
    res = {n: {"val_loss": stat(v), "params": params[n]} for n, v in loss.items()}
    out = [f for f in judged(*language._findings(res)) if f.get("claim_type")]
    aot = next(f for f in out if f["a_name"] == "aot" and f["b_name"] == "gpt")
    # 1.46x here, 1.47x for the pair AoT Table 1 calls comparable (Medium 182M vs GPT-2 Base 124M): not gated
    assert "gate" not in aot and aot["params_a"] == 161_000
    assert "AoT-Medium" in aot["paper_value"] and aot["margin"] == pytest.approx(0.035 * 1.81)
    hybrid = next(f for f in out if f["b_name"] == "aot_hybrid")
    # AoT 1.26x Hybrid here as in the paper (Base 102M vs Hybrid 81M): kept; now make Hybrid 2.27x AoT
    assert "gate" not in hybrid
    res["aot_hybrid"]["params"] = 365_000
    out = [f for f in judged(*language._findings(res)) if f.get("claim_type")]
    hybrid = next(f for f in out if f["b_name"] == "aot_hybrid")
    # Base's size (0.82x GPT) is not the comparable pair's: gated
    res["aot"]["params"] = 90_000
    out = [f for f in judged(*language._findings(res)) if f.get("claim_type")]
    aot = next(f for f in out if f["a_name"] == "aot" and f["b_name"] == "gpt")
    assert aot["gate_reasons"] == ["conditions"] and "0.82x here against 1.47x in the paper" in aot["gate"]
    assert hybrid["gate_reasons"] == ["conditions"] and "0.44x here against 1.26x in the paper" in hybrid["gate"]


def _cmp(a, b, a_name, b_name, margin=0.0, **kw):
    """A finding of made-up values: non-inferiority with ``margin`` > 0, else superiority; points unless told."""
    from attnzoo.compare.claims import compare

    kind = {"claim_type": "non-inferiority", "margin_source": "paper"} if margin else {"claim_type": "superiority"}
    kw = {"unit": "pts", "paper": "p", "claim": "c", "paper_value": "v", **kind, **kw}
    return compare(a, b, margin=margin, a_name=a_name, b_name=b_name, **kw)


def test_a_margin_that_admits_no_attention_gates_the_claim():
    """AoT's 11-point margin (AoT Table 2) on a task where a model without attention is 3 points behind CRATE: the
    "agrees" cannot tell AoT from no attention, so it is gated on the control; a narrow margin is not."""
    from attnzoo.compare.claims import margin_control_gate

    def f(margin):
        return _cmp([84.0, 84.5, 84.2], [86.0, 86.2, 85.9], "aot", "crate", margin)

    wide = margin_control_gate(f(11.0), [83.0, 82.8, 83.1], "vit+identity")
    assert wide["verdict"] == "inconclusive" and wide["ungated_verdict"] == "agrees"
    assert wide["gate_reasons"] == ["control"] and wide["control_effect"] == pytest.approx(-3.067, abs=1e-3)
    assert (
        "(no token mixer in its blocks) is -3.07 [-3.41, -2.72] pts from crate, not shown outside the margin"
        in wide["gate"]
    )
    narrow = margin_control_gate(f(2.6), [83.0, 82.8, 83.1], "vit+identity")
    assert "gate" not in narrow and narrow["control_effect"] == pytest.approx(-3.067, abs=1e-3)
    # the control's mean is outside a 2.9-point margin but its interval reaches inside: gated, as the claim would be
    # by the same evidence (the mean alone would let a control 0.1 beyond the margin pass)
    close = margin_control_gate(f(2.9), [83.0, 82.8, 83.1], "vit+identity")
    assert close["gate_reasons"] == ["control"] and close["control_ci95"][1] > -2.9 > close["control_effect"]

    # lower is better (losses): the control's loss 30% above GPT's is outside a 12.7% margin, inside a 40% one
    def loss(margin):
        kw = {"relative": True, "lower_is_better": True, "unit": "nats"}
        return _cmp([1.9, 1.92, 1.91], [1.80, 1.81, 1.82], "tost", "gpt", margin, **kw)

    assert "gate" not in margin_control_gate(loss(0.127), [2.35, 2.36, 2.34], "gpt+identity")
    assert margin_control_gate(loss(0.40), [2.35, 2.36, 2.34], "gpt+identity")["gate_reasons"] == ["control"]
    # a disagreement stays: the mechanism is worse than a margin no attention meets
    bad = _cmp([70.0, 70.5, 70.2], [86.0, 86.2, 85.9], "aot", "crate", 11.0)
    assert margin_control_gate(bad, [83.0, 82.8, 83.1], "vit+identity")["verdict"] == "disagrees"
    # superiority claims have no margin to admit anything
    sup = _cmp([87.0, 87.5, 87.2], [86.0, 86.2, 85.9], "cbt", "crate")
    assert "control_effect" not in margin_control_gate(sup, [83.0, 82.8, 83.1], "vit+identity")


def test_tost_listops_claim_is_non_inferiority_with_table_3s_margin():
    from attnzoo.reproduce import paper_claims
    from attnzoo.reproduce.sections import lra

    rec = paper_claims.get(next(cid for m, cid in lra.CLAIMS if m == "tssa"))
    kind, margin, source = rec.kind, rec.margin, rec.margin_source
    assert (kind, margin) == ("non-inferiority", 2.42) and "Pathfinder" in source and "37.25 vs 37.11" in source


def test_listops_control_check_and_margin_gate():
    """default's ListOps runs the identity encoder: softmax's check against it, and Fastmax's 2.6-point margin gated
    when the control is within it (an agreement that no attention would also reach)."""
    from attnzoo.reproduce import budgets
    from attnzoo.reproduce.sections import lra

    assert lra.CONTROL in budgets.BUDGETS["default"]["long-range"]["mechanisms"]

    def fastmax():
        claim = "Fastmax keeps softmax's accuracy on listops"
        cid = "fast-t1-accuracy#listops"
        return _cmp([33.5, 33.9, 33.7], [32.6, 33.0, 32.8], "fastmax", "softmax", 2.6, claim=claim, claim_id=cid)

    soft = stat([32.6, 33.0, 32.8])
    for ctl, gated in (([31.0, 31.4, 31.2], True), ([20.0, 21.0, 20.5], False)):
        f = fastmax()
        found = [f]
        res = {"softmax": {"listops": {"accuracy": soft}}, "identity": {"listops": {"accuracy": stat(ctl)}}}
        judged(found, Evidence(controls=lra._control_findings(found, res, ["listops"])))
        check = found[-1]
        assert check["kind"] == "check" and check["b_name"] == "identity" and check["verdict"] == "agrees"
        assert (f["verdict"] == "inconclusive" and f["gate_reasons"] == ["control"]) == gated
        assert f["verdict"] == ("inconclusive" if gated else "agrees")
    # without the control's runs nothing is added
    found = [fastmax()]
    lra._control_findings(found, {"softmax": {"listops": {"accuracy": soft}}}, ["listops"])
    assert len(found) == 1


def test_clock_span_covers_the_steps_computed_here_and_leaves_imported_ones_out():
    from attnzoo.reproduce.report import _clock_span

    recs = {
        "a": {"started": "2026-11-27T01:00:00", "finished": "2026-11-27T01:10:00"},
        "b": {"started": "2026-11-27T01:05:00", "finished": "2026-11-27T01:52:30"},
        # imported with --reuse: measured elsewhere, earlier; it must not stretch the span
        "c": {"started": "2026-11-20T09:00:00", "finished": "2026-11-20T09:30:00", "imported_from": "old"},
    }
    text = _clock_span(recs)
    assert "its 2 steps computed here" in text
    assert "2026-11-27 01:00:00 to 2026-11-27 01:52:30" in text and "52.5 min" in text
    assert _clock_span({"c": recs["c"]}) == "no step computed in this directory"
    assert "with a step running" not in text  # a and b overlap: no pause
    # a run resumed after a pause: the span counts the pause, the time with a step running does not
    recs["d"] = {"started": "2026-11-27T03:00:00", "finished": "2026-11-27T03:07:30"}
    text = _clock_span(recs)
    assert "01:00:00 to 2026-11-27 03:07:30" in text and "127.5 min of wall clock" in text
    assert "60.0 min with a step running" in text


def test_a_one_seed_plateau_run_is_compared_with_the_same_seed_of_the_baseline():
    from attnzoo.compare.claims import plateau_gate

    # the in-context case of the long run of 2026-11-27: seed 0 moves 0.182 -> 0.0825, the three-seed mean 0.442
    p = plateau_gate([], "gpt", stat([0.182, 0.660, 0.483]), stat([0.0825]), "error/d")
    assert p["change"] == pytest.approx(0.0825 - 0.182)
    assert "on the same seed (1 of 3): 0.182 -> 0.0825 (change -0.0995)" in p["text"]
    # every seed at twice the steps: the means, as before
    p = plateau_gate([], "vit", stat([84.0, 85.0, 84.5]), stat([84.2, 84.8, 84.4]), "%")
    assert p["change"] == pytest.approx(84.4667 - 84.5, abs=1e-3) and "same seed" not in p["text"]


def test_a_compared_row_that_moves_more_at_twice_the_steps_than_its_verdict_clears_is_gated():
    from attnzoo.compare.claims import compared_row_gate

    # CSP on ListOps 7 points behind softmax, its interval clearing 0 by ~6; CSP itself gains 7.7 at twice the steps
    f = _cmp([25.0, 26.0, 25.5], [32.5, 33.0, 32.8], "csp", "softmax", 0.0)
    assert f["verdict"] == "disagrees"
    g = compared_row_gate(copy.copy(f), "csp on listops", stat([25.0, 26.0, 25.5]), stat([33.0, 33.2, 33.4]), "%")
    assert g["verdict"] == "inconclusive" and g["gate_reasons"] == ["plateau"]
    assert "csp on listops alone moves +7.7 % at 2x steps" in g["gate"]
    assert g["trend_2x"]["verdict"] == "inconclusive" and "not the reported steps' verdict" in g["gate"]
    # a small move leaves it standing
    h = compared_row_gate(copy.copy(f), "csp on listops", stat([25.0, 26.0, 25.5]), stat([25.6, 25.9, 25.4]), "%")
    assert h["verdict"] == "disagrees" and h["compared_row_change"] == pytest.approx(0.133, abs=1e-3)
    assert "csp on listops alone moves +0.133 % at 2x steps" in h["explanation"]
    assert h["trend_2x"]["move"] == pytest.approx(0.133, abs=1e-3) and "< clearance" in h["explanation"]


def test_language_compared_row_runs_at_twice_the_steps_and_gates_its_own_verdict():
    """A compared row of the language section (here Fastmax) has its own run at twice the steps to gate its verdict."""
    from attnzoo.compare.common import Section
    from attnzoo.reproduce.runner import plan
    from attnzoo.reproduce.sections import language

    b, steps = plan("long", 0)
    by_id = {s.id: s for s in steps}
    longer, seed_run = by_id["language/fastmax@2x-steps/seed0"], by_id["language/fastmax/seed0"]
    assert longer.config["train"]["steps"] == 2 * seed_run.config["train"]["steps"]
    assert longer.deps == seed_run.deps and longer.deps  # at Fastmax's own tuned rate
    # the run at twice the steps has the plan's plateau_seeds seeds; a row not in compared_2x has none
    k = b["language"].get("plateau_seeds", b["language"]["seeds"])
    assert longer.config["contexts"] == [] and f"language/fastmax@2x-steps/seed{k - 1}" in by_id
    assert f"language/fastmax@2x-steps/seed{k}" not in by_id
    assert not any(i.startswith("language/tost@2x-steps/") for i in by_id)
    with pytest.raises(ValueError, match=r"compared_2x rows \['xcit'\] are not compared rows"):
        language.longer_rows({**b["language"], "compared_2x": ["xcit"]})
    # the gate: ToST 0.4 nats behind GPT; at twice the steps ToST itself gains 0.3, more than the interval clears
    res = {"gpt": {"val_loss": stat([1.60, 1.61, 1.62])}, "tost": {"val_loss": stat([2.00, 2.01, 2.02])}}
    f = _cmp([2.00, 2.01, 2.02], [1.60, 1.61, 1.62], "tost", "gpt", 0.2, lower_is_better=True)
    assert f["verdict"] == "disagrees"
    sec = Section("language", "Language", findings=[f])
    records = {"language/tost@2x-steps/seed0": {"result": {"val_loss": 1.70}}}
    plateaus = language._plateaus(records, {"models": ["gpt", "tost"], "compared_2x": ["tost"]}, res)
    judged(sec.findings, Evidence(plateaus=plateaus))
    assert f["verdict"] == "inconclusive" and "plateau" in f["gate_reasons"]
    assert "tost alone moves -0.3 nats at 2x steps" in f["gate"]


def test_an_untuned_control_does_not_pass_the_margin_test():
    from attnzoo.compare.claims import margin_control_gate, untuned_control_gate

    def comparable():
        f = _cmp([50.0, 50.2, 49.9], [50.1, 50.0, 50.2], "a", "b", 2.0)
        assert f["verdict"] == "agrees"
        return margin_control_gate(f, [30.0, 31.0, 29.5], "identity on t")  # far outside the margin: passes

    f = comparable()
    assert f["verdict"] == "agrees"
    untuned_control_gate(f, None, "identity on t")
    assert f["verdict"] == "agrees"
    untuned_control_gate(f, "best rate 0.012 at the top of the grid", "identity on t")
    assert f["verdict"] == "inconclusive" and f["gate_reasons"] == ["control"]
    assert "control is not tuned: best rate 0.012" in f["gate"]
    f = comparable()
    f.control_effect = None  # no margin test ran: nothing to gate
    untuned_control_gate(f, "untuned", "identity on t")
    assert f["verdict"] == "agrees"


def test_the_eval_set_note_gives_the_binomial_error_from_its_numbers():
    from attnzoo.reproduce.sections import lra

    records = {"long-range/listops/labels": {"result": {"n_val": 400, "majority": 0.2}}}
    res = {"softmax": {"listops": {"accuracy": [32.0, 33.0, 33.5]}}}
    (note,) = lra._eval_set_notes(records, res, ["listops"])
    # sqrt(0.3283 * 0.6717 / 400) = 0.0235
    assert "the same 400 validation examples" in note and "about 2.3 pts" in note and "spread is 0.76" in note
    assert lra._eval_set_notes({}, res, ["listops"]) == []


def test_a_comparison_replicated_at_twice_the_steps_is_judged_on_its_gap_not_on_each_side_moving():
    """Both sides can move at twice the steps while their gap does not (ToST and GPT, -0.054 nats each, on
    2026-11-27): each side's own move must not gate the verdict then. With both sides at twice the steps on >= 2
    seeds, the same rule on those runs decides; the drift gates then leave the finding alone."""
    from attnzoo.compare.claims import compared_row_gate, replicated_gate

    a1, b1 = [2.00, 2.01, 2.02], [1.60, 1.61, 1.62]
    f = _cmp(a1, b1, "tost", "gpt", 0.2, lower_is_better=True, unit="nats")
    assert f["verdict"] == "disagrees"
    # both sides 0.3 lower at twice the steps: the gap (0.4 against a 0.2 margin) is the same
    replicated_gate(f, stat([1.70, 1.71, 1.72]), stat([1.30, 1.31, 1.32]), row="tost", baseline="gpt")
    rep = f["replicated_2x"]
    assert rep["verdict"] == "disagrees" and rep["effect"] == pytest.approx(-0.4)
    assert ": disagrees, -0.4 -> -0.4 nats [" in f["explanation"]
    assert f["replicated_2x"]["move"] == pytest.approx(0.0, abs=1e-12) and "; moved +0 < clearance" in f["explanation"]
    # the baseline's drift (0.3) and the row's own move (0.3) exceed the clearance (~0.17) but no longer gate it
    out = plateau_gate([f], "gpt", stat(b1), stat([1.30, 1.31, 1.32]), "nats")
    compared_row_gate(f, "tost", stat(a1), stat([1.70, 1.71, 1.72]), "nats")
    assert f["verdict"] == "disagrees" and "gate" not in f
    assert out["gated"] == 0
    assert "0 of 1 comparisons decided by their numbers alone (checks too) clear the change" in out["text"]
    assert "1 more judged on its own comparison at 2x" in out["text"]
    # the gap closing at twice the steps: the same rule is inconclusive there, so the verdict is gated
    g = _cmp(a1, b1, "tost", "gpt", 0.2, lower_is_better=True, unit="nats")
    replicated_gate(g, stat([1.50, 1.52, 1.55]), stat([1.30, 1.31, 1.32]), row="tost", baseline="gpt")
    assert g["verdict"] == "inconclusive" and g["ungated_verdict"] == "disagrees" and g["gate_reasons"] == ["plateau"]
    assert ": inconclusive, " in g["gate"] and "not the reported steps' verdict" in g["gate"]


def test_a_replicated_verdict_whose_interval_approaches_its_boundary_as_fast_as_it_clears_it_is_gated():
    """A verdict replicated at twice the steps while its gap shrank 70% is not shown to hold
    at the next doubling. Clearances (margin 0.2): 0.4 - 0.2 - half-width at 1x; at 2x the gap shrinks."""
    from attnzoo.compare.claims import replicated_gate

    a1, b1 = [2.00, 2.01, 2.02], [1.60, 1.61, 1.62]
    # the gap shrinks from 0.40 to 0.30: clearance ~0.17 -> ~0.07, approached by ~0.10 >= 0.07 left: gated
    f = _cmp(a1, b1, "tost", "gpt", 0.2, lower_is_better=True, unit="nats")
    replicated_gate(f, stat([1.60, 1.61, 1.62]), stat([1.30, 1.31, 1.32]), row="tost", baseline="gpt")
    rep = f["replicated_2x"]
    assert (
        rep["verdict"] == "disagrees" and rep["move"] == pytest.approx(0.1) and abs(rep["move"]) >= rep["clearance"] > 0
    )
    assert f["verdict"] == "inconclusive" and f["ungated_verdict"] == "disagrees" and f["gate_reasons"] == ["plateau"]
    assert "; moved +0.1 ≥ clearance" in f["gate"] and "the next doubling could cross" in f["gate"]
    # a smaller shrink (0.40 -> 0.36): approached by 0.04 < 0.13 left, so it stands, with both clearances stated
    g = _cmp(a1, b1, "tost", "gpt", 0.2, lower_is_better=True, unit="nats")
    replicated_gate(g, stat([1.66, 1.67, 1.68]), stat([1.30, 1.31, 1.32]), row="tost", baseline="gpt")
    rep = g["replicated_2x"]
    assert g["verdict"] == "disagrees" and "gate" not in g and 0 < rep["move"] < rep["clearance"]
    assert "< clearance" in g["explanation"]
    # moving away from the boundary never gates (the same test for "agrees")
    h = _cmp([1.60, 1.61, 1.62], [1.60, 1.61, 1.62], "fastmax", "gpt", 0.2, lower_is_better=True, unit="nats")
    assert h["verdict"] == "agrees"
    replicated_gate(h, stat([1.30, 1.31, 1.32]), stat([1.31, 1.32, 1.33]), row="fastmax", baseline="gpt")
    assert h["verdict"] == "agrees" and h["replicated_2x"]["clearance"] > h["replicated_2x"]["move"] > 0
    # an agreement approaching its boundary (the row falls behind at twice the steps) is gated by the same rule
    k = _cmp([1.60, 1.61, 1.62], [1.60, 1.61, 1.62], "fastmax", "gpt", 0.2, lower_is_better=True, unit="nats")
    replicated_gate(k, stat([1.41, 1.42, 1.43]), stat([1.30, 1.31, 1.32]), row="fastmax", baseline="gpt")
    assert k["replicated_2x"]["verdict"] == "agrees" and k["verdict"] == "inconclusive"


def test_a_relative_margin_is_re_read_on_the_longer_baseline_and_one_seed_only_describes_the_gap():
    from attnzoo.compare.claims import replicated_gate

    # non-inferiority at 10% of the baseline's loss: 0.16 at 1x (b = 1.6), 0.10 at 2x (b = 1.0)
    a1, b1 = [1.70, 1.71, 1.72], [1.60, 1.61, 1.62]
    f = _cmp(a1, b1, "fastmax", "gpt", 0.1, lower_is_better=True, relative=True, unit="nats")
    assert f["verdict"] == "agrees" and f["margin_rel"] == 0.1
    # the same absolute gap (0.1) at 2x no longer clears the smaller margin (0.1 of 1.0)
    replicated_gate(f, stat([1.10, 1.11, 1.12]), stat([1.00, 1.01, 1.02]), row="fastmax", baseline="gpt")
    assert f["replicated_2x"]["margin"] == pytest.approx(0.101)
    assert f["replicated_2x"]["verdict"] == "inconclusive" and f["verdict"] == "inconclusive"
    # one seed a side at twice the steps: no interval, so nothing is decided here; the paired gap is described
    g = _cmp(a1, b1, "tost", "gpt", 0.05, lower_is_better=True, unit="nats")
    assert g["verdict"] == "disagrees"
    replicated_gate(g, stat([1.60]), stat([1.45]), row="tost", baseline="gpt")
    assert "replicated_2x" not in g and g["verdict"] == "disagrees"
    assert g["paired_2x"] == {"seeds": 1, "effect_1x": pytest.approx(-0.1), "effect_2x": pytest.approx(-0.15)}
    assert "on the seed both tost and gpt ran at 2x steps: -0.1 -> -0.15 nats" in g["explanation"]
    assert "one seed a side gives no interval" in g["explanation"]
    # an undecided finding is left alone
    h = _cmp([1.70, 1.60, 1.80], [1.65, 1.70, 1.60], "tost", "gpt", 0.01, lower_is_better=True, unit="nats")
    assert h["verdict"] == "inconclusive"
    replicated_gate(h, stat([1.1, 1.2]), stat([1.0, 1.1]), row="tost", baseline="gpt")
    assert "replicated_2x" not in h and "paired_2x" not in h and h["verdict"] == "inconclusive"
    # ... though what the rule gives at twice the steps is said (a reader should not find it only in a figure)
    assert h["at_2x"]["verdict"] == "inconclusive" and "2x steps (2 vs 2 seeds" in h["explanation"]
    u = _cmp([1.70, 1.60, 1.80], [1.65, 1.70, 1.60], "tost", "gpt", 0.2, lower_is_better=True, unit="nats")
    replicated_gate(u, stat([1.30, 1.31, 1.32]), stat([1.30, 1.31, 1.32]), row="tost", baseline="gpt")
    assert u["verdict"] == "inconclusive" and "gate" not in u and u["at_2x"]["verdict"] == "agrees"
    assert ": the verdict depends on the steps" in u["explanation"]


def test_lra_extra_seeds_train_the_row_more_seeds_and_reject_an_unknown_row():
    import copy

    from attnzoo.reproduce.budgets import BUDGETS
    from attnzoo.reproduce.sections import lra

    plan = copy.deepcopy(BUDGETS["long"]["long-range"])
    plan["mechanisms"] = ["softmax", "identity"]  # long trains no ListOps row: put two back
    plan["extra_seeds"] = {"rows": ["identity"], "seeds": 2}
    ids = {s.id for s in lra.plan_steps(plan, 0)}
    n = plan["seeds"]
    assert {f"long-range/listops/identity/seed{s}" for s in range(n + 2)} <= ids
    assert f"long-range/listops/identity/seed{n + 2}" not in ids
    # the other rows keep the section's seeds
    assert f"long-range/listops/softmax/seed{n}" not in ids
    assert "identity: 2 seeds more" in lra._intro(plan, ["listops"], {"listops": 128})
    plan["extra_seeds"] = {"rows": ["cbsa"], "seeds": 2}
    with pytest.raises(ValueError, match="extra_seeds row 'cbsa'"):
        lra.plan_steps(plan, 0)


@pytest.mark.parametrize(
    "effect,ci,words",
    [
        (-0.274, [-0.331, -0.218], "tost is behind gpt by 0.274 nats (95% CI 0.218 to 0.331)"),
        (3.78, [2.86, 4.71], "tost is ahead of gpt by 3.78 nats (95% CI 2.86 to 4.71)"),
        (
            -0.45,
            [-1.11, 0.212],
            "tost and gpt differ by -0.45 nats, no direction shown (95% CI from 1.11 behind to 0.212 ahead)",
        ),
    ],
)
def test_effect_in_words_reads_the_sign_and_the_interval(effect, ci, words):
    from attnzoo.reproduce.report import effect_in_words

    f = {"a_name": "tost", "b_name": "gpt", "effect": effect, "ci95": ci, "unit": "nats"}
    assert effect_in_words(f) == words


def test_margin_sensitivity_states_the_verdict_under_another_of_the_papers_gaps():
    from attnzoo.compare.claims import margin_sensitivity, verdict_from_ci

    assert [verdict_from_ci(ci, 1.0) for ci in ([-0.5, 0.2], [-1.5, -1.2], [-1.2, -0.8])] == [
        "agrees",
        "disagrees",
        "inconclusive",
    ]
    f = _cmp([2.0, 2.01, 2.02], [1.72, 1.73, 1.74], "tost", "gpt", 0.155, lower_is_better=True, relative=True)
    assert f["verdict"] == "inconclusive"  # -0.28 [-0.31, -0.25] against 0.155 x 1.73 = 0.268
    margin_sensitivity(f, 0.127, "the in-distribution gap")
    assert "with the in-distribution gap (12.7%) as margin: disagrees (margin 0.22)" in f["explanation"]


def test_margin_sensitivity_in_the_effects_unit():
    from attnzoo.compare.claims import margin_sensitivity

    f = _cmp([34.0, 33.6, 34.3], [33.4, 33.8, 34.6], "fastmax", "softmax", 2.6)
    assert f["verdict"] == "agrees"
    margin_sensitivity(f, 0.97, "the task's own gap", relative=False)
    assert "with the task's own gap (0.97 pts) as margin: inconclusive" in f["explanation"]


def test_the_vision_intro_names_the_rates_beyond_the_shared_grid():
    from attnzoo.reproduce.budgets import budget
    from attnzoo.reproduce.sections import vision

    p = budget("long")["vision"]
    extra = [x for lrs in p["lr_sweep_extra"].values() for x in lrs]
    assert f"some rows' grids reach {min(extra):g} to {max(extra):g}: configs.md" in vision._intro(p)
    assert "grids reach" not in vision._intro({**p, "lr_sweep_extra": {}})
