"""Long-range: the offline LRA-style suite with encoders of equal size that differ only in the attention: accuracy
per task and on average (ToST Table 3 / FAST Table 1 / CSP Table 4), training steps/s (FAST Table 2) and the peak
memory of a training step at each task's length."""

from __future__ import annotations

import math
import re

import numpy as np

from attnzoo.compare import claims, common
from attnzoo.compare.claims import Finding
from attnzoo.compare.common import Context, Section, Table, fmt
from attnzoo.compare.pipeline import Control, Evidence, Longer, Plateau, Tuning, compared, judge
from attnzoo.compare.store import Step
from attnzoo.reproduce import budgets, paper_claims

KEY = "long-range"
TITLE = "Long-range: LRA-style suite"

TASKS = {t: f"lra_{t}" for t in ("listops", "text", "retrieval", "image", "pathfinder")}
CHANCE = {"listops": 10.0, "text": 50.0, "retrieval": 50.0, "image": 10.0, "pathfinder": 50.0}

#: mechanism -> attention options (Fastmax p = 2 as FAST's main; CSP as CSP Table 6: complete sorting, K = 1); the
#: MEGA rows are CSP Table 4's second group, identity the no-attention control (each token sees only itself)
MECHANISMS: dict[str, dict] = {"fastmax": {"p": 2}, "csp": {"groups": 1, "shift_schedule": "none"}}
MECHANISMS |= {m: {} for m in ("softmax", "tssa", "cbsa", "linear", "mega", "mega_chunk", "mega_csp", "identity")}
CONTROL = "identity"

#: MEGA rows -> the registered MEGA LRA model each resizes (they differ only in the attention: dense, chunked, CSP)
MEGA_ROWS = {"mega": "mega_lra_{task}", "mega_chunk": "mega_chunk_lra_{task}", "mega_csp": "mega_csp_lra_{task}"}


def task_train(plan: dict, task: str) -> dict:
    """The optimisation settings of ``task``: the section's ``train`` with the task's ``task_train`` overrides."""
    return {**plan["train"], **plan.get("task_train", {}).get(task, {})}


def _schedule(plan: dict, task: str) -> str:
    train = task_train(plan, task)
    return f"{train['steps']} steps of batch {train['batch_size']}"


def _config(plan: dict, task: str, mech: str, abl: dict, seed: int, lr: float | None = None) -> dict:
    """The step config of one run of ``mech`` on ``task``, changed by ablation ``abl`` (a sweep run at ``lr``)."""
    from attnzoo.data.tasks import task_options

    arch = dict(plan["arch"], **(abl.get("arch") or {}))
    if mech in MEGA_ROWS:
        model, opts = mega_model(task, mech, arch, chunk=plan.get("mega_chunk_size"))
    else:  # one encoder shape for every mechanism (ToST Table 7's registered config, resized), pre-norm, mean pool
        model, att = f"tost_lra_{task}", dict(MECHANISMS[mech])
        opts = dict(arch, attention=mech, attention_options=att, dropout=0.0, norm="pre", pool="mean")
    settings = common.train_defaults(**{**task_train(plan, task), **(abl.get("train") or {})})
    if lr is not None:
        settings = dict(common.sweep_train(settings, plan), lr=lr)
    task_opts = dict(plan["tasks"][task])
    if "mask_padding" in task_options(TASKS[task]):  # LRA's padding mask written out (older runs' configs differ)
        task_opts["mask_padding"] = True
    data = dict(task=TASKS[task], task_options=task_opts, model=model)
    return {"train": dict(data, model_options=opts, seed=seed, **settings), "mechanism": mech, "task": task}


def mega_model(task: str, row: str, arch: dict, chunk: int | None = None) -> tuple[str, dict]:
    """MEGA row ``row`` on ``task`` at the section's width, depth and MLP width: ``(model name, options)``."""
    from attnzoo.models import get_config

    name = MEGA_ROWS[row].format(task=task)
    att = dict(get_config(name).attention_options, hdim=arch["mlp_dim"])
    # r = 128 covers a whole sequence of <= 128 tokens (dense MEGA): mega_chunk_size keeps MEGA's chunks per sequence
    if chunk is not None and att.get("chunk_size") is not None:
        if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
            raise ValueError(f"mega_chunk_size must be a positive int, got {chunk!r}")
        att["chunk_size"] = chunk
    # MEGA's LRA configurations keep Z at 0.4-0.8 D and E at 2 D; Z = D / 2 and E = the MLP width for all three rows
    if "zdim" in att:
        att["zdim"] = max(1, arch["dim"] // 2)
    if att.get("csp_groups"):  # CSP Table 7's group counts are for width 128-160; a group needs at least one channel
        att["csp_groups"] = min(att["csp_groups"], arch["dim"])
    opts = {k: arch[k] for k in ("dim", "depth", "mlp_dim")}
    return name, {**opts, "head_dim": arch["mlp_dim"], "attention_options": att, "dropout": 0.0}


def plan_steps(plan: dict, seed: int) -> list[Step]:
    extra = common.extra_seed_counts(plan)
    common.check_sweep_extra(plan, list(plan["mechanisms"]))
    common.check_known(extra, plan["mechanisms"], "extra_seeds row")
    common.check_known(plan["tasks"], TASKS, "LRA task")
    common.check_known(plan["mechanisms"], MECHANISMS, "LRA mechanism")
    budgets.left_out(plan, "long-range", _ACCURACY_CLAIMS, plan["mechanisms"], "mechanisms")
    steps, record = [], common.classification_record
    for task, task_opts in plan["tasks"].items():
        ablations = [(n, a["mechanism"], a) for n, a in plan.get("ablations", {}).items() if a["task"] == task]
        for row, mech, abl in [(m, m, {}) for m in plan["mechanisms"]] + ablations:
            base, lrs = f"{KEY}/{task}/{row}", common.row_lrs(plan, mech)
            if not abl:  # the sweep first: the seeds train at its best rate (an ablation at its mechanism's)
                for sid, s, lr in common.sweep_runs(base, lrs, seed):
                    steps.append(common.section_step(KEY, sid, _config(plan, task, mech, abl, s, lr), record))
            seeds = common.seed_list(plan, seed)
            if row in extra:  # always its extra seeds (using them by verdict would bias)
                seeds += list(range(seeds[-1] + 1, seeds[-1] + 1 + extra[row]))
            for sid, s in common.seed_runs(base, seeds):
                cfg = _config(plan, task, mech, abl, s) | ({"ablation": row} if abl else {})
                if mech in plan["mechanisms"]:
                    cfg = common.tuned(cfg, f"{KEY}/{task}", mech, lrs, "accuracy", True)
                steps.append(common.section_step(KEY, sid, cfg, record))
        # the validation labels' majority rate, and on Retrieval how far a byte-histogram shortcut gets
        for what in ["labels"] + (["shortcut"] if task == "retrieval" else []):
            config = {"task": TASKS[task], "task_options": dict(task_opts)}
            steps.append(Step(f"{KEY}/{task}/{what}", KEY, config, _run_data, label=f"{task}/{what}"))
    return steps


def _run_data(_ctx: Context, step: Step) -> dict:
    """Validation class counts (the majority class is the bar) or, for ``shortcut``, a byte-histogram rule's score."""
    from attnzoo.data import build_task
    from attnzoo.data import lra as lra_data

    task = build_task(step.config["task"], **step.config["task_options"])
    if step.id.endswith("/shortcut"):
        return {"available": True, **dict(lra_data.retrieval_shortcut_accuracy(task))}
    n = len(task.val)
    labels = np.concatenate([task.val.get_batch(np.arange(s, min(s + 256, n)))[1].numpy() for s in range(0, n, 256)])
    counts = np.bincount(labels, minlength=task.info["num_classes"])
    return {"counts": counts.tolist(), "majority": float(counts.max() / counts.sum()), "n_val": int(n)}


#: a task counts as learned when every seed of the softmax baseline clears the majority class by this many points:
#: half ``common.LEARNED_MARGIN``, as the papers' own ListOps accuracies (37-38%) stand only ~20 points above it
LEARNED_MARGIN = 5.0


def _fold(rs: list[dict]) -> dict:
    """One task x mechanism over seeds: accuracy (%) as a Stat, the costs as seed means."""
    out = common.fold(rs, {"accuracy": 100.0}, means=("steps_per_s", "peak_train_mb"), first=("params", "seq_len"))
    out["per_seed"] = [None if r.get("accuracy") is None else 100 * r["accuracy"] for r in rs]
    # each seed's validation accuracy (%) by step: the equal-wall-clock reading takes per-seed values from them
    out["val_by_step"] = [{p["step"]: 100.0 * p["accuracy"] for p in r.get("val_curve") or []} for r in rs]
    return out


def summarize(records: dict[str, dict], plan: dict, plots_dir, rel) -> Section:
    sec = Section(KEY, TITLE)
    tasks = [t for t in TASKS if t in plan["tasks"]]
    mechs = plan["mechanisms"]
    res = {m: {t: _fold(rs) for t in tasks if (rs := common.per_seed(records, f"{KEY}/{t}/{m}"))} for m in mechs}
    lengths = {t: next((res[m][t]["seq_len"] for m in mechs if t in res[m]), None) for t in tasks}
    ablations = {
        name: dict(abl, result=_fold(rs))
        for name, abl in plan.get("ablations", {}).items()
        if (rs := common.per_seed(records, f"{KEY}/{abl['task']}/{name}"))
    }
    if mechs:
        sec.intro = _intro(plan, tasks, lengths)
        sec.scale = (
            f"here {', '.join(f'{t} at N={lengths[t]}' for t in tasks)}, width {plan['arch']['dim']}, depth "
            f"{plan['arch']['depth']}, {'; '.join(f'{t}: {_schedule(plan, t)}' for t in tasks)}; the papers: the "
            "Long Range Arena's five tasks at 1K-4K tokens (ListOps up to 2K)"
        )
    else:  # every claim of the section is not tested, for the reasons its plan gives
        sec.intro = (
            f"No encoder trains at this budget on {', '.join(tasks) or 'any task'}: each claim's reason, with the "
            "pilots' figures, is in the claims table."
        )
    majority = {t: 100 * rec["result"]["majority"] for t in tasks if (rec := records.get(f"{KEY}/{t}/labels"))}
    learned = _learned(res, tasks, majority) if plan.get("require_learned", True) else list(tasks)
    sec.tables += _tables(res, mechs, tasks, learned, majority, ablations, plan) if mechs else []
    shortcut = records.get(f"{KEY}/retrieval/shortcut", {}).get("result")
    sec.notes += _notes(plan, shortcut) + _eval_set_notes(records, res, tasks)

    def by_task(key):
        return {m: {t: res[m][t][key] for t in res[m]} for m in mechs}

    sec.data = {
        "accuracy": by_task("per_seed"),
        "accuracy_mean": {m: {t: res[m][t]["accuracy"].mean for t in res[m] if res[m][t]["accuracy"]} for m in mechs},
        "accuracy_std": {m: {t: res[m][t]["accuracy"].std for t in res[m] if res[m][t]["accuracy"]} for m in mechs},
        "average_accuracy": {m: (a.mean if (a := _avg_stat(res, m, learned)) else None) for m in mechs},
        "learned_tasks": learned,
        "steps_per_s": by_task("steps_per_s"),
        "peak_train_mb": by_task("peak_train_mb"),
        "params": by_task("params"),
        "lengths": lengths,
        "majority": majority,
        "retrieval_shortcut": shortcut,
        "ablations": {
            n: {"task": a["task"], "mechanism": a["mechanism"], "accuracy": a["result"]["per_seed"]}
            for n, a in ablations.items()
        },
    }
    if any(res[m] for m in mechs):
        caption = "Accuracy (dashed: chance) and training steps/s per task."
        sec.add_plot(_plot(res, mechs, tasks, lengths), plots_dir / "long_range.png", rel, caption)
    head_dim = plan["arch"]["dim"] // plan["arch"]["heads"]
    sec.findings, ev = _findings(res, mechs, tasks, lengths, learned, head_dim, majority)
    sec.findings += _not_tested(plan, tasks, lengths)
    ev.gates += _dense_chunks(sec.findings, records, tasks, lengths)
    # validation curves: one panel per task, every mechanism and every ablation of that task
    curves = {t: {m: res[m][t]["val_curve"] for m in mechs if t in res[m]} for t in tasks}
    for n, a in ablations.items():
        curves[a["task"]][n] = a["result"]["val_curve"]
    sec.data["val_curves"] = curves
    path = plots_dir / "long_range_curves.png"
    sec.add_curves(list(curves.items()), path, rel, "accuracy (%)", "Long-range: validation curves")
    eq_table, sec.data["equal_time"] = equal_time(res, mechs, learned, ablations, plan)
    sec.tables += [eq_table] if eq_table else []
    ev.plateaus = _plateaus(res, learned, ablations)
    untuned = {}  # per task, {row: why} for rows not at their best rate (or swept at chance); the sweep tables
    for t in learned:
        noise = {m: res[m][t]["accuracy"].std for m in mechs if t in res[m]}
        kw = dict(unswept=f"no learning-rate sweep on {t} at this budget", noise=noise, floor=majority.get(t))
        args = (f"{KEY}/{t}", "accuracy", True, 100.0, f"{t}, accuracy %")
        untuned[t] = common.tune_rows(sec, records, plan, mechs, *args, **kw)
    ev.tuning += [Tuning(why, lambda f, t=t: compared(f) and _test(f) in (t, AVERAGE)) for t, why in untuned.items()]
    for c in ev.controls:
        c.untuned = untuned.get(c.task, {}).get(CONTROL)
    sec.data["plateau"] = judge(sec.findings, ev)
    sec.data["untuned"] = untuned
    return sec


#: (mechanism, task) -> another of the paper's gaps on that task, stated beside the finding's own margin
OTHER_MARGINS = {("fastmax", "listops"): (0.97, "FAST Table 1's own ListOps gap (38.37 vs 37.40)")}


def _other_margins(f: Finding) -> None:
    if other := OTHER_MARGINS.get((f.a_name, _test(f))):
        claims.margin_sensitivity(f, *other, relative=False)


def _intro(plan: dict, tasks: list[str], lengths: dict[str, int | None]) -> str:
    from attnzoo.models.zoo import MEGA_CHUNK

    arch, extra = plan["arch"], common.extra_seeds_text(plan)
    text = (
        f"Encoders of width {arch['dim']}, depth {arch['depth']}, {arch['heads']} heads, MLP {arch.get('mlp_dim')}, "
        "pre-norm, mean pooling, AdamW/cosine; only the attention differs. "
        + "; ".join(f"{t}: N={lengths[t]}, {_schedule(plan, t)}" for t in tasks)
        + (" (Retrieval: two documents of N bytes each)" if "retrieval" in tasks else "")
        + f". {common.seeds_text(plan.get('seeds', 1), 'cell')}"
        + (f"; {extra}" if extra else "")
        + ". Data generated offline (`attnzoo.data`), not LRA's release files."
    )
    if rows := [m for m in plan["mechanisms"] if m in MEGA_ROWS]:
        chunk = plan.get("mega_chunk_size", MEGA_CHUNK)
        kinds = {"mega": "dense", "mega_chunk": f"chunked (r = {chunk})", "mega_csp": "CSP"}
        # MEGA's N(0, 0.02) leaves the attention's gradients below Adam's epsilon for thousands of steps (it trains 90k)
        text += (
            f" {', '.join(rows)}: MEGA's own block (CSP Table 4's second group, Z = D/2) with "
            f"{' / '.join(kinds[m] for m in rows)} attention, compared only with each other; initialised "
            "N(0, 1/fan-in) and N(0, 1) (`init='scaled'`; MEGA's N(0, 0.02) stayed at the majority class, "
            "docs/results_history.md, 2026-11-26)."
        )
    return text


def _tables(res: dict, mechs, tasks, learned, majority: dict, ablations: dict, plan: dict) -> list[Table]:
    """Accuracy (with chance, majority and learned tasks; average over several tasks), ablations, training cost."""
    several = len(tasks) > 1

    def row(name, cells, avg):
        return [name, *cells, *([avg] if several else [])]

    acc = [
        row(m, [_cell(res[m].get(t, {}).get("accuracy")) for t in tasks], _cell(_avg_stat(res, m, learned)))
        for m in mechs
    ]
    acc.append(row("chance", [fmt(CHANCE[t], ".1f") for t in tasks], "-"))
    if len(majority) == len(tasks):
        mean = fmt(sum(majority[t] for t in learned) / len(learned), ".1f") if learned else "-"
        acc.append(row("majority class", [fmt(majority[t], ".1f") for t in tasks], mean))
    acc.append(row("learned by softmax?", [fmt(t in learned) for t in tasks], "-"))
    title = "Accuracy (%, mean ± std over seeds" + ("; avg over the learned tasks)" if several else ")")
    tables = [Table(title, row("mechanism", tasks, "avg (learned)"), acc)]
    if ablations:
        heads = ["ablation", "task", "mechanism", "changes", "val acc %"]
        rows = [
            [n, a["task"], a["mechanism"], _describe_ablation(a, plan), _cell(a["result"]["accuracy"])]
            for n, a in ablations.items()
        ]
        tables.append(Table("Ablations", heads, rows))
    cost = (("steps_per_s", ".2f", "steps/s"), ("peak_train_mb", ".1f", "MiB"))
    heads = ["mechanism"] + [f"{t} {what}" for t in tasks for _, _, what in cost]
    rows = [[m] + [fmt(res[m].get(t, {}).get(key), spec) for t in tasks for key, spec, _ in cost] for m in mechs]
    tables.append(Table("Training cost (seed means; MiB: peak training-step memory)", heads, rows))
    return tables


def _cell(acc: claims.Stat | None) -> str:
    return acc.fmt(".1f") if acc else "-"


#: the "; re-measure ... `command` ..." tail of a left-out task's reason in the budget files
_REMEASURE = re.compile(r"; re-measure[^`]*`[^`]*`[^;)]*")


def _notes(plan: dict, shortcut: dict | None = None) -> list[str]:
    """The Retrieval shortcut's accuracy; the tasks the budget leaves out (a pilot's figures stay in the budget)."""
    notes = []
    if shortcut and shortcut.get("available"):
        numbers = {k: v for k, v in shortcut.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        notes.append(
            "retrieval shortcut check (a threshold on the cosine similarity of the two documents' byte histograms, "
            "fitted on train; same-play excerpts share some byte statistics): "
            + ", ".join(f"{k} {v:.3g}" for k, v in numbers.items())
        )
    left_out = plan.get("left_out", {})
    if any(_REMEASURE.search(why) for why in left_out.values()):
        notes.append(
            f"Not run at this budget: {', '.join(left_out)} (why, with pilot figures and re-measure commands: the "
            "budget's `left_out`, attnzoo/reproduce/budgets)"
        )
    elif left_out:
        notes.append("Not run at this budget: " + "; ".join(f"{t} — {why}" for t, why in left_out.items()))
    return notes


def _eval_set_notes(records: dict, res: dict, tasks: list[str]) -> list[str]:
    """Each task's validation-set noise against softmax's seed spread: the intervals are over seeds, on one set."""
    notes = []
    for t in tasks:
        n = records.get(f"{KEY}/{t}/labels", {}).get("result", {}).get("n_val")
        if not n or not (soft := res.get("softmax", {}).get(t)):
            continue
        acc = claims.stat(soft["accuracy"])
        se = 100 * float(np.sqrt(max(acc.mean / 100 * (1 - acc.mean / 100), 0.0) / n))
        spread = f"softmax's seed spread is {acc.std:.2f} pts" if acc.std is not None else "softmax has one seed"
        notes.append(
            f"{t}: every seed is scored on the same {n:,} validation examples (binomial standard error at softmax's "
            f"{acc.mean:.1f}%: about {se:.1f} pts; {spread}): the intervals compare models on this set, not the task"
        )
    return notes


def _describe_ablation(abl: dict, plan: dict) -> str:
    parts = [f"{k} {plan['arch'].get(k)} -> {v}" for k, v in abl.get("arch", {}).items()]
    parts += [f"{k} {task_train(plan, abl['task']).get(k)} -> {v}" for k, v in abl.get("train", {}).items()]
    return ", ".join(parts) or "-"


def _longer_runs(ablations: dict, mech: str, task: str) -> list[dict]:
    """``mech``'s ablations on ``task`` that change only the steps (and the warm-up with them)."""
    own = [a for a in ablations.values() if a["mechanism"] == mech and a["task"] == task]
    return [a for a in own if "steps" in a.get("train", {}) and set(a["train"]) <= {"steps", "warmup_steps"}]


def _plateaus(res: dict, learned: list[str], ablations: dict) -> list[Plateau]:
    """Softmax's plateau per learned task (its ``@2x-steps`` run), and each compared row's own run at 2x the steps."""
    out = []
    for t in learned:
        rows = {
            m: Longer(f"{m} on {t}", res[m][t]["accuracy"], runs[0]["result"]["accuracy"])
            for m in res
            if t in res[m] and (runs := _longer_runs(ablations, m, t))
        }
        longer = rows["softmax"].longer if "softmax" in rows else None
        own = lambda f, t=t: _test(f) in (t, AVERAGE)  # noqa: E731
        base = res["softmax"][t]["accuracy"]
        out.append(Plateau("softmax", f"softmax on {t}", base, longer, "%", ".1f", judges=own, rows=rows, key=t))
    return out


def equal_time(
    res: dict, mechs: list[str], learned: list[str], ablations: dict, plan: dict
) -> tuple[Table | None, dict[str, dict[str, dict]]]:
    """Accuracy at softmax's training wall time, read from the validation curves: ``(table, {task: {mech: ...}})``."""
    rows, out, times = [], {}, []
    for t in learned:
        soft = res.get("softmax", {}).get(t)
        if not soft or not soft.get("steps_per_s") or not soft["accuracy"]:
            continue
        base_steps = task_train(plan, t)["steps"]
        wall = base_steps / soft["steps_per_s"]
        times.append(f"{base_steps} steps in {wall:.0f} s on {t}")
        for m in mechs:
            # the MEGA rows are compared among themselves (CSP Table 4's second group), not with softmax
            if m in ("softmax", CONTROL) or m in MEGA_ROWS or t not in res[m] or not res[m][t].get("steps_per_s"):
                continue
            affordable = wall * res[m][t]["steps_per_s"]
            longer = _longer_runs(ablations, m, t)
            runs = [(base_steps, res[m][t])] + [(a["train"]["steps"], a["result"]) for a in longer]
            # a point of a longer cosine schedule is read before its rate has annealed: a low estimate
            if (best := _point_within(runs, affordable)) is None:
                continue
            step, run_steps, vals = best
            acc = claims.stat(vals)
            eff, ci, _ = claims.welch_ci(acc, soft["accuracy"])
            lower = affordable > max(r for r, _ in runs)
            cell = dict(softmax_seconds=wall, affordable_steps=affordable, step=step, run_steps=run_steps)
            cell.update(accuracy_per_seed=vals, effect=eff, ci95=list(ci) if ci else None, lower_bound=lower)
            out.setdefault(t, {})[m] = cell
            read = f"{step} of {run_steps}" + (" (lower bound)" if lower else "")
            interval = f"{eff:+.1f}" + (f" [{ci[0]:+.1f}, {ci[1]:+.1f}]" if ci else "")
            rows.append([t, m, f"{affordable:.0f}", read, acc.fmt(".1f"), interval])
    if not rows:
        return None, out
    heads = ["task", "mechanism", "steps in that time", "step read", "acc %", "vs softmax pts [95% CI]"]
    caption = f"Softmax trains {'; '.join(times)}; lower bound: the longest run ends sooner."
    title = "Equal wall clock: accuracy at softmax's training time (from the validation curves)"
    return Table(title, heads, rows, caption=caption), out


def _point_within(runs: list[tuple[int, dict]], affordable: float) -> tuple[int, int, list[float]] | None:
    """The latest validation point within ``affordable`` on every seed: ``(step, run steps, accuracies)`` or None."""
    points = [
        (step, run_steps, [d[step] for d in by])
        for run_steps, fold in runs
        if (by := fold.get("val_by_step")) and all(by)
        for step in set.intersection(*(set(d) for d in by))
        if step <= affordable + 1e-9
    ]
    # at a tie, the run that ends there (its rate annealed)
    return max(points, key=lambda p: (p[0], -p[1]), default=None)


def _avg_stat(res, m, tasks) -> claims.Stat | None:
    """Per-seed averages over ``tasks`` (seed i's average uses seed i of every task) as a Stat."""
    if not tasks or any(t not in res[m] for t in tasks):
        return None
    seeds = zip(*(res[m][t]["per_seed"] for t in tasks), strict=False)  # as many as the task with the fewest
    return claims.stat(sum(v) / len(v) for v in seeds if None not in v)


def _plot(res, mechs, tasks, lengths):
    plt = common.pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 3.8))
    x = np.arange(len(tasks))
    w = 0.8 / max(1, len(mechs))
    for i, m in enumerate(mechs):
        acc = [res[m][t]["accuracy"] if t in res[m] else None for t in tasks]
        err = [(a.std or 0.0) if a else 0.0 for a in acc]
        a1.bar(x + i * w, [a.mean if a else 0.0 for a in acc], w, yerr=err, label=m, color=f"C{i}", capsize=2)
        a2.bar(x + i * w, [res[m].get(t, {}).get("steps_per_s") or 0.0 for t in tasks], w, label=m, color=f"C{i}")
    for j, t in enumerate(tasks):
        a1.hlines(CHANCE[t], j - 0.1, j + 0.9, colors="gray", linestyles="--", lw=1)
    labels = [f"{t}\nN={lengths[t]}" for t in tasks]
    for ax, lab in ((a1, "accuracy (%)"), (a2, "training steps / s")):
        ax.set_xticks(x + 0.4 - w / 2, labels, fontsize=8)
        ax.set_ylabel(lab)
        ax.grid(True, axis="y", alpha=0.3)
    a2.set_yscale("log")
    a1.legend(fontsize=8, ncol=2)
    fig.suptitle("LRA-style suite")
    fig.tight_layout()
    return fig


def _unlearned_base(found: list[Finding], res, base: str, learned: list[str], majority: dict) -> list:
    """Did-not-learn gates on comparisons against a baseline other than softmax (MEGA-chunk) that did not learn."""
    lows = {
        t: f"{t}: lowest seed {min(res[base][t]['accuracy'].values):.1f}%, not {LEARNED_MARGIN:g} pts above the "
        f"majority class {majority.get(t, CHANCE[t]):.1f}%"
        for t in learned
        if t not in _learned(res, [t], majority, row=base)
    }
    return [
        (f, "did not learn", f"the baseline {base} did not learn ({', '.join(hits)})")
        for f in found
        if (hits := [why for t, why in lows.items() if _test(f) in (t, AVERAGE)])
    ]


def _dense_chunks(findings: list[Finding], records: dict, tasks: list[str], lengths: dict) -> list:
    """Condition gates on comparisons with MEGA-chunk whose stored chunk covers the whole sequence (dense MEGA)."""
    gates = []
    for t in tasks:
        rec = next((r for k, r in records.items() if k.startswith(f"{KEY}/{t}/mega_chunk/seed")), {})
        opts = rec.get("config", {}).get("train", {}).get("model_options", {})
        chunk = opts.get("attention_options", {}).get("chunk_size")
        if chunk is None or not lengths.get(t) or chunk < lengths[t]:
            continue
        why = (
            f"mega_chunk's chunk r = {chunk} covers the whole sequence (N = {lengths[t]} on {t}): dense MEGA, not "
            "the paper's 8-32 chunks (r = 128 at 1K-4K tokens)"
        )
        gates += [(f, "conditions", why) for f in findings if f.b_name == "mega_chunk" and _test(f) in (t, AVERAGE)]
    return gates


def unlearned_row(acc: claims.Stat, m: str, majority: float | None) -> str | None:
    """Why the compared row did not learn (a seed within LEARNED_MARGIN of the majority class), or None."""
    failed = [] if majority is None else common.unlearned_seeds(acc.values, majority, LEARNED_MARGIN)
    rule = f"within {LEARNED_MARGIN:g} pts of the majority class {majority:.1f}%" if failed else ""
    return common.did_not_learn(failed, acc.n, m, rule, unit="%") if failed else None


def _control_findings(findings: list[Finding], res: dict, learned: list[str]) -> list[Control]:
    """Per learned task, the check that softmax beats the control (into ``findings``) and the control's gate."""
    controls = []
    for t in learned:
        if not (ctl := res.get(CONTROL, {}).get(t)) or not (soft := res.get("softmax", {}).get(t)):
            continue
        kw = dict(claim_type="superiority", unit="pts", a_name="softmax", b_name=CONTROL, kind="check", spec=".1f")
        kw.update(paper_claims.finding_kw(f"lra-attention-helps#{t}", task=t))
        findings.append(claims.compare(soft["accuracy"], ctl["accuracy"], **kw))
        judges = lambda f, t=t: f.kind == "paper" and _test(f) == t and f.b_name == "softmax"  # noqa: E731
        controls.append(Control(f"{CONTROL} on {t}", ctl["accuracy"], judges, task=t))
    return controls


def _learned(res, tasks, majority, row: str = "softmax") -> list[str]:
    """Tasks on which every seed of ``row`` beats the majority class (chance if unknown) by LEARNED_MARGIN."""
    accs = {t: a for t in tasks if (a := res.get(row, {}).get(t, {}).get("accuracy")) is not None}
    return [t for t, a in accs.items() if common.learned(a.values, majority.get(t, CHANCE[t]), LEARNED_MARGIN)]


#: the accuracy claims against softmax: (mechanism, claim id in :mod:`paper_claims`), each tested on the LRA average
#: and per task (``"<id>#average"``, ``"<id>#<task>"``)
CLAIMS = [("tssa", "tost-t3-lra"), ("fastmax", "fast-t1-accuracy"), ("csp", "csp-t4-lra")]
#: row -> (its baseline, its accuracy claim's id); MEGA-CSP's is CSP Table 4's second group, against MEGA-chunk
_ACCURACY_CLAIMS = {m: ("softmax", cid) for m, cid in CLAIMS} | {"mega_csp": ("mega_chunk", "csp-t4-mega")}
#: the test of an accuracy claim on the average over the learned tasks
AVERAGE = "average"


def _test(f: Finding) -> str:
    """Which test of its claim a finding is: a task, ``AVERAGE``, or ``""`` for a claim tested once."""
    return paper_claims.test_of(f.claim_id)


def _findings(res, mechs, tasks, lengths, learned, head_dim=None, majority=None) -> tuple[list[Finding], Evidence]:
    """The section's findings and the evidence of their gates that the rows' results give."""
    majority = majority or {}
    ev = Evidence(readings=[_other_margins])
    out = []
    for m, (base, claim_id) in _ACCURACY_CLAIMS.items():
        if m in mechs and base in mechs and learned:
            found = _accuracy_findings(res, m, claim_id, learned, gates=ev.gates, majority=majority, base=base)
            if base != "softmax":  # the learned tasks are softmax's: another baseline may not have learned them
                ev.gates += _unlearned_base(found, res, base, learned, majority)
            out += found
    if "softmax" in mechs and tasks:
        out += _speed_findings(res, mechs, tasks, lengths, head_dim)
        if "csp" in mechs and len(mechs) > 2 and (f := _fastest_finding(res, mechs, tasks, lengths)):
            out.append(f)
    ev.controls = _control_findings(out, res, learned)
    return out, ev


def _accuracy_findings(res, m, claim_id, learned, *, gates: list, majority: dict, base="softmax") -> list[Finding]:
    """One accuracy claim ``m`` vs ``base``: its LRA-average finding, then per learned task (did-not-learn gates)."""
    kw = dict(unit="pts", a_name=m, b_name=base, spec=".1f")
    per_task = []
    for t in learned:
        if t not in res[m] or t not in res[base]:
            continue
        task_kw = dict(paper_claims.compare_kw(f"{claim_id}#{t}"), paper_value="per-task column")
        f = claims.compare(res[m][t]["accuracy"], res[base][t]["accuracy"], **task_kw, **kw)
        f.claim += f" on {t}"
        if why := unlearned_row(res[m][t]["accuracy"], m, majority.get(t)):
            gates.append((f, "did not learn", why))
        per_task.append(f)
    if len(per_task) == 1:  # one task: its average is that task, and a second finding would count it twice
        return per_task
    avg_kw = paper_claims.compare_kw(f"{claim_id}#{AVERAGE}")
    avg = claims.compare(_avg_stat(res, m, learned), _avg_stat(res, base, learned), **avg_kw, **kw)
    avg.claim += " on the LRA average"
    avg.measured += f" (average over the learned tasks: {', '.join(learned)})"
    return [avg, *per_task]


def _not_tested(plan: dict, tasks: list[str], lengths: dict) -> list[Finding]:
    """The claims of the rows a plan leaves out for a reason its pilots measured (``not_tested``: row -> why): the
    accuracy claims with that reason, the speed claims (which the row's training would have timed) naming it."""
    out = []
    n = max((lengths.get(t) or 0 for t in tasks), default=0)
    for m, why in budgets.left_out(plan, "long-range", _ACCURACY_CLAIMS, plan["mechanisms"], "mechanisms").items():
        for t in tasks:
            f = claims.not_tested(**paper_claims.finding_kw(f"{_ACCURACY_CLAIMS[m][1]}#{t}"), why=why)
            f.claim += f" on {t}"
            out.append(f)
        if cid := _SPEED_CLAIMS.get(m):
            min_n = paper_claims.get(cid).conditions.min_n
            speed_why = f"{m} is not trained here (its accuracy claim is not tested)"
            if n:  # a length is known only where some row trained on the task
                speed_why += f"; longest task N={n}" + (f" < {min_n} in any case" if min_n and n < min_n else "")
            out.append(claims.not_tested(**paper_claims.finding_kw(cid), why=speed_why))
        if m == "csp":  # the "fastest of all" claim is CSP's training speed too
            out.append(claims.not_tested(**paper_claims.finding_kw(FASTEST), why=f"as for `{_SPEED_CLAIMS['csp']}`"))
    return out


#: the speed claims against softmax: mechanism -> claim id; the smallest N and the head dimension each is made at are
#: the claim's conditions
_SPEED_CLAIMS = {"fastmax": "fast-t2-speed#lra-training", "tssa": "tost-t4-speed", "csp": "csp-f4-faster"}


def _speed_findings(res, mechs, tasks, lengths, head_dim=None) -> list[Finding]:
    """Speed claims against softmax, judged at the longest length both ran, at the head dimension the paper used."""
    out = []
    longest = max(tasks, key=lambda t: lengths[t] or 0)
    n = lengths[longest]
    base = res["softmax"].get(longest, {}).get("steps_per_s")
    for m, claim_id in _SPEED_CLAIMS.items():
        if m not in mechs:
            continue
        cond = paper_claims.get(claim_id).conditions
        val = res[m].get(longest, {}).get("steps_per_s")
        ratio = f"{val / base:.2f}x softmax" if val and base else "n/a"
        if cond.head_dim is not None and head_dim != cond.head_dim:
            why = (
                f"head dimension {head_dim} here, the claim's {cond.head_dim} ({ratio} steps/s on "
                f"{longest}, N={n}); tested at D = {cond.head_dim} under Efficiency"
            )
        elif n is None or n < cond.min_n:
            why = f"longest task N={n} < {cond.min_n} ({ratio} steps/s on {longest})"
        elif val is None or base is None:
            why = "missing steps/s"
        else:
            measured = f"{m} {val:.2f} vs softmax {base:.2f} steps/s on {longest} (N={n}): {val / base:.2f}x"
            rule = f"agrees if {m} steps/s > softmax's (a measurement of training throughput)"
            seeds = res[m][longest]["seeds"]
            out.append(paper_claims.measured_finding(claim_id, measured, val > base, rule, "paper", seeds))
            continue
        out.append(claims.not_tested(**paper_claims.finding_kw(claim_id), why=why))
    return out


#: CSP's "fastest training" claim: read from LRA at 1K-4K tokens, like its "trains faster than softmax" (N >= 1024)
FASTEST = "csp-f4-fastest"
FASTEST_MIN_N = paper_claims.get(FASTEST).conditions.min_n


def _fastest_finding(res, mechs, tasks, lengths) -> Finding | None:
    """CSP's 'fastest of all compared' claim over geometric-mean steps/s; None without a speed."""
    # the paper's comparison set (Transformer variants): mechanisms it did not compare do not decide it
    mechs = [m for m in mechs if m in ("softmax", "linear", "csp")]
    speeds = {m: [v for t in tasks if (v := res[m].get(t, {}).get("steps_per_s"))] for m in mechs}
    known = {m: math.exp(sum(math.log(v) for v in vs) / len(vs)) for m, vs in speeds.items() if vs}
    if not known:
        return None
    measured = f"geometric-mean steps/s over {', '.join(tasks)}: " + ", ".join(f"{m} {v:.2f}" for m, v in known.items())
    if (n := max(lengths[t] or 0 for t in tasks)) < FASTEST_MIN_N:
        why = f"longest task N={n} < {FASTEST_MIN_N} ({measured})"
        return claims.not_tested(**paper_claims.finding_kw(FASTEST), why=why)
    rule = (
        "agrees if CSP has the highest geometric-mean steps/s over the tasks among the mechanisms of the paper's "
        "comparison set run here (a measurement)"
    )
    seeds = min(res[m][t]["seeds"] for m in mechs for t in tasks if t in res[m])
    return paper_claims.measured_finding(FASTEST, measured, max(known, key=known.get) == "csp", rule, "paper", seeds)
