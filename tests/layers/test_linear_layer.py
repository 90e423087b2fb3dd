"""LinearAttention module: layout, causality, O(1)-state decoding, internals, options, compile."""

import pytest
import torch
import torch.nn.functional as F

import attnzoo
from attnzoo.layers import capture_internals
from attnzoo.layers import linear as linear_mod

DIM, HEADS = 12, 3
P = DIM // HEADS


def _build(**kw):
    return attnzoo.build_attention("linear", DIM, HEADS, **kw).double().eval()


def _reference(m, x, causal, eps=1e-6):
    b, n, _ = x.shape
    q, k, v = m.qkv(x).split(DIM, dim=-1)
    q, k, v = (t.view(b, n, HEADS, P).transpose(1, 2) for t in (q, k, v))
    a = (F.elu(q) + 1) @ (F.elu(k) + 1).transpose(-1, -2)
    if causal:
        a = a.tril()
    y = (a @ v) / (a.sum(-1, keepdim=True) + eps)
    return m.proj(y.transpose(1, 2).reshape(b, n, DIM))


@pytest.mark.parametrize("n", [1, 2, 7, 16])
@pytest.mark.parametrize("causal", [False, True])
def test_shape_and_matches_reference(n, causal):
    m = _build(causal=causal, chunk_size=4)
    x = torch.randn(2, n, DIM, dtype=torch.float64)
    y = m(x)
    assert y.shape == (2, n, DIM)
    torch.testing.assert_close(y, _reference(m, x, causal))


def test_parameter_layout():
    m = attnzoo.build_attention("linear", DIM, HEADS)
    shapes = {k: tuple(v.shape) for k, v in m.named_parameters()}
    assert shapes == {
        "qkv.weight": (3 * DIM, DIM),
        "qkv.bias": (3 * DIM,),
        "proj.weight": (DIM, DIM),
        "proj.bias": (DIM,),
    }


@pytest.mark.parametrize("feature_map", ["elu", "relu"])
def test_step_keeps_a_constant_state(feature_map):
    # step == causal forward (both feature maps): tests/contract/test_contract_layers.py
    m = _build(causal=True, feature_map=feature_map)
    x = torch.randn(2, 9, DIM, dtype=torch.float64)
    state = m.init_state(2)
    for i in range(9):
        _, state = m.step(x[:, i : i + 1], state)
        # O(1): the state never grows with the number of decoded tokens
        assert state["s"].shape == (2, HEADS, P, P) and state["z"].shape == (2, HEADS, P)


def test_state_is_float32_for_half_modules():
    m = attnzoo.build_attention("linear", DIM, HEADS, causal=True).to(torch.bfloat16)
    state = m.init_state(1)
    assert state["s"].dtype == torch.float32
    y, state = m.step(torch.randn(1, 1, DIM, dtype=torch.bfloat16), state)
    assert y.dtype == torch.bfloat16 and state["s"].dtype == torch.float32


def test_step_errors():
    m = _build(causal=True)
    with pytest.raises(ValueError, match=r"x must have shape \(B, 1, dim\)"):
        m.step(torch.randn(2, 2, DIM, dtype=torch.float64), m.init_state(2))
    with pytest.raises(ValueError, match="build the module with causal=True"):
        _build().step(torch.randn(1, 1, DIM, dtype=torch.float64), m.init_state(1))
    with pytest.raises(TypeError, match=r"keys \['s', 'z'\]"):
        m.step(torch.randn(1, 1, DIM, dtype=torch.float64), {"k": None})


def test_noncausal_permutation_equivariance():
    m = _build()
    x = torch.randn(2, 10, DIM, dtype=torch.float64)
    perm = torch.randperm(10)
    torch.testing.assert_close(m(x[:, perm]), m(x)[:, perm])


@pytest.mark.parametrize("causal", [False, True])
def test_capture_records_explicit_map(causal):
    m = _build(causal=causal)
    x = torch.randn(2, 6, DIM, dtype=torch.float64)
    with capture_internals(m) as store:
        y = m(x)
    attn = store[""]["attn"]
    assert attn.shape == (2, HEADS, 6, 6)
    # the recorded map reproduces the head outputs
    b, n = 2, 6
    v = m.qkv(x).split(DIM, dim=-1)[2].view(b, n, HEADS, P).transpose(1, 2)
    torch.testing.assert_close(m.proj((attn @ v).transpose(1, 2).reshape(b, n, DIM)), y)
    if causal:
        assert torch.all(attn.triu(1) == 0)


def test_capture_skips_map_above_threshold(monkeypatch):
    monkeypatch.setattr(linear_mod, "MAX_RECORDED_TOKENS", 4)
    m = _build()
    with capture_internals(m) as store:
        m(torch.randn(1, 5, DIM, dtype=torch.float64))
    assert "attn" not in store[""]
    with capture_internals(m) as store:
        m(torch.randn(1, 4, DIM, dtype=torch.float64))
    assert store[""]["attn"].shape == (1, HEADS, 4, 4)


def test_build_errors():
    with pytest.raises(ValueError, match=r"feature_map='exp' is not supported; valid feature maps: \['elu', 'relu'\]"):
        attnzoo.build_attention("linear", DIM, HEADS, feature_map="exp")
    with pytest.raises(ValueError, match="chunk_size must be None or a positive integer"):
        attnzoo.build_attention("linear", DIM, HEADS, causal=True, chunk_size=-2)
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        attnzoo.build_attention("linear", DIM, HEADS, eps=-1e-3)
    bad = torch.randn(1, 3, DIM)
    bad[0, 1, 2] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        attnzoo.build_attention("linear", DIM, HEADS)(bad)


def test_torch_compile_matches_eager():
    m = attnzoo.build_attention("linear", DIM, HEADS, causal=True, chunk_size=4).eval()
    x = torch.randn(2, 7, DIM)
    compiled = torch.compile(m, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), m(x))
