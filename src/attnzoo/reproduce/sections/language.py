"""Language: GPT, ToST, AoT (+Hybrid) and Fastmax decoders on character-level Shakespeare: validation loss, training
cost and token-by-token decoding time and state against context length (ToST Table 4 / Fig. 8, AoT Table 1)."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from attnzoo.compare import claims, common
from attnzoo.compare.claims import Finding
from attnzoo.compare.common import Context, ModelRow, Section, Table, fmt
from attnzoo.compare.pipeline import Control, Evidence, Longer, Plateau, Tuning, judge
from attnzoo.compare.store import Step
from attnzoo.models import from_pretrained
from attnzoo.reproduce import paper_claims

KEY = "language"
TITLE = "Language: character-level Shakespeare"

#: name -> its row of the section's tables
MODELS: dict[str, ModelRow] = {
    "gpt": ModelRow("gpt2_base", "softmax", "GPT-2 layout (baseline)"),
    "tost": ModelRow("tost_gpt_base", "tssa", "ToST (causal TSSA)"),
    "aot": ModelRow("aot_gpt_base", "mssa", "AoT (attention only, no MLP)"),
    "aot_hybrid": ModelRow("aot_gpt_hybrid", "mssa", "AoT Hybrid (MLP in the first half)"),
    "fastmax": ModelRow("fastmax_gpt_p2", "fastmax", "Fastmax p=2 in GPT"),
    "gpt+identity": ModelRow("gpt2_base", "identity", "GPT-2 layout, identity token mixer (no-attention control)"),
}

#: the no-attention control: the baseline's layout with an identity token mixer (run whenever the baseline is)
CONTROL = "gpt+identity"


def rows_of(plan: dict) -> list[str]:
    """The compared rows: the plan's models and, with the baseline, its no-attention control."""
    rows = list(plan["models"])
    return rows + [CONTROL] if "gpt" in rows and CONTROL not in rows else rows


#: the baseline's plateau check: the baseline trained with twice the steps (and warm-up), nothing else changed
PLATEAU = "gpt" + common.LONGER


def longer_rows(plan: dict) -> list[str]:
    """The runs at twice the steps: the baseline's plateau run, then the compared rows' own (``compared_2x``)."""
    rows = [PLATEAU] if "gpt" in plan["models"] else []
    extra = plan.get("compared_2x", [])
    if unknown := [r for r in extra if r not in rows_of(plan) or r == "gpt"]:
        raise ValueError(f"compared_2x rows {unknown} are not compared rows of this plan; rows: {rows_of(plan)}")
    return rows + [f"{r}{common.LONGER}" for r in extra]


def plan_steps(plan: dict, seed: int) -> list[Step]:
    ngram = {"task_options": dict(plan["task_options"]), "eval_windows": plan["eval_windows"]}
    steps = [Step(f"{KEY}/ngram-baselines", KEY, ngram, _run_ngrams, label="ngram-baselines")]
    rows = rows_of(plan) + longer_rows(plan)
    common.check_sweep_extra(plan, rows_of(plan))
    common.check_row_arch(plan, rows_of(plan))
    common.check_known(rows_of(plan), MODELS, "language model")
    # the sweep first: every seed run then trains at its row's best swept rate (a run at twice the steps too)
    runs = [(n, *run) for n in rows_of(plan) for run in common.sweep_runs(f"{KEY}/{n}", common.row_lrs(plan, n), seed)]
    for n in rows:
        seeds = (common.plateau_seed_list if n.endswith(common.LONGER) else common.seed_list)(plan, seed)
        runs += [(n, sid, s, None) for sid, s in common.seed_runs(f"{KEY}/{n}", seeds)]
    for name, sid, s, lr in runs:
        row, longer = name.split("@")[0], name.endswith(common.LONGER)
        reg, mech, _ = MODELS[row]
        settings = common.twice_steps(plan["train"]) if longer else dict(plan["train"])
        settings = settings if lr is None else dict(common.sweep_train(plan["train"], plan), lr=lr)
        train = dict(task="shakespeare_char", task_options=dict(plan["task_options"]), model=reg, seed=s)
        # the section's ``arch``, then the row's own ``row_arch`` entry (a width or depth at the paper's size ratio)
        opts = train["model_options"] = {**plan["arch"], **plan.get("row_arch", {}).get(row, {})}
        if row == CONTROL:
            opts["attention"] = "identity"
        if row == "aot_hybrid":
            opts["ffn_layers"] = max(1, opts["depth"] // 2)
        # scored at the best checkpoint on the selection split (held out apart from the reported one)
        train.update(eval_batches=1, select_every=plan.get("select_every", 0), **common.train_defaults(**settings))
        # decoding cost is a property of the architecture, not of the seed: profiled on the first seed only
        contexts = plan["contexts"] if s == seed and not longer else []
        cfg = {"train": train, "mechanism": mech, "eval_windows": plan["eval_windows"], "contexts": contexts}
        if lr is None:
            cfg = common.tuned(cfg, KEY, row, common.row_lrs(plan, row), "val_loss", False)
        steps.append(common.section_step(KEY, sid, cfg, _run))
    return steps


def _run_ngrams(_ctx: Context, step: Step) -> dict:
    """Unigram and bigram character models (add-one smoothing) in bits/char on :func:`lm_eval`'s windows."""
    from attnzoo.data import build_task

    task = build_task("shakespeare_char", **step.config["task_options"])
    v = task.info["vocab_size"]
    train = task.train.tokens.numpy()
    uni = np.bincount(train, minlength=v).astype(np.float64) + 1.0
    big = np.ones((v, v))
    np.add.at(big, (train[:-1], train[1:]), 1.0)
    log_uni = np.log2(uni / uni.sum())
    log_big = np.log2(big / big.sum(axis=1, keepdims=True))
    idx = np.unique(np.linspace(0, len(task.val) - 1, step.config["eval_windows"]).astype(np.int64))
    (x,), y = task.val.get_batch(idx)
    x, y = x.numpy(), y.numpy()
    bpc = {"unigram_bpc": float(-log_uni[y].mean()), "bigram_bpc": float(-log_big[x, y].mean())}
    return bpc | {"train_chars": int(len(train)), "val_targets": int(y.size)}


@torch.no_grad()
def lm_eval(model, val, n_windows: int, batch: int = 32) -> float:
    """Mean next-character cross-entropy (nats) over ``n_windows`` windows spread evenly through the validation text
    (the trainer's ``eval_batches`` reads consecutive, overlapping windows)."""
    model.eval()
    idx = np.unique(np.linspace(0, len(val) - 1, n_windows).astype(np.int64))
    total, count = 0.0, 0
    for s in range(0, len(idx), batch):
        (x,), y = val.get_batch(idx[s : s + batch])
        total += float(F.cross_entropy(model(x).float().flatten(0, 1), y.flatten(), reduction="sum"))
        count += y.numel()
    return total / count


def state_bytes(state) -> int:
    """Bytes held by the tensors of a decoding state (KV cache grows with context; TSSA/Fastmax sums don't)."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        state = list(state.values())
    return sum(map(state_bytes, state)) if isinstance(state, (list, tuple)) else 0


@torch.no_grad()
def decode_profile(model, contexts: list[int], block: int = 8, repeats: int = 3, seed: int = 0) -> list[dict]:
    """Per-token time of cached decoding (``model.step``) of the last ``block`` tokens before each context length
    (median of ``repeats``), and the decoding state's size there."""
    model.eval()
    vocab, limit = model.config.vocab_size, model.config.block_size
    gen = torch.Generator().manual_seed(seed)
    out = []
    for ctx in sorted(contexts):
        ctx = min(ctx, limit)
        start = max(0, ctx - block)
        toks = torch.randint(0, vocab, (1, ctx), generator=gen)
        times = []
        for _ in range(repeats):
            state = model.init_state(1)
            for t in range(start):
                _, state = model.step(toks[:, t], state)
            t0 = time.perf_counter()
            for t in range(start, ctx):
                _, state = model.step(toks[:, t], state)
            times.append((time.perf_counter() - t0) / max(1, ctx - start))
        out.append(dict(context=ctx, ms_per_token=1e3 * float(np.median(times)), state_kib=state_bytes(state) / 1024))
    return out


def _run(ctx: Context, step: Step) -> dict:
    from attnzoo.data import build_task

    cfg = step.config["train"]
    rec = common.train_run(ctx, step.id, cfg, sweep=step.config.get("sweep"))
    # with best-checkpoint selection the run keeps the weights of its best selection score beside the last ones
    best = Path(rec["run_dir"]) / "best_model"
    model = from_pretrained(best) if best.is_dir() else common.load_trained(rec["run_dir"])
    task = build_task(cfg["task"], **cfg["task_options"])
    loss = lm_eval(model, task.val, step.config["eval_windows"])
    inputs, target = task.train.get_batch(np.arange(cfg["batch_size"]))
    peak = common.peak_train_mb(model, inputs, target, task.kind, ctx.device)
    model = model.cpu().eval()
    decode = decode_profile(model, step.config["contexts"], seed=ctx.seed) if model.supports_incremental else []
    out = dict(val_loss=loss, val_bpc=loss / math.log(2), params=common.num_params(model), peak_train_mb=peak)
    out.update(tokens_per_s=rec["tokens_per_s"], decode=decode, vocab_size=task.info["vocab_size"])
    return out | {k: rec[k] for k in common.RUN_KEYS}


def summarize(records: dict[str, dict], plan: dict, plots_dir, rel) -> Section:
    sec = Section(KEY, TITLE)
    seeds_res = {n: common.per_seed(records, f"{KEY}/{n}") for n in rows_of(plan) + longer_rows(plan)}
    names = [n for n in rows_of(plan) if seeds_res[n]]
    res = {}
    for n in names:
        rs = seeds_res[n]
        tokens_per_s = float(np.mean([r["tokens_per_s"] or 0.0 for r in rs]))
        res[n] = dict(rs[0], val_loss=claims.stat(r["val_loss"] for r in rs), tokens_per_s=tokens_per_s, seeds=len(rs))
    curves = {n: common.mean_val_curve(rs, "bits_per_token") for n, rs in seeds_res.items() if rs}
    ngram = records.get(f"{KEY}/ngram-baselines", {}).get("result")
    sec.intro, sec.scale = _describe(plan, [res[n]["params"] for n in names], ngram)
    sec.tables += _tables(res, names)
    sec.data = {"models": {n: _model_data(res[n]) for n in names}, "val_curves": curves}
    if names:
        caption = "Training loss; decode time and state vs context."
        sec.add_plot(_plot(res, names), plots_dir / "language.png", rel, caption)
    points = "each point one batch of the validation plays: shape, not level; the table: every window, best checkpoint"
    panels, title = [("Validation loss and training cost", curves)], "Language: validation curves"
    sec.add_curves(panels, plots_dir / "language_curves.png", rel, "bits/char", title, points=points)
    # every seed of the baseline must beat the bigram model by the margin, else the comparisons are of bigram-level
    # models and say nothing about the mechanisms (the decoding checks measure the architecture: reported either way)
    bar = ngram["bigram_bpc"] if ngram else None
    gpt = res["gpt"]["val_loss"].scaled(1 / math.log(2)) if "gpt" in res else None
    short = gpt is not None and (bar is None or max(gpt.values) > bar - LEARNED_MARGIN_BPC)
    learned = not (plan.get("require_learned", True) and short)
    found, ev = _findings(res)
    sec.findings = [f for f in found if learned or f.kind == "check"]
    if not learned:
        bigram = f"{bar:.2f}" if bar is not None else "(not measured)"
        sec.notes.append(
            f"the GPT baseline's {gpt.fmt('.2f')} bits/char is not {LEARNED_MARGIN_BPC:g} below the character bigram "
            f"model's {bigram} on every seed: the models are at bigram level, so no comparison is reported"
        )
    ev.plateaus = _plateaus(records, plan, res)
    noise = {r: res[r]["val_loss"].std for r in rows_of(plan) if r in res and res[r].get("val_loss")}
    label = "validation loss, nats"
    untuned = common.tune_rows(sec, records, plan, rows_of(plan), KEY, "val_loss", False, label=label, noise=noise)
    ev.tuning.append(Tuning(untuned))
    sec.data["plateau"] = judge(sec.findings, ev)[""]
    sec.data["untuned"] = untuned
    return sec


def _describe(plan: dict, params: list[int], ngram: dict | None) -> tuple[str, str]:
    """The section's intro (data, model, training, the n-gram baselines) and its line of the report's scale list."""
    arch, tr, block = plan["arch"], plan["train"], plan["task_options"]["block_size"]
    seen = tr["steps"] * tr["batch_size"] * block
    subset = plan["task_options"].get("train_chars")  # data-limited on purpose: the baseline reaches a plateau
    epochs = f"; the first {subset:,} characters of the training plays ({seen / subset:.3g} epochs)" if subset else ""
    width = common.width_text(plan, plan["models"])
    intro = (
        f"Shakespeare, split by play, character vocabulary{epochs}; block {block}, {width}, depth "
        f"{arch['depth']}, {arch['heads']} heads; {tr['steps']} steps of batch {tr['batch_size']}. Validation loss "
        f"on {plan['eval_windows']} windows of the validation plays, {plan.get('seeds', 1)} seed(s) per model (mean ± "
        "std)."
    )
    if ngram:
        intro += (
            f" Unigram / bigram character models on the same training text: {ngram['unigram_bpc']:.3f} / "
            f"{ngram['bigram_bpc']:.3f} bits/char."
        )
    if not params:
        return intro, ""
    epochs = f", {seen / subset:.3g} epochs of {subset:,}" if subset else ""
    return intro, (
        f"here character-level Shakespeare, {min(params):,}-{max(params):,} parameters, {block}-character windows, "
        f"{tr['steps']} steps of batch {tr['batch_size']} ({seen / 1e6:.1f}M characters seen{epochs}); the papers: "
        "GPT-2-size decoders on OpenWebText (ToST, AoT), data-rich"
    )


def _model_data(r: dict) -> dict:
    """A row's entry in results.json: its seed means and per-seed losses (no curves or run paths)."""
    out = {k: v for k, v in r.items() if k not in ("curve", "val_curve", "run_dir", "val_loss", "val_bpc")}
    return out | common.stat_data("val_loss", r["val_loss"]) | {"val_bpc_mean": r["val_loss"].mean / math.log(2)}


def _plateaus(records: dict, plan: dict, res: dict) -> list[Plateau]:
    """The baseline's run at twice the steps, and those of the compared rows that have one (``compared_2x``)."""
    rows = ["gpt", *plan.get("compared_2x", [])]
    own_2x = {
        row: claims.stat(r["val_loss"] for r in common.per_seed(records, f"{KEY}/{row}{common.LONGER}")) for row in rows
    }
    gpt_2x = own_2x.pop("gpt")
    rows = {row: Longer(row, res[row]["val_loss"], own) for row, own in own_2x.items() if row in res and own}
    return [Plateau("gpt", "gpt", res["gpt"]["val_loss"] if "gpt" in res else None, gpt_2x, "nats", rows=rows)]


def _tables(res: dict, names: list[str]) -> list[Table]:
    """The loss-and-cost table and, when decoding was timed, the per-token generation table."""
    headers = ["model", "mechanism", "description", "params", "val loss (nats)", "val bits/char"]
    headers += ["train tokens/s", "peak train-step MiB"]
    rows = []
    for n in names:
        r, loss = res[n], res[n]["val_loss"]
        bpc = loss.scaled(1 / math.log(2)).fmt(".3f")
        cost = [fmt(r["tokens_per_s"], ".0f"), fmt(r["peak_train_mb"], ".1f")]
        rows.append([n, *MODELS[n][1:], fmt(r["params"], ","), loss.fmt(".3f"), bpc, *cost])
    tables = [Table("Validation loss and training cost", headers, rows)]
    if contexts := sorted({d["context"] for n in names for d in res[n]["decode"]}):
        drows, cells = [], (("ms_per_token", ".3f"), ("state_kib", ".1f"))
        for n in [n for n in names if res[n]["decode"]]:  # the no-attention control decodes nothing
            by = {d["context"]: d for d in res[n]["decode"]}
            drows.append([n, *(fmt(by.get(c, {}).get(key), spec) for key, spec in cells for c in contexts)])
        headers = ["model"] + [f"ms/token @ {c}" for c in contexts] + [f"state KiB @ {c}" for c in contexts]
        tables.append(Table("Token-by-token generation (batch 1, cached decoding)", headers, drows))
    return tables


def _plot(res, names):
    plt = common.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for i, n in enumerate(names):
        if c := res[n].get("curve"):
            axes[0].plot([s for s, _ in c], [v / math.log(2) for _, v in c], label=n, color=f"C{i}")
        for ax, key in zip(axes[1:], ("ms_per_token", "state_kib"), strict=True):
            if d := res[n]["decode"]:
                ax.plot([x["context"] for x in d], [x[key] for x in d], "o-", label=n, color=f"C{i}")
    labels = ("training loss (bits/char)", "decode ms / token", "decoding state (KiB)")
    for ax, xlabel, ylabel in zip(axes, ("step", "context length", "context length"), labels, strict=True):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if ax.get_lines():  # a run without decoding profiles leaves its panels empty
            ax.legend(fontsize=8)
    for ax in axes[1:]:
        ax.set_xscale("log", base=2)
    fig.suptitle("Character-level Shakespeare")
    fig.tight_layout()
    return fig


#: how far below the character bigram model's bits/char every seed of the baseline must get
LEARNED_MARGIN_BPC = 0.5
#: the non-inferiority claims against GPT on validation loss: (row, claim id)
REL_CLAIMS = (("tost", "tost-t4-lm"), ("aot", "aot-t1-lm"), ("fastmax", "fast-f6-lm"))
#: (a, b) -> the paper's parameter ratio a/b: a comparison more than claims.SIZE_TOLERANCE from it is gated
PAPER_SIZE_RATIO: dict[tuple[str, str], tuple[float, str]] = paper_claims.size_ratios(
    "tost-t4-lm", "aot-t1-lm", "aot-t1-hybrid", "fast-f6-lm"
)
#: a row -> another of its paper's gaps (a fraction of GPT's loss) whose verdict the report states beside its own
OTHER_MARGINS = {"tost": (0.127, "ToST Table 4's in-distribution OWT gap")}


def _compare(res: dict, a: str, b: str, claim_id: str, **kw) -> Finding:
    """Row ``a`` against row ``b`` on validation loss (nats, lower is better) for claim ``claim_id``; with both sides'
    sizes where the paper compares at a stated size (the size gate reads them)."""
    kw = dict(paper_claims.compare_kw(claim_id), unit="nats", a_name=a, b_name=b, lower_is_better=True, **kw)
    f = claims.compare(res[a]["val_loss"], res[b]["val_loss"], spec=".3f", **kw)
    pa, pb = res[a].get("params"), res[b].get("params")
    if (a, b) in PAPER_SIZE_RATIO and pa and pb:
        f.params_a, f.params_b = pa, pb
    return f


def _other_margins(f: Finding) -> None:
    if f.a_name in OTHER_MARGINS and f.b_name == "gpt":
        claims.margin_sensitivity(f, *OTHER_MARGINS[f.a_name])


def _findings(res) -> tuple[list[Finding], Evidence]:
    """The section's findings, and what their gates read: the papers' sizes and the no-attention control."""
    out = [
        _compare(res, a, "gpt", cid, relative=True)
        if a in res and "gpt" in res
        else claims.not_tested(**paper_claims.finding_kw(cid), why=f"{a} or gpt not in this run")
        for a, cid in REL_CLAIMS
    ]
    if "aot_hybrid" in res and "aot" in res:
        out.append(_compare(res, "aot", "aot_hybrid", "aot-t1-hybrid", relative=True))
    if CONTROL in res and "gpt" in res:  # a check: with no attention each character is predicted from itself alone
        out.append(_compare(res, "gpt", CONTROL, "lm-attention-helps", claim_type="superiority", kind="check"))
    g = {x["context"]: x for x in res.get("gpt", {}).get("decode", [])}
    for m in ("tost", "fastmax"):
        d = {x["context"]: x for x in res.get(m, {}).get("decode", [])}
        if len(d) < 2 or len(g) < 2:
            continue
        lo, hi = min(d), max(d)
        grows = g[hi]["state_kib"] / max(g[lo]["state_kib"], 1e-9)
        measured = (
            f"{m} state {d[lo]['state_kib']:.1f} -> {d[hi]['state_kib']:.1f} KiB from context {lo} to {hi}; gpt "
            f"KV cache x{grows:.1f}"
        )
        flat, rule = d[hi]["state_kib"] <= d[lo]["state_kib"] * 1.01, "agrees if the state does not grow"
        out.append(paper_claims.measured_finding(f"lm-decode-memory-{m}", measured, flat, rule))
        tr, gr = (x[hi]["ms_per_token"] / x[lo]["ms_per_token"] for x in (d, g))
        measured = f"{m} x{tr:.2f}, gpt x{gr:.2f} from context {lo} to {hi}"
        rule = "agrees if ms/token grows at most 1.5x (timing noise)"
        out.append(paper_claims.measured_finding(f"lm-decode-time-{m}", measured, tr <= 1.5, rule))
    ev = Evidence(sizes=PAPER_SIZE_RATIO, readings=[_other_margins])
    if CONTROL in res:
        ev.controls.append(Control(CONTROL, res[CONTROL]["val_loss"], lambda f: f.kind == "paper"))
    return out, ev
