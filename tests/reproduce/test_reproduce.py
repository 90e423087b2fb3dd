"""``attnzoo reproduce``: the smoke budget end to end (report structure, results.json, resume, determinism),
plan validation for every budget, the claim verdict rules and bad-argument errors."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from attnzoo.compare.claims import VERDICTS, compare, verdict_from_ci
from attnzoo.compare.common import SWEEP_SEED_OFFSET
from attnzoo.compare.pipeline import judged
from attnzoo.compare.store import Step, StepStore
from attnzoo.reproduce import BUDGETS, SECTIONS, ReproduceError, main, plan, run
from attnzoo.reproduce.report import CONFIGS_FILE, FINDING_COLUMNS

HEADINGS = {
    "vision": "## Vision: image classification",
    "long-range": "## Long-range: LRA-style suite",
    "language": "## Language: character-level Shakespeare",
    "icl": "## In-context learning: linear and sparse-linear regression",
    "efficiency": "## Efficiency: time and memory vs sequence length",
    "probes": "## White-box probes",
}

#: header row prefixes every smoke report must contain (the tables' expected columns)
TABLE_HEADERS = [
    "| model | mechanism | architecture | params | val acc % | train img/s | peak train-step MiB |",
    "| mechanism | listops | image | avg (learned) |",
    "| mechanism | listops steps/s | listops MiB | image steps/s | image MiB |",
    "| model | mechanism | description | params | val loss (nats) | val bits/char | train tokens/s |",
    "| model | ms/token @ 8 | ms/token @ 32 | state KiB @ 8 | state KiB @ 32 |",
    "| predictor | k=1 |",
    "| mechanism | N=64 | N=256 |",
    "| layer | SNR, φ=threshold, η=0.1 | SNR, φ=softmax, η=0.1 | SNR, φ=threshold, η=0.02 | SNR, φ=softmax, η=0.02 |",
    "| " + " | ".join(FINDING_COLUMNS) + " |",
    "| claim (paper) | statement | paper's figure | test: effect [95% CI] (margin) | verdict [notes] | section |",
    "| section | compared rows, measurements | lr sweeps | ablations, plateau runs | total |",
]


def _results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


@pytest.mark.slow
def test_report_has_every_section_table_and_plot(smoke):
    text = (smoke / "report.md").read_text()
    for h in [*HEADINGS.values(), "## Summary", "## Compute", "## Provenance"]:
        assert re.search(rf"^{re.escape(h)}$", text, re.M), f"missing heading {h!r}"
    # the summary comes first; the configuration appendix is a file of its own, linked
    assert text.index("## Summary") < min(text.index(h) for h in HEADINGS.values())
    # the first screen states the scale of the runs against the papers', one line per trained section
    summary = text[text.index("## Summary") : min(text.index(h) for h in HEADINGS.values())]
    assert "**Scale**" in summary
    for line in (
        "- Vision: here digits",
        "- Language: here character-level Shakespeare",
        "- In-context learning: here d=",
    ):
        assert line in summary, line
    assert "the papers: ImageNet-1k at 224x224" in summary
    assert f"]({CONFIGS_FILE})" in text and "<details>" not in text
    for header in TABLE_HEADERS:
        assert header in text, f"missing table with columns {header!r}"
    assert "SMOKE RUN" in text
    # a task a budget leaves out is named with the reason, not silently missing
    assert re.search(r"Not run at this budget[^:\n]*: [^\n]*text — smoke: the pipeline, not the papers", text)
    refs = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(refs) >= 6
    for ref in refs:
        png = smoke / ref
        assert png.is_file(), ref
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", ref
    on_disk = {p.relative_to(smoke).as_posix() for p in (smoke / "plots").glob("*.png")}
    assert on_disk == set(refs), "every plot is referenced exactly by the report"
    # every step's exact config appears in the configuration file
    configs = (smoke / CONFIGS_FILE).read_text()
    assert "| step | config hash | wall s | finished |" in configs
    _, steps = plan("smoke", 0)
    for s in steps:
        assert f"<code>{s.id}</code>" in configs


@pytest.mark.slow
def test_results_json_holds_every_number(smoke):
    res = _results(smoke)
    assert set(res) == {"meta", "claims", "sections", "steps", "failed"}
    ids = [c["id"] for c in res["claims"]]
    assert len(ids) == len(set(ids)) and res["meta"]["finding_schema"] == 2
    assert res["failed"] == {}
    assert res["meta"]["budget"] == "smoke" and res["meta"]["seed"] == 0
    assert {"cpu", "threads", "torch"} <= set(res["meta"]["machine"])
    # the smoke fixture computed every step in one process of --threads 1
    assert res["meta"]["workers"] == [{"jobs": 1, "threads": 1, "steps": len(plan("smoke", 0)[1])}]
    assert "| workers | 1 job x 1 thread |" in (smoke / "report.md").read_text()
    assert list(res["sections"]) == list(SECTIONS)
    for key, sec in res["sections"].items():
        assert sec["tables"], key
        for f in sec["findings"]:
            assert f["verdict"] in VERDICTS
    _, steps = plan("smoke", 0)
    assert set(res["steps"]) == {s.id for s in steps}
    vis = res["sections"]["vision"]["data"]["models"]
    plan_v = BUDGETS["smoke"]["vision"]
    # the no-attention controls (the ViT's, ToST's skeleton's), ToST at ViT's parameter count
    controls = {"vit+identity", "xcit+identity", "tost@matched-params"}
    assert set(vis) == set(plan_v["models"]) | set(plan_v["swaps"]) | {"vit@2x-steps"} | controls
    extra = plan_v["extra_seeds"]
    for name, m in vis.items():
        # a row of the plan's extra_seeds reports every seed it has (the section's and the extra ones)
        n = plan_v["seeds"] + (extra["seeds"] if name in extra["rows"] else 0)
        assert m["seeds"] == len(m["accuracy_per_seed"]) == n
        assert m["accuracy_mean"] == pytest.approx(sum(m["accuracy_per_seed"]) / n)
        assert 0.0 <= m["accuracy_mean"] <= 100.0 and m["params"] > 0 and m["samples_per_s"] > 0
    n_comparisons = 0
    for sec in res["sections"].values():
        for f in sec["findings"]:
            assert isinstance(f["seeds"], int) and isinstance(f["explanation"], str)
            assert f["kind"] in ("paper", "check")
            if f.get("claim_type"):  # a trained comparison: its verdict follows from its own fields
                n_comparisons += 1
                _check_comparison_fields(f)
    assert n_comparisons >= 4
    lra = res["sections"]["long-range"]["data"]
    assert set(lra["majority"]) == set(BUDGETS["smoke"]["long-range"]["tasks"])
    assert all(10.0 <= v <= 100.0 for v in lra["majority"].values())  # 10 classes at most: majority >= 10%
    lm = res["sections"]["language"]["data"]["models"]
    for m in lm.values():
        assert m["val_bpc_mean"] == pytest.approx(m["val_loss_mean"] / torch.log(torch.tensor(2.0)).item())
    # the baseline references of the ICL section: least squares is exact once k >= d (noiseless data)
    curves = res["sections"]["icl"]["data"]["curves"]["linear"]
    d = BUDGETS["smoke"]["icl"]["tasks"]["linear"]["dim"]
    assert max(curves["least_squares"][d + 1 :]) < 1e-8
    assert curves["lasso"][-1] < curves["zero"][-1]


def _check_comparison_fields(f: dict) -> None:
    """Recompute a comparison's effect, CI and verdict from its per-seed values (scipy's Welch interval)."""
    from scipy import stats

    a, b = f["values_a"], f["values_b"]
    sign = -1.0 if f["lower_is_better"] else 1.0
    assert f["effect"] == pytest.approx(sign * (sum(a) / len(a) - sum(b) / len(b)), abs=1e-12)
    if len(a) >= 2 and len(b) >= 2 and (max(a) > min(a) or max(b) > min(b)):
        ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
        lo, hi = sorted((sign * ci.low, sign * ci.high))
        assert f["ci95"] == pytest.approx([lo, hi], rel=1e-9, abs=1e-9)
    elif len(a) < 2 or len(b) < 2:
        assert f["ci95"] is None
    expected = verdict_from_ci(f["ci95"], f["margin"], f.get("refute_below"))  # half the paper's own effect refutes
    if f.get("gate"):
        assert f["verdict"] == "inconclusive" and f.get("ungated_verdict", "inconclusive") == expected
    else:
        assert f["verdict"] == expected


@pytest.mark.slow
def test_rerun_skips_completed_steps_and_keeps_numbers(smoke):
    before = _results(smoke)["steps"]
    mtimes = {p: p.stat().st_mtime_ns for p in (smoke / "steps").rglob("*.json")}
    outcome = run(smoke, "smoke", seed=0, progress=False)
    assert outcome.computed == [] and outcome.failed == {}
    assert len(outcome.skipped) == len(before)
    assert outcome.wall_s < 30  # only the report is rebuilt
    assert {p: p.stat().st_mtime_ns for p in (smoke / "steps").rglob("*.json")} == mtimes
    after = _results(smoke)["steps"]
    assert {k: v["result"] for k, v in after.items()} == {k: v["result"] for k, v in before.items()}


@pytest.mark.slow
def test_interrupted_run_continues_and_same_seed_gives_same_numbers(smoke, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(smoke, out)
    before = _results(out)["steps"]
    # a step whose training finished but whose record was never written, and a step lost entirely
    (out / "steps" / "vision" / "vit" / "seed1.json").unlink()
    (out / "steps" / "icl" / "linear" / "aot" / "seed0.json").unlink()
    shutil.rmtree(out / "runs" / "icl" / "linear" / "aot" / "seed0")
    outcome = run(out, "smoke", seed=0, progress=False, only="vision,icl", threads=1)
    assert sorted(outcome.computed) == ["icl/linear/aot/seed0", "vision/vit/seed1"]
    after = _results(out)["steps"]
    # retrained from scratch with the same seed: identical numbers
    a, v = "icl/linear/aot/seed0", "vision/vit/seed1"
    assert after[a]["result"]["error_per_position"] == before[a]["result"]["error_per_position"]
    assert after[v]["result"]["accuracy"] == before[v]["result"]["accuracy"]
    # sections not selected this time are still reported, since their steps are complete
    assert list(_results(out)["sections"]) == list(SECTIONS)


def test_store_recomputes_when_the_config_changes(tmp_path):
    store = StepStore(tmp_path)
    s1 = Step("sec/a", "sec", {"x": 1}, lambda ctx, step: {"y": 2})
    store.save(s1, {"y": 2}, 0.1, 0.0)
    assert store.load(s1)["result"] == {"y": 2}
    s2 = Step("sec/a", "sec", {"x": 2}, lambda ctx, step: {"y": 3})
    assert store.load(s2) is None
    assert not list(tmp_path.rglob("*.tmp")), "writes are atomic (no temporary files left)"


@pytest.mark.parametrize("budget", sorted(BUDGETS))
def test_every_budget_plans_valid_runs(budget):
    """Every training step's config passes the trainer's validation and builds a valid model config."""
    from attnzoo.models import get_config
    from attnzoo.train.config import from_dict

    b, steps = plan(budget, 3)
    # a section whose plan names no models runs nothing (default leaves segmentation to long)
    # a section without models plans nothing, except in-context learning's reference predictors on its tasks
    # (adapt-vision's rows play its models' part)
    empty = {k for k in SECTIONS if b[k].get("models", b[k].get("rows")) == [] and not b[k].get("tasks")}
    assert {s.section for s in steps} == set(SECTIONS) - empty
    trains = [s for s in steps if "train" in s.config]
    assert trains
    by_id = {s.id: s for s in steps}
    for s in trains:
        train = dict(s.config["train"])
        if train["lr"] == "tuned":  # trains at the best rate of its row's sweep: every rate of it is a step before it
            ids = s.config["sweep"]["ids"]
            assert set(s.deps) == set(ids.values()) and all(
                by_id[d].config["train"]["lr"] == float(lr) for lr, d in ids.items()
            )
            assert all(list(by_id).index(d) < list(by_id).index(s.id) for d in s.deps)
            train["lr"] = float(next(iter(ids)))
        cfg = from_dict(train).validate()
        if "/seed" in s.id:  # a seeded comparison: seeds 3, 4, ... of its section
            n = b[s.section].get("seeds", 1)
            extra = b[s.section].get("extra_seeds", {})
            if s.section == "long-range" and s.id.split("/")[2] in extra.get("rows", []):
                n += extra["seeds"]  # ListOps' extra seeds are seeds of the row (every reading uses them)
            assert 3 <= cfg.seed < 3 + n and s.id.endswith(f"/seed{cfg.seed}")
        elif "/extra-seed" in s.id:  # an extra-seeds ablation: the seeds after the section's
            assert cfg.seed >= 3 + b[s.section].get("seeds", 1) and s.id.endswith(f"/extra-seed{cfg.seed}")
        elif "/lr-sweep/" in s.id:  # a learning-rate sweep: a seed of its own, apart from the reported ones
            assert cfg.seed == 3 + SWEEP_SEED_OFFSET and s.id.endswith(f"/lr{cfg.lr:g}")
            extra = [x for rates in b[s.section].get("lr_sweep_extra", {}).values() for x in rates]
            if s.id.startswith("segmentation/decoders/"):  # the decoders sweep a grid of their own
                grid = b[s.section]["decoders"]["lr_sweep"]
            elif s.section == "adapt-vision":  # so does adapt-vision's attention check (from scratch)
                grid = b[s.section]["attention_control"]["lr_sweep"]
            else:
                grid = b[s.section]["lr_sweep"] + extra
            assert cfg.lr in grid
        else:
            assert cfg.seed == 3
        get_config(cfg.model, **cfg.resolved_model_options())  # raises on an invalid architecture
    if budget == "long":  # every trained comparison rests on >= 3 seeds
        assert all(b[k]["seeds"] >= 3 for k in ("vision", "long-range", "language", "icl"))
        # every LRA task it does not run is listed with the reason (the report prints them)
        lra = b["long-range"]
        assert set(lra["tasks"]) | set(lra["left_out"]) == {"listops", "text", "retrieval", "image", "pathfinder"}
        assert all(len(why) > 40 for why in lra["left_out"].values())
    ids = [s.id for s in steps]
    assert all(d in ids and ids.index(d) < ids.index(s.id) for s in steps for d in s.deps)


def test_plan_seeds_per_task_and_longer_ablations():
    """``task_seeds`` overrides a task's seed count (for its comparisons and ablations alike); the ``aot@Nx-steps``
    ablations train N times the section's steps and warm-up, everything else equal."""
    from collections import Counter

    b, steps = plan("default", 0)  # long trains no ListOps row
    lra = b["long-range"]
    counts = Counter(s.id.rsplit("/", 1)[0] for s in steps if s.id.startswith("long-range/") and "/seed" in s.id)
    for task in lra["tasks"]:
        n = lra.get("task_seeds", {}).get(task, lra["seeds"])
        rows = [k for k in counts if k.split("/")[1] == task]
        more = lra.get("extra_seeds", {})
        want = {k: n + (more["seeds"] if k.split("/")[2] in more.get("rows", []) else 0) for k in rows}
        assert rows and all(counts[k] == want[k] for k in rows), (task, want, counts)
    # the in-context baseline's plateau run, planned by the budget that has one (`long` leaves it out)
    b, steps = plan("smoke", 0)
    assert "gpt@2x-steps" in b["icl"]["ablations"]
    icl = {s.id: s.config["train"] for s in steps if s.id.startswith("icl/") and "train" in s.config}
    for task in b["icl"]["ablation_tasks"]:
        # the baseline's plateau run: twice the steps and warm-up, everything else (the tuned rate too) equal, on
        # `plateau_seeds` seeds
        base, longer = icl[f"icl/{task}/gpt/seed0"], icl[f"icl/{task}/gpt@2x-steps/seed0"]
        assert longer["steps"] == 2 * base["steps"] and longer["warmup_steps"] == 2 * base["warmup_steps"]
        assert {**longer, "steps": 0, "warmup_steps": 0} == {**base, "steps": 0, "warmup_steps": 0}
        n = b["icl"].get("plateau_seeds", b["icl"].get("seeds", 1))
        assert f"icl/{task}/gpt@2x-steps/seed{n - 1}" in icl and f"icl/{task}/gpt@2x-steps/seed{n}" not in icl


#: (a per seed, b per seed, claim type, margin, lower_is_better, expected verdict): the rule's edges with known numbers.
#: With sd 1 on both sides and 3 seeds each: se = sqrt(2/3) = 0.816, Welch df = 4, t_0.975,4 = 2.776, half-width 2.267.
VERDICT_TABLE = [
    # one seed: no interval, never decided either way
    ([81.0], [80.0], "superiority", 0.0, False, "inconclusive"),
    ([70.0], [80.0], "superiority", 0.0, False, "inconclusive"),
    ([80.0], [81.5], "non-inferiority", 2.0, False, "inconclusive"),
    # superiority: the whole CI above 0 agrees, the whole CI below 0 disagrees (the same evidence either way)
    ([82.3, 83.3, 84.3], [79.0, 80.0, 81.0], "superiority", 0.0, False, "agrees"),  # effect 3.3 > 2.267
    ([81.2, 82.2, 83.2], [79.0, 80.0, 81.0], "superiority", 0.0, False, "inconclusive"),  # 2.2 < 2.267
    ([75.7, 76.7, 77.7], [79.0, 80.0, 81.0], "superiority", 0.0, False, "disagrees"),  # -3.3
    ([76.8, 77.8, 78.8], [79.0, 80.0, 81.0], "superiority", 0.0, False, "inconclusive"),  # -2.2
    # non-inferiority, margin 2: agrees when the CI lies above -2, disagrees when below -2
    ([79.3, 80.3, 81.3], [79.0, 80.0, 81.0], "non-inferiority", 2.0, False, "agrees"),  # CI [-1.97, 2.57]
    ([78.7, 79.7, 80.7], [79.0, 80.0, 81.0], "non-inferiority", 2.0, False, "inconclusive"),  # CI [-2.57, 1.97]
    ([73.7, 74.7, 75.7], [79.0, 80.0, 81.0], "non-inferiority", 2.0, False, "disagrees"),  # CI [-7.57, -3.03]
    # lower is better (losses): a's loss 3.3 above b's with sd 1
    ([4.3, 5.3, 6.3], [1.0, 2.0, 3.0], "superiority", 0.0, True, "disagrees"),
    ([-2.3, -1.3, -0.3], [1.0, 2.0, 3.0], "superiority", 0.0, True, "agrees"),
    # a huge spread decides nothing
    ([60.0, 80.0, 100.0], [85.0, 86.0, 87.0], "superiority", 0.0, False, "inconclusive"),
]


@pytest.mark.parametrize("a, b, claim_type, margin, lower, expected", VERDICT_TABLE)
def test_claim_rules(a, b, claim_type, margin, lower, expected):
    kw = dict(unit="pts", paper="P", claim="c", paper_value="v", a_name="a", b_name="b")
    src = "a paper's comparison" if margin else ""
    f = compare(a, b, claim_type=claim_type, margin=margin, margin_source=src, lower_is_better=lower, **kw)
    assert f["verdict"] == expected, f
    assert f["seeds"] == min(len(a), len(b)) and f["kind"] == "paper"
    assert f["values_a"] == a and f["values_b"] == b
    _check_comparison_fields(f)


def test_welch_interval_is_symmetric_in_the_evidence():
    """Swapping the sides of a superiority claim swaps agrees and disagrees and nothing else."""
    kw = dict(claim_type="superiority", unit="pts", paper="P", claim="c", paper_value="v", a_name="a", b_name="b")
    for a, b in [([82.3, 83.3, 84.3], [79.0, 80.0, 81.0]), ([81.2, 82.2, 83.2], [79.0, 80.0, 81.0])]:
        one, other = compare(a, b, **kw), compare(b, a, **kw)
        swap = {"agrees": "disagrees", "disagrees": "agrees", "inconclusive": "inconclusive"}
        assert other["verdict"] == swap[one["verdict"]]
        assert other["ci95"] == pytest.approx([-one["ci95"][1], -one["ci95"][0]])


def test_equal_seed_values_in_another_order_are_a_tie_not_a_rounding_residue():
    from attnzoo.compare.claims import stat, welch_ci
    from attnzoo.reproduce.report import effect_cell

    v = [36.9, 35.2, 28.4, 25.2]  # summed in reverse order their mean differs in the last bit
    assert stat(v).mean != stat(v[::-1]).mean
    effect, ci, _ = welch_ci(stat(v), stat(v[::-1]))
    assert effect == 0.0 and ci[0] == -ci[1]
    kw = dict(claim_type="non-inferiority", margin=2.6, margin_source="m", unit="pts", paper="P", claim="c")
    f = compare(v, v[::-1], paper_value="v", a_name="a", b_name="b", **kw)
    assert effect_cell(f).startswith("+0 pts [")
    # a difference tiny in absolute terms but large against the means is kept: the tie is relative to their scale
    assert welch_ci(stat([1e-12, 2e-12]), stat([0.0, 1e-12]))[0] == pytest.approx(1e-12)


def test_claim_rules_relative_and_errors():
    from attnzoo.compare.claims import Stat, stat

    kw = dict(unit="nats", paper="P", claim="c", paper_value="v", a_name="a", b_name="b", lower_is_better=True)
    ni = dict(claim_type="non-inferiority", margin=0.15, margin_source="paper", relative=True)
    # "at most 15% above": 2.2 vs 2.0 is +10% (agrees); 2.6 vs 2.0 is +30% with a tight spread (disagrees)
    assert compare([2.2, 2.21, 2.19], [2.0, 2.01, 1.99], **ni, **kw)["verdict"] == "agrees"
    assert compare([2.6, 2.61, 2.59], [2.0, 2.01, 1.99], **ni, **kw)["verdict"] == "disagrees"
    assert compare(None, 1.0, claim_type="superiority", **kw)["verdict"] == "not tested"
    with pytest.raises(ValueError, match="claim_type must be"):
        compare(1.0, 1.0, claim_type="better", **kw)
    with pytest.raises(ValueError, match="non-inferiority claim needs margin > 0 and the paper's comparison"):
        compare([1.0, 2.0], [1.0, 2.0], claim_type="non-inferiority", margin=0.1, **kw)
    with pytest.raises(ValueError, match="superiority claim has margin 0"):
        compare([1.0, 2.0], [1.0, 2.0], claim_type="superiority", margin=0.1, **kw)
    s = stat([1.0, 2.0, 3.0])
    assert s.mean == 2.0 and s.std == pytest.approx(1.0) and s.fmt(".1f") == "2.0 ± 1.0"
    assert stat([None, float("nan")]) is None and stat(5.0) == Stat((5.0,)) and stat(5.0).std is None


#: (gap before, gap after, noise, the word): known numbers for the explanations' vocabulary
CHANGE_WORDS = [
    (10.0, 9.5, 1.0, "stays"),
    (10.0, 5.0, 1.0, "shrinks"),
    (10.0, 0.5, 1.0, "is no longer distinguishable from zero"),
    (0.4, -1.0, 1.5, "stays"),  # no gap before: nothing closes
    (10.0, -5.0, 1.0, "reverses"),
    (5.0, 10.0, 1.0, "widens"),
    (25.4, 11.4, 3.0, "shrinks"),  # a gap more than halved, well beyond the noise, shrinks (not "stays")
    (25.4, 11.4, 15.9, "is no longer distinguishable from zero"),  # ... and with its real interval (±15.9)
]


@pytest.mark.parametrize("before, after, noise, word", CHANGE_WORDS)
def test_explanation_words_follow_the_numbers(before, after, noise, word):
    from attnzoo.compare.claims import change_word

    assert change_word(before, after, noise=noise) == word
    with pytest.raises(ValueError, match="noise >= 0"):
        change_word(before, after, noise=-1.0)


def test_plateau_gate_makes_comparisons_inconclusive_and_keeps_the_numbers_verdict():
    from attnzoo.compare.claims import plateau_gate, stat

    kw = dict(claim_type="superiority", unit="pts", paper="P", claim="c", paper_value="v", a_name="a", b_name="b")
    base, f = stat([79.0, 80.0, 81.0]), compare([82.3, 83.3, 84.3], [79.0, 80.0, 81.0], **kw)
    assert f["verdict"] == "agrees"
    lo = f["ci95"][0]  # effect 3.3, CI half-width 2.27 (Welch df 4): clears 0 by 1.03
    assert lo == pytest.approx(1.03, abs=0.01)
    # twice the steps moves the baseline by 0.5 < 1.03: the verdict stands, plateaued
    info = plateau_gate([f], "b", base, stat([79.5, 80.5, 81.5]), "pts")
    assert info["plateaued"] and f["verdict"] == "agrees" and "gate" not in f
    assert info["smallest_effect"] == pytest.approx(lo) and info["standing"] == 1 and info["gated"] == 0
    # by 5: the verdict becomes inconclusive and the numbers' verdict is kept
    info = plateau_gate([f], "b", base, stat([84.0, 85.0, 86.0]), "pts")
    assert not info["plateaued"] and f["verdict"] == "inconclusive" and f["ungated_verdict"] == "agrees"
    g = compare([82.3, 83.3, 84.3], [79.0, 80.0, 81.0], **kw)
    assert not plateau_gate([g], "b", base, None, "pts")["plateaued"] and g["verdict"] == "inconclusive"


def test_plateau_gate_keeps_the_verdicts_that_clear_the_drift_on_either_side():
    from attnzoo.compare.claims import plateau_gate, stat

    kw = dict(claim_type="superiority", unit="pts", paper="P", claim="c", paper_value="v", a_name="a", b_name="b")
    b = [79.0, 80.0, 81.0]
    near = compare([82.3, 83.3, 84.3], b, **kw)  # agrees, clears 0 by 1.03
    far = compare([89.0, 90.0, 91.0], b, **kw)  # agrees, clears 0 by 7.7
    below = compare([69.0, 70.0, 71.0], b, **kw)  # disagrees, clears 0 by 7.7 on the other side
    undecided = compare([80.0, 81.0, 82.0], b, **kw)
    assert [x["verdict"] for x in (near, far, below, undecided)] == ["agrees", "agrees", "disagrees", "inconclusive"]
    info = plateau_gate([near, far, below, undecided], "b", stat(b), stat([82.0, 83.0, 84.0]), "pts")
    # the baseline gains 3: only the verdict within 3 of its boundary falls, the same rule for both directions
    assert [x["verdict"] for x in (near, far, below)] == ["inconclusive", "agrees", "disagrees"]
    assert near["ungated_verdict"] == "agrees" and "gate" not in far and "gate" not in below
    assert not info["plateaued"] and info["standing"] == 2 and info["gated"] == 1
    assert "2 of 3 comparisons decided by their numbers alone" in info["text"]


def test_plateau_gate_with_nothing_decided_shows_no_plateau_and_judges_numbers_verdicts():
    from attnzoo.compare.claims import gate, plateau_gate, stat

    kw = dict(claim_type="superiority", unit="pts", paper="P", claim="c", paper_value="v", a_name="a", b_name="b")
    b = [79.0, 80.0, 81.0]
    undecided = compare([79.5, 81.0, 82.5], b, **kw)  # effect +1.0, interval holds 0
    assert undecided["verdict"] == "inconclusive"
    # nothing decided: no bar, so no plateau is shown, however small the change
    info = plateau_gate([undecided], "b", stat(b), stat([80.0, 80.0, 80.1]), "pts")
    assert info["plateaued"] is False and info["text"].endswith("so its plateau is not shown")
    assert plateau_gate([], "b", stat(b), stat(b), "pts")["plateaued"] is False
    # a verdict another gate made inconclusive is still judged by its interval: it sets the bar, and a drift
    # larger than its clearance adds the plateau reason
    near = compare([82.3, 83.3, 84.3], b, **kw)  # agrees, clears 0 by 1.03
    gate(near, "sizes differ", "conditions")
    info = plateau_gate([near], "b", stat(b), stat([79.5, 80.5, 81.5]), "pts")
    assert info["plateaued"] is True and near["gate_reasons"] == ["conditions"]
    info = plateau_gate([near], "b", stat(b), stat([82.0, 83.0, 84.0]), "pts")
    assert info["plateaued"] is False and near["gate_reasons"] == ["conditions", "plateau"]
    assert near["ungated_verdict"] == "agrees"


def test_plateau_gate_margin_counts_in_the_clearance():
    from attnzoo.compare.claims import plateau_gate, stat

    kw = dict(paper="P", claim="c", paper_value="v", a_name="a", b_name="b", unit="pts")
    b = [79.0, 80.0, 81.0]
    # comparable within 5: CI of the effect [-2.27, +2.27] lies above -5 by 2.73
    f = compare(b, b, claim_type="non-inferiority", margin=5.0, margin_source="Table 1", **kw)
    assert f["verdict"] == "agrees"
    plateau_gate([f], "b", stat(b), stat([81.0, 82.0, 83.0]), "pts")  # drift 2 < 2.73: stands
    assert f["verdict"] == "agrees"
    plateau_gate([f], "b", stat(b), stat([82.0, 83.0, 84.0]), "pts")  # drift 3 > 2.73: falls
    assert f["verdict"] == "inconclusive"


def test_bad_arguments_fail_early(tmp_path, capsys):
    with pytest.raises(ReproduceError, match="unknown section 'visoin'.*valid sections"):
        run(tmp_path / "a", "smoke", only="visoin")
    with pytest.raises(ReproduceError, match="unknown budget 'huge'; valid budgets"):
        plan("huge", 0)
    with pytest.raises(ReproduceError, match="seed must be a non-negative integer"):
        plan("smoke", -1)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert main(["--budget", "smoke", "--out", str(foreign), "--no-progress"]) == 2
    assert "not a reproduce run" in capsys.readouterr().err
    assert (foreign / "notes.txt").read_text() == "mine"
    # a directory of another budget/seed is refused before anything runs
    other = tmp_path / "other"
    other.mkdir()
    (other / "run.json").write_text(json.dumps({"budget": "default", "seed": 0}))
    with pytest.raises(ReproduceError, match="budget 'default' and seed 0"):
        run(other, "smoke", seed=0, only="probes")
    assert not (other / "steps").exists()


def test_list_prints_the_plan(capsys):
    assert main(["--budget", "smoke", "--list", "--only", "probes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(line.startswith("probes/") for line in lines)
    assert any("needs vision/vit/seed0" in line for line in lines)


def test_interrupted_run_prints_the_command_that_continues_it(tmp_path, monkeypatch, capsys):
    """Started without --out, the run writes to a new timestamped directory: the hint must name it."""
    from attnzoo.compare.store import Interrupted
    from attnzoo.reproduce.sections import probes

    def stop(ctx, step):
        raise Interrupted("SIGTERM")

    for experiment in ("denoise", "compress", "rank-collapse"):
        monkeypatch.setitem(probes._RUN, experiment, stop)
    monkeypatch.chdir(tmp_path)
    outcome = run(None, "smoke", seed=2, only="probes", progress=False)
    assert outcome.interrupted
    err = capsys.readouterr().err
    hint = err.split("To continue, run: ", 1)[1].strip()
    assert hint == f"attnzoo reproduce --budget smoke --seed 2 --out {outcome.out} --only probes"
    assert outcome.out.parent == Path("results") and (tmp_path / outcome.out / "run.json").is_file()


def test_vision_extra_seeds_count_in_a_controlled_comparison():
    """A row with extra seeds is judged on all of them, whatever the 3-seed verdict (never only when it is undecided:
    that would choose the data by its outcome); the measurement says how many seeds each side has."""
    from attnzoo.compare.claims import stat
    from attnzoo.reproduce.sections import vision

    six_cbsa, six_mssa = stat([60.0, 63.0, 61.0, 55.0, 56.0, 55.5]), stat([65.0, 64.0, 65.0, 64.0, 65.0, 64.5])
    res = {
        "cbt": {"accuracy": stat([73.0, 74.0, 73.5]), "extra_seeds": 0},
        "crate": {"accuracy": stat([59.0, 60.0, 58.5]), "extra_seeds": 0},
        "vit+cbsa": {"accuracy": six_cbsa, "extra_seeds": 3},
        "vit+mssa": {"accuracy": six_mssa, "extra_seeds": 3},
    }
    ctl = [
        f
        for f in judged(*vision._findings(res))
        if f["claim"].startswith("controlled swap: CBSA is competitive with MSSA")
    ]
    assert len(ctl) == 1 and ctl[0]["verdict"] == "disagrees" and ctl[0]["values_a"] == list(six_cbsa.values)
    assert "(6 vs 6 seeds)" in ctl[0]["measured"]
    # `long` plans no swaps (CBSA Table 4 is not tested there); a plan asking for them and extra seeds gets them
    b, _ = plan("long", 0)
    swaps = {**b["vision"], "swaps": ["vit+cbsa", "vit+mssa"], "not_tested": {}}
    with_extra = {**swaps, "extra_seeds": {"rows": ["vit+cbsa", "vit+mssa"], "seeds": 3}}
    steps = vision.plan_steps(with_extra, 0)
    ids = [s.id for s in steps if s.id.startswith("vision/vit+cbsa/") and "/lr-sweep/" not in s.id]
    assert ids == [f"vision/vit+cbsa/seed{k}" for k in range(3)] + [f"vision/vit+cbsa/extra-seed{k}" for k in (3, 4, 5)]
    with pytest.raises(ValueError, match=r"extra_seeds row 'vit\+nope' is not a row of this plan"):
        vision.plan_steps({**swaps, "extra_seeds": {"rows": ["vit+nope"], "seeds": 1}}, 0)


def test_layerwise_probe_over_seeds_uses_the_mean_series_and_the_seeds_agreement():
    from attnzoo.reproduce.sections import probes

    falling, rising, flat = [5.0, 4.0, 3.0, 2.0], [2.0, 3.0, 4.0, 5.0], [3.0, 3.1, 2.9, 3.0]
    assert probes._seeds_verdict([4.0, 3.5, 3.0, 2.5], [falling, falling, rising], 0) == "agrees"  # 2 of 3 seeds
    assert probes._seeds_verdict([3.5, 3.5, 3.5, 3.49], [falling, rising, flat], 0) == "inconclusive"  # 1 of 3
    assert probes._seeds_verdict([2.0, 3.0, 4.0, 5.0], [rising, rising, rising], 0) == "disagrees"

    def probe(vals):
        return {
            "layers": [
                {"name": f"blocks.{i}.attn", "mechanism": "tssa", "variational_compression": v}
                for i, v in enumerate(vals)
            ],
            "series": {"variational_compression": vals},
        }

    f = probes._layerwise_finding("tost", probe(falling), [probe(falling), probe(rising)])
    assert f["seeds"] == 3 and f["verdict"] == "agrees" and "mean of 3 seeds" in f["measured"]
    assert "per seed: agrees, agrees, disagrees" in f["measured"]
    b, steps = plan("long", 0)
    ids = {s.id for s in steps}
    n = b["probes"]["layerwise_seeds"]
    assert n >= 2  # a trend on one trained model is an anecdote
    for name in ("tost", "crate", "cbt", "aot"):
        assert {f"probes/layerwise/{name}"} | {f"probes/layerwise/{name}/extra-seed{k}" for k in range(1, n)} <= ids
        assert f"probes/layerwise/{name}/extra-seed{n}" not in ids
    assert not any(i.startswith("probes/train/vit/extra-seed") for i in ids)  # no layer-wise claim for softmax


def test_layerwise_verdict_stands_only_where_the_papers_own_measure_agrees():
    from attnzoo.reproduce.sections import probes

    falling, rising = [5.0, 4.0, 3.0, 2.0], [2.0, 3.0, 4.0, 5.0]

    def probe(claim, literal):
        rows = [
            {
                "name": f"blocks.{i}.attn",
                "mechanism": "tssa",
                "variational_compression": c,
                "variational_compression_out": o,
            }
            for i, (c, o) in enumerate(zip(claim, literal, strict=True))
        ]
        return {"layers": rows, "series": {"variational_compression": claim}}

    # ToST Fig. 4a plots the TSSA outputs: they rise where the claim measure falls, on both seeds
    f = probes._layerwise_finding("tost", probe(falling, rising), [probe(falling, rising)])
    assert f["ungated_verdict"] == "agrees" and f["verdict"] == "inconclusive" and f["gate_reasons"] == ["conditions"]
    assert "ToST Fig. 4a plots (R^var_c, block output) gives disagrees" in f["gate"]
    assert f["literal_measure"]["verdict"] == "disagrees"
    # both measures fall: the verdict stands
    f = probes._layerwise_finding("tost", probe(falling, falling), [probe(falling, falling)])
    assert f["verdict"] == "agrees" and "gate" not in f


def test_baselines_count_as_learned_only_when_every_seed_learned():
    from attnzoo.compare.claims import stat
    from attnzoo.reproduce.sections import icl, lra

    res = {"softmax": {"listops": {"accuracy": stat([35.0, 15.2])}, "image": {"accuracy": stat([40.0, 45.0])}}}
    # ListOps' mean (25.1) clears a 17% majority by 5 points, but one seed sits at the majority class
    assert lra._learned(res, ["listops", "image"], {"listops": 17.0, "image": 13.5}) == ["image"]
    plan = {"require_learned": True}
    assert icl._baseline_learned({"gpt": [0.11, 0.24]}, 0.263, plan) is False  # seed 2 on the plateau
    assert icl._baseline_learned({"gpt": [0.11, 0.10]}, 0.263, plan) is True


def test_jobs_runs_steps_in_processes_with_the_numbers_of_one_job(tmp_path):
    """--jobs 2: cheap real steps (n-gram and regression baselines) computed in worker processes, a dependency
    started only after the step it reads, the same numbers as one process, and a failed dependency reported."""
    import dataclasses

    from attnzoo.compare.common import Context
    from attnzoo.compare.runner import RunOutcome, run_steps

    _, steps = plan("smoke", 0)
    by_id = {s.id: s for s in steps}
    cheap = [by_id["language/ngram-baselines"], by_id["icl/linear/baselines"], by_id["icl/sparse/baselines"]]
    cheap[2] = dataclasses.replace(cheap[2], deps=("icl/linear/baselines",))
    bad = dataclasses.replace(cheap[0], id="language/broken", config={"task_options": {"block_size": -1}})
    dep = dataclasses.replace(cheap[1], id="icl/linear/needs-broken", deps=("language/broken",))
    results = {}
    for jobs in (1, 2):
        out = tmp_path / f"jobs{jobs}"
        ctx = Context(out=out, store=StepStore(out), seed=0, progress=False)
        outcome = RunOutcome(out, out / "r.md", out / "r.json")
        records = outcome.records
        if jobs == 1:
            run_steps(cheap, ctx, outcome, progress=False)
            assert outcome.failed == {}
        else:  # with a failing step and its dependant: reported, not run, the others unaffected
            run_steps([bad, dep] + cheap, ctx, outcome, progress=False, jobs=2, threads=1)
            assert set(outcome.failed) == {"language/broken", "icl/linear/needs-broken"}
            assert "depends on failed step" in outcome.failed["icl/linear/needs-broken"]
        assert sorted(outcome.computed) == sorted(s.id for s in cheap)
        results[jobs] = {sid: r["result"] for sid, r in records.items()}
        starts = {sid: r["started"] for sid, r in records.items()}
        assert starts["icl/sparse/baselines"] >= records["icl/linear/baselines"]["finished"]
    assert results[1] == results[2]
    ng = results[2]["language/ngram-baselines"]
    assert 0 < ng["bigram_bpc"] < ng["unigram_bpc"] < 7  # a bigram model beats a unigram one on English text


def test_sweep_table_marks_the_best_rate_and_gates_untuned_rows():
    from attnzoo.compare.common import sweep_id, sweep_table
    from attnzoo.compare.pipeline import Evidence, Tuning

    lrs = [1e-3, 2e-3, 4e-3]
    # tost: best at the grid's lowest rate; crate: one rate missing
    acc = {"vit": [0.60, 0.70, 0.65], "tost": [0.72, 0.66, 0.50], "crate": [0.50, 0.55], "csp": [0.10, 0.15, 0.12]}
    records = {
        sweep_id(f"vision/{row}", lr): {"result": {"accuracy": a}}
        for row, vals in acc.items()
        for lr, a in zip(lrs, vals, strict=False)  # a row may lack its last rates (untuned)
    }
    table, untuned = sweep_table(records, ["vit", "tost", "crate", "csp"], "vision", lrs, "accuracy", True, 100.0)
    assert [r[0] for r in table.rows] == ["vit", "tost †", "csp"] and table.rows[0][2] == "**70**"
    assert table.rows[2][2] == "**15**"
    assert set(untuned) == {"tost", "crate"}
    assert "0.001 is the lowest of the grid" in untuned["tost"] and "incomplete" in untuned["crate"]
    kw = dict(claim_type="superiority", unit="pts", paper="P", claim="c", paper_value="v")
    tuned = compare([82.3, 83.3, 84.3], [79.0, 80.0, 81.0], a_name="vit", b_name="vit+x", **kw)
    not_tuned = compare([82.3, 83.3, 84.3], [79.0, 80.0, 81.0], a_name="tost", b_name="vit", **kw)
    judged([tuned, not_tuned], Evidence(tuning=[Tuning(untuned)]))
    assert tuned["verdict"] == "agrees" and "gate" not in tuned
    assert not_tuned["verdict"] == "inconclusive" and not_tuned["ungated_verdict"] == "agrees"
    assert not_tuned["gate"].startswith("not tuned: tost's best swept learning rate")


def test_reuse_imports_only_steps_whose_config_is_unchanged(tmp_path):
    from attnzoo.reproduce.runner import import_results

    old = StepStore(tmp_path / "old")
    same = Step("sec/same", "sec", {"x": 1}, lambda ctx, step: {})
    changed_before = Step("sec/changed", "sec", {"x": 1}, lambda ctx, step: {})
    old.save(same, {"y": 1}, 2.5, 0.0)
    old.save(changed_before, {"y": 2}, 1.0, 0.0)
    changed_now = Step("sec/changed", "sec", {"x": 2}, lambda ctx, step: {})
    new_step = Step("sec/new", "sec", {"x": 3}, lambda ctx, step: {})
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"steps": {s: old.load_by_id(s) for s in ("sec/same", "sec/changed")}}))
    for src in (results, tmp_path / "old"):  # a results.json or a reproduce directory
        new = StepStore(tmp_path / f"new-{src.name}")
        assert import_results(src, [same, changed_now, new_step], new) == 1
        rec = new.load(same)
        assert rec["result"] == {"y": 1} and rec["wall_s"] == 2.5
        assert rec["imported_from"] == ("old" if src.is_dir() else tmp_path.name)  # a name, not a local path
        assert new.load(changed_now) is None and new.load(new_step) is None
    with pytest.raises(ReproduceError, match="not a readable results.json"):
        import_results(tmp_path / "missing.json", [same], StepStore(tmp_path / "x"))
    # a published record whose plot arrays were dropped (publish_report.sh) is computed again, not imported
    slim = dict(old.load_by_id("sec/same"), result_slimmed=["points"])
    results.write_text(json.dumps({"steps": {"sec/same": slim}}))
    assert import_results(results, [same], StepStore(tmp_path / "slim")) == 0
    # ... except for a report alone (--report-only): its numbers render, and it stays marked so that a later
    # computing run takes the step again
    kept = StepStore(tmp_path / "slim-report")
    assert import_results(results, [same], kept, slimmed=True) == 1
    assert kept.load(same)["result_slimmed"] == ["points"]
    from attnzoo.compare.common import Context
    from attnzoo.compare.runner import RunOutcome, run_steps

    # a computing run takes the step again rather than reuse the record without its plot arrays
    runs = {}
    for store in (kept, new):
        runs[store] = RunOutcome(store.root, store.root / "r.md", store.root / "r.json")
        run_steps([same], Context(out=store.root, store=store, seed=0, progress=False), runs[store], progress=False)
    assert runs[kept].computed == ["sec/same"] and runs[kept].skipped == []
    assert runs[new].computed == [] and runs[new].skipped == ["sec/same"]


def test_results_json_names_the_run_each_reused_step_was_measured_in():
    from attnzoo.reproduce.report import _results_payload

    records = {
        "sec/own": {"section": "sec", "config": {}, "result": {"y": 1}, "wall_s": 1.0},
        "sec/reused": {"section": "sec", "config": {}, "result": {"y": 2}, "wall_s": 2.0, "imported_from": "long"},
    }
    steps = _results_payload({}, [], records, {})["steps"]
    assert steps["sec/reused"]["imported_from"] == "long" and "imported_from" not in steps["sec/own"]


def test_reuse_of_a_directory_brings_the_run_files_a_later_step_loads(tmp_path):
    """A pretrained model imported by --reuse is loaded by the steps that depend on it: its run directory comes with
    its record (and is covered by the record's hashes)."""
    from attnzoo.reproduce.runner import import_results

    old = StepStore(tmp_path / "old")
    teacher = Step("sec/teacher", "sec", {"x": 1}, lambda ctx, step: {})
    (old.run_dir(teacher.id) / "model").mkdir(parents=True)
    (old.run_dir(teacher.id) / "model" / "weights.bin").write_bytes(b"\x01\x02")
    old.save(teacher, {"accuracy": 0.8}, 1.0, 0.0)
    new = StepStore(tmp_path / "new")
    assert import_results(tmp_path / "old", [teacher], new) == 1
    assert (new.run_dir(teacher.id) / "model" / "weights.bin").read_bytes() == b"\x01\x02"
    assert new.load(teacher)["result"] == {"accuracy": 0.8}


@pytest.mark.slow
def test_report_only_writes_a_report_from_stored_steps_and_lists_the_missing(smoke, tmp_path):
    out = tmp_path / "partial"
    shutil.copytree(smoke, out)
    (out / "steps" / "vision" / "vit" / "seed1.json").unlink()
    outcome = run(out, "smoke", seed=0, progress=False, report_only=True)
    assert outcome.computed == [] and outcome.missing == ["vision/vit/seed1"]
    assert not (out / "steps" / "vision" / "vit" / "seed1.json").exists()
    res = _results(out)
    assert res["meta"]["missing_steps"] == ["vision/vit/seed1"] and list(res["sections"]) == list(SECTIONS)
    assert "`vision/vit/seed1`" in (out / "report.md").read_text()


def test_a_timed_step_runs_with_no_other_step_in_flight(tmp_path):
    """--jobs 2: a measurement step (``timed``) neither starts beside a running step nor lets one start beside it."""
    import dataclasses

    from attnzoo.compare.common import Context
    from attnzoo.compare.runner import RunOutcome, run_steps

    _, steps = plan("smoke", 0)
    by_id = {s.id: s for s in steps}
    cheap = [by_id["language/ngram-baselines"], by_id["icl/linear/baselines"], by_id["icl/sparse/baselines"]]
    cheap[1] = dataclasses.replace(cheap[1], timed=True)
    ctx = Context(out=tmp_path, store=StepStore(tmp_path), seed=0, progress=False)
    outcome = RunOutcome(tmp_path, tmp_path / "r.md", tmp_path / "r.json")
    records = outcome.records
    run_steps(cheap, ctx, outcome, progress=False, jobs=2, threads=1)
    assert outcome.failed == {} and len(records) == 3
    t = records["icl/linear/baselines"]
    for sid, r in records.items():
        if sid != "icl/linear/baselines":
            assert r["finished"] <= t["started"] or r["started"] >= t["finished"], sid
    assert all(s.timed for s in plan("smoke", 0)[1] if s.section == "efficiency")


def test_vision_reports_every_claim_whose_rows_ran():
    """Each architecture claim of the vision section whose two rows have results is a finding (AoT vs CRATE, whose
    explanation comes from its own ablations, included)."""
    from attnzoo.compare.claims import stat
    from attnzoo.reproduce.sections import vision

    rows = {row for c in vision.CLAIMS for row in (c.row, c.base)}
    res = {r: {"accuracy": stat([70.0 + i, 71.0 + i, 70.5 + i]), "extra_seeds": 0} for i, r in enumerate(rows)}
    claimed = {f["claim_id"] for f in judged(*vision._findings(res)) if f["kind"] == "paper"}
    assert {c.claim_id for c in vision.CLAIMS} <= claimed


def test_the_provenance_names_the_imported_steps():
    from attnzoo.reproduce.report import _imported_text

    recs = {
        "icl/a": {"section": "icl", "imported_from": "long16"},
        "icl/b": {"section": "icl", "imported_from": "long16"},
        "vision/a": {"section": "vision"},
    }
    text = _imported_text(recs)
    assert "1 of 3 steps were measured in this run; 2 were imported unchanged" in text
    assert "`long16` (icl 2)" in text
    assert _imported_text({"vision/a": {"section": "vision"}}) == "every step was measured in this run. "
