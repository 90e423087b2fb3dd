"""The varlen sweep of ``attnzoo bench``: its three calls see the same real tokens, and it runs end to
end at tiny size."""

import csv
import json
import subprocess
import sys

import pytest
import torch

from attnzoo.bench import varlen


@pytest.mark.parametrize("batch,length", [(1, 4), (4, 4096), (5, 37), (8, 100)])
def test_lengths_half_full_rest_distinct_odd_and_shorter(batch, length):
    lengths = varlen.varlen_lengths(batch, length)
    full, short = lengths[: batch - batch // 2], lengths[batch - batch // 2 :]
    assert len(lengths) == batch and full == [length] * len(full)
    assert len(set(short)) == len(short) and all(x % 2 == 1 and length // 2 <= x < length for x in short)


def test_lengths_refuse_what_has_no_padding_room():
    with pytest.raises(ValueError, match="length >= 4"):
        varlen.varlen_lengths(2, 3)


@pytest.mark.parametrize("name", ["linear", "tssa", "fastmax_p1", "fastmax_p2"])
def test_the_three_forms_compute_on_the_same_real_tokens(name):
    lengths = varlen.varlen_lengths(4, 12)
    forms = varlen.varlen_forms(name, 2, 8, lengths, 12, causal=False, device="cpu", dtype=torch.float32)
    total = sum(lengths)
    assert forms["dense"].inputs[0].shape[2] == forms["packed"].inputs[0].shape[2] == total
    masked = forms["masked"].run()
    assert masked.shape[0] == 4 and masked.shape[2] == 12
    # padding outputs are zero, so the real tokens are where the masked output is not
    assert int((masked.abs().sum(dim=(1, 3)) > 0).sum()) == total
    assert forms["packed"].run().shape[2] == forms["dense"].run().shape[2] == total


def test_cases_without_a_varlen_form_are_refused():
    with pytest.raises(ValueError, match="no varlen form"):
        varlen.varlen_forms("softmax", 2, 8, [4, 3], 4, causal=False, device="cpu", dtype=torch.float32)


def test_cli_varlen_sweep_writes_its_table_and_csv(tmp_path):
    out = tmp_path / "bench"
    args = ["--sweeps", "varlen", "--mechanisms", "linear,tssa", "--varlen-batch", "3", "--varlen-length", "16"]
    args += ["--dim", "8", "--heads", "2", "--repeats", "1", "--threads", "1", "--device", "cpu", "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "attnzoo.bench", *args], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "masked/x" in proc.stdout and "load average" in proc.stdout
    rows = list(csv.DictReader(open(out / "varlen.csv")))
    # 2 mechanisms x (non-causal, causal) x (fwd, fwd+bwd)
    assert len(rows) == 8 and {r["mechanism"] for r in rows} == {"linear", "tssa"}
    assert all(int(r["real_tokens"]) == 16 + 16 + 13 and float(r["masked_ratio"]) > 0 for r in rows)
    meta = json.load(open(out / "results.json"))["machine"]
    assert meta["varlen"]["lengths"] == [16, 16, 13] and meta["threads"] == 1


def test_varlen_sweep_times_cpu_or_cuda_and_names_the_device_it_refuses():
    with pytest.raises(ValueError, match="times CPU or CUDA calls; got device=meta"):
        varlen.measure_varlen(
            "tssa", batch=2, heads=2, length=8, dim=8, causal=False, backward=False, device="meta",
            dtype=torch.float32, repeats=1,
        )  # fmt: skip


def test_varlen_backend_runs_every_form_on_it_and_an_unknown_one_is_refused(tmp_path):
    # "auto" does not take the masked Triton kernels: --varlen-backend is how a GPU run times them
    rows = varlen.measure_varlen(
        "tssa", batch=2, heads=2, length=8, dim=8, causal=False, backward=False, device="cpu",
        dtype=torch.float32, repeats=1, backend="naive",
    )  # fmt: skip
    assert [r.backend for r in rows] == ["naive"]
    # linear has no such backend: its rows stay on "auto"
    rows = varlen.measure_varlen(
        "linear", batch=2, heads=2, length=8, dim=8, causal=False, backward=False, device="cpu",
        dtype=torch.float32, repeats=1, backend="naive_missing",
    )  # fmt: skip
    assert [r.backend for r in rows] == ["auto"]
    args = ["--sweeps", "varlen", "--mechanisms", "tssa", "--varlen-backend", "tritonn", "--device", "cpu"]
    proc = subprocess.run(
        [sys.executable, "-m", "attnzoo.bench", *args, "--out", str(tmp_path / "b")],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert proc.returncode != 0 and "--varlen-backend 'tritonn' is a backend of none of ['tssa']" in proc.stderr
