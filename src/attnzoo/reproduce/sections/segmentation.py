"""Segmentation on scenes with exact masks: zero-shot [CLS] maps (CBSA Tables 5-6, Fig. 7; ToST Fig. 5) against
untrained controls, and the segmentation decoders of CBSA Fig. 8 (mIoU, FLOPs, robustness to noise)."""

from __future__ import annotations

import numpy as np

from attnzoo.compare import claims, common
from attnzoo.compare.claims import Finding
from attnzoo.compare.common import Context, Section, Table, fmt
from attnzoo.compare.pipeline import Evidence, Longer, Plateau, Tuning, compared, judge
from attnzoo.compare.store import Step
from attnzoo.data.scenes import SceneSpec
from attnzoo.reproduce import budgets, paper_claims

KEY = "segmentation"
TITLE = "Segmentation: zero-shot [CLS] maps and decoders on scenes (CBSA Tables 5-6, Fig. 8; ToST Fig. 5)"

#: model -> (its ``attnzoo train`` preset, how the tables describe it)
MODELS: dict[str, tuple[str, str]] = {
    "crate_cbt": ("scenes_crate_cbt_small", "CRATE+CBT: MSSA in the first half of the blocks, CBSA in the second"),
    "crate": ("scenes_crate_small", "CRATE: MSSA + ISTA (convolutional stem, as CBT's)"),
    "cbt": ("scenes_cbt_small", "CBT: CBSA + ISTA"),
    "tost": ("scenes_tost_small", "ToST: TSSA blocks, then class-attention blocks"),
    "vit": ("scenes_vit_small", "ViT: softmax attention (the black-box baseline)"),
}
#: the untrained controls' rows (the trained architecture and seed, no training step)
INIT = "@init"

#: CBSA Table 5 (PASCAL VOC12, ImageNet-1k-trained -S models): IoU per target
PAPER_T5 = {
    "crate_cbt": {"foreground": 0.68, "background": 0.78, "boundary": 0.18},
    "crate": {"foreground": 0.65, "background": 0.76, "boundary": 0.17},
    "cbt": {"foreground": 0.51, "background": 0.72, "boundary": 0.15},
    "tost": {"foreground": 0.42, "background": 0.75, "boundary": 0.12},
}
#: CBSA Table 6: foreground IoU per layer (L1-L12) of the -S models
PAPER_T6 = {
    "crate_cbt": (0.37, 0.44, 0.55, 0.46, 0.56, 0.58, 0.60, 0.53, 0.59, 0.56, 0.55, 0.55),
    "crate": (0.34, 0.45, 0.51, 0.48, 0.53, 0.56, 0.53, 0.57, 0.55, 0.52, 0.50, 0.39),
    "cbt": (0.39, 0.41, 0.43, 0.42, 0.37, 0.40, 0.38, 0.33, 0.35, 0.34, 0.36, 0.33),
}
#: Table 6's later-half means (L7-L12), beside the persistence claim's figure
PAPER_T6_LATER = {n: sum(v[len(v) // 2 :]) / (len(v) - len(v) // 2) for n, v in PAPER_T6.items()}
#: Table 5's ranking as adjacent pairs (a beats b), each a test of ``cbsa-t5-ranking`` with the paper's own effect
RANKING = (("crate_cbt", "crate"), ("crate", "cbt"), ("cbt", "tost"))
TARGETS = ("foreground", "background", "boundary")
#: the Fig. 8 decoders, both on a ``vit_s`` encoder: kind -> (its ``attnzoo train`` preset, how the report names it)
DECODERS = {
    "mask_transformer": ("scenes_segmenter_small", "Segmenter (softmax mask transformer)"),
    "cbsa": ("scenes_cbsa_decoder_small", "CBSA layers, no feed-forward"),
}
DECODER_ENCODER = "vit_s"

#: a [CLS] map keeps the patches holding this fraction of its mass (DINO's rule)
MASS = 0.6
#: chance accuracy of the scenes' 10 classes (%): a classifier near it did not learn
CHANCE = 10.0
#: a decoder learned when its mIoU clears the all-background prediction's by this many points
DECODER_MARGIN = 5.0
#: "20% of the FLOPs": the claim agrees while the CBSA decoder costs at most twice that fraction of Segmenter's
FLOPS_PAPER = 0.2
FLOPS_BOUND = 2 * FLOPS_PAPER


def models_of(plan: dict) -> list[str]:
    common.check_known(plan["models"], MODELS, "segmentation model")
    return list(plan["models"])


def left_out(plan: dict) -> dict[str, str]:
    """The models the plan does not train for a reason its pilots measured (``not_tested``: model -> why): every
    comparison that needs one says that reason."""
    return budgets.left_out(plan, KEY, MODELS, models_of(plan), "models")


def controls_of(plan: dict) -> list[str]:
    """The models whose untrained copies are analysed as controls."""
    common.check_known(plan["controls"], MODELS, "segmentation control")
    return list(plan["controls"])


def plateau_rows_of(plan: dict) -> list[str]:
    """The models also trained at twice the steps on every seed; comparisons between two of them are judged there."""
    rows = list(plan.get("plateau_rows", []))
    if missing := sorted(set(rows) - set(models_of(plan))):
        raise ValueError(f"plateau_rows {missing} are not models of this segmentation plan; models: {models_of(plan)}")
    return rows


def _preset(name: str, plan: dict, model_options: dict, settings: dict) -> dict:
    """An ``attnzoo train`` preset at the plan's task options, ``model_options`` and ``settings`` (no logging keys)."""
    from attnzoo.train.config import preset_path, read_yaml

    logging = ("description", "eval_every", "ckpt_every", "log_every")
    cfg = {k: v for k, v in read_yaml(preset_path(name)).items() if k not in logging}
    cfg["task_options"] = {**cfg["task_options"], **plan.get("task_options", {})}
    cfg["model_options"] = {**cfg["model_options"], **model_options}
    cfg.update(settings, amp="off", compile=False, keep_checkpoints=1)
    return cfg


def row_config(plan: dict, name: str, seed: int) -> dict:
    """The training config of ``name``: its preset at the plan's data, ``arch``, ``row_arch`` and ``train``."""
    overrides = plan.get("row_arch", {})
    rows = sorted(set(models_of(plan)) | set(controls_of(plan)))
    if unknown := sorted(set(overrides) - set(rows)):
        raise ValueError(f"row_arch names {unknown}, not rows of this segmentation plan; valid rows: {rows}")
    arch = {**plan["arch"], **overrides.get(name, {})}
    return _preset(MODELS[name][0], plan, arch, {**plan["train"], "seed": seed})


def decoder_config(plan: dict, kind: str, seed: int) -> dict:
    """The training config of the ``kind`` decoder: its preset at the plan's ``decoders`` settings."""
    dec = plan["decoders"]
    if (encoder := dec.get("encoder", DECODER_ENCODER)) != DECODER_ENCODER:
        why = "is not one the decoder presets build"
        raise ValueError(f"segmentation decoders' encoder {encoder!r} {why}; valid: [{DECODER_ENCODER!r}]")
    options = {**dec["encoder_options"], "decoder_depth": dec["decoder_depth"]}
    settings = {k: dec[k] for k in ("steps", "batch_size", "lr")}
    settings.update(warmup_steps=dec.get("warmup_steps", 0), seed=seed)
    return _preset(DECODERS[kind][0], plan, options, settings)


def decoder_lrs(plan: dict) -> list[float]:
    """The decoders' learning-rate grid (``decoders.lr_sweep``), ascending; empty when nothing is swept."""
    return sorted(set((plan.get("decoders") or {}).get("lr_sweep", [])))


def plan_steps(plan: dict, seed: int) -> list[Step]:
    """The sweeps, then per seed each model's training, its zero-shot analysis, the controls' and the decoders'."""
    names, decoders = models_of(plan), DECODERS if plan.get("decoders") else {}
    if decoders and plan.get("decoders_not_tested"):
        raise ValueError("segmentation: decoders_not_tested says why Fig. 8 is not tested; drop decoders, or drop it")
    common.check_sweep_extra(plan, names)
    left_out(plan)
    off = seed + common.SWEEP_SEED_OFFSET  # every rate of each model's and decoder's grid, on the sweep seed
    grids = [(f"{KEY}/{n}", row_config(plan, n, off), common.row_lrs(plan, n)) for n in names]
    grids += [(f"{KEY}/decoders/{k}", decoder_config(plan, k, off), decoder_lrs(plan)) for k in decoders]
    steps = []
    for base, cfg, lrs in grids:
        for lr in lrs:
            sweep = {"train": common.sweep_train(dict(cfg, lr=lr), plan)}
            steps.append(common.section_step(KEY, common.sweep_id(base, lr), sweep, _train))
    for s in common.seed_list(plan, seed):
        probe = {"images": plan.get("images", 128), "mass": MASS}
        probe["overlays"] = plan.get("overlays", 2) if s == seed else 0  # drawn from the first seed's maps
        for name in names:
            steps += _trained_row_steps(plan, name, s, row_config(plan, name, s), probe)
        for name in plateau_rows_of(plan):  # the row's own rate, twice the steps
            train = {**row_config(plan, name, s), **common.twice_steps(plan["train"])}
            steps += _trained_row_steps(plan, name, s, train, {**probe, "overlays": 0}, common.LONGER)
        for name in controls_of(plan):
            cid = common.seeded_id(f"{KEY}/zero-shot-init/{name}", s)
            config = {"experiment": "zero-shot-init", "train": row_config(plan, name, s), **probe}
            steps.append(common.section_step(KEY, cid, config, _zero_shot))
        steps += _decoder_steps(plan, s) if decoders else []
    return steps


def _trained_row_steps(plan: dict, name: str, seed: int, train: dict, probe: dict, suffix: str = "") -> list[Step]:
    """Model ``name`` trained on ``train`` at its sweep's best rate (row ``name + suffix``), then its zero-shot maps."""
    tid = common.seeded_id(f"{KEY}/{name}{suffix}", seed)
    cfg = common.tuned({"train": train}, KEY, name, common.row_lrs(plan, name), "accuracy", True)
    # the run's whole config (its sweep's too): a change to the run changes this step's hash, so it reruns
    config = {"experiment": "zero-shot", "source": tid, "trained": cfg, **probe}
    zid = common.seeded_id(f"{KEY}/zero-shot/{name}{suffix}", seed)
    return [common.section_step(KEY, tid, cfg, _train), common.section_step(KEY, zid, config, _zero_shot, (tid,))]


def _decoder_steps(plan: dict, seed: int) -> list[Step]:
    """One seed's decoders: each kind trained (at its sweep's best rate), then both measured together."""
    dec, lrs, base = plan["decoders"], decoder_lrs(plan), f"{KEY}/decoders"
    runs = {k: common.seeded_id(f"{base}/{k}", seed) for k in DECODERS}
    trained = {k: common.tuned({"train": decoder_config(plan, k, seed)}, base, k, lrs, "miou", True) for k in DECODERS}
    # the runs' configs ride along: a changed run changes the measurement's hash, so it is measured again
    config = dict(experiment="decoders", task_options=plan.get("task_options", {}), runs=runs, trained=trained)
    config.update(seed=seed, sigmas=list(dec["sigmas"]), **{k: dec[k] for k in ("encoder_options", "draws", "images")})
    measure = common.section_step(KEY, common.seeded_id(base, seed), config, _decoders, (*runs.values(),))
    return [*(common.section_step(KEY, runs[k], trained[k], _train) for k in DECODERS), measure]


# ---- steps --------------------------------------------------------------------------------------------------


def _train(ctx: Context, step: Step) -> dict:
    """One ``attnzoo train`` run: a classifier's accuracy and parameters, or a decoder's whole-validation-set mIoU."""
    rec = common.train_run(ctx, step.id, step.config["train"], sweep=step.config.get("sweep"))
    val = rec["val"]
    if step.config["train"]["task"] == "scenes_segmentation":
        out = {"miou": val.get("miou"), "pixel_accuracy": val.get("pixel_accuracy")}
    else:
        out = {"accuracy": val.get("accuracy"), "params": common.num_params(common.load_trained(rec["run_dir"]))}
    return {**out, "val_loss": val.get("loss"), **{k: rec[k] for k in common.RUN_KEYS}}


def _zero_shot(ctx: Context, step: Step) -> dict:
    """The [CLS] maps' zero-shot segmentation of the validation scenes by a trained run, or its untrained copy."""
    from attnzoo.analysis.io import to_jsonable
    from attnzoo.analysis.segment import load_scenes_run, zero_shot_segmentation

    cfg = step.config
    if cfg["experiment"] == "zero-shot-init":
        model, task = common.untrained_model(cfg["train"])
        scenes = task.val
    else:
        model, scenes, _ = load_scenes_run(ctx.store.run_dir(cfg["source"]))
    res = zero_shot_segmentation(model, scenes, images=min(cfg["images"], len(scenes)), mass=cfg["mass"])
    if cfg["overlays"]:
        res["overlays"] = _overlay_data(model, scenes, cfg["overlays"], cfg["mass"])
    return to_jsonable(res)


def _overlay_data(model, scenes, n: int, mass: float) -> dict:
    """The first ``n`` scenes' pixels and foreground and, per layer, each scene's best-matching head's map."""
    import torch

    from attnzoo.analysis.segment import cls_attention_maps, iou, threshold_mass, upsample_masks

    idx = np.arange(min(n, len(scenes)))
    (x,), _ = scenes.get_batch(idx)
    fg = scenes.masks(idx)["foreground"]
    layers = []
    for entry in cls_attention_maps(model.eval(), x):
        maps = entry["maps"].detach().cpu()  # (B, H, Hg, Wg)
        pred = upsample_masks(threshold_mass(maps, mass), tuple(fg.shape[-2:]))
        chosen = maps[torch.arange(len(idx)), iou(pred, fg.unsqueeze(1)).argmax(1)]
        layers.append({"mechanism": entry["mechanism"], "maps": np.round(chosen.numpy(), 5).tolist()})
    pixels = np.round(scenes.pixels(idx) * 255).astype(np.uint8)
    return {"pixels": pixels.tolist(), "foreground": fg.numpy().astype(np.uint8).tolist(), "layers": layers}


def _decoders(ctx: Context, step: Step) -> dict:
    """CBSA Fig. 8 on scenes: both trained decoders measured on the same scenes, and the all-background mIoU."""
    import torch

    from attnzoo.analysis.io import to_jsonable
    from attnzoo.analysis.segment_decoders import confusion_matrix, load_segmenter_run, mean_iou, sweep_runs

    cfg = step.config
    runs = [ctx.store.run_dir(cfg["runs"][kind]) for kind in ("cbsa", "mask_transformer")]
    res = sweep_runs(runs, list(cfg["sigmas"]), draws=cfg["draws"], images=cfg["images"], seed=cfg["seed"])
    model, scenes = load_segmenter_run(runs[0])
    target = scenes.masks(np.arange(min(cfg["images"], len(scenes))))["semantic"]
    res["background_miou"] = mean_iou(confusion_matrix(torch.zeros_like(target), target, model.config.num_classes))
    return to_jsonable(res)


# ---- summary ------------------------------------------------------------------------------------------------


def _zs_stats(records: dict, base: str) -> dict | None:
    """Per-seed figures of one row's zero-shot analyses (``None`` without any)."""
    if not (rs := common.per_seed(records, base)):
        return None
    mechanisms = [lay["mechanism"] for lay in rs[0]["layers"]]
    layers = np.array([[lay["best"]["foreground"] for lay in r["layers"]] for r in rs])  # (seeds, layers)
    # Table 6 reads the model's own blocks; ToST Fig. 5 its penultimate class-attention layer (the last if only one)
    blocks = [i for i, m in enumerate(mechanisms) if m != "class_attention"]
    heads = [i for i, m in enumerate(mechanisms) if m == "class_attention"][-2:]
    return {
        "best": {t: claims.stat(r["best"][t] for r in rs) for t in TARGETS},
        "layers": layers,
        "mechanisms": mechanisms,
        "later_half": claims.stat(float(np.mean(row[blocks[len(blocks) // 2 :]])) for row in layers),
        "penultimate_class": claims.stat(row[heads[0]] for row in layers) if heads else None,
        "best_layer": int(np.argmax(layers[0])) + 1,
        "overlays": rs[0].get("overlays"),
        "seeds": len(rs),
    }


def _rows(records: dict, plan: dict) -> dict:
    """Row name -> its training and zero-shot statistics (trained models, then the untrained controls)."""
    out = {}
    for name in models_of(plan):
        zs = _zs_stats(records, f"{KEY}/zero-shot/{name}")
        if zs is not None and (trained := common.per_seed(records, f"{KEY}/{name}")):
            accuracy = claims.stat(100.0 * r["accuracy"] for r in trained)
            out[name] = dict(zs, accuracy=accuracy, params=trained[0]["params"])
    for name in controls_of(plan):
        if (zs := _zs_stats(records, f"{KEY}/zero-shot-init/{name}")) is not None:
            out[name + INIT] = dict(zs, accuracy=None, params=None)
    return out


def _decoder_stats(records: dict) -> dict | None:
    if not (rs := common.per_seed(records, f"{KEY}/decoders")):
        return None
    prefix = f"{KEY}/decoders/seed"  # the measurement steps, not the decoders' training runs
    cfg = next((r.get("config") for sid, r in records.items() if sid.removeprefix(prefix).isdigit()), None)
    img = cfg and cfg["task_options"].get("img_size", SceneSpec().canvas)
    out = {"background_miou": 100.0 * float(np.mean([r["background_miou"] for r in rs])), "seeds": len(rs)}
    out["tokens"] = (img // cfg["encoder_options"]["patch_size"]) ** 2 if cfg else None  # the decoder's patch tokens
    for kind in DECODERS:
        rows = [r["decoders"][kind] for r in rs]
        sweeps = np.array([[np.mean(v) for v in row["sweep"]["miou"]] for row in rows])  # (seeds, sigmas)
        first = rows[0]
        d = out[kind] = {"miou": claims.stat(100.0 * row["miou"] for row in rows), "sweep": 100.0 * sweeps}
        d.update(flops=first["decoder_flops"], params=first["decoder_params"], sigmas=list(first["sweep"]["sigmas"]))
        # the drop at the largest sigma, from the unperturbed model's mIoU on the same scenes
        d["drop"] = claims.stat(100.0 * (row["miou"] - s[-1]) for row, s in zip(rows, sweeps, strict=True))
    return out


def summarize(records: dict[str, dict], plan: dict, plots_dir, rel) -> Section:
    sec = Section(KEY, TITLE, intro=_intro(plan))
    res = _rows(records, plan)
    dec = _decoder_stats(records)
    sec.scale = _scale(plan, [r["params"] for r in res.values() if r.get("params")])
    sec.data = {"rows": {n: _row_data(st) for n, st in res.items()}, "decoders": dec and _decoder_data(dec)}
    if res:
        sec.tables.append(_table5(res))
        sec.add_plot(_plot_layers(res), plots_dir / "segmentation_layers.png", rel, _LAYERS_CAPTION)
        if over := {n: st["overlays"] for n, st in res.items() if st.get("overlays")}:
            sec.add_plot(_plot_overlays(over), plots_dir / "segmentation_overlays.png", rel, _OVERLAYS_CAPTION, dpi=45)
    if dec:
        sec.tables.append(_decoder_table(dec))
        sec.add_plot(_plot_sweep(dec), plots_dir / "segmentation_decoders.png", rel, _SWEEP_CAPTION)
    ev = Evidence()
    sec.findings = _zero_shot_findings(res, ev.gates, left_out(plan))
    _later_half_caveat(sec.findings, plan["arch"]["depth"])
    sec.findings += _decoder_findings(dec, ev.gates, plan.get("decoders_not_tested"))
    if plan.get("require_learned", True):
        ev.unlearned = _unlearned(res, dec)
        if ev.unlearned:
            sec.notes.append("did not learn: " + "; ".join(ev.unlearned.values()))
    if plan.get("require_tuned", True):
        ev.gates += _untuned_gates(sec.findings, plan)
        if plan.get("lr_sweep") and res:  # a flat top within the seeds' spread is not held against a row
            rows, label = [n for n in models_of(plan) if n in res], "validation accuracy %"
            noise = {r: res[r]["accuracy"].std for r in rows}
            untuned = common.tune_rows(sec, records, plan, rows, KEY, "accuracy", True, 100.0, label, noise=noise)
            ev.tuning.append(Tuning(untuned))
    ev.plateaus += _plateaus(records, plan, sec.findings, res)
    judge(sec.findings, ev)
    return sec


def _plateaus(records: dict, plan: dict, findings: list[Finding], res: dict) -> list[Plateau]:
    """Each zero-shot comparison whose two rows both ran at twice the steps, again there: it stands only if the same
    rule gives the same verdict there and the effect moves less than its interval clears the boundary by (the
    replicated gate). Table 6 compares the later half, Table 5 the best layer."""
    longer = plateau_rows_of(plan)
    runs = {n: _zs_stats(records, f"{KEY}/zero-shot/{n}{common.LONGER}") for n in longer}
    out = []
    for f in findings:
        a, b = f.a_name, f.b_name
        if not {a, b} <= set(longer) or not f.claim_id.startswith(("cbsa-t5-", "cbsa-t6-")):
            continue
        keys = ("later_half",) if f.claim_id == "cbsa-t6-persistence" else ("best", "foreground")
        rows = {a: Longer(a, _at(res, a, *keys), _at(runs, a, *keys))}
        base, twice = _at(res, b, *keys), _at(runs, b, *keys)
        out.append(Plateau(b, b, base, twice, "IoU", ".3f", judges=lambda g, f=f: g is f, rows=rows, key=f.claim_id))
    return out


def _untuned_gates(findings: list[Finding], plan: dict) -> list:
    """The classifiers' (decoders') comparisons held back as not tuned where their learning rate was not swept."""
    gates = []
    for f in filter(compared, findings):
        rows, swept = ("decoders", decoder_lrs(plan)) if f.a_name in DECODERS else ("classifiers", plan.get("lr_sweep"))
        if not swept:
            gates.append((f, "not tuned", f"not tuned: the {rows} train at the budget's one rate, without a sweep"))
    return gates


def _at(stats: dict | None, name: str, *keys: str):
    """``stats[name][key][...]``, ``None`` without that row."""
    out = (stats or {}).get(name)
    for k in keys if out is not None else ():
        out = out[k]
    return out


def _compare(
    stats: dict | None, claim_id: str, a: str, b: str, keys: tuple[str, ...], absent: dict | None = None, **kw
) -> Finding:
    """Rows ``a`` and ``b`` compared on ``stats[row][keys...]`` for the claim ``claim_id``; not tested, with the
    plan's reason, where either row is one the plan leaves out (``absent``: row -> why)."""
    absent = absent or {}
    if why := absent.get(a) or absent.get(b):
        return claims.not_tested(**paper_claims.finding_kw(claim_id), why=why)
    kw = {**paper_claims.compare_kw(claim_id), **kw}  # a pair's own paper effect over the claim's
    return claims.compare(_at(stats, a, *keys), _at(stats, b, *keys), a_name=a, b_name=b, **kw)


#: CBSA Table 6's later half: L7-L12 of its 12-layer -S models
PAPER_LATER_HALF = 6


def _later_half_caveat(findings: list[Finding], depth: int) -> None:
    """Table 6's persistence judged over fewer later-half layers than the paper's: said beside its verdict."""
    if depth // 2 >= PAPER_LATER_HALF:
        return
    for f in findings:
        if f.claim_id == "cbsa-t6-persistence" and f.verdict != "not tested":
            f.caveat = (
                f"judged at depth {depth}: the later half is {depth // 2} layers against the paper's "
                f"{PAPER_LATER_HALF} (L7-L12 of 12)"
            )
            claims.explain(f, f"caveat: {f.caveat}")


def _zero_shot_findings(res: dict, gates: list, absent: dict[str, str] | None = None) -> list[Finding]:
    """Table 5's ranking (adjacent pairs), Table 6's persistence and ToST Fig. 5 against its control."""
    iou, out = {"unit": "IoU", "spec": ".3f", "absent": absent}, []
    for a, b in RANKING:
        effect = round(PAPER_T5[a]["foreground"] - PAPER_T5[b]["foreground"], 6)
        claim = f"cbsa-t5-ranking#{a}-vs-{b}"
        out.append(_compare(res, claim, a, b, ("best", "foreground"), paper_effect=effect, **iou))
    persistence = _compare(res, "cbsa-t6-persistence", "crate_cbt", "cbt", ("later_half",), **iou)
    gates += _untrained_gates(persistence, res, "crate_cbt")
    tost = _compare(res, "tost-f5-segments", "tost", "tost" + INIT, ("penultimate_class",), **iou)
    return [*out, persistence, tost]


def _vs_untrained(f: Finding, res: dict, name: str, *keys: str) -> tuple[float, tuple | None, str, bool] | None:
    """For a decided ``f``, the trained ``name`` against its untrained copy on ``res[...][keys]``: effect, 95%
    interval, both in words and whether the interval is above zero (``None`` if undecided or without either row)."""
    trained, init = _at(res, name, *keys), _at(res, name + INIT, *keys)
    if claims.numbers_verdict(f) not in claims.DECIDED or trained is None or init is None:
        return None
    effect, ci, _ = claims.welch_ci(trained, init)
    where = f"{effect:+.3f}" + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else " (one seed: no interval)")
    return effect, ci, where, ci is not None and ci[0] > 0


def _untrained_gates(f: Finding, res: dict, name: str) -> list:
    """The trained ``name`` against its untrained copy. An agreement is held back where its later half is not shown
    above the copy's; a disagreement stands (its later half failing to keep maps is what the claim denies) and says
    where it stands. Either verdict is held back unless its best layer segments better than the copy's: persistence
    presupposes that segmentation emerged, else the comparison reads the initialisation."""
    gates = []
    if vs := _vs_untrained(f, res, name, "later_half"):
        effect, ci, where, above = vs
        f.random_init_control = {"row": name + INIT, "effect": effect, "ci95": list(ci) if ci else None}
        if claims.numbers_verdict(f) == "disagrees":
            said = "above" if above else "not shown above"
            claims.explain(f, f"{name}'s later half is {where} IoU from its untrained copy's ({said} it)")
        elif not above:
            on = "on the later-half layers' mean foreground IoU: not shown above it"
            gates.append((f, "control", f"the trained {name} is {where} IoU from its untrained copy {on}"))
    if vs := _vs_untrained(f, res, name, "best", "foreground"):
        *_, where, above = vs
        if above:
            claims.explain(f, f"segmentation emerged: {name}'s best layer {where} IoU above its untrained copy's")
        else:
            why = f"the trained {name}'s best layer is {where} IoU from its untrained copy's: its maps never emerged"
            gates.append((f, "did not learn", why))
    return gates


def _decoder_findings(dec: dict | None, gates: list, not_tested: str | None = None) -> list[Finding]:
    """CBSA Fig. 8: mIoU, FLOPs and robustness of the CBSA decoder against Segmenter's (``not_tested``: why the plan
    trains no decoder)."""
    if not_tested:
        ids = ("cbsa-f8-miou", "cbsa-f8-flops", "cbsa-f8-robust")
        return [claims.not_tested(**paper_claims.finding_kw(i), why=" ".join(not_tested.split())) for i in ids]
    rows = ("cbsa", "mask_transformer")
    miou = _compare(dec, "cbsa-f8-miou", *rows, ("miou",), unit="pts", spec=".1f")
    robust = _compare(dec, "cbsa-f8-robust", *rows, ("drop",), unit="pts", lower_is_better=True, spec=".1f")
    if not dec:
        why = "no decoder measurement at this budget"
        return [miou, claims.not_tested(**paper_claims.finding_kw("cbsa-f8-flops"), why=why), robust]
    cb, mt = (dec[k] for k in rows)
    robust.measured = f"mIoU drop at sigma={cb['sigmas'][-1]:g}: " + robust.measured
    for f in (miou, robust):
        f.flops_a, f.flops_b, f.params_a, f.params_b = cb["flops"], mt["flops"], cb["params"], mt["params"]
    ratio = cb["flops"] / mt["flops"]
    mflops = f"cbsa {cb['flops'] / 1e6:.2f}M vs mask_transformer {mt['flops'] / 1e6:.2f}M"
    measured = f"decoder FLOPs per image: {mflops} ({ratio:.1%})"
    rule = (
        f"agrees if the CBSA decoder's FLOPs are at most {FLOPS_BOUND:.0%} of Segmenter's (twice the paper's "
        f"{FLOPS_PAPER:.0%}), else disagrees (torch.utils.flop_counter, one image)"
    )
    flops = paper_claims.measured_finding("cbsa-f8-flops", measured, ratio <= FLOPS_BOUND, rule, "paper")
    need = paper_claims.get("cbsa-f8-flops").conditions
    if dec["tokens"] is not None and dec["tokens"] < need.min_n:
        why = f"{dec['tokens']} tokens here, about {need.min_n:,} in the paper ({need.note})"
        gates.append((flops, "conditions", why))
    return [miou, flops, robust]


def _unlearned(res: dict, dec: dict | None) -> dict[str, str]:
    """The classifiers that did not learn the scenes and the decoders not above predicting background, with why."""
    unlearned = {
        n: f"{len(common.unlearned_seeds(st['accuracy'].values, CHANCE))} of {st['accuracy'].n} seeds of {n} "
        f"within {common.LEARNED_MARGIN:g} points of chance {CHANCE:g}% "
        f"({', '.join(f'{v:.1f}' for v in st['accuracy'].values)}%)"
        for n, st in res.items()
        if st.get("accuracy") is not None and not common.learned(st["accuracy"].values, CHANCE)
    }
    for kind in DECODERS if dec else ():
        if (m := dec[kind]["miou"].mean) < dec["background_miou"] + DECODER_MARGIN:
            unlearned[kind] = (
                f"the {kind} decoder's mIoU {m:.1f} is not {DECODER_MARGIN:g} points above predicting background "
                f"everywhere ({dec['background_miou']:.1f})"
            )
    return unlearned


def _row_data(st: dict) -> dict:
    out = {"accuracy_per_seed": list(st["accuracy"].values) if st.get("accuracy") else None, "params": st.get("params")}
    out |= {f"{t}_per_seed": list(st["best"][t].values) for t in TARGETS}
    out |= {"foreground_per_layer": st["layers"].tolist(), "mechanisms": st["mechanisms"]}
    return out | {"later_half_per_seed": list(st["later_half"].values), "seeds": st["seeds"]}


def _decoder_data(dec: dict) -> dict:
    out = {"background_miou": dec["background_miou"], "seeds": dec["seeds"]}
    for kind in DECODERS:
        d = dec[kind]
        out[kind] = dict(miou_per_seed=list(d["miou"].values), decoder_flops=d["flops"], decoder_params=d["params"])
        out[kind].update(sigmas=d["sigmas"], miou_by_sigma_per_seed=d["sweep"].tolist())
        out[kind]["drop_per_seed"] = list(d["drop"].values)
    return out


def _name(row: str) -> str:
    return f"{row} (untrained control)" if row.endswith(INIT) else row


def _table5(res: dict) -> Table:
    heads = ["model", "description", "params", "val acc %", *TARGETS, "best fg layer", "later-half fg"]
    heads += ["paper (fg / bg / boundary)", "paper later-half fg (Table 6)"]
    rows = []
    for n, st in res.items():
        acc = st["accuracy"].fmt(".1f") if st.get("accuracy") else "-"
        here = [*(st["best"][t].fmt(".3f") for t in TARGETS), f"L{st['best_layer']}", st["later_half"].fmt(".3f")]
        paper = " / ".join(f"{PAPER_T5[n][t]:.2f}" for t in TARGETS) if n in PAPER_T5 else "-"
        later = f"{PAPER_T6_LATER[n]:.2f}" if n in PAPER_T6_LATER else "-"
        rows.append([_name(n), MODELS[n.removesuffix(INIT)][1], fmt(st["params"], ","), acc, *here, paper, later])
    caption = (
        "IoU of the thresholded [CLS] map with each target (mean ± sample std over seeds), best over layers and heads "
        "(CBSA Table 5's 'best-performing attention maps'); best fg layer: the layer whose best head scores highest "
        "(first seed); later-half fg: mean of the later-half blocks' best heads (no class attention; per layer: plot "
        "below), the persistence claim's figure."
    )
    return Table("Zero-shot segmentation of the [CLS] maps (CBSA Tables 5-6)", heads, rows, caption)


def _decoder_table(dec: dict) -> Table:
    sigmas = dec["cbsa"]["sigmas"]
    heads = ["decoder", "design", "decoder params", "decoder MFLOPs / image", "mIoU %"]
    heads += [f"mIoU % at σ={s:g}" for s in sigmas] + [f"drop at σ={sigmas[-1]:g}"]
    rows = []
    for kind, (_, what) in DECODERS.items():
        d = dec[kind]
        noisy = [claims.stat(at_sigma).fmt(".1f") for at_sigma in d["sweep"].T]
        size = [fmt(d["params"], ","), fmt(d["flops"] / 1e6, ".2f")]
        rows.append([kind, what, *size, d["miou"].fmt(".1f"), *noisy, d["drop"].fmt(".1f")])
    caption = (
        f"Both decoders train from one initial encoder (per-pixel cross-entropy on the scenes' semantic maps); mIoU "
        f"over the object classes and background, mean ± std over {dec['seeds']} seeds; at each σ, the mean over "
        f"draws of N(0, σ²) added to every attention parameter of the decoder. Predicting background everywhere: "
        f"{dec['background_miou']:.1f}. FLOPs exclude pairwise similarities."
    )
    return Table("Segmentation decoders (CBSA Fig. 8)", heads, rows, caption)


def _intro(plan: dict) -> str:
    arch, tr, opts = plan["arch"], plan["train"], plan.get("task_options", {})
    n = plan.get("seeds", 1)
    rate = common.rate_text([lr for m in models_of(plan) for lr in common.row_lrs(plan, m)], tr["lr"], "each")
    wider = "; ".join(
        f"{m} at " + ", ".join(f"{k} {v}" for k, v in o.items()) for m, o in plan.get("row_arch", {}).items()
    )
    lo, hi = opts.get("min_objects", 1), opts.get("max_objects", 3)
    text = (
        f"Scenes of {lo if lo == hi else f'{lo}-{hi}'} object{'s' * (hi > 1)} with exact masks (`scenes`, "
        f"{opts.get('n_train', 10000):,} training scenes); classifiers {', '.join(models_of(plan))}: `scenes_*_small` "
        f"presets at width {arch['dim']}, depth {arch['depth']}, {arch['heads']} heads, patch "
        f"{arch['patch_size']}" + (f" ({wider})" if wider else "") + f", {tr['steps']} steps of batch "
        f"{tr['batch_size']} ({rate}), {n} seed{'s' if n > 1 else ''}. Each attention "
        f"layer's [CLS] map (CBSA: the [CLS] row of A_k A_kᵀ, Fig. 7; TSSA: its memberships Π; class attention: the "
        f"[CLS] query's map) keeps the patches holding the top {MASS:.0%} of its mass (DINO's rule), "
        f"scored on the first {plan.get('images', 128)} validation scenes. Untrained controls (same architecture and "
        f"seed): {', '.join(controls_of(plan))}."
    )
    if dec := plan.get("decoders"):
        text += (
            f" Decoders (Fig. 8): a {dec.get('encoder', DECODER_ENCODER)} encoder (width "
            f"{dec['encoder_options'].get('dim')}, depth {dec['encoder_options'].get('depth')}) with a "
            f"{dec['decoder_depth']}-layer decoder of either kind (`attnzoo train` "
            f"{' / '.join(p for p, _ in DECODERS.values())}), {dec['steps']} steps of batch "
            f"{dec['batch_size']} ({common.rate_text(decoder_lrs(plan), dec['lr'], 'each')}); noise σ in "
            f"{list(dec['sigmas'])}, {dec['draws']} draws each."
        )
    return text


def _scale(plan: dict, params: list[int]) -> str:
    arch, tr, opts = plan["arch"], plan["train"], plan.get("task_options", {})
    size = f"{min(params):,}-{max(params):,} parameters" if params else "no trained row"
    img, width = opts.get("img_size", 64), common.width_text(plan, models_of(plan))
    return (
        f"here {img}x{img} scenes ({opts.get('n_train', 10000):,} training scenes, {(img // arch['patch_size']) ** 2} "
        f"tokens), {width}, depth {arch['depth']}, {size}, {tr['steps']} steps of batch "
        f"{tr['batch_size']}; the papers: ImageNet-1k-trained -S models (12 layers, width 384) scored zero-shot on "
        "PASCAL VOC12 (CBSA Tables 5-6, ToST Fig. 5), decoders trained on ADE20K (CBSA Fig. 8)"
    )


_LAYERS_CAPTION = (
    "Left: foreground IoU per attention layer (best head; seed mean, bars: std; dashed: untrained controls) against "
    "relative depth. Right: CBSA Table 6's 12-layer -S models on PASCAL VOC12."
)
_OVERLAYS_CAPTION = (
    "First seed's maps, first validation scenes: per layer, the head whose kept region (cyan: the top of its mass) "
    "best matches the objects (green)."
)
_SWEEP_CAPTION = "Each decoder's mIoU against the noise σ on its attention parameters (CBSA Fig. 8); band: seed range."


def _plot_layers(res: dict):
    plt = common.pyplot()
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    colors = {n: f"C{i}" for i, n in enumerate(MODELS)}
    for n, st in res.items():
        base, lay = n.removesuffix(INIT), st["layers"]
        x = (np.arange(lay.shape[1]) + 1) / lay.shape[1]
        err = lay.std(0, ddof=1) if st["seeds"] > 1 else None
        style = "o--" if n != base else "o-"
        ax0.errorbar(x, lay.mean(0), yerr=err, fmt=style, ms=3, color=colors[base], label=_name(n), capsize=2)
    for n, vals in PAPER_T6.items():
        ax1.plot((np.arange(len(vals)) + 1) / len(vals), vals, "o-", ms=3, color=colors[n], label=n)
    for ax, title in ((ax0, "here: scenes"), (ax1, "CBSA Table 6: PASCAL VOC12")):
        ax.set_xlabel("layer / number of layers")
        ax.set_title(title, fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    ax0.set(ylabel="foreground IoU (best head)", ylim=(0, 1))
    fig.suptitle("Zero-shot segmentation across layers")
    fig.tight_layout()
    return fig


def _plot_overlays(over: dict):
    import torch
    import torch.nn.functional as F

    from attnzoo.analysis.segment import threshold_mass, upsample_masks

    plt = common.pyplot()
    rows = [(n, i) for n, o in over.items() for i in range(len(o["pixels"]))]
    cols = 1 + max(len(o["layers"]) for o in over.values())
    fig, axes = plt.subplots(len(rows), cols, figsize=(1.25 * cols + 0.4, 1.3 * len(rows) + 0.5), squeeze=False)
    for r, (n, i) in enumerate(rows):
        o = over[n]
        pixels, fg = np.asarray(o["pixels"][i]) / 255.0, np.asarray(o["foreground"][i])
        axes[r, 0].imshow(pixels, cmap="gray", vmin=0, vmax=1)
        axes[r, 0].contour(fg, levels=[0.5], colors=["lime"], linewidths=0.6)
        axes[r, 0].set_ylabel(f"{_name(n)}\nscene {i}", fontsize=6)
        for c, lay in enumerate(o["layers"], start=1):
            m = torch.tensor(lay["maps"][i], dtype=torch.float64)
            kept = upsample_masks(threshold_mass(m, MASS), pixels.shape)
            heat = F.interpolate(m[None, None].float(), size=pixels.shape, mode="nearest")[0, 0]
            axes[r, c].imshow(pixels, cmap="gray", vmin=0, vmax=1)
            axes[r, c].imshow(heat.numpy(), cmap="inferno", alpha=0.6)
            axes[r, c].contour(kept.numpy().astype(float), levels=[0.5], colors=["cyan"], linewidths=0.6)
            if r == 0 or rows[r - 1][0] != n:
                axes[r, c].set_title(f"L{c} {lay['mechanism']}", fontsize=6)
    for ax in axes.flat:
        ax.set(xticks=[], yticks=[])
        if not ax.images:
            ax.axis("off")
    fig.suptitle(f"[CLS] maps, best head per layer; cyan: top {MASS:.0%} of the mass", fontsize=8)
    fig.tight_layout()
    return fig


def _plot_sweep(dec: dict):
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    for c, kind in enumerate(DECODERS):
        d = dec[kind]
        ax.plot(d["sigmas"], d["sweep"].mean(0), "o-", color=f"C{c}", label=f"{kind} ({d['miou'].fmt('.1f')})")
        ax.fill_between(d["sigmas"], d["sweep"].min(0), d["sweep"].max(0), color=f"C{c}", alpha=0.2)
    ax.axhline(dec["background_miou"], color="gray", ls=":", label="background everywhere")
    ax.set(xlabel="noise std σ on the decoder's attention parameters", ylabel="mIoU (%)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("CBSA Fig. 8 on scenes: robustness of the decoders", fontsize=9)
    fig.tight_layout()
    return fig
