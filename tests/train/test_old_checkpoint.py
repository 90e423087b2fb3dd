"""A run directory written before the training loop's refactor (commit 4eaf652) still resumes, bit for bit.

``fixtures/interrupted_run_v1.json`` holds (base64) every file of a run the previous code stopped by SIGTERM at
step 6 of 12: config, task description, metrics.csv and the step-6 checkpoint (weights, AdamW state, RNG state,
loss window, manifest). Resuming it must give exactly what an uninterrupted run gives today.
"""

import base64
import csv
import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnzoo.train.checkpoint import verify_checkpoint
from attnzoo.train.run_dir import foreign_run_files, load_run
from attnzoo.train.trainer import train

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from tiny_models import tiny_factory  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _unpack(dest: Path) -> Path:
    doc = json.loads((HERE / "fixtures" / "interrupted_run_v1.json").read_text())
    for rel, data in doc["files"].items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(base64.b64decode(data))
    return dest


def _rows(run: Path) -> list[dict]:
    with open(run / "metrics.csv", newline="") as f:
        timing = ("samples_per_s", "tokens_per_s", "elapsed_s")
        return [{k: v for k, v in r.items() if k not in timing} for r in csv.DictReader(f)]


def test_run_from_before_the_refactor_resumes_bit_exactly(tmp_path):
    old = _unpack(tmp_path / "old")
    assert foreign_run_files(old) == []  # still recognised as a run's own files
    assert verify_checkpoint(old / "checkpoints" / "step_00000006")
    resumed = train(None, old, resume=True, model_factory=tiny_factory, progress=False)
    fresh = train(load_run(old), tmp_path / "fresh", model_factory=tiny_factory, progress=False)
    assert resumed.step == fresh.step == 12 and not resumed.interrupted
    wa = load_file(str(old / "checkpoints" / "step_00000012" / "model.safetensors"))
    wb = load_file(str(tmp_path / "fresh" / "checkpoints" / "step_00000012" / "model.safetensors"))
    assert wa.keys() == wb.keys()
    # Bit for bit where this CPU rounds as the one that wrote the fixture (an AMD EPYC); BLAS kernels differ between
    # CPUs (an AVX-512 Xeon computes the first six steps a few ulps apart), and there the resumed run must still
    # follow the uninterrupted one to float32 rounding.
    if not all(torch.equal(wa[k], wb[k]) for k in wa):
        assert all(torch.allclose(wa[k], wb[k], rtol=1e-3, atol=1e-5) for k in wa)
        assert resumed.final_metrics.keys() == fresh.final_metrics.keys()
        for k, x in resumed.final_metrics.items():
            assert x == pytest.approx(fresh.final_metrics[k], rel=1e-3, abs=1e-4), k
        return
    assert resumed.final_metrics == fresh.final_metrics
    assert _rows(old) == _rows(tmp_path / "fresh")  # the step-10 train loss averages steps 6..10 across the resume
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert (old / "checkpoints" / "step_00000012" / "state.json").read_bytes() == (
        tmp_path / "fresh" / "checkpoints" / "step_00000012" / "state.json"
    ).read_bytes()
