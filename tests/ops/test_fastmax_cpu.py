"""The fused CPU kernel of the unmasked p=1 Fastmax (ops/fastmax/cpu.cpp) against the explicit reference."""

import importlib

import pytest
import torch

from attnzoo._checks import NonFiniteError
from attnzoo.ops import _cpu_kernels
from attnzoo.ops.fastmax import fastmax, fastmax_naive

fm = importlib.import_module("attnzoo.ops.fastmax")  # the sub-package (attnzoo.ops.fastmax is also the function)

# (B, H, N, D, Dv): one token, D and Dv of 1, widths that are not whole vectors (17, 33, 47) or are (16, 48, 64),
# N around the 64-token block and the 8-row register block (63, 64, 65, 130)
SHAPES = [
    (1, 1, 1, 1, 1),
    (2, 3, 7, 5, 3),
    (1, 2, 63, 16, 48),
    (1, 1, 64, 48, 16),
    (2, 1, 65, 17, 33),
    (1, 2, 130, 33, 47),
    (1, 1, 200, 64, 64),
]


def _qkv(shape, dtype=torch.float64, grad=False):
    b, h, n, d, dv = shape
    ts = [torch.randn(b, h, n, x, dtype=dtype) for x in (d, d, dv)]
    return [t.requires_grad_(grad) for t in ts]


@pytest.mark.parametrize("scale", [None, "1/D"])
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_and_gradients_match_naive_float64(shape, scale):
    torch.manual_seed(0)
    q, k, v = _qkv(shape, grad=True)
    s = None if scale is None else 1.0 / shape[3]
    g = torch.randn(shape[:3] + (shape[4],), dtype=torch.float64)
    got = fastmax(q, k, v, p=1, scale=s, backend="cpu")
    ref = fastmax_naive(q, k, v, p=1, causal=False, scale=s)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-10)
    for a, b in zip(torch.autograd.grad(got, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("shape", SHAPES)
def test_float32_forward_and_gradients_close_to_float64(shape):
    torch.manual_seed(1)
    q, k, v = _qkv(shape, grad=True)
    s = 1.0 / shape[3]
    ref = fastmax_naive(q, k, v, p=1, causal=False, scale=s)
    g = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, (q, k, v), g)
    q32, k32, v32 = (t.detach().float().requires_grad_(True) for t in (q, k, v))
    got = fastmax(q32, k32, v32, p=1, scale=s, backend="cpu")
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-5)
    for a, b in zip(torch.autograd.grad(got, (q32, k32, v32), g.float()), ref_grads, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-3, atol=1e-4)


def test_inference_path_equals_training_path_and_no_grad():
    torch.manual_seed(2)
    q, k, v = _qkv((2, 3, 77, 24, 40), dtype=torch.float32, grad=True)
    with torch.no_grad():
        a = fastmax(q, k, v, p=1, backend="cpu")
    b = fastmax(q, k, v, p=1, backend="cpu")
    assert b.requires_grad and not a.requires_grad
    assert torch.equal(a, b)


def test_strided_head_views_and_gradcheck():
    # the layers hand over "b n (three h d) -> three b h n d" views of one projection: not copied, same values
    torch.manual_seed(3)
    b, n, h, d = 2, 19, 3, 6
    x = torch.randn(b, n, 3 * h * d, dtype=torch.float64, requires_grad=True)
    q, k, v = x.view(b, n, 3, h, d).permute(2, 0, 3, 1, 4)
    assert not q.is_contiguous()
    out = fastmax(q, k, v, p=1, backend="cpu")
    ref = fastmax_naive(q.contiguous(), k.contiguous(), v.contiguous(), p=1, causal=False, scale=d**-0.5)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    assert torch.autograd.gradcheck(lambda t: fastmax(*t.view(b, n, 3, h, d).permute(2, 0, 3, 1, 4), p=1), (x,))


def test_auto_takes_the_kernel_on_cpu_for_the_unmasked_p1_op(monkeypatch):
    assert fm.fastmax_cpu.simd_kernel() == bool(_cpu_kernels.required_cpu_kernels().fastmax_p1_simd())
    calls = []
    real = fm.fastmax_cpu.fastmax_p1_cpu
    monkeypatch.setattr(fm.fastmax_cpu, "fastmax_p1_cpu", lambda *a: calls.append(1) or real(*a))
    q, k, v = _qkv((1, 2, 9, 4, 4), dtype=torch.float32)
    fastmax(q, k, v, p=1, backend="cpu")
    assert calls == [1]
    fastmax(q, k, v, p=1)  # auto: the kernel where it is the vector build, else the PyTorch path
    assert calls == [1, 1] if fm.fastmax_cpu.simd_kernel() else [1]
    for kw in ({"p": 2}, {"p": 1, "causal": True}, {"p": 1, "backend": "torch"}):
        fastmax(q, k, v, **kw)
    fastmax(q.half(), k.half(), v.half(), p=1, backend="cpu")  # half inputs: the PyTorch path, in float32
    assert len(calls) == (2 if fm.fastmax_cpu.simd_kernel() else 1)


@pytest.mark.parametrize("name", ["q", "k", "v"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nonfinite_inputs_raise_naming_the_input(name, bad):
    q, k, v = _qkv((1, 2, 70, 5, 6), dtype=torch.float32)
    t = {"q": q, "k": k, "v": v}[name]
    t[0, 1, 66, 2] = bad
    with pytest.raises(NonFiniteError, match=rf"fastmax: {name} .*(NaN|Inf)") as e:
        fastmax(q, k, v, p=1, backend="cpu")
    assert e.value.names == (name,)


def test_overflowing_magnitudes_raise_as_before():
    q, k, v = _qkv((1, 1, 8, 4, 4), dtype=torch.float32)
    with pytest.raises(NonFiniteError, match="variance of q") as e:
        fastmax(q * 1e19, k, v, p=1, backend="cpu")
    assert e.value.kind == "overflow"
    with pytest.raises(NonFiniteError, match="moment sums") as e:
        fastmax(q, k, v * 1e37, p=1, backend="cpu")
    assert e.value.names == ("v",)


def test_p1_normaliser_crossing_zero_is_named():
    # D = 2 with |x| large against eps: q_hat = (1, -1), the first key's k_hat = (-1, 1) (s = -2, f = -1) and the
    # constant second key's k_hat = 0 (f = 1): the row's normaliser is exactly 0
    q = torch.tensor([[[[1000.0, -1000.0]]]])
    k = torch.tensor([[[[-1000.0, 1000.0], [5.0, 5.0]]]])
    v = torch.ones(1, 1, 2, 3)
    with pytest.raises(NonFiniteError, match=r"normaliser .* crossed zero"):
        fastmax(q.expand(1, 1, 2, 2).contiguous(), k, v, p=1, scale=1.0, backend="cpu")
    # the same row with the guaranteed-average scale 1/D is finite
    assert torch.isfinite(fastmax(q.expand(1, 1, 2, 2).contiguous(), k, v, p=1, scale=0.5, backend="cpu")).all()


def test_explicit_cpu_backend_without_kernels_says_why(monkeypatch):
    monkeypatch.setattr(_cpu_kernels, "cpu_kernels", lambda: None)
    monkeypatch.setattr(_cpu_kernels, "cpu_kernels_error", lambda: "no compiler")
    q, k, v = _qkv((1, 1, 4, 3, 3), dtype=torch.float32)
    for p in (1, 2):
        with pytest.raises(RuntimeError, match="backend='cpu' needs attnzoo's CPU kernels: no compiler"):
            fastmax(q, k, v, p=p, backend="cpu")
    torch.testing.assert_close(fastmax(q, k, v, p=1), fastmax(q, k, v, p=1, backend="torch"))  # auto: PyTorch path


def test_kernel_rejects_bad_layouts():
    kernels = _cpu_kernels.required_cpu_kernels()
    q = torch.randn(1, 1, 4, 3)
    with pytest.raises(RuntimeError, match="unit stride"):
        kernels.fastmax_p1_unmasked(q.transpose(2, 3).contiguous().transpose(2, 3), q, q, 1.0, 1e-5, False)
    with pytest.raises(RuntimeError, match=r"\(B, H, N, D\)"):
        kernels.fastmax_p1_unmasked(q, q[..., :2], q, 1.0, 1e-5, False)
    with pytest.raises(RuntimeError, match="one dtype"):
        kernels.fastmax_p1_unmasked(q, q.double(), q, 1.0, 1e-5, False)


# (B, H, N, D, Dv) for the feature-map kernel (ops/_kernels/feature_attention.cpp with Fastmax's features): feature
# rows of 1 + D (p=1) and 1 + D + D(D+1)/2 (p=2, the symmetric half), the longer ones padded to whole vectors
# (D = 8: 45 -> 48 in float64; D = 17: 171 -> 176)
FEATURE_SHAPES = [(1, 1, 1, 1, 1), (2, 3, 7, 5, 3), (1, 2, 21, 8, 6), (1, 1, 9, 17, 5)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("shape", FEATURE_SHAPES)
def test_feature_kernel_matches_naive(shape, p, causal, dtype, monkeypatch):
    # what the fused p=1 kernel does not take (causal, p=2) runs the feature-map kernel: no PyTorch sweeps
    monkeypatch.setattr(fm, "fastmax_factorized", None)
    monkeypatch.setattr(fm, "masked_sweeps", None)
    torch.manual_seed(7)
    q, k, v = _qkv(shape, grad=True)
    s = 1.0 / shape[3] if p == 1 else None
    ref = fastmax_naive(q, k, v, p=p, causal=causal, scale=s)
    g = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, (q, k, v), g)
    ins = [t.detach().to(dtype).requires_grad_(True) for t in (q, k, v)]
    if p == 1 and not causal:
        monkeypatch.setattr(fm, "_kernel_covers", lambda *a: False)  # the feature kernel for this case too
    got = fastmax(*ins, p=p, causal=causal, scale=s, backend="cpu")
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got.double(), ref, **tol)
    gtol = dict(rtol=1e-9, atol=1e-9) if dtype == torch.float64 else dict(rtol=1e-3, atol=1e-4)
    for a, b in zip(torch.autograd.grad(got, ins, g.to(dtype)), ref_grads, strict=True):
        torch.testing.assert_close(a.double(), b, **gtol)
