"""linear_attention with padding masks and packed rows: per-sequence moment sums, causal scans restarted
at each sequence start (chunk sizes that cut sequences anywhere), every backend."""

import pytest
import torch
from conftest import mask_backends

from attnzoo.ops.linear import LINEAR, linear_attention, linear_attention_recurrent, linear_attention_weights


@pytest.mark.parametrize("backend", mask_backends(LINEAR, reference=False))
@pytest.mark.parametrize("causal", [False, True])
def test_holed_mask_and_empty_row_match_reference(causal, backend):
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(3, 2, 23, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    mask = torch.rand(3, 23, generator=gen) > 0.4
    mask[1] = False
    ref = linear_attention(q, k, v, causal=causal, backend="naive", attention_mask=mask)
    got = linear_attention(q, k, v, causal=causal, backend=backend, attention_mask=mask, chunk_size=4)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-11)
    assert bool((got[1] == 0).all())
    # eps = 0: the padding rows are still 0, not 0 / 0
    out = linear_attention(
        q, k, v, causal=causal, feature_map="relu", eps=0.0, attention_mask=mask, chunk_size=4, backend=backend
    )
    assert bool((out.transpose(1, 2)[~mask] == 0).all())


def test_weights_with_a_mask_stay_within_each_sequence():
    gen = torch.Generator().manual_seed(6)
    q, k = (torch.randn(1, 1, 6, 3, generator=gen, dtype=torch.float64) for _ in range(2))
    cu = torch.tensor([0, 2, 6])
    a = linear_attention_weights(q, k, causal=False, feature_map="elu", eps=0.0, cu_seqlens=cu)[0, 0]
    assert bool((a[:2, 2:] == 0).all()) and bool((a[2:, :2] == 0).all())
    torch.testing.assert_close(a.sum(-1), torch.ones(6, dtype=torch.float64))


def test_recurrent_decoding_from_each_prompt_alone_equals_the_padded_batch_forward():
    # the model resets state per row: decoding each real prompt from an empty state gives the masked forward
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 2, 6, 3, generator=gen, dtype=torch.float64) for _ in range(3))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]]).bool()
    full = linear_attention(q, k, v, causal=True, attention_mask=mask)
    for b in range(2):
        idx = mask[b].nonzero().flatten()
        alone, _ = linear_attention_recurrent(*(t[b : b + 1, :, idx] for t in (q, k, v)))
        torch.testing.assert_close(full[b : b + 1, :, idx], alone, rtol=1e-10, atol=1e-11)
