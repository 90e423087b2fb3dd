"""White-box probes (``attnzoo.analysis``): AoT's denoising theorem (Fig. 4, at two step sizes η), CBSA's compression
of noisy lines (Fig. 4), rank collapse without skip connections (CSP Thm 1), the per-layer compression term (ToST
Fig. 4a, CBSA Fig. 5, CRATE) of vision models trained for the probe at ``layerwise_depth`` layers (the vision section's
recipe otherwise), measured as CRATE's code measures it, with the vision section's shallow models as an ablation, and
the attention maps of the vision section's models (ToST Fig. 5 / FAST Fig. 4).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from attnzoo.reproduce import claims, paper_claims
from attnzoo.reproduce.common import (
    Context,
    Section,
    Table,
    fmt,
    load_trained,
    save_figure,
    seeded_id,
    train_run,
)
from attnzoo.reproduce.store import Step

KEY = "probes"
TITLE = "White-box probes"


#: eta of AoT Fig. 4's second run: a small step, where the soft-max iteration is compared (the paper gives no eta)
SMALL_ETA = 0.02

#: the probe models with a layer-wise claim: ToST Fig. 4a's for tost, a test of CBSA Fig. 5's for the others
#: (``_layerwise_claim`` names the claim)
LAYERWISE_MODELS = ("tost", "crate", "cbt", "aot")

#: the measure each mechanism's claim is judged on: ToST's own R^var_c for TSSA, CRATE's measured R^c otherwise
_CLAIM_MEASURE = {"tssa": "variational_compression"}
_DEFAULT_MEASURE = "crate_compression"
#: the measure each paper's figure plots, where the claim measure differs from it: ToST Fig. 4a the TSSA layers'
#: outputs with their own memberships; CBSA Fig. 5 the compression term of its eq 2 on the raw tokens
_LITERAL_MEASURE = {"tssa": "variational_compression_out"}
_DEFAULT_LITERAL = "compression"


#: every probe finding tests a paper's claim with a rule of its own (trends over layers or iterations)
_finding = functools.partial(claims.finding, kind="paper", measurement=True)


def _deep_vision_plan(plan: dict, vision_plan: dict) -> dict:
    """The vision section's plan with the probe models' depth (``layerwise_depth``) and training overrides."""
    depth = plan.get("layerwise_depth", vision_plan["arch"]["depth"])
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 2:
        raise ValueError(f"probes' layerwise_depth must be an int >= 2 (layer-wise claims need layers), got {depth!r}")
    return {
        **vision_plan,
        "arch": {**vision_plan["arch"], "depth": depth},
        "train": {**vision_plan["train"], **plan.get("layerwise_train", {})},
    }


def plan_steps(plan: dict, seed: int, vision_plan: dict) -> list[Step]:
    steps = _synthetic_steps(plan, seed)
    batch = {"task": vision_plan["task"], "task_options": vision_plan["task_options"], "n": 8}
    lw_batch = dict(batch, n=plan.get("layerwise_batch", 32))
    measure = {"eps": 0.5, "crate_eps": 0.1}
    deep = _deep_vision_plan(plan, vision_plan)
    for name in plan["layerwise"]:
        steps.extend(_layerwise_steps(name, seed, deep, vision_plan, lw_batch, measure))
        # more seeds of the models with a layer-wise claim: the verdict then rests on the seed-mean series and on
        # how many seeds agree with it (ids apart from the base seed's, so its steps are reused)
        if name in LAYERWISE_MODELS:
            for s in range(seed + 1, seed + plan.get("layerwise_seeds", 1)):
                steps.extend(_layerwise_steps(name, s, deep, vision_plan, lw_batch, measure, suffix=f"/extra-seed{s}"))
    steps.extend(_maps_steps(plan, seed, vision_plan, batch))
    return steps


def _synthetic_steps(plan: dict, seed: int) -> list[Step]:
    """The parameter-free probes: denoise at two step sizes (and at the small one with the same ηL), compress, and
    rank collapse."""
    den = dict(plan["denoise"], seed=seed)
    big_eta = den.get("eta", 0.1)
    layers = den.get("layers", 12)
    small = plan.get("denoise_small_eta", SMALL_ETA)
    return [
        Step(
            f"{KEY}/denoise",
            KEY,
            {"experiment": "denoise", "params": dict(den, eta=big_eta)},
            _run_synth,
            label="denoise",
        ),
        Step(
            f"{KEY}/denoise/eta{small:g}",
            KEY,
            {"experiment": "denoise", "params": dict(den, eta=small)},
            _run_synth,
            label=f"denoise/eta{small:g}",
        ),
        # the same total step eta*L as the first run: does the soft-max iteration's fall depend on eta or on eta*L?
        Step(
            f"{KEY}/denoise/eta{small:g}-matched",
            KEY,
            {"experiment": "denoise", "params": dict(den, eta=small, layers=max(1, round(layers * big_eta / small)))},
            _run_synth,
            label=f"denoise/eta{small:g}-matched",
        ),
        Step(
            f"{KEY}/compress",
            KEY,
            {"experiment": "compress", "params": dict(plan["compress"], seed=seed)},
            _run_synth,
            label="compress",
        ),
        Step(
            f"{KEY}/rank-collapse",
            KEY,
            {"experiment": "rank-collapse", "params": dict(plan["rank_collapse"], seed=seed)},
            _run_synth,
            label="rank-collapse",
        ),
    ]


def _layerwise_steps(
    name: str, seed: int, deep: dict, vision_plan: dict, lw_batch: dict, measure: dict, suffix: str = ""
) -> list[Step]:
    """One layer-wise probe model: its training at the probes' depth, its probe, and (for the base seed, when the
    vision section trains it too) the same probe on the vision section's shallow model."""
    from attnzoo.reproduce.sections import vision

    if name not in vision.MODELS:
        raise ValueError(f"unknown layer-wise probe model {name!r}; valid: {sorted(vision.MODELS)}")
    config = vision.row_config(deep, name, seed)
    train = config["train"]
    tid = f"{KEY}/train/{name}{suffix}"
    steps = [
        Step(tid, KEY, config, _run_train, label=f"train/{name}{suffix}"),
        Step(
            f"{KEY}/layerwise/{name}{suffix}",
            KEY,
            {"experiment": "layerwise", "model": name, "source": tid, "train": train, "batch": lw_batch, **measure},
            _run_layerwise,
            deps=(tid,),
            label=f"layerwise/{name}{suffix}",
        ),
    ]
    if not suffix:
        # control: the same probe on the same architecture at its random initialisation (the trained model's seed),
        # so a fall that is there before training is not read as learned
        steps.append(
            Step(
                f"{KEY}/layerwise-init/{name}",
                KEY,
                {"experiment": "layerwise-init", "model": name, "train": train, "batch": lw_batch, **measure},
                _run_layerwise_init,
                label=f"layerwise-init/{name}",
            )
        )
    if name in vision_plan["models"] and not suffix:
        # ablation: the same probe on the vision section's shallow model (what the report probed before)
        vid = seeded_id(f"vision/{name}", seed)
        shallow_model = {"model_options": vision.model_options(name, vision_plan), "train": vision_plan["train"]}
        steps.append(
            Step(
                f"{KEY}/layerwise-shallow/{name}",
                KEY,
                {
                    "experiment": "layerwise",
                    "model": name,
                    "source": vid,
                    "trained": shallow_model,
                    "batch": lw_batch,
                    **measure,
                },
                _run_layerwise,
                deps=(vid,),
                label=f"layerwise-shallow/{name}",
            )
        )
    return steps


def _maps_steps(plan: dict, seed: int, vision_plan: dict, batch: dict) -> list[Step]:
    """The attention-maps step over the vision section's models named for it (none if it trains none of them)."""
    maps = [n for n in plan.get("attention_maps", []) if n in vision_plan["models"]]
    if not maps:
        return []
    return [
        Step(
            f"{KEY}/attention-maps",
            KEY,
            {"experiment": "attention-maps", "models": maps, "batch": batch},
            _run_maps,
            deps=tuple(seeded_id(f"vision/{n}", seed) for n in maps),
            label="attention-maps",
        )
    ]


def _run_train(ctx: Context, step: Step) -> dict:
    """Train a probe model (the vision section's recipe at the probes' depth); validation accuracy beside it."""
    cfg = step.config["train"]
    rec = train_run(ctx, step.id, cfg)
    return {
        "accuracy": rec["val"].get("accuracy"),
        "val_loss": rec["val"].get("loss"),
        "run_dir": rec["run_dir"],
        "depth": cfg["model_options"]["depth"],
        "steps": cfg["steps"],
        "batch_size": cfg["batch_size"],
        "curve": rec["curve"],
        "val_curve": rec["val_curve"],
    }


def _run_synth(_ctx: Context, step: Step) -> dict:
    from attnzoo.analysis import compress, denoise, rank_collapse
    from attnzoo.analysis.io import to_jsonable

    fn = {"denoise": denoise, "compress": compress, "rank-collapse": rank_collapse}[step.config["experiment"]]
    return to_jsonable(fn(**step.config["params"]))


def _val_batch(cfg: dict):
    from attnzoo.data import build_task

    task = build_task(cfg["task"], **cfg["task_options"])
    (x,), _ = task.val.get_batch(np.arange(min(cfg["n"], len(task.val))))
    return x


def _trained(ctx: Context, name: str, source: str | None = None):
    sid = source or seeded_id(f"vision/{name}", ctx.seed)
    rec = ctx.store.load_by_id(sid)
    if rec is None:
        raise RuntimeError(f"probe needs the trained model {name!r} of step {sid!r}; that step has not run")
    return load_trained(rec["result"]["run_dir"])


def _run_layerwise(ctx: Context, step: Step) -> dict:
    from attnzoo.analysis import layerwise
    from attnzoo.analysis.io import to_jsonable

    cfg = step.config
    model = _trained(ctx, cfg["model"], cfg.get("source"))
    return to_jsonable(layerwise(model, _val_batch(cfg["batch"]), eps=cfg["eps"], crate_eps=cfg.get("crate_eps", 0.1)))


def _run_layerwise_init(_ctx: Context, step: Step) -> dict:
    """The layer-wise probe on the probe model's architecture as initialised by its training seed (no step taken)."""
    import torch

    from attnzoo.analysis import layerwise
    from attnzoo.analysis.io import to_jsonable
    from attnzoo.data import build_task
    from attnzoo.train.config import from_dict
    from attnzoo.train.objectives import build_task_model

    cfg = step.config
    tcfg = from_dict({**cfg["train"], "eval_every": 1})
    task = build_task(tcfg.task, **tcfg.task_options)
    torch.manual_seed(tcfg.seed)
    model = build_task_model(tcfg, task).eval()
    return to_jsonable(layerwise(model, _val_batch(cfg["batch"]), eps=cfg["eps"], crate_eps=cfg.get("crate_eps", 0.1)))


def _run_maps(ctx: Context, step: Step) -> dict:
    from attnzoo.analysis import attention_maps
    from attnzoo.analysis.io import to_jsonable

    models = {n: _trained(ctx, n) for n in step.config["models"]}
    x = _val_batch(step.config["batch"])
    return to_jsonable(attention_maps(models, x))


def _num(v) -> float:
    """JSON numbers back to floats (the analysis package writes non-finite values as strings)."""
    if isinstance(v, str):
        return float(v)
    return float(v) if v is not None else math.nan


def summarize(records: dict[str, dict], plan: dict, plots_dir, rel) -> Section:
    sec = Section(KEY, TITLE)
    all_res = {sid.split("/", 1)[1]: rec["result"] for sid, rec in records.items()}
    # extra seeds of the layer-wise models: {name: [(train result, probe result), ...]}, kept out of the tables
    res = {k: v for k, v in all_res.items() if "/extra-seed" not in k}
    more: dict[str, list] = {}
    for k, v in sorted(all_res.items()):
        if k.startswith("layerwise/") and "/extra-seed" in k:
            name, tail = k.split("/", 1)[1].split("/", 1)
            more.setdefault(name, []).append((all_res.get(f"train/{name}/{tail}", {}), v))
    trained = {k.split("/", 1)[1]: v for k, v in res.items() if k.startswith("train/")}
    depth = next((t["depth"] for t in trained.values()), plan.get("layerwise_depth"))
    steps = next((t["steps"] for t in trained.values()), None)
    sec.intro = (
        "Synthetic probes run the papers' parameter-free iterations (`attnzoo analyze`); the layer-wise probe "
        f"measures vision models trained for it ({depth} layers, {steps} steps, the vision recipe otherwise) on "
        f"validation images. {FALL_RULE}"
    )
    plot = _plotter(sec, plots_dir, rel)
    dn = {k: v for k, v in res.items() if k == "denoise" or k.startswith("denoise/")}
    if "denoise" in dn:
        _denoise_table(sec, dn, plot)
    if "compress" in res:
        _compress_table(sec, res["compress"], plot)
    if "rank-collapse" in res:
        _rank_collapse_table(sec, res["rank-collapse"], plot)
    lw = {k.split("/", 1)[1]: v for k, v in res.items() if k.startswith("layerwise/")}
    shallow = {k.split("/", 1)[1]: v for k, v in res.items() if k.startswith("layerwise-shallow/")}
    init = {k.split("/", 1)[1]: v for k, v in res.items() if k.startswith("layerwise-init/")}
    if lw:
        _layerwise_table(sec, lw, trained, depth, plot)
    if init:
        _init_table(sec, lw, init)
    curves = {n: t["val_curve"] for n, t in trained.items() if t.get("val_curve")}
    if curves:
        from attnzoo.reproduce.common import plot_val_curves, save_figure

        path = plots_dir / "probes_curves.png"
        rows = {n: [[p["step"], 100.0 * p["accuracy"]] for p in c if "accuracy" in p] for n, c in curves.items()}
        save_figure(plot_val_curves([("probe models", rows)], "validation accuracy (%)", "Probe models"), path)
        sec.plots.append((rel(path), "Validation accuracy of the probe models during training."))
    if "attention-maps" in res:
        plot(
            "attention-maps",
            res["attention-maps"],
            "Attention maps of the trained models (ToST Fig. 5 / FAST Fig. 4).",
        )
    sec.data = {k: _slim(v) for k, v in res.items()}
    majority = 100.0 * plan.get("majority", 0.1)
    unlearned = {
        n
        for n, t in trained.items()
        if t.get("accuracy") is None or 100.0 * _num(t["accuracy"]) < majority + LEARNED_MARGIN
    }
    if plan.get("require_learned", True) and unlearned:
        sec.notes.append(
            f"probe model(s) {', '.join(sorted(unlearned))} did not reach {LEARNED_MARGIN:g} points above "
            f"the {majority:.0f}% majority class; their layer-wise claims are not judged"
        )
        lw = {n: r for n, r in lw.items() if n not in unlearned}
    if plan.get("require_learned", True):  # extra seeds that did not learn are left out of their model's verdict
        more = {n: [(t, r) for t, r in runs if _learned(t, majority)] for n, runs in more.items()}
    sec.findings = _findings(res, lw, shallow, {n: [r for _, r in runs] for n, runs in more.items()})
    for f in sec.findings:
        name = f.get("probe_model")
        if name in init and name in lw:
            apply_init_control(f, init_control(lw[name], init[name], [r for _, r in more.get(name, [])]))
    return sec


def apply_init_control(f: dict, control: dict) -> dict:
    """Attach the random-initialisation control to a layer-wise finding; a trend the untrained model shows as
    strongly is not credited to training, so its verdict is gated (reason ``control``)."""
    f["random_init_control"] = control["data"]
    f["explanation"] = (f.get("explanation", "") + "; " if f.get("explanation") else "") + control["text"]
    if control["data"] and control["data"]["reading"] == INIT_FALLS_AS_MUCH:
        claims.gate(f, "the random-initialisation control falls as much", "control")
    return f


#: the control's reading when the untrained architecture shows the trend as strongly (the verdict is then gated)
INIT_FALLS_AS_MUCH = "the untrained model falls as much: the trend is the architecture's, not learned"


def init_control(trained: dict, init: dict, more: list[dict] | None = None) -> dict:
    """The random-initialisation control of a layer-wise claim, in words chosen from the numbers.

    ``trained`` and ``more`` are the probe results of the trained model's seeds, ``init`` the same probe on the
    untrained model of the base seed. Returns ``{"text", "data"}``: the control's series and verdict by the same
    rule, and whether the trained fall is learned (the control does not fall), there before training (both fall,
    the trained one by no more than twice the control's), deepened by training (both fall, the trained one by
    more than twice), undone by training (only the control falls) or absent from both.
    """
    key = _measure_key(trained)
    tr = _layer_series(trained, key)
    runs = [tr] + [v for m in more or [] if len(v := _layer_series(m, key)) == len(tr)]
    mean = [sum(x[i] for x in runs) / len(runs) for i in range(len(tr))]
    iv = _layer_series(init, key)
    if len(iv) != len(mean) or len(mean) < 2:
        return {"text": "random-initialisation control: no comparable series", "data": None}
    start, *_ = _layerwise_claim("", key, len(mean))
    v_tr, v_init = _fall_verdict(mean, start), _fall_verdict(iv, start)
    d_tr, d_init = _delta(mean, start), _delta(iv, start)
    if v_tr != "agrees" and v_init == "agrees":
        reading = "the untrained architecture falls and the trained model does not: training undoes the trend"
    elif v_tr != "agrees":
        reading = "neither the trained nor the untrained model shows the fall"
    elif v_init != "agrees":
        reading = "the untrained model does not fall: training produces the trend"
    elif d_tr < 2 * d_init:  # both negative: the trained fall is more than twice the untrained one
        reading = "training deepens a fall the untrained architecture already has"
    else:
        reading = INIT_FALLS_AS_MUCH
    text = (
        f"random-initialisation control: untrained {d_init:+.4g} ({_downs(iv, start)} of {len(iv) - 1 - start} steps "
        f"fall, {v_init}) vs trained {d_tr:+.4g} ({len(runs)} seeds): {reading}"
    )
    data = {"series": iv, "verdict": v_init, "change": d_tr, "change_init": d_init, "reading": reading}
    return {"text": text, "data": data}


def _init_table(sec: Section, lw: dict[str, dict], init: dict[str, dict]) -> None:
    """The claim measure of every probe model with a layer-wise claim at its random initialisation (the trained rows
    are the layer-wise table's claim rows)."""
    rows = []
    for name, r in init.items():
        if name not in LAYERWISE_MODELS:  # no layer-wise claim: no control to read
            continue
        key = _measure_key(lw[name]) if name in lw else _measure_key(r)
        if key not in {k for row in r["layers"] for k in row}:
            continue
        vals = _layer_series(r, key)
        rows.append([name, MEASURE_LABEL.get(key, key), _series_cell(vals)])
    if rows:
        sec.tables.append(
            Table(
                "layerwise control: the probe models' architectures at random initialisation (training seed)",
                ["model", "measure", "layers 1 to last"],
                rows,
            )
        )


def _series_cell(vals: list[float]) -> str:
    return ", ".join(fmt(v, ".4g") for v in vals)


def _learned(t: dict, majority: float) -> bool:
    return t.get("accuracy") is not None and 100.0 * _num(t["accuracy"]) >= majority + LEARNED_MARGIN


def _plotter(sec: Section, plots_dir, rel):
    """``plot(name, result, caption)``: draw ``result`` with its experiment's plotter into the section's plots."""
    from attnzoo.analysis.experiments import PLOTTERS

    def plot(name: str, result: dict, caption: str) -> None:
        path = plots_dir / f"probe_{name.replace('/', '_')}.png"
        try:
            fig = PLOTTERS[result["experiment"]](result)
        except KeyError as e:  # a record imported (--reuse) from a results.json whose large arrays were left out
            sec.notes.append(f"plot `{name}` not drawn: its stored result lacks {e} (rerun the step)")
            return
        save_figure(fig, path)
        sec.plots.append((rel(path), caption))

    return plot


def _denoise_table(sec: Section, dn: dict[str, dict], plot) -> None:
    """AoT eq 3: SNR per layer of every η run, and their plots (the fitted growths and the ``-matched`` run are in the
    findings)."""
    runs = [k for k in dn if not k.endswith("-matched")]
    cols, series = [], []
    for k in runs:
        eta = _num(dn[k]["params"]["eta"])
        for phi, vals in dn[k]["snr"].items():
            cols.append(f"SNR, φ={phi}, η={eta:g}")
            series.append([_num(x) for x in vals])
    n_rows = max(len(v) for v in series)
    rows = [[i] + [fmt(v[i], ".3g") if i < len(v) else "-" for v in series] for i in range(n_rows)]
    sec.tables.append(Table("denoise (AoT eq 3 on Definition 1 data): mean SNR per layer", ["layer"] + cols, rows))
    for k in runs:
        plot(k, dn[k], f"AoT Fig. 4: SNR per layer, η={_num(dn[k]['params']['eta']):g}.")


def _compress_table(sec: Section, r: dict, plot) -> None:
    rate = [_num(x) for x in r["coding_rate"]]
    snaps = r["params"]["snapshots"]
    rows = [[s, fmt(rate[s], ".4g"), fmt(_num(r["line_fit"].get(str(s))), ".3g")] for s in snaps]
    sec.tables.append(
        Table(
            "compress (CBSA eq 12 on noisy lines in R^3)",
            ["iteration", "coding rate Σ_c R(Z_c)", "mean σ2/σ1 per class"],
            rows,
        )
    )
    plot("compress", r, "CBSA Fig. 4: points and coding rate.")


def _rank_collapse_table(sec: Section, r: dict, plot) -> None:
    depth_axis = r["depth"]
    picks = sorted({0, len(depth_axis) // 2, len(depth_axis) - 1})
    starts = {fmt(_num(series[0]), ".2e") for series in r["residual"].values()}
    title = "rank collapse without skip connections: relative residual ‖ε(X)‖/‖X‖ (CSP eq 6)"
    if len(starts) == 1 and len(picks) > 1:  # every stack sees the same input: its residual once, in the title
        title += f", {starts.pop()} at depth {depth_axis[0]} for every stack"
        picks = picks[1:]
    rows = [[name] + [fmt(_num(series[i]), ".2e") for i in picks] for name, series in r["residual"].items()]
    sec.tables.append(Table(title, ["stack"] + [f"depth {depth_axis[i]}" for i in picks], rows))
    plot("rank-collapse", r, "CSP Thm 1: residual vs depth, output spectra.")


def _layerwise_table(sec: Section, lw: dict[str, dict], trained: dict[str, dict], depth, plot) -> None:
    """Per probe model (base seed): the claim's measure and the one the paper's figure plots (the literal gate's),
    layer 1 → last; and its plot with every measure. The other measures are in results.json."""
    rows, shown = [], set()
    for name, r in lw.items():
        plot(f"layerwise/{name}", r, f"Per-layer measures: {name}.")
        if name not in LAYERWISE_MODELS:  # no layer-wise claim (its measures are in the plot)
            continue
        t = trained.get(name, {})
        acc = _num(t.get("accuracy")) * 100 if t.get("accuracy") is not None else math.nan
        claim = _measure_key(r)
        lit = _LITERAL_MEASURE.get(r["layers"][0]["mechanism"] if r["layers"] else None, _DEFAULT_LITERAL)
        keys = [claim] + ([lit] if lit != claim and claim != "coding_rate" and lit in r["series"] else [])
        for i, key in enumerate(keys):
            shown.add(key)
            tag = (" (claim)" if key != "coding_rate" else "") if i == 0 else " (figure)"
            rows.append(
                [
                    name if i == 0 else "",
                    fmt(acc, ".1f") if i == 0 else "",
                    MEASURE_LABEL.get(key, key) + tag,
                    _series_cell(_layer_series(r, key)),
                ]
            )
    if not rows:
        return
    defs = "; ".join(f"{v}: {MEASURE_DEF[k]}" for k, v in MEASURE_LABEL.items() if k in MEASURE_DEF and k in shown)
    sec.tables.append(
        Table(
            f"layerwise: compression term per layer of the probe models (depth {depth})",
            ["model", "val acc %", "measure", "layers 1 to last"],
            rows,
            caption=defs + "; (figure): what the paper's figure plots. Tokens enter the attention layer after its "
            "pre-norm unless the label says block output; batch means over validation images.",
        )
    )


#: a probe model has learned its task when its accuracy clears the majority class by this many points
LEARNED_MARGIN = 10.0

#: the layer-wise findings' rule (:func:`_fall_verdict`, :func:`_seeds_verdict`), stated once in the section's intro
FALL_RULE = (
    "Layer-wise fall rule: agrees if the value falls over the claim's layers with at least half the steps "
    "falling, disagrees if it rises with under half falling, else inconclusive; over seeds, the seed mean's "
    "verdict if more than half of the seeds give it."
)


#: short names of the per-layer measures in the tables, and their definitions
MEASURE_LABEL = {
    "crate_compression": "R^c (CRATE's code)",
    "crate_compression_out": "R^c (CRATE's code), block output",
    "compression": "R^c raw (eq 2)",
    "variational_compression": "R^var_c (ToST eq 4)",
    "variational_compression_normalized": "R^var_c, unit-norm tokens",
    "variational_compression_out": "R^var_c, block output",
    "coding_rate": "R(Z) (eq 1)",
}
#: (the tokens are those entering each attention layer after its pre-norm, unless the label says block output)
MEASURE_DEF = {
    "crate_compression": "CBSA eq 2 on unit-norm codes U_kᵀz, ε² = 0.01",
    "compression": "CBSA eq 2, ε = 0.5",
    "variational_compression": "ToST eq 4 with the layer's memberships, ε = 0.5",
    "variational_compression_out": "the same on the block's outputs (what ToST Fig. 4a plots)",
    "coding_rate": "CBSA eq 1, ε = 0.5",
}


def _measure_key(r: dict) -> str:
    """The measure a layer-wise claim is judged on: ToST's R^var_c for TSSA, CRATE's measured R^c for the other
    white-box layers, the plain coding rate where the layer has no subspace bases (no claim)."""
    keys = {k for row in r["layers"] for k in row}
    mech = r["layers"][0]["mechanism"] if r["layers"] else None
    for k in (_CLAIM_MEASURE.get(mech), _DEFAULT_MEASURE, "compression"):
        if k and k in keys:
            return k
    return "coding_rate"


def _layer_series(r: dict, key: str) -> list[float]:
    """Per-layer values of ``key`` over the layers that define it (class-attention layers do not)."""
    return [_num(row[key]) for row in r["layers"] if key in row]


def _half_start(n: int) -> int:
    """Index of the first layer of the latter half of ``n`` layers (at least two layers in it)."""
    return max(0, min(n // 2, n - 2))


def _delta(vals: list[float], start: int) -> float:
    return vals[-1] - vals[start] if len(vals) > start else math.nan


def _downs(vals: list[float], start: int) -> int:
    """How many consecutive layer-to-layer steps from ``start`` on decrease the value."""
    return sum(1 for a, b in zip(vals[start:], vals[start + 1 :], strict=False) if b < a)


def _peak(series) -> tuple[float, int, float]:
    vals = [_num(x) for x in series]
    i = int(np.nanargmax(vals))
    return vals[i], i, vals[-1]


def _slim(r: dict) -> dict:
    """The numbers worth keeping in results.json (point clouds and maps stay in the step files)."""
    drop = {"points", "labels", "directions", "cls_maps", "matrices", "snr_per_cluster", "curve"}
    return {k: v for k, v in r.items() if k not in drop}


def _fall_verdict(vals: list[float], start: int) -> str:
    """``agrees`` if the value falls from ``start`` to the last layer with at least half of the steps falling;
    ``disagrees`` if it rises with fewer than half falling; otherwise ``inconclusive`` (mixed)."""
    n = len(vals) - 1 - start
    d, downs = _delta(vals, start), _downs(vals, start)
    if n < 1 or not math.isfinite(d):
        return "inconclusive"
    if d < 0 and 2 * downs >= n:
        return "agrees"
    if d > 0 and 2 * downs < n:
        return "disagrees"
    return "inconclusive"


def _describe(vals: list[float], start: int) -> str:
    n = len(vals) - 1 - start
    return (
        f"layer {start + 1} → {len(vals)}: {vals[start]:.4g} → {vals[-1]:.4g} ({_delta(vals, start):+.4g}; "
        f"{_downs(vals, start)} of {n} steps fall)"
    )


def _findings(res, lw, shallow=None, more=None) -> list[dict]:
    shallow, more = shallow or {}, more or {}
    out = []
    if "denoise" in res:
        out.append(_threshold_denoise_finding(res))
        out.append(_softmax_denoise_finding(res))
    if "compress" in res:
        out.append(_compress_finding(res["compress"]))
    if "rank-collapse" in res:
        out.extend(_rank_collapse_findings(res["rank-collapse"]))
    for name, r in lw.items():
        f = _layerwise_finding(name, r, shallow.get(name), more.get(name, []))
        if f is not None:
            f["probe_model"] = name  # its random-initialisation control is attached by name
            out.append(f)
    return out


def _threshold_denoise_finding(res) -> dict:
    """AoT Theorem 1 with the thresholded φ, judged at the first η; the small η's growth is reported beside it."""
    r = res["denoise"]
    fit, theory = _num(r["growth_factor_fit"]["threshold"]), _num(r["growth_factor_theory"])
    eta = _num(r["params"]["eta"])
    measured = f"η={eta:g}: fitted x{fit:.4f} per layer"
    small = next((v for k, v in res.items() if k.startswith("denoise/") and not k.endswith("-matched")), None)
    if small is not None:
        measured += (
            f"; η={_num(small['params']['eta']):g}: x{_num(small['growth_factor_fit']['threshold']):.4f} "
            f"(1+ητ = {_num(small['growth_factor_theory']):.4f})"
        )
    kw = paper_claims.finding_kw("aot-thm1-denoise")
    return _finding(
        **{**kw, "paper_value": kw["paper_value"].format(theory=theory, eta=eta)},
        measured=measured,
        verdict="agrees" if fit >= theory * 0.995 else "disagrees",
        rule="agrees if the fitted growth is at least 99.5% of 1+ητ (at the first η)",
    )


def _compress_finding(r: dict) -> dict:
    rate = [_num(x) for x in r["coding_rate"]]
    return _finding(
        **paper_claims.finding_kw("cbsa-f4-compress"),
        measured=f"coding rate {rate[0]:.4g} → {rate[-1]:.4g} over {len(rate) - 1} iterations",
        verdict="agrees" if rate[-1] < rate[0] else "disagrees",
        rule="agrees if the final rate < initial",
    )


def _rank_collapse_findings(r: dict) -> list[dict]:
    """CSP Theorem 1, judged only when both reference stacks were run (otherwise no finding)."""
    resid = {k: [_num(x) for x in v] for k, v in r["residual"].items()}
    if "softmax_reference" not in resid or "csp_reference" not in resid:
        return []
    s, c = resid["softmax_reference"], resid["csp_reference"]
    return [
        _finding(
            **paper_claims.finding_kw("csp-thm1-rank"),
            measured=f"softmax {s[0]:.2e} → {s[-1]:.2e}, CSP {c[0]:.2e} → {c[-1]:.2e} over {len(s) - 1} layers",
            verdict="agrees" if s[-1] < 1e-3 * s[0] and c[-1] > 0.1 * c[0] else "disagrees",
            rule="agrees if softmax's residual falls 1000x while CSP's stays above 10%",
        )
    ]


def _layerwise_finding(name: str, r: dict, shallow: dict | None, more: list | None = None) -> dict | None:
    """One probe model's layer-wise claim on its claim measure (None where that claim is undefined), with the
    ablations as its explanation when it does not agree, or the raw eq 2's verdict when that one differs. With
    more seeds (``more``: their probe results) the claim is judged on the seed-mean series (see
    :func:`_seeds_verdict`)."""
    key = _measure_key(r)
    if key == "coding_rate":
        return None  # no subspace bases: the paper's compression term is not defined for this mechanism
    vals = _layer_series(r, key)
    if len(vals) < 2:
        return None
    runs = [vals] + [v for m in more or [] if len(v := _layer_series(m, key)) == len(vals)]
    if len(runs) > 1:
        return _literal_gate(_layerwise_seeds_finding(name, key, runs, r, shallow), name, key, [r, *(more or [])])
    start, claim_id, rule = _layerwise_claim(name, key, len(vals))
    verdict = _fall_verdict(vals, start)
    # the series per layer and the model's accuracy are in the layerwise table: the finding gives the trend only
    f = _finding(
        **paper_claims.finding_kw(claim_id, name=name),
        measured=f"{MEASURE_LABEL[key]}: {_describe(vals, start)}",
        verdict=verdict,
        rule=rule,
        seeds=1,
    )
    lit = _LITERAL_MEASURE.get(r["layers"][0]["mechanism"] if r.get("layers") else None, _DEFAULT_LITERAL)
    if verdict != "agrees":
        f["explanation"] = _layerwise_explanation(key, start, r, shallow)
    elif key != "compression" and lit != "compression" and "compression" in r["series"]:
        # (where raw eq 2 is the figure's own measure, :func:`_literal_gate` states its verdict as the gate)
        raw = _layer_series(r, "compression")
        if _fall_verdict(raw, start) != "agrees":  # the definition decides: say so beside the agreement
            f["explanation"] = f"raw eq 2 (ε = 0.5): {_describe(raw, start)}, {_fall_verdict(raw, start)}"
    return _literal_gate(f, name, key, [r])


def _literal_gate(f: dict, name: str, key: str, probes_: list[dict]) -> dict:
    """A decided verdict on the claim measure stands only where the measure the paper's figure plots
    (``_LITERAL_MEASURE``) gives the same verdict on the same layers and seeds; otherwise it is gated on conditions:
    the verdict depends on the definition (ToST's block outputs can rise where the claim measure falls)."""
    layers = probes_[0].get("layers") or []
    lit = _LITERAL_MEASURE.get(layers[0]["mechanism"] if layers else None, _DEFAULT_LITERAL)
    if lit == key or f["verdict"] == "inconclusive":
        return f
    n = len(_layer_series(probes_[0], key))
    series = [v for p in probes_ if len(v := _layer_series(p, lit)) == n]
    if not series:
        return f
    mean = [sum(x[i] for x in series) / len(series) for i in range(n)]
    start, claim_id, _ = _layerwise_claim(name, key, n)
    lv = _seeds_verdict(mean, series, start) if len(series) > 1 else _fall_verdict(mean, start)
    f["literal_measure"] = {"measure": MEASURE_LABEL[lit], "verdict": lv, "series": mean}
    if lv != f["verdict"]:
        claims.gate(
            f,
            f"{paper_claims.get(claim_id).reference} plots ({MEASURE_LABEL[lit]}) gives {lv} "
            f"({_describe(mean, start)})",
            "conditions",
        )
    return f


def _seeds_verdict(mean: list[float], runs: list[list[float]], start: int) -> str:
    """The seed-mean series' verdict when more than half of the seeds' own series give the same one; else
    ``inconclusive`` (the seeds disagree about the trend)."""
    v = _fall_verdict(mean, start)
    same = sum(_fall_verdict(x, start) == v for x in runs)
    return v if v != "inconclusive" and 2 * same > len(runs) else "inconclusive"


def _layerwise_seeds_finding(name: str, key: str, runs: list[list[float]], r: dict, shallow: dict | None) -> dict:
    """The layer-wise claim over several seeds of the probe model: seed-mean series, per-seed verdicts."""
    mean = [sum(x[i] for x in runs) / len(runs) for i in range(len(runs[0]))]
    start, claim_id, rule = _layerwise_claim(name, key, len(mean))
    verdict = _seeds_verdict(mean, runs, start)
    per_seed = [_fall_verdict(x, start) for x in runs]
    f = _finding(
        **paper_claims.finding_kw(claim_id, name=name),
        measured=f"{MEASURE_LABEL[key]}, mean of {len(runs)} seeds, {_describe(mean, start)}; per seed: "
        + ", ".join(per_seed),
        verdict=verdict,
        rule=f"{rule}, {len(runs)} seeds",
        seeds=len(runs),
    )
    if verdict != "agrees":
        f["explanation"] = "base seed's model: " + _layerwise_explanation(key, start, r, shallow)
    return f


def _layerwise_claim(name: str, key: str, n_layers: int) -> tuple[int, str, str]:
    """``(start, claim id, rule)``: ToST's claim spans all layers, CBSA's / CRATE's the latter half."""
    if key == "variational_compression":  # ToST Fig. 4a: "mostly decreases by layer" over all layers
        return 0, "tost-f4a-compression", f"fall rule over all layers (1-{n_layers})"
    # CBSA Fig. 5 / CRATE: consecutive compression over the latter half of the layers
    start = _half_start(n_layers)
    return start, f"cbsa-f5-compression#{name}", f"fall rule over the latter half (layers {start + 1}-{n_layers})"


def _layerwise_explanation(key: str, start: int, r: dict, shallow: dict | None) -> str:
    """The ablations run for a layer-wise verdict that is not 'agrees': other measures on the same model, and the
    same measure on the shallow vision model."""
    parts, agreeing = [], []
    for k in (
        "compression",
        "crate_compression",
        "crate_compression_out",
        "variational_compression",
        "variational_compression_normalized",
        "variational_compression_out",
    ):
        if k == key or k not in r["series"]:
            continue
        vals = _layer_series(r, k)
        v = _fall_verdict(vals, start)
        if v == "agrees":
            agreeing.append(MEASURE_LABEL[k])
        parts.append(f"{MEASURE_LABEL[k]}: {_describe(vals, start)}, {v}")
    if shallow is not None and key in shallow["series"]:
        vals = _layer_series(shallow, key)
        parts.append(f"depth-{len(vals)} vision model: {_series_cell(vals)}")
    if not parts:
        return "no ablation available for this model"
    reading = (
        f"the verdict depends on the definition: it agrees under {', '.join(agreeing)}"
        if agreeing
        else "no other definition reverses the verdict"
    )
    return "other measures: " + "; ".join(parts) + f". {reading}"


def _softmax_snr(r: dict) -> list[float]:
    """Mean SNR per layer of a denoise run with the plain soft-max φ."""
    return [_num(x) for x in r["snr"]["softmax"]]


def _rises(vals: list[float]) -> bool:
    return all(b > a for a, b in zip(vals, vals[1:], strict=False))


def _describe_softmax_run(r: dict) -> str:
    snr = _softmax_snr(r)
    peak, at, last = _peak(snr)
    return (
        f"η={_num(r['params']['eta']):g}, {len(snr) - 1} layers: SNR {snr[0]:.3g} → {last:.3g} "
        f"(fitted x{_num(r['growth_factor_fit']['softmax']):.4f}/layer; "
        + ("rises at every layer)" if _rises(snr) else f"peaks at {peak:.3g} at layer {at}, then falls)")
    )


def _softmax_denoise_finding(res) -> dict:
    """AoT Fig. 4 with the plain soft-max φ, judged at the small η; the explanation gives the larger η and the run
    with the same total step ηL."""
    big = res["denoise"]
    small = next((v for k, v in res.items() if k.startswith("denoise/") and not k.endswith("-matched")), None)
    matched = next((v for k, v in res.items() if k.startswith("denoise/") and k.endswith("-matched")), None)
    judged = small if small is not None else big
    measured = _describe_softmax_run(judged)
    verdict = "agrees" if _rises(_softmax_snr(judged)) else "disagrees"
    expl = []
    if small is not None:
        expl.append(f"the paper gives no η for Fig. 4; at the larger step {_describe_softmax_run(big)}")
    if matched is not None:
        expl.append(
            f"same total step ηL, {_describe_softmax_run(matched)}: the soft-max rise lasts a bounded ηL, "
            "unlike Theorem 1's thresholded φ"
        )
    return _finding(
        **paper_claims.finding_kw("aot-f4-softmax-denoise"),
        measured=measured,
        verdict=verdict,
        rule=f"at η={_num(judged['params']['eta']):g}: agrees if the SNR rises at every layer",
        explanation="; ".join(expl),
    )
