"""In-context learning (AoT §4.1.2, Fig. 6): AoT vs GPT on linear and sparse-linear regression, error / d (Garg et
al.'s normalisation: predicting 0 scores 1 on dense functions, s/d on s-sparse ones) against the number of
in-context examples, with least squares and Lasso (scikit-learn) fitted on the same prompts.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from attnzoo.compare import claims, common
from attnzoo.compare.claims import Finding
from attnzoo.compare.common import Context, Section, Table, fmt
from attnzoo.compare.pipeline import Evidence, Longer, Plateau, Tuning, judge
from attnzoo.compare.store import Step
from attnzoo.reproduce import paper_claims

KEY = "icl"
TITLE = "In-context learning: regression"

TASKS = {"linear": "icl_linear", "sparse": "icl_sparse_linear"}
#: the function class each task key names, as the section title says it
TASK_NAMES = {"linear": "linear", "sparse": "sparse-linear"}


def title(tasks: Iterable[str]) -> str:
    """The section title naming only the function classes the plan runs (``TITLE`` when none is known)."""
    names = [TASK_NAMES.get(t, t) for t in tasks]
    if not names:
        return TITLE
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return f"In-context learning: {listed} regression"


#: model overrides of AoT's attention ablations: without MSSA's query normalisation (AoT §4.1); with three projections
#: instead of one (the query still normalised); softmax attention, which changes both (the 2x2's fourth corner)
_OVERRIDES = {
    "aot-qnorm": {"attention_options": {"normalize_query": False}},
    "aot-untied": {"attention_options": {"normalize_query": True, "tied": False}},
    "aot+softmax": {"attention": "softmax", "attention_options": {}},
}
#: rows trained 2x or 4x the steps and warm-up: is AoT's plateau the budget? (and the baseline's plateau check)
_STEP_FACTOR = {"aot@2x-steps": 2, "aot@4x-steps": 4, "gpt@2x-steps": 2}
#: each ablation -> the row whose model and tuned learning rate it trains with (one factor changed, the rate kept)
TUNED_AS = dict.fromkeys(_OVERRIDES, "aot") | {n: n.split("@")[0] for n in _STEP_FACTOR}
#: row -> its registered model
MODELS = {n: f"icl_{n}" for n in ("gpt", "aot", "aot_hybrid", "aot_full_mlp")}
MODELS |= {n: MODELS[row] for n, row in TUNED_AS.items()}


def plan_steps(plan: dict, seed: int) -> list[Step]:
    steps = []
    common.check_sweep_extra(plan, list(plan["models"]))
    for task, opts in plan["tasks"].items():
        common.check_known([task], TASKS, "ICL task")
        ablate = task in plan.get("ablation_tasks", plan["tasks"])
        names = list(plan["models"]) + (list(plan.get("ablations", [])) if ablate else [])
        common.check_known(names, MODELS, "ICL model")
        # the sweep first, on its own seed and its own prompts (the task seed too): the seeds train at its best rate
        for name in plan["models"]:
            for sid, off, lr in common.sweep_runs(f"{KEY}/{task}/{name}", common.row_lrs(plan, name), seed):
                steps.append(common.section_step(KEY, sid, _train(plan, task, opts, name, off, off, lr), _run_model))
        for name in names:
            # the prompts (task seed) are the same for every model and seed; the seed varies initialisation and order;
            # the baseline's plateau check runs `plateau_seeds` seeds: GPT's 2x runs are the section's costliest
            seeds = (common.plateau_seed_list if name == "gpt@2x-steps" else common.seed_list)(plan, seed)
            source = TUNED_AS.get(name, name)
            for sid, s in common.seed_runs(f"{KEY}/{task}/{name}", seeds):
                cfg = _train(plan, task, opts, name, seed, s)
                if source in plan["models"]:
                    cfg = common.tuned(cfg, f"{KEY}/{task}", source, common.row_lrs(plan, source), "mean_error", False)
                steps.append(common.section_step(KEY, sid, cfg, _run_model))
        config = {"task": TASKS[task], "task_options": dict(opts, seed=seed), "lasso_alpha": plan["lasso_alpha"]}
        steps.append(common.section_step(KEY, f"{KEY}/{task}/baselines", config, _run_baselines))
    return steps


def _train(plan: dict, task: str, opts: dict, name: str, task_seed: int, seed: int, lr: float | None = None) -> dict:
    """The step config of one training run of ICL row ``name`` (at ``lr``, else the plan's rate)."""
    model_opts = dict(plan["arch"], **_OVERRIDES.get(name, {}))
    if name == "aot_hybrid":
        model_opts["ffn_layers"] = max(1, plan["arch"]["depth"] // 2)
    factor, tr = _STEP_FACTOR.get(name, 1), plan["train"]
    settings = tr | {k: factor * tr[k] for k in ("steps", "warmup_steps") if k in tr}
    if lr is not None:  # a sweep run: at the plan's `sweep_fraction` of the steps, like every section's sweeps
        settings = dict(common.sweep_train(settings, plan), lr=lr)
    data = dict(task=TASKS[task], task_options=dict(opts, seed=task_seed), model=MODELS[name])
    return {"train": dict(data, model_options=model_opts, seed=seed, **common.train_defaults(**settings))}


def _run_model(ctx: Context, step: Step) -> dict:
    rec = common.train_run(ctx, step.id, step.config["train"], sweep=step.config.get("sweep"))
    val = rec["val"]
    out = {"error_per_position": val["normalized_error_per_position"], "mean_error": val["normalized_error"]}
    return out | {k: rec[k] for k in ("samples_per_s", *common.RUN_KEYS)}


def baseline_errors(xs: np.ndarray, ys: np.ndarray, lasso_alpha: float) -> dict[str, list[float]]:
    """Per-position error / d of predicting 0, least squares and Lasso on examples ``0..i-1`` (``xs (B, n, d)``)."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import Lasso

    b, n, d = xs.shape
    xs, ys = xs.astype(np.float64), ys.astype(np.float64)
    err = {k: ys**2 for k in ("zero", "least_squares", "lasso")}  # with no example yet, each predicts 0
    for j in range(b):
        for i in range(1, n):
            w, *_ = np.linalg.lstsq(xs[j, :i], ys[j, :i], rcond=None)
            err["least_squares"][j, i] = (xs[j, i] @ w - ys[j, i]) ** 2
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                las = Lasso(alpha=lasso_alpha, fit_intercept=False, max_iter=10000).fit(xs[j, :i], ys[j, :i])
            err["lasso"][j, i] = (las.predict(xs[j, i][None])[0] - ys[j, i]) ** 2
    return {k: (v.mean(0) / d).tolist() for k, v in err.items()}


def _run_baselines(_ctx: Context, step: Step) -> dict:
    from attnzoo.data import build_task

    task = build_task(step.config["task"], **step.config["task_options"])
    (xs, ys), _ = task.val.get_batch(np.arange(len(task.val)))
    errors = baseline_errors(xs.numpy(), ys.numpy(), step.config["lasso_alpha"])
    return {"errors": errors, "n_prompts": len(task.val), "dim": task.info["dim"]}


def summarize(records: dict[str, dict], plan: dict, plots_dir, rel) -> Section:
    sec = Section(KEY, title(plan["tasks"]))
    if not plan["tasks"]:
        sec.intro = "Not run at this budget (`--budget long` runs it)."
        return sec
    arch, tr = plan["arch"], plan["train"]
    first = next(iter(plan["tasks"].values()))
    d, n = first["dim"], first["n_points"]
    sp = plan["tasks"].get("sparse", {}).get("sparsity")
    rows = list(plan["models"]) + list(plan.get("ablations", []))
    if rows:
        sec.scale = (
            f"here d={d} with {n} points per prompt, width {arch['dim']}, depth {arch['depth']}, {tr['steps']} steps "
            f"of {tr['batch_size']} prompts; AoT: d=20 with up to 40 in-context examples, 16 layers (Hybrid 24) of "
            "width 128 with 8 heads, 50,000 steps of 64 prompts (§4.1.2, Fig. 6, after Garg et al.)"
        )
        sec.intro = (
            f"{n} Gaussian inputs per prompt, d={d}, {', '.join(plan['tasks'])} functions"
            + (f" (sparse: {sp} non-zero weights)" if sp is not None else "")
            + f"; width {arch['dim']}, depth {arch['depth']}, {arch['heads']} heads, {tr['steps']} steps of "
            f"{tr['batch_size']} fresh prompts, {plan.get('seeds', 1)} seed(s). Error / d on "
            f"{first.get('n_val', 1000)} held-out prompts at k examples (last column: mean ± std over seeds); Lasso "
            f"alpha {plan['lasso_alpha']}."
        )
    else:  # the reference predictors only
        sec.intro = (
            "No model trains at this budget: AoT's claims are not tested (the claims table gives the pilots' reason) "
            "and GPT's own in-context check tests no paper claim. The table gives the reference predictors' error / d "
            f"on {first.get('n_val', 1000)} held-out prompts ({n} Gaussian inputs, d={d}; Lasso alpha "
            f"{plan['lasso_alpha']})."
        )
    runs = {t: {m: rs for m in rows if (rs := common.per_seed(records, f"{KEY}/{t}/{m}"))} for t in plan["tasks"]}

    def per_row(fold):
        return {t: {m: fold(rs) for m, rs in by.items()} for t, by in runs.items()}

    curves = per_row(lambda rs: np.mean([r["error_per_position"] for r in rs], axis=0).tolist())
    finals = per_row(lambda rs: [r["error_per_position"][-1] for r in rs])
    for t in plan["tasks"]:
        if (base := records.get(f"{KEY}/{t}/baselines")) is not None:
            curves[t].update(base["result"]["errors"])
        if curves[t]:
            sec.tables.append(_error_table(t, curves[t], finals[t], d))
    sec.data = {"curves": curves, "final_error_per_seed": finals}
    if any(curves.values()):
        sec.add_plot(_plot(curves, d), plots_dir / "icl.png", rel, "Error / d vs in-context examples (AoT Fig. 6).")
    ev = _findings(sec, curves, finals, records, plan)
    sec.data["val_curves"] = val = per_row(lambda rs: common.mean_val_curve(rs, "normalized_error"))
    labels = ("error / d", "In-context: validation curves", "mean over k, seed means")
    sec.add_curves(list(val.items()), plots_dir / "icl_curves.png", rel, *labels)
    ev.plateaus = _plateaus(records, finals)
    _tune(sec, records, plan, ev)
    sec.data["plateau"] = judge(sec.findings, ev)
    sec.data["untuned"] = ev.tuning[0].untuned
    return sec


def _error_table(task: str, c: dict[str, list[float]], fin: dict[str, list[float]], d: int) -> Table:
    """Error / d of every predictor at a few k, averaged over k, and with all examples (mean ± std over seeds)."""
    npos = len(next(iter(c.values())))
    # the last position is the over-seeds column (mean ± std), not repeated as a mean
    ks = sorted({1, max(1, d // 2), min(d, npos - 1)} - {npos - 1})
    rows = []
    for name, v in c.items():
        last = claims.stat(fin[name]).fmt(".3f") if name in fin else fmt(v[-1], ".3f")
        rows.append([name, *(fmt(v[k], ".3f") for k in ks), fmt(float(np.mean(v)), ".3f"), last])
    heads = ["predictor"] + [f"k={k}" for k in ks] + ["mean over k", f"k={npos - 1}"]
    return Table(f"{task}: error / d by number of in-context examples k", heads, rows)


def _plateaus(records: dict, finals: dict) -> list[Plateau]:
    """GPT's plateau per task on the compared metric (error averaged over k), with AoT's own run at 2x steps."""
    out = []
    for t, fin in finals.items():
        if "gpt" not in fin:
            continue
        aot, gpt = ((_mean_over_k(records, t, m), _mean_over_k(records, t, m + common.LONGER)) for m in ("aot", "gpt"))
        rows = {"aot": Longer("aot", *aot)} if "aot@2x-steps" in fin else {}
        own = lambda f, t=t: paper_claims.test_of(f.claim_id) == t  # noqa: E731
        out.append(Plateau("gpt", f"gpt on {t} (error averaged over k)", *gpt, "error/d", judges=own, rows=rows, key=t))
    return out


def _mean_over_k(records: dict, task: str, name: str) -> claims.Stat | None:
    """Row ``name``'s error averaged over the number of in-context examples (the comparison's metric), per seed."""
    runs = common.per_seed(records, f"{KEY}/{task}/{name}")
    return claims.stat(float(np.mean(r["error_per_position"])) for r in runs)


def _tune(sec: Section, records: dict, plan: dict, ev: Evidence) -> None:
    """The sweep table per task, and gates on every comparison (and AoT's own claims) at an unswept rate."""
    untuned: dict[str, str] = {}
    models, unswept = list(plan["models"]), "no learning-rate sweep in this section ({row})"
    for t in plan["tasks"]:
        base, label = f"{KEY}/{t}", f"{t}, error / d"
        untuned |= common.tune_rows(sec, records, plan, models, base, "mean_error", False, 1.0, label, unswept=unswept)
    ev.tuning.append(Tuning(untuned))
    if "aot" in untuned:  # AoT's own "learns in context" claims rest on the same rate
        why = f"not tuned: {untuned['aot']}"
        ev.gates += [(f, "not tuned", why) for f in sec.findings if f.kind == "paper" and not f.claim_type]


def _plot(curves, d):
    plt = common.pyplot()
    tasks = [t for t in curves if curves[t]]
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 3.8), squeeze=False)
    styles = {"zero": ":", "least_squares": "--", "lasso": "-."}
    for ax, t in zip(axes[0], tasks, strict=True):
        for i, (name, v) in enumerate(curves[t].items()):
            ref = name in styles
            color = "gray" if ref else f"C{i}"
            ax.plot(range(len(v)), v, styles.get(name, "-"), marker=None if ref else "o", ms=3, label=name, color=color)
        ax.axvline(d, color="k", lw=0.5, alpha=0.5)
        ax.set(xlabel="in-context examples", ylabel="squared error / d", ylim=(0, None))
        ax.set_title(f"{t} regression (d={d})")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _baseline_learned(fin: dict, zero: float, plan: dict) -> bool:
    """Every GPT seed's error with all examples is below 0.8x the zero predictor's (or no such rule)."""
    return not plan.get("require_learned", True) or ("gpt" in fin and not _stuck(fin["gpt"], zero))


def _stuck(errors: list[float], zero: float) -> list[float]:
    """The seeds' errors (with all examples) not below 0.8x the zero predictor's: those did not learn."""
    return [e for e in errors if e >= 0.8 * zero]


def _findings(sec: Section, curves: dict, finals: dict, records: dict, plan: dict) -> Evidence:
    """The section's findings (and a note where AoT is not compared), and the gates that its runs' errors give."""
    ev = Evidence()
    for t, c in curves.items():
        if "zero" not in c:
            continue
        zero, fin = c["zero"][-1], finals[t]
        # the comparisons with AoT need a baseline that left the zero predictor (every seed below 0.8x its error);
        # the "learns" findings need no baseline and use the stricter half-the-zero-predictor rule per seed
        if "aot" in fin and "gpt" in fin:
            if _baseline_learned(fin, zero, plan):
                sec.findings.append(_closeness(t, zero, records))
                ev.gates += _aot_unlearned(sec.findings[-1], fin, zero)
            else:
                errors = ", ".join(f"{e:.3f}" for e in fin["gpt"])
                sec.notes.append(
                    f"{t}: GPT's error at k = all ({errors} over its seeds) is not below 0.8x the zero "
                    f"predictor's ({zero:.3f}) on every seed, so AoT is not compared with it here"
                )
        sec.findings += [_learns(t, m, len(c[m]) - 1, fin, zero, ev) for m in ("gpt", "aot") if m in fin]
        sec.findings += _aot_not_tested(t, plan, fin)
    return ev


def _learns_verdict(errors: list[float], zero: float) -> tuple[int, str]:
    """How many seeds learn in context (their error with all examples below half the zero predictor's), and the
    verdict: every seed learns: agrees; none: disagrees; a split: inconclusive."""
    n_ok = sum(e < 0.5 * zero for e in errors)
    return n_ok, "agrees" if n_ok == len(errors) else "disagrees" if n_ok == 0 else "inconclusive"


def _learns(t: str, m: str, k: int, fin: dict, zero: float, ev: Evidence) -> Finding:
    """Row ``m`` learns task ``t`` in context with ``k`` examples (AoT Fig. 6; GPT's as a check), gates into ``ev``."""
    n_ok, verdict = _learns_verdict(fin[m], zero)
    f = claims.finding(
        **paper_claims.finding_kw(f"icl-gpt-learns#{t}" if m == "gpt" else f"aot-f6-icl-learns#{t}", task=t),
        measured=f"{m} error {claims.stat(fin[m]).fmt('.3f')} at k={k}; {n_ok} of {len(fin[m])} "
        f"seeds below half the zero predictor's {zero:.3f}",
        verdict=verdict,
        rule="per seed, error at k = all below half the zero predictor's (every seed: agrees; none: disagrees)",
        kind="check" if m == "gpt" else "paper",
        seeds=len(fin[m]),
    )
    gpt = fin.get("gpt", [])
    gpt_ok = _learns_verdict(gpt, zero)[0]
    if m == "aot" and verdict == "disagrees" and not (gpt and gpt_ok == len(gpt)):
        # a budget that does not teach GPT on every seed by the same rule cannot show that AoT fails to learn
        why = f"the GPT baseline learns by the same rule on only {gpt_ok} of {len(gpt)} seeds"
        ev.gates.append((f, "did not learn", why + ", so the budget may be the limit"))
    f.trained = True  # over seeds of trained models, though not an interval: counted with the comparisons
    ev.gates += _learns_plateau(f, m, fin, zero)
    return f


def _aot_not_tested(t: str, plan: dict, fin: dict) -> list[Finding]:
    """AoT's claims, where the plan leaves AoT out for a reason its pilots measured (``aot_not_tested``)."""
    why = plan.get("aot_not_tested")
    if "aot" in fin or not why:
        return []
    ids = (f"aot-f6-icl-learns#{t}", f"aot-f6-icl-close#{t}")
    return [claims.not_tested(**paper_claims.finding_kw(cid, task=t), why=why) for cid in ids]


def _closeness(t: str, zero: float, records: dict) -> Finding:
    """AoT against GPT on the error averaged over k (AoT Fig. 6's "close to")."""
    kw = paper_claims.compare_kw(f"aot-f6-icl-close#{t}", task=t)
    kw["margin"] *= zero  # a fraction of the zero predictor's error: linear ~1, sparse ~0.26
    aot, gpt = (_mean_over_k(records, t, m) for m in ("aot", "gpt"))
    return claims.compare(aot, gpt, **kw, unit="(error/d)", a_name="aot", b_name="gpt", lower_is_better=True)


def _aot_unlearned(f: Finding, fin: dict, zero: float) -> list:
    """The baseline's rule applied to AoT: a seed on the zero predictor measures a failure to train."""
    if not (stuck := _stuck(fin["aot"], zero)):
        return []
    rule = f"error at k = all not below 0.8x the zero predictor's {zero:.3f}"
    return [(f, "did not learn", common.did_not_learn(stuck, len(fin["aot"]), "aot", rule, ".3f"))]


def _learns_plateau(f: Finding, m: str, fin: dict, zero: float) -> list:
    """A decided "learns" verdict stands only if the row's run at twice the steps gives the same verdict."""
    if claims.numbers_verdict(f) not in claims.DECIDED:
        return []
    longer = fin.get(f"{m}@2x-steps")
    if not longer:
        return [(f, "plateau", f"{m} has no run at twice the steps, so its plateau is not shown")]
    _, v2 = _learns_verdict(longer, zero)
    err = claims.stat(longer).fmt(".3f")
    if v2 != claims.numbers_verdict(f):
        return [(f, "plateau", f"{m} at twice the steps: error {err} ({len(longer)} seed(s)), {v2!r} by the same rule")]
    f.longer_run = f"{m} at twice the steps: error {err}, {v2} by the same rule"
    return []
