"""xca with padding masks and packed rows: channel covariances over each sequence's real tokens."""

import pytest
import torch
from varlen_cases import MODES, assert_equal_to_alone

from attnzoo.ops.xca import xca

AXES = {"q": 2, "k": 2, "v": 2}
# (3, 1, 6, 2, 5) packs more sequences than channels: the other way of reading each token's sequence map
LENGTHS = [(1, 4, 7), (5,), (3, 1, 6, 2, 5)]


def _seqs(lengths, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [{n: torch.randn(1, 2, m, 3, generator=gen, dtype=dtype) for n in "qkv"} for m in lengths]


def _temp(dtype):
    return torch.tensor([0.7, 1.9], dtype=dtype)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", ["naive", "torch"])
@pytest.mark.parametrize("lengths", LENGTHS)
def test_equal_to_alone_float64(backend, mode, lengths):
    call = lambda temp, **kw: xca(**kw, temp=temp, backend=backend)  # noqa: E731
    seqs = _seqs(lengths, torch.float64)
    assert_equal_to_alone(call, seqs, AXES, mode=mode, shared={"temp": _temp(torch.float64)})


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", ["naive", "torch"])
def test_equal_to_alone_float32(backend, mode):
    call = lambda temp, **kw: xca(**kw, temp=temp, backend=backend)  # noqa: E731
    seqs = _seqs((2, 9, 5), torch.float32)
    assert_equal_to_alone(call, seqs, AXES, mode=mode, shared={"temp": _temp(torch.float32)}, rtol=1e-4, atol=1e-5)


def test_holed_mask_matches_reference_and_empty_row_is_zero():
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(3, 2, 11, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    mask = torch.rand(3, 11, generator=gen) > 0.5
    mask[2] = False
    ref = xca(q, k, v, 1.3, backend="naive", attention_mask=mask)
    got = xca(q, k, v, 1.3, backend="torch", attention_mask=mask)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-11)
    assert bool((got[2] == 0).all())


def test_mask_errors_are_clear():
    q = torch.randn(1, 1, 4, 3)
    with pytest.raises(ValueError, match="must end at the row's length T=4"):
        xca(q, q, q, 1.0, cu_seqlens=torch.tensor([0, 3]))
    with pytest.raises(TypeError, match="int32 or int64"):
        xca(q, q, q, 1.0, cu_seqlens=torch.tensor([0.0, 4.0]))
