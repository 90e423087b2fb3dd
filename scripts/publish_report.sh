#!/usr/bin/env bash
# Publish a reproduce run's report as the committed one: DIR/report.md -> docs/results.md, its plots, results.json
# and configs.md -> docs/results/ (links rewritten to the new places). Usage: bash scripts/publish_report.sh DIR
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:?usage: bash scripts/publish_report.sh DIR (an attnzoo reproduce --out directory)}
for f in report.md results.json configs.md; do
  [ -s "$src/$f" ] || { echo "publish_report: $src/$f is missing; is $src a finished reproduce run?" >&2; exit 2; }
done
rm -f docs/results/*.png
mkdir -p docs/results
# only the plots the report shows: a plot left in DIR by an earlier render of a section that no longer draws it stays
for f in "$src"/plots/*.png; do
  if grep -qF "plots/$(basename "$f")" "$src/report.md"; then cp "$f" docs/results/; fi
done
abs=$(cd "$src" && pwd)
# paths of this machine become DIR (the run's --out) so the committed files name no local directory
sed -E -e "s#$abs#DIR#g" -e 's#"/[^"]*/(runs/[^"]*)"#"DIR/\1"#g' "$src/results.json" > docs/results/results.json
sed -e "s#$abs#DIR#g" "$src/configs.md" > docs/results/configs.md
# compact JSON without the per-step training-loss curves (nor run_dir where it is DIR/runs/<step id>, nor a probe's
# plot-only arrays, nor a learning-rate sweep's validation curve), the steps' results to 4 significant digits and
# the sections' floats (the findings' statistics) to 5: the repository keeps files under 600 KiB, the run's own results.json keeps every digit and
# curve; the steps' configurations as written, so their hashes still match for --reuse
python3 - docs/results/results.json <<'PYEOF'
import json, sys


def rounded(x, digits=5):
    if isinstance(x, float):
        return float(f"{x:.{digits}g}")
    if isinstance(x, list):
        return [rounded(v, digits) for v in x]
    if isinstance(x, dict):
        return {k: rounded(v, digits) for k, v in x.items()}
    return x


PLOT_ONLY = ("points", "labels", "directions", "cls_maps", "matrices", "snr_per_cluster", "overlays")
p = sys.argv[1]
d = json.load(open(p))
for sid, rec in d["steps"].items():
    rec["result"].pop("curve", None)
    if rec["result"].get("run_dir") == f"DIR/runs/{sid}":  # always the run's --out, runs/, the step's id
        del rec["result"]["run_dir"]
    rec["result"] = rounded(rec["result"], 4)
    # a probe's plot-only arrays (point clouds, attention maps, per-cluster curves) are drawn in the committed plots
    # and kept in the run's own results.json; without them --reuse computes such a step again
    slim = [k for k in PLOT_ONLY if k in rec["result"]]
    # a learning-rate sweep's run is read for its final metric only (its curve is in no table or plot): ~27 KB of
    # curves in the long report of 2026-11-27 (390 steps)
    if "/lr-sweep/" in sid and "val_curve" in rec["result"]:
        slim.append("val_curve")
    for k in slim:
        del rec["result"][k]
    if slim or rec.get("result_slimmed"):  # a record imported already slimmed keeps what it lacks
        rec["result_slimmed"] = sorted(set(slim) | set(rec.get("result_slimmed", [])))
    # a zero-shot segmentation step's per-head IoUs: the section reads each layer's best head only
    for lay in rec["result"].get("layers", []) if sid.startswith("segmentation/zero-shot") else []:
        for k in ("iou", "iou_sem", "best_sem"):
            lay.pop(k, None)
# the sections' findings (every verdict with its per-seed values) and notes stay; their plot data ("data") and
# tables are in report.md and are recomputed from the steps by --report-only: the file stays under 600 KiB
for sec in d["sections"].values():
    sec.pop("data", None)
    sec.pop("tables", None)
d["sections"] = rounded(d["sections"])
open(p, "w").write(json.dumps(d, separators=(",", ":")) + "\n")
PYEOF
sed -e 's#](plots/#](results/#g' -e 's#](configs.md)#](results/configs.md)#g' -e "s#$abs#DIR#g" "$src/report.md" \
  > docs/results.md.tmp
mv docs/results.md.tmp docs/results.md
echo "publish_report: docs/results.md, docs/results/ from $src"
