"""softmax_attention: SDPA fast path vs the explicit reference, causality, equivariance, errors."""

import pytest
import torch
from conftest import assert_half_close

from attnzoo.ops.softmax import softmax_attention, softmax_attention_weights


def _qkv(shape, dtype, requires_grad=False):
    return [torch.randn(shape, dtype=dtype, requires_grad=requires_grad) for _ in range(3)]


@pytest.mark.parametrize("backend", ["naive", "torch"])
@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck(backend, causal):
    q, k, v = _qkv((1, 2, 4, 2), torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b, c: softmax_attention(a, b, c, causal=causal, scale=0.7, backend=backend), (q, k, v)
    )


def test_cross_attention_different_lengths():
    q = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    k = torch.randn(2, 3, 9, 5, dtype=torch.float64)
    v = torch.randn(2, 3, 9, 6, dtype=torch.float64)
    a = softmax_attention(q, k, v, backend="naive")
    b = softmax_attention(q, k, v, backend="torch")
    assert a.shape == (2, 3, 4, 6)
    torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("backend", ["naive", "torch"])
def test_matches_definition(backend):
    q, k, v = _qkv((2, 2, 6, 4), torch.float64)
    scale = 0.3
    logits = torch.einsum("bhip,bhjp->bhij", q, k) * scale
    mask = torch.arange(6)[None, :] > torch.arange(6)[:, None]
    w = torch.exp(logits.masked_fill(mask, -torch.inf))
    expected = torch.einsum("bhij,bhjp->bhip", w / w.sum(-1, keepdim=True), v)
    torch.testing.assert_close(softmax_attention(q, k, v, causal=True, scale=scale, backend=backend), expected)
    # default scale is P ** -0.5
    w = torch.softmax(torch.einsum("bhip,bhjp->bhij", q, k) * 0.5, dim=-1)
    torch.testing.assert_close(softmax_attention(q, k, v, backend=backend), w @ v)


@pytest.mark.parametrize("backend", ["naive", "torch"])
def test_zero_query_causal_gives_running_mean(backend):
    q = torch.zeros(1, 1, 5, 3, dtype=torch.float64)
    k, v = torch.randn(2, 1, 1, 5, 3, dtype=torch.float64)
    out = softmax_attention(q, k, v, causal=True, backend=backend)
    running_mean = v.cumsum(2) / torch.arange(1, 6, dtype=torch.float64)[:, None]
    torch.testing.assert_close(out, running_mean)


@pytest.mark.parametrize("backend", ["naive", "torch"])
def test_noncausal_permutation_equivariance(backend):
    q, k, v = _qkv((2, 3, 11, 4), torch.float64)
    perm = torch.randperm(11)
    out = softmax_attention(q, k, v, backend=backend)
    outp = softmax_attention(q[:, :, perm], k[:, :, perm], v[:, :, perm], backend=backend)
    torch.testing.assert_close(outp, out[:, :, perm])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_close_to_float32(dtype):
    q, k, v = _qkv((2, 2, 12, 8), torch.float32)
    ref = softmax_attention(q, k, v, causal=True, backend="naive")
    for backend in ("naive", "torch"):
        out = softmax_attention(q.to(dtype), k.to(dtype), v.to(dtype), causal=True, backend=backend)
        assert out.dtype == dtype
        assert_half_close(out, ref)


def test_weights_rows_sum_to_one_and_are_causal():
    q, k, _ = _qkv((1, 2, 6, 4), torch.float64)
    w = softmax_attention_weights(q, k, causal=True, scale=0.5)
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 2, 6, dtype=torch.float64))
    assert torch.all(w.triu(1) == 0)


def test_dropout_in_both_backends_keeps_expectation_shape():
    q, k, v = _qkv((1, 1, 8, 4), torch.float32)
    for backend in ("naive", "torch"):
        out = softmax_attention(q, k, v, dropout_p=0.5, backend=backend)
        assert out.shape == v.shape and torch.isfinite(out).all()
        assert not torch.allclose(out, softmax_attention(q, k, v, backend=backend))


def test_errors():
    q, k, v = _qkv((1, 2, 4, 3), torch.float32)
    with pytest.raises(ValueError, match=r"shape \(B, H, N, P\)"):
        softmax_attention(q[0], k, v)
    with pytest.raises(ValueError, match="head size P"):
        softmax_attention(q, torch.randn(1, 2, 4, 5), v)
    with pytest.raises(ValueError, match="same number of tokens"):
        softmax_attention(q, k, torch.randn(1, 2, 5, 3))
    with pytest.raises(ValueError, match=r"agree on \(B, H\)"):
        softmax_attention(q, torch.randn(1, 3, 4, 3), torch.randn(1, 3, 4, 3))
    with pytest.raises(ValueError, match="as many queries as keys"):
        softmax_attention(q, torch.randn(1, 2, 6, 3), torch.randn(1, 2, 6, 3), causal=True)
    with pytest.raises(TypeError, match="share a dtype"):
        softmax_attention(q, k.double(), v)
    with pytest.raises(TypeError, match="floating-point"):
        softmax_attention(q, k, torch.ones(1, 2, 4, 3, dtype=torch.int64))
    bad = q.clone()
    bad[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="q contains non-finite values"):
        softmax_attention(bad, k, v)
    bad = v.clone()
    bad[0, 1, 2, 0] = float("inf")
    with pytest.raises(ValueError, match=r"v contains non-finite values \(0 NaN, 1 Inf\)"):
        softmax_attention(q, k, bad)
    valid = r"backend='cuda' is not supported.*valid backends: \['auto', 'naive', 'torch'"
    with pytest.raises(ValueError, match=valid):
        softmax_attention(q, k, v, backend="cuda")
    with pytest.raises(ValueError, match="scale must be None or a positive finite number"):
        softmax_attention(q, k, v, scale=-1.0)
    with pytest.raises(ValueError, match=r"dropout_p must be a probability in \[0, 1\)"):
        softmax_attention(q, k, v, dropout_p=1.0)


def test_triton_backend_is_refused_without_a_kernel_or_runs_with_one():
    from attnzoo.ops.softmax import SOFTMAX

    q, k, v = _qkv((1, 1, 4, 2), torch.float32)
    if "triton" in SOFTMAX.backend_names():
        assert softmax_attention(q, k, v, backend="triton").shape == v.shape
    else:
        with pytest.raises(
            ValueError,
            match=r"backend='triton' is not supported by softmax_attention; valid "
            r"backends: \['auto', 'naive', 'torch'\]",
        ):
            softmax_attention(q, k, v, backend="triton")
