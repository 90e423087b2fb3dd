"""The comparison's outputs: ``compare.md`` (tables and verdicts in words), ``compare.json`` (every number) and the
plots ``curves.png`` (validation curves, seed means, per row) and ``effects.png`` (each effect with its 95% interval).
"""

from __future__ import annotations

from pathlib import Path

from attnzoo._io import atomic_write_text, to_jsonable, write_json
from attnzoo.compare.common import (
    CURVE_NOTE,
    SWEEP_SEED_OFFSET,
    curve_text,
    fmt,
    md_table,
    plot_val_curves,
    save_figure,
)
from attnzoo.compare.plan import CompareSpec

__all__ = ["write_outputs", "OUTPUT_FILES"]

#: what a comparison writes at the top of its directory (together or not at all)
OUTPUT_FILES = ("compare.md", "compare.json", "curves.png", "effects.png")


def _rate(row: dict, spec: CompareSpec, untuned: str | None) -> str:
    """The tuned rate; at an end of the grid it says which end and whether that counts as tuned (a flat top)."""
    if row["tuned_lr"] is None:
        return "-"
    if not row["lr_at_edge"]:
        return f"{row['tuned_lr']:g}"
    end = "lowest" if row["tuned_lr"] == min(spec.lrs) else "highest"
    return f"{row['tuned_lr']:g} (the grid's {end}: {'not tuned' if untuned else 'a flat top, tuned'})"


def _effect_cell(f: dict | None) -> str:
    if f is None:
        return "(baseline)"
    if f.get("ci95") is None:
        return fmt(f.get("effect"), "+.4g")
    lo, hi = f["ci95"]
    return f"{f['effect']:+.4g} [{lo:+.4g}, {hi:+.4g}]"


def main_table(spec: CompareSpec, summary: dict) -> str:
    """One line per mechanism: metric, size, step time, tuned rate, effect with its interval, verdict."""
    rows = []
    for mech, r in summary["rows"].items():
        f = summary["findings"].get(mech)
        value = "-" if r["mean"] is None else (fmt(r["mean"], ".4g") + (f" ± {r['std']:.2g}" if r["std"] else ""))
        rows.append(
            [
                mech,
                f"{value} ({len(r['seeds'])} seeds)",
                fmt(r["params"], ","),
                fmt(r["step_ms"], ".1f"),
                _rate(r, spec, summary["untuned"].get(mech)),
                _effect_cell(f),
                "-" if f is None else f["reading"],
            ]
        )
    better = "higher" if spec.higher_is_better else "lower"
    headers = [
        "mechanism",
        f"val {spec.metric} ({better} is better)",
        "params",
        "step (ms)",
        "tuned lr",
        f"effect vs {spec.baseline} [95% CI]",
        "verdict",
    ]
    return md_table(headers, rows)


def _intro(spec: CompareSpec, meta: dict) -> list[str]:
    cfg = spec.base
    grid = ", ".join(f"{x:g}" for x in spec.lrs)
    m = meta.get("machine", {})
    return [
        f"# Mechanism comparison: {cfg['task']} / {cfg['model']}",
        "",
        f"Command: `{meta.get('command', '')}`",
        "",
        f"Task `{cfg['task']}` ({spec.source}), model `{cfg['model']}`, {spec.steps} steps at batch {cfg['batch_size']}"
        f", seeds {spec.seed_list}; each row's learning rate swept over {grid} on seed "
        f"{spec.seed + SWEEP_SEED_OFFSET} (base seed + {SWEEP_SEED_OFFSET}, not a reported seed), its seeds trained "
        f"at its best. Machine: {m.get('cpu', '?')} ({m.get('cpu_count', '?')} cores), {m.get('threads', '?')} torch "
        f"thread(s), device "
        f"{m.get('device', '?')}, {meta.get('jobs', 1)} job(s)"
        + (" (step times measured with other runs in parallel)" if meta.get("jobs", 1) > 1 else "")
        + ".",
        "",
    ]


def _rule(spec: CompareSpec, summary: dict) -> list[str]:
    f = next(iter(summary["findings"].values()), None)
    if f is None:
        return []
    kind = (
        f"non-inferiority with margin {spec.margin:g} {spec.metric}"
        if spec.margin is not None
        else "superiority (no --margin)"
    )
    lines = [f"**Rule**, {kind}: {f['rule']}. The effect is oriented so that positive favours the mechanism."]
    lines.append(
        "A comparison involving a row whose best rate lies at an end of the grid (beyond one seed standard deviation "
        "of its neighbour) is inconclusive: its optimum may lie beyond the grid."
    )
    return lines + [""]


def _plateau(spec: CompareSpec, summary: dict) -> list[str]:
    p = summary["plateau"]
    if p is None:
        return [
            "**Plateau**: not checked (the verdicts are at "
            f"{spec.steps} steps; `--replicate-baseline` trains {spec.baseline} at twice the steps and keeps only the "
            "verdicts that survive its change).",
            "",
        ]
    state = "plateaued" if p["plateaued"] else "not shown to plateau"
    return [f"**Plateau** ({spec.baseline} {state}): {p['text']}.", ""]


def render_markdown(spec: CompareSpec, summary: dict, meta: dict) -> str:
    """``compare.md``: the intro, the main table, the rule, the sweep, the plateau, curves and failures."""
    lines = _intro(spec, meta) + [main_table(spec, summary), ""] + _rule(spec, summary)
    for mech, f in summary["findings"].items():
        lines.append(f"- **{mech}**: {f['measured']}" + (f"; {f['gate']}" if f.get("gate") else ""))
    lines.append("")
    table = summary["sweep_table"]
    if table is not None:
        lines += [f"## {table.title}", "", table.markdown(), "", table.caption, ""]
    lines += _plateau(spec, summary)
    lines += ["## Learning curves", "", f"Validation {spec.metric}, seed means ({CURVE_NOTE}).", ""]
    lines += [f"- {m}: {curve_text(r['curve'], '.4g')}" for m, r in summary["rows"].items()]
    lines += ["", "![learning curves](curves.png)", "", "![effects](effects.png)", ""]
    if meta.get("failed"):
        lines += ["## Failed steps", ""] + [f"- `{sid}`: {why}" for sid, why in meta["failed"].items()] + [""]
    return "\n".join(lines)


def plot_effects(spec: CompareSpec, summary: dict):
    """Each mechanism's effect against the baseline with its 95% interval; zero and ``-margin`` marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    items = [(m, f) for m, f in summary["findings"].items() if f.get("effect") is not None]
    fig, ax = plt.subplots(figsize=(6.0, 0.6 * max(2, len(items)) + 1.2))
    for i, (_, f) in enumerate(items):
        lo, hi = f["ci95"] if f.get("ci95") else (f["effect"], f["effect"])
        ax.errorbar([f["effect"]], [i], xerr=[[f["effect"] - lo], [hi - f["effect"]]], fmt="o", capsize=4)
    ax.set_ylim(-0.6, len(items) - 0.4)
    ax.axvline(0.0, color="k", lw=0.8)
    if spec.margin is not None:
        ax.axvline(-spec.margin, color="C3", ls="--", lw=1, label=f"-margin ({spec.margin:g})")
        ax.legend(fontsize=8)
    ax.set_yticks(range(len(items)), [m for m, _ in items])
    ax.set_xlabel(f"effect on val {spec.metric} vs {spec.baseline} (positive favours the mechanism; 95% Welch CI)")
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def _curves_figure(curves: dict, spec: CompareSpec):
    """Every row's validation curve (seed means) against steps; an empty frame when no run logged one."""
    if any(curves.values()):
        return plot_val_curves([("", curves)], f"val {spec.metric}", "Validation curves (seed means)")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.2, 3.8))
    ax.set_title("no validation curve was logged")
    return fig


def write_outputs(out: Path, spec: CompareSpec, summary: dict, meta: dict, records: dict) -> None:
    """Write the plots, ``compare.json`` and ``compare.md`` (the caller makes them all-or-nothing)."""
    curves = {m: r["curve"] for m, r in summary["rows"].items()}
    if summary["rows"].get(spec.baseline, {}).get("curve_2x"):
        curves[f"{spec.baseline} (2x steps)"] = summary["rows"][spec.baseline]["curve_2x"]
    save_figure(_curves_figure(curves, spec), out / "curves.png")
    save_figure(plot_effects(spec, summary), out / "effects.png")
    table = summary["sweep_table"]
    doc = {
        **meta,
        "spec": to_jsonable(spec.__dict__),
        "rows": summary["rows"],
        "effects": {m: f.to_dict() for m, f in summary["findings"].items()},
        "untuned": summary["untuned"],
        "sweep_caption": table.caption if table is not None else None,
        "plateau": summary["plateau"],
        "steps": records,
    }
    write_json(out / "compare.json", doc)
    atomic_write_text(out / "compare.md", render_markdown(spec, summary, meta))
