"""Module-level tests of TSSAAttention (ToST Alg. 1 / 2): wiring, parameters, internals, decoding, errors."""

import pytest
import torch
from einops import rearrange

from attnzoo.layers import build_attention, capture_internals, list_attentions
from attnzoo.layers.tssa import TSSAAttention
from attnzoo.ops.tssa.naive import tssa_naive


def _randomise(m: TSSAAttention, seed: int = 0) -> TSSAAttention:
    # temp and bias start at ones / zeros; move them so that tests see their effect
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        m.temp.copy_(0.5 + 2 * torch.rand(m.temp.shape, generator=g))
        if m.bias is not None:
            m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=g))
    return m


def _alg(m: TSSAAttention, x: torch.Tensor) -> torch.Tensor:
    """The module written out as Alg. 1 / 2 with the reference op."""
    w = rearrange(m.qkv(x), "b n (h d) -> b h n d", h=m.heads)
    out = tssa_naive(w, m.temp.view(-1), causal=m.causal, bias=m.bias)
    return m.to_out(rearrange(out, "b h n d -> b n (h d)"))


def test_registered_with_causal_mode():
    assert "tssa" in list_attentions(causal=True)
    assert TSSAAttention.supports_causal


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [1, 2, 7, 16])
def test_forward_matches_pseudocode(causal, n):
    m = _randomise(TSSAAttention(12, 3, causal=causal, max_len=16)).double()
    x = torch.randn(2, n, 12, dtype=torch.float64)
    y = m(x)
    assert y.shape == (2, n, 12)
    torch.testing.assert_close(y, _alg(m, x), rtol=1e-12, atol=1e-12)


def test_parameters_match_tost_pseudocode():
    # Alg. 1, ToST-S attention (d=384, K=8): qkv 384x384 (no bias), temp (8, 1), to_out 384x384 + bias
    m = TSSAAttention(384, 8)
    shapes = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert shapes == {"qkv.weight": (384, 384), "temp": (8, 1), "to_out.weight": (384, 384), "to_out.bias": (384,)}
    assert sum(p.numel() for p in m.parameters()) == 2 * 384 * 384 + 384 + 8
    assert torch.equal(m.temp, torch.ones(8, 1))
    # Alg. 2, ToST-Base (d=768, K=12, context 1024): plus the (K, 1024, 1) zero-initialised bias
    c = TSSAAttention(768, 12, causal=True)
    assert c.max_len == 1024 and tuple(c.bias.shape) == (12, 1024, 1) and c.bias.abs().sum() == 0
    assert sum(p.numel() for p in c.parameters()) == 2 * 768 * 768 + 768 + 12 + 12 * 1024
    q = TSSAAttention(8, 2, qkv_bias=True, proj_bias=False)
    assert q.qkv.bias is not None and q.to_out.bias is None


def test_build_attention_and_options():
    m = build_attention("tssa", 16, 4, causal=True, max_len=32, qkv_bias=True)
    assert isinstance(m, TSSAAttention) and m.max_len == 32 and m.causal
    with pytest.raises(TypeError, match="max_len"):
        build_attention("tssa", 16, 4, window=3)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "8"])
def test_bad_max_len_raises(bad):
    with pytest.raises(ValueError, match="max_len must be a positive integer"):
        TSSAAttention(8, 2, causal=True, max_len=bad)


def test_sequence_longer_than_max_len_raises():
    m = TSSAAttention(8, 2, causal=True, max_len=5)
    m(torch.randn(1, 5, 8))
    with pytest.raises(ValueError, match=r"N=6 exceeds max_len=5"):
        m(torch.randn(1, 6, 8))
    # non-causal TSSA has no positional bias and no length limit
    TSSAAttention(8, 2, max_len=5)(torch.randn(1, 6, 8))


def test_bad_input_raises():
    m = TSSAAttention(8, 2)
    with pytest.raises(ValueError, match="dim=8"):
        m(torch.randn(1, 3, 6))
    with pytest.raises(ValueError, match=r"\(B, N, dim\)"):
        m(torch.randn(3, 8))
    x = torch.randn(1, 3, 8)
    x[0, 1, 2] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        m(x)


@pytest.mark.parametrize("causal", [False, True])
def test_capture_internals(causal):
    m = _randomise(TSSAAttention(12, 3, causal=causal, max_len=8))
    model = torch.nn.Sequential(m)
    x = torch.randn(2, 5, 12)
    with capture_internals(model) as store:
        y = model(x)
    pi, w = store["0"]["pi"], store["0"]["w"]
    assert pi.shape == (2, 3, 5) and w.shape == (2, 3, 5, 4)
    assert not pi.requires_grad
    torch.testing.assert_close(pi.sum(1), torch.ones(2, 5))
    torch.testing.assert_close(w, rearrange(m.qkv(x), "b n (h p) -> b h n p", h=3))
    # Pi weights the output: with it the module output is reproduced
    g = 1.0 / (1.0 + _second_moment(w, pi, causal))
    expected = m.to_out(rearrange(-w * pi[..., None] * g, "b h n p -> b n (h p)"))
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    # no capture, no record
    m(torch.randn(2, 4, 12))
    assert store["0"]["pi"] is pi and not m.capturing


def _second_moment(w, pi, causal):
    if not causal:
        return ((pi / (pi.sum(-1, keepdim=True) + 1e-8))[..., None] * w**2).sum(2, keepdim=True)
    return torch.cumsum(w**2 * pi[..., None], 2) / torch.cumsum(pi, -1)[..., None]


def test_gradients_reach_only_the_used_bias_positions():
    # every parameter and x get a gradient equal to the reference's: tests/contract/test_contract_layers.py
    m = _randomise(TSSAAttention(12, 3, causal=True, max_len=10, qkv_bias=True))
    x = torch.randn(2, 6, 12, requires_grad=True)
    m(x).square().sum().backward()
    assert m.bias.grad[:, :6].abs().sum() > 0
    assert m.bias.grad[:, 6:].abs().max() == 0  # only the first N positions are used


def test_step_errors():
    m = TSSAAttention(8, 2, causal=True, max_len=3)
    state = m.init_state(1)
    for _ in range(3):
        _, state = m.step(torch.randn(1, 1, 8), state)
    with pytest.raises(ValueError, match=r"position 3.*max_len=3"):
        m.step(torch.randn(1, 1, 8), state)
    with pytest.raises(ValueError, match=r"one token"):
        m.step(torch.randn(1, 2, 8), m.init_state(1))
    with pytest.raises(ValueError, match="causal=True"):
        TSSAAttention(8, 2).init_state(1)
    with pytest.raises(ValueError, match="causal=True"):
        TSSAAttention(8, 2).step(torch.randn(1, 1, 8), state)


@pytest.mark.parametrize("causal", [False, True])
def test_torch_compile_matches_eager(causal):
    m = _randomise(TSSAAttention(12, 3, causal=causal, max_len=8))
    x = torch.randn(2, 7, 12, requires_grad=True)
    compiled = torch.compile(m, backend="eager", fullgraph=True)
    y, yc = m(x), compiled(x)
    torch.testing.assert_close(yc, y)
    (g,) = torch.autograd.grad(y.sum(), x)
    (gc,) = torch.autograd.grad(yc.sum(), x)
    torch.testing.assert_close(gc, g)


def test_half_precision_module():
    m = _randomise(TSSAAttention(16, 4, causal=True, max_len=8))
    x = torch.randn(2, 8, 16)
    ref = m(x)
    y = m.to(torch.bfloat16)(x.bfloat16())
    assert y.dtype == torch.bfloat16
    # bfloat16 keeps 8 significant bits (unit roundoff u = 2**-8). The module's error measured 0.84 u*max|ref| here
    # (1.5e-3) and up to 1.4 u*max|ref| over seeds 0-5; a bound of 2 u*max|ref| covers that and still stays below
    # the error of an output off by 1% (2.6 u*max|ref|), which must fail.
    bound = 2 * 2.0**-8 * ref.abs().max().item()
    torch.testing.assert_close(y.float(), ref, rtol=0, atol=bound)
    assert (0.99 * y.float() - ref).abs().max().item() > bound


def test_masked_forward_records_pi_per_sequence():
    m = _randomise(TSSAAttention(8, 2, causal=True, max_len=6)).double()
    model = torch.nn.Sequential(m)
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    with capture_internals(model) as rec:
        m(x, attention_mask=mask)
    with capture_internals(model) as alone:
        model(x[:1, 2:])
    pi, pi_alone = rec["0"]["pi"], alone["0"]["pi"]
    torch.testing.assert_close(pi[:1, :, 2:], pi_alone, rtol=1e-12, atol=1e-12)
    assert bool((pi[0, :, :2] == 0).all())


def test_decoding_a_left_padded_prompt_equals_each_prompt_alone():
    m = _randomise(TSSAAttention(8, 2, causal=True, max_len=6)).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)
    state, outs = m.init_state(2), []
    for t in range(5):
        y, state = m.step(x[:, t : t + 1], state, attention_mask=mask[:, t : t + 1])
        outs.append(y)
    got = torch.cat(outs, dim=1)
    torch.testing.assert_close(got, m(x, attention_mask=mask), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got[:1, 2:], m(x[:1, 2:]), rtol=1e-12, atol=1e-12)
    assert bool((got[0, :2] == 0).all()) and state.pos.tolist() == [3, 5]


@pytest.mark.parametrize("masked", [False, True])
def test_prefill_state_equals_stepping_the_prompt(masked):
    m = _randomise(TSSAAttention(8, 2, causal=True, max_len=8)).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool) if masked else None
    out, state = m.prefill(x, attention_mask=mask)
    torch.testing.assert_close(out, m(x, attention_mask=mask), rtol=0, atol=0)
    stepped = m.init_state(2)
    for t in range(5):
        _, stepped = m.step(x[:, t : t + 1], stepped, attention_mask=None if mask is None else mask[:, : t + 1])
    for a, b in zip(state[:3], stepped[:3], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert (state.pos.tolist() if masked else state.pos) == ([3, 5] if masked else 5)
    nxt = torch.randn(2, 1, 8, dtype=torch.float64)
    ones = None if mask is None else torch.ones(2, 6, dtype=torch.bool)
    if ones is not None:
        ones[:, :5] = mask
    torch.testing.assert_close(
        m.step(nxt, state, attention_mask=ones)[0], m.step(nxt, stepped, attention_mask=ones)[0], rtol=1e-12, atol=1e-12
    )
