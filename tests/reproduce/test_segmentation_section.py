"""The segmentation section (CBSA Tables 5-6 and Fig. 8, ToST Fig. 5): its plan in every budget, and its summary of
synthetic records: the claims with the verdicts the rule gives, the gates, the tables and the plot files."""

from __future__ import annotations

import copy

import pytest

from attnzoo.compare.common import LONGER, SWEEP_SEED_OFFSET, row_lrs, sweep_id
from attnzoo.reproduce.budgets import BUDGET_NAMES, BUDGETS
from attnzoo.reproduce.runner import plan
from attnzoo.reproduce.sections import segmentation as seg
from attnzoo.reproduce.sections.segmentation import INIT, KEY

PLAN = {
    # the rule's verdicts are tested with the tuning gate off; the budgets keep it on (a test below)
    "require_tuned": False,
    "task_options": {"n_train": 64, "n_val": 32},
    "models": ["crate_cbt", "crate", "cbt", "tost", "vit"],
    "controls": ["tost", "crate_cbt"],
    "seeds": 3,
    "arch": {"dim": 16, "depth": 6, "heads": 2, "patch_size": 8},
    "train": {"steps": 4, "batch_size": 8, "lr": 1.0e-3},
    "decoders": {
        "encoder": "vit_s",
        "encoder_options": {"dim": 16, "depth": 1},
        "decoder_depth": 1,
        "steps": 2,
        "batch_size": 8,
        "lr": 1.0e-3,
        "sigmas": [0.0, 0.1],
        "draws": 1,
        "images": 16,
    },
}
SEEDS = (0, 1, 2)
#: per-seed jitter, so every comparison has a spread (and an interval)
JITTER = (0.0, 0.002, -0.002)


def _zero_shot(fg_layers: list[float], *, cls: list[float] = (), jitter: float = 0.0) -> dict:
    """A zero-shot result: the model's blocks' foreground IoUs per layer, then class-attention layers (``cls``)."""
    layers = [{"mechanism": "mssa", "v": v} for v in fg_layers] + [
        {"mechanism": "class_attention", "v": v} for v in cls
    ]
    out = []
    for lay in layers:
        best = {"foreground": lay["v"] + jitter, "background": 0.8 + jitter, "boundary": 0.2 + jitter}
        out.append({"mechanism": lay["mechanism"], "best": best, "iou": {t: [v] for t, v in best.items()}})
    return {"layers": out, "best": {t: max(lay["best"][t] for lay in out) for t in seg.TARGETS}}


def _decoder(miou: float, drop: float, flops: int) -> dict:
    return {
        "miou": miou,
        "decoder_flops": flops,
        "decoder_params": flops // 10,
        "sweep": {"sigmas": [0.0, 0.1], "miou": [[miou, miou], [miou - drop, miou - drop]]},
    }


def _records(layers: dict[str, list[float]], *, accuracy: float = 0.6, decoders: dict | None = None) -> dict:
    """Synthetic records of every step of :data:`PLAN`: ``layers`` maps a row (models and ``name@init`` controls) to
    its blocks' foreground IoU per layer; ToST gets two class-attention layers (penultimate 0.5, last 0.1) and its
    control the reverse, so only the penultimate layer shows the trained map above the untrained one."""
    recs = {}

    def put(sid, result):
        recs[sid] = {"section": KEY, "result": result}

    for s, j in zip(SEEDS, JITTER, strict=True):
        for name, fg in layers.items():
            base = name.removesuffix(INIT)
            cls = ([0.2, 0.6] if name != base else [0.5, 0.1]) if base == "tost" else []
            kind = "zero-shot-init" if name != base else "zero-shot"
            put(f"{KEY}/{kind}/{base}/seed{s}", _zero_shot(fg, cls=cls, jitter=j))
            if name == base:
                put(f"{KEY}/{name}/seed{s}", {"accuracy": accuracy + j, "params": 1000})
        dec = decoders or {"cbsa": (0.50, 0.01, 200), "mask_transformer": (0.40, 0.20, 1000)}
        put(
            f"{KEY}/decoders/seed{s}",
            {"background_miou": 0.07, "decoders": {k: _decoder(m + j, d + j / 2, f) for k, (m, d, f) in dec.items()}},
        )
    return recs


#: the paper's order; the hybrid's later half lies above CBT's and its first half below (a wrong half flips it)
AGREEING = {
    "crate_cbt": [0.3, 0.3, 0.3, 0.8, 0.8, 0.8],
    "crate": [0.7, 0.7, 0.7, 0.7, 0.7, 0.7],
    "cbt": [0.6, 0.6, 0.6, 0.2, 0.2, 0.2],
    "tost": [0.4, 0.4, 0.4, 0.4, 0.4, 0.4],
    "vit": [0.5] * 6,
    "tost@init": [0.1] * 6,
    "crate_cbt@init": [0.1] * 6,
}


def _summary(tmp_path, records, plan_=PLAN):
    def rel(p):
        return p.relative_to(tmp_path).as_posix()

    plots = tmp_path / "plots"
    plots.mkdir(exist_ok=True)
    return seg.summarize(records, plan_, plots, rel)


def _by_id(sec) -> dict:
    return {f["claim_id"]: f for f in sec.findings}


def test_summary_agrees_where_the_numbers_follow_the_papers(tmp_path):
    sec = _summary(tmp_path, _records(AGREEING))
    f = _by_id(sec)
    assert list(f) == [
        "cbsa-t5-ranking#crate_cbt-vs-crate",
        "cbsa-t5-ranking#crate-vs-cbt",
        "cbsa-t5-ranking#cbt-vs-tost",
        "cbsa-t6-persistence",
        "tost-f5-segments",
        "cbsa-f8-miou",
        "cbsa-f8-flops",
        "cbsa-f8-robust",
    ]
    assert all(x["verdict"] == "agrees" for x in f.values()), {k: x["verdict"] for k, x in f.items()}
    # each ranking test carries the paper's own effect for its pair (Table 5)
    effects = [f[f"cbsa-t5-ranking#{a}-vs-{b}"]["paper_effect"] for a, b in seg.RANKING]
    assert effects == pytest.approx([0.03, 0.14, 0.09])
    assert f["cbsa-t6-persistence"]["effect"] == pytest.approx(0.6)  # later halves: 0.8 vs 0.2
    assert f["tost-f5-segments"]["effect"] == pytest.approx(0.3)  # penultimate class attention: 0.5 vs 0.2
    assert f["cbsa-f8-miou"]["effect"] == pytest.approx(10.0)  # mIoU points
    assert f["cbsa-f8-robust"]["effect"] == pytest.approx(19.0) and f["cbsa-f8-robust"]["lower_is_better"]
    assert "(20.0%)" in f["cbsa-f8-flops"]["measured"]
    titles = [t.title for t in sec.tables]
    assert titles == [
        "Zero-shot segmentation of the [CLS] maps (CBSA Tables 5-6)",
        "Segmentation decoders (CBSA Fig. 8)",
    ]
    t5 = sec.tables[0]
    assert [r[0] for r in t5.rows] == [
        *PLAN["models"],
        "tost@init (untrained control)",
        "crate_cbt@init (untrained control)",
    ]
    assert t5.rows[0][4] == "0.800 ± 0.002" and t5.rows[0][-2] == "0.68 / 0.78 / 0.18"
    # the later half the persistence claim compares, beside the paper's (CBSA Table 6's L7-L12 mean)
    hybrid = next(r for r in t5.rows if r[0] == "crate_cbt")
    assert hybrid[-3] == f["cbsa-t6-persistence"]["measured"].split(" vs ")[0].split(" ", 1)[1]
    assert hybrid[-1] == "0.56"
    for path, _ in sec.plots:
        assert (tmp_path / path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {p for p, _ in sec.plots} == {"plots/segmentation_layers.png", "plots/segmentation_decoders.png"}
    assert sec.scale.startswith("here 64x64 scenes (64 training scenes, 64 tokens)")


def test_summary_disagrees_where_the_numbers_reverse_the_papers(tmp_path):
    layers = {**AGREEING, "crate_cbt": [0.5] * 6, "crate": [0.6] * 6, "cbt": [0.9] * 6}
    dec = {"cbsa": (0.30, 0.25, 900), "mask_transformer": (0.40, 0.01, 1000)}
    f = _by_id(_summary(tmp_path, _records(layers, decoders=dec)))
    verdicts = {k: x["verdict"] for k, x in f.items()}
    assert verdicts == {
        "cbsa-t5-ranking#crate_cbt-vs-crate": "disagrees",
        "cbsa-t5-ranking#crate-vs-cbt": "disagrees",
        "cbsa-t5-ranking#cbt-vs-tost": "agrees",
        "cbsa-t6-persistence": "disagrees",
        "tost-f5-segments": "agrees",
        "cbsa-f8-miou": "disagrees",
        "cbsa-f8-flops": "disagrees",
        "cbsa-f8-robust": "disagrees",
    }


def test_a_tie_inside_half_the_papers_effect_disagrees_and_a_wide_interval_is_inconclusive(tmp_path):
    # crate_cbt ties crate: the paper's +0.03 halved is +0.015, and the interval lies below it
    layers = {**AGREEING, "crate_cbt": [0.7] * 6}
    f = _by_id(_summary(tmp_path, _records(layers)))["cbsa-t5-ranking#crate_cbt-vs-crate"]
    assert f["verdict"] == "disagrees" and f["refute_below"] == pytest.approx(0.015)
    recs = _records(AGREEING)
    recs[f"{KEY}/zero-shot/crate/seed2"]["result"] = _zero_shot([0.95] * 6)  # one seed far off: a wide interval
    f = _by_id(_summary(tmp_path, recs))["cbsa-t5-ranking#crate_cbt-vs-crate"]
    assert f["verdict"] == "inconclusive" and f["ci95"][0] < 0 < f["ci95"][1]


def test_the_untrained_control_holds_back_the_persistence_agreement(tmp_path):
    layers = {**AGREEING, "crate_cbt@init": [0.8] * 6}  # the hybrid's later half shows it before training
    f = _by_id(_summary(tmp_path, _records(layers)))["cbsa-t6-persistence"]
    assert f["verdict"] == "inconclusive" and f["ungated_verdict"] == "agrees"
    # its best layer is no better than the untrained one's either: the maps never emerged
    assert f["gate_reasons"] == ["control", "did not learn"] and "untrained copy" in f["gate"]
    assert "never emerged" in f["gate"]
    assert f["random_init_control"]["row"] == "crate_cbt@init"


def test_a_persistence_disagreement_stands_and_says_where_the_hybrids_later_half_is_against_its_untrained_copy(
    tmp_path,
):
    # the hybrid's maps emerge in its first half (0.9 against 0.1 untrained); its later half is 0.5, below CBT's
    layers = {**AGREEING, "crate_cbt": [0.9] * 3 + [0.5] * 3, "crate": [0.6] * 6, "cbt": [0.9] * 6}
    for init, said in ((0.5, "not shown above it"), (0.1, "above it")):
        untrained = [0.1] * 3 + [init] * 3
        f = _by_id(_summary(tmp_path, _records({**layers, "crate_cbt@init": untrained})))["cbsa-t6-persistence"]
        assert f["verdict"] == "disagrees" and not f.get("gate_reasons")
        assert "crate_cbt's later half is" in f["explanation"] and f"untrained copy's ({said})" in f["explanation"]
        assert f["random_init_control"]["row"] == "crate_cbt@init"


def test_rows_that_did_not_learn_gate_their_comparisons_unless_the_plan_turns_the_gate_off(tmp_path):
    recs = _records(AGREEING, accuracy=0.12)  # 12% against chance 10%: not learned
    sec = _summary(tmp_path, recs)
    f = _by_id(sec)
    for cid in ("cbsa-t5-ranking#crate_cbt-vs-crate", "cbsa-t6-persistence", "tost-f5-segments"):
        assert f[cid]["verdict"] == "inconclusive" and f[cid]["ungated_verdict"] == "agrees", cid
        assert f[cid]["gate_reasons"] == ["did not learn"]
    assert f["cbsa-f8-miou"]["verdict"] == "agrees"  # the decoders learned (mIoU far above all-background's)
    assert any("did not learn" in n for n in sec.notes)
    sec = _summary(tmp_path, recs, {**PLAN, "require_learned": False})
    assert all(x["verdict"] == "agrees" for x in sec.findings)
    # decoders that do not beat the all-background prediction
    dec = {"cbsa": (0.09, 0.01, 200), "mask_transformer": (0.08, 0.02, 1000)}
    f = _by_id(_summary(tmp_path, _records(AGREEING, decoders=dec)))
    assert f["cbsa-f8-miou"]["gate_reasons"] == ["did not learn"] and f["cbsa-f8-flops"]["verdict"] == "agrees"


def test_missing_rows_are_not_tested(tmp_path):
    recs = {k: v for k, v in _records(AGREEING).items() if "/tost/" not in k and "/decoders/" not in k}
    f = _by_id(_summary(tmp_path, recs))
    assert f["cbsa-t5-ranking#cbt-vs-tost"]["verdict"] == "not tested"
    assert f["tost-f5-segments"]["verdict"] == "not tested"
    assert all(f[c]["verdict"] == "not tested" for c in ("cbsa-f8-miou", "cbsa-f8-flops", "cbsa-f8-robust"))


def test_decoders_a_plan_marks_not_tested_are_not_trained_and_their_claims_carry_the_reason(tmp_path):
    why = "the decoders did not learn the scenes (pilot figures)"
    p = {k: v for k, v in PLAN.items() if k != "decoders"} | {"decoders_not_tested": why}
    assert not any("/decoders" in s.id for s in seg.plan_steps(p, 0))
    f = _by_id(_summary(tmp_path, _records(AGREEING), p))  # decoder records present: the plan's word decides
    for c in ("cbsa-f8-miou", "cbsa-f8-flops", "cbsa-f8-robust"):
        assert f[c]["verdict"] == "not tested" and f[c]["measured"] == why
    assert f["cbsa-t5-ranking#crate_cbt-vs-crate"]["verdict"] != "not tested"
    with pytest.raises(ValueError, match="decoders_not_tested says why Fig. 8 is not tested"):
        seg.plan_steps(dict(PLAN, decoders_not_tested=why), 0)


@pytest.mark.parametrize("name", BUDGET_NAMES)
def test_every_budget_plans_the_sections_steps(name):
    b, steps = plan(name, 0)
    p = b[KEY]
    ids = {s.id: s for s in steps if s.section == KEY}
    want = set()
    for m in p["models"]:  # each row's sweep on the sweep seed, at the plan's share of the steps
        for lr in row_lrs(p, m):
            sid = sweep_id(f"{KEY}/{m}", lr)
            want.add(sid)
            train = ids[sid].config["train"]
            assert train["lr"] == lr and train["seed"] == SWEEP_SEED_OFFSET and ids[sid].deps == ()
            assert train["steps"] == max(1, round(p["train"]["steps"] * p.get("sweep_fraction", 1.0)))
    for kind in seg.DECODERS if p.get("decoders") else ():
        for lr in seg.decoder_lrs(p):
            sid = sweep_id(f"{KEY}/decoders/{kind}", lr)
            want.add(sid)
            assert ids[sid].config["train"]["lr"] == lr and ids[sid].config["train"]["seed"] == SWEEP_SEED_OFFSET
    for s in range(p["seeds"]):
        for m in p["models"]:
            want |= {f"{KEY}/{m}/seed{s}", f"{KEY}/zero-shot/{m}/seed{s}"}
            assert ids[f"{KEY}/zero-shot/{m}/seed{s}"].deps == (f"{KEY}/{m}/seed{s}",)
            run = ids[f"{KEY}/{m}/seed{s}"]
            assert run.config["train"]["seed"] == s
            # a swept row trains at its sweep's best rate, read when it runs; an unswept one at the plan's rate
            swept = tuple(sweep_id(f"{KEY}/{m}", lr) for lr in row_lrs(p, m))
            assert run.deps == swept
            assert run.config["train"]["lr"] == ("tuned" if swept else p["train"]["lr"])
        want |= {f"{KEY}/zero-shot-init/{m}/seed{s}" for m in p["controls"]}
        for m in p.get("plateau_rows", []):  # at twice the steps, at the row's own swept rate
            run = ids[f"{KEY}/{m}{LONGER}/seed{s}"]
            assert (
                run.config["train"]["steps"] == 2 * p["train"]["steps"] and run.deps == ids[f"{KEY}/{m}/seed{s}"].deps
            )
            want |= {run.id, f"{KEY}/zero-shot/{m}{LONGER}/seed{s}"}
        if p.get("decoders"):
            runs = {kind: f"{KEY}/decoders/{kind}/seed{s}" for kind in seg.DECODERS}
            want |= {f"{KEY}/decoders/seed{s}", *runs.values()}
            assert ids[f"{KEY}/decoders/seed{s}"].deps == tuple(runs.values())
            assert ids[f"{KEY}/decoders/seed{s}"].config["runs"] == runs
            for kind, rid in runs.items():
                train = ids[rid].config["train"]
                assert train["task"] == "scenes_segmentation" and train["seed"] == s
                assert train["model_options"]["decoder_depth"] == p["decoders"]["decoder_depth"]
                swept = tuple(sweep_id(f"{KEY}/decoders/{kind}", lr) for lr in seg.decoder_lrs(p))
                assert ids[rid].deps == swept and (train["lr"] == "tuned") == bool(swept)
    assert set(ids) == want
    if "tost" in p["models"]:  # the overlays are drawn from the first seed only
        firsts = [ids[f"{KEY}/zero-shot/tost/seed{s}"].config["overlays"] > 0 for s in range(p["seeds"])]
        assert firsts == [True] + [False] * (p["seeds"] - 1)


def test_the_long_plan_sweeps_every_row_and_marks_the_decoders_tost_and_crate_not_tested():
    b, steps = plan("long", 0)
    p = b[KEY]
    ids = {s.id for s in steps if s.section == KEY}
    sweeps = {i for i in ids if "/lr-sweep/" in i}
    lrs = sum(len(row_lrs(p, m)) for m in p["models"])
    assert len(sweeps) == lrs == 10
    assert "decoders" not in p and "mIoU" in p["decoders_not_tested"] and not any("/decoders" in i for i in ids)
    assert set(p["not_tested"]) == {"tost", "crate"} and not any(i.split("/")[1] in p["not_tested"] for i in ids)
    # the command in the budget file that trains CRATE again widens it to the paper's parameter ratio
    remeasure = ["segmentation.models=[crate_cbt, crate, cbt]", "segmentation.not_tested={}"]
    remeasure += ["segmentation.row_arch={crate: {dim: 88, heads: 8}}"]
    extra = ", ".join(f"{m}: [2.5e-4, 5.0e-4]" for m in ("crate_cbt", "crate", "cbt"))
    remeasure += [f"segmentation.lr_sweep_extra={{{extra}}}"]
    _, steps = plan("long", 0, remeasure)
    crate = next(s for s in steps if s.id == f"{KEY}/crate/seed0").config["train"]["model_options"]
    hybrid = next(s for s in steps if s.id == f"{KEY}/crate_cbt/seed0").config["train"]["model_options"]
    assert (crate["dim"], crate["heads"]) == (88, 8) and (hybrid["dim"], hybrid["heads"]) == (64, 4)


def test_a_model_the_plan_leaves_out_gives_its_reason_to_every_comparison_that_needs_it(tmp_path):
    why = {"crate": "CRATE's pairs stayed undecided (pilot figures)", "tost": "ToST stalls (pilot)"}
    p = dict(PLAN, models=["crate_cbt", "cbt"], not_tested=why)
    assert not any(s.id.split("/")[1] in why for s in seg.plan_steps(p, 0))
    f = _by_id(_summary(tmp_path, _records(AGREEING), p))  # records of crate present: the plan's word decides
    assert f["cbsa-t5-ranking#crate_cbt-vs-crate"]["measured"] == f["cbsa-t5-ranking#crate-vs-cbt"]["measured"]
    assert f["cbsa-t5-ranking#crate-vs-cbt"]["measured"] == why["crate"]
    assert f["cbsa-t5-ranking#cbt-vs-tost"]["measured"] == f["tost-f5-segments"]["measured"] == why["tost"]
    assert all(f[c]["verdict"] == "not tested" for c in ("cbsa-t5-ranking#crate-vs-cbt", "tost-f5-segments"))
    assert f["cbsa-t6-persistence"]["verdict"] != "not tested"


@pytest.mark.parametrize(
    "not_tested,message",
    [
        ({"mega": "x"}, r"segmentation: not_tested names 'mega', which has no claim here \(valid: \["),
        ({"cbt": "x"}, r"segmentation: 'cbt' is both trained \(models\) and marked not_tested; keep one"),
    ],
)
def test_a_bad_not_tested_entry_is_refused_at_planning(not_tested, message):
    with pytest.raises(ValueError, match=message):
        seg.plan_steps(dict(PLAN, not_tested=not_tested), 0)


def test_row_config_keeps_each_presets_own_options_at_the_plans_size():
    cfg = seg.row_config(PLAN, "cbt", 4)
    assert cfg["model"] == "cbt_t" and cfg["model_options"]["attention_options"] == {"rep_grid": [4, 4]}
    assert cfg["model_options"]["dim"] == 16 and cfg["seed"] == 4 and cfg["steps"] == 4
    assert seg.row_config(PLAN, "crate", 0)["model_options"]["patch_embed"] == "conv"
    assert seg.row_config(PLAN, "crate_cbt", 0)["model_options"]["second_attention_options"] == {"rep_grid": [4, 4]}
    assert "description" not in cfg and "eval_every" not in cfg
    with pytest.raises(ValueError, match=r"unknown segmentation model 'swin'; valid: \["):
        seg.models_of({**PLAN, "models": ["swin"]})
    with pytest.raises(ValueError, match=r"unknown segmentation control 'swin'"):
        seg.controls_of({**PLAN, "controls": ["swin"]})


def test_row_arch_overrides_one_rows_size_and_names_an_unknown_row():
    plan_ = {**PLAN, "row_arch": {"crate": {"dim": 24, "heads": 4}}}
    crate = seg.row_config(plan_, "crate", 0)["model_options"]
    assert (crate["dim"], crate["heads"], crate["depth"], crate["patch_embed"]) == (24, 4, 6, "conv")
    assert seg.row_config(plan_, "cbt", 0)["model_options"]["dim"] == 16  # the other rows keep the plan's arch
    steps = seg.plan_steps(plan_, 0)
    probe = next(s for s in steps if s.id == f"{KEY}/zero-shot/crate/seed0")
    assert probe.config["trained"]["train"]["model_options"]["dim"] == 24
    with pytest.raises(ValueError, match=r"row_arch names \['swin'\].*valid rows: \['cbt', 'crate', 'crate_cbt'"):
        seg.row_config({**PLAN, "row_arch": {"swin": {"dim": 8}}}, "crate", 0)


def test_decoder_config_is_the_kinds_preset_at_the_plans_encoder_and_decoder_sizes():
    plan_ = {**PLAN, "decoders": {**PLAN["decoders"], "lr": 3e-3, "warmup_steps": 1}}
    cbsa, mt = (seg.decoder_config(plan_, k, 5) for k in ("cbsa", "mask_transformer"))
    assert (cbsa["model"], mt["model"]) == ("cbsa_decoder_vit_s", "segmenter_vit_s")
    for cfg in (cbsa, mt):
        assert cfg["model_options"] == {"dim": 16, "depth": 1, "heads": 4, "patch_size": 8, "decoder_depth": 1}
        assert cfg["task_options"] == {"n_train": 64, "n_val": 32} and cfg["task"] == "scenes_segmentation"
        assert (cfg["steps"], cfg["batch_size"], cfg["lr"], cfg["warmup_steps"], cfg["seed"]) == (2, 8, 3e-3, 1, 5)
    with pytest.raises(ValueError, match=r"encoder 'swin_t' is not one the decoder presets build; valid: \['vit_s'\]"):
        seg.decoder_config({**PLAN, "decoders": {**PLAN["decoders"], "encoder": "swin_t"}}, "cbsa", 0)


def test_long_budget_runs_five_seeds_and_smoke_two():
    assert BUDGETS["long"][KEY]["seeds"] == 5 and BUDGETS["smoke"][KEY]["seeds"] == 2
    assert BUDGETS["default"][KEY]["models"] == [] and not BUDGETS["default"][KEY].get("decoders")  # 30 minutes
    smoke = copy.deepcopy(BUDGETS["smoke"][KEY])
    assert smoke["require_learned"] is False


def test_without_a_learning_rate_sweep_every_comparison_is_held_back_as_not_tuned(tmp_path):
    sec = _summary(tmp_path, _records(AGREEING), {k: v for k, v in PLAN.items() if k != "require_tuned"})
    compared = [f for f in sec.findings if f.get("claim_type")]
    assert compared and all(f["verdict"] == "inconclusive" and "not tuned" in f["gate_reasons"] for f in compared)
    assert all(f["ungated_verdict"] == "agrees" for f in compared)
    assert all("require_tuned" not in b.get("segmentation", {}) for b in BUDGETS.values())


def test_a_sweep_lifts_the_not_tuned_gate_of_the_comparisons_it_tunes_only(tmp_path):
    untuned = {k: v for k, v in PLAN.items() if k != "require_tuned"}
    rows_swept = {**untuned, "lr_sweep": [1e-3, 2e-3]}
    f = _by_id(_summary(tmp_path, _records(AGREEING), rows_swept))
    decoders = {"cbsa-f8-miou", "cbsa-f8-robust"}
    for cid, x in f.items():
        if not x.get("claim_type"):
            continue
        if cid in decoders:  # the decoders train at one rate still
            assert x["verdict"] == "inconclusive" and "not tuned" in x["gate_reasons"], cid
            assert "decoders" in x["gate"]
        else:
            assert x["verdict"] == "agrees", cid
    both = {**rows_swept, "decoders": {**PLAN["decoders"], "lr_sweep": [1e-3, 2e-3]}}
    f = _by_id(_summary(tmp_path, _records(AGREEING), both))
    assert all(x["verdict"] == "agrees" for x in f.values()), {k: x["verdict"] for k, x in f.items()}


def test_a_classifier_whose_best_swept_rate_is_at_its_grids_end_holds_back_its_comparisons(tmp_path):
    swept = {k: v for k, v in PLAN.items() if k != "require_tuned"}
    swept = {**swept, "lr_sweep": [1e-3, 2e-3, 4e-3], "decoders": {**PLAN["decoders"], "lr_sweep": [1e-3, 2e-3]}}

    def with_sweeps(best_of_cbt: float) -> dict:
        recs = _records(AGREEING)
        for m in swept["models"]:
            for lr in swept["lr_sweep"]:  # every row peaks inside its grid, except cbt where told
                best = best_of_cbt if m == "cbt" else 2e-3
                acc = 0.6 if lr == best else 0.3
                recs[sweep_id(f"{KEY}/{m}", lr)] = {"section": KEY, "result": {"accuracy": acc}}
        return recs

    inside = _by_id(_summary(tmp_path, with_sweeps(2e-3), swept))
    assert inside["cbsa-t6-persistence"]["verdict"] == "agrees"
    edge = _by_id(_summary(tmp_path, with_sweeps(1e-3), swept))
    for cid, x in edge.items():
        if x.get("claim_type") and "cbt" in (x.get("a_name"), x.get("b_name")):
            assert x["verdict"] == "inconclusive" and x["gate_reasons"] == ["not tuned"], cid
            assert "lowest of the grid" in x["gate"], cid
    assert edge["cbsa-t5-ranking#crate_cbt-vs-crate"]["verdict"] == "agrees"  # no cbt in it


@pytest.mark.parametrize("holds", [True, False])
def test_the_persistence_verdict_stands_only_if_its_comparison_at_twice_the_steps_gives_it_again(tmp_path, holds):
    plateau = {**PLAN, "plateau_rows": ["crate_cbt", "cbt"]}
    longer = AGREEING if holds else {"crate_cbt": AGREEING["cbt"], "cbt": AGREEING["crate_cbt"]}
    layers = {**AGREEING, **{f"{n}{LONGER}": longer[n] for n in ("crate_cbt", "cbt")}}
    f = _by_id(_summary(tmp_path, _records(layers), plateau))
    persistence = f["cbsa-t6-persistence"]
    if holds:
        assert persistence["verdict"] == "agrees" and "gate" not in persistence
    else:
        assert persistence["verdict"] == "inconclusive" and persistence["gate_reasons"] == ["plateau"]
    assert f["cbsa-t5-ranking#crate_cbt-vs-crate"]["verdict"] == "agrees"  # the plateau judges persistence only
    # without the runs at twice the steps, the plateau is not shown: held back
    f = _by_id(_summary(tmp_path, _records(AGREEING), plateau))
    assert f["cbsa-t6-persistence"]["gate_reasons"] == ["plateau"]


@pytest.mark.parametrize("holds", [True, False])
def test_a_ranking_pair_both_at_twice_the_steps_is_judged_on_its_runs_there(tmp_path, holds):
    plateau = {**PLAN, "plateau_rows": ["crate_cbt", "crate", "cbt"]}
    longer = AGREEING if holds else {**AGREEING, "crate": AGREEING["cbt"], "cbt": AGREEING["crate"]}
    layers = {**AGREEING, **{f"{n}{LONGER}": longer[n] for n in plateau["plateau_rows"]}}
    f = _by_id(_summary(tmp_path, _records(layers), plateau))
    ranked = f["cbsa-t5-ranking#crate-vs-cbt"]
    if holds:
        assert ranked["verdict"] == "agrees" and "gate" not in ranked and ranked["replicated_2x"]
    else:
        assert ranked["verdict"] == "inconclusive" and ranked["gate_reasons"] == ["plateau"]
    # crate_cbt-vs-crate is replicated too: with crate and cbt swapped at 2x, crate_cbt's best layer (0.8) still
    # leads crate's (0.6), so it stands either way
    assert f["cbsa-t5-ranking#crate_cbt-vs-crate"]["verdict"] == "agrees"
    assert f["cbsa-t5-ranking#crate_cbt-vs-crate"]["replicated_2x"]
    assert not f["cbsa-t5-ranking#cbt-vs-tost"].get("replicated_2x")  # tost has no runs at twice the steps
    # without the runs at twice the steps, neither is shown to hold: held back
    f = _by_id(_summary(tmp_path, _records(AGREEING), plateau))
    assert f["cbsa-t5-ranking#crate-vs-cbt"]["gate_reasons"] == ["plateau"]


def test_plateau_rows_are_planned_at_twice_the_steps_on_every_seed():
    p = {**PLAN, "plateau_rows": ["cbt"]}
    ids = {s.id: s for s in seg.plan_steps(p, 0)}
    for s in SEEDS:
        run = ids[f"{KEY}/cbt{LONGER}/seed{s}"].config["train"]
        assert run["steps"] == 2 * PLAN["train"]["steps"] and run["seed"] == s
        assert ids[f"{KEY}/zero-shot/cbt{LONGER}/seed{s}"].deps == (f"{KEY}/cbt{LONGER}/seed{s}",)
    with pytest.raises(ValueError, match="plateau_rows"):
        seg.plan_steps({**PLAN, "plateau_rows": ["crate_cbt"], "models": ["cbt"]}, 0)


def test_the_decoders_token_count_is_read_from_the_measurement_steps_config_not_a_training_runs(tmp_path):
    recs = {
        # a decoder's training run, stored first: its config has no encoder options
        f"{KEY}/decoders/cbsa/seed0": {"section": KEY, "result": {"miou": 0.5}, "config": {"train": {}}},
        **_records(AGREEING),
    }
    for s in SEEDS:
        recs[f"{KEY}/decoders/seed{s}"]["config"] = {
            "task_options": {"img_size": 32},
            "encoder_options": {"patch_size": 8},
        }
    sec = _summary(tmp_path, recs)
    flops = _by_id(sec)["cbsa-f8-flops"]
    assert "16 tokens here" in flops["gate"]  # (32 / 8)^2 patch tokens, against the paper's thousands


def test_a_changed_run_changes_the_hash_of_every_step_that_reads_it():
    """The store reuses a step by its config's hash alone: a step that reads a run must carry that run's config."""

    def hashes(plan_):
        return {s.id: s.hash for s in seg.plan_steps(plan_, 0)}

    base = hashes(PLAN)
    swept = hashes({**PLAN, "lr_sweep": [1e-3, 2e-3]})  # the rows now train at their sweeps' best rates
    assert swept[f"{KEY}/zero-shot/crate/seed1"] != base[f"{KEY}/zero-shot/crate/seed1"]
    assert swept[f"{KEY}/decoders/seed1"] == base[f"{KEY}/decoders/seed1"]
    regrid = hashes({**PLAN, "lr_sweep": [1e-3, 4e-3]})  # another grid: the same "tuned" rate, another run
    assert regrid[f"{KEY}/zero-shot/crate/seed1"] != swept[f"{KEY}/zero-shot/crate/seed1"]
    longer = hashes({**PLAN, "decoders": {**PLAN["decoders"], "steps": 3}})
    assert longer[f"{KEY}/decoders/seed1"] != base[f"{KEY}/decoders/seed1"]
    assert longer[f"{KEY}/zero-shot/crate/seed1"] == base[f"{KEY}/zero-shot/crate/seed1"]


def test_persistence_judged_over_fewer_later_layers_than_the_papers_says_so_beside_its_verdict():
    from attnzoo.compare.claims import compare
    from attnzoo.reproduce.sections.segmentation import PAPER_LATER_HALF, _later_half_caveat

    kw = dict(unit="IoU", paper="CBSA Table 6", claim="c", paper_value="v", a_name="crate_cbt", b_name="cbt")

    def persistence():
        return compare(
            [0.2, 0.21, 0.22], [0.3, 0.31, 0.32], claim_type="superiority", claim_id="cbsa-t6-persistence", **kw
        )

    shallow, deep = persistence(), persistence()
    _later_half_caveat([shallow], 4)
    _later_half_caveat([deep], 2 * PAPER_LATER_HALF)
    assert shallow.caveat == "judged at depth 4: the later half is 2 layers against the paper's 6 (L7-L12 of 12)"
    assert "caveat: judged at depth 4" in shallow.explanation and shallow.verdict == deep.verdict  # words only
    assert deep.caveat is None and not deep.explanation
