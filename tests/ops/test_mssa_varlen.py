"""mssa with padding masks and packed rows: each sequence as if alone, every backend."""

import pytest
import torch
from varlen_cases import MODES, assert_equal_to_alone

from attnzoo.ops.mssa import mssa

LENGTHS = [(1, 4, 7), (5,), (3, 1, 6, 2)]


def _seqs(lengths, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [{"w": torch.randn(1, 2, n, 3, generator=gen, dtype=dtype)} for n in lengths]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("normalize_query", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("backend", ["naive", "torch"])
@pytest.mark.parametrize("lengths", LENGTHS)
def test_equal_to_alone_float64(backend, causal, normalize_query, mode, lengths):
    def call(**kw):
        return mssa(**kw, causal=causal, normalize_query=normalize_query, scale=0.8, backend=backend)

    assert_equal_to_alone(call, _seqs(lengths, torch.float64), {"w": 2}, mode=mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("backend", ["naive", "torch"])
def test_equal_to_alone_float32(backend, causal, mode):
    call = lambda **kw: mssa(**kw, causal=causal, normalize_query=True, backend=backend)  # noqa: E731
    assert_equal_to_alone(call, _seqs((2, 9, 5), torch.float32), {"w": 2}, mode=mode, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", ["naive", "torch"])
def test_masked_causal_does_not_leak(backend):
    w = torch.randn(1, 2, 9, 3, dtype=torch.float64)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    out = mssa(w, causal=True, backend=backend, cu_seqlens=cu)
    w2 = w.clone()
    w2[:, :, 6:] += 5
    out2 = mssa(w2, causal=True, backend=backend, cu_seqlens=cu)
    torch.testing.assert_close(out2[:, :, :6], out[:, :, :6], atol=0, rtol=0)
    assert not torch.allclose(out2[:, :, 6:], out[:, :, 6:])


def test_mask_errors_are_clear():
    w = torch.randn(2, 1, 4, 3)
    with pytest.raises(ValueError, match="batch size 1, got B=2"):
        mssa(w, cu_seqlens=torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="only 0/1"):
        mssa(w, attention_mask=torch.full((2, 4), 3))
