"""MEGA attention with padding masks and packed rows: within each sequence, chunks from its start."""

from __future__ import annotations

import pytest
import torch
from varlen_cases import MODES, assert_equal_to_alone

from attnzoo.layers.mega import MegaLayer
from attnzoo.ops.mega import mega_attention

LENGTHS = [5, 1, 7, 3]  # 1, and lengths not divisible by the chunk sizes


def _seqs(lengths, z=3, e=4, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        {
            "q": torch.randn(1, n, z, generator=g, dtype=dtype),
            "k": torch.randn(1, n, z, generator=g, dtype=dtype),
            "v": torch.randn(1, n, e, generator=g, dtype=dtype),
        }
        for n in lengths
    ]


def _call(fn, chunk_size, backend, causal=False):
    def call(q, k, v, rel_bias, attention_mask=None, cu_seqlens=None):
        kw = dict(attention_mask=attention_mask, cu_seqlens=cu_seqlens, causal=causal)
        return mega_attention(q, k, v, rel_bias, fn=fn, chunk_size=chunk_size, backend=backend, **kw)

    return call


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", ["naive", "torch", "auto"])
@pytest.mark.parametrize("chunk_size", [None, 1, 2, 3, 16])
@pytest.mark.parametrize("fn", ["softmax", "laplace"])
def test_equal_to_alone_float64(fn, chunk_size, backend, mode):
    bias = torch.randn(2 * 8 - 1, dtype=torch.float64)
    axes = {"q": 1, "k": 1, "v": 1}
    call = _call(fn, chunk_size, backend)
    assert_equal_to_alone(call, _seqs(LENGTHS), axes, mode=mode, shared={"rel_bias": bias}, out_axis=1)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", ["naive", "torch"])
@pytest.mark.parametrize("chunk_size", [None, 1, 3])
@pytest.mark.parametrize("fn", ["softmax", "laplace"])
def test_causal_equal_to_alone_float64(fn, chunk_size, backend, mode):
    bias = torch.randn(2 * 8 - 1, dtype=torch.float64)
    call = _call(fn, chunk_size, backend, causal=True)
    axes = {"q": 1, "k": 1, "v": 1}
    assert_equal_to_alone(call, _seqs(LENGTHS, seed=3), axes, mode=mode, shared={"rel_bias": bias}, out_axis=1)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("chunk_size", [None, 4])
@pytest.mark.parametrize("fn", ["softmax", "laplace"])
def test_equal_to_alone_float32(fn, chunk_size, mode):
    bias = torch.randn(2 * 9 - 1)
    seqs = _seqs([9, 1, 6], dtype=torch.float32)
    call = _call(fn, chunk_size, "torch")
    axes = {"q": 1, "k": 1, "v": 1}
    assert_equal_to_alone(call, seqs, axes, mode=mode, shared={"rel_bias": bias}, out_axis=1, rtol=1e-4, atol=1e-5)


def test_bias_must_cover_the_longest_sequence():
    q = torch.randn(1, 9, 3)
    cu = torch.tensor([0, 3, 9])
    mega_attention(q, q, q, torch.randn(11), cu_seqlens=cu)  # R = 6 covers sequences of 3 and 6
    with pytest.raises(ValueError, match=r"R >= 6"):
        mega_attention(q, q, q, torch.randn(9), cu_seqlens=cu)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "options",
    [
        {"attention": "softmax"},
        {"attention": "laplace", "chunk_size": 2},
        {"attention": "softmax", "chunk_size": 3, "prenorm": False, "norm_layer": "scalenorm"},
        {"attention": "csp", "csp_groups": 1, "shift_schedule": "linear"},
        {"attention": "csp", "csp_groups": None, "shift_schedule": "power", "num_layers": 2, "layer_index": 1},
    ],
)
def test_layer_equal_to_alone(options, mode):
    torch.manual_seed(0)
    layer = MegaLayer(6, 1, ndim=3, zdim=4, hdim=5, max_len=8, **options).double()
    g = torch.Generator().manual_seed(2)
    seqs = [{"x": torch.randn(1, n, 6, generator=g, dtype=torch.float64)} for n in (5, 1, 4)]
    assert_equal_to_alone(layer, seqs, {"x": 1}, mode=mode, out_axis=1)
    assert MegaLayer.supports_masks


def test_layer_errors_with_masks():
    x, mask = torch.randn(2, 4, 6), torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    with pytest.raises(ValueError, match="batchnorm"):
        MegaLayer(6, 1, norm_layer="batchnorm").train()(x, attention_mask=mask)
    with pytest.raises(ValueError, match="needs N divisible by csp_groups, got N=3"):
        MegaLayer(6, 1, attention="csp", csp_groups=2)(x, attention_mask=mask)
