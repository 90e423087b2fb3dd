"""The benchmark runs end to end at tiny size and its memory measure sees what it should."""

import csv
import json
import subprocess
import sys

import pytest
import torch

from attnzoo.bench import cases
from attnzoo.layers import attention_info

# CSP with groups of two tokens (csp_pairs, csp_pairs_torch, csp_pairs_general): CSP's cases beside its default one
CSP_PAIR_CASES = [c.name for c in attention_info("csp").mechanism.bench if not c.default]


def _run(args, tmp_path):
    return subprocess.run(
        [sys.executable, "-m", "attnzoo.bench", *args], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )


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


def test_the_registry_declares_the_cases_the_published_figures_were_measured_with():
    # declared by the mechanisms (Mechanism.bench) since, listed by hand in this module before: the same cases
    assert cases.OP_CASES == ["softmax", "linear", "xca", "mssa", "tssa", "fastmax_p1", "fastmax_p2", "csp", "cbsa"]
    assert cases.DECODE_CASES == ["softmax", "linear", "tssa", "fastmax_p1", "fastmax_p2"]
    causal = ["softmax", "softmax_explicit", "linear", "mssa", "tssa", "fastmax_p1", "fastmax_p2"]
    causal += ["fastmax_p1_autograd", "fastmax_p2_autograd", "tssa_torch", "ema"] + cases.BASELINE_CASES
    assert sorted(cases.CAUSAL_OP_CASES) == sorted(causal)
    extra = ["softmax_explicit", "fastmax_p1_autograd", "fastmax_p2_autograd", "tssa_torch"] + cases.BASELINE_CASES
    extra += ["csp_pairs", "csp_pairs_torch", "csp_pairs_general", "ema", "mega", "mega_chunk", "mega_csp"]
    assert sorted(cases.EXTRA_OP_CASES) == sorted(extra)
    assert cases.ALL_OP_CASES == cases.OP_CASES + cases.EXTRA_OP_CASES
    assert sorted(cases.BASELINE_CASES) == ["fastmax_p1_baseline", "fastmax_p2_baseline", "tssa_baseline"]


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
    pairs = mech in CSP_PAIR_CASES  # groups of two tokens need an even N; CSP has no causal form
    s = cases.Shape(batch=1, heads=2, length=18 if pairs else 17, dim=16)
    causal = mech in cases.EXTRA_OP_CASES and mech in cases.CAUSAL_OP_CASES
    prep = cases.prepare(mech, s, causal=causal, level="op", device=torch.device("cpu"), dtype=torch.float32)
    for t in prep.inputs:
        t.requires_grad_(True)
    out = prep.run()
    grads = torch.autograd.grad(out, prep.inputs, torch.ones_like(out))
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)
    assert prep.bytes_moved > 0


def test_csp_pair_cases_compute_the_same_values_and_refuse_odd_n():
    assert CSP_PAIR_CASES == ["csp_pairs", "csp_pairs_torch", "csp_pairs_general"]
    s = cases.Shape(batch=2, heads=2, length=64, dim=24)
    outs = []
    for mech in CSP_PAIR_CASES:
        torch.manual_seed(0)
        outs.append(cases.prepare(mech, s, causal=False, level="op", device=torch.device("cpu"), dtype=torch.float32))
    assert all(torch.equal(o.inputs[0], outs[0].inputs[0]) for o in outs)
    assert all(torch.equal(o.run(), outs[0].run()) for o in outs[1:])
    with pytest.raises(ValueError, match="csp_pairs needs an even sequence length, got N=17"):
        cases.prepare(
            "csp_pairs",
            cases.Shape(1, 2, 17, 16),
            causal=False,
            level="op",
            device=torch.device("cpu"),
            dtype=torch.float32,
        )


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


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("shape", [(1, 1, 1, 3, 3), (2, 3, 9, 4, 5), (1, 2, 17, 5, 2)])
def test_fastmax_baseline_computes_the_op(p, causal, shape):
    """The einsum factorisation (eqs 11-12 / 32-35) and attnzoo's op are references for each other."""
    from attnzoo import ops
    from attnzoo.ops.fastmax.baseline import fastmax_baseline

    b, h, n, d, dv = shape
    q, k = (torch.randn(b, h, n, d, dtype=torch.float64, requires_grad=True) for _ in range(2))
    v = torch.randn(b, h, n, dv, dtype=torch.float64, requires_grad=True)
    scale = 1.0 / d  # p=1 with a larger scale may cross zero in a denominator (ill-conditioned comparison)
    base = fastmax_baseline(q, k, v, p=p, causal=causal, scale=scale)
    op = ops.fastmax(q, k, v, p=p, causal=causal, scale=scale)
    naive = ops.fastmax(q, k, v, p=p, causal=causal, scale=scale, backend="naive")
    torch.testing.assert_close(base, op, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(base, naive, rtol=1e-10, atol=1e-10)
    w = torch.randn_like(op)
    for a, r in zip(
        torch.autograd.grad((base * w).sum(), (q, k, v)), torch.autograd.grad((op * w).sum(), (q, k, v)), strict=True
    ):
        torch.testing.assert_close(a, r, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(1, 1, 1, 3), (2, 3, 9, 4), (1, 2, 33, 5)])
def test_tssa_baseline_computes_the_op(causal, shape):
    """ToST Alg. 1 / Alg. 2 as printed and attnzoo's TSSA (fused CPU kernels where built) agree."""
    from attnzoo import ops
    from attnzoo.ops.tssa.baseline import tssa_baseline

    b, h, n, p = shape
    w = torch.randn(b, h, n, p, dtype=torch.float64, requires_grad=True)
    temp = torch.rand(h, dtype=torch.float64) + 0.5
    bias = torch.randn(h, n + 3, 1, dtype=torch.float64) if causal else None
    base = tssa_baseline(w, temp, causal=causal, bias=bias)
    op = ops.tssa(w, temp, causal=causal, bias=bias)
    torch.testing.assert_close(base, op, rtol=1e-10, atol=1e-12)
    ref = ops.tssa(w, temp, causal=causal, bias=bias, backend="naive")
    torch.testing.assert_close(base, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(op)
    torch.testing.assert_close(
        torch.autograd.grad((base * g).sum(), w)[0], torch.autograd.grad((op * g).sum(), w)[0], rtol=1e-9, atol=1e-11
    )


def test_causal_fastmax_baseline_refuses_what_would_exhaust_memory(monkeypatch):
    from attnzoo.ops.fastmax import baseline as baselines

    monkeypatch.setattr(baselines, "MAX_BASELINE_BYTES", 1000)
    q = torch.randn(1, 1, 8, 4)
    with pytest.raises(MemoryError, match="prefix moments"):
        baselines.fastmax_baseline(q, q, q, p=2, causal=True)
    assert baselines.fastmax_baseline(q, q, q, p=2, causal=False).shape == q.shape  # unmasked needs no prefix sums


@pytest.mark.parametrize("mech", cases.BASELINE_CASES)
@pytest.mark.parametrize("causal", [False, True])
def test_baseline_module_cases_run_forward_and_backward(mech, causal):
    s = cases.Shape(batch=1, heads=2, length=9, dim=8)
    prep = cases.prepare(mech, s, causal=causal, level="module", device=torch.device("cpu"), dtype=torch.float32)
    for t in prep.inputs:
        t.requires_grad_(True)
    out = prep.run()
    assert out.shape == (1, 9, 8)
    (g,) = torch.autograd.grad(out, prep.inputs, torch.ones_like(out))
    assert torch.isfinite(out).all() and torch.isfinite(g).all()


def test_cpu_warm_up_runs_until_a_call_takes_no_fresh_pages(monkeypatch):
    from attnzoo.bench import runner

    # fault counter as the calls move it: fresh pages on calls 1-3 and 5 (a quiet call in between), then 10 a call
    per_call = iter([5000, 5000, 5000, 10, 5000] + [10] * 20)
    state = {"faults": 0, "calls": 0}

    def fn():
        state["calls"] += 1
        state["faults"] += next(per_call)

    monkeypatch.setattr(runner, "_minor_faults", lambda: state["faults"])
    runner.time_call(fn, torch.device("cpu"), repeats=3, warmup=1)
    # 1 warm-up call + settling until SETTLE_QUIET quiet calls in a row + 3 timed
    settle = {1: 3, 2: 6, 3: 7}[runner.SETTLE_QUIET]  # quiet call 4, call 5 faults again, calls 6, 7, 8 quiet
    assert state["calls"] == 1 + settle + 3

    # a case that never settles stops after SETTLE_CALLS extra calls; warmup=0 (decode) never settles
    state["calls"] = 0
    monkeypatch.setattr(runner, "_minor_faults", lambda: state["calls"] * 10_000)
    runner.time_call(lambda: state.__setitem__("calls", state["calls"] + 1), torch.device("cpu"), repeats=2)
    assert state["calls"] == 1 + runner.SETTLE_CALLS + 2
    state["calls"] = 0
    runner.time_call(lambda: state.__setitem__("calls", state["calls"] + 1), torch.device("cpu"), 2, warmup=0)
    assert state["calls"] == 2


@pytest.mark.parametrize("mech", ["mega", "mega_chunk", "mega_csp"])
def test_mega_module_cases_run_forward_and_backward(mech):
    s = cases.Shape(batch=1, heads=2, length=20, dim=16)
    prep = cases.prepare(mech, s, causal=False, level="module", device=torch.device("cpu"), dtype=torch.float32)
    for t in prep.inputs:
        t.requires_grad_(True)
    out = prep.run()
    (g,) = torch.autograd.grad(out.square().sum(), prep.inputs)
    assert out.shape == (1, 20, 16) and torch.isfinite(g).all() and g.abs().sum() > 0
    with pytest.raises(ValueError, match="'mega' has no causal form"):
        cases.prepare("mega", s, causal=True, level="op", device=torch.device("cpu"), dtype=torch.float32)
    with pytest.raises(ValueError, match="op-level case only"):
        cases.prepare("ema", s, causal=False, level="module", device=torch.device("cpu"), dtype=torch.float32)


def test_a_failing_case_is_an_error_row_and_the_series_stops(monkeypatch):
    # A kernel failure at one shape (H200: CUDA adaptive pooling's backward at N=65536) must not end a long run:
    # the row says what failed, the larger shapes are skipped, the other rows stay.
    from attnzoo.bench import runner

    real_prepare = runner.prepare

    def prepare(name, shape, **kw):
        prep = real_prepare(name, shape, **kw)
        if shape.length == 32:
            monkeypatch.setattr(prep, "run", lambda: (_ for _ in ()).throw(RuntimeError("launch\n bounds")))
        return prep

    monkeypatch.setattr(runner, "prepare", prepare)
    shapes = [cases.Shape(1, 2, n, 16) for n in (16, 32, 64)]
    rows = runner.measure_series(
        "n",
        "linear",
        shapes,
        causal=False,
        level="op",
        device=torch.device("cpu"),
        dtype=torch.float32,
        repeats=1,
        backward=False,
        bandwidth=1e9,
        budget_s=60.0,
    )
    assert [r.status for r in rows] == ["ok", "error: RuntimeError: launch bounds", "skipped (N=32 gave error)"]


def test_speed_column_divides_by_the_declared_sdpa_case(capsys):
    from attnzoo.bench import print_table
    from attnzoo.bench.runner import Row

    assert cases.SPEED_UNIT_CASES == ["softmax"]  # declared by softmax's BenchCase(speed_unit=True)

    def row(mechanism: str, fwd_ms: float) -> Row:
        return Row("n", mechanism, False, "op", 1, 2, 64, 32, fwd_ms, 2 * fwd_ms, 1.0, 1.0, 100, None, "ok")

    print_table([row("softmax", 6.0), row("tssa", 1.5)])
    lines = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [(line[1], line[8]) for line in lines] == [("softmax", "1.0-"), ("tssa", "4.0-")]  # "-": no roofline
