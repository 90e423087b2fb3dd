"""Triton kernels of TSSA and Fastmax vs their naive references, run on CPU under TRITON_INTERPRET=1.

The interpreter flag is read when a kernel is decorated, so it is set here before anything imports the
kernel modules (they are imported lazily by the ops' ``backend="triton"`` dispatch). With a GPU and
``TRITON_INTERPRET=0`` the same tests run the compiled kernels on CUDA.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

# scripts/setup.sh installs triton==3.7.1; these tests are part of the suite, not optional.
import triton  # noqa: E402, F401

from attnzoo.ops.fastmax import fastmax  # noqa: E402
from attnzoo.ops.fastmax.common import standardize  # noqa: E402
from attnzoo.ops.tssa import tssa  # noqa: E402

pytestmark = pytest.mark.triton

INTERPRET = os.environ["TRITON_INTERPRET"].lower() in ("1", "true", "on", "yes")
DEV = "cpu" if INTERPRET else "cuda"
F64 = dict(rtol=1e-10, atol=1e-11)
F32 = dict(rtol=2e-4, atol=2e-5)


def _grads(out, inputs, seed_grad):
    return torch.autograd.grad(out, inputs, seed_grad)


def _assert_all_close(got, ref, tol):
    for a, r in zip(got, ref, strict=True):
        torch.testing.assert_close(a, r, **tol)


# ---------------------------------------------------------------------------------------------------
# TSSA
# ---------------------------------------------------------------------------------------------------
def _tssa_inputs(b, h, n, p, dtype, causal):
    w = torch.randn(b, h, n, p, dtype=dtype, device=DEV, requires_grad=True)
    temp = (torch.rand(h, dtype=dtype, device=DEV) + 0.5).requires_grad_(True)
    # bias longer than N (N_max >= N) so the kernels' slicing is exercised
    bias = (0.1 * torch.randn(h, n + 3, 1, dtype=dtype, device=DEV)).requires_grad_(True) if causal else None
    return w, temp, bias


# (B, H, N, P, block_p): P=48 with block_p=32 -> a full and a masked feature block; N=33 -> 3 token blocks
TSSA_CASES = [(1, 2, 33, 48, 32), (2, 3, 1, 5, None), (1, 2, 17, 16, None)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", TSSA_CASES)
def test_tssa_matches_naive_float64(causal, case):
    b, h, n, p, bp = case
    from attnzoo.ops.tssa.triton import tssa_triton

    w, temp, bias = _tssa_inputs(b, h, n, p, torch.float64, causal)
    ins = (w, temp) + ((bias,) if causal else ())
    ref = tssa(w, temp, causal=causal, bias=bias, backend="naive")
    out = tssa_triton(w, temp, causal=causal, bias=bias, block_n=16, block_p=bp)
    assert out.shape == (b, h, n, p) and out.dtype == torch.float64
    torch.testing.assert_close(out, ref, **F64)
    go = torch.randn_like(ref)
    _assert_all_close(_grads(out, ins, go), _grads(ref, ins, go), F64)


@pytest.mark.parametrize("causal", [False, True])
def test_tssa_gradcheck(causal):
    from attnzoo.ops.tssa.triton import tssa_triton

    w, temp, bias = _tssa_inputs(1, 2, 5, 3, torch.float64, causal)
    if causal:
        assert torch.autograd.gradcheck(
            lambda a, t, c: tssa_triton(a, t, causal=True, bias=c, block_n=4), (w, temp, bias), fast_mode=True
        )
    else:
        assert torch.autograd.gradcheck(lambda a, t: tssa_triton(a, t, block_n=4), (w, temp), fast_mode=True)


@pytest.mark.parametrize("causal", [False, True])
def test_tssa_float16_accumulates_in_float32(causal):
    w, temp, bias = _tssa_inputs(1, 2, 19, 8, torch.float32, causal)
    w16 = w.detach().half().requires_grad_(True)
    out = tssa(w16, temp, causal=causal, bias=bias, backend="triton")
    assert out.dtype == torch.float16
    ref = tssa(w16.detach().float(), temp, causal=causal, bias=bias, backend="naive")
    torch.testing.assert_close(out.float(), ref, rtol=2e-3, atol=2e-3)
    (g,) = torch.autograd.grad(out.float().sum(), w16)
    assert g.dtype == torch.float16 and torch.isfinite(g).all()


def test_tssa_triton_rejects_bad_blocks_and_devices(monkeypatch):
    from attnzoo.ops.tssa.triton import tssa_triton

    w, temp, _ = _tssa_inputs(1, 2, 4, 3, torch.float32, False)
    with pytest.raises(ValueError, match="block_n must be a positive power of two, got 12"):
        tssa_triton(w, temp, block_n=12)
    if INTERPRET:
        with pytest.raises(TypeError, match="does not support bfloat16"):
            tssa_triton(w.bfloat16(), temp)
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(ValueError, match="needs CUDA tensors"):
            tssa_triton(w, temp)


# ---------------------------------------------------------------------------------------------------
# Fastmax
# ---------------------------------------------------------------------------------------------------
def _qkv(b, h, n, d, dv, dtype):
    return [torch.randn(b, h, n, x, dtype=dtype, device=DEV, requires_grad=True) for x in (d, d, dv)]


def _scale(p, d):
    # p = 1 with scale <= 1/D keeps every weight non-negative (well-conditioned denominators)
    return 1.0 / d if p == 1 else None


# (B, H, N, D, Dv): N=33 -> 3 blocks of 16 (last partial); D, Dv not powers of two; N=1
FASTMAX_CASES = [(1, 2, 33, 3, 5), (2, 1, 1, 4, 4)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("case", FASTMAX_CASES)
def test_fastmax_matches_naive_float64(causal, p, case):
    b, h, n, d, dv = case
    q, k, v = _qkv(b, h, n, d, dv, torch.float64)
    ref = fastmax(q, k, v, p=p, causal=causal, scale=_scale(p, d), backend="naive")
    out = fastmax(q, k, v, p=p, causal=causal, scale=_scale(p, d), backend="triton", chunk_size=16)
    assert out.shape == (b, h, n, dv) and out.dtype == torch.float64
    torch.testing.assert_close(out, ref, **F64)
    go = torch.randn_like(ref)
    _assert_all_close(_grads(out, (q, k, v), go), _grads(ref, (q, k, v), go), F64)


@pytest.mark.parametrize("causal", [False, True])
def test_fastmax_head_dim_128(causal):
    # ToST Fig. 7's d = 4096 over 32 heads: with Triton's default 3 pipeline stages the state kernel asked an
    # H200 for 288 KiB of shared memory and failed to launch; the pipeline depth now follows the tile size
    q, k, v = _qkv(1, 1, 70, 128, 128, torch.float32)
    ref = fastmax(q, k, v, p=1, causal=causal, scale=_scale(1, 128), backend="naive")
    out = fastmax(q, k, v, p=1, causal=causal, scale=_scale(1, 128), backend="triton")
    torch.testing.assert_close(out, ref, **F32)
    go = torch.randn_like(ref)
    _assert_all_close(_grads(out, (q, k, v), go), _grads(ref, (q, k, v), go), dict(rtol=1e-3, atol=1e-4))


@pytest.mark.parametrize("p", [1, 2])
def test_fastmax_unmasked_token_splits(p):
    # the state reduction split over token ranges (partial states summed) equals the one-pass state
    from attnzoo.ops.fastmax.triton import fastmax_triton

    q, k, v = _qkv(1, 1, 40, 3, 2, torch.float64)
    scale = 1.0 / 3 if p == 1 else 3**-0.5
    qs, kh = standardize(q) * scale, standardize(k)
    ref = fastmax(q, k, v, p=p, scale=scale, backend="naive")
    outs = [fastmax_triton(qs, kh, v, p=p, chunk_size=16, num_splits=s) for s in (1, 3)]
    for out in outs:
        torch.testing.assert_close(out, ref, **F64)
    go = torch.randn_like(ref)
    _assert_all_close(_grads(outs[1], (q, k, v), go), _grads(ref, (q, k, v), go), F64)


@pytest.mark.parametrize("causal", [False, True])
def test_fastmax_gradcheck(causal):
    from attnzoo.ops.fastmax.triton import fastmax_triton

    n = 17 if causal else 5  # causal: two token blocks, so the carried prefix/suffix states are checked
    qs, kh, v = _qkv(1, 1, n, 2, 1, torch.float64)
    assert torch.autograd.gradcheck(
        lambda a, b, c: fastmax_triton(a, b, c, p=2, causal=causal, chunk_size=16), (qs, kh, v), fast_mode=True
    )


def test_fastmax_triton_rejects_bad_input(monkeypatch):
    from attnzoo.ops.fastmax.triton import fastmax_triton

    qs, kh, v = (x.detach() for x in _qkv(1, 1, 4, 2, 2, torch.float32))
    with pytest.raises(ValueError, match="p=3 is not supported"):
        fastmax_triton(qs, kh, v, p=3)
    with pytest.raises(TypeError, match="float32/float64 inputs"):
        fastmax_triton(qs.half(), kh.half(), v.half())
    with pytest.raises(ValueError, match="chunk_size must be a positive integer, got 0"):
        fastmax_triton(qs, kh, v, chunk_size=0)
    with pytest.raises(ValueError, match="num_splits must be a positive integer or None, got 0"):
        fastmax_triton(qs, kh, v, num_splits=0)
    if INTERPRET:
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(ValueError, match="needs CUDA tensors"):
            fastmax_triton(qs, kh, v)


@pytest.mark.parametrize("causal", [False, True])
def test_tssa_zero_features_match_naive(causal):
    # a feature that is 0 in every token (non-causal norm 0) or in the first tokens (causal prefix 0):
    # the 0/0 := 0 convention of naive.py, with finite gradients
    w, temp, bias = _tssa_inputs(1, 2, 7, 4, torch.float64, causal)
    with torch.no_grad():
        w[:, :, :, 1] = 0.0
        w[:, :, :3, 2] = 0.0
    ins = (w, temp) + ((bias,) if causal else ())
    ref = tssa(w, temp, causal=causal, bias=bias, backend="naive")
    out = tssa(w, temp, causal=causal, bias=bias, backend="triton")
    torch.testing.assert_close(out, ref, **F64)
    go = torch.randn_like(ref)
    got = _grads(out, ins, go)
    assert all(torch.isfinite(g).all() for g in got)
    _assert_all_close(got, _grads(ref, ins, go), F64)


# ---------------------------------------------------------------------------------------------------
# "auto" through the fallback guard (the backends take the raw inputs and check their values inside it)
# ---------------------------------------------------------------------------------------------------
def test_auto_runs_the_kernels_behind_the_guard_and_input_errors_are_not_kernel_failures(monkeypatch):
    from attnzoo._checks import NonFiniteError
    from attnzoo.ops import _triton_utils

    monkeypatch.setattr(_triton_utils, "_triton_device", lambda x: True)  # "auto" takes Triton, as on CUDA
    monkeypatch.setattr(_triton_utils, "_FAILED", {})
    monkeypatch.setattr(_triton_utils, "_BACKWARD_OK", set())
    torch.manual_seed(5)
    q, k, v = (torch.randn(1, 2, 9, 4, dtype=torch.float64, device=DEV, requires_grad=True) for _ in range(3))
    temp = (torch.rand(2, dtype=torch.float64, device=DEV) + 0.5).requires_grad_(True)
    for run, ref, inputs in (
        (lambda b: fastmax(q, k, v, p=2, causal=True, backend=b), "torch", (q, k, v)),
        (lambda b: tssa(q, temp, causal=True, backend=b), "naive", (q, temp)),
    ):
        out, want = run("auto"), run(ref)
        torch.testing.assert_close(out, want, **F64)
        _assert_all_close(_grads(out, inputs, torch.ones_like(out)), _grads(want, inputs, torch.ones_like(want)), F64)
    bad = q.detach().clone()
    bad[0, 1, 4, 2] = float("nan")
    with pytest.raises(NonFiniteError, match="fastmax: q"):
        fastmax(bad.requires_grad_(), k, v)
    with pytest.raises(NonFiniteError, match="tssa: w"):
        tssa(bad, temp, causal=True)
    assert _triton_utils.triton_failures() == {}  # the kernels stay in use


def test_auto_takes_the_tssa_kernels_below_the_length_where_the_pytorch_path_is_faster(monkeypatch):
    # H200, twice: from N = 16384 on the token-sequential kernels ran slower than TSSA's PyTorch path
    from attnzoo.ops import _cpu_kernels, _triton_utils
    from attnzoo.ops._dispatch import resolve_backend
    from attnzoo.ops.tssa import TRITON_AUTO_MAX_TOKENS, TSSA

    monkeypatch.setattr(_triton_utils, "_triton_device", lambda x: True)
    monkeypatch.setattr(_triton_utils, "_FAILED", {})
    monkeypatch.setattr(_cpu_kernels, "cpu_kernels", lambda: None)
    for n, want in ((1, "triton"), (TRITON_AUTO_MAX_TOKENS - 1, "triton"), (TRITON_AUTO_MAX_TOKENS, "torch")):
        w = torch.empty(1, 2, n, 3, device="meta")
        for causal in (False, True):
            opts = dict(causal=causal, seg=None)
            assert resolve_backend(TSSA, "auto", w, inputs=(w, torch.ones(2), None), options=opts) == want, (n, causal)


def test_auto_takes_the_fastmax_kernels_only_where_two_pipeline_stages_fit(monkeypatch):
    # H200: at D = Dv = 128 one stage fits in shared memory and ran 12x slower than the PyTorch path
    from attnzoo.ops import _cpu_kernels, _triton_utils
    from attnzoo.ops._dispatch import resolve_backend
    from attnzoo.ops.fastmax import FASTMAX
    from attnzoo.ops.fastmax.triton import pipeline_stages

    f32 = torch.float32
    assert [pipeline_stages(d, d, 1, None, f32, False) for d in (32, 48, 64, 128)] == [3, 3, 3, 1]
    assert [pipeline_stages(d, d, 2, None, f32, True) for d in (32, 64, 128)] == [3, 3, 1]
    assert [pipeline_stages(d, d, 1, None, torch.float64, False) for d in (32, 64)] == [3, 1]  # 8-byte tiles
    monkeypatch.setattr(_triton_utils, "_triton_device", lambda x: True)
    monkeypatch.setattr(_triton_utils, "_FAILED", {})
    monkeypatch.setattr(_cpu_kernels, "cpu_kernels", lambda: None)
    for d, want in ((48, "triton"), (64, "triton"), (128, "torch")):
        # 300 tokens: longer than the explicit form takes (N <= min(256, D^p / 2))
        q, k, v = (torch.randn(1, 1, 300, d) for _ in "qkv")
        for causal in (False, True):
            opts = dict(p=1, causal=causal, scale=None, chunk_size=None)
            assert resolve_backend(FASTMAX, "auto", q, inputs=(q, k, v), options=opts) == want, (d, causal)
