"""``report.md`` (+ ``report.html``) and ``results.json`` from the step records and the section summaries."""

from __future__ import annotations

import html
import json
import os
import time
from collections import Counter
from pathlib import Path

from attnzoo._io import atomic_write_text, write_json
from attnzoo.reproduce.claims import ACC_TOL
from attnzoo.reproduce.common import Section, md_table
from attnzoo.reproduce.sections import SECTION_MODULES

__all__ = ["write_report", "FINDING_COLUMNS", "PLOTS_DIR"]

PLOTS_DIR = "plots"
FINDING_COLUMNS = [
    "paper",
    "claim",
    "paper's figure",
    "measured here",
    "verdict",
    "seeds",
    "rule",
    "explanation (ablation)",
]
_MARK = {"agrees": "agrees", "disagrees": "**disagrees**", "inconclusive": "inconclusive", "not tested": "not tested"}


def _summaries(out: Path, plan: dict, sections: list[str], records: dict, failed: dict) -> list[Section]:
    plots_dir = out / PLOTS_DIR
    plots_dir.mkdir(parents=True, exist_ok=True)

    def rel(p) -> str:
        return Path(os.path.relpath(p, out)).as_posix()

    result = []
    for key in sections:
        mod = SECTION_MODULES[key]
        recs = {sid: r for sid, r in records.items() if r["section"] == key}
        try:
            sec = mod.summarize(recs, plan[key], plots_dir, rel)
        except Exception as e:  # noqa: BLE001 - a broken summary must not hide the other sections
            sec = Section(key, mod.TITLE, notes=[f"summary failed: {type(e).__name__}: {e}"])
        for sid, why in failed.items():
            if sid.split("/", 1)[0] == key:
                sec.notes.append(f"step `{sid}` failed: {why}")
        result.append(sec)
    return result


def _findings_md(findings: list[dict]) -> str:
    rows = [
        [
            f["paper"],
            f["claim"],
            f["paper_value"],
            f["measured"],
            _MARK[f["verdict"]],
            f.get("seeds", "-"),
            f["rule"],
            f.get("explanation") or "-",
        ]
        for f in findings
    ]
    return md_table(FINDING_COLUMNS, rows)


def _fmt_s(s: float) -> str:
    return f"{s / 60:.1f} min" if s >= 120 else f"{s:.0f} s"


def _discussion(secs: list[Section], plan_name: str, plan: dict) -> list[str]:
    """The closing discussion, built from the verdicts (nothing here is written before the numbers exist)."""
    allf = [(s.title, f) for s in secs for f in s.findings]
    counts = Counter(f["verdict"] for _, f in allf)
    lines = [
        f"Of {len(allf)} checks against the papers' claims: "
        + ", ".join(f"{counts.get(v, 0)} {v}" for v in ("agrees", "disagrees", "inconclusive", "not tested"))
        + "."
    ]
    dis = [(t, f) for t, f in allf if f["verdict"] == "disagrees"]
    agr = [(t, f) for t, f in allf if f["verdict"] == "agrees"]
    if agr:
        lines.append("")
        lines.append("Where the small-scale numbers agree with the papers:")
        lines += [f"- *{f['paper']}* — {f['claim']}: {f['measured']}." for _, f in agr]
    if dis:
        lines.append("")
        lines.append("Where they disagree:")
        lines += [
            f"- *{f['paper']}* — {f['claim']}: {f['measured']} (paper: {f['paper_value']})."
            + (f" Diagnosis: {f['explanation']}." if f.get("explanation") else " No ablation explains it yet.")
            for _, f in dis
        ]
    inc = [(t, f) for t, f in allf if f["verdict"] in ("inconclusive", "not tested")]
    if inc:
        lines.append("")
        lines.append("Not decided by this run:")
        lines += [
            f"- *{f['paper']}* — {f['claim']}: {f['measured']} ({f['verdict']})."
            + (f" Diagnosis: {f['explanation']}." if f.get("explanation") else "")
            for _, f in inc
        ]
    v = plan["vision"]
    seeds = sorted({plan[k].get("seeds", 1) for k in ("vision", "long-range", "language", "icl")})
    lines += [
        "",
        f"Caveats (from this run's configuration): every trained figure rests on {'/'.join(map(str, seeds))} "
        f"seed(s) of a model with width {v['arch']['dim']} and depth {v['arch']['depth']} (vision) trained for "
        f"{v['train']['steps']} steps, against the papers' ImageNet/LRA/OpenWebText runs of hours to days on "
        "GPUs with tuned hyper-parameters; all models of a section share one untuned optimiser setting. "
        "A verdict "
        "'disagrees' needs the paper's direction contradicted by more than two standard errors of the "
        "difference of the seed means, so with one seed a contradiction is reported as inconclusive; the "
        f"tolerance of 'comparable' accuracy claims is {ACC_TOL:g} points. Timings come from a shared CPU and "
        "vary between runs; accuracies and losses are reproducible for a seed.",
    ]
    if plan_name == "smoke":
        lines += [
            "",
            "**This is a smoke run**: the models train for a handful of steps, so the verdicts above only "
            "show that the pipeline computes them; they say nothing about the papers.",
        ]
    return lines


def write_report(
    out: Path,
    plan: dict,
    budget_name: str,
    seed: int,
    sections: list[str],
    steps: list,
    records: dict,
    outcome,
    machine: dict,
    argv: list[str],
    threads: int,
) -> None:
    secs = _summaries(out, plan, sections, records, outcome.failed)
    compute_s = sum(r.get("wall_s", 0.0) for r in records.values())
    cmd = "attnzoo reproduce " + " ".join(argv) if argv else f"attnzoo reproduce --budget {budget_name} --out {out}"
    created = time.strftime("%Y-%m-%d %H:%M:%S")
    setup = _setup_rows(budget_name, plan, seed, cmd, machine, threads, compute_s, records, outcome, created)
    md = _report_md(secs, setup, budget_name, plan, seed, cmd, records)
    atomic_write_text(out / "report.md", "\n".join(md) + "\n")
    atomic_write_text(out / "report.html", _html(secs, setup, budget_name, _discussion(secs, budget_name, plan)))
    meta = {
        "budget": budget_name,
        "seed": seed,
        "command": cmd,
        "machine": machine,
        "threads": threads,
        "generated": created,
        "compute_s": compute_s,
        "invocation_wall_s": outcome.wall_s,
        "sections": [s.key for s in secs],
        "plan": plan,
    }
    write_json(out / "results.json", _results_payload(meta, secs, records, outcome.failed))


def _setup_rows(
    budget_name: str,
    plan: dict,
    seed: int,
    cmd: str,
    machine: dict,
    threads: int,
    compute_s: float,
    records: dict,
    outcome,
    created: str,
) -> list[list[str]]:
    return [
        ["budget", f"`{budget_name}`: {plan['description']}"],
        ["seed", str(seed)],
        ["command", f"`{cmd}`"],
        ["machine", f"{machine.get('cpu')} ({machine.get('cpu_count')} CPUs), {machine.get('gpu', 'no GPU')}"],
        ["torch threads", str(threads)],
        [
            "software",
            f"torch {machine.get('torch')}, Python {machine.get('python')}, numpy {machine.get('numpy')}, "
            f"{machine.get('platform')}",
        ],
        ["device", machine.get("device", "-")],
        [
            "wall time",
            f"{_fmt_s(compute_s)} of step compute in total ({len(records)} steps); this invocation "
            f"{_fmt_s(outcome.wall_s)} ({len(outcome.computed)} computed, {len(outcome.skipped)} reused)",
        ],
        ["generated", created],
    ]


def _report_md(
    secs: list[Section], setup: list, budget_name: str, plan: dict, seed: int, cmd: str, records: dict
) -> list[str]:
    """The lines of ``report.md``: header, contents, setup, one part per section, discussion, run configs."""
    md = [f"# attnzoo reproduce: the papers' comparisons at laptop scale (`{budget_name}` budget)", ""]
    if budget_name == "smoke":
        md += [
            "> **SMOKE RUN** — tiny models trained for a few steps to exercise every code path. The numbers below "
            "are not evidence for or against any paper; run `attnzoo reproduce --budget default` for that.",
            "",
        ]
    md += [
        f"Every table, plot and verdict below was generated from this run's own measurements by `{cmd}`. "
        "Re-running the command with the same `--out` reuses finished steps and recomputes nothing.",
        "",
    ]
    md += ["## Contents", ""] + [f"- [{s.title}](#{_anchor(s.title)})" for s in secs]
    md += [
        "- [Agreement with the papers](#agreement-with-the-papers)",
        "- [Run configurations](#run-configurations)",
        "",
    ]
    md += ["## Setup", "", md_table(["item", "value"], setup), ""]
    for s in secs:
        md += _section_md(s)
    md += ["## Agreement with the papers", ""] + _discussion(secs, budget_name, plan) + [""]
    return md + _configs_md(seed, records)


def _section_md(s: Section) -> list[str]:
    md = [f"## {s.title}", ""]
    if s.intro:
        md += [s.intro, ""]
    for t in s.tables:
        md += [f"### {t.title}", "", t.markdown(), ""]
        if t.caption:
            md += [t.caption, ""]
    for path, caption in s.plots:
        alt = caption.replace("[", "").replace("]", "")  # brackets would end the image's alt text
        md += [f"![{alt}]({path})", "", f"*{caption}*", ""]
    if s.findings:
        md += [f"### {s.title.split(':')[0]}: agreement with the papers", "", _findings_md(s.findings), ""]
    for n in s.notes:
        md += [f"> {n}", ""]
    return md


def _configs_md(seed: int, records: dict) -> list[str]:
    md = [
        "## Run configurations",
        "",
        "Each step is one training run or one measurement, stored in `steps/<id>.json` with its exact config "
        f"(the trainer's `config.yaml` and `metrics.csv` are in `runs/<id>/`). Base seed {seed}: a step "
        f"`<row>/seed<k>` is the run of that row with seed k (seeds {seed}, {seed}+1, ... per section); the other "
        f"steps use seed {seed}.",
        "",
    ]
    cfg_rows = [
        [f"`{sid}`", rec.get("config_hash", ""), f"{rec.get('wall_s', 0):.1f}", rec.get("finished", "")]
        for sid, rec in records.items()
    ]
    md += [md_table(["step", "config hash", "wall s", "finished"], cfg_rows), ""]
    for sid, rec in records.items():
        md += [
            f"<details><summary><code>{sid}</code></summary>",
            "",
            "```json",
            json.dumps(rec.get("config", {}), indent=1, sort_keys=True),
            "```",
            "",
            "</details>",
            "",
        ]
    return md


def _results_payload(meta: dict, secs: list[Section], records: dict, failed: dict) -> dict:
    return {
        "meta": meta,
        "sections": {
            s.key: {
                "title": s.title,
                "data": s.data,
                "findings": s.findings,
                "notes": s.notes,
                "tables": [{"title": t.title, "headers": t.headers, "rows": t.rows} for t in s.tables],
                "plots": [p for p, _ in s.plots],
            }
            for s in secs
        },
        "steps": {
            sid: {"section": r["section"], "config": r["config"], "result": r["result"], "wall_s": r["wall_s"]}
            for sid, r in records.items()
        },
        "failed": failed,
    }


def _anchor(title: str) -> str:
    keep = "".join(c for c in title.lower() if c.isalnum() or c in " -")
    return keep.replace(" ", "-")


def _html_table(headers, rows) -> str:
    h = "".join(f"<th>{html.escape(str(x))}</th>" for x in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"


def _html(secs: list[Section], setup, budget_name: str, discussion: list[str]) -> str:
    parts = [
        "<!doctype html><meta charset='utf-8'><title>attnzoo reproduce</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse;"
        "margin:8px 0}td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}img{max-width:100%}</style>",
        f"<h1>attnzoo reproduce ({html.escape(budget_name)} budget)</h1>",
        "<h2>Setup</h2>",
        _html_table(["item", "value"], setup),
    ]
    for s in secs:
        parts.append(f"<h2>{html.escape(s.title)}</h2><p>{html.escape(s.intro)}</p>")
        for t in s.tables:
            parts.append(f"<h3>{html.escape(t.title)}</h3>" + _html_table(t.headers, t.rows))
        for p, cap in s.plots:
            parts.append(f"<figure><img src='{html.escape(p)}'><figcaption>{html.escape(cap)}</figcaption></figure>")
        if s.findings:
            parts.append(
                "<h3>Agreement with the papers</h3>"
                + _html_table(
                    FINDING_COLUMNS,
                    [
                        [
                            f["paper"],
                            f["claim"],
                            f["paper_value"],
                            f["measured"],
                            f["verdict"],
                            f.get("seeds", "-"),
                            f["rule"],
                            f.get("explanation") or "-",
                        ]
                        for f in s.findings
                    ],
                )
            )
    parts.append(
        "<h2>Agreement with the papers</h2><pre style='white-space:pre-wrap'>"
        + html.escape("\n".join(discussion))
        + "</pre>"
    )
    return "\n".join(parts) + "\n"
