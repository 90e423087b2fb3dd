"""Compare two reproduce reports (their results.json): which verdicts changed, and the compute per section.

    python scripts/compare_reports.py OLD/results.json NEW/results.json

Findings are paired by (section, paper, claim); a claim present in one report only is listed as added or dropped.
Compute per section is the sum of its steps' wall-clock seconds (with ``--jobs N`` the wall time of the run is
about this sum / N).
"""

from __future__ import annotations

import argparse
import collections
import json


def _findings(report: dict) -> dict[tuple[str, str, str], dict]:
    out = {}
    for key, sec in report["sections"].items():
        for f in sec.get("findings", []):
            out[(key, f.get("paper", ""), f.get("claim", ""))] = f
    return out


def _compute(report: dict) -> dict[str, float]:
    per = collections.Counter()
    for rec in report.get("steps", {}).values():
        per[rec.get("section", "?")] += float(rec.get("wall_s", 0.0))
    return per


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    a = ap.parse_args(argv)
    old, new = (json.load(open(p, encoding="utf-8")) for p in (a.old, a.new))
    fo, fn = _findings(old), _findings(new)
    print("| section | paper | claim | kind | old verdict | new verdict |\n|---|---|---|---|---|---|")
    for k in sorted(set(fo) | set(fn)):
        o, n = fo.get(k), fn.get(k)
        vo = o["verdict"] if o else "(absent)"
        vn = n["verdict"] if n else "(absent)"
        if vo != vn:
            kind = (n or o).get("kind", "")
            print(f"| {k[0]} | {k[1]} | {k[2]} | {kind} | {vo} | {vn} |")
    co, cn = _compute(old), _compute(new)
    print("\n| section | old thread-min | new thread-min |\n|---|---|---|")
    for s in sorted(set(co) | set(cn)):
        print(f"| {s} | {co.get(s, 0) / 60:.1f} | {cn.get(s, 0) / 60:.1f} |")
    print(f"| total | {sum(co.values()) / 60:.1f} | {sum(cn.values()) / 60:.1f} |")
    for name, rep in (("old", old), ("new", new)):
        tally = collections.Counter(f["verdict"] for f in _findings(rep).values() if f.get("kind") == "paper")
        print(f"{name}: paper-claim verdicts {dict(tally)}")


if __name__ == "__main__":
    main()
