"""softmax_attention with padding masks and packed rows: each sequence as if alone, every backend."""

import pytest
import torch
from conftest import mask_backends

from attnzoo.ops.softmax import SOFTMAX, softmax_attention


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("backend", mask_backends(SOFTMAX))
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
