"""The benchmark runs end to end at tiny size and its memory measure sees what it should."""
import csv
import json
import subprocess
import sys

import pytest
import torch

from attnzoo.bench import cases


def _run(args, tmp_path):
    return subprocess.run([sys.executable, "-m", "attnzoo.bench", *args], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)


def test_quick_bench_writes_table_csv_json_and_plots(tmp_path):
    out = tmp_path / "bench"
    proc = _run(["--preset", "quick", "--out", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "x SDPA" in proc.stdout and "roofline" in proc.stdout
    rows = list(csv.DictReader(open(out / "results.csv")))
    meta = json.load(open(out / "results.json"))["machine"]
    assert meta["bandwidth_GBps"] > 0 and meta["threads"] >= 1 and "memory_method" in meta
    got = {(r["sweep"], r["mechanism"], r["causal"]) for r in rows}
    for mech in cases.OP_CASES:
        assert ("n", mech, "False") in got and ("d", mech, "False") in got
    for mech in cases.CAUSAL_OP_CASES:
        assert (("n", mech, "True") in got) == (mech in cases.OP_CASES)  # extra cases only on request
    for mech in cases.DECODE_CASES:
        assert ("decode", mech, "True") in got
    assert all(r["status"] == "ok" for r in rows), [r for r in rows if r["status"] != "ok"]
    nd = [r for r in rows if r["sweep"] in ("n", "d")]
    assert all(float(r["fwd_ms"]) > 0 and float(r["fwdbwd_ms"]) > 0 for r in nd)
    for png in ("sweep_n.png", "sweep_d.png", "decode.png"):
        assert (out / png).stat().st_size > 1000


def test_earlier_results_are_not_overwritten(tmp_path):
    out = tmp_path / "bench"
    out.mkdir()
    (out / "results.csv").write_text("precious")
    proc = _run(["--preset", "quick", "--sweeps", "n", "--mechanisms", "tssa", "--out", str(out)], tmp_path)
    assert proc.returncode == 2 and "--overwrite" in proc.stderr
    assert (out / "results.csv").read_text() == "precious"


def test_unknown_mechanism_is_rejected_with_valid_list(tmp_path):
    proc = _run(["--preset", "quick", "--mechanisms", "softmax,nope", "--out", str(tmp_path / "x")], tmp_path)
    assert proc.returncode != 0
    assert "nope" in proc.stderr and "tssa" in proc.stderr


def test_cpu_peak_memory_is_the_most_held_at_once():
    from attnzoo.bench.memory import cpu_peak_supported, peak_memory_bytes

    assert cpu_peak_supported()
    dev = torch.device("cpu")
    keep = torch.ones(2**20)  # allocated before the call: not counted

    def f():
        big = torch.ones(5 * 2**20)  # 20 MiB, freed before the 8 MiB tensors exist
        del big
        small = torch.ones(2 * 2**20)
        return small + keep.sum()  # 8 MiB result (+ the temporary of small + ...)

    peak = peak_memory_bytes(f, dev)
    # the peak is the 20 MiB tensor, not the 8 + 8 MiB alive together later, nor the net 8 MiB
    assert 20 * 2**20 <= peak < 20 * 2**20 + 2**16, peak
    assert [peak_memory_bytes(f, dev) for _ in range(2)] == [peak, peak]  # deterministic

    def g():
        a, b = torch.ones(3 * 2**20), torch.ones(3 * 2**20)  # 12 + 12 MiB alive together
        return a + b  # 12 MiB more: 36 MiB at once

    assert 36 * 2**20 <= peak_memory_bytes(g, dev) < 36 * 2**20 + 2**16
    assert keep.numel() == 2**20


@pytest.mark.parametrize("mech", cases.ALL_OP_CASES)
def test_every_op_case_runs_forward_and_backward(mech):
    s = cases.Shape(batch=1, heads=2, length=17, dim=16)
    causal = mech in cases.EXTRA_OP_CASES
    prep = cases.prepare(mech, s, causal=causal, level="op", device=torch.device("cpu"), dtype=torch.float32)
    for t in prep.inputs:
        t.requires_grad_(True)
    out = prep.run()
    grads = torch.autograd.grad(out, prep.inputs, torch.ones_like(out))
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)
    assert prep.bytes_moved > 0


def test_cpu_peak_memory_keeps_errors_and_stderr(capfd):
    import os

    from attnzoo.bench.memory import peak_memory_bytes

    def boom():
        torch.ones(10)
        raise ValueError("from inside the measured call")

    with pytest.raises(ValueError, match="from inside the measured call"):
        peak_memory_bytes(boom, torch.device("cpu"))
    os.write(2, b"fd 2 is back\n")
    assert "fd 2 is back" in capfd.readouterr().err
