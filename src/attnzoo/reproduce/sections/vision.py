"""Vision: ViT vs ToST vs XCiT vs CRATE vs CBT vs AoT vs CSP-ViT vs Fastmax-ViT at equal width/depth.

Each model is the paper's architecture (registered in ``attnzoo.models``) shrunk to the budget's width,
depth and heads, trained with the same optimiser and steps on (Fashion-)MNIST / digits. Reported:
validation accuracy, parameters, training images/s and the peak memory of one training step.
"""

from __future__ import annotations

import copy
from typing import NamedTuple

import numpy as np

from attnzoo.reproduce import claims, common, paper_claims
from attnzoo.reproduce.claims import Finding
from attnzoo.reproduce.common import Section, Table, fmt
from attnzoo.reproduce.pipeline import Control, Evidence, Plateau, Tuning, judge, paper_finding
from attnzoo.reproduce.store import Step

KEY = "vision"
TITLE = "Vision: image classification"


class VisionRow(NamedTuple):
    """A trained row: registered model, mechanism, table description, arch overrides (options None: CSP's groups)."""

    registered: str
    mechanism: str
    description: str
    overrides: dict


def _swap(mech: str, options: dict | None, description: str = "", **extra) -> VisionRow:
    """A controlled swap: the ViT's skeleton (conv patches, CLS token, MLP blocks, pre-norm), another attention."""
    overrides = {"attention": mech, "attention_options": options, **extra}
    return VisionRow("vit_s", mech, description or f"ViT skeleton, {mech} attention (controlled swap)", overrides)


def _meanpooled(mech: str, options: dict | None, attention: str) -> VisionRow:
    """A controlled swap that pools the patches by their mean instead of reading a CLS token."""
    return _swap(mech, options, f"ViT skeleton, {attention}, mean pooling instead of the CLS token", pool="mean")


#: name -> the architecture of a paper
MODELS: dict[str, VisionRow] = {
    "vit": VisionRow("vit_s", "softmax", "ViT/DeiT (baseline)", {}),
    "tost": VisionRow("tost_t", "tssa", "ToST", {}),
    "xcit": VisionRow("xcit_s", "xca", "XCiT (ToST's baseline)", {}),
    "crate": VisionRow("crate_t", "mssa", "CRATE (CBSA/AoT baseline)", {}),
    "cbt": VisionRow("cbt_t", "cbsa", "CBSA (CBT)", {}),
    "aot": VisionRow("aot_vision_b", "mssa", "AoT (attention only)", {}),
    "csp_vit": VisionRow(
        "csp_vit_cifar", "csp", "CSP-ViT", {"mlp_dim": None, "dropout": 0.0, "attention_options": None}
    ),
    "fastmax_vit": _swap("fastmax", {"p": 2}, "FAST (Fastmax p=2 in ViT)"),
}

_IMAGE_SIZE = {"digits": 8, "mnist": 28, "fashion_mnist": 28}

#: controlled swaps, and the no-attention control: the same skeleton with an identity token mixer, so "attention
#: helps" is measured; with no token mixing a CLS token never sees the patches (the control scored chance, 10.2%,
#: in the long run of 2026-11-26), so the control pools the patches by their mean instead
SWAPS: dict[str, VisionRow] = {
    "vit+tssa": _swap("tssa", {}),
    "vit+xca": _swap("xca", {}),
    "vit+mssa": _swap("mssa", {}),
    "vit+cbsa": _swap("cbsa", {}),
    "vit+csp": _swap("csp", None),
    "vit+identity": _swap("identity", {}, pool="mean"),
}

#: the no-attention control row (run whenever the ViT baseline is)
CONTROL = "vit+identity"
#: ToST at ViT's parameter count ("similar size", ToST Table 2): ToST's architecture with only its width changed
MATCHED = "tost@matched-params"
#: a parameter-matched row is within this relative distance of the reference's parameter count
MATCH_TOLERANCE = claims.SIZE_TOLERANCE

#: (a, b) -> the parameter ratio a/b of the paper's own comparison and where it is from: a comparison whose ratio is
#: more than MATCH_TOLERANCE away from it (either way) is not under the paper's conditions (gated)
PAPER_SIZE_RATIO: dict[tuple[str, str], tuple[float, str]] = paper_claims.size_ratios(
    "tost-t2-vit", "tost-t2-xcit", "cbsa-t3-crate", "csp-t3-vit"
)
# CSP-ViT is compared with softmax in its own skeleton (below, CSP_BASE): the paper's ratio is that pair's
PAPER_SIZE_RATIO[("csp_vit", "csp_vit_skeleton+softmax")] = PAPER_SIZE_RATIO[("csp_vit", "vit")]

#: ablations that test an explanation of a gap
ABLATIONS: dict[str, VisionRow] = {
    # AoT is CRATE without the ISTA block and without LayerNorm: one factor given back at a time
    "aot+ista": VisionRow(
        "aot_vision_b",
        "mssa",
        "AoT with CRATE's ISTA block restored (norm unchanged)",
        {"ffn": "ista", "ista_step": 0.1, "ista_lambda": 0.1},
    ),
    "aot+prenorm": VisionRow("aot_vision_b", "mssa", "AoT with CRATE's pre-norm restored (no ISTA)", {"norm": "pre"}),
    # TSSA mixes tokens only through global second-moment statistics, so a CLS token cannot gather the patches
    # through it (ToST pools with class attention): the ViT skeleton with mean pooling tests that reading
    "vit+tssa-meanpool": _meanpooled("tssa", {}, "TSSA attention"),
    # the baseline of the mean-pooled rows (the control, TSSA's and CSP's mean-pooled swaps): one factor apart
    "vit-meanpool": VisionRow("vit_s", "softmax", "ViT skeleton, softmax attention, mean pooling", {"pool": "mean"}),
    # XCA's swap without the CLS token: the other side of ToST's XCiT comparison in the mean-pooled skeleton
    "vit+xca-meanpool": _meanpooled("xca", {}, "XCA attention"),
    # CSP's swap without the CLS token: 16 tokens in 8 groups of two, the paper's vision setting (CSP Table 5:
    # K = N/2); with the CLS token N = 17 is prime and K = 1 (complete sorting, CSP's LRA setting)
    "vit+csp-meanpool": _meanpooled("csp", None, "CSP attention (groups of two)"),
    # CSP-ViT's own skeleton (LayerNorm-linear patches, mean pooling) with softmax attention: the skeleton's share
    "csp_vit_skeleton+softmax": VisionRow(
        "csp_vit_cifar",
        "softmax",
        "CSP-ViT's skeleton with softmax attention",
        {"mlp_dim": None, "dropout": 0.0, "attention": "softmax", "attention_options": {}},
    ),
}


def _csp_groups(n_tokens: int) -> int:
    """CSP's K: the largest divisor of N up to N/2 (CSP Table 5 uses K=32 for N=64, two tokens a group)."""
    return max(k for k in range(1, max(1, n_tokens // 2) + 1) if n_tokens % k == 0)


def _image_size(plan: dict) -> int:
    return plan["task_options"].get("img_size") or _IMAGE_SIZE.get(plan["task"], 28)


def row_arch(plan: dict, name: str) -> dict:
    """Row ``name``'s own model options from the plan's ``row_arch`` (``crate@2x-steps`` takes ``crate``'s)."""
    return dict(plan.get("row_arch", {}).get(name.split("@")[0], {}))


def _row(name: str) -> VisionRow:
    """The entry of any vision row: a paper's architecture, a controlled swap or an ablation (``x@...``: x's)."""
    base = name.split("@")[0]
    for rows in (SWAPS, ABLATIONS, MODELS):
        if base in rows:
            return rows[base]
    raise ValueError(f"unknown vision model {base!r}; valid: {sorted(MODELS) + sorted(SWAPS) + sorted(ABLATIONS)}")


def model_options(name: str, plan: dict) -> dict:
    """``create_model`` overrides of vision row ``name`` under a section plan, its ``row_arch`` entry last."""
    row = _row(name)
    opts = {**plan["arch"], **copy.deepcopy(row.overrides)}
    if opts.get("attention_options", {}) is None:
        # CSP: two tokens a group; the ViT skeleton's CLS token counts unless it mean-pools
        cls = 1 if row.registered == "vit_s" and opts.get("pool") != "mean" else 0
        n = (_image_size(plan) // plan["arch"]["patch_size"]) ** 2 + cls
        opts["attention_options"] = {"groups": _csp_groups(n), "shift_schedule": "linear"}
    return {**opts, **row_arch(plan, name)}


#: the baseline's plateau check: the ViT baseline trained with twice the steps (and warm-up), nothing else changed
PLATEAU = "vit@2x-steps"
#: the papers' own baselines with a plateau check of their own when the plan lists them (``plateau_baselines``):
#: a comparison against one of them is judged by its run at twice the steps, every other by the ViT's
BASELINE_PLATEAUS = {"vit": PLATEAU, "crate": "crate@2x-steps", "xcit": "xcit@2x-steps"}


def rows_of(plan: dict) -> list[str]:
    """Every trained row: the papers' architectures, the swaps, the controls, the ablations and the plateau runs."""
    rows = list(plan["models"]) + list(plan.get("swaps", [])) + _controls(plan) + list(plan.get("ablations", []))
    return rows + list(_plateau_rows(plan).values())


def _plateau_rows(plan: dict) -> dict[str, str]:
    """baseline -> its plateau row: the ViT's, and those of ``plateau_baselines`` (each run one seed)."""
    if not plan.get("plateau", True) or "vit" not in plan["models"]:
        return {}
    extra = plan.get("plateau_baselines", [])
    unknown = sorted(set(extra) - set(BASELINE_PLATEAUS) - {"vit"})
    if unknown:
        raise ValueError(f"plateau_baselines {unknown} have no plateau row; valid: {sorted(BASELINE_PLATEAUS)}")
    return {b: BASELINE_PLATEAUS[b] for b in ["vit"] + [b for b in extra if b in plan["models"] and b != "vit"]}


def _controls(plan: dict) -> list[str]:
    """The no-attention control and the parameter-matched ToST row, run whenever their reference rows are."""
    if not plan.get("controls", True) or "vit" not in plan["models"]:
        return []
    out = [CONTROL] if CONTROL not in plan.get("swaps", []) else []
    # ``matched_params: false``: the tost row is already at ViT's parameter count (its ``row_arch`` width)
    return out + ([MATCHED] if plan.get("matched_params", True) and "tost" in plan["models"] else [])


def _model_params(plan: dict, registered: str, options: dict) -> int:
    """Parameters of ``registered`` built with ``options`` for the plan's images (10 classes, one channel)."""
    from attnzoo.models import create_model

    model = create_model(registered, num_classes=10, image_size=_image_size(plan), in_chans=1, **options)
    return common.num_params(model)


def matched_dim(plan: dict, name: str = "tost", ref: str = "vit") -> int:
    """The width of ``name`` (a multiple of the heads, up to twice the plan's) closest to ``ref``'s parameters."""
    target = _model_params(plan, MODELS[ref].registered, model_options(ref, plan))
    heads, opts = plan["arch"]["heads"], model_options(name, plan)
    return min(
        range(heads, 2 * plan["arch"]["dim"] + 1, heads),
        key=lambda d: abs(_model_params(plan, MODELS[name].registered, {**opts, "dim": d}) - target),
    )


def plan_steps(plan: dict, seed: int) -> list[Step]:
    # the sweeps first: every seed run trains at its row's best swept rate, read when it runs
    steps = []
    common.check_sweep_extra(plan, sweep_rows(plan))
    common.check_row_arch(plan, rows_of(plan))
    for name in sweep_rows(plan):
        for sid, s, lr in common.sweep_runs(f"{KEY}/{name}", common.row_lrs(plan, name), seed):
            swept = {**plan, "train": {**common.sweep_train(plan["train"], plan), "lr": lr}}
            steps.append(_row_step(swept, name, s, sid, tune=False))
    plateaus = set(_plateau_rows(plan).values())
    for name in rows_of(plan):
        if name not in {**MODELS, **SWAPS, **ABLATIONS} and name not in plateaus | {MATCHED}:
            raise ValueError(
                f"unknown vision model {name!r}; valid: {sorted(MODELS) + sorted(SWAPS) + sorted(ABLATIONS)}"
            )
        # a paper baseline's own plateau check runs one seed; the ViT's every seed (its change gates most findings)
        seeds = common.seed_list(plan, seed)[:1] if name in plateaus - {PLATEAU} else common.seed_list(plan, seed)
        steps += [_row_step(plan, name, s, sid) for sid, s in common.seed_runs(f"{KEY}/{name}", seeds)]
    # more seeds of a comparison's two rows, kept out of the tables and read in the finding's explanation
    extra = plan.get("extra_seeds", {})
    for name in extra.get("rows", []):
        if name not in rows_of(plan):
            raise ValueError(f"extra_seeds row {name!r} is not a row of this plan; rows: {rows_of(plan)}")
        first = seed + plan.get("seeds", 1)
        steps += [_row_step(plan, name, s, f"{KEY}/{name}/extra-seed{s}") for s in range(first, first + extra["seeds"])]
    return steps


#: the row whose tuned learning rate an ablation or plateau run trains with (one factor changed, the rate kept)
TUNED_AS = {
    "aot+ista": "aot",
    "aot+prenorm": "aot",
    "vit+tssa-meanpool": "vit+tssa",
    "vit+xca-meanpool": "vit+xca",
    "csp_vit_skeleton+softmax": "csp_vit",
    MATCHED: "tost",
} | {row: base for base, row in BASELINE_PLATEAUS.items()}


def sweep_rows(plan: dict) -> list[str]:
    """The rows whose rate is swept: every compared row and the ``swept_ablations`` (not the parameter-matched ToST)."""
    swept = plan.get("swept_ablations", [])
    unknown = sorted(set(swept) - set(plan.get("ablations", [])))
    if unknown:
        raise ValueError(
            f"swept_ablations {unknown} are not ablations of this plan; ablations: {plan.get('ablations')}"
        )
    rows = list(plan["models"]) + list(plan.get("swaps", [])) + [c for c in _controls(plan) if c != MATCHED]
    return rows + list(swept)


def row_config(plan: dict, name: str, seed: int) -> dict:
    """A step config training vision row ``name`` under ``plan`` (the probes section's deeper models use it too)."""
    base = name.split("@")[0]
    reg, mech, paper, _ = _row(base)
    opt = common.twice_steps(plan["train"]) if name in BASELINE_PLATEAUS.values() else dict(plan["train"])
    opts = model_options(base, plan)
    if name == MATCHED:
        opts["dim"] = matched_dim(plan)
        paper = f"ToST at width {opts['dim']}: ViT's parameter count (similar size)"
    task = dict(task=plan["task"], task_options=dict(plan["task_options"]), model=reg, model_options=opts)
    return {"train": dict(**task, seed=seed, **common.train_defaults(**opt)), "mechanism": mech, "paper": paper}


def _row_step(plan: dict, name: str, seed: int, sid: str, tune: bool = True) -> Step:
    """One training run of row ``name``, at the best rate of its sweep (``TUNED_AS``'s row's) when ``tune``."""
    cfg = row_config(plan, name, seed)
    source = name if name in plan.get("swept_ablations", []) else TUNED_AS.get(name, name)
    if tune and source in sweep_rows(plan):
        cfg = common.tuned(cfg, KEY, source, common.row_lrs(plan, source), "accuracy", True)
    return common.section_step(KEY, sid, cfg, common.classification_record)


def _stats(records: dict, name: str) -> dict | None:
    """Per-seed results of row ``name`` folded: accuracy (%) as a Stat, the rest as seed means."""
    rs = common.per_seed(records, f"{KEY}/{name}")
    if not rs:
        return None
    prefix = f"{KEY}/{name}/extra-seed"
    extra = [rec["result"] for sid, rec in sorted(records.items()) if sid.startswith(prefix)]
    return {
        # every seed the row has: the section's and, for the rows of plan "extra_seeds", the extra ones (whatever the
        # verdict: using extra seeds only when a verdict is undecided would pick the data by its outcome)
        "accuracy": claims.stat(_pct(r.get("accuracy")) for r in rs + extra),
        "extra_seeds": len(extra),
        "params": rs[0]["params"],
        "samples_per_s": common.seed_mean(rs, "samples_per_s"),
        "peak_train_mb": common.seed_mean(rs, "peak_train_mb"),
        "tokens": rs[0]["tokens"],
        "seeds": len(rs) + len(extra),
        "curve": rs[0].get("curve"),
        "val_curve": common.mean_val_curve(rs, "accuracy", 100.0),
    }


def summarize(records: dict[str, dict], plan: dict, plots_dir, rel) -> Section:
    sec = Section(KEY, TITLE)
    res = {n: st for n in rows_of(plan) if (st := _stats(records, n)) is not None}
    sec.intro = _intro(plan)
    sec.scale = scale_line(plan, [r["params"] for r in res.values() if r.get("params")])
    swaps = list(dict.fromkeys(n for n in ["vit", "fastmax_vit", *plan.get("swaps", []), CONTROL] if n in res))
    sec.tables += _tables(res, plan, swaps)
    sec.data = {"models": {n: _model_data(r) for n, r in res.items()}}
    sec.data["val_curves"] = {n: r["val_curve"] for n, r in res.items()}
    panels = [(t.title, {row[0]: res[row[0]]["val_curve"] for row in t.rows}) for t in sec.tables]
    for row in _plateau_rows(plan).values():
        if row in res and panels:
            panels[0][1][row] = res[row]["val_curve"]
    caption = (
        "Validation accuracy during training (seed means), one panel per table, plateau runs included; points before "
        f"the last use {common.CURVE_EVAL_BATCHES} validation batches."
    )
    title = "Vision: validation curves (seed means)"
    sec.add_curves(panels, plots_dir / "vision_curves.png", rel, "validation accuracy (%)", title, caption)
    names = [n for n in plan["models"] if n in res]
    if names:
        fig = _plot(res, names + [n for n in swaps if n not in names])
        caption = "Accuracy (mean ± std over seeds), training images/s and peak training-step memory."
        sec.add_plot(fig, plots_dir / "vision.png", rel, caption)
    majority = 100.0 * plan.get("majority", 0.1)
    vit_learned = "vit" not in res or common.learned(res["vit"]["accuracy"].values, majority)
    if plan.get("require_learned", True) and not vit_learned:
        sec.notes.append(
            f"the ViT baseline reached {res['vit']['accuracy'].fmt('.1f')}% against a majority class of "
            f"{majority:.0f}%: not {common.LEARNED_MARGIN:g} points above it on every seed, so no comparison is "
            "reported"
        )
        return sec
    sec.findings, ev = _findings(res)
    ev.plateaus = _plateaus(res, _plateau_rows(plan))
    ev.tuning.append(Tuning(_tune(sec, records, plan, res)))
    plateau = judge(sec.findings, ev)
    sec.data["plateau"] = plateau["vit"] if len(plateau) == 1 else plateau
    sec.data["untuned"] = ev.tuning[0].untuned
    return sec


def _tune(sec: Section, records: dict, plan: dict, res: dict) -> dict[str, str]:
    """The sweep table, and ``{row: why}`` for every row not shown at its best rate."""
    rows = sweep_rows(plan)
    noise = {r: res[r]["accuracy"].std for r in rows if r in res}
    label = "validation accuracy %"
    untuned = common.tune_rows(sec, records, plan, rows, KEY, "accuracy", True, 100.0, label, noise=noise)
    if "tost" in untuned and MATCHED in res and plan.get("lr_sweep"):
        untuned[MATCHED] = f"{MATCHED} trains at tost's rate: " + untuned["tost"]
    return untuned


def _plateaus(res: dict, rows: dict[str, str]) -> list[Plateau]:
    """Each baseline's plateau check on the comparisons against it; the ViT's on every other one."""
    others = [b for b in rows if b != "vit"]
    judges = {"vit": lambda f: f.b_name not in others} | {b: (lambda f, b=b: f.b_name == b) for b in others}
    return [
        Plateau(b, b, _acc(res, b), _acc(res, rows.get(b, f"{b}@2x-steps")), "%", ".1f", judges=j, key=b)
        for b, j in judges.items()
    ]


def _attention_needed(findings: list[Finding]) -> list[tuple[Finding, str, str]]:
    """Control gates on non-inferiority claims when the ViT is not shown to beat its no-attention control."""
    check = next((f for f in findings if f.b_name == CONTROL and f.a_name in ("vit", MEANPOOL_BASE)), None)
    if check is None or claims.numbers_verdict(check) == "agrees":
        return []
    check.gates_section = True  # the first screen says so
    why = f"not shown to need attention: {check.a_name} vs {CONTROL} {check.effect:+.3g} pts " + (
        f"[{check.ci95[0]:+.3g}, {check.ci95[1]:+.3g}]" if check.ci95 else "(one seed, no interval)"
    )
    return [(f, "control", why) for f in findings if paper_finding(f) and f.claim_type == "non-inferiority"]


def _acc(res: dict, name: str) -> claims.Stat | None:
    return res[name]["accuracy"] if name in res else None


def _intro(plan: dict) -> str:
    arch, tr = plan["arch"], plan["train"]
    n_seeds = plan.get("seeds", 1)
    rate = (
        f"each row at the best rate of its sweep ({', '.join(f'{x:g}' for x in lrs)})"
        if (lrs := plan.get("lr_sweep"))
        else f"lr {tr['lr']}, not tuned"
    )
    return (
        f"Task `{plan['task']}` ({_describe_task(plan)}); width {arch['dim']}, depth {arch['depth']}, "
        f"{arch['heads']} heads, patch {arch['patch_size']}; {tr['steps']} steps of batch {tr['batch_size']}, "
        f"AdamW/cosine, {rate}, no augmentation; {n_seeds} seed{'s' if n_seeds > 1 else ''} per row (mean ± "
        "sample std). The papers' architectures differ in more than the attention; the controlled swaps put each "
        "attention into the ViT skeleton (conv patches, CLS token, MLP blocks, pre-norm)."
    )


_MEASURES = ["params", "val acc %", "train img/s", "peak train-step MiB"]

#: the ablation table's words for each row (its step configs keep the long descriptions of :data:`ABLATIONS`)
ABLATION_LABELS = {
    "aot+ista": "AoT + CRATE's ISTA block",
    "aot+prenorm": "AoT + CRATE's pre-norm",
    "vit+tssa-meanpool": "ViT + TSSA, mean pooling",
    "vit-meanpool": "ViT, mean pooling",
    "vit+csp-meanpool": "ViT + CSP (groups of two), mean pooling",
    "vit+xca-meanpool": "ViT + XCA, mean pooling",
    "csp_vit_skeleton+softmax": "CSP-ViT's skeleton, softmax",
}


def _tables(res: dict, plan: dict, swaps: list[str]) -> list[Table]:
    """The papers' architectures, the controlled swaps and the ablations (one row per model, seed means)."""

    def measures(n):
        r = res[n]
        acc = r["accuracy"].fmt(".1f")
        return [fmt(r["params"], ","), acc, fmt(r["samples_per_s"], ".0f"), fmt(r["peak_train_mb"], ".1f")]

    def paper_row(n):
        _, mech, desc, _ = _row(n)
        return [n, mech, "ToST, width matched to ViT's parameters" if n == MATCHED else desc, *measures(n)]

    papers = [n for n in list(plan["models"]) + [MATCHED] if n in res]
    heads = ["model", "mechanism", "architecture", *_MEASURES]
    tables = [Table("Papers' architectures", heads, [paper_row(n) for n in papers])]
    if len(swaps) > 1:
        rows = [[n, *measures(n)] for n in swaps]
        tables.append(Table("Controlled swaps: ViT skeleton, only the attention differs", ["model", *_MEASURES], rows))
    abl = [n for n in plan.get("ablations", []) if n in res]
    if abl:
        rows = [[n, ABLATION_LABELS.get(n, _row(n).description), *measures(n)] for n in abl]
        tables.append(Table("Ablations", ["model", "change", *_MEASURES], rows))
    return tables


def _model_data(r: dict) -> dict:
    return {
        "accuracy_mean": r["accuracy"].mean,
        "accuracy_std": r["accuracy"].std,
        "accuracy_per_seed": list(r["accuracy"].values),
        "params": r["params"],
        "samples_per_s": r["samples_per_s"],
        "peak_train_mb": r["peak_train_mb"],
        "tokens": r["tokens"],
        "seeds": r["seeds"],
        **({"accuracy_per_seed_with_extra": list(r["accuracy"].values)} if r.get("extra_seeds") else {}),
    }


def _describe_task(plan: dict) -> str:
    opts = plan["task_options"]
    if plan["task"] == "digits":
        return "scikit-learn 8x8 digits, 1,438 train / 359 validation images"
    n_tr, n_va = opts.get("n_train", 60000), opts.get("n_val", 10000)
    size = "28x28" + (f" resized to {opts['img_size']}x{opts['img_size']}" if opts.get("img_size") else "")
    return f"{n_tr:,} train / {n_va:,} validation images, {size}"


#: the papers' vision scale, from their texts (ToST §4: "resolutions of 224×224 ... patch of size 16×16", "400 epochs")
PAPER_SCALE = "ImageNet-1k at 224x224 (196 tokens of 16x16 patches), pre-trained for hundreds of epochs (ToST: 400)"


def scale_line(plan: dict, params: list[int]) -> str:
    """This section's scale against the papers', for the summary."""
    arch, tr, opts = plan["arch"], plan["train"], plan["task_options"]
    tokens = ((opts.get("img_size") or 28) // arch["patch_size"]) ** 2
    n_tr = opts.get("n_train", 60000)
    size = f"{min(params):,}-{max(params):,} parameters" if params else "no trained row"
    return (
        f"here {plan['task']}, {n_tr:,} training images, {tokens} tokens, width {arch['dim']}, depth "
        f"{arch['depth']}, {size}, {tr['steps']} steps of batch {tr['batch_size']} "
        f"({tr['steps'] * tr['batch_size'] / n_tr:.1f} epochs); the papers: {PAPER_SCALE}"
    )


def _pct(x):
    return None if x is None else 100.0 * x


def _plot(res: dict, names: list[str]):
    plt = common.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    x = np.arange(len(names))
    colors = [f"C{i % 10}" for i in range(len(names))]
    acc = [res[n]["accuracy"] for n in names]
    axes[0].bar(x, [a.mean for a in acc], yerr=[a.std or 0.0 for a in acc], color=colors, capsize=3)
    axes[0].set_ylabel("validation accuracy (%)")
    for ax, key, label in (
        (axes[1], "samples_per_s", "training images / s"),
        (axes[2], "peak_train_mb", "peak memory of a training step (MiB)"),
    ):
        ax.bar(x, [res[n].get(key) or 0.0 for n in names], color=colors)
        ax.set_ylabel(label)
    for ax in axes:
        ax.set_xticks(x, names, rotation=35, ha="right", fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle("Vision models at equal width/depth (papers' architectures, then controlled swaps)")
    fig.tight_layout()
    return fig


class VisionClaim(NamedTuple):
    """An architecture claim: its rows, their controlled swaps (``None``: none) and its id in :mod:`paper_claims`."""

    row: str
    swap: str | None
    base: str
    base_swap: str | None
    claim_id: str


CLAIMS = [
    VisionClaim("tost", "vit+tssa", "vit", "vit", "tost-t2-vit#architecture"),
    VisionClaim("tost", "vit+tssa", "xcit", "vit+xca", "tost-t2-xcit#architecture"),
    VisionClaim("cbt", "vit+cbsa", "crate", "vit+mssa", "cbsa-t3-crate"),
    VisionClaim("aot", "aot+ista", "crate", "crate", "aot-t2-crate"),
    VisionClaim("csp_vit", "vit+csp", "vit", "vit", "csp-t3-vit#architecture"),
    VisionClaim("fastmax_vit", None, "vit", None, "fast-t1-accuracy#vision"),
]


#: a controlled swap whose paper makes its own same-skeleton claim (instead of the architectures' claim above):
#: controlled row -> that claim's id
CONTROLLED_CLAIMS = {"vit+cbsa": "cbsa-t4-mssa"}


#: the mean-pooled baseline and the mean-pooled form of a controlled swap: ToST never passes a CLS token through
#: TSSA (class-attention layers pool, ToST App. C), and CSP's vision setting is groups of two (CSP Table 5), which
#: the 17 tokens of a CLS-token skeleton (a prime) do not allow (K = 1, complete sorting: CSP's LRA setting)
MEANPOOL_BASE = "vit-meanpool"
MEANPOOLED = {"vit+tssa": "vit+tssa-meanpool", "vit+csp": "vit+csp-meanpool", "vit+xca": "vit+xca-meanpool"}
#: why a CLS-token swap is not the paper's condition (used when its mean-pooled form was not run)
CLS_CONDITIONS = {
    "vit+tssa": "TSSA reads the CLS token here; ToST pools with class-attention layers and never passes a CLS token "
    "through TSSA (ToST App. C)",
    "vit+csp": "with the CLS token the skeleton has 17 tokens, a prime, so CSP runs with K = 1 (complete sorting, its "
    "LRA setting) instead of its vision setting of groups of two (CSP Table 5)",
}
#: the claim words of a controlled swap's finding (the same claim, tested with only the attention swapped)
SWAP_PREFIX = "controlled swap: "
#: CSP Table 3's MHA baseline is the paper's own ViT (LayerNorm-linear patches, mean pooling) with softmax attention
CSP_BASE = "csp_vit_skeleton+softmax"


def _controlled_pair(a_ctl: str | None, b_ctl: str | None, res: dict) -> tuple[str | None, str | None]:
    """The controlled swap a finding reads: the mean-pooled pair where both ran (the paper's condition), else given."""
    a_mp = MEANPOOLED.get(a_ctl)
    b_mp = MEANPOOL_BASE if b_ctl == "vit" else MEANPOOLED.get(b_ctl)
    if a_mp in res and b_mp in res:
        return a_mp, b_mp
    return a_ctl, b_ctl


def _findings(res: dict) -> tuple[list[Finding], Evidence]:
    """The section's comparisons and the evidence of their gates that the rows' results give."""
    ev = Evidence(sizes=PAPER_SIZE_RATIO)
    out = _comparisons(res, ev.gates)
    ev.gates += _attention_needed(out)
    # a CLS-token ViT baseline differs from the mean-pooled control in pooling too: the control is read against its
    # mean-pooled twin where it ran (one factor)
    twin = (MEANPOOL_BASE, res[MEANPOOL_BASE]["accuracy"]) if MEANPOOL_BASE in res else None
    ev.controls.append(Control(CONTROL, _acc(res, CONTROL), paper_finding, twin, lambda f: f.b_name == "vit"))
    return out, ev


def _comparisons(res: dict, gates: list) -> list[Finding]:
    """The comparisons; the gates only this section's set-up can judge go to ``gates``."""
    out = []

    def cmp(a, b, claim_id, **kw):
        return claims.compare(res[a]["accuracy"], res[b]["accuracy"], **_cmp_kw(claim_id, a, b), **kw)

    out += _control_findings(res, cmp, gates)
    for a, a_ctl, b, b_ctl, cid in CLAIMS:
        claim = paper_claims.get(cid).statement
        if a == "csp_vit" and CSP_BASE in res:
            b = CSP_BASE  # the paper swaps the attention inside its own ViT (CSP §4.1, Table 3's "ViT + MHA")
        if a not in res or b not in res:
            continue
        cls_row, cls_base = a_ctl, b_ctl
        a_ctl, b_ctl = _controlled_pair(a_ctl, b_ctl, res)
        f = _with_params(cmp(a, b, cid), res, a, b)
        if a == "aot":
            f.explanation = _aot_ablations(res, b)
            out.append(f)
        elif a_ctl in res and b_ctl in res and (a_ctl, b_ctl) != (a, b):
            swap_id = CONTROLLED_CLAIMS.get(a_ctl, f"{paper_claims.base_id(cid)}#controlled-swap")
            ctl = _with_params(cmp(a_ctl, b_ctl, swap_id), res, a_ctl, b_ctl)
            ctl.claim = f"{SWAP_PREFIX}{ctl.claim if a_ctl in CONTROLLED_CLAIMS else claim}"
            f.explanation = _explain(a, a_ctl, b_ctl, f, ctl, res, cid)
            if a_ctl != cls_row and cls_row in res and cls_base in res:
                # the mean-pooled pair is the finding; the CLS-token pair is the table's swap row
                claims.explain(
                    ctl,
                    f"with the CLS token, {cls_row} vs {cls_base}: {res[cls_row]['accuracy'].fmt('.1f')} vs "
                    f"{res[cls_base]['accuracy'].fmt('.1f')}",
                )
            elif a_ctl == cls_row and a_ctl in CLS_CONDITIONS:
                gates.append((ctl, "conditions", CLS_CONDITIONS[a_ctl]))
            if res[a_ctl].get("extra_seeds") and res[b_ctl].get("extra_seeds"):
                n_a, n_b = res[a_ctl]["accuracy"].n, res[b_ctl]["accuracy"].n
                claims.explain(ctl, f"{n_a} vs {n_b} seeds (the section's and the plan's extra seeds, all used)")
            out += [f, ctl]
        else:
            out.append(f)
        if (a, b) == ("tost", "vit") and MATCHED in res and f.params_a and f.params_b:
            claims.explain(f, f"parameters {f.params_a / f.params_b:.2f}x: {MATCHED} is the similar-size test")
    return out


def _control_findings(res: dict, cmp, gates: list) -> list[Finding]:
    """ToST against ViT at a matched parameter count (a paper claim), and ViT against its no-attention control."""
    out = []
    if MATCHED in res and "vit" in res:
        f = _with_params(cmp(MATCHED, "vit", "tost-t2-vit#matched-params"), res, MATCHED, "vit")
        f.claim += " (parameter-matched)"
        pa, pb = f.params_a, f.params_b
        if pa and pb and abs(pa / pb - 1) > MATCH_TOLERANCE:
            why = f"the parameter counts {pa:,} and {pb:,} differ by more than {MATCH_TOLERANCE:.0%}"
            gates.append((f, "conditions", why))
        out.append(f)
    if CONTROL in res and MEANPOOL_BASE in res:
        # one factor: the control mean-pools the patches (a CLS token without token mixing never sees the image),
        # and so does this ViT
        out.append(cmp(MEANPOOL_BASE, CONTROL, "vision-attention-helps", claim_type="superiority", kind="check"))
    elif CONTROL in res and "vit" in res:
        f = cmp("vit", CONTROL, "vision-attention-helps", claim_type="superiority", kind="check")
        # the CLS-token baseline against the mean-pooled control: the same check, its words say the pooling differs
        f.claim = (
            "attention helps: the ViT baseline beats its no-attention control (identity token mixer, same "
            "skeleton, mean-pooled patches: a CLS token without token mixing would never see the image)"
        )
        out.append(f)
    return out


def _with_params(f: Finding, res: dict, a: str, b: str) -> Finding:
    """The parameter ratio of both sides beside the comparison, with the counts for the parameter-matched row."""
    pa, pb = res[a].get("params"), res[b].get("params")
    if pa and pb:
        f.params_a, f.params_b = pa, pb
        ratio = f"{pa / pb:.2f}x"  # the counts of the other rows are in the tables
        f.measured += f"; parameters {pa:,} vs {pb:,} ({ratio})" if a == MATCHED else f"; parameters {ratio}"
    return f


def _cmp_kw(claim_id: str, a: str, b: str) -> dict:
    """:func:`claims.compare`'s arguments for claim ``claim_id`` (its record in :mod:`paper_claims`), ``a`` vs ``b``."""
    return dict(**paper_claims.compare_kw(claim_id), unit="pts", a_name=a, b_name=b, spec=".1f")


def gap_change(res: dict, base: str, ablated: str, ref: str, key: str = "accuracy") -> str:
    """How ablating ``base`` into ``ablated`` moved its gap to ``ref``, worded from the Welch CI of the change."""
    b, a, r = res[base][key], res[ablated][key], res[ref][key]
    before, after = r.mean - b.mean, r.mean - a.mean
    gap = f"gap to {ref} {before:+.1f} -> {after:+.1f} pts"
    delta, ci, _ = claims.welch_ci(a, b)
    if ci is None:
        return f"{gap} (one seed: the change is not judged)"
    change = f"change of {ablated} vs {base} {delta:+.1f} pts, 95% CI [{ci[0]:+.1f}, {ci[1]:+.1f}]"
    if ci[0] <= 0 <= ci[1]:
        return f"{gap}, but the {change} contains 0: no change is shown"
    _, new_ci, _ = claims.welch_ci(r, a)
    return f"{gap}: it {claims.change_word(before, after, noise=(new_ci[1] - new_ci[0]) / 2)} ({change})"


def _aot_ablations(res: dict, ref: str) -> str:
    """AoT vs CRATE differ in two factors (the ISTA block, pre-norm): one ablation each, each read on its own."""
    abls = [abl for abl in ("aot+ista", "aot+prenorm") if abl in res and "aot" in res]
    return "; ".join(f"{abl}: " + gap_change(res, "aot", abl, ref) for abl in abls)


def _explain(a, a_ctl, b_ctl, f, ctl, res, claim_id) -> str:
    """The architecture finding's reading (its controlled swap, own skeleton, mean pooling), worded from the CIs."""
    acc = lambda n: res[n]["accuracy"].fmt(".1f")  # noqa: E731
    lo_hi = lambda g: "no interval" if g.ci95 is None else f"95% CI [{g.ci95[0]:+.1f}, {g.ci95[1]:+.1f}]"  # noqa: E731
    swap = f"controlled swap {a_ctl} vs {b_ctl}: {ctl.effect:+.1f} pts, {lo_hi(ctl)}"
    swap += f", numbers alone: {ctl.verdict}"  # its gates come later, in its own row
    if ctl.verdict != f.verdict and "inconclusive" not in (ctl.verdict, f.verdict):
        swap += ": the two skeletons give opposite verdicts"
    parts = [swap]
    skel = {"csp_vit": CSP_BASE}.get(a)
    if skel in res and f.b_name != skel:
        # a reading in the explanation, not a finding: the claim's rule on another pair of rows
        within = claims.compare(res[a]["accuracy"], res[skel]["accuracy"], **_cmp_kw(claim_id, a, skel))
        text = (
            f"in {a}'s own skeleton with softmax ({skel}): {acc(a)} vs {acc(skel)}, effect {within.effect:+.1f} "
            f"pts, {lo_hi(within)}, {within.verdict}"
        )
        if {g.verdict for g in (within, ctl)} == {"agrees", "disagrees"}:
            text += ": the mechanism's effect changes sign with the skeleton (an interaction, not a skeleton effect)"
        parts.append(text)
    mp = "vit+tssa-meanpool"
    if a_ctl == "vit+tssa" and mp in res:
        text = f"{mp} (mean pooling instead of the CLS token): " + gap_change(res, a_ctl, mp, b_ctl)
        if b_ctl != "vit":  # the other side keeps its CLS token: the new gap is between two pooling schemes
            text += f" (vs {b_ctl}, which keeps its CLS token: two factors; only the change is one factor's)"
        parts.append(text)
    return "; ".join(parts)
