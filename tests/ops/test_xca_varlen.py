"""xca with padding masks and packed rows: channel covariances over each sequence's real tokens."""

import pytest
import torch

from attnzoo.ops.xca import xca


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
