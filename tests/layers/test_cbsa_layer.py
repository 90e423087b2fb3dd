"""CBSAAttention module: Algorithm 1 parameterisation, options, internals, errors, compile."""

from __future__ import annotations

import pytest
import torch
from einops import rearrange
from torch import nn

from attnzoo.layers import build_attention, capture_internals
from attnzoo.layers.cbsa import CBSAAttention
from attnzoo.ops.cbsa import cbsa, pool_reps

VARIANTS = [
    ("cbsa", None),
    ("cbsa", "exact"),
    ("agent", None),
    ("mssa", None),
    ("mssa", "exact"),
    ("linear", None),
    ("channel", None),
]


@pytest.mark.parametrize("n", [1, 2, 7, 70])
@pytest.mark.parametrize("variant,contraction", VARIANTS)
def test_default_options_any_length(n, variant, contraction):
    m = CBSAAttention(16, 2, variant=variant, contraction=contraction).double()
    x = torch.randn(2, n, 16, dtype=torch.float64, requires_grad=True)
    y = m(x)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert torch.isfinite(y).all()
    y.square().sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())


def test_matches_paper_algorithm_1():
    """Same parameters as the appendix listing; its CLS token is last (``w[:, :-1]``), ours is prefix token 0."""
    dim, heads, b = 16, 2, 2
    dh = dim // heads

    class Listing(nn.Module):  # Algorithm 1, transcribed
        def __init__(self):
            super().__init__()
            self.scale = dh**-0.5
            self.attend = nn.Softmax(dim=-1)
            self.pool = nn.AdaptiveAvgPool2d(output_size=(8, 8))
            self.proj = nn.Linear(dim, dim, bias=False)
            self.to_out = nn.Linear(dim, dim)
            self.ss_x = nn.Parameter(torch.randn(heads, 1, 1))
            self.ss_rep = nn.Parameter(torch.randn(heads, 1, 1))

        def attention(self, query, key, value):
            attn = self.attend((query @ key.transpose(-1, -2)) * self.scale)
            return attn @ value, attn

        def forward(self, x):
            b, n, c = x.shape
            height = width = int(n**0.5)
            w = self.proj(x)
            rep = self.pool(w[:, :-1, :].reshape(b, height, width, c).permute(0, 3, 1, 2))
            rep = rep.reshape(b, c, -1).permute(0, 2, 1)
            w = w.reshape(b, n, heads, dh).permute(0, 2, 1, 3)
            rep = rep.reshape(b, 64, heads, dh).permute(0, 2, 1, 3)
            rep_delta, attn = self.attention(rep, w, w)
            rep = rep + self.ss_rep * rep_delta
            x_delta, _ = self.attention(rep, rep, rep)
            x_delta = attn.transpose(-1, -2) @ x_delta
            x_delta = self.ss_x * x_delta
            return self.to_out(rearrange(x_delta, "b h n k -> b n (h k)"))

    ref = Listing().double()
    ours = CBSAAttention(dim, heads, grid=(8, 8), num_prefix_tokens=1).double()
    assert sorted(k for k, _ in ours.named_parameters()) == sorted(k for k, _ in ref.named_parameters())
    ours.load_state_dict(ref.state_dict())
    body = torch.randn(b, 64, dim, dtype=torch.float64)
    cls = torch.randn(b, 1, dim, dtype=torch.float64)
    y_ref = ref(torch.cat([body, cls], dim=1))
    y = ours(torch.cat([cls, body], dim=1))
    torch.testing.assert_close(y[:, 1:], y_ref[:, :-1], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(y[:, :1], y_ref[:, -1:], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dim,heads", [(16, 2), (384, 6)])
def test_parameter_count(dim, heads):
    """Algorithm 1: proj dim^2, to_out dim^2 + dim, kappa and eta (heads each)."""

    def count(**kw):
        return sum(p.numel() for p in CBSAAttention(dim, heads, **kw).parameters())

    assert count() == 2 * dim * dim + dim + 2 * heads
    assert count(qkv_bias=True) == 2 * dim * dim + 2 * dim + 2 * heads
    assert count(variant="agent") == 2 * dim * dim + dim + 2 * heads
    for v in ("mssa", "linear", "channel"):  # no extraction step, hence no eta
        assert count(variant=v) == 2 * dim * dim + dim + heads


def test_layer_equals_op_composition():
    m = CBSAAttention(12, 3, num_reps=4, num_prefix_tokens=2, contraction="exact", eps=0.8).double()
    x = torch.randn(2, 11, 12, dtype=torch.float64)
    w = rearrange(m.proj(x), "b n (h p) -> b h n p", h=3)
    reps = pool_reps(w, num_reps=4, num_prefix_tokens=2)
    o = cbsa(w, reps, contraction="exact", eps=0.8, eta=m.ss_rep, backend="naive")
    expected = m.to_out(rearrange(m.ss_x * o, "b h n p -> b n (h p)"))
    torch.testing.assert_close(m(x), expected, rtol=1e-10, atol=1e-12)


def test_capture_internals_shapes():
    m = nn.Sequential(CBSAAttention(16, 2, grid=(4, 6), rep_grid=(2, 3), num_prefix_tokens=1))
    x = torch.randn(3, 25, 16)
    y0 = m(x)
    with capture_internals(m) as store:
        y = m(x)
    torch.testing.assert_close(y, y0, rtol=0, atol=0)
    rec = store["0"]
    assert rec["attn_extract"].shape == (3, 2, 6, 25)
    assert rec["attn_contract"].shape == (3, 2, 6, 6)
    assert rec["reps"].shape == (3, 2, 6, 8) and rec["reps_init"].shape == (3, 2, 6, 8)
    torch.testing.assert_close(rec["attn_extract"].sum(-1), torch.ones(3, 2, 6))
    torch.testing.assert_close(rec["attn_contract"].sum(-1), torch.ones(3, 2, 6))
    assert not rec["attn_extract"].requires_grad
    # 1-D default: min(64, N) representatives
    m1 = CBSAAttention(16, 2)
    with capture_internals(m1) as store:
        m1(torch.randn(1, 100, 16))
        rec = store[""]
        assert rec["attn_extract"].shape == (1, 2, 64, 100)
        m1(torch.randn(1, 5, 16))
        assert rec["attn_extract"].shape == (1, 2, 5, 5) and rec["attn_contract"].shape == (1, 2, 5, 5)
    mm = CBSAAttention(16, 2, variant="mssa")
    with capture_internals(mm) as store:
        mm(torch.randn(1, 7, 16))
    assert store[""]["attn_contract"].shape == (1, 2, 7, 7) and "attn_extract" not in store[""]
    ml = CBSAAttention(16, 2, variant="linear")
    with capture_internals(ml) as store:
        ml(torch.randn(1, 7, 16))
    assert store[""]["filter"].shape == (1, 2, 8, 8)


def test_prefix_tokens_excluded_from_pooling_but_mixed():
    m = CBSAAttention(8, 2, grid=(3, 3), num_prefix_tokens=2).double()
    x = torch.randn(1, 11, 8, dtype=torch.float64)
    x2 = x.clone()
    x2[:, :2] += 5.0
    with capture_internals(m) as store:
        y = m(x)
        reps1 = store[""]["reps_init"]
        y2 = m(x2)
        reps2 = store[""]["reps_init"]
    torch.testing.assert_close(reps1, reps2, rtol=0, atol=0)  # pooled over the grid only
    assert (y2[:, 2:] - y[:, 2:]).abs().max() > 1e-6  # prefix tokens are keys/values of the extraction
    assert torch.isfinite(y2[:, :2]).all()


def test_permutation_behaviour():
    x = torch.randn(1, 12, 8, dtype=torch.float64)
    perm = torch.tensor([4, 1, 9, 0, 7, 2, 10, 5, 3, 11, 8, 6])
    m = CBSAAttention(8, 2, num_reps=3).double()
    assert (m(x[:, perm]) - m(x)[:, perm]).abs().max() > 1e-4  # 1-D pooling sees token order
    for v in ("mssa", "linear", "channel"):
        mv = CBSAAttention(8, 2, variant=v).double()
        torch.testing.assert_close(mv(x[:, perm]), mv(x)[:, perm], rtol=1e-10, atol=1e-12)


def test_detach_init_changes_only_gradients():
    torch.manual_seed(3)
    m = CBSAAttention(8, 2, num_reps=3).double()
    md = CBSAAttention(8, 2, num_reps=3, detach_init=True).double()
    md.load_state_dict(m.state_dict())
    x = torch.randn(1, 9, 8, dtype=torch.float64)
    y, yd = m(x), md(x)
    torch.testing.assert_close(y, yd, rtol=0, atol=0)
    y.sum().backward()
    yd.sum().backward()
    assert (m.proj.weight.grad - md.proj.weight.grad).abs().max() > 1e-8


def test_build_attention_and_errors():
    m = build_attention("cbsa", 16, 4, num_reps=8, variant="agent")
    assert isinstance(m, CBSAAttention) and m.variant == "agent"
    with pytest.raises(ValueError, match="has no causal mode"):
        CBSAAttention(16, 4, causal=True)
    with pytest.raises(ValueError, match=r"contraction='inv' is not supported; valid choices: \['softmax', 'exact'\]"):
        CBSAAttention(16, 4, contraction="inv")
    with pytest.raises(ValueError, match="variant='bogus' is not supported"):
        CBSAAttention(16, 4, variant="bogus")
    with pytest.raises(ValueError, match="contraction='exact' cannot be chosen for variant='channel'"):
        CBSAAttention(16, 4, variant="channel", contraction="exact")
    with pytest.raises(ValueError, match="num_reps=8 applies to 1-D pooling only"):
        CBSAAttention(16, 4, num_reps=8, grid=(4, 4))
    with pytest.raises(ValueError, match="rep_grid=.* needs a token grid"):
        CBSAAttention(16, 4, rep_grid=(2, 2))
    with pytest.raises(ValueError, match="variant='mssa' pools no representatives"):
        CBSAAttention(16, 4, variant="mssa", grid=(4, 4))
    with pytest.raises(ValueError, match="grid must be a pair of positive integers"):
        CBSAAttention(16, 4, grid=(4, -1))
    with pytest.raises(ValueError, match="grid must be a pair of positive integers"):
        CBSAAttention(16, 4, grid=14)
    with pytest.raises(ValueError, match="num_prefix_tokens must be a non-negative integer"):
        CBSAAttention(16, 4, num_prefix_tokens=-2)
    with pytest.raises(ValueError, match="num_reps must be None or a positive integer"):
        CBSAAttention(16, 4, num_reps=0)
    with pytest.raises(ValueError, match="eps must be a positive finite number"):
        CBSAAttention(16, 4, eps=0)
    m = CBSAAttention(16, 4, grid=(4, 4), num_prefix_tokens=1)
    with pytest.raises(ValueError, match=r"grid=\(4, 4\) holds 16 tokens but the input has 19 non-prefix tokens"):
        m(torch.randn(1, 20, 16))
    with pytest.raises(ValueError, match="no non-prefix tokens to pool"):
        CBSAAttention(16, 4, num_prefix_tokens=1)(torch.randn(1, 1, 16))
    with pytest.raises(ValueError, match="feature size 8"):
        m(torch.randn(1, 17, 8))


@pytest.mark.parametrize("variant", ["cbsa", "linear"])
def test_torch_compile_matches_eager(variant):
    m = CBSAAttention(16, 2, variant=variant)
    x = torch.randn(2, 9, 16)
    compiled = torch.compile(m, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), m(x), rtol=1e-6, atol=1e-6)
