"""``attnzoo reproduce`` section adapt-vision (CBSA Fig. 9): plans for every budget, the smoke section end to end
(trains, fine-tunes, summarises, findings with their statistics), and the verdicts on made-up accuracies."""

from __future__ import annotations

import json
import math

import pytest
import torch

from attnzoo.compare import claims
from attnzoo.compare.common import SWEEP_SEED_OFFSET
from attnzoo.reproduce import BUDGETS, SECTIONS, main, plan
from attnzoo.reproduce.budgets import budget, with_settings
from attnzoo.reproduce.sections import SECTION_MODULES
from attnzoo.reproduce.sections import adapt_vision as av

FINDING_FIELDS = ("kind", "paper", "claim", "paper_value", "measured", "verdict", "rule", "seeds")
COMPARISON_FIELDS = ("claim_type", "effect", "ci95", "margin", "values_a", "values_b", "a_name", "b_name")


def test_registered_after_vision():
    assert SECTIONS.index(av.KEY) == SECTIONS.index("vision") + 1
    assert list(SECTION_MODULES).index(av.KEY) == list(SECTION_MODULES).index("vision") + 1


#: long's Fig. 9 rows, as its budget file's re-measure command restores them
LONG_ROWS = (
    "adapt-vision.rows=[original, cbsa, cbsa-no-contraction, linear]",
    "adapt-vision.compared_2x=[cbsa, cbsa-no-contraction]",
    "adapt-vision.not_tested={}",
)
LONG_PLAN = with_settings(budget("long"), LONG_ROWS)[av.KEY]


@pytest.mark.parametrize("name,seeds", [("smoke", 2), ("default", 2), ("long", 6), ("full", 3)])
def test_plan_of_every_budget(name, seeds):
    b, steps = plan(name, 5, LONG_ROWS if name == "long" else ())
    control = [s for s in steps if s.id.split("/")[1] in av.CONTROL_ROWS]  # the attention check: its own test
    assert bool(control) == ("attention_control" in b[av.KEY])
    mine = [s for s in steps if s.section == av.KEY and s not in control]
    assert b[av.KEY]["seeds"] == seeds
    teacher = [s for s in mine if s.id == av.TEACHER]
    assert len(teacher) == 1 and teacher[0].config["train"]["model"] == "vit_s"
    rows = av.rows_of(b[av.KEY])
    assert set(rows) >= {"original", "cbsa", "cbsa-no-contraction", "linear"}
    lrs = b[av.KEY].get("finetune_lr_sweep", [])
    assert (len(lrs) >= 3) == (name in ("long",))  # long sweeps each row's fine-tuning rate
    sweep = [s for s in mine if "/lr-sweep/" in s.id]
    assert len(sweep) == len(rows) * len(lrs)
    for s in sweep:
        assert s.deps == (av.TEACHER,) and s.config["seed"] == 5 + SWEEP_SEED_OFFSET
        assert s.config["finetune"]["lr"] in lrs
    plateau = [s for s in mine if s.id.startswith(f"{av.KEY}/{av.PLATEAU}/")]
    compared = [s for s in mine if "@2x-steps/" in s.id and s not in plateau]
    assert len(compared) == len(av.compared_2x(b[av.KEY])) * seeds
    tuned = [s for s in mine if s.id != av.TEACHER and s not in sweep + plateau + compared]
    assert len(tuned) == len(rows) * seeds
    # long fine-tunes the claims' baseline (linear) twice the steps too, at its own tuned rate: its plateau run
    assert len(plateau) == (seeds if name == "long" else 0)
    for s in plateau:
        assert s.config["finetune"]["steps"] == 2 * b[av.KEY]["finetune"]["steps"]
        assert s.deps == (av.TEACHER, *(f"{av.KEY}/linear/lr-sweep/lr{lr:g}" for lr in lrs))
        assert (
            s.config["mechanism"] == next(t for t in tuned if t.id.startswith(f"{av.KEY}/linear/")).config["mechanism"]
        )
    for s in tuned:
        row = s.id.split("/")[1]
        assert s.deps == (av.TEACHER, *(f"{av.KEY}/{row}/lr-sweep/lr{lr:g}" for lr in lrs))
        ft = dict(s.config["finetune"], lr=b[av.KEY]["finetune"]["lr"])
        assert ft == b[av.KEY]["finetune"]  # every row fine-tunes for the same steps
        assert s.config["finetune"]["lr"] == ("tuned" if lrs else b[av.KEY]["finetune"]["lr"])
        assert s.config["seed"] in range(5, 5 + seeds)
    by_row = {s.id.split("/")[1]: s.config for s in tuned}
    assert by_row["cbsa"]["mechanism"] == "cbsa-qkv" and by_row["cbsa-no-contraction"]["mechanism"] == "agent-qkv"
    assert by_row[av.SCRATCH]["scratch"] and by_row[av.SCRATCH]["mechanism"] == "cbsa-qkv"
    assert not by_row["cbsa"]["scratch"]


def test_a_plan_without_rows_trains_nothing_and_says_why_each_claim_is_not_tested(tmp_path):
    b, steps = plan("long", 0)
    assert b[av.KEY]["rows"] == [] and not [s for s in steps if s.section == av.KEY]
    sec = av.summarize({}, b[av.KEY], tmp_path, "plots")
    assert not sec.tables and not sec.notes and "No row is fine-tuned" in sec.intro
    got = {f.claim_id: (f.verdict, f.measured) for f in sec.findings}
    why = {r: " ".join(w.split()) for r, w in b[av.KEY]["not_tested"].items()}
    assert got == {
        "cbsa-f9-linear": ("not tested", why["cbsa"]),
        "cbsa-f9-no-contraction": ("not tested", why["cbsa-no-contraction"]),
    }


@pytest.mark.parametrize(
    "not_tested,message",
    [
        ({"linear": "x"}, r"names 'linear', which has no claim here \(valid: \['cbsa', 'cbsa-no-contraction'\]\)"),
        ({"cbsa": "x"}, r"adapt-vision: 'cbsa' is both trained \(rows\) and marked not_tested; keep one"),
    ],
)
def test_a_bad_not_tested_entry_is_refused_at_planning(not_tested, message):
    p = dict(BUDGETS["smoke"][av.KEY], not_tested=not_tested)
    with pytest.raises(ValueError, match=message):
        av.plan_steps(p, 0)


def test_a_left_out_row_replaces_its_comparison_and_keeps_the_others(tmp_path):
    p = dict(BUDGETS["smoke"][av.KEY], rows=["original", "cbsa", "linear"], not_tested={"cbsa-no-contraction": "why"})
    accs = {"original": 80.0, "cbsa": 79.0, "linear": 78.0, av.SCRATCH: 60.0}
    res = {r: {"accuracy": claims.stat([a, a + 1, a - 1]), "flops": 1e6} for r, a in accs.items()}
    ids = [f.claim_id for f in av._findings(res, p["not_tested"])]
    assert "cbsa-f9-no-contraction" not in ids and {"cbsa-f9-linear", "adapt-beats-scratch"} <= set(ids)


def test_unknown_row_is_named():
    p = dict(BUDGETS["smoke"][av.KEY], rows=["cbsa", "mega"])
    with pytest.raises(ValueError, match=r"unknown adapt-vision row 'mega'; valid: \["):
        av.plan_steps(p, 0)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("adapt_vision") / "run"
    threads = torch.get_num_threads()
    try:
        argv = ["--budget", "smoke", "--only", "adapt-vision", "--out", str(out), "--no-progress", "--threads", "1"]
        rc = main(argv)
    finally:
        torch.set_num_threads(threads)
    assert rc == 0
    return out


@pytest.mark.slow
def test_smoke_section_runs_and_reports(smoke_run):
    text = (smoke_run / "report.md").read_text()
    assert f"## {av.TITLE}" in text
    assert "| row | description | params | forward MFLOPs / image |" in text
    assert text.count("dated pilot: a smoke note") == 1  # the plan's claim note, under cbsa-f9-linear's finding
    assert (smoke_run / "plots" / "adapt_vision.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    res = json.loads((smoke_run / "results.json").read_text())
    sec = res["sections"][av.KEY]
    rows = sec["data"]["rows"]
    assert set(rows) == set(av.rows_of(BUDGETS["smoke"][av.KEY]))
    for r in rows.values():
        assert r["seeds"] == 2 and len(r["accuracy_per_seed"]) == 2
        assert all(0.0 <= a <= 100.0 for a in r["accuracy_per_seed"])
        assert r["forward_flops_per_image"] > 0 and r["ms_per_step"] > 0 and r["params"] > 0
    # TSSA's single projection U replaces q/k/v: fewer parameters than the inherited-projection rows
    assert rows["tssa"]["params"] < rows["linear"]["params"] == rows["original"]["params"]
    arch = BUDGETS["smoke"][av.KEY]["arch"]
    assert rows["cbsa"]["params"] == rows["original"]["params"] + arch["depth"] * arch["heads"]  # kappa is new
    assert len(sec["data"]["teacher"]["val_curve"]) >= 2
    findings = sec["findings"]
    assert [f["kind"] for f in findings] == ["paper", "paper", "check", "check", "check"]
    attention = findings.pop()  # the task's attention check, trained from scratch beside the adaptation
    assert (attention["a_name"], attention["b_name"]) == (av.CONTROL_TWIN, av.CONTROL)
    assert len(attention["values_a"]) == len(attention["values_b"]) == 2
    flops = findings.pop()
    assert flops["measurement"] and flops["verdict"] in ("agrees", "disagrees") and "x)" in flops["measured"]
    for f in findings:
        for k in FINDING_FIELDS + COMPARISON_FIELDS:
            assert k in f, k
        assert len(f["values_a"]) == len(f["values_b"]) == 2
        assert math.isclose(f["effect"], sum(f["values_a"]) / 2 - sum(f["values_b"]) / 2, abs_tol=1e-9)
    assert findings[0]["claim_type"] == "non-inferiority" and findings[0]["margin"] == 1.5
    assert "Table 4" in findings[0]["margin_source"]
    assert [f["claim_type"] for f in findings[1:]] == ["superiority", "superiority"]
    assert "plateau" in sec["data"]


def _records(accs: dict[str, list[float]]) -> dict:
    recs = {av.TEACHER: {"result": {"accuracy": 0.8, "params": 1, "curve": [[1, 2.0]], "val_curve": [[1, 0.8]]}}}
    for row, values in accs.items():
        for s, a in enumerate(values):
            recs[f"{av.KEY}/{row}/seed{s}"] = {
                "result": {
                    "accuracy": a,
                    "swapped_accuracy": 0.1,
                    "params": 100,
                    "flops": 1000,
                    "ms_per_step": 1.0,
                }
            }
    return recs


def _summary(tmp_path, accs):
    p = dict(BUDGETS["default"][av.KEY])
    return av.summarize(_records(accs), p, tmp_path, lambda x: str(x))


def test_verdicts_follow_the_welch_rule(tmp_path):
    accs = {
        "original": [0.801, 0.799, 0.800],
        "cbsa": [0.700, 0.702, 0.698],  # 1 pt under linear: within the 1.5 pt margin
        "cbsa-no-contraction": [0.75, 0.752, 0.748],  # above linear
        "linear": [0.71, 0.712, 0.708],
        "tssa": [0.6, 0.61, 0.62],
        "fastmax": [0.7, 0.71, 0.72],
        av.SCRATCH: [0.3, 0.31, 0.29],
    }
    sec = _summary(tmp_path, accs)
    # the paper comparisons are gated as not tuned (one fine-tuning rate): the rule's verdict is ungated_verdict
    v = {
        f["a_name"] + " vs " + f["b_name"]: f.get("ungated_verdict", f["verdict"])
        for f in sec.findings
        if f.get("claim_type")
    }
    assert all(
        f["verdict"] == "inconclusive" and "not tuned" in f["gate"] for f in sec.findings if f["kind"] == "paper"
    )
    assert v == {
        "cbsa vs linear": "agrees",
        "cbsa-no-contraction vs linear": "agrees",
        f"cbsa vs {av.SCRATCH}": "agrees",
    }
    assert sec.data["plateau"]["teacher"]["plateaued"]
    # linear (the claims' baseline) has no run at twice its fine-tuning steps: its plateau is not shown
    assert not sec.data["plateau"]["linear"]["plateaued"]
    assert all("plateau" in f["gate_reasons"] for f in sec.findings if f["kind"] == "paper")
    # CBSA 3 pts under linear (beyond the margin) and Agent Attention under linear: both disagree
    accs["cbsa"] = [0.68, 0.682, 0.678]
    accs["cbsa-no-contraction"] = [0.69, 0.692, 0.688]
    v = {
        (f["a_name"], f["b_name"]): f.get("ungated_verdict", f["verdict"])
        for f in _summary(tmp_path, accs).findings
        if f.get("claim_type")
    }
    assert v[("cbsa", "linear")] == "disagrees" and v[("cbsa-no-contraction", "linear")] == "disagrees"


def test_the_sweep_table_and_its_gate(tmp_path):
    """With a fine-tuning rate sweep each row's comparisons are gated only if its best rate is not shown tuned:
    linear's best on the top end of the grid (well beyond one seed std) gates the two claims against it."""
    accs = {
        "original": [0.801, 0.799, 0.800],
        "cbsa": [0.700, 0.702, 0.698],
        "cbsa-no-contraction": [0.75, 0.752, 0.748],
        "linear": [0.71, 0.712, 0.708],
        "tssa": [0.6, 0.61, 0.62],
        "fastmax": [0.7, 0.71, 0.72],
        av.SCRATCH: [0.3, 0.31, 0.29],
    }
    lrs = [1e-4, 3e-4, 1e-3]
    recs = _records(accs)
    for row in accs:
        for lr, a in zip(lrs, [0.5, 0.7, 0.6] if row != "linear" else [0.5, 0.6, 0.7], strict=True):
            recs[f"{av.KEY}/{row}/lr-sweep/lr{lr:g}"] = {"result": {"accuracy": a}}
    p = dict(BUDGETS["default"][av.KEY], finetune_lr_sweep=lrs)
    sec = av.summarize(recs, p, tmp_path, lambda x: str(x))
    table = next(t for t in sec.tables if t.title.startswith("Learning-rate sweep"))
    assert len(table.rows) == len(accs) and "**70**" in table.rows[0]
    paper = [f for f in sec.findings if f["kind"] == "paper"]
    assert len(paper) == 2 and all(f["b_name"] == "linear" and f["verdict"] == "inconclusive" for f in paper)
    assert all("linear's best swept learning rate 0.001 is the highest" in f["gate"] for f in paper)
    scratch = next(f for f in sec.findings if f.get("b_name") == av.SCRATCH)
    assert scratch["verdict"] == "agrees" and "gate" not in scratch
    # with linear's best inside the grid nothing is gated on tuning
    for lr, a in zip(lrs, [0.5, 0.7, 0.6], strict=True):
        recs[f"{av.KEY}/linear/lr-sweep/lr{lr:g}"] = {"result": {"accuracy": a}}
    sec = av.summarize(recs, p, tmp_path, lambda x: str(x))
    assert not any("not tuned" in f.get("gate_reasons", []) for f in sec.findings)
    assert "each row at the best rate of its sweep over 0.0001, 0.0003, 0.001" in sec.intro


def test_unplateaued_teacher_gates_the_paper_findings(tmp_path):
    accs = {
        "original": [0.90, 0.91, 0.92],  # fine-tuning moved the 80% teacher by 11 pts: it had not plateaued
        "cbsa": [0.700, 0.702, 0.698],
        "cbsa-no-contraction": [0.75, 0.752, 0.748],
        "linear": [0.71, 0.712, 0.708],
        av.SCRATCH: [0.3, 0.31, 0.29],
    }
    sec = _summary(tmp_path, accs)
    assert not sec.data["plateau"]["teacher"]["plateaued"]
    paper = [f for f in sec.findings if f["kind"] == "paper"]
    assert all(f["verdict"] == "inconclusive" and f["ungated_verdict"] == "agrees" for f in paper)
    assert next(f for f in sec.findings if f["kind"] == "check")["verdict"] == "agrees"


def test_flops_check_reads_the_ratio(tmp_path):
    accs = {"cbsa": [0.7, 0.71], "linear": [0.7, 0.71]}
    recs = _records(accs)
    f = av._findings({r: av._stats(recs, r) for r in accs})[-1]
    assert f["verdict"] == "agrees" and "(1.000x)" in f["measured"]
    for sid in recs:
        if "/cbsa/" in sid:
            recs[sid]["result"]["flops"] = 1200  # 1.2x linear's 1000
    f = av._findings({r: av._stats(recs, r) for r in accs})[-1]
    assert f["verdict"] == "disagrees" and "(1.200x)" in f["measured"]


def test_unlearned_teacher_reports_no_comparison(tmp_path):
    recs = _records({"cbsa": [0.1, 0.1], "linear": [0.1, 0.1]})
    recs[av.TEACHER]["result"]["accuracy"] = 0.12
    sec = av.summarize(recs, dict(BUDGETS["default"][av.KEY]), tmp_path, str)
    assert not sec.findings and "not 10 points above it" in sec.notes[0]


def test_flops_count_the_softmax_attention():
    """The CPU's fused SDPA kernel has no FLOP formula: the count must still hold softmax's two N x N products."""
    from torch.utils.flop_counter import FlopCounterMode

    from attnzoo.models import create_model

    torch.manual_seed(0)
    dim, depth, n = 16, 2, 1 + 4 * 4
    vit = create_model("vit_s", dim=dim, depth=depth, heads=2, patch_size=2, image_size=8, in_chans=1).eval()
    image = torch.randn(1, 1, 8, 8)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        vit(image)
    without_attention = counter.get_total_flops()
    assert av.forward_flops(vit, image) - without_attention == depth * 2 * (2 * n * n * dim)


def test_the_baseline_plateau_run_is_read(tmp_path):
    # linear fine-tuned twice the steps: moving 0.02 pts it has plateaued for these claims; moving 5 pts it has not
    accs = {
        "original": [0.801, 0.800, 0.802],
        "cbsa": [0.700, 0.702, 0.698],
        "cbsa-no-contraction": [0.75, 0.752, 0.748],
        "linear": [0.71, 0.712, 0.708],
        av.PLATEAU: [0.7102, 0.7122, 0.7082],
    }
    sec = _summary(tmp_path, accs)
    own = sec.data["plateau"]["linear"]
    assert own["plateaued"] and own["change"] == pytest.approx(0.02, abs=1e-6)
    accs[av.PLATEAU] = [0.76, 0.762, 0.758]
    own = _summary(tmp_path, accs).data["plateau"]["linear"]
    assert not own["plateaued"] and own["change"] == pytest.approx(5.0, abs=1e-6)


def _planned(plan_: dict) -> dict[str, object]:
    return {s.id: s for s in av.plan_steps(plan_, 0)}


def test_compared_rows_at_twice_the_steps_are_planned_on_every_seed_at_their_own_rate():
    p = dict(LONG_PLAN, compared_2x=["cbsa"])
    steps, lrs = _planned(p), p["finetune_lr_sweep"]
    twice = sorted(i for i in steps if i.startswith(f"{av.KEY}/cbsa@2x-steps/"))
    assert twice == [f"{av.KEY}/cbsa@2x-steps/seed{s}" for s in range(p["seeds"])]
    for i in twice:
        cfg = steps[i].config
        assert cfg["finetune"]["steps"] == 2 * p["finetune"]["steps"] and cfg["mechanism"] == "cbsa-qkv"
        assert steps[i].deps == (av.TEACHER, *(f"{av.KEY}/cbsa/lr-sweep/lr{lr:g}" for lr in lrs))
    assert not any(i.startswith(f"{av.KEY}/cbsa-no-contraction@2x-steps/") for i in steps)


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"compared_2x": ["linear"]}, r"compared_2x rows \['linear'\] are not compared rows"),
        ({"compared_2x": ["mega"]}, r"compared_2x rows \['mega'\] are not compared rows"),
        ({"compared_2x": ["cbsa"], "baseline_plateau": False}, "needs the baseline's own run at twice the steps"),
    ],
)
def test_a_bad_compared_2x_entry_is_refused_at_planning(over, message):
    with pytest.raises(ValueError, match=message):
        av.plan_steps(dict(LONG_PLAN, **over), 0)


@pytest.mark.parametrize("holds", [True, False])
def test_a_comparison_with_runs_at_twice_the_steps_is_judged_there_not_on_the_baselines_drift(tmp_path, holds):
    # cbsa within the margin of linear at both lengths, while linear alone moves more than the clearance
    accs = {
        "original": [0.801, 0.800, 0.802],
        "cbsa": [0.710, 0.712, 0.708],
        "cbsa-no-contraction": [0.75, 0.752, 0.748],
        "linear": [0.71, 0.712, 0.708],
        av.PLATEAU: [0.76, 0.762, 0.758],
        "cbsa@2x-steps": [0.76, 0.762, 0.758] if holds else [0.70, 0.702, 0.698],
    }
    p = dict(BUDGETS["default"][av.KEY], compared_2x=["cbsa"], baseline_plateau=True)
    sec = av.summarize(_records(accs), p, tmp_path, lambda x: str(x))
    f = next(f for f in sec.findings if f.claim_id == "cbsa-f9-linear")
    # (no fine-tuning sweep here: every comparison is also held back as not tuned; the plateau gate is the one read)
    assert f.ungated_verdict == "agrees" and f.replicated_2x is not None
    assert f.replicated_2x["effect"] == pytest.approx(0.0 if holds else -6.0, abs=1e-6)
    assert ("plateau" in f.gate_reasons) is not holds
    # without its own longer runs the same comparison is held back by linear's move
    del accs["cbsa@2x-steps"]
    f = next(f for f in av.summarize(_records(accs), p, tmp_path, str).findings if f.claim_id == "cbsa-f9-linear")
    assert f.replicated_2x is None and "plateau" in f.gate_reasons and "linear moved +5" in f.gate


CONTROL_PLAN = {"seeds": 3, "lr_sweep": [1.0e-3, 3.0e-3, 1.0e-2]}


def test_the_attention_control_rows_are_planned_from_scratch_mean_pooled_at_their_own_rate():
    p = dict(LONG_PLAN, attention_control=CONTROL_PLAN)
    steps = _planned(p)
    assert not any(i.startswith(f"{av.KEY}/vit-mean") for i in _planned(BUDGETS["default"][av.KEY]))
    for row, mech in av.CONTROL_ROWS.items():
        sweep = [f"{av.KEY}/{row}/lr-sweep/lr{lr:g}" for lr in CONTROL_PLAN["lr_sweep"]]
        seeds = sorted(i for i in steps if i.startswith(f"{av.KEY}/{row}/seed"))
        assert seeds == [f"{av.KEY}/{row}/seed{s}" for s in range(3)]
        for i in sweep + seeds:
            train = steps[i].config["train"]
            # the teacher's shape and recipe, but from scratch (no teacher dependency) and mean-pooled
            assert train["model_options"] == dict(p["arch"], attention=mech, pool="mean")
            assert train["steps"] == p["pretrain"]["steps"] and av.TEACHER not in steps[i].deps
        assert [steps[i].config["train"]["seed"] for i in sweep] == [SWEEP_SEED_OFFSET] * 3
        assert all(steps[i].config["train"]["lr"] == "tuned" and steps[i].deps == tuple(sweep) for i in seeds)


@pytest.mark.parametrize(
    "bad", [{"seeds": 1, "lr_sweep": [1.0e-3]}, {"seeds": 3, "lr_sweep": 1.0e-3}, {"seeds": 3}, "4 seeds"]
)
def test_a_malformed_attention_control_is_refused_at_planning(bad):
    with pytest.raises(ValueError, match="attention_control must give 'seeds'"):
        av.plan_steps(dict(LONG_PLAN, attention_control=bad), 0)


def _control_records(twin: list[float], control: list[float], best: int = 1) -> dict:
    recs = {}
    for row, values in ((av.CONTROL_TWIN, twin), (av.CONTROL, control)):
        for s, a in enumerate(values):
            recs[f"{av.KEY}/{row}/seed{s}"] = {"result": {"accuracy": a, "params": 100}}
        for j, lr in enumerate(CONTROL_PLAN["lr_sweep"]):
            acc = values[0] - (0.0 if j == best else 0.05)
            recs[f"{av.KEY}/{row}/lr-sweep/lr{lr:g}"] = {"result": {"accuracy": acc}}
    return recs


@pytest.mark.parametrize(
    ("control", "best", "gated"),
    [
        ([0.60, 0.61, 0.59], 1, False),  # 20 points behind the mean-pooled ViT: outside the 1.5-point margin
        ([0.795, 0.80, 0.805], 1, True),  # level with it: the margin admits no attention at all
        ([0.60, 0.61, 0.59], 0, True),  # far behind, but at the end of its grid: tuned, it might not be
    ],
)
def test_the_attention_control_gates_the_non_inferiority_claim_only(tmp_path, control, best, gated):
    accs = {"original": [0.8, 0.81, 0.8], "cbsa": [0.7, 0.71, 0.7], "cbsa-no-contraction": [0.75, 0.76, 0.75]}
    accs["linear"] = [0.7, 0.71, 0.705]
    recs = _records(accs) | _control_records([0.80, 0.81, 0.79], control, best)
    p = dict(BUDGETS["default"][av.KEY], attention_control=CONTROL_PLAN)
    sec = av.summarize(recs, p, tmp_path, str)
    f = {f.claim_id: f for f in sec.findings}
    assert f["cbsa-f9-linear"].ungated_verdict == "agrees"
    assert ("control" in f["cbsa-f9-linear"].gate_reasons) is gated
    assert "control" not in f["cbsa-f9-no-contraction"].gate_reasons  # superiority: margin 0
    check = f["adapt-attention-helps"]
    assert (check.a_name, check.b_name) == (av.CONTROL_TWIN, av.CONTROL)
    assert check.verdict == ("inconclusive" if control[0] > 0.7 else "agrees")
    assert any("the attention check, from scratch" in t.title for t in sec.tables)
    # without the control rows' records nothing is gated by them and no check is reported
    sec = av.summarize(_records(accs), p, tmp_path, str)
    assert "adapt-attention-helps" not in {f.claim_id for f in sec.findings}
