"""Adapting a pretrained ViT into CBSA, Agent Attention, linear attention, TSSA and Fastmax (CBSA §4 / Fig. 9).

Each student is the pretrained ViT with every attention swapped (:func:`attnzoo.adapt.make_student`), fine-tuned like
the original beside it, as in Fig. 9 (no attention transfer); a check row trains the CBSA student from scratch, and
the attention check (``attention_control``) trains the teacher's ViT from scratch, mean-pooled, with and without
attention.
"""

from __future__ import annotations

import time
from collections.abc import Collection

import numpy as np

from attnzoo._io import read_json
from attnzoo.compare import claims, common
from attnzoo.compare.claims import Finding
from attnzoo.compare.common import Context, Section, Table, fmt
from attnzoo.compare.pipeline import Control, Evidence, Longer, Plateau, Tuning, judge, paper_finding
from attnzoo.compare.store import Step
from attnzoo.reproduce import budgets, paper_claims
from attnzoo.reproduce.sections.vision import CHANCE, row_config

KEY = "adapt-vision"
TITLE = "Adapting a pretrained ViT (CBSA Fig. 9)"

TEACHER = f"{KEY}/teacher"

#: row -> (mechanism given to make_student, the table's description: what is inherited from the pretrained ViT)
ROWS: dict[str, tuple[str, str]] = {
    "original": ("softmax", "the pretrained softmax ViT"),
    "cbsa": ("cbsa-qkv", "q/k/v/o inherited, kappa new"),
    "cbsa-no-contraction": ("agent-qkv", "Agent Attention (no contraction), q/k/v/o inherited"),
    "linear": ("linear", "elu + 1, q/k/v/o inherited"),
    "tssa": ("tssa", "U and temperatures new, o inherited"),
    "fastmax": ("fastmax", "q/k/v/o inherited"),
}

#: the CBSA student built from an untrained ViT; the claims' baseline and its plateau run (twice the steps)
SCRATCH = "cbsa@scratch"
BASELINE = "linear"
PLATEAU = f"{BASELINE}@2x-steps"
#: "nearly the same FLOPs": within this fraction of linear attention's count
FLOPS_TOLERANCE = 0.1
#: the task's attention check (``attention_control``): the teacher's shape and recipe trained from scratch, mean-pooled
#: as a CLS token without token mixing never sees the image, with softmax and with no token mixing at all
CONTROL_ROWS: dict[str, str] = {"vit-mean": "softmax", "vit-mean+identity": "identity"}
CONTROL_TWIN, CONTROL = CONTROL_ROWS


def rows_of(plan: dict) -> list[str]:
    """The fine-tuned rows of the plan, then the scratch check (none where the plan fine-tunes no row)."""
    common.check_known(plan["rows"], ROWS, "adapt-vision row")
    return [*plan["rows"], SCRATCH] if plan["rows"] else []


def compared_2x(plan: dict) -> list[str]:
    """The compared rows also fine-tuned at twice the steps on every seed (``compared_2x``): each such comparison
    with the baseline is then judged on its own runs there."""
    rows = plan.get("compared_2x", [])
    if bad := [r for r in rows if r not in plan["rows"] or r == BASELINE]:
        raise ValueError(f"compared_2x rows {bad} are not compared rows of this plan; rows: {plan['rows']}")
    if rows and not plan.get("baseline_plateau"):
        raise ValueError(f"compared_2x {rows} needs the baseline's own run at twice the steps: set baseline_plateau")
    return list(rows)


def attention_control(plan: dict) -> dict | None:
    """The plan's ``attention_control`` (``seeds``, ``lr_sweep``), checked; None without one."""
    if (ctl := plan.get("attention_control")) is None:
        return None
    seeds, lrs = (ctl.get(k) if isinstance(ctl, dict) else None for k in ("seeds", "lr_sweep"))
    ok_seeds = isinstance(seeds, int) and not isinstance(seeds, bool) and seeds >= 2
    if not ok_seeds or not isinstance(lrs, list) or not all(isinstance(x, float) and x > 0 for x in lrs):
        raise ValueError(
            f"adapt-vision's attention_control must give 'seeds' (an int >= 2, for an interval) and 'lr_sweep' (a list "
            f"of positive rates), got {ctl!r}"
        )
    return ctl


def _control_steps(plan: dict, seed: int, recipe: dict) -> list[Step]:
    """The attention check's rows from scratch at the pretraining ``recipe``: each row's sweep on the sweep's seed,
    then its seeds at the best."""
    if not (ctl := attention_control(plan)):
        return []
    configs = []
    for row, mech in CONTROL_ROWS.items():
        train = dict(recipe, model_options=dict(recipe["model_options"], attention=mech, pool="mean"))
        for sid, s, lr in common.sweep_runs(f"{KEY}/{row}", ctl["lr_sweep"], seed):
            configs.append((sid, {"train": dict(train, seed=s, lr=lr), "mechanism": mech}))
        for sid, s in common.seed_runs(f"{KEY}/{row}", range(seed, seed + ctl["seeds"])):
            config = {"train": dict(train, seed=s), "mechanism": mech}
            configs.append((sid, common.tuned(config, KEY, row, ctl["lr_sweep"], "accuracy", True)))
    return [common.section_step(KEY, sid, cfg, common.classification_record) for sid, cfg in configs]


def _student(plan: dict, row: str) -> dict:
    """The mechanism ``make_student`` swaps in for ``row``, and its options."""
    mech = ROWS["cbsa" if row == SCRATCH else row][0]
    if mech in ("cbsa-qkv", "agent-qkv"):
        return {"mechanism": mech, "options": {"rep_grid": list(plan["rep_grid"])}}
    return {"mechanism": mech, "options": {"p": 2} if mech == "fastmax" else {}}


def plan_steps(plan: dict, seed: int) -> list[Step]:
    """The pretraining (the vision section's recipe, with validation along the way), then per row its fine-tuning-rate
    sweep (on the sweep's own seed) and its seeds at the best, then the attention check."""
    recipe = row_config({**plan, "train": plan["pretrain"]}, "vit", seed)["train"]
    # the pretrained model is read from the run's final save only
    pretrain = dict(recipe, eval_every=max(1, recipe["steps"] // common.CURVE_POINTS), ckpt_every=recipe["steps"])
    teacher = Step(TEACHER, KEY, {"train": pretrain}, _pretrain, label="teacher")
    _not_tested(plan)  # the plan's settings are checked where nothing trains too
    attention_control(plan)
    longer = compared_2x(plan) + ([BASELINE] if plan.get("baseline_plateau") else [])
    if not rows_of(plan):  # the attention check serves the comparisons: without a row it has nothing to check
        return []
    lrs, seeds, ft = list(plan.get("finetune_lr_sweep", [])), common.seed_list(plan, seed), plan["finetune"]
    configs = []
    for row in rows_of(plan):
        base = {"teacher": teacher.config, **_student(plan, row), "scratch": row == SCRATCH, "swapped_eval_batches": 4}
        for sid, s, lr in common.sweep_runs(f"{KEY}/{row}", lrs, seed):
            configs.append((sid, dict(base, finetune=dict(ft, lr=lr), seed=s)))
        # every seed at the best rate of the row's sweep; the baseline's plateau run at the baseline's
        runs = [(row, ft)] + ([(f"{row}{common.LONGER}", common.twice_steps(ft))] if row in longer else [])
        for name, finetune in runs:
            for sid, s in common.seed_runs(f"{KEY}/{name}", seeds):
                config = dict(base, finetune=dict(finetune), seed=s)
                configs.append((sid, common.tuned(config, KEY, row, lrs, "accuracy", True, settings="finetune")))
    steps = [common.section_step(KEY, sid, config, _finetune, (TEACHER,)) for sid, config in configs]
    return [teacher, *steps, *_control_steps(plan, seed, recipe)]


def _pretrain(ctx: Context, step: Step) -> dict:
    rec = common.train_run(ctx, step.id, step.config["train"])
    out = {"accuracy": rec["val"].get("accuracy"), "params": common.num_params(common.load_trained(rec["run_dir"]))}
    val_curve = [[p["step"], p["accuracy"]] for p in rec["val_curve"] if "accuracy" in p]
    return out | {"curve": rec["curve"], "val_curve": val_curve, "run_dir": rec["run_dir"]}


def forward_flops(model, image) -> int:
    """Forward FLOPs of ``model`` on one ``(1, C, H, W)`` image: matrix products (attention's too) and convolutions."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    was = model.training
    model.eval()
    # the counter has no formula for the CPU's fused SDPA kernel; the math backend runs the same products as bmm
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(image)
    model.train(was)
    return int(counter.get_total_flops())


def _finetune(ctx: Context, step: Step) -> dict:
    """Swap the pretrained ViT's attention and fine-tune (every weight) for the plan's steps."""
    import torch

    from attnzoo.adapt.loop import AdaptConfig, adapt
    from attnzoo.data import build_task
    from attnzoo.train.config import from_dict
    from attnzoo.train.objectives import build_task_model, compute_loss
    from attnzoo.train.trainer import evaluate

    cfg = step.config
    tcfg = cfg["teacher"]["train"]
    task = build_task(tcfg["task"], **tcfg["task_options"])
    teacher = common.load_trained(ctx.store.run_dir(TEACHER))
    if cfg["scratch"]:
        torch.manual_seed(cfg["seed"])  # an untrained ViT of the same shape, drawn from the row's seed
        teacher = build_task_model(from_dict({**tcfg, "device": ctx.device}), task)
    teacher.to(ctx.device)
    ft = dict(cfg["finetune"])
    if ft["lr"] == "tuned":
        ft["lr"] = common.best_swept_lr(ctx, cfg["sweep"])
    n, bs = len(task.train), ft["batch_size"]

    # a step's time runs from one batch request to the next: CPU time on a shared CPU, wall time on a GPU
    cpu = torch.device(ctx.device).type == "cpu"
    clock = time.process_time if cpu else time.perf_counter
    stamps: list[float] = []

    def batches(i: int):
        stamps.append(clock())
        g = torch.Generator().manual_seed(cfg["seed"] * 1_000_003 + i)
        return task.train.get_batch(torch.randint(0, n, (bs,), generator=g).numpy())

    def loss_fn(m, batch):
        return compute_loss(task.kind, m(*batch[0]), batch[1])[0]

    pretrained = read_json(ctx.store.run_dir(TEACHER) / "final.json", "the pretrained ViT's final metrics")["val"]

    def eval_fn(m):
        if m is teacher and not cfg["scratch"]:
            return {"accuracy": float(pretrained["accuracy"])}  # measured once, by the pretraining run
        # before the first step: the swapped model, on the first validation batches only (it is a reference point)
        limit = cfg["swapped_eval_batches"] if not stamps else None
        return {"accuracy": float(evaluate(m, task, bs, torch.device(ctx.device), max_batches=limit)["accuracy"])}

    kw = dict(finetune_steps=ft["steps"], finetune_lr=ft["lr"], warmup_steps=ft.get("warmup_steps", 0))
    kw.update(transfer_steps=0, weight_decay=0.05, seed=cfg["seed"])
    acfg = AdaptConfig(cfg["mechanism"], dict(cfg["options"]), **kw)
    res = adapt(teacher, batches, acfg, None, loss_fn=loss_fn, eval_fn=eval_fn, progress=False)
    # the median leaves out the first step's one-time costs (allocations, lazy imports)
    step_ms = 1000.0 * float(np.median(np.diff(stamps))) if len(stamps) > 1 else None
    model = res.student.model
    image = task.val.get_batch(np.arange(1))[0][0].to(ctx.device)
    acc = {k: res.evaluations[k]["accuracy"] for k in ("finetune", "swapped", "teacher")}
    out = dict(accuracy=acc["finetune"], swapped_accuracy=acc["swapped"], teacher_accuracy=acc["teacher"])
    out.update(params=common.num_params(model), flops=forward_flops(model, image), ms_per_step=step_ms)
    return out | {"step_clock": "cpu" if cpu else "wall", "report": res.student.report, "lr": ft["lr"]}


def _stats(records: dict, row: str) -> dict | None:
    if not (rs := common.per_seed(records, f"{KEY}/{row}")):
        return None
    out = common.fold(rs, {"accuracy": 100.0, "swapped_accuracy": 100.0}, ("ms_per_step",), ("params", "flops"))
    return out | {"clock": rs[0].get("step_clock", "wall")}


def summarize(records: dict[str, dict], plan: dict, plots_dir, rel) -> Section:
    sec = Section(KEY, TITLE, intro=_intro(plan))
    teacher = records.get(TEACHER, {}).get("result")
    res = {r: st for r in rows_of(plan) if (st := _stats(records, r)) is not None}
    sec.data = {"teacher": teacher and {k: teacher[k] for k in ("accuracy", "params", "val_curve")}}
    sec.data["rows"] = {r: _row_data(st) for r, st in res.items()}
    if res:
        sec.tables.append(_table(res))
    left_out = _not_tested(plan)
    if teacher is None:
        if plan["rows"]:
            sec.notes.append("the pretrained ViT has no record: nothing to compare")
        sec.findings = left_out
        return sec
    caption = "Left: the ViT's pretraining; right: accuracy fine-tuned (mean ± std) and just swapped (hatched)."
    sec.add_plot(_plot(teacher, res), plots_dir / "adapt_vision.png", rel, caption)
    t_acc = 100.0 * teacher["accuracy"]
    if plan.get("require_learned", True) and not common.learned([t_acc], CHANCE):
        sec.notes.append(
            f"the pretrained ViT reached {t_acc:.1f}% against a majority class of {CHANCE:.0f}%: not "
            f"{common.LEARNED_MARGIN:g} points above it, so no comparison is reported"
        )
        return sec
    sec.findings = _findings(res, plan.get("not_tested", {})) + left_out
    # the pretrained ViT's plateau: fine-tuned as long again (row original); the baseline's: at twice the steps
    pre = Plateau("", "pretrained ViT", claims.stat([t_acc]), _acc(res, "original"), "%", ".1f", key="teacher")
    pre.longer_run = f"fine-tuned {plan['finetune']['steps']} more steps (row original)"
    longer = _stats(records, PLATEAU)
    own = Plateau(BASELINE, BASELINE, _acc(res, BASELINE), longer and longer["accuracy"], "%", ".1f", key=BASELINE)
    for row in compared_2x(plan):
        if row in res and (twice := _stats(records, f"{row}{common.LONGER}")):
            own.rows[row] = Longer(row, res[row]["accuracy"], twice["accuracy"])
    pre.judges = own.judges = paper_finding
    label, noise = "fine-tuning, validation accuracy %", {r: st["accuracy"].std for r, st in res.items()}
    grid, unswept = plan.get("finetune_lr_sweep", []), "no fine-tuning rate sweep at this budget ({row})"
    untuned = common.tune_rows(  # the fine-tuning-rate sweep's table, and the rows it does not show tuned
        sec, records, plan, list(res), KEY, "accuracy", True, 100.0, label, grid=grid, noise=noise, unswept=unswept
    )
    # the baseline's first: a comparison replicated at twice the steps is judged there, not on the teacher's drift
    ev = Evidence(plateaus=[own, pre], tuning=[Tuning(untuned, paper_finding)])
    runs = {r: common.per_seed(records, f"{KEY}/{r}") for r in CONTROL_ROWS}
    ctl = {r: common.fold(rs, {"accuracy": 100.0}) for r, rs in runs.items() if rs}
    if len(ctl) == 2:
        a, b = ctl[CONTROL_TWIN]["accuracy"], ctl[CONTROL]["accuracy"]
        kw = paper_claims.finding_kw("adapt-attention-helps") | {"claim_type": "superiority", "kind": "check"}
        sec.findings.append(claims.compare(a, b, unit="pts", a_name=CONTROL_TWIN, b_name=CONTROL, spec=".1f", **kw))
        label, grid = "the attention check, from scratch, validation accuracy %", attention_control(plan)["lr_sweep"]
        off = common.tune_rows(sec, records, plan, list(ctl), KEY, "accuracy", True, 100.0, label, grid=grid)
        ev.controls.append(Control(CONTROL, b, paper_finding, (CONTROL_TWIN, a), untuned=off.get(CONTROL)))
    sec.data["plateau"] = judge(sec.findings, ev)
    return sec


def _acc(res: dict, row: str) -> claims.Stat | None:
    return res[row]["accuracy"] if row in res else None


def _row_data(st: dict) -> dict:
    out = common.stat_data("accuracy", st["accuracy"]) | {"swapped_accuracy_mean": st["swapped_accuracy"].mean}
    out |= {"params": st["params"], "forward_flops_per_image": st["flops"]}
    return out | {"ms_per_step": st["ms_per_step"], "seeds": st["seeds"]}


def _table(res: dict) -> Table:
    rows = [
        [r, "check: cbsa from an untrained ViT" if r == SCRATCH else ROWS[r][1], fmt(st["params"], ",")]
        + [fmt(st["flops"] / 1e6, ".2f"), st["swapped_accuracy"].fmt(".1f"), st["accuracy"].fmt(".1f")]
        + [fmt(st["ms_per_step"], ".1f")]
        for r, st in res.items()
    ]
    clock = "CPU time" if {st.get("clock") for st in res.values()} == {"cpu"} else "wall time"
    caption = (
        "Mean ± sample std over seeds; FLOPs: matrix products and patch convolution of one image's forward pass "
        f"(torch.utils.flop_counter); ms / step: median {clock} of a fine-tuning step."
    )
    heads = ["row", "description", "params", "forward MFLOPs / image", "val acc % swapped (first batches)"]
    heads += ["val acc % fine-tuned", "ms / step"]
    return Table("Pretrained ViT adapted into each attention and fine-tuned", heads, rows, caption)


def _intro(plan: dict) -> str:
    if not plan["rows"]:
        return "No row is fine-tuned at this budget: each of Fig. 9's claims says why in the claims table."
    arch, pre, ft = plan["arch"], plan["pretrain"], plan["finetune"]
    rate = common.rate_text(plan.get("finetune_lr_sweep", []), ft["lr"])
    return (
        f"A softmax ViT (width {arch['dim']}, depth {arch['depth']}, {arch['heads']} heads, patch "
        f"{arch['patch_size']}) is pretrained on `{plan['task']}` ({pre['steps']} steps of batch {pre['batch_size']}, "
        f"lr {pre['lr']}). Each row swaps its attention, keeps the pretrained projections it has and fine-tunes "
        f"every weight ({ft['steps']} steps of batch {ft['batch_size']}, AdamW, {rate}; no attention transfer, as "
        f"in Fig. 9); {common.seeds_text(plan.get('seeds', 1))}. CBSA keeps Fig. 9's q/k/v projections (attnzoo's "
        f"has one, eq 8), {tuple(plan['rep_grid'])}-pooled queries as representatives."
    )


def _plot(teacher: dict, res: dict):
    plt = common.pyplot()
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(12, 3.8))
    if curve := teacher.get("curve") or []:
        ax0.plot([c[0] for c in curve], [c[1] for c in curve], color="C0", label="train loss")
    ax0.set(xlabel="pretraining step", ylabel="training loss", title="pretraining of the ViT")
    twin = ax0.twinx()
    if vc := teacher.get("val_curve") or []:
        twin.plot([c[0] for c in vc], [100 * c[1] for c in vc], "o-", color="C1", label="val accuracy")
    twin.set_ylabel("validation accuracy (%)")
    names = list(res)
    x = np.arange(len(names))
    acc = [res[n]["accuracy"] for n in names]
    ax1.bar(x, [a.mean for a in acc], yerr=[a.std or 0.0 for a in acc], color="C2", capsize=3, label="fine-tuned")
    ax1.bar(x, [res[n]["swapped_accuracy"].mean for n in names], fill=False, hatch="//", label="swapped, no training")
    ax1.set_xticks(x, names, rotation=30, ha="right", fontsize=8)
    ax1.set_ylabel("validation accuracy (%)")
    ax1.legend(fontsize=7)
    ax1.grid(True, axis="y", alpha=0.3)
    fig.suptitle("CBSA Fig. 9 at small scale: a pretrained ViT adapted and fine-tuned")
    fig.tight_layout()
    return fig


#: CBSA Fig. 9's comparisons: (row a, row b, kind, claim id in :mod:`paper_claims`, whose record gives the margin)
CLAIMS = [
    ("cbsa", "linear", "paper", "cbsa-f9-linear"),
    ("cbsa-no-contraction", "linear", "paper", "cbsa-f9-no-contraction"),
    ("cbsa", SCRATCH, "check", "adapt-beats-scratch"),
]


def _not_tested(plan: dict) -> list[Finding]:
    """Fig. 9's claims whose compared row the plan leaves out for a reason its pilots measured (``not_tested``:
    row -> why)."""
    ids = {a: cid for a, _, kind, cid in CLAIMS if kind == "paper"}
    rows = budgets.left_out(plan, KEY, ids, plan["rows"], "rows")
    return [claims.not_tested(**paper_claims.finding_kw(ids[row]), why=why) for row, why in rows.items()]


def _findings(res: dict, left_out: Collection[str] = ()) -> list[Finding]:
    """Fig. 9's comparisons (a check without a margin is a superiority claim) but those of the rows ``left_out``,
    then the FLOPs check."""
    out = []
    for a, b, kind, claim_id in CLAIMS:
        if a in left_out:
            continue
        kw = {"claim_type": "superiority", **paper_claims.compare_kw(claim_id)}
        f = claims.compare(_acc(res, a), _acc(res, b), unit="pts", **kw, a_name=a, b_name=b, kind=kind, spec=".1f")
        if a in res and b in res:
            f.flops_a, f.flops_b = res[a]["flops"], res[b]["flops"]
        out.append(f)
    if "cbsa" in res and "linear" in res:
        cbsa, linear = res["cbsa"]["flops"], res["linear"]["flops"]
        ratio = cbsa / linear
        measured = f"forward FLOPs per image: cbsa {cbsa / 1e6:.2f}M vs linear {linear / 1e6:.2f}M ({ratio:.3f}x)"
        rule = f"agrees if the ratio is within 1 ± {FLOPS_TOLERANCE:g}"
        out.append(paper_claims.measured_finding("adapt-flops", measured, abs(ratio - 1.0) <= FLOPS_TOLERANCE, rule))
    return out
