"""XCAttention module: XCiT layout, no causal mode, equivariance, internals, options, compile."""

import pytest
import torch
import torch.nn.functional as F

import attnzoo
from attnzoo.layers import capture_internals

DIM, HEADS = 12, 3
P = DIM // HEADS


def _build(**kw):
    return attnzoo.build_attention("xca", DIM, HEADS, **kw).double().eval()


def _reference(m, x):
    # XCiT's XCA forward, channels-first per head.
    b, n, _ = x.shape
    qkv = m.qkv(x).reshape(b, n, 3, HEADS, P).permute(2, 0, 3, 1, 4)
    q, k, v = (t.transpose(-2, -1) for t in qkv)  # (B, H, P, N)
    attn = (F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)) * m.temperature
    y = (attn.softmax(-1) @ v).permute(0, 3, 1, 2).reshape(b, n, DIM)
    return m.proj(y)


@pytest.mark.parametrize("n", [1, 2, 7, 16])
def test_shape_and_matches_xcit(n):
    m = _build()
    with torch.no_grad():
        m.temperature.copy_(torch.tensor([0.5, 1.0, 3.0]).view(HEADS, 1, 1))
    x = torch.randn(2, n, DIM, dtype=torch.float64)
    y = m(x)
    assert y.shape == (2, n, DIM)
    torch.testing.assert_close(y, _reference(m, x))


def test_parameter_layout():
    m = attnzoo.build_attention("xca", DIM, HEADS)
    shapes = {k: tuple(v.shape) for k, v in m.named_parameters()}
    assert shapes == {
        "temperature": (HEADS, 1, 1),
        "qkv.weight": (3 * DIM, DIM),
        "qkv.bias": (3 * DIM,),
        "proj.weight": (DIM, DIM),
        "proj.bias": (DIM,),
    }
    assert torch.equal(m.temperature, torch.ones(HEADS, 1, 1))


def test_permutation_equivariance():
    m = _build()
    x = torch.randn(2, 10, DIM, dtype=torch.float64)
    perm = torch.randperm(10)
    torch.testing.assert_close(m(x[:, perm]), m(x)[:, perm])


def test_capture_records_channel_attention():
    m = _build()
    x = torch.randn(2, 5, DIM, dtype=torch.float64)
    with capture_internals(m) as store:
        y = m(x)
    attn = store[""]["attn"]
    assert attn.shape == (2, HEADS, P, P)
    torch.testing.assert_close(attn.sum(-1), torch.ones(2, HEADS, P, dtype=torch.float64))
    torch.testing.assert_close(y, m(x))


def test_attention_dropout_only_in_training():
    m = _build(attn_dropout=0.5)
    ref = _build()
    ref.load_state_dict(m.state_dict())
    x = torch.randn(2, 6, DIM, dtype=torch.float64)
    torch.testing.assert_close(m(x), ref(x))
    m.train()
    assert not torch.allclose(m(x), ref(x))


def test_build_errors():
    with pytest.raises(ValueError, match=r"proj_dropout must be a probability in \[0, 1\)"):
        attnzoo.build_attention("xca", DIM, HEADS, proj_dropout=-0.1)
    with pytest.raises(ValueError, match=r"x must have shape \(B, N, dim\)"):
        _build()(torch.randn(4, DIM, dtype=torch.float64))


def test_torch_compile_matches_eager():
    m = attnzoo.build_attention("xca", DIM, HEADS).eval()
    x = torch.randn(2, 7, DIM)
    compiled = torch.compile(m, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), m(x))
