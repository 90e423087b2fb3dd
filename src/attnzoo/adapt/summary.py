"""Tables and a plot of ``attnzoo adapt`` runs, for docs/adapt.md: every number read from the run directories.

    python -m attnzoo.adapt.summary RUN_DIR [RUN_DIR ...] [--plot PNG]

Per run: held-out perplexity of the teacher, the swapped model before training, after attention transfer and after
fine-tuning (with the adaptation tokens and training CPU seconds spent to get there), the ratio to the teacher, a
second held-out corpus where the run evaluated one (``--also-eval``), the held-out perplexity per corpus of a
mixture (``--data``, with the control of ``--control``), the perplexity curve where it evaluated every few steps
(``--eval-every``), and prefill and decoding time (``--prompt-lengths``).
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

__all__ = [
    "load_run",
    "perplexity_table",
    "curve_table",
    "generation_table",
    "per_corpus",
    "per_corpus_table",
    "plot_curves",
    "main",
]

#: the stage evaluations of a run, in order
STAGES = ("teacher", "swapped", "transfer", "finetune")


def load_run(run: str | Path) -> dict:
    """``{"name", "config", "evaluations", "generation", "evals"}`` of one run directory; ``evals`` are its
    ``metrics.csv`` evaluation rows in order (each with ``step``, ``stage``, ``tokens``, ``elapsed_s`` and its
    metrics, as floats)."""
    run = Path(run)
    for f in ("adapt.json", "results.json", "metrics.csv"):
        if not (run / f).is_file():
            raise FileNotFoundError(f"{run}: no {f}; is it an `attnzoo adapt` run directory?")
    config = json.loads((run / "adapt.json").read_text())
    results = json.loads((run / "results.json").read_text())
    with open(run / "metrics.csv", newline="") as f:
        evals = [
            {k: (v if k == "stage" else float(v)) for k, v in r.items() if v not in ("", None) and k != "split"}
            for r in csv.DictReader(f)
            if r["split"] == "eval"
        ]
    return {
        "name": run.name,
        "config": config,
        "evaluations": results.get("evaluations", {}),
        "generation": results.get("generation"),
        "per_corpus": results.get("per_corpus"),
        "evals": evals,
    }


def _mechanism(r: dict) -> str:
    cfg = r["config"].get("config", r["config"])
    opts = ", ".join(f"{k}={v}" for k, v in sorted(cfg.get("options", {}).items()))
    return cfg.get("mechanism", "?") + (f" ({opts})" if opts else "")


def _at(r: dict, stage: str) -> dict | None:
    return next((e for e in r["evals"] if e["stage"] == stage), None)


def perplexity_table(runs: list[dict], metric: str = "perplexity") -> str:
    """Markdown: one row per run, the stage perplexities (tokens and CPU seconds where a stage trained) and the
    final / teacher ratio. ``metric``: ``perplexity`` or a second corpus's (e.g. ``imdb_perplexity``)."""
    head = "| run | mechanism | teacher | swapped | after transfer (tokens, CPU s) | after fine-tune (tokens, CPU s) |"
    lines = [head + " final / teacher |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in runs:
        ev = r["evaluations"]
        cells = []
        for stage in STAGES:
            v = ev.get(stage, {}).get(metric)
            row = _at(r, stage)
            if v is None:
                cells.append("-")
            elif stage in ("transfer", "finetune") and row is not None:
                cells.append(f"{v:,.1f} ({int(row.get('tokens', 0)):,}, {row.get('elapsed_s', 0.0):,.0f})")
            else:
                cells.append(f"{v:,.1f}")
        final = next((ev[s][metric] for s in ("finetune", "transfer") if metric in ev.get(s, {})), None)
        teacher = ev.get("teacher", {}).get(metric)
        ratio = f"{final / teacher:.2f}x" if final is not None and teacher else "-"
        lines.append(f"| {r['name']} | {_mechanism(r)} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines)


def curve_table(r: dict, metric: str = "perplexity") -> str:
    """Markdown: a run's evaluations in order, with the tokens and CPU seconds at each."""
    lines = ["| evaluation | step | tokens | CPU s | " + metric + " |", "|---|---:|---:|---:|---:|"]
    for e in r["evals"]:
        if metric in e:
            lines.append(
                f"| {e['stage']} | {int(e['step'])} | {int(e.get('tokens', 0)):,} | {e.get('elapsed_s', 0.0):,.0f} | "
                f"{e[metric]:,.1f} |"
            )
    return "\n".join(lines)


def generation_table(runs: list[dict]) -> str:
    """Markdown: prefill seconds and greedy decoding time per token (and tokens/s) after each prompt length, for
    each model a run timed (teacher, control, student)."""
    head = "| run | model | prompt tokens | prefill s | decode ms/token | decode tokens/s |"
    lines = [head, "|---|---|---:|---:|---:|---:|"]
    for r in runs:
        for who, rows in (r["generation"] or {}).items():
            for g in rows:
                per_token = g.get("decode_s_per_token", 1 / g["decode_tokens_per_s"])
                lines.append(
                    f"| {r['name']} | {who} | {g['context']} | {g['prefill_s']:.3f} | {1e3 * per_token:.1f} | "
                    f"{g['decode_tokens_per_s']:.1f} |"
                )
    return "\n".join(lines)


#: the columns of the per-corpus table: evaluation name -> column heading
COLUMNS = {
    "teacher": "teacher",
    "control": "control (teacher fine-tuned)",
    "swapped": "swapped",
    "transfer": "after transfer",
    "finetune": "after fine-tune",
}


def per_corpus(evaluations: dict[str, dict[str, float]], corpora: dict[str, str]) -> dict[str, dict[str, float]]:
    """``{corpus: {evaluation: held-out perplexity}}`` from the run's evaluations (columns of :data:`COLUMNS` that
    ran)."""
    table: dict[str, dict[str, float]] = {}
    for name, pre in corpora.items():
        key = f"{pre}perplexity"
        table[name] = {col: evaluations[col][key] for col in COLUMNS if key in evaluations.get(col, {})}
    return table


def per_corpus_table(table: dict[str, dict[str, float]]) -> str:
    """Markdown: one row per corpus, its held-out perplexity per evaluation."""
    cols = [c for c in COLUMNS if any(c in row for row in table.values())]
    lines = ["| corpus | " + " | ".join(COLUMNS[c] for c in cols) + " |", "|---|" + "---:|" * len(cols)]
    for name, row in table.items():
        cells = [f"{row[c]:,.1f}" if c in row else "-" for c in cols]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_curves(runs: list[dict], png: str | Path, metric: str = "perplexity") -> Path:
    """Held-out ``metric`` against adaptation tokens (left) and training CPU seconds (right), one line per run, the
    teacher's as a dashed line per run; log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attnzoo._io import atomic_save_figure

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for i, r in enumerate(runs):
        pts = [e for e in r["evals"] if metric in e and e["stage"] not in ("teacher",)]
        teacher = r["evaluations"].get("teacher", {}).get(metric)
        for ax, key in zip(axes, ("tokens", "elapsed_s"), strict=True):
            ax.plot([e.get(key, 0.0) for e in pts], [e[metric] for e in pts], "o-", color=f"C{i}", label=r["name"])
            if teacher:
                ax.axhline(teacher, color=f"C{i}", ls="--", lw=0.8)
    for ax, xl in zip(axes, ("adaptation tokens", "training CPU seconds"), strict=True):
        ax.set_xlabel(xl)
        ax.set_ylabel(f"held-out {metric}")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Adaptation: held-out perplexity (dashed: each run's teacher)")
    fig.tight_layout()
    png = Path(png)
    atomic_save_figure(fig, png)
    plt.close(fig)
    return png


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="`attnzoo adapt` run directories")
    ap.add_argument("--plot", default=None, help="write the perplexity curves to this PNG")
    a = ap.parse_args(argv)
    runs = [load_run(r) for r in a.runs]
    print(perplexity_table(runs))
    others = sorted({k for r in runs for v in r["evaluations"].values() for k in v if k.endswith("_perplexity")})
    for m in others:
        print(f"\n{m}:\n\n" + perplexity_table(runs, m))
    for r in runs:
        if any("@" in e["stage"] for e in r["evals"]):
            print(f"\n{r['name']}:\n\n" + curve_table(r))
    for r in runs:
        if r["per_corpus"]:
            print(f"\n{r['name']}, held-out perplexity per corpus:\n\n" + per_corpus_table(r["per_corpus"]))
    if any(r["generation"] for r in runs):
        print("\n" + generation_table(runs))
    if a.plot:
        print(f"\nplot: {plot_curves(runs, a.plot)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
