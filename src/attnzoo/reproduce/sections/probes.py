"""White-box probes (``attnzoo.analysis``): AoT's denoising (Fig. 4), CBSA's compression of noisy lines (Fig. 4), rank
collapse without skip connections (CSP Thm 1), the per-layer compression term of vision models trained at
``layerwise_depth`` layers (ToST Fig. 4a, CBSA Fig. 5, CRATE) and attention maps (ToST Fig. 5 / FAST Fig. 4)."""

from __future__ import annotations

import math

import numpy as np

from attnzoo.compare import claims, common
from attnzoo.compare.common import Context, Section, Table, fmt
from attnzoo.compare.store import Step
from attnzoo.reproduce import paper_claims
from attnzoo.reproduce.sections import vision

KEY = "probes"
TITLE = "White-box probes"

#: eta of AoT Fig. 4's second run: a small step, where the soft-max iteration is compared (the paper gives no eta)
SMALL_ETA = 0.02
#: its run's label; ``-matched`` appended: the run at the small eta with the first run's total step eta*L
SMALL_RUN = f"denoise/eta{SMALL_ETA:g}"
#: the probe models with a layer-wise claim: ToST Fig. 4a's for tost, a test of CBSA Fig. 5's for the others
LAYERWISE_MODELS = ("tost", "crate", "cbt", "aot")
#: the layer-wise findings' rule (:func:`_fall_verdict`, :func:`_seeds_verdict`), stated once in the section's intro
FALL_RULE = (
    "Layer-wise fall rule: agrees if the value falls over the claim's layers with at least half the steps "
    "falling, disagrees if it rises with under half falling, else inconclusive; over seeds, the seed mean's "
    "verdict if more than half of the seeds give it."
)
#: per-layer measure -> (its short name in the tables, its definition); the tokens are those entering each attention
#: layer after its pre-norm, unless the name says block output
MEASURES = {
    "crate_compression": ("R^c (CRATE's code)", "CBSA eq 2 on unit-norm codes U_kᵀz, ε² = 0.01"),
    "compression": ("R^c raw (eq 2)", "CBSA eq 2, ε = 0.5"),
    "variational_compression": ("R^var_c (ToST eq 4)", "ToST eq 4 with the layer's memberships, ε = 0.5"),
    "variational_compression_out": (
        "R^var_c, block output",
        "the same on the block's outputs (what ToST Fig. 4a plots)",
    ),
    "coding_rate": ("R(Z) (eq 1)", "CBSA eq 1, ε = 0.5"),
}
MEASURE_LABEL = {k: label for k, (label, _) in MEASURES.items()}
#: the control's reading when the untrained architecture shows the trend as strongly (the verdict is then gated)
INIT_FALLS_AS_MUCH = "the untrained model falls as much: the trend is the architecture's, not learned"


def plan_steps(plan: dict, seed: int, vision_plan: dict) -> list[Step]:
    depth = plan.get("layerwise_depth", vision_plan["arch"]["depth"])
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 2:
        raise ValueError(f"probes' layerwise_depth must be an int >= 2 (layer-wise claims need layers), got {depth!r}")
    common.check_known(plan["layerwise"], vision.MODELS, "layer-wise probe model")
    # the probe models: the vision section's recipe at the probes' depth, with their own training overrides
    arch, train = {**vision_plan["arch"], "depth": depth}, {**vision_plan["train"], **plan.get("layerwise_train", {})}
    deep = {**vision_plan, "arch": arch, "train": train}
    batch = {"task": vision_plan["task"], "task_options": vision_plan["task_options"], "n": 8}
    probe = {"batch": dict(batch, n=32), "eps": 0.5, "crate_eps": 0.1}
    steps = _synthetic_steps(plan, seed)
    for name in plan["layerwise"]:
        steps.extend(_layerwise_steps(name, seed, deep, vision_plan, probe))
        # more seeds of the models with a layer-wise claim: the verdict reads their mean and how many agree with it
        if name in LAYERWISE_MODELS:
            for s in range(seed + 1, seed + plan.get("layerwise_seeds", 1)):
                steps.extend(_layerwise_steps(name, s, deep, vision_plan, probe, suffix=f"/extra-seed{s}"))
    maps = [n for n in plan.get("attention_maps", []) if n in vision_plan["models"]]
    if maps:  # the attention maps of the vision section's models named for them
        deps = tuple(common.seeded_id(f"vision/{n}", seed) for n in maps)
        steps.append(_step("attention-maps", {"experiment": "attention-maps", "models": maps, "batch": batch}, deps))
    return steps


def _step(label: str, config: dict, deps: tuple[str, ...] = ()) -> Step:
    return Step(f"{KEY}/{label}", KEY, config, _RUN[config["experiment"]], deps=deps, label=label)


def _synthetic_steps(plan: dict, seed: int) -> list[Step]:
    """The parameter-free probes: denoise at two step sizes (and at the small one with the same ηL), compress, rank."""
    den = dict(plan["denoise"], seed=seed)
    big_eta, layers = den.get("eta", 0.1), den.get("layers", 12)
    params = {  # label -> params; the experiment is the label's first part
        "denoise": dict(den, eta=big_eta),
        SMALL_RUN: dict(den, eta=SMALL_ETA),
        # the first run's total step eta*L: does the soft-max fall depend on eta or on eta*L?
        f"{SMALL_RUN}-matched": dict(den, eta=SMALL_ETA, layers=max(1, round(layers * big_eta / SMALL_ETA))),
        "compress": dict(plan["compress"], seed=seed),
        "rank-collapse": dict(plan["rank_collapse"], seed=seed),
    }
    return [_step(label, {"experiment": label.split("/")[0], "params": p}) for label, p in params.items()]


def _layerwise_steps(name: str, seed: int, deep: dict, vision_plan: dict, probe: dict, suffix: str = "") -> list[Step]:
    """One probe model's training and probe; for the base seed also its random-init and shallow-model probes."""
    config = vision.row_config(deep, name, seed)
    train, tid = config["train"], f"{KEY}/train/{name}{suffix}"
    lw = {"experiment": "layerwise", "model": name, "source": tid, "train": train, **probe}
    steps = [
        Step(tid, KEY, config, _run_train, label=f"train/{name}{suffix}"),
        _step(f"layerwise/{name}{suffix}", lw, (tid,)),
    ]
    if suffix:
        return steps
    # control: the architecture at its random initialisation, where a fall is not learned
    init = {"experiment": "layerwise-init", "model": name, "train": train, **probe}
    steps.append(_step(f"layerwise-init/{name}", init))
    if name in vision_plan["models"]:  # ablation (in results.json): the probe on the vision section's shallow model
        vid = common.seeded_id(f"vision/{name}", seed)
        shallow = {"model_options": vision.model_options(name, vision_plan), "train": vision_plan["train"]}
        config = {"experiment": "layerwise", "model": name, "source": vid, "trained": shallow, **probe}
        steps.append(_step(f"layerwise-shallow/{name}", config, (vid,)))
    return steps


def _run_train(ctx: Context, step: Step) -> dict:
    cfg = step.config["train"]
    rec = common.train_run(ctx, step.id, cfg)
    out = {"accuracy": rec["val"].get("accuracy"), "val_loss": rec["val"].get("loss"), "run_dir": rec["run_dir"]}
    out.update(depth=cfg["model_options"]["depth"], steps=cfg["steps"], batch_size=cfg["batch_size"])
    return out | {k: rec[k] for k in ("curve", "val_curve")}


def _val_batch(cfg: dict):
    from attnzoo.data import build_task

    task = build_task(cfg["task"], **cfg["task_options"])
    (x,), _ = task.val.get_batch(np.arange(min(cfg["n"], len(task.val))))
    return x


def _trained(ctx: Context, name: str, source: str | None = None):
    sid = source or common.seeded_id(f"vision/{name}", ctx.seed)
    rec = ctx.store.load_by_id(sid)
    if rec is None:
        raise RuntimeError(f"probe needs the trained model {name!r} of step {sid!r}; that step has not run")
    return common.load_trained(rec["result"]["run_dir"])


def _run_probe(ctx: Context, step: Step) -> dict:
    """A parameter-free probe, the attention maps of trained models, or the layer-wise probe of a trained model or of
    its architecture as its training seed initialises it."""
    from attnzoo import analysis
    from attnzoo.analysis.io import to_jsonable

    cfg, experiment = step.config, step.config["experiment"]
    synthetic = {"denoise": analysis.denoise, "compress": analysis.compress, "rank-collapse": analysis.rank_collapse}
    if experiment in synthetic:
        return to_jsonable(synthetic[experiment](**cfg["params"]))
    if experiment == "attention-maps":
        models = {n: _trained(ctx, n) for n in cfg["models"]}
        return to_jsonable(analysis.attention_maps(models, _val_batch(cfg["batch"])))
    if experiment == "layerwise-init":
        model = common.untrained_model(cfg["train"])[0]
    else:
        model = _trained(ctx, cfg["model"], cfg["source"])
    batch = _val_batch(cfg["batch"])
    return to_jsonable(analysis.layerwise(model, batch, eps=cfg["eps"], crate_eps=cfg["crate_eps"]))


#: experiment -> the function that runs its step
_RUN = dict.fromkeys(
    ("denoise", "compress", "rank-collapse", "layerwise", "layerwise-init", "attention-maps"), _run_probe
)


def summarize(records: dict[str, dict], plan: dict, plots_dir, rel) -> Section:
    sec = Section(KEY, TITLE)
    all_res = {sid.split("/", 1)[1]: rec["result"] for sid, rec in records.items()}
    res = {k: v for k, v in all_res.items() if "/extra-seed" not in k}  # the extra seeds stay out of the tables
    trained, lw, init = _under(res, "train"), _under(res, "layerwise"), _under(res, "layerwise-init")
    depth = next((t["depth"] for t in trained.values()), plan.get("layerwise_depth"))
    steps = next((t["steps"] for t in trained.values()), None)
    sec.intro = (
        "Synthetic probes run the papers' parameter-free iterations (`attnzoo analyze`); the layer-wise probe "
        f"measures vision models trained for it ({depth} layers, {steps} steps, the vision recipe otherwise) on "
        f"validation images. {FALL_RULE}"
    )
    plot = _plotter(sec, plots_dir, rel)
    if "denoise" in res:
        _denoise_table(sec, {k: res[k] for k in ("denoise", SMALL_RUN) if k in res}, plot)
    for label, table in (("compress", _compress_table), ("rank-collapse", _rank_collapse_table)):
        if label in res:
            table(sec, res[label], plot)
    _layerwise_table(sec, lw, trained, depth, plot)
    _init_table(sec, lw, init)
    curves = {n: t["val_curve"] for n, t in trained.items() if t.get("val_curve")}
    rows = {n: [[p["step"], 100.0 * p["accuracy"]] for p in c if "accuracy" in p] for n, c in curves.items()}
    sec.add_curves([("probe models", rows)], plots_dir / "probes_curves.png", rel, "accuracy (%)", "Probe models", "")
    if (maps := res.get("attention-maps")) is not None:
        plot("attention-maps", maps, "Attention maps of the trained models (ToST Fig. 5 / FAST Fig. 4).")
    sec.data = {k: _slim(v) for k, v in res.items()}
    require = plan.get("require_learned", True)
    if unlearned := sorted(n for n, t in trained.items() if require and not _learned(t)):
        sec.notes.append(
            f"probe model(s) {', '.join(unlearned)} did not reach {common.LEARNED_MARGIN:g} points above the "
            f"{vision.CHANCE:.0f}% majority class; their layer-wise claims are not judged"
        )
        lw = {n: r for n, r in lw.items() if n not in unlearned}
    more: dict[str, list] = {}  # the extra seeds' probes by model, those that learned
    for k, v in sorted(_under(all_res, "layerwise").items()):
        name, _, extra = k.partition("/")
        if extra and (not require or _learned(all_res.get(f"train/{k}", {}))):
            more.setdefault(name, []).append(v)
    sec.findings = _findings(res, lw, more)
    for f in sec.findings:
        if (name := f.get("probe_model")) in init:
            apply_init_control(f, init_control(lw[name], init[name], more.get(name, [])))
    return sec


def apply_init_control(f: claims.Finding, control: dict) -> claims.Finding:
    """Attach the random-initialisation control to a finding, gated where the untrained model falls as much."""
    f["random_init_control"] = control["data"]
    claims.explain(f, control["text"])
    if control["data"] and control["data"]["reading"] == INIT_FALLS_AS_MUCH:
        claims.gate(f, "the random-initialisation control falls as much", "control")
    return f


def init_control(trained: dict, init: dict, more: list[dict] | None = None) -> dict:
    """The random-initialisation control of a layer-wise claim in words chosen from the numbers: ``{text, data}``."""
    key = _measure_key(trained)
    mean, runs = _seed_mean(key, [trained, *(more or [])])
    iv = _layer_series(init, key)
    if len(iv) != len(mean) or len(mean) < 2:
        return {"text": "untrained control: no comparable series", "data": None}
    start, *_ = _layerwise_claim("", key, len(mean))
    v_tr, v_init = _fall_verdict(mean, start), _fall_verdict(iv, start)
    d_tr, d_init = mean[-1] - mean[start], iv[-1] - iv[start]
    if v_tr != "agrees":
        reading = "training undoes the untrained model's fall" if v_init == "agrees" else "neither falls"
    elif v_init != "agrees":
        reading = "training produces the trend"
    elif d_tr < 2 * d_init:  # both negative: the trained fall is more than twice the untrained one
        reading = "training deepens the untrained model's fall"
    else:
        reading = INIT_FALLS_AS_MUCH
    text = (
        f"untrained control: {d_init:+.4g} ({_downs(iv, start)} of {len(iv) - 1 - start} steps "
        f"fall, {v_init}) vs trained {d_tr:+.4g} ({len(runs)} seed{'s' if len(runs) != 1 else ''}): {reading}"
    )
    data = {"series": iv, "verdict": v_init, "change": d_tr, "change_init": d_init, "reading": reading}
    return {"text": text, "data": data}


def _plotter(sec: Section, plots_dir, rel):
    """``plot(name, result, caption)``: draw ``result`` with its experiment's plotter into the section's plots."""
    from attnzoo.analysis.experiments import PLOTTERS

    def plot(name: str, result: dict, caption: str) -> None:
        try:
            fig = PLOTTERS[result["experiment"]](result)
        except KeyError as e:  # a record imported (--reuse) from a results.json whose large arrays were left out
            sec.notes.append(f"plot `{name}` not drawn: its stored result lacks {e} (rerun the step)")
            return
        sec.add_plot(fig, plots_dir / f"probe_{name.replace('/', '_')}.png", rel, caption)

    return plot


def _denoise_table(sec: Section, dn: dict[str, dict], plot) -> None:
    """AoT eq 3: SNR per layer of every η run but the matched one, and their plots."""
    eta = {k: _num(r["params"]["eta"]) for k, r in dn.items()}
    cols = [f"SNR, φ={phi}, η={eta[k]:g}" for k, r in dn.items() for phi in r["snr"]]
    series = [[_num(x) for x in vals] for r in dn.values() for vals in r["snr"].values()]
    rows = [[i] + [fmt(v[i], ".3g") if i < len(v) else "-" for v in series] for i in range(max(map(len, series)))]
    sec.tables.append(Table("denoise (AoT eq 3 on Definition 1 data): mean SNR per layer", ["layer"] + cols, rows))
    for k, r in dn.items():
        plot(k, r, f"AoT Fig. 4: SNR per layer, η={eta[k]:g}.")


def _compress_table(sec: Section, r: dict, plot) -> None:
    rate = [_num(x) for x in r["coding_rate"]]
    rows = [[s, fmt(rate[s], ".4g"), fmt(_num(r["line_fit"].get(str(s))), ".3g")] for s in r["params"]["snapshots"]]
    heads = ["iteration", "coding rate Σ_c R(Z_c)", "mean σ2/σ1 per class"]
    sec.tables.append(Table("compress (CBSA eq 12 on noisy lines in R^3)", heads, rows))
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
    """Per probe model with a claim: its claim's measure and the one the paper's figure plots per layer."""
    rows, shown = [], set()
    for name, r in lw.items():
        plot(f"layerwise/{name}", r, f"Per-layer measures: {name}.")
        if name not in LAYERWISE_MODELS:  # no layer-wise claim (its measures are in the plot)
            continue
        acc = fmt(_num(trained.get(name, {}).get("accuracy")) * 100, ".1f")
        claim, lit = _measure_key(r), _literal_key(r)
        tag = " (claim)" if claim != "coding_rate" else ""
        rows.append([name, acc, MEASURE_LABEL[claim] + tag, _series_cell(_layer_series(r, claim))])
        shown.add(claim)
        if lit != claim and claim != "coding_rate" and lit in r["series"]:  # the paper's figure plots another measure
            rows.append(["", "", MEASURE_LABEL[lit] + " (figure)", _series_cell(_layer_series(r, lit))])
            shown.add(lit)
    if not rows:
        return
    defs = "; ".join(f"{label}: {definition}" for k, (label, definition) in MEASURES.items() if k in shown)
    caption = (
        f"{defs}; (figure): what the paper's figure plots. Tokens enter the attention layer after its pre-norm unless "
        "labelled block output; batch means over validation images; the first training seed's values (the findings "
        "average every seed's)."
    )
    title = f"layerwise: compression term per layer of the probe models (depth {depth})"
    sec.tables.append(Table(title, ["model", "val acc %", "measure", "layers 1 to last"], rows, caption=caption))


def _init_table(sec: Section, lw: dict[str, dict], init: dict[str, dict]) -> None:
    """The claim measure of every probe model with a layer-wise claim at its random initialisation."""
    rows = []
    for name, r in init.items():
        if name not in LAYERWISE_MODELS:  # no layer-wise claim: no control to read
            continue
        key = _measure_key(lw.get(name, r))
        if vals := _layer_series(r, key):
            rows.append([name, MEASURE_LABEL.get(key, key), _series_cell(vals)])
    if rows:
        title = "layerwise control: the probe models at random initialisation (training seed)"
        sec.tables.append(Table(title, ["model", "measure", "layers 1 to last"], rows))


def _num(v) -> float:
    """JSON numbers back to floats (the analysis package writes non-finite values as strings)."""
    return math.nan if v is None else float(v)


def _under(res: dict, prefix: str) -> dict:
    """The results whose label starts with ``prefix/``, by the rest of the label."""
    return {k.split("/", 1)[1]: v for k, v in res.items() if k.startswith(prefix + "/")}


def _slim(r: dict) -> dict:
    """The numbers worth keeping in results.json (point clouds and maps stay in the step files)."""
    drop = {"points", "labels", "directions", "cls_maps", "matrices", "snr_per_cluster", "curve"}
    return {k: v for k, v in r.items() if k not in drop}


def _series_cell(vals: list[float]) -> str:
    return ", ".join(fmt(v, ".4g") for v in vals)


def _learned(t: dict) -> bool:
    return t.get("accuracy") is not None and common.learned([100.0 * _num(t["accuracy"])], vision.CHANCE)


def _mechanism(r: dict) -> str | None:
    return r["layers"][0]["mechanism"] if r.get("layers") else None


def _measure_key(r: dict) -> str:
    """The claim measure: ToST's R^var_c for TSSA, CRATE's R^c otherwise, R(Z) without subspace bases."""
    keys = {k for row in r["layers"] for k in row}
    own = ["variational_compression"] if _mechanism(r) == "tssa" else []
    return next((k for k in [*own, "crate_compression", "compression"] if k in keys), "coding_rate")


def _literal_key(r: dict) -> str:
    """The measure the paper's figure plots: ToST Fig. 4a the TSSA blocks' outputs, CBSA Fig. 5 raw eq 2."""
    return "variational_compression_out" if _mechanism(r) == "tssa" else "compression"


def _layer_series(r: dict, key: str) -> list[float]:
    """Per-layer values of ``key`` over the layers that define it (class-attention layers do not)."""
    return [_num(row[key]) for row in r["layers"] if key in row]


def _seed_mean(key: str, probes_: list[dict], n: int | None = None) -> tuple[list[float], list[list[float]]]:
    """The seed-mean series of ``key`` over the probes whose series has ``n`` layers (the first's), and those series."""
    n = len(_layer_series(probes_[0], key)) if n is None else n
    runs = [v for p in probes_ if len(v := _layer_series(p, key)) == n]
    return [sum(layer) / len(runs) for layer in zip(*runs, strict=True)], runs


def _downs(vals: list[float], start: int) -> int:
    """How many consecutive layer-to-layer steps from ``start`` on decrease the value."""
    return sum(1 for a, b in zip(vals[start:], vals[start + 1 :], strict=False) if b < a)


def _fall_verdict(vals: list[float], start: int) -> str:
    """agrees: falls from ``start`` with at least half the steps falling; disagrees: rises with fewer."""
    n = len(vals) - 1 - start
    d = vals[-1] - vals[start] if n >= 1 else math.nan
    if not math.isfinite(d):
        return "inconclusive"
    downs = _downs(vals, start)
    return "agrees" if d < 0 and 2 * downs >= n else "disagrees" if d > 0 and 2 * downs < n else "inconclusive"


def _seeds_verdict(mean: list[float], runs: list[list[float]], start: int) -> str:
    """The seed-mean series' verdict where more than half of the seeds give it, else inconclusive."""
    v = _fall_verdict(mean, start)
    same = sum(_fall_verdict(x, start) == v for x in runs)
    return v if v != "inconclusive" and 2 * same > len(runs) else "inconclusive"


def _describe(vals: list[float], start: int) -> str:
    return (
        f"layer {start + 1} → {len(vals)}: {vals[start]:.4g} → {vals[-1]:.4g} ({vals[-1] - vals[start]:+.4g}; "
        f"{_downs(vals, start)} of {len(vals) - 1 - start} steps fall)"
    )


def _findings(res, lw, more=None) -> list[dict]:
    out = []
    if "denoise" in res:  # the runs at the first η, at the small η, and at the small η with the first run's ηL
        big, small, matched = res["denoise"], res.get(SMALL_RUN), res.get(f"{SMALL_RUN}-matched")
        out += _denoise_findings(big, small, matched)
    if "compress" in res:
        out.append(_compress_finding(res["compress"]))
    if "rank-collapse" in res:
        out.extend(_rank_collapse_findings(res["rank-collapse"]))
    for name, r in lw.items():
        f = _layerwise_finding(name, r, (more or {}).get(name))
        if f is not None:
            f["probe_model"] = name  # its random-initialisation control is attached by name
            out.append(f)
    return out


def _denoise_findings(big: dict, small: dict | None, matched: dict | None) -> list[dict]:
    """AoT Theorem 1 with the thresholded φ, judged at the first η (the small η's growth is reported beside it), and
    AoT Fig. 4 with the soft-max φ, judged at the small η (the larger η and same-ηL runs explain it)."""
    fit, theory = _num(big["growth_factor_fit"]["threshold"]), _num(big["growth_factor_theory"])
    eta = _num(big["params"]["eta"])
    measured = f"η={eta:g}: fitted x{fit:.4f} per layer"
    expl = []
    if small is not None:
        measured += (
            f"; η={_num(small['params']['eta']):g}: x{_num(small['growth_factor_fit']['threshold']):.4f} "
            f"(1+ητ = {_num(small['growth_factor_theory']):.4f})"
        )
        expl.append(f"the paper gives no η for Fig. 4; at the larger step {_softmax_run(big)[0]}")
    rule = "agrees if the fitted growth is at least 99.5% of 1+ητ (at the first η)"
    holds = fit >= theory * 0.995
    thm = paper_claims.measured_finding("aot-thm1-denoise", measured, holds, rule, "paper", theory=theory, eta=eta)
    if matched is not None:
        expl.append(
            f"same total step ηL, {_softmax_run(matched)[0]}: the soft-max rise lasts a bounded ηL, unlike Theorem 1's "
            "thresholded φ"
        )
    judged = small if small is not None else big
    measured, rises = _softmax_run(judged)
    rule = f"at η={_num(judged['params']['eta']):g}: agrees if the SNR rises at every layer"
    soft = paper_claims.measured_finding("aot-f4-softmax-denoise", measured, rises, rule, "paper")
    soft["explanation"] = "; ".join(expl)
    return [thm, soft]


def _softmax_run(r: dict) -> tuple[str, bool]:
    """A denoise run with the plain soft-max φ in words, and whether its SNR rises at every layer."""
    snr = [_num(x) for x in r["snr"]["softmax"]]
    rises = all(b > a for a, b in zip(snr, snr[1:], strict=False))
    at = int(np.nanargmax(snr))
    return (
        f"η={_num(r['params']['eta']):g}, {len(snr) - 1} layers: SNR {snr[0]:.3g} → {snr[-1]:.3g} "
        f"(fitted x{_num(r['growth_factor_fit']['softmax']):.4f}/layer; "
        + ("rises at every layer)" if rises else f"peaks at {snr[at]:.3g} at layer {at})")
    ), rises


def _compress_finding(r: dict) -> dict:
    rate = [_num(x) for x in r["coding_rate"]]
    measured = f"coding rate {rate[0]:.4g} → {rate[-1]:.4g} over {len(rate) - 1} iterations"
    rule = "agrees if the final rate < initial"
    return paper_claims.measured_finding("cbsa-f4-compress", measured, rate[-1] < rate[0], rule, "paper")


def _rank_collapse_findings(r: dict) -> list[dict]:
    """CSP Theorem 1, judged only when both reference stacks were run (otherwise no finding)."""
    resid = {k: [_num(x) for x in v] for k, v in r["residual"].items()}
    if "softmax_reference" not in resid or "csp_reference" not in resid:
        return []
    s, c = resid["softmax_reference"], resid["csp_reference"]
    measured = f"softmax {s[0]:.2e} → {s[-1]:.2e}, CSP {c[0]:.2e} → {c[-1]:.2e} over {len(s) - 1} layers"
    rule = "agrees if softmax's residual falls 1000x while CSP's stays above 10%"
    holds = s[-1] < 1e-3 * s[0] and c[-1] > 0.1 * c[0]
    return [paper_claims.measured_finding("csp-thm1-rank", measured, holds, rule, "paper")]


def _layerwise_claim(name: str, key: str, n_layers: int) -> tuple[int, str, str]:
    """``(start, claim id, rule)``: ToST's claim spans all layers, CBSA's / CRATE's the latter half."""
    if key == "variational_compression":  # ToST Fig. 4a: "mostly decreases by layer" over all layers
        return 0, "tost-f4a-compression", f"fall rule over all layers (1-{n_layers})"
    start = max(0, min(n_layers // 2, n_layers - 2))  # CBSA Fig. 5 / CRATE: the latter half, at least two layers
    return start, f"cbsa-f5-compression#{name}", f"fall rule over the latter half (layers {start + 1}-{n_layers})"


def _layerwise_finding(name: str, r: dict, more: list | None = None) -> dict | None:
    """A probe model's layer-wise claim on its claim measure (the seed-mean series over more seeds), gated where the
    measure the paper's figure plots gives another verdict (ToST Fig. 4a)."""
    key = _measure_key(r)
    if key == "coding_rate":
        return None  # no subspace bases: the paper's compression term is not defined for this mechanism
    probes_ = [r, *(more or [])]
    mean, runs = _seed_mean(key, probes_)
    if len(mean) < 2:
        return None
    start, claim_id, rule = _layerwise_claim(name, key, len(mean))
    # the series per layer and the model's accuracy are in the layerwise table: the finding gives the trend only
    measured = f"{MEASURE_LABEL[key]}: {_describe(mean, start)}"
    if len(runs) > 1:
        per_seed = ", ".join(_fall_verdict(x, start) for x in runs)
        measured = f"{MEASURE_LABEL[key]}, mean of {len(runs)} seeds, {_describe(mean, start)}; per seed: {per_seed}"
        rule = f"{rule}, {len(runs)} seeds"
    verdict = _seeds_verdict(mean, runs, start)
    f = paper_claims.measured_finding(claim_id, measured, verdict, rule, "paper", len(runs), name=name)
    lit = _literal_key(r)
    lit_mean, lit_runs = _seed_mean(lit, probes_ if len(runs) > 1 else [r], len(mean))
    if lit == key or verdict == "inconclusive" or not lit_runs:
        return f
    lv = _seeds_verdict(lit_mean, lit_runs, start)
    f["literal_measure"] = {"measure": MEASURE_LABEL[lit], "verdict": lv, "series": lit_mean}
    if lv != verdict:
        why = f"{paper_claims.get(claim_id).reference} plots ({MEASURE_LABEL[lit]}) gives {lv}"
        claims.gate(f, f"{why} ({_describe(lit_mean, start)})", "conditions")
    return f
