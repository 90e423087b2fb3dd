"""xca: the Gram-folded fast path vs the explicit XCiT reference, equivariance, temperatures, errors."""

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_half_close

from attnzoo.ops.xca import xca, xca_weights


def _qkv(shape, dtype, requires_grad=False):
    return [torch.randn(shape, dtype=dtype, requires_grad=requires_grad) for _ in range(3)]


@pytest.mark.parametrize("backend", ["naive", "torch"])
def test_gradcheck(backend):
    q, k, v = _qkv((1, 2, 4, 2), torch.float64, requires_grad=True)
    temp = torch.tensor([0.7, 1.3], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c, t: xca(a, b, c, t, backend=backend), (q, k, v, temp))


@pytest.mark.parametrize("backend", ["naive", "torch"])
def test_matches_xcit_definition(backend):
    q, k, v = _qkv((2, 2, 6, 4), torch.float64)
    temp = torch.tensor([0.5, 2.0], dtype=torch.float64)
    # XCiT: channels-first, normalise each channel over tokens, (d, d) map, attn @ v
    qt, kt, vt = (t.transpose(-1, -2) for t in (q, k, v))
    attn = (F.normalize(qt, dim=-1) @ F.normalize(kt, dim=-1).transpose(-1, -2) * temp[:, None, None]).softmax(-1)
    expected = (attn @ vt).transpose(-1, -2)
    torch.testing.assert_close(xca(q, k, v, temp, backend=backend), expected)
    torch.testing.assert_close(xca_weights(q, k, temp.reshape(2, 1, 1)), attn)


@pytest.mark.parametrize("backend", ["naive", "torch"])
def test_zero_temperature_averages_channels(backend):
    q, k, v = _qkv((1, 2, 5, 4), torch.float64)
    out = xca(q, k, v, 0.0, backend=backend)
    torch.testing.assert_close(out, v.mean(-1, keepdim=True).expand_as(v))


@pytest.mark.parametrize("backend", ["naive", "torch"])
def test_temperature_shapes_agree(backend):
    q, k, v = _qkv((2, 3, 5, 4), torch.float64)
    t = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    a = xca(q, k, v, t, backend=backend)
    torch.testing.assert_close(a, xca(q, k, v, t.reshape(3, 1, 1), backend=backend))
    full = torch.full((3,), 1.5, dtype=torch.float64)
    torch.testing.assert_close(xca(q, k, v, 1.5, backend=backend), xca(q, k, v, full, backend=backend))


@pytest.mark.parametrize("backend", ["naive", "torch"])
def test_token_permutation_equivariance(backend):
    q, k, v = _qkv((2, 3, 11, 4), torch.float64)
    perm = torch.randperm(11)
    t = torch.rand(3, dtype=torch.float64) + 0.5
    out = xca(q, k, v, t, backend=backend)
    outp = xca(q[:, :, perm], k[:, :, perm], v[:, :, perm], t, backend=backend)
    torch.testing.assert_close(outp, out[:, :, perm])


def test_zero_channel_gives_finite_equal_results():
    q, k, v = _qkv((1, 1, 6, 4), torch.float64)
    q[..., 1] = 0.0
    k[..., 2] = 0.0
    a = xca(q, k, v, 1.0, backend="naive")
    b = xca(q, k, v, 1.0, backend="torch")
    assert torch.isfinite(a).all()
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_close_to_float32(dtype):
    q, k, v = _qkv((2, 2, 64, 8), torch.float32)
    ref = xca(q, k, v, 1.0, backend="naive")
    for backend in ("naive", "torch"):
        out = xca(q.to(dtype), k.to(dtype), v.to(dtype), torch.ones(2, dtype=dtype), backend=backend)
        assert out.dtype == dtype
        assert_half_close(out, ref)


def test_no_causal_form():
    q, k, v = _qkv((1, 1, 3, 2), torch.float32)
    with pytest.raises(TypeError, match="causal"):
        xca(q, k, v, 1.0, causal=True)


def test_errors():
    q, k, v = _qkv((1, 2, 4, 3), torch.float32)
    with pytest.raises(ValueError, match="must have one shape"):
        xca(q, k, torch.randn(1, 2, 5, 3), 1.0)
    with pytest.raises(ValueError, match=r"temp must have shape \(2,\) or \(2, 1, 1\) for H=2, got \(3,\)"):
        xca(q, k, v, torch.ones(3))
    with pytest.raises(TypeError, match="temp must be a number or a tensor"):
        xca(q, k, v, [1.0, 1.0])
    with pytest.raises(ValueError, match="temp contains non-finite values"):
        xca(q, k, v, torch.tensor([1.0, float("nan")]))
    bad = v.clone()
    bad[0, 0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="v contains non-finite values"):
        xca(q, k, bad, 1.0)
    with pytest.raises(ValueError, match=r"shape \(B, H, N, P\)"):
        xca(q[0], k[0], v[0], 1.0)
    with pytest.raises(ValueError, match="valid backends"):
        xca(q, k, v, 1.0, backend="fused")
