"""softmax_attention with padding masks and packed rows: each sequence as if alone, every backend."""

import pytest
import torch
from varlen_cases import MODES, assert_equal_to_alone

from attnzoo.ops.softmax import softmax_attention

LENGTHS = [(1, 4, 7), (5,), (3, 1, 6, 2)]
AXES = {"q": 2, "k": 2, "v": 2}


def _seqs(lengths, dtype, seed=0, p=3, pv=4):
    gen = torch.Generator().manual_seed(seed)

    def one(n, width):
        return torch.randn(1, 2, n, width, generator=gen, dtype=dtype)

    return [{"q": one(n, p), "k": one(n, p), "v": one(n, pv)} for n in lengths]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("backend", ["naive", "torch"])
@pytest.mark.parametrize("lengths", LENGTHS)
def test_equal_to_alone_float64(backend, causal, mode, lengths):
    call = lambda **kw: softmax_attention(**kw, causal=causal, scale=0.6, backend=backend)  # noqa: E731
    assert_equal_to_alone(call, _seqs(lengths, torch.float64), AXES, mode=mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("backend", ["naive", "torch"])
def test_equal_to_alone_float32(backend, causal, mode):
    call = lambda **kw: softmax_attention(**kw, causal=causal, backend=backend)  # noqa: E731
    assert_equal_to_alone(call, _seqs((2, 9, 5), torch.float32), AXES, mode=mode, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", ["naive", "torch"])
def test_masked_causal_does_not_leak(backend):
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 8, 3, generator=gen, dtype=torch.float64) for _ in range(3))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 0, 0]])
    out = softmax_attention(q, k, v, causal=True, backend=backend, attention_mask=mask)
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    for x in (q2, k2, v2):
        x[:, :, 5:] += 5
    out2 = softmax_attention(q2, k2, v2, causal=True, backend=backend, attention_mask=mask)
    torch.testing.assert_close(out2[:, :, :5], out[:, :, :5], atol=0, rtol=0)
    assert not torch.allclose(out2[0, :, 5:], out[0, :, 5:])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("backend", ["naive", "torch"])
def test_all_padding_row_gives_zeros_not_nan(backend, causal):
    q, k, v = (torch.randn(2, 1, 4, 3, requires_grad=True) for _ in range(3))
    mask = torch.tensor([[0, 0, 0, 0], [0, 1, 0, 1]])
    out = softmax_attention(q, k, v, attention_mask=mask, causal=causal, backend=backend)
    assert bool((out[0] == 0).all()) and bool((out[1, :, ::2] == 0).all()) and bool(out.isfinite().all())
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    for g in grads:  # no NaN from the empty row, and padding gets no gradient
        assert bool((g[0] == 0).all()) and bool((g[1, :, ::2] == 0).all()) and bool(g.isfinite().all())


def test_mask_errors_are_clear():
    q, k, v = (torch.randn(1, 1, 4, 3) for _ in range(3))
    with pytest.raises(ValueError, match=r"shape \(B, N\) = \(1, 4\)"):
        softmax_attention(q, k, v, attention_mask=torch.ones(1, 5))
    with pytest.raises(ValueError, match="strictly increasing"):
        softmax_attention(q, k, v, cu_seqlens=torch.tensor([0, 2, 2, 4], dtype=torch.int32))
    with pytest.raises(ValueError, match="not both"):
        softmax_attention(q, k, v, attention_mask=torch.ones(1, 4), cu_seqlens=torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="as many queries as keys"):
        softmax_attention(q[:, :, :1], k, v, attention_mask=torch.ones(1, 4))
