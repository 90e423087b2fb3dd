"""FastmaxAttention module: fast vs naive backend, causality, equivariance, decoding, internals, errors."""

import pytest
import torch

from attnzoo.layers import build_attention, capture_internals, list_attentions
from attnzoo.layers.fastmax import FastmaxAttention
from attnzoo.ops.fastmax.naive import explicit_attention, standardize_naive


def test_registered():
    assert "fastmax" in list_attentions(causal=True)
    m = build_attention("fastmax", 8, 2, causal=True, p=1, attn_dropout=0.1, dropout_placement="1d")
    assert isinstance(m, FastmaxAttention) and m.p == 1
    with pytest.raises(TypeError, match="valid options"):
        build_attention("fastmax", 8, 2, window=3)


def test_noncausal_permutation_equivariant():
    m = FastmaxAttention(12, 3).double()
    x = torch.randn(2, 9, 12, dtype=torch.float64)
    perm = torch.randperm(9)
    torch.testing.assert_close(m(x[:, perm]), m(x)[:, perm], rtol=1e-10, atol=1e-10)


def test_causal_is_not_permutation_equivariant():
    m = FastmaxAttention(12, 3, causal=True).double()
    x = torch.randn(1, 9, 12, dtype=torch.float64)
    perm = torch.arange(8, -1, -1)
    assert not torch.allclose(m(x[:, perm]), m(x)[:, perm])


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_step_state_dtype(p, dtype):
    # step == causal forward for p=1 and 2, float32 and float64: tests/contract (FASTMAX.examples)
    m = FastmaxAttention(12, 3, causal=True, p=p, scale=0.25 if p == 1 else None).to(dtype)
    x = torch.randn(2, 7, 12, dtype=dtype)
    state = m.init_state(2)
    for t in range(7):
        _, state = m.step(x[:, t : t + 1], state)
    assert state.num.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)


def test_step_needs_causal_and_one_token():
    with pytest.raises(ValueError, match="causal=True"):
        FastmaxAttention(12, 3).init_state(1)
    m = FastmaxAttention(12, 3, causal=True)
    with pytest.raises(ValueError, match=r"one token x of shape \(B, 1, dim\)"):
        m.step(torch.randn(1, 2, 12), m.init_state(1))


def test_capture_internals():
    m = FastmaxAttention(12, 3, causal=True).double()
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    with capture_internals(m) as store:
        y = m(x)
    rec = store[""]
    assert set(rec) == {"attn", "q_hat", "k_hat"}
    q, k, v = m._qkv(x)
    torch.testing.assert_close(rec["q_hat"], standardize_naive(q), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(rec["k_hat"], standardize_naive(k), rtol=1e-10, atol=1e-10)
    a = rec["attn"]
    assert a.shape == (2, 3, 5, 5)
    torch.testing.assert_close(a, explicit_attention(q, k, causal=True))
    out = (a @ v).transpose(1, 2).reshape(2, 5, 12)
    torch.testing.assert_close(m.proj(out), y, rtol=1e-10, atol=1e-10)


def test_capture_skips_attn_for_long_inputs(monkeypatch):
    import attnzoo.layers.fastmax as mod

    monkeypatch.setattr(mod, "MAX_CAPTURE_TOKENS", 4)
    m = FastmaxAttention(8, 2)
    with capture_internals(m) as store:
        m(torch.randn(1, 5, 8))
    assert set(store[""]) == {"q_hat", "k_hat"}


@pytest.mark.parametrize("placement", ["standard", "1d", "quadratic"])
@pytest.mark.parametrize("causal", [False, True])
def test_dropout_placements(placement, causal):
    m = FastmaxAttention(12, 3, causal=causal, attn_dropout=0.5, dropout_placement=placement)
    ref = FastmaxAttention(12, 3, causal=causal)
    ref.load_state_dict(m.state_dict())
    x = torch.randn(2, 8, 12, requires_grad=True)
    m.train()
    y1, y2 = m(x), m(x)
    assert torch.isfinite(y1).all() and not torch.allclose(y1, y2)
    y1.sum().backward()
    assert torch.isfinite(x.grad).all() and m.qkv.weight.grad is not None
    m.eval()
    torch.testing.assert_close(m(x), ref(x))
    if causal:  # dropout masks act on shared sums: training outputs stay causal too
        m.train()
        torch.manual_seed(1)
        y = m(x)
        x2 = x.detach().clone()
        x2[:, 5:] = torch.randn_like(x2[:, 5:])
        torch.manual_seed(1)
        torch.testing.assert_close(m(x2)[:, :5], y[:, :5])


def test_errors():
    with pytest.raises(ValueError, match=r"p=3 is not supported"):
        FastmaxAttention(8, 2, p=3)
    with pytest.raises(ValueError, match=r"dropout_placement='dropconnect' is not supported; valid choices"):
        FastmaxAttention(8, 2, attn_dropout=0.1, dropout_placement="dropconnect")
    with pytest.raises(ValueError, match="needs a dropout_placement"):
        FastmaxAttention(8, 2, attn_dropout=0.1)
    with pytest.raises(ValueError, match="needs p=2"):
        FastmaxAttention(8, 2, p=1, attn_dropout=0.1, dropout_placement="quadratic")
    with pytest.raises(ValueError, match=r"attn_dropout must be a probability in \[0, 1\), got 1.5"):
        FastmaxAttention(8, 2, attn_dropout=1.5, dropout_placement="standard")
    with pytest.raises(ValueError, match=r"proj_dropout must be a probability in \[0, 1\), got -0.1"):
        FastmaxAttention(8, 2, proj_dropout=-0.1)
    with pytest.raises(ValueError, match="scale=0 must be a finite positive"):
        FastmaxAttention(8, 2, scale=0)
    with pytest.raises(ValueError, match="backend='fused' is not supported"):
        FastmaxAttention(8, 2, backend="fused")
    m = FastmaxAttention(8, 2)
    x = torch.randn(1, 4, 8)
    x[0, 2, 3] = float("nan")
    with pytest.raises(ValueError, match=r"x contains non-finite values \(1 NaN"):
        m(x)
    with pytest.raises(ValueError, match="feature size 6"):
        m(torch.randn(1, 4, 6))


@pytest.mark.parametrize("causal", [False, True])
def test_torch_compile(causal):
    m = FastmaxAttention(8, 2, causal=causal).eval()
    x = torch.randn(2, 5, 8, requires_grad=True)
    compiled = torch.compile(m, backend="eager", fullgraph=True)
    y_c, y = compiled(x), m(x)
    torch.testing.assert_close(y_c, y, rtol=1e-5, atol=1e-6)
    # the custom §2.5 backward runs under compile too
    w = torch.randn_like(y)
    g_c = torch.autograd.grad((y_c * w).sum(), x)[0]
    g = torch.autograd.grad((y * w).sum(), x)[0]
    torch.testing.assert_close(g_c, g, rtol=1e-5, atol=1e-6)
