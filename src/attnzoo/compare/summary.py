"""From stored step records to the comparison's numbers: per row the seeds' metric, size, speed and tuned rate; per
mechanism its effect against the baseline with the report's own rule (:func:`attnzoo.compare.claims.compare`),
the report's gates through its own pipeline (:func:`attnzoo.compare.pipeline.judge`: a row tuned at an end of its
grid, the baseline's plateau) and a reading in words."""

from __future__ import annotations

import statistics

from attnzoo.compare import claims
from attnzoo.compare.claims import Finding
from attnzoo.compare.common import curve_text, mean_val_curve, seeded_id, sweep_id, sweep_table
from attnzoo.compare.pipeline import Evidence, Plateau, Tuning, judge
from attnzoo.compare.plan import PREFIX, CompareSpec, longer_id, row_ids

__all__ = ["summarise", "reading", "MARGIN_SOURCE"]

#: where a non-inferiority margin comes from (the rule's text quotes it)
MARGIN_SOURCE = "the user's --margin"

_SUPERIORITY_WORDS = {"agrees": "better", "disagrees": "worse", "inconclusive": "not distinguishable"}
_NONINFERIORITY_WORDS = {
    "agrees": "non-inferior (within the margin)",
    "disagrees": "inferior (worse by more than the margin)",
    "inconclusive": "inconclusive",
}


def _results(records: dict, ids: list[str]) -> list[dict]:
    return [records[i]["result"] for i in ids if i in records]


def _row(spec: CompareSpec, records: dict, mech: str) -> dict:
    """One mechanism's row: the metric per reported seed, its mean and std, size, step time, rate and sweep."""
    results = _results(records, [seeded_id(row_ids(mech), s) for s in spec.seed_list])
    values = [r.get(spec.metric) for r in results]
    s = claims.stat(values)
    times = [r["step_ms"] for r in results if r.get("step_ms")]
    sweep = {}
    for lr in spec.lrs:
        rec = records.get(sweep_id(row_ids(mech), lr))
        sweep[f"{lr:g}"] = rec["result"].get(spec.metric) if rec else None
    tuned = results[0]["lr"] if results else None
    edge = tuned is not None and len(spec.lrs) > 1 and tuned in (min(spec.lrs), max(spec.lrs))
    row = {
        "seeds": [sd for sd in spec.seed_list if seeded_id(row_ids(mech), sd) in records],
        "values": values,
        "mean": s.mean if s else None,
        "std": s.std if s else None,
        "params": results[0].get("params") if results else None,
        "step_ms": statistics.median(times) if times else None,
        "tuned_lr": tuned,
        "lr_at_edge": edge,
        "sweep": sweep,
        "curve": mean_val_curve(results, spec.metric) if results else [],
    }
    if spec.replicate_baseline and mech == spec.baseline:
        longer = _results(records, [longer_id(mech, sd) for sd in spec.seed_list])
        row["values_2x"] = [r.get(spec.metric) for r in longer]
        row["curve_2x"] = mean_val_curve(longer, spec.metric) if longer else []
    return row


def _finding(spec: CompareSpec, rows: dict, mech: str) -> Finding:
    """``claims.compare`` of ``mech``'s seeds against the baseline's: the report's interval and rule."""
    margin = spec.margin is not None
    return claims.compare(
        rows[mech]["values"],
        rows[spec.baseline]["values"],
        claim_type="non-inferiority" if margin else "superiority",
        unit=spec.metric,
        paper="your task",
        claim=f"{mech} against {spec.baseline}",
        paper_value="-",
        a_name=mech,
        b_name=spec.baseline,
        kind="check",
        margin=spec.margin if margin else 0.0,
        margin_source=MARGIN_SOURCE if margin else "",
        lower_is_better=not spec.higher_is_better,
        spec=".4g",
    )


def reading(f: Finding, superiority: bool) -> str:
    """A finding's verdict in words: better / worse / not distinguishable (superiority) or non-inferior / inferior /
    inconclusive (margin); a gated verdict says why and what the numbers alone give."""
    words = _SUPERIORITY_WORDS if superiority else _NONINFERIORITY_WORDS
    if f.verdict == "not tested":
        return f"not tested ({f.measured})"
    if f.ci95 is None:
        return "no interval (one seed a side)"
    why = ", ".join(f.gate_reasons or [])
    if f.ungated_verdict:
        return f"inconclusive ({why}); the numbers alone: {words[f.ungated_verdict]}"
    return words[f.verdict] + (f" (and {why})" if why else "")


def summarise(spec: CompareSpec, records: dict) -> dict:
    """``{"rows", "findings", "untuned", "sweep_table", "plateau"}`` of a comparison from its step records.

    Gates as in the report: a comparison involving a row whose best swept rate lies at an end of the grid (beyond a
    flat top) is ``inconclusive`` (not tuned); with ``replicate_baseline`` a decided verdict stands only if it
    clears its boundary by more than the baseline moves at twice the steps (:func:`claims.plateau_gate`)."""
    mechs = list(spec.mechanisms)
    rows = {m: _row(spec, records, m) for m in mechs}
    noise = {m: r["std"] for m, r in rows.items() if r["std"] is not None}
    table, untuned = sweep_table(
        records, mechs, PREFIX, list(spec.lrs), spec.metric, spec.higher_is_better, noise=noise
    )
    findings = {m: _finding(spec, rows, m) for m in mechs if m != spec.baseline}
    ev = Evidence(tuning=[Tuning(untuned)])
    if spec.replicate_baseline:
        base = rows[spec.baseline]
        curves = f"{spec.steps} steps: {curve_text(base['curve'])}; {2 * spec.steps} steps: "
        b1, b2 = claims.stat(base["values"]), claims.stat(base.get("values_2x"))
        curves += curve_text(base.get("curve_2x", []))
        ev.plateaus.append(Plateau(spec.baseline, spec.baseline, b1, b2, spec.metric, ".4g", curves, key="baseline"))
    # the report's own chain of gates, in the report's order
    plateau = judge(list(findings.values()), ev).get("baseline")
    for f in findings.values():
        f.reading = reading(f, spec.margin is None)
    return {"rows": rows, "findings": findings, "untuned": untuned, "sweep_table": table, "plateau": plateau}
