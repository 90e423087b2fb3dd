"""Vision: ViT vs ToST vs XCiT vs CRATE vs CBT vs AoT vs CSP-ViT vs Fastmax-ViT at equal width/depth.

Each model is the paper's architecture (registered in ``attnzoo.models``) shrunk to the budget's width,
depth and heads, trained with the same optimiser and steps on (Fashion-)MNIST / digits. Reported:
validation accuracy, parameters, training images/s and the peak memory of one training step.
"""
from __future__ import annotations

import numpy as np

from attnzoo.reproduce import claims
from attnzoo.reproduce.common import (Context, Section, Table, fmt, load_trained, num_params, peak_train_mb,
                                      save_figure, train_defaults, train_run)
from attnzoo.reproduce.store import Step

KEY = "vision"
TITLE = "Vision: image classification"

#: name -> (registered model, mechanism, paper, extra model overrides)
MODELS: dict[str, tuple[str, str, str, dict]] = {
    "vit": ("vit_s", "softmax", "ViT/DeiT (baseline)", {}),
    "tost": ("tost_t", "tssa", "ToST", {}),
    "xcit": ("xcit_s", "xca", "XCiT (ToST's baseline)", {}),
    "crate": ("crate_t", "mssa", "CRATE (CBSA/AoT baseline)", {}),
    "cbt": ("cbt_t", "cbsa", "CBSA (CBT)", {}),
    "aot": ("aot_vision_b", "mssa", "AoT (attention only)", {}),
    "csp_vit": ("csp_vit_cifar", "csp", "CSP-ViT", {"mlp_dim": None, "dropout": 0.0}),
    "fastmax_vit": ("vit_s", "fastmax", "FAST (Fastmax p=2 in ViT)", {"attention": "fastmax",
                                                                    "attention_options": {"p": 2}}),
}

_IMAGE_SIZE = {"digits": 8, "mnist": 28, "fashion_mnist": 28}


def _csp_groups(n_tokens: int) -> int:
    """CSP's K: the largest divisor of N up to N/2 (CSP Table 5 uses K=32 for N=64, two tokens a group)."""
    best = 1
    for k in range(1, n_tokens // 2 + 1):
        if n_tokens % k == 0:
            best = k
    return best


def model_options(name: str, plan: dict) -> dict:
    """``create_model`` overrides of vision model ``name`` under a section plan (task sizes come from the task)."""
    if name not in MODELS:
        raise ValueError(f"unknown vision model {name!r}; valid: {sorted(MODELS)}")
    _, mech, _, extra = MODELS[name]
    opts = {**plan["arch"], **extra}
    if mech == "csp":
        img = plan["task_options"].get("img_size") or _IMAGE_SIZE.get(plan["task"], 28)
        n = (img // plan["arch"]["patch_size"]) ** 2
        opts["attention_options"] = {"groups": _csp_groups(n), "shift_schedule": "linear"}
    return opts


def plan_steps(plan: dict, seed: int) -> list[Step]:
    steps = []
    for name in plan["models"]:
        reg, mech, paper, _ = MODELS[name]
        train = dict(task=plan["task"], task_options=dict(plan["task_options"]), model=reg,
                     model_options=model_options(name, plan), seed=seed, **train_defaults(**plan["train"]))
        steps.append(Step(f"{KEY}/{name}", KEY, {"train": train, "mechanism": mech, "paper": paper}, _run, label=name))
    return steps


def classification_record(ctx: Context, step: Step) -> dict:
    """Train, then parameters and the peak memory of one training step (shared with the LRA section)."""
    from attnzoo.data import build_task

    cfg = step.config["train"]
    rec = train_run(ctx, step.id, cfg)
    model = load_trained(rec["run_dir"])
    task = build_task(cfg["task"], **cfg["task_options"])
    bs = min(cfg["batch_size"], len(task.train))
    inputs, target = task.train.get_batch(np.arange(bs))
    peak = peak_train_mb(model, inputs, target, task.kind, ctx.device)
    val = rec["val"]
    return {
        "accuracy": val.get("accuracy"),
        "val_loss": val.get("loss"),
        "params": num_params(model),
        "samples_per_s": rec["samples_per_s"],
        "steps_per_s": (rec["samples_per_s"] / cfg["batch_size"]) if rec["samples_per_s"] else None,
        "peak_train_mb": peak,
        "seq_len": task.info.get("seq_len"),
        "tokens": _tokens(model),
        "curve": rec["curve"],
        "run_dir": rec["run_dir"],
    }


def _tokens(model) -> int | None:
    grid = getattr(model, "grid", None)
    if grid is None:
        return None
    return int(grid[0] * grid[1]) + int(getattr(model, "num_prefix_tokens", 0))


def _run(ctx: Context, step: Step) -> dict:
    return classification_record(ctx, step)


def summarize(records: dict[str, dict], plan: dict, plots_dir, rel) -> Section:
    sec = Section(KEY, TITLE)
    rows, names = [], []
    for name in plan["models"]:
        rec = records.get(f"{KEY}/{name}")
        if rec is None:
            continue
        r = rec["result"]
        names.append(name)
        rows.append([name, MODELS[name][1], MODELS[name][2], fmt(r["params"], ","), fmt(_pct(r["accuracy"]), ".1f"),
                     fmt(r["samples_per_s"], ".0f"), fmt(r["peak_train_mb"], ".1f"), fmt(r["tokens"], "d"),
                     fmt(rec["wall_s"], ".0f")])
    arch = plan["arch"]
    sec.intro = (f"Task `{plan['task']}` ({_describe_task(plan)}); every model has width {arch['dim']}, depth "
                 f"{arch['depth']}, {arch['heads']} heads, patch {arch['patch_size']}, and trains for "
                 f"{plan['train']['steps']} steps of batch {plan['train']['batch_size']} with the same AdamW/cosine "
                 f"schedule (lr {plan['train']['lr']}), no augmentation. Parameters differ because each paper's "
                 "architecture keeps its own blocks (ISTA vs MLP, no MLP in AoT, class-attention in XCiT/ToST).")
    sec.tables.append(Table("Accuracy and cost", ["model", "mechanism", "paper", "params", "val acc %",
                                                  "train img/s", "peak train-step MiB", "tokens", "wall s"], rows))
    results = {n: records[f"{KEY}/{n}"]["result"] for n in names}
    sec.data = {"models": {n: {k: v for k, v in results[n].items() if k not in ("curve", "run_dir")} for n in names}}
    if names:
        path = plots_dir / "vision.png"
        save_figure(_plot(results, names), path)
        sec.plots.append((rel(path), "Validation accuracy, training throughput and peak memory of one training step."))
    sec.findings = _findings(results)
    return sec


def _describe_task(plan: dict) -> str:
    opts = plan["task_options"]
    if plan["task"] == "digits":
        return "scikit-learn 8x8 digits, 1,438 train / 359 validation images"
    n_tr = opts.get("n_train", 60000)
    n_va = opts.get("n_val", 10000)
    return f"{plan['task']}, {n_tr:,} train / {n_va:,} validation images, 28x28"


def _pct(x):
    return None if x is None else 100.0 * x


def _plot(results: dict, names: list[str]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    x = np.arange(len(names))
    for ax, key, label, scale in ((axes[0], "accuracy", "validation accuracy (%)", 100.0),
                                  (axes[1], "samples_per_s", "training images / s", 1.0),
                                  (axes[2], "peak_train_mb", "peak memory of a training step (MiB)", 1.0)):
        vals = [(results[n].get(key) or 0.0) * scale for n in names]
        ax.bar(x, vals, color=[f"C{i}" for i in range(len(names))])
        ax.set_xticks(x, names, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle("Vision models at equal width/depth")
    fig.tight_layout()
    return fig


def _findings(res: dict) -> list[dict]:
    acc = {n: _pct(r.get("accuracy")) for n, r in res.items()}
    out = []

    def cmp(a, b, kind, paper, claim, paper_value):
        if a in acc and b in acc:
            out.append(claims.compare(acc[a], acc[b], kind=kind, tol=claims.ACC_TOL, unit="pts", paper=paper,
                                      claim=claim, paper_value=paper_value, a_name=a, b_name=b))

    cmp("tost", "vit", "comparable", "ToST Table 2",
        "ToST is competitive with ViT at similar size", "ToST-S 77.9 vs ViT-S 79.8 ImageNet top-1 (-1.9 pts)")
    cmp("tost", "xcit", "comparable", "ToST Table 2",
        "ToST is competitive with XCiT (same skeleton, XCA attention)", "ToST-S 77.9 vs XCiT-S 80.5 (-2.6 pts)")
    cmp("cbt", "crate", "at_least", "CBSA Table 3",
        "CBT matches or beats CRATE", "CBT-B 73.4 vs CRATE-B 70.8 ImageNet top-1 (+2.6 pts)")
    cmp("aot", "crate", "comparable", "AoT Table 2 / §4.2",
        "attention-only AoT is competitive with CRATE despite no MLP",
        "AoT-B 70.2 vs CRATE-α-B 81.2 (-11 pts; the paper calls it comparable)")
    cmp("csp_vit", "vit", "at_least", "CSP Table 3",
        "CSP-ViT beats the MHA ViT", "CSP 84.81 vs MHA 81.90 CIFAR-10 top-1 (+2.9 pts)")
    cmp("fastmax_vit", "vit", "comparable", "FAST §3 / Table 1",
        "Fastmax keeps softmax attention's accuracy", "Fastmax2 57.90 vs softmax 57.37 LRA average (+0.5 pts)")
    return out
