"""linear_attention with padding masks and packed rows: per-sequence moment sums, causal scans restarted
at each sequence start (chunk sizes that cut sequences anywhere), every backend."""

import pytest
import torch
from varlen_cases import MODES, assert_equal_to_alone

from attnzoo.ops.linear import linear_attention, linear_attention_recurrent, linear_attention_weights

AXES = {"q": 2, "k": 2, "v": 2}
LENGTHS = [(1, 4, 7), (5,), (3, 1, 6, 2, 5), (1, 17, 40, 3)]


def _seqs(lengths, dtype, seed=0, p=3, pv=4):
    gen = torch.Generator().manual_seed(seed)

    def one(n, width):
        return torch.randn(1, 2, n, width, generator=gen, dtype=dtype)

    return [{"q": one(n, p), "k": one(n, p), "v": one(n, pv)} for n in lengths]


# the reference and the kernel have no chunks (the kernel's groups of 4 tokens cut the lengths above anywhere); the
# torch path's chunks of 1, 3 and 4 cut the sequences anywhere
BACKENDS = [(b, c, None) for b in ("naive", "cpu") for c in (False, True)] + [
    ("torch", c, cs) for c, cs in ((False, None), (True, None), (True, 1), (True, 3), (True, 4))
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend,causal,chunk_size", BACKENDS)
@pytest.mark.parametrize("lengths", LENGTHS)
def test_equal_to_alone_float64(backend, causal, chunk_size, mode, lengths):

    def call(**kw):
        return linear_attention(**kw, causal=causal, chunk_size=chunk_size, backend=backend)

    assert_equal_to_alone(call, _seqs(lengths, torch.float64), AXES, mode=mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("feature_map", ["elu", "relu"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("backend", ["naive", "torch", "cpu"])
def test_equal_to_alone_float32(backend, causal, feature_map, mode):
    def call(**kw):
        return linear_attention(**kw, causal=causal, feature_map=feature_map, chunk_size=4, backend=backend)

    assert_equal_to_alone(call, _seqs((2, 9, 13), torch.float32), AXES, mode=mode, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "cpu"])
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


@pytest.mark.parametrize("backend", ["naive", "torch", "cpu"])
def test_packed_causal_does_not_leak_across_or_forward(backend):
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 12, 3, generator=gen, dtype=torch.float64) for _ in range(3))
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    out = linear_attention(q, k, v, causal=True, backend=backend, cu_seqlens=cu, chunk_size=3)
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    for x in (q2, k2, v2):
        x[:, :, 7:] += 5
    out2 = linear_attention(q2, k2, v2, causal=True, backend=backend, cu_seqlens=cu, chunk_size=3)
    torch.testing.assert_close(out2[:, :, :7], out[:, :, :7], atol=0, rtol=0)
    assert not torch.allclose(out2[:, :, 7:], out[:, :, 7:])


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
