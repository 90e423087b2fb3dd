"""``report.md`` (and ``report.html``, its rendering) and ``results.json`` from the step records and summaries."""

from __future__ import annotations

import html
import itertools
import json
import os
import time
from collections import Counter
from pathlib import Path

from markdown_it import MarkdownIt

from attnzoo._io import atomic_write_text, write_json
from attnzoo.compare import claims
from attnzoo.compare.claims import FINDING_SCHEMA, GATES, REFUTE_FRACTION, STRICT_LEVEL, VERDICTS, Finding
from attnzoo.compare.common import Section, md_table
from attnzoo.reproduce import paper_claims
from attnzoo.reproduce.sections import SECTION_MODULES
from attnzoo.reproduce.tally import CAUSES, ClaimResult, tally

__all__ = ["write_report", "html_page", "FINDING_COLUMNS", "PLOTS_DIR", "CONFIGS_FILE", "effect_cell"]

PLOTS_DIR = "plots"
FINDING_COLUMNS = ["check", "expected", "measured here", "verdict [notes]"]
CLAIMS_COLUMNS = ["claim (paper)", "statement", "paper's figure", "test: effect [95% CI] (margin)"]
CLAIMS_COLUMNS += ["verdict [notes]", "section"]
CONFIGS_FILE = "configs.md"
_MARK = {"agrees": "agrees", "disagrees": "**disagrees**", "inconclusive": "inconclusive", "not tested": "not tested"}


def _summaries(out: Path, plan: dict, sections: list[str], records: dict, outcome) -> list[Section]:
    """Each section's summary of its stored steps, with the steps that failed or were not computed."""
    plots_dir = out / PLOTS_DIR
    plots_dir.mkdir(parents=True, exist_ok=True)
    result = []
    for key in sections:
        mod = SECTION_MODULES[key]
        mine = {sid: r for sid, r in records.items() if r["section"] == key}
        try:
            sec = mod.summarize(mine, plan[key], plots_dir, lambda p: Path(os.path.relpath(p, out)).as_posix())
        except Exception as e:  # noqa: BLE001 - a broken summary must not hide the other sections
            sec = Section(key, mod.TITLE, notes=[f"summary failed: {type(e).__name__}: {e}"])
        _claim_notes(sec, plan[key].get("claim_notes", {}))
        _caveats(sec, plan[key].get("caveats", {}))
        sec.notes += [f"step `{sid}` failed: {why}" for sid, why in outcome.failed.items() if sid.startswith(f"{key}/")]
        if missing := [f"`{sid}`" for sid in outcome.missing if sid.startswith(f"{key}/")]:
            sec.notes.insert(
                0,
                f"{len(missing)} step(s) of this section's plan were not computed (report written with --report-only): "
                f"{', '.join(missing)}. Findings that need them are not tested, untuned or not shown to plateau.",
            )
        result.append(sec)
    return result


def _claim_notes(sec: Section, notes: dict[str, str]) -> None:
    """A plan's dated pilot on a claim (``claim_notes``: claim id -> the figures and the command that re-measures
    them) under each of the section's findings of that claim: evidence beside the run's, never part of its verdict."""
    _plan_words(sec, notes, "dated_pilot", "dated pilot")


def _caveats(sec: Section, caveats: dict[str, str]) -> None:
    """A plan's caveat on a claim (``caveats``: claim id -> how the plan came to its evidence, e.g. a seed count
    chosen after a reading was seen): under the claim and on the first screen, never part of its verdict."""
    _plan_words(sec, caveats, "caveat", "caveat")


def _plan_words(sec: Section, texts: dict[str, str], field: str, label: str) -> None:
    """``texts[claim id]`` (or its base id's) into ``field`` of each of that claim's findings and their footnote."""
    for f in sec.findings:
        if text := texts.get(f.claim_id) or texts.get(paper_claims.base_id(f.claim_id)):
            f[field] = " ".join(text.split())
            claims.explain(f, f"{label}: {f[field]}")


def effect_cell(f: dict) -> str:
    """``+1.2 pts [-0.3, +2.7] (margin 1.9)`` for a comparison (a refuted superiority's bar: ``(refuted below
    +1.3)``); the measured text for a measurement."""
    if f.get("claim_type") is None or f.get("effect") is None:
        return f["measured"]
    ci = f.get("ci95")
    ci_txt = f" [{ci[0]:+.3g}, {ci[1]:+.3g}]" if ci else " (one seed: no CI)"
    margin = f" (margin {f['margin']:.3g})" if f.get("margin") else ""
    if not margin and f.get("refute_below") is not None:
        margin = f" (refuted below {f['refute_below']:+.3g})"
    return f"{f['effect']:+.3g} {f.get('unit', '')}{ci_txt}{margin}"


def _blank_repeats():
    """``once(column, value)``: the value, or "" when it equals the row above's in that column (read as "the same")."""
    last: dict[str, str] = {}

    def once(column: str, value: str) -> str:
        same = last.get(column) == value
        last[column] = value
        return "" if same else value

    return once


def _findings_md(findings: list[dict]) -> tuple[str, list[str]]:
    """A section's implementation checks with their numbered notes; a per-item check is one row (:func:`_group_row`)."""
    rows, seen, once = [], {}, _blank_repeats()
    for _, run in itertools.groupby(findings, _item_key):
        group = list(run)
        f = group[0]
        row = _group_row(group) if len(group) > 1 else [f["claim"], f["measured"], _verdict_cell(f)]
        rows.append([row[0], once("paper_value", f["paper_value"]), row[1], row[2] + _note_refs(f, seen)])
    return md_table(FINDING_COLUMNS, rows), _notes(seen)


def _item_key(f: dict) -> object:
    """Findings of one per-item check with one rule and no gate or explanation share a key; others get their own."""
    cid = f.get("claim_id") or ""
    alone = not paper_claims.test_of(cid) or f.get("gate") or f.get("explanation") or f.get("claim_type")
    if alone or not getattr(paper_claims.get(cid), "per", ""):
        return object()
    return paper_claims.base_id(cid), f.get("rule"), f["paper_value"]


def _group_row(group: list[dict]) -> list[str]:
    """``[check, measured, verdict]`` of a per-item check: "each <item>" in its statement, each item's figure (a
    suffix they all share said once) and each item's verdict (one word when they all agree on it)."""
    rec = paper_claims.get(group[0]["claim_id"])
    items = [paper_claims.test_of(f["claim_id"]) for f in group]
    tail = os.path.commonprefix([f["measured"][::-1] for f in group])[::-1]
    shared = tail[tail.find(" ") :] if " " in tail else ""  # the longest whole-word ending all the figures share
    cut = [f["measured"][: len(f["measured"]) - len(shared)] for f in group]
    figures = ", ".join(f"{i} {m}" for i, m in zip(items, cut, strict=True))
    verdicts = [_verdict_cell(f) for f in group]
    if len(set(verdicts)) == 1:
        verdict = f"{verdicts[0]} (all {len(group)})"
    else:
        verdict = "; ".join(f"{i}: {v}" for i, v in zip(items, verdicts, strict=True))
    return [rec.statement.format(**{rec.per: f"each {rec.per}"}), figures + shared, verdict]


def _note_refs(f: dict, seen: dict[tuple[str, str], int], rule=None) -> str:
    """`` [n] [m]`` after a verdict (empty without notes): the finding's rule (``rule(f)``, by default
    :func:`_own_rule`), gate, explanation and confound, each numbered in ``seen`` (``(label, text) -> n``) when first
    met."""
    refs = ""
    confound = f.get("confound") and f"an architecture comparison: {f['confound']}"
    notes = (("rule", (rule or _own_rule)(f)), ("gated", f.get("gate")), ("why", f.get("explanation")))
    for label, text in (*notes, ("confound", confound)):
        if text and text != "-":
            refs += f" [{seen.setdefault((label, text), len(seen) + 1)}]"
    return refs


def _notes(seen: dict[tuple[str, str], int]) -> list[str]:
    """The numbered notes of :func:`_note_refs`, in order."""
    return [f"[{n}] {label}: {text}" for (label, text), n in seen.items()]


def _verdict_cell(f: dict) -> str:
    return _MARK[f["verdict"]] + (f" ({f['ungated_verdict']} ungated)" if f.get("ungated_verdict") else "")


def _own_rule(f: dict) -> str | None:
    """What a finding's rule says beyond the legend: a margin and its source, a refuting bar, a measurement's rule."""
    if not f.get("claim_type"):
        return f.get("rule")
    if f.get("margin"):
        rel = f" ({f['margin_rel']:g} of {f['b_name']}'s mean)" if f.get("margin_rel") is not None else ""
        return f"margin {f['margin']:.3g} {f.get('unit', '')}{rel}: {f.get('margin_source', '')}"
    if f.get("refute_below") is not None:
        return f"refuted below {f['refute_below']:+.3g} (E = {f['paper_effect']:+.3g})"
    return None


def _table_rule(f: dict) -> str | None:
    """The claims table's rule note: a margin's source only (the effect cell prints the margin or refuting bar), and
    none where the margin is the paper's own gap for the pair (its record's paper effect, read as a gap called
    comparable by the legend), which the paper's figure shows."""
    if not f.get("claim_type") or f.get("effect") is None:
        return _own_rule(f)
    if not f.get("margin"):
        return None
    rel, rec = f.get("margin_rel"), paper_claims.get(f["claim_id"]) if f.get("claim_id") else None
    effect = getattr(rec, "paper_effect", None)
    if effect is not None and rel is None and abs(effect) == rec.margin == f["margin"]:
        return None
    return (f"{rel:g} of {f['b_name']}'s mean: " if rel is not None else "") + f.get("margin_source", "")


def _fmt_s(s: float) -> str:
    return f"{s / 60:.1f} min" if s >= 120 else f"{s:.0f} s"


def _short_title(title: str) -> str:
    """A section's title without its subtitle or parenthesis (``Adapting a pretrained ViT``), as tables cite it."""
    return title.split(":")[0].split(" (")[0]


def _paper_claims(secs: list[Section]) -> list[ClaimResult]:
    return tally([(_short_title(s.title), f) for s in secs for f in s.findings if f.get("kind") == "paper"])


def _summary(secs: list[Section], plan_name: str) -> list[str]:
    """The first screen: the claims counted once, decided and undecided, the legend, the claims table, the checks."""
    claims_ = _paper_claims(secs)
    lines = _headline(claims_) + _decided_lines(claims_) + _blocked_lines(claims_)
    # the scale before the rules: it bounds what every verdict above can mean
    if scaled := [f"- {s.title.split(':')[0]}: {s.scale}" for s in secs if s.scale]:  # each trained section's scale
        lines += ["**Scale** (laptop-sized, far below the papers'; a verdict holds at this scale):", "", *scaled, ""]
    lines += _legend_lines()
    if plan_name == "smoke":
        lines += [
            "**This is a smoke run**: the models train for a handful of steps, so the verdicts above only show that "
            "the pipeline computes them; they say nothing about the papers.",
            "",
        ]
    table, notes = _claims_table(claims_)
    lines += ["### The claims", "", table, ""] + [n + "  " for n in notes] + [""]
    if checks := [(_short_title(s.title), f) for s in secs for f in s.findings if f.get("kind") == "check"]:
        # counted by verdict, with the sections of those that do not agree
        cc = Counter(f["verdict"] for _, f in checks)
        odd = Counter(t for t, f in checks if f["verdict"] != "agrees")
        where = " (not agreeing: " + ", ".join(f"{t} {n}" for t, n in odd.items()) + ")" if odd else ""
        counts = ", ".join(f"{cc[v]} {v}" for v in VERDICTS if cc[v])
        lines += [f"Implementation checks (in their sections): {counts}{where}.", ""]
    return lines


def _headline(claims_: list[ClaimResult]) -> list[str]:
    counts = Counter(c.verdict for c in claims_)
    trained = Counter(c.verdict for c in claims_ if c.trained)
    measured = Counter(c.verdict for c in claims_ if not c.trained and c.verdict != "not tested")
    n_trained = trained.total()
    return [
        f"**{len(claims_)} claims of the five papers, each counted once**: "
        + ", ".join(f"{counts[v]} {v}" for v in VERDICTS)
        + f". On trained models over seeds: {n_trained} ({trained['agrees']} agree, {trained['disagrees']} "
        f"disagree, {n_trained - trained['agrees'] - trained['disagrees']} undecided); measurements (timings, memory, "
        f"parameter-free iterations, probes of trained layers): {measured.total()} ("
        + ", ".join(f"{measured[v]} {v}" for v in VERDICTS if v != "not tested")
        + ").",
        "",
    ]


def _holds_strictly(f: dict) -> bool:
    """The same rule and boundary give the finding's verdict with :data:`~claims.STRICT_LEVEL` intervals too: its
    own, and for an agreement (the verdict the control gate holds back) its no-attention control's, which must still
    lie outside the margin."""
    a, b = claims.stat(f["values_a"]), claims.stat(f["values_b"])
    _, ci, _ = claims.welch_ci(a, b, lower_is_better=bool(f.get("lower_is_better")), level=STRICT_LEVEL)
    held = claims.verdict_from_ci(ci, f.get("margin") or 0.0, f.get("refute_below")) == f["verdict"]
    control = f.get("control_ci99") if f["verdict"] == "agrees" else None
    return held and (control is None or control[1] <= -(f.get("margin") or 0.0))


def _decided_lines(claims_: list[ClaimResult]) -> list[str]:
    """Each decided trained claim with the effect of its deciding tests (a refuted superiority: the bar it misses)."""
    decided = [c for c in claims_ if c.trained and c.verdict in ("agrees", "disagrees")]
    if not decided:
        return ["**Decided trained claims**: none at this budget.", ""]
    deciding = [[f for f in c.findings if f["verdict"] == c.verdict] for c in decided]
    robust = sum(any(_doubling(f)[0] >= 2 for f in fs) for fs in deciding)
    loose = [
        c.id
        for c, fs in zip(decided, deciding, strict=True)
        if not any(f.get("ci95") and _holds_strictly(f) for f in fs)
    ]
    not_strict = f"; not at {STRICT_LEVEL:.0%}: " + ", ".join(f"`{i}`" for i in loose) if loose else ""
    lines = [
        f"**Decided trained claims** ({robust} of {len(decided)} robust: at twice the steps each clears its "
        f"boundary by at least twice the move shown; {len(decided) - len(loose)} of {len(decided)} decided with "
        f"{STRICT_LEVEL:.0%} intervals too, their controls' included{not_strict}):",
        "",
    ]
    for c, fs in zip(decided, deciding, strict=True):
        for f in fs:
            if not f.get("ci95"):  # a measurement: its own sentence
                lines.append(f"- {f['paper']}, {f['claim']}: {f['measured']}: **{c.verdict}**.")
                continue
            bar = f", margin {f['margin']:.3g}" if f.get("margin") else ""
            if f.get("refute_below") is not None and c.verdict == "disagrees":  # the bar a superiority misses
                rb, e = f["refute_below"], f["paper_effect"]
                bar = f", wholly below {rb:+.3g} ({REFUTE_FRACTION:g} of the paper's {e:+.3g})"
            test = paper_claims.test_of(f.get("claim_id") or "") if len(c.tests) > 1 else ""
            claim = f"{f['claim']} (test: {test})" if test else f["claim"]  # which of its tests decided it
            pilot = " Dated pilot: its note in the claims table." if f.get("dated_pilot") else ""
            if f.get("caveat"):
                pilot = f" Caveat: {f['caveat']}.{pilot}"
            if f.get("confound"):  # the skeletons differ too: the mechanism's share is not what was measured
                pilot = f" An architecture comparison ({f['confound']}): the attention's share is not shown.{pilot}"
            ratio, moved = _doubling(f)
            # the count's "robust" said per claim, so a fragile verdict is not read as settled
            fragile = "" if ratio >= 2 else ", not robust" + (moved or " (no run at twice the steps)")
            lines.append(
                f"- {f['paper']}, {claim}: {effect_in_words(f)}{bar}: **{c.verdict}**{fragile or moved}.{pilot}"
            )
    return lines + [""]


def _doubling(f: dict) -> tuple[float, str]:
    """How a decided verdict fared at twice the steps: the clearance there over the move (the effect's, or the
    baseline's where only the baseline ran longer; below 2, one more such doubling could cross), and those figures
    in words; ``(0, "")`` without a run at twice the steps."""
    t, d = f.get("trend_2x") or {}, f.get("drift_2x") or {}
    if t.get("clearance") is not None and t.get("move"):
        c, move, where, what = t["clearance"], t["move"], "at 2x steps ", "the effect moved"
    elif d.get("change"):  # the clearance at the reported steps against the baseline's own move
        c, move, where, what = d["clearance"], d["change"], "", f"{d['row']} moved at 2x steps"
    else:
        return 0.0, ""
    words = f"its interval clears the boundary by {c:.3g}, {c / abs(move):.1f}x the {move:+.3g} {what}"
    return c / abs(move), f" ({where}{words})"


def effect_in_words(f: dict) -> str:
    """A comparison's effect as a sentence: ``a`` ahead of / behind ``b``, with its interval (positive favours a)."""
    e, (lo, hi), unit = f["effect"], f["ci95"], f.get("unit", "")
    if lo < 0 < hi:  # no direction shown: the point estimate, and how far the interval reaches on each side
        return (
            f"{f['a_name']} and {f['b_name']} differ by {e:+.3g} {unit}, no direction shown (95% CI from "
            f"{-lo:.3g} behind to {hi:.3g} ahead)"
        )
    near, far = sorted((abs(lo), abs(hi)))  # an interval on one side: its ends as distances on that side
    side = "ahead of" if e >= 0 else "behind"
    return f"{f['a_name']} is {side} {f['b_name']} by {abs(e):.3g} {unit} (95% CI {near:.3g} to {far:.3g})"


def _blocked_lines(claims_: list[ClaimResult]) -> list[str]:
    """The undecided claims by their first cause; the counts add up to the undecided total."""
    blocked = [c for c in claims_ if c.cause]
    if not blocked:
        return []
    lines = [f"**Why the other {len(blocked)} claims are undecided** (each under its first cause):", ""]
    for cause, text in CAUSES.items():
        if ids := [f"`{c.id}`" if ":" not in c.id else c.id for c in blocked if c.cause == cause]:
            lines.append(f"- {text}: {len(ids)} ({', '.join(ids)})")
    return lines + [""]


def _legend_lines() -> list[str]:
    """The rule and every gate with the verdicts it holds back and why, stated once for the whole report."""
    return [
        "**How a verdict is reached**:",
        "",
        "- Effect: the difference of the seed means (positive favours the claim), its 95% Welch-t interval in "
        "brackets; **agrees** if the interval lies wholly above -margin, **disagrees** if wholly below (one seed a "
        "side: inconclusive). Margin: the largest gap the paper calls comparable; a superiority claim's is 0 and, "
        f"with the paper's effect E, it also disagrees wholly below {REFUTE_FRACTION:g}·E.",
        f"- Several tests of one claim: {paper_claims.COMBINE_EVERY}; a ranking (each of its pairs a test): "
        f"{paper_claims.COMBINE_ALL}.",
        "- Each row's seeds train at the best rate of its own sweep (run on another seed). Seed counts are the plan's, "
        "some raised after an earlier run's interval came near its bar (docs/results_history.md): the 95% is nominal, "
        f"not corrected for those looks, so the decided claims are counted again with {STRICT_LEVEL:.0%} intervals "
        "(the control gate's too).",
        "- Gates: a failed precondition makes a decided verdict inconclusive (the numbers' verdict shown "
        "'ungated'), holding back only the verdicts in brackets:",
        *[f"  - *{reason}* ({', '.join(rule.holds_back)}): {rule.why}." for reason, rule in GATES.items()],
        "- Clearance: how far an interval lies beyond its boundary. At twice the steps (2x; a side or both) a "
        "verdict stands only if the same rule gives it there, clearing by more than the effect moved; a decided "
        "claim above shows that clearance as a multiple of the move (below 2x, one more doubling at that pace could "
        "cross).",
        "",
    ]


def _claims_table(claims_: list[ClaimResult]) -> tuple[str, list[str]]:
    """One block of rows per claim: its statement once, then each test's figure, effect, verdict and notes."""
    rows, seen, once = [], {}, _blank_repeats()
    said: dict[str, tuple] = {}  # a long measured text already in the table -> the claim and test it was printed for
    for c in claims_:
        for i, (section, f) in enumerate(c.tests):
            refs = _note_refs(f, seen, _table_rule)
            paper = once("paper", f["paper"])
            statement = f["claim"] + (f" (claim: {_MARK[c.verdict]})" if len(c.tests) > 1 else "")
            # the claim's id and paper (a finding without a record: its paper, then its statement)
            cell = paper if ":" in c.id else f"`{c.id}`" + (f" ({paper})" if paper else "")
            head = [cell, statement] if i == 0 else ["", ""]
            test = paper_claims.test_of(f.get("claim_id") or "")
            effect = effect_cell(f)
            if f.get("claim_type") is None and len(effect.split()) > 20:
                first = said.setdefault(effect, (c.id, i))
                if first != (c.id, i):
                    effect = "as above" if first[0] == c.id else f"as for `{first[0]}`"
            effect = f"{test}: {effect}" if test else effect
            row = head + [once("paper_value", f["paper_value"]), effect, _verdict_cell(f) + refs]
            rows.append(row + [once("section", section)])
    return md_table(CLAIMS_COLUMNS, rows), _notes(seen)


def _compute_md(secs: list[Section], records: dict) -> list[str]:
    """Step compute per section: compared rows, learning-rate sweeps, and ablations and plateau checks (rows named
    ``x@...``, ``x+...`` beyond the swaps, ``x-...``)."""
    kinds = ("compared rows, measurements", "lr sweeps", "ablations, plateau runs")
    per: dict = {}
    for sid, r in records.items():
        row = "/".join(p for p in sid.split("/")[1:] if not p.startswith(("seed", "extra-seed")))
        # more seeds of two vision rows are an ablation of the spread
        ablation = "@" in row or any(t in row for t in ("-meanpool", "+ista", "+prenorm", "+softmax"))
        ablation = ablation or ("/extra-seed" in sid and r["section"] == "vision")
        kind = kinds[1] if "/lr-sweep/" in sid else kinds[2] if ablation else kinds[0]
        per.setdefault(r["section"], Counter())[kind] += r.get("wall_s", 0.0)
    total = sum(sum(c.values()) for c in per.values()) or 1.0
    decided: dict[str, list[str]] = {}  # a claim tested in two sections is listed under both
    for c in _paper_claims(secs):
        if c.trained and c.verdict in ("agrees", "disagrees"):
            for title in dict.fromkeys(t for t, f in c.tests if f["verdict"] != "not tested"):
                decided.setdefault(title, []).append(f"`{c.id}`")
    rows = []
    for s in secs:
        c = per.get(s.key, Counter())
        ids = decided.get(_short_title(s.title), [])
        rows.append(
            [_short_title(s.title), *[f"{c[k] / 60:.1f}" for k in kinds], f"{c.total() / 60:.1f}"]
            + [f"{100 * c.total() / total:.0f}%", f"{len(ids)}: {', '.join(ids)}" if ids else "0"]
        )
    return [
        "## Compute",
        "",
        "Thread-minutes of the stored steps (one thread each); the trained claims each section decided.",
        "",
        md_table(["section", *kinds, "total", "share", "trained claims decided"], rows),
        "",
    ]


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
    secs = _summaries(out, plan, sections, records, outcome)
    cmd = "attnzoo reproduce " + " ".join(argv) if argv else f"attnzoo reproduce --budget {budget_name} --out {out}"
    meta = {
        "budget": budget_name,
        "seed": seed,
        "command": cmd,
        "machine": machine,
        "workers": workers,
        "generated": time.strftime("%Y-%m-%d %H:%M:%S"),
        "compute_s": sum(r.get("wall_s", 0.0) for r in records.values()),
        "invocation_wall_s": outcome.wall_s,
        "missing_steps": outcome.missing,
        "sections": [s.key for s in secs],
        "plan": plan,
    }
    m = machine
    setup = [  # the provenance table: the budget, the command, the machine and software, the workers and the times
        ["budget", f"`{budget_name}`: {plan['description']}"],
        ["seed", str(seed)],
        ["command", f"`{cmd}`"],
        [
            "machine",
            f"{m.get('cpu')} ({m.get('cpu_count')} CPUs, {m.get('cpu_isa', 'vector ISA not recorded')}), "
            f"{m.get('gpu', 'no GPU')}",
        ],
        ["workers", _workers_cell(workers)],
        ["software", f"torch {m.get('torch')}, Python {m.get('python')}, numpy {m.get('numpy')}, {m.get('platform')}"],
        ["device", m.get("device", "-")],
        [
            "wall time",
            f"{_fmt_s(meta['compute_s'])} of step compute ({len(records)} steps); {_clock_span(records)}; "
            f"this invocation {_fmt_s(outcome.wall_s)} ({len(outcome.computed)} computed, {len(outcome.skipped)} "
            "reused)",
        ],
        ["generated", meta["generated"]],
    ]
    md = "\n".join(_report_md(secs, setup, budget_name, records)) + "\n"
    atomic_write_text(out / CONFIGS_FILE, "\n".join(_configs_md(seed, records, secs)) + "\n")
    atomic_write_text(out / "report.md", md)
    atomic_write_text(out / "report.html", html_page(md, f"attnzoo reproduce ({budget_name} budget)"))
    write_json(out / "results.json", _results_payload(meta, secs, records, outcome.failed))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def _workers_cell(workers: list[dict]) -> str:
    """How this directory's steps were computed (run.json): "J jobs x T threads", with step counts if they differed."""
    if not workers:
        return "not recorded (no step computed here)"
    cells = [f"{_plural(w.get('jobs'), 'job')} x {_plural(w.get('threads'), 'thread')}" for w in workers]
    if len(workers) == 1:
        return cells[0]
    return "; ".join(f"{cell} ({_plural(w.get('steps', 0), 'step')})" for cell, w in zip(cells, workers, strict=True))


def _clock_span(records: dict) -> str:
    """First start to last finish of the steps computed here, and the time within it that some step ran (pauses
    between invocations of a resumed run do not count there)."""
    own = [r for r in records.values() if not r.get("imported_from") and r.get("started") and r.get("finished")]
    if not own:
        return "no step computed in this directory"

    def at(stamp: str) -> float:
        return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))

    busy, reach = 0.0, None
    for a, b in sorted((at(r["started"]), at(r["finished"])) for r in own):
        busy += max(0.0, b - max(a, reach if reach is not None else a))
        reach = b if reach is None else max(reach, b)
    start, end = min(r["started"] for r in own), max(r["finished"] for r in own)
    span = at(end) - at(start)
    running = f"; {_fmt_s(busy)} with a step running" if span - busy >= 60 else ""
    return (
        f"its {len(own)} steps computed here ran from {start.replace('T', ' ')} to {end.replace('T', ' ')} "
        f"({_fmt_s(span)} of wall clock, first start to last finish{running})"
    )


def _report_md(secs: list[Section], setup: list, budget_name: str, records: dict) -> list[str]:
    """The lines of ``report.md``: summary first, then one part per section, compute, provenance."""
    md = [f"# attnzoo reproduce: the papers' comparisons at laptop scale (`{budget_name}` budget)", ""]
    if budget_name == "smoke":
        md += [
            "> **SMOKE RUN** — tiny models trained for a few steps to exercise every code path. The numbers below "
            "are not evidence for or against any paper; run `attnzoo reproduce --budget default` for that.",
            "",
        ]
    md += ["## Summary", ""] + _summary(secs, budget_name)
    md += ["## Contents", ""] + [f"- [{_short_title(s.title)}](#{_anchor(s.title)})" for s in secs]
    md += ["- [Compute](#compute)", "- [Provenance](#provenance)", ""]
    md += [line for s in secs for line in _section_md(s)] + _compute_md(secs, records)
    provenance = "Generated by the command below from the stored steps (re-running it reuses them): "
    provenance += _imported_text(records) + f"Each step's configuration and time: [{CONFIGS_FILE}]({CONFIGS_FILE})."
    return md + ["## Provenance", "", provenance, "", md_table(["item", "value"], setup), ""]


def _imported_text(records: dict[str, dict]) -> str:
    """Which steps were measured in this run and which were imported from earlier ones (``--reuse``)."""
    imported: dict[str, Counter] = {}
    for rec in records.values():
        if rec.get("imported_from"):
            imported.setdefault(rec["imported_from"], Counter())[rec.get("section", "?")] += 1
    if not imported:
        return "every step was measured in this run. "
    n = sum(c.total() for c in imported.values())
    parts = [f"`{src}` ({', '.join(f'{s} {k}' for s, k in sorted(c.items()))})" for src, c in sorted(imported.items())]
    return (
        f"{len(records) - n} of {len(records)} steps were measured in this run; {n} were imported unchanged "
        f"with `--reuse` (`imported_from` in `results.json`): {'; '.join(parts)}. "
    )


def _section_md(s: Section) -> list[str]:
    md = [f"## {s.title}", ""] + ([s.intro, ""] if s.intro else [])
    md += [line for t in s.tables if not t.appendix for line in _table_md(t)]
    if any(t.appendix for t in s.tables):
        md += [f"Learning-rate sweeps: [{CONFIGS_FILE}]({CONFIGS_FILE}#{_anchor(_short_title(s.title))}).", ""]
    for path, caption in s.plots:  # the alt text names the figure; the caption is printed under it
        md += [f"![{Path(path).stem.replace('_', ' ')}]({path})", "", f"*{caption}*", ""]
    if plateau := s.data.get("plateau") if isinstance(s.data, dict) else None:
        items = plateau.values() if "text" not in plateau else [plateau]
        md += ["Plateau evidence: " + "; ".join(p["text"] for p in items) + ".", ""]
    if checks := [f for f in s.findings if f.get("kind") != "paper"]:  # paper claims: in the summary's claims table
        table, notes = _findings_md(checks)
        md += [f"### {_short_title(s.title)}: implementation checks", "", table, ""] + [n + "  " for n in notes] + [""]
    return md + [line for n in s.notes for line in (f"> {n}", "")]


def _table_md(t) -> list[str]:
    return [f"### {t.title}", "", t.markdown(), ""] + ([t.caption, ""] if t.caption else [])


def _configs_md(seed: int, records: dict, secs: list[Section]) -> list[str]:
    """configs.md: every section's learning-rate sweeps (the report links here), then each step's config."""
    md = []
    for s in secs:
        if sweeps := [t for t in s.tables if t.appendix]:
            md += [f"## {_short_title(s.title)}", ""] + [line for t in sweeps for line in _table_md(t)]
    md = (["# Learning-rate sweeps", ""] + md if md else []) + [
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
        config = json.dumps(rec.get("config", {}), indent=1, sort_keys=True)
        md += [f"<details><summary><code>{sid}</code></summary>", "", "```json", config, "```", "", "</details>", ""]
    return md


def _results_payload(meta: dict, secs: list[Section], records: dict, failed: dict) -> dict:
    return {
        "meta": {**meta, "finding_schema": FINDING_SCHEMA},
        "claims": [
            {
                "id": c.id,
                "verdict": c.verdict,
                "trained": c.trained,
                "cause": c.cause,
                "tests": [f.get("claim_id") or f["claim"] for f in c.findings],
                "sections": c.sections,
            }
            for c in _paper_claims(secs)  # the claims table's tally: the same verdicts and section names
        ],
        "sections": {
            s.key: {
                "title": s.title,
                "data": s.data,
                "findings": [Finding.checked(f) for f in s.findings],
                "notes": s.notes,
                "tables": [{"title": t.title, "headers": t.headers, "rows": t.rows} for t in s.tables],
                "plots": [p for p, _ in s.plots],
            }
            for s in secs
        },
        "steps": {
            # imported_from: the run a reused step was measured in (Provenance points readers here)
            sid: {k: r[k] for k in ("section", "config", "result", "wall_s")}
            | {k: r[k] for k in ("result_slimmed", "imported_from") if r.get(k)}
            for sid, r in records.items()
        },
        "failed": failed,
    }


def _anchor(title: str) -> str:
    return "".join(c for c in title.lower() if c.isalnum() or c in " -").replace(" ", "-")


_STYLE = (
    "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse;margin:8px 0}"
    "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}img{max-width:100%}</style>"
)


def _heading_ids(state) -> None:
    """Give each heading the anchor the report's contents link to (markdown-it core rule)."""
    for opening, inline in zip(state.tokens, state.tokens[1:], strict=False):
        if opening.type == "heading_open":
            opening.attrSet("id", _anchor(inline.content))


def html_page(md: str, title: str) -> str:
    """``report.md`` rendered as one HTML page (CommonMark with tables), so the two cannot drift apart."""
    parser = MarkdownIt("commonmark").enable("table")
    parser.core.ruler.push("heading_ids", _heading_ids)
    head = f"<meta charset='utf-8'><title>{html.escape(title)}</title>{_STYLE}"
    return f"<!doctype html>\n<html><head>{head}</head><body>\n{parser.render(md)}</body></html>\n"
