"""SoftmaxAttention module: layout, causality, KV-cache decoding, internals, options, compile."""

import math

import pytest
import torch

import attnzoo
from attnzoo.layers import capture_internals
from attnzoo.layers.softmax import SoftmaxAttention

DIM, HEADS = 12, 3


def _build(**kw):
    return attnzoo.build_attention("softmax", DIM, HEADS, **kw).double().eval()


def _reference(m, x, causal):
    # nanoGPT-style forward written from the layout: c_attn split, per-head softmax(q k^T / sqrt(P)) v, c_proj.
    b, n, _ = x.shape
    q, k, v = m.qkv(x).split(DIM, dim=-1)
    q, k, v = (t.view(b, n, HEADS, DIM // HEADS).transpose(1, 2) for t in (q, k, v))
    att = q @ k.transpose(-1, -2) / math.sqrt(DIM // HEADS)
    if causal:
        att = att.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, n, DIM)
    return m.proj(y)


@pytest.mark.parametrize("n", [1, 2, 7, 16])
@pytest.mark.parametrize("causal", [False, True])
def test_shape_and_matches_reference(n, causal):
    m = _build(causal=causal)
    x = torch.randn(2, n, DIM, dtype=torch.float64)
    y = m(x)
    assert y.shape == (2, n, DIM)
    torch.testing.assert_close(y, _reference(m, x, causal))


def test_parameter_layout_matches_vit_nanogpt():
    m = SoftmaxAttention(DIM, HEADS)
    shapes = {k: tuple(v.shape) for k, v in m.named_parameters()}
    assert shapes == {
        "qkv.weight": (3 * DIM, DIM),
        "qkv.bias": (3 * DIM,),
        "proj.weight": (DIM, DIM),
        "proj.bias": (DIM,),
    }
    no_bias = SoftmaxAttention(DIM, HEADS, qkv_bias=False, proj_bias=False)
    assert sum(p.numel() for p in no_bias.parameters()) == 4 * DIM * DIM


def test_kv_cache_grows_by_one_token_per_step():
    # step == causal forward: tests/contract/test_contract_layers.py
    m = _build(causal=True)
    x = torch.randn(2, 7, DIM, dtype=torch.float64)
    state = m.init_state(2)
    assert state["k"].shape == (2, HEADS, 0, DIM // HEADS) and state["k"].dtype == torch.float64
    for i in range(7):
        _, state = m.step(x[:, i : i + 1], state)
    assert state["k"].shape == (2, HEADS, 7, DIM // HEADS)


def test_step_errors():
    m = _build(causal=True)
    with pytest.raises(ValueError, match=r"one token at a time: x must have shape \(B, 1, dim\)"):
        m.step(torch.randn(2, 3, DIM, dtype=torch.float64), m.init_state(2))
    with pytest.raises(ValueError, match="built for batch size 2, but x has batch size 1"):
        m.step(torch.randn(1, 1, DIM, dtype=torch.float64), m.init_state(2))
    with pytest.raises(ValueError, match="build the module with causal=True"):
        _build().step(torch.randn(1, 1, DIM, dtype=torch.float64), m.init_state(1))


def test_noncausal_permutation_equivariance():
    m = _build()
    x = torch.randn(2, 10, DIM, dtype=torch.float64)
    perm = torch.randperm(10)
    torch.testing.assert_close(m(x[:, perm]), m(x)[:, perm])


@pytest.mark.parametrize("causal", [False, True])
def test_capture_records_attention(causal):
    m = _build(causal=causal)
    x = torch.randn(2, 5, DIM, dtype=torch.float64)
    with capture_internals(m) as store:
        y = m(x)
    attn = store[""]["attn"]
    assert attn.shape == (2, HEADS, 5, 5)
    torch.testing.assert_close(attn.sum(-1), torch.ones(2, HEADS, 5, dtype=torch.float64))
    if causal:
        assert torch.all(attn.triu(1) == 0)
    torch.testing.assert_close(y, m(x))  # capturing does not change the output
    assert m._capture_store is None


def test_attention_dropout_only_in_training():
    m = _build(attn_dropout=0.5)
    ref = _build()
    ref.load_state_dict(m.state_dict())
    x = torch.randn(2, 6, DIM, dtype=torch.float64)
    torch.testing.assert_close(m(x), ref(x))
    m.train()
    assert not torch.allclose(m(x), ref(x))


def test_build_errors():
    with pytest.raises(ValueError, match=r"attn_dropout must be a probability in \[0, 1\), got 1.5"):
        attnzoo.build_attention("softmax", DIM, HEADS, attn_dropout=1.5)
    with pytest.raises(ValueError, match="scale must be None or a positive finite number"):
        attnzoo.build_attention("softmax", DIM, HEADS, scale=0)
    with pytest.raises(ValueError, match="divisible by heads=5"):
        attnzoo.build_attention("softmax", DIM, 5)
    with pytest.raises(ValueError, match="built with dim=12"):
        _build()(torch.randn(1, 3, 8, dtype=torch.float64))
    assert "softmax" in attnzoo.list_attentions(causal=True)


def test_torch_compile_matches_eager():
    m = attnzoo.build_attention("softmax", DIM, HEADS, causal=True).eval()
    x = torch.randn(2, 7, DIM)
    compiled = torch.compile(m, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), m(x))
