"""linear_attention: factorised / chunked fast paths and the recurrent form vs the explicit reference."""

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_half_close

from attnzoo.ops.linear import linear_attention, linear_attention_recurrent, linear_attention_weights


def _qkv(shape, dtype, requires_grad=False):
    return [torch.randn(shape, dtype=dtype, requires_grad=requires_grad) for _ in range(3)]


@pytest.mark.parametrize("backend", ["naive", "torch", "cpu"])
@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck(backend, causal):
    q, k, v = _qkv((1, 2, 4, 2), torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b, c: linear_attention(a, b, c, causal=causal, backend=backend, chunk_size=2), (q, k, v)
    )


def test_gradcheck_recurrent():
    q, k, v = _qkv((1, 1, 4, 3), torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c: linear_attention_recurrent(a, b, c)[0], (q, k, v))


@pytest.mark.parametrize("backend", ["naive", "torch", "cpu"])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_katharopoulos_formula(backend, causal):
    q, k = torch.randn(2, 2, 3, 6, 4, dtype=torch.float64)
    v = torch.randn(2, 3, 6, 5, dtype=torch.float64)
    eps = 1e-3
    fq, fk = F.elu(q) + 1, F.elu(k) + 1
    expected = torch.empty_like(v[..., :5])
    for i in range(6):
        js = range(i + 1) if causal else range(6)
        num = sum(torch.einsum("bhp,bhp->bh", fq[:, :, i], fk[:, :, j])[..., None] * v[:, :, j] for j in js)
        den = sum(torch.einsum("bhp,bhp->bh", fq[:, :, i], fk[:, :, j]) for j in js)[..., None] + eps
        expected[:, :, i] = num / den
    out = linear_attention(q, k, v, causal=causal, eps=eps, backend=backend, chunk_size=4)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("n", [1, 6, 13])
def test_recurrent_equals_causal_parallel_and_continues_from_state(n):
    q, k, v = _qkv((2, 2, n, 4), torch.float64)
    par = linear_attention(q, k, v, causal=True)
    rec, (s, z) = linear_attention_recurrent(q, k, v)
    torch.testing.assert_close(rec, par)
    assert s.shape == (2, 2, 4, 4) and z.shape == (2, 2, 4) and s.dtype == torch.float64
    # the final state is the full prefix sum
    fk = F.elu(k) + 1
    torch.testing.assert_close(s, torch.einsum("bhnp,bhnv->bhpv", fk, v))
    torch.testing.assert_close(z, fk.sum(2))
    for cut in sorted({1, n // 2} & set(range(1, n))):  # split points strictly inside the sequence
        first, state = linear_attention_recurrent(q[:, :, :cut], k[:, :, :cut], v[:, :, :cut])
        second, _ = linear_attention_recurrent(q[:, :, cut:], k[:, :, cut:], v[:, :, cut:], state)
        torch.testing.assert_close(torch.cat([first, second], dim=2), par)


def test_recurrent_state_is_float32_for_half_inputs_and_input_state_untouched():
    q, k, v = (t.bfloat16() for t in _qkv((1, 2, 5, 4), torch.float32))
    out, (s, z) = linear_attention_recurrent(q, k, v)
    assert out.dtype == torch.bfloat16 and s.dtype == torch.float32 and z.dtype == torch.float32
    s0, z0 = s.clone(), z.clone()
    linear_attention_recurrent(q[:, :, :1], k[:, :, :1], v[:, :, :1], (s, z))
    assert torch.equal(s, s0) and torch.equal(z, z0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_long_causal_sum_close_to_float64(dtype):
    q, k, v = _qkv((1, 2, 600, 8), torch.float64)
    ref = linear_attention(q, k, v, causal=True, backend="naive")
    out = linear_attention(q.to(dtype), k.to(dtype), v.to(dtype), causal=True, chunk_size=16)
    assert out.dtype == dtype
    assert_half_close(out, ref)


@pytest.mark.parametrize("backend", ["naive", "torch", "cpu"])
def test_noncausal_permutation_equivariance(backend):
    q, k, v = _qkv((2, 3, 11, 4), torch.float64)
    perm = torch.randperm(11)
    out = linear_attention(q, k, v, backend=backend)
    outp = linear_attention(q[:, :, perm], k[:, :, perm], v[:, :, perm], backend=backend)
    torch.testing.assert_close(outp, out[:, :, perm])


def test_weights_are_normalised_kernel():
    q, k, _ = _qkv((1, 2, 6, 4), torch.float64)
    w = linear_attention_weights(q, k, causal=True, feature_map="elu", eps=0.0)
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 2, 6, dtype=torch.float64))
    assert torch.all(w.triu(1) == 0) and torch.all(w >= 0)


def test_errors():
    q, k, v = _qkv((1, 2, 4, 3), torch.float32)
    msg = r"feature_map='softmax' is not supported; valid feature maps: \['elu', 'relu'\]"
    with pytest.raises(ValueError, match=msg):
        linear_attention(q, k, v, feature_map="softmax")
    with pytest.raises(ValueError, match="same number of tokens N"):
        linear_attention(q, k, torch.randn(1, 2, 5, 3))
    with pytest.raises(ValueError, match="head size P"):
        linear_attention(q, torch.randn(1, 2, 4, 2), v)
    with pytest.raises(ValueError, match=r"shape \(B, H, N, P\)"):
        linear_attention(q, k, v[0])
    bad = k.clone()
    bad[0, 0, 1, 1] = float("nan")
    with pytest.raises(ValueError, match="k contains non-finite values"):
        linear_attention(q, bad, v)
    bad = q.clone()
    bad[0, 0, 1, 1] = -float("inf")
    with pytest.raises(ValueError, match="q contains non-finite values"):
        linear_attention_recurrent(bad, k, v)
    with pytest.raises(ValueError, match="chunk_size must be None or a positive integer"):
        linear_attention(q, k, v, causal=True, chunk_size=0)
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        linear_attention(q, k, v, eps=-1.0)
    with pytest.raises(ValueError, match="valid backends"):
        linear_attention(q, k, v, backend="chunked")
    with pytest.raises(ValueError, match="state shapes"):
        linear_attention_recurrent(q, k, v, (torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3)))
    with pytest.raises(TypeError, match="state must be None or a pair of tensors"):
        linear_attention_recurrent(q, k, v, torch.zeros(1, 2, 3, 3))
