"""Vision: the papers' image classifiers and each attention swapped into the ViT, trained alike at a small scale."""

from __future__ import annotations

import copy
from collections import namedtuple

import numpy as np

from attnzoo.compare import claims, common
from attnzoo.compare.claims import Finding
from attnzoo.compare.common import Section, Table, fmt
from attnzoo.compare.pipeline import Control, Evidence, Longer, Plateau, Tuning, judge, paper_finding
from attnzoo.compare.store import Step
from attnzoo.reproduce import budgets, paper_claims

KEY = "vision"
TITLE = "Vision: image classification"


#: a trained row: its registered model, mechanism, description and model overrides (options None: CSP's groups)
VisionRow = namedtuple("VisionRow", "registered mechanism description overrides")


def _swap(mech: str, options: dict | None, description: str = "", **extra) -> VisionRow:
    """A controlled swap: the ViT's skeleton (conv patches, CLS token, MLP blocks, pre-norm), another attention."""
    overrides = {"attention": mech, "attention_options": options, **extra}
    return VisionRow("vit_s", mech, description or f"ViT skeleton, {mech} attention (controlled swap)", overrides)


_CSP_VIT = {"mlp_dim": None, "dropout": 0.0}
_ISTA = {"ffn": "ista", "ista_step": 0.1, "ista_lambda": 0.1}
#: name -> the architecture of a paper
MODELS: dict[str, VisionRow] = {
    "vit": VisionRow("vit_s", "softmax", "ViT/DeiT (baseline)", {}),
    "tost": VisionRow("tost_t", "tssa", "ToST", {}),
    "xcit": VisionRow("xcit_s", "xca", "XCiT (ToST's baseline)", {}),
    "crate": VisionRow("crate_t", "mssa", "CRATE (CBSA/AoT baseline)", {}),
    "cbt": VisionRow("cbt_t", "cbsa", "CBSA (CBT)", {}),
    "aot": VisionRow("aot_vision_b", "mssa", "AoT (attention only)", {}),
    "csp_vit": VisionRow("csp_vit_cifar", "csp", "CSP-ViT", {**_CSP_VIT, "attention_options": None}),
    "fastmax_vit": _swap("fastmax", {"p": 2}, "FAST (Fastmax p=2 in ViT)"),
}

_IMAGE_SIZE = {"digits": 8, "mnist": 28, "fashion_mnist": 28}
#: the majority class of every task here (ten balanced classes), in %
CHANCE = 10.0

#: the controlled swaps; the no-attention control mean-pools, as a CLS token without token mixing never sees the image
SWAPS: dict[str, VisionRow] = {
    "vit+tssa": _swap("tssa", {}),
    "vit+xca": _swap("xca", {}),
    "vit+mssa": _swap("mssa", {}),
    "vit+cbsa": _swap("cbsa", {}),
    "vit+csp": _swap("csp", None),
    "vit+identity": _swap("identity", {}, pool="mean"),
}

#: the no-attention control (run whenever the ViT is) and ToST at ViT's parameter count ("similar size", ToST Table 2)
CONTROL = "vit+identity"
MATCHED = "tost@matched-params"
#: ToST's and XCiT's skeleton (they differ in the token mixer only: conv stem, MLP blocks, class-attention pooling)
#: without a token mixer, run whenever either is: the control of ToST's claims
SKELETON_CONTROL = "xcit+identity"
SKELETON_ROWS = ("tost", "xcit")
MATCH_TOLERANCE = claims.SIZE_TOLERANCE

#: (a, b) -> the paper's parameter ratio a/b and its source: a pair further than MATCH_TOLERANCE from it is gated
PAPER_SIZE_RATIO: dict[tuple[str, str], tuple[float, str]] = paper_claims.size_ratios(
    "tost-t2-vit", "tost-t2-xcit", "cbsa-t3-crate", "csp-t3-vit"
)
PAPER_SIZE_RATIO[("csp_vit", "csp_vit_skeleton+softmax")] = PAPER_SIZE_RATIO[("csp_vit", "vit")]

#: ablations that test an explanation of a gap, one factor each
ABLATIONS: dict[str, VisionRow] = {
    # AoT is CRATE without the ISTA block and without LayerNorm
    "aot+ista": VisionRow("aot_vision_b", "mssa", "AoT + CRATE's ISTA block", _ISTA),
    "aot+prenorm": VisionRow("aot_vision_b", "mssa", "AoT + CRATE's pre-norm", {"norm": "pre"}),
    # ToST never passes a CLS token through TSSA (class-attention layers pool, ToST App. C); CSP's vision setting is
    # groups of two (CSP Table 5), which the 17 tokens of a CLS-token skeleton (a prime) do not allow
    "vit+tssa-meanpool": _swap("tssa", {}, "ViT + TSSA, mean pooling", pool="mean"),
    "vit-meanpool": VisionRow("vit_s", "softmax", "ViT, mean pooling", {"pool": "mean"}),
    "vit+xca-meanpool": _swap("xca", {}, "ViT + XCA, mean pooling", pool="mean"),
    "vit+csp-meanpool": _swap("csp", None, "ViT + CSP (groups of two), mean pooling", pool="mean"),
    # CSP Table 3's MHA baseline: CSP-ViT's own skeleton (LayerNorm-linear patches, mean pooling) with softmax
    "csp_vit_skeleton+softmax": VisionRow(
        "csp_vit_cifar",
        "softmax",
        "CSP-ViT's skeleton, softmax",
        {**_CSP_VIT, "attention": "softmax", "attention_options": {}},
    ),
}

#: baselines trained with twice the steps: the ViT's judges every comparison not against another in the plan
PLATEAU = "vit@2x-steps"
BASELINE_PLATEAUS = {"vit": PLATEAU, "crate": "crate@2x-steps", "xcit": "xcit@2x-steps"}

#: the controls outside the ViT skeleton
CONTROLS = {
    SKELETON_CONTROL: VisionRow(
        "xcit_s",
        "identity",
        "ToST's and XCiT's skeleton, identity token mixer (class-attention pooling kept)",
        {"attention": "identity", "attention_options": {}},
    )
}

#: the row whose tuned learning rate an ablation trains with (one factor changed, the rate kept); a run at twice the
#: steps (``x@2x-steps``) trains at x's
TUNED_AS = {"aot+ista": "aot", "aot+prenorm": "aot", "vit+tssa-meanpool": "vit+tssa", "vit+xca-meanpool": "vit+xca"}
TUNED_AS |= {"csp_vit_skeleton+softmax": "csp_vit", MATCHED: "tost"}


def _image_size(plan: dict) -> int:
    return plan["task_options"].get("img_size") or _IMAGE_SIZE.get(plan["task"], 28)


def _row(name: str) -> VisionRow:
    """Any row's entry; a plateau or parameter-matched row (``x@...``) is x's."""
    at_row = name == MATCHED or name.endswith(common.LONGER)
    row = {**MODELS, **SWAPS, **ABLATIONS, **CONTROLS}.get(name.split("@")[0] if at_row else name)
    if row is None:
        raise ValueError(f"unknown vision model {name!r}; valid: {sorted(MODELS) + sorted(SWAPS) + sorted(ABLATIONS)}")
    return row


def model_options(name: str, plan: dict) -> dict:
    """``create_model`` overrides of row ``name`` under a section plan, its ``row_arch`` entry last."""
    row = _row(name)
    opts = {**plan["arch"], **copy.deepcopy(row.overrides)}
    if opts.get("attention_options", {}) is None:
        # CSP: two tokens a group; the ViT skeleton's CLS token counts unless it mean-pools
        cls = 1 if row.registered == "vit_s" and opts.get("pool") != "mean" else 0
        n = (_image_size(plan) // plan["arch"]["patch_size"]) ** 2 + cls
        # K: the largest divisor of N up to N/2 (CSP Table 5 uses K=32 for N=64, two tokens a group)
        groups = max(k for k in range(1, max(1, n // 2) + 1) if n % k == 0)
        opts["attention_options"] = {"groups": groups, "shift_schedule": "linear"}
    return {**opts, **plan.get("row_arch", {}).get(name.split("@")[0], {})}


def rows_of(plan: dict) -> list[str]:
    """Every trained row: the papers' architectures, the swaps, the controls, the ablations and the runs at twice the
    steps (the baselines' plateau runs, then the compared rows' own)."""
    rows = [*plan["models"], *plan.get("swaps", []), *_controls(plan), *plan.get("ablations", [])]
    return list(dict.fromkeys([*rows, *_plateau_rows(plan).values(), *_compared_2x(plan).values()]))


def _compared_2x(plan: dict) -> dict[str, str]:
    """row -> its run at twice the steps, on every seed (``compared_2x``): a compared row's own, or a baseline's plateau
    run on every seed rather than one, so that the comparisons between such rows are replicated there."""
    extra, compared = plan.get("compared_2x", []), list(plan["models"]) + list(plan.get("swaps", []))
    if unknown := sorted(set(extra) - set(compared)):
        raise ValueError(f"compared_2x rows {unknown} are not models or swaps of this plan; rows: {compared}")
    return {r: f"{r}{common.LONGER}" for r in extra}


def _plateau_rows(plan: dict) -> dict[str, str]:
    """baseline -> its plateau row: the ViT's, and those of ``plateau_baselines`` that are rows of the plan."""
    if "vit" not in plan["models"]:
        return {}
    extra = plan.get("plateau_baselines", [])
    if unknown := sorted(set(extra) - set(BASELINE_PLATEAUS)):
        raise ValueError(f"plateau_baselines {unknown} have no plateau row; valid: {sorted(BASELINE_PLATEAUS)}")
    return {b: BASELINE_PLATEAUS[b] for b in ["vit", *extra] if b in plan["models"]}


def _controls(plan: dict) -> list[str]:
    """The no-attention controls and the parameter-matched ToST, run whenever their reference rows are."""
    skeleton = [SKELETON_CONTROL] if set(SKELETON_ROWS) & set(plan["models"]) else []
    if "vit" not in plan["models"]:
        return skeleton
    out = [CONTROL] if CONTROL not in plan.get("swaps", []) else []
    # ``matched_params: false``: the tost row is already at ViT's parameter count (its ``row_arch`` width)
    return out + ([MATCHED] if plan.get("matched_params", True) and "tost" in plan["models"] else []) + skeleton


def _model_params(plan: dict, registered: str, options: dict) -> int:
    from attnzoo.models import create_model

    model = create_model(registered, num_classes=10, image_size=_image_size(plan), in_chans=1, **options)
    return common.num_params(model)


def matched_dim(plan: dict) -> int:
    """The width of ToST (a multiple of the heads, up to twice the plan's) closest to ViT's parameter count."""
    target = _model_params(plan, "vit_s", model_options("vit", plan))
    heads, opts = plan["arch"]["heads"], model_options("tost", plan)
    widths = range(heads, 2 * plan["arch"]["dim"] + 1, heads)
    return min(widths, key=lambda d: abs(_model_params(plan, "tost_t", {**opts, "dim": d}) - target))


def plan_steps(plan: dict, seed: int) -> list[Step]:
    # the sweeps first: every seed run trains at its row's best swept rate, read when it runs
    steps, swept_rows, rows = [], sweep_rows(plan), rows_of(plan)
    common.check_sweep_extra(plan, swept_rows)
    common.check_row_arch(plan, rows)
    _not_tested(plan)
    for name in swept_rows:
        for sid, s, lr in common.sweep_runs(f"{KEY}/{name}", common.row_lrs(plan, name), seed):
            swept = {**plan, "train": {**common.sweep_train(plan["train"], plan), "lr": lr}}
            steps.append(_row_step(swept, name, s, sid, tune=False))
    # a paper baseline's own plateau check runs one seed; the ViT's its plateau seeds (every seed by default, as its
    # change gates most findings)
    seeds = common.seed_list(plan, seed)
    one_seed = set(_plateau_rows(plan).values()) - {PLATEAU} - set(_compared_2x(plan).values())
    for name in rows:
        own = seeds[:1] if name in one_seed else common.plateau_seed_list(plan, seed) if name == PLATEAU else seeds
        steps += [_row_step(plan, name, s, sid) for sid, s in common.seed_runs(f"{KEY}/{name}", own)]
    # more seeds of a comparison's rows: each finding uses all of a row's seeds
    for name, n in common.extra_seed_counts(plan).items():
        if name not in rows:
            raise ValueError(f"extra_seeds row {name!r} is not a row of this plan; rows: {rows}")
        first = seed + plan.get("seeds", 1)
        steps += [_row_step(plan, name, s, f"{KEY}/{name}/extra-seed{s}") for s in range(first, first + n)]
    return steps


def sweep_rows(plan: dict) -> list[str]:
    """The rows whose rate is swept: every compared row, the controls and the ``swept_ablations`` (not the
    parameter-matched ToST)."""
    swept, ablations = plan.get("swept_ablations", []), plan.get("ablations", [])
    if unknown := sorted(set(swept) - set(ablations)):
        raise ValueError(f"swept_ablations {unknown} are not ablations of this plan; ablations: {ablations}")
    return [*plan["models"], *plan.get("swaps", []), *(c for c in _controls(plan) if c != MATCHED), *swept]


def row_config(plan: dict, name: str, seed: int) -> dict:
    """A step config training vision row ``name`` under ``plan`` (the probes section's deeper models use it too)."""
    reg, mech, paper, _ = _row(name)
    opt = common.twice_steps(plan["train"]) if name.endswith(common.LONGER) else dict(plan["train"])
    opts = model_options(name, plan)
    if name == MATCHED:
        opts["dim"] = matched_dim(plan)
        paper = f"ToST at width {opts['dim']}: ViT's parameter count (similar size)"
    task = dict(task=plan["task"], task_options=dict(plan["task_options"]), model=reg, model_options=opts)
    return {"train": dict(**task, seed=seed, **common.train_defaults(**opt)), "mechanism": mech, "paper": paper}


def _row_step(plan: dict, name: str, seed: int, sid: str, tune: bool = True) -> Step:
    """One training run of row ``name``, at the best rate of its sweep (``TUNED_AS``'s row's) when ``tune``."""
    cfg = row_config(plan, name, seed)
    source = name if name in plan.get("swept_ablations", []) else TUNED_AS.get(name, name.removesuffix(common.LONGER))
    if tune and source in sweep_rows(plan):
        cfg = common.tuned(cfg, KEY, source, common.row_lrs(plan, source), "accuracy", True)
    return common.section_step(KEY, sid, cfg, common.classification_record)


def _stats(records: dict, name: str) -> dict | None:
    """Row ``name``'s seeds folded: accuracy (%) as a Stat, the rest as seed means."""
    rs = common.per_seed(records, f"{KEY}/{name}")
    if not rs:
        return None
    prefix = f"{KEY}/{name}/extra-seed"
    extra = [rec["result"] for sid, rec in sorted(records.items()) if sid.startswith(prefix)]
    out = common.fold(rs, {"accuracy": 100.0}, ("samples_per_s", "peak_train_mb"), ("params", "tokens"))
    # every extra seed, whatever the verdict: using them only when it is undecided would pick data by outcome
    out["accuracy"] = claims.stat(100.0 * a for r in rs + extra if (a := r.get("accuracy")) is not None)
    return out | {"extra_seeds": len(extra), "seeds": len(rs) + len(extra)}


def summarize(records: dict[str, dict], plan: dict, plots_dir, rel) -> Section:
    res = {n: st for n in rows_of(plan) if (st := _stats(records, n)) is not None}
    sec = Section(KEY, TITLE, intro=_intro(plan))
    sec.scale = scale_line(plan, [r["params"] for r in res.values() if r["params"]])
    swaps = ["vit", *_swap_rows(plan, res)] if "vit" in res else _swap_rows(plan, res)
    sec.tables += _tables(res, plan, swaps)
    sec.data = {"models": {n: _model_data(r) for n, r in res.items()}}
    sec.data["val_curves"] = {n: r["val_curve"] for n, r in res.items()}
    panels = [(t.title, {row[0]: res[row[0]]["val_curve"] for row in t.rows}) for t in sec.tables]
    if panels:
        panels[0][1].update({row: res[row]["val_curve"] for row in _plateau_rows(plan).values() if row in res})
    note = "seed means, one panel per table, plateau runs included"
    sec.add_curves(panels, plots_dir / "vision_curves.png", rel, "accuracy (%)", "Vision: validation curves", note)
    if names := [n for n in plan["models"] if n in res]:
        caption = "Accuracy (mean ± std over seeds), training images/s and peak training-step memory."
        sec.add_plot(_plot(res, names + [n for n in swaps if n not in names]), plots_dir / "vision.png", rel, caption)
    vit = res.get("vit")
    if plan.get("require_learned", True) and vit and not common.learned(vit["accuracy"].values, CHANCE):
        sec.notes.append(
            f"the ViT baseline reached {vit['accuracy'].fmt('.1f')}% against a majority class of "
            f"{CHANCE:.0f}%: not {common.LEARNED_MARGIN:g} points above it on every seed, so no comparison is "
            "reported"
        )
        return sec
    sec.findings, ev = _findings(res)
    sec.findings += _not_tested(plan)
    ev.plateaus = _plateaus(res, _plateau_rows(plan), _compared_2x(plan))
    # the sweep table, and every row not shown at its best rate
    rows, label = sweep_rows(plan), "validation accuracy %"
    noise = {r: res[r]["accuracy"].std for r in rows if r in res}
    untuned = common.tune_rows(sec, records, plan, rows, KEY, "accuracy", True, 100.0, label, noise=noise)
    if "tost" in untuned and MATCHED in res and plan.get("lr_sweep"):
        untuned[MATCHED] = f"{MATCHED} trains at tost's rate: " + untuned["tost"]
    ev.tuning.append(Tuning(untuned))
    for c in ev.controls:  # a control off its best rate can pass no margin test
        c.untuned = untuned.get(c.name)
    plateau = judge(sec.findings, ev)
    sec.data["plateau"] = plateau["vit"] if len(plateau) == 1 else plateau
    sec.data["untuned"] = untuned
    return sec


def _plateaus(res: dict, rows: dict[str, str], compared_2x: dict[str, str] | None = None) -> list[Plateau]:
    """Each baseline's plateau check on the comparisons against it; the ViT's on every other one. A compared row with
    runs at twice the steps (``compared_2x``) is judged there on its own comparison instead."""
    acc = {n: r["accuracy"] for n, r in res.items()}
    others = [b for b in rows if b != "vit"]
    judges = {"vit": lambda f: f.b_name not in others} | {b: (lambda f, b=b: f.b_name == b) for b in others}
    own = {r: Longer(r, acc[r], acc[r2]) for r, r2 in (compared_2x or {}).items() if {r, r2} <= set(acc)}
    return [
        Plateau(b, b, acc.get(b), acc.get(rows[b]), "%", ".1f", judges=j, key=b, rows=own) for b, j in judges.items()
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


_STEM = {"linear": "a strided patch projection", "linear_ln": "a normed patch projection", "conv": "a conv stem"}
_POOL = {"cls": "a CLS token", "class_attention": "class-attention layers", "mean": "mean pooling"}


def _stems(plan: dict) -> str:
    """Each paper row's patch embedding and pooling, from its model's config (the confounds beside the attention)."""
    from attnzoo.models import get_config

    size, out = _image_size(plan), {}
    for name in plan["models"]:
        opts = model_options(name, plan)
        cfg = get_config(MODELS[name].registered, num_classes=10, image_size=size, in_chans=1, **opts)
        out.setdefault(_embedding(cfg), []).append(name)
    return "; ".join(f"{', '.join(rows)}: {what}" for what, rows in out.items())


def _embedding(cfg) -> str:
    """A model config's patch embedding and pooling, in words: "a conv stem and a CLS token"."""
    return f"{_STEM[cfg.patch_embed]} and {_POOL[cfg.pool]}"


def _stem_note(a: str, b: str) -> str | None:
    """Where two papers' architectures differ in their patch embedding or pooling, the words that say so."""
    from attnzoo.models import get_config

    if a not in MODELS or b not in MODELS:
        return None
    ea, eb = (_embedding(get_config(MODELS[n].registered)) for n in (a, b))
    return None if ea == eb else f"{a} has {ea}, {b} {eb}"


def _intro(plan: dict) -> str:
    arch, tr, n_seeds, opts = plan["arch"], plan["train"], plan.get("seeds", 1), plan["task_options"]
    if plan["task"] == "digits":
        data = "scikit-learn 8x8 digits, 1,438 train / 359 validation images"
    else:
        where = "each at a fixed random offset" if opts.get("placement") == "random" else "centred"
        canvas = f" on a {opts['img_size']}x{opts['img_size']} canvas, {where}" if opts.get("img_size") else ""
        data = f"{opts.get('n_train', 60000):,} train / {opts.get('n_val', 10000):,} validation images, 28x28{canvas}"
    rate = common.rate_text(plan.get("lr_sweep", []), tr["lr"])
    if plan.get("lr_sweep") and (extra := [x for lrs in plan.get("lr_sweep_extra", {}).values() for x in lrs]):
        rate += f" (some rows' grids reach {min(extra):g} to {max(extra):g}: configs.md)"
    more = f" ({seeds})" if (seeds := common.extra_seeds_text(plan)) else ""
    # the rows that differ from the ViT in their token mixer only, named so that no other row is read as one
    swapped = _swap_rows(plan, rows_of(plan))
    pooled = [n for n in swapped if _row(n).overrides.get("pool") == "mean"]
    pools = f", {', '.join(pooled)} with mean pooling" if pooled else ""
    skeleton = "the ViT skeleton (strided patches, CLS token, MLP blocks, pre-norm)"
    only = f"; the controlled swaps ({', '.join(swapped)}) put their token mixer into {skeleton}{pools}"
    return (
        f"Task `{plan['task']}` ({data}); {common.width_text(plan, plan['models'])}, depth {arch['depth']}, "
        f"{arch['heads']} heads, patch {arch['patch_size']}; {tr['steps']} steps of batch {tr['batch_size']}, "
        f"AdamW/cosine, {rate}, no augmentation; {common.seeds_text(n_seeds)}{more} (mean ± "
        f"sample std). The papers' architectures differ in more than the attention: {_stems(plan)}"
        f"{only if swapped else ''}."
    )


def _swap_rows(plan: dict, present) -> list[str]:
    """The rows of ``present`` that put another token mixer into the ViT skeleton: Fastmax-ViT, the swaps, the
    no-attention control."""
    return list(dict.fromkeys(n for n in ["fastmax_vit", *plan.get("swaps", []), CONTROL] if n in present))


def _tables(res: dict, plan: dict, swaps: list[str]) -> list[Table]:
    """The papers' architectures, the controlled swaps and the ablations (one row per model, seed means)."""

    def measures(n):
        r, acc = res[n], res[n]["accuracy"].fmt(".1f")
        return [fmt(r["params"], ","), acc, fmt(r["samples_per_s"], ".0f"), fmt(r["peak_train_mb"], ".1f")]

    def paper_row(n):
        desc = "ToST, width matched to ViT's parameters" if n == MATCHED else _row(n).description
        return [n, _row(n).mechanism, desc, *measures(n)]

    measured = ["params", "val acc %", "train img/s", "peak train-step MiB"]
    papers = [paper_row(n) for n in [*plan["models"], MATCHED, SKELETON_CONTROL] if n in res]
    tables = [Table("Papers' architectures", ["model", "mechanism", "architecture", *measured], papers)]
    if len(swaps) > 1:
        rows = [[n, *measures(n)] for n in swaps]
        tables.append(Table("Controlled swaps: ViT skeleton, only the attention differs", ["model", *measured], rows))
    if abl := [n for n in plan.get("ablations", []) if n in res]:
        rows = [[n, _row(n).description, *measures(n)] for n in abl]
        tables.append(Table("Ablations", ["model", "change", *measured], rows))
    return tables


def _model_data(r: dict) -> dict:
    out = common.stat_data("accuracy", r["accuracy"])
    out |= {k: r[k] for k in ("params", "samples_per_s", "peak_train_mb", "tokens", "seeds")}
    return out | ({"accuracy_per_seed_with_extra": out["accuracy_per_seed"]} if r["extra_seeds"] else {})


#: the papers' vision scale, from their texts (ToST §4: "resolutions of 224×224 ... patch of size 16×16", "400 epochs")
PAPER_SCALE = "ImageNet-1k at 224x224 (196 tokens of 16x16 patches), pre-trained for hundreds of epochs (ToST: 400)"


def scale_line(plan: dict, params: list[int]) -> str:
    """This section's scale against the papers', for the summary."""
    arch, tr, opts = plan["arch"], plan["train"], plan["task_options"]
    tokens = ((opts.get("img_size") or 28) // arch["patch_size"]) ** 2
    n_tr = opts.get("n_train", 60000)
    size = f"{min(params):,}-{max(params):,} parameters" if params else "no trained row"
    return (
        f"here {plan['task']}, {n_tr:,} training images, {tokens} tokens, {common.width_text(plan, plan['models'])}, "
        f"depth {arch['depth']}, {size}, {tr['steps']} steps of batch {tr['batch_size']} "
        f"({tr['steps'] * tr['batch_size'] / n_tr:.1f} epochs); the papers: {PAPER_SCALE}"
    )


def _plot(res: dict, names: list[str]):
    plt = common.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    x = np.arange(len(names))
    colors = [f"C{i % 10}" for i in range(len(names))]
    acc = [res[n]["accuracy"] for n in names]
    axes[0].bar(x, [a.mean for a in acc], yerr=[a.std or 0.0 for a in acc], color=colors, capsize=3)
    for ax, key in zip(axes[1:], ("samples_per_s", "peak_train_mb"), strict=True):
        ax.bar(x, [res[n].get(key) or 0.0 for n in names], color=colors)
    labels = ("validation accuracy (%)", "training images / s", "peak memory of a training step (MiB)")
    for ax, label in zip(axes, labels, strict=True):
        ax.set_ylabel(label)
        ax.set_xticks(x, names, rotation=35, ha="right", fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle("Vision models at equal width/depth (papers' architectures, then controlled swaps)")
    fig.tight_layout()
    return fig


#: an architecture claim: its rows, their controlled swaps (``None``: none) and its id in :mod:`paper_claims`
VisionClaim = namedtuple("VisionClaim", "row swap base base_swap claim_id")
CLAIMS = [
    VisionClaim("tost", "vit+tssa", "vit", "vit", "tost-t2-vit#architecture"),
    VisionClaim("tost", "vit+tssa", "xcit", "vit+xca", "tost-t2-xcit#architecture"),
    VisionClaim("cbt", "vit+cbsa", "crate", "vit+mssa", "cbsa-t3-crate"),
    VisionClaim("aot", None, "crate", None, "aot-t2-crate"),
    VisionClaim("csp_vit", "vit+csp", "vit", "vit", "csp-t3-vit#architecture"),
    VisionClaim("fastmax_vit", None, "vit", None, "fast-t1-accuracy#vision"),
]
#: a controlled swap whose paper makes its own same-skeleton claim: swap row -> that claim's id
CONTROLLED_CLAIMS = {"vit+cbsa": "cbsa-t4-mssa"}
#: the one-factor ablations read in an architecture finding's explanation
ABLATED = {"aot": ("aot+ista", "aot+prenorm")}

#: a row's mean-pooled form: a controlled swap reads the mean-pooled pair where both ran (the papers' conditions)
MEANPOOL_BASE = "vit-meanpool"
MEANPOOLED = {"vit": MEANPOOL_BASE} | {r: f"{r}-meanpool" for r in ("vit+tssa", "vit+csp", "vit+xca")}
#: why a CLS-token swap is not the paper's condition (gates it when its mean-pooled form did not run)
CLS_CONDITIONS = {
    "vit+tssa": "TSSA reads the CLS token here; ToST pools with class-attention layers and never passes a CLS token "
    "through TSSA (ToST App. C)",
    "vit+csp": "with the CLS token the skeleton has 17 tokens, a prime, so CSP runs with K = 1 (complete sorting, its "
    "LRA setting) instead of its vision setting of groups of two (CSP Table 5)",
}
#: CSP-ViT is compared with softmax in its own skeleton where that ran (CSP §4.1, Table 3's "ViT + MHA")
CSP_BASE = "csp_vit_skeleton+softmax"


def _findings(res: dict) -> tuple[list[Finding], Evidence]:
    """The section's comparisons and the evidence of their gates that the rows' results give."""
    ev = Evidence(sizes=PAPER_SIZE_RATIO)
    out = _control_findings(res, ev.gates)
    for a, a_ctl, b, b_ctl, cid in CLAIMS:
        if a == "csp_vit" and CSP_BASE in res:
            b = CSP_BASE
        if a not in res or b not in res:
            continue
        f = _compare(res, a, b, cid)
        f.explanation = "; ".join(f"{abl}: {gap_change(res, a, abl, b)}" for abl in ABLATED.get(a, ()) if abl in res)
        f.confound = _stem_note(a, b)
        out.append(f)
        pooled = (MEANPOOLED.get(a_ctl), MEANPOOLED.get(b_ctl))
        a_ctl, b_ctl = pooled if all(n in res for n in pooled) else (a_ctl, b_ctl)
        if a_ctl in res and b_ctl in res:
            swap_id = CONTROLLED_CLAIMS.get(a_ctl, f"{paper_claims.base_id(cid)}#controlled-swap")
            ctl = _compare(res, a_ctl, b_ctl, swap_id)
            ctl.claim = "controlled swap: " + ctl.claim
            if a_ctl in CLS_CONDITIONS:
                ev.gates.append((ctl, "conditions", CLS_CONDITIONS[a_ctl]))
            out.append(ctl)
    ev.gates += _attention_needed(out)
    # the control is read against the mean-pooled ViT where it ran: one factor apart
    twin = (MEANPOOL_BASE, res[MEANPOOL_BASE]["accuracy"]) if MEANPOOL_BASE in res else None
    # a row in ToST's skeleton is judged by that skeleton's control, the rest by the ViT's
    skeleton = res.get(SKELETON_CONTROL, {}).get("accuracy")
    in_skeleton = lambda f: skeleton is not None and f.a_name in ("tost", MATCHED)  # noqa: E731
    vit_judges = lambda f: paper_finding(f) and not in_skeleton(f)  # noqa: E731
    ev.controls.append(
        Control(CONTROL, res.get(CONTROL, {}).get("accuracy"), vit_judges, twin, lambda f: f.b_name == "vit")
    )
    # read against XCiT too where it ran: the control's own skeleton with attention
    xcit = ("xcit", res["xcit"]["accuracy"]) if "xcit" in res else None
    ev.controls.append(Control(SKELETON_CONTROL, skeleton, lambda f: paper_finding(f) and in_skeleton(f), xcit))
    return out, ev


def _not_tested(plan: dict) -> list[Finding]:
    """The claims of the rows a plan leaves out for a reason its pilots measured (``not_tested``: row -> why)."""
    claim_ids = {row: [c.claim_id for c in CLAIMS if c.row == row] for row in {c.row for c in CLAIMS}}
    claim_ids |= {row: [cid] for row, cid in CONTROLLED_CLAIMS.items()}
    trained = list(plan["models"]) + list(plan.get("swaps", []))
    out = []
    for row, why in budgets.left_out(plan, "vision", claim_ids, trained, "models or swaps").items():
        out += [claims.not_tested(**paper_claims.finding_kw(cid), why=why) for cid in claim_ids[row]]
    return out


def _control_findings(res: dict, gates: list) -> list[Finding]:
    """ToST against ViT at a matched parameter count (a paper claim), and ViT and XCiT against their no-attention
    controls."""
    out = []
    if MATCHED in res and "vit" in res:
        f = _compare(res, MATCHED, "vit", "tost-t2-vit#matched-params")
        f.claim += " (parameter-matched)"
        pa, pb = f.params_a, f.params_b
        if pa and pb and abs(pa / pb - 1) > MATCH_TOLERANCE:
            why = f"the parameter counts {pa:,} and {pb:,} differ by more than {MATCH_TOLERANCE:.0%}"
            gates.append((f, "conditions", why))
        out.append(f)
    base = MEANPOOL_BASE if MEANPOOL_BASE in res else "vit"
    if CONTROL in res and base in res:
        f = _compare(res, base, CONTROL, "vision-attention-helps", claim_type="superiority", kind="check")
        if base == "vit":  # the CLS-token ViT against the mean-pooled control: the words say the pooling differs
            f.claim = (
                "attention helps: the ViT baseline beats its no-attention control (identity token mixer, same "
                "skeleton, mean-pooled patches: without token mixing a CLS token never sees the image)"
            )
        out.append(f)
    if SKELETON_CONTROL in res and "xcit" in res:
        kw = {"claim_type": "superiority", "kind": "check"}
        out.append(_compare(res, "xcit", SKELETON_CONTROL, "vision-attention-helps-xcit", **kw))
    return out


def _compare(res: dict, a: str, b: str, claim_id: str, **kw) -> Finding:
    """Claim ``claim_id`` on the accuracies of rows ``a`` and ``b``; a paper claim's with their parameter ratio."""
    kw |= paper_claims.compare_kw(claim_id)
    f = claims.compare(res[a]["accuracy"], res[b]["accuracy"], unit="pts", a_name=a, b_name=b, spec=".1f", **kw)
    pa, pb = res[a].get("params"), res[b].get("params")
    if paper_finding(f) and pa and pb:
        f.params_a, f.params_b = pa, pb
        ratio = f"{pa / pb:.2f}x"  # the counts of the other rows are in the tables
        f.measured += f"; parameters {pa:,} vs {pb:,} ({ratio})" if a == MATCHED else f"; parameters {ratio}"
    return f


def gap_change(res: dict, base: str, ablated: str, ref: str) -> str:
    """How ablating ``base`` into ``ablated`` moved its gap to ``ref``, worded from the Welch CI of the change."""
    b, a, r = res[base]["accuracy"], res[ablated]["accuracy"], res[ref]["accuracy"]
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
