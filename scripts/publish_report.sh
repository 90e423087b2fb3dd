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
cp "$src"/plots/*.png docs/results/
cp "$src/results.json" "$src/configs.md" docs/results/
sed -e 's#](plots/#](results/#g' -e 's#](configs.md)#](results/configs.md)#g' "$src/report.md" > docs/results.md.tmp
mv docs/results.md.tmp docs/results.md
echo "publish_report: docs/results.md, docs/results/ from $src"
