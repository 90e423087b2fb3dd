"""``report.md`` (+ ``report.html``) and ``results.json`` from the step records and the section summaries."""

from __future__ import annotations

import html
import json
import os
import time
from collections import Counter
from pathlib import Path

from attnzoo._io import atomic_write_text, write_json
from attnzoo.reproduce.claims import GATE_REASONS, VERDICTS
from attnzoo.reproduce.common import Section, md_table
from attnzoo.reproduce.sections import SECTION_MODULES

__all__ = ["write_report", "FINDING_COLUMNS", "PLOTS_DIR", "CONFIGS_FILE", "effect_cell"]

PLOTS_DIR = "plots"
FINDING_COLUMNS = ["kind", "paper", "claim", "paper's figure", "measured here", "verdict", "seeds", "notes"]
SUMMARY_COLUMNS = ["paper", "claim", "effect [95% CI] (margin)", "verdict", "section"]
CONFIGS_FILE = "configs.md"
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


def effect_cell(f: dict) -> str:
    """``+1.2 pts [-0.3, +2.7] (margin 1.9)`` for a comparison; the measured text for a measurement."""
    if f.get("claim_type") is None or f.get("effect") is None:
        return f["measured"]
    ci = f.get("ci95")
    ci_txt = f" [{ci[0]:+.3g}, {ci[1]:+.3g}]" if ci else " (one seed: no CI)"
    margin = f" (margin {f['margin']:.3g})" if f.get("margin") else ""
    return f"{f['effect']:+.3g} {f.get('unit', '')}{ci_txt}{margin}"


def _findings_md(findings: list[dict], start: int = 1) -> tuple[str, list[str], int]:
    """The findings table with its notes (rule, gate, explanation) as numbered footnotes under it."""
    rows, notes = [], []
    for f in findings:
        refs = []
        for label, text in (("rule", f.get("rule")), ("gated", f.get("gate")), ("why", f.get("explanation"))):
            if text and text != "-":
                notes.append(f"[{start}] {label}: {text}")
                refs.append(f"[{start}]")
                start += 1
        verdict = _MARK[f["verdict"]]
        if f.get("ungated_verdict"):
            verdict += f" (numbers alone: {f['ungated_verdict']})"
        rows.append(
            [
                f.get("kind", "-") + (" (measurement)" if f.get("measurement") else ""),
                f["paper"],
                f["claim"],
                f["paper_value"],
                f["measured"],
                verdict,
                f.get("seeds", "-"),
                " ".join(refs) or "-",
            ]
        )
    return md_table(FINDING_COLUMNS, rows), notes, start


def _fmt_s(s: float) -> str:
    return f"{s / 60:.1f} min" if s >= 120 else f"{s:.0f} s"


def _is_trained(f: dict) -> bool:
    """A verdict on trained models over seeds: a comparison with an interval, or a per-seed rule such as "learns in
    context" (a trained result too: counted with the measurements, it would be missing from the trained tally)."""
    return bool(f.get("claim_type") or f.get("trained"))


def _summary(secs: list[Section], plan_name: str) -> list[str]:
    """The first screen: the paper claims as one table, one line per disagreement, then the checks' tally.
    Only ``kind: "paper"`` findings count in the headline."""
    allf = [(s.title.split(":")[0], f) for s in secs for f in s.findings]
    paper = [(t, f) for t, f in allf if f.get("kind") == "paper"]
    checks = [(t, f) for t, f in allf if f.get("kind") == "check"]
    counts = Counter(f["verdict"] for _, f in paper)
    trained = Counter(f["verdict"] for _, f in paper if _is_trained(f))
    decided = trained.get("agrees", 0) + trained.get("disagrees", 0)
    lines = _brief(paper, checks) + [
        f"**{len(paper)} claims of the five papers** tested: "
        + ", ".join(f"{counts.get(v, 0)} {v}" for v in VERDICTS)
        + f". Of them, {sum(trained.values())} rest on trained models over seeds (comparisons, and per-seed rules "
        "such as learning in context): "
        + (
            f"{trained.get('agrees', 0)} agree and {trained.get('disagrees', 0)} disagree"
            if decided
            else "**none of them is decided at this budget**"
        )
        + "; the other decided verdicts are measurements (timings, memory, parameter-free iterations, probes of "
        f"trained layers). {len(checks)} implementation checks are counted apart (table below). A comparison agrees "
        "when its whole 95% Welch-t interval lies on the paper's side of -margin, disagrees when it lies wholly on "
        "the other side, and is inconclusive otherwise. A swept row trains its reported seeds at the best rate of its "
        "own learning-rate sweep (run on a seed that is not reported; each sweep table says when its runs are shorter "
        "than the reported ones). A decided verdict is made inconclusive, with the numbers-alone verdict given in "
        "brackets, when a precondition fails: a row is not tuned (no sweep, an incomplete one, a best rate on an end "
        "of its grid not within a seed's spread of its neighbour, or no rate above chance), the verdict is not shown "
        "to survive more training (its interval clears the boundary by less than a side moves at twice the steps, or "
        "the comparison at twice the steps gives another verdict), a compared row did not learn the task, the paper's "
        "conditions are not met (sizes, the task, the configuration), or a control shows the same effect (an "
        "untrained model's layers; a model without attention inside the claim's margin).",
        "",
    ]
    lines += _gate_lines([f for _, f in paper], counts) + _scale_lines(secs)
    silent = [s for s in secs if not any(f.get("kind") == "paper" for f in s.findings)]
    lines += [f"- {s.title}: no paper claim decided here. {s.notes[0] if s.notes else ''}".rstrip() for s in silent]
    lines += ([""] if silent else []) + [
        md_table(
            SUMMARY_COLUMNS,
            [
                [
                    f["paper"],
                    f["claim"],
                    effect_cell(f),
                    _MARK[f["verdict"]] + (f" ({f['ungated_verdict']} ungated)" if f.get("ungated_verdict") else ""),
                    t,
                ]
                for t, f in paper
            ],
        ),
        "",
    ]
    dis = [(t, f) for t, f in paper if f["verdict"] == "disagrees"]
    if dis:
        lines += ["Disagreements:", ""]
        lines += [
            f"- *{f['paper']}* — {f['claim']}: {effect_cell(f)}. "
            + (f"Diagnosis: {f['explanation']}." if f.get("explanation") else "No ablation explains it yet.")
            for _, f in dis
        ]
        lines.append("")
    if checks:
        cc = Counter(f["verdict"] for _, f in checks)
        lines += [
            "Implementation checks: " + ", ".join(f"{cc.get(v, 0)} {v}" for v in VERDICTS if cc.get(v)) + ".",
            "",
            md_table(
                ["check", "measured", "verdict", "section"],
                [[f["claim"], f["measured"], _MARK[f["verdict"]], t] for t, f in checks],
            ),
            "",
        ]
    if plan_name == "smoke":
        lines += [
            "**This is a smoke run**: the models train for a handful of steps, so the verdicts above only show that "
            "the pipeline computes them; they say nothing about the papers.",
            "",
        ]
    return lines


def _brief(pairs: list[tuple[str, dict]], checks: list[tuple[str, dict]] = ()) -> list[str]:
    """Plain lines first: which trained comparisons were decided and how, how the measurements went, each section
    whose no-attention control is not shown to lose (its paper claims then test no token mixing), then each section's
    clearest effect in words. ``pairs``: (section, finding) of the paper claims."""
    paper = [f for _, f in pairs]
    trained = [f for f in paper if _is_trained(f)]
    measured = [f for f in paper if not _is_trained(f) and f["verdict"] != "not tested"]

    def named(verdict: str) -> str:
        hits = [f"{f['paper']} ({f['claim']})" for f in trained if f["verdict"] == verdict]
        return f"{len(hits)} {verdict.removesuffix('s')}" + (": " + "; ".join(hits) if hits else "")

    incon = [f for f in trained if f["verdict"] == "inconclusive"]
    gated = sum(1 for f in incon if f.get("ungated_verdict"))
    mc = Counter(f["verdict"] for f in measured)
    return [
        "**In brief.**",
        "",
        f"- Trained-model claims ({len(trained)}): {named('agrees')}.",
        f"- {named('disagrees')}.",
        f"- {len(incon)} inconclusive at this scale ({gated} of them decided by their intervals alone but gated by a "
        f"precondition below); of {len(measured)} measured claims (timings, memory, iterations, probes), "
        + ", ".join(f"{mc.get(v, 0)} {v}" for v in VERDICTS if v != "not tested" and mc.get(v))
        + ".",
        *[
            f"- {t}: attention is not shown to matter ({f['measured']}), so its paper claims are gated on conditions."
            for t, f in checks
            if f.get("gates_section")
        ],
        "- Every verdict holds at this report's scale (**Scale** below: models, data and steps far below the papers'), "
        "not at the papers' own.",
        "",
        *_effects_in_words(pairs),
    ]


def _num(x: float) -> str:
    return f"{x:.3g}"


def effect_in_words(f: dict) -> str:
    """A comparison's effect as a sentence: ``a`` ahead of / behind ``b`` by ``|effect|`` with its interval, in the
    finding's orientation (a positive effect favours ``a``)."""
    e, (lo, hi), unit = f["effect"], f["ci95"], f.get("unit", "")
    if lo < 0 < hi:  # no direction shown: the point estimate alone, and the interval's reach on both sides
        return (
            f"{f['a_name']} and {f['b_name']} differ by {e:+.3g} {unit}, no direction shown (95% CI from "
            f"{_num(-lo)} behind to {_num(hi)} ahead)"
        )
    near, far = sorted((abs(lo), abs(hi)))  # the interval on one side: its ends as distances on that side
    side = "ahead of" if e >= 0 else "behind"
    return f"{f['a_name']} is {side} {f['b_name']} by {_num(abs(e))} {unit} (95% CI {_num(near)} to {_num(far)})"


def _effects_in_words(paper: list[tuple[str, dict]]) -> list[str]:
    """Per section, the trained comparison whose effect is the most clearly away from zero (largest effect over the
    interval's half-width), in words, with its verdict: what the numbers say before any rule reads them."""
    best: dict[str, tuple[float, dict]] = {}  # section -> (effect over half-width, finding)
    for t, f in paper:
        if not (_is_trained(f) and f.get("ci95") and f.get("a_name") and f.get("b_name")):
            continue
        half = (f["ci95"][1] - f["ci95"][0]) / 2
        score = abs(f["effect"]) / half if half > 0 else float("inf")
        if t not in best or score > best[t][0]:
            best[t] = (score, f)
    if not best:
        return []
    lines = ["**The clearest effect per section** (the trained comparison farthest from zero for its interval):", ""]
    for t, (_, f) in best.items():
        verdict = f["verdict"] + (f" (numbers alone: {f['ungated_verdict']})" if f.get("ungated_verdict") else "")
        lines.append(f"- {t}: {effect_in_words(f)}; {f['paper']}, {f['claim']}: {verdict}.")
    return lines + [""]


def _gate_lines(paper: list[dict], counts: Counter) -> list[str]:
    """How many decided verdicts the gates made inconclusive, by reason (a finding's ``gate_reasons``)."""
    gated = [f for f in paper if f.get("ungated_verdict")]
    if not gated:
        return []
    n = {r: sum(r in f.get("gate_reasons", ()) for f in gated) for r in GATE_REASONS}
    return [
        f"{len(gated)} of the {counts.get('inconclusive', 0)} inconclusive verdicts would be decided by their "
        f"intervals alone but are gated: {n['plateau']} because they are not shown to survive more training (a "
        f"baseline or a compared row still moving, or the comparison changing at twice the steps), "
        f"{n['not tuned']} because a row is not tuned (no sweep, an incomplete one, a best rate at an end of the "
        f"grid not within a seed's spread of its neighbour, or no rate above chance), {n['did not learn']} because "
        "a compared row did not learn the task on "
        f"every seed, "
        f"{n['conditions']} because the paper's conditions are not met (sizes, the task, the configuration), "
        f"{n['control']} because a control shows the effect without what the claim credits (a verdict can have "
        "several reasons). They say the "
        "training budget or set-up is short of the claim, not that the claim holds or fails.",
        "",
    ]


def _scale_lines(secs: list[Section]) -> list[str]:
    """One line per trained section: its runs' scale against the papers' (``Section.scale``)."""
    scaled = [s for s in secs if s.scale]
    if not scaled:
        return []
    return [
        "**Scale.** These runs are laptop-sized, far below the papers' experiments; a verdict says what holds at "
        "this scale:",
        "",
        *[f"- {s.title.split(':')[0]}: {s.scale}" for s in scaled],
        "",
    ]


def _compute_md(secs: list[Section], records: dict) -> list[str]:
    """Step compute per section, split into the compared rows, the learning-rate sweeps and the ablations and
    plateau checks (rows named ``x@...``, ``x+...`` beyond the swaps, ``x-...``), with the time of each of those."""
    kinds = ("compared rows and measurements", "learning-rate sweeps", "ablations and plateau checks")
    per: dict = {}
    abl: Counter = Counter()
    for sid, r in records.items():
        row = "/".join(p for p in sid.split("/")[1:] if not p.startswith(("seed", "extra-seed")))
        if "/lr-sweep/" in sid:
            kind = kinds[1]
        elif "@" in row or any(t in row for t in ("-meanpool", "+ista", "+prenorm", "+softmax")):
            kind = kinds[2]
            abl[(r["section"], row)] += r.get("wall_s", 0.0)
        elif "/extra-seed" in sid and r["section"] == "vision":  # more seeds of two rows: an ablation of the spread
            kind = kinds[2]
            abl[(r["section"], f"{row} (extra seeds)")] += r.get("wall_s", 0.0)
        else:
            kind = kinds[0]
        per.setdefault(r["section"], Counter())[kind] += r.get("wall_s", 0.0)
    total = sum(sum(c.values()) for c in per.values()) or 1.0
    rows = []
    for s in secs:
        c = per.get(s.key, Counter())
        rows.append(
            [s.title.split(":")[0]]
            + [_fmt_s(c[k]) for k in kinds]
            + [_fmt_s(sum(c.values())), f"{100 * sum(c.values()) / total:.0f}%"]
        )
    lines = ["## Compute", "", md_table(["section", *kinds, "total", "share"], rows), ""]
    if abl:
        detail = [[sec, f"`{row}`", _fmt_s(v)] for (sec, row), v in sorted(abl.items(), key=lambda kv: -kv[1])]
        lines += ["Each ablation and plateau check:", "", md_table(["section", "row", "compute"], detail), ""]
    return lines


def write_report(
    out: Path,
    plan: dict,
    budget_name: str,
    seed: int,
    sections: list[str],
    records: dict,
    outcome,
    machine: dict,
    argv: list[str],
    workers: list[dict],
) -> None:
    secs = _summaries(out, plan, sections, records, outcome.failed)
    missing = getattr(outcome, "missing", [])
    for sec in secs:
        mine = [sid for sid in missing if sid.split("/", 1)[0] == sec.key]
        if mine:
            sec.notes.insert(
                0,
                f"{len(mine)} step(s) of this section's plan were not computed (report written with --report-only): "
                + ", ".join(f"`{sid}`" for sid in mine)
                + ". Findings that need them are not tested, untuned or not shown to plateau.",
            )
    compute_s = sum(r.get("wall_s", 0.0) for r in records.values())
    cmd = "attnzoo reproduce " + " ".join(argv) if argv else f"attnzoo reproduce --budget {budget_name} --out {out}"
    created = time.strftime("%Y-%m-%d %H:%M:%S")
    setup = _setup_rows(budget_name, plan, seed, cmd, machine, workers, compute_s, records, outcome, created)
    md = _report_md(secs, setup, budget_name, cmd, records)
    atomic_write_text(out / CONFIGS_FILE, "\n".join(_configs_md(seed, records)) + "\n")
    atomic_write_text(out / "report.md", "\n".join(md) + "\n")
    atomic_write_text(out / "report.html", _html(secs, setup, budget_name, _summary(secs, budget_name)))
    meta = {
        "budget": budget_name,
        "seed": seed,
        "command": cmd,
        "machine": machine,
        "workers": workers,
        "generated": created,
        "compute_s": compute_s,
        "invocation_wall_s": outcome.wall_s,
        "missing_steps": missing,
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
    workers: list[dict],
    compute_s: float,
    records: dict,
    outcome,
    created: str,
) -> list[list[str]]:
    return [
        ["budget", f"`{budget_name}`: {plan['description']}"],
        ["seed", str(seed)],
        ["command", f"`{cmd}`"],
        [
            "machine",
            f"{machine.get('cpu')} ({machine.get('cpu_count')} CPUs, "
            f"{machine.get('cpu_isa', 'vector ISA not recorded')}), {machine.get('gpu', 'no GPU')}",
        ],
        ["workers", _workers_cell(workers)],
        [
            "software",
            f"torch {machine.get('torch')}, Python {machine.get('python')}, numpy {machine.get('numpy')}, "
            f"{machine.get('platform')}",
        ],
        ["device", machine.get("device", "-")],
        [
            "wall time",
            f"{_fmt_s(compute_s)} of step compute in total ({len(records)} steps); {_clock_span(records)}; this "
            f"invocation {_fmt_s(outcome.wall_s)} ({len(outcome.computed)} computed, {len(outcome.skipped)} reused)",
        ],
        ["generated", created],
    ]


def _workers_cell(workers: list[dict]) -> str:
    """How this directory's steps were computed, as run.json recorded it: "J jobs x T threads" per setting (each
    worker process runs T torch threads), with its step count when invocations differed."""
    if not workers:
        return "not recorded (no step was computed in this directory by a run that records its workers)"

    def one(w: dict) -> str:
        jobs, threads = w.get("jobs"), w.get("threads")
        return f"{jobs} job{'s' * (jobs != 1)} x {threads} thread{'s' * (threads != 1)}"

    if len(workers) == 1:
        return one(workers[0])
    return "; ".join(f"{one(w)} ({w.get('steps', 0)} step{'s' * (w.get('steps', 0) != 1)})" for w in workers)


def _clock_span(records: dict) -> str:
    """The wall clock over which this directory's own steps ran (first start to last finish, imported steps left
    out): a re-rendered report (--report-only) still states how long computing it took. Pauses between invocations
    count, so it bounds the computing time from above."""
    own = [r for r in records.values() if not r.get("imported_from") and r.get("started") and r.get("finished")]
    if not own:
        return "no step computed in this directory"
    start = min(r["started"] for r in own)
    end = max(r["finished"] for r in own)
    fmt = "%Y-%m-%dT%H:%M:%S"
    span = time.mktime(time.strptime(end, fmt)) - time.mktime(time.strptime(start, fmt))
    return (
        f"its {len(own)} steps computed here ran from {start.replace('T', ' ')} to {end.replace('T', ' ')} "
        f"({_fmt_s(span)} of wall clock, first start to last finish)"
    )


def _report_md(secs: list[Section], setup: list, budget_name: str, cmd: str, records: dict) -> list[str]:
    """The lines of ``report.md``: summary first, then one part per section, compute, provenance."""
    md = [f"# attnzoo reproduce: the papers' comparisons at laptop scale (`{budget_name}` budget)", ""]
    if budget_name == "smoke":
        md += [
            "> **SMOKE RUN** — tiny models trained for a few steps to exercise every code path. The numbers below "
            "are not evidence for or against any paper; run `attnzoo reproduce --budget default` for that.",
            "",
        ]
    md += ["## Summary", ""] + _summary(secs, budget_name)
    md += ["## Contents", ""] + [f"- [{s.title}](#{_anchor(s.title)})" for s in secs]
    md += ["- [Compute](#compute)", "- [Provenance](#provenance)", ""]
    for s in secs:
        md += _section_md(s)
    md += _compute_md(secs, records)
    md += [
        "## Provenance",
        "",
        f"Every table, plot and verdict above was generated by `{cmd}` from the stored steps: "
        + _imported_text(records)
        + "Re-running it with the same `--out` reuses finished steps. Each step's exact configuration is in "
        f"[{CONFIGS_FILE}]({CONFIGS_FILE}) and in `results.json`.",
        "",
        md_table(["item", "value"], setup),
        "",
    ]
    return md


def _imported_text(records: dict[str, dict]) -> str:
    """Which steps were measured in this run and which were imported from earlier ones (``--reuse``)."""
    imported: dict[str, dict[str, int]] = {}
    for rec in records.values():
        if rec.get("imported_from"):
            by = imported.setdefault(rec["imported_from"], {})
            by[rec.get("section", "?")] = by.get(rec.get("section", "?"), 0) + 1
    if not imported:
        return "every step was measured in this run. "
    n = sum(sum(v.values()) for v in imported.values())
    parts = [
        f"`{src}` ({', '.join(f'{sec} {k}' for sec, k in sorted(by.items()))})" for src, by in sorted(imported.items())
    ]
    return (
        f"{len(records) - n} of {len(records)} steps were measured in this run; {n} were imported unchanged "
        f"(same configuration) from earlier runs with `--reuse`: {'; '.join(parts)}. Their figures, timings "
        "included, were measured there (each record's `imported_from` in `results.json`). "
    )


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
    plateau = s.data.get("plateau") if isinstance(s.data, dict) else None
    if plateau:
        items = plateau.values() if "text" not in plateau else [plateau]
        md += ["Plateau evidence: " + "; ".join(p["text"] for p in items) + ".", ""]
    if s.findings:
        table, notes, _ = _findings_md(s.findings)
        md += [f"### {s.title.split(':')[0]}: findings", "", table, ""]
        md += [n + "  " for n in notes] + [""]
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
                            f.get("kind", "-"),
                            f["paper"],
                            f["claim"],
                            f["paper_value"],
                            f["measured"],
                            f["verdict"],
                            f.get("seeds", "-"),
                            " ".join(x for x in (f.get("rule"), f.get("gate"), f.get("explanation")) if x) or "-",
                        ]
                        for f in s.findings
                    ],
                )
            )
    parts.append("<h2>Summary</h2><pre style='white-space:pre-wrap'>" + html.escape("\n".join(discussion)) + "</pre>")
    return "\n".join(parts) + "\n"
