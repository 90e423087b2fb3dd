"""The fused CPU kernel of feature-map attention (ops/_kernels/feature_attention.cpp) as linear attention's backend
against the explicit reference."""

import pytest
import torch

from attnzoo.ops import _cpu_kernels
from attnzoo.ops._dispatch import resolve_backend
from attnzoo.ops.linear import LINEAR, linear_attention

# (B, H, N, P, R): one token, widths of 1, widths that are not whole groups of 4 or whole vectors (5, 17, 33),
# lengths around the kernel's 4-token groups (3, 4, 5) and longer ones
SHAPES = [
    (1, 1, 1, 1, 1),
    (2, 3, 7, 5, 3),
    (1, 2, 3, 16, 48),
    (1, 1, 4, 48, 16),
    (2, 1, 5, 17, 33),
    (1, 2, 130, 33, 47),
    (1, 1, 200, 64, 64),
]


def _qkv(shape, dtype=torch.float64, scale=1.0):
    b, h, n, p, r = shape
    return [(scale * torch.randn(b, h, n, x, dtype=dtype)).requires_grad_(True) for x in (p, p, r)]


def _grads(out, inputs, g):
    return torch.autograd.grad(out, inputs, g)


@pytest.mark.parametrize("feature_map", ["elu", "relu"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_and_gradients_match_naive_float64(shape, causal, feature_map):
    torch.manual_seed(0)
    q, k, v = _qkv(shape, scale=2.0)
    kw = dict(causal=causal, feature_map=feature_map)
    got = linear_attention(q, k, v, backend="cpu", **kw)
    ref = linear_attention(q, k, v, backend="naive", **kw)
    g = torch.randn_like(ref)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)
    for a, b in zip(_grads(got, (q, k, v), g), _grads(ref, (q, k, v), g), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES[1:])
def test_float32_close_to_float64(shape, causal):
    torch.manual_seed(1)
    q, k, v = _qkv(shape)
    ref = linear_attention(q, k, v, backend="naive", causal=causal)
    g = torch.randn_like(ref)
    ref_grads = _grads(ref, (q, k, v), g)
    q32, k32, v32 = (t.detach().float().requires_grad_(True) for t in (q, k, v))
    got = linear_attention(q32, k32, v32, backend="cpu", causal=causal)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-5)
    for a, b in zip(_grads(got, (q32, k32, v32), g.float()), ref_grads, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-3, atol=1e-4)


def _exact_causal(q, k, v, eps=1e-6):
    # elu + 1 written as exp(x) for x <= 0: torch's elu(x) + 1 cancels to 0 below x ~ -37 (float64), the kernel not
    fq, fk = (torch.where(x > 0, x + 1, torch.exp(x.clamp_max(0))) for x in (q, k))
    w = (fq @ fk.transpose(-1, -2)).tril()
    return (w @ v) / (w.sum(-1, keepdim=True) + eps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_feature_map_exp_over_its_whole_range(dtype):
    # elu + 1 = exp(x) for x <= 0, computed by the kernel's own vectorisable exp: queries and keys spread over
    # [-800, 5] (beyond float32's and float64's normal range of exp) give the exact formula's output and gradients
    torch.manual_seed(2)
    q = torch.cat([torch.linspace(-800, -100, 64), torch.linspace(-100, 5, 960)]).reshape(1, 2, 64, 8).double()
    k = q.flip(-2).clone()
    v = torch.randn(1, 2, 64, 8, dtype=torch.float64)
    ins = [t.to(dtype).requires_grad_(True) for t in (q, k, v)]
    ref_ins = [t.clone().requires_grad_(True) for t in (q, k, v)]
    got = linear_attention(*ins, backend="cpu", causal=True)
    ref = _exact_causal(*ref_ins)
    tol = dict(rtol=1e-11, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got.double(), ref, **tol)
    g = torch.randn_like(ref)
    for a, b in zip(_grads(got, ins, g.to(dtype)), _grads(ref, ref_ins, g), strict=True):
        torch.testing.assert_close(a.double(), b, **tol)


def test_inference_path_equals_training_path():
    torch.manual_seed(3)
    q, k, v = _qkv((2, 3, 77, 24, 40), dtype=torch.float32)
    with torch.no_grad():
        a = linear_attention(q, k, v, backend="cpu", causal=True)
    b = linear_attention(q, k, v, backend="cpu", causal=True)
    assert b.requires_grad and not a.requires_grad
    assert torch.equal(a, b)


@pytest.mark.parametrize("causal", [False, True])
def test_strided_head_views_and_gradcheck(causal):
    # the layers hand over "b n (three h d) -> three b h n d" views of one projection: read in place, same values
    torch.manual_seed(4)
    b, n, h, d = 2, 9, 3, 5
    x = torch.randn(b, n, 3 * h * d, dtype=torch.float64, requires_grad=True)

    def fn(x):
        q, k, v = x.view(b, n, 3, h, d).permute(2, 0, 3, 1, 4)
        assert not q.is_contiguous()
        return linear_attention(q, k, v, backend="cpu", causal=causal)

    q, k, v = x.detach().view(b, n, 3, h, d).permute(2, 0, 3, 1, 4)
    ref = linear_attention(q.contiguous(), k.contiguous(), v.contiguous(), backend="naive", causal=causal)
    torch.testing.assert_close(fn(x), ref, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(fn, (x,))


@pytest.mark.parametrize("causal", [False, True])
def test_masked_gradcheck(causal):
    torch.manual_seed(5)
    q, k, v = _qkv((2, 2, 7, 3, 2))
    mask = torch.tensor([[0, 1, 1, 0, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    assert torch.autograd.gradcheck(
        lambda a, b, c: linear_attention(a, b, c, backend="cpu", causal=causal, attention_mask=mask), (q, k, v)
    )


def test_auto_takes_the_kernel_for_float_cpu_tensors_only(monkeypatch):
    opts = dict(causal=False, feature_map="elu", eps=1e-6, chunk_size=None, attention_mask=None, cu_seqlens=None)

    def pick(dtype):
        x = torch.zeros(1, 1, 4, 2, dtype=dtype)
        return resolve_backend(LINEAR, "auto", x, inputs=(x, x, x), options=opts)

    assert pick(torch.float32) == "cpu" and pick(torch.float64) == "cpu"
    assert pick(torch.bfloat16) == "torch"
    monkeypatch.setattr(_cpu_kernels, "cpu_kernels", lambda: None)  # no compiler: the PyTorch path
    assert pick(torch.float32) == "torch"


def test_half_inputs_named_cpu_run_the_pytorch_path():
    torch.manual_seed(6)
    q, k, v = (torch.randn(1, 2, 9, 4, dtype=torch.bfloat16) for _ in range(3))
    got = linear_attention(q, k, v, backend="cpu", causal=True)
    ref = linear_attention(q, k, v, backend="torch", causal=True)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, ref, rtol=0, atol=0)


def _forward_ad_cases():
    from attnzoo.ops.fastmax import fastmax

    k, v = (torch.randn(1, 2, 40, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(s)) for s in (8, 9))
    return [
        ("linear", lambda q, **kw: linear_attention(q, k, v, causal=True, **kw)),
        ("fastmax p=1", lambda q, **kw: fastmax(q, k, v, p=1, scale=0.25, **kw)),
        ("fastmax p=2 causal", lambda q, **kw: fastmax(q, k, v, p=2, causal=True, **kw)),
    ]


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("case", range(3))
def test_forward_ad_and_torch_func_get_the_reference_derivatives(case, masked):
    # the kernels' autograd Functions define no jvp: "auto" must not drop a forward-mode tangent (it did, silently,
    # when the kernel ran without requires_grad) nor fail under torch.func; it takes the PyTorch path then
    import torch.autograd.forward_ad as fwAD

    name, fn = _forward_ad_cases()[case]
    gen = torch.Generator().manual_seed(10)
    q, t = (torch.randn(1, 2, 40, 4, dtype=torch.float64, generator=gen) for _ in range(2))
    mask = torch.ones(1, 40, dtype=torch.bool)
    mask[0, :7] = False
    kw = {"attention_mask": mask} if masked else {}
    tangents = []
    for backend in ("auto", "naive"):
        with fwAD.dual_level():
            tangents.append(fwAD.unpack_dual(fn(fwAD.make_dual(q, t), backend=backend, **kw)).tangent)
    assert tangents[0] is not None, name
    torch.testing.assert_close(tangents[0], tangents[1], rtol=1e-9, atol=1e-10)
    grad = torch.func.grad(lambda a: fn(a, **kw).square().sum())(q)
    x = q.clone().requires_grad_(True)
    (ref,) = torch.autograd.grad(fn(x, backend="naive", **kw).square().sum(), x)
    torch.testing.assert_close(grad, ref, rtol=1e-9, atol=1e-10)
    with fwAD.dual_level(), pytest.raises(ValueError, match="forward-mode AD"):
        fn(fwAD.make_dual(q, t), backend="cpu", **kw)
